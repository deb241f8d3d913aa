// Microbenchmarks of the CPU kernels (Google Benchmark). Each reports, besides time:
//   GB/s    weight bytes streamed per second (what bounds decode), and
//   GOP/s   multiply-adds x 2 per second (what bounds prefill),
// and the two "peak" benchmarks measure the machine itself: read bandwidth over a buffer
// far larger than the caches, and the int8 dot-product rate of independent VNNI (or
// AVX2 maddubs) chains. Run: build/release/bench/kernels_bench [--benchmark_filter=...]
// GEIST_BENCH_THREADS=N (default 2) sets the pool; docs/KERNELS.md has the numbers.
#include <benchmark/benchmark.h>
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/isa.h"
#include "backends/cpu/kv_rows.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/packed.h"
#include "base/thread_pool.h"
#include "quant/ggml_type.h"
#include "test_util.h"

namespace {

using geist::ThreadPool;
using geist::WeightView;
using geist::quant::GgmlType;
namespace cpu = geist::cpu;

int bench_threads() {
  const char *e = std::getenv("GEIST_BENCH_THREADS");
  return e ? std::max(1, std::atoi(e)) : 2;
}

ThreadPool &pool() {
  static ThreadPool p(bench_threads());
  return p;
}

// A random matrix of n_out x K, packed for the tier in use (kept for the whole run).
struct Matrix {
  std::vector<uint8_t> data;
  WeightView w;
  cpu::PackedStore store;
};

Matrix *matrix(GgmlType t, int64_t K, int64_t N) {
  static std::vector<std::unique_ptr<Matrix>> cache;
  for (auto &m : cache)
    if (m->w.type == t && m->w.n_in == K && m->w.n_out == N) return m.get();
  auto m = std::make_unique<Matrix>();
  std::mt19937 rng(1);
  const size_t rb = geist::quant::row_bytes(t, K);
  std::vector<uint8_t> row = geist::test::random_row(t, K, rng);
  m->data.resize(rb * N);
  for (int64_t n = 0; n < N; ++n) {
    if (n % 64 == 0) row = geist::test::random_row(t, K, rng);
    std::memcpy(m->data.data() + n * rb, row.data(), rb);
  }
  m->w = WeightView{m->data.data(), t, K, N, rb};
  cpu::pack_weight(&m->w, &m->store);
  cache.push_back(std::move(m));
  return cache.back().get();
}

// args: type, K, N, rows
void BM_Matmul(benchmark::State &st) {
  const auto t = static_cast<GgmlType>(st.range(0));
  const int64_t K = st.range(1), N = st.range(2);
  const int rows = static_cast<int>(st.range(3));
  Matrix *m = matrix(t, K, N);
  std::vector<float> x(size_t(rows) * K), y(size_t(rows) * N);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  for (float &v : x) v = nd(rng);
  for (auto _ : st) {
    cpu::matmul(m->w, x.data(), y.data(), rows, pool());
    benchmark::ClobberMemory();
  }
  const double bytes = double(m->data.size());
  st.counters["GB/s"] = benchmark::Counter(bytes * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  st.counters["GOP/s"] =
      benchmark::Counter(2.0 * K * N * rows * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  st.SetLabel(std::string(geist::quant::traits(t).name) + " " + cpu::isa_name(cpu::active_isa()) +
              (m->w.packed ? " packed" : ""));
}

void matmul_args(benchmark::internal::Benchmark *b) {
  // The default model's matrices: Q5_0 640->2048 (ffn gate/up), Q4_K / Q6_K 2048->640
  // (ffn down), Q8_0 640->262144 (the tied output head, decode only).
  for (int rows : {1, 16, 128, 512}) {
    b->Args({int(GgmlType::Q5_0), 640, 2048, rows});
    b->Args({int(GgmlType::Q4_0), 640, 2048, rows});
    b->Args({int(GgmlType::Q8_0), 640, 2048, rows});
    b->Args({int(GgmlType::Q4_K), 2048, 640, rows});
    b->Args({int(GgmlType::Q5_K), 2048, 640, rows});
    b->Args({int(GgmlType::Q6_K), 2048, 640, rows});
  }
  for (int rows : {1, 16, 128, 512}) {  // the other GGUF types (Q2_K/Q3_K mixes, Q4_1/Q5_1 files)
    b->Args({int(GgmlType::Q2_K), 2048, 640, rows});
    b->Args({int(GgmlType::Q3_K), 2048, 640, rows});
    b->Args({int(GgmlType::Q4_1), 640, 2048, rows});
    b->Args({int(GgmlType::Q5_1), 640, 2048, rows});
  }
  for (int rows : {1, 16, 128}) {  // float weights (tiny test models, F16/BF16 GGUFs)
    b->Args({int(GgmlType::F32), 640, 2048, rows});
    b->Args({int(GgmlType::F16), 640, 2048, rows});
    b->Args({int(GgmlType::BF16), 640, 2048, rows});
  }
  b->Args({int(GgmlType::Q8_0), 640, 262144, 1});
  b->Args({int(GgmlType::F16), 640, 262144, 1});
  b->Args({int(GgmlType::Q6_K), 768, 262144, 1});
}
BENCHMARK(BM_Matmul)->Apply(matmul_args)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Gemma 4 E4B's widest matrices at prefill rows (K = 2560 gate/up, K = 10240 down): what a
// 16-core host's prefill spends most of its time in. Filter with --benchmark_filter=Wide.
void matmul_wide_args(benchmark::internal::Benchmark *b) {
  for (int rows : {64, 512}) {
    b->Args({int(GgmlType::Q4_K), 2560, 10240, rows});
    b->Args({int(GgmlType::Q6_K), 10240, 2560, rows});
  }
}
void BM_MatmulWide(benchmark::State &st) { BM_Matmul(st); }
BENCHMARK(BM_MatmulWide)->Apply(matmul_wide_args)->UseRealTime()->Unit(benchmark::kMillisecond);

// args: rows, cached positions before them, window (0 global). Gemma 3 270M geometry:
// 4 query heads, 1 KV head, head_dim 256.
void BM_Attention(benchmark::State &st) {
  const int rows = int(st.range(0));
  const int64_t depth = st.range(1);
  const int window = int(st.range(2));
  const int H = 4, HKV = 1, D = 256;
  const int64_t cap = window > 0 ? window + rows : depth + rows;
  std::vector<float> q(size_t(rows) * H * D), k(size_t(cap) * HKV * D), v(k.size()), out(q.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto *vec : {&q, &k, &v})
    for (float &x : *vec) x = nd(rng);
  cpu::AttentionArgs a{q.data(), k.data(), v.data(), out.data(), rows, depth, cap, H, HKV, D, window, 0.0625f};
  double keys = 0;
  for (int r = 0; r < rows; ++r) {
    const int64_t p = depth + r;
    keys += double(window > 0 ? std::min<int64_t>(window, p + 1) : p + 1);
  }
  for (auto _ : st) {
    cpu::attention(a, pool());
    benchmark::ClobberMemory();
  }
  st.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * keys * H * D * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Attention)
    ->Args({512, 0, 512})
    ->Args({512, 0, 0})
    ->Args({1, 8192, 0})
    ->Args({64, 8192, 0})
    ->Args({1, 8192, 512})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// args: KV type (geist::KvType, of K and V), rows, cached positions before them. The same
// geometry over typed rings (every key block read to f32 once per block of rows, attn_impl.h); GB/s counts the
// ring bytes each query reads.
void BM_AttentionKv(benchmark::State &st) {
  const auto t = geist::KvType(st.range(0));
  const int rows = int(st.range(1));
  const int64_t depth = st.range(2);
  const int H = 4, HKV = 1, D = 256;
  const int64_t cap = depth + rows, row = int64_t(HKV) * D;
  std::vector<float> q(size_t(rows) * H * D), kf(size_t(cap * row)), vf(kf.size()), out(q.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto *vec : {&q, &kf, &vf})
    for (float &x : *vec) x = nd(rng);
  std::vector<uint8_t> k(size_t(cap) * geist::kv_row_bytes(t, row)), v(k.size());
  cpu::kv_store_rows(t, kf.data(), cap, row, k.data());
  cpu::kv_store_rows(t, vf.data(), cap, row, v.data());
  cpu::AttentionArgs a{q.data(), k.data(), v.data(), out.data(), rows, depth, cap, H, HKV, D, 0, 0.0625f, t, t};
  double keys = 0;
  for (int r = 0; r < rows; ++r) keys += double(depth + r + 1);
  for (auto _ : st) {
    cpu::attention(a, pool());
    benchmark::ClobberMemory();
  }
  st.counters["GFLOP/s"] =
      benchmark::Counter(4.0 * keys * H * D * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  st.counters["GB/s"] = benchmark::Counter(2.0 * keys * geist::kv_row_bytes(t, row) * st.iterations() / 1e9,
                                           benchmark::Counter::kIsRate);
}
void attention_kv_args(benchmark::internal::Benchmark *b) {
  for (int t = 0; t < 4; ++t) {
    b->Args({t, 1, 4095});   // decode at 4096 keys
    b->Args({t, 64, 4032});  // a chunk of 64 rows ending at 4096
    b->Args({t, 1, 8191});   // and at 8192 (a global layer of pp64 / tg16 at depth 8192)
    b->Args({t, 64, 8128});
  }
}
BENCHMARK(BM_AttentionKv)->Apply(attention_kv_args)->UseRealTime()->Unit(benchmark::kMicrosecond);

// Peak read bandwidth: sum a 1 GiB buffer, in chunks claimed by the pool's threads, with the widest
// loads the CPU has (512- or 256-bit, 4 independent accumulators; else 64-bit adds).
__attribute__((target("avx512f"))) uint64_t sum_avx512(const uint64_t *p, size_t n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 24));
  }
  // Lanes summed through memory: GCC 12's _mm512_reduce_* warn (bug 105593) under -Werror.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t s = 0;
  for (uint64_t x : lanes) s += x;
  return s;
}

// 256-bit loads for AVX2-only CPUs (Zen 2/3, pre-Alder-Lake Intel): the scalar loop below
// issues 8-byte loads and, on two cores of a Zen 3, read 16.2 GB/s where a 256-bit loop
// reads 22.3 GB/s (issue 15): it measured its own load rate, not the memory's.
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint64_t *p, size_t n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i *>(lanes), _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t sum_scalar(const uint64_t *p, size_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 4 <= n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  return s0 + s1 + s2 + s3;
}

// Fraction of [p, p + bytes) that the kernel backs with transparent huge pages: the
// AnonHugePages of the mappings that overlap it (/proc/self/smaps); -1 if unreadable.
double huge_page_fraction(const void *p, size_t bytes) {
  FILE *f = std::fopen("/proc/self/smaps", "r");
  if (!f) return -1;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
  char line[512], perms[8];
  unsigned long m_lo = 0, m_hi = 0;
  bool in = false;
  double kib = 0, v = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "%lx-%lx %7s", &m_lo, &m_hi, perms) == 3) {  // a mapping's header line
      in = m_lo < hi && m_hi > lo;
    } else if (in && std::sscanf(line, "AnonHugePages: %lf kB", &v) == 1) {
      kib += v;
    }
  }
  std::fclose(f);
  return kib * 1024 / double(bytes);
}

