/* kernels/cpu/activation.c: pointwise activations and GLUs of kernels/activation.h.
 * The scalar functions below are the definitions (fp32 libm); the range loops apply them.  The
 * forward passes of sigmoid, SiLU, tanh, SiTU's phi and the two GLUs and the backward passes of
 * the two GLUs, which sit on the policy's hot paths, run the same formulas vectorised
 * (kernels/vmath.h: a few ulp, bit-identical on every CPU); softplus, the GELUs and the other
 * backward passes use libm. */
#include "kernels/activation.h"

#include <math.h>

#include "core/assert.h"
#include "kernels/cpu/internal.h"
#include "kernels/threadpool.h"
#include "kernels/vmath.h"

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2 0.7071067811865476f
#define INV_SQRT_2PI 0.3989422804014327f
#define GELU_C 0.044715f

/* ---- scalar definitions: value and derivative ---- */

static inline float silu_grad(float x) {
    float s = arl_k_sigmoidf(x);
    return s * (1.0f + x * arl_k_sigmoidf(-x));
}
static inline float sigmoid_grad(float x) {
    return arl_k_sigmoidf(x) * arl_k_sigmoidf(-x);
}
/* 1 - tanh^2(x) = sech^2(x) = 4e/(1+e)^2 with e = exp(-2|x|): full relative precision for
 * large |x|, where 1 - t*t cancels (t rounds to 1 already near |x| = 9). */
static inline float sech2(float x) {
    float e = expf(-2.0f * fabsf(x));
    float q = 1.0f + e;
    return 4.0f * e / (q * q);
}

static inline float tanh_grad(float x) {
    return sech2(x);
}
static inline float softplus(float x) {
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}
static inline float gelu_tanh(float x) {
    float t = tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x));
    return 0.5f * x * (1.0f + t);
}
static inline float gelu_tanh_grad(float x) {
    float t = tanhf(SQRT_2_OVER_PI * (x + GELU_C * x * x * x));
    return 0.5f * (1.0f + t) +
           0.5f * x * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_C * x * x);
}
static inline float gelu_erf(float x) {
    return 0.5f * x * (1.0f + erff(x * INV_SQRT_2));
}
static inline float gelu_erf_grad(float x) {
    return 0.5f * (1.0f + erff(x * INV_SQRT_2)) + x * INV_SQRT_2PI * expf(-0.5f * x * x);
}
/* phi'(x) = (1 - tanh^2(x/b)) sigma(x) + b tanh(x/b) sigma(x) (1 - sigma(x)) */
static inline float situ_phi_grad(float x, float b) {
    float t = tanhf(x / b), s = arl_k_sigmoidf(x);
    return sech2(x / b) * s + b * t * s * arl_k_sigmoidf(-x);
}

/* ---- elementwise drivers ---- */

typedef enum act_kind {
    ACT_SIGMOID,
    ACT_SILU,
    ACT_TANH,
    ACT_SOFTPLUS,
    ACT_GELU_TANH,
    ACT_GELU_ERF,
    ACT_SITU_PHI,
} act_kind;

typedef struct act_args {
    act_kind kind;
    float *y; /* forward: output; backward: dx */
    const float *x;
    const float *dy; /* backward only */
    float beta;
} act_args;

static void act_fwd_range(void *vctx, int64_t b, int64_t e) {
    const act_args *a = vctx;
    const float *x = a->x;
    float *y = a->y;
    switch (a->kind) {
    case ACT_SIGMOID:
        arl_k_vsigmoid(y + b, x + b, e - b);
        break;
    case ACT_SILU:
        arl_k_vsilu(y + b, x + b, e - b);
        break;
    case ACT_TANH:
        arl_k_vtanh(y + b, x + b, e - b);
        break;
    case ACT_SOFTPLUS:
        for (int64_t i = b; i < e; i++)
            y[i] = softplus(x[i]);
        break;
    case ACT_GELU_TANH:
        for (int64_t i = b; i < e; i++)
            y[i] = gelu_tanh(x[i]);
        break;
    case ACT_GELU_ERF:
        for (int64_t i = b; i < e; i++)
            y[i] = gelu_erf(x[i]);
        break;
    case ACT_SITU_PHI:
        arl_k_vsitu_phi(y + b, x + b, e - b, a->beta);
        break;
    }
}

