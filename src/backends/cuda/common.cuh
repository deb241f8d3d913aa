// Device helpers shared by the kernels: f16/bf16 conversions, per-element dequantization
// and integer unpacking of every GGUF block format, warp reductions, error mapping.
// Every float operation mirrors the CPU reference (quant/dequant.cpp, quant/dot.cpp)
// operation for operation; the library is built with -fmad=false so none is fused.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "backends/cuda/kernels.h"
#include "quant/ggml_type.h"

namespace geist::cuda {

// "<what>: CUDA error 2 (cudaErrorMemoryAllocation): out of memory" with the geist code.
Status cuda_status(cudaError_t e, const char *what);
// The launch error after a kernel launch, else OK.
inline Status launch_status(const char *what) { return cuda_status(cudaGetLastError(), what); }
inline Status bad_arg(const std::string &msg) { return Status(GEIST_E_INVALID_ARGUMENT, msg); }
// GEIST_CUDA_REFERENCE=1: the simple reference kernels only (one warp per matmul output,
// one block per attention query and head), to measure the fast ones against.
bool reference_kernels();

// Calls f(std::integral_constant<E, V>{}) for the V among Vs equal to t (one template
// instance per V); false if t is none of them.
template <class E, E... Vs, class F>
bool dispatch_among(E t, F &&f) {
  return ((t == Vs ? (f(std::integral_constant<E, Vs>{}), true) : false) || ...);
}

// Programmatic dependent launch (sm_90 and later): launch() lets a kernel's blocks become
// resident while the kernel before it in the stream is still running; every kernel starts
// with dev::pdl_start(), which waits until that kernel has finished and its writes are
// visible, and then lets the next kernel's blocks in. What a kernel reads and writes is
// ordered exactly as without it; only the launch latency overlaps the previous kernel.
// pdl_enabled() (kernels.h) says whether launch() asks for it.

// Weight prefetch of the matrix-vector kernels (GEIST_CUDA_PREFETCH): 0 none, 1 into L2
// (the default), 2 into L1. See dev::prefetch_lines.
int prefetch_mode();

template <class... P, class... A>
void launch_smem(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, CudaStream s, A &&...args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);  // the error is read by launch_status
}

template <class... P, class... A>
void launch(void (*kernel)(P...), dim3 grid, dim3 block, CudaStream s, A &&...args) {
  launch_smem(kernel, grid, block, 0, s, std::forward<A>(args)...);
}

// Lets `kernel` launch with up to `bytes` of dynamic shared memory on the current device
// (above the default 48 KiB), set once per device: `done` is the kernel's own flags, one
// bit per device. false where the device's opt-in limit is below `bytes` or the call fails.
template <class... P>
bool allow_dynamic_smem(void (*kernel)(P...), size_t bytes, std::atomic<uint64_t> &done) {
  int dev = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  const uint64_t bit = uint64_t(1) << dev;
  if ((done.load(std::memory_order_relaxed) & bit) != 0) return true;
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      size_t(optin) < bytes) {
    return false;
  }
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  done.fetch_or(bit, std::memory_order_relaxed);
  return true;
}

// A non-negative integer knob from the environment (at most 2^20); dflt when unset or not one.
inline int env_int(const char *name, int dflt) {
  const char *e = std::getenv(name);
  if (e == nullptr || *e == '\0') return dflt;
  char *end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return (*end == '\0' && v >= 0 && v <= (1 << 20)) ? int(v) : dflt;
}

