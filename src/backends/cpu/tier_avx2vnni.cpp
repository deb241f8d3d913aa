// The avx2vnni tier: the AVX2 tier's source compiled again with AVX-VNNI's int8 dot products
// (see tier_avx2.cpp). Runs only where isa.cpp found AVX2, FMA, F16C and AVX-VNNI.
#define GEIST_TIER_AVXVNNI 1
#include "backends/cpu/tier_avx2.cpp"
