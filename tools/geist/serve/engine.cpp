#include "engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "../api_common.h"
#include "stop_matcher.h"

namespace geist::serve {

using Clock = std::chrono::steady_clock;

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// log-softmax of logits[0..nv) at `token`, and the `top` most likely tokens (ties: lower id).
TokenLogprob logprob_of(const float *logits, size_t nv, int32_t token, int top) {
  float mx = -INFINITY;
  for (size_t i = 0; i < nv; ++i) mx = std::max(mx, logits[i]);
  double sum = 0;
  for (size_t i = 0; i < nv; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = double(mx) + std::log(sum);
  TokenLogprob lp;
  lp.token = token;
  lp.logprob = float(double(logits[token]) - lse);
  if (top > 0) {
    // A small sorted list of the best (logit, id); nv is large and top at most 20.
    std::vector<std::pair<float, int32_t>> best;
    auto better = [](const std::pair<float, int32_t> &a, const std::pair<float, int32_t> &b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    for (size_t i = 0; i < nv; ++i) {
      const std::pair<float, int32_t> c{logits[i], int32_t(i)};
      if (int(best.size()) == top && !better(c, best.back())) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), c, better), c);
      if (int(best.size()) > top) best.pop_back();
    }
    for (const auto &[l, id] : best) lp.top.emplace_back(id, float(double(l) - lse));
  }
  return lp;
}

}  // namespace

geist_sampling_params resolve_sampling(const geist_sampling_params &defaults,
                                       const SamplingFields &f, bool fixed_seed) {
  geist_sampling_params p = defaults;
  if (f.temperature) p.temperature = float(*f.temperature);
  if (f.top_p) p.top_p = float(*f.top_p);
  if (f.min_p) p.min_p = float(*f.min_p);
  if (f.repeat_penalty) p.repeat_penalty = float(*f.repeat_penalty);
  if (f.top_k) p.top_k = int32_t(std::clamp<int64_t>(*f.top_k, INT32_MIN, INT32_MAX));
  if (f.seed) {
    p.seed = *f.seed;
  } else if (!fixed_seed) {
    static std::mutex mu;
    static std::mt19937_64 rng{(uint64_t(std::random_device{}()) << 32) ^ std::random_device{}()};
    std::lock_guard<std::mutex> lk(mu);
    p.seed = rng();
  }
  return p;
}

struct Engine::Slot {
  explicit Slot(const api::Model &m) : text(m) {}
  int index = 0;
  api::Session session;
  std::shared_ptr<Job> job;
  enum class Phase { kIdle, kPrefill, kDecode } phase = Phase::kIdle;
  size_t n_done = 0;          // prompt tokens in the session
  std::vector<size_t> snaps;  // prompt positions to snapshot at, ascending, > reused
  size_t next_snap = 0;
  cli::TextStream text;  // kept across jobs (its table of hidden tokens is per model)
  std::optional<StopMatcher> stop;
  int64_t n_gen = 0;
  uint64_t last_used = 0, seq = 0;
  Clock::time_point t_start, t_first;
  std::vector<float> logits_copy;  // [n_vocab], the step's input logits when logprobs are asked
};

Engine::Engine(const api::Model &model, EngineOptions o)
    : model_(model), o_(std::move(o)), cache_(o_.cache_bytes) {}

Engine::~Engine() {
  stop();
}

