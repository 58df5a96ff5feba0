/* policy/model_device.h: the policy forward over a run-time selected device ("cpu" host
 * memory, or "cuda" device memory of the current CUDA context), written once over two tables:
 * the kernel backend (kernels/backend.h: GEMMs, norms, activations, softmax/log-probs) and
 * arl_dev_ops below (memory, transfers, and the model-level ops: short conv, KDA gate, core
 * and output norm, MLA attention, AttnRes mix, router, routed experts).
 *
 * What this is: weights uploaded once into one arena of the device (fp32 masters; the GEMMs
 * of the "cuda" device run through cuBLAS in the context's math mode, ARL_CUDA_MATH_BF16
 * giving bf16 inputs with fp32 accumulation, or, with bf16_weights, on bf16 copies of the
 * weights: bf16 storage, fp32 accumulation, spec/policy.md 1.4; norms, router, KDA gate,
 * beta and state, softmax and SiTU stay fp32), every activation and work buffer in the
 * same arena, sized at init from the config and max_tokens / max_docs; a forward allocates
 * nothing.  With the "cpu" ops the forward calls exactly the functions policy/model.c calls,
 * in the same order, so its logits are bit-identical to arl_model_forward's (tested).
 * Decode state: the model may own n_slots sequence slots on the device (KDA states and conv
 * tails, MLA latent caches of max_context rows), continued by arl_model_dev_forward_state,
 * arl_model_dev_prefill and arl_model_dev_decode_step exactly as policy/model.h continues an
 * arl_decode_state (the same ops in the same order: bit-identical on "cpu").
 * The training step (saved activations, backward, AdamW; fresh documents or documents
 * continuing the slots, with state gradients) over the same tables is
 * policy/model_device_backward.h.
 * Images: the forwards take media rows (b->media, computed on the host by policy/vision.h)
 * and place them at the <|media_pad|> rows as policy/model.c does; the training step does not.
 * A slot's state moves to and from a host arl_decode_state (policy/state.h) with
 * arl_model_dev_slot_download / _upload, which is how it is exported, cached and imported.
 * Block-sparse MLA (spec 4.5, opts mla_sparse_topk > 0): every MLA layer runs the absorbed
 * form with the chunk selection, as policy/mla_layer.c does: fresh documents over their own
 * chunk summaries (made once per forward), decode slots over summaries kept beside their
 * latent rows on the device (st_means), brought up to date by every forward and recomputed
 * from the rows by arl_model_dev_slot_upload.  The training step (policy/model_device_backward.h)
 * runs it as policy/mla_layer_backward.c (ops mla_sparse_*); decode steps of a block-sparse
 * model are captured as CUDA graphs when the device has the position-independent ops
 * (mla_chunk_means_update_dpos, mla_sparse_attn_dpos; same bits as op by op).
 *
 * Symbols: T tokens of a batch, N documents, d width, V vocabulary, L layers, E experts,
 * k experts per token, H KDA heads, dk = dv, P = H*dk, Hm MLA heads, dz latent width,
 * f expert width, C KDA chunk length.
 *
 * Pointer rules: tensor arguments of arl_dev_ops entries are memory of that device ("cuda":
 * device pointers of the current context; "cpu": host pointers); the cu (N + 1), token and
 * route arrays too.  Host arrays are named as such.
 */
#ifndef ARL_POLICY_MODEL_DEVICE_H
#define ARL_POLICY_MODEL_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "kernels/backend.h"
#include "kernels/cuda/ops.h"
#include "policy/model.h"