static void act_bwd_range(void *vctx, int64_t b, int64_t e) {
    const act_args *a = vctx;
    const float *x = a->x, *dy = a->dy;
    float *dx = a->y;
    switch (a->kind) {
    case ACT_SIGMOID:
        for (int64_t i = b; i < e; i++)
            dx[i] += dy[i] * sigmoid_grad(x[i]);
        break;
    case ACT_SILU:
        for (int64_t i = b; i < e; i++)
            dx[i] += dy[i] * silu_grad(x[i]);
        break;
    case ACT_TANH:
        for (int64_t i = b; i < e; i++)
            dx[i] += dy[i] * tanh_grad(x[i]);
        break;
    case ACT_SOFTPLUS:
        for (int64_t i = b; i < e; i++)
            dx[i] += dy[i] * arl_k_sigmoidf(x[i]);
        break;
    case ACT_GELU_TANH:
        for (int64_t i = b; i < e; i++)
            dx[i] += dy[i] * gelu_tanh_grad(x[i]);
        break;
    case ACT_GELU_ERF:
        for (int64_t i = b; i < e; i++)
            dx[i] += dy[i] * gelu_erf_grad(x[i]);
        break;
    case ACT_SITU_PHI:
        for (int64_t i = b; i < e; i++)
            dx[i] += dy[i] * situ_phi_grad(x[i], a->beta);
        break;
    }
}

/* Transcendental elementwise work: a quarter of the memory-bound grain per thread suffices. */
#define ACT_GRAIN (ARL_K_GRAIN / 4)

static void act_fwd(act_kind k, float *y, const float *x, int64_t n, float beta) {
    ARL_ASSERT(n >= 0);
    act_args a = {k, y, x, NULL, beta};
    arl_k_parallel_for(n, ACT_GRAIN, act_fwd_range, &a);
}

static void act_bwd(act_kind k, float *dx, const float *dy, const float *x, int64_t n, float beta) {
    ARL_ASSERT(n >= 0);
    act_args a = {k, dx, x, dy, beta};
    arl_k_parallel_for(n, ACT_GRAIN, act_bwd_range, &a);
}

void arl_k_sigmoid_fwd(float *y, const float *x, int64_t n) {
    act_fwd(ACT_SIGMOID, y, x, n, 0);
}
void arl_k_silu_fwd(float *y, const float *x, int64_t n) {
    act_fwd(ACT_SILU, y, x, n, 0);
}
void arl_k_tanh_fwd(float *y, const float *x, int64_t n) {
    act_fwd(ACT_TANH, y, x, n, 0);
}
void arl_k_softplus_fwd(float *y, const float *x, int64_t n) {
    act_fwd(ACT_SOFTPLUS, y, x, n, 0);
}
void arl_k_gelu_tanh_fwd(float *y, const float *x, int64_t n) {
    act_fwd(ACT_GELU_TANH, y, x, n, 0);
}
void arl_k_gelu_erf_fwd(float *y, const float *x, int64_t n) {
    act_fwd(ACT_GELU_ERF, y, x, n, 0);
}
void arl_k_situ_phi_fwd(float *y, const float *x, int64_t n, float beta1) {
    ARL_ASSERT(beta1 > 0.0f);
    act_fwd(ACT_SITU_PHI, y, x, n, beta1);
}

void arl_k_sigmoid_bwd(float *dx, const float *dy, const float *x, int64_t n) {
    act_bwd(ACT_SIGMOID, dx, dy, x, n, 0);
}
void arl_k_silu_bwd(float *dx, const float *dy, const float *x, int64_t n) {
    act_bwd(ACT_SILU, dx, dy, x, n, 0);
}
void arl_k_tanh_bwd(float *dx, const float *dy, const float *x, int64_t n) {
    act_bwd(ACT_TANH, dx, dy, x, n, 0);
}
void arl_k_softplus_bwd(float *dx, const float *dy, const float *x, int64_t n) {
    act_bwd(ACT_SOFTPLUS, dx, dy, x, n, 0);
}
void arl_k_gelu_tanh_bwd(float *dx, const float *dy, const float *x, int64_t n) {
    act_bwd(ACT_GELU_TANH, dx, dy, x, n, 0);
}
void arl_k_gelu_erf_bwd(float *dx, const float *dy, const float *x, int64_t n) {
    act_bwd(ACT_GELU_ERF, dx, dy, x, n, 0);
}
void arl_k_situ_phi_bwd(float *dx, const float *dy, const float *x, int64_t n, float beta1) {
    ARL_ASSERT(beta1 > 0.0f);
    act_bwd(ACT_SITU_PHI, dx, dy, x, n, beta1);
}