// The bound that decode speed is compared against (docs/BENCH.md). Choices, each measured
// on the 2-vCPU AMD EPYC (Zen 5, family 26) with the variants' repetitions randomly
// interleaved, quiet machine (GB/s, 1 thread / 2 threads):
// - The buffer comes from PackedStore::allocate, the packed weights' own allocator (2 MiB
//   aligned, MADV_HUGEPAGE): on 4 KiB pages (a std::vector) every 4 KiB of the stream is a
//   TLB miss and the prefetchers stop at each page: 35-37 / 73-75 against 41-42 / 81-85.
// - It is first touched on the pool (on a NUMA machine its pages land near the readers;
//   here, one node, the same as touching it on one thread).
// - 64 chunks of 16 MiB are claimed from the pool, not one half per thread: a thread that
//   starts late leaves its chunks to the others instead of reading its half alone at the
//   end. worker_share is the fraction of chunks the pool's other threads read:
//   (T - 1) / T when all T ran throughout (0.49-0.51 at 2 threads here).
// - No software prefetch and 4 accumulators: prefetching 256 or 512 bytes ahead and 8
//   accumulators were within the noise with 512-bit loads, and 512 bytes ahead cost the
//   AVX2 loop 15 % (34 against 40 at 1 thread).
// On this VM the 2-thread figure also moves with the host: for minutes at a time it reads
// 40-50 instead of 75-85 with both threads busy throughout (worker_share 0.5), so compare
// decode against a probe run in the same minutes.
void BM_PeakReadBandwidth(benchmark::State &st) {
  constexpr size_t kBytes = size_t(1) << 30, kWords = kBytes / 8;
  constexpr int kChunks = 64;
  constexpr size_t kChunkWords = kWords / kChunks;
  static cpu::PackedStore store;
  static uint64_t *buf = nullptr;  // [kWords], all ones, 2 MiB aligned
  if (!buf) {
    buf = reinterpret_cast<uint64_t *>(store.allocate(kBytes));
    pool().run(kChunks,
               [](int c, int) { std::fill_n(buf + c * kChunkWords, kChunkWords, uint64_t(1)); });
  }
  std::vector<uint64_t> sums(size_t(kChunks) * 8);  // one cache line per chunk
  std::vector<uint8_t> by_worker(kChunks);  // whether a thread other than the caller read it
  // The widest loads of the tier in use (GEIST_ISA=avx2 measures the AVX2 loop on any CPU).
  const bool w512 = cpu::active_isa() == cpu::Isa::Avx512,
             w256 = w512 || cpu::active_isa() == cpu::Isa::Avx2 || cpu::active_isa() == cpu::Isa::Avx2Vnni;
  double worker_chunks = 0;
  for (auto _ : st) {
    pool().run(kChunks, [&](int c, int thread) {
      const uint64_t *p = buf + c * kChunkWords;
      sums[size_t(c) * 8] = w512   ? sum_avx512(p, kChunkWords)
                            : w256 ? sum_avx2(p, kChunkWords)
                                   : sum_scalar(p, kChunkWords);
      by_worker[c] = thread != 0;
    });
    benchmark::DoNotOptimize(sums.data());
    for (uint8_t w : by_worker) worker_chunks += w;
  }
  st.counters["GB/s"] =
      benchmark::Counter(double(kBytes) * st.iterations() / 1e9, benchmark::Counter::kIsRate);
  st.counters["huge_pages"] = huge_page_fraction(buf, kBytes);
  st.counters["worker_share"] = worker_chunks / (double(kChunks) * double(st.iterations()));
}
BENCHMARK(BM_PeakReadBandwidth)->UseRealTime()->Unit(benchmark::kMillisecond);

