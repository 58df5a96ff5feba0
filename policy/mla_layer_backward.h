/* policy/mla_layer_backward.h: training forward and backward of one gated NoPE MLA mixer layer
 * on the CPU, fp32 (spec/policy.md 4.1-4.3).
 *
 * What this is: a forward that computes what arl_mla_layer_fwd (policy/mla_layer.h) computes and
 * keeps the intermediates, and the backward of the whole layer: output projection, sigmoid
 * output gate, attention, the per-head up-projection W_kvb, the q and kv RMSNorms (eps 1e-6)
 * and the projections (q_lora or direct q_proj).  Two attention forms, as in the forward:
 *   - expanded (4.1, backward 4.3; policy/mla.h) when every document starts fresh;
 *   - absorbed (4.2) when a document continues a sequence: its queries attend over the
 *     sequence's latent rows [c; k_pe] - the rows of earlier segments (constants of this
 *     segment, spec 4.2: "earlier tokens' [c; k_pe] are constants") followed by its own.  W_kvb
 *     still acts on the earlier rows inside this segment, so it receives their share of the
 *     gradient; the rows themselves receive a gradient only on request (dprefix).
 * The absorbed core here is blocked over 64 queries with GEMMs and keeps each row's
 * log-sum-exp for the backward.  With block-sparse selection (4.5, c->sparse_topk > 0) every
 * document runs the absorbed form through policy/mla.h's sparse cores: the forward keeps each
 * (token, head)'s selected chunks, the backward runs over the selected rows only (the
 * selection carries no gradient); cost per query O((k_c + 1) n_c), not O(rows).
 * What this is not: the residual stream (policy/model_backward.c), cache storage
 * (policy/state.h).
 *
 * Symbols: T tokens, N documents, d width, Hm heads, rq, rkv ranks, n, r, vm head dims,
 * R = rkv + r.  Conventions: the backward ACCUMULATES (+=) into dx and every gradient; work
 * buffers come from the caller; nothing allocates; pointers are borrowed for the call.
 */
#ifndef ARL_POLICY_MLA_LAYER_BACKWARD_H
#define ARL_POLICY_MLA_LAYER_BACKWARD_H

#include <stdint.h>

#include "policy/mla_layer.h"
#include "policy/params.h"

typedef struct arl_mla_layer_save {
    float *cq_pre;    /* (T, rq) W_qa x (q_lora only) */
    float *rstd_q;    /* (T) */
    float *cq;        /* (T, rq) RMSNorm(W_qa x) */
    float *q_nope;    /* (T, Hm, n) */
    float *q_pe;      /* (T, Hm, r) */
    float *c_pre;     /* (T, rkv) first rkv of W_kva x */
    float *rstd_c;    /* (T) */
    float *c;         /* (T, rkv) normalised latent */
    float *lat;       /* (T, R) the new rows [c; k_pe] */
    float *k_pe;      /* (T, r) */
    float *k_nope;    /* (T, Hm, n) expanded form */
    float *v;         /* (T, Hm, vm) expanded form */
    float *qhat;      /* (T, Hm, rkv) absorbed form */
    float *ohat;      /* (T, Hm, rkv) absorbed form */
    float *lse;       /* (T, Hm) log-sum-exp of every softmax row */
    float *o;         /* (T, Hm, vm) attention output */
    float *gam;       /* (T, Hm*vm) gate logits W_g x */
    float *u;         /* (T, Hm*vm) sigmoid(gam) * o, input of o_proj */
    int32_t *sel;     /* (T, Hm, sparse_topk) block-sparse: the earlier chunks each (token,
                       * head) selected, increasing, -1 after the last (NULL when dense) */
    int32_t absorbed; /* the form the forward used */
} arl_mla_layer_save;

int64_t arl_mla_layer_save_floats(const arl_mla_layer_cfg *c, int64_t T);
void arl_mla_layer_save_bind(arl_mla_layer_save *s, const arl_mla_layer_cfg *c, int64_t T,
                             float *base);

/* Floats of work buffer of arl_mla_layer_fwd_save / _bwd (c->max_rows bounds the rows one
 * sequence attends over, for the absorbed form). */
int64_t arl_mla_layer_train_ws_floats(const arl_mla_layer_cfg *c, int64_t T, int32_t N);

