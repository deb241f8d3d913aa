// Gemma 4 E2B / E4B text decoder (general.architecture = "gemma4"), model-spec.md section 4.
#pragma once

#include <memory>

#include "models/arch.h"

namespace geist::models {

// Bind hyperparameters and tensors of a gemma4 GGUF and have the backend prepare them (on
// the CPU the matrices are repacked, the token and per-layer embeddings stay mapped).
// MoE and K=V variants (26B-A4B, 31B) are refused with GEIST_E_UNSUPPORTED.
Result<std::unique_ptr<ArchModel>> load_gemma4(const gguf::GgufFile &file, std::unique_ptr<Backend> backend);

}  // namespace geist::models
