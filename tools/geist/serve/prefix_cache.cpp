#include "prefix_cache.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <utility>

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

const PrefixCache::Entry *PrefixCache::find_longest_prefix(const int32_t *p, size_t n,
                                                           size_t max_len) {
  Entry *best = nullptr;
  for (Entry &e : entries_) {
    const size_t len = e.tokens.size();
    if (len > n || len > max_len || (best && len <= best->tokens.size())) continue;
    if (std::memcmp(e.tokens.data(), p, len * sizeof(int32_t)) == 0) best = &e;
  }
  if (best) best->last_used = ++clock_;
  return best;
}

size_t PrefixCache::longest_common_prefix(const int32_t *p, size_t n) const {
  size_t best = 0;
  for (const Entry &e : entries_)
    best = std::max(best, common_prefix(p, n, e.tokens.data(), e.tokens.size()));
  return best;
}

bool PrefixCache::touch(const int32_t *t, size_t n) {
  const uint64_t h = tokens_hash(t, n);
  for (Entry &e : entries_) {
    if (e.hash == h && e.tokens.size() == n && std::equal(e.tokens.begin(), e.tokens.end(), t)) {
      e.last_used = ++clock_;
      return true;
    }
  }
  return false;
}

void PrefixCache::erase_at(size_t i) {
  bytes_ -= entries_[i].cost;
  entries_[i] = std::move(entries_.back());
  entries_.pop_back();
}

bool PrefixCache::make_room(size_t cost) {
  return make_room(cost, nullptr);
}

bool PrefixCache::make_room(size_t cost,
                            std::vector<std::shared_ptr<std::vector<uint8_t>>> *freed) {
  if (cost > capacity_) return false;
  while (bytes_ + cost > capacity_) {
    size_t lru = 0;
    for (size_t i = 1; i < entries_.size(); ++i) {
      if (entries_[i].last_used < entries_[lru].last_used) lru = i;
    }
    std::shared_ptr<std::vector<uint8_t>> &img = entries_[lru].image;
    if (freed && img && img.use_count() == 1) {
      // No one else holds it, and only this thread could hand out a new reference. The
      // disk writer's release of its reference is an acq_rel decrement; this fence orders
      // that thread's reads of the buffer before the writes of whoever reuses it.
      std::atomic_thread_fence(std::memory_order_acquire);
      freed->push_back(std::move(img));
    }
    erase_at(lru);
    ++evictions_;
  }
  return true;
}

size_t PrefixCache::image_capacity(size_t image_bytes) {
  const size_t step = std::max<size_t>(1, std::bit_floor(image_bytes) / 8);
  const size_t r = image_bytes % step;
  return r == 0 || image_bytes > SIZE_MAX - step ? image_bytes : image_bytes - r + step;
}

std::shared_ptr<std::vector<uint8_t>> PrefixCache::image_buffer(size_t n_tokens,
                                                                size_t image_bytes) {
  const size_t want = image_capacity(image_bytes);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> freed;
  if (!make_room(entry_cost(n_tokens, want), &freed)) return nullptr;
  // The smallest evicted buffer that holds the image without wasting more than an eighth.
  std::shared_ptr<std::vector<uint8_t>> buf;
  for (auto &b : freed) {
    const size_t c = b->capacity();
    if (c >= image_bytes && c <= want + want / 8 && (!buf || c < buf->capacity())) buf = b;
  }
  freed.clear();  // the rest go back to the system (large buffers are mapped on their own)
  // A buffer larger than `want` is charged its capacity: room for the difference, or none.
  if (buf && buf->capacity() > want && !make_room(entry_cost(n_tokens, buf->capacity()))) {
    buf.reset();
  }
  if (buf) {
    ++buffers_reused_;
    return buf;
  }
  buf = std::make_shared<std::vector<uint8_t>>();
  buf->reserve(want);
  return buf;
}

bool PrefixCache::insert(std::vector<int32_t> tokens, std::shared_ptr<std::vector<uint8_t>> image) {
  const uint64_t h = tokens_hash(tokens.data(), tokens.size());
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (entries_[i].hash == h && entries_[i].tokens == tokens) {
      erase_at(i);
      break;
    }
  }
  const size_t cost = entry_cost(tokens.size(), image ? image->capacity() : 0);
  if (bytes_ + cost > capacity_) return false;
  Entry e;
  e.tokens = std::move(tokens);
  e.image = std::move(image);
  e.hash = h;
  e.last_used = ++clock_;
  e.cost = cost;
  bytes_ += cost;
  entries_.push_back(std::move(e));
  return true;
}

}  // namespace geist::serve