/* The dense absorbed core of the layer (4.2), one document per call (also the "cpu" ops of the
 * device training step, policy/model_device.h mla_abs_*): Tq queries at positions p0.. over the
 * document's rows (p0 + Tq, rkv + r), token rows of stride Hm*rkv (qhat, ohat, dohat, dqhat),
 * Hm*r (q_pe, dq_pe), Hm (lse).  Forward: ohat, lse OVERWRITTEN (heads in parallel).  Backward
 * for dohat: dqhat, dq_pe +=, dnew (Tq, rkv + r) += (the document's own rows), dprefix (p0,
 * rkv + r) += (NULL: not wanted); heads and query blocks in order.  ws:
 * arl_mla_absorbed_train_ws_floats(S >= p0 + Tq, Hm) floats. */
int64_t arl_mla_absorbed_train_ws_floats(int64_t S, int64_t Hm);
void arl_mla_absorbed_fwd_save(float *ohat, float *lse, const float *qhat, const float *q_pe,
                               const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                               int64_t r, float scale, float *ws);
void arl_mla_absorbed_bwd(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                          const float *dohat, const float *ohat, const float *lse,
                          const float *qhat, const float *q_pe, const float *rows, int64_t p0,
                          int64_t Tq, int64_t Hm, int64_t rkv, int64_t r, float scale, float *ws);

/* The block-sparse core of the layer (4.5 with 4.3), one document per call, as the layer runs
 * it (also the "cpu" ops of the device training step, policy/model_device.h mla_sparse_*):
 * Tq queries at positions p0.. over the document's rows (p0 + Tq, rkv + r) (the prefix, then
 * its own), token rows as arl_mla_absorbed_fwd_save.  Forward: the chunk summaries of all the
 * rows (arl_mla_chunk_means_update from row 0), then arl_mla_sparse_attn_save in blocks of at
 * most 8192 (query, head) pairs: ohat, lse and list (Tq, Hm, k_c) (each pair's selected earlier
 * chunks, increasing, -1 after the last) OVERWRITTEN.  Backward with that list
 * (arl_mla_sparse_attn_bwd, the same blocks): dqhat, dq_pe +=, dnew (Tq, rkv + r) +=, dprefix
 * (p0, rkv + r) += (NULL: not wanted).  n_c >= 1, k_c >= 1.  ws:
 * arl_mla_sparse_doc_ws_floats(Tq_max >= Tq, S >= p0 + Tq, ...) floats. */
int64_t arl_mla_sparse_doc_ws_floats(int64_t Tq_max, int64_t S, int64_t Hm, int64_t rkv, int64_t r,
                                     int64_t n_c, int64_t k_c);
void arl_mla_sparse_doc_fwd_save(float *ohat, float *lse, int32_t *list, const float *qhat,
                                 const float *q_pe, const float *rows, int64_t p0, int64_t Tq,
                                 int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                                 int64_t k_c, float *ws);
void arl_mla_sparse_doc_bwd(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                            const float *dohat, const float *ohat, const float *lse,
                            const int32_t *list, const float *qhat, const float *q_pe,
                            const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                            int64_t r, float scale, int64_t n_c, int64_t k_c, float *ws);

/* y (T, d) = the MLA mixer of x (T, d).  caches, pos: NULL (fresh documents), or as in
 * arl_mla_layer_fwd (caches[i] holds pos[i] rows and has room for the document's; its new rows
 * are written there).  absorbed: 1 forces the absorbed form (also for fresh documents); 0
 * uses it only when some pos[i] > 0 (always used when c->sparse_topk > 0).  ws: train ws
 * floats. */
void arl_mla_layer_fwd_save(float *y, const float *x, const arl_mla_params *p,
                            const arl_mla_layer_cfg *c, const int32_t *cu, int32_t N, int64_t T,
                            float *const *caches, const int64_t *pos, int absorbed,
                            arl_mla_layer_save *sv, float *ws);

/* Backward for dy (T, d) with sv from arl_mla_layer_fwd_save over the same inputs (and the same
 * caches, whose rows 0 .. pos[i] + len_i - 1 must be unchanged).  dx (T, d) +=, gradients in
 * gp +=.  dlat_T (T, R): gradient of the new rows from later segments (NULL: 0).
 * dprefix: NULL, or N pointers to (pos[i], R) that receive += the gradient of the earlier rows
 * (only with the absorbed form; entries for fresh documents are not touched).
 * ws: train ws floats. */
void arl_mla_layer_bwd(float *dx, const arl_mla_params *gp, const float *dy, const float *x,
                       const arl_mla_params *p, const arl_mla_layer_cfg *c, const int32_t *cu,
                       int32_t N, int64_t T, float *const *caches, const int64_t *pos,
                       const arl_mla_layer_save *sv, const float *dlat_T, float *const *dprefix,
                       float *ws);

#endif
