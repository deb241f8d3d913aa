// The backend seam: one forward pass per architecture, any number of devices.
//
//   Backend  one per device and model (owned by the Model, shared by its sessions):
//            prepares each weight once (repacked on the CPU, uploaded as stored on a GPU)
//            and makes the per-session objects.
//   Exec     one per session: the ops a forward pass calls, on activation handles (Act)
//            that live on the backend's device, plus the step that frames one call.
//   KvStore  one per session (kv_store.h): typed KV rows, addressed by position.
//
// Forward only enqueues. Between begin_step and end_step a model reads no activation on
// the host and branches on nothing but its own constants and the row counts it was given;
// per-call values (tokens, the first position, RoPE rows) enter through the step. A GPU
// backend can therefore run the ops asynchronously and replay a captured sequence, and
// end_step is where a device error surfaces. Every op is row-independent: a row's result
// depends on that row's inputs (and the KV rows it attends to) only, never on how many
// rows the call has, which is what keeps logits bit-identical for any chunking.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/kv_store.h"
#include "backends/weight.h"
#include "base/draw.h"
#include "base/status.h"

namespace geist {

namespace cpu {
class RopeTable;
}

// [rows][width] f32 activations on the exec's device. Models pass these around and take
// row offsets; they never dereference p.
struct Act {
  float *p = nullptr;
  int64_t width = 0;
  Act rows_from(int64_t r) const { return {p + r * width, width}; }
};

// The rows of one step may belong to several sequences (sessions decoding together): a
// sequence is the next n_rows rows of the step, at positions kv->n_past, kv->n_past + 1, ...
// of its own KV store. Rows are independent in every op but kv_append and attention,
// which each sequence runs against its own store, so a row's result is the same whatever
// else shares its step.
struct StepSeq {
  KvStore *kv = nullptr;
  int n_rows = 0;
};

class Exec {
 public:
  virtual ~Exec() = default;
  // Host threads this exec computes with (1 for a device backend).
  virtual int n_threads() const = 0;

  // Scratch buffer `slot` of max_rows x width floats (max_rows: the session's chunk). A
  // model calls buffer() for every slot with its widest use in reserve(); later calls with
  // a width no larger return the same memory without allocating.
  virtual Act buffer(int slot, int64_t width) = 0;
  // Whether every buffer() so far got its memory (a device can run out): the session
  // checks it after reserve and refuses to start otherwise.
  virtual Status reserve_status() const { return Status::ok(); }
  // Bytes this exec holds for its scratch: the activation buffers and whatever its steps
  // stage (device memory on a device backend; its page-locked host staging is not counted).
  // Not the KV cache, not the weights. It is set by reserve() and the first steps that need
  // more (a longer context's attention partials, more sessions in one step), then fixed.
  virtual uint64_t scratch_bytes() const = 0;
  // How many times a new session should run a throwaway decode step before its first
  // request, so that nothing is compiled or captured on a request's path (CUDA: the step is
  // captured into a graph the second time it is seen). 0: none needed.
  virtual int warm_up_steps() const { return 0; }

