#include "backends/cpu/ops.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/cpu/isa.h"
#include "backends/cpu/kv_rows.h"
#include "backends/cpu/packed.h"
#include "backends/cpu/qgemm.h"
#include "base/cpu_clones.h"
#include "base/status.h"
#include "quant/dot.h"
#include "quant/quant.h"

namespace geist::cpu {
namespace {

// Dot product with 16 independent partial sums in a fixed order, reduced as a fixed
// tree. The compiler maps the 16 lanes onto SIMD registers of any width; the result is
// the same on every ISA because the association never changes (built with
// -ffp-contract=off, no fast-math).
GEIST_CPU_CLONES
float dot_f32(const float *a, const float *b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
  }
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  for (int w = 8; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0];
}

// Output rows per task: enough work per task to amortize the claim, small enough to
// balance two to sixteen threads.
int64_t rows_per_task(int64_t n_out, int n_threads) {
  int64_t per = n_out / (static_cast<int64_t>(n_threads) * 8);
  return std::clamp<int64_t>(per, 1, 256);
}

thread_local std::vector<float> t_dequant_row;

}  // namespace

namespace {

// Types whose tier kernel takes f32 activations (fgemm_impl.h): the float types, and
// Q4_1/Q5_1, which have no integer form and are dequantized on the fly.
bool is_float_type(quant::GgmlType t) {
  return t == quant::GgmlType::F32 || t == quant::GgmlType::F16 || t == quant::GgmlType::BF16 ||
         t == quant::GgmlType::Q4_1 || t == quant::GgmlType::Q5_1;
}

FloatGemmFn float_fn(const WeightView &w, Isa isa) {
  if (!is_float_type(w.type)) return nullptr;
  const TierKernels *tk = tier_kernels(isa);
  return tk ? tk->float_for_type(w.type) : nullptr;
}

// Float weights on a tier's kernel (fgemm_impl.h): the same split over output rows and
// the same arithmetic as matmul_f32_act below.
void matmul_float(FloatGemmFn fn, const WeightView &w, const float *x, float *y, int n_rows, int64_t n_begin,
                  int64_t n_end, ThreadPool &pool) {
  FloatGemmArgs a;
  a.w = static_cast<const uint8_t *>(w.data);
  a.row_bytes = w.row_bytes;
  a.K = w.n_in;
  a.x = x;
  a.n_rows = n_rows;
  a.y = y;
  a.ldy = n_end - n_begin;
  a.n_begin = n_begin;
  // Tasks over (activation rows, outputs): a task over all rows re-reads every row for its
  // few outputs, so with many rows the split by outputs alone streams the activations once
  // per task (E4B's per-layer gate, 512 x 2560 f32 rows and 256 outputs, read 128 times:
  // 4.5 ms per call at 16 threads). Row blocks of kRowBlock keep a block's rows in L2.
  // Every (row, output) is the same dot whatever block it is in: the bits do not change.
  constexpr int kRowBlock = 64;
  const int n_rb = (n_rows + kRowBlock - 1) / kRowBlock;
  const int64_t n_cols = n_end - n_begin;
  const int64_t want = int64_t(pool.n_threads()) * 8;
  const int64_t per = std::clamp<int64_t>(n_cols * n_rb / want, std::min<int64_t>(16, n_cols), 256);
  const int64_t n_cb = (n_cols + per - 1) / per;
  pool.run(static_cast<int>(n_cb * n_rb), [&](int task, int) {
    const int rb = static_cast<int>(task / n_cb);
    const int64_t c0 = n_begin + (task % n_cb) * per;
    FloatGemmArgs b = a;
    b.x = a.x + static_cast<size_t>(rb) * kRowBlock * a.K;
    b.y = a.y + static_cast<size_t>(rb) * kRowBlock * a.ldy;
    b.n_rows = std::min(kRowBlock, n_rows - rb * kRowBlock);
    fn(b, c0, std::min(n_end, c0 + per));
  });
}

// Weights whose type has no integer form: dequantize a row to f32, dot with f32 rows.
void matmul_f32_act(const WeightView &w, const float *x, float *y, int n_rows, int64_t n_begin, int64_t n_end,
                    ThreadPool &pool, Isa isa) {
  if (FloatGemmFn fn = float_fn(w, isa)) {
    matmul_float(fn, w, x, y, n_rows, n_begin, n_end, pool);
    return;
  }
  const int64_t K = w.n_in;
  const int64_t n_cols = n_end - n_begin;
  const int64_t per = rows_per_task(n_cols, pool.n_threads());
  const int n_tasks = static_cast<int>((n_cols + per - 1) / per);
  pool.run(n_tasks, [&](int task, int /*thread*/) {
    std::vector<float> &wrow = t_dequant_row;
    if (static_cast<int64_t>(wrow.size()) < K) wrow.resize(K);
    const int64_t c0 = n_begin + task * per;
    const int64_t c1 = std::min(n_end, c0 + per);
    for (int64_t n = c0; n < c1; ++n) {
      const float *wr;
      if (w.type == quant::GgmlType::F32) {
        wr = reinterpret_cast<const float *>(w.row(n));
      } else {
        bool ok = quant::dequantize_row(w.type, w.row(n), wrow.data(), K);
        GEIST_CHECK(ok, "matmul on a weight type without a dequantizer");
        wr = wrow.data();
      }
      for (int r = 0; r < n_rows; ++r) {
        y[static_cast<size_t>(r) * n_cols + (n - n_begin)] = dot_f32(wr, x + static_cast<size_t>(r) * K, K);
      }
    }
  });
}

thread_local std::vector<quant::QuantizedRow> t_act_rows;
thread_local quant::UnpackedRow t_unpacked;

ActivationMode mode_from_env() {
  const char *e = std::getenv("GEIST_ACT");
  if (e == nullptr || *e == '\0' || std::string(e) == "q8") return ActivationMode::Q8;
  if (std::string(e) == "f32") return ActivationMode::F32;
  std::fprintf(stderr, "geist: GEIST_ACT=%s is not one of q8, f32; using q8\n", e);
  return ActivationMode::Q8;
}
std::atomic<ActivationMode> g_act_mode{mode_from_env()};

}  // namespace

