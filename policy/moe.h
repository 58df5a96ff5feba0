/* policy/moe.h: the FFNs of the policy on the CPU, fp32: Stable LatentMoE with shared experts
 * (spec/policy.md section 7) and the dense GLU FFN of the first layers, both with the GLU
 * activation of the config (SiTU, section 8, or SwiGLU).
 *
 * What this is: routing (through policy/router.h), the down-projection to the latent width,
 * the routed experts grouped by expert (count, gather, one GEMM pair per expert with tokens,
 * scatter, spec 7.2), the weighted sum, the latent RMSNorm, the up-projection, the fused
 * shared experts; expert loads and routes for monitoring, Quantile Balancing and replay.
 * What this is not: the router itself (policy/router.h), the QB bias update (policy/qb.h),
 * expert parallelism across processes (learner/).
 *
 * Symbols: T tokens, d width, E experts, k experts per token, f expert width, dz latent
 * width, fs = ns*f shared width, fd dense width.
 */
#ifndef ARL_POLICY_MOE_H
#define ARL_POLICY_MOE_H

#include <stdint.h>

#include "core/status.h"
#include "policy/params.h"

/* The GLU activation: SiTU(g, u) = phi(g) psi(u) with caps beta1, beta2, or SwiGLU. */
typedef struct arl_glu_act {
    int32_t situ; /* 1: SiTU (hidden_act "situ"); 0: SwiGLU ("silu") */
    float beta1;  /* activation_situ_beta */
    float beta2;  /* activation_situ_linear_beta */
} arl_glu_act;

/* h (T, f) = act(g, u) for g, u (T, f) stored with row stride ld (see kernels/activation.h). */
void arl_glu_act_fwd(const arl_glu_act *a, float *h, const float *g, const float *u, int64_t T,
                     int64_t f, int64_t ld);

/* ---- dense FFN: y = W_down act(W_gate x, W_up x), width fd ---- */

int64_t arl_dense_ffn_ws_floats(int64_t d, int64_t fd, int64_t T);

/* y (T, d) from x (T, d).  ws: arl_dense_ffn_ws_floats floats.  y must not alias x. */
void arl_dense_ffn_fwd(float *y, const float *x, const arl_dense_params *p, int64_t d, int64_t fd,
                       const arl_glu_act *act, int64_t T, float *ws);

/* ---- Stable LatentMoE ---- */

typedef struct arl_moe_cfg {
    int64_t d, E, k, f, dz, fs; /* fs = 0: no shared experts */
    float rho;                  /* routed_scaling_factor */
    float eps;                  /* rms_norm_eps of the latent norm */
    arl_glu_act act;
} arl_moe_cfg;

/* Outputs besides y; every pointer may be NULL (not wanted). */
typedef struct arl_moe_out {
    int32_t *routes; /* (T, k) selected experts, best first (or the forced routes) */
    float *weights;  /* (T, k) router weights p aligned with routes */
    float *scores;   /* (T, E) sigmoid scores s (Quantile Balancing statistics) */
    int64_t *load;   /* (E) tokens routed to each expert in this call (overwritten) */
} arl_moe_out;

int64_t arl_moe_ws_floats(const arl_moe_cfg *c, int64_t T);

/* y (T, d) = LatentMoE(x (T, d)) (x = RMSNorm_post(m)).  forced (T, k) or NULL: routes to use
 * instead of the router's selection (spec 6.1).  ws: arl_moe_ws_floats(c, T) floats.
 * ARL_ERR_RANGE (naming the token) for a forced route outside [0, E) or repeated within a
 * token; y is then undefined.  y must not alias x. */
arl_status arl_moe_fwd(float *y, const arl_moe_out *out, const float *x, const arl_moe_params *p,
                       const arl_moe_cfg *c, const int32_t *forced, int64_t T, float *ws);

#endif