typedef struct arl_dev_ops {
    const char *name;                      /* "cpu" or "cuda" */
    const arl_k_backend *(*backend)(void); /* the kernel table over this device's memory */

    /* one block of device memory (*out, valid until mem_free(*out, *token)) */
    arl_status (*mem_alloc)(size_t bytes, const char *what, void **out, size_t *token);
    void (*mem_free)(void *p, size_t token);
    /* host <-> device copies; both wait for completion */
    arl_status (*upload)(void *dst, const void *src_host, size_t bytes);
    arl_status (*download)(void *dst_host, const void *src, size_t bytes);
    /* waits for queued work; returns the first recorded device error */
    arl_status (*sync)(void);

    /* dst (rows, cols) leading dim ldd = src leading dim lds */
    void (*copy_rows)(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                      int64_t cols);
    /* x (T, d) = table (V, d) rows of tokens (T); ids checked by the caller */
    void (*embed)(float *x, const float *table, const int32_t *tokens, int64_t T, int64_t d,
                  int64_t V);
    /* policy/kda.h contracts */
    void (*kda_conv_fwd)(float *z, float *y, const float *x, const float *w, const float *tails,
                         const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W);
    void (*kda_gate_k3_fwd)(float *g, const float *f, const float *A_log, const float *dt_bias,
                            int64_t T, int64_t H, int64_t dk, float g_min);
    void (*kda_gate_softplus_fwd)(float *g, const float *f, const float *A_log,
                                  const float *dt_bias, int64_t T, int64_t H, int64_t dk);
    /* tail_out must not alias tail_in (the CUDA kernel writes every element at once) */
    void (*kda_conv_tail)(float *tail_out, const float *x, int64_t n, const float *tail_in,
                          int64_t C, int64_t W);
    void (*kda_onorm_fwd)(float *ob, float *rstd, const float *o, const float *gam, const float *w,
                          int64_t n, int64_t dv, float eps);
    int64_t (*kda_chunk_ws_floats)(int64_t T, int32_t N, int64_t H, int64_t dk, int64_t dv,
                                   int64_t C);
    void (*kda_chunk_fwd)(float *o, float *S, float *chunk_states, const float *q, const float *k,
                          const float *v, const float *g, const float *beta, const int32_t *cu,
                          int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale,
                          int64_t C, float *ws);
    void (*kda_recurrent_fwd)(float *o, float *S, float *chunk_states, const float *q,
                              const float *k, const float *v, const float *g, const float *beta,
                              const int32_t *cu, int32_t N, int64_t T, int64_t H, int64_t dk,
                              int64_t dv, float scale, int64_t C);
    /* policy/mla.h arl_mla_attn_fwd (lse may be NULL) */
    int64_t (*mla_attn_ws_floats)(int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm);
    void (*mla_attn_fwd)(float *o, float *lse, const float *q_nope, const float *q_pe,
                         const float *k_nope, const float *k_pe, const float *v, const int32_t *cu,
                         int32_t N, int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm,
                         float scale, float *ws);
    /* policy/mla.h arl_mla_absorbed_attn, dense (k_c = 0): Tq queries at positions pos0.. of
     * one sequence over its cache rows (pos0 + Tq, rkv + r); ws: mla_absorbed_ws_floats(S,
     * Hm, rkv, r) floats for caches of at most S rows */
    int64_t (*mla_absorbed_ws_floats)(int64_t S, int64_t Hm, int64_t rkv, int64_t r);
    void (*mla_absorbed_attn)(float *ohat, const float *qhat, const float *q_pe, const float *cache,
                              int64_t pos0, int64_t Tq, int64_t Hm, int64_t rkv, int64_t r,
                              float scale, float *ws);
    /* policy/attnres.h; src is a HOST array of N pointers to (T, d) device rows */
    void (*attnres_mix_fwd)(float *out, float *a, const float *const *src, int32_t N, int64_t T,
                            int64_t d, const float *w_norm, const float *w_proj, float eps);
    /* policy/router.h arl_router_fwd; forced routes were checked by the caller */
    int64_t (*router_ws_floats)(int64_t T, int64_t E);
    void (*router_fwd)(int32_t *sel, float *p, float *s, const float *x, const float *W_r,
                       const float *bias, const int32_t *forced, int64_t T, int64_t d, int64_t E,
                       int64_t k, float rho, float *ws);
    /* the routed experts of spec 7.2: u (T, dz) = sum_j p[t, j] E_{sel[t, j]}(z_t) in slot
     * order, for z (T, dz), sel and p (T, k); expert e = W2_e act(W1_e z, W3_e z) */
    int64_t (*moe_experts_ws_floats)(int64_t T, int64_t k, int64_t E, int64_t dz, int64_t f);
    void (*moe_experts_fwd)(float *u, const float *z, const int32_t *sel, const float *p,
                            const arl_moe_params *w, const arl_moe_cfg *c, int64_t T,
                            const uint16_t *const *banks, float *ws);
    /* banks: NULL, or the bf16 copies of w1, w3, w2 (bf16 weights; "cuda" only) */

    /* bf16 weight storage ("cuda" only; NULL on "cpu"): y (T, out; leading dim ldy) =
     * xb (T, in) W^T + beta y with xb and W (out, in) bf16, fp32 accumulation and output; and
     * the fp32 -> bf16 conversion (nearest even) of the uploaded weights and the GEMMs' inputs */
    void (*linear_bf16)(float *y, int64_t ldy, float beta, const uint16_t *xb, const uint16_t *W,
                        int64_t T, int64_t in, int64_t out);
    void (*f32_to_bf16)(uint16_t *y, const float *x, int64_t n);
    /* whether the GEMMs round their fp32 inputs to bf16 (the current context's bf16 math mode;
     * NULL on "cpu": never) */
    int (*math_bf16)(void);

    /* CUDA graphs of decode steps ("cuda" only; NULL on "cpu"): the position-independent
     * forms of the two ops that read a sequence's position (read from pos_dev when the
     * kernel runs), and capture / replay of the ops enqueued between begin and end. */
    void (*cache_append_dpos)(float *cache, const int64_t *pos_dev, const float *rows, int64_t n,
                              int64_t R);
    void (*mla_absorbed_attn_dpos)(float *ohat, const float *qhat, const float *q_pe,
                                   const float *cache, const int64_t *pos_dev, int64_t Tq,
                                   int64_t Hm, int64_t rkv, int64_t r, float scale,
                                   int64_t max_rows, float *ws);
    /* block-sparse MLA (spec 4.5) in a decode step, one row / query at position *pos_dev:
     * mla_chunk_means_update(means, cache, pos, pos + 1, ...) and mla_sparse_attn(..., pos, 1,
     * ...) with ws for S >= pos + 1 rows (NULL: block-sparse steps are not captured) */
    void (*mla_chunk_means_update_dpos)(float *means, const float *cache, const int64_t *pos_dev,
                                        int64_t R, int64_t n_c);
    void (*mla_sparse_attn_dpos)(float *ohat, const float *qhat, const float *q_pe,
                                 const float *cache, const float *means, const int64_t *pos_dev,
                                 int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                                 int64_t k_c, int64_t S, float *ws);
    arl_status (*graph_begin)(void);
    arl_status (*graph_end)(void **graph);
    arl_status (*graph_launch)(void *graph);
    void (*graph_free)(void *graph);

    /* ---- training (policy/model_device_backward.h); backward entries ACCUMULATE (+=) into
     * their gradients unless said otherwise, as the CPU functions they name ---- */
    /* policy/kda.h arl_kda_conv_bwd, arl_kda_gate_*_bwd, arl_kda_onorm_bwd, arl_kda_chunk_bwd */
    void (*kda_conv_bwd)(float *dx, float *dw, const float *dz, const float *x, const float *w,
                         const float *tails, const int32_t *cu, int32_t N, int64_t T, int64_t C,
                         int64_t W);
    void (*kda_gate_k3_bwd)(float *df, float *dA_log, float *ddt_bias, const float *dg,
                            const float *f, const float *A_log, const float *dt_bias, int64_t T,
                            int64_t H, int64_t dk, float g_min);
    void (*kda_gate_softplus_bwd)(float *df, float *dA_log, float *ddt_bias, const float *dg,
                                  const float *f, const float *A_log, const float *dt_bias,
                                  int64_t T, int64_t H, int64_t dk);
    void (*kda_onorm_bwd)(float *d_o, float *dgam, float *dw, const float *dob, const float *o,
                          const float *gam, const float *w, const float *rstd, int64_t n,
                          int64_t dv);
    int64_t (*kda_chunk_bwd_ws_floats)(int64_t T, int32_t N, int64_t H, int64_t dk, int64_t dv,
                                       int64_t C);
    void (*kda_chunk_bwd)(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, float *dS0,
                          const float *d_o, const float *dS_T, const float *q, const float *k,
                          const float *v, const float *g, const float *beta,
                          const float *chunk_states, const int32_t *cu, int32_t N, int64_t T,
                          int64_t H, int64_t dk, int64_t dv, float scale, int64_t C, float *ws);
    /* policy/mla.h arl_mla_attn_bwd (o and lse of the forward) */
    int64_t (*mla_attn_bwd_ws_floats)(int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm);
    void (*mla_attn_bwd)(float *dq_nope, float *dq_pe, float *dk_nope, float *dk_pe, float *dv,
                         const float *d_o, const float *o, const float *lse, const float *q_nope,
                         const float *q_pe, const float *k_nope, const float *k_pe, const float *v,
                         const int32_t *cu, int32_t N, int64_t T, int64_t Hm, int64_t n, int64_t r,
                         int64_t vm, float scale, float *ws);
    /* policy/attnres.h arl_attnres_mix_bwd_ws; dsrc and src are HOST arrays of N device
     * pointers; ws: attnres_bwd_ws_floats(N, T) floats */
    int64_t (*attnres_bwd_ws_floats)(int32_t N, int64_t T);
    void (*attnres_mix_bwd)(float *const *dsrc, float *dw_norm, float *dw_proj, const float *dh,
                            const float *const *src, int32_t N, int64_t T, int64_t d,
                            const float *w_norm, const float *w_proj, float eps, float *ws);
    /* policy/router.h arl_router_bwd (ws: router_ws_floats) */
    void (*router_bwd)(float *dx, float *dW_r, const float *dp, const float *x, const float *W_r,
                       const float *s, const int32_t *sel, int64_t T, int64_t d, int64_t E,
                       int64_t k, float rho, float *ws);
    /* The routed experts of the training forward: moe_experts_fwd keeping what the backward
     * needs in save (moe_experts_save_floats floats, the device's own layout); and their
     * backward for du (T, dz): dz (T, dz) and dp (T, k) OVERWRITTEN (the gradients of z and
     * of the router weights p), gw->w1, w3, w2 +=.  ws: moe_experts_bwd_ws_floats floats.
     * The same arithmetic as policy/moe_backward.c (tested bit for bit on "cpu").  banks (the
     * same in both calls): NULL, or the bf16 copies of w1, w3, w2 ("cuda" only): under the bf16
     * math mode the GEMMs' operands are then kept in bf16 (the activations rounded once where
     * they are made, the weights' copies read) - the same sums as without, bit for bit. */
    int64_t (*moe_experts_save_floats)(int64_t T, int64_t k, int64_t E, int64_t dz, int64_t f);
    void (*moe_experts_fwd_save)(float *u, const float *z, const int32_t *sel, const float *p,
                                 const arl_moe_params *w, const arl_moe_cfg *c, int64_t T,
                                 const uint16_t *const *banks, float *save);
    int64_t (*moe_experts_bwd_ws_floats)(int64_t T, int64_t k, int64_t E, int64_t dz, int64_t f);
    void (*moe_experts_bwd)(float *dz, float *dp, const arl_moe_params *gw, const float *du,
                            const int32_t *sel, const float *p, const arl_moe_params *w,
                            const uint16_t *const *banks, const arl_moe_cfg *c, int64_t T,
                            const float *save, float *ws);
    /* dtable (V, d) row tokens[t] += dx row t, tokens in order t = 0..T-1 (policy/
     * model_backward.c); ws: embed_bwd_ws_floats(T, V) floats */
    int64_t (*embed_bwd_ws_floats)(int64_t T, int64_t V);
    void (*embed_bwd)(float *dtable, const float *dx, const int32_t *tokens, int64_t T, int64_t d,
                      int64_t V, float *ws);
    /* AdamW (policy/optimizer.c): out[i] = sum of g^2 over floats [ranges[2i], ranges[2i+1])
     * of g, left to right in double (out, ranges: device memory); and the element update of
     * floats [0, n) of one tensor (kernels/cuda/ops.h arl_cuda_adamw_step; hp a host struct),
     * with pb (n) the bf16 copy of p rewritten from the new p in the same pass (NULL: none;
     * always NULL on "cpu", which keeps no bf16 weights) */
    void (*grad_sumsq)(double *out, const float *g, const int64_t *ranges, int64_t n);
    void (*adamw_update)(float *p, uint16_t *pb, float *m, float *v, const float *g, int64_t n,
                         int32_t apply_decay, const arl_cuda_adamw_hp *hp);

    /* ---- training from decode states (segment-wise, policy/model_device_backward.h); NULL
     * where the device lacks them (the state forward then answers ARL_ERR_UNSUPPORTED) ---- */
    /* policy/kda_layer_backward.c: the gradient of the incoming conv tails from dz (T, C):
     * dtail (N, C, W-1) +=, the pre-activations recomputed from x (T, C), w (C, W) and tails
     * (N, C, W-1; NULL = zeros) */
    void (*kda_conv_tail_bwd)(float *dtail, const float *dz, const float *x, const float *w,
                              const float *tails, const int32_t *cu, int32_t N, int64_t T,
                              int64_t C, int64_t W);
    /* the gradient of each document's final tail dtail_out (N, C, W-1) routed to its inputs:
     * dpre (T, C) +=, and for documents shorter than W-1 partly to dtail_in (N, C, W-1) += (or
     * dropped when NULL) */
    void (*kda_conv_tail_out_bwd)(float *dpre, float *dtail_in, const float *dtail_out,
                                  const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W);
    /* The absorbed MLA core of policy/mla_layer_backward.c (dense), one document per call:
     * Tq queries at positions p0.. over its rows (p0 + Tq, rkv + r) (the prefix, then its own).
     * Forward: ohat (Tq, Hm, rkv) and lse (Tq, Hm) OVERWRITTEN from qhat (Tq, Hm, rkv) and q_pe
     * (Tq, Hm, r) (token rows of stride Hm*rkv / Hm*r).  Backward for dohat (Tq, Hm, rkv):
     * dqhat, dq_pe +=, dnew (Tq, rkv + r) += (the document's own rows), dprefix (p0, rkv + r)
     * += (or NULL: not wanted).  ws: mla_abs_train_ws_floats(S, Hm, rkv, r) floats for
     * documents of at most S rows. */
    int64_t (*mla_abs_train_ws_floats)(int64_t S, int64_t Hm, int64_t rkv, int64_t r);
    void (*mla_abs_fwd_save)(float *ohat, float *lse, const float *qhat, const float *q_pe,
                             const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                             int64_t r, float scale, float *ws);
    void (*mla_abs_bwd)(float *dqhat, float *dq_pe, float *dnew, float *dprefix, const float *dohat,
                        const float *ohat, const float *lse, const float *qhat, const float *q_pe,
                        const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                        int64_t r, float scale, float *ws);

    /* ---- block-sparse MLA inference (spec 4.5; policy/mla.h); NULL where the device lacks
     * them (a model with mla_sparse_topk > 0 then answers ARL_ERR_UNSUPPORTED at init) ---- */
    /* arl_mla_chunk_means_update: the summaries means (ceil(to / n_c), R) of cache (to, R)
     * brought from `from` rows to `to` rows (complete chunks: fp32 means; the open chunk: the
     * running sum) */
    void (*mla_chunk_means_update)(float *means, const float *cache, int64_t from, int64_t to,
                                   int64_t R, int64_t n_c);
    /* arl_mla_sparse_attn (no selection mask): Tq queries at positions pos0.. of one sequence
     * over its cache rows (pos0 + Tq, rkv + r) and their summaries means (as
     * mla_chunk_means_update leaves them for those rows); k_c >= 1.  qhat, ohat (Tq, Hm, rkv),
     * q_pe (Tq, Hm, r).  ws: mla_sparse_ws_floats(Tq_max >= Tq, Hm, S >= pos0 + Tq, ...)
     * floats. */
    int64_t (*mla_sparse_ws_floats)(int64_t Tq_max, int64_t Hm, int64_t S, int64_t rkv, int64_t r,
                                    int64_t n_c, int64_t k_c);
    void (*mla_sparse_attn)(float *ohat, const float *qhat, const float *q_pe, const float *cache,
                            const float *means, int64_t pos0, int64_t Tq, int64_t Hm, int64_t rkv,
                            int64_t r, float scale, int64_t n_c, int64_t k_c, float *ws);

    /* ---- block-sparse MLA training (spec 4.5 with 4.3): policy/mla_layer_backward.h
     * arl_mla_sparse_doc_*, one document per call; NULL where the device lacks them (training a
     * block-sparse model then answers ARL_ERR_UNSUPPORTED at init) ----
     * Forward: the chunk summaries of the rows (p0 + Tq, rkv + r) from row 0, then Tq queries at
     * positions p0..: ohat (Tq, Hm, rkv), lse (Tq, Hm) and list (Tq, Hm, k_c) int32 (the earlier
     * chunks each (query, head) selected, increasing, -1 after the last) OVERWRITTEN.  Backward
     * over that selection: as mla_abs_bwd.  ws: mla_sparse_train_ws_floats(Tq_max >= Tq,
     * S >= p0 + Tq, ...) floats. */
    int64_t (*mla_sparse_train_ws_floats)(int64_t Tq_max, int64_t S, int64_t Hm, int64_t rkv,
                                          int64_t r, int64_t n_c, int64_t k_c);
    void (*mla_sparse_fwd_save)(float *ohat, float *lse, int32_t *list, const float *qhat,
                                const float *q_pe, const float *rows, int64_t p0, int64_t Tq,
                                int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                                int64_t k_c, float *ws);
    void (*mla_sparse_bwd)(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                           const float *dohat, const float *ohat, const float *lse,
                           const int32_t *list, const float *qhat, const float *q_pe,
                           const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                           int64_t r, float scale, int64_t n_c, int64_t k_c, float *ws);
} arl_dev_ops;

