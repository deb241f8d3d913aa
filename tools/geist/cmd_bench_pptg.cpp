// geist bench pp-tg: llama-bench's tests with its flags and semantics, so the two tools'
// outputs line up.
//   ppN  prefill N tokens in chunks of -b (one chunk when N <= -b), timed as one call;
//   tgN  N one-token forward passes (no sampling, as llama-bench's test_gen), timed together;
//   -d D both after D tokens already in the context: prefilled once and pinned, then reset
//        before every repetition (llama-bench restores the same state), not timed.
// A warm-up run of each test (pp: the whole prefill, tg: one token) comes first unless
// --no-warmup. tokens/s = N / time of one repetition; reported as mean ± sample stddev
// over the repetitions. Tokens come from the built-in corpus (llama-bench uses random ids;
// the cost of a forward pass does not depend on the ids). Every list flag takes
// comma-separated values and each combination is one test (threads x depth x (pp, tg)).
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

struct PpTgOptions {
  BenchCommon c;
  std::vector<int> n_prompt = {512}, n_gen = {128}, n_depth = {0}, threads = {0};
  int reps = 5, batch = 512;
  std::string output = "md";
  bool no_warmup = false;
};

double now_ns() {
  return std::chrono::duration<double, std::nano>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Runs one test on a fresh session; fills t->samples_ns. False after printing an error.
bool run_test(const api::Model &m, const std::vector<geist_token> &tokens, const PpTgOptions &o,
              Progress &progress, bench::PpTgTest *t) {
  geist_session_params p = geist_session_params_default();
  p.n_ctx = t->n_ctx;
  p.n_threads = t->n_threads;
  p.chunk = t->n_batch;
  apply_kv_types(o.c.dev, &p);
  p.sampling.temperature = 0;
  api::Session s;
  api::Error e = api::Session::create(m, &p, &s);
  if (!e && t->n_depth > 0) e = s.pin_prefix(tokens.data(), size_t(t->n_depth));
  const geist_token *run = tokens.data() + t->n_depth;  // the tokens after the depth
  auto once = [&](int n_pp, int n_tg) {
    api::Error r = s.reset();  // to the pinned depth, or to empty
    if (!r && n_pp > 0) r = s.prefill(run, size_t(n_pp));
    for (int i = 0; !r && i < n_tg; ++i) r = s.prefill(run + i, 1);
    return r;
  };
  if (!e && !o.no_warmup) e = t->n_prompt > 0 ? once(t->n_prompt, 0) : once(0, 1);
  progress.step();
  for (int r = 0; !e && r < o.reps; ++r) {
    if ((e = s.reset())) break;
    const double t0 = now_ns();
    if (t->n_prompt > 0) {
      e = s.prefill(run, size_t(t->n_prompt));
    } else {
      for (int i = 0; !e && i < t->n_gen; ++i) e = s.prefill(run + i, 1);
    }
    t->samples_ns.push_back(now_ns() - t0);
    progress.step();
  }
  if (e) {
    std::fprintf(stderr, "geist: error: %s: %s\n", t->name().c_str(), e.message.c_str());
    return false;
  }
  return true;
}

int run(const PpTgOptions &o) {
  if (!outputs_writable(o.c)) return 1;
  api::Model model;
  if (!load_api_model(o.c.model, &model, nullptr, &o.c.dev)) return 1;
  const geist_model_info info = model.info();
  std::vector<bench::PpTgTest> tests;
  int64_t max_ctx = 0;
  for (int th : o.threads)
    for (int d : o.n_depth) {
      auto add = [&](int pp, int tg) {
        bench::PpTgTest t;
        t.n_prompt = pp, t.n_gen = tg, t.n_depth = d, t.n_threads = bench_threads(th),
        t.n_batch = o.batch;
        t.n_ctx = int64_t(d) + pp + tg;  // as llama-bench: n_prompt + n_gen + n_depth
        max_ctx = std::max(max_ctx, t.n_ctx);
        tests.push_back(t);
      };
      for (int pp : o.n_prompt)
        if (pp > 0) add(pp, 0);
      for (int tg : o.n_gen)
        if (tg > 0) add(0, tg);
    }
  if (tests.empty()) {
    std::fprintf(stderr, "geist: error: no test to run (every -p and -n value is 0)\n");
    return 2;
  }
  // BOS + corpus, as long as the longest test needs.
  std::vector<geist_token> corpus, tokens;
  if (api::Error e = corpus_tokens(model, &corpus)) return report(e);
  if (info.add_bos && info.bos >= 0) tokens.push_back(info.bos);
  const std::vector<geist_token> body = corpus_slice(corpus, 0, size_t(max_ctx));
  tokens.insert(tokens.end(), body.begin(), body.end());

  const bench::Environment env =
      collect_environment("pp-tg", model, o.c.model, tests[0].n_threads, max_ctx, o.c.hash);
  Progress progress("bench pp-tg", tests.size() * size_t(o.reps + 1), !o.c.no_progress);
  for (bench::PpTgTest &t : tests)
    if (!run_test(model, tokens, o, progress, &t)) return 1;
  progress.done();

  const nlohmann::json params{{"n_prompt", o.n_prompt}, {"n_gen", o.n_gen},
                              {"n_depth", o.n_depth},   {"threads", o.threads},
                              {"repetitions", o.reps},  {"n_batch", o.batch},
                              {"warmup", !o.no_warmup}};
  if (o.output == "md") {
    std::printf("%s\n%s", bench::environment_text(env).c_str(),
                bench::pptg_markdown(env, tests).c_str());
  } else {
    std::fprintf(stderr, "%s", bench::environment_text(env).c_str());
    if (o.output == "csv") {
      std::printf("%s", bench::pptg_csv(env, tests).c_str());
    } else {
      nlohmann::json a = nlohmann::json::array();
      for (const bench::PpTgTest &t : tests) a.push_back(bench::pptg_record_json(env, t));
      std::printf("%s\n", a.dump(2).c_str());
    }
  }
  std::string svg;
  if (!o.c.plot.empty()) {
    std::vector<PlotSeries> series;
    for (const bench::PpTgTest &t : tests) {
      PlotSeries s{t.name(), {}};
      const double n = t.n_prompt > 0 ? t.n_prompt : t.n_gen;
      for (double ns : t.samples_ns) s.values_ms.push_back(ns / 1e6 / n);
      series.push_back(std::move(s));
    }
    svg = svg_latency_plot("geist bench pp-tg: ms per token, one dot per repetition", series);
  }
  return write_outputs(o.c, bench::pptg_json(env, params, tests), svg) ? 0 : 1;
}

}  // namespace

