#include "engine/session.h"

#include <algorithm>
#include <cstring>

namespace geist {

Session::Session(const Model &m, const SessionParams &p, std::unique_ptr<models::KvCache> c, int n_threads)
    : model_(m), params_(p), cache_(std::move(c)), pool_(n_threads) {
  logits_.resize(static_cast<size_t>(m.info().n_vocab));
}

Result<std::unique_ptr<Session>> Session::create(const Model &m, const SessionParams &p) {
  SessionParams q = p;
  if (q.n_ctx == 0) q.n_ctx = m.info().n_ctx_train;
  if (q.n_ctx < 1 || q.n_ctx > (int64_t(1) << 24)) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "n_ctx %lld out of range [1, %d]", (long long)q.n_ctx, 1 << 24);
  }
  if (q.chunk < 1 || q.chunk > 65536) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "chunk size %d out of range [1, 65536]", q.chunk);
  }
  if (q.n_threads < 0) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "n_threads %d is negative", q.n_threads);
  int threads = q.n_threads > 0 ? q.n_threads : ThreadPool::hardware_threads();
  if (threads > 512) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "n_threads %d out of range", threads);
  q.chunk = static_cast<int>(std::min<int64_t>(q.chunk, q.n_ctx));
  std::unique_ptr<models::KvCache> cache;
  GEIST_ASSIGN_OR_RETURN(cache, models::KvCache::create(m.arch().kv_layout(), q.n_ctx, q.chunk));
  return std::unique_ptr<Session>(new Session(m, q, std::move(cache), threads));
}

void Session::clear() {
  cache_->n_past = 0;
  tokens_.clear();
  has_logits_ = false;
}

Status Session::check_append(const int32_t *tokens, size_t n) const {
  if (n == 0 || tokens == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "prefill of zero tokens");
  if (tokens_.size() + n > static_cast<size_t>(cache_->n_ctx())) {
    return GEIST_ERROR(GEIST_E_CONTEXT_FULL, "%zu tokens in the session + %zu new exceed the context of %lld",
                       tokens_.size(), n, (long long)cache_->n_ctx());
  }
  const int64_t nv = model_.info().n_vocab;
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= nv) {
      return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "token %zu has id %d, outside [0, %lld)", i, tokens[i],
                         (long long)nv);
    }
  }
  return Status::ok();
}

Status Session::prefill(const int32_t *tokens, size_t n) {
  GEIST_RETURN_IF_ERROR(check_append(tokens, n));
  for (size_t done = 0; done < n;) {
    const int rows = static_cast<int>(std::min<size_t>(params_.chunk, n - done));
    const bool last = done + rows == n;
    GEIST_RETURN_IF_ERROR(model_.arch().forward(tokens + done, rows, *cache_, ws_, pool_, last ? rows - 1 : rows,
                                                last ? logits_.data() : nullptr));
    tokens_.insert(tokens_.end(), tokens + done, tokens + done + rows);
    done += rows;
  }
  has_logits_ = true;
  return Status::ok();
}

Status Session::prefill_with_logits(const int32_t *tokens, size_t n, size_t first, float *out) {
  GEIST_RETURN_IF_ERROR(check_append(tokens, n));
  if (first >= n || out == nullptr) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "logits requested from row %zu of %zu", first, n);
  }
  const size_t nv = static_cast<size_t>(model_.info().n_vocab);
  for (size_t done = 0; done < n;) {
    const int rows = static_cast<int>(std::min<size_t>(params_.chunk, n - done));
    // Rows of this chunk whose logits are wanted: [max(first, done), done + rows).
    const size_t from = std::max(first, done);
    const bool want = from < done + rows;
    const int first_row = want ? static_cast<int>(from - done) : rows;
    GEIST_RETURN_IF_ERROR(model_.arch().forward(tokens + done, rows, *cache_, ws_, pool_, first_row,
                                                want ? out + (from - first) * nv : nullptr));
    tokens_.insert(tokens_.end(), tokens + done, tokens + done + rows);
    done += rows;
  }
  std::memcpy(logits_.data(), out + (n - 1 - first) * nv, nv * sizeof(float));
  has_logits_ = true;
  return Status::ok();
}

}  // namespace geist
