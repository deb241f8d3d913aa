// CPU operators of the forward pass. Activations are row-major [n_rows][width] f32.
// Every op is deterministic and batch invariant: the value of one output element depends
// only on its own inputs (fixed reduction order over K), never on n_rows or the thread
// count; threads split output rows/columns, never a reduction.
#pragma once

#include <cstdint>

#include "backends/cpu/isa.h"
#include "backends/kv_type.h"
#include "backends/weight.h"
#include "base/thread_pool.h"

namespace geist::cpu {

// How quantized weights meet activations in matmul:
//   Q8:  activations quantized per row to 8-bit blocks, integer block dots (ggml's arithmetic;
//        the form fast SIMD kernels implement). The default.
//   F32: weights dequantized to f32 and multiplied with f32 activations (exact up to f32
//        rounding; for reference comparisons).
// Chosen once per process: GEIST_ACT=f32|q8 in the environment, or set_activation_mode
// before any session runs.
enum class ActivationMode { Q8, F32 };
void set_activation_mode(ActivationMode m);
ActivationMode activation_mode();

// y[r][n] = sum_k W[n][k] * x[r][k].  x: [n_rows][w.n_in], y: [n_rows][w.n_out].
// A weight repacked at load (w.packed) runs the tier's packed kernel (qgemm.h), F32/F16/
// BF16 weights the tier's float kernel (fgemm_impl.h); otherwise the generic path
// dequantizes or unpacks a row at a time into per-thread scratch. All give the same bits. Only the types with a reference dequantizer are accepted (checked
// at model load).
void matmul(const WeightView &w, const float *x, float *y, int n_rows, ThreadPool &pool);

// Same for a subset of output rows of the weight: y[r][n - n_begin] for n in [n_begin, n_end).
void matmul_range(const WeightView &w, const float *x, float *y, int n_rows, int64_t n_begin,
                  int64_t n_end, ThreadPool &pool);

// ys[m] = W_m x for up to 4 matrices reading the same x (Q, K, V; gate, up): when all are
// packed with the same activation format, x is quantized once and one pool run covers
// them all; otherwise one matmul each. The same bits either way.
void matmul_shared_input(const WeightView *const *ws, int n_mat, const float *x, float *const *ys, int n_rows,
                         ThreadPool &pool);

// The generic path (the oracle) whatever the tier in use, for tests and benchmarks.
void matmul_generic(const WeightView &w, const float *x, float *y, int n_rows, ThreadPool &pool);

// The path of one SIMD tier, for tests and microbenchmarks: the float kernel for F32, F16
// and BF16 weights, else the packed kernel (w.packed must be set, packed.h). Returns
// false, doing nothing, if the tier has no kernel for w.type or the CPU lacks the tier.
bool matmul_on_tier(Isa isa, const WeightView &w, const float *x, float *y, int n_rows, ThreadPool &pool);

// out[r] = W[ids[r]] (one dequantized row of the table per id) * scale. out: [n][w.n_in].
void embedding_gather(const WeightView &w, const int32_t *ids, int n, float scale, float *out);

// In place over `n_vec` vectors of `dim`: x = x / rms(x) * g (eps inside the root).
// g: [dim] or nullptr (no scale). Vectors are contiguous: x is [n_vec][dim].
void rmsnorm(float *x, const float *g, int64_t n_vec, int64_t dim, float eps);
// out = rmsnorm(x) without modifying x.
void rmsnorm_to(const float *x, const float *g, float *out, int64_t n_vec, int64_t dim, float eps);

// Rotary embedding, half-split (NEOX) layout, in place on x: [n_rows][n_heads][head_dim].
// cs: [n_rows][rot_dim/2][2] = (cos, sin) of each row's position (RopeTable::fill).
// Dimensions >= rot_dim pass through.
void rope_neox(float *x, int n_rows, int n_heads, int head_dim, int rot_dim, const float *cs);

// out[i] = gelu_tanh(gate[i]) * up[i]  (generic: libm's tanh)
void gelu_mul(const float *gate, const float *up, float *out, int64_t n);
// The same split over the pool, on the tier in use (a vector tanh from the tier's exp).
void gelu_mul(const float *gate, const float *up, float *out, int64_t n, ThreadPool &pool);

// The pool versions of the row-wise ops: vectors (rows) split over the threads, each
// computed exactly as by the single-threaded version, so the same bits.
void rmsnorm(float *x, const float *g, int64_t n_vec, int64_t dim, float eps, ThreadPool &pool);
void rmsnorm_to(const float *x, const float *g, float *out, int64_t n_vec, int64_t dim, float eps, ThreadPool &pool);
void rope_neox(float *x, int n_rows, int n_heads, int head_dim, int rot_dim, const float *cs, ThreadPool &pool);

// x[i] += y[i]
void add_inplace(float *x, const float *y, int64_t n);
// Over the pool (elementwise: the serial loops' bits): x += y; x *= s; x = (x + y) * s; and
// embedding_gather by rows.
void add_inplace(float *x, const float *y, int64_t n, ThreadPool &pool);
void scale_inplace(float *x, float s, int64_t n, ThreadPool &pool);
void add_scale_inplace(float *x, const float *y, float s, int64_t n, ThreadPool &pool);
void embedding_gather(const WeightView &w, const int32_t *ids, int n, float scale, float *out, ThreadPool &pool);

// x[i] = cap * tanh(x[i] / cap) (libm's tanhf), split over the pool: each element computed
// as the single-threaded loop does, so the same bits (the logits' final softcap: 262144
// per row on Gemma).
void softcap(float *x, float cap, int64_t n, ThreadPool &pool);

// Frequencies of one RoPE (base, rotated width, linear scale, optional frequency factors):
// omega_i = scale * base^(-2i/rot_dim) / ff_i. Angles are evaluated in double and rounded
// once, so the table is as exact as f32 allows at any position.
class RopeTable {
 public:
  static constexpr int kMaxRotDim = 1024;
  RopeTable() = default;
  // rot_dim even, <= kMaxRotDim. freq_factors: [rot_dim/2] or nullptr; ff >= 1e29 means omega 0.
  void init(double base, int rot_dim, double scale, const float *freq_factors);
  // cs: [n_pos][rot_dim/2][2] (cos, sin) for positions pos0 .. pos0 + n_pos - 1.
  void fill(int64_t pos0, int n_pos, float *cs) const;
  int rot_dim() const { return rot_dim_; }
  double omega(int i) const { return omega_[i]; }