Runner add_bench_pptg(CLI::App &bench) {
  auto o = std::make_shared<PpTgOptions>();
  CLI::App *sub =
      bench.add_subcommand("pp-tg",
                           "llama-bench's tests: prompt processing (-p) and text generation (-n) "
                           "tokens/s, mean ± stddev over -r repetitions");
  add_bench_common(sub, &o->c);
  sub->add_option("-p,--n-prompt", o->n_prompt,
                  "Prompt tokens of the pp tests (comma-separated; 0: none)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(int_range(0, 1 << 20));
  sub->add_option("-n,--n-gen", o->n_gen,
                  "Generated tokens of the tg tests (comma-separated; 0: none)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(int_range(0, 1 << 20));
  sub->add_option("-d,--n-depth", o->n_depth, "Tokens already in the context (comma-separated)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(int_range(0, 1 << 24));
  sub->add_option("-t,--threads", o->threads, "Threads (comma-separated; 0: all)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(int_range(0, 512));
  sub->add_option("-r,--repetitions", o->reps, "Repetitions of each test")
      ->capture_default_str()
      ->check(int_range(1, 100000));
  sub->add_option("-b,--batch-size,-u,--ubatch-size", o->batch,
                  "Prefill chunk (llama-bench's ubatch)")
      ->capture_default_str()
      ->check(int_range(1, 65536));
  sub->add_option("-o,--output", o->output, "Output format on stdout: md, csv or json")
      ->capture_default_str()
      ->check(CLI::IsMember({"md", "csv", "json"}));
  sub->add_flag("--no-warmup", o->no_warmup, "Skip the warm-up run of each test");
  return [o] { return run(*o); };
}

}  // namespace geist::cli
