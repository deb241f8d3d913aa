#include "engine/session.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <new>

#include "base/thread_pool.h"
#include "base/timer.h"

namespace geist {

Session::Session(const Model &m, const SessionParams &p, std::unique_ptr<KvStore> c, std::unique_ptr<Exec> e)
    : model_(m),
      params_(p),
      cache_(std::move(c)),
      exec_(std::move(e)),
      pool_(ThreadPool::shared(exec_->n_threads() > 1
                                   ? exec_->n_threads()
                                   : std::min(p.n_threads > 0 ? p.n_threads : ThreadPool::hardware_threads(),
                                              kDevicePoolThreads))),
      sampler_(p.sampling),
      logits_(exec_->host_floats(static_cast<size_t>(m.info().n_vocab))) {}

Session::~Session() {
  if (exec_) exec_->drop_queued();  // no copy of a queued step may land in logits_ after this
}

Result<std::unique_ptr<Session>> Session::create(const Model &m, const SessionParams &p) {
  SessionParams q = p;
  if (q.n_ctx == 0 && m.info().n_ctx_train > (int64_t(1) << 24)) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT,
                       "the model's trained context (%lld tokens) is above the largest session context (%d); "
                       "ask for a smaller one (n_ctx, geist's -c)",
                       (long long)m.info().n_ctx_train, 1 << 24);
  }
  if (q.n_ctx == 0) q.n_ctx = m.info().n_ctx_train;
  if (q.n_ctx < 1 || q.n_ctx > (int64_t(1) << 24)) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "n_ctx %lld out of range [1, %d]", (long long)q.n_ctx, 1 << 24);
  }
  if (q.chunk < 1 || q.chunk > 65536) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "chunk size %d out of range [1, 65536]", q.chunk);
  }
  if (q.n_threads < 0) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "n_threads %d is negative", q.n_threads);
  if (std::string why = Sampler::check(q.sampling); !why.empty()) return Status(GEIST_E_INVALID_ARGUMENT, why);
  int threads = q.n_threads > 0 ? q.n_threads : ThreadPool::hardware_threads();
  if (threads > 512) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "n_threads %d out of range", threads);
  q.chunk = static_cast<int>(std::min<int64_t>(q.chunk, q.n_ctx));
  Backend &b = m.arch().backend();
  std::unique_ptr<KvStore> cache;
  GEIST_ASSIGN_OR_RETURN(cache, b.create_kv(m.arch().kv_layout(), q.n_ctx, q.chunk, q.type_k, q.type_v));
  std::unique_ptr<Exec> exec;
  GEIST_ASSIGN_OR_RETURN(exec, b.create_exec(threads, q.chunk));
  m.arch().reserve(*exec);
  GEIST_RETURN_IF_ERROR(exec->reserve_status());
  if (const int warm = exec->warm_up_steps(); warm > 0) {
    // Throwaway decode steps at position 0 (the rows they write lie past n_past and are
    // overwritten by the first prefill), so that the first request runs like the tenth:
    // without a drawn token, with the greedy one and with a sampled one (the steps of a
    // sampler whose draws a step computes; the session's own top-k where it has one), so
    // that changing the sampling does not capture on a request's path either.
    std::vector<float> logits(static_cast<size_t>(m.info().n_vocab));
    const int32_t tok = 0;
    StepDraw greedy, sampled;
    sampled.spec.temperature = 1.0f;
    sampled.spec.top_k = 40;
    if (DrawSpec own; Sampler(q.sampling).step_spec(0, m.info().n_vocab, &own) && own.temperature > 0.0f) {
      sampled.spec.top_k = own.top_k;
    }
    sampled.spec.top_k = static_cast<int>(std::min<int64_t>(sampled.spec.top_k, m.info().n_vocab));
    StepDraw *const draws[3] = {nullptr, &greedy, &sampled};
    for (int variant = 0; variant < (exec->draws_sampled() ? 3 : 2); ++variant) {
      for (int i = 0; i < warm; ++i) {
        StepDraw *const *d = variant > 0 ? &draws[variant] : nullptr;
        GEIST_RETURN_IF_ERROR(m.arch().forward(&tok, 1, *cache, *exec, 0, logits.data(), d));
        cache->n_past = 0;
      }
    }
  }
  return std::unique_ptr<Session>(new Session(m, q, std::move(cache), std::move(exec)));
}

