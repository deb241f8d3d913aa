#include "engine/perplexity.h"

#include <algorithm>
#include <cmath>

namespace geist {

double token_nll(const float *logits, int64_t n_vocab, int32_t target) {
  float mx = logits[0];
  for (int64_t i = 1; i < n_vocab; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (int64_t i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - mx);
  return std::log(sum) - (double(logits[target]) - mx);
}

Result<PerplexityResult> compute_perplexity(Session &s, const std::vector<int32_t> &tokens, int n_ctx,
                                            int max_windows, const std::function<void(int, double)> &on_window) {
  if (n_ctx < 4 || tokens.size() < 2 * size_t(n_ctx)) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "perplexity with windows of %d tokens needs at least %d tokens, got %zu",
                       n_ctx, 2 * n_ctx, tokens.size());
  }
  if (s.n_ctx() < n_ctx) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "session context %lld is smaller than the window %d",
                       (long long)s.n_ctx(), n_ctx);
  }
  int n_windows = static_cast<int>(tokens.size() / n_ctx);
  if (max_windows > 0) n_windows = std::min(n_windows, max_windows);
  const int64_t nv = s.n_vocab();
  const int first = n_ctx / 2;
  const int32_t bos = s.model().tokenizer().bos();
  const bool add_bos = s.model().tokenizer().vocab().add_bos && bos >= 0;
  std::vector<float> logits(size_t(n_ctx - first) * nv);
  PerplexityResult r;
  double nll = 0, nll2 = 0;
  for (int w = 0; w < n_windows; ++w) {
    const size_t start = size_t(w) * n_ctx;
    std::vector<int32_t> win(tokens.begin() + start, tokens.begin() + start + n_ctx);
    if (add_bos) win[0] = bos;
    s.clear();
    GEIST_RETURN_IF_ERROR(s.prefill_with_logits(win.data(), win.size(), first, logits.data()));
    for (int j = first; j < n_ctx - 1; ++j) {
      const double v = token_nll(logits.data() + size_t(j - first) * nv, nv, tokens[start + j + 1]);
      nll += v;
      nll2 += v * v;
      ++r.n_scored;
    }
    if (on_window) on_window(w, std::exp(nll / r.n_scored));
  }
  r.n_windows = n_windows;
  r.mean_nll = nll / r.n_scored;
  r.ppl = std::exp(r.mean_nll);
  const double var = std::max(0.0, nll2 / r.n_scored - r.mean_nll * r.mean_nll);
  r.ppl_stderr = r.n_scored > 1 ? r.ppl * std::sqrt(var / double(r.n_scored - 1)) : 0.0;
  return r;
}

}  // namespace geist
