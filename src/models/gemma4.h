// Gemma 4 E2B / E4B text decoder (general.architecture = "gemma4"), model-spec.md section 4.
#pragma once

#include <memory>

#include "models/arch.h"

namespace geist::models {

// Bind hyperparameters and tensors of a gemma4 GGUF; weights stay in the mapping (the
// matrices are repacked for the CPU tier, the token and per-layer embeddings stay mapped).
// MoE and K=V variants (26B-A4B, 31B) are refused with GEIST_E_UNSUPPORTED.
Result<std::unique_ptr<ArchModel>> load_gemma4(const gguf::GgufFile &file);

}  // namespace geist::models
