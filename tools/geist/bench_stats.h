// The model-free part of `geist bench`: statistics, the interleaving schedule, the row
// sweep's aligned-neighbour test, tables and the JSON documents (schema in docs/BENCH.md).
// Pure functions of their arguments (thread-safe, no I/O), so tests/bench_stats_unit.cpp
// checks them with known inputs. Times are milliseconds unless a name says otherwise.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace geist::cli::bench {

// ---- Statistics -------------------------------------------------------------------

// The q-th percentile (q in [0, 100]) by linear interpolation between order statistics,
// numpy's default ('linear', type 7 of Hyndman & Fan): with x sorted ascending and
// h = (n - 1) * q / 100, the result is x[floor h] + (h - floor h) * (x[floor h + 1] - x[floor h]).
// P50 of an even count is the mean of the middle two; P0 is the min, P100 the max.
// NaN for an empty x. O(n log n).
double percentile(std::vector<double> x, double q);
// Arithmetic mean; NaN for an empty x.
double mean(const std::vector<double> &x);
// Sample standard deviation (divides by n - 1, as llama-bench); 0 for n < 2.
double stddev(const std::vector<double> &x);

// What the tables and the JSON report of a set of samples. Every field is NaN when n is 0.
struct Summary {
  size_t n = 0;
  double mean, stddev, min, p5, p50, p95, max;
};
Summary summarize(const std::vector<double> &x);

// ---- The pinned workload's schedule ----------------------------------------------

// One step of `bench pinned`. kSetup prepares a session of one mode (pin, or pin and
// snapshot; for full a reference prefill of the prefix); kRequest runs one request.
struct Step {
  enum Kind { kSetup, kRequest } kind;
  int session;
  int request;  // -1 for kSetup
  int mode;     // index into the modes being run
};

// The interleaved order: first every session's setup, session by session, then every
// request, request index by request index, session by session; within each (session,
// request) all modes run back to back, in an order rotated by one mode per step
// (mode (k + step) % n_modes at position k), so no mode always runs first or right after
// another. Each (session, request, mode) appears once; a session's requests run in order.
std::vector<Step> interleaved_schedule(int n_sessions, int n_requests, int n_modes);

// ---- Row sweep: the aligned-neighbour line test -----------------------------------

// The aligned neighbours of a row count n for an alignment a (default 16: the row
// multiple that GEMM tiles and SIMD kernels are built around):
//   hi = the smallest multiple of a strictly greater than n,
//   lo = the largest multiple of a strictly less than n, or 1 when that would be 0
//        (a call of 0 rows is not a measurement; 1 row is the smallest call).
// n = 1 has no lower neighbour (lo = 0) and is not tested.
// Examples for a = 16: 2 -> (1, 16), 16 -> (1, 32), 17 -> (16, 32), 32 -> (16, 48).
struct Neighbours {
  int lo = 0, hi = 0;
  bool ok() const { return lo > 0; }
};
Neighbours aligned_neighbours(int n, int align);

// ns with every tested n's aligned neighbours added: sorted, unique, all >= 1.
std::vector<int> with_aligned_neighbours(std::vector<int> ns, int align);

// The line test of one row count: `line_ms` is the straight line through (lo, t(lo)) and
// (hi, t(hi)) evaluated at n, where t is the measured time per call; since per-row cost
// is t(n) / n, "per-row cost more than `threshold` above the line" is
// t(n) > (1 + threshold) * line_ms. excess = t(n) / line_ms - 1.
struct RowCheck {
  int n = 0;
  Neighbours nb;
  bool tested = false;  // n > 1 and both neighbours were measured
  double line_ms = 0, excess = 0;
  bool flagged = false;
};
// n[i] and ms_per_call[i] are measurements (any order, unique n). One RowCheck per n[i].
std::vector<RowCheck> check_rows(const std::vector<int> &n, const std::vector<double> &ms_per_call,
                                 int align, double threshold);

// ---- Tables -----------------------------------------------------------------------

// A markdown table (GitHub style, which also reads well in a terminal): columns padded to
// their widest cell; align[i] 'l' or 'r' ('r' marks the separator "---:"). Ends in '\n'.
std::string format_table(const std::vector<std::string> &header,
                         const std::vector<std::vector<std::string>> &rows,
                         const std::string &align);
// printf-style formatting into a std::string.
std::string fmt(const char *format, ...) __attribute__((format(printf, 1, 2)));
// "12.3" with `digits` decimals, or "-" for NaN.
std::string ms(double v, int digits = 1);
// Bytes as MiB with one decimal ("-" for a negative value).
std::string mib(int64_t bytes);
// Bytes with a unit: "512 B", "12.5 KiB", "8.6 MiB", "1.20 GiB" ("-" for a negative value).
std::string bytes_text(int64_t bytes);

// ---- Reports ----------------------------------------------------------------------

