// CUDA kernels (backends/cuda/kernels.h) against the CPU generic oracle, in the style of
// llama.cpp's test-backend-ops: every op and every weight/KV type over ragged shapes, seeded
// random inputs, bit-exact (memcmp) wherever the kernels reproduce the CPU's arithmetic and
// a tolerance, with its reason, where they cannot. Plus batch invariance on the device: rows
// computed in one call and in chunks must be memcmp-equal.
//
// Built without CUDA every test SKIPs ("built without CUDA"); built with CUDA on a machine
// without a usable device every test SKIPs with the CUDA error. Each test prints one
// "RESULT op type: ..." line per (op, type) with its case count and largest error.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

#if defined(GEIST_HAVE_CUDA) && GEIST_HAVE_CUDA
#define GEIST_TEST_CUDA 1
#else
#define GEIST_TEST_CUDA 0
#endif

#include "backends/cpu/ops.h"
#include "backends/cuda/draw_kernels.h"
#include "backends/cuda/kernels.h"
#include "backends/kv_type.h"
#include "base/draw.h"
#include "base/thread_pool.h"
#include "quant/dot.h"
#include "quant/quant.h"

namespace geist {
namespace {

using quant::GgmlType;
namespace cu = geist::cuda;

// Without CUDA a test's body becomes an uninstantiated template (parsed, never compiled to
// calls, so nothing from the absent kernel library is linked) and the test itself skips.
#if GEIST_TEST_CUDA
#define CUDA_TEST(suite, name) TEST(suite, name)
#else
#define CUDA_TEST(suite, name)                                        \
  TEST(suite, name) { GEIST_SKIP("built without CUDA (-DGEIST_CUDA=ON)"); } \
  template <int>                                                      \
  [[maybe_unused]] void suite##_##name##_body()
#endif
// Without CUDA the helpers below are only used by those uninstantiated bodies: clang says
// so (and -Werror would stop the build); that is the point.
#if !GEIST_TEST_CUDA && defined(__clang__)
#pragma clang diagnostic ignored "-Wunneeded-internal-declaration"
#endif

// ---- device setup -------------------------------------------------------------------------

struct CudaEnv {
  bool ok = false;
  std::string reason;
  cu::CudaStream s = nullptr;
};

inline const CudaEnv &cuda_env() {
  static CudaEnv env = [] {
    CudaEnv e;
    Result<int> n = cu::device_count();
    if (!n) {
      e.reason = "no usable CUDA device: " + n.status().message();
      return e;
    }
    if (*n == 0) {
      e.reason = "no CUDA device";
      return e;
    }
    Status st = cu::set_device(0);
    Result<cu::DeviceInfo> info = cu::device_info(0);
    if (!st || !info) {
      e.reason = !st ? st.message() : info.status().message();
      return e;
    }
    Result<cu::CudaStream> s = cu::stream_create();
    if (!s) {
      e.reason = s.status().message();
      return e;
    }
    e.s = *s;
    // One launch, to learn now whether the build has a kernel image for this device.
    Result<void *> p = cu::device_alloc(4);
    if (!p) {
      e.reason = p.status().message();
      return e;
    }
    Status run = cu::scale_inplace(static_cast<float *>(*p), 1.0f, 1, e.s);
    if (run) run = cu::stream_sync(e.s);
    cu::device_free(*p);
    if (!run) {
      e.reason = run.message();
      return e;
    }
    std::printf("CUDA device: %s\n", cu::describe(*info).c_str());
    e.ok = true;
    return e;
  }();
  return env;
}

#define REQUIRE_CUDA()                                        \
  do {                                                        \
    if (!cuda_env().ok) GEIST_SKIP(cuda_env().reason);        \
  } while (0)
#define CU_OK(expr)                                           \
  do {                                                        \
    ::geist::Status st_ = (expr);                             \
    ASSERT_TRUE(st_.is_ok()) << #expr << ": " << st_.message(); \
  } while (0)

// A device buffer (throws on failure: gtest reports the exception as the test's failure).
class DevBuf {
 public:
  explicit DevBuf(size_t bytes) : bytes_(bytes) {
    Result<void *> r = cu::device_alloc(bytes);
    if (!r) throw std::runtime_error(r.status().message());
    p_ = *r;
  }
  template <class T>
  explicit DevBuf(const std::vector<T> &v) : DevBuf(v.size() * sizeof(T)) {
    put(v.data(), bytes_);
  }
  ~DevBuf() { cu::device_free(p_); }
  DevBuf(const DevBuf &) = delete;
  DevBuf &operator=(const DevBuf &) = delete;
  template <class T = void>
  T *as() const {
    return static_cast<T *>(p_);
  }
  void put(const void *src, size_t n) const {
    Status st = cu::upload(p_, src, n);
    if (!st) throw std::runtime_error(st.message());
  }
  template <class T>
  std::vector<T> get(size_t n) const {
    std::vector<T> v(n);
    Status st = cu::stream_sync(cuda_env().s);
    if (st) st = cu::download(v.data(), p_, n * sizeof(T));
    if (!st) throw std::runtime_error(st.message());
    return v;
  }

 private:
  void *p_ = nullptr;
  size_t bytes_ = 0;
};

// Helpers are `inline`: a build without CUDA leaves them unused (no warning, nothing emitted).

// ---- random inputs and comparison ---------------------------------------------------------

// test::random_row, with the f16 offsets of Q4_1/Q5_1 (random bytes there) made finite too.
inline std::vector<uint8_t> random_matrix(GgmlType t, int64_t k, int64_t n, std::mt19937 &rng) {
  std::vector<uint8_t> out;
  std::uniform_real_distribution<float> off(-0.05f, 0.05f);
  for (int64_t r = 0; r < n; ++r) {
    std::vector<uint8_t> row = test::random_row(t, k, rng);
    if (t == GgmlType::Q4_1 || t == GgmlType::Q5_1) {
      const size_t bb = quant::traits(t).block_bytes;
      for (size_t b = 0; b < row.size() / bb; ++b) {
        const uint16_t h = quant::fp32_to_fp16(off(rng));
        std::memcpy(row.data() + b * bb + 2, &h, 2);
      }
    }
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// n normal floats times a per-row scale over several magnitudes; row 5 (if present) is all
// zeros and row 6 has one large outlier (edge cases of the activation quantizers).
inline std::vector<float> random_acts(int n_rows, int64_t k, std::mt19937 &rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-6, 4);
  std::vector<float> x(size_t(n_rows) * k);
  for (int r = 0; r < n_rows; ++r) {
    const float sc = std::ldexp(1.0f, ex(rng));
    for (int64_t i = 0; i < k; ++i) x[size_t(r) * k + i] = r == 5 ? 0.0f : nd(rng) * sc;
    if (r == 6) x[size_t(r) * k + k / 2] = 1000.0f;
  }
  return x;
}

inline std::vector<float> randn(size_t n, std::mt19937 &rng, float scale = 1.0f) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto &e : v) e = nd(rng);
  return v;
}

// Per (op, type) statistics, printed as one RESULT line.
struct Stats {
  std::string name;
  int cases = 0;
  size_t elems = 0, exact = 0;
  double max_abs = 0, max_rel = 0;
  void add(const float *got, const float *want, size_t n) {
    ++cases;
    for (size_t i = 0; i < n; ++i) {
      ++elems;
      if (std::memcmp(&got[i], &want[i], 4) == 0) {
        ++exact;
        continue;
      }
      const double d = std::fabs(double(got[i]) - double(want[i]));
      max_abs = std::max(max_abs, d);
      max_rel = std::max(max_rel, d / std::max(1e-30, std::fabs(double(want[i]))));
    }
  }
  ~Stats() {
    if (cases == 0) return;
    std::printf("RESULT %-28s %4d cases %9zu values: %s, max |err| %.3g, max rel %.3g\n", name.c_str(), cases,
                elems, exact == elems ? "bit-exact" : (std::to_string(elems - exact) + " differ").c_str(), max_abs,
                max_rel);
  }
};

inline ::testing::AssertionResult bits_equal(const float *got, const float *want, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[i], &want[i], 4) != 0) {
      return ::testing::AssertionFailure() << "first difference at " << i << ": " << got[i] << " vs " << want[i]
                                           << " (" << n << " values)";
    }
  }
  return ::testing::AssertionSuccess();
}

const int kRowCounts[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 25, 31, 32, 33, 63, 64, 65, 127, 128, 129, 130};
constexpr int kMaxRows = 130;

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                              GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

// K values per type: several block counts, including odd ones.
inline std::vector<int64_t> k_values(GgmlType t) {
  const int64_t bs = quant::traits(t).block_size;
  if (bs == 256) return {256, 768, 2560};
  if (bs == 32) return {32, 96, 640, 1056};
  return {16, 200, 640, 1003};  // float types take any K: tails of dot_f32's 16 lanes
}

inline WeightView view_of(const std::vector<uint8_t> &w, GgmlType t, int64_t k, int64_t n) {
  WeightView v;
  v.data = w.data();
  v.type = t;
  v.n_in = k;
  v.n_out = n;
  v.row_bytes = quant::row_bytes(t, k);
  return v;
}

inline cu::DevMatrix dev_matrix(const DevBuf &b, GgmlType t, int64_t k, int64_t n) {
  cu::DevMatrix m;
  m.data = b.as<uint8_t>();
  m.type = t;
  m.n_in = k;
  m.n_out = n;
  m.row_bytes = quant::row_bytes(t, k);
  return m;
}

// The CPU activation mode for one scope.
struct ActModeScope {
  cpu::ActivationMode saved = cpu::activation_mode();
  explicit ActModeScope(cpu::ActivationMode m) { cpu::set_activation_mode(m); }
  ~ActModeScope() { cpu::set_activation_mode(saved); }
};

// ---- tests ----------------------------------------------------------------------------------

CUDA_TEST(CudaOps, DeviceAndErrors) {
  REQUIRE_CUDA();
  Result<cu::DeviceInfo> info = cu::device_info(0);
  ASSERT_TRUE(info.is_ok());
  EXPECT_GT(info->sm_count, 0);
  EXPECT_GT(info->runtime_version, 0);
  // Asking for far more memory than exists is a clean OUT_OF_MEMORY naming the CUDA error,
  // and leaves the device usable.
  Result<void *> huge = cu::device_alloc(size_t(1) << 50);
  ASSERT_FALSE(huge.is_ok());
  EXPECT_EQ(huge.status().code(), GEIST_E_OUT_OF_MEMORY);
  EXPECT_NE(huge.status().message().find("cudaErrorMemoryAllocation"), std::string::npos) << huge.status().message();
  std::printf("out-of-memory message: %s\n", huge.status().message().c_str());
  DevBuf b(std::vector<float>{1.0f, 2.0f});
  CU_OK(cu::scale_inplace(b.as<float>(), 3.0f, 2, cuda_env().s));
  EXPECT_EQ(b.get<float>(2), (std::vector<float>{3.0f, 6.0f}));
  // Bad arguments are refused before any launch.
  cu::DevMatrix m;
  m.type = GgmlType::IQ2_XXS;
  EXPECT_EQ(cu::matmul(m, nullptr, nullptr, 1, cu::ActMode::Q8, nullptr, cuda_env().s).code(), GEIST_E_UNSUPPORTED);
  cu::AttnArgs a;
  a.n_rows = 1;
  a.n_head = 3;
  a.n_head_kv = 2;
  EXPECT_EQ(cu::attention(a, cuda_env().s).code(), GEIST_E_INVALID_ARGUMENT);
}

// Matmul, every type, both activation modes, K over several block counts, every row count:
// bit-exact against cpu::matmul_generic (the same integer block sums and f32 scale math in the
// same order in Q8 mode; dot_f32's 16 lanes and tree over dequantize_row's values in F32 mode).
// The CPU oracle runs once for 130 rows; it is batch invariant, so its first n rows are the
// oracle for an n-row call.
CUDA_TEST(CudaOps, MatmulEveryTypeBitExact) {
  REQUIRE_CUDA();
  ThreadPool pool(4);
  std::mt19937 rng(1234);
  const int64_t kN = 67;  // output rows: not a multiple of the 4 per thread block
  for (cu::ActMode mode : {cu::ActMode::Q8, cu::ActMode::F32}) {
    ActModeScope scope(mode == cu::ActMode::Q8 ? cpu::ActivationMode::Q8 : cpu::ActivationMode::F32);
    for (GgmlType t : kAllTypes) {
      Stats st{std::string("matmul ") + quant::type_name(t) + (mode == cu::ActMode::Q8 ? " q8" : " f32")};
      for (int64_t k : k_values(t)) {
        SCOPED_TRACE(std::string(quant::type_name(t)) + " K=" + std::to_string(k));
        const std::vector<uint8_t> w = random_matrix(t, k, kN, rng);
        const std::vector<float> x = random_acts(kMaxRows, k, rng);
        std::vector<float> want(size_t(kMaxRows) * kN);
        cpu::matmul_generic(view_of(w, t, k, kN), x.data(), want.data(), kMaxRows, pool);
        DevBuf dw(w), dx(x), dy(want.size() * 4);
        const cu::DevMatrix m = dev_matrix(dw, t, k, kN);
        DevBuf scratch(std::max<size_t>(1, cu::matmul_scratch_bytes(m, kMaxRows)));
        for (int n : kRowCounts) {
          CU_OK(cu::memset_async(dy.as(), 0xFF, want.size() * 4, cuda_env().s));
          CU_OK(cu::matmul(m, dx.as<float>(), dy.as<float>(), n, mode, scratch.as(), cuda_env().s));
          const std::vector<float> got = dy.get<float>(size_t(n) * kN);
          st.add(got.data(), want.data(), got.size());
          ASSERT_TRUE(bits_equal(got.data(), want.data(), got.size())) << "n_rows " << n;
        }
      }
    }
  }
}

// The prefill tile kernel on a matrix as wide as E4B's down and o projections (2560 outputs,
// 40 column blocks), where 64-row blocks fill one wave and a bit of the next from ~400 rows and
// the launch takes blocks of up to 96 rows, the rows split evenly (wtile_wide_rows): 200, 256,
// 448 and 512 rows, bit-exact against the CPU oracle. ctest runs it again with
// GEIST_CUDA_WTILE=12, where every tile-kernel call takes the wide blocks.
CUDA_TEST(CudaOps, MatmulWideBlocksBitExact) {
  REQUIRE_CUDA();
  ThreadPool pool(4);
  std::mt19937 rng(2560);
  ActModeScope scope(cpu::ActivationMode::Q8);
  const int64_t k = 512, n_out = 2560;
  const int rows = 512;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q3_K}) {
    SCOPED_TRACE(quant::type_name(t));
    const std::vector<uint8_t> w = random_matrix(t, k, n_out, rng);
    const std::vector<float> x = random_acts(rows, k, rng);
    std::vector<float> want(size_t(rows) * n_out);
    cpu::matmul_generic(view_of(w, t, k, n_out), x.data(), want.data(), rows, pool);
    DevBuf dw(w), dx(x), dy(want.size() * 4);
    const cu::DevMatrix m = dev_matrix(dw, t, k, n_out);
    DevBuf scratch(std::max<size_t>(1, cu::matmul_scratch_bytes(m, rows)));
    for (int n : {200, 256, 448, 512}) {
      CU_OK(cu::memset_async(dy.as(), 0xFF, want.size() * 4, cuda_env().s));
      CU_OK(cu::matmul(m, dx.as<float>(), dy.as<float>(), n, cu::ActMode::Q8, scratch.as(), cuda_env().s));
      const std::vector<float> got = dy.get<float>(size_t(n) * n_out);
      ASSERT_TRUE(bits_equal(got.data(), want.data(), got.size())) << "n_rows " << n;
    }
  }
}

