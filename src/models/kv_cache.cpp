#include <sys/mman.h>

#include <algorithm>

#include "models/arch.h"

namespace geist::models {

Result<std::unique_ptr<KvCache>> KvCache::create(const std::vector<KvLayerSpec> &layers,
                                                 int64_t n_ctx, int max_chunk) {
  if (n_ctx < 1) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "n_ctx must be >= 1 (got %lld)", (long long)n_ctx);
  if (max_chunk < 1) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "chunk size must be >= 1 (got %d)", max_chunk);
  std::unique_ptr<KvCache> c(new KvCache());
  c->n_ctx_ = n_ctx;
  c->max_chunk_ = max_chunk;
  size_t total = 0;
  for (const KvLayerSpec &s : layers) {
    Layer l;
    l.spec = s;
    l.capacity = s.window > 0 ? std::min<int64_t>(n_ctx, int64_t(s.window) + max_chunk - 1) : n_ctx;
    total += 2 * static_cast<size_t>(l.capacity) * static_cast<size_t>(s.row_floats) * sizeof(float);
    c->layers_.push_back(l);
  }
  if (total > 0) {
    void *m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      return GEIST_ERROR(GEIST_E_OUT_OF_MEMORY, "cannot reserve %zu bytes for the KV cache (n_ctx %lld)", total,
                         (long long)n_ctx);
    }
    c->mapping_ = m;
  }
  c->bytes_ = total;
  float *p = static_cast<float *>(c->mapping_);
  for (Layer &l : c->layers_) {
    const size_t n = static_cast<size_t>(l.capacity) * static_cast<size_t>(l.spec.row_floats);
    l.k = p;
    l.v = p + n;
    p += 2 * n;
  }
  return c;
}

KvCache::~KvCache() {
  if (mapping_) munmap(mapping_, bytes_);
}

}  // namespace geist::models