void Session::reserve_tokens(size_t extra) {
  const size_t need = tokens_.size() + extra;
  if (need <= tokens_.capacity()) return;
  // Geometric growth (capped at the context): reserving exactly size + 1 on every decode
  // step would copy the whole token list each time.
  tokens_.reserve(std::max(need, std::min(2 * tokens_.capacity(), size_t(cache_->n_ctx()))));
}

size_t Session::checkpoint_bytes() const {
  size_t b = 0;
  if (pin_) {
    b += cache_->checkpoint_bytes(int64_t(pin_->n));
    b += pin_->logits.size() * sizeof(float);
  }
  return b;
}

void Session::clear() {
  (void)ready();  // a queued step's error: the session is emptied anyway
  cache_->n_past = 0;
  tokens_.clear();
  has_logits_ = false;
  logits_on_device_ = false;
  step_draw_ = StepDraw{};
  sampler_.reset();
  pin_.reset();
}

void Session::unpin() {
  (void)ready();  // a queued step that failed goes back to the pin being dropped
  pin_.reset();
}

Status Session::check_append(const int32_t *tokens, size_t n) const {
  if (n == 0 || tokens == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "prefill of zero tokens");
  if (n > static_cast<size_t>(cache_->n_ctx()) || tokens_.size() + n > static_cast<size_t>(cache_->n_ctx())) {
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

// Inputs are validated and the scratch is reserved at create, so forward() fails only on
// a device error. Earlier chunks of this call may then have overwritten ring rows the
// state before the call still read, so the session goes back to its pin (or empty).
Status Session::run_chunks(const int32_t *tokens, size_t n, size_t first, float *out, bool may_defer) {
  const size_t nv = static_cast<size_t>(model_.info().n_vocab);
  reserve_tokens(n);  // may throw: before anything changes
  for (size_t done = 0; done < n;) {
    const int rows = static_cast<int>(std::min<size_t>(params_.chunk, n - done));
    const bool last = done + rows == n;
    float *dst = nullptr;
    StepDraw *draw = nullptr;
    int first_row = rows;
    if (out) {
      const size_t from = std::max(first, done);  // rows of this chunk wanted: [from, done + rows)
      if (from < done + rows) {
        first_row = static_cast<int>(from - done);
        dst = out + (from - first) * nv;
      }
    } else if (last) {
      first_row = rows - 1;
      dst = logits_.get();
      draw = draw_target();
    }
    step_draw_.token = -1;
    Status st = forward_one(tokens + done, rows, first_row, dst, draw, may_defer);
    if (!st.is_ok()) {
      recover(rows);
      return st;
    }
    tokens_.insert(tokens_.end(), tokens + done, tokens + done + rows);
    done += rows;
  }
  if (out) {
    logits_on_device_ = false;
    std::memcpy(logits_.get(), out + (n - 1 - first) * nv, nv * sizeof(float));
  }
  for (size_t i = 0; i < n; ++i) sampler_.accept(tokens[i]);
  has_logits_ = true;
  return Status::ok();
}

void Session::recover(int failed_rows) {
  if (!pin_ || tokens_.size() < pin_->n) {
    clear();
    return;
  }
  cache_->n_past += failed_rows;  // the failed call may have written these: rewind them too
  reset();
}

Status Session::prefill(const int32_t *tokens, size_t n) {
  GEIST_RETURN_IF_ERROR(ready());
  GEIST_RETURN_IF_ERROR(check_append(tokens, n));
  Timer t;
  GEIST_RETURN_IF_ERROR(run_chunks(tokens, n, 0, nullptr));
  stats_.last_prefill_seconds = t.seconds();
  stats_.prefill_seconds += stats_.last_prefill_seconds;
  stats_.n_prefill_tokens += n;
  return Status::ok();
}

Status Session::prefill_with_logits(const int32_t *tokens, size_t n, size_t first, float *out) {
  GEIST_RETURN_IF_ERROR(ready());
  GEIST_RETURN_IF_ERROR(check_append(tokens, n));
  if (first >= n || out == nullptr) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "logits requested from row %zu of %zu", first, n);
  }
  Timer t;
  GEIST_RETURN_IF_ERROR(run_chunks(tokens, n, first, out));
  stats_.last_prefill_seconds = t.seconds();
  stats_.prefill_seconds += stats_.last_prefill_seconds;
  stats_.n_prefill_tokens += n;
  return Status::ok();
}

std::unique_ptr<Session::Pin> Session::make_pin() const {
  auto pin = std::make_unique<Pin>();
  pin->n = tokens_.size();
  pin->logits.assign(logits_.get(), logits_.get() + n_vocab());
  pin->draw = step_draw_;
  pin->sampler = sampler_.state();
  cache_->save_checkpoint(int64_t(pin->n));
  return pin;
}

