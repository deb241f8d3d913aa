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
  bool amx_int8 = false;  // AMX-TILE + AMX-INT8, and the OS enables the tile state (XCR0)
  bool amx_bf16 = false;  // AMX-BF16 as well (with amx_int8)
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
// Whether the avx512 tier's quantized matmuls run their full 16-row tiles on AMX-INT8 tiles
// (amx_impl.h; the same bits as its VNNI kernels): the CPU has AMX-INT8, Linux granted the
// process the tile state (arch_prctl, asked once), and neither GEIST_AMX=0 nor
// set_amx_enabled(false) turned it off.
bool amx_enabled();
// Tests: turn the AMX kernels off or back on (on only takes effect where amx_usable()).
void set_amx_enabled(bool on);
// The CPU and the OS allow AMX-INT8 in this process (the arch_prctl request succeeded).
bool amx_usable();

// "avx512 (F BW DQ VL VNNI BF16)" and the like: the tier in use and the extensions it uses.
std::string isa_description();

}  // namespace geist::cpu