/* The host ops (static table, never NULL). */
const arl_dev_ops *arl_dev_ops_cpu(void);
/* The CUDA ops (static table; usable only with a current CUDA context, see
 * arl_dev_ops_get).  Present in every build. */
const arl_dev_ops *arl_dev_ops_cuda(void);

/* The ops of device "cpu" or "cuda" (the value of a --device option) in *out, with the
 * errors of arl_k_backend_get (kernels/backend.h): ARL_ERR_UNSUPPORTED in a build without
 * CUDA, ARL_ERR_DEVICE without a visible device, ARL_ERR_ARG for another name.  For "cuda",
 * when the calling thread has no current context: cuda_arena_bytes > 0 opens one on device 0
 * with an arena of that size (see arl_model_dev_bytes) and makes it current; 0 uses the
 * process default context (ARL_CUDA_DEFAULT_ARENA).  Either lives until process exit. */
arl_status arl_dev_ops_get(const char *device, size_t cuda_arena_bytes, const arl_dev_ops **out);

/* Device-model settings beyond arl_model_opts. */
typedef struct arl_model_dev_opts {
    int32_t n_slots;       /* decode-state slots of max_context rows (0: none) */
    int32_t bf16_weights;  /* 1 ("cuda" only): keep bf16 copies of the weights and run every
                              weight GEMM on them (bf16 x bf16, fp32 accumulation), except the
                              router's (fp32 always, spec 1.4) and the absorbed MLA products;
                              the fp32 weights stay (masters).  The training forward reads
                              them under the bf16 math mode alone (whose GEMMs would round the
                              masters to bf16 anyway), so that it rounds as the other forwards
                              do; its backward reads the masters; AdamW refreshes them */
    int32_t decode_graphs; /* 1 ("cuda" only): arl_model_dev_decode_step replays a CUDA graph
                              of the whole step, captured once per set of slots (again when
                              the set changes); same kernels, so the same bits as without */
    int32_t train_checkpoint; /* 1: the training step (policy/model_device_backward.h) keeps
                                 only each layer's input and recomputes the layer in the
                                 backward (activation checkpointing: one layer's saved
                                 activations instead of L; the same bits as without) */
    int64_t slot_rows;        /* 0: each slot owns max_context latent rows per MLA layer (n_slots x
                                 max_context in all); > 0: that many rows per MLA layer, shared:
                                 a slot's rows are a range made and grown as its sequence grows
                                 and freed by arl_model_dev_slot_reset (arl_model_dev_slot_fit;
                                 policy/model_device_rows.c), so memory follows the documents'
                                 lengths, not the longest possible; not with decode_graphs */
} arl_model_dev_opts;

