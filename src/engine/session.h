// A session: one conversation's state over a shared Model — KV cache, scratch, the
// tokens so far, the logits after the last one, the sampler, and an optional pin.
// Not thread-safe: one thread at a time per session; many sessions may share one Model
// concurrently, each with its own thread pool.
//
// Every method that returns an error leaves the session exactly as it was (inputs are
// validated and memory is allocated before anything changes), with one exception: a
// device error during a forward pass (a GPU backend's fault, reported with the device's
// message) takes the session back to its pin, or empty if it has none.
//
// Pin and reset. pin_prefix(P tokens) records the state after them: tokens, logits,
// sampler state, and (in the KV store, on the device for a GPU) for each sliding-window
// layer the K/V rows of positions [P-W+1, P) — the only rows a later prefill can
// overwrite (the ring is W + chunk - 1 slots) that a continuation from P still reads. Global layers never lose rows below
// n_past. reset() truncates to P and copies back only the checkpoint rows whose slots
// later positions overwrote, so it is O(1) for a request of up to `chunk` tokens.
//
// Batch invariance: the logits after token i depend only on tokens [0, i], never on the
// chunking, the thread count, a pin/reset or a snapshot/restore (tests memcmp them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/kv_store.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "engine/model.h"
#include "engine/sampler.h"
#include "models/arch.h"

namespace geist {

class Timer;  // base/timer.h

struct SessionParams {
  int64_t n_ctx = 0;     // 0: the model's trained context
  int n_threads = 0;     // 0: all hardware threads of this process
  int chunk = 256;       // rows per forward call; prefill of any length is split into these
  KvType type_k = KvType::F32, type_v = KvType::F32;  // KV cache element types (kv_type.h)
  SamplerParams sampling;
};

struct SessionStats {
  uint64_t n_prefill_tokens = 0;
  double prefill_seconds = 0;
  uint64_t n_decode_tokens = 0;
  double decode_seconds = 0;
  uint64_t n_pins = 0, n_pinned_tokens = 0;
  double pin_seconds = 0;
  uint64_t n_resets = 0, n_reset_rows = 0;
  double reset_seconds = 0;
  uint64_t n_snapshots = 0;
  double snapshot_seconds = 0;
  uint64_t n_restores = 0;
  double restore_seconds = 0;
  double last_prefill_seconds = 0, last_decode_seconds = 0;
};

// A session's state saved for a later Session::load_state into any session of the same
// model (a server's prefix cache): what a snapshot holds, not serialised, with the KV rows
// kept where the session keeps them (KvBuffer: device memory on a GPU), so that saving and
// loading are copies inside the device that never cross the bus. A state is reused by
// later saves: its memory grows when a save needs more and is otherwise kept (the KV
// buffer is made up to 1/8 larger than asked, so that a slightly longer state fits). Saving into
// a state while another thread reads it is a race; concurrent reads (load_state,
// snapshot) are fine.
struct ImageParts;  // snapshot.cpp

class SessionState {
 public:
  SessionState() = default;
  bool empty() const { return !saved_; }
  size_t n_tokens() const { return tokens_.size(); }
  const std::vector<int32_t> &tokens() const { return tokens_; }
  // Memory it holds: host (tokens, logits, sampler histories) and KV buffer.
  size_t bytes() const;
  // The snapshot (docs/SNAPSHOT.md) of the saved state, byte for byte what
  // Session::snapshot wrote when the state was saved; copies the KV rows to the host.
  // GEIST_E_STATE for an empty state.
  size_t snapshot_size() const;
  Status snapshot(void *buf, size_t cap, size_t *written) const;

