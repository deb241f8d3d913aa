// GEIST_PROFILE=1: the time of each op of a session's forward passes, by op name and
// shape, printed to stderr as a table when the session's exec ends. Each backend's exec
// times its own ops (the CPU's are synchronous; the CUDA exec waits for each op).
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <utility>

#include "base/timer.h"

namespace geist {

class OpProfile {
 public:
  // GEIST_PROFILE=1 in the environment (read once).
  static bool enabled();

  void add(const std::string &op, double seconds) {
    auto &e = ops_[op];
    e.first += seconds;
    e.second += 1;
  }
  // "GEIST_PROFILE <device>: <total> ms in ops", then one line per op, slowest first.
  void print(const std::string &device, const char *note) const;

  // Times one op from construction to destruction (no-op when p is null).
  class Scope {
   public:
    Scope(OpProfile *p, std::string op) : p_(p), op_(p ? std::move(op) : std::string()), t0_(p ? now_seconds() : 0) {}
    ~Scope() {
      if (p_) p_->add(op_, now_seconds() - t0_);
    }
    Scope(const Scope &) = delete;
    Scope &operator=(const Scope &) = delete;

   private:
    OpProfile *p_;
    std::string op_;
    double t0_;
  };

 private:
  std::map<std::string, std::pair<double, long>> ops_;  // op -> (seconds, calls)
};

// "matmul Q4_K 2560x10240 (1 row)": the name an op is profiled under.
std::string profile_label(const std::string &op, int n_rows);

}  // namespace geist