// The K-quant matrix-vector kernels with several warps per output (matrices with few
// outputs; long rows: 13, 14, 40 and 130 super-blocks, the last past the dp4a kernel's split
// limit of 128 and past the tensor-core kernel's shared memory) and 1-32 rows, as a single
// matrix and as a set of three: bit-exact against the CPU oracle. ctest runs it again with
// GEIST_CUDA_MVMMA_ROWS=0 (the dp4a kernel) and GEIST_CUDA_MVMMA_P=1/2/4/8 (the tensor-core
// kernel, one row included, with that many warps per 16 outputs).
CUDA_TEST(CudaOps, MatvecSplitBitExact) {
  REQUIRE_CUDA();
  ThreadPool pool(4);
  std::mt19937 rng(4321);
  ActModeScope scope(cpu::ActivationMode::Q8);
  const int64_t kN = 67;
  for (GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    for (int64_t k : {int64_t(256) * 13, int64_t(256) * 14, int64_t(256) * 40, int64_t(256) * 130}) {
      SCOPED_TRACE(std::string(quant::type_name(t)) + " K=" + std::to_string(k));
      const std::vector<uint8_t> w = random_matrix(t, k, kN, rng);
      const std::vector<float> x = random_acts(32, k, rng);
      std::vector<float> want(size_t(32) * kN);
      cpu::matmul_generic(view_of(w, t, k, kN), x.data(), want.data(), 32, pool);
      DevBuf dw(w), dx(x), dy(want.size() * 4), dy2(want.size() * 4), dy3(want.size() * 4);
      const cu::DevMatrix m = dev_matrix(dw, t, k, kN);
      DevBuf scratch(std::max<size_t>(1, cu::matmul_scratch_bytes(m, 32)));
      // 9-32 rows: mvmma's two to four B tiles (GEIST_CUDA_MVMMA_ROWS=32), whose terms for
      // K = 40 super-blocks need more than 48 KiB of shared memory from 17 rows; 1-4 rows:
      // the staged kernel's row counts (GEIST_CUDA_MVS_ROWS=4).
      for (int n : {1, 2, 3, 4, 5, 8, 12, 17, 25, 32}) {
        CU_OK(cu::memset_async(dy.as(), 0xFF, want.size() * 4, cuda_env().s));
        CU_OK(cu::matmul(m, dx.as<float>(), dy.as<float>(), n, cu::ActMode::Q8, scratch.as(), cuda_env().s));
        std::vector<float> got = dy.get<float>(size_t(n) * kN);
        ASSERT_TRUE(bits_equal(got.data(), want.data(), got.size())) << "n_rows " << n;
        // The same matrix three times in one launch (q/k/v style): each output as alone.
        const cu::DevMatrix ms[3] = {m, m, m};
        float *ys[3] = {dy.as<float>(), dy2.as<float>(), dy3.as<float>()};
        CU_OK(cu::matmul_n(ms, ys, 3, dx.as<float>(), n, cu::ActMode::Q8, scratch.as(), cuda_env().s));
        for (DevBuf *b : {&dy, &dy2, &dy3}) {
          got = b->get<float>(size_t(n) * kN);
          ASSERT_TRUE(bits_equal(got.data(), want.data(), got.size())) << "matmul_n, n_rows " << n;
        }
      }
    }
  }
}

// matmul_n over matrices of mixed types and widths sharing one x (the 270M's q/k Q5_0 and
// v Q8_0; five of one type, past a launch's set of four; a K-quant beside Q8_0-format
// types, which take another activation format): every output bit-exact against the CPU
// oracle for its matrix alone, at 1-8 rows (the matrix-vector kernels' sets) and 9 and 64
// rows (one matrix per launch).
CUDA_TEST(CudaOps, MatmulNMixedTypesBitExact) {
  REQUIRE_CUDA();
  ThreadPool pool(4);
  std::mt19937 rng(9876);
  ActModeScope scope(cpu::ActivationMode::Q8);
  const int64_t k = 768;
  const int kMaxRows = 130;
  using G = GgmlType;
  const std::vector<std::vector<std::pair<G, int64_t>>> lists = {
      {{G::Q5_0, 1024}, {G::Q5_0, 256}, {G::Q8_0, 256}},
      {{G::Q5_0, 256}, {G::Q8_0, 256}, {G::Q5_0, 1024}},
      {{G::Q4_0, 96}, {G::Q4_0, 33}, {G::Q4_0, 200}, {G::Q4_0, 8}, {G::Q4_0, 65}},
      {{G::Q8_0, 300}, {G::Q4_K, 70}, {G::Q5_0, 40}},
      {{G::Q4_K, 130}, {G::Q6_K, 64}, {G::Q4_K, 17}},
      {{G::Q4_K, 200}, {G::Q4_K, 64}, {G::Q6_K, 64}},  // q, k, v of Q4_K_M (GEIST_CUDA_MIXED_SET)
      {{G::Q6_K, 70}, {G::Q4_K, 130}, {G::Q6_K, 64}, {G::Q4_K, 8}},  // a tile-kernel set of 4, types alternating
      {{G::Q5_K, 96}, {G::Q5_K, 33}},
  };
  const std::vector<float> x = random_acts(kMaxRows, k, rng);
  DevBuf dx(x);
  for (size_t li = 0; li < lists.size(); ++li) {
    SCOPED_TRACE("list " + std::to_string(li));
    const auto &list = lists[li];
    const int n_mat = int(list.size());
    std::vector<std::vector<uint8_t>> w(n_mat);
    std::vector<std::vector<float>> want(n_mat);
    std::vector<std::unique_ptr<DevBuf>> dw, dy;
    std::vector<cu::DevMatrix> ms;
    std::vector<float *> ys;
    size_t scratch_bytes = 1;
    for (int m = 0; m < n_mat; ++m) {
      const auto [t, n_out] = list[m];
      w[m] = random_matrix(t, k, n_out, rng);
      want[m].resize(size_t(kMaxRows) * n_out);
      cpu::matmul_generic(view_of(w[m], t, k, n_out), x.data(), want[m].data(), kMaxRows, pool);
      dw.push_back(std::make_unique<DevBuf>(w[m]));
      dy.push_back(std::make_unique<DevBuf>(want[m].size() * 4));
      ms.push_back(dev_matrix(*dw.back(), t, k, n_out));
      ys.push_back(dy.back()->as<float>());
      scratch_bytes = std::max(scratch_bytes, cu::matmul_scratch_bytes(ms.back(), kMaxRows));
    }
    DevBuf scratch(scratch_bytes);
    for (int n : {1, 2, 3, 4, 5, 8, 9, 64, 65, 130}) {
      for (int m = 0; m < n_mat; ++m) {
        CU_OK(cu::memset_async(ys[m], 0xFF, want[m].size() * 4, cuda_env().s));
      }
      CU_OK(cu::matmul_n(ms.data(), ys.data(), n_mat, dx.as<float>(), n, cu::ActMode::Q8, scratch.as(),
                         cuda_env().s));
      for (int m = 0; m < n_mat; ++m) {
        const std::vector<float> got = dy[m]->get<float>(size_t(n) * list[m].second);
        ASSERT_TRUE(bits_equal(got.data(), want[m].data(), got.size())) << "matrix " << m << ", n_rows " << n;
      }
    }
  }
}

// One row of a long Q4_0/Q5_0/Q8_0 matrix (an output head: matvec_q32_staged_kernel, its
// rows staged through shared memory) and two rows of it (matvec_q32_kernel), against the CPU
// generic matmul, memcmp; n_out not a multiple of the staged kernel's 64 rows, K of 20, 3
// and 33 blocks.
CUDA_TEST(CudaOps, MatmulLongMatrixFewRowsBitExact) {
  REQUIRE_CUDA();
  ThreadPool pool(4);
  std::mt19937 rng(4321);
  ActModeScope scope(cpu::ActivationMode::Q8);
  const int64_t kN = 40037;
  for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0}) {
    Stats st{std::string("matmul long ") + quant::type_name(t)};
    for (int64_t k : {int64_t(640), int64_t(96), int64_t(1056)}) {
      SCOPED_TRACE(std::string(quant::type_name(t)) + " K=" + std::to_string(k));
      const std::vector<uint8_t> w = random_matrix(t, k, kN, rng);
      const std::vector<float> x = random_acts(2, k, rng);
      std::vector<float> want(size_t(2) * kN);
      cpu::matmul_generic(view_of(w, t, k, kN), x.data(), want.data(), 2, pool);
      DevBuf dw(w), dx(x), dy(want.size() * 4);
      const cu::DevMatrix m = dev_matrix(dw, t, k, kN);
      DevBuf scratch(std::max<size_t>(1, cu::matmul_scratch_bytes(m, 2)));
      for (int n : {1, 2}) {
        CU_OK(cu::memset_async(dy.as(), 0xFF, want.size() * 4, cuda_env().s));
        CU_OK(cu::matmul(m, dx.as<float>(), dy.as<float>(), n, cu::ActMode::Q8, scratch.as(), cuda_env().s));
        const std::vector<float> got = dy.get<float>(size_t(n) * kN);
        st.add(got.data(), want.data(), got.size());
        ASSERT_TRUE(bits_equal(got.data(), want.data(), got.size())) << "n_rows " << n;
      }
    }
  }
}

// A range of output rows is a view of the matrix (DevMatrix comment): equal to cpu::matmul_range.
CUDA_TEST(CudaOps, MatmulRowRangeView) {
  REQUIRE_CUDA();
  ThreadPool pool(4);
  std::mt19937 rng(77);
  const int64_t k = 512, n = 300, n0 = 37, n1 = 201;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16}) {
    const std::vector<uint8_t> w = random_matrix(t, k, n, rng);
    const std::vector<float> x = random_acts(9, k, rng);
    std::vector<float> want(size_t(9) * (n1 - n0));
    cpu::matmul_range(view_of(w, t, k, n), x.data(), want.data(), 9, n0, n1, pool);
    // matmul_range runs the generic path unless the weight is packed (it is not here).
    DevBuf dw(w), dx(x), dy(want.size() * 4);
    cu::DevMatrix m = dev_matrix(dw, t, k, n);
    m.data += n0 * m.row_bytes;
    m.n_out = n1 - n0;
    DevBuf scratch(std::max<size_t>(1, cu::matmul_scratch_bytes(m, 9)));
    const cu::ActMode mode = cpu::activation_mode() == cpu::ActivationMode::Q8 ? cu::ActMode::Q8 : cu::ActMode::F32;
    CU_OK(cu::matmul(m, dx.as<float>(), dy.as<float>(), 9, mode, scratch.as(), cuda_env().s));
    const std::vector<float> got = dy.get<float>(want.size());
    EXPECT_TRUE(bits_equal(got.data(), want.data(), want.size())) << quant::type_name(t);
  }
}

// Batch invariance on the device: rows [0, 130) in one call and in chunks of 1, 3, 7, 64
// (the chunk calls reading and writing at row offsets) must be memcmp-equal.
CUDA_TEST(CudaOps, MatmulBatchInvariantOnDevice) {
  REQUIRE_CUDA();
  std::mt19937 rng(99);
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::F16, GgmlType::BF16}) {
    for (cu::ActMode mode : {cu::ActMode::Q8, cu::ActMode::F32}) {
      const int64_t k = 1024, n = 131;
      const std::vector<uint8_t> w = random_matrix(t, k, n, rng);
      const std::vector<float> x = random_acts(kMaxRows, k, rng);
      DevBuf dw(w), dx(x), dy(size_t(kMaxRows) * n * 4), dy2(size_t(kMaxRows) * n * 4);
      const cu::DevMatrix m = dev_matrix(dw, t, k, n);
      DevBuf scratch(std::max<size_t>(1, cu::matmul_scratch_bytes(m, kMaxRows)));
      CU_OK(cu::matmul(m, dx.as<float>(), dy.as<float>(), kMaxRows, mode, scratch.as(), cuda_env().s));
      const std::vector<float> whole = dy.get<float>(size_t(kMaxRows) * n);
      for (int chunk : {1, 3, 7, 64}) {
        CU_OK(cu::memset_async(dy2.as(), 0, size_t(kMaxRows) * n * 4, cuda_env().s));
        for (int r0 = 0; r0 < kMaxRows; r0 += chunk) {
          const int nr = std::min(chunk, kMaxRows - r0);
          CU_OK(cu::matmul(m, dx.as<float>() + size_t(r0) * k, dy2.as<float>() + size_t(r0) * n, nr, mode,
                           scratch.as(), cuda_env().s));
        }
        const std::vector<float> parts = dy2.get<float>(whole.size());
        ASSERT_TRUE(bits_equal(parts.data(), whole.data(), whole.size()))
            << quant::type_name(t) << " chunk " << chunk << (mode == cu::ActMode::Q8 ? " q8" : " f32");
      }
    }
  }
}

// Embedding gather, every type: cpu::embedding_gather's bits; ids outside [0, n_out) give
// zero rows.
CUDA_TEST(CudaOps, EmbedEveryTypeBitExact) {
  REQUIRE_CUDA();
  std::mt19937 rng(5);
  for (GgmlType t : kAllTypes) {
    Stats st{std::string("embed ") + quant::type_name(t)};
    const int64_t k = quant::traits(t).block_size == 256 ? 512 : 640, n_vocab = 50;
    const std::vector<uint8_t> w = random_matrix(t, k, n_vocab, rng);
    std::vector<int32_t> ids;
    for (int i = 0; i < 37; ++i) ids.push_back(int32_t(rng() % n_vocab));
    ids[3] = int32_t(n_vocab);  // out of range: zero row
    ids[9] = -1;
    ids[10] = 1 << 30;
    const float scale = 25.298221f;  // sqrt(640), as Gemma scales embeddings
    std::vector<float> want(ids.size() * k, 0.0f);
    for (size_t r = 0; r < ids.size(); ++r) {
      if (ids[r] < 0 || ids[r] >= n_vocab) continue;
      cpu::embedding_gather(view_of(w, t, k, n_vocab), &ids[r], 1, scale, want.data() + r * k);
    }
    DevBuf dw(w), di(ids), dout(want.size() * 4);
    CU_OK(cu::embed(dev_matrix(dw, t, k, n_vocab), di.as<int32_t>(), int(ids.size()), scale, dout.as<float>(),
                    cuda_env().s));
    const std::vector<float> got = dout.get<float>(want.size());
    st.add(got.data(), want.data(), got.size());
    EXPECT_TRUE(bits_equal(got.data(), want.data(), want.size())) << quant::type_name(t);
  }
}

// Every f16 bit pattern through the device's f16 -> f32 conversion (an F16 embedding row
// gathered with scale 1): quant::fp16_to_fp32's bits, subnormals, zeros and infinities
// included. NaN patterns are left out (multiplying by the scale may quiet their payload).
CUDA_TEST(CudaOps, Fp16ToFp32EveryPattern) {
  REQUIRE_CUDA();
  const int64_t k = 65536;
  std::vector<uint16_t> row(k);
  for (int64_t i = 0; i < k; ++i) {
    const uint16_t h = uint16_t(i);
    row[i] = ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0) ? uint16_t(0) : h;
  }
  std::vector<uint8_t> w(k * 2);
  std::memcpy(w.data(), row.data(), w.size());
  std::vector<float> want(k);
  for (int64_t i = 0; i < k; ++i) want[i] = quant::fp16_to_fp32(row[i]) * 1.0f;
  const std::vector<int32_t> ids = {0};
  DevBuf dw(w), di(ids), dout(k * 4);
  CU_OK(cu::embed(dev_matrix(dw, GgmlType::F16, k, 1), di.as<int32_t>(), 1, 1.0f, dout.as<float>(), cuda_env().s));
  const std::vector<float> got = dout.get<float>(k);
  for (int64_t i = 0; i < k; ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0) << "f16 bits 0x" << std::hex << row[i];
  }
}

// RMSNorm: cpu::rmsnorm_to's bits (the double sum of squares is taken in the CPU's order).
CUDA_TEST(CudaOps, RmsNormMatchesCpu) {
  REQUIRE_CUDA();
  std::mt19937 rng(11);
  Stats st{"rmsnorm"};
  // The device sums the squares in double in another order than the CPU's loop: the double
  // sums differ by ~dim * 2^-53 relative, which moves the float scale r by one ulp only when
  // it lies that close to a rounding boundary. out = x * r * g then differs by at most
  // ~2 ulp (r's ulp through two roundings); 3 ulp is the bound asserted.
  auto ulp = [](float v) { return std::ldexp(1.0, std::max(-149, std::ilogb(std::max(std::fabs(v), 1e-38f)) - 23)); };
  size_t differing = 0, total = 0;
  for (int64_t dim : {32, 64, 256, 512, 640, 1000, 2560, 3072, 3073, 4096}) {
    for (int n_vec : {1, 7, 130}) {
      for (bool with_g : {true, false}) {
        std::vector<float> x = randn(size_t(n_vec) * dim, rng, 3.0f), g = randn(dim, rng);
        std::vector<float> want(x.size());
        cpu::rmsnorm_to(x.data(), with_g ? g.data() : nullptr, want.data(), n_vec, dim, 1e-6f);
        DevBuf dx(x), dg(g), dout(x.size() * 4);
        CU_OK(cu::rmsnorm(dx.as<float>(), with_g ? dg.as<float>() : nullptr, dout.as<float>(), n_vec, dim, 1e-6f,
                          cuda_env().s));
        std::vector<float> got = dout.get<float>(x.size());
        st.add(got.data(), want.data(), got.size());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_LE(std::fabs(double(got[i]) - want[i]), 3 * ulp(want[i])) << "dim " << dim << " i " << i;
          differing += got[i] != want[i];
        }
        total += got.size();
        // In place gives the same bits as out of place.
        CU_OK(cu::rmsnorm(dx.as<float>(), with_g ? dg.as<float>() : nullptr, dx.as<float>(), n_vec, dim, 1e-6f,
                          cuda_env().s));
        const std::vector<float> again = dx.get<float>(x.size());
        ASSERT_TRUE(bits_equal(again.data(), got.data(), got.size())) << "in place, dim " << dim;
      }
    }
  }
  std::printf("rmsnorm: %zu of %zu outputs differ from the CPU's (each within 3 ulp)\n", differing, total);
}

