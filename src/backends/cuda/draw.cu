// Sampled draws on the device: the top-k candidates of a logits row, then the sampler's
// top-p / min-p / temperature pick (base/draw.h), so a sampling session's step returns its
// token without the 1 MiB row reaching the host, and can be queued like a greedy one.
//
// The candidates are exact: each (value, id) is a 64-bit key that orders as the host's sort
// does (value descending, then id ascending; NaN never a candidate, -0 equal to +0), and
// blocks keep the best k keys of tiles of keys, level by level, until one tile is left.
// Keys are unique, so neither the tiling nor the order of the work changes which candidates
// come out, nor their order. Two ways to keep a tile's best k (DrawAlgo): sort the tile
// with a bitonic network (78 block barriers for 4096 keys) or select them by their bytes,
// most significant first (a radix select: a histogram of the next byte among the keys that
// share the bytes found so far, until the k-th best key is pinned down; ~2 barriers a byte,
// usually 4 bytes), then sort only the k candidates of the last tile, by rank
// (draw_select.cuh, which a host test runs with the block emulated). The pick
// then runs base/draw.h's arithmetic: the weights of the candidates in parallel, the sums
// and the walk in candidate order on one thread, as the host runs them.
#include <cuda_runtime.h>

#include "backends/cuda/common.cuh"
#include "backends/cuda/draw_kernels.h"
#include "backends/cuda/draw_select.cuh"

namespace geist::cuda {
namespace {

using sel::id_of;
using sel::key_of;
using sel::kMaxK;
using sel::kThreads;
using sel::kTile;

// s[0, kTile) sorted descending (a bitonic network: each thread one compare per pair of
// its stride, a barrier between strides).
__device__ void sort_desc(uint64_t *s) {
  for (int size = 2; size <= kTile; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int t = threadIdx.x; t < kTile / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        const uint64_t a = s[i], b = s[j];
        const bool desc = (i & size) == 0;
        if ((a < b) == desc) {
          s[i] = b;
          s[j] = a;
        }
      }
    }
  }
  __syncthreads();
}

// Block (tile, row): the best k keys of elements [tile * kTile, ...) of a sampled row, to
// out[row][tile * k ...].
__global__ void __launch_bounds__(kThreads)
    topk_tiles_kernel(const float *__restrict__ x, int64_t width, const DrawSpec *__restrict__ specs, int k,
                      uint64_t *__restrict__ out) {
  __shared__ uint64_t s[kTile];
  dev::pdl_start();
  if (!(specs[blockIdx.y].temperature > 0.0f)) return;  // not a sampled row
  const float *row = x + size_t(blockIdx.y) * size_t(width);
  const int64_t base = int64_t(blockIdx.x) * kTile;
  for (int t = threadIdx.x; t < kTile; t += kThreads) {
    const int64_t j = base + t;
    s[t] = j < width ? key_of(row[j], uint32_t(j)) : 0;
  }
  sort_desc(s);
  uint64_t *o = out + (size_t(blockIdx.y) * gridDim.x + blockIdx.x) * size_t(k);
  for (int t = threadIdx.x; t < k; t += kThreads) o[t] = s[t];
}

// Loads keys [blockIdx.x * kTile, ...) of in's row (m keys a row) and sorts them.
__device__ void load_sorted(const uint64_t *in, int m, uint64_t *s) {
  const uint64_t *r = in + size_t(blockIdx.y) * size_t(m);
  const int base = int(blockIdx.x) * kTile;
  for (int t = threadIdx.x; t < kTile; t += kThreads) s[t] = base + t < m ? r[base + t] : 0;
  sort_desc(s);
}

// Block (tile, row): the best k of a tile of the row's m keys, to out[row][tile * k ...].
__global__ void __launch_bounds__(kThreads)
    topk_merge_kernel(const uint64_t *__restrict__ in, int m, const DrawSpec *__restrict__ specs, int k,
                      uint64_t *__restrict__ out) {
  __shared__ uint64_t s[kTile];
  dev::pdl_start();
  if (!(specs[blockIdx.y].temperature > 0.0f)) return;
  load_sorted(in, m, s);
  uint64_t *o = out + (size_t(blockIdx.y) * gridDim.x + blockIdx.x) * size_t(k);
  for (int t = threadIdx.x; t < k; t += kThreads) o[t] = s[t];
}

// Block (0, row): the row's m <= kTile keys sorted, its top_k candidates, the pick.
__global__ void __launch_bounds__(kThreads)
    draw_pick_kernel(const float *__restrict__ x, int64_t width, const uint64_t *__restrict__ in, int m,
                     const DrawSpec *__restrict__ specs, int32_t *__restrict__ out) {
  __shared__ uint64_t s[kTile];
  __shared__ float cv[kMaxK];
  __shared__ int ci[kMaxK];
  __shared__ double pr[kMaxK], w[kMaxK];
  __shared__ int n_sh;
  dev::pdl_start();
  const DrawSpec d = specs[blockIdx.y];
  if (!(d.temperature > 0.0f)) return;
  if (threadIdx.x == 0) n_sh = 0;
  load_sorted(in, m, s);  // its barriers order n_sh's first write before the ones below
  const int k = d.top_k < 0 ? 0 : (d.top_k > kMaxK ? kMaxK : (d.top_k > m ? m : d.top_k));
  const float *row = x + size_t(blockIdx.y) * size_t(width);
  // The candidates: keys are unique and every padding key is 0, so the real ones come
  // first; the thread of the last one writes their count (no thread where there is none).
  for (int t = threadIdx.x; t < k; t += kThreads) {
    const uint64_t key = s[t];
    if (key != 0) {
      ci[t] = int(id_of(key));
      cv[t] = row[id_of(key)];
      if (t + 1 == k || s[t + 1] == 0) n_sh = t + 1;
    }
  }
  __syncthreads();
  const int n = n_sh;
  if (n == 0) {
    if (threadIdx.x == 0) out[blockIdx.y] = 0;  // no number in the row: what the host draws
    return;
  }
  const float mx = cv[0];
  for (int t = threadIdx.x; t < n; t += kThreads) {
    pr[t] = draw::weight(cv[t], mx);
    w[t] = draw::weight_t(cv[t], mx, d.temperature);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const double *wp = w;
    out[blockIdx.y] = ci[draw::pick(pr, [wp](int i) { return wp[i]; }, n, d.top_p, d.min_p, d.u)];
  }
}

