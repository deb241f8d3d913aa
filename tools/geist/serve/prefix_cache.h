// The prefix cache of `geist serve`: saved session states (api::State: where the sessions
// keep their KV rows, device memory on a GPU) keyed by the tokens they hold, least recently
// used first out. The capacity is a hard cap in bytes: every entry is charged entry_cost()
// (the image's memory + tokens + a fixed overhead), room is made before an image is taken,
// and the sum never exceeds the capacity. An image is taken into an entry evicted to make
// its room where one fits (image_buffer()), so that a full cache saves states without
// allocating and faulting in fresh memory. Not thread-safe (the server's engine thread
// owns it).
//
// The cache is a template over the image type so that its bookkeeping is tested without a
// model: Image needs image_bytes(const Image &) (the memory it holds) and
// new_image(size_t bytes, Image *) (a fresh one for about that many bytes, or nullptr),
// declared before the template (api::State's, below) or beside Image (found by argument
// lookup: the tests' byte images).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "geist/geist.hpp"

namespace geist::serve {

// FNV-1a 64 of the tokens' little-endian bytes: the key of an entry (and its file name).
uint64_t tokens_hash(const int32_t *t, size_t n);

// Length of the longest common prefix of a[0..na) and b[0..nb).
size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb);

// The size a new image is charged at: image_bytes rounded up to a multiple of an eighth of
// its highest power of two (at most 1/8 more), so that images of about the same length
// (prompts a few tokens apart) fit in each other's memory.
size_t image_capacity(size_t image_bytes);

// Saved states, as the server keeps them.
inline size_t image_bytes(const api::State &s) { return s.bytes(); }
// A fresh, empty state (it takes its memory at the first save); nullptr if none can be made.
inline std::shared_ptr<api::State> new_image(size_t /*bytes*/, api::State *) {
  auto s = std::make_shared<api::State>();
  if (api::State::create(s.get())) return nullptr;
  return s;
}

template <class Image>
class PrefixCacheOf {
 public:
  struct Entry {
    std::vector<int32_t> tokens;
    // Shared with a pending disk write; read-only to everyone but the cache, which reuses
    // the image once it is evicted and no one else holds it.
    std::shared_ptr<Image> image;
    uint64_t hash = 0;
    uint64_t last_used = 0;
    size_t cost = 0;
  };

  // Fixed bytes charged per entry beside the image and the tokens (the entry, its map node
  // and allocator headers, rounded up).
  static constexpr size_t kEntryOverhead = 256;
  // image_bytes: the memory the image holds (its capacity), not what it uses.
  static size_t entry_cost(size_t n_tokens, size_t image_bytes) {
    return image_bytes + n_tokens * sizeof(int32_t) + kEntryOverhead;
  }

