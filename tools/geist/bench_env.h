// The machine side of `geist bench`: the environment header (CPU, ISA, build, model),
// process memory from /proc, and a progress bar on stderr.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "bench_stats.h"
#include "geist/geist.hpp"

namespace geist::cli {

// The environment of a run of `geist bench <command>` on model m loaded from path, with
// sessions of `threads` compute threads (0: all) and context n_ctx. hash: also compute the
// file's SHA-256 (reads the whole file: about a second per few hundred MB); a file that
// cannot be read leaves the hash empty with a warning on stderr.
bench::Environment collect_environment(const std::string &command, const api::Model &m,
                                       const std::string &path, int threads, int64_t n_ctx,
                                       bool hash);

// A "VmHWM:"/"VmRSS:"-style field of /proc/self/status in bytes; -1 if unavailable.
int64_t proc_status_bytes(const char *key);

// A one-line progress bar on stderr: drawn only when stderr is a terminal, and only once
// the run has taken more than two seconds (short runs print nothing). Redrawn at most ten
// times a second; done() erases it. Not thread-safe.
class Progress {
 public:
  Progress(std::string label, size_t total, bool enabled = true);
  ~Progress() { done(); }
  void step(size_t n = 1);
  void done();

 private:
  std::string label_;
  size_t total_, count_ = 0;
  bool tty_, drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace geist::cli
