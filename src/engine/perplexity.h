// Perplexity the way llama.cpp's perplexity tool computes it: the token sequence (which
// starts with BOS when the vocab adds one) is cut into windows of n_ctx tokens; each window
// starts over from an empty cache with its first token replaced by BOS; the predictions of
// positions n_ctx/2 .. n_ctx-2 (of the token that follows) are scored.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "base/status.h"
#include "engine/session.h"

namespace geist {

struct PerplexityResult {
  double ppl = 0;
  double ppl_stderr = 0;
  double mean_nll = 0;
  int64_t n_scored = 0;
  int n_windows = 0;
};

// The session's context must hold n_ctx tokens; it is cleared before every window.
// max_windows <= 0: all full windows. on_window(i, running_ppl) after each window.
// GEIST_E_INVALID_ARGUMENT if fewer than 2 * n_ctx tokens are given.
Result<PerplexityResult> compute_perplexity(Session &s, const std::vector<int32_t> &tokens, int n_ctx,
                                            int max_windows,
                                            const std::function<void(int, double)> &on_window = {});

// -log softmax(logits)[target], in double.
double token_nll(const float *logits, int64_t n_vocab, int32_t target);

}  // namespace geist
