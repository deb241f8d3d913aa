#include "bench_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <limits>
#include <map>

namespace geist::cli::bench {

using nlohmann::json;

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A number, or null for NaN/inf (JSON has no NaN).
json num(double v) {
  return std::isfinite(v) ? json(v) : json(nullptr);
}

json summary_json(const Summary &s) {
  return json{{"n", s.n},          {"mean", num(s.mean)}, {"stddev", num(s.stddev)},
              {"min", num(s.min)}, {"p5", num(s.p5)},     {"p50", num(s.p50)},
              {"p95", num(s.p95)}, {"max", num(s.max)}};
}

std::vector<double> flatten_from(const std::vector<std::vector<double>> &v, size_t first) {
  std::vector<double> out;
  for (const auto &row : v)
    for (size_t i = first; i < row.size(); ++i) out.push_back(row[i]);
  return out;
}

std::string hex64(uint64_t v) {
  return fmt("0x%016llx", (unsigned long long)v);
}

// Display width of UTF-8 text: code points (the tables hold no wide characters).
size_t display_width(const std::string &s) {
  size_t w = 0;
  for (unsigned char c : s) w += (c & 0xC0) != 0x80;
  return w;
}

std::string csv_quote(const std::string &s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}
}  // namespace

// ---- Statistics -------------------------------------------------------------------

double percentile(std::vector<double> x, double q) {
  if (x.empty()) return kNaN;
  std::sort(x.begin(), x.end());
  q = std::clamp(q, 0.0, 100.0);
  const double h = double(x.size() - 1) * q / 100.0;
  const size_t i = size_t(std::floor(h));
  if (i + 1 >= x.size()) return x.back();
  return x[i] + (h - double(i)) * (x[i + 1] - x[i]);
}

double mean(const std::vector<double> &x) {
  if (x.empty()) return kNaN;
  double s = 0;
  for (double v : x) s += v;
  return s / double(x.size());
}

double stddev(const std::vector<double> &x) {
  if (x.size() < 2) return 0;
  const double m = mean(x);
  double s = 0;
  for (double v : x) s += (v - m) * (v - m);
  return std::sqrt(s / double(x.size() - 1));
}

Summary summarize(const std::vector<double> &x) {
  Summary s;
  s.n = x.size();
  if (x.empty()) {
    s.mean = s.stddev = s.min = s.p5 = s.p50 = s.p95 = s.max = kNaN;
    return s;
  }
  s.mean = mean(x);
  s.stddev = stddev(x);
  s.min = *std::min_element(x.begin(), x.end());
  s.max = *std::max_element(x.begin(), x.end());
  s.p5 = percentile(x, 5);
  s.p50 = percentile(x, 50);
  s.p95 = percentile(x, 95);
  return s;
}

// ---- Schedule ---------------------------------------------------------------------

std::vector<Step> interleaved_schedule(int n_sessions, int n_requests, int n_modes) {
  std::vector<Step> out;
  if (n_sessions <= 0 || n_modes <= 0) return out;
  for (int s = 0; s < n_sessions; ++s)
    for (int k = 0; k < n_modes; ++k) out.push_back({Step::kSetup, s, -1, (k + s) % n_modes});
  int step = 0;
  for (int r = 0; r < n_requests; ++r) {
    for (int s = 0; s < n_sessions; ++s, ++step)
      for (int k = 0; k < n_modes; ++k) out.push_back({Step::kRequest, s, r, (k + step) % n_modes});
  }
  return out;
}

// ---- Row sweep --------------------------------------------------------------------

Neighbours aligned_neighbours(int n, int align) {
  Neighbours nb;
  if (n < 1 || align < 1) return nb;
  nb.hi = (n / align + 1) * align;
  if (n > 1) nb.lo = std::max(1, (n - 1) / align * align);
  return nb;
}

