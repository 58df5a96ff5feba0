/* policy/moe_backward.h: training forward and backward of the FFNs on the CPU, fp32: the dense
 * GLU FFN and Stable LatentMoE with shared experts (spec/policy.md 7, 8; router 6.2).
 *
 * What this is: forwards that compute what arl_dense_ffn_fwd / arl_moe_fwd (policy/moe.h)
 * compute - same kernels, same order, same bits - keeping the intermediates, and their
 * backwards.  LatentMoE backward (7.3): the up-projection and latent RMSNorm, the weighted sum
 * (dp_i = E_i(z) . du for the router, p_i du into expert i), the routed experts grouped by
 * expert (each expert's weight gradient accumulates only over the tokens routed to it;
 * experts without tokens get none), the down-projection, the fused shared experts and the
 * router (gradient through the selected scores only; the selection bias gets none).
 * What this is not: the router or expert forward math itself (policy/router.h, policy/moe.h),
 * Quantile Balancing (policy/qb.h).
 *
 * Symbols: T tokens, d width, E experts, k per token, f expert width, dz latent width,
 * fs shared width, fd dense width.  The backward ACCUMULATES (+=) into dx and the gradients;
 * work buffers come from the caller; nothing allocates.
 */
#ifndef ARL_POLICY_MOE_BACKWARD_H
#define ARL_POLICY_MOE_BACKWARD_H

#include <stdint.h>

#include "core/status.h"
#include "policy/moe.h"
#include "policy/params.h"

/* ---- dense FFN ---- */

typedef struct arl_dense_save {
    float *gu; /* (T, 2 fd) [W_gate x | W_up x] */
    float *h;  /* (T, fd) act(gate, up) */
} arl_dense_save;

int64_t arl_dense_save_floats(int64_t fd, int64_t T);
void arl_dense_save_bind(arl_dense_save *s, int64_t fd, int64_t T, float *base);
int64_t arl_dense_train_ws_floats(int64_t d, int64_t fd, int64_t T);

/* y (T, d) as arl_dense_ffn_fwd, keeping sv. */
void arl_dense_ffn_fwd_save(float *y, const float *x, const arl_dense_params *p, int64_t d,
                            int64_t fd, const arl_glu_act *act, int64_t T, arl_dense_save *sv);
/* dx (T, d) +=, gp +=, for dy (T, d). ws: arl_dense_train_ws_floats floats. */
void arl_dense_ffn_bwd(float *dx, const arl_dense_params *gp, const float *dy, const float *x,
                       const arl_dense_params *p, int64_t d, int64_t fd, const arl_glu_act *act,
                       int64_t T, const arl_dense_save *sv, float *ws);

/* ---- Stable LatentMoE ---- */

typedef struct arl_moe_save {
    float *s;       /* (T, E) sigmoid scores */
    int32_t *sel;   /* (T, k) selected experts */
    float *pw;      /* (T, k) router weights */
    float *z;       /* (T, dz) W_down x */
    int64_t *start; /* (E + 1) first grouped row of each expert */
    int64_t *row;   /* (T*k) grouped row of (token, slot) */
    float *zg;      /* (T*k, dz) latent inputs grouped by expert */
    float *gu;      /* (T*k, 2f) */
    float *h;       /* (T*k, f) */
    float *yg;      /* (T*k, dz) expert outputs */
    float *u_pre;   /* (T, dz) weighted sum */
    float *rstd;    /* (T) latent norm statistics */
    float *u;       /* (T, dz) after the latent norm (= u_pre without it) */
    float *sgu;     /* (T, 2 fs) shared experts */
    float *sh;      /* (T, fs) */
} arl_moe_save;

int64_t arl_moe_save_floats(const arl_moe_cfg *c, int64_t T);
void arl_moe_save_bind(arl_moe_save *s, const arl_moe_cfg *c, int64_t T, float *base);
int64_t arl_moe_train_ws_floats(const arl_moe_cfg *c, int64_t T);

/* y (T, d) as arl_moe_fwd (out, forced and errors the same), keeping sv.  ws: train ws. */
arl_status arl_moe_fwd_save(float *y, const arl_moe_out *out, const float *x,
                            const arl_moe_params *p, const arl_moe_cfg *c, const int32_t *forced,
                            int64_t T, arl_moe_save *sv, float *ws);

/* dx (T, d) +=, gp += (gp->gate_bias is never written), for dy (T, d).  ws: train ws. */
void arl_moe_bwd(float *dx, const arl_moe_params *gp, const float *dy, const float *x,
                 const arl_moe_params *p, const arl_moe_cfg *c, int64_t T, const arl_moe_save *sv,
                 float *ws);

#endif