Status Session::pin_prefix(const int32_t *tokens, size_t n) {
  GEIST_RETURN_IF_ERROR(ready());
  if (n == 0 || tokens == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "pin of zero tokens");
  if (n > static_cast<size_t>(cache_->n_ctx())) {
    return GEIST_ERROR(GEIST_E_CONTEXT_FULL, "a pin of %zu tokens exceeds the context of %lld", n,
                       (long long)cache_->n_ctx());
  }
  // Validate ids against an empty session (the context check above is the one that applies).
  const int64_t nv = model_.info().n_vocab;
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= nv) {
      return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "token %zu has id %d, outside [0, %lld)", i, tokens[i],
                         (long long)nv);
    }
  }
  Timer t;
  clear();
  GEIST_RETURN_IF_ERROR(run_chunks(tokens, n, 0, nullptr, /*may_defer=*/false));  // the pin keeps the row
  pin_ = make_pin();
  stats_.pin_seconds += t.seconds();
  stats_.n_pins += 1;
  stats_.n_pinned_tokens += n;
  return Status::ok();
}

void Session::reset() {
  if (!ready().is_ok()) return;  // a queued step's error: settle took the session to its pin
  Timer t;
  if (!pin_) {
    clear();
  } else {
    const int64_t p = int64_t(pin_->n), n_past = cache_->n_past;
    for (int l = 0; l < cache_->n_layers(); ++l) {
      if (cache_->spec(l).window == 0) continue;
      stats_.n_reset_rows += uint64_t(cache_->rewind(l, p, n_past));
    }
    cache_->n_past = p;
    tokens_.resize(pin_->n);
    std::memcpy(logits_.get(), pin_->logits.data(), pin_->logits.size() * sizeof(float));
    has_logits_ = true;
    logits_on_device_ = false;
    step_draw_ = pin_->draw;
    sampler_.set_state(pin_->sampler);
  }
  stats_.reset_seconds += t.seconds();
  stats_.n_resets += 1;
}

Status Session::sample(int32_t *out) {
  if (out == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "out is NULL");
  GEIST_RETURN_IF_ERROR(ready());
  if (!has_logits_) return GEIST_ERROR(GEIST_E_STATE, "no logits to sample from: prefill first");
  GEIST_RETURN_IF_ERROR(sync_for_draw());
  *out = draw(row_pool());
  return Status::ok();
}

const float *Session::logits() const {
  if (!has_logits_ || !sync_logits().is_ok()) return nullptr;
  return logits_.get();
}

Status Session::sync_logits() const {
  GEIST_RETURN_IF_ERROR(settle());
  if (!logits_on_device_) return Status::ok();
  logits_on_device_ = false;  // asked once
  Status st = exec_->fetch_outputs();
  if (!st.is_ok()) has_logits_ = false;  // the row is gone (or half copied): none to read
  return st;
}

Status Session::sync_for_draw() const {
  return draws_step_token() ? Status::ok() : sync_logits();
}

namespace {
// Exec::defer_outputs(true) for the next step, and off again after it, also when the
// forward pass throws (bad_alloc): later steps must not defer. Null: nothing.
class DeferOutputs {
 public:
  explicit DeferOutputs(Exec *e) : e_(e) {
    if (e_) e_->defer_outputs(true);
  }
  ~DeferOutputs() {
    if (e_) e_->defer_outputs(false);
  }
  DeferOutputs(const DeferOutputs &) = delete;
  DeferOutputs &operator=(const DeferOutputs &) = delete;

 private:
  Exec *e_;
};

// Whether a step's logits row may stay on the device: the session's next draw is the
// step's token whatever its history (a repeat penalty makes even a greedy sampler's draws
// read the row once there is history).
bool row_may_stay(const StepDraw *draw, const SamplerParams &p) {
  return draw != nullptr && p.repeat_penalty == 1.0f;
}
}  // namespace

Status Session::forward_one(const int32_t *tokens, int rows, int first_row, float *dst, StepDraw *draw,
                            bool may_defer) {
  // Whatever was deferred is overwritten by this step.
  logits_on_device_ = false;
  const bool defer = may_defer && dst == logits_.get() && row_may_stay(draw, sampler_.params());
  const DeferOutputs scope(defer ? exec_.get() : nullptr);
  Status st = model_.arch().forward(tokens, rows, *cache_, *exec_, first_row, dst, draw != nullptr ? &draw : nullptr);
  if (defer) logits_on_device_ = st.is_ok() && exec_->outputs_deferred();
  return st;
}

