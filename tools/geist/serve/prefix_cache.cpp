#include "prefix_cache.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

namespace geist::serve {

uint64_t tokens_hash(const int32_t *t, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t v = uint32_t(t[i]);
    for (int b = 0; b < 4; ++b) {
      h ^= (v >> (8 * b)) & 0xffu;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
  const size_t n = std::min(na, nb);
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

size_t image_capacity(size_t image_bytes) {
  const size_t step = std::max<size_t>(1, std::bit_floor(image_bytes) / 8);
  const size_t r = image_bytes % step;
  return r == 0 || image_bytes > SIZE_MAX - step ? image_bytes : image_bytes - r + step;
}

}  // namespace geist::serve