typedef struct arl_model_dev {
    const arl_dev_ops *ops;
    const arl_k_backend *kb;
    const arl_model_config *cfg; /* borrowed: must outlive the model */
    arl_model_dims dm;
    arl_model_opts opts;
    arl_model_dev_opts dopts;
    arl_kda_layer_cfg kda;
    arl_mla_layer_cfg mla;
    arl_moe_cfg moe;
    arl_glu_act act;
    float eps;
    int64_t weight_floats; /* floats of the parameter arena (policy/params.h layout) */
    int32_t n_blocks;      /* AttnRes block entries ceil(L / B); 0 without AttnRes */
    int32_t *moe_index;    /* (L) host: index among MoE layers or -1; owned */
    int32_t *no_targets;   /* (max_tokens) host, all -1; owned */
    int32_t *routes_host;  /* (max_tokens, k) host: one MoE layer's routes (expert loads); owned */
    arl_model_params w;    /* parameter view whose pointers are DEVICE memory (the weights) */
    void *arena;           /* the one device block, owned */
    size_t arena_token;
    int64_t arena_floats;
    /* named device buffers inside the arena (T = opts.max_tokens, N = opts.max_docs) */
    float *weights;   /* (inv.arena_floats) the parameters, layout of policy/params.h */
    uint16_t *wb16;   /* (inv.arena_floats) their bf16 copies, same layout, or NULL */
    uint16_t *xb16;   /* (T, xb16_in) bf16 input of one weight GEMM, or NULL */
    uint16_t *xin16;  /* (T, d) bf16 layer input several weight GEMMs read, or NULL */
    int64_t xb16_in;  /* the widest weight GEMM input */
    float *res;       /* (n_blocks + 1, T, d) AttnRes entries, then p (or h: slot 0) */
    float *hbuf;      /* (T, d) */
    float *xbuf;      /* (T, d) */
    float *ybuf;      /* (T, d) */
    float *logits;    /* (T, V) */
    float *logprobs;  /* (T) */
    float *entropy;   /* (T) */
    int32_t *tokens;  /* (T) */
    int32_t *targets; /* (T) */
    int32_t *cu;      /* (N + 1) */
    int32_t *routes;  /* (n_moe, T, k) routes of the last forward */
    int32_t *forced;  /* (n_moe, T, k) forced routes of the batch */
    /* decode state (n_slots = 0: none) */
    int32_t n_slots;
    int64_t max_context;   /* MLA cache rows per slot */
    float *st_kda;         /* (n_kda, n_slots, H*dk*dv + 3*P*(W-1)) S then conv tails */
    float *st_lat;         /* (n_mla, lat_rows, rkv + r) latent rows; slot i's are rows
                              slot_row0[i] .. + slot_cap[i] of each MLA layer */
    int64_t lat_rows;      /* n_slots x max_context, or dopts.slot_rows */
    int64_t *slot_row0;    /* (n_slots) host: first row of each slot's range; owned */
    int64_t *slot_cap;     /* (n_slots) host: rows of each slot's range (slot_rows > 0: 0 until
                              the slot holds rows); owned */
    int32_t *slot_order;   /* (n_slots) host: the ranges' scratch ordering (a slot outgrowing
                              its range, policy/model_device_rows.c); owned */
    float *lat_twin;       /* NULL, or an array of st_lat's layout moved with it when slot
                              ranges move (the training step's state gradients) */
    int64_t *st_pos;       /* (n_slots) host: tokens in each slot; owned */
    int64_t last_T;        /* rows of the last completed forward in xbuf (0: none) */
    float *kda_S;          /* (N, H, dk, dv) gathered states */
    float *kda_tails;      /* (N, 3, P, W-1) gathered conv tails */
    float *kda_tin;        /* (N, P, W-1) the tails of one projection */
    float *lat;            /* (T, rkv + r) new latent rows (slots or block-sparse) */
    float *qhat, *ohat;    /* (T, Hm, rkv) absorbed MLA (slots or block-sparse) */
    float *mla_ws;         /* absorbed attention work buffer */
    /* block-sparse MLA (mla.sparse_topk > 0; else NULL) */
    int64_t means_rows;    /* ceil(max_context / n_c): summary rows per slot and MLA layer */
    float *st_means;       /* (n_mla, n_slots, means_rows, rkv + r) chunk summaries of st_lat */
    float *fmeans;         /* (T / n_c + N + 1, rkv + r) summaries of a forward's fresh docs */
    float *sparse_ws;      /* mla_sparse_ws_floats(16, Hm, mla.max_rows, ...) floats */
    float **caches;        /* (N) host: cache of each document in one MLA layer; owned */
    int32_t *cu_host1;     /* (N + 1) host: boundaries of a one-token-per-document step; owned */
    int64_t *pos_dev;      /* (N) device: positions of a graph step's documents */
    int64_t *pos_host;     /* (N) host staging of pos_dev; owned */
    void *graph;           /* the captured decode step, or NULL; owned */
    int32_t graph_n;       /* its sequence count */
    int32_t *graph_slots;  /* (N) host: its slots; owned */
    int64_t graph_replays; /* decode steps served by a replay (statistics) */
    float *scratch;        /* sublayer work buffer */
    int64_t scratch_floats;
} arl_model_dev;

