// Gemma 3 (general.architecture = "gemma3"), model-spec.md section 2.
#pragma once

#include <memory>

#include "models/arch.h"

namespace geist::models {

// Bind hyperparameters and tensors of a gemma3 GGUF; weights stay in the mapping.
Result<std::unique_ptr<ArchModel>> load_gemma3(const gguf::GgufFile &file);

}  // namespace geist::models
