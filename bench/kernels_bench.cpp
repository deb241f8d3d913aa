// Microbenchmarks of the CPU kernels (Google Benchmark). Each reports, besides time:
//   GB/s    weight bytes streamed per second (what bounds decode), and
//   GOP/s   multiply-adds x 2 per second (what bounds prefill),
// and the two "peak" benchmarks measure the machine itself: read bandwidth over a buffer
// far larger than the caches, and the int8 dot-product rate of independent VNNI (or
// AVX2 maddubs) chains. Run: build/release/bench/kernels_bench [--benchmark_filter=...]
// GEIST_BENCH_THREADS=N (default 2) sets the pool; docs/KERNELS.md has the numbers.
#include <benchmark/benchmark.h>
#include <immintrin.h>

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

// Peak read bandwidth: sum a 1 GiB buffer, split over the pool's threads, with the widest
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

void BM_PeakReadBandwidth(benchmark::State &st) {
  const size_t n = size_t(1) << 27;  // 2^27 uint64 = 1 GiB
  static std::vector<uint64_t> buf(n, 1);
  std::vector<uint64_t> sums(size_t(pool().n_threads()) * 8);  // one cache line per task
  // The widest loads of the tier in use (GEIST_ISA=avx2 measures the AVX2 loop on any CPU).
  const bool w512 = cpu::active_isa() == cpu::Isa::Avx512,
             w256 = w512 || cpu::active_isa() == cpu::Isa::Avx2 || cpu::active_isa() == cpu::Isa::Avx2Vnni;
  for (auto _ : st) {
    const int T = pool().n_threads();
    pool().run(T, [&](int task, int) {
      const size_t lo = n / T * task, len = n / T;
      sums[size_t(task) * 8] = w512   ? sum_avx512(buf.data() + lo, len)
                               : w256 ? sum_avx2(buf.data() + lo, len)
                                      : sum_scalar(buf.data() + lo, len);
    });
    benchmark::DoNotOptimize(sums.data());
  }
  st.counters["GB/s"] = benchmark::Counter(double(n) * 8 * st.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PeakReadBandwidth)->UseRealTime()->Unit(benchmark::kMillisecond);

// Peak int8 rate: 12 independent chains of 512-bit VNNI dot products per thread
// (64 multiply-adds each), on registers only.
__attribute__((target("avx512f,avx512bw,avx512vnni"))) int64_t vnni_loop(int64_t iters) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  for (int64_t it = 0; it < iters; ++it) {
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
    __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]), "+v"(acc[4]), "+v"(acc[5]));
  }
  int64_t s = 0;
  for (int i = 0; i < 12; ++i) {
    alignas(64) int32_t lanes[16];
    _mm512_store_si512(lanes, acc[i]);
    for (int32_t x : lanes) s += x;
  }
  return s;
}

void BM_PeakInt8(benchmark::State &st) {
  if (cpu::best_isa() != cpu::Isa::Avx512) {
    st.SkipWithError("no AVX-512 VNNI on this CPU");
    return;
  }
  const int64_t iters = 1 << 22;
  std::vector<int64_t> out(64);
  for (auto _ : st) {
    pool().run(pool().n_threads(), [&](int task, int) { out[task] = vnni_loop(iters); });
    benchmark::DoNotOptimize(out.data());
  }
  st.counters["GOP/s"] = benchmark::Counter(2.0 * 64 * 12 * iters * pool().n_threads() * st.iterations() / 1e9,
                                            benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PeakInt8)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