 private:
  friend class Session;
  bool saved_ = false;
  uint64_t fingerprint_ = 0;
  std::vector<KvLayerSpec> layers_;
  KvType type_k_ = KvType::F32, type_v_ = KvType::F32;
  std::vector<int32_t> tokens_;
  size_t n_vocab_ = 0;
  bool has_logits_ = false;
  std::vector<float> logits_;
  Sampler::State sampler_;
  size_t n_pin_ = 0;
  Sampler::State pin_sampler_;
  std::vector<float> pin_logits_;
  std::unique_ptr<KvBuffer> kv_;  // the snapshot's kv and ckpt sections, kv_bytes_ of it used
  size_t kv_bytes_ = 0;
};

class Session {
 public:
  // GEIST_E_INVALID_ARGUMENT for out-of-range params, GEIST_E_OUT_OF_MEMORY if the KV
  // cache cannot be reserved.
  static Result<std::unique_ptr<Session>> create(const Model &m, const SessionParams &p);
  ~Session();

  // Append tokens (any n >= 1) and compute the logits after the last one.
  // GEIST_E_INVALID_ARGUMENT (n 0, bad id), GEIST_E_CONTEXT_FULL.
  Status prefill(const int32_t *tokens, size_t n);
  // As prefill, and also write the logits after every token i in [first, n) to
  // out: [n - first][n_vocab].
  Status prefill_with_logits(const int32_t *tokens, size_t n, size_t first, float *out);

  // clear(), prefill, pin. Checked before the session is cleared.
  Status pin_prefix(const int32_t *tokens, size_t n);
  void unpin();
  // Back to the pin (or empty if none).
  void reset();
  // Empty, no pin.
  void clear();

  // Sample from the current logits, append the token, compute the next logits.
  // GEIST_E_STATE without logits, GEIST_E_CONTEXT_FULL when no room is left.
  // On a backend that queues steps (Exec::can_queue), a session whose draws the step
  // computes (Session::queues_steps) returns from a step once it is queued, and the next decode_step takes its token from it on the device: the host
  // records each step while the device runs the one before. Any other call waits for the
  // queued step first (wait()); a device error found then is that call's error.
  Status decode_step(int32_t *out);
  // Waits for a queued step (nothing to do on the CPU). A device error found there takes the
  // session back to its pin (or empty), as the step's own call would have.
  Status wait();
  // Whether this session's decode steps are queued: a backend that queues
  // (Exec::can_queue) and a sampler whose draws a step computes (Sampler::step_spec: greedy,
  // or sampled with top-k and no penalty).
  bool queues_steps() const;
  // decode_step for n sessions of one model in a single forward step, which reads the
  // weights once for all of them; out[i] is session i's token. Each session samples from
  // its own logits with its own sampler, and its new logits are bit-identical to a
  // decode_step of it alone. The step runs on sessions[0]'s exec, so n <= its chunk.
  // Checked before anything changes: GEIST_E_INVALID_ARGUMENT (n 0, a null or repeated
  // session, sessions of different models, n above the chunk), GEIST_E_STATE (a session
  // without logits), GEIST_E_CONTEXT_FULL (a session without room). A device error takes
  // every session back to its pin (or empty), as decode_step does.
  static Status decode_batch(Session *const *sessions, size_t n, int32_t *out);
  // One forward step for n sessions of one model, each either prefilling a chunk or
  // decoding: where n_tokens[i] > 0 session i appends tokens[i][0 .. n_tokens[i]) as
  // prefill does; where it is 0 it samples a token, appends it and out[i] is that token, as
  // decode_step does. The weights are read once for the step; every session's new logits
  // are bit-identical to that prefill or decode_step alone (batch invariance). The step
  // runs on sessions[0]'s exec: the rows, sum of max(n_tokens[i], 1), are at most its
  // chunk. Checked before anything changes, as decode_batch, plus prefill's checks of a
  // chunk's tokens (ids, context room). out[i] of a prefilling session is left as it was.
  static Status step_batch(Session *const *sessions, const int32_t *const *tokens, const size_t *n_tokens, size_t n,
                           int32_t *out);
  // Sample without appending. GEIST_E_STATE without logits.
  Status sample(int32_t *out);
  Status set_sampling(const SamplerParams &p);

