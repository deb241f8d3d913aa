#include "bench_env.h"

#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string_view>

#include "base/thread_pool.h"
#include "bench_sha256.h"

namespace geist::cli {

namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0 || line.rfind("Model", 0) == 0) {
      const size_t c = line.find(':');
      if (c != std::string::npos) {
        size_t b = line.find_first_not_of(" \t", c + 1);
        return b == std::string::npos ? "unknown" : line.substr(b);
      }
    }
  }
  return "unknown";
}

// The highest x86-64 level the CPU supports, and the extensions the kernels care about.
void cpu_isa(std::string *level, std::vector<std::string> *features) {
#if defined(__x86_64__)
  __builtin_cpu_init();
#define GEIST_BENCH_FEATURE(f) \
  if (__builtin_cpu_supports(f)) features->push_back(f)
  GEIST_BENCH_FEATURE("sse4.2");
  GEIST_BENCH_FEATURE("avx");
  GEIST_BENCH_FEATURE("avx2");
  GEIST_BENCH_FEATURE("fma");
#if !defined(__clang__)  // clang 14's __builtin_cpu_supports knows neither name
  GEIST_BENCH_FEATURE("f16c");
  GEIST_BENCH_FEATURE("avxvnni");
#endif
  GEIST_BENCH_FEATURE("avx512f");
  GEIST_BENCH_FEATURE("avx512bw");
  GEIST_BENCH_FEATURE("avx512vl");
  GEIST_BENCH_FEATURE("avx512dq");
  GEIST_BENCH_FEATURE("avx512vnni");
  GEIST_BENCH_FEATURE("avx512bf16");
  // The x86-64 level, from the features its definition needs that both compilers name
  // (clang 14 has no "x86-64-vN" strings).
  auto has = [&](const char *f) { return std::find(features->begin(), features->end(), f) != features->end(); };
  if (has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq") && has("avx2") && has("fma")) {
    *level = "x86-64-v4";
  } else if (has("avx2") && has("fma") && has("avx")) {
    *level = "x86-64-v3";
  } else if (has("sse4.2")) {
    *level = "x86-64-v2";
  } else {
    *level = "x86-64";
  }
#undef GEIST_BENCH_FEATURE
#else
  *level = "not x86-64";
  (void)features;
#endif
}

// What the kernels run: the clone the ifunc resolver picks is the highest compiled level
// the CPU supports.

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

bench::Environment collect_environment(const std::string &command, const api::Model &m,
                                       const std::string &path, int threads, int64_t n_ctx,
                                       bool hash) {
  bench::Environment e;
  e.command = command;
  // geist_version(): "0.1.0 (commit abcdef123456)".
  const std::string v = geist_version();
  const size_t sp = v.find(' ');
  e.geist_version = v.substr(0, sp);
  const size_t c = v.find("commit ");
  e.geist_commit = c == std::string::npos ? "unknown" : v.substr(c + 7, v.find(')', c) - (c + 7));
  e.cpu = cpu_model();
  e.cpu_threads = ThreadPool::hardware_threads();
  cpu_isa(&e.cpu_level, &e.cpu_features);
  {
    const geist_backend_info b = m.backend();
    e.backend = b.backend;
    e.device = b.device;
    e.isa = std::string(b.isa_detail) + ", best " + b.isa_best + ", " +
            (e.backend == "cpu" ? "repacked " : "on the device ") + std::to_string(b.packed_bytes >> 20) + " MiB in " +
            std::to_string(int(b.repack_seconds * 1000)) + " ms";
  }
  e.threads = threads > 0 ? threads : e.cpu_threads;
  const geist_model_info info = m.info();
  e.model_path = path;
  e.model_name = info.name ? info.name : "";
  e.model_arch = info.arch ? info.arch : "";
  e.model_size = int64_t(info.file_size);
  e.model_n_params = info.n_params;
  e.model_fingerprint = info.fingerprint;
  e.n_ctx = n_ctx;
  e.time_utc = utc_now();
  if (hash && !bench::sha256_file(path, &e.model_sha256)) {
    std::fprintf(stderr, "geist: warning: cannot read %s to hash it\n", path.c_str());
  }
  return e;
}

int64_t proc_status_bytes(const char *key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const size_t n = std::strlen(key);
  while (std::getline(f, line)) {
    if (line.compare(0, n, key) == 0 && line.size() > n && line[n] == ':') {
      long long kb = -1;
      if (std::sscanf(line.c_str() + n + 1, "%lld", &kb) == 1 && kb >= 0) return int64_t(kb) * 1024;
    }
  }
  return -1;
}

Progress::Progress(std::string label, size_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      tty_(enabled && isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void Progress::step(size_t n) {
  count_ += n;
  if (!tty_ || total_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (elapsed < 2.0 ||
      (drawn_ && now - last_draw_ < std::chrono::milliseconds(100) && count_ < total_))
    return;
  last_draw_ = now;
  const double frac = std::min(1.0, double(count_) / double(total_));
  const int width = 30, full = int(frac * width + 0.5);
  const double eta = frac > 0 ? elapsed * (1 - frac) / frac : 0;
  auto clock = [](double s) {
    const long t = std::lround(s);
    return t < 60 ? bench::fmt("%ld s", t) : bench::fmt("%ld:%02ld min", t / 60, t % 60);
  };
  std::fprintf(stderr, "\r\033[K%s [%.*s%*s] %zu/%zu  %s, about %s left", label_.c_str(), full,
               "##############################", width - full, "", count_, total_,
               clock(elapsed).c_str(), clock(eta).c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::done() {
  if (drawn_) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
  }
  tty_ = false;
}

}  // namespace geist::cli
