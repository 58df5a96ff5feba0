/* kernels/cpu/vmath_avx2.c: kernels/cpu/vmath_map.h compiled with 8 lanes for x86-64 CPUs with
 * AVX2 (chosen at run time by kernels/cpu/vmath.c; same bits as the 4-lane build, see
 * kernels/cpu/vec.h).  Only AVX2 is enabled, not FMA: no operation is fused.  Elsewhere this
 * file only says that AVX2 is unavailable. */
#include "kernels/cpu/internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))

#include <stdatomic.h>

int arl_k_cpu_has_avx2(void) {
    static atomic_int known = -1; /* the answer never changes: a racing first call is harmless */
    int v = atomic_load_explicit(&known, memory_order_relaxed);
    if (v < 0) {
        v = __builtin_cpu_supports("avx2") != 0;
        atomic_store_explicit(&known, v, memory_order_relaxed);
    }
    return v;
}

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2"))), apply_to = function)
#else
#pragma GCC target("avx2")
#endif

#define VEC_N 8
#define VM_SUFFIX avx2
#include "kernels/cpu/vmath_map.h"

#if defined(__clang__)
#pragma clang attribute pop
#endif

#else

int arl_k_cpu_has_avx2(void) {
    return 0;
}

#endif