// Block (tile, row): the best keys of elements [tile * kTile, ...) of a sampled row (at most
// its top_k of them, the rest 0) to out[row][tile * k ...] (draw_select.cuh).
__global__ void __launch_bounds__(kThreads)
    select_tiles_kernel(const float *__restrict__ x, int64_t width, const DrawSpec *__restrict__ specs, int k,
                        uint64_t *__restrict__ out) {
  __shared__ sel::TileSmem sm;
  dev::pdl_start();
  const DrawSpec &d = specs[blockIdx.y];
  if (!(d.temperature > 0.0f)) return;  // not a sampled row
  sel::tile_best(x + size_t(blockIdx.y) * size_t(width), width, int(blockIdx.x), sel::wanted(d, k), k,
                 out + (size_t(blockIdx.y) * gridDim.x + blockIdx.x) * size_t(k), sm);
}

// Block (tile, row): the best keys of a tile of the row's m keys, as select_tiles_kernel.
__global__ void __launch_bounds__(kThreads)
    select_merge_kernel(const uint64_t *__restrict__ in, int m, const DrawSpec *__restrict__ specs, int k,
                        uint64_t *__restrict__ out) {
  __shared__ sel::TileSmem sm;
  dev::pdl_start();
  const DrawSpec &d = specs[blockIdx.y];
  if (!(d.temperature > 0.0f)) return;
  sel::keys_best(in + size_t(blockIdx.y) * size_t(m), m, int(blockIdx.x), sel::wanted(d, k), k,
                 out + (size_t(blockIdx.y) * gridDim.x + blockIdx.x) * size_t(k), sm);
}

// Block (0, row): the row's candidates among its m <= kTile keys, sorted, and the pick.
__global__ void __launch_bounds__(kThreads)
    select_pick_kernel(const float *__restrict__ x, int64_t width, const uint64_t *__restrict__ in, int m,
                       const DrawSpec *__restrict__ specs, int k, int32_t *__restrict__ out) {
  __shared__ sel::PickSmem sm;
  dev::pdl_start();
  const DrawSpec d = specs[blockIdx.y];
  if (!(d.temperature > 0.0f)) return;
  sel::pick(x + size_t(blockIdx.y) * size_t(width), in + size_t(blockIdx.y) * size_t(m), m, d, k, out + blockIdx.y,
            sm);
}

int tiles_of(int64_t n) { return int((n + kTile - 1) / kTile); }

}  // namespace

size_t sample_scratch_bytes(int64_t width, int n_rows, int k) {
  if (width <= 0 || n_rows <= 0 || k <= 0) return 0;
  // Two buffers of the first level's keys (the largest), used in turn by the levels.
  return 2 * size_t(n_rows) * size_t(tiles_of(width)) * size_t(k) * sizeof(uint64_t);
}

Status sample_rows(const float *x, int64_t width, int n_rows, const DrawSpec *specs, int k, int32_t *out,
                   void *scratch, CudaStream s, DrawAlgo algo) {
  if (n_rows < 0 || n_rows > 65535 || width <= 0 || width > 0x7FFFFFFF) return bad_arg("cuda::sample_rows: bad shape");
  if (k < 1 || k > kMaxK) return bad_arg("cuda::sample_rows: k out of [1, 256]");
  if (n_rows == 0) return Status::ok();
  if (x == nullptr || specs == nullptr || out == nullptr || scratch == nullptr) {
    return bad_arg("cuda::sample_rows: null pointer");
  }
  const bool select = algo == DrawAlgo::kSelect;
  // The levels' kernels of either way take the same arguments; the picks differ by k.
  auto *const tiles_kernel = select ? select_tiles_kernel : topk_tiles_kernel;
  auto *const merge_kernel = select ? select_merge_kernel : topk_merge_kernel;
  const int t1 = tiles_of(width);
  auto *a = static_cast<uint64_t *>(scratch);
  uint64_t *b = a + size_t(n_rows) * size_t(t1) * size_t(k);
  launch(tiles_kernel, dim3(unsigned(t1), unsigned(n_rows)), kThreads, s, x, width, specs, k, a);
  if (Status st = launch_status("cuda::sample_rows"); !st.is_ok()) return st;
  int m = t1 * k;  // keys a row in a
  while (m > kTile) {
    const int t = tiles_of(m);
    launch(merge_kernel, dim3(unsigned(t), unsigned(n_rows)), kThreads, s, static_cast<const uint64_t *>(a), m, specs,
           k, b);
    if (Status st = launch_status("cuda::sample_rows"); !st.is_ok()) return st;
    m = t * k;
    uint64_t *c = a;
    a = b;
    b = c;
  }
  if (select) {
    launch(select_pick_kernel, dim3(1, unsigned(n_rows)), kThreads, s, x, width, static_cast<const uint64_t *>(a), m,
           specs, k, out);
  } else {
    launch(draw_pick_kernel, dim3(1, unsigned(n_rows)), kThreads, s, x, width, static_cast<const uint64_t *>(a), m,
           specs, out);
  }
  return launch_status("cuda::sample_rows");
}

}  // namespace geist::cuda
