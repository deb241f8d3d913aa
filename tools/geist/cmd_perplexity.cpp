// geist perplexity: perplexity of a text file, computed the way llama.cpp's perplexity
// tool does: tokenize with BOS, split into windows of n_ctx tokens, put BOS at the start of
// every window, and score the predictions of the second half of each window
// (positions n_ctx/2 .. n_ctx-2 predicting the next token).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "base/timer.h"
#include "commands.h"
#include "engine/perplexity.h"
#include "engine/session.h"

namespace geist::cli {
namespace {

struct PplOptions {
  std::string model, file;
  int n_ctx = 512;
  int batch = 512;
  int threads = 0;
  int chunks = -1;
};

int perplexity(const PplOptions &o) {
  std::string text;
  if (!read_text_file(o.file, &text)) return 1;
  std::unique_ptr<Model> model = load_model_or_report(o.model);
  if (!model) return 1;
  std::vector<int32_t> tokens;
  if (Status s = model->tokenizer().encode(text, true, false, &tokens); !s) return report(s);
  if (tokens.size() < 2 * size_t(o.n_ctx)) {
    std::fprintf(stderr, "geist: error: need at least %d tokens for --ctx %d, the file has %zu\n", 2 * o.n_ctx,
                 o.n_ctx, tokens.size());
    return 1;
  }
  SessionParams sp;
  sp.n_ctx = o.n_ctx;
  sp.chunk = std::min(o.batch, o.n_ctx);
  sp.n_threads = o.threads;
  Result<std::unique_ptr<Session>> sr = Session::create(*model, sp);
  if (!sr) return report(sr.status());
  std::fprintf(stderr, "perplexity: %zu tokens, windows of %d, scoring positions %d..%d of each\n", tokens.size(),
               o.n_ctx, o.n_ctx / 2, o.n_ctx - 2);
  Timer t;
  Result<PerplexityResult> r = compute_perplexity(**sr, tokens, o.n_ctx, o.chunks, [](int w, double ppl) {
    std::printf("[%d]%.4f,", w + 1, ppl);
    std::fflush(stdout);
  });
  if (!r) return report(r.status());
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r->ppl, r->ppl_stderr);
  std::fprintf(stderr, "perplexity: %lld predictions in %d windows, %.1f s (%.1f tokens/s)\n", (long long)r->n_scored,
               r->n_windows, t.seconds(), double(r->n_windows) * o.n_ctx / t.seconds());
  return 0;
}

}  // namespace

Runner add_perplexity(CLI::App &app) {
  auto o = std::make_shared<PplOptions>();
  CLI::App *sub = app.add_subcommand("perplexity", "Perplexity of a text file (llama.cpp's method)");
  add_model_option(sub, &o->model);
  sub->add_option("-f,--file", o->file, "Text file")->required();
  sub->add_option("-c,--ctx,--ctx-size", o->n_ctx, "Window size in tokens")->capture_default_str()->check(CLI::Range(16, 1 << 20));
  sub->add_option("-b,--batch-size", o->batch, "Prefill chunk size")->capture_default_str()->check(CLI::Range(1, 65536));
  sub->add_option("-t,--threads", o->threads, "Threads (0: all)")->capture_default_str()->check(CLI::Range(0, 512));
  sub->add_option("--chunks", o->chunks, "Score at most this many windows (-1: all)")->capture_default_str();
  return [o] { return perplexity(*o); };
}

}  // namespace geist::cli
