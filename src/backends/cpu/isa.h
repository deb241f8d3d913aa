// The CPU's instruction-set tier, detected once from CPUID and XGETBV.
//
//   generic  portable C++ (the oracle every other tier is tested against)
//   avx2     AVX2 + FMA + F16C (x86-64-v3)
//   avx2vnni avx2 + AVX-VNNI's 256-bit int8 dot products (Alder Lake and later Intel cores
//            without AVX-512)
//   avx512   AVX-512 F/BW/DQ/VL + VNNI (Ice Lake, Sapphire Rapids, Zen 4/5); BF16 noted
//
// The tier in use is the best the CPU and the OS (XGETBV: the OS saves the register
// state) support (avx512, else avx2vnni, else avx2, else generic), or GEIST_ISA=generic|
// avx2|avx2vnni|avx512 from the environment if the machine supports that one (otherwise it
// is ignored, with a warning on stderr once). It is fixed for the life of the process:
// models repack their weights for it at load.
#pragma once

#include <string>

namespace geist::cpu {

enum class Isa { Generic = 0, Avx2 = 1, Avx512 = 2, Avx2Vnni = 3 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512dq = false, avx512vl = false;
  bool avx512vnni = false, avx512bf16 = false, avxvnni = false;
  bool os_avx = false, os_avx512 = false;  // XGETBV: YMM / ZMM state enabled by the OS
};

// What CPUID/XGETBV report (all false off x86-64).
const CpuFeatures &cpu_features();
// The highest tier the machine supports.
Isa best_isa();
// Whether this machine can run the tier (avx2vnni is not implied by avx512: Ice Lake has
// AVX-512 VNNI without AVX-VNNI).
bool isa_supported(Isa isa);
// The tier in use: best_isa(), or GEIST_ISA's if supported, read once.
Isa active_isa();
const char *isa_name(Isa isa);
// Parses "generic" / "avx2" / "avx2vnni" / "avx512"; false if unknown.
bool parse_isa(const std::string &s, Isa *out);
// "avx512 (F BW DQ VL VNNI BF16)" and the like: the tier in use and the extensions it uses.
std::string isa_description();

}  // namespace geist::cpu
