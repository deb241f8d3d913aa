// The CUDA kernel library: a host-callable C++ API over device memory, free of CUDA
// headers (a translation unit that includes this needs no nvcc). The CUDA backend wraps it.
//
// Conventions, for every op below:
// - Tensor pointers are DEVICE pointers unless a comment says "host"; activations are
//   row-major f32, [n_rows][width].
// - Every op enqueues on the given stream and returns at once (asynchronous). The returned
//   Status reports a bad argument (checked on the host before any launch) or the launch
//   error (cudaGetLastError right after the launch); a fault inside a kernel surfaces at the
//   next synchronizing call (stream_sync).
// - Positions that vary per step (pos0) are read from device memory, so a captured CUDA
//   graph can replay a call after the host rewrote that memory.
// - Deterministic and batch invariant: an output row is computed by the same operations in
//   the same order whatever n_rows and whatever the other rows hold (no split-K chosen by
//   size, no atomics, no cuBLAS). Which ops reproduce the CPU generic path bit for bit is
//   said at each op (built with -fmad=false: no contraction of a*b+c into an FMA).
// - Thread safety: the functions hold no state; concurrent calls on different streams are
//   safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "backends/kv_type.h"
#include "base/status.h"
#include "quant/ggml_type.h"

struct CUstream_st;     // CUDA's opaque stream (cudaStream_t is CUstream_st *)
struct CUevent_st;      // CUDA's opaque event (cudaEvent_t)
struct CUgraphExec_st;  // an instantiated CUDA graph (cudaGraphExec_t)