api::Error Engine::start(std::vector<DiskCache::File> preload, size_t *n_loaded) {
  for (int i = 0; i < o_.n_parallel; ++i) {
    auto s = std::make_unique<Slot>(model_);
    s->index = i;
    if (api::Error e = api::Session::create(model_, &o_.session, &s->session)) return e;
    n_ctx_ = s->session.n_ctx();
    slots_.push_back(std::move(s));
  }
  // preload is newest (most recently used) first: validate in that order, up to the
  // capacity, then insert oldest first so that the cache's LRU order is the files'.
  std::vector<std::pair<std::vector<geist_token>, std::shared_ptr<api::State>>> accepted;
  size_t accepted_bytes = 0;
  api::Session &probe = slots_[0]->session;
  for (DiskCache::File &f : preload) {
    if (api::Error e = probe.restore(f.image)) {
      std::fprintf(stderr, "geist serve: ignoring cache file '%s': %s\n", f.path.c_str(),
                   e.message.c_str());
      continue;
    }
    std::vector<geist_token> t = probe.tokens();
    if (tokens_hash(t.data(), t.size()) != f.hash) {
      std::fprintf(
          stderr, "geist serve: ignoring cache file '%s': its name is not the hash of its tokens\n",
          f.path.c_str());
      continue;
    }
    const size_t cost = PrefixCache::entry_cost(t.size(), probe.state_bytes());
    if (accepted_bytes + cost > cache_.capacity())
      continue;  // newest first: the rest wait for the disk
    std::shared_ptr<api::State> st = new_image(0, static_cast<api::State *>(nullptr));
    if (!st) continue;
    if (api::Error e = probe.save_state(st.get())) {
      std::fprintf(stderr, "geist serve: cannot keep cache file '%s' in memory: %s\n",
                   f.path.c_str(), e.message.c_str());
      continue;
    }
    f.image = std::vector<uint8_t>();  // the state holds it now
    accepted_bytes += PrefixCache::entry_cost(t.size(), st->bytes());
    accepted.emplace_back(std::move(t), std::move(st));
  }
  probe.clear();
  for (auto it = accepted.rbegin(); it != accepted.rend(); ++it) {
    cache_.insert(std::move(it->first), std::move(it->second));
  }
  if (n_loaded) *n_loaded = accepted.size();
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.slots_total = slots_.size();
    stats_.cache_capacity = cache_.capacity();
    stats_.cache_entries = cache_.size();
    stats_.cache_bytes = cache_.bytes();
  }
  thread_ = std::thread([this] { loop(); });
  return {};
}

Engine::Submit Engine::submit(std::shared_ptr<Job> job) {
  std::lock_guard<std::mutex> lk(mu_);
  if (draining_ || stop_) return Submit::kDraining;
  const size_t free_slots = slots_.size() - busy_;
  if (queue_.size() >= free_slots + o_.queue_max) {
    ++stats_.jobs_rejected;
    return Submit::kQueueFull;
  }
  job->out.n_prompt = job->prompt.size();
  job->submitted = Clock::now();
  queue_.push_back(std::move(job));
  cv_.notify_all();
  return Submit::kOk;
}

void Engine::drain() {
  std::lock_guard<std::mutex> lk(mu_);
  draining_ = true;
}

bool Engine::idle() const {
  std::lock_guard<std::mutex> lk(mu_);
  return busy_ == 0 && queue_.empty();
}

void Engine::cancel_all() {
  std::deque<std::shared_ptr<Job>> queued;
  {
    std::lock_guard<std::mutex> lk(mu_);
    queued.swap(queue_);
    cv_.notify_all();
  }
  for (auto &j : queued) {
    ApiError e;
    e.http_status = 503;
    e.type = "server_error";
    e.code = "shutting_down";
    e.message = "the server is shutting down";
    std::lock_guard<std::mutex> lk(j->mu);
    j->out.error = e;
    j->out.done = true;
    j->cv.notify_all();
  }
  std::lock_guard<std::mutex> lk(mu_);
  cancel_running_ = true;
  cv_.notify_all();
}

void Engine::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  EngineStats s = stats_;
  s.queue_depth = queue_.size();
  s.slots_busy = busy_;
  return s;
}

