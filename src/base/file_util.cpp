#include "base/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace geist {

const char *file_kind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

Status read_file_limited(const std::string &path, size_t max_bytes, std::string *out) {
  // O_NONBLOCK: opening a FIFO without a writer must not hang; reads are made blocking
  // again below (a pipe whose writer is slow is still read to its end).
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return GEIST_ERROR(GEIST_E_IO, "cannot open '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return GEIST_ERROR(GEIST_E_IO, "cannot stat '%s': %s", path.c_str(), std::strerror(e));
  }
  if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISCHR(st.st_mode)) {
    ::close(fd);
    return GEIST_ERROR(GEIST_E_IO, "cannot read '%s': it is %s", path.c_str(), file_kind(st.st_mode));
  }
  if (S_ISREG(st.st_mode) && uint64_t(st.st_size) > max_bytes) {
    ::close(fd);
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "'%s' is %llu bytes; the limit is %zu bytes", path.c_str(),
                       (unsigned long long)st.st_size, max_bytes);
  }
  const int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  std::string buf;
  // Grow as the bytes arrive (a FIFO's size is unknown); never past max_bytes + 1.
  size_t n = 0;
  for (;;) {
    if (buf.size() - n < 65536) buf.resize(std::min(max_bytes + 1, std::max<size_t>(n + 65536, 2 * n)));
    if (n == buf.size()) break;  // max_bytes + 1 read
    const ssize_t r = ::read(fd, &buf[n], buf.size() - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      ::close(fd);
      return GEIST_ERROR(GEIST_E_IO, "cannot read '%s': %s", path.c_str(), std::strerror(e));
    }
    if (r == 0) break;
    n += size_t(r);
  }
  ::close(fd);
  if (n > max_bytes) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "'%s' holds more than %zu bytes (the limit)", path.c_str(),
                       max_bytes);
  }
  buf.resize(n);
  *out = std::move(buf);
  return Status::ok();
}

bool same_file(const std::string &a, const std::string &b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

std::string dir_of(const std::string &path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace geist