/* Model over cfg (borrowed) on the device of ops, with the weights of host_w (fp32 host
 * parameters of the same config) uploaded once.  opts NULL = the defaults of
 * arl_model_opts_default; kda_chunk <= 64 on "cuda"; mla_sparse_topk > 0 (with
 * mla_sparse_chunk >= 1) selects block-sparse MLA (spec 4.5) as in policy/model.h.
 * dopts NULL = no decode slots, fp32 weights (arl_model_dev_opts); slots hold
 * opts->max_context rows (0: max_position_embeddings), every slot empty (position 0).
 * ARL_ERR_NOMEM names the bytes (for "cuda": the context's arena is too small; open the
 * context with a larger arena_bytes). */
arl_status arl_model_dev_init(arl_model_dev *m, const arl_dev_ops *ops, const arl_model_config *cfg,
                              const arl_model_params *host_w, const arl_model_opts *opts,
                              const arl_model_dev_opts *dopts);
void arl_model_dev_free(arl_model_dev *m); /* NULL is a no-op */

/* Bytes of device memory arl_model_dev_init takes (weights, activations, work buffers). */
int64_t arl_model_dev_bytes(const arl_model_config *cfg, const arl_model_opts *opts,
                            const arl_dev_ops *ops, const arl_model_dev_opts *dopts);

