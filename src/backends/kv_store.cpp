#include "backends/backend.h"

namespace geist {

Status check_kv_args(const std::vector<KvLayerSpec> &layers, int64_t n_ctx, int max_chunk, KvType tk, KvType tv) {
  if (n_ctx < 1) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "n_ctx must be >= 1 (got %lld)", (long long)n_ctx);
  if (max_chunk < 1) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "chunk size must be >= 1 (got %d)", max_chunk);
  for (const KvLayerSpec &s : layers) {
    // Whole q8_0 blocks per head: every backend reads a head's keys as its own blocks.
    if ((tk == KvType::Q8_0 || tv == KvType::Q8_0) && (s.head_dim % 32 != 0 || s.row_floats % 32 != 0)) {
      return GEIST_ERROR(GEIST_E_UNSUPPORTED,
                         "a q8_0 KV cache needs heads a multiple of 32 wide; this model's are %d (use f16 or bf16)",
                         s.head_dim);
    }
  }
  return Status::ok();
}

}  // namespace geist
