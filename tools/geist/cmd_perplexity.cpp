// geist perplexity: perplexity of a text file, computed the way llama.cpp's perplexity
// tool does: tokenize with BOS, split into windows of n_ctx tokens, put BOS at the start of
// every window, and score the predictions of the second half of each window
// (positions n_ctx/2 .. n_ctx-2 predicting the next token).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "base/timer.h"
#include "commands.h"
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

// -log softmax(logits)[target], in double.
double nll_of(const float *logits, int64_t n_vocab, int32_t target) {
  float mx = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  return std::log(sum) - (double(logits[target]) - mx);
}

int perplexity(const PplOptions &o) {
  std::string text;
  if (!read_text_file(o.file, &text)) return 1;
  std::unique_ptr<Model> model = load_model_or_report(o.model);
  if (!model) return 1;
  std::vector<int32_t> tokens;
  if (Status s = model->tokenizer().encode(text, true, false, &tokens); !s) return report(s);
  const int n_ctx = o.n_ctx;
  if (tokens.size() < 2 * size_t(n_ctx)) {
    std::fprintf(stderr, "geist: error: need at least %d tokens for --ctx %d, the file has %zu\n", 2 * n_ctx, n_ctx,
                 tokens.size());
    return 1;
  }
  int n_chunk = static_cast<int>(tokens.size() / n_ctx);
  if (o.chunks > 0 && o.chunks < n_chunk) n_chunk = o.chunks;

  SessionParams sp;
  sp.n_ctx = n_ctx;
  sp.chunk = std::min(o.batch, n_ctx);
  sp.n_threads = o.threads;
  Result<std::unique_ptr<Session>> sr = Session::create(*model, sp);
  if (!sr) return report(sr.status());
  Session &s = **sr;
  const int64_t nv = s.n_vocab();
  const int first = n_ctx / 2;
  std::vector<float> logits(size_t(n_ctx - first) * nv);
  const bool add_bos = model->tokenizer().vocab().add_bos;
  std::fprintf(stderr, "perplexity: %zu tokens, %d chunks of %d, scoring positions %d..%d of each\n", tokens.size(),
               n_chunk, n_ctx, first, n_ctx - 2);

  double nll = 0, nll2 = 0;
  int64_t count = 0;
  Timer t;
  for (int c = 0; c < n_chunk; ++c) {
    std::vector<int32_t> win(tokens.begin() + size_t(c) * n_ctx, tokens.begin() + size_t(c + 1) * n_ctx);
    if (add_bos) win[0] = model->tokenizer().bos();
    s.clear();
    if (Status e = s.prefill_with_logits(win.data(), win.size(), first, logits.data()); !e) return report(e);
    for (int j = first; j < n_ctx - 1; ++j) {
      const double v = nll_of(logits.data() + size_t(j - first) * nv, nv, tokens[size_t(c) * n_ctx + j + 1]);
      nll += v;
      nll2 += v * v;
      ++count;
    }
    std::printf("[%d]%.4f,", c + 1, std::exp(nll / count));
    std::fflush(stdout);
  }
  const double mean = nll / count;
  const double var = nll2 / count - mean * mean;
  const double ppl = std::exp(mean);
  const double err = count > 1 ? ppl * std::sqrt(std::max(0.0, var) / (count - 1)) : 0.0;
  std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", ppl, err);
  std::fprintf(stderr, "perplexity: %lld predictions, %.1f s (%.1f tokens/s)\n", (long long)count, t.seconds(),
               double(n_chunk) * n_ctx / t.seconds());
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