  // Rows a step may have (the session's chunk).
  virtual int max_rows() const = 0;
  // One forward call: n_rows tokens (ids checked by the caller) of the sequences seqs[0..n_seqs)
  // (their n_rows add up to n_rows), each at its store's positions. The pointers must stay
  // valid until end_step.
  virtual void begin_step(const int32_t *tokens, int n_rows, const StepSeq *seqs, int n_seqs) = 0;
  // The RoPE rows (cos, sin) of the step's positions from a table: [n_rows][rot_dim], in
  // scratch slot `slot`. Computed on the host (double angles, the same bits everywhere).
  virtual Act rope_rows(int slot, const cpu::RopeTable &t) = 0;
  // An output of the step: [n_rows][width] written by ops, on the host at `host` after
  // end_step.
  virtual Act output(float *host, int64_t width, int n_rows) = 0;
  // The same with row r of the output going to hosts[r] (width floats each).
  virtual Act output_rows(float *const *hosts, int64_t width, int n_rows) = 0;
  // The token each row r of x [n_rows][x.width] draws (rows[r]->spec) to rows[r]->token,
  // on the host after end_step; a null rows[r]: row r not wanted. Greedy rows
  // (temperature <= 0): base/argmax.h's greedy_argmax (the first index of the largest
  // value, NaNs never chosen, a NaN at index 0 kept). Sampled rows: engine/sampler.h's
  // draw_sampled with the spec's uniform (base/draw.h: the same token on every backend).
  // x is an output of this step (output, output_rows), read after the ops before this
  // call. What a session whose next draw the step can compute takes instead of reading the
  // logits row on the host. The specs are read during the call.
  virtual void draw(Act x, int n_rows, StepDraw *const *rows) = 0;
  // Whether a session lets this exec's steps draw its sampled tokens (every exec runs draw's
  // sampled rows; this only says whether a session asks). GEIST_CUDA_SAMPLE=0 turns the CUDA
  // exec's off; greedy draws are always the step's.
  virtual bool draws_sampled() const { return true; }
  // Host memory for outputs of n floats, zeroed, that this exec downloads into fastest
  // (page-locked on CUDA: a 1 MiB logits row comes back in 27 us instead of 130 on the
  // H200); plain heap memory where that is all there is, or when page-locking fails.
  using HostFloats = std::unique_ptr<float[], void (*)(float *)>;
  virtual HostFloats host_floats(size_t n) {
    return HostFloats(new float[n](), [](float *p) { delete[] p; });
  }
  // Wait for the step's ops; outputs are on the host after it (unless the step is queued:
  // queue_next_step). A device error is reported here (naming the device and the error);
  // the session is then left as before the call.
  virtual Status end_step() = 0;
  // Deferred outputs: while on, the steps that end leave their output() rows on the device
  // (the logits row of a step that draws its token, which the session may never read) and
  // outputs_deferred() says so; fetch_outputs() then copies them to their host buffers and
  // waits, any time before the next begin_step, which drops them. A backend that writes
  // the host buffers directly (the CPU) defers nothing.
  virtual void defer_outputs(bool /*on*/) {}
  virtual bool outputs_deferred() const { return false; }
  virtual Status fetch_outputs() { return Status::ok(); }
  // After a step of several sessions whose outputs were deferred: hands each deferred row
  // whose host buffer is hosts[i] to owners[i], the exec of the session it belongs to, which
  // then holds it as its own deferred output (a copy on the device: its fetch_outputs copies
  // it to the same host buffer, its next begin_step drops it); kept[i] says so. A row whose
  // owner is null (its session reads the row: copy it now), or that cannot be handed on, is
  // copied to its host buffer here. Waits for the copies; on an error nothing stays deferred
  // here or with the owners. The owners must be idle (no step queued) and of this backend.
  // hands_off_outputs(): whether a step of several sessions should defer its outputs for it.
  virtual bool hands_off_outputs() const { return false; }
  virtual Status hand_off_outputs(float *const * /*hosts*/, Exec *const * /*owners*/, size_t n, bool *kept) {
    for (size_t i = 0; i < n; ++i) kept[i] = false;
    return Status::ok();
  }
  // Queued steps, for a backend whose steps run while the host goes on (CUDA). A decode
  // step that draws its own token need not wait for its own result: the next step takes its token
  // from it on the device, so the host records step n+1 while the device runs step n.
  // can_queue(): whether this exec queues steps (not the CPU, whose steps run on the caller).
  virtual bool can_queue() const { return false; }
  // The next end_step returns once the step is enqueued (errors of recording and launching
  // are reported there, as always); its drawn tokens, its outputs and its device errors
  // come with wait_queued(), which waits for the oldest queued step. At most two steps are
  // queued; while one is, the only step that may begin is a fed one (feed_drawn).
  virtual void queue_next_step() {}
  // Waits for the oldest queued step and writes its drawn tokens to their rows; OK when
  // none is queued. On an error every queued step is dropped (nothing of them runs on).
  virtual Status wait_queued() { return Status::ok(); }
  // Waits for the device and forgets every queued step (their drawn tokens unwritten).
  virtual void drop_queued() {}
  // In the next step (one row), the row's token is the token that the step before it (one
  // row, a draw asked for) drew, taken on the device: the id given to begin_step for that
  // row is not used.
  virtual void feed_drawn() {}

