/* kernels/cpu/vmath.c: the serial array functions of kernels/vmath.h.  The elementwise ones are
 * written once in kernels/cpu/vmath_map.h and built twice, with 4 lanes here and with 8 for AVX2
 * in kernels/cpu/vmath_avx2.c; both give the same bits, and each call takes the AVX2 build when
 * the CPU has it.  The reductions (dot, sum, max) use 4 lanes everywhere, so their summation
 * order is one for every CPU. */
#include "kernels/vmath.h"

#include <stdatomic.h>

#include "core/assert.h"
#include "kernels/cpu/internal.h"

#define VM_SUFFIX base
#include "kernels/cpu/vmath_map.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
void arl_k_vexp_avx2(float *y, const float *x, int64_t n);
void arl_k_vsigmoid_avx2(float *y, const float *x, int64_t n);
void arl_k_vtanh_avx2(float *y, const float *x, int64_t n);
void arl_k_vsilu_avx2(float *y, const float *x, int64_t n);
void arl_k_vsitu_phi_avx2(float *y, const float *x, int64_t n, float b1);
void arl_k_vsitu_glu_avx2(float *h, const float *g, const float *u, int64_t n, float b1, float b2);
void arl_k_vswiglu_avx2(float *h, const float *g, const float *u, int64_t n);
void arl_k_vsitu_glu_bwd_avx2(float *dg, float *du, const float *dh, const float *g,
                              const float *u, int64_t n, float b1, float b2);
void arl_k_vswiglu_bwd_avx2(float *dg, float *du, const float *dh, const float *g, const float *u,
                            int64_t n);
void arl_k_vaxpy_avx2(float *y, float alpha, const float *x, int64_t n);
void arl_k_vscale_avx2(float *y, float alpha, int64_t n);
void arl_k_vmul_avx2(float *y, const float *a, const float *b, int64_t n);
/* arl_k_cpu_has_avx2, cached here so that the check inlines into every call */
static atomic_int g_avx2 = -1;
static inline int use_avx2(void) {
    int v = atomic_load_explicit(&g_avx2, memory_order_relaxed);
    if (v < 0) {
        v = arl_k_cpu_has_avx2();
        atomic_store_explicit(&g_avx2, v, memory_order_relaxed);
    }
    return v;
}
#define VM_CALL(f, ...) (use_avx2() ? f##avx2(__VA_ARGS__) : f##base(__VA_ARGS__))
#else
#define VM_CALL(f, ...) f##base(__VA_ARGS__)
#endif

void arl_k_vexp(float *y, const float *x, int64_t n) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vexp_, y, x, n);
}

void arl_k_vsigmoid(float *y, const float *x, int64_t n) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vsigmoid_, y, x, n);
}

void arl_k_vtanh(float *y, const float *x, int64_t n) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vtanh_, y, x, n);
}

void arl_k_vsilu(float *y, const float *x, int64_t n) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vsilu_, y, x, n);
}

void arl_k_vsitu_phi(float *y, const float *x, int64_t n, float beta1) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vsitu_phi_, y, x, n, beta1);
}

void arl_k_vsitu_glu(float *h, const float *g, const float *u, int64_t n, float beta1,
                     float beta2) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vsitu_glu_, h, g, u, n, beta1, beta2);
}

void arl_k_vswiglu(float *h, const float *g, const float *u, int64_t n) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vswiglu_, h, g, u, n);
}

void arl_k_vsitu_glu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                         int64_t n, float beta1, float beta2) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vsitu_glu_bwd_, dg, du, dh, g, u, n, beta1, beta2);
}

void arl_k_vswiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                       int64_t n) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vswiglu_bwd_, dg, du, dh, g, u, n);
}

void arl_k_vaxpy(float *y, float alpha, const float *x, int64_t n) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vaxpy_, y, alpha, x, n);
}

void arl_k_vscale(float *y, float alpha, int64_t n) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vscale_, y, alpha, n);
}

void arl_k_vmul(float *y, const float *a, const float *b, int64_t n) {
    ARL_ASSERT(n >= 0);
    VM_CALL(arl_k_vmul_, y, a, b, n);
}

float arl_k_vdot(const float *a, const float *b, int64_t n) {
    ARL_ASSERT(n >= 0);
    vec_f acc = vec_set1(0.0f);
    int64_t i = 0;
    for (; i + VEC_N <= n; i += VEC_N)
        acc += vec_load(a + i) * vec_load(b + i);
    if (i < n) acc += vec_load_part(a + i, n - i) * vec_load_part(b + i, n - i);
    return vec_hsum(acc);
}

float arl_k_vsum(const float *x, int64_t n) {
    ARL_ASSERT(n >= 0);
    vec_f acc = vec_set1(0.0f);
    int64_t i = 0;
    for (; i + VEC_N <= n; i += VEC_N)
        acc += vec_load(x + i);
    if (i < n) acc += vec_load_part(x + i, n - i);
    return vec_hsum(acc);
}

float arl_k_vmax(const float *x, int64_t n) {
    ARL_ASSERT(n >= 1);
    float m = x[0];
    int64_t i = 1;
    if (n >= VEC_N) {
        vec_f acc = vec_load(x);
        for (i = VEC_N; i + VEC_N <= n; i += VEC_N) {
            vec_f v = vec_load(x + i);
            acc = vec_select((v > acc) | (acc != acc), v, acc);
        }
        m = acc[0];
        for (int j = 1; j < VEC_N; j++)
            m = acc[j] > m || m != m ? acc[j] : m;
    }
    for (; i < n; i++)
        m = x[i] > m || m != m ? x[i] : m;
    return m;
}