  explicit PrefixCacheOf(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The entry with the most tokens, all of them a prefix of p[0..n), at most max_len long;
  // nullptr if none. Marks it most recently used. The pointer is valid until the next
  // call that changes the cache.
  const Entry *find_longest_prefix(const int32_t *p, size_t n, size_t max_len) {
    Entry *best = nullptr;
    for (Entry &e : entries_) {
      const size_t len = e.tokens.size();
      if (len > n || len > max_len || (best && len <= best->tokens.size())) continue;
      if (std::memcmp(e.tokens.data(), p, len * sizeof(int32_t)) == 0) best = &e;
    }
    if (best) best->last_used = ++clock_;
    return best;
  }
  // The longest common prefix of p[0..n) with any entry's tokens (0 if empty).
  size_t longest_common_prefix(const int32_t *p, size_t n) const {
    size_t best = 0;
    for (const Entry &e : entries_) best = std::max(best, common_prefix(p, n, e.tokens.data(), e.tokens.size()));
    return best;
  }
  // Whether an entry holds exactly t[0..n) (marks it used if so).
  bool touch(const int32_t *t, size_t n) {
    const uint64_t h = tokens_hash(t, n);
    for (Entry &e : entries_) {
      if (e.hash == h && e.tokens.size() == n && std::equal(e.tokens.begin(), e.tokens.end(), t)) {
        e.last_used = ++clock_;
        return true;
      }
    }
    return false;
  }

  // Evicts least recently used entries until `cost` more bytes fit; false (nothing
  // evicted) if cost exceeds the capacity.
  bool make_room(size_t cost) { return make_room(cost, nullptr); }
  // An image for a new entry of n_tokens whose image needs image_bytes, with room made for
  // the entry (entry_cost(n_tokens, what it is charged) fits under the cap until insert());
  // nullptr (nothing evicted) if it cannot fit or no image can be made. The image is one
  // evicted to make the room when it holds image_bytes and is at most one rounding step
  // larger than image_capacity() (its memory is mapped already: faulting in a fresh 20 MB
  // buffer costs ~8 ms, docs/SERVE.md; a device allocation synchronises the GPU), else
  // new_image(image_capacity(image_bytes)). Images still shared (a pending disk write) are
  // never reused. Evicts like make_room.
  std::shared_ptr<Image> image_buffer(size_t n_tokens, size_t image_bytes) {
    const size_t want = image_capacity(image_bytes);
    std::vector<std::shared_ptr<Image>> freed;
    if (!make_room(entry_cost(n_tokens, want), &freed)) return nullptr;
    // The smallest evicted image that holds this one without wasting more than an eighth.
    std::shared_ptr<Image> buf;
    for (auto &b : freed) {
      const size_t c = image_bytes_of(*b);
      if (c >= image_bytes && c <= want + want / 8 && (!buf || c < image_bytes_of(*buf))) buf = b;
    }
    freed.clear();  // the rest go back to the system
    // An image larger than `want` is charged its size: room for the difference, or none.
    if (buf && image_bytes_of(*buf) > want && !make_room(entry_cost(n_tokens, image_bytes_of(*buf)))) buf.reset();
    if (buf) {
      ++buffers_reused_;
      return buf;
    }
    return new_image(want, static_cast<Image *>(nullptr));
  }
  // Adds an entry (after make_room(entry_cost(...)) or image_buffer() succeeded; replaces
  // one with the same tokens), charged entry_cost(tokens, image_bytes(*image)). If that is
  // more than the room made (a reused state can grow a little in the save: a longer token
  // list), least recently used entries make the rest. False if it cannot fit at all.
  bool insert(std::vector<int32_t> tokens, std::shared_ptr<Image> image) {
    const uint64_t h = tokens_hash(tokens.data(), tokens.size());
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].hash == h && entries_[i].tokens == tokens) {
        erase_at(i);
        break;
      }
    }
    const size_t cost = entry_cost(tokens.size(), image ? image_bytes_of(*image) : 0);
    if (!make_room(cost)) return false;
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

  size_t capacity() const { return capacity_; }
  size_t bytes() const { return bytes_; }
  size_t size() const { return entries_.size(); }
  uint64_t evictions() const { return evictions_; }
  uint64_t buffers_reused() const { return buffers_reused_; }  // by image_buffer()
  const std::vector<Entry> &entries() const { return entries_; }

 private:
  static size_t image_bytes_of(const Image &im) { return image_bytes(im); }
  void erase_at(size_t i) {
    bytes_ -= entries_[i].cost;
    entries_[i] = std::move(entries_.back());
    entries_.pop_back();
  }
  // make_room; evicted images no one else holds are moved to *freed when it is not null.
  bool make_room(size_t cost, std::vector<std::shared_ptr<Image>> *freed) {
    if (cost > capacity_) return false;
    while (bytes_ + cost > capacity_) {
      size_t lru = 0;
      for (size_t i = 1; i < entries_.size(); ++i) {
        if (entries_[i].last_used < entries_[lru].last_used) lru = i;
      }
      std::shared_ptr<Image> &img = entries_[lru].image;
      if (freed && img && img.use_count() == 1) {
        // No one else holds it, and only this thread could hand out a new reference. The
        // disk writer's release of its reference is an acq_rel decrement; this fence orders
        // that thread's reads of the image before the writes of whoever reuses it.
        std::atomic_thread_fence(std::memory_order_acquire);
        freed->push_back(std::move(img));
      }
      erase_at(lru);
      ++evictions_;
    }
    return true;
  }

  size_t capacity_;
  size_t bytes_ = 0;
  uint64_t clock_ = 0;
  uint64_t evictions_ = 0;
  uint64_t buffers_reused_ = 0;
  std::vector<Entry> entries_;  // unordered; a few hundred at most, scanned linearly
};

using PrefixCache = PrefixCacheOf<api::State>;

}  // namespace geist::serve