void set_activation_mode(ActivationMode m) { g_act_mode.store(m); }
ActivationMode activation_mode() { return g_act_mode.load(std::memory_order_relaxed); }

namespace {

// Quantized activation rows in the flat form the packed kernels read (qgemm.h).
struct ActBuffers {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int16_t> s32, s16;
};
thread_local ActBuffers t_acts;

// Tasks per pool thread of a packed matmul over n_rows rows. On more than kFewThreads
// threads: 8, so that a thread that falls behind (descheduled, or a slower core) leaves
// work for the others. On a few threads: one contiguous range each for decode and
// batched decode (at most kDecodeRows rows), two for prefill, because a thread's tasks
// are claimed in turn with the other threads' and so lie apart in the weights, and each
// task's first groups wait on memory while the prefetchers find the new stream (the
// prefetch of the next group stops at a task's end). Measured (docs/BENCH.md): on the
// 2-core EPYC the 270M model's layer matmuls took 10-16 % (avx512) and 22-24 % (avx2)
// less time per decoded token, 4 / 8 sessions decoding together gained 33-48 % / 10-16 %,
// and calls of 9-64 rows 5-22 % (pp512 unchanged); on the 16-core Xeon host E4B decoded
// 7-18 % slower with one task per thread at 16 threads and within noise at 8, so more
// threads keep 8. GEIST_CPU_DECODE_TASKS=N and GEIST_CPU_PREFILL_TASKS=N set the counts
// for any thread count (tuning knobs). Which thread computes a group never changes its
// bits.
constexpr int kDecodeRows = 8;
constexpr int kFewThreads = 4;
int tasks_per_thread(int n_rows, int n_threads) {
  auto knob = [](const char *name) {
    const char *e = std::getenv(name);
    const int v = e ? std::atoi(e) : 0;
    return v >= 1 && v <= 64 ? v : 0;
  };
  static const int decode = knob("GEIST_CPU_DECODE_TASKS"), prefill = knob("GEIST_CPU_PREFILL_TASKS");
  const bool few = n_threads <= kFewThreads;
  if (n_rows <= kDecodeRows) return decode > 0 ? decode : few ? 1 : 8;
  return prefill > 0 ? prefill : few ? 2 : 8;
}

// The packed path: activations quantized per row (parallel over rows), then the tier's
// kernel over groups of 16 weight rows (parallel over groups; every group sees all rows).
// The packed path for n_mat matrices that read the same input x (Q, K, V; gate, up): the
// activations are quantized once per row (parallel over rows), then one pool run covers
// every matrix's groups of 16 weight rows (every group sees all rows).
void matmul_packed(const GemmFn *fns, const WeightView *const *ws, int n_mat, const float *x, float *const *ys,
                   int n_rows, ThreadPool &pool) {
  const quant::ActFormat af = quant::act_format(ws[0]->type);
  const int64_t K = ws[0]->n_in;
  const int64_t nd = K / quant::act_block(af);
  ActBuffers &ab = t_acts;
  const size_t nr = static_cast<size_t>(n_rows);
  if (ab.q.size() < nr * K) ab.q.resize(nr * K);
  if (ab.d.size() < nr * nd) ab.d.resize(nr * nd);
  if (ab.s32.size() < nr * (K / 32)) ab.s32.resize(nr * (K / 32));
  if (ab.s16.size() < nr * (K / 16)) ab.s16.resize(nr * (K / 16));
  // The tier's vectorized quantizer where it has one (the same bits as quant's).
  const TierKernels *tk = tier_kernels(active_isa());
  const auto quantize = tk && tk->quantize_row ? tk->quantize_row : quant::quantize_row_to;
  pool.run(n_rows, [&](int r, int) {
    int8_t *q = ab.q.data() + r * K;
    quantize(af, x + static_cast<size_t>(r) * K, K, ab.d.data() + r * nd, q);
    int16_t *s16 = ab.s16.data() + r * (K / 16);
    int16_t *s32 = ab.s32.data() + r * (K / 32);
    for (int64_t b = 0; b < K / 16; ++b) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += q[16 * b + j];
      s16[b] = static_cast<int16_t>(s);
    }
    for (int64_t b = 0; b < K / 32; ++b) s32[b] = static_cast<int16_t>(s16[2 * b] + s16[2 * b + 1]);
  });
  constexpr int kMaxMat = 4;
  GemmArgs args[kMaxMat];
  int64_t task0[kMaxMat + 1] = {0}, per[kMaxMat] = {};
  for (int m = 0; m < n_mat; ++m) {
    const WeightView &w = *ws[m];
    GemmArgs &a = args[m];
    a.w = w.packed;
    a.group_bytes = w.group_bytes;
    a.K = K;
    a.n_out = w.n_out;
    a.xq = ab.q.data();
    a.xd = ab.d.data();
    a.xs32 = ab.s32.data();
    a.xs16 = ab.s16.data();
    a.n_rows = n_rows;
    a.y = ys[m];
    a.ldy = w.n_out;
    const int64_t n_groups = (w.n_out + kPackRows - 1) / kPackRows;
    const int tpt = tasks_per_thread(n_rows, pool.n_threads());
    per[m] = std::max<int64_t>(1, n_groups / (int64_t(pool.n_threads()) * tpt));
    task0[m + 1] = task0[m] + (n_groups + per[m] - 1) / per[m];
  }
  pool.run(static_cast<int>(task0[n_mat]), [&](int task, int) {
    int m = 0;
    while (task >= task0[m + 1]) ++m;
    const int64_t n_groups = (ws[m]->n_out + kPackRows - 1) / kPackRows;
    const int64_t g0 = (task - task0[m]) * per[m];
    fns[m](args[m], g0, std::min(n_groups, g0 + per[m]));
  });
}

