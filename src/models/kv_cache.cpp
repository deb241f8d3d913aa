#include <sys/mman.h>

#include <algorithm>
#include <cstring>

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

int64_t KvCache::first_live(int l, int64_t n) const {
  const int w = layers_[l].spec.window;
  return w > 0 ? std::max<int64_t>(0, n - (w - 1)) : 0;
}

void KvCache::read_rows(int l, int64_t from, int64_t to, float *dst) const {
  const Layer &L = layers_[l];
  const size_t rf = static_cast<size_t>(L.spec.row_floats), n = static_cast<size_t>(to - from);
  for (int64_t p = from; p < to; ++p) {
    const size_t slot = static_cast<size_t>(p % L.capacity), i = static_cast<size_t>(p - from);
    std::memcpy(dst + i * rf, L.k + slot * rf, rf * sizeof(float));
    std::memcpy(dst + (n + i) * rf, L.v + slot * rf, rf * sizeof(float));
  }
}

void KvCache::write_rows(int l, int64_t from, int64_t to, const float *src) {
  Layer &L = layers_[l];
  const size_t rf = static_cast<size_t>(L.spec.row_floats), n = static_cast<size_t>(to - from);
  for (int64_t p = from; p < to; ++p) {
    const size_t slot = static_cast<size_t>(p % L.capacity), i = static_cast<size_t>(p - from);
    std::memcpy(L.k + slot * rf, src + i * rf, rf * sizeof(float));
    std::memcpy(L.v + slot * rf, src + (n + i) * rf, rf * sizeof(float));
  }
}

void KvCache::append(int l, int64_t pos0, int n_rows, const float *k, const float *v) {
  Layer &L = layers_[l];
  const size_t rf = static_cast<size_t>(L.spec.row_floats);
  for (int r = 0; r < n_rows; ++r) {
    const size_t slot = static_cast<size_t>((pos0 + r) % L.capacity);
    std::memcpy(L.k + slot * rf, k + size_t(r) * rf, rf * sizeof(float));
    std::memcpy(L.v + slot * rf, v + size_t(r) * rf, rf * sizeof(float));
  }
}

int64_t KvCache::rewind_rows(int l, int64_t n_pin, int64_t n_past, const float *saved) {
  const Layer &L = layers_[l];
  if (L.spec.window == 0 || n_past <= n_pin) return 0;
  const int64_t from = first_live(l, n_pin);
  // Position q's slot was overwritten iff some position in [n_pin, n_past) maps to it,
  // i.e. q + capacity < n_past (q + capacity >= n_pin holds since capacity >= W - 1 >=
  // n_pin - q).
  const int64_t to = std::min(n_pin, n_past - L.capacity);
  if (to <= from) return 0;
  const size_t rf = static_cast<size_t>(L.spec.row_floats), rows = static_cast<size_t>(n_pin - from);
  for (int64_t q = from; q < to; ++q) {
    const size_t slot = static_cast<size_t>(q % L.capacity), i = static_cast<size_t>(q - from);
    std::memcpy(L.k + slot * rf, saved + i * rf, rf * sizeof(float));
    std::memcpy(L.v + slot * rf, saved + (rows + i) * rf, rf * sizeof(float));
  }
  return to - from;
}

KvCache::~KvCache() {
  if (mapping_) munmap(mapping_, bytes_);
}

}  // namespace geist::models