namespace dev {

// Asynchronous copies from global to shared memory (sm_80 and later): 16 bytes (L2 only) or
// 4 bytes; commit closes a group, wait_all waits for every group.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
// The same with the 256 bytes around gmem asked of DRAM into L2 at once (the .L2::256B
// prefetch size): the chunks after it, copied by later instructions, then hit L2.
__device__ __forceinline__ void cp_async16_l2pf(void *smem, const void *gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem) : "memory");
}
// 16 bytes of which the first src_bytes (0 or 16) are copied and the rest zero-filled: a
// masked tile's out-of-range chunk reads nothing (gmem must still be a valid address).
__device__ __forceinline__ void cp_async16_zfill(void *smem, const void *gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits until at most N of the committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void pdl_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks for the 128-byte lines of [p, p + n) ahead of their loads, thread i of count issuing
// lines i, i + count, ...: mode 1 into L2, mode 2 into L1, 0 nothing. The matrix-vector
// kernels call it on their weight rows before pdl_start(): weights never depend on the
// kernel before, so the requests overlap its tail, and a warp's whole row is in flight at
// once instead of one step's blocks per round trip. A prefetch changes no value.
__device__ __forceinline__ void prefetch_lines(const void *p, size_t n, int i, int count, int mode) {
  if (mode == 0 || n == 0) return;
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
  for (uintptr_t a = (reinterpret_cast<uintptr_t>(p) & ~uintptr_t(127)) + 128 * uintptr_t(i); a < end;
       a += 128 * uintptr_t(count)) {
    if (mode == 1) {
      asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    } else {
      asm volatile("prefetch.global.L1 [%0];" ::"l"(a));
    }
  }
}

// Unaligned little-endian loads: block fields are not aligned in general.
__device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) { return uint32_t(p[0]) | (uint32_t(p[1]) << 8); }
__device__ __forceinline__ uint32_t ld_u32(const uint8_t *p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// quant::fp16_to_fp32, bit for bit (NaN payloads included). Every finite f16 (subnormals
// too) and both infinities are exact in f32, so the hardware conversion gives the same bits
// for them; NaNs take the bit formula, which keeps the payload. (CudaOps.Fp16ToFp32EveryPattern
// checks all 65536 patterns but the NaNs against the CPU.)
__device__ __forceinline__ float fp16_to_fp32(uint32_t h) {
  if ((h & 0x7C00u) != 0x7C00u || (h & 0x3FFu) == 0) return __half2float(__ushort_as_half(uint16_t(h)));
  return __uint_as_float(((h & 0x8000u) << 16) | 0x7F800000u | ((h & 0x3FFu) << 13));
}

__device__ __forceinline__ uint32_t shift_round_even(uint32_t m, int shift) {
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1))) ? q + 1 : q;
}

// quant::fp32_to_fp16, bit for bit.
__device__ __forceinline__ uint16_t fp32_to_fp16(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) {
    uint32_t payload = (a >> 13) & 0x3FFu;
    if (payload == 0) payload = 1;
    return uint16_t(sign | 0x7C00u | payload);
  }
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);
  if (a >= 0x38800000u) {
    const uint32_t exp = (a >> 23) - 112;
    const uint32_t m = (exp << 23) | (a & 0x7FFFFFu);
    return uint16_t(sign | shift_round_even(m, 13));
  }
  if (a <= 0x33000000u) return sign;
  const int32_t e = int32_t(a >> 23);
  const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
  return uint16_t(sign | shift_round_even(m, 126 - e));
}

__device__ __forceinline__ float bf16_to_fp32(uint32_t h) { return __uint_as_float(h << 16); }