/* The settings of arl_model_dev_init without allocating or uploading anything: m then serves
 * only to size memory (arl_model_dev_train_bytes, policy/model_device_backward.h) before a
 * device context is opened; nothing to free.  Errors as arl_model_dev_init's checks. */
arl_status arl_model_dev_plan(arl_model_dev *m, const arl_dev_ops *ops, const arl_model_config *cfg,
                              const arl_model_opts *opts, const arl_model_dev_opts *dopts);

/* Upload new host weights (after an optimizer step on the host), same config. */
arl_status arl_model_dev_set_params(arl_model_dev *m, const arl_model_params *host_w);
/* The bf16 copies of a MoE layer's expert banks w1, w3, w2 (bf16_weights) in out, returned;
 * NULL when the model keeps no copies: the banks argument of the experts' ops. */
const uint16_t *const *arl_model_dev_expert_banks(const arl_model_dev *m, const arl_moe_params *p,
                                                  const uint16_t *out[3]);
/* The weight GEMMs of the forwards: y (T, out; leading dim ldy) = x (T, in) W^T + beta y for a
 * weight W (out, in) of the model (arl_model_dev_lin: ldy = out, beta = 0, kb->linear_fwd's
 * call; arl_model_dev_gemm_w: kb->gemm's).  On W's bf16 copy (ops linear_bf16) when the model
 * keeps copies - in the training forward (train) under the bf16 math mode alone (ops
 * math_bf16) - else on the fp32 weight through the kernel table.  The bf16 GEMM's input: xr, x
 * already rounded by arl_model_dev_round (a layer input several GEMMs read, rounded once), or
 * NULL: x rounded into m->xb16 first. */
