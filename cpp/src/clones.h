#pragma once
// Internal: CROSSKNN_CLONES_AVX512 compiles a hot loop for AVX-512, AVX2 and the baseline; the
// loader picks one per process (GCC target_clones), so results stay the same from call to call.
// The core builds with -ffp-contract=off: a clone changes the vector width, not the operations.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CROSSKNN_CLONES_AVX512 __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CROSSKNN_CLONES_AVX512
#endif
