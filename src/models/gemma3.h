// Gemma 3 (general.architecture = "gemma3"), model-spec.md section 2.
#pragma once

#include <memory>

#include "models/arch.h"

namespace geist::models {

// Bind hyperparameters and tensors of a gemma3 GGUF and have the backend prepare them.
Result<std::unique_ptr<ArchModel>> load_gemma3(const gguf::GgufFile &file, std::unique_ptr<Backend> backend);

}  // namespace geist::models