// The machine's peaks: 12 independent chains c = OP(c, X, Y) per thread on registers. The
// chains are named variables, each an operand of the empty asm: kept in an array, GCC moved
// part of it through the stack every iteration and the int8 loop measured store-forwarding,
// not VNNI (416 GOP/s per thread on the 2-core Zen 5, below what the Q4_K matmul itself
// reaches). One body, expanded inside each function so that it takes the function's target.
#define GEIST_PEAK_CHAINS(V, OP, X, Y)                                                                      \
  const V x = X, y = Y;                                                                                \
  V c0 = y, c1 = y, c2 = y, c3 = y, c4 = y, c5 = y, c6 = y, c7 = y, c8 = y, c9 = y, c10 = y, c11 = y;  \
  for (int64_t it = 0; it < iters; ++it) {                                                             \
    c0 = OP(c0, x, y);                                                                                 \
    c1 = OP(c1, x, y);                                                                                 \
    c2 = OP(c2, x, y);                                                                                 \
    c3 = OP(c3, x, y);                                                                                 \
    c4 = OP(c4, x, y);                                                                                 \
    c5 = OP(c5, x, y);                                                                                 \
    c6 = OP(c6, x, y);                                                                                 \
    c7 = OP(c7, x, y);                                                                                 \
    c8 = OP(c8, x, y);                                                                                 \
    c9 = OP(c9, x, y);                                                                                 \
    c10 = OP(c10, x, y);                                                                               \
    c11 = OP(c11, x, y);                                                                               \
    __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5), "+v"(c6), "+v"(c7), \
                     "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11));                                        \
  }                                                                                                    \
  const V all[12] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11};                                \
  int64_t differ = 0;                                                                                  \
  for (const V &v : all) differ += std::memcmp(&v, &x, sizeof(V)) != 0;                                \
  return differ;