namespace {
bool step_greedy_on() {
  static const bool on = [] {
    const char *e = std::getenv("GEIST_STEP_GREEDY");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}
}  // namespace

StepDraw *Session::draw_target(int pending) {
  if (!step_greedy_on() || !sampler_.step_spec(pending, n_vocab(), &step_draw_.spec)) return nullptr;
  return step_draw_.spec.temperature <= 0.0f || exec_->draws_sampled() ? &step_draw_ : nullptr;
}

bool Session::queues_steps() const {
  DrawSpec spec;
  return exec_->can_queue() && step_greedy_on() && sampler_.step_spec(0, n_vocab(), &spec) &&
         (spec.temperature <= 0.0f || exec_->draws_sampled());
}

Status Session::settle() const {
  if (!queued_) return Status::ok();
  queued_ = false;
  Timer t;
  Status st = exec_->wait_queued();
  stats_.decode_seconds += t.seconds();  // the queued step's time, counted where it is waited for
  if (!st.is_ok()) {
    // The step's logits and rows are gone: back to the pin now, also from a const reader
    // (never a const object: sessions are made by create()).
    const_cast<Session *>(this)->recover(0);  // its rows are counted in n_past already
  }
  return st;
}

void Session::abandon_queued() {
  exec_->drop_queued();
  queued_ = false;
  recover(1);
}

Status Session::wait() { return ready(); }

int32_t Session::draw(ThreadPool *pool) {
  if (draws_step_token()) {
    sampler_.take_step_draw(step_draw_.spec, step_draw_.token);
    return step_draw_.token;
  }
  return sampler_.sample(logits_.get(), n_vocab(), pool);
}

Status Session::decode_step(int32_t *out) {
  if (out == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "out is NULL");
  // After a queued step whose drawn token is the sampler's next draw: this step takes it on
  // the device (queued behind it), then waits for it.
  const bool fed = queued_ && queues_steps() && sampler_.takes_step_draw(step_draw_.spec);
  if (!fed) GEIST_RETURN_IF_ERROR(ready());
  if (!has_logits_) return GEIST_ERROR(GEIST_E_STATE, "no logits to sample from: prefill first");
  if (tokens_.size() + 1 > static_cast<size_t>(cache_->n_ctx())) {
    return GEIST_ERROR(GEIST_E_CONTEXT_FULL, "the context of %lld tokens is full", (long long)cache_->n_ctx());
  }
  Timer t;
  if (fed) {
    try {
      return decode_fed(out, t);
    } catch (...) {
      abandon_queued();
      throw;
    }
  }
  GEIST_RETURN_IF_ERROR(sync_for_draw());
  reserve_tokens(1);  // may throw: before the sampler draws
  const int32_t tok = draw(row_pool());  // records tok in the history
  StepDraw *draw = draw_target();
  step_draw_.token = -1;
  const bool queue = draw != nullptr && queues_steps();
  if (queue) exec_->queue_next_step();
  Status st;
  try {
    st = forward_one(&tok, 1, 0, logits_.get(), draw);
  } catch (...) {
    if (queue) abandon_queued();
    throw;
  }
  if (!st.is_ok()) {
    exec_->drop_queued();
    recover(1);
    return st;
  }
  queued_ = queue;
  tokens_.push_back(tok);
  *out = tok;
  stats_.last_decode_seconds = t.seconds();
  stats_.decode_seconds += stats_.last_decode_seconds;
  stats_.n_decode_tokens += 1;
  return Status::ok();
}

Status Session::decode_fed(int32_t *out, const Timer &t) {
  reserve_tokens(1);  // may throw: before anything changes
  const DrawSpec before = step_draw_.spec;  // the queued step's draw, which this step takes
  // This step's draw comes after that one (pending 1); queues_steps() said the sampler's
  // draws are a step's, so there is one.
  StepDraw *const draw = draw_target(1);
  exec_->feed_drawn();
  exec_->queue_next_step();
  const int32_t unused = 0;  // the row's id comes from the queued step, on the device
  Status st = forward_one(&unused, 1, 0, logits_.get(), draw);
  if (!st.is_ok()) {
    abandon_queued();  // the step before too
    return st;
  }
  // The step before: its drawn token is the token this step took.
  st = exec_->wait_queued();  // step_draw_.token = that token (both steps draw there)
  if (!st.is_ok()) {        // both steps are dropped; n_past counts their rows
    queued_ = false;
    recover(0);
    return st;
  }
  const int32_t tok = step_draw_.token;
  step_draw_.token = -1;  // this step's, when it is waited for
  sampler_.take_step_draw(before, tok);
  tokens_.push_back(tok);
  *out = tok;
  stats_.last_decode_seconds = t.seconds();
  stats_.decode_seconds += stats_.last_decode_seconds;
  stats_.n_decode_tokens += 1;
  return Status::ok();
}

Status Session::decode_batch(Session *const *sessions, size_t n, int32_t *out) {
  if (sessions == nullptr || out == nullptr || n == 0) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "decode_batch needs sessions, n >= 1 and out");
  }
  const std::vector<size_t> none(n, 0);
  return step_batch(sessions, nullptr, none.data(), n, out);
}