std::vector<int> with_aligned_neighbours(std::vector<int> ns, int align) {
  std::vector<int> out;
  for (int n : ns) {
    if (n < 1) continue;
    out.push_back(n);
    const Neighbours nb = aligned_neighbours(n, align);
    if (nb.ok()) {
      out.push_back(nb.lo);
      out.push_back(nb.hi);
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<RowCheck> check_rows(const std::vector<int> &n, const std::vector<double> &ms_per_call,
                                 int align, double threshold) {
  std::map<int, double> t;
  for (size_t i = 0; i < n.size() && i < ms_per_call.size(); ++i) t[n[i]] = ms_per_call[i];
  std::vector<RowCheck> out;
  for (size_t i = 0; i < n.size() && i < ms_per_call.size(); ++i) {
    RowCheck c;
    c.n = n[i];
    c.nb = aligned_neighbours(c.n, align);
    c.excess = c.line_ms = kNaN;
    if (c.nb.ok() && t.count(c.nb.lo) && t.count(c.nb.hi)) {
      const double tl = t[c.nb.lo], th = t[c.nb.hi];
      c.line_ms = tl + (th - tl) * double(c.n - c.nb.lo) / double(c.nb.hi - c.nb.lo);
      c.tested = std::isfinite(c.line_ms) && c.line_ms > 0 && std::isfinite(ms_per_call[i]);
      if (c.tested) {
        c.excess = ms_per_call[i] / c.line_ms - 1;
        c.flagged = ms_per_call[i] > (1 + threshold) * c.line_ms;
      } else {
        c.line_ms = kNaN;
      }
    }
    out.push_back(c);
  }
  return out;
}

// ---- Tables -----------------------------------------------------------------------

std::string format_table(const std::vector<std::string> &header,
                         const std::vector<std::vector<std::string>> &rows,
                         const std::string &align) {
  const size_t nc = header.size();
  std::vector<size_t> w(nc, 3);
  for (size_t c = 0; c < nc; ++c) w[c] = std::max(w[c], display_width(header[c]));
  for (const auto &r : rows)
    for (size_t c = 0; c < nc && c < r.size(); ++c) w[c] = std::max(w[c], display_width(r[c]));
  auto right = [&](size_t c) { return c < align.size() && align[c] == 'r'; };
  std::string out;
  auto line = [&](const std::vector<std::string> &cells) {
    out += '|';
    for (size_t c = 0; c < nc; ++c) {
      const std::string v = c < cells.size() ? cells[c] : "";
      const size_t pad = w[c] - display_width(v);
      out += ' ';
      if (right(c)) out.append(pad, ' ');
      out += v;
      if (!right(c)) out.append(pad, ' ');
      out += " |";
    }
    out += '\n';
  };
  line(header);
  out += '|';
  for (size_t c = 0; c < nc; ++c) {
    out += ' ';
    out.append(right(c) ? w[c] - 1 : w[c], '-');
    out += right(c) ? ": |" : " |";
  }
  out += '\n';
  for (const auto &r : rows) line(r);
  return out;
}

std::string fmt(const char *format, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, format);
  const int n = std::vsnprintf(buf, sizeof buf, format, ap);
  va_end(ap);
  if (n < 0) return std::string();
  if (size_t(n) < sizeof buf) return std::string(buf, size_t(n));
  std::string big(size_t(n) + 1, '\0');
  va_start(ap, format);
  std::vsnprintf(big.data(), big.size(), format, ap);
  va_end(ap);
  big.resize(size_t(n));
  return big;
}

std::string ms(double v, int digits) {
  return std::isfinite(v) ? fmt("%.*f", digits, v) : "-";
}

std::string mib(int64_t bytes) {
  return bytes < 0 ? "-" : fmt("%.1f", double(bytes) / 1048576.0);
}

std::string bytes_text(int64_t bytes) {
  const double b = double(bytes);
  if (bytes < 0) return "-";
  if (bytes < 1024) return fmt("%lld B", (long long)bytes);
  if (b < 1048576.0) return fmt("%.1f KiB", b / 1024.0);
  if (b < 1073741824.0) return fmt("%.1f MiB", b / 1048576.0);
  return fmt("%.2f GiB", b / 1073741824.0);
}

// ---- Reports ----------------------------------------------------------------------

json to_json(const Environment &e) {
  return json{
      {"geist_version", e.geist_version},
      {"geist_commit", e.geist_commit},
      {"cpu", e.cpu},
      {"cpu_threads", e.cpu_threads},
      {"cpu_level", e.cpu_level},
      {"cpu_features", e.cpu_features},
      {"isa", e.isa},
      {"backend", e.backend},
      {"device", e.device},
      {"threads", e.threads},
      {"model",
       {{"path", e.model_path},
        {"name", e.model_name},
        {"arch", e.model_arch},
        {"size_bytes", e.model_size},
        {"n_params", e.model_n_params},
        {"fingerprint", hex64(e.model_fingerprint)},
        {"sha256", e.model_sha256.empty() ? json(nullptr) : json(e.model_sha256)}}},
      {"n_ctx", e.n_ctx},
      {"time_utc", e.time_utc},
  };
}

std::string environment_text(const Environment &e) {
  std::string features;
  for (const std::string &f : e.cpu_features) features += (features.empty() ? "" : " ") + f;
  std::string out = fmt("geist bench %s | geist %s (commit %s) | %s\n", e.command.c_str(),
                        e.geist_version.c_str(), e.geist_commit.c_str(), e.time_utc.c_str());
  out += fmt("cpu: %s, %d hardware threads; supports %s (%s)\n", e.cpu.c_str(), e.cpu_threads,
             e.cpu_level.c_str(), features.c_str());
  out += fmt("kernels: %s | backend: %s (%s) | threads: %d | n_ctx: %lld\n", e.isa.c_str(),
             e.backend.c_str(), e.device.c_str(), e.threads, (long long)e.n_ctx);
  out +=
      fmt("model: %s (%s%s%s, %.1f MiB = %lld bytes, %.1f M params, fingerprint %s, sha256 %s)\n",
          e.model_path.c_str(), e.model_arch.c_str(), e.model_name.empty() ? "" : " ",
          e.model_name.c_str(), double(e.model_size) / 1048576.0, (long long)e.model_size,
          double(e.model_n_params) / 1e6, hex64(e.model_fingerprint).c_str(),
          e.model_sha256.empty() ? "not computed (--hash)" : e.model_sha256.c_str());
  return out;
}

PinnedSummary summarize(const PinnedMode &m) {
  PinnedSummary s;
  s.request = summarize(flatten_from(m.request_ms, 1));
  s.prefill = summarize(flatten_from(m.prefill_ms, 1));
  s.reset = summarize(flatten_from(m.reset_ms, 1));
  s.decode = summarize(m.decode_ms);
  std::vector<double> first;
  for (const auto &row : m.request_ms)
    if (!row.empty()) first.push_back(row[0]);
  s.first_request = summarize(first);
  s.pin = summarize(m.pin_ms);
  s.snapshot = summarize(m.snapshot_ms);
  s.prefix_prefill = summarize(m.prefix_prefill_ms);
  return s;
}

double ratio(double v, double full) {
  if (!std::isfinite(v) || !std::isfinite(full) || full == 0) return kNaN;
  return v / full;
}

json pinned_json(const Environment &env, const PinnedParams &p,
                 const std::vector<PinnedMode> &modes, int outputs_identical, int64_t model_rss) {
  const PinnedMode *full = nullptr;
  for (const PinnedMode &m : modes)
    if (m.mode == "full") full = &m;
  const PinnedSummary fs = full ? summarize(*full) : PinnedSummary{};
  json jm = json::array();
  std::vector<std::string> names;
  for (const PinnedMode &m : modes) {
    names.push_back(m.mode);
    const PinnedSummary s = summarize(m);
    json r{{"mode", m.mode},
           {"request_ms", summary_json(s.request)},
           {"prefill_ms", summary_json(s.prefill)},
           {"reset_ms", summary_json(s.reset)},
           {"decode_ms_per_token", summary_json(s.decode)},
           {"first_request_ms", summary_json(s.first_request)},
           {"pin_ms", summary_json(s.pin)},
           {"snapshot_ms", summary_json(s.snapshot)},
           {"prefix_prefill_ms", summary_json(s.prefix_prefill)},
           {"snapshot_bytes", m.snapshot_bytes < 0 ? json(nullptr) : json(m.snapshot_bytes)},
           {"checkpoint_bytes", m.checkpoint_bytes < 0 ? json(nullptr) : json(m.checkpoint_bytes)},
           {"peak_rss_bytes", m.peak_rss < 0 ? json(nullptr) : json(m.peak_rss)},
           {"rss_after_first_request_bytes",
            m.rss_after_first < 0 ? json(nullptr) : json(m.rss_after_first)},
           {"rss_after_last_request_bytes",
            m.rss_after_last < 0 ? json(nullptr) : json(m.rss_after_last)}};
    if (full) {
      r["ratio_to_full"] =
          json{{"request_p50", num(ratio(s.request.p50, fs.request.p50))},
               {"request_p95", num(ratio(s.request.p95, fs.request.p95))},
               {"request_max", num(ratio(s.request.max, fs.request.max))},
               {"prefill_p50", num(ratio(s.prefill.p50, fs.prefill.p50))},
               {"prefill_p95", num(ratio(s.prefill.p95, fs.prefill.p95))},
               {"first_request_mean", num(ratio(s.first_request.mean, fs.first_request.mean))},
               {"peak_rss", num(ratio(double(m.peak_rss), double(full->peak_rss)))}};
    } else {
      r["ratio_to_full"] = nullptr;
    }
    r["samples"] = json{{"request_ms", m.request_ms},
                        {"prefill_ms", m.prefill_ms},
                        {"reset_ms", m.reset_ms},
                        {"decode_ms", m.decode_ms},
                        {"pin_ms", m.pin_ms},
                        {"snapshot_ms", m.snapshot_ms},
                        {"prefix_prefill_ms", m.prefix_prefill_ms}};
    jm.push_back(std::move(r));
  }
  json params{{"sessions", p.sessions},
              {"requests", p.requests},
              {"prompt_tokens", p.prompt_tokens},
              {"prefix_fraction", p.prefix_fraction},
              {"prefix_tokens", p.prefix_tokens},
              {"remainder_tokens", p.prompt_tokens - p.prefix_tokens},
              {"chunk", p.chunk},
              {"gen_tokens", p.gen_tokens},
              {"modes", names},
              {"order", "interleaved"}};
  return json{
      {"schema", "geist-bench/1"},
      {"command", "pinned"},
      {"environment", to_json(env)},
      {"params", params},
      {"results",
       {{"modes", jm},
        {"outputs_identical", outputs_identical < 0 ? json(nullptr) : json(outputs_identical == 1)},
        {"model_rss_bytes", model_rss < 0 ? json(nullptr) : json(model_rss)}}}};
}

std::string PpTgTest::name() const {
  std::string s = n_prompt > 0 ? fmt("pp%d", n_prompt) : fmt("tg%d", n_gen);
  if (n_depth > 0) s += fmt(" @ d%d", n_depth);
  return s;
}

std::vector<double> PpTgTest::samples_ts() const {
  const double n = n_prompt > 0 ? n_prompt : n_gen;
  std::vector<double> ts;
  for (double ns : samples_ns) ts.push_back(ns > 0 ? n * 1e9 / ns : kNaN);
  return ts;
}

namespace {
std::string model_type(const Environment &env) {
  return env.model_name.empty() ? env.model_arch : env.model_arch + " " + env.model_name;
}
}  // namespace

json pptg_record_json(const Environment &env, const PpTgTest &t) {
  const std::vector<double> ts = t.samples_ts();
  std::vector<int64_t> ns;
  for (double v : t.samples_ns) ns.push_back(int64_t(std::llround(v)));
  return json{{"build_commit", env.geist_commit},
              {"geist_version", env.geist_version},
              {"cpu_info", env.cpu},
              {"gpu_info", env.backend == "cpu" ? "" : env.device},
              {"backends", env.backend == "cpu" ? "CPU" : "CUDA"},
              {"isa", env.isa},
              {"model_filename", env.model_path},
              {"model_type", model_type(env)},
              {"model_size", env.model_size},
              {"model_n_params", env.model_n_params},
              {"model_fingerprint", hex64(env.model_fingerprint)},
              {"model_sha256", env.model_sha256.empty() ? json(nullptr) : json(env.model_sha256)},
              {"n_batch", t.n_batch},
              {"n_ubatch", t.n_batch},
              {"n_threads", t.n_threads},
              {"n_ctx", t.n_ctx},
              {"n_prompt", t.n_prompt},
              {"n_gen", t.n_gen},
              {"n_depth", t.n_depth},
              {"test", t.name()},
              {"test_time", env.time_utc},
              {"avg_ns", int64_t(std::llround(mean(t.samples_ns)))},
              {"stddev_ns", int64_t(std::llround(stddev(t.samples_ns)))},
              {"avg_ts", num(mean(ts))},
              {"stddev_ts", num(stddev(ts))},
              {"samples_ns", ns},
              {"samples_ts", ts}};
}

json pptg_json(const Environment &env, const json &params, const std::vector<PpTgTest> &tests) {
  json results = json::array();
  for (const PpTgTest &t : tests) results.push_back(pptg_record_json(env, t));
  return json{{"schema", "geist-bench/1"},
              {"command", "pp-tg"},
              {"environment", to_json(env)},
              {"params", params},
              {"results", results}};
}

std::string pptg_markdown(const Environment &env, const std::vector<PpTgTest> &tests) {
  std::vector<std::vector<std::string>> rows;
  const double size = double(env.model_size);
  const std::string size_s = size < 1073741824.0 ? fmt("%.2f MiB", size / 1048576.0)
                                                 : fmt("%.2f GiB", size / 1073741824.0);
  const double np = double(env.model_n_params);
  const std::string params_s = np < 1e9 ? fmt("%.2f M", np / 1e6) : fmt("%.2f B", np / 1e9);
  for (const PpTgTest &t : tests) {
    const std::vector<double> ts = t.samples_ts();
    rows.push_back({model_type(env), size_s, params_s, env.backend == "cpu" ? "CPU" : "CUDA",
                    std::to_string(t.n_threads), t.name(),
                    fmt("%.2f ± %.2f", mean(ts), stddev(ts))});
  }
  return format_table({"model", "size", "params", "backend", "threads", "test", "t/s"}, rows,
                      "lrrlrrr");
}

std::string pptg_csv(const Environment &env, const std::vector<PpTgTest> &tests) {
  static const char *kFields[] = {"build_commit",      "geist_version",
                                  "cpu_info",          "gpu_info",
                                  "backends",          "isa",
                                  "model_filename",    "model_type",
                                  "model_size",        "model_n_params",
                                  "model_fingerprint", "model_sha256",
                                  "n_batch",           "n_ubatch",
                                  "n_threads",         "n_ctx",
                                  "n_prompt",          "n_gen",
                                  "n_depth",           "test",
                                  "test_time",         "avg_ns",
                                  "stddev_ns",         "avg_ts",
                                  "stddev_ts"};
  std::string out;
  for (const char *f : kFields) {
    if (!out.empty()) out += ',';
    out += f;
  }
  out += "\n";
  for (const PpTgTest &t : tests) {
    const json r = pptg_record_json(env, t);
    std::string line;
    for (const char *f : kFields) {
      const json &v = r.at(f);
      std::string s = v.is_string() ? v.get<std::string>() : v.is_null() ? "" : v.dump();
      if (!line.empty()) line += ',';
      line += csv_quote(s);
    }
    out += line + "\n";
  }
  return out;
}

double RowPoint::ms_per_call() const {
  return samples_ms.empty() ? kNaN : *std::min_element(samples_ms.begin(), samples_ms.end());
}
double RowPoint::median_ms() const {
  return percentile(samples_ms, 50);
}

json rows_json(const Environment &env, const RowsParams &p, const std::vector<RowPoint> &points,
               const std::vector<RowCheck> &checks, int64_t peak_rss) {
  json pts = json::array();
  int n_flagged = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    const RowPoint &pt = points[i];
    const RowCheck c = i < checks.size() ? checks[i] : RowCheck{};
    const double t = pt.ms_per_call();
    n_flagged += c.flagged;
    pts.push_back(json{{"n", pt.n},
                       {"requested", pt.requested},
                       {"ms_per_call", num(t)},
                       {"ms_per_row", num(t / pt.n)},
                       {"median_ms", num(pt.median_ms())},
                       {"samples_ms", pt.samples_ms},
                       {"lo", c.nb.ok() ? json(c.nb.lo) : json(nullptr)},
                       {"hi", c.nb.ok() ? json(c.nb.hi) : json(nullptr)},
                       {"line_ms_per_call", c.tested ? num(c.line_ms) : json(nullptr)},
                       {"excess", c.tested ? num(c.excess) : json(nullptr)},
                       {"flagged", c.flagged}});
  }
  json params{{"reps", p.reps},   {"depth", p.depth},         {"align", p.align},
              {"chunk", p.chunk}, {"threshold", p.threshold}, {"requested", p.requested}};
  return json{{"schema", "geist-bench/1"},
              {"command", "rows"},
              {"environment", to_json(env)},
              {"params", params},
              {"results",
               {{"points", pts},
                {"n_flagged", n_flagged},
                {"peak_rss_bytes", peak_rss < 0 ? json(nullptr) : json(peak_rss)}}}};
}

// ---- Schema check -----------------------------------------------------------------

namespace {

enum class T {
  kStr,
  kInt,
  kNum,
  kBool,
  kArr,
  kObj,
  kNumOrNull,
  kStrOrNull,
  kIntOrNull,
  kBoolOrNull,
  kSummary
};

const char *type_name(T t) {
  switch (t) {
    case T::kStr:
      return "string";
    case T::kInt:
      return "integer";
    case T::kNum:
      return "number";
    case T::kBool:
      return "boolean";
    case T::kArr:
      return "array";
    case T::kObj:
      return "object";
    case T::kNumOrNull:
      return "number or null";
    case T::kStrOrNull:
      return "string or null";
    case T::kIntOrNull:
      return "integer or null";
    case T::kBoolOrNull:
      return "boolean or null";
    case T::kSummary:
      return "summary object";
  }
  return "?";
}

struct Checker {
  std::vector<std::string> errors;

  bool is(const json &v, T t) {
    switch (t) {
      case T::kStr:
        return v.is_string();
      case T::kInt:
        return v.is_number_integer();
      case T::kNum:
        return v.is_number();
      case T::kBool:
        return v.is_boolean();
      case T::kArr:
        return v.is_array();
      case T::kObj:
        return v.is_object();
      case T::kNumOrNull:
        return v.is_number() || v.is_null();
      case T::kStrOrNull:
        return v.is_string() || v.is_null();
      case T::kIntOrNull:
        return v.is_number_integer() || v.is_null();
      case T::kBoolOrNull:
        return v.is_boolean() || v.is_null();
      case T::kSummary:
        return v.is_object();
    }
    return false;
  }

  // Checks o[k] has type t; returns it (or a null json when absent or mistyped).
  const json &key(const json &o, const std::string &path, const char *k, T t) {
    static const json kNull;
    const std::string p = path.empty() ? k : path + "." + k;
    if (!o.is_object() || !o.contains(k)) {
      errors.push_back(p + ": missing");
      return kNull;
    }
    const json &v = o.at(k);
    if (!is(v, t)) {
      errors.push_back(p + ": expected " + type_name(t));
      return kNull;
    }
    if (t == T::kSummary) {
      key(v, p, "n", T::kInt);
      for (const char *f : {"mean", "stddev", "min", "p5", "p50", "p95", "max"})
        key(v, p, f, T::kNumOrNull);
    }
    return v;
  }

  void array_of(const json &a, const std::string &path, T t) {
    if (!a.is_array()) return;
    for (size_t i = 0; i < a.size(); ++i)
      if (!is(a[i], t))
        errors.push_back(path + "[" + std::to_string(i) + "]: expected " + type_name(t));
  }

  void environment(const json &e) {
    const std::string p = "environment";
    for (const char *k :
         {"geist_version", "geist_commit", "cpu", "cpu_level", "isa", "backend", "time_utc"})
      key(e, p, k, T::kStr);
    for (const char *k : {"cpu_threads", "threads", "n_ctx"}) key(e, p, k, T::kInt);
    array_of(key(e, p, "cpu_features", T::kArr), p + ".cpu_features", T::kStr);
    const json &m = key(e, p, "model", T::kObj);
    if (m.is_object()) {
      for (const char *k : {"path", "name", "arch", "fingerprint"})
        key(m, p + ".model", k, T::kStr);
      for (const char *k : {"size_bytes", "n_params"}) key(m, p + ".model", k, T::kInt);
      key(m, p + ".model", "sha256", T::kStrOrNull);
    }
  }

  void pinned(const json &params, const json &results) {
    for (const char *k : {"sessions", "requests", "prompt_tokens", "prefix_tokens",
                          "remainder_tokens", "chunk", "gen_tokens"})
      key(params, "params", k, T::kInt);
    key(params, "params", "prefix_fraction", T::kNum);
    array_of(key(params, "params", "modes", T::kArr), "params.modes", T::kStr);
    key(params, "params", "order", T::kStr);
    key(results, "results", "outputs_identical", T::kBoolOrNull);
    key(results, "results", "model_rss_bytes", T::kIntOrNull);
    const json &modes = key(results, "results", "modes", T::kArr);
    for (size_t i = 0; i < modes.size(); ++i) {
      const json &m = modes[i];
      const std::string p = "results.modes[" + std::to_string(i) + "]";
      key(m, p, "mode", T::kStr);
      for (const char *k : {"request_ms", "prefill_ms", "reset_ms", "decode_ms_per_token",
                            "first_request_ms", "pin_ms", "snapshot_ms", "prefix_prefill_ms"})
        key(m, p, k, T::kSummary);
      for (const char *k : {"snapshot_bytes", "checkpoint_bytes", "peak_rss_bytes",
                            "rss_after_first_request_bytes", "rss_after_last_request_bytes"})
        key(m, p, k, T::kIntOrNull);
      if (!m.contains("ratio_to_full")) {
        errors.push_back(p + ".ratio_to_full: missing");
      } else if (!m["ratio_to_full"].is_null()) {
        const json &r = key(m, p, "ratio_to_full", T::kObj);
        for (const char *k : {"request_p50", "request_p95", "request_max", "prefill_p50",
                              "prefill_p95", "first_request_mean", "peak_rss"})
          key(r, p + ".ratio_to_full", k, T::kNumOrNull);
      }
      const json &s = key(m, p, "samples", T::kObj);
      for (const char *k : {"request_ms", "prefill_ms", "reset_ms"}) {
        const json &a = key(s, p + ".samples", k, T::kArr);
        for (size_t j = 0; j < a.size(); ++j) {
          const std::string q = p + ".samples." + k + "[" + std::to_string(j) + "]";
          if (!a[j].is_array()) errors.push_back(q + ": expected array");
          array_of(a[j], q, T::kNum);
        }
      }
      for (const char *k : {"decode_ms", "pin_ms", "snapshot_ms", "prefix_prefill_ms"})
        array_of(key(s, p + ".samples", k, T::kArr), p + ".samples." + k, T::kNum);
    }
  }

  void pptg(const json &params, const json &results) {
    for (const char *k : {"n_prompt", "n_gen", "n_depth", "threads"})
      array_of(key(params, "params", k, T::kArr), std::string("params.") + k, T::kInt);
    key(params, "params", "repetitions", T::kInt);
    key(params, "params", "n_batch", T::kInt);
    key(params, "params", "warmup", T::kBool);
    if (!results.is_array()) {
      errors.push_back("results: expected array");
      return;
    }
    for (size_t i = 0; i < results.size(); ++i) {
      const json &r = results[i];
      const std::string p = "results[" + std::to_string(i) + "]";
      for (const char *k :
           {"build_commit", "geist_version", "cpu_info", "gpu_info", "backends", "isa",
            "model_filename", "model_type", "model_fingerprint", "test", "test_time"})
        key(r, p, k, T::kStr);
      key(r, p, "model_sha256", T::kStrOrNull);
      for (const char *k : {"model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads",
                            "n_ctx", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns"})
        key(r, p, k, T::kInt);
      for (const char *k : {"avg_ts", "stddev_ts"}) key(r, p, k, T::kNumOrNull);
      array_of(key(r, p, "samples_ns", T::kArr), p + ".samples_ns", T::kInt);
      array_of(key(r, p, "samples_ts", T::kArr), p + ".samples_ts", T::kNumOrNull);
    }
  }

  void rows(const json &params, const json &results) {
    for (const char *k : {"reps", "depth", "align", "chunk"}) key(params, "params", k, T::kInt);
    key(params, "params", "threshold", T::kNum);
    array_of(key(params, "params", "requested", T::kArr), "params.requested", T::kInt);
    key(results, "results", "n_flagged", T::kInt);
    key(results, "results", "peak_rss_bytes", T::kIntOrNull);
    const json &pts = key(results, "results", "points", T::kArr);
    for (size_t i = 0; i < pts.size(); ++i) {
      const json &pt = pts[i];
      const std::string p = "results.points[" + std::to_string(i) + "]";
      key(pt, p, "n", T::kInt);
      key(pt, p, "requested", T::kBool);
      key(pt, p, "flagged", T::kBool);
      for (const char *k : {"ms_per_call", "ms_per_row", "median_ms", "line_ms_per_call", "excess"})
        key(pt, p, k, T::kNumOrNull);
      for (const char *k : {"lo", "hi"}) key(pt, p, k, T::kIntOrNull);
      array_of(key(pt, p, "samples_ms", T::kArr), p + ".samples_ms", T::kNum);
    }
  }
  void batch(const json &params, const json &results) {
    for (const char *k : {"n_prompt", "n_gen", "repetitions", "threads"}) key(params, "params", k, T::kInt);
    array_of(key(params, "params", "sessions", T::kArr), "params.sessions", T::kInt);
    if (!results.is_array()) {
      errors.push_back("results: expected array");
      return;
    }
    for (size_t i = 0; i < results.size(); ++i) {
      const json &pt = results[i];
      const std::string p = "results[" + std::to_string(i) + "]";
      key(pt, p, "sessions", T::kInt);
      for (const char *k : {"ms_per_step", "aggregate_tps"}) key(pt, p, k, T::kNum);
      array_of(key(pt, p, "samples_ms", T::kArr), p + ".samples_ms", T::kNum);
    }
  }
};

}  // namespace

std::vector<std::string> check_bench_json(const json &j) {
  Checker c;
  if (!j.is_object()) return {"document: expected object"};
  const json &schema = c.key(j, "", "schema", T::kStr);
  if (schema.is_string() && schema.get<std::string>() != "geist-bench/1")
    c.errors.push_back("schema: expected \"geist-bench/1\"");
  const json &command = c.key(j, "", "command", T::kStr);
  c.environment(c.key(j, "", "environment", T::kObj));
  const json &params = c.key(j, "", "params", T::kObj);
  if (!j.contains("results")) {
    c.errors.push_back("results: missing");
    return c.errors;
  }
  const json &results = j.at("results");
  const std::string cmd = command.is_string() ? command.get<std::string>() : "";
  if (cmd == "pinned") {
    c.pinned(params, results);
  } else if (cmd == "pp-tg") {
    c.pptg(params, results);
  } else if (cmd == "rows") {
    c.rows(params, results);
  } else if (cmd == "batch") {
    c.batch(params, results);
  } else if (command.is_string()) {
    c.errors.push_back("command: expected \"pinned\", \"pp-tg\", \"rows\" or \"batch\"");
  }
  return c.errors;
}

}  // namespace geist::cli::bench