// rmsnorm_add (out = norm(x) g in place of x, h += out) gives rmsnorm's bits for out and
// h + out rounded once for h, on every kernel path (registers up to 3072, the loop above).
CUDA_TEST(CudaOps, RmsNormAddIsNormThenAdd) {
  REQUIRE_CUDA();
  std::mt19937 rng(13);
  for (int64_t dim : {256, 640, 2560, 3072, 4096}) {
    for (int n_vec : {1, 7}) {
      const std::vector<float> x = randn(size_t(n_vec) * dim, rng, 3.0f), g = randn(dim, rng),
                               h = randn(x.size(), rng, 5.0f);
      DevBuf dx(x), dg(g), dh(h), dnorm(x.size() * 4);
      CU_OK(cu::rmsnorm(dx.as<float>(), dg.as<float>(), dnorm.as<float>(), n_vec, dim, 1e-6f, cuda_env().s));
      CU_OK(cu::rmsnorm_add(dx.as<float>(), dg.as<float>(), dx.as<float>(), dh.as<float>(), n_vec, dim, 1e-6f,
                            cuda_env().s));
      const std::vector<float> norm = dnorm.get<float>(x.size()), out = dx.get<float>(x.size()),
                               h2 = dh.get<float>(x.size());
      ASSERT_TRUE(bits_equal(out.data(), norm.data(), norm.size())) << "dim " << dim;
      std::vector<float> want(h.size());
      for (size_t i = 0; i < h.size(); ++i) want[i] = h[i] + norm[i];
      ASSERT_TRUE(bits_equal(h2.data(), want.data(), want.size())) << "dim " << dim;
    }
  }
}

// rmsnorm_add_norm (the end of a block and the next block's input norm, one launch up to
// dim 3072) gives the bits of rmsnorm_add, scale_inplace and rmsnorm run one after another,
// with and without a scale, a next norm and weights.
CUDA_TEST(CudaOps, RmsNormAddNormIsTheOpsInTurn) {
  REQUIRE_CUDA();
  std::mt19937 rng(14);
  cu::CudaStream s = cuda_env().s;
  for (int64_t dim : {256, 512, 640, 2560, 3072, 3073}) {
    for (int n_vec : {1, 7, 130}) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool with_g = variant != 1, with_next = variant != 2, with_gn = variant != 3;
        const float h_scale = variant == 0 ? 0.8125f : variant == 3 ? 1.7f : 1.0f;
        const std::vector<float> x = randn(size_t(n_vec) * dim, rng, 3.0f), g = randn(dim, rng),
                                 gn = randn(dim, rng), h = randn(x.size(), rng, 5.0f);
        DevBuf dx(x), dg(g), dgn(gn), dh(h), dout(x.size() * 4), ex(x), eh(h), eout(x.size() * 4);
        const float *gp = with_g ? dg.as<float>() : nullptr, *gnp = with_gn ? dgn.as<float>() : nullptr;
        CU_OK(cu::rmsnorm_add(ex.as<float>(), gp, ex.as<float>(), eh.as<float>(), n_vec, dim, 1e-6f, s));
        if (h_scale != 1.0f) CU_OK(cu::scale_inplace(eh.as<float>(), h_scale, int64_t(n_vec) * dim, s));
        if (with_next) CU_OK(cu::rmsnorm(eh.as<float>(), gnp, eout.as<float>(), n_vec, dim, 1e-6f, s));
        CU_OK(cu::rmsnorm_add_norm(dx.as<float>(), gp, dh.as<float>(), h_scale, gnp,
                                   with_next ? dout.as<float>() : nullptr, n_vec, dim, 1e-6f, s));
        const std::string what = "dim " + std::to_string(dim) + " rows " + std::to_string(n_vec) + " variant " +
                                  std::to_string(variant);
        ASSERT_TRUE(bits_equal(dx.get<float>(x.size()).data(), ex.get<float>(x.size()).data(), x.size())) << what;
        ASSERT_TRUE(bits_equal(dh.get<float>(x.size()).data(), eh.get<float>(x.size()).data(), x.size())) << what;
        if (with_next) {
          ASSERT_TRUE(bits_equal(dout.get<float>(x.size()).data(), eout.get<float>(x.size()).data(), x.size()))
              << what;
        }
      }
    }
  }
  EXPECT_FALSE(cu::rmsnorm_add_norm(nullptr, nullptr, nullptr, 1.0f, nullptr, nullptr, 1, 64, 1e-6f, s).is_ok());
}

// Random matrices of one K (each type with its outputs) on the device, with two output
// buffers of n_rows rows each (a reference and the result to compare) and the matmul scratch
// they need.
struct SetCase {
  int64_t k;
  std::vector<std::pair<GgmlType, int64_t>> mats;  // type, outputs
};
struct MatSet {
  std::vector<std::unique_ptr<DevBuf>> w, y_ref, y_got;  // DevBuf does not move
  std::vector<cu::DevMatrix> ms;
  std::vector<float *> yr, yg;
  size_t scratch_bytes = 1;
  MatSet(int64_t k, const std::vector<std::pair<GgmlType, int64_t>> &mats, int n_rows, std::mt19937 &rng) {
    for (auto [t, n_out] : mats) {
      w.push_back(std::make_unique<DevBuf>(random_matrix(t, k, n_out, rng)));
      ms.push_back(dev_matrix(*w.back(), t, k, n_out));
      y_ref.push_back(std::make_unique<DevBuf>(size_t(n_rows) * n_out * 4));
      y_got.push_back(std::make_unique<DevBuf>(size_t(n_rows) * n_out * 4));
      yr.push_back(y_ref.back()->as<float>());
      yg.push_back(y_got.back()->as<float>());
      scratch_bytes = std::max(scratch_bytes, cu::matmul_scratch_bytes(ms.back(), n_rows));
    }
  }
};

// The producers that quantize what they write for the matmul after them give the bits of
// the producer and then matmul_n (which quantizes x itself): gelu_mul_quantize and
// rmsnorm_add_norm_quantize, then matmul_n_quantized, over the shapes the models run (the
// 270M's 640-wide Q5_0 / Q8_0 q, k, v and 2048-wide Q6_K down, E4B-like Q4_K at 2560 and
// 10240, the 64-thread norm at 512) and 1-64 rows.
CUDA_TEST(CudaOps, QuantizingProducersThenMatmulSameBits) {
  REQUIRE_CUDA();
  std::mt19937 rng(31);
  cu::CudaStream s = cuda_env().s;
  using G = GgmlType;
  const std::vector<SetCase> cases = {
      {640, {{G::Q5_0, 1024}, {G::Q5_0, 256}, {G::Q8_0, 256}}},
      {2048, {{G::Q6_K, 640}}},
      {512, {{G::Q4_K, 96}, {G::Q4_K, 64}}},
      {2560, {{G::Q4_K, 300}, {G::Q4_K, 300}}},
      {10240, {{G::Q6_K, 256}}},
      {1024, {{G::Q8_0, 128}, {G::Q4_0, 64}}},  // Q8_0 blocks in rows of whole 256s
  };
  for (const SetCase &c : cases) {
    for (int n_rows : {1, 3, 8, 9, 64}) {
      const int64_t k = c.k;
      const int n_mat = int(c.mats.size());
      const std::string what = "K " + std::to_string(k) + " rows " + std::to_string(n_rows);
      MatSet set(k, c.mats, n_rows, rng);
      const std::vector<cu::DevMatrix> &ms = set.ms;
      std::vector<float *> &yr = set.yr, &yg = set.yg;
      auto &y_ref = set.y_ref, &y_got = set.y_got;
      const size_t scratch_bytes = set.scratch_bytes;
      const int act_block = cu::matmul_n_act_block(ms.data(), yg.data(), n_mat, n_rows);
      ASSERT_EQ(act_block, ms[0].type == G::Q5_0 || ms[0].type == G::Q8_0 ? 32 : 256) << what;
      DevBuf scratch(scratch_bytes);
      auto same_y = [&](const char *op) {
        for (int m = 0; m < n_mat; ++m) {
          const size_t n = size_t(n_rows) * ms[size_t(m)].n_out;
          ASSERT_TRUE(bits_equal(y_got[size_t(m)]->get<float>(n).data(), y_ref[size_t(m)]->get<float>(n).data(), n))
              << op << ", " << what << ", matrix " << m;
        }
      };
      // gelu_mul (out = gate, as the models call it), then the matmuls.
      {
        const std::vector<float> gate = randn(size_t(n_rows) * k, rng, 2.0f), up = randn(gate.size(), rng, 2.0f);
        DevBuf g_ref(gate), g_got(gate), du(up);
        CU_OK(cu::gelu_mul(g_ref.as<float>(), du.as<float>(), g_ref.as<float>(), int64_t(n_rows) * k, s));
        CU_OK(cu::matmul_n(ms.data(), yr.data(), n_mat, g_ref.as<float>(), n_rows, cu::ActMode::Q8, scratch.as(), s));
        CU_OK(cu::gelu_mul_quantize(g_got.as<float>(), du.as<float>(), g_got.as<float>(), n_rows, k, act_block,
                                    scratch.as(), s));
        CU_OK(cu::matmul_n_quantized(ms.data(), yg.data(), n_mat, n_rows, scratch.as(), s));
        ASSERT_TRUE(bits_equal(g_got.get<float>(gate.size()).data(), g_ref.get<float>(gate.size()).data(),
                               gate.size()))
            << "gelu_mul values, " << what;
        same_y("gelu_mul_quantize");
      }
      // rmsnorm_add_norm (the block's end and the next norm), then the matmuls.
      if (k <= cu::kRmsNormAddNormMaxDim) {
        const std::vector<float> x = randn(size_t(n_rows) * k, rng, 3.0f), g = randn(k, rng), gn = randn(k, rng),
                                 h = randn(x.size(), rng, 5.0f);
        DevBuf dg(g), dgn(gn), x_ref(x), h_ref(h), o_ref(x.size() * 4), x_got(x), h_got(h), o_got(x.size() * 4);
        CU_OK(cu::rmsnorm_add_norm(x_ref.as<float>(), dg.as<float>(), h_ref.as<float>(), 0.75f, dgn.as<float>(),
                                   o_ref.as<float>(), n_rows, k, 1e-6f, s));
        CU_OK(cu::matmul_n(ms.data(), yr.data(), n_mat, o_ref.as<float>(), n_rows, cu::ActMode::Q8, scratch.as(), s));
        CU_OK(cu::rmsnorm_add_norm_quantize(x_got.as<float>(), dg.as<float>(), h_got.as<float>(), 0.75f,
                                            dgn.as<float>(), o_got.as<float>(), n_rows, k, 1e-6f, act_block,
                                            scratch.as(), s));
        CU_OK(cu::matmul_n_quantized(ms.data(), yg.data(), n_mat, n_rows, scratch.as(), s));
        const DevBuf *got[3] = {&x_got, &h_got, &o_got}, *ref[3] = {&x_ref, &h_ref, &o_ref};
        for (int i = 0; i < 3; ++i) {
          const std::vector<float> a = got[i]->get<float>(x.size()), b = ref[i]->get<float>(x.size());
          ASSERT_TRUE(bits_equal(a.data(), b.data(), x.size())) << "rmsnorm_add_norm values " << i << ", " << what;
        }
        same_y("rmsnorm_add_norm_quantize");
      }
    }
  }
  EXPECT_FALSE(cu::gelu_mul_quantize(nullptr, nullptr, nullptr, 1, 256, 256, nullptr, s).is_ok());
  EXPECT_FALSE(cu::rmsnorm_add_norm_quantize(nullptr, nullptr, nullptr, 1.0f, nullptr, nullptr, 1, 4096, 1e-6f, 256,
                                             nullptr, s)
                   .is_ok());
}