// kv_type.h's BF16: round to nearest even on the top 16 bits; a NaN stays a quiet NaN.
__device__ __forceinline__ uint16_t fp32_to_bf16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// quant/dot.cpp's round_even: NaN -> 0, clamped to [-128, 127], ties to even.
__device__ __forceinline__ int round_even(float v) {
  v = v == v ? v : 0.0f;
  v = v < -128.0f ? -128.0f : v;
  v = v > 127.0f ? 127.0f : v;
  return int(__fsub_rn(__fadd_rn(v, 12582912.0f), 12582912.0f));
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (block_formats.h).
__device__ __forceinline__ void scale_min_k4(const uint8_t *q, int j, int *sc, int *mn) {
  if (j < 4) {
    *sc = q[j] & 0x3F;
    *mn = q[j + 4] & 0x3F;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Element e of a row of type T: the f32 value quant::dequantize_row gives, by the same
// operations in the same order. row: the row's first byte.
template <quant::GgmlType T>
__device__ __forceinline__ float dequant_elem(const uint8_t *row, int64_t e) {
  using quant::GgmlType;
  if constexpr (T == GgmlType::F32) {
    return __uint_as_float(ld_u32(row + 4 * e));
  } else if constexpr (T == GgmlType::F16) {
    return fp16_to_fp32(ld_u16(row + 2 * e));
  } else if constexpr (T == GgmlType::BF16) {
    return bf16_to_fp32(ld_u16(row + 2 * e));
  } else if constexpr (T == GgmlType::Q4_0 || T == GgmlType::Q4_1) {
    constexpr int bb = T == GgmlType::Q4_0 ? 18 : 20;
    const uint8_t *b = row + (e / 32) * bb;
    const int j = int(e % 32);
    const uint8_t *qs = b + (T == GgmlType::Q4_0 ? 2 : 4);
    const int q = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
    const float d = fp16_to_fp32(ld_u16(b));
    if constexpr (T == GgmlType::Q4_0) {
      return d * float(q - 8);
    } else {
      return d * float(q) + fp16_to_fp32(ld_u16(b + 2));
    }
  } else if constexpr (T == GgmlType::Q5_0 || T == GgmlType::Q5_1) {
    constexpr int bb = T == GgmlType::Q5_0 ? 22 : 24;
    constexpr int qh_off = T == GgmlType::Q5_0 ? 2 : 4;
    const uint8_t *b = row + (e / 32) * bb;
    const int j = int(e % 32);
    const uint8_t *qs = b + qh_off + 4;
    const uint32_t qh = ld_u32(b + qh_off);
    const int lo = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
    const int q = lo | int(((qh >> j) & 1u) << 4);
    const float d = fp16_to_fp32(ld_u16(b));
    if constexpr (T == GgmlType::Q5_0) {
      return d * float(q - 16);
    } else {
      return d * float(q) + fp16_to_fp32(ld_u16(b + 2));
    }
  } else if constexpr (T == GgmlType::Q8_0) {
    const uint8_t *b = row + (e / 32) * 34;
    return float(int8_t(b[2 + e % 32])) * fp16_to_fp32(ld_u16(b));
  } else if constexpr (T == GgmlType::Q2_K) {
    const uint8_t *b = row + (e / 256) * 84;
    const int i = int(e % 256), h = i / 128, s = (i / 32) % 4, l = i % 32;
    const int q = (b[16 + 32 * h + l] >> (2 * s)) & 3;
    const uint32_t sc = b[i / 16];
    const float dl = fp16_to_fp32(ld_u16(b + 80)) * float(sc & 0x0F);
    const float ml = fp16_to_fp32(ld_u16(b + 82)) * float(sc >> 4);
    return dl * float(q) - ml;
  } else if constexpr (T == GgmlType::Q3_K) {
    const uint8_t *b = row + (e / 256) * 110;
    const int i = int(e % 256), h = i / 128, s = (i / 32) % 4, l = i % 32;
    const int lo = (b[32 + 32 * h + l] >> (2 * s)) & 3;
    const int hbit = (b[l] >> (i / 32)) & 1;
    const int q = lo - (hbit ? 0 : 4);
    const int j = i / 16;
    const uint8_t *sp = b + 96;
    const int sc = (((sp[j % 8] >> (4 * (j / 8))) & 0x0F) | (((sp[8 + j % 4] >> (2 * (j / 4))) & 0x03) << 4)) - 32;
    const float dl = fp16_to_fp32(ld_u16(b + 108)) * float(sc);
    return dl * float(q);
  } else if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    constexpr int bb = T == GgmlType::Q4_K ? 144 : 176;
    const uint8_t *b = row + (e / 256) * bb;
    const int i = int(e % 256), j = i / 32, l = i % 32;
    const uint8_t *qs = b + (T == GgmlType::Q4_K ? 16 : 48);
    int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
    if constexpr (T == GgmlType::Q5_K) q |= ((b[16 + l] >> j) & 1) << 4;
    int sc, mn;
    scale_min_k4(b + 4, j, &sc, &mn);
    const float dl = fp16_to_fp32(ld_u16(b)) * float(sc);
    const float ml = fp16_to_fp32(ld_u16(b + 2)) * float(mn);
    return dl * float(q) - ml;
  } else if constexpr (T == GgmlType::Q6_K) {
    const uint8_t *b = row + (e / 256) * 210;
    const int i = int(e % 256), h = i / 128, s = (i / 32) % 4, l = i % 32;
    const int lo = (b[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
    const int hi = (b[128 + 32 * h + l] >> (2 * s)) & 0x03;
    const int q = (lo | (hi << 4)) - 32;
    const float dl = fp16_to_fp32(ld_u16(b + 208)) * float(int8_t(b[192 + i / 16]));
    return dl * float(q);
  } else {
    static_assert(T == GgmlType::F32, "no dequantizer for this type");
    return 0.0f;
  }
}

// The integer form quant::unpack_row gives element i (0..block-1) of block `b`: a = scale *
// quant, m = the min (0 for types without mins).
template <quant::GgmlType T>
__device__ __forceinline__ void unpack_elem(const uint8_t *b, int i, int *a, int *m) {
  using quant::GgmlType;
  *m = 0;
  if constexpr (T == GgmlType::Q8_0) {
    *a = int8_t(b[2 + i]);
  } else if constexpr (T == GgmlType::Q4_0) {
    *a = (i < 16 ? (b[2 + i] & 0x0F) : (b[2 + i - 16] >> 4)) - 8;
  } else if constexpr (T == GgmlType::Q5_0) {
    const uint32_t qh = ld_u32(b + 2);
    const int lo = i < 16 ? (b[6 + i] & 0x0F) : (b[6 + i - 16] >> 4);
    *a = (lo | int(((qh >> i) & 1u) << 4)) - 16;
  } else if constexpr (T == GgmlType::Q2_K) {
    const int h = i / 128, s = (i / 32) % 4, l = i % 32;
    const int q = (b[16 + 32 * h + l] >> (2 * s)) & 3;
    const int sc = b[i / 16];
    *a = (sc & 0x0F) * q;
    *m = sc >> 4;
  } else if constexpr (T == GgmlType::Q3_K) {
    const int h = i / 128, s = (i / 32) % 4, l = i % 32;
    const int lo = (b[32 + 32 * h + l] >> (2 * s)) & 3;
    const int q = lo - (((b[l] >> (i / 32)) & 1) ? 0 : 4);
    const int j = i / 16;
    const uint8_t *sp = b + 96;
    const int sc = (((sp[j % 8] >> (4 * (j / 8))) & 0x0F) | (((sp[8 + j % 4] >> (2 * (j / 4))) & 0x03) << 4)) - 32;
    *a = sc * q;
  } else if constexpr (T == GgmlType::Q4_K || T == GgmlType::Q5_K) {
    const int j = i / 32, l = i % 32;
    const uint8_t *qs = b + (T == GgmlType::Q4_K ? 16 : 48);
    int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
    if constexpr (T == GgmlType::Q5_K) q |= ((b[16 + l] >> j) & 1) << 4;
    int sc, mn;
    scale_min_k4(b + 4, j, &sc, &mn);
    *a = sc * q;
    *m = mn;
  } else if constexpr (T == GgmlType::Q6_K) {
    const int h = i / 128, s = (i / 32) % 4, l = i % 32;
    const int lo = (b[64 * h + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
    const int hi = (b[128 + 32 * h + l] >> (2 * s)) & 0x03;
    *a = int(int8_t(b[192 + i / 16])) * ((lo | (hi << 4)) - 32);
  } else {
    static_assert(T == GgmlType::Q8_0, "no integer form for this type");
  }
}

// Byte offsets of a block's f16 super-scale d and dmin (-1: none), as quant/dot.cpp's
// scale_fields.
template <quant::GgmlType T>
struct BlockInfo;
#define GEIST_BLOCK_INFO(T_, bs, bb, doff, dmoff)                                          \
  template <>                                                                              \
  struct BlockInfo<quant::GgmlType::T_> {                                                  \
    static constexpr int kBlock = bs, kBytes = bb, kDOff = doff, kDminOff = dmoff;         \
  };
GEIST_BLOCK_INFO(Q4_0, 32, 18, 0, -1)
GEIST_BLOCK_INFO(Q5_0, 32, 22, 0, -1)
GEIST_BLOCK_INFO(Q8_0, 32, 34, 0, -1)
GEIST_BLOCK_INFO(Q2_K, 256, 84, 80, 82)
GEIST_BLOCK_INFO(Q3_K, 256, 110, 108, -1)
GEIST_BLOCK_INFO(Q4_K, 256, 144, 0, 2)
GEIST_BLOCK_INFO(Q5_K, 256, 176, 0, 2)
GEIST_BLOCK_INFO(Q6_K, 256, 210, 208, -1)
#undef GEIST_BLOCK_INFO

__device__ __forceinline__ int warp_sum_int(int v) {
  for (int o = 16; o >= 1; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  return v;
}

// tanh in double, rounded once: within an ulp of the true value (libm's tanhf is too).
__device__ __forceinline__ float tanh_f(float u) { return float(tanh(double(u))); }

// gelu_tanh(g) * u in the CPU generic's order: k * (g + ((0.044715 * g) * g) * g);
// 0.5 * g * (1 + t) * u.
__device__ __forceinline__ float gelu_times(float g, float u) {
  const float k = 0.7978845608028654f;
  const float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g);
  const float t = tanh_f(__fmul_rn(k, __fadd_rn(g, cube)));
  return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, t)), u);
}

// ---- RMSNorm's tree (rmsnorm_kernel, rmsnorm_add_norm_kernel, and the matvecs that fold the
// norm before them in: the same functions, so the same bits) ----

// RMSNorm's scale of one vector, 1 / sqrt(mean(x^2) + eps), from each thread's double sum
// of squares: across the warp by shuffles, then warp by warp in thread 0, in that fixed
// order. Every thread of the block calls it; `part` (an entry per warp of the block) and
// `r_sh` are the block's shared scratch, free again when it returns (a second call in the
// same kernel is safe). In a block of more than kThreads threads the others pass ss = 0 and
// their warps' entries are not read: the value is that of a block of kThreads.
template <int kThreads>
__device__ __forceinline__ float rms_scale(double ss, int64_t dim, float eps, double *part, float *r_sh) {
  for (int o = 16; o >= 1; o /= 2) ss = __dadd_rn(ss, __shfl_xor_sync(0xFFFFFFFFu, ss, o));
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = part[0];
    for (int w = 1; w < kThreads / 32; ++w) t = __dadd_rn(t, part[w]);
    *r_sh = float(__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(__ddiv_rn(t, double(dim)), double(eps)))));
  }
  __syncthreads();
  return *r_sh;
}

