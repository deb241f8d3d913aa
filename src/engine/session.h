// A session: one conversation's state over a shared Model — KV cache, scratch, the
// tokens so far and the logits after the last one. Not thread-safe: use one session per
// thread (many sessions may share one Model concurrently).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/model.h"
#include "models/arch.h"

namespace geist {

struct SessionParams {
  int64_t n_ctx = 0;     // 0: the model's trained context
  int n_threads = 0;     // 0: all hardware threads of this process
  int chunk = 256;       // rows per forward call; prefill of any length is split into these
};

class Session {
 public:
  // GEIST_E_INVALID_ARGUMENT for out-of-range params, GEIST_E_OUT_OF_MEMORY if the KV
  // cache cannot be reserved.
  static Result<std::unique_ptr<Session>> create(const Model &m, const SessionParams &p);

  // Append tokens (any n >= 1), keeping the logits after the last one. On error the
  // session is unchanged if the error is detected before computing (context full, bad
  // ids); a failure mid-way cannot happen with valid input.
  Status prefill(const int32_t *tokens, size_t n);
  // As prefill, and also write the logits after every token i in [first, n) to
  // out: [n - first][n_vocab].
  Status prefill_with_logits(const int32_t *tokens, size_t n, size_t first, float *out);

  const float *logits() const { return has_logits_ ? logits_.data() : nullptr; }
  int64_t n_vocab() const { return model_.info().n_vocab; }
  size_t n_tokens() const { return tokens_.size(); }
  const std::vector<int32_t> &tokens() const { return tokens_; }
  int64_t n_ctx() const { return cache_->n_ctx(); }
  int chunk() const { return params_.chunk; }
  int n_threads() const { return pool_.n_threads(); }
  const Model &model() const { return model_; }
  void clear();

 private:
  Session(const Model &m, const SessionParams &p, std::unique_ptr<models::KvCache> c, int n_threads);
  Status check_append(const int32_t *tokens, size_t n) const;

  const Model &model_;
  SessionParams params_;
  std::unique_ptr<models::KvCache> cache_;
  models::Workspace ws_;
  ThreadPool pool_;
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;  // [n_vocab]
  bool has_logits_ = false;
};

}  // namespace geist
