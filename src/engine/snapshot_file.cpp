#include "engine/snapshot_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "base/file_util.h"

namespace geist {
namespace {

// A descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd &) = delete;
  Fd &operator=(const Fd &) = delete;
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

int open_retry(int dirfd, const char *path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::openat(dirfd, path, flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

// Reads up to n bytes at offset; returns the count read, or -1 (errno set).
ssize_t pread_full(int fd, void *buf, size_t n, off_t offset) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, static_cast<uint8_t *>(buf) + got, n - got, offset + off_t(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += size_t(r);
  }
  return ssize_t(got);
}

bool write_full(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = EIO;
      return false;
    }
    p += r;
    n -= size_t(r);
  }
  return true;
}

std::string base_of(const std::string &path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// True if name is base + ".tmp." followed by digits and dots only (a temporary file of a
// snapshot write to base, by this or an earlier version of geist).
bool is_temp_name(const std::string &name, const std::string &base) {
  const std::string prefix = base + ".tmp.";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if ((name[i] < '0' || name[i] > '9') && name[i] != '.') return false;
  }
  return true;
}

// Removes temporary files of base that a killed writer left in the directory. A writer
// holds flock on its temporary file from creation to rename, so a file whose lock we
// get has no live writer. Only files that are geist's are removed: starting with the
// magic, or empty and older than a minute (created, killed before the first byte).
void remove_stale_temps(int dirfd, const std::string &base) {
  const int dup_fd = ::dup(dirfd);
  if (dup_fd < 0) return;
  DIR *d = ::fdopendir(dup_fd);
  if (d == nullptr) {
    ::close(dup_fd);
    return;
  }
  while (const dirent *e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!is_temp_name(name, base)) continue;
    Fd fd(open_retry(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK));
    struct stat st {};
    if (fd.get() < 0 || fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) continue;  // a live writer
    char head[8];
    bool ours = false;
    if (st.st_size == 0) {
      ours = std::time(nullptr) - st.st_mtime > 60;
    } else {
      ours = pread_full(fd.get(), head, 8, 0) == 8 && std::memcmp(head, kSnapshotMagic, 8) == 0;
    }
    if (ours) ::unlinkat(dirfd, name.c_str(), 0);
  }
  ::closedir(d);
}

std::atomic<unsigned> g_temp_counter{0};

// The rule for what is at path now (nothing, an empty regular file, or a snapshot); no
// directory probe.
Status check_existing_target(const std::string &path) {
  if (path.empty()) return GEIST_ERROR(GEIST_E_IO, "cannot write a snapshot: the path is empty");
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      return GEIST_ERROR(GEIST_E_IO,
                         "refusing to write '%s': it is a symbolic link (geist writes snapshots only to regular "
                         "files; give the link's target)",
                         path.c_str());
    }
    if (!S_ISREG(st.st_mode)) {
      return GEIST_ERROR(GEIST_E_IO, "refusing to write '%s': it is %s, not a geist snapshot file", path.c_str(),
                         file_kind(st.st_mode));
    }
    if (st.st_size > 0) {
      Fd fd(open_retry(AT_FDCWD, path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK));
      if (fd.get() < 0) {
        return GEIST_ERROR(GEIST_E_IO, "refusing to write '%s': cannot read it to check that it is a snapshot: %s",
                           path.c_str(), std::strerror(errno));
      }
      char head[8];
      if (pread_full(fd.get(), head, 8, 0) != 8 || std::memcmp(head, kSnapshotMagic, 8) != 0) {
        return GEIST_ERROR(GEIST_E_IO,
                           "refusing to overwrite '%s': it exists and is not a geist snapshot (geist replaces only "
                           "its own snapshot files; remove it or choose another path)",
                           path.c_str());
      }
    }
  } else if (errno != ENOENT) {
    return GEIST_ERROR(GEIST_E_IO, "cannot write '%s': %s", path.c_str(), std::strerror(errno));
  }
  return Status::ok();
}

}  // namespace

Status check_snapshot_target(const std::string &path) {
  GEIST_RETURN_IF_ERROR(check_existing_target(path));
  // The directory must take a new file: probe with an unnamed temporary file, which
  // leaves nothing behind; without O_TMPFILE support, ask access().
  const std::string dir = dir_of(path);
  struct stat ds {};
  if (::stat(dir.c_str(), &ds) != 0) {
    return GEIST_ERROR(GEIST_E_IO, "cannot write '%s': directory '%s': %s", path.c_str(), dir.c_str(),
                       std::strerror(errno));
  }
  if (!S_ISDIR(ds.st_mode)) {
    return GEIST_ERROR(GEIST_E_IO, "cannot write '%s': '%s' is %s", path.c_str(), dir.c_str(), file_kind(ds.st_mode));
  }
  const int probe = open_retry(AT_FDCWD, dir.c_str(), O_TMPFILE | O_WRONLY, 0600);
  if (probe >= 0) {
    ::close(probe);
    return Status::ok();
  }
  const int e = errno;
  if (e == EOPNOTSUPP || e == EISDIR || e == EINVAL) {
    if (::access(dir.c_str(), W_OK | X_OK) == 0) return Status::ok();
    return GEIST_ERROR(GEIST_E_IO, "cannot write '%s': directory '%s': %s", path.c_str(), dir.c_str(),
                       std::strerror(errno));
  }
  return GEIST_ERROR(GEIST_E_IO, "cannot write '%s': directory '%s': %s", path.c_str(), dir.c_str(),
                     std::strerror(e));
}