 private:
  int rot_dim_ = 0;
  double omega_[kMaxRotDim / 2] = {};
};

// Causal (optionally sliding-window) attention for n_rows queries.
// q:  [n_rows][n_head][head_dim]; query r is at absolute position q_pos0 + r.
// k, v: cache rings of kv_cap rows, each row [n_head_kv][head_dim] elements of type
// k_type (v_type) stored as backends/kv_type.h says (kv_row_bytes(type, n_head_kv *
// head_dim) bytes); the key of absolute position p is in row (p % kv_cap). F32 rings are
// plain floats; for Q8_0, head_dim must be a multiple of 32 (checked): whole blocks per head.
// Keys for positions [kv_begin(p), p] are visible to the query at p, where kv_begin is
// max(0, p - window + 1) for sliding layers (window > 0) and 0 otherwise.
// out: [n_rows][n_head][head_dim].
// A typed ring gives the same bits as the same attention over its rows read back to f32
// (kv_rows.h, kv_load_rows): the kernels read each block of keys they visit into f32. The
// exception: bf16 K and V rings on the avx512 tier where the CPU has AMX-BF16 (and
// amx_enabled()) run on tiles with the queries and softmax weights in bf16
// (amx_attn_impl.h): close to, not equal to, the f32 result; rows and threads still change
// no bit.
struct AttentionArgs {
  const float *q;
  const void *k;
  const void *v;
  float *out;
  int n_rows;
  int64_t q_pos0;
  int64_t kv_cap;
  int n_head, n_head_kv, head_dim;
  int window;  // 0 = global
  float scale;
  KvType k_type = KvType::F32, v_type = KvType::F32;  // element types of the k and v rings
};
// On a SIMD tier: tiled with an online softmax (attn_impl.h), keys in chunks of 256
// absolute positions merged in order; the generic tier (and head dims that are not a
// multiple of the tier's lanes) compute the exact softmax.
void attention(const AttentionArgs &a, ThreadPool &pool);
// The same on a given tier (tests); the generic path where the tier cannot run.
void attention_on_tier(Isa isa, const AttentionArgs &a, ThreadPool &pool);
// The attention of n_seq sequences (the same n_head, n_head_kv, head_dim; each its own
// queries, ring, positions and KV types) in at most two pool runs instead of two each:
// every query's result has the same bits as attention() over its sequence alone.
void attention_seqs(const AttentionArgs *as, int n_seq, ThreadPool &pool);
void attention_seqs_on_tier(Isa isa, const AttentionArgs *as, int n_seq, ThreadPool &pool);

}  // namespace geist::cpu