void arl_model_dev_lin(const arl_model_dev *m, int train, float *y, const float *x,
                       const uint16_t *xr, const float *W, int64_t T, int64_t in, int64_t out);
void arl_model_dev_gemm_w(const arl_model_dev *m, int train, float *y, int64_t ldy, float beta,
                          const float *x, const uint16_t *xr, const float *W, int64_t T, int64_t in,
                          int64_t out);
/* x (T, d) rounded to bf16 into m->xin16 when the weight GEMMs read the copies (the rule
 * above), returned for their xr; else NULL, and nothing runs.  Valid until the next call. */
const uint16_t *arl_model_dev_round(const arl_model_dev *m, int train, const float *x, int64_t T);

/* Forward over fresh documents, arl_model_forward's contract (policy/model.h) with HOST
 * outputs: logits, logprobs, entropy, routes, router_scores (one download per MoE layer) and
 * expert_load are copied back; acts must be NULL (ARL_ERR_UNSUPPORTED).  Errors before
 * anything runs: ARL_ERR_RANGE for T or N above the limits, ids outside [0, V), bad forced
 * routes; ARL_ERR_ARG for bad cu.  Device failures: ARL_ERR_DEVICE. */
arl_status arl_model_dev_forward(arl_model_dev *m, const arl_batch *b, const arl_forward_out *out);
/* The batch check of the device paths (forward and training step): token count and documents
 * within the model's max_tokens / max_docs, cu boundaries, token and target ids, forced routes
 * in range and distinct per token; image rows are ARL_ERR_UNSUPPORTED here.  Messages start with
 * "<what> (<device> device)". */