GemmFn packed_fn(const WeightView &w, Isa isa) {
  if (!w.packed) return nullptr;
  const TierKernels *tk = tier_kernels(isa);
  return tk ? tk->for_type(w.type) : nullptr;
}

// isa: the tier whose kernels may run (Generic: none).
void matmul_impl(const WeightView &w, const float *x, float *y, int n_rows, int64_t n_begin, int64_t n_end,
                 ThreadPool &pool, Isa isa) {
  const quant::ActFormat af = quant::act_format(w.type);
  if (af == quant::ActFormat::F32 || activation_mode() == ActivationMode::F32) {
    matmul_f32_act(w, x, y, n_rows, n_begin, n_end, pool, isa);
    return;
  }
  if (n_begin == 0 && n_end == w.n_out) {
    if (GemmFn fn = packed_fn(w, isa)) {
      const WeightView *wp = &w;
      matmul_packed(&fn, &wp, 1, x, &y, n_rows, pool);
      return;
    }
  }
  const int64_t K = w.n_in;
  // Quantize every activation row once (per row: batch invariant).
  std::vector<quant::QuantizedRow> &xq = t_act_rows;
  if (static_cast<int>(xq.size()) < n_rows) xq.resize(n_rows);
  pool.run(n_rows, [&](int r, int) { quant::quantize_row(af, x + static_cast<size_t>(r) * K, K, &xq[r]); });
  const int64_t n_cols = n_end - n_begin;
  const int64_t per = rows_per_task(n_cols, pool.n_threads());
  const int n_tasks = static_cast<int>((n_cols + per - 1) / per);
  pool.run(n_tasks, [&](int task, int /*thread*/) {
    quant::UnpackedRow &wu = t_unpacked;
    const int64_t c0 = n_begin + task * per;
    const int64_t c1 = std::min(n_end, c0 + per);
    for (int64_t n = c0; n < c1; ++n) {
      if (w.type == quant::GgmlType::Q8_0) {  // no unpack needed: int8 weights as stored
        for (int r = 0; r < n_rows; ++r) {
          y[static_cast<size_t>(r) * n_cols + (n - n_begin)] = quant::dot_q8_0_blocks(w.row(n), xq[r]);
        }
        continue;
      }
      bool ok = quant::unpack_row(w.type, w.row(n), K, &wu);
      GEIST_CHECK(ok, "no integer form for this weight type");
      for (int r = 0; r < n_rows; ++r) {
        y[static_cast<size_t>(r) * n_cols + (n - n_begin)] = quant::dot_unpacked(wu, xq[r]);
      }
    }
  });
}

}  // namespace

void matmul_range(const WeightView &w, const float *x, float *y, int n_rows, int64_t n_begin,
                  int64_t n_end, ThreadPool &pool) {
  matmul_impl(w, x, y, n_rows, n_begin, n_end, pool, active_isa());
}

void matmul_generic(const WeightView &w, const float *x, float *y, int n_rows, ThreadPool &pool) {
  matmul_impl(w, x, y, n_rows, 0, w.n_out, pool, Isa::Generic);
}