// matmul_n_norm (a one-row rmsnorm_add_norm folded into the set's matvec: every block
// computes the norms itself, the last block to read x and h writes them) gives the bits of
// rmsnorm_add_norm and then matmul_n (and of the quantizing norm and matmul_n_quantized,
// which the exec runs without the fold): y, and x, h, out in place, over the 270M's sets
// (640: q/k/v of Q5_0 and Q8_0, gate/up), the 64-thread tree (<= 512), the 256-thread trees
// of 4 and 12 per thread and their edges, with and without the weights and the h scale. The
// launches share one counter across grids of 1 to 8224 blocks (many waves), which must come
// back to 0.
CUDA_TEST(CudaOps, NormFoldedIntoMatvecSameBits) {
  REQUIRE_CUDA();
  std::mt19937 rng(47);
  cu::CudaStream s = cuda_env().s;
  using G = GgmlType;
  const std::vector<SetCase> cases = {
      {640, {{G::Q5_0, 1024}, {G::Q5_0, 256}, {G::Q8_0, 256}}},
      {640, {{G::Q5_0, 2048}, {G::Q5_0, 2048}}},
      {640, {{G::Q5_0, 1024}, {G::Q5_0, 256}, {G::Q5_0, 256}}},
      {64, {{G::Q8_0, 8}, {G::Q8_0, 1}}},  // one block of the grid
      {96, {{G::Q4_0, 40}, {G::Q4_0, 9}}},
      {384, {{G::Q8_0, 200}, {G::Q4_0, 72}}},
      {512, {{G::Q4_0, 33}, {G::Q5_0, 31}}},  // the 64-thread tree's last dim
      {544, {{G::Q5_0, 64}, {G::Q5_0, 64}}},  // the 256-thread trees' first
      {1024, {{G::Q8_0, 128}, {G::Q5_0, 64}}},
      {1056, {{G::Q5_0, 96}, {G::Q5_0, 32}}},
      {1152, {{G::Q5_0, 512}, {G::Q8_0, 128}, {G::Q4_0, 64}, {G::Q5_0, 7}}},
      {2560, {{G::Q8_0, 300}, {G::Q8_0, 300}}},
      {3072, {{G::Q5_0, 96}, {G::Q8_0, 8}}},
      {640, {{G::Q8_0, 65536}, {G::Q5_0, 256}}},  // 8224 blocks: many waves meet one counter
  };
  DevBuf count(std::vector<unsigned>{0u});
  for (const SetCase &c : cases) {
    const int64_t k = c.k;
    const int n_mat = int(c.mats.size());
    MatSet set(k, c.mats, 1, rng);
    const std::vector<cu::DevMatrix> &ms = set.ms;
    std::vector<float *> &yr = set.yr, &yg = set.yg;
    auto &y_ref = set.y_ref, &y_got = set.y_got;
    const size_t scratch_bytes = set.scratch_bytes;
    ASSERT_TRUE(cu::matmul_n_norm_fits(ms.data(), n_mat, k)) << "K " << k;
    DevBuf scratch(scratch_bytes);
    for (int variant = 0; variant < 4; ++variant) {
      const bool weights = variant != 1, scaled = variant >= 2;
      const std::string what = "K " + std::to_string(k) + " matrices " + std::to_string(n_mat) + " variant " +
                               std::to_string(variant);
      const std::vector<float> x = randn(size_t(k), rng, 3.0f), g = randn(k, rng), gn = randn(k, rng),
                               h = randn(x.size(), rng, 5.0f);
      DevBuf dg(g), dgn(gn), x_ref(x), h_ref(h), o_ref(x.size() * 4), x_got(x), h_got(h), o_got(x.size() * 4);
      const float hs = scaled ? 0.75f : 1.0f;
      const float *gp = weights ? dg.as<float>() : nullptr, *gnp = variant == 3 ? nullptr : dgn.as<float>();
      CU_OK(cu::rmsnorm_add_norm(x_ref.as<float>(), gp, h_ref.as<float>(), hs, gnp, o_ref.as<float>(), 1, k, 1e-6f,
                                 s));
      CU_OK(cu::matmul_n(ms.data(), yr.data(), n_mat, o_ref.as<float>(), 1, cu::ActMode::Q8, scratch.as(), s));
      cu::NormFold nf;
      nf.x = x_got.as<float>();
      nf.g = gp;
      nf.h = h_got.as<float>();
      nf.h_scale = hs;
      nf.g_next = gnp;
      nf.out = o_got.as<float>();
      nf.dim = k;
      nf.eps = 1e-6f;
      nf.count = count.as<unsigned>();
      CU_OK(cu::matmul_n_norm(ms.data(), yg.data(), n_mat, nf, s));
      // And the path the exec takes without the fold: the quantizing norm, then the set.
      {
        DevBuf x_q(x), h_q(h), o_q(x.size() * 4);
        std::vector<std::unique_ptr<DevBuf>> y_q;
        std::vector<float *> yq;
        for (int m = 0; m < n_mat; ++m) {
          y_q.push_back(std::make_unique<DevBuf>(size_t(ms[size_t(m)].n_out) * 4));
          yq.push_back(y_q.back()->as<float>());
        }
        CU_OK(cu::rmsnorm_add_norm_quantize(x_q.as<float>(), gp, h_q.as<float>(), hs, gnp, o_q.as<float>(), 1, k,
                                            1e-6f, 32, scratch.as(), s));
        CU_OK(cu::matmul_n_quantized(ms.data(), yq.data(), n_mat, 1, scratch.as(), s));
        for (int m = 0; m < n_mat; ++m) {
          const size_t n = size_t(ms[size_t(m)].n_out);
          ASSERT_TRUE(bits_equal(y_q[size_t(m)]->get<float>(n).data(), y_ref[size_t(m)]->get<float>(n).data(), n))
              << "the quantizing path, " << what << ", matrix " << m;
        }
      }
      const DevBuf *got[3] = {&x_got, &h_got, &o_got}, *ref[3] = {&x_ref, &h_ref, &o_ref};
      for (int i = 0; i < 3; ++i) {
        const std::vector<float> a = got[i]->get<float>(x.size()), b = ref[i]->get<float>(x.size());
        ASSERT_TRUE(bits_equal(a.data(), b.data(), x.size())) << "values " << i << " (x, h, out), " << what;
      }
      for (int m = 0; m < n_mat; ++m) {
        const size_t n = size_t(ms[size_t(m)].n_out);
        ASSERT_TRUE(bits_equal(y_got[size_t(m)]->get<float>(n).data(), y_ref[size_t(m)]->get<float>(n).data(), n))
            << what << ", matrix " << m;
      }
      ASSERT_EQ(count.get<unsigned>(1)[0], 0u) << "the counter after " << what;
    }
  }
  // What it does not take: K-quants, a K not of 32s or above 3072, one or five matrices,
  // another K; outputs over x, h or out.
  DevBuf w4(random_matrix(G::Q4_K, 256, 8, rng)), w5(random_matrix(G::Q5_0, 3104, 8, rng)),
      w8(random_matrix(G::Q8_0, 640, 8, rng));
  const cu::DevMatrix q4k[2] = {dev_matrix(w4, G::Q4_K, 256, 8), dev_matrix(w4, G::Q4_K, 256, 8)},
                      big[2] = {dev_matrix(w5, G::Q5_0, 3104, 8), dev_matrix(w5, G::Q5_0, 3104, 8)},
                      q8 = dev_matrix(w8, G::Q8_0, 640, 8);
  EXPECT_FALSE(cu::matmul_n_norm_fits(q4k, 2, 256));
  EXPECT_FALSE(cu::matmul_n_norm_fits(big, 2, 3104));
  const cu::DevMatrix five[5] = {q8, q8, q8, q8, q8};
  EXPECT_FALSE(cu::matmul_n_norm_fits(five, 2, 512));
  EXPECT_FALSE(cu::matmul_n_norm_fits(five, 1, 640));
  EXPECT_FALSE(cu::matmul_n_norm_fits(five, 5, 640));
  EXPECT_TRUE(cu::matmul_n_norm_fits(five, 4, 640));
  DevBuf xb(640 * 4), hb(640 * 4), ob(640 * 4), yb(8 * 4);
  cu::NormFold nf;
  nf.x = xb.as<float>();
  nf.h = hb.as<float>();
  nf.out = ob.as<float>();
  nf.dim = 640;
  nf.count = count.as<unsigned>();
  float *ys[2] = {yb.as<float>(), nullptr};
  EXPECT_FALSE(cu::matmul_n_norm(five, ys, 2, nf, s).is_ok());  // a null output
  ys[1] = ob.as<float>() + 4;
  EXPECT_FALSE(cu::matmul_n_norm(five, ys, 2, nf, s).is_ok());  // an output inside out
  ys[1] = yb.as<float>();
  nf.h = nf.x + 100;
  EXPECT_FALSE(cu::matmul_n_norm(five, ys, 2, nf, s).is_ok());  // h over x
  EXPECT_FALSE(cu::matmul_n_norm(five, ys, 2, cu::NormFold{}, s).is_ok());
  EXPECT_EQ(count.get<unsigned>(1)[0], 0u);
}

// head_norm_rope (Gemma's q/k/v norms and RoPE, one launch for up to three tensors) gives
// the bits of rmsnorm per head then rope_neox on each tensor, for head dims 32..512 (and
// 1024, where it runs those ops), with and without weights and rotation.
CUDA_TEST(CudaOps, HeadNormRopeIsNormThenRope) {
  REQUIRE_CUDA();
  std::mt19937 rng(15);
  cu::CudaStream s = cuda_env().s;
  for (int head_dim : {32, 64, 256, 512, 1024}) {
    for (int n_rows : {1, 7, 130}) {
      for (int n_t : {1, 2, 3}) {
        cpu::RopeTable table;
        table.init(1e6, head_dim, 1.0, nullptr);
        std::vector<float> cs(size_t(n_rows) * head_dim);
        table.fill(int64_t(rng() % 100000), n_rows, cs.data());
        DevBuf dcs(cs);
        const int heads[3] = {8, 2, 2};
        const bool rope[3] = {true, true, false};
        const bool weight[3] = {true, true, false};
        std::vector<std::vector<float>> xs, gs;
        std::vector<std::unique_ptr<DevBuf>> dx, de, dg;  // DevBuf does not move
        cu::HeadNormSet set;
        set.n = n_t;
        for (int i = 0; i < n_t; ++i) {
          xs.push_back(randn(size_t(n_rows) * heads[i] * head_dim, rng, 3.0f));
          gs.push_back(randn(head_dim, rng));
        }
        for (int i = 0; i < n_t; ++i) {
          dx.push_back(std::make_unique<DevBuf>(xs[i]));
          de.push_back(std::make_unique<DevBuf>(xs[i]));
          dg.push_back(std::make_unique<DevBuf>(gs[i]));
        }
        for (int i = 0; i < n_t; ++i) {
          const float *gp = weight[i] ? dg[i]->as<float>() : nullptr;
          set.x[i] = dx[i]->as<float>();
          set.g[i] = gp;
          set.n_heads[i] = heads[i];
          set.rope[i] = rope[i];
          float *e = de[i]->as<float>();
          CU_OK(cu::rmsnorm(e, gp, e, int64_t(n_rows) * heads[i], head_dim, 1e-6f, s));
          if (rope[i]) CU_OK(cu::rope_neox(e, n_rows, heads[i], head_dim, head_dim, dcs.as<float>(), s));
        }
        CU_OK(cu::head_norm_rope(set, n_rows, head_dim, 1e-6f, dcs.as<float>(), s));
        for (int i = 0; i < n_t; ++i) {
          const size_t n = xs[i].size();
          ASSERT_TRUE(bits_equal(dx[i]->get<float>(n).data(), de[i]->get<float>(n).data(), n))
              << "hd " << head_dim << " rows " << n_rows << " tensor " << i << " of " << n_t;
        }
      }
    }
  }
  cu::HeadNormSet bad;
  EXPECT_FALSE(cu::head_norm_rope(bad, 1, 64, 1e-6f, nullptr, s).is_ok());
}

// RoPE (NEOX), full and partial rotation: cpu::rope_neox's bits.
CUDA_TEST(CudaOps, RopeNeoxBitExact) {
  REQUIRE_CUDA();
  std::mt19937 rng(12);
  Stats st{"rope_neox"};
  for (int head_dim : {32, 64, 256, 512}) {
    for (int rot_dim : {head_dim, head_dim / 4}) {
      for (int n_rows : {1, 7, 130}) {
        const int n_heads = head_dim >= 256 ? 4 : 8;
        cpu::RopeTable table;
        table.init(1e6, rot_dim, 1.0, nullptr);
        std::vector<float> cs(size_t(n_rows) * rot_dim);
        table.fill(int64_t(rng() % 100000), n_rows, cs.data());
        std::vector<float> x = randn(size_t(n_rows) * n_heads * head_dim, rng), want = x;
        cpu::rope_neox(want.data(), n_rows, n_heads, head_dim, rot_dim, cs.data());
        DevBuf dx(x), dcs(cs);
        CU_OK(cu::rope_neox(dx.as<float>(), n_rows, n_heads, head_dim, rot_dim, dcs.as<float>(), cuda_env().s));
        const std::vector<float> got = dx.get<float>(x.size());
        st.add(got.data(), want.data(), got.size());
        ASSERT_TRUE(bits_equal(got.data(), want.data(), want.size())) << "hd " << head_dim << " rot " << rot_dim;
      }
    }
  }
}

// Elementwise ops. add/scale/add_scale/copy_cols: bit-exact (one rounding each, as on the
// CPU). gelu_mul and softcap use tanh: the device evaluates it in double and rounds once,
// libm's tanhf is within an ulp or two of that, so t = tanh(u) may differ by up to ~3 ulp of
// 1 (|dt| <= 3 * 2^-24). The tolerance follows: gelu |d out| <= 0.5 |g up| |dt| + 4 ulp(out)
// (1 + t cancels for negative u, so the error is absolute in |g up|, not relative to out);
// softcap |d out| <= cap |dt| + 2 ulp(out).
CUDA_TEST(CudaOps, ElementwiseOps) {
  REQUIRE_CUDA();
  std::mt19937 rng(13);
  cu::CudaStream s = cuda_env().s;
  const double dt = 3.0 * std::ldexp(1.0, -24);
  auto ulp = [](float v) { return std::ldexp(1.0, std::max(-149, std::ilogb(std::max(std::fabs(v), 1e-38f)) - 23)); };
  for (int64_t n : {1, 31, 1000, 100003}) {
    const std::vector<float> a = randn(n, rng, 2.0f), b = randn(n, rng, 2.0f);
    DevBuf da(a), db(b), dout(n * 4);
    {  // add_inplace
      std::vector<float> want = a;
      cpu::add_inplace(want.data(), b.data(), n);
      DevBuf dz(a);
      CU_OK(cu::add_inplace(dz.as<float>(), db.as<float>(), n, s));
      EXPECT_TRUE(bits_equal(dz.get<float>(n).data(), want.data(), n)) << "add_inplace";
    }
    {  // scale_inplace, add_scale: z = (z + t) * s as the Gemma 4 per-layer input does it
      std::vector<float> want(n), want2(n);
      for (int64_t i = 0; i < n; ++i) want[i] = a[i] * 0.70710678f;
      for (int64_t i = 0; i < n; ++i) want2[i] = (a[i] + b[i]) * 0.70710678f;
      DevBuf dz(a), dz2(a);
      CU_OK(cu::scale_inplace(dz.as<float>(), 0.70710678f, n, s));
      CU_OK(cu::add_scale(dz2.as<float>(), db.as<float>(), 0.70710678f, n, s));
      EXPECT_TRUE(bits_equal(dz.get<float>(n).data(), want.data(), n)) << "scale_inplace";
      EXPECT_TRUE(bits_equal(dz2.get<float>(n).data(), want2.data(), n)) << "add_scale";
    }
    {  // gelu_mul
      Stats st{"gelu_mul n=" + std::to_string(n)};
      std::vector<float> want(n);
      cpu::gelu_mul(a.data(), b.data(), want.data(), n);
      CU_OK(cu::gelu_mul(da.as<float>(), db.as<float>(), dout.as<float>(), n, s));
      const std::vector<float> got = dout.get<float>(n);
      st.add(got.data(), want.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double tol = 0.5 * std::fabs(double(a[i]) * b[i]) * dt + 4 * ulp(want[i]);
        ASSERT_LE(std::fabs(double(got[i]) - want[i]), tol) << "gelu_mul i " << i << " g " << a[i];
      }
    }
    {  // softcap (Gemma's final logits: cap 30, inputs over +-100)
      Stats st{"softcap n=" + std::to_string(n)};
      const float cap = 30.0f;
      std::vector<float> in(n), want(n);
      for (int64_t i = 0; i < n; ++i) in[i] = a[i] * 25.0f;
      for (int64_t i = 0; i < n; ++i) want[i] = cap * std::tanh(in[i] / cap);
      DevBuf dz(in);
      CU_OK(cu::softcap(dz.as<float>(), n, cap, s));
      const std::vector<float> got = dz.get<float>(n);
      st.add(got.data(), want.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_LE(std::fabs(double(got[i]) - want[i]), cap * dt + 2 * ulp(want[i])) << "softcap i " << i;
      }
    }
  }
  {  // copy_cols
    const int n_rows = 33;
    const int64_t stride = 700, col0 = 123, width = 333;
    const std::vector<float> src = randn(size_t(n_rows) * stride, rng);
    std::vector<float> want(size_t(n_rows) * width);
    for (int r = 0; r < n_rows; ++r) {
      std::memcpy(&want[size_t(r) * width], &src[size_t(r) * stride + col0], width * 4);
    }
    DevBuf dsrc(src), ddst(want.size() * 4);
    CU_OK(cu::copy_cols(dsrc.as<float>(), stride, col0, ddst.as<float>(), width, n_rows, s));
    EXPECT_TRUE(bits_equal(ddst.get<float>(want.size()).data(), want.data(), want.size())) << "copy_cols";
  }
}

// ---- KV rings -----------------------------------------------------------------------------

// kv_type.h's BF16 rounding: nearest even on the top 16 bits; a NaN stays a quiet NaN.
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x40u);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// One row of n floats in KvType t's bytes, from kv_type.h's description (Q8_0 through the
// activation quantizer quant::quantize_row_to, whose d is the f16-rounded scale).
inline std::vector<uint8_t> kv_encode(KvType t, const float *x, int64_t n) {
  std::vector<uint8_t> out(kv_row_bytes(t, n));
  switch (t) {
    case KvType::F32: std::memcpy(out.data(), x, n * 4); break;
    case KvType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = quant::fp32_to_fp16(x[i]);
        std::memcpy(&out[2 * i], &h, 2);
      }
      break;
    case KvType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = bf16_bits(x[i]);
        std::memcpy(&out[2 * i], &h, 2);
      }
      break;
    case KvType::Q8_0: {
      std::vector<float> d(n / 32);
      std::vector<int8_t> q(n);
      quant::quantize_row_to(quant::ActFormat::Q8_0, x, n, d.data(), q.data());
      for (int64_t b = 0; b < n / 32; ++b) {
        const uint16_t h = quant::fp32_to_fp16(d[b]);
        std::memcpy(&out[34 * b], &h, 2);
        std::memcpy(&out[34 * b + 2], &q[32 * b], 32);
      }
      break;
    }
  }
  return out;
}

// A row of KvType t's bytes back to f32 (the CPU attention's view of a typed cache).
inline void kv_decode(KvType t, const uint8_t *row, int64_t n, float *out) {
  switch (t) {
    case KvType::F32: std::memcpy(out, row, n * 4); break;
    case KvType::F16: quant::dequantize_row(GgmlType::F16, row, out, n); break;
    case KvType::BF16: quant::dequantize_row(GgmlType::BF16, row, out, n); break;
    case KvType::Q8_0: quant::dequantize_row(GgmlType::Q8_0, row, out, n); break;
  }
}

