#include "backends/cpu/qgemm.h"

#include <atomic>

namespace geist::cpu {
namespace {
std::atomic<uint64_t> g_calls[4];  // by Isa
std::atomic<uint64_t> g_amx_calls;
}

GemmFn TierKernels::for_type(quant::GgmlType t) const {
  switch (t) {
    case quant::GgmlType::Q8_0: return q8_0;
    case quant::GgmlType::Q4_0: return q4_0;
    case quant::GgmlType::Q5_0: return q5_0;
    case quant::GgmlType::Q4_K: return q4_k;
    case quant::GgmlType::Q5_K: return q5_k;
    case quant::GgmlType::Q6_K: return q6_k;
    case quant::GgmlType::Q2_K: return q2_k;
    case quant::GgmlType::Q3_K: return q3_k;
    default: return nullptr;
  }
}

FloatGemmFn TierKernels::float_for_type(quant::GgmlType t) const {
  switch (t) {
    case quant::GgmlType::F32: return f32;
    case quant::GgmlType::F16: return f16;
    case quant::GgmlType::BF16: return bf16;
    case quant::GgmlType::Q4_1: return q4_1;
    case quant::GgmlType::Q5_1: return q5_1;
    default: return nullptr;
  }
}

const TierKernels *tier_kernels(Isa isa) {
#if defined(__x86_64__)
  if (isa == Isa::Avx512) return tier_kernels_avx512();
  if (isa == Isa::Avx2) return tier_kernels_avx2();
  if (isa == Isa::Avx2Vnni) return tier_kernels_avx2vnni();
#endif
  (void)isa;
  return nullptr;
}

uint64_t tier_calls(Isa isa) { return g_calls[static_cast<int>(isa)].load(std::memory_order_relaxed); }
uint64_t amx_calls() { return g_amx_calls.load(std::memory_order_relaxed); }
void count_amx_call() { g_amx_calls.fetch_add(1, std::memory_order_relaxed); }
void count_tier_call(Isa isa) { g_calls[static_cast<int>(isa)].fetch_add(1, std::memory_order_relaxed); }

}  // namespace geist::cpu
