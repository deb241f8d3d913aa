// geist perplexity: perplexity of a text file, computed the way llama.cpp's perplexity
// tool does: tokenize with BOS, split into windows of n_ctx tokens, put BOS at the start of
// every window (when the vocabulary adds one), and score the predictions of the second
// half of each window (positions n_ctx/2 .. n_ctx-2 predicting the next token). Runs on
// the public API; the numbers equal the engine's compute_perplexity (same logits by batch
// invariance, same double-precision sums).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "api_common.h"
#include "commands.h"

namespace geist::cli {
namespace {

struct PplOptions {
  std::string model, file;
  int n_ctx = 512;
  int batch = 512;
  int threads = 0;
  int chunks = -1;
  DeviceOptions dev;
};

// -log softmax(logits)[target], in double.
double token_nll(const float *logits, size_t n_vocab, geist_token target) {
  float mx = logits[0];
  for (size_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (size_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  return std::log(sum) - (double(logits[target]) - mx);
}

int perplexity(const PplOptions &o) {
  std::string text;
  if (!read_text_file(o.file, &text)) return 1;
  api::Model model;
  if (!load_api_model(o.model, &model, nullptr, &o.dev)) return 1;
  std::vector<geist_token> tokens;
  if (api::Error e = model.tokenize(text, true, false, &tokens)) return report(e);
  if (tokens.size() < 2 * size_t(o.n_ctx)) {
    std::fprintf(stderr, "geist: error: need at least %d tokens for --ctx %d, the file has %zu\n", 2 * o.n_ctx, o.n_ctx,
                 tokens.size());
    return 1;
  }
  // BOS starts every window iff tokenize adds one (the vocabulary's add_bos).
  std::vector<geist_token> empty;
  if (api::Error e = model.tokenize("", true, false, &empty)) return report(e);
  const geist_token bos = model.info().bos;
  const bool add_bos = bos >= 0 && !empty.empty() && empty[0] == bos;

  GenOptions g;
  g.n_ctx = o.n_ctx;
  g.batch = std::min(o.batch, o.n_ctx);
  g.threads = o.threads;
  g.dev = o.dev;
  api::Session s;
  if (!create_session(model, g, &s)) return 1;
  std::fprintf(stderr, "perplexity: %zu tokens, windows of %d, scoring positions %d..%d of each\n", tokens.size(),
               o.n_ctx, o.n_ctx / 2, o.n_ctx - 2);

  const auto t0 = std::chrono::steady_clock::now();
  int n_windows = static_cast<int>(tokens.size() / size_t(o.n_ctx));
  if (o.chunks > 0) n_windows = std::min(n_windows, o.chunks);
  const size_t nv = s.n_vocab(), n_ctx = size_t(o.n_ctx), first = n_ctx / 2;
  std::vector<float> logits;  // [n_ctx - first][n_vocab]
  double nll = 0, nll2 = 0;
  int64_t n_scored = 0;
  for (int w = 0; w < n_windows; ++w) {
    const size_t start = size_t(w) * n_ctx;
    std::vector<geist_token> win(tokens.begin() + start, tokens.begin() + start + n_ctx);
    if (add_bos) win[0] = bos;
    api::Error e = s.clear();
    if (!e) e = s.prefill_logits(win, first, &logits);
    if (e) return report(e);
    for (size_t j = first; j < n_ctx - 1; ++j) {
      const double v = token_nll(logits.data() + (j - first) * nv, nv, tokens[start + j + 1]);
      nll += v;
      nll2 += v * v;
      ++n_scored;
    }
    std::printf("[%d]%.4f,", w + 1, std::exp(nll / double(n_scored)));
    std::fflush(stdout);
  }
  const double mean = nll / double(n_scored), ppl = std::exp(mean);
  const double var = std::max(0.0, nll2 / double(n_scored) - mean * mean);
  const double ppl_stderr = n_scored > 1 ? ppl * std::sqrt(var / double(n_scored - 1)) : 0.0;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, ppl_stderr);
  std::fprintf(stderr, "perplexity: %lld predictions in %d windows, %.1f s (%.1f tokens/s)\n", (long long)n_scored,
               n_windows, secs, double(n_windows) * o.n_ctx / secs);
  return 0;
}

}  // namespace

Runner add_perplexity(CLI::App &app) {
  auto o = std::make_shared<PplOptions>();
  CLI::App *sub = app.add_subcommand("perplexity", "Perplexity of a text file (llama.cpp's method)");
  add_model_option(sub, &o->model);
  add_device_options(sub, &o->dev);
  sub->add_option("-f,--file", o->file, "Text file")->required();
  sub->add_option("-c,--ctx,--ctx-size", o->n_ctx, "Window size in tokens")
      ->capture_default_str()
      ->check(int_range(16, 1 << 20));
  sub->add_option("-b,--batch-size", o->batch, "Prefill chunk size")
      ->capture_default_str()
      ->check(int_range(1, 65536));
  sub->add_option("-t,--threads", o->threads, "Threads (0: all)")->capture_default_str()->check(int_range(0, 512));
  sub->add_option("--chunks", o->chunks, "Score at most this many windows (-1: all)")->capture_default_str();
  return [o] { return perplexity(*o); };
}

}  // namespace geist::cli