// Runs loop(iters) on every pool thread at once per iteration; `counter` is the rate of
// ops_per_iter operations per loop iteration and thread, in G per second.
template <class Loop>
void run_peak(benchmark::State &st, Loop loop, int64_t iters, double ops_per_iter, const char *counter) {
  std::vector<int64_t> out(64);
  for (auto _ : st) {
    pool().run(pool().n_threads(), [&](int task, int) { out[task] = loop(iters); });
    benchmark::DoNotOptimize(out.data());
  }
  st.counters[counter] = benchmark::Counter(ops_per_iter * double(iters) * pool().n_threads() * st.iterations() / 1e9,
                                            benchmark::Counter::kIsRate);
}

// int8: 512-bit VNNI dot products (64 multiply-adds each).
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t vnni_loop(int64_t iters) {
  GEIST_PEAK_CHAINS(__m512i, _mm512_dpbusd_epi32, _mm512_set1_epi8(3), _mm512_set1_epi8(5))
}

void BM_PeakInt8(benchmark::State &st) {
  if (cpu::best_isa() != cpu::Isa::Avx512) {
    st.SkipWithError("no AVX-512 VNNI on this CPU");
    return;
  }
  run_peak(st, vnni_loop, int64_t(1) << 22, 2.0 * 64 * 12, "GOP/s");
}
BENCHMARK(BM_PeakInt8)->UseRealTime()->Unit(benchmark::kMillisecond);