// greedy_rows against a scan that moves to i whenever x[i] > x[best] (the sampler's greedy
// rule, written out here): rows with ties inside and across the kernel's segments, NaNs (at
// 0, in runs, everywhere), infinities, signed zeros, the largest value last; several rows
// per call, each row its own pattern, over widths from 1 to a Gemma vocabulary.
CUDA_TEST(CudaOps, GreedyRowsIsTheScan) {
  REQUIRE_CUDA();
  const cu::CudaStream s = cuda_env().s;
  const float nan = std::nanf(""), inf = INFINITY;
  std::mt19937 rng(77);
  auto scan = [](const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (x[i] > x[best]) best = i;
    }
    return best;
  };
  // Row pattern p of width n.
  auto make_row = [&](int p, int64_t n) {
    std::vector<float> x = randn(size_t(n), rng);
    std::uniform_int_distribution<int64_t> at(0, n - 1);
    switch (p) {
      case 0: break;                                               // random
      case 1:  // ties anywhere
        for (int k = 0; k < 5; ++k) x[size_t(at(rng))] = 9.0f;
        break;
      case 2: x[0] = nan; break;                                   // NaN at 0: 0
      case 3: std::fill(x.begin(), x.end(), nan); break;           // every NaN: 0
      case 4:  // every other element NaN, the largest last
        for (int64_t i = 0; i < n; i += 2) x[size_t(i)] = nan;
        x[size_t(n - 1)] = 50.0f;
        break;
      case 5: std::fill(x.begin(), x.end(), -inf); break;          // all -inf: 0
      case 6: std::fill(x.begin(), x.end(), 0.0f); x[0] = -0.0f; break;  // zeros, -0 first: 0
      case 7: x[size_t(n - 1)] = inf; x[size_t(n / 2)] = inf; break;     // +inf twice
      case 8: x[size_t(n - 1)] = 100.0f; break;                    // the largest last
      case 9: std::fill(x.begin(), x.begin() + (n + 1) / 2, nan); x[size_t(n - 1)] = -1.0f; break;
      default: break;
    }
    return x;
  };
  constexpr int kPatterns = 10;
  int cases = 0;
  for (int64_t n : {int64_t(1), int64_t(31), int64_t(256), int64_t(257), int64_t(4097), int64_t(65539),
                    int64_t(262144)}) {
    for (int rows : {1, 3, kPatterns}) {
      std::vector<float> x;
      std::vector<int32_t> want;
      for (int r = 0; r < rows; ++r) {
        const std::vector<float> row = make_row((r + rows) % kPatterns, n);
        x.insert(x.end(), row.begin(), row.end());
        want.push_back(int32_t(scan(row.data(), n)));
      }
      DevBuf dx(x), dout(size_t(rows) * 4), dscratch(cu::greedy_scratch_bytes(rows));
      CU_OK(cu::greedy_rows(dx.as<float>(), n, rows, dout.as<int32_t>(), dscratch.as(), s));
      const std::vector<int32_t> got = dout.get<int32_t>(size_t(rows));
      for (int r = 0; r < rows; ++r) {
        EXPECT_EQ(got[size_t(r)], want[size_t(r)]) << "width " << n << " row " << r << " of " << rows;
        ++cases;
      }
    }
  }
  DevBuf d1(16);
  EXPECT_FALSE(cu::greedy_rows(d1.as<float>(), 0, 1, d1.as<int32_t>(), d1.as(), s).is_ok());
  EXPECT_FALSE(cu::greedy_rows(nullptr, 4, 1, d1.as<int32_t>(), d1.as(), s).is_ok());
  std::printf("RESULT greedy_rows %d rows: the scan's index\n", cases);
}

// The two ways sample_rows finds a row's candidates (cuda::DrawAlgo): each must give the
// host's token.
const cu::DrawAlgo kDrawAlgos[] = {cu::DrawAlgo::kSort, cu::DrawAlgo::kSelect};

// sample_rows (the sampled draw on the device) against the host's draw_sampled (what the
// sampler runs) on the same rows and uniforms: random rows, ties everywhere, NaNs (sprinkled,
// everywhere), -inf and signed zeros among the candidates, +inf (NaN weights), over widths
// from 1 to a Gemma vocabulary, several rows per call with their own params (top-k 1 to
// 256, top-p and min-p on and off) and rows not sampled (left as they were); then one tied
// row drawn hot by 64 uniforms, which walks the pick across its candidates' order.
CUDA_TEST(CudaOps, SampleRowsEqualsTheHostDraw) {
  REQUIRE_CUDA();
  const cu::CudaStream s = cuda_env().s;
  const float nan = std::nanf(""), inf = INFINITY;
  std::mt19937 rng(91);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  auto make_row = [&](int p, int64_t n) {
    std::vector<float> x = randn(size_t(n), rng, 3.0f);
    std::uniform_int_distribution<int64_t> at(0, n - 1);
    switch (p) {
      case 0: break;
      case 1: for (float &v : x) v = std::round(v); break;  // ties everywhere
      case 2: for (int k = 0; k < int(n / 7) + 1; ++k) x[size_t(at(rng))] = nan; break;
      case 3: std::fill(x.begin(), x.end(), nan); break;  // no candidate: 0
      case 4: for (float &v : x) v = v < 1.0f ? -inf : v; break;
      case 5: for (float &v : x) v = std::round(v) == 0.0f ? (v < 0 ? -0.0f : 0.0f) : v - 9.0f; break;
      case 6: x[size_t(at(rng))] = inf; break;
      case 7: std::fill(x.begin(), x.end(), 1.5f); x[size_t(at(rng))] = nan; break;  // all tied
      default: break;
    }
    return x;
  };
  constexpr int kPatterns = 8;
  const DrawSpec kinds[] = {{0.8f, 40, 0.95f, 0.05f, 0}, {1.5f, 1, 1.0f, 0.0f, 0},   {2.0f, 64, 1.0f, 0.0f, 0},
                            {5.0f, 65, 1.0f, 0.0f, 0},   {1.0f, 256, 0.99f, 0.0f, 0}, {0.3f, 17, 0.5f, 0.2f, 0},
                            {0.0f, 0, 1.0f, 0.0f, 0}};  // the last: not sampled
  constexpr int kKinds = 7;
  std::vector<std::pair<float, int32_t>> cand;
  std::vector<double> pr;
  int cases = 0;
  for (int64_t n : {int64_t(1), int64_t(31), int64_t(257), int64_t(4096), int64_t(4097), int64_t(65539),
                    int64_t(262144)}) {
    for (int rows : {1, 3, 9}) {
      for (int round = 0; round < 2; ++round) {
        std::vector<float> x;
        std::vector<DrawSpec> specs;
        std::vector<int32_t> want;
        int max_k = 0;
        for (int r = 0; r < rows; ++r) {
          const std::vector<float> row = make_row((r + rows + round) % kPatterns, n);
          x.insert(x.end(), row.begin(), row.end());
          DrawSpec d = kinds[(r + 2 * round + int(n % 5)) % kKinds];
          d.u = uni(rng);
          specs.push_back(d);
          if (d.temperature > 0) {
            max_k = std::max(max_k, d.top_k);
            want.push_back(draw_sampled(row.data(), n, size_t(d.top_k), d.temperature, d.top_p, d.min_p, d.u, cand, pr));
          } else {
            want.push_back(-5);
          }
        }
        if (max_k == 0) continue;
        for (int k : {max_k <= 64 ? 64 : 256, 256}) {
          for (cu::DrawAlgo algo : kDrawAlgos) {
            DevBuf dx(x), dspec(specs), dout(std::vector<int32_t>(size_t(rows), -5)),
                dscratch(cu::sample_scratch_bytes(n, rows, k));
            CU_OK(cu::sample_rows(dx.as<float>(), n, rows, dspec.as<DrawSpec>(), k, dout.as<int32_t>(), dscratch.as(), s,
                                  algo));
            const std::vector<int32_t> got = dout.get<int32_t>(size_t(rows));
            for (int r = 0; r < rows; ++r) {
              EXPECT_EQ(got[size_t(r)], want[size_t(r)])
                  << "width " << n << " row " << r << " of " << rows << " k " << k << " top_k "
                  << specs[size_t(r)].top_k << " pattern " << (r + rows + round) % kPatterns << " algo "
                  << (algo == cu::DrawAlgo::kSelect ? "select" : "sort");
              ++cases;
            }
          }
        }
      }
    }
  }
  // One row with ties everywhere, hot and with every candidate kept, drawn with 64 uniforms
  // across [0, 1): the picks go through the candidates in their order.
  const int64_t n = 100000;
  std::vector<float> row = make_row(1, n), x;
  std::vector<DrawSpec> specs;
  std::vector<int32_t> want;
  for (int r = 0; r < 64; ++r) {
    x.insert(x.end(), row.begin(), row.end());
    specs.push_back({100.0f, 256, 1.0f, 0.0f, (r + 0.5) / 64});
    want.push_back(draw_sampled(row.data(), n, 256, 100.0f, 1.0f, 0.0f, specs.back().u, cand, pr));
  }
  DevBuf dx(x), dspec(specs), dout(size_t(64) * 4), dscratch(cu::sample_scratch_bytes(n, 64, 256));
  for (cu::DrawAlgo algo : kDrawAlgos) {
    CU_OK(cu::sample_rows(dx.as<float>(), n, 64, dspec.as<DrawSpec>(), 256, dout.as<int32_t>(), dscratch.as(), s, algo));
    const std::vector<int32_t> got = dout.get<int32_t>(64);
    EXPECT_EQ(got, want) << (algo == cu::DrawAlgo::kSelect ? "select" : "sort");
  }
  EXPECT_GT(std::set<int32_t>(want.begin(), want.end()).size(), 40u) << "the sweep should reach many candidates";
  DevBuf d1(64);
  EXPECT_FALSE(cu::sample_rows(d1.as<float>(), 0, 1, d1.as<DrawSpec>(), 64, d1.as<int32_t>(), d1.as(), s).is_ok());
  EXPECT_FALSE(cu::sample_rows(d1.as<float>(), 4, 1, d1.as<DrawSpec>(), 257, d1.as<int32_t>(), d1.as(), s).is_ok());
  EXPECT_FALSE(cu::sample_rows(nullptr, 4, 1, d1.as<DrawSpec>(), 64, d1.as<int32_t>(), d1.as(), s).is_ok());
  std::printf("RESULT sample_rows %d rows + 64 uniforms: the host's draw\n", cases);
}

const KvType kKvTypes[] = {KvType::F32, KvType::F16, KvType::BF16, KvType::Q8_0};

// kv_append: rows land at (pos0 + r) % capacity with exactly kv_type.h's bytes, wrapping the
// ring; untouched slots keep their bytes. Then positions move ring <-> host, ring -> ring and
// ring <-> a device block.
// kv_append_kv_seqs: K and V rows of two sequences (one wrapping its ring) in one launch,
// byte-equal to the rows encoded on the host; the rest of every ring untouched.
CUDA_TEST(CudaOps, KvAppendKAndVInOneLaunch) {
  REQUIRE_CUDA();
  std::mt19937 rng(23);
  cu::CudaStream s = cuda_env().s;
  for (KvType t : kKvTypes) {
    for (int64_t row_elems : {32, 512}) {
      SCOPED_TRACE(std::string(kv_type_name(t)) + " row_elems " + std::to_string(row_elems));
      const size_t rb = kv_row_bytes(t, row_elems);
      const int64_t caps[2] = {6, 9}, pos0[2] = {4, 0};
      const int rows[2] = {3, 2};
      const int n_rows = rows[0] + rows[1];
      const std::vector<float> k = randn(size_t(n_rows) * row_elems, rng, 3.0f);
      const std::vector<float> v = randn(size_t(n_rows) * row_elems, rng, 3.0f);
      DevBuf dk(k), dv(v);
      std::vector<std::vector<uint8_t>> want_k, want_v;
      std::vector<std::unique_ptr<DevBuf>> bufs;
      cu::SeqRings sq;
      sq.n = 2;
      int r0 = 0;
      for (int i = 0; i < 2; ++i) {
        want_k.emplace_back(size_t(caps[i]) * rb, uint8_t(0x5A));
        want_v.emplace_back(size_t(caps[i]) * rb, uint8_t(0xC3));
        bufs.push_back(std::make_unique<DevBuf>(want_k.back()));
        sq.k[i] = bufs.back()->as();
        bufs.push_back(std::make_unique<DevBuf>(want_v.back()));
        sq.v[i] = bufs.back()->as();
        bufs.push_back(std::make_unique<DevBuf>(std::vector<int64_t>{pos0[i]}));
        sq.pos0[i] = bufs.back()->as<int64_t>();
        sq.capacity[i] = caps[i];
        for (int r = 0; r < rows[i]; ++r) {
          const size_t slot = size_t((pos0[i] + r) % caps[i]);
          const std::vector<uint8_t> ek = kv_encode(t, &k[size_t(r0 + r) * row_elems], row_elems);
          const std::vector<uint8_t> ev = kv_encode(t, &v[size_t(r0 + r) * row_elems], row_elems);
          std::memcpy(&want_k[i][slot * rb], ek.data(), rb);
          std::memcpy(&want_v[i][slot * rb], ev.data(), rb);
        }
        r0 += rows[i];
        sq.row0[i + 1] = r0;
      }
      CU_OK(cu::kv_append_kv_seqs(t, sq, row_elems, dk.as<float>(), dv.as<float>(), s));
      for (int i = 0; i < 2; ++i) {
        const std::vector<uint8_t> gk = bufs[size_t(3 * i)]->get<uint8_t>(want_k[i].size());
        const std::vector<uint8_t> gv = bufs[size_t(3 * i + 1)]->get<uint8_t>(want_v[i].size());
        EXPECT_EQ(std::memcmp(gk.data(), want_k[i].data(), gk.size()), 0) << "K, sequence " << i;
        EXPECT_EQ(std::memcmp(gv.data(), want_v[i].data(), gv.size()), 0) << "V, sequence " << i;
      }
    }
  }
}

