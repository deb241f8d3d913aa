#include "backends/cpu/isa.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace geist::cpu {
namespace {

#if defined(__x86_64__)
uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1, avx = (c >> 28) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  if (osxsave && avx) {
    const uint64_t xcr0 = xgetbv0();
    f.os_avx = (xcr0 & 0x6) == 0x6;            // XMM | YMM
    f.os_avx512 = (xcr0 & 0xE6) == 0xE6;       // + opmask, ZMM_Hi256, Hi16_ZMM
  }
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.avx512vnni = (c >> 11) & 1;
    // AMX-TILE (EDX bit 24) and AMX-INT8 (bit 25), with XTILECFG and XTILEDATA (XCR0 bits
    // 17 and 18) enabled by the OS.
    f.amx_int8 = ((d >> 24) & 1) && ((d >> 25) & 1) && osxsave && ((xgetbv0() >> 17) & 3) == 3;
    f.amx_bf16 = f.amx_int8 && ((d >> 22) & 1);  // AMX-BF16: EDX bit 22
    __cpuid_count(7, 1, a, b, c, d);
    f.avxvnni = (a >> 4) & 1;
    f.avx512bf16 = (a >> 5) & 1;
  }
  if (!f.os_avx) f.avx2 = f.fma = f.f16c = f.avxvnni = false;
  if (!f.os_avx512) {
    f.avx512f = f.avx512bw = f.avx512dq = f.avx512vl = f.avx512vnni = f.avx512bf16 = f.amx_int8 = f.amx_bf16 = false;
  }
#endif
  return f;
}

Isa best_of(const CpuFeatures &f) {
  const bool v3 = f.avx2 && f.fma && f.f16c;
  if (v3 && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.avx512vnni) return Isa::Avx512;
  if (v3 && f.avxvnni) return Isa::Avx2Vnni;
  if (v3) return Isa::Avx2;
  return Isa::Generic;
}

bool supported_by(const CpuFeatures &f, Isa isa) {
  const bool v3 = f.avx2 && f.fma && f.f16c;
  switch (isa) {
    case Isa::Generic: return true;
    case Isa::Avx2: return v3;
    case Isa::Avx2Vnni: return v3 && f.avxvnni;
    case Isa::Avx512: return v3 && f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl && f.avx512vnni;
  }
  return false;
}

Isa choose() {
  const Isa best = best_isa();
  const char *env = std::getenv("GEIST_ISA");
  if (!env || !*env) return best;
  Isa want;
  if (!parse_isa(env, &want)) {
    std::fprintf(stderr, "geist: GEIST_ISA=%s is not one of generic, avx2, avx2vnni, avx512; using %s\n", env,
                 isa_name(best));
    return best;
  }
  if (!isa_supported(want)) {
    std::fprintf(stderr, "geist: GEIST_ISA=%s is not supported by this CPU; using %s\n", env, isa_name(best));
    return best;
  }
  return want;
}

}  // namespace

const CpuFeatures &cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

Isa best_isa() {
#if defined(GEIST_GENERIC_ONLY)
  return Isa::Generic;
#else
  return best_of(cpu_features());
#endif
}

bool isa_supported(Isa isa) {
#if defined(GEIST_GENERIC_ONLY)
  return isa == Isa::Generic;
#else
  return supported_by(cpu_features(), isa);
#endif
}

Isa active_isa() {
  static const Isa isa = choose();
  return isa;
}

bool amx_usable() {
  static const bool ok = [] {
#if defined(__linux__) && defined(__x86_64__) && !defined(GEIST_GENERIC_ONLY)
    if (!cpu_features().amx_int8) return false;
    // Linux hands a process the 8 KiB tile state only after it asks (ARCH_REQ_XCOMP_PERM
    // for XTILEDATA, feature 18); a tile instruction before that faults.
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

namespace {
std::atomic<int> g_amx_override{-1};  // -1: GEIST_AMX decides; 0 / 1: set_amx_enabled
}  // namespace

bool amx_enabled() {
  static const bool env_on = [] {
    const char *e = std::getenv("GEIST_AMX");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  const int o = g_amx_override.load(std::memory_order_relaxed);
  return (o < 0 ? env_on : o == 1) && amx_usable();
}

void set_amx_enabled(bool on) { g_amx_override.store(on ? 1 : 0, std::memory_order_relaxed); }

const char *isa_name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    case Isa::Avx2Vnni: return "avx2vnni";
    case Isa::Generic: break;
  }
  return "generic";
}

bool parse_isa(const std::string &s, Isa *out) {
  if (s == "generic") *out = Isa::Generic;
  else if (s == "avx2") *out = Isa::Avx2;
  else if (s == "avx2vnni") *out = Isa::Avx2Vnni;
  else if (s == "avx512") *out = Isa::Avx512;
  else return false;
  return true;
}

std::string isa_description() {
  const Isa isa = active_isa();
  const CpuFeatures &f = cpu_features();
  std::string s = isa_name(isa);
  if (isa == Isa::Avx512) {
    s += std::string(" (F BW DQ VL VNNI") + (f.avx512bf16 ? " BF16" : "") + (amx_enabled() ? " AMX" : "") + ")";
  }
  if (isa == Isa::Avx2) s += " (AVX2 FMA F16C)";
  if (isa == Isa::Avx2Vnni) s += " (AVX2 FMA F16C AVX-VNNI)";
  if (isa != best_isa()) s += std::string(", lowered by GEIST_ISA from ") + isa_name(best_isa());
  return s;
}

}  // namespace geist::cpu