void Engine::loop() {
  for (;;) {
    std::vector<std::shared_ptr<Job>> admitted;
    bool cancel_running = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || cancel_running_ || busy_ > 0 || !queue_.empty(); });
      if (stop_ || cancel_running_) {
        cancel_running = true;
        cancel_running_ = false;
      }
      while (busy_ < slots_.size() && !queue_.empty()) {
        std::shared_ptr<Job> j = std::move(queue_.front());
        queue_.pop_front();
        if (j->cancelled.load()) {  // its client left while it waited
          ++stats_.jobs_cancelled;
          std::lock_guard<std::mutex> jl(j->mu);
          j->out.done = true;
          j->out.finish_reason = "cancelled";
          j->cv.notify_all();
          continue;
        }
        admitted.push_back(std::move(j));
        ++busy_;
      }
      if (stop_ && busy_ == 0 && admitted.empty()) break;
    }
    for (auto &job : admitted) {
      // The idle slot whose tokens are the longest prefix of the prompt; else the one
      // idle longest (its state is the least likely to be asked for again).
      Slot *best = nullptr;
      size_t best_reuse = 0;
      for (auto &sp : slots_) {
        Slot &s = *sp;
        if (s.phase != Slot::Phase::kIdle || s.job) continue;
        size_t reuse = 0;
        const size_t n = s.session.n_tokens();
        if (job->cache_prompt && n > 0 && n <= job->prompt.size()) {
          const std::vector<geist_token> t = s.session.tokens();
          if (std::equal(t.begin(), t.end(), job->prompt.begin())) reuse = n;
        }
        if (!best || reuse > best_reuse || (reuse == best_reuse && s.last_used < best->last_used)) {
          best = &s;
          best_reuse = reuse;
        }
      }
      start_job(*best, std::move(job));
    }
    for (auto &sp : slots_) {
      Slot &s = *sp;
      if (s.job && (cancel_running || s.job->cancelled.load())) finish(s, nullptr);
    }
    step();
  }
}

std::vector<size_t> Engine::snapshot_points(const Slot &s, size_t reused) {
  const Job &j = *s.job;
  std::vector<size_t> pts;
  if (!j.cache_prompt || cache_.capacity() == 0) return pts;
  const size_t n = j.prompt.size();
  pts = j.boundaries;
  pts.push_back(n);
  // Where the prompt leaves what is cached, live in a slot, or being prefilled: the
  // shared part is a prefix the next request may share too.
  size_t lcp = cache_.longest_common_prefix(j.prompt.data(), n);
  for (const auto &op : slots_) {
    if (op.get() == &s) continue;
    const std::vector<geist_token> t = op->session.tokens();
    lcp = std::max(lcp, common_prefix(j.prompt.data(), n, t.data(), t.size()));
    if (op->job)
      lcp = std::max(
          lcp, common_prefix(j.prompt.data(), n, op->job->prompt.data(), op->job->prompt.size()));
  }
  pts.push_back(lcp);
  std::sort(pts.begin(), pts.end());
  pts.erase(std::unique(pts.begin(), pts.end()), pts.end());
  // A snapshot costs a copy of the KV rows and splits the prefill (one more pass of the
  // output head), so a boundary within min_snapshot_tokens of the start state or of the
  // boundary before it is not worth one. The prompt's end always is (a repeated prompt, the
  // next turn of a conversation).
  const size_t gap = o_.min_snapshot_tokens;
  std::vector<size_t> kept;
  size_t last = reused;
  for (size_t p : pts) {
    if (p > n || p < gap || p <= reused) continue;
    if (p != n && p < last + gap) continue;
    kept.push_back(p);
    last = p;
  }
  return kept;
}

