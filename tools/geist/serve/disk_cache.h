// The disk tier of the prefix cache (--cache-dir): each cache entry is also written to
// DIR/<16 hex digits of tokens_hash>.geistsnap, a plain session snapshot (checksummed,
// docs/SNAPSHOT.md) made from the entry's saved state on the writer thread, so a restarted
// server answers a known prefix warm.
// - Writes run on a thread of their own, atomically (a temporary file, fsync, rename,
//   fsync of the directory) and only over a path that geist_snapshot_file_check allows
//   (absent, empty, or already a geist snapshot): a file geist did not write is never
//   replaced. At most kMaxPending states wait; more are dropped (an entry is optional).
// - A file's modification time is its entry's last use: put() writes it, touch() (a
//   request that restored the entry, or found it already cached) sets it to now. So
//   "newest" below means most recently used, not most recently written: a shared prefix
//   snapshotted once and restored by every request since stays among the newest.
// - At startup the files are read newest first; each is validated by a full restore
//   (checksum included) before it is used, and one whose name is not its tokens' hash is
//   skipped. A corrupt or foreign file is reported and ignored, never served.
// - The files geist wrote are kept under a byte budget, the least recently used removed
//   first. open() removes the temporary files that a server killed while writing left
//   (cache_remove_stale_temps: geist's temporary names and bytes, of a process that is
//   gone); nothing else in the directory is ever removed or replaced.
// Thread-safe: put() and touch() from the engine thread, the rest from the server's main thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "geist/geist.hpp"

namespace geist::serve {

class DiskCache {
 public:
  static constexpr size_t kMaxPending = 8;
  static constexpr size_t kMaxTouches = 1024;

  DiskCache(std::string dir, size_t budget_bytes) : dir_(std::move(dir)), budget_(budget_bytes) {}
  ~DiskCache() { flush(); }

  // Creates the directory if needed and checks it takes files; starts the writer.
  api::Error open();

  struct File {
    std::string path;
    uint64_t hash = 0;  // from the name
    std::vector<uint8_t> image;
  };
  // The entry files, newest first, whose sizes sum to at most max_bytes (read, not yet
  // validated: the caller restores each before trusting it).
  std::vector<File> read_all(size_t max_bytes) const;

  // Queues the state (of tokens with this hash) for writing as a snapshot file. The
  // caller does not save into it while it is shared (the cache reuses only images no one
  // else holds).
  void put(uint64_t hash, std::shared_ptr<const api::State> state);
  // Marks the entry file of this hash used now (its modification time; on the writer
  // thread, after the writes queued before). Nothing if there is no such file of ours.
  void touch(uint64_t hash);
  // Writes what is queued and stops the writer.
  void flush();

  uint64_t written() const;
  uint64_t dropped() const;

 private:
  void writer();
  void write_one(uint64_t hash, const api::State &state);
  void enforce_budget();
  void touch_one(uint64_t hash);
  std::string path_of(uint64_t hash) const;

  std::string dir_;
  size_t budget_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, std::shared_ptr<const api::State>>> pending_;
  std::vector<uint64_t> touches_;  // distinct hashes, at most kMaxTouches
  bool stop_ = false;
  uint64_t written_ = 0, dropped_ = 0;
  std::thread thread_;
};

}  // namespace geist::serve