  // out[r] = table[id_r] * scale for the step's tokens; an id >= table.n_out gives a zero
  // row (Gemma 4's per-layer embeddings have no row for some ids). out width = table.n_in.
  virtual void embed(const WeightView &table, float scale, Act out) = 0;
  // ys[m] = W_m x (rows [0, n_rows)), for up to 4 matrices reading the same x.
  virtual void matmul(const WeightView *const *ws, int n_mat, Act x, const Act *ys, int n_rows) = 0;
  void matmul(const WeightView &w, Act x, Act y, int n_rows) {
    const WeightView *p = &w;
    matmul(&p, 1, x, &y, n_rows);
  }
  // out = x / rms(x) * g over n_vec contiguous vectors of dim (g: an F32 vector of dim, or
  // nullptr for none). out may be x.
  virtual void rmsnorm(Act x, const WeightView *g, int64_t n_vec, int64_t dim, float eps, Act out) = 0;
  // x = rmsnorm(x) * g in place, then h += x (a post-norm and its residual add): exactly
  // rmsnorm then add, as one op where a backend fuses them.
  virtual void rmsnorm_add(Act x, const WeightView *g, int64_t n_vec, int64_t dim, float eps, Act h) {
    rmsnorm(x, g, n_vec, dim, eps, x);
    add(h, x, n_vec * dim);
  }
  // The end of a block and the input norm of the next, as one op where a backend fuses
  // them: rmsnorm_add(x, g, h), then h *= h_scale unless it is 1, then out = rmsnorm(h) *
  // g_next (g_next null: no weight). Exactly those ops in turn. x, h, out: distinct.
  virtual void rmsnorm_add_norm(Act x, const WeightView *g, Act h, float h_scale, const WeightView *g_next, Act out,
                                int64_t n_vec, int64_t dim, float eps) {
    rmsnorm_add(x, g, n_vec, dim, eps, h);
    if (h_scale != 1.0f) scale(h, h_scale, n_vec * dim);
    rmsnorm(h, g_next, n_vec, dim, eps, out);
  }
  // Per-head RMSNorm and then, where `rope` is set, NEOX RoPE over the whole head with the
  // rows cs, in place on each of up to 3 tensors x [n_rows][n_heads][head_dim] of one step
  // (Gemma's q, k and v norms). Exactly rmsnorm then rope on each, as one op where a
  // backend fuses them.
  struct HeadNorm {
    Act x;
    const WeightView *g = nullptr;  // null: no weight
    int n_heads = 0;
    bool rope = false;
  };
  virtual void head_norm_rope(const HeadNorm *t, int n_t, int n_rows, int head_dim, float eps, Act cs) {
    for (int i = 0; i < n_t; ++i) {
      rmsnorm(t[i].x, t[i].g, int64_t(n_rows) * t[i].n_heads, head_dim, eps, t[i].x);
      if (t[i].rope) rope(t[i].x, n_rows, t[i].n_heads, head_dim, head_dim, cs);
    }
  }
  // NEOX rotary embedding in place on x [n_rows][n_heads][head_dim] with rows cs (rope_rows).
  virtual void rope(Act x, int n_rows, int n_heads, int head_dim, int rot_dim, Act cs) = 0;
  // Store the step's K and V rows [n_rows][row_floats] as layer l of each sequence's store,
  // at the sequence's positions.
  virtual void kv_append(int l, Act k, Act v) = 0;
  // Causal attention of the step's q [n_rows][n_head][head_dim], each sequence's rows at
  // its positions over layer l of its own store (window W > 0: the last W positions), GQA
  // by the store's row width.
  virtual void attention(int l, Act q, Act out, int n_head, int head_dim, int window, float scale) = 0;
  // Elementwise over n floats: out = gelu_tanh(gate) * up; x += y; x *= s;
  // x = (x + y) * s; x = cap * tanh(x / cap).
  virtual void gelu_mul(Act gate, Act up, Act out, int64_t n) = 0;
  virtual void add(Act x, Act y, int64_t n) = 0;
  virtual void scale(Act x, float s, int64_t n) = 0;
  virtual void add_scale(Act x, Act y, float s, int64_t n) = 0;
  virtual void softcap(Act x, float cap, int64_t n) = 0;
  // gate[r][i] = gelu_tanh(gate[r][i]) * src[r][col0 + i] for i < gate.width (Gemma 4's
  // per-layer gate times its slice of z): copy_cols into tmp (n_rows x gate.width of scratch)
  // then gelu_mul, as one op where a backend fuses them.
  virtual void gelu_mul_cols(Act gate, Act src, int64_t col0, Act tmp, int n_rows) {
    copy_cols(src, col0, Act{tmp.p, gate.width}, n_rows);
    gelu_mul(gate, Act{tmp.p, gate.width}, gate, int64_t(n_rows) * gate.width);
  }
  // dst[r][0, dst.width) = src[r][col0, col0 + dst.width) for n_rows rows.
  virtual void copy_cols(Act src, int64_t col0, Act dst, int n_rows) = 0;
};

// The weights a model hands its backend, by role. Null views (absent optional tensors)
// are skipped.
struct ModelWeights {
  std::vector<WeightView *> matrices;  // multiplied (Exec::matmul)
  std::vector<WeightView *> tables;    // looked up by row (Exec::embed)
  std::vector<WeightView *> vectors;   // F32 vectors (norm weights)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char *name() const = 0;  // "cpu", "cuda"
  // The device in words, for `geist run` ("CPU: AVX-512 VNNI tier", "NVIDIA H200 ...").
  virtual std::string device() const = 0;