void Engine::start_job(Slot &s, std::shared_ptr<Job> job) {
  const auto now = Clock::now();
  s.job = std::move(job);
  Job &j = *s.job;
  s.t_start = now;
  s.seq = ++clock_;
  s.n_gen = 0;
  s.text.flush();
  s.stop.emplace(j.stop);
  const size_t n = j.prompt.size();

  size_t live = 0;
  if (j.cache_prompt && s.session.n_tokens() > 0 && s.session.n_tokens() <= n) {
    const std::vector<geist_token> t = s.session.tokens();
    if (std::equal(t.begin(), t.end(), j.prompt.begin())) live = t.size();
  }
  size_t reused = live;
  const char *source = live > 0 ? "slot" : "none";
  const PrefixCache::Entry *e = j.cache_prompt && cache_.capacity() > 0
                                    ? cache_.find_longest_prefix(j.prompt.data(), n, n)
                                    : nullptr;
  if (e && e->tokens.size() > live) {
    const auto t0 = Clock::now();
    if (api::Error re = s.session.load_state(*e->image)) {
      std::fprintf(
          stderr,
          "geist serve: warning: a cache entry did not load (%s); computing the prompt\n",
          re.message.c_str());
      reused = 0;
      source = "none";
    } else {
      reused = e->tokens.size();
      source = "cache";
      if (o_.on_use) o_.on_use(e->hash);
    }
    std::lock_guard<std::mutex> lk(mu_);
    stats_.restore_seconds += ms_between(t0, Clock::now()) / 1e3;
  }
  if (reused == 0) s.session.clear();
  if (api::Error se = s.session.set_sampling(j.sampling)) {
    fail(s, se);
    return;
  }
  s.n_done = reused;
  s.snaps = snapshot_points(s, reused);
  s.next_snap = 0;
  s.phase = reused == n ? Slot::Phase::kDecode : Slot::Phase::kPrefill;
  if (s.phase == Slot::Phase::kDecode) s.t_first = Clock::now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.jobs_started;
    stats_.prompt_tokens += n;
    stats_.cached_tokens += reused;
    if (reused == 0) {
      ++stats_.misses;
    } else if (source[0] == 'c') {
      ++stats_.cache_hits;
    } else {
      ++stats_.slot_hits;
    }
  }
  std::lock_guard<std::mutex> lk(j.mu);
  j.out.started = true;
  j.out.n_cached = reused;
  j.out.cache_source = source;
  j.out.queue_ms = ms_between(j.submitted, now);
}

void Engine::maybe_snapshot(Slot &s) {
  const std::vector<geist_token> &p = s.job->prompt;
  if (cache_.touch(p.data(), s.n_done)) {
    if (o_.on_use) o_.on_use(tokens_hash(p.data(), s.n_done));
    return;
  }
  const auto t0 = Clock::now();
  // A full cache hands over an evicted state (no allocation: on a GPU a device allocation
  // would synchronise the card, on the CPU fresh pages fault in).
  std::shared_ptr<api::State> img = cache_.image_buffer(s.n_done, s.session.state_bytes());
  if (!img) return;
  if (api::Error e = s.session.save_state(img.get())) {
    if (!warned_save_) {
      std::fprintf(stderr, "geist serve: warning: saving a prefix failed (%s); the cache keeps what it has\n",
                   e.message.c_str());
      warned_save_ = true;
    }
    return;
  }
  if (!cache_.insert(std::vector<int32_t>(p.begin(), p.begin() + long(s.n_done)), img)) return;
  if (o_.on_snapshot) o_.on_snapshot(tokens_hash(p.data(), s.n_done), img);
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.snapshots_taken;
  stats_.snapshot_bytes_taken += img->bytes();
  stats_.snapshot_seconds += ms_between(t0, Clock::now()) / 1e3;
  stats_.cache_entries = cache_.size();
  stats_.cache_bytes = cache_.bytes();
  stats_.cache_evictions = cache_.evictions();
  stats_.snapshot_buffers_reused = cache_.buffers_reused();
}

bool Engine::catch_up(Slot &s) {
  // A request admitted together with others that share its prefix starts with nothing
  // cached; once the first of them has snapshotted the shared part, the others skip to it
  // instead of computing it again. Same state as a restore at the start: the session's
  // tokens are a prefix of the entry's, and the sampler is reseeded after the restore.
  Job &j = *s.job;
  if (!j.cache_prompt || cache_.capacity() == 0) return true;
  const std::vector<geist_token> &p = j.prompt;
  const PrefixCache::Entry *e = cache_.find_longest_prefix(p.data(), p.size(), p.size());
  if (!e || e->tokens.size() <= s.n_done) return true;
  const auto t0 = Clock::now();
  if (api::Error re = s.session.load_state(*e->image)) return true;  // keep computing
  if (o_.on_use) o_.on_use(e->hash);
  const size_t before = s.n_done;
  s.n_done = e->tokens.size();
  if (api::Error se = s.session.set_sampling(j.sampling)) {
    fail(s, se);
    return false;
  }
  while (s.next_snap < s.snaps.size() && s.snaps[s.next_snap] <= s.n_done) ++s.next_snap;
  if (s.n_done == p.size()) {
    s.phase = Slot::Phase::kDecode;
    s.t_first = Clock::now();
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.restore_seconds += ms_between(t0, Clock::now()) / 1e3;
    stats_.cached_tokens += s.n_done - before;
    if (before == 0) {  // the miss counted at the start became a hit
      ++stats_.cache_hits;
      if (stats_.misses > 0) --stats_.misses;
    }
  }
  std::lock_guard<std::mutex> lk(j.mu);
  j.out.n_cached = s.n_done;
  j.out.cache_source = "cache";
  return true;
}

