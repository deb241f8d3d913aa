// geist bench rows: the prefill time of one chunk of n rows, for every n in --from..--to
// (or a --list), after --depth tokens already in the context. The session's chunk is the
// largest n, so every call is one forward pass. Each n is timed -r times in passes over
// all n (ascending, then descending, alternating, so drift spreads over all n); its time
// per call is the fastest of them (noise only adds time; a real cliff is in every timing). Each n
// is then checked against the straight line through its aligned neighbours
// (bench::aligned_neighbours: the multiples of --align around it, measured too when not asked for):
// per-row cost more than --threshold above that line is flagged, the tile-size cliff of
// ../shared/docs/CONTEXT.md.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "api_common.h"
#include "bench_common.h"
#include "svg_plot.h"

namespace geist::cli {
namespace {

using bench::fmt;

struct RowsOptions {
  BenchCommon c;
  int threads = 0, from = 1, to = 512, reps = 3, depth = 0, align = 16;
  double threshold = 0.10;
  std::vector<int> list;
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void print_table(const bench::Environment &env, const RowsOptions &o,
                 const std::vector<bench::RowPoint> &pts,
                 const std::vector<bench::RowCheck> &checks) {
  std::printf("%s\n", bench::environment_text(env).c_str());
  std::printf(
      "row sweep: one prefill call of n rows after %d tokens, fastest of %d; line test against the "
      "aligned "
      "neighbours (multiples of %d), flag above +%.0f %%\n\n",
      o.depth, o.reps, o.align, o.threshold * 100);
  std::vector<std::vector<std::string>> rows;
  std::vector<int> flagged;
  int tested = 0;
  for (size_t i = 0; i < pts.size(); ++i) {
    const bench::RowPoint &p = pts[i];
    const bench::RowCheck &c = checks[i];
    const double t = p.ms_per_call();
    tested += c.tested;
    if (c.flagged) flagged.push_back(p.n);
    rows.push_back({std::to_string(p.n) + (p.requested ? "" : " (neighbour)"), bench::ms(t, 2),
                    bench::ms(t / p.n, 3), c.nb.ok() ? fmt("%d, %d", c.nb.lo, c.nb.hi) : "-",
                    c.tested ? bench::ms(c.line_ms / p.n, 3) : "-",
                    c.tested ? fmt("%+.1f %%", c.excess * 100) : "-", c.flagged ? "FLAG" : ""});
  }
  std::printf("%s", bench::format_table(
                        {"n", "ms/call", "ms/row", "neighbours", "line ms/row", "vs line", "flag"},
                        rows, "rrrrrrl")
                        .c_str());
  std::string list;
  for (int n : flagged) list += (list.empty() ? "" : ", ") + std::to_string(n);
  std::printf("\nflagged: %zu of %d tested row counts%s%s\n", flagged.size(), tested,
              flagged.empty() ? "" : ": n = ", list.c_str());
}

int run(const RowsOptions &o) {
  std::vector<int> requested = o.list;
  if (requested.empty()) {
    if (o.from > o.to) {
      std::fprintf(stderr, "geist: error: --from %d is above --to %d\n", o.from, o.to);
      return 2;
    }
    for (int n = o.from; n <= o.to; ++n) requested.push_back(n);
  }
  std::sort(requested.begin(), requested.end());
  requested.erase(std::unique(requested.begin(), requested.end()), requested.end());
  const std::vector<int> ns = bench::with_aligned_neighbours(requested, o.align);
  const int max_n = ns.back();

  if (!outputs_writable(o.c)) return 1;
  api::Model model;
  if (!load_api_model(o.c.model, &model, nullptr, &o.c.dev)) return 1;
  const geist_model_info info = model.info();
  std::vector<geist_token> corpus, tokens;
  if (api::Error e = corpus_tokens(model, &corpus)) return report(e);
  if (info.add_bos && info.bos >= 0) tokens.push_back(info.bos);
  const std::vector<geist_token> body = corpus_slice(corpus, 0, size_t(o.depth + max_n));
  tokens.insert(tokens.end(), body.begin(), body.end());

  geist_session_params p = geist_session_params_default();
  p.n_ctx = int64_t(o.depth) + max_n;
  p.n_threads = o.threads;
  p.chunk = max_n;
  apply_kv_types(o.c.dev, &p);
  api::Session s;
  api::Error e = api::Session::create(model, &p, &s);
  if (!e && o.depth > 0) e = s.pin_prefix(tokens.data(), size_t(o.depth));
  const geist_token *run = tokens.data() + o.depth;
  // Warm-up: the largest call and a one-row call (first use of every code path).
  for (int n : {max_n, 1})
    if (!e && !(e = s.reset())) e = s.prefill(run, size_t(n));
  if (e) return report(e);

  const bench::Environment env =
      collect_environment("rows", model, o.c.model, bench_threads(o.threads), p.n_ctx, o.c.hash);
  std::vector<bench::RowPoint> pts(ns.size());
  for (size_t i = 0; i < ns.size(); ++i) {
    pts[i].n = ns[i];
    pts[i].requested = std::binary_search(requested.begin(), requested.end(), ns[i]);
  }
  Progress progress("bench rows", size_t(o.reps) * ns.size(), !o.c.no_progress);
  for (int r = 0; r < o.reps; ++r) {
    for (size_t k = 0; k < ns.size(); ++k) {
      bench::RowPoint &pt = pts[r % 2 == 0 ? k : ns.size() - 1 - k];
      if ((e = s.reset())) return report(e);
      const double t0 = now_ms();
      if ((e = s.prefill(run, size_t(pt.n)))) return report(e);
      pt.samples_ms.push_back(now_ms() - t0);
      progress.step();
    }
  }
  progress.done();

  std::vector<double> per_call;
  for (const bench::RowPoint &pt : pts) per_call.push_back(pt.ms_per_call());
  const std::vector<bench::RowCheck> checks = bench::check_rows(ns, per_call, o.align, o.threshold);
  print_table(env, o, pts, checks);

  bench::RowsParams rp;
  rp.reps = o.reps, rp.depth = o.depth, rp.align = o.align, rp.chunk = max_n,
  rp.threshold = o.threshold;
  rp.requested = requested;
  std::string svg;
  if (!o.c.plot.empty()) {
    std::vector<double> per_row;
    std::vector<bool> flagged;
    for (size_t i = 0; i < pts.size(); ++i) {
      per_row.push_back(per_call[i] / pts[i].n);
      flagged.push_back(checks[i].flagged);
    }
    svg = svg_rows_plot(fmt("geist bench rows: ms per row of one prefill call of n rows (depth %d, "
                            "flagged: > %.0f %% "
                            "above the line through the multiples of %d around n)",
                            o.depth, o.threshold * 100, o.align),
                        ns, per_row, flagged);
  }
  const nlohmann::json doc = bench::rows_json(env, rp, pts, checks, proc_status_bytes("VmHWM"));
  return write_outputs(o.c, doc, svg) ? 0 : 1;
}

}  // namespace

Runner add_bench_rows(CLI::App &bench) {
  auto o = std::make_shared<RowsOptions>();
  CLI::App *sub =
      bench.add_subcommand("rows",
                           "Prefill time of one chunk of n rows for every n, flagging n whose "
                           "per-row cost is above the line through its aligned neighbours");
  add_bench_common(sub, &o->c);
  sub->add_option("-t,--threads", o->threads, "Threads (0: all)")
      ->capture_default_str()
      ->check(int_range(0, 512));
  sub->add_option("--from", o->from, "Smallest n")
      ->capture_default_str()
      ->check(int_range(1, 65536));
  sub->add_option("--to", o->to, "Largest n")->capture_default_str()->check(int_range(1, 65536));
  sub->add_option("-l,--list", o->list,
                  "Row counts to measure instead of --from..--to (comma-separated)")
      ->delimiter(',')
      ->check(int_range(1, 65536));
  sub->add_option("-r,--repetitions", o->reps, "Timings of each n (the median is used)")
      ->capture_default_str()
      ->check(int_range(1, 10000));
  sub->add_option("-d,--depth", o->depth, "Tokens already in the context before each call")
      ->capture_default_str()
      ->check(int_range(0, 1 << 24));
  sub->add_option("--align", o->align, "Row multiple of the aligned neighbours")
      ->capture_default_str()
      ->check(int_range(1, 4096));
  sub->add_option("--threshold", o->threshold,
                  "Flag per-row cost more than this fraction above the line")
      ->capture_default_str()
      ->check(real_range(0.0, 100.0));
  return [o] { return run(*o); };
}

}  // namespace geist::cli