  // Prepare every weight once, in place (a backend may set fields of the views that only
  // it reads). release(p, n) tells the model's mapping that the host bytes [p, p + n) of
  // a weight are no longer read (the backend made its own copy).
  virtual Status prepare(const ModelWeights &w, const std::function<void(const void *, size_t)> &release) = 0;
  // Bytes the backend holds for the weights (repacked copies, device memory) and the
  // seconds prepare took.
  virtual uint64_t weight_bytes() const = 0;
  virtual double prepare_seconds() const = 0;

  // KV storage of K rows of type tk and V rows of type tv (GEIST_E_UNSUPPORTED for q8_0
  // rows whose width is not a multiple of 32).
  virtual Result<std::unique_ptr<KvStore>> create_kv(const std::vector<KvLayerSpec> &layers, int64_t n_ctx,
                                                     int max_chunk, KvType tk, KvType tv) = 0;
  // n_threads: host threads (0: all); ignored by device backends.
  virtual Result<std::unique_ptr<Exec>> create_exec(int n_threads, int max_chunk) = 0;
};

enum class BackendKind { Cpu, Cuda };

// The argument checks of Backend::create_kv every backend makes: n_ctx and max_chunk >= 1,
// q8_0 rows a multiple of 32 wide (GEIST_E_UNSUPPORTED, naming the width).
Status check_kv_args(const std::vector<KvLayerSpec> &layers, int64_t n_ctx, int max_chunk, KvType tk, KvType tv);

// The registry (backends/registry.cpp), the only place that names concrete backends.
// GEIST_E_UNSUPPORTED for a backend this build does not have; a device backend reports a
// missing device, an old driver or a failed initialisation with the device's message.
Result<std::unique_ptr<Backend>> make_backend(BackendKind kind, int device);

// The backends themselves.
std::unique_ptr<Backend> make_cpu_backend();
Result<std::unique_ptr<Backend>> make_cuda_backend(int device);  // builds with GEIST_CUDA

}  // namespace geist