namespace geist::cuda {

using CudaStream = CUstream_st *;  // nullptr = the legacy default stream

// ---- device, memory, streams -------------------------------------------------------------
// Errors are GEIST_E_UNSUPPORTED (no device, driver too old, no kernel image for the
// device), GEIST_E_OUT_OF_MEMORY, GEIST_E_INVALID_ARGUMENT or GEIST_E_INTERNAL, with a
// message "<what>: CUDA error 35 (cudaErrorInsufficientDriver): <CUDA's description>".

struct DeviceInfo {
  int index = 0;
  std::string name;          // "NVIDIA H200"
  int cc_major = 0, cc_minor = 0;
  int driver_version = 0;    // as cudaDriverGetVersion: 1000 * major + 10 * minor
  int runtime_version = 0;   // the runtime this library was linked with, same encoding
  size_t total_mem = 0;      // bytes
  int sm_count = 0;
};

// Number of usable devices; an error (not 0) when the driver is missing or too old.
Result<int> device_count();
// Properties of device `index`; errors as above (no device, bad index).
Result<DeviceInfo> device_info(int index);
// Makes `index` the calling thread's current device.
Status set_device(int index);
// Bytes of device `index` in use by every process (total minus free, cudaMemGetInfo); makes
// it the calling thread's current device.
Result<uint64_t> device_memory_used(int index);
// "NVIDIA H200 (sm_90, 139.8 GiB, driver 13.0, runtime 13.0)"
std::string describe(const DeviceInfo &d);

// cudaMalloc / cudaFree. device_free(nullptr) does nothing.
Result<void *> device_alloc(size_t bytes);
void device_free(void *p);
// Page-locked host memory (cudaMallocHost): asynchronous copies from it do not stage.
Result<void *> host_alloc_pinned(size_t bytes);
void host_free_pinned(void *p);
// Synchronous copies (return when the data has arrived).
Status upload(void *dst_dev, const void *src_host, size_t bytes);
Status download(void *dst_host, const void *src_dev, size_t bytes);
// Asynchronous on s; the host buffer must stay valid until the stream reaches the copy
// (pageable host memory makes the copy synchronous with respect to the host).
Status upload_async(void *dst_dev, const void *src_host, size_t bytes, CudaStream s);
Status download_async(void *dst_host, const void *src_dev, size_t bytes, CudaStream s);
Status copy_async(void *dst_dev, const void *src_dev, size_t bytes, CudaStream s);
// Reads bytes at p (16-byte aligned, a multiple of 16) and discards them (sink: one word
// it writes only by a one-in-2^32 chance): the device's read rate, a copy's other half.
Status read_probe(const void *p, size_t bytes, unsigned *sink, CudaStream s);
Status memset_async(void *dst_dev, int value, size_t bytes, CudaStream s);
// Whether kernels are launched with programmatic dependent launch (common.cuh): false where
// GEIST_CUDA_PDL=0 or the current device is older than sm_90.
bool pdl_enabled();

// A kernel boundary against a grid barrier (CudaOps.DISABLED_PerfBoundary): `steps` dependent
// steps over an n-float vector, ping-ponging between a and b (step 0 reads a), each block of
// `blocks` reading all of the vector and writing its slice. chain_probe launches one kernel
// per step (with programmatic dependent launch, as the model's kernels); barrier_probe runs
// every step in one cooperative kernel with a grid-wide barrier between steps (count: one
// device word it zeroes first; more blocks than fit on the device at once is the launch's
// error). Both give the same bits.
Status chain_probe(float *a, float *b, int n, int steps, int blocks, CudaStream s);
Status barrier_probe(float *a, float *b, int n, int steps, int blocks, unsigned *count, CudaStream s);

// A non-blocking stream of the current device.
Result<CudaStream> stream_create();
void stream_destroy(CudaStream s);
// Waits for everything enqueued on s; reports any error a kernel raised.
Status stream_sync(CudaStream s);
// The pending launch error, if any (cudaGetLastError), named after `what`.
Status last_error(const char *what);
// Events (without timing): a point in a stream that the host can wait for alone, while
// later work of the stream runs on.
using CudaEvent = CUevent_st *;
Result<CudaEvent> event_create();
void event_destroy(CudaEvent e);
Status event_record(CudaEvent e, CudaStream s);
// Waits until the stream has passed the point last recorded; reports any error a kernel
// raised before it.
Status event_sync(CudaEvent e);

// ---- graphs -----------------------------------------------------------------------------------
// Work enqueued on a stream between graph_capture_begin and graph_capture_end is recorded,
// not run (thread-local capture: other threads' CUDA calls are unaffected), and becomes a
// graph that graph_launch replays on any stream with the same pointers and arguments.
using CudaGraph = CUgraphExec_st *;
Status graph_capture_begin(CudaStream s);
// Ends the capture and instantiates the graph. On an error the capture is ended anyway (the
// stream is usable again) and nothing is returned.
Result<CudaGraph> graph_capture_end(CudaStream s);
Status graph_launch(CudaGraph g, CudaStream s);
void graph_destroy(CudaGraph g);

// ---- matmul ---------------------------------------------------------------------------------

// A weight matrix on the device, exactly as stored in GGUF: [n_out] rows of n_in elements in
// blocks of `type` (quant/block_formats.h), row r at data + r * row_bytes. A range of output
// rows [n0, n1) is the view {data + n0 * row_bytes, type, n_in, n1 - n0, row_bytes}.
struct DevMatrix {
  const uint8_t *data = nullptr;
  quant::GgmlType type = quant::GgmlType::F32;
  int64_t n_in = 0;      // K, contiguous
  int64_t n_out = 0;     // N, rows
  size_t row_bytes = 0;  // bytes of one row of n_in elements
};

// How quantized weights meet activations (as cpu::ActivationMode):
//   Q8:  activations quantized per row (quant::act_format: Q8_0 for Q4_0/Q5_0/Q8_0, Q8_K for
//        the K-quants), integer block dots, block scales applied in f32; weight types whose
//        act_format is F32 (F32, F16, BF16, Q4_1, Q5_1) run as in F32 mode.
//   F32: weights dequantized to f32 (quant::dequantize_row's bits) times f32 activations.
enum class ActMode { Q8, F32 };

// F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
bool matmul_supported(quant::GgmlType t);
// Bytes of device scratch matmul needs for up to max_rows rows (the quantized activations;
// 0 when nothing is quantized). The same scratch may serve every matmul of a stream.
size_t matmul_scratch_bytes(const DevMatrix &w, int max_rows);

// y[r][n] = sum_k W[n][k] * x[r][k].  x: [n_rows][w.n_in], y: [n_rows][w.n_out].
// scratch: >= matmul_scratch_bytes(w, n_rows) bytes (may be null when that is 0); in use
// until the stream passes this call. Bits: equal to cpu::matmul_generic in the same mode
// (Q8: quant::quantize_row + dot_unpacked / dot_q8_0_blocks; F32: dequantize_row + the
// 16-lane dot_f32 of ops.cpp), for every type. n_rows <= 65535. Cost: one warp per
// (output, 8 rows), so decode streams the weights once and prefill re-reads them per 8 rows.
Status matmul(const DevMatrix &w, const float *x, float *y, int n_rows, ActMode mode, void *scratch,
              CudaStream s);

// matmul of n_mat matrices over the same x (y_m = W_m x), with matmul's bits; K-quants of one
// K with few rows share one quantization of x and one launch per run of a type.
Status matmul_n(const DevMatrix *ws, float *const *ys, int n_mat, const float *x, int n_rows, ActMode mode,
                void *scratch, CudaStream s);

// Producers that quantize what they write (one launch less per matmul). When
// matmul_n_act_block(ws, ys, n_mat, n_rows) is 32 or 256 (Q8 mode: every matrix takes that
// activation format with one K, and not the reference kernels; 0 otherwise), matmul_n over
// them quantizes x once, and a kernel that produces x may write that quantization into the
// matmul scratch itself; matmul_n_quantized then runs the matrices on it. The same bits as
// the producer followed by matmul_n.
int matmul_n_act_block(const DevMatrix *ws, float *const *ys, int n_mat, int n_rows);
// x [n_rows][K] quantized into scratch as matmul_n quantizes it (act_block 32 or 256).
Status quantize_rows(const float *x, int64_t K, int n_rows, int act_block, void *scratch, CudaStream s);
Status matmul_n_quantized(const DevMatrix *ws, float *const *ys, int n_mat, int n_rows, void *scratch, CudaStream s);
// gelu_mul over n_rows rows of K, and those rows quantized into scratch (act_block 32 or
// 256; scratch: matmul_scratch_bytes of a matrix of K with n_rows).
Status gelu_mul_quantize(const float *gate, const float *up, float *out, int n_rows, int64_t K, int act_block,
                         void *scratch, CudaStream s);

// out[r] = dequant(table row ids[r]) * scale; an id outside [0, table.n_out) gives a zero row
// (Gemma 4's per-layer embeddings). ids: [n] int32 (device), out: [n][table.n_in]; n <= 65535.
// Bits: cpu::embedding_gather's.
Status embed(const DevMatrix &table, const int32_t *ids, int n, float scale, float *out, CudaStream s);

// A decode step's norm before its matmul, folded into the matmul's kernel: the args of a
// one-row rmsnorm_add_norm with out set (x, h, out: [dim], distinct; g, g_next may be null),
// and `count`, a device counter that is 0 and that the kernel leaves 0.
struct NormFold {
  float *x = nullptr;
  const float *g = nullptr;
  float *h = nullptr;
  float h_scale = 1.0f;
  const float *g_next = nullptr;
  float *out = nullptr;
  int64_t dim = 0;
  float eps = 0.0f;
  unsigned *count = nullptr;
};
// Whether matmul_n_norm runs these matrices (one row, K = dim) as one launch: 2 to 4
// matrices of 32-block types (Q4_0, Q5_0, Q8_0) that the one-row matrix-vector kernels take
// (a set: q/k/v, gate/up), dim a multiple of 32 and at most kRmsNormAddNormMaxDim.
bool matmul_n_norm_fits(const DevMatrix *ws, int n_mat, int64_t dim);
// rmsnorm_add_norm(nf, n_vec 1) and then matmul_n of its out in Q8 mode, as one launch:
// every block computes the norms and out's quantization itself (rmsnorm_add_norm_quantize's
// operations in its order), so the matmul does not wait a kernel boundary for them, and the
// block that reads x and h last writes x, h and out. The same bits as the two ops. No
// output may overlap x, h or out (nor they each other).
Status matmul_n_norm(const DevMatrix *ws, float *const *ys, int n_mat, const NormFold &nf, CudaStream s);

// ---- row-wise and elementwise ops -----------------------------------------------------------

// out = x / rms(x) * g per vector of dim (eps inside the root); x, out: [n_vec][dim] (out may
// equal x); g: [dim] or nullptr. The sum of squares is taken in double by a fixed parallel
// tree, so the scale equals cpu::rmsnorm_to's except where the other order of the double
// additions changes its rounding to float (then by one ulp; out within a few ulp).
Status rmsnorm(const float *x, const float *g, float *out, int64_t n_vec, int64_t dim, float eps, CudaStream s);
// rmsnorm, then h += out (h: [n_vec][dim], not aliasing x or out), in one launch; the same
// bits as rmsnorm followed by add_inplace.
Status rmsnorm_add(const float *x, const float *g, float *out, float *h, int64_t n_vec, int64_t dim, float eps,
                   CudaStream s);

// The end of a block and the input norm of the next, in one launch (dim <= 3072; the
// separate ops beyond): x = rmsnorm(x) g in place; h += x; h *= h_scale unless it is 1;
// then, when out is not null, out = rmsnorm(h) g_next (g, g_next may be null). The same
// bits as rmsnorm_add, scale_inplace and rmsnorm in turn. x, h, out: [n_vec][dim], distinct.
Status rmsnorm_add_norm(float *x, const float *g, float *h, float h_scale, const float *g_next, float *out,
                        int64_t n_vec, int64_t dim, float eps, CudaStream s);
constexpr int64_t kRmsNormAddNormMaxDim = 3072;
// rmsnorm_add_norm with out set (dim <= kRmsNormAddNormMaxDim, n_vec <= 65535), and out's
// rows quantized into a matmul scratch for matmul_n_quantized (act_block 32 or 256 dividing
// dim); the same bits as rmsnorm_add_norm and then matmul_n's quantization of out.
Status rmsnorm_add_norm_quantize(float *x, const float *g, float *h, float h_scale, const float *g_next, float *out,
                                 int64_t n_vec, int64_t dim, float eps, int act_block, void *scratch, CudaStream s);

// Per-head RMSNorm, then NEOX RoPE over the whole head, in place, for up to three tensors
// of one step in one launch (Gemma's q, k and v norms): tensor i is x[i] [n_rows][n_heads[i]]
// [head_dim], normalized with g[i] (null: no weight) and rotated with the rows cs when
// rope[i]. The same bits as rmsnorm (dim = head_dim) then rope_neox (rot_dim = head_dim) on
// each; head dims above 512 run those ops. A tensor with norm[i] false is left as it is
// (head_norm_rope_store stores it).
struct HeadNormSet {
  int n = 0;
  float *x[3] = {};
  const float *g[3] = {};
  int n_heads[3] = {};
  bool rope[3] = {};
  bool norm[3] = {true, true, true};
  int ring[3] = {-1, -1, -1};  // head_norm_rope_store: 0 K rings, 1 V rings, -1 none
};
Status head_norm_rope(const HeadNormSet &t, int n_rows, int head_dim, float eps, const float *cs, CudaStream s);

// Rotary embedding, half-split (NEOX) layout, in place: x [n_rows][n_heads][head_dim];
// cs: [n_rows][rot_dim/2][2] (cos, sin), as cpu::RopeTable::fill makes it. Dims >= rot_dim
// pass through. Bits: cpu::rope_neox's.
Status rope_neox(float *x, int n_rows, int n_heads, int head_dim, int rot_dim, const float *cs, CudaStream s);

// out[i] = gelu_tanh(gate[i]) * up[i] with the CPU generic's formula; tanh is evaluated in
// double and rounded once, so it can differ from libm's tanhf by 1 ulp (then out by a few ulp).
Status gelu_mul(const float *gate, const float *up, float *out, int64_t n, CudaStream s);
// gate[r][i] = gelu_tanh(gate[r][i]) * src[r][col0 + i] for i < width, r < n_rows (gate:
// [n_rows][width], src: [n_rows][src_stride]): copy_cols then gelu_mul, in one launch, with
// gelu_mul's bits.
Status gelu_mul_cols(float *gate, int64_t width, const float *src, int64_t src_stride, int64_t col0, int n_rows,
                     CudaStream s);
// x[i] += y[i] (bit-exact)
Status add_inplace(float *x, const float *y, int64_t n, CudaStream s);
// x[i] *= scale (bit-exact)
Status scale_inplace(float *x, float scale, int64_t n, CudaStream s);
// z[i] = (z[i] + t[i]) * scale (bit-exact)
Status add_scale(float *z, const float *t, float scale, int64_t n, CudaStream s);
// x[i] = cap * tanh(x[i] / cap) (tanh as in gelu_mul: within 1 ulp of libm's)
Status softcap(float *x, int64_t n, float cap, CudaStream s);
// out[r] = the greedy token of row r of x [n_rows][width]: base/argmax.h's greedy_argmax (the
// first index of the largest value, NaNs never chosen, a NaN at index 0 kept; every NaN: 0).
// Each row read in kGreedyParts segments (one block each) whose (largest, first index) are
// merged in segment order by a second kernel. scratch: greedy_scratch_bytes(n_rows) of
// device memory. width < 2^31, n_rows <= 65535.
constexpr int kGreedyParts = 64;
size_t greedy_scratch_bytes(int n_rows);
Status greedy_rows(const float *x, int64_t width, int n_rows, int32_t *out, void *scratch, CudaStream s);
// dst[r][0, width) = src[r][col0, col0 + width); src: [n_rows][src_stride], dst: [n_rows][width].
Status copy_cols(const float *src, int64_t src_stride, int64_t col0, float *dst, int64_t width, int n_rows,
                 CudaStream s);

// ---- KV cache rings -------------------------------------------------------------------------
// A ring of `capacity` rows of row_elems elements of KvType t (kv_type.h gives the bytes of
// each type; row_elems a multiple of 32 for q8_0); the row of absolute position p is at slot
// p % capacity, at byte offset slot * kv_row_bytes(t, row_elems). K and V are separate rings
// (their types may differ), so each call below handles one ring.

// Rows src[r] (f32, [n_rows][row_elems]) stored at positions *pos0 + r, converted to t with
// exactly kv_type.h's arithmetic. pos0: one int64 in device memory. n_rows <= capacity.
Status kv_append(KvType t, void *ring, int64_t capacity, int64_t row_elems, const int64_t *pos0, int n_rows,
                 const float *src, CudaStream s);
// Device to device, by position: for p in [from, to), dst slot p % dst_capacity = src slot
// p % src_capacity (the bytes, same type). to - from <= both capacities. (Pin checkpoints.)
Status kv_copy_positions(KvType t, const void *src_ring, int64_t src_capacity, void *dst_ring,
                         int64_t dst_capacity, int64_t row_elems, int64_t from, int64_t to, CudaStream s);
// Ring <-> a dense block, by position: the rows of [from, to) as one block of
// (to - from) * kv_row_bytes(t, row_elems) bytes, in position order. (Snapshots, and saved
// session states.) to - from <= capacity. The block is host memory or device memory (the
// direction follows from the pointers); it must stay valid until the stream passes the call.
Status kv_read_positions(KvType t, const void *ring, int64_t capacity, int64_t row_elems, int64_t from,
                         int64_t to, void *dst, CudaStream s);
Status kv_write_positions(KvType t, void *ring, int64_t capacity, int64_t row_elems, int64_t from, int64_t to,
                          const void *src, CudaStream s);

// ---- attention ------------------------------------------------------------------------------

// Causal, optionally sliding-window, GQA attention for n_rows queries (cpu::AttentionArgs
// with typed rings and pos0 on the device).
struct AttnArgs {
  const float *q = nullptr;   // [n_rows][n_head][head_dim]; query r is at position *pos0 + r
  const void *k = nullptr;    // K ring: [capacity][n_head_kv * head_dim] of k_type
  const void *v = nullptr;    // V ring: the same shape, of v_type
  KvType k_type = KvType::F32, v_type = KvType::F32;
  float *out = nullptr;       // [n_rows][n_head][head_dim]
  int n_rows = 0;
  const int64_t *pos0 = nullptr;  // device: one int64
  int64_t capacity = 0;       // ring rows; must hold every visible key (the last `window`)
  int n_head = 0, n_head_kv = 0, head_dim = 0;  // n_head % n_head_kv == 0; head_dim <= 512
  int window = 0;             // keys [max(0, p - window + 1), p] visible; 0 = [0, p]
  float scale = 1.0f;
  void *scratch = nullptr;    // attention_scratch_bytes(n_head, head_dim, n_rows) bytes: the split kernel
  size_t scratch_bytes = 0;   // its size (0: attention_scratch_bytes(n_head, head_dim), 64 queries' worth)
  // The split kernel is compiled for head dims 64/128/256/512 (K and V of one type) and for
  // any head dim; both give the same bits. true: the any-head-dim one (the tests compare).
  bool any_head_dim = false;
  // From 4 rows of one sequence, a kernel stages each chunk of keys once for 16 query heads;
  // it gives the one-query-per-block kernel's bits. true: that kernel (the tests compare).
  bool single_query = false;
  // attention_counter_bytes(n_head) of device memory, zero before the first call (each call
  // leaves it zero), or null: the one-query split kernel's blocks count themselves in and the
  // last of a query's merges the splits (the merge kernel's bits, one launch fewer). Only one
  // attention at a time may use a set of counters.
  unsigned *merge_counters = nullptr;
  // 32 or 256 (dividing head_dim): the output rows are also quantized into quant_scratch as
  // matmul_n would quantize out for matrices of that activation block (for
  // matmul_n_quantized: one launch less before the output projection). 0: not.
  int quant_block = 0;
  void *quant_scratch = nullptr;
};
// Device scratch the split kernels need for calls of up to n_rows queries: the partials of
// the queries one launch takes (64; the many-queries kernel up to GEIST_CUDA_ATTN_ROWS, default
// 256, when n_rows has them). Any n_rows works with less: the queries then go 64 at a time.
size_t attention_scratch_bytes(int n_head, int head_dim, int n_rows = 1);
// Whether attention_seqs gives a one-sequence call of at least 65 rows (a model's prefill
// chunk; GEIST_CUDA_ATTN_MQ_STEPS_ROWS) to the kernels as a plain call, which lets a prefill
// reach the many-queries kernel (CUDA.md, "The many-queries attention and the model"; E4B
// pp512 on an H200 +15-19 %).
// GEIST_CUDA_ATTN_MQ_STEPS=0: every step passes its sequence table (the one-query kernel).
bool attention_mq_in_steps();
// Bytes of AttnArgs::merge_counters for n_head query heads.
size_t attention_counter_bytes(int n_head);
// With scratch (the fast path): keys in chunks of 64 absolute positions, 8 splits taking
// every 8th chunk with an online softmax each, merged in split order; scores by the CPU's
// 16-lane dot. A query's output depends on the query alone (batch invariant) but is not the
// CPU's bit for bit: the V sums are grouped by chunk (relative error ~ (keys + 600) 2^-24).
// Without scratch, or with GEIST_CUDA_REFERENCE=1, the reference kernel:
// one thread block per (query, head); the exact softmax of the CPU generic path (scores by
// its 16-lane dot, bit-exact; max; exp; sum in double; weighted sum of V in key order per
// dimension). Differs from the CPU only where exp (double, rounded once, vs libm's expf) or
// the double sum's order change the last bit: relative error ~1e-6. Keys in tiles of 2048,
// scores recomputed per pass beyond one tile.
Status attention(const AttnArgs &a, CudaStream s);

// Several sequences (sessions decoding together) in one launch: rows [row0[i], row0[i + 1])
// of the step belong to sequence i, at positions *pos0[i] + (r - row0[i]) of its own rings
// k[i] and v[i] of capacity[i] rows (all of the same types and row width). Each row gets
// exactly what a launch for its sequence alone gives it.
constexpr int kMaxStepSeqs = 16;
struct SeqRings {
  int n = 0;
  int row0[kMaxStepSeqs + 1] = {};
  const int64_t *pos0[kMaxStepSeqs] = {};
  void *k[kMaxStepSeqs] = {};
  void *v[kMaxStepSeqs] = {};
  int64_t capacity[kMaxStepSeqs] = {};
};
// kv_append of rows [0, s.row0[s.n]) of src into each sequence's K rings (v_rings false)
// or V rings (true).
Status kv_append_seqs(KvType t, const SeqRings &s, bool v_rings, int64_t row_elems, const float *src, CudaStream st);
// Both: k_src's rows into the K rings and v_src's into the V rings (one type for both), in
// one launch; the same bytes as the two kv_append_seqs calls.
Status kv_append_kv_seqs(KvType t, const SeqRings &s, int64_t row_elems, const float *k_src, const float *v_src,
                         CudaStream st);
// head_norm_rope, then each tensor i with ring[i] >= 0 (its rows of n_heads[i] x head_dim
// elements) stored into the sequences' K (ring 0) or V (1) rings of type t as kv_append_seqs
// stores it, in one launch: the same values and ring bytes as head_norm_rope and then the
// appends (RoPE then the KV store, fused). head_dim a multiple of 32, at most 512.
Status head_norm_rope_store(const HeadNormSet &hn, int n_rows, int head_dim, float eps, const float *cs, KvType t,
                            const SeqRings &s, CudaStream st);
// The checks of kv_append_seqs on a table (its K rings where k, V rings where v).
Status check_seq_rings(KvType t, const SeqRings &s, int64_t row_elems, bool k, bool v, const char *op);
// attention with the sequences' rings and positions (a's k, v, pos0, capacity are unused;
// a.n_rows must be s.row0[s.n]).
Status attention_seqs(const AttnArgs &a, const SeqRings &s, CudaStream st);

}  // namespace geist::cuda
