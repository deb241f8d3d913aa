// The generation engine of `geist serve`: N slots (sessions over one model), a bounded
// queue of jobs, the prefix cache, and one thread that runs every forward pass. Each loop
// turn runs one geist_step_batch step: every decoding slot advances by one token and, up
// to a token budget, the waiting prompts advance by a chunk each (continuous batching: the
// weights are read once for both). HTTP threads submit jobs and read their output; only the engine thread
// touches sessions and the cache.
//
// Prefix reuse is exact: a job starts from the longest of (a) an idle slot whose tokens
// are a prefix of the prompt (nothing to copy) and (b) the cache entry with the longest
// prefix (a saved state's load: a copy inside the device on a GPU), then prefills only the
// rest. States are saved while a prompt is prefilled, at its boundaries: the ends of the leading chat turns, where it
// diverges from something cached or live, and its end. Logits do not depend on how a
// state was reached (batch invariance, docs/SNAPSHOT.md), and the sampler is reseeded
// per job, so a job's output is the same cached or not.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <functional>

#include "disk_cache.h"
#include "geist/geist.hpp"
#include "openai_api.h"
#include "prefix_cache.h"

namespace geist::serve {

// The log-probability of a generated token and the most likely alternatives (raw logits,
// before temperature and penalties), natural log.
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // best first
};

// One generation request. The submitter fills the inputs, submits, then reads `out` under
// `mu` (waiting on `cv`) until out.done. cancel() may be called from any thread.
struct Job {
  // Inputs (read-only once submitted).
  std::vector<geist_token> prompt;
  std::vector<size_t> boundaries;  // prompt positions worth a snapshot (chat turn ends)
  geist_sampling_params sampling = geist_sampling_params_default();
  int64_t max_tokens = 0;  // at most the room left in the context
  std::vector<std::string> stop;
  bool logprobs = false;
  int top_logprobs = 0;
  bool cache_prompt = true;

  struct Output {
    std::string text;                    // emitted so far (stop strings never appear)
    std::vector<TokenLogprob> logprobs;  // one per generated token when logprobs is set
    bool started = false;                // a slot took the job
    bool done = false;
    std::string finish_reason;      // "stop" or "length" when done without error
    std::optional<ApiError> error;  // set when the job failed
    size_t n_prompt = 0, n_cached = 0, n_generated = 0;
    double queue_ms = 0, prompt_ms = 0, generate_ms = 0;  // prompt_ms: start to first token
    std::string cache_source;                             // "none", "slot" or "cache"
  };
  std::mutex mu;
  std::condition_variable cv;
  Output out;

  std::chrono::steady_clock::time_point submitted;  // set by Engine::submit
  std::atomic<bool> cancelled{false};
  void cancel() { cancelled.store(true); }
};

struct EngineOptions {
  int n_parallel = 1;
  size_t queue_max = 64;            // jobs waiting beyond the busy slots
  size_t cache_bytes = 0;           // 0: no snapshot cache (live slots are still reused)
  size_t min_snapshot_tokens = 16;  // shorter prefixes are not worth an entry
  int prefill_budget = 256;         // prompt tokens per loop turn, across slots
  geist_session_params session = geist_session_params_default();
  // Called on the engine thread with each state the cache takes (the disk tier's put).
  std::function<void(uint64_t hash, std::shared_ptr<const api::State> state)> on_snapshot;
  // Called on the engine thread with the hash of each entry a request used (restored, or
  // found already cached at a snapshot point): the disk tier's touch.
  std::function<void(uint64_t hash)> on_use;
};

// Counters for /metrics (a consistent copy).
struct EngineStats {
  uint64_t jobs_started = 0, jobs_finished = 0, jobs_cancelled = 0, jobs_failed = 0,
           jobs_rejected = 0;
  uint64_t prompt_tokens = 0, prefilled_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  uint64_t cache_hits = 0, slot_hits = 0, misses = 0;
  uint64_t snapshots_taken = 0, snapshot_bytes_taken = 0;
  uint64_t decode_steps = 0, decode_rows = 0;
  // Every forward step; the sequences it advanced (its decode rows plus its prompt chunks,
  // one per request); steps that held prompt rows and decode rows together.
  uint64_t steps = 0, step_sequences = 0, steps_mixed = 0;
  double prefill_seconds = 0, decode_seconds = 0, snapshot_seconds = 0, restore_seconds = 0;
  size_t queue_depth = 0, slots_busy = 0, slots_total = 0;
  size_t cache_entries = 0, cache_bytes = 0, cache_capacity = 0;
  uint64_t cache_evictions = 0;
  uint64_t snapshot_buffers_reused = 0;  // snapshots taken into an evicted image's buffer
};

class Engine {
 public:
  Engine(const api::Model &model, EngineOptions o);
  ~Engine();
  Engine(const Engine &) = delete;
  Engine &operator=(const Engine &) = delete;

  // Creates the sessions, puts the images of `preload` that restore (checksum and all)
  // and are named by their tokens' hash into the cache (as saved states) while it has
  // room, and starts the engine thread. *n_loaded: how many were taken.
  api::Error start(std::vector<DiskCache::File> preload = {}, size_t *n_loaded = nullptr);

  enum class Submit { kOk, kQueueFull, kDraining };
  Submit submit(std::shared_ptr<Job> job);

  // Stop taking jobs; those queued and running go on. Then, after drain(), cancel_all()
  // ends the rest, and stop() joins the thread.
  void drain();
  // True when nothing is queued or running.
  bool idle() const;
  void cancel_all();
  void stop();

  size_t n_ctx() const { return n_ctx_; }
  EngineStats stats() const;

 private:
  struct Slot;
  void loop();
  void start_job(Slot &s, std::shared_ptr<Job> job);
  // One forward step: every decoding slot's next token and, within the prefill budget and
  // the step's rows, a chunk of each waiting prompt (oldest job first), through
  // geist_step_batch.
  void step();
  bool catch_up(Slot &s);  // false if the job failed
  void after_token(Slot &s, geist_token t);  // a decoded token: stream it, stop, finish
  void finish(Slot &s, const char *reason);
  void fail(Slot &s, const api::Error &e);
  void maybe_snapshot(Slot &s);
  void emit(Slot &s, const std::string &text, const TokenLogprob *lp);
  std::vector<size_t> snapshot_points(const Slot &s, size_t reused);

  const api::Model &model_;
  EngineOptions o_;
  size_t n_ctx_ = 0;
  std::vector<std::unique_ptr<Slot>> slots_;
  PrefixCache cache_;
  uint64_t clock_ = 0;
  bool warned_save_ = false;  // a failed save_state is reported once

  mutable std::mutex mu_;  // guards queue_, draining_, stop_, stats_, busy_
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  size_t busy_ = 0;
  bool draining_ = false, stop_ = false, cancel_running_ = false;
  EngineStats stats_;
  std::thread thread_;
};

// Sampling params for a request: the server's defaults overridden by the request's
// fields; a missing seed is the default's when fixed_seed, else drawn at random.
geist_sampling_params resolve_sampling(const geist_sampling_params &defaults,
                                       const SamplingFields &f, bool fixed_seed = false);

}  // namespace geist::serve
