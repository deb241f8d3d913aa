#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "base/file_util.h"
#include "base/thread_pool.h"
#include "commands.h"
#include "engine/model_paths.h"

namespace geist::cli {

void add_model_option(CLI::App *sub, std::string *path) {
  *path = default_model_file();
  sub->add_option("-m,--model", *path, "GGUF model file (default: the fetched default model)")
      ->capture_default_str();
}

int report(const Status &s) {
  std::fprintf(stderr, "geist: error: %s\n", s.message().c_str());
  return 1;
}

bool read_text_file(const std::string &path, std::string *out) {
  if (Status s = read_file_limited(path == "-" ? "/dev/stdin" : path, kMaxTextFileBytes, out); !s) {
    report(s);
    return false;
  }
  return true;
}

namespace {

std::string shown(const std::string &v) { return "'" + v + "'"; }

// Bounds printed as a reader writes them (1e+06, not 1000000.000000).
std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

bool parse_real(const std::string &in, double *v, std::string *err) {
  const char *s = in.c_str();
  char *end = nullptr;
  errno = 0;
  *v = std::strtod(s, &end);
  if (in.empty() || end == s || *end != '\0') {
    *err = shown(in) + " is not a number";
    return false;
  }
  if (!std::isfinite(*v)) {
    *err = shown(in) + " is not a finite number";
    return false;
  }
  return true;
}

char g_model_path[4096];  // read by the SIGBUS handler: a fixed buffer, no allocation

void on_sigbus(int) {
  // Async-signal-safe: write(2) of static bytes, then die of the signal as before.
  static const char a[] = "\ngeist: fatal: bus error (SIGBUS) reading mapped memory: the model file '";
  static const char b[] =
      "' was probably truncated or changed while geist was running (never modify a model file that is in use)\n";
  static const char c[] = "\ngeist: fatal: bus error (SIGBUS)\n";
  if (g_model_path[0]) {
    ssize_t r = ::write(2, a, sizeof a - 1);
    r = ::write(2, g_model_path, ::strlen(g_model_path));
    r = ::write(2, b, sizeof b - 1);
    (void)r;
  } else {
    ssize_t r = ::write(2, c, sizeof c - 1);
    (void)r;
  }
  ::signal(SIGBUS, SIG_DFL);
  ::raise(SIGBUS);
}

}  // namespace

CLI::Validator int_range(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string &in) -> std::string {
        long long v = 0;
        const char *b = in.data(), *e = in.data() + in.size();
        const auto r = std::from_chars(b, e, v);
        if (r.ec == std::errc::result_out_of_range) return shown(in) + " is outside [" + std::to_string(lo) + ", " +
                                                              std::to_string(hi) + "]";
        if (in.empty() || r.ec != std::errc() || r.ptr != e) return shown(in) + " is not an integer";
        if (v < lo || v > hi) {
          return std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
        }
        return std::string();
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

CLI::Validator real_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string &in) -> std::string {
        double v;
        std::string err;
        if (!parse_real(in, &v, &err)) return err;
        if (v < lo || v > hi) return shown(in) + " is outside [" + num(lo) + ", " + num(hi) + "]";
        return std::string();
      },
      "NUMBER in [" + num(lo) + ", " + num(hi) + "]");
}

CLI::Validator real_above(double lo) {
  return CLI::Validator(
      [lo](std::string &in) -> std::string {
        double v;
        std::string err;
        if (!parse_real(in, &v, &err)) return err;
        if (!(v > lo)) return shown(in) + " must be greater than " + num(lo);
        return std::string();
      },
      "NUMBER > " + num(lo));
}

void note_model_path(const std::string &path) {
  std::snprintf(g_model_path, sizeof g_model_path, "%s", path.c_str());
}

void install_fault_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_sigbus;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  sigaction(SIGBUS, &sa, nullptr);
}

std::string build_info() {
  char buf[256];
  std::snprintf(buf, sizeof buf, "geist %s, %d hardware threads", geist_version(), ThreadPool::hardware_threads());
  return buf;
}

}  // namespace geist::cli
