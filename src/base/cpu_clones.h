// GEIST_CPU_CLONES: compile a function for AVX-512 (x86-64-v4), AVX2 (x86-64-v3) and the
// baseline, picked once at load through an ifunc. Empty where ifunc resolvers cannot run:
// ThreadSanitizer instruments the resolver, which runs before its runtime is up.
// The hand-written kernels live in per-ISA translation units instead (backends/cpu/isa.h);
// this covers the generic code (f32 dots, quantizers) that the compiler vectorizes.
#pragma once

#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define GEIST_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define GEIST_CPU_CLONES
#endif