bool matmul_on_tier(Isa isa, const WeightView &w, const float *x, float *y, int n_rows, ThreadPool &pool) {
  if (!isa_supported(isa)) return false;
  if (FloatGemmFn ffn = float_fn(w, isa)) {
    matmul_float(ffn, w, x, y, n_rows, 0, w.n_out, pool);
    return true;
  }
  GemmFn fn = packed_fn(w, isa);
  if (!fn) return false;
  const WeightView *wp = &w;
  matmul_packed(&fn, &wp, 1, x, &y, n_rows, pool);
  return true;
}

void matmul_shared_input(const WeightView *const *ws, int n_mat, const float *x, float *const *ys, int n_rows,
                         ThreadPool &pool) {
  GemmFn fns[4];
  bool fused = n_mat >= 1 && n_mat <= 4 && activation_mode() == ActivationMode::Q8;
  for (int m = 0; fused && m < n_mat; ++m) {
    fns[m] = packed_fn(*ws[m], active_isa());
    fused = fns[m] != nullptr && ws[m]->n_in == ws[0]->n_in &&
            quant::act_format(ws[m]->type) == quant::act_format(ws[0]->type);
  }
  if (!fused) {
    for (int m = 0; m < n_mat; ++m) matmul(*ws[m], x, ys[m], n_rows, pool);
    return;
  }
  matmul_packed(fns, ws, n_mat, x, ys, n_rows, pool);
}

void matmul(const WeightView &w, const float *x, float *y, int n_rows, ThreadPool &pool) {
  matmul_range(w, x, y, n_rows, 0, w.n_out, pool);
}

void embedding_gather(const WeightView &w, const int32_t *ids, int n, float scale, float *out) {
  for (int r = 0; r < n; ++r) {
    float *o = out + static_cast<size_t>(r) * w.n_in;
    bool ok = quant::dequantize_row(w.type, w.row(ids[r]), o, w.n_in);
    GEIST_CHECK(ok, "embedding of a type without a dequantizer");
    for (int64_t i = 0; i < w.n_in; ++i) o[i] *= scale;
  }
}

namespace {

// ss[v] = sum over i in order of double(x[v][i])^2 for kVec vectors of dim floats each
// (x: [kVec][dim], row-major). Each vector's sum is one running double, added in index
// order exactly as a loop over that vector alone adds it; the kVec sums are independent,
// so the adds of different vectors overlap instead of waiting on each other's latency
// (the compiler may put them in the lanes of one register: same order per lane).
// (A template inlined into one cloned function per count: clang does not multiversion
// function templates.)
template <int kVec>
inline __attribute__((always_inline)) void sum_squares_n(const float *x, int64_t dim, double *ss) {
  double s[kVec] = {};
  for (int64_t i = 0; i < dim; ++i) {
    for (int v = 0; v < kVec; ++v) {
      const double e = x[v * dim + i];
      s[v] += e * e;
    }
  }
  for (int v = 0; v < kVec; ++v) ss[v] = s[v];
}
GEIST_CPU_CLONES void sum_squares8(const float *x, int64_t dim, double *ss) { sum_squares_n<8>(x, dim, ss); }
GEIST_CPU_CLONES void sum_squares4(const float *x, int64_t dim, double *ss) { sum_squares_n<4>(x, dim, ss); }
GEIST_CPU_CLONES void sum_squares2(const float *x, int64_t dim, double *ss) { sum_squares_n<2>(x, dim, ss); }
GEIST_CPU_CLONES void sum_squares1(const float *x, int64_t dim, double *ss) { sum_squares_n<1>(x, dim, ss); }

}  // namespace

void rmsnorm_to(const float *x, const float *g, float *out, int64_t n_vec, int64_t dim, float eps) {
  // Sum of squares in double (each square is exact; the adds run in index order).
  constexpr int kBlock = 8;
  double ss[kBlock];
  for (int64_t v0 = 0; v0 < n_vec; v0 += kBlock) {
    const int nb = int(std::min<int64_t>(kBlock, n_vec - v0));
    const float *xb = x + v0 * dim;
    for (int b = 0; b < nb;) {  // 8 vectors at a time, a tail in 4, 2, 1
      const int left = nb - b;
      if (left >= 8) {
        sum_squares8(xb + b * dim, dim, ss + b);
        b += 8;
      } else if (left >= 4) {
        sum_squares4(xb + b * dim, dim, ss + b);
        b += 4;
      } else if (left >= 2) {
        sum_squares2(xb + b * dim, dim, ss + b);
        b += 2;
      } else {
        sum_squares1(xb + b * dim, dim, ss + b);
        b += 1;
      }
    }
    for (int b = 0; b < nb; ++b) {
      const float *xv = xb + b * dim;
      float *ov = out + (v0 + b) * dim;
      const float r = static_cast<float>(1.0 / std::sqrt(ss[b] / static_cast<double>(dim) + eps));
      if (g) {
        for (int64_t i = 0; i < dim; ++i) ov[i] = xv[i] * r * g[i];
      } else {
        for (int64_t i = 0; i < dim; ++i) ov[i] = xv[i] * r;
      }
    }
  }
}