  // Snapshots (docs/SNAPSHOT.md).
  size_t snapshot_size() const;
  // Writes snapshot_size() bytes; GEIST_E_BUFFER_TOO_SMALL (and *written = size) if cap
  // is smaller.
  Status snapshot(void *buf, size_t cap, size_t *written) const;
  Status restore(const void *buf, size_t size);
  Status save_file(const std::string &path) const;
  Status load_file(const std::string &path);
  // Saved states (SessionState above). save_state leaves *st as it was on an error
  // (GEIST_E_OUT_OF_MEMORY: its KV buffer does not fit). load_state restores st as
  // restore() would its snapshot, with the same checks and guarantee (GEIST_E_STATE for
  // an empty state; GEIST_E_MISMATCH also for a state held in another space, a GPU
  // session's state in a CPU session, say). state_bytes: the memory a state saved now
  // needs (a fresh one holds up to 1/8 more: its rounded KV buffer).
  size_t state_bytes() const;
  Status save_state(SessionState *st) const;
  Status load_state(const SessionState &st);

  // The current logits row, or null without logits (or when a deferred row could not be
  // copied from the device: a device error, which sync_logits reports).
  const float *logits() const;
  // Copies a logits row that a step which drew its token left on the device (Exec::defer_outputs) to the
  // host; OK when none is pending. On a device error the row is gone: the session then has
  // no logits (GEIST_E_STATE for a draw) until its next step, reset or restore.
  Status sync_logits() const;
  int64_t n_vocab() const { return model_.info().n_vocab; }
  size_t n_tokens() const { return tokens_.size(); }
  size_t n_pinned() const { return pin_ ? pin_->n : 0; }
  const std::vector<int32_t> &tokens() const { return tokens_; }
  int64_t n_ctx() const { return cache_->n_ctx(); }
  int chunk() const { return params_.chunk; }
  int n_threads() const { return exec_->n_threads(); }
  const Model &model() const { return model_; }
  const SamplerParams &sampling() const { return sampler_.params(); }
  const SessionStats &stats() const { return stats_; }
  size_t kv_bytes_reserved() const { return cache_->bytes_reserved(); }
  // The exec's scratch (Exec::scratch_bytes: activations and step staging; device memory
  // on a GPU).
  uint64_t scratch_bytes() const { return exec_->scratch_bytes(); }
  size_t checkpoint_bytes() const;

 private:
  // The pinned state.
  struct Pin {
    size_t n = 0;
    std::vector<float> logits;  // [n_vocab]
    StepDraw draw;              // their drawn token where the step computed it
    Sampler::State sampler;
    // The K/V rows a continuation from n still reads that a later prefill can overwrite
    // are the KV store's checkpoint (KvStore::save_checkpoint), kept where the rows live.
  };

  Session(const Model &m, const SessionParams &p, std::unique_ptr<KvStore> c, std::unique_ptr<Exec> e);
  Status check_append(const int32_t *tokens, size_t n) const;
  // Chunked forward passes; out/first as prefill_with_logits (out may be null). An error
  // is a device error, after which the session is back at its pin (recover).
  // may_defer: the last chunk's logits row may stay on the device (forward_one).
  Status run_chunks(const int32_t *tokens, size_t n, size_t first, float *out, bool may_defer = true);
  // After a forward pass of failed_rows rows failed: back to the pin, or empty.
  void recover(int failed_rows);
  std::unique_ptr<Pin> make_pin() const;
  // What restore and load_state commit once every check has passed (snapshot.cpp).
  struct Parts;
  void commit(const Parts &p, Sampler::State &&pin_sampler);
  // The kv and ckpt sections of this session's snapshot, written at dst (host memory or a
  // KvBuffer of the store's space).
  void read_kv_sections(uint8_t *dst) const;
  size_t state_kv_bytes() const;  // the KV buffer a save_state needs now
  // This session's parts of an image (snapshot.cpp), over the layer specs and sampler
  // state given (the caller's copies, alive while the parts are used).
  ImageParts image_parts(const std::vector<KvLayerSpec> &layers, const Sampler::State &sampler) const;
  // Room in tokens_ for extra more (amortized O(1) per token). May throw bad_alloc.
  void reserve_tokens(size_t extra);

