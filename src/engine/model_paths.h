// Where geist looks for models: the default model's cache location.
#pragma once

#include <string>

namespace geist {

// Name of the default model file (Gemma 3 270M Q4_K_M).
inline constexpr const char *kDefaultModelName = "gemma-3-270m-q4_k_m.gguf";

// $GEIST_MODEL if set; else $GEIST_MODEL_DIR (or $XDG_CACHE_HOME/geist/models, or
// ~/.cache/geist/models) joined with kDefaultModelName. Does not check that it exists.
std::string default_model_file();

}  // namespace geist