Status write_snapshot_file(const std::string &path, const uint8_t *data, size_t n) {
  // Nothing touches path before the rename, and the rule is checked right before it.
  const std::string dir = dir_of(path), base = base_of(path);
  Fd dirfd(open_retry(AT_FDCWD, dir.c_str(), O_RDONLY | O_DIRECTORY));
  if (dirfd.get() < 0) {
    return GEIST_ERROR(GEIST_E_IO, "cannot open directory '%s': %s", dir.c_str(), std::strerror(errno));
  }
  remove_stale_temps(dirfd.get(), base);

  auto temp_name = [&] {
    return base + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(g_temp_counter.fetch_add(1));
  };
  auto io_error = [&](const char *what, int e) {
    return GEIST_ERROR(GEIST_E_IO, "cannot write '%s' (%s): %s", path.c_str(), what, std::strerror(e));
  };
  // The bytes go to an unnamed file first (nothing is left if we are killed while
  // writing), which is then linked under a temporary name and renamed over path.
  std::string name;  // the linked temporary name, once it exists
  Fd fd(open_retry(dirfd.get(), ".", O_TMPFILE | O_WRONLY, 0666));
  bool linked = false;
  if (fd.get() >= 0) {
    if (!write_full(fd.get(), data, n) || ::fsync(fd.get()) != 0) return io_error("write", errno);
    ::flock(fd.get(), LOCK_EX);  // held until the rename, like a named temporary's
    name = temp_name();
    char proc[64];
    std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd.get());
    linked = ::linkat(fd.get(), "", dirfd.get(), name.c_str(), AT_EMPTY_PATH) == 0 ||
             ::linkat(AT_FDCWD, proc, dirfd.get(), name.c_str(), AT_SYMLINK_FOLLOW) == 0;
  }
  if (!linked) {  // no O_TMPFILE here, or no way to link it: a named temporary file
    name = temp_name();
    fd.reset(open_retry(dirfd.get(), name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0666));
    if (fd.get() < 0) return io_error("create a temporary file", errno);
    ::flock(fd.get(), LOCK_EX);  // before the first byte: remove_stale_temps skips it
    if (!write_full(fd.get(), data, n) || ::fsync(fd.get()) != 0) {
      const int e = errno;
      ::unlinkat(dirfd.get(), name.c_str(), 0);
      return io_error("write", e);
    }
  }
  // path may have changed while we wrote: check the rule again right before replacing.
  if (Status s = check_existing_target(path); !s) {
    ::unlinkat(dirfd.get(), name.c_str(), 0);
    return s;
  }
  if (::renameat(dirfd.get(), name.c_str(), dirfd.get(), base.c_str()) != 0) {
    const int e = errno;
    ::unlinkat(dirfd.get(), name.c_str(), 0);
    return io_error("rename", e);
  }
  ::fsync(dirfd.get());  // the rename itself is durable
  return Status::ok();
}

Status read_snapshot_file(const std::string &path, size_t header_bytes,
                          const std::function<Status(const uint8_t *, size_t, uint64_t)> &check,
                          std::vector<uint8_t> *out) {
  Fd fd(open_retry(AT_FDCWD, path.c_str(), O_RDONLY | O_NONBLOCK));  // a FIFO must not block
  if (fd.get() < 0) return GEIST_ERROR(GEIST_E_IO, "cannot open '%s': %s", path.c_str(), std::strerror(errno));
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) {
    return GEIST_ERROR(GEIST_E_IO, "cannot stat '%s': %s", path.c_str(), std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return GEIST_ERROR(GEIST_E_IO, "'%s' is %s, not a snapshot file", path.c_str(), file_kind(st.st_mode));
  }
  const uint64_t size = uint64_t(st.st_size);
  std::vector<uint8_t> head(size_t(std::min<uint64_t>(header_bytes, size)));
  const ssize_t got = pread_full(fd.get(), head.data(), head.size(), 0);
  if (got < 0) return GEIST_ERROR(GEIST_E_IO, "cannot read '%s': %s", path.c_str(), std::strerror(errno));
  GEIST_RETURN_IF_ERROR(check(head.data(), size_t(got), size));
  if (size > SIZE_MAX) return GEIST_ERROR(GEIST_E_OUT_OF_MEMORY, "'%s' is too large", path.c_str());
  std::vector<uint8_t> img(static_cast<size_t>(size));
  const ssize_t r = pread_full(fd.get(), img.data(), img.size(), 0);
  if (r < 0) return GEIST_ERROR(GEIST_E_IO, "cannot read '%s': %s", path.c_str(), std::strerror(errno));
  if (uint64_t(r) != size) {
    return GEIST_ERROR(GEIST_E_IO, "'%s' changed while it was read (%zd of %llu bytes)", path.c_str(), r,
                       (unsigned long long)size);
  }
  *out = std::move(img);
  return Status::ok();
}

}  // namespace geist