// Where a benchmark ran (the environment header of every output).
struct Environment {
  std::string command;        // "pinned", "pp-tg", "rows"
  std::string geist_version;  // "0.1.0"
  std::string geist_commit;   // "8ec3294abcde"
  std::string cpu;            // /proc/cpuinfo "model name"
  int cpu_threads = 0;        // hardware threads this process may run on
  std::string cpu_level;      // the highest x86-64 level the CPU supports ("x86-64-v4", ...)
  std::vector<std::string> cpu_features;  // ISA extensions of interest the CPU has
  std::string isa;                        // what the kernels use: "auto (target_clones: x86-64-v4)"
  std::string backend = "cpu";
  std::string device;  // the backend's device in words
  int threads = 0;  // compute threads of each session
  std::string model_path, model_name, model_arch;
  int64_t model_size = 0;  // bytes of the GGUF file
  int64_t model_n_params = 0;
  uint64_t model_fingerprint = 0;
  std::string model_sha256;  // empty unless computed (--hash)
  int64_t n_ctx = 0;         // context of the sessions (pp-tg: the largest test's)
  std::string time_utc;      // ISO 8601 start time
};
nlohmann::json to_json(const Environment &e);
// The environment as text lines (each ends in '\n') for the top of a table.
std::string environment_text(const Environment &e);

// The measurements of one mode of `bench pinned`.
struct PinnedMode {
  std::string mode;  // "full", "pin", "snapshot"
  std::vector<std::vector<double>>
      request_ms;  // [session][request]: reset/restore + prefill + G decode steps
  std::vector<std::vector<double>> prefill_ms;  // [session][request]
  std::vector<std::vector<double>>
      reset_ms;  // [session][request]: clear (full), reset (pin), restore (snapshot)
  std::vector<double> decode_ms;          // every decode step of the requests after the first
  std::vector<double> pin_ms;             // [session] pin_prefix (pin, snapshot); empty for full
  std::vector<double> snapshot_ms;        // [session] snapshot to memory (snapshot); else empty
  std::vector<double> prefix_prefill_ms;  // [session] plain prefill of the prefix (full's setup)
  int64_t snapshot_bytes = -1, checkpoint_bytes = -1;  // -1: not applicable
  int64_t peak_rss = -1;                               // VmHWM of the mode's process, bytes
  // VmRSS once every session has run its first request / after the last request.
  int64_t rss_after_first = -1, rss_after_last = -1;
};

// A PinnedMode's samples split as the report uses them: the first request of every
// session apart, the percentiles over the others.
struct PinnedSummary {
  Summary request, prefill, reset, decode, first_request, pin, snapshot, prefix_prefill;
};
PinnedSummary summarize(const PinnedMode &m);

struct PinnedParams {
  int sessions = 3, requests = 20, prompt_tokens = 600, prefix_tokens = 240, chunk = 64,
      gen_tokens = 16;
  double prefix_fraction = 0.4;
};

// ratio = mode's value / full's; NaN when either is NaN or full's is 0.
double ratio(double v, double full);

// The JSON document of `bench pinned` (docs/BENCH.md). outputs_identical: -1 not checked
// (one mode), 0 no, 1 yes. model_rss: the parent process's RSS after loading the model.
nlohmann::json pinned_json(const Environment &env, const PinnedParams &p,
                           const std::vector<PinnedMode> &modes, int outputs_identical,
                           int64_t model_rss);

// One test of `bench pp-tg` (llama-bench's record; field names follow its JSON output).
struct PpTgTest {
  int n_prompt = 0, n_gen = 0, n_depth = 0, n_threads = 0, n_batch = 0;
  int64_t n_ctx = 0;
  std::vector<double> samples_ns;  // one per repetition: the timed prefill or generation
  // "pp512", "tg128", "pp512 @ d1024".
  std::string name() const;
  // tokens/s of each repetition (n_prompt or n_gen tokens / its time).
  std::vector<double> samples_ts() const;
};
nlohmann::json pptg_record_json(const Environment &env, const PpTgTest &t);
nlohmann::json pptg_json(const Environment &env, const nlohmann::json &params,
                         const std::vector<PpTgTest> &tests);
// llama-bench's markdown table (model, size, params, backend, threads, test, t/s mean ± sd).
std::string pptg_markdown(const Environment &env, const std::vector<PpTgTest> &tests);
// CSV: a header line and one line per test, every value quoted (as llama-bench -o csv).
std::string pptg_csv(const Environment &env, const std::vector<PpTgTest> &tests);

// One row count of `bench rows`.
struct RowPoint {
  int n = 0;
  bool requested = true;           // false: measured only as an aligned neighbour
  std::vector<double> samples_ms;  // per call, one per repetition
  // The fastest of the samples: interference from other work only adds time, and a real
  // cost cliff is in every sample, so the minimum is what the line test compares.
  double ms_per_call() const;
  double median_ms() const;  // the median of the samples, for reference
};
struct RowsParams {
  int reps = 3, depth = 0, align = 16, chunk = 0;
  double threshold = 0.10;
  std::vector<int> requested;
};
nlohmann::json rows_json(const Environment &env, const RowsParams &p,
                         const std::vector<RowPoint> &points, const std::vector<RowCheck> &checks,
                         int64_t peak_rss);

// ---- Schema check -----------------------------------------------------------------

// Every difference between j and the schema of docs/BENCH.md (missing keys, wrong types),
// one line each ("results.modes[0].request_ms.p50: expected number or null"); empty when
// j conforms. Keys not in the schema are allowed (later versions add keys).
std::vector<std::string> check_bench_json(const nlohmann::json &j);

}  // namespace geist::cli::bench