Status Session::step_batch(Session *const *sessions, const int32_t *const *tokens, const size_t *n_tokens, size_t n,
                           int32_t *out) {
  if (sessions == nullptr || out == nullptr || n_tokens == nullptr || n == 0) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "step_batch needs sessions, n_tokens, n >= 1 and out");
  }
  // Queued steps first (any session's exec may have one; this step runs on session 0's).
  for (size_t i = 0; i < n; ++i) {
    if (sessions[i] != nullptr) GEIST_RETURN_IF_ERROR(sessions[i]->ready());
  }
  size_t rows = 0;
  for (size_t i = 0; i < n; ++i) {
    const Session *s = sessions[i];
    if (s == nullptr) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "session %zu is NULL", i);
    if (&s->model_ != &sessions[0]->model_) {
      return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "session %zu belongs to another model than session 0", i);
    }
    for (size_t k = 0; k < i; ++k) {
      if (sessions[k] == s) return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "sessions %zu and %zu are the same", k, i);
    }
    const size_t m = n_tokens[i];
    if (m > 0) {
      if (tokens == nullptr || tokens[i] == nullptr) {
        return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "session %zu: %zu tokens to prefill but no token array", i, m);
      }
      if (Status st = s->check_append(tokens[i], m); !st.is_ok()) {
        return Status(st.code(), "session " + std::to_string(i) + ": " + st.message());
      }
    } else {
      if (!s->has_logits_) return GEIST_ERROR(GEIST_E_STATE, "session %zu has no logits to sample from: prefill first", i);
      if (s->tokens_.size() + 1 > static_cast<size_t>(s->cache_->n_ctx())) {
        return GEIST_ERROR(GEIST_E_CONTEXT_FULL, "session %zu: the context of %lld tokens is full", i,
                           (long long)s->cache_->n_ctx());
      }
    }
    rows += m > 0 ? m : 1;
  }
  Session &lead = *sessions[0];
  if (rows > static_cast<size_t>(lead.exec_->max_rows())) {
    return GEIST_ERROR(GEIST_E_INVALID_ARGUMENT, "%zu rows in one step; session 0's chunk takes up to %d", rows,
                       lead.exec_->max_rows());
  }
  Timer t;
  // Everything that may throw comes before the samplers draw.
  for (size_t i = 0; i < n; ++i) sessions[i]->reserve_tokens(n_tokens[i] > 0 ? n_tokens[i] : 1);
  std::vector<int32_t> toks;
  toks.reserve(rows);
  std::vector<StepSeq> seqs(n);
  std::vector<float *> logits(n);
  std::vector<StepDraw *> draws(n);
  std::vector<Exec *> owners(n, nullptr);  // the execs that may keep their session's row (below)
  std::unique_ptr<bool[]> kept(new bool[n]());
  // The decoding sessions draw their tokens, each from its own logits with its own sampler,
  // over session 0's pool when there are several (a draw that is not the step's own token
  // reads 1 MiB of logits: ~80 us each, one after the other on this thread otherwise). Which
  // thread draws changes nothing.
  std::vector<int32_t> drawn(n, 0);
  std::vector<size_t> decoding;  // the draws that read their logits
  decoding.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (n_tokens[i] == 0) GEIST_RETURN_IF_ERROR(sessions[i]->sync_for_draw());
  }
  for (size_t i = 0; i < n; ++i) {
    if (n_tokens[i] != 0) continue;
    Session &s = *sessions[i];
    if (s.draws_step_token()) {
      drawn[i] = s.draw(nullptr);  // the step's token: nothing to read
    } else {
      decoding.push_back(i);
    }
  }
  std::exception_ptr draw_error;
  std::atomic<bool> draw_failed{false};
  // (One decoding session reads its row over the pool itself; several draw one per task.)
  ThreadPool *const row_pool = decoding.size() == 1 ? lead.row_pool() : nullptr;
  auto draw = [&](int task, int) {
    Session &s = *sessions[decoding[size_t(task)]];
    try {
      drawn[decoding[size_t(task)]] = s.draw(row_pool);
    } catch (...) {  // bad_alloc from a penalised copy: rethrown below, as without the pool
      if (!draw_failed.exchange(true)) draw_error = std::current_exception();
    }
  };
  if (decoding.size() >= 2 && lead.pool_ && lead.pool_->n_threads() > 1) {
    lead.pool_->run(static_cast<int>(decoding.size()), draw);
  } else {
    for (size_t k = 0; k < decoding.size(); ++k) draw(static_cast<int>(k), 0);
  }
  if (draw_error) std::rethrow_exception(draw_error);
  for (size_t i = 0; i < n; ++i) {
    Session &s = *sessions[i];
    const size_t m = n_tokens[i];
    if (m > 0) {
      toks.insert(toks.end(), tokens[i], tokens[i] + m);
    } else {
      toks.push_back(drawn[i]);
    }
    seqs[i] = {s.cache_.get(), int(m > 0 ? m : 1)};
    logits[i] = s.logits_.get();  // read by the sampler above; the step writes the next ones there
    draws[i] = s.draw_target();
    s.step_draw_.token = -1;
  }
  // As forward_one: a session whose next draw is the step's token whatever its history
  // need not read its row, so the row may stay on the device, handed to the session's own
  // exec after the step (Exec::hand_off_outputs); the others' rows come to the host.
  bool any_deferred = false;
  const bool hands_off = lead.exec_->hands_off_outputs();
  for (size_t i = 0; i < n && hands_off; ++i) {
    if (row_may_stay(draws[i], sessions[i]->sampler_.params())) {
      owners[i] = sessions[i]->exec_.get();
      any_deferred = true;
    }
  }
  Status st;
  {
    const DeferOutputs scope(any_deferred ? lead.exec_.get() : nullptr);
    models::ArchModel::LogitRows lr;
    lr.seq_out = logits.data();
    lr.draws = draws.data();
    st = lead.model_.arch().forward(toks.data(), seqs.data(), int(n), *lead.exec_, lr);
  }
  const bool advanced = st.is_ok();  // the step's rows are counted in every n_past
  if (st.is_ok() && lead.exec_->outputs_deferred()) {
    try {
      st = lead.exec_->hand_off_outputs(logits.data(), owners.data(), n, kept.get());
    } catch (const std::bad_alloc &) {  // the rows are lost: as a failed step
      st = GEIST_ERROR(GEIST_E_OUT_OF_MEMORY, "out of memory handing the step's logits rows on");
    }
  }
  if (!st.is_ok()) {
    for (size_t i = 0; i < n; ++i) sessions[i]->recover(advanced ? 0 : seqs[i].n_rows);
    return st;
  }
  const double seconds = t.seconds();
  size_t r = 0;
  for (size_t i = 0; i < n; ++i) {
    Session &s = *sessions[i];
    const size_t m = n_tokens[i];
    s.tokens_.insert(s.tokens_.end(), toks.begin() + r, toks.begin() + r + (m > 0 ? m : 1));
    s.has_logits_ = true;
    s.logits_on_device_ = kept[i];  // on its own exec's device memory, or written to the host
    if (m > 0) {
      for (size_t k = 0; k < m; ++k) s.sampler_.accept(toks[r + k]);
      s.stats_.last_prefill_seconds = seconds;  // the step's wall time, which each session waited
      s.stats_.prefill_seconds += seconds;
      s.stats_.n_prefill_tokens += m;
    } else {
      out[i] = toks[r];
      s.stats_.last_decode_seconds = seconds;
      s.stats_.decode_seconds += seconds;
      s.stats_.n_decode_tokens += 1;
    }
    r += m > 0 ? m : 1;
  }
  return Status::ok();
}

Status Session::set_sampling(const SamplerParams &p) {
  if (std::string why = Sampler::check(p); !why.empty()) return Status(GEIST_E_INVALID_ARGUMENT, why);
  sampler_.set_params(p);
  params_.sampling = p;
  return Status::ok();
}

}  // namespace geist