  const Model &model_;
  SessionParams params_;
  std::unique_ptr<KvStore> cache_;
  std::unique_ptr<Exec> exec_;
  // Where a step of several sessions draws their tokens, one task per session: the CPU
  // exec's own pool (shared by the process), or for a device exec a pool of at most
  // kDevicePoolThreads of the threads the session may use (n_threads; 1 keeps every draw on
  // the calling thread).
  static constexpr int kDevicePoolThreads = 4;
  std::shared_ptr<ThreadPool> pool_;
  // Where one greedy draw reads its row in segments: the CPU exec's pool, whose workers are
  // awake between the step's ops anyway; none for a device exec, whose pool would otherwise
  // wake (and spin) for every token of a single session.
  ThreadPool *row_pool() const { return exec_->n_threads() > 1 ? pool_.get() : nullptr; }
  Sampler sampler_;
  std::vector<int32_t> tokens_;
  Exec::HostFloats logits_;  // [n_vocab], from exec_->host_floats (page-locked on CUDA)
  // Mutable: a failed sync_logits (const) drops them.
  mutable bool has_logits_ = false;
  // logits_ is still on the device (Exec::defer_outputs: the row of a step that drew the next
  // draw does not read); sync_logits() copies it. Every read of logits_ goes through it.
  mutable bool logits_on_device_ = false;
  // model_.arch().forward for one sequence, its logits row deferred where draw is set
  // (the step computes the token, so the row may never be read).
  Status forward_one(const int32_t *tokens, int rows, int first_row, float *dst, StepDraw *draw,
                     bool may_defer = true);
  // A queued decode step (Exec::queue_next_step): its token is in tokens_, while its drawn
  // token (step_draw_) and its logits row come with settle(). Mutable: const readers settle.
  mutable bool queued_ = false;
  // Waits for a queued step. On a device error the session goes back to its pin (or empty),
  // even from a const method (logits, snapshot, save_state: the state they would read is
  // gone), and the error is returned.
  Status settle() const;
  // settle(): what every call that may change the session does first.
  Status ready() { return settle(); }
  // A decode step that threw (bad_alloc while recording) after asking for a queued or fed
  // step: nothing of it or of a queued step may stay half done, so both are dropped and the
  // session goes back to its pin, as after a device error.
  void abandon_queued();
  // decode_step after a queued step whose drawn token is the next draw: this step takes
  // that token on the device and is queued behind it, then the step before is waited for
  // (its token is this step's, returned in *out). t: the call's timer.
  Status decode_fed(int32_t *out, const Timer &t);
  // The draw of logits_ that the step which wrote them computed (Exec::draw: on a GPU, on
  // the device) by the sampler's spec at that time; token -1: not computed.
  StepDraw step_draw_;
  // Where a step that writes logits_ puts the draw of them: &step_draw_ with the sampler's
  // spec for the draw after `pending` further draws (a decode step fed by a queued one
  // draws after that one's), where the sampler's draws can be computed by a step
  // (Sampler::step_spec), else nothing. A later change of the sampler reads the logits
  // instead. GEIST_STEP_GREEDY=0: never (every draw reads the logits on the host), for an A/B.
  StepDraw *draw_target(int pending = 0);
  // Whether the next draw is the step's (computed, and the sampler takes it: the same
  // params and RNG words): then it reads no logits.
  bool draws_step_token() const { return step_draw_.token >= 0 && sampler_.takes_step_draw(step_draw_.spec); }
  // The next token from the current logits, as sampler_.sample(logits_) draws it: the step's
  // step's token where draws_step_token(), so the row is not read again here.
  // sync_for_draw() first: a draw that reads the row needs it on the host.
  int32_t draw(ThreadPool *pool);
  Status sync_for_draw() const;
  std::unique_ptr<Pin> pin_;
  mutable SessionStats stats_;  // snapshot() (const) counts too
};

}  // namespace geist
