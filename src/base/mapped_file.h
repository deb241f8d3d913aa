// MappedFile: an RAII, read-only, private mapping of a whole file.
// open() maps the file and closes the descriptor at once; the mapping lives until the
// object is destroyed or moved from. Move-only. Reading the bytes is thread safe; the
// object itself is not synchronized. Cost: one open/fstat/mmap; pages fault in lazily.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"

namespace geist {

class MappedFile {
 public:
  MappedFile() = default;  // empty: data() == nullptr, size() == 0
  ~MappedFile();
  MappedFile(MappedFile &&other) noexcept;
  MappedFile &operator=(MappedFile &&other) noexcept;
  MappedFile(const MappedFile &) = delete;
  MappedFile &operator=(const MappedFile &) = delete;

  // Maps `path` read-only (PROT_READ, MAP_PRIVATE). GEIST_E_IO naming the path and
  // strerror if it cannot be opened, stat'ed or mapped, is not a regular file, or is
  // empty (a zero-length mapping is not possible).
  static Result<MappedFile> open(const std::string &path);

  const uint8_t *data() const { return data_; }
  size_t size() const { return size_; }
  const std::string &path() const { return path_; }
  bool is_mapped() const { return data_ != nullptr; }

  // madvise hints over [offset, offset + len) clamped to the mapping (rounded out to
  // pages); no-ops on an empty object. Failures are ignored: these are only hints.
  void advise_willneed(size_t offset = 0, size_t len = SIZE_MAX) const;
  void advise_sequential(size_t offset = 0, size_t len = SIZE_MAX) const;
  void advise_random(size_t offset = 0, size_t len = SIZE_MAX) const;
  // MADV_DONTNEED: drop the pages (e.g. after a backend repacked the weights). A later
  // read faults the file's bytes back in.
  void advise_dontneed(size_t offset = 0, size_t len = SIZE_MAX) const;

  // Unmaps now (idempotent).
  void reset();

 private:
  void advise(int advice, size_t offset, size_t len) const;

  std::string path_;
  const uint8_t *data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace geist
