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

/* NaN results.  When both operands of an operation are NaN, x86 returns the first source
 * operand's NaN, and which operand a compiler makes the first one is not specified: it differs
 * between the SSE (two-operand) and AVX (three-operand) encodings and between -O0 and -O2.  So
 * a NaN result is never left to the arithmetic: a NaN input gives that input quietened (x + x;
 * the first NaN input in argument order), every other NaN comes from one operation without NaN
 * operands (the default NaN, e.g. silu(-inf) = -inf * 0).  With this, the bits of every result,
 * NaN included, are the same in the 4-lane and the AVX2 build at every optimisation level. */
VEC_FN vec_f vm_nan1(vec_f r, vec_f a) {
    return vec_select(a != a, a + a, r);
}

VEC_FN vec_f vm_nan2(vec_f r, vec_f a, vec_f b) {
    return vec_select(a != a, a + a, vec_select(b != b, b + b, r));
}

/* y[i] = expr(va) with va the vector of x[i], for i in [0, n); the tail on a zero-padded copy. */
#define VM_MAP(y, x, n, expr)                                                                      \
    do {                                                                                           \
        int64_t i_ = 0;                                                                            \
        for (; i_ + VEC_N <= (n); i_ += VEC_N) {                                                   \
            vec_f va = vec_load((x) + i_);                                                         \
            vec_store((y) + i_, vm_nan1(expr, va));                                                \
        }                                                                                          \
        if (i_ < (n)) {                                                                            \
            vec_f va = vec_load_part((x) + i_, (n)-i_);                                            \
            vec_store_part((y) + i_, vm_nan1(expr, va), (n)-i_);                                   \
        }                                                                                          \
    } while (0)

