// geist bench batch: decode throughput of S sessions advancing together through
// geist_decode_batch (one forward step per token of all of them, the weights read once),
// for each S of -S. Each session first prefills its own -p corpus tokens (not timed); then
// -n steps are timed. Reported per S, median over -r repetitions: ms per step, aggregate
// tokens/s (S tokens per step), and the ratio to one session's throughput measured in the
// same run (S = 1 through the same call, which is decode_step's cost).
// --concurrent instead runs each session's -n decode_steps on its own thread, all at once
// (sessions of one process share its worker pool): the aggregate tokens/s and, per session,
// the P95 of its step times (the spread between sessions shows the pool's fairness).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "api_common.h"
#include "bench_common.h"

namespace geist::cli {
namespace {

using bench::fmt;

struct BatchOptions {
  BenchCommon c;
  std::vector<int> sessions = {1, 2, 4, 8, 16};
  int n_prompt = 128, n_gen = 64, reps = 3, threads = 0;
  bool concurrent = false;
};

struct BatchResult {
  int sessions = 0;
  std::vector<double> samples_ms;  // time of the -n steps, per repetition
  double median_ms = 0;
  std::vector<double> p95_step_ms;  // --concurrent: each session's P95 step time (last repetition)
};

bool run_one(const api::Model &m, const std::vector<geist_token> &corpus, const BatchOptions &o, Progress &progress,
             BatchResult *r) {
  const int S = r->sessions;
  std::vector<std::unique_ptr<api::Session>> owned;
  std::vector<api::Session *> ss;
  geist_session_params p = geist_session_params_default();
  p.n_ctx = int64_t(o.n_prompt) + o.n_gen + 2;
  p.n_threads = o.threads;
  p.chunk = std::max(S, std::min(o.n_prompt, 256));
  apply_kv_types(o.c.dev, &p);
  p.sampling.temperature = 0;
  api::Error e;
  for (int i = 0; i < S && !e; ++i) {
    owned.push_back(std::make_unique<api::Session>());
    e = api::Session::create(m, &p, owned.back().get());
    ss.push_back(owned.back().get());
  }
  std::vector<geist_token> toks;
  // Repetition 0 is the warm-up (kernels loaded, graphs captured), not counted.
  for (int rep = 0; rep <= o.reps && !e; ++rep) {
    for (int i = 0; i < S && !e; ++i) {
      e = ss[size_t(i)]->clear();
      const std::vector<geist_token> prompt = corpus_slice(corpus, size_t(i) * 7919, size_t(o.n_prompt));
      if (!e) e = ss[size_t(i)]->prefill(prompt.data(), prompt.size());
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (o.concurrent) {
      std::vector<std::vector<double>> step_ms(static_cast<size_t>(S));
      std::vector<api::Error> errs(static_cast<size_t>(S));
      std::vector<std::thread> th;
      for (int i = 0; i < S; ++i) {
        th.emplace_back([&, i] {
          geist_token t = 0;
          for (int k = 0; k < o.n_gen && !errs[size_t(i)]; ++k) {
            const auto a = std::chrono::steady_clock::now();
            errs[size_t(i)] = ss[size_t(i)]->decode_step(&t);
            step_ms[size_t(i)].push_back(
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
          }
        });
      }
      for (auto &t : th) t.join();
      for (const api::Error &x : errs)
        if (x && !e) e = x;
      r->p95_step_ms.clear();
      for (const std::vector<double> &v : step_ms) r->p95_step_ms.push_back(v.empty() ? 0 : bench::percentile(v, 95));
    } else {
      for (int k = 0; k < o.n_gen && !e; ++k) e = api::Session::decode_batch(ss, &toks);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) r->samples_ms.push_back(ms);
    progress.step();
  }
  if (e) {
    std::fprintf(stderr, "geist: error: %d sessions: %s\n", S, e.message.c_str());
    return false;
  }
  r->median_ms = bench::percentile(r->samples_ms, 50);
  return true;
}

int run(const BatchOptions &o) {
  if (!o.c.plot.empty()) {
    std::fprintf(stderr, "geist: error: --plot: bench batch draws no plot (its table and --json have the numbers)\n");
    return 2;
  }
  if (!outputs_writable(o.c)) return 1;
  api::Model model;
  if (!load_api_model(o.c.model, &model, nullptr, &o.c.dev)) return 1;
  std::vector<geist_token> corpus;
  if (api::Error e = corpus_tokens(model, &corpus)) return report(e);
  std::vector<BatchResult> results;
  Progress progress("bench batch", o.sessions.size() * size_t(o.reps + 1), !o.c.no_progress);
  for (int S : o.sessions) {
    BatchResult r;
    r.sessions = S;
    if (!run_one(model, corpus, o, progress, &r)) return 1;
    results.push_back(r);
  }
  progress.done();
  const bench::Environment env = collect_environment("batch", model, o.c.model, bench_threads(o.threads),
                                                     int64_t(o.n_prompt) + o.n_gen + 2, o.c.hash);
  std::printf("%s\n", bench::environment_text(env).c_str());
  if (o.concurrent) {
    std::printf("S sessions decoding at once, each on its own thread (decode_step): each prefilled with its own %d "
                "tokens, then %d steps timed; median of %d repetitions after a warm-up; P95 of each session's step "
                "times (last repetition), lowest and highest session\n\n",
                o.n_prompt, o.n_gen, o.reps);
    std::printf("| sessions | ms/step | aggregate t/s | t/s per session | vs 1 session | P95 step ms min / max |\n");
    std::printf("| -------: | ------: | ------------: | --------------: | -----------: | -------------------: |\n");
  } else {
    std::printf("decode of S sessions together (geist_decode_batch): each prefilled with its own %d tokens, then %d "
                "steps timed; median of %d repetitions after a warm-up\n\n",
                o.n_prompt, o.n_gen, o.reps);
    std::printf("| sessions | ms/step | aggregate t/s | t/s per session | vs 1 session |\n");
    std::printf("| -------: | ------: | ------------: | --------------: | -----------: |\n");
  }
  double one = 0;
  for (const BatchResult &r : results)
    if (r.sessions == 1) one = double(o.n_gen) / (r.median_ms / 1e3);
  nlohmann::json pts = nlohmann::json::array();
  for (const BatchResult &r : results) {
    const double step_ms = r.median_ms / o.n_gen;
    const double agg = double(r.sessions) * o.n_gen / (r.median_ms / 1e3);
    std::printf("| %8d | %7.3f | %13.1f | %15.1f | %12s |", r.sessions, step_ms, agg, agg / r.sessions,
                one > 0 ? fmt("%.2fx", agg / one).c_str() : "-");
    if (o.concurrent && !r.p95_step_ms.empty()) {
      const auto [lo, hi] = std::minmax_element(r.p95_step_ms.begin(), r.p95_step_ms.end());
      std::printf(" %20s |", fmt("%.2f / %.2f", *lo, *hi).c_str());
    }
    std::printf("\n");
    pts.push_back({{"sessions", r.sessions},
                   {"ms_per_step", step_ms},
                   {"aggregate_tps", agg},
                   {"samples_ms", r.samples_ms},
                   {"p95_step_ms", r.p95_step_ms}});
  }
  const nlohmann::json doc{{"schema", "geist-bench/1"},
                           {"command", "batch"},
                           {"environment", bench::to_json(env)},
                           {"params",
                            {{"sessions", o.sessions},
                             {"n_prompt", o.n_prompt},
                             {"n_gen", o.n_gen},
                             {"repetitions", o.reps},
                             {"threads", o.threads},
                             {"concurrent", o.concurrent}}},
                           {"results", pts}};
  return write_outputs(o.c, doc, "") ? 0 : 1;
}

}  // namespace

Runner add_bench_batch(CLI::App &bench) {
  auto o = std::make_shared<BatchOptions>();
  CLI::App *sub = bench.add_subcommand(
      "batch", "Decode throughput of S sessions advancing together in one step each token (geist_decode_batch)");
  add_bench_common(sub, &o->c);
  sub->add_option("-S,--sessions", o->sessions, "Session counts to measure (comma-separated)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(int_range(1, 1024));
  sub->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens each session prefills first")
      ->capture_default_str()
      ->check(int_range(1, 1 << 20));
  sub->add_option("-n,--n-gen", o->n_gen, "Decode steps timed")->capture_default_str()->check(int_range(1, 1 << 20));
  sub->add_option("-r,--repetitions", o->reps, "Repetitions (after one warm-up)")
      ->capture_default_str()
      ->check(int_range(1, 100000));
  sub->add_option("-t,--threads", o->threads, "Threads (0: all)")->capture_default_str()->check(int_range(0, 512));
  sub->add_flag("--concurrent", o->concurrent,
                "Each session decodes on its own thread with decode_step, all at once, instead of one "
                "geist_decode_batch step for all");
  return [o] { return run(*o); };
}

}  // namespace geist::cli