void Engine::step() {
  // The decoding slots: one row each.
  std::vector<Slot *> ds;
  for (auto &sp : slots_) {
    Slot &s = *sp;
    if (s.phase != Slot::Phase::kDecode) continue;
    if (s.n_gen >= s.job->max_tokens || s.session.n_tokens() >= n_ctx_) {
      finish(s, "length");
      continue;
    }
    ds.push_back(&s);
  }
  // A chunk of each waiting prompt, oldest job first (finishing one prompt gives a first
  // token sooner than sharing out), within the budget and the step's rows (the session
  // chunk); a chunk ends at the prompt's next snapshot point.
  std::vector<Slot *> order;
  for (auto &sp : slots_) {
    if (sp->phase == Slot::Phase::kPrefill) order.push_back(sp.get());
  }
  std::sort(order.begin(), order.end(), [](const Slot *a, const Slot *b) { return a->seq < b->seq; });
  const size_t max_rows = size_t(std::max(1, o_.session.chunk));
  size_t rows = ds.size();
  size_t budget = size_t(std::max(0, o_.prefill_budget));
  std::vector<Slot *> ps;
  std::vector<size_t> pn;
  for (Slot *sp : order) {
    Slot &s = *sp;
    if (budget == 0 || rows >= max_rows) break;
    if (!catch_up(s)) continue;
    if (s.phase != Slot::Phase::kPrefill) continue;  // all of it was cached: decodes next turn
    const size_t end = s.next_snap < s.snaps.size() ? s.snaps[s.next_snap] : s.job->prompt.size();
    const size_t n = std::min({end - s.n_done, budget, max_rows - rows});
    ps.push_back(&s);
    pn.push_back(n);
    rows += n;
    budget -= n;
  }
  if (ds.empty() && ps.empty()) return;
  for (Slot *s : ds) {
    if (s->job->logprobs) {
      size_t nv = 0;
      const float *l = s->session.logits(&nv);
      s->logits_copy.assign(l, l + nv);
    }
  }
  std::vector<geist_token> toks;
  const auto t0 = Clock::now();
  api::Error e;
  if (ps.empty() && ds.size() == 1) {
    toks.resize(1);
    e = ds[0]->session.decode_step(&toks[0]);
  } else if (ds.empty() && ps.size() == 1) {
    e = ps[0]->session.prefill(ps[0]->job->prompt.data() + ps[0]->n_done, pn[0]);
  } else {
    std::vector<api::Session *> sessions;
    std::vector<std::vector<geist_token>> chunks;
    for (Slot *s : ds) {
      sessions.push_back(&s->session);
      chunks.emplace_back();
    }
    for (size_t i = 0; i < ps.size(); ++i) {
      sessions.push_back(&ps[i]->session);
      const geist_token *p = ps[i]->job->prompt.data() + ps[i]->n_done;
      chunks.emplace_back(p, p + pn[i]);
    }
    e = api::Session::step_batch(sessions, chunks, &toks);
  }
  if (e) {
    for (Slot *s : ds) fail(*s, e);
    for (Slot *s : ps) fail(*s, e);
    return;
  }
  {
    // A mixed step's time is shared out by rows.
    const double sec = ms_between(t0, Clock::now()) / 1e3;
    const double prefill_rows = double(rows - ds.size());
    std::lock_guard<std::mutex> lk(mu_);
    stats_.prefill_seconds += sec * prefill_rows / double(rows);
    stats_.prefilled_tokens += rows - ds.size();
    ++stats_.steps;
    stats_.step_sequences += ds.size() + ps.size();
    if (!ds.empty() && !ps.empty()) ++stats_.steps_mixed;
    if (!ds.empty()) {
      stats_.decode_seconds += sec * double(ds.size()) / double(rows);
      ++stats_.decode_steps;
      stats_.decode_rows += ds.size();
      stats_.generated_tokens += ds.size();
    }
  }
  for (size_t i = 0; i < ps.size(); ++i) {
    Slot &s = *ps[i];
    s.n_done += pn[i];
    if (s.next_snap < s.snaps.size() && s.n_done == s.snaps[s.next_snap]) {
      maybe_snapshot(s);
      ++s.next_snap;
    }
    if (s.n_done == s.job->prompt.size()) {
      s.phase = Slot::Phase::kDecode;
      s.t_first = Clock::now();
    }
  }
  for (size_t i = 0; i < ds.size(); ++i) after_token(*ds[i], toks[i]);
}