void rmsnorm(float *x, const float *g, int64_t n_vec, int64_t dim, float eps) {
  rmsnorm_to(x, g, x, n_vec, dim, eps);
}

void RopeTable::init(double base, int rot_dim, double scale, const float *freq_factors) {
  GEIST_CHECK(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= kMaxRotDim, "bad RoPE width");
  rot_dim_ = rot_dim;
  for (int i = 0; i < rot_dim / 2; ++i) {
    double w = std::pow(base, -2.0 * i / rot_dim) * scale;
    if (freq_factors) {
      const double ff = freq_factors[i];
      w = ff >= 1e29 ? 0.0 : w / ff;
    }
    omega_[i] = w;
  }
}

void RopeTable::fill(int64_t pos0, int n_pos, float *cs) const {
  const int half = rot_dim_ / 2;
  for (int r = 0; r < n_pos; ++r) {
    const double p = static_cast<double>(pos0 + r);
    float *row = cs + static_cast<size_t>(r) * rot_dim_;
    for (int i = 0; i < half; ++i) {
      const double th = p * omega_[i];
      row[2 * i] = static_cast<float>(std::cos(th));
      row[2 * i + 1] = static_cast<float>(std::sin(th));
    }
  }
}

void rope_neox(float *x, int n_rows, int n_heads, int head_dim, int rot_dim, const float *cs) {
  const int half = rot_dim / 2;
  for (int r = 0; r < n_rows; ++r) {
    const float *c = cs + static_cast<size_t>(r) * rot_dim;
    for (int h = 0; h < n_heads; ++h) {
      float *v = x + (static_cast<size_t>(r) * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float x0 = v[i], x1 = v[i + half];
        const float co = c[2 * i], si = c[2 * i + 1];
        v[i] = x0 * co - x1 * si;
        v[i + half] = x1 * co + x0 * si;
      }
    }
  }
}

void gelu_mul(const float *gate, const float *up, float *out, int64_t n) {
  const float k = 0.7978845608028654f;  // sqrt(2/pi)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float t = std::tanh(k * (g + 0.044715f * g * g * g));
    out[i] = 0.5f * g * (1.0f + t) * up[i];
  }
}

void gelu_mul(const float *gate, const float *up, float *out, int64_t n, ThreadPool &pool) {
  const TierKernels *tk = tier_kernels(active_isa());
  auto fn = tk && tk->gelu_mul ? tk->gelu_mul : nullptr;
  parallel_ranges(n, 4096, pool, [&](int64_t b, int64_t e) {
    if (fn) {
      fn(gate + b, up + b, out + b, e - b);
    } else {
      gelu_mul(gate + b, up + b, out + b, e - b);
    }
  });
}

void softcap(float *x, float cap, int64_t n, ThreadPool &pool) {
  parallel_ranges(n, 16384, pool, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = cap * std::tanh(x[i] / cap);
  });
}

void rmsnorm(float *x, const float *g, int64_t n_vec, int64_t dim, float eps, ThreadPool &pool) {
  parallel_ranges(n_vec, std::max<int64_t>(1, 8192 / dim), pool,
                  [&](int64_t b, int64_t e) { rmsnorm(x + b * dim, g, e - b, dim, eps); });
}

void rmsnorm_to(const float *x, const float *g, float *out, int64_t n_vec, int64_t dim, float eps, ThreadPool &pool) {
  parallel_ranges(n_vec, std::max<int64_t>(1, 8192 / dim), pool,
                  [&](int64_t b, int64_t e) { rmsnorm_to(x + b * dim, g, out + b * dim, e - b, dim, eps); });
}

void rope_neox(float *x, int n_rows, int n_heads, int head_dim, int rot_dim, const float *cs, ThreadPool &pool) {
  parallel_ranges(n_rows, std::max(1, 8192 / (n_heads * head_dim)), pool, [&](int64_t b, int64_t e) {
    rope_neox(x + b * n_heads * head_dim, int(e - b), n_heads, head_dim, rot_dim, cs + b * rot_dim);
  });
}

void add_inplace(float *x, const float *y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// Elementwise, so split anywhere: the same bits as the serial loops. (Serial, the residual
// adds of E4B's 512-row prefill took 0.8 ms each, 4.5 % of it at 16 threads.)
void add_inplace(float *x, const float *y, int64_t n, ThreadPool &pool) {
  parallel_ranges(n, 16384, pool, [&](int64_t b, int64_t e) { add_inplace(x + b, y + b, e - b); });
}

void scale_inplace(float *x, float s, int64_t n, ThreadPool &pool) {
  parallel_ranges(n, 16384, pool, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] *= s;
  });
}

void add_scale_inplace(float *x, const float *y, float s, int64_t n, ThreadPool &pool) {
  parallel_ranges(n, 16384, pool, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = (x[i] + y[i]) * s;
  });
}