// head_norm_rope_store (the K/V stores fused into the head norms and RoPE) against
// head_norm_rope and then kv_append_seqs for K and V: memcmp of the tensors and of every ring,
// Gemma 3's layout (v stored, not normalized) and Gemma 4's (v normalized without a weight),
// one and two sequences (the second's ring wraps), every KV type.
CUDA_TEST(CudaOps, HeadNormRopeStoreIsOpsThenAppend) {
  REQUIRE_CUDA();
  std::mt19937 rng(29);
  cu::CudaStream s = cuda_env().s;
  for (KvType t : kKvTypes) {
    for (int head_dim : {64, 256, 512}) {
      for (bool gemma4 : {false, true}) {
        for (int n_seq : {1, 2}) {
          SCOPED_TRACE(std::string(kv_type_name(t)) + " hd " + std::to_string(head_dim) + (gemma4 ? " gemma4" : " gemma3") +
                       " seqs " + std::to_string(n_seq));
          const int heads[3] = {8, 2, 2};
          const int64_t re = int64_t(heads[1]) * head_dim;
          const size_t rb = kv_row_bytes(t, re);
          const int64_t caps[2] = {6, 9}, pos0[2] = {4, 0};
          const int rows[2] = {n_seq == 1 ? 1 : 3, 2};
          int n_rows = 0;
          for (int i = 0; i < n_seq; ++i) n_rows += rows[i];
          cpu::RopeTable table;
          table.init(1e6, head_dim, 1.0, nullptr);
          std::vector<float> cs(size_t(n_rows) * head_dim);
          table.fill(int64_t(rng() % 100000), n_rows, cs.data());
          DevBuf dcs(cs);
          // Two copies of q, k, v and of every ring: [0] the separate ops, [1] the fused one.
          std::vector<std::unique_ptr<DevBuf>> x[2], ring_k[2], ring_v[2], pos;
          std::vector<float> host[3];
          for (int i = 0; i < 3; ++i) host[i] = randn(size_t(n_rows) * heads[i] * head_dim, rng, 3.0f);
          const std::vector<float> gq = randn(size_t(head_dim), rng), gk = randn(size_t(head_dim), rng);
          DevBuf dgq(gq), dgk(gk);
          cu::SeqRings sq[2];
          for (int c = 0; c < 2; ++c) {
            for (int i = 0; i < 3; ++i) x[c].push_back(std::make_unique<DevBuf>(host[i]));
            sq[c].n = n_seq;
            int r0 = 0;
            for (int i = 0; i < n_seq; ++i) {
              ring_k[c].push_back(std::make_unique<DevBuf>(std::vector<uint8_t>(size_t(caps[i]) * rb, 0x5A)));
              ring_v[c].push_back(std::make_unique<DevBuf>(std::vector<uint8_t>(size_t(caps[i]) * rb, 0xC3)));
              pos.push_back(std::make_unique<DevBuf>(std::vector<int64_t>{pos0[i]}));
              sq[c].k[i] = ring_k[c].back()->as();
              sq[c].v[i] = ring_v[c].back()->as();
              sq[c].pos0[i] = pos.back()->as<int64_t>();
              sq[c].capacity[i] = caps[i];
              r0 += rows[i];
              sq[c].row0[i + 1] = r0;
            }
          }
          auto make_set = [&](int c) {
            cu::HeadNormSet set;
            set.n = gemma4 ? 3 : 2;
            for (int i = 0; i < set.n; ++i) {
              set.x[i] = x[c][size_t(i)]->as<float>();
              set.n_heads[i] = heads[i];
              set.rope[i] = i < 2;
            }
            set.g[0] = dgq.as<float>();
            set.g[1] = dgk.as<float>();
            return set;
          };
          CU_OK(cu::head_norm_rope(make_set(0), n_rows, head_dim, 1e-6f, dcs.as<float>(), s));
          CU_OK(cu::kv_append_seqs(t, sq[0], false, re, x[0][1]->as<float>(), s));
          CU_OK(cu::kv_append_seqs(t, sq[0], true, re, x[0][2]->as<float>(), s));
          cu::HeadNormSet fused = make_set(1);
          if (!gemma4) {  // v only stored, as the backend adds it
            fused.n = 3;
            fused.x[2] = x[1][2]->as<float>();
            fused.n_heads[2] = heads[2];
            fused.norm[2] = false;
          }
          fused.ring[1] = 0;
          fused.ring[2] = 1;
          CU_OK(cu::head_norm_rope_store(fused, n_rows, head_dim, 1e-6f, dcs.as<float>(), t, sq[1], s));
          for (int i = 0; i < 3; ++i) {
            const size_t n = host[i].size();
            EXPECT_TRUE(bits_equal(x[0][size_t(i)]->get<float>(n).data(), x[1][size_t(i)]->get<float>(n).data(), n))
                << "tensor " << i;
          }
          for (int i = 0; i < n_seq; ++i) {
            const size_t n = size_t(caps[i]) * rb;
            const std::vector<uint8_t> k0 = ring_k[0][size_t(i)]->get<uint8_t>(n), k1 = ring_k[1][size_t(i)]->get<uint8_t>(n);
            const std::vector<uint8_t> v0 = ring_v[0][size_t(i)]->get<uint8_t>(n), v1 = ring_v[1][size_t(i)]->get<uint8_t>(n);
            EXPECT_EQ(std::memcmp(k0.data(), k1.data(), n), 0) << "K ring of sequence " << i;
            EXPECT_EQ(std::memcmp(v0.data(), v1.data(), n), 0) << "V ring of sequence " << i;
          }
          if (head_dim == 64 && !gemma4 && n_seq == 1) {  // bad input: errors, nothing launched
            EXPECT_FALSE(cu::head_norm_rope_store(fused, n_rows, 48, 1e-6f, dcs.as<float>(), t, sq[1], s).is_ok());
            EXPECT_FALSE(cu::head_norm_rope_store(fused, n_rows + 1, head_dim, 1e-6f, dcs.as<float>(), t, sq[1], s).is_ok());
            cu::HeadNormSet bad = fused;
            bad.ring[0] = 2;
            EXPECT_FALSE(cu::head_norm_rope_store(bad, n_rows, head_dim, 1e-6f, dcs.as<float>(), t, sq[1], s).is_ok());
          }
        }
      }
    }
  }
}

CUDA_TEST(CudaOps, KvAppendCopyReadWrite) {
  REQUIRE_CUDA();
  std::mt19937 rng(21);
  cu::CudaStream s = cuda_env().s;
  for (KvType t : kKvTypes) {
    for (int64_t row_elems : {32, 256, 2048}) {
      const int64_t cap = 10;
      const size_t rb = kv_row_bytes(t, row_elems);
      std::vector<uint8_t> ring(cap * rb, 0xAB);
      DevBuf dring(ring);
      for (auto [pos0, n_rows] : std::vector<std::pair<int64_t, int>>{{7, 5}, {20, 1}, {33, 10}, {0, 3}}) {
        std::vector<float> x = randn(size_t(n_rows) * row_elems, rng, 4.0f);
        if (n_rows > 1) std::fill(x.begin() + row_elems, x.begin() + row_elems + 32, 0.0f);  // a zero block
        for (int r = 0; r < n_rows; ++r) {
          const std::vector<uint8_t> enc = kv_encode(t, &x[size_t(r) * row_elems], row_elems);
          std::memcpy(&ring[size_t((pos0 + r) % cap) * rb], enc.data(), rb);
        }
        DevBuf dx(x), dpos(std::vector<int64_t>{pos0});
        CU_OK(cu::kv_append(t, dring.as(), cap, row_elems, dpos.as<int64_t>(), n_rows, dx.as<float>(), s));
        const std::vector<uint8_t> got = dring.get<uint8_t>(ring.size());
        ASSERT_EQ(std::memcmp(got.data(), ring.data(), ring.size()), 0)
            << kv_type_name(t) << " row_elems " << row_elems << " pos0 " << pos0;
      }
      // Read positions [27, 35) (wrapping slots 7..9, 0..4) as a dense block.
      std::vector<uint8_t> dense(8 * rb);
      CU_OK(cu::kv_read_positions(t, dring.as(), cap, row_elems, 27, 35, dense.data(), s));
      CU_OK(cu::stream_sync(s));
      for (int64_t p = 27; p < 35; ++p) {
        ASSERT_EQ(std::memcmp(&dense[size_t(p - 27) * rb], &ring[size_t(p % cap) * rb], rb), 0) << p;
      }
      // Write them to another ring of capacity 7 at the same positions, copy those to a third
      // ring of capacity 9 on the device, read back: the same rows.
      DevBuf r7(7 * rb), r9(9 * rb);
      std::vector<uint8_t> back(8 * rb - rb);
      CU_OK(cu::kv_write_positions(t, r7.as(), 7, row_elems, 28, 35, dense.data() + rb, s));
      CU_OK(cu::kv_copy_positions(t, r7.as(), 7, r9.as(), 9, row_elems, 28, 35, s));
      CU_OK(cu::kv_read_positions(t, r9.as(), 9, row_elems, 28, 35, back.data(), s));
      CU_OK(cu::stream_sync(s));
      ASSERT_EQ(std::memcmp(back.data(), dense.data() + rb, back.size()), 0) << kv_type_name(t);
      // The dense block may be device memory too (saved session states): ring -> device
      // block -> another ring, never through the host, then read back.
      DevBuf dblock(8 * rb), r11(11 * rb);
      CU_OK(cu::kv_read_positions(t, dring.as(), cap, row_elems, 27, 35, dblock.as(), s));
      CU_OK(cu::kv_write_positions(t, r11.as(), 11, row_elems, 27, 35, dblock.as(), s));
      CU_OK(cu::stream_sync(s));
      ASSERT_EQ(dblock.get<uint8_t>(8 * rb), dense) << kv_type_name(t);
      std::vector<uint8_t> back11(8 * rb);
      CU_OK(cu::kv_read_positions(t, r11.as(), 11, row_elems, 27, 35, back11.data(), s));
      CU_OK(cu::stream_sync(s));
      ASSERT_EQ(back11, dense) << kv_type_name(t);
    }
  }
}

// ---- attention --------------------------------------------------------------------------------

struct AttnCase {
  int n_rows, n_head, n_head_kv, head_dim, window;
  int64_t pos0, capacity;
  KvType kt, vt;
};

struct AttnResult {
  std::vector<float> got, want;
  double max_abs_v = 0;
  // quant_block != 0: the quantized output's scratch bytes, and those of quantize_rows(got).
  std::vector<uint8_t> quant, quant_want;
};

// Builds the rings (every visible position written through kv_append in chunks), runs the
// device attention and the CPU generic attention over the dequantized rings.
// split: the fast path (scratch given); else the reference kernel.
inline AttnResult run_attention(const AttnCase &c, std::mt19937 &rng, int chunk = 0, bool split = true,
                                bool any_head_dim = false, bool single_query = false, bool merge_counters = false,
                                int quant_block = 0) {
  ThreadPool pool(8);
  cu::CudaStream s = cuda_env().s;
  const int64_t row = int64_t(c.n_head_kv) * c.head_dim;
  const int64_t p_end = c.pos0 + c.n_rows;
  const int64_t p_begin =
      c.window > 0 ? std::max<int64_t>(0, c.pos0 - c.window + 1) : 0;  // oldest position any query sees
  DevBuf dk(c.capacity * kv_row_bytes(c.kt, row)), dv(c.capacity * kv_row_bytes(c.vt, row));
  auto ok = [](Status st) {
    if (!st) throw std::runtime_error(st.message());
  };
  ok(cu::memset_async(dk.as(), 0, c.capacity * kv_row_bytes(c.kt, row), s));
  ok(cu::memset_async(dv.as(), 0, c.capacity * kv_row_bytes(c.vt, row), s));
  AttnResult res;
  for (int64_t p = p_begin; p < p_end;) {
    const int n = int(std::min<int64_t>({p_end - p, c.capacity, 512}));
    const std::vector<float> k = randn(size_t(n) * row, rng, 1.0f), v = randn(size_t(n) * row, rng, 1.0f);
    for (float e : v) res.max_abs_v = std::max(res.max_abs_v, double(std::fabs(e)));
    DevBuf dkk(k), dvv(v), dp(std::vector<int64_t>{p});
    ok(cu::kv_append(c.kt, dk.as(), c.capacity, row, dp.as<int64_t>(), n, dkk.as<float>(), s));
    ok(cu::kv_append(c.vt, dv.as(), c.capacity, row, dp.as<int64_t>(), n, dvv.as<float>(), s));
    ok(cu::stream_sync(s));
    p += n;
  }
  // The CPU's f32 view of the typed rings.
  const std::vector<uint8_t> kb = dk.get<uint8_t>(c.capacity * kv_row_bytes(c.kt, row));
  const std::vector<uint8_t> vb = dv.get<uint8_t>(c.capacity * kv_row_bytes(c.vt, row));
  std::vector<float> kf(c.capacity * row), vf(c.capacity * row);
  for (int64_t i = 0; i < c.capacity; ++i) {
    kv_decode(c.kt, &kb[i * kv_row_bytes(c.kt, row)], row, &kf[i * row]);
    kv_decode(c.vt, &vb[i * kv_row_bytes(c.vt, row)], row, &vf[i * row]);
  }
  const std::vector<float> q = randn(size_t(c.n_rows) * c.n_head * c.head_dim, rng, 1.0f);
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  res.want.resize(q.size());
  cpu::AttentionArgs a{q.data(), kf.data(), vf.data(), res.want.data(), c.n_rows, c.pos0, c.capacity,
                       c.n_head, c.n_head_kv, c.head_dim, c.window, scale};
  cpu::attention_on_tier(cpu::Isa::Generic, a, pool);

  DevBuf dq(q), dout(q.size() * 4);
  // Sized for the whole call: the many-queries kernel then takes up to 256 queries a launch.
  const size_t scratch_bytes = cu::attention_scratch_bytes(c.n_head, c.head_dim, c.n_rows);
  DevBuf scratch(scratch_bytes);
  const size_t n_cnt = cu::attention_counter_bytes(c.n_head) / sizeof(unsigned);
  DevBuf counters(std::vector<unsigned>(n_cnt, 0u));
  const int step = chunk > 0 ? chunk : c.n_rows;
  std::vector<int64_t> pos;
  for (int r0 = 0; r0 < c.n_rows; r0 += step) pos.push_back(c.pos0 + r0);
  DevBuf dpos(pos);  // one pos0 per call, as a per-call step block would hold it
  const int64_t qk = int64_t(c.n_head) * c.head_dim;
  const size_t quant_bytes =
      quant_block ? (size_t(c.n_rows) * qk + 255) / 256 * 256 + size_t(c.n_rows) * (qk / quant_block) * 4 : 0;
  DevBuf qscratch(std::vector<uint8_t>(std::max<size_t>(quant_bytes, 1), 0x77));
  if (quant_block && chunk > 0) throw std::runtime_error("quantized attention output: one call");
  for (int r0 = 0, i = 0; r0 < c.n_rows; r0 += step, ++i) {
    cu::AttnArgs g;
    g.q = dq.as<float>() + size_t(r0) * c.n_head * c.head_dim;
    g.k = dk.as();
    g.v = dv.as();
    g.k_type = c.kt;
    g.v_type = c.vt;
    g.out = dout.as<float>() + size_t(r0) * c.n_head * c.head_dim;
    g.n_rows = std::min(step, c.n_rows - r0);
    g.pos0 = dpos.as<int64_t>() + i;
    g.capacity = c.capacity;
    g.n_head = c.n_head;
    g.n_head_kv = c.n_head_kv;
    g.head_dim = c.head_dim;
    g.window = c.window;
    g.scale = scale;
    g.scratch = split ? scratch.as() : nullptr;
    g.scratch_bytes = split ? scratch_bytes : 0;
    g.any_head_dim = any_head_dim;
    g.single_query = single_query;
    g.merge_counters = merge_counters ? counters.as<unsigned>() : nullptr;
    g.quant_block = quant_block;
    g.quant_scratch = quant_block ? qscratch.as() : nullptr;
    ok(cu::attention(g, s));
  }
  res.got = dout.get<float>(q.size());
  if (quant_block) {
    res.quant = qscratch.get<uint8_t>(quant_bytes);
    DevBuf want(std::vector<uint8_t>(quant_bytes, 0x77));
    ok(cu::quantize_rows(dout.as<float>(), qk, c.n_rows, quant_block, want.as(), s));
    res.quant_want = want.get<uint8_t>(quant_bytes);
  }
  if (merge_counters) {  // every call leaves them zero
    for (unsigned v : counters.get<unsigned>(n_cnt)) {
      if (v != 0) throw std::runtime_error("attention left a merge counter at " + std::to_string(v));
    }
  }
  return res;
}

inline std::string describe(const AttnCase &c) {
  char buf[200];
  std::snprintf(buf, sizeof buf, "rows %d heads %d/%d hd %d window %d pos0 %lld cap %lld K %s V %s", c.n_rows,
                c.n_head, c.n_head_kv, c.head_dim, c.window, (long long)c.pos0, (long long)c.capacity,
                kv_type_name(c.kt), kv_type_name(c.vt));
  return buf;
}