// int8 on AMX tiles (Sapphire Rapids and later): what a tile kernel could reach where the
// CPU has AMX-INT8. Four 16 x 16 int32 accumulator tiles, each TDPBSSD 16 x 16 x 64
// multiply-adds from two A and two B tiles loaded once. Linux hands out the tile state only
// after the process asks for it (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA).
bool amx_int8_usable() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || (d & (1u << 24)) == 0 || (d & (1u << 25)) == 0) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || (c & (1u << 27)) == 0) return false;  // OSXSAVE
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA enabled by the OS
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return ok;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile,amx-int8"))) int64_t amx_loop(int64_t iters) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
  alignas(64) int8_t src[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) src[i] = int8_t(i % 7 - 3);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  alignas(64) int32_t c[16 * 16];
  _tile_stored(0, c, 64);
  _tile_release();
  return c[0];
}

void BM_PeakAmxInt8(benchmark::State &st) {
  if (!amx_int8_usable()) {
    st.SkipWithError("no AMX-INT8 on this CPU (or the OS gives no tile state)");
    return;
  }
  run_peak(st, amx_loop, int64_t(1) << 18, 2.0 * 16 * 16 * 64 * 4, "GOP/s");
}
BENCHMARK(BM_PeakAmxInt8)->UseRealTime()->Unit(benchmark::kMillisecond);

// f32: FMAs, 512-bit where the CPU has AVX-512, else 256-bit: what bounds the attention's
// f32 scores and sums.
__attribute__((target("avx512f"))) int64_t fma512_loop(int64_t iters) {
  GEIST_PEAK_CHAINS(__m512, _mm512_fmadd_ps, _mm512_set1_ps(0.999f), _mm512_set1_ps(1e-4f))
}
__attribute__((target("avx2,fma"))) int64_t fma256_loop(int64_t iters) {
  GEIST_PEAK_CHAINS(__m256, _mm256_fmadd_ps, _mm256_set1_ps(0.999f), _mm256_set1_ps(1e-4f))
}
#undef GEIST_PEAK_CHAINS

void BM_PeakF32(benchmark::State &st) {
  const bool w512 = cpu::best_isa() == cpu::Isa::Avx512;
  if (!w512 && cpu::best_isa() == cpu::Isa::Generic) {
    st.SkipWithError("no AVX2/FMA on this CPU");
    return;
  }
  run_peak(st, w512 ? fma512_loop : fma256_loop, int64_t(1) << 22, 2.0 * (w512 ? 16 : 8) * 12, "GFLOP/s");
  st.SetLabel(w512 ? "512-bit" : "256-bit");
}
BENCHMARK(BM_PeakF32)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