/* the same with two inputs, vb the vector of x2[i] */
#define VM_MAP2(y, x, x2, n, expr)                                                                 \
    do {                                                                                           \
        int64_t i_ = 0;                                                                            \
        for (; i_ + VEC_N <= (n); i_ += VEC_N) {                                                   \
            vec_f va = vec_load((x) + i_), vb = vec_load((x2) + i_);                               \
            vec_store((y) + i_, vm_nan2(expr, va, vb));                                            \
        }                                                                                          \
        if (i_ < (n)) {                                                                            \
            vec_f va = vec_load_part((x) + i_, (n)-i_);                                            \
            vec_f vb = vec_load_part((x2) + i_, (n)-i_);                                           \
            vec_store_part((y) + i_, vm_nan2(expr, va, vb), (n)-i_);                               \
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

/* y + alpha x with the NaN rule above: y, then x, then alpha */
VEC_FN vec_f vm_axpy(vec_f y, vec_f a, vec_f x) {
    return vm_nan2(y + vm_nan1(a * x, x), y, x);
}

/* t = tanh(y) (vec_tanh) and s2 = 1 - tanh^2(y): for |y| < 0.625 as 1 - t*t (t*t <= 0.31, no
 * cancellation), else as 4e / (1 + e)^2 with e = exp(-2|y|), full relative precision where
 * 1 - t*t cancels (as kernels/cpu/activation.c sech2).  A vector whose lanes are all small
 * skips the exp (same bits). */
VEC_FN vec_f vm_tanh_sech2(vec_f y, vec_f *s2) {
    vec_f t = vec_tanh(y);
    vec_f small = vec_set1(1.0f) - t * t;
    vec_i is_small = vec_abs(y) < vec_set1(0.625f);
    int all_small = 1;
    for (int i = 0; i < VEC_N; i++)
        all_small &= is_small[i] != 0;
    if (all_small) {
        *s2 = small;
        return t;
    }
    vec_f e = vec_exp(vec_set1(-2.0f) * vec_abs(y));
    vec_f q = vec_set1(1.0f) + e;
    *s2 = vec_select(is_small, small, (vec_set1(4.0f) * e) / (q * q));
    return t;
}

/* Backward rows of the GLUs (kernels/activation.h), accumulating:
 *   SiTU-GLU  dg += dh phi'(g) psi(u),  du += dh phi(g) psi'(u)
 *             phi'(g) = sech^2(g/b1) sigma(g) + b1 tanh(g/b1) sigma(g) sigma(-g), psi' = sech^2(u/b2),
 *             sech^2 = 1 - tanh^2 (vm_tanh_sech2)
 *   SwiGLU    dg += dh silu'(g) u,       du += dh silu(g),  silu' = sigma(g) (1 + g sigma(-g))
 * sigma(g) and sigma(-g) share one exp(-|g|).  The tail runs on zero-padded copies. */
VEC_FN void vm_situ_glu_bwd(vec_f *dg, vec_f *du, vec_f dh, vec_f g, vec_f u, float b1,
                            float b2) {
    const vec_f one = vec_set1(1.0f), vb1 = vec_set1(b1), vb2 = vec_set1(b2);
    vec_f gb = g / vb1, ub = u / vb2;
    vec_f e = vec_exp(-vec_abs(g)), den = one + e;
    vec_i pos = g >= vec_set1(0.0f);
    vec_f s = vec_select(pos, one, e) / den, sm = vec_select(pos, e, one) / den;
    vec_f sg2, su2;
    vec_f btg = vb1 * vm_tanh_sech2(gb, &sg2);
    vec_f phi = btg * s;
    vec_f dphi = sg2 * s + btg * s * sm;
    vec_f psi = vb2 * vm_tanh_sech2(ub, &su2);
    *dg = vm_nan2(*dg + dh * dphi * psi, *dg, dh);
    *du = vm_nan2(*du + dh * phi * su2, *du, dh);
    *dg = vm_nan2(*dg, g, u);
    *du = vm_nan2(*du, g, u);
}

VEC_FN void vm_swiglu_bwd(vec_f *dg, vec_f *du, vec_f dh, vec_f g, vec_f u) {
    const vec_f one = vec_set1(1.0f);
    vec_f e = vec_exp(-vec_abs(g)), den = one + e;
    vec_i pos = g >= vec_set1(0.0f);
    vec_f s = vec_select(pos, one, e) / den, sm = vec_select(pos, e, one) / den;
    vec_f dsilu = s * (one + g * sm);
    *dg = vm_nan2(*dg + dh * dsilu * u, *dg, dh);
    *du = vm_nan2(*du + dh * (g * s), *du, dh);
    *dg = vm_nan2(*dg, g, u);
    *du = vm_nan2(*du, g, u);
}

#define VM_GLU_BWD(call)                                                                           \
    do {                                                                                           \
        int64_t i = 0;                                                                             \
        for (; i + VEC_N <= n; i += VEC_N) {                                                       \
            vec_f vdg = vec_load(dg + i), vdu = vec_load(du + i);                                  \
            vec_f vdh = vec_load(dh + i), vg = vec_load(g + i), vu = vec_load(u + i);              \
            call;                                                                                  \
            vec_store(dg + i, vdg), vec_store(du + i, vdu);                                        \
        }                                                                                          \
        if (i < n) {                                                                               \
            vec_f vdg = vec_load_part(dg + i, n - i), vdu = vec_load_part(du + i, n - i);          \
            vec_f vdh = vec_load_part(dh + i, n - i), vg = vec_load_part(g + i, n - i);            \
            vec_f vu = vec_load_part(u + i, n - i);                                                \
            call;                                                                                  \
            vec_store_part(dg + i, vdg, n - i), vec_store_part(du + i, vdu, n - i);                \
        }                                                                                          \
    } while (0)

void VM_NAME(arl_k_vsitu_glu_bwd_)(float *dg, float *du, const float *dh, const float *g,
                                   const float *u, int64_t n, float b1, float b2) {
    VM_GLU_BWD(vm_situ_glu_bwd(&vdg, &vdu, vdh, vg, vu, b1, b2));
}

void VM_NAME(arl_k_vswiglu_bwd_)(float *dg, float *du, const float *dh, const float *g,
                                 const float *u, int64_t n) {
    VM_GLU_BWD(vm_swiglu_bwd(&vdg, &vdu, vdh, vg, vu));
}

/* y += alpha x */
void VM_NAME(arl_k_vaxpy_)(float *y, float alpha, const float *x, int64_t n) {
    const vec_f a = vec_set1(alpha);
    int64_t i = 0;
    for (; i + VEC_N <= n; i += VEC_N)
        vec_store(y + i, vm_axpy(vec_load(y + i), a, vec_load(x + i)));
    for (; i < n; i++) { /* the tail in scalars (short rows are common), with the same rule */
        float p = x[i] != x[i] ? x[i] + x[i] : alpha * x[i];
        y[i] = y[i] != y[i] ? y[i] + y[i] : x[i] != x[i] ? p : y[i] + p;
    }
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
        vec_store(y + i, vm_nan1(vec_load(y + i) * a, vec_load(y + i)));
    for (; i < n; i++)
        y[i] = y[i] != y[i] ? y[i] + y[i] : y[i] * alpha;
}