// Attention against the CPU generic path over the same (dequantized) keys and values. Scores
// are bit-exact (the CPU's 16-lane dot); exp is evaluated in double and rounded once where the
// CPU calls expf (each within about half an ulp of the true value, so they can differ by one
// ulp). Reference kernel: the double sum of the exps is taken in another order, so every
// weight w_j carries a relative error of a few 2^-24 and the output sum_j w_j v_j,
// accumulated in the same order on both, differs by at most ~4 * 2^-24 * sum_j w_j |v_j|
// <= 2.4e-7 max|v|: tolerance 1e-6 * max|v|. Split kernel (the fast path): the weights are
// exp(s_j - m_c) * exp(m_c - M) / L with a few more roundings, and sum_j w_j v_j is grouped
// by 64-key chunk and 8 splits instead of one run over the keys; the CPU's own run of n
// float additions is accurate to n 2^-24 sum_j w_j |v_j| only, so the two differ by up to
// (n + 64 + 8 + 16) 2^-24 max|v| (n: the keys a query sees): that is the tolerance.
CUDA_TEST(CudaOps, AttentionMatchesCpuGeneric) {
  REQUIRE_CUDA();
  std::mt19937 rng(31);
  std::vector<AttnCase> cases;
  // Head dims and GQA ratios, global attention, all KV types.
  for (KvType t : kKvTypes) {
    for (int hd : {32, 64, 128, 256, 512}) {
      for (auto [nh, nkv] : std::vector<std::pair<int, int>>{{1, 1}, {2, 1}, {4, 1}, {8, 1}, {8, 2}, {4, 4}}) {
        if (hd >= 256 && nh > 4) continue;  // keep the CPU oracle's time down
        cases.push_back({7, nh, nkv, hd, 0, 40, 64, t, t});
      }
    }
  }
  // Ragged row counts at a cached length; windows 1, n and small; rings smaller than n_past
  // with positions across the wrap; mixed K/V types.
  for (int n : {1, 2, 3, 8, 9, 17, 33, 64, 65, 130}) cases.push_back({n, 4, 2, 64, 0, 100, 256, KvType::F32, KvType::F32});
  for (int w : {1, 2, 16, 130}) {
    cases.push_back({130, 2, 1, 64, w, 0, w + 129, KvType::F32, KvType::F32});           // from position 0
    cases.push_back({33, 4, 1, 128, w, 5 * (w + 32) - 3, w + 32, KvType::F16, KvType::Q8_0});  // across the wrap
  }
  cases.push_back({17, 8, 1, 256, 512, 3000, 512 + 16, KvType::BF16, KvType::BF16});  // Gemma-like sliding
  cases.push_back({3, 8, 2, 512, 0, 2500, 2600, KvType::Q8_0, KvType::F16});          // > 1 tile of keys
  cases.push_back({1, 8, 1, 256, 0, 4200, 4300, KvType::F32, KvType::F32});           // decode, 3 tiles
  Stats st{"attention"};
  size_t n_exact_cases = 0;
  for (const AttnCase &c : cases) {
    SCOPED_TRACE(describe(c));
    for (bool split : {false, true}) {
      std::mt19937 r2 = rng;  // the same rings and queries for both kernels
      const AttnResult r = run_attention(c, r2, 0, split);
      st.add(r.got.data(), r.want.data(), r.got.size());
      n_exact_cases += !split && std::memcmp(r.got.data(), r.want.data(), r.got.size() * 4) == 0;
      const int64_t keys = c.window > 0 ? std::min<int64_t>(c.window, c.pos0 + c.n_rows) : c.pos0 + c.n_rows;
      const double tol = split ? double(keys + 88) * std::ldexp(1.0, -24) * r.max_abs_v : 1e-6 * r.max_abs_v;
      double worst = 0;
      for (size_t i = 0; i < r.got.size(); ++i) worst = std::max(worst, std::fabs(double(r.got[i]) - r.want[i]));
      ASSERT_LE(worst, tol) << (split ? "split kernel" : "reference kernel");
      if (split) rng = r2;
    }
  }
  std::printf("attention (reference kernel): %zu of %zu cases bit-exact against the CPU generic path\n", n_exact_cases,
              cases.size());
}

// Batch invariance of attention on the device: the same queries in one call and in chunks of
// 1, 3, 7 and 64 rows (each chunk with its own pos0 in device memory) are memcmp-equal.
CUDA_TEST(CudaOps, AttentionBatchInvariantOnDevice) {
  REQUIRE_CUDA();
  for (const AttnCase &c : std::vector<AttnCase>{AttnCase{130, 4, 2, 64, 0, 77, 256, KvType::F32, KvType::F32},
                            AttnCase{130, 8, 1, 256, 48, 1000, 48 + 129, KvType::Q8_0, KvType::F16},
                            AttnCase{70, 2, 2, 512, 0, 2100, 2200, KvType::BF16, KvType::Q8_0}}) {
    SCOPED_TRACE(describe(c));
    std::mt19937 rng_a(41);  // the same seed, so the same rings and queries, for every run
    const AttnResult whole = run_attention(c, rng_a);
    for (int chunk : {1, 3, 7, 64}) {
      std::mt19937 rng(41);
      const AttnResult parts = run_attention(c, rng, chunk);
      ASSERT_TRUE(bits_equal(parts.got.data(), whole.got.data(), whole.got.size())) << "chunk " << chunk;
    }
  }
}

// The split kernel compiled for head dims 64/128/256/512 gives the bits of the one compiled
// for any head dim: decode (1 row) and prefill-like (33 rows) queries, global and sliding,
// rings that wrap, every KV type.
CUDA_TEST(CudaOps, AttentionFixedHeadDimSameBits) {
  REQUIRE_CUDA();
  for (KvType t : kKvTypes) {
    for (int hd : {64, 128, 256, 512}) {
      for (const AttnCase &c : std::vector<AttnCase>{AttnCase{1, 8, 2, hd, 0, 700, 800, t, t},
                                                     AttnCase{33, 4, 1, hd, 0, 130, 200, t, t},
                                                     AttnCase{9, 8, 2, hd, 100, 1000, 100 + 8, t, t}}) {
        SCOPED_TRACE(describe(c));
        std::mt19937 rng_a(43), rng_b(43);
        const AttnResult fixed = run_attention(c, rng_a, 0, true, false);
        const AttnResult any = run_attention(c, rng_b, 0, true, true);
        ASSERT_TRUE(bits_equal(fixed.got.data(), any.got.data(), any.got.size()));
      }
    }
  }
}

// The cases of the merge tests: decode (1 row), the one-query kernel on 70 rows (two row
// groups), a sliding window over a ring that wraps.
std::vector<AttnCase> merge_cases(KvType t, int hd) {
  return {AttnCase{1, 8, 2, hd, 0, 700, 800, t, t}, AttnCase{70, 4, 1, hd, 0, 130, 300, t, t},
          AttnCase{9, 8, 2, hd, 100, 1000, 100 + 8, t, t}};
}

// The split kernel merging its own splits (the last block of a query does it, counted in by
// AttnArgs::merge_counters) gives the merge kernel's bits, and leaves the counters zero for the
// next call: decode (1 row) and the one-query kernel on up to 70 rows (two row groups),
// global and sliding, rings that wrap, calls of 1 and 7 rows reusing the counters, every KV
// type, the fixed and the any head dim kernels.
CUDA_TEST(CudaOps, AttentionMergeInSplitSameBits) {
  REQUIRE_CUDA();
  for (KvType t : kKvTypes) {
    for (int hd : {64, 256, 512}) {
      for (const AttnCase &c : merge_cases(t, hd)) {
        for (int chunk : {0, 1, 7}) {
          for (bool any : {false, true}) {
            SCOPED_TRACE(describe(c) + " chunk " + std::to_string(chunk) + (any ? " any head dim" : ""));
            std::mt19937 rng_a(47), rng_b(47);
            const AttnResult sep = run_attention(c, rng_a, chunk, true, any, true, false);
            const AttnResult fused = run_attention(c, rng_b, chunk, true, any, true, true);
            ASSERT_TRUE(bits_equal(sep.got.data(), fused.got.data(), sep.got.size()));
          }
        }
      }
    }
  }
}

// The attention quantizing its output for the output projection (AttnArgs::quant_block):
// the outputs are those of the plain call and the scratch holds quantize_rows' bytes of
// them, through every path that merges (the split kernel with the merge kernel or its own
// merge, the many-queries kernel) and the reference kernel (quantized after it).
CUDA_TEST(CudaOps, AttentionQuantizedOutputSameBits) {
  REQUIRE_CUDA();
  for (KvType t : kKvTypes) {
    for (int hd : {64, 256, 512}) {
      for (const AttnCase &c : merge_cases(t, hd)) {
        for (int qb : {32, 256}) {
          if (hd % qb != 0) continue;
          // (split, single query, merge counters): the merge kernel, the split kernel's own
          // merge, the many-queries kernel, the reference kernel.
          for (auto [split, single, counters] : std::vector<std::tuple<bool, bool, bool>>{
                   {true, true, false}, {true, true, true}, {true, false, false}, {false, true, false}}) {
            SCOPED_TRACE(describe(c) + " block " + std::to_string(qb) + (split ? "" : " reference") +
                         (single ? "" : " many-queries") + (counters ? " own merge" : ""));
            std::mt19937 rng_a(53), rng_b(53);
            const AttnResult plain = run_attention(c, rng_a, 0, split, false, single, counters);
            const AttnResult quant = run_attention(c, rng_b, 0, split, false, single, counters, qb);
            ASSERT_TRUE(bits_equal(quant.got.data(), plain.got.data(), plain.got.size()));
            ASSERT_EQ(quant.quant.size(), quant.quant_want.size());
            EXPECT_EQ(std::memcmp(quant.quant.data(), quant.quant_want.data(), quant.quant.size()), 0);
          }
        }
      }
    }
  }
}

// The many-queries-per-block kernel (prefill) against the one-query kernel (decode): the
// same bits for every row, whatever the chunking of the rows into calls, across row groups
// (more than 64 rows), windows starting inside a chunk, ring wrap, GQA groups 1..8, every
// head dim it is compiled for and every KV type.
CUDA_TEST(CudaOps, AttentionMultiQuerySameBits) {
  REQUIRE_CUDA();
  std::vector<AttnCase> cases;
  for (KvType t : kKvTypes) {
    cases.push_back(AttnCase{130, 8, 2, 256, 0, 0, 130, t, t});        // causal from 0: one launch of 130 queries
    cases.push_back(AttnCase{77, 4, 1, 256, 512, 600, 512 + 77, t, t});  // sliding window, ring wraps
  }
  cases.push_back(AttnCase{40, 8, 2, 512, 0, 100, 140, KvType::F32, KvType::F32});
  cases.push_back(AttnCase{20, 8, 1, 128, 0, 33, 53, KvType::F16, KvType::F16});
  cases.push_back(AttnCase{17, 2, 2, 64, 16, 5, 40, KvType::F32, KvType::F32});       // window inside chunks
  cases.push_back(AttnCase{33, 4, 2, 64, 100, 1000, 100 + 33, KvType::BF16, KvType::BF16});
  cases.push_back(AttnCase{5, 16, 1, 256, 0, 70, 75, KvType::F32, KvType::F32});     // group 16: one row per tile
  cases.push_back(AttnCase{9, 8, 2, 256, 0, 0, 9, KvType::F16, KvType::Q8_0});       // mixed K and V types
  cases.push_back(AttnCase{300, 8, 2, 256, 0, 20, 320, KvType::F32, KvType::F32});   // one launch (5 of 64 in ctest's ATTN_ROWS_64)
  cases.push_back(AttnCase{600, 8, 2, 128, 0, 20, 620, KvType::F32, KvType::F32});   // launches of 512 and 88
  for (const AttnCase &c : cases) {
    SCOPED_TRACE(describe(c));
    std::mt19937 rng_a(7), rng_b(7), rng_c(7);
    const AttnResult one = run_attention(c, rng_a, 0, true, false, true);
    const AttnResult many = run_attention(c, rng_b, 0, true, false, false);
    ASSERT_TRUE(bits_equal(many.got.data(), one.got.data(), one.got.size()));
    const AttnResult chunked = run_attention(c, rng_c, 6, true, false, false);  // calls of 6 rows (the last fewer)
    ASSERT_TRUE(bits_equal(chunked.got.data(), one.got.data(), one.got.size()));
  }
}

}  // namespace
}  // namespace geist

