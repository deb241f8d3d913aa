#include "cache_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace geist::serve {

namespace {

constexpr size_t kHexDigits = 16;
constexpr char kTempInfix[] = ".tmp.";

bool parse_hash(const std::string &name, uint64_t *hash) {
  if (name.size() < kHexDigits) return false;
  uint64_t h = 0;
  for (size_t i = 0; i < kHexDigits; ++i) {
    const char c = name[i];
    const int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (v < 0) return false;
    h = h << 4 | uint64_t(v);
  }
  *hash = h;
  return true;
}

// Whether process pid exists (a process of another user counts: EPERM).
bool process_running(long pid) {
  return ::kill(pid_t(pid), 0) == 0 || errno == EPERM;
}

}  // namespace

bool cache_entry_name(const std::string &name, uint64_t *hash) {
  constexpr size_t n = kHexDigits + sizeof kCacheFileSuffix - 1;
  return name.size() == n && name.compare(kHexDigits, std::string::npos, kCacheFileSuffix) == 0 &&
         parse_hash(name, hash);
}

std::string cache_temp_name(const std::string &entry_path, long pid) {
  return entry_path + kTempInfix + std::to_string(pid);
}

bool cache_temp_name_pid(const std::string &name, long *pid) {
  constexpr size_t entry = kHexDigits + sizeof kCacheFileSuffix - 1;
  constexpr size_t infix = sizeof kTempInfix - 1;
  uint64_t h = 0;
  if (name.size() <= entry + infix || !cache_entry_name(name.substr(0, entry), &h) ||
      name.compare(entry, infix, kTempInfix) != 0) {
    return false;
  }
  const std::string digits = name.substr(entry + infix);
  if (digits.size() > 9 || digits[0] == '0') return false;  // pids are below 2^22
  long p = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
    p = p * 10 + (c - '0');
  }
  *pid = p;
  return true;
}

size_t cache_remove_stale_temps(const std::string &dir, size_t *kept, std::string *why_kept) {
  size_t removed = 0, left = 0;
  if (kept) *kept = 0;
  DIR *d = ::opendir(dir.c_str());
  if (!d) return 0;
  const int dfd = ::dirfd(d);
  std::vector<std::string> names;
  while (const dirent *e = ::readdir(d)) {
    long pid = 0;
    if (cache_temp_name_pid(e->d_name, &pid)) names.emplace_back(e->d_name);
  }
  for (const std::string &name : names) {
    long pid = 0;
    cache_temp_name_pid(name, &pid);
    auto keep = [&](const std::string &why) {
      ++left;
      if (why_kept) *why_kept = name + ": " + why;
    };
    if (pid != long(::getpid()) && process_running(pid)) {
      keep("its writer, process " + std::to_string(pid) + ", may be running");
      continue;
    }
    // O_NOFOLLOW: a symlink is not opened (nor what it points to).
    const int fd = ::openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      keep("not a regular file geist can open");
      continue;
    }
    struct stat st {};
    char b[8] = {};
    const ssize_t got =
        ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? ::pread(fd, b, sizeof b, 0) : -1;
    ::close(fd);
    // What a writer of ours had written: nothing yet, part of the magic, or the magic.
    const bool ours = got >= 0 && size_t(got) == std::min<size_t>(sizeof b, size_t(st.st_size)) &&
                      std::memcmp(b, kCacheFileMagic, size_t(got)) == 0;
    if (!ours) {
      keep("not a regular file that starts as a geist snapshot");
      continue;
    }
    // Still the file read above (not one put in its place since).
    struct stat now {};
    if (::fstatat(dfd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_dev != st.st_dev ||
        now.st_ino != st.st_ino) {
      keep("replaced while it was checked");
      continue;
    }
    if (::unlinkat(dfd, name.c_str(), 0) == 0) {
      ++removed;
    } else {
      keep(std::strerror(errno));
    }
  }
  ::closedir(d);
  if (kept) *kept = left;
  return removed;
}

}  // namespace geist::serve