void embedding_gather(const WeightView &w, const int32_t *ids, int n, float scale, float *out, ThreadPool &pool) {
  parallel_ranges(n, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, w.n_in)), pool, [&](int64_t b, int64_t e) {
    embedding_gather(w, ids + b, int(e - b), scale, out + b * w.n_in);
  });
}

namespace {

// The generic (oracle) attention: per query and head, every visible score, an exact
// softmax (sum in double), then the weighted sum of values. A typed ring's rows are read
// to f32 one at a time (kv_load_rows) into per-thread rows; F32 rings are read in place.
template <bool kTyped>
void attention_generic_t(const AttentionArgs &a, ThreadPool &pool) {
  const int group = a.n_head / a.n_head_kv;
  const int n_tasks = a.n_rows * a.n_head;
  const size_t kv_stride = static_cast<size_t>(a.n_head_kv) * a.head_dim;
  pool.run(n_tasks, [&](int task, int /*thread*/) {
    thread_local std::vector<float> scores, row;
    const int r = task / a.n_head;
    const int h = task % a.n_head;
    const int g = h / group;
    // Head g's elements of the ring row (of type t) holding position j.
    auto kv_row = [&](const void *ring, KvType t, int64_t j) -> const float * {
      const size_t slot = static_cast<size_t>(j % a.kv_cap);
      if constexpr (kTyped) {
        const auto *p = static_cast<const uint8_t *>(ring) + slot * kv_row_bytes(t, int64_t(kv_stride)) +
                        kv_row_bytes(t, int64_t(g) * a.head_dim);
        kv_load_rows(t, p, 1, a.head_dim, row.data());
        return row.data();
      } else {
        return static_cast<const float *>(ring) + slot * kv_stride + g * a.head_dim;
      }
    };
    if (kTyped && static_cast<int>(row.size()) < a.head_dim) row.resize(a.head_dim);
    const int64_t p = a.q_pos0 + r;
    const int64_t j0 = a.window > 0 ? std::max<int64_t>(0, p - a.window + 1) : 0;
    const int64_t n_keys = p - j0 + 1;
    if (static_cast<int64_t>(scores.size()) < n_keys) scores.resize(n_keys);
    const float *q = a.q + (static_cast<size_t>(r) * a.n_head + h) * a.head_dim;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < n_keys; ++j) {
      const float *k = kv_row(a.k, a.k_type, j0 + j);
      const float s = dot_f32(q, k, a.head_dim) * a.scale;
      scores[j] = s;
      mx = std::max(mx, s);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n_keys; ++j) {
      scores[j] = std::exp(scores[j] - mx);
      sum += scores[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    float *o = a.out + (static_cast<size_t>(r) * a.n_head + h) * a.head_dim;
    std::fill(o, o + a.head_dim, 0.0f);
    for (int64_t j = 0; j < n_keys; ++j) {
      const float *v = kv_row(a.v, a.v_type, j0 + j);
      const float w = scores[j] * inv;
      for (int d = 0; d < a.head_dim; ++d) o[d] += w * v[d];
    }
  });
}

void attention_generic(const AttentionArgs &a, ThreadPool &pool) {
  if (a.k_type == KvType::F32 && a.v_type == KvType::F32) {
    attention_generic_t<false>(a, pool);
  } else {
    attention_generic_t<true>(a, pool);
  }
}

}  // namespace

}  // namespace geist::cpu

