#include "disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "cache_files.h"

namespace geist::serve {

namespace fs = std::filesystem;

namespace {

bool starts_with_magic(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return false;
  char b[8];
  const bool ok = ::read(fd, b, 8) == 8 && std::memcmp(b, kCacheFileMagic, 8) == 0;
  ::close(fd);
  return ok;
}

bool write_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

}  // namespace

std::string DiskCache::path_of(uint64_t hash) const {
  char b[32];
  std::snprintf(b, sizeof b, "%016" PRIx64, hash);
  return dir_ + "/" + b + kCacheFileSuffix;
}

api::Error DiskCache::open() {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (!fs::is_directory(dir_, ec)) {
    return api::Error{GEIST_E_IO,
                      "--cache-dir '" + dir_ + "' is not a directory that can be created"};
  }
  // The rule geist applies to every snapshot it writes, on a name of ours.
  if (api::Error e = api::snapshot_file_check(path_of(0))) {
    return api::Error{e.status, "--cache-dir '" + dir_ + "': " + e.message};
  }
  // A server killed while it wrote an entry left its temporary file (never an entry: the
  // rename is atomic). Only those are removed, before this process writes any.
  size_t kept = 0;
  std::string why;
  const size_t removed = cache_remove_stale_temps(dir_, &kept, &why);
  if (removed > 0) {
    std::fprintf(stderr,
                 "geist serve: cache dir %s: removed %zu temporary file%s left by a writer\n",
                 dir_.c_str(), removed, removed == 1 ? "" : "s");
  }
  if (kept > 0) {
    std::fprintf(stderr, "geist serve: cache dir %s: left %zu file%s with a temporary name (%s)\n",
                 dir_.c_str(), kept, kept == 1 ? "" : "s", why.c_str());
  }
  thread_ = std::thread([this] { writer(); });
  return {};
}

std::vector<DiskCache::File> DiskCache::read_all(size_t max_bytes) const {
  struct Found {
    std::string path;
    uint64_t hash;
    fs::file_time_type mtime;
    uintmax_t size;
  };
  std::vector<Found> found;
  std::error_code ec;
  for (const fs::directory_entry &de : fs::directory_iterator(dir_, ec)) {
    uint64_t h = 0;
    if (!cache_entry_name(de.path().filename().string(), &h)) continue;
    std::error_code e2;
    if (!de.is_regular_file(e2) || de.is_symlink(e2)) continue;
    found.push_back({de.path().string(), h, de.last_write_time(e2), de.file_size(e2)});
  }
  std::sort(found.begin(), found.end(),
            [](const Found &a, const Found &b) { return a.mtime > b.mtime; });
  std::vector<File> out;
  size_t total = 0;
  for (const Found &f : found) {
    if (f.size < 72 || total + f.size > max_bytes) continue;
    File file;
    file.path = f.path;
    file.hash = f.hash;
    file.image.resize(size_t(f.size));
    const int fd = ::open(f.path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    size_t got = 0;
    while (got < file.image.size()) {
      const ssize_t r = ::read(fd, file.image.data() + got, file.image.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      got += size_t(r);
    }
    ::close(fd);
    if (got != file.image.size()) continue;
    total += got;
    out.push_back(std::move(file));
  }
  return out;
}

void DiskCache::put(uint64_t hash, std::shared_ptr<const api::State> state) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_ || !thread_.joinable()) return;
  if (pending_.size() >= kMaxPending) {
    ++dropped_;
    return;
  }
  pending_.emplace_back(hash, std::move(state));
  cv_.notify_all();
}

void DiskCache::touch(uint64_t hash) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_ || !thread_.joinable()) return;
  if (std::find(touches_.begin(), touches_.end(), hash) != touches_.end()) return;
  if (touches_.size() >= kMaxTouches) return;  // the writer is far behind; a hint only
  touches_.push_back(hash);
  cv_.notify_all();
}

void DiskCache::flush() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

uint64_t DiskCache::written() const {
  std::lock_guard<std::mutex> lk(mu_);
  return written_;
}

uint64_t DiskCache::dropped() const {
  std::lock_guard<std::mutex> lk(mu_);
  return dropped_;
}

void DiskCache::writer() {
  for (;;) {
    std::pair<uint64_t, std::shared_ptr<const api::State>> job;
    std::vector<uint64_t> touches;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !pending_.empty() || !touches_.empty(); });
      if (pending_.empty() && touches_.empty()) return;  // stop_ and nothing left
      if (!pending_.empty()) {
        job = std::move(pending_.front());
        pending_.pop_front();
      } else {
        touches.swap(touches_);  // after the writes queued before them
      }
    }
    if (job.second) {
      write_one(job.first, *job.second);
      enforce_budget();
    }
    for (uint64_t h : touches) touch_one(h);
  }
}

void DiskCache::write_one(uint64_t hash, const api::State &state) {
  const std::string path = path_of(hash);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(path, ec))) return;  // the same prefix is already there
  if (api::Error e = api::snapshot_file_check(path)) {
    std::fprintf(stderr, "geist serve: warning: not writing the cache file: %s\n",
                 e.message.c_str());
    return;
  }
  // The state's image (its KV rows come to the host here, on this thread, off the
  // requests' path); freed when the file is written.
  std::vector<uint8_t> image;
  if (api::Error e = state.snapshot(&image)) {
    std::fprintf(stderr, "geist serve: warning: not writing the cache file: %s\n",
                 e.message.c_str());
    return;
  }
  const std::string tmp = cache_temp_name(path, long(::getpid()));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "geist serve: warning: cannot create '%s': %s\n", tmp.c_str(),
                 std::strerror(errno));
    return;
  }
  const bool ok = write_all(fd, image.data(), image.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "geist serve: warning: cannot write '%s': %s\n", path.c_str(),
                 std::strerror(errno));
    ::unlink(tmp.c_str());
    return;
  }
  const int dfd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  std::lock_guard<std::mutex> lk(mu_);
  ++written_;
}

void DiskCache::touch_one(uint64_t hash) {
  // Only a regular file (not a symlink) of this name that holds a geist snapshot.
  const std::string path = path_of(hash);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;  // not written (dropped, or removed by the budget): nothing to mark
  struct stat st {};
  char b[8];
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::pread(fd, b, 8, 0) == 8 &&
      std::memcmp(b, kCacheFileMagic, 8) == 0) {
    ::futimens(fd, nullptr);  // both times to now
  }
  ::close(fd);
}

void DiskCache::enforce_budget() {
  // Only files named as ours that hold a geist snapshot are counted and removed.
  struct Mine {
    std::string path;
    fs::file_time_type mtime;
    uintmax_t size;
  };
  std::vector<Mine> mine;
  uintmax_t total = 0;
  std::error_code ec;
  for (const fs::directory_entry &de : fs::directory_iterator(dir_, ec)) {
    uint64_t h = 0;
    std::error_code e2;
    if (!cache_entry_name(de.path().filename().string(), &h) || de.is_symlink(e2) ||
        !de.is_regular_file(e2))
      continue;
    if (!starts_with_magic(de.path().string())) continue;
    mine.push_back({de.path().string(), de.last_write_time(e2), de.file_size(e2)});
    total += mine.back().size;
  }
  if (total <= budget_) return;
  std::sort(mine.begin(), mine.end(),
            [](const Mine &a, const Mine &b) { return a.mtime < b.mtime; });
  for (const Mine &m : mine) {
    if (total <= budget_) break;
    if (::unlink(m.path.c_str()) == 0) total -= m.size;
  }
}

}  // namespace geist::serve
