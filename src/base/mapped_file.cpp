#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "base/file_util.h"

namespace geist {

MappedFile::~MappedFile() {
  reset();
}

MappedFile::MappedFile(MappedFile &&other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile &MappedFile::operator=(MappedFile &&other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::reset() {
  if (data_ != nullptr) {
    munmap(const_cast<uint8_t *>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }
}

Result<MappedFile> MappedFile::open(const std::string &path) {
  int fd;
  do {
    // O_NONBLOCK: a FIFO without a writer would block open() forever; it is refused below.
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    return GEIST_ERROR(GEIST_E_IO, "cannot open '%s': %s", path.c_str(), std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return GEIST_ERROR(GEIST_E_IO, "cannot stat '%s': %s", path.c_str(), std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return GEIST_ERROR(GEIST_E_IO, "cannot map '%s': it is %s, not a regular file", path.c_str(),
                       file_kind(st.st_mode));
  }
  if (st.st_size <= 0) {
    ::close(fd);
    return GEIST_ERROR(GEIST_E_IO, "cannot map '%s': the file is empty (0 bytes)", path.c_str());
  }
  size_t size = static_cast<size_t>(st.st_size);
  void *p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps its own reference to the file
  if (p == MAP_FAILED) {
    return GEIST_ERROR(GEIST_E_IO, "cannot mmap '%s' (%zu bytes): %s", path.c_str(), size,
                       std::strerror(err));
  }
  MappedFile m;
  m.path_ = path;
  m.data_ = static_cast<const uint8_t *>(p);
  m.size_ = size;
  return m;
}

void MappedFile::advise(int advice, size_t offset, size_t len) const {
  if (data_ == nullptr || offset >= size_) return;
  if (len > size_ - offset) len = size_ - offset;
  // madvise needs a page-aligned start: round the start down (the mapping itself is
  // page aligned, so the rounded start stays inside it).
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t start = offset / page * page;
  len += offset - start;
  madvise(const_cast<uint8_t *>(data_) + start, len, advice);
}

void MappedFile::advise_willneed(size_t offset, size_t len) const {
  advise(MADV_WILLNEED, offset, len);
}
void MappedFile::advise_sequential(size_t offset, size_t len) const {
  advise(MADV_SEQUENTIAL, offset, len);
}
void MappedFile::advise_random(size_t offset, size_t len) const {
  advise(MADV_RANDOM, offset, len);
}
void MappedFile::advise_dontneed(size_t offset, size_t len) const {
  advise(MADV_DONTNEED, offset, len);
}

}  // namespace geist
