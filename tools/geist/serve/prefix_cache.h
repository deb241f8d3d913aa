// The prefix cache of `geist serve`: session snapshots (opaque images, docs/SNAPSHOT.md)
// keyed by the tokens they hold, least recently used first out. The capacity is a hard
// cap in bytes: every entry is charged entry_cost() (the image buffer's capacity + tokens
// + a fixed overhead), room is made before an image is taken, and the sum never exceeds
// the capacity. An image is taken into the buffer of an entry evicted to make its room
// where one fits (image_buffer()), so that a full cache takes snapshots without faulting
// in fresh memory. Model-free; not thread-safe (the server's engine thread owns it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace geist::serve {

// FNV-1a 64 of the tokens' little-endian bytes: the key of an entry (and its file name).
uint64_t tokens_hash(const int32_t *t, size_t n);

// Length of the longest common prefix of a[0..na) and b[0..nb).
size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb);

class PrefixCache {
 public:
  struct Entry {
    std::vector<int32_t> tokens;
    // Shared with a pending disk write; read-only to everyone but the cache, which reuses
    // the buffer once it is evicted and no one else holds it.
    std::shared_ptr<std::vector<uint8_t>> image;
    uint64_t hash = 0;
    uint64_t last_used = 0;
    size_t cost = 0;
  };

  // Fixed bytes charged per entry beside the image and the tokens (the entry, its map node
  // and allocator headers, rounded up).
  static constexpr size_t kEntryOverhead = 256;
  // image_bytes: the image buffer's capacity (what it holds in memory), not its size.
  static size_t entry_cost(size_t n_tokens, size_t image_bytes) {
    return image_bytes + n_tokens * sizeof(int32_t) + kEntryOverhead;
  }
  // The capacity a new image buffer is given: image_bytes rounded up to a multiple of an
  // eighth of its highest power of two (at most 1/8 more), so that images of about the
  // same length (prompts a few tokens apart) fit in each other's buffers.
  static size_t image_capacity(size_t image_bytes);

  explicit PrefixCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The entry with the most tokens, all of them a prefix of p[0..n), at most max_len long;
  // nullptr if none. Marks it most recently used. The pointer is valid until the next
  // call that changes the cache.
  const Entry *find_longest_prefix(const int32_t *p, size_t n, size_t max_len);
  // The longest common prefix of p[0..n) with any entry's tokens (0 if empty).
  size_t longest_common_prefix(const int32_t *p, size_t n) const;
  // Whether an entry holds exactly t[0..n) (marks it used if so).
  bool touch(const int32_t *t, size_t n);

  // Evicts least recently used entries until `cost` more bytes fit; false (nothing
  // evicted) if cost exceeds the capacity.
  bool make_room(size_t cost);
  // A buffer for the image of a new entry of n_tokens whose image has image_bytes, with
  // room made for the entry (entry_cost(n_tokens, buffer capacity) fits under the cap until
  // insert()); nullptr (nothing evicted) if it cannot fit. The buffer is that of an entry
  // evicted to make the room when one holds image_bytes and is at most one rounding step
  // larger than image_capacity() (its pages are mapped already: faulting in a fresh 20 MB
  // buffer costs ~8 ms, docs/SERVE.md), else new memory reserved at image_capacity().
  // Images still shared (a pending disk write) are never reused. Evicts like make_room.
  std::shared_ptr<std::vector<uint8_t>> image_buffer(size_t n_tokens, size_t image_bytes);
  // Adds an entry (after make_room(entry_cost(...)) or image_buffer() succeeded; replaces
  // one with the same tokens), charged entry_cost(tokens, image->capacity()). False if it
  // does not fit.
  bool insert(std::vector<int32_t> tokens, std::shared_ptr<std::vector<uint8_t>> image);

  size_t capacity() const { return capacity_; }
  size_t bytes() const { return bytes_; }
  size_t size() const { return entries_.size(); }
  uint64_t evictions() const { return evictions_; }
  uint64_t buffers_reused() const { return buffers_reused_; }  // by image_buffer()
  const std::vector<Entry> &entries() const { return entries_; }

 private:
  void erase_at(size_t i);
  // make_room; evicted images no one else holds are moved to *freed when it is not null.
  bool make_room(size_t cost, std::vector<std::shared_ptr<std::vector<uint8_t>>> *freed);
  size_t capacity_;
  size_t bytes_ = 0;
  uint64_t clock_ = 0;
  uint64_t evictions_ = 0;
  uint64_t buffers_reused_ = 0;
  std::vector<Entry> entries_;  // unordered; a few hundred at most, scanned linearly
};

}  // namespace geist::serve