arl_status arl_model_dev_batch_check(const arl_model_dev *m, const arl_batch *b, const char *what);

/* The rows of the <|media_pad|> placeholders of batch b in p ((b->T, d) DEVICE), one transfer
 * per run of consecutive placeholders: stage NULL uploads b->media's rows into them (the
 * forwards); else their values are added to dmedia ((n_media, d) HOST, unless NULL) through
 * stage (HOST, >= b->T * d floats) and the rows zeroed (the backward). */
arl_status arl_model_dev_media_rows(arl_model_dev *m, float *p, const arl_batch *b, float *dmedia,
                                    float *stage);

/* Empty slot `slot` (position 0, zero state) for a new sequence.  ARL_ERR_RANGE for a slot
 * outside [0, n_slots). */
arl_status arl_model_dev_slot_reset(arl_model_dev *m, int32_t slot);
/* Tokens held by a slot. */
int64_t arl_model_dev_slot_pos(const arl_model_dev *m, int32_t slot);

/* arl_model_forward_state on the device: document i continues slot slots[i] (distinct, host
 * array) and the slot's state advances.  out as arl_model_dev_forward.  ARL_ERR_STATE for a
 * repeated or unknown slot, ARL_ERR_RANGE past max_context. */
arl_status arl_model_dev_forward_state(arl_model_dev *m, const int32_t *slots, const arl_batch *b,
                                       const arl_forward_out *out);
/* arl_model_prefill / arl_model_decode_step on the device (media: (n_media, d) HOST rows for
 * the <|media_pad|> placeholders, or NULL; a count mismatch is ARL_ERR_ARG before anything
 * runs; routes of the decode step (n_moe, n, k) or NULL). */
arl_status arl_model_dev_prefill(arl_model_dev *m, int32_t slot, const int32_t *tokens, int64_t n,
                                 const float *media, int64_t n_media, float *logits,
                                 float *last_logits);
arl_status arl_model_dev_decode_step(arl_model_dev *m, const int32_t *slots, int32_t n,
                                     const int32_t *tokens, float *logits, int32_t *routes);

/* Logits (n, V, HOST) of rows rows[0..n) (host array, each in [0, last_T)) of the final-norm
 * rows the last forward left on the device (last_T: that forward's token count, 0 after a
 * failed one: ARL_ERR_RANGE), without the (T, V) logits of every row: how a rollout engine gets
 * the next-token logits of the documents of a chunked prefill.  Valid until the next forward
 * of m. */
arl_status arl_model_dev_rows_logits(arl_model_dev *m, int32_t n, const int64_t *rows,
                                     float *logits);

/* Slot `slot`'s latent rows of MLA layer j inside base (st_lat, or lat_twin: arrays of st_lat's
 * layout).  Valid until the next arl_model_dev_slot_fit (a forward, an upload). */
float *arl_model_dev_slot_rows(const arl_model_dev *m, float *base, int64_t j, int32_t slot);

/* Makes slot `slot`'s range hold at least `rows` latent rows per MLA layer (the forwards and
 * uploads call it).  With dopts.slot_rows > 0 the range is made or grown (with headroom, up to
 * max_context), moving this slot's rows, or the others' to close the gaps between them, with
 * their contents (and lat_twin's) kept; otherwise each slot owns max_context rows.
 * ARL_ERR_RANGE when rows > max_context or the shared rows cannot hold it (the message says
 * how many are in use): nothing is lost then, every slot keeps its rows. */
arl_status arl_model_dev_slot_fit(arl_model_dev *m, int32_t slot, int64_t rows);

/* Slot `slot` of the device -> host slot `hslot` (active) of st: the KDA states and conv tails,
 * the MLA latent rows [row0, position) (rows below row0 are left as the host has them: a
 * caller that keeps the host copy current passes where its last download ended), and the
 * position; the host slot's block-sparse chunk summaries are marked stale.  st must be made
 * for the same model config (ARL_ERR_SHAPE).  Latent rows are reserved in st as needed. */
arl_status arl_model_dev_slot_download(arl_model_dev *m, int32_t slot, arl_decode_state *st,
                                       int32_t hslot, int64_t row0);
/* Host slot `hslot` (active) of st -> device slot `slot`: states, conv tails, every latent row
 * and the position (an imported export, a resumed or forked sequence); with block-sparse MLA
 * the slot's chunk summaries are recomputed on the device from the uploaded rows (the host's
 * are not read).  ARL_ERR_RANGE when the host position exceeds the device's max_context. */
arl_status arl_model_dev_slot_upload(arl_model_dev *m, int32_t slot, const arl_decode_state *st,
                                     int32_t hslot);

#endif
