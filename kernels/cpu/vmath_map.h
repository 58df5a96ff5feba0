/* kernels/cpu/vmath_map.h: the elementwise array functions of kernels/vmath.h (and the GLU rows
 * of kernels/cpu/activation.c) written once over kernels/cpu/vec.h, compiled twice: by
 * kernels/cpu/vmath.c with 4 lanes (suffix _base) and by kernels/cpu/vmath_avx2.c with 8 lanes
 * for AVX2 (suffix _avx2).  Both compute the same bits for every element (see vec.h); the
 * public functions in vmath.c pick one by the CPU.  Not a header for other files: include it
 * only with VM_SUFFIX defined. */
#ifndef VM_SUFFIX
#error "define VM_SUFFIX before including kernels/cpu/vmath_map.h"
#endif

#include "kernels/cpu/vec.h"

#define VM_CAT2(a, b) a##b
#define VM_CAT(a, b) VM_CAT2(a, b)
#define VM_NAME(f) VM_CAT(f, VM_SUFFIX)

/* y[i] = expr(va) with va the vector of x[i], for i in [0, n); the tail on a zero-padded copy. */
#define VM_MAP(y, x, n, expr)                                                                      \
    do {                                                                                           \
        int64_t i_ = 0;                                                                            \
        for (; i_ + VEC_N <= (n); i_ += VEC_N) {                                                   \
            vec_f va = vec_load((x) + i_);                                                         \
            vec_store((y) + i_, expr);                                                             \
        }                                                                                          \
        if (i_ < (n)) {                                                                            \
            vec_f va = vec_load_part((x) + i_, (n)-i_);                                            \
            vec_store_part((y) + i_, expr, (n)-i_);                                                \
        }                                                                                          \
    } while (0)

/* the same with two inputs, vb the vector of x2[i] */
#define VM_MAP2(y, x, x2, n, expr)                                                                 \
    do {                                                                                           \
        int64_t i_ = 0;                                                                            \
        for (; i_ + VEC_N <= (n); i_ += VEC_N) {                                                   \
            vec_f va = vec_load((x) + i_), vb = vec_load((x2) + i_);                               \
            vec_store((y) + i_, expr);                                                             \
        }                                                                                          \
        if (i_ < (n)) {                                                                            \
            vec_f va = vec_load_part((x) + i_, (n)-i_);                                            \
            vec_f vb = vec_load_part((x2) + i_, (n)-i_);                                           \
            vec_store_part((y) + i_, expr, (n)-i_);                                                \
        }                                                                                          \
    } while (0)

VEC_FN vec_f vm_silu(vec_f x) {
    return x * vec_sigmoid(x);
}

/* phi(g) = b1 tanh(g / b1) sigma(g), psi(u) = b2 tanh(u / b2) (spec section 8) */
VEC_FN vec_f vm_situ_phi(vec_f g, float b1) {
    return vec_set1(b1) * vec_tanh(g / vec_set1(b1)) * vec_sigmoid(g);
}

VEC_FN vec_f vm_situ_psi(vec_f u, float b2) {
    return vec_set1(b2) * vec_tanh(u / vec_set1(b2));
}

void VM_NAME(arl_k_vexp_)(float *y, const float *x, int64_t n) {
    VM_MAP(y, x, n, vec_exp(va));
}

void VM_NAME(arl_k_vsigmoid_)(float *y, const float *x, int64_t n) {
    VM_MAP(y, x, n, vec_sigmoid(va));
}

void VM_NAME(arl_k_vtanh_)(float *y, const float *x, int64_t n) {
    VM_MAP(y, x, n, vec_tanh(va));
}

void VM_NAME(arl_k_vsilu_)(float *y, const float *x, int64_t n) {
    VM_MAP(y, x, n, vm_silu(va));
}

void VM_NAME(arl_k_vsitu_phi_)(float *y, const float *x, int64_t n, float b1) {
    VM_MAP(y, x, n, vm_situ_phi(va, b1));
}

/* h = phi(g) psi(u) */
void VM_NAME(arl_k_vsitu_glu_)(float *h, const float *g, const float *u, int64_t n, float b1,
                               float b2) {
    VM_MAP2(h, g, u, n, vm_situ_phi(va, b1) * vm_situ_psi(vb, b2));
}

/* h = silu(g) u */
void VM_NAME(arl_k_vswiglu_)(float *h, const float *g, const float *u, int64_t n) {
    VM_MAP2(h, g, u, n, vm_silu(va) * vb);
}

/* y += alpha x */
void VM_NAME(arl_k_vaxpy_)(float *y, float alpha, const float *x, int64_t n) {
    const vec_f a = vec_set1(alpha);
    int64_t i = 0;
    for (; i + VEC_N <= n; i += VEC_N)
        vec_store(y + i, vec_load(y + i) + a * vec_load(x + i));
    for (; i < n; i++)
        y[i] += alpha * x[i];
}

/* y = a * b */
void VM_NAME(arl_k_vmul_)(float *y, const float *a, const float *b, int64_t n) {
    VM_MAP2(y, a, b, n, va * vb);
}

/* y *= alpha */
void VM_NAME(arl_k_vscale_)(float *y, float alpha, int64_t n) {
    const vec_f a = vec_set1(alpha);
    int64_t i = 0;
    for (; i + VEC_N <= n; i += VEC_N)
        vec_store(y + i, vec_load(y + i) * a);
    for (; i < n; i++)
        y[i] *= alpha;
}