void Engine::emit(Slot &s, const std::string &text, const TokenLogprob *lp) {
  if (text.empty() && !lp) return;
  Job &j = *s.job;
  std::lock_guard<std::mutex> lk(j.mu);
  j.out.text += text;
  if (lp) j.out.logprobs.push_back(*lp);
  j.cv.notify_all();
}

void Engine::after_token(Slot &s, geist_token t) {
  ++s.n_gen;
  std::optional<TokenLogprob> lp;
  if (s.job->logprobs && !model_.is_eog(t)) {
    lp = logprob_of(s.logits_copy.data(), s.logits_copy.size(), t, s.job->top_logprobs);
  }
  if (model_.is_eog(t)) {
    finish(s, "stop");
    return;
  }
  emit(s, s.stop->push(s.text.push(t)), lp ? &*lp : nullptr);
  if (s.stop->stopped()) {
    finish(s, "stop");
  } else if (s.n_gen >= s.job->max_tokens || s.session.n_tokens() >= n_ctx_) {
    finish(s, "length");
  }
}

void Engine::finish(Slot &s, const char *reason) {
  Job &j = *s.job;
  if (reason && !s.stop->stopped()) {
    std::string tail = s.stop->push(s.text.flush());
    tail += s.stop->flush();
    emit(s, tail, nullptr);
  }
  const auto now = Clock::now();
  // The counters before the answer: a client that reads /metrics right after it sees
  // them. The slot counts as busy until it is idle (idle() must not be early).
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (reason) {
      ++stats_.jobs_finished;
    } else {
      ++stats_.jobs_cancelled;
    }
  }
  {
    std::lock_guard<std::mutex> lk(j.mu);
    j.out.done = true;
    j.out.finish_reason = reason ? reason : "cancelled";
    j.out.n_generated = size_t(s.n_gen);
    const bool first = s.phase == Slot::Phase::kDecode;
    j.out.prompt_ms = ms_between(s.t_start, first ? s.t_first : now);
    j.out.generate_ms = first ? ms_between(s.t_first, now) : 0;
    j.cv.notify_all();
  }
  s.job.reset();
  s.phase = Slot::Phase::kIdle;
  s.last_used = ++clock_;
  std::lock_guard<std::mutex> lk(mu_);
  --busy_;
}

void Engine::fail(Slot &s, const api::Error &e) {
  std::fprintf(stderr, "geist serve: error: %s\n", e.to_string().c_str());
  s.session.clear();  // a state after a failed call is not worth reusing
  Job &j = *s.job;
  {
    std::lock_guard<std::mutex> lk(mu_);  // before the answer, as in finish()
    ++stats_.jobs_failed;
  }
  {
    std::lock_guard<std::mutex> lk(j.mu);
    ApiError ae;
    ae.http_status = 500;
    ae.type = "server_error";
    ae.message = "generation failed: " + e.to_string();
    j.out.error = ae;
    j.out.done = true;
    j.cv.notify_all();
  }
  s.job.reset();
  s.phase = Slot::Phase::kIdle;
  s.last_used = ++clock_;
  std::lock_guard<std::mutex> lk(mu_);
  --busy_;
}

}  // namespace geist::serve