namespace geist::cpu {
namespace {

// Keys are split into chunks of kAttnChunk absolute positions. Every query's chunks are
// reduced to partial states by the tier's kernel and merged in chunk order, whether one
// task walks all of a query's chunks or several threads compute them (decode at long
// context): the same partials, merged the same way, so the same bits.
constexpr int64_t kAttnChunk = 256;

struct AttnState {
  float *m, *l, *acc;  // [group], [group], [group][D]
};

void merge_state(AttnState s, const AttnState &p, int group, int D) {
  for (int h = 0; h < group; ++h) {
    const float mn = std::max(s.m[h], p.m[h]);
    const float ca = std::exp(s.m[h] - mn), cb = std::exp(p.m[h] - mn);
    s.l[h] = s.l[h] * ca + p.l[h] * cb;
    s.m[h] = mn;
    float *o = s.acc + size_t(h) * D;
    const float *q = p.acc + size_t(h) * D;
    for (int d = 0; d < D; ++d) o[d] = o[d] * ca + q[d] * cb;
  }
}

void finish_state(const AttnState &s, const AttentionArgs &a, int r, int g, int group) {
  const int D = a.head_dim;
  for (int h = 0; h < group; ++h) {
    float *o = a.out + (size_t(r) * a.n_head + size_t(g) * group + h) * D;
    const float *acc = s.acc + size_t(h) * D;
    const float inv = 1.0f / s.l[h];
    for (int d = 0; d < D; ++d) o[d] = acc[d] * inv;
  }
}

void visible(const AttentionArgs &a, int r, int64_t *lo, int64_t *hi) {
  *hi = a.q_pos0 + r;
  *lo = a.window > 0 ? std::max<int64_t>(0, *hi - a.window + 1) : 0;
}

thread_local uint64_t t_attn_task = 0;
// A new attention_task_id() for this thread's next kernel calls.
void begin_attention_task() {
  static std::atomic<uint64_t> next{1};
  t_attn_task = next.fetch_add(1, std::memory_order_relaxed);
}

thread_local std::vector<float> t_attn_scratch;
thread_local std::vector<int> t_attn_unit0;
thread_local std::vector<int> t_attn_task0;
thread_local std::vector<int64_t> t_attn_first;

// Most query rows one task of attention_blocks walks together: the rows' running and
// partial states ([rows][2][group][head_dim + 2] f32: 128 KiB at 16 rows, 4 heads of 256)
// stay in L2 while each block of keys is read once for all of them. A tier may ask for up
// to kAttnRowBlockMax (TierKernels::attn_row_block).
constexpr int kAttnRowBlock = 16;
constexpr int kAttnRowBlockMax = 32;

// Query rows [r0, r1) of one sequence for KV head g, their chunks walked in order: for
// each chunk, one kernel call computes every row's partial state over it (the keys read
// once for the rows), then each row merges its partial into its running state, in chunk
// order. A row's bits are those of a walk over its chunks alone.
void attention_rows(AttnRowsFn kernel, const AttentionArgs &a, int g, int r0, int r1) {
  begin_attention_task();
  const int group = a.n_head / a.n_head_kv;
  const int D = a.head_dim;
  const int n = r1 - r0;
  const size_t state_floats = size_t(group) * (D + 2);
  thread_local std::vector<float> buf;
  if (buf.size() < 2 * size_t(n) * state_floats) buf.resize(2 * size_t(n) * state_floats);
  auto view = [&](float *base) { return AttnState{base, base + group, base + 2 * group}; };
  auto running = [&](int i) { return buf.data() + size_t(i) * state_floats; };
  auto partial = [&](int i) { return buf.data() + size_t(n + i) * state_floats; };
  float *st[kAttnRowBlockMax];
  int64_t lo0, hi0, lo1, hi1;
  visible(a, r0, &lo0, &hi0);
  visible(a, r1 - 1, &lo1, &hi1);  // kv_begin and the position grow with the row
  for (int64_t c = lo0 / kAttnChunk; c <= hi1 / kAttnChunk; ++c) {
    const int64_t c_lo = c * kAttnChunk, c_hi = c_lo + kAttnChunk - 1;
    for (int i = 0; i < n; ++i) {
      int64_t lo, hi;
      visible(a, r0 + i, &lo, &hi);
      st[i] = c == lo / kAttnChunk ? running(i) : partial(i);
    }
    kernel(a, g, r0, r1, c_lo, c_hi, st);
    for (int i = 0; i < n; ++i) {
      int64_t lo, hi;
      visible(a, r0 + i, &lo, &hi);
      if (c > lo / kAttnChunk && c <= hi / kAttnChunk) merge_state(view(running(i)), view(partial(i)), group, D);
    }
  }
  for (int i = 0; i < n; ++i) finish_state(view(running(i)), a, r0 + i, g, group);
}

// The attention of n_seq sequences (each its own queries, ring and positions; the same
// head geometry) in at most two pool runs. Units are (sequence, query row, KV head).
// Many units: one task per block of up to kAttnRowBlock rows of one sequence and KV head
// walks their chunks together. Few units (decode): one task per (unit, chunk), then one
// task per unit merges its partials in chunk order. Every path gives a unit the same
// bits, whatever the other rows and sequences in the call and the thread count.
void attention_tiled(AttnRowsFn kernel, int row_block, const AttentionArgs *as, int n_seq, ThreadPool &pool) {
  const int group = as[0].n_head / as[0].n_head_kv;
  const int D = as[0].head_dim;
  const size_t state_floats = size_t(group) * (D + 2);
  // The caller's scratch (thread_local, so the tasks hold references to this thread's).
  std::vector<int> &unit0 = t_attn_unit0;  // [n_seq + 1]: first unit of each sequence
  unit0.assign(size_t(n_seq) + 1, 0);
  for (int s = 0; s < n_seq; ++s) unit0[s + 1] = unit0[s] + as[s].n_rows * as[s].n_head_kv;
  const int units = unit0[n_seq];
  if (units >= 2 * pool.n_threads()) {
    // Blocks of b rows: small enough that every thread gets a few tasks (one where the tier
    // takes wider blocks, so that each thread reads a chunk's keys once), at most row_block.
    // Which rows share a task changes no row's bits.
    const int per_thread = row_block > kAttnRowBlock ? 1 : 2;
    const int b = std::clamp(units / (per_thread * pool.n_threads()), 1, row_block);
    std::vector<int> &task0 = t_attn_task0;  // [n_seq + 1]: first task of each sequence
    task0.assign(size_t(n_seq) + 1, 0);
    for (int s = 0; s < n_seq; ++s) task0[s + 1] = task0[s] + as[s].n_head_kv * ((as[s].n_rows + b - 1) / b);
    // The pool hands tasks out in index order, so the last row blocks (the most keys under a
    // causal mask) go first: heaviest first, the short ones fill in at the end. (In row
    // order the longest tasks came last; E4B's sliding-window attention scaled 1.34x from 8
    // to 16 threads on the Xeon.)
    pool.run(task0[n_seq], [&](int task, int) {
      const int s = int(std::upper_bound(task0.begin(), task0.end(), task) - task0.begin()) - 1;
      const int blocks = (as[s].n_rows + b - 1) / b, n_kv = as[s].n_head_kv;
      const int i = task - task0[s];
      const int g = i % n_kv, r0 = (blocks - 1 - i / n_kv) * b;
      attention_rows(kernel, as[s], g, r0, std::min(as[s].n_rows, r0 + b));
    });
    return;
  }
  // Unit u -> (sequence, row, KV head).
  auto locate = [&](int u, int *s, int *r, int *g) {
    // The last sequence whose first unit is <= u: it has units (u < units).
    const int q = int(std::upper_bound(unit0.begin(), unit0.end(), u) - unit0.begin()) - 1;
    *s = q;
    *r = (u - unit0[q]) / as[q].n_head_kv;
    *g = (u - unit0[q]) % as[q].n_head_kv;
  };
  auto view = [&](float *base) { return AttnState{base, base + group, base + 2 * group}; };
  std::vector<int64_t> &first = t_attn_first;  // [units + 1]: first chunk task of each unit
  first.assign(size_t(units) + 1, 0);
  for (int u = 0; u < units; ++u) {
    int s, r, g;
    locate(u, &s, &r, &g);
    int64_t lo, hi;
    visible(as[s], r, &lo, &hi);
    first[u + 1] = first[u] + (hi / kAttnChunk - lo / kAttnChunk + 1);
  }
  std::vector<float> &parts = t_attn_scratch;
  if (parts.size() < size_t(first[units]) * state_floats) parts.resize(size_t(first[units]) * state_floats);
  pool.run(static_cast<int>(first[units]), [&](int task, int) {
    begin_attention_task();
    const int u = int(std::upper_bound(first.begin(), first.end(), int64_t(task)) - first.begin()) - 1;
    int s, r, g;
    locate(u, &s, &r, &g);
    int64_t lo, hi;
    visible(as[s], r, &lo, &hi);
    const int64_t c = lo / kAttnChunk + (task - first[u]);
    float *p = parts.data() + size_t(task) * state_floats;
    kernel(as[s], g, r, r + 1, c * kAttnChunk, c * kAttnChunk + kAttnChunk - 1, &p);
  });
  pool.run(units, [&](int u, int) {
    int s, r, g;
    locate(u, &s, &r, &g);
    AttnState st = view(parts.data() + size_t(first[u]) * state_floats);
    for (int64_t t = first[u] + 1; t < first[u + 1]; ++t) {
      merge_state(st, view(parts.data() + size_t(t) * state_floats), group, D);
    }
    finish_state(st, as[s], r, g, group);
  });
}

}  // namespace

uint64_t attention_task_id() { return t_attn_task; }

void attention(const AttentionArgs &a, ThreadPool &pool) { attention_on_tier(active_isa(), a, pool); }

void attention_on_tier(Isa isa, const AttentionArgs &a, ThreadPool &pool) { attention_seqs_on_tier(isa, &a, 1, pool); }

void attention_seqs(const AttentionArgs *as, int n_seq, ThreadPool &pool) {
  attention_seqs_on_tier(active_isa(), as, n_seq, pool);
}

void attention_seqs_on_tier(Isa isa, const AttentionArgs *as, int n_seq, ThreadPool &pool) {
  if (n_seq <= 0) return;
  const AttentionArgs &a = as[0];
  for (int s = 0; s < n_seq; ++s) {
    GEIST_CHECK((as[s].k_type != KvType::Q8_0 && as[s].v_type != KvType::Q8_0) || as[s].head_dim % 32 == 0,
                "q8_0 KV needs head_dim a multiple of 32");
    GEIST_CHECK(as[s].n_head == a.n_head && as[s].n_head_kv == a.n_head_kv && as[s].head_dim == a.head_dim,
                "attention over sequences of different head geometry");
  }
  const TierKernels *tk = isa_supported(isa) ? tier_kernels(isa) : nullptr;
  if (!tk || !tk->attn_rows || a.head_dim % tk->lanes != 0) {
    for (int s = 0; s < n_seq; ++s) attention_generic(as[s], pool);
    return;
  }
  const int row_block = tk->attn_row_block ? std::clamp(tk->attn_row_block(a), 1, kAttnRowBlockMax) : kAttnRowBlock;
  attention_tiled(tk->attn_rows, row_block, as, n_seq, pool);
}

}  // namespace geist::cpu