// A thread's kPer elements i = threadIdx.x + j kThreads of a vector of dim (0 past dim, or
// everywhere when p is null), all loaded before any is used.
template <int kThreads, int kPer>
__device__ __forceinline__ void load_part(const float *p, int64_t dim, float (&out)[kPer]) {
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + j * kThreads;
    out[j] = p && i < dim ? p[i] : 0.0f;
  }
}

// A thread's sum of squares over its kPer register elements i = threadIdx.x + j kThreads,
// in j order (the tree of rms_scale does the rest).
template <int kThreads, int kPer>
__device__ __forceinline__ double sum_squares(const float (&xr)[kPer], int64_t dim) {
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    if (threadIdx.x + j * kThreads < dim) {
      const double t = double(xr[j]);
      ss = __dadd_rn(ss, __dmul_rn(t, t));
    }
  }
  return ss;
}

// The activation quantizers of Q8-mode matmuls (quant::quantize_row's arithmetic), one warp
// per block. Q8_0: lane j holds element j of a 32-element block; writes q[j] and, lane 0,
// *d.
__device__ __forceinline__ void quant_q8_0_block(float v, int lane, int8_t *q, float *d) {
  float amax = fmaxf(0.0f, fabsf(v));  // fmaxf ignores NaN, as the CPU's `ax > amax` does
  for (int o = 16; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const float dd = __fdiv_rn(amax, 127.0f);
  const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
  q[lane] = int8_t(round_even(__fmul_rn(v, id)));
  if (lane == 0) *d = fp16_to_fp32(fp32_to_fp16(dd));
}

// Q8_K: lane j holds v[t] = element j + 32 t of a 256-element block; writes qb[0, 256) and,
// lane 0, *d.
__device__ __forceinline__ void quant_q8_k_block(const float (&v)[8], int lane, int8_t *qb, float *d) {
  float amax = 0.0f;
#pragma unroll
  for (int t = 0; t < 8; ++t) amax = fmaxf(amax, fabsf(v[t]));
  for (int o = 16; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  // The first element (lowest index) of largest magnitude.
  int first = 256;
#pragma unroll
  for (int t = 7; t >= 0; --t) {
    if (fabsf(v[t]) == amax) first = lane + 32 * t;
  }
  for (int o = 16; o >= 1; o /= 2) first = min(first, __shfl_xor_sync(0xFFFFFFFFu, first, o));
  if (amax == 0.0f || first == 256) {  // first == 256 only if amax is 0 (all zero or NaN)
#pragma unroll
    for (int t = 0; t < 8; ++t) qb[lane + 32 * t] = 0;
    if (lane == 0) *d = 0.0f;
    return;
  }
  // Every lane computes the same mx from the same registers: v[first / 32] of lane first % 32.
  float sel = 0.0f;
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    if (t == first / 32) sel = v[t];
  }
  const float mx = __shfl_sync(0xFFFFFFFFu, sel, first % 32);
  const float iscale = __fdiv_rn(-127.0f, mx);
#pragma unroll
  for (int t = 0; t < 8; ++t) {
    const int qv = round_even(__fmul_rn(iscale, v[t]));
    qb[lane + 32 * t] = int8_t(qv < 127 ? qv : 127);
  }
  if (lane == 0) *d = __fdiv_rn(1.0f, iscale);
}

// ---- KV rings (kernels.h's SeqRings) ----

// Row r's sequence in a table of n (row0 ascending, row0[0] = 0). Both lookups run over the
// whole table with constant indices: a variable index into a kernel parameter would copy the
// table to local memory, on every launch of the single-session path too.
__device__ __forceinline__ int seq_of_row(const SeqRings &t, int r) {
  int i = 0;
#pragma unroll
  for (int j = 1; j < kMaxStepSeqs; ++j) {
    if (j < t.n && r >= t.row0[j]) i = j;
  }
  return i;
}
template <class T, int N>
__device__ __forceinline__ T pick(const T (&a)[N], int i) {
  T v = a[0];
#pragma unroll
  for (int j = 1; j < N; ++j) {
    if (j == i) v = a[j];
  }
  return v;
}

// Where step row r goes: its sequence's K (v_ring false) or V ring row at the sequence's
// position for it, of row_bytes bytes.
__device__ __forceinline__ uint8_t *ring_row(const SeqRings &t, int r, bool v_ring, size_t row_bytes) {
  const int i = seq_of_row(t, r);
  const int64_t slot = (*pick(t.pos0, i) + (r - pick(t.row0, i))) % pick(t.capacity, i);
  return static_cast<uint8_t *>(v_ring ? pick(t.v, i) : pick(t.k, i)) + size_t(slot) * row_bytes;
}

// Element e of a KV row of type T (kv_type.h) set to v. For Q8_0 (quantize_q8_0's arithmetic)
// every lane of the warp calls it together, lane j with element j of one 32-element block.
template <KvType T>
__device__ __forceinline__ void kv_store(uint8_t *row, int64_t e, float v) {
  if constexpr (T == KvType::F32) {
    reinterpret_cast<float *>(row)[e] = v;
  } else if constexpr (T == KvType::F16) {
    reinterpret_cast<uint16_t *>(row)[e] = fp32_to_fp16(v);
  } else if constexpr (T == KvType::BF16) {
    reinterpret_cast<uint16_t *>(row)[e] = fp32_to_bf16(v);
  } else {
    const int lane = int(e % 32);
    float amax = fmaxf(0.0f, fabsf(v));
    for (int o = 16; o >= 1; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    uint8_t *b = row + (e / 32) * 34;
    b[2 + lane] = uint8_t(int8_t(round_even(__fmul_rn(v, id))));
    if (lane == 0) {
      const uint16_t h = fp32_to_fp16(__fdiv_rn(amax, 127.0f));
      b[0] = uint8_t(h & 0xFF);
      b[1] = uint8_t(h >> 8);
    }
  }
}

}  // namespace dev

// Where a Q8-mode matmul's scratch holds the quantized activations of n_rows rows of K:
// the quants [n_rows][K] from its start, the block scales [n_rows][K / block] from the next
// 256-byte boundary (matmul_scratch_bytes).
inline int8_t *act_quants(void *scratch) { return static_cast<int8_t *>(scratch); }
inline float *act_scales(void *scratch, int n_rows, int64_t K) {
  const size_t q = (size_t(n_rows) * size_t(K) + 255) / 256 * 256;
  return reinterpret_cast<float *>(static_cast<uint8_t *>(scratch) + q);
}

template <class F>
bool dispatch_kv(KvType t, F &&f) {
  return dispatch_among<KvType, KvType::F32, KvType::F16, KvType::BF16, KvType::Q8_0>(t, std::forward<F>(f));
}
}  // namespace geist::cuda