/* ---- gated linear units ---- */

typedef struct glu_args {
    int situ; /* 1: SiTU-GLU, 0: SwiGLU */
    float *h, *dg, *du;
    const float *g, *u, *dh;
    int64_t f, ld;
    float b1, b2;
} glu_args;

static void glu_fwd_rows(void *vctx, int64_t begin, int64_t end) {
    const glu_args *a = vctx;
    for (int64_t t = begin; t < end; t++) {
        const float *g = a->g + t * a->ld, *u = a->u + t * a->ld;
        float *h = a->h + t * a->f;
        if (a->situ)
            arl_k_vsitu_glu(h, g, u, a->f, a->b1, a->b2);
        else
            arl_k_vswiglu(h, g, u, a->f);
    }
}

static void glu_bwd_rows(void *vctx, int64_t begin, int64_t end) {
    const glu_args *a = vctx;
    for (int64_t t = begin; t < end; t++) {
        const float *g = a->g + t * a->ld, *u = a->u + t * a->ld, *dh = a->dh + t * a->f;
        float *dg = a->dg + t * a->ld, *du = a->du + t * a->ld;
        if (a->situ)
            arl_k_vsitu_glu_bwd(dg, du, dh, g, u, a->f, a->b1, a->b2);
        else
            arl_k_vswiglu_bwd(dg, du, dh, g, u, a->f);
    }
}

static void glu_check(int64_t T, int64_t f, int64_t ld) {
    ARL_ASSERT(T >= 0 && f >= 0 && ld >= f);
}

void arl_k_swiglu_fwd(float *h, const float *g, const float *u, int64_t T, int64_t f, int64_t ld) {
    glu_check(T, f, ld);
    glu_args a = {.situ = 0, .h = h, .g = g, .u = u, .f = f, .ld = ld};
    arl_k_parallel_for(T, arl_k_grain_items(f, ACT_GRAIN), glu_fwd_rows, &a);
}

void arl_k_swiglu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                      int64_t T, int64_t f, int64_t ld) {
    glu_check(T, f, ld);
    glu_args a = {.situ = 0, .dg = dg, .du = du, .g = g, .u = u, .dh = dh, .f = f, .ld = ld};
    arl_k_parallel_for(T, arl_k_grain_items(f, ACT_GRAIN), glu_bwd_rows, &a);
}

void arl_k_situ_glu_fwd(float *h, const float *g, const float *u, int64_t T, int64_t f, int64_t ld,
                        float beta1, float beta2) {
    glu_check(T, f, ld);
    ARL_ASSERT(beta1 > 0.0f && beta2 > 0.0f);
    glu_args a = {.situ = 1, .h = h, .g = g, .u = u, .f = f, .ld = ld, .b1 = beta1, .b2 = beta2};
    arl_k_parallel_for(T, arl_k_grain_items(f, ACT_GRAIN), glu_fwd_rows, &a);
}

void arl_k_situ_glu_bwd(float *dg, float *du, const float *dh, const float *g, const float *u,
                        int64_t T, int64_t f, int64_t ld, float beta1, float beta2) {
    glu_check(T, f, ld);
    ARL_ASSERT(beta1 > 0.0f && beta2 > 0.0f);
    glu_args a = {.situ = 1,
                  .dg = dg,
                  .du = du,
                  .g = g,
                  .u = u,
                  .dh = dh,
                  .f = f,
                  .ld = ld,
                  .b1 = beta1,
                  .b2 = beta2};
    arl_k_parallel_for(T, arl_k_grain_items(f, ACT_GRAIN), glu_bwd_rows, &a);
}