namespace geist {
namespace {

// Timings of a few model-sized calls (information for the speed work, not a pass/fail check):
// run with --gtest_also_run_disabled_tests. Host clock around `iters` calls after a warm-up.
template <class F>
double time_ms(F &&f, int iters) {
  f();
  if (!cu::stream_sync(cuda_env().s)) return -1;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  if (!cu::stream_sync(cuda_env().s)) return -1;
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / iters;
}

CUDA_TEST(CudaOps, DISABLED_Perf) {
  REQUIRE_CUDA();
  std::mt19937 rng(3);
  cu::CudaStream s = cuda_env().s;
  const int64_t k = 2560, n = 10240;  // Gemma 4 E4B's FFN up/gate
  DevBuf dx(random_acts(512, n, rng)), dy(size_t(512) * 10752 * 4);
  {
    // The ceiling for streaming weights: a device-to-device copy of 1 GiB (read + write).
    const size_t bytes = size_t(1) << 30;
    DevBuf a(bytes), b(bytes);
    const double ms = time_ms([&] { (void)cu::copy_async(b.as(), a.as(), bytes, s); }, 5);
    std::printf("PERF copy 1 GiB device to device: %8.3f ms  %7.1f GB/s (read + write)\n", ms, 2.0 * bytes / (ms * 1e6));
  }
  struct Shape {
    GgmlType t;
    int64_t k, n;
    bool f32;
  };
  // E4B's FFN gate/up in four types, then its down and attention output projections, then
  // its BF16 per-layer-input gate, projection and model projection.
  const Shape shapes[] = {{GgmlType::Q4_K, k, n, true},       {GgmlType::Q6_K, k, n, true},
                          {GgmlType::Q8_0, k, n, true},       {GgmlType::F16, k, n, true},
                          {GgmlType::Q4_K, n, k, false},      {GgmlType::Q6_K, n, k, false},
                          {GgmlType::Q4_K, 2048, 2560, false},  {GgmlType::BF16, 2560, 256, true},
                          {GgmlType::BF16, 256, 2560, true},    {GgmlType::BF16, 2560, 10752, true}};
  for (const Shape &sh : shapes) {
    const GgmlType t = sh.t;
    const int64_t k = sh.k, n = sh.n;
    const std::vector<uint8_t> w1 = random_matrix(t, k, n, rng);
    // 8 copies, used in turn, so that the weights come from HBM and not the 50 MB L2.
    std::vector<uint8_t> w;
    for (int c = 0; c < 8; ++c) w.insert(w.end(), w1.begin(), w1.end());
    DevBuf dw(w);
    const cu::DevMatrix m = dev_matrix(dw, t, k, n);
    DevBuf scratch(std::max<size_t>(1, cu::matmul_scratch_bytes(m, 512)));
    for (cu::ActMode mode : {cu::ActMode::Q8, cu::ActMode::F32}) {
      if (mode == cu::ActMode::F32 && !sh.f32) continue;
      for (int rows : {1, 2, 4, 8, 9, 16, 17, 32, 33, 64, 65, 128, 512}) {
        int turn = 0;
        const double ms = time_ms(
            [&] {
              cu::DevMatrix mm = m;
              mm.data += size_t(turn++ % 8) * w1.size();
              (void)cu::matmul(mm, dx.as<float>(), dy.as<float>(), rows, mode, scratch.as(), s);
            },
            rows >= 64 ? 8 : 16);
        std::printf("PERF matmul %-5s %s %5lldx%-6lld rows %3d: %8.3f ms  %7.1f GB/s weights  %8.1f GFLOP/s\n",
                    quant::type_name(t), mode == cu::ActMode::Q8 ? "q8 " : "f32", (long long)k, (long long)n, rows, ms,
                    double(w1.size()) / (ms * 1e6), 2.0 * k * n * rows / (ms * 1e6));
      }
    }
  }
  DevBuf xn(randn(size_t(512) * 2560, rng));
  const double ms = time_ms([&] { (void)cu::rmsnorm(xn.as<float>(), nullptr, xn.as<float>(), 512, 2560, 1e-6f, s); }, 5);
  std::printf("PERF rmsnorm 512 x 2560: %.3f ms\n", ms);
  const double ms1 = time_ms([&] { (void)cu::rmsnorm(xn.as<float>(), nullptr, xn.as<float>(), 1, 2560, 1e-6f, s); }, 20);
  std::printf("PERF rmsnorm 1 x 2560: %.4f ms\n", ms1);
}

// Decode-shaped matmuls as a model's step runs them (--gtest_filter='*PerfDecode'
// --gtest_also_run_disabled_tests): 32 calls, each on its own copy of the weights (so they
// come from HBM, not the 50 MB L2), captured in one graph (launched with programmatic
// dependent launch, as the session's graphs are) and replayed; microseconds and GB/s of
// weights per call. Beside each, the ceiling at that size: a graph of 32 device-to-device
// copies of the same bytes (GB/s counts read + write).
CUDA_TEST(CudaOps, DISABLED_PerfDecode) {
  REQUIRE_CUDA();
  std::mt19937 rng(5);
  cu::CudaStream s = cuda_env().s;
  constexpr int kCalls = 32;
  DevBuf dx(random_acts(8, 10240, rng)), dy(size_t(8) * 10240 * 4 * 2);
  struct Shape {
    GgmlType t;
    int64_t k, n;
    int n_mat;  // matrices per call (gate and up together, as the model calls them)
    const char *what;
  };
  const Shape shapes[] = {{GgmlType::Q4_K, 2560, 10240, 2, "E4B gate+up"}, {GgmlType::Q4_K, 2560, 10240, 1, "E4B gate"},
                          {GgmlType::Q4_K, 10240, 2560, 1, "E4B down"},    {GgmlType::Q6_K, 10240, 2560, 1, "E4B down"},
                          {GgmlType::Q6_K, 2560, 10240, 1, "Q6_K up"},     {GgmlType::Q4_K, 2560, 2048, 1, "E4B q"},
                          {GgmlType::Q4_K, 2048, 2560, 1, "E4B o"},        {GgmlType::Q4_K, 2560, 512, 1, "E4B k"},
                          {GgmlType::Q6_K, 2560, 512, 1, "E4B v"},         {GgmlType::Q8_0, 640, 2048, 1, "270M up"},
                          {GgmlType::BF16, 2560, 256, 1, "E4B ple gate"},  {GgmlType::BF16, 256, 2560, 1, "E4B ple proj"},
                          {GgmlType::BF16, 2560, 10752, 1, "E4B ple model"}};
  auto time_graph = [&](auto &&body) {
    double best = -1;
    if (!cu::graph_capture_begin(s)) return best;
    body();
    auto g = cu::graph_capture_end(s);
    if (!g) return best;
    std::vector<double> v;
    for (int rep = 0; rep < 7; ++rep) {
      v.push_back(time_ms([&] { (void)cu::graph_launch(*g, s); }, 5));
    }
    cu::graph_destroy(*g);
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  // GEIST_PERF_SHAPES=a,b: only the shapes whose name and type ("E4B gate+up Q4_K") contain
  // one of the comma-separated pieces (for comparing knobs in a few seconds).
  const char *only = std::getenv("GEIST_PERF_SHAPES");
  auto wanted = [&](const Shape &sh) {
    if (only == nullptr || *only == 0) return true;
    const std::string name = std::string(sh.what) + " " + quant::type_name(sh.t), list = only;
    for (size_t b = 0; b <= list.size();) {
      const size_t e = std::min(list.find(',', b), list.size());
      if (e > b && name.find(list.substr(b, e - b)) != std::string::npos) return true;
      b = e + 1;
    }
    return false;
  };
  for (const Shape &sh : shapes) {
    if (!wanted(sh)) continue;
    const std::vector<uint8_t> w1 = random_matrix(sh.t, sh.k, sh.n, rng);
    const size_t per_call = w1.size() * size_t(sh.n_mat);
    std::vector<uint8_t> w;
    for (int c = 0; c < kCalls * sh.n_mat; ++c) w.insert(w.end(), w1.begin(), w1.end());
    DevBuf dw(w), dcopy(per_call);
    const double copy_ms = time_graph([&] {
      for (int c = 0; c < kCalls; ++c) (void)cu::copy_async(dcopy.as(), dw.as<uint8_t>() + size_t(c) * per_call, per_call, s);
    });
    std::printf("PERF decode %-12s %-5s %5lldx%-6lld x%d  copy %7.2f us %7.1f GB/s\n", sh.what, quant::type_name(sh.t),
                (long long)sh.k, (long long)sh.n, sh.n_mat, 1e3 * copy_ms / kCalls,
                2.0 * per_call * kCalls / (copy_ms * 1e6));
    DevBuf sink(16);
    const double read_ms = time_graph([&] {
      for (int c = 0; c < kCalls; ++c) (void)cu::read_probe(dw.as<uint8_t>() + size_t(c) * per_call, per_call, sink.as<unsigned>(), s);
    });
    std::printf("PERF decode %-12s %-5s %5lldx%-6lld x%d  read %7.2f us %7.1f GB/s\n", sh.what, quant::type_name(sh.t),
                (long long)sh.k, (long long)sh.n, sh.n_mat, 1e3 * read_ms / kCalls, double(per_call) * kCalls / (read_ms * 1e6));
    const cu::DevMatrix m0 = dev_matrix(dw, sh.t, sh.k, sh.n);
    DevBuf scratch(std::max<size_t>(1, cu::matmul_scratch_bytes(m0, 8)));
    // One call of `rows` rows on weight copy `copy` (each matrix of the call its own copy).
    auto call = [&](int copy, int rows) {
      cu::DevMatrix ms_[2];
      float *ys[2];
      for (int j = 0; j < sh.n_mat; ++j) {
        ms_[j] = m0;
        ms_[j].data += size_t(copy * sh.n_mat + j) * w1.size();
        ys[j] = dy.as<float>() + size_t(j) * 8 * sh.n;
      }
      (void)cu::matmul_n(ms_, ys, sh.n_mat, dx.as<float>(), rows, cu::ActMode::Q8, scratch.as(), s);
    };
    // One row once more, every call on the same copy: from L2 where the matrix fits (E4B's
    // gate+up, 29.5 MB, does on an H100), what the kernel takes when DRAM is not what it waits on.
    const double warm_ms = time_graph([&] {
      for (int c = 0; c < kCalls; ++c) call(0, 1);
    });
    std::printf("PERF decode %-12s %-5s rows 1 one copy: %7.2f us/call\n", sh.what, quant::type_name(sh.t),
                1e3 * warm_ms / kCalls);
    for (int rows : {1, 2, 4, 8}) {
      const double ms = time_graph([&] {
        for (int c = 0; c < kCalls; ++c) call(c, rows);
      });
      std::printf("PERF decode %-12s %-5s rows %d: %7.2f us/call %7.1f GB/s weights\n", sh.what, quant::type_name(sh.t),
                  rows, 1e3 * ms / kCalls, double(per_call) * kCalls / (ms * 1e6));
    }
  }
}

// E4B's q, k and v projections (Q4_K 2560 x 2048, Q4_K 2560 x 512, Q6_K 2560 x 512) through
// matmul_n together and each alone (--gtest_filter='*PerfQkv' --gtest_also_run_disabled_tests).
CUDA_TEST(CudaOps, DISABLED_PerfQkv) {
  REQUIRE_CUDA();
  std::mt19937 rng(5);
  cu::CudaStream s = cuda_env().s;
  const int64_t k = 2560;
  const std::pair<GgmlType, int64_t> mats[] = {{GgmlType::Q4_K, 2048}, {GgmlType::Q4_K, 512}, {GgmlType::Q6_K, 512}};
  DevBuf dx(random_acts(512, k, rng));
  std::vector<std::unique_ptr<DevBuf>> dw, dy;
  std::vector<cu::DevMatrix> ms;
  std::vector<float *> ys;
  size_t scratch_bytes = 1;
  for (const auto &[t, n] : mats) {
    dw.push_back(std::make_unique<DevBuf>(random_matrix(t, k, n, rng)));
    dy.push_back(std::make_unique<DevBuf>(size_t(512) * n * 4));
    ms.push_back(dev_matrix(*dw.back(), t, k, n));
    ys.push_back(dy.back()->as<float>());
    scratch_bytes = std::max(scratch_bytes, cu::matmul_scratch_bytes(ms.back(), 512));
  }
  DevBuf scratch(scratch_bytes);
  for (int rows : {64, 128, 512}) {
    const double all = time_ms(
        [&] { (void)cu::matmul_n(ms.data(), ys.data(), 3, dx.as<float>(), rows, cu::ActMode::Q8, scratch.as(), s); }, 20);
    double one[3];
    for (int m = 0; m < 3; ++m) {
      one[m] = time_ms(
          [&] { (void)cu::matmul(ms[size_t(m)], dx.as<float>(), ys[size_t(m)], rows, cu::ActMode::Q8, scratch.as(), s); },
          20);
    }
    std::printf("PERF qkv rows %3d: matmul_n %7.1f us; alone (each quantizing x) q %7.1f, k %7.1f, v %7.1f us\n", rows,
                1e3 * all, 1e3 * one[0], 1e3 * one[1], 1e3 * one[2]);
  }
}

// Attention timings alone (--gtest_filter='*PerfAttention' --gtest_also_run_disabled_tests).
CUDA_TEST(CudaOps, DISABLED_PerfAttention) {
  REQUIRE_CUDA();
  cu::CudaStream s = cuda_env().s;
  for (KvType t : {KvType::F32, KvType::F16, KvType::Q8_0}) {
    for (int64_t cached : {0, 600, 4096}) {
      for (const auto &[rows, hd] :
           std::vector<std::pair<int, int>>{{1, 256}, {64, 256}, {512, 256}, {1, 512}, {64, 512}, {512, 512}}) {
        AttnCase c{rows, 8, 2, hd, 0, cached, cached + 512, t, t};
        std::mt19937 r2(4);
        const int64_t row = int64_t(c.n_head_kv) * c.head_dim;
        DevBuf dk(c.capacity * kv_row_bytes(t, row)), dv(c.capacity * kv_row_bytes(t, row));
        DevBuf kf(randn(size_t(c.capacity) * row, r2)), dq(randn(size_t(rows) * c.n_head * c.head_dim, r2));
        DevBuf dout(size_t(rows) * c.n_head * c.head_dim * 4), dp(std::vector<int64_t>{0}),
            dp0(std::vector<int64_t>{c.pos0});
        const size_t scratch_bytes = cu::attention_scratch_bytes(c.n_head, c.head_dim, rows);
        DevBuf scratch(scratch_bytes);
        CU_OK(cu::kv_append(t, dk.as(), c.capacity, row, dp.as<int64_t>(), int(c.capacity), kf.as<float>(), s));
        CU_OK(cu::kv_append(t, dv.as(), c.capacity, row, dp.as<int64_t>(), int(c.capacity), kf.as<float>(), s));
        cu::AttnArgs g;
        g.q = dq.as<float>();
        g.k = dk.as();
        g.v = dv.as();
        g.k_type = g.v_type = t;
        g.out = dout.as<float>();
        g.n_rows = rows;
        g.pos0 = dp0.as<int64_t>();
        g.capacity = c.capacity;
        g.n_head = c.n_head;
        g.n_head_kv = c.n_head_kv;
        g.head_dim = c.head_dim;
        g.scale = 0.0625f;
        double ms[3];
        for (int split = 0; split < 3; ++split) {
          g.scratch = split ? scratch.as() : nullptr;
          g.scratch_bytes = split ? scratch_bytes : 0;
          g.single_query = split == 2;
          ms[split] = time_ms([&] { (void)cu::attention(g, s); }, split ? 20 : 3);
        }
        std::printf("PERF attention %-4s rows %3d at %4lld cached, 8/2 heads, hd %d: split %8.3f ms (one query per "
                    "block %8.3f ms), reference %8.3f ms\n",
                    kv_type_name(t), rows, (long long)cached, hd, ms[1], ms[2], ms[0]);
      }
    }
  }
}

// The probes' chain on the host, in their order of operations (cuda::chain_probe's comment):
// per block, thread t sums elements t, t + 256, ...; each warp adds its lanes by the xor tree
// (every lane ends with the same bits); the 8 warp sums are added in order.
inline std::vector<float> boundary_chain_on_host(std::vector<float> v, int steps, int blocks) {
  const int n = int(v.size()), per = (n + blocks - 1) / blocks;
  std::vector<float> next(v.size());
  for (int st = 0; st < steps; ++st) {
    float tot = 0.0f;
    for (int w = 0; w < 8; ++w) {
      float lane[32];
      for (int l = 0; l < 32; ++l) {
        lane[l] = 0.0f;
        for (int i = 32 * w + l; i < n; i += 256) lane[l] += v[size_t(i)];
      }
      for (int o = 16; o >= 1; o /= 2) {
        float t[32];
        for (int l = 0; l < 32; ++l) t[l] = lane[l] + lane[l ^ o];
        std::copy(t, t + 32, lane);
      }
      tot += lane[0];
    }
    const float add = tot * 1e-6f;
    for (int i = 0; i < n; ++i) next[size_t(i)] = v[size_t((i + per) % n)] + add;
    v.swap(next);
  }
  return v;
}

// What a kernel boundary costs inside a graph (programmatic dependent launch on, as in the
// model) against a grid-wide barrier inside one persistent kernel: the question behind a
// persistent whole-layer decode kernel (CUDA.md, "What a kernel boundary costs"). A decode
// step is a chain of ~10 dependent steps per layer, each of which reads a vector the one
// before wrote. Information, not a check; but both probes must give the host replay's bits.
CUDA_TEST(CudaOps, DISABLED_PerfBoundary) {
  REQUIRE_CUDA();
  cu::CudaStream s = cuda_env().s;
  Result<cu::DeviceInfo> info = cu::device_info(0);
  ASSERT_TRUE(info) << info.status().message();
  const int sms = info->sm_count;
  constexpr int kSteps = 200;
  const char *pdl = cu::pdl_enabled() ? "on" : "off";
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int n : {640, 2560}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float &v : x) v = nd(rng);
    DevBuf a(x), b(x), a2(x), b2(x), count(16);
    for (int blocks : {1, 8, 32, sms, 2 * sms}) {
      // Same bits: one run of each from the same start.
      a.put(x.data(), x.size() * 4);
      a2.put(x.data(), x.size() * 4);
      CU_OK(cu::chain_probe(a.as<float>(), b.as<float>(), n, kSteps, blocks, s));
      CU_OK(cu::barrier_probe(a2.as<float>(), b2.as<float>(), n, kSteps, blocks, count.as<unsigned>(), s));
      CU_OK(cu::stream_sync(s));
      const std::vector<float> ya = a.get<float>(x.size()), yb = a2.get<float>(x.size());
      const std::vector<float> yh = boundary_chain_on_host(x, kSteps, blocks);
      EXPECT_EQ(std::memcmp(ya.data(), yh.data(), x.size() * 4), 0) << "chain, n " << n << ", " << blocks << " blocks";
      EXPECT_EQ(std::memcmp(yb.data(), yh.data(), x.size() * 4), 0) << "barrier, n " << n << ", " << blocks << " blocks";
      EXPECT_TRUE(std::any_of(yh.begin(), yh.end(), [](float v) { return v != 0.0f && std::isfinite(v); }));
      // The chain as the model runs it: captured in a graph, replayed.
      CU_OK(cu::graph_capture_begin(s));
      (void)cu::chain_probe(a.as<float>(), b.as<float>(), n, kSteps, blocks, s);
      Result<cu::CudaGraph> g = cu::graph_capture_end(s);
      ASSERT_TRUE(g) << g.status().message();
      std::vector<double> chain, barrier;
      for (int rep = 0; rep < 7; ++rep) {
        chain.push_back(time_ms([&] { (void)cu::graph_launch(*g, s); }, 5));
        barrier.push_back(time_ms(
            [&] { (void)cu::barrier_probe(a2.as<float>(), b2.as<float>(), n, kSteps, blocks, count.as<unsigned>(), s); }, 5));
      }
      cu::graph_destroy(*g);
      std::sort(chain.begin(), chain.end());
      std::sort(barrier.begin(), barrier.end());
      std::printf("PERF boundary n %4d, %3d blocks of 256: a kernel per step (graph, PDL %s) %6.2f us/step, one kernel "
                  "with a grid barrier per step %6.2f us/step (medians of 7, %d steps)\n",
                  n, blocks, pdl, 1e3 * chain[3] / kSteps, 1e3 * barrier[3] / kSteps, kSteps);
    }
  }
}

// Logits rows (262144 floats each) downloaded to page-locked memory (what a session's
// logits buffer is on CUDA, Exec::host_floats) against pageable memory, reused and fresh
// per call, and the host copy a batched step used to make of them: median of 200, us.
CUDA_TEST(CudaOps, DISABLED_PerfDownload) {
  REQUIRE_CUDA();
  cu::CudaStream s = cuda_env().s;
  for (size_t rows : {size_t(1), size_t(8)}) {
    const size_t bytes = rows * 262144 * sizeof(float);
    DevBuf d(bytes);
    CU_OK(cu::memset_async(d.as(), 1, bytes, s));
    Result<void *> pinned = cu::host_alloc_pinned(bytes);
    ASSERT_TRUE(pinned.is_ok());
    std::vector<uint8_t> pageable(bytes), copy(bytes);
    auto median_us = [&](auto &&one) {
      std::vector<double> t;
      for (int i = 0; i < 200; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        one();
        t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    auto down = [&](void *dst) {
      CU_OK(cu::download_async(dst, d.as(), bytes, s));
      CU_OK(cu::stream_sync(s));
    };
    const double pin = median_us([&] { down(*pinned); });
    const double page = median_us([&] { down(pageable.data()); });
    const double fresh = median_us([&] {
      std::vector<uint8_t> f(bytes);
      down(f.data());
    });
    const double host = median_us([&] { std::memcpy(copy.data(), pageable.data(), bytes); });
    std::printf("PERF download %zu logits rows (%zu KiB): page-locked %.1f us, pageable %.1f us, pageable fresh %.1f "
                "us; host copy %.1f us\n",
                rows, bytes / 1024, pin, page, fresh, host);
    cu::host_free_pinned(*pinned);
  }
}

}  // namespace
}  // namespace geist
