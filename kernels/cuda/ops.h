/* kernels/cuda/ops.h: the model-level device ops of the CUDA backend - the stages of KDA, MLA,
 * LatentMoE, the router, AttnRes and AdamW that policy/ computes on the CPU.
 *
 * Each op mirrors the CPU function named in its comment (same argument order, same shapes and
 * layouts, same "forward overwrites, backward accumulates (+=)" rule); the contract is in that
 * CPU header (policy/kda.h, policy/mla.h, policy/attnres.h, policy/router.h, policy/moe.h,
 * policy/optimizer.c).  It is not: parameter structs, model bookkeeping or configs.
 *
 * Common rules (see kernels/cuda/cuda.h for context, errors and the dtype policy):
 *   - every tensor pointer is DEVICE memory of the current context (arl_cuda_current());
 *     the exceptions are named (host arrays of device pointers, host hyper-parameters);
 *   - cu (N + 1) int32 document boundaries live in device memory (NULL: one document [0, T));
 *   - ops run asynchronously on the context's stream; arl_cuda_sync reports failures;
 *   - fp32 storage unless the name ends in _bf16 (bf16 = uint16_t bit patterns);
 *   - work buffers come from the caller (sizes from the *_ws_* functions), typically from the
 *     arena (arl_cuda_alloc); nothing here allocates;
 *   - results are deterministic run to run (no atomics on floating-point sums).
 * Symbols: T tokens, N documents, H heads, dk/dv KDA head dims, C chunk length or channels
 * (as stated), W conv taps, E experts, k top-k, d width.
 */
#ifndef ARL_KERNELS_CUDA_OPS_H
#define ARL_KERNELS_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/status.h"

/* ======================= short causal conv + SiLU (policy/kda.h arl_kda_conv_*) ========= */

/* z (T, C) = SiLU(conv(x)), y (T, C) pre-activation unless NULL; x (T, C), w (C, W),
 * tails (N, C, W-1) or NULL. */
void arl_cuda_conv_fwd(float *z, float *y, const float *x, const float *w, const float *tails,
                       const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W);
/* dx (T, C) +=, dw (C, W) += (dw may be NULL). */
void arl_cuda_conv_bwd(float *dx, float *dw, const float *dz, const float *x, const float *w,
                       const float *tails, const int32_t *cu, int32_t N, int64_t T, int64_t C,
                       int64_t W);

/* ======================= KDA core (policy/kda.h) ========================================= */

/* The largest head dims and chunk length of the CUDA KDA kernels. */
#define ARL_CUDA_KDA_MAX_DK 128
#define ARL_CUDA_KDA_MAX_DV 128
#define ARL_CUDA_KDA_MAX_C 64

/* arl_kda_recurrent_fwd on the device: one warp per (state column, head, document), token by
 * token in the exact order of spec 3.3.  Decode of one token is T = 1, N = 1.  S (N, H, dk,
 * dv) in/out; chunk_states (n_chunks, H, dk, dv) or NULL.  dk <= 256. */
void arl_cuda_kda_recurrent_fwd(float *o, float *S, float *chunk_states, const float *q,
                                const float *k, const float *v, const float *g, const float *beta,
                                const int32_t *cu, int32_t N, int64_t T, int64_t H, int64_t dk,
                                int64_t dv, float scale, int64_t C);

/* arl_kda_chunk_fwd on the device (spec 3.5, difference form for every decay, so valid for both
 * gates), in two kernels: (1) per (chunk, head), all chunks in parallel: G = cumsum g, A_kk, the
 * UT transform T = (I + A_kk)^-1 by forward substitution, W, U, A_qk and the decay factors;
 * (2) per (document, head, 32-column slice of the state), chunks in order: V~ = U - W S,
 * O = (Gamma Q) S + A_qk V~, S <- exp(G_n) S + K~^T V~.  The products of (2) and W, U of (1)
 * run on tensor cores as 3xTF32 (each fp32 operand split into two tf32 parts, three products:
 * fp32-class results); the state stays fp32 in shared memory.  dk <= 128, dv <= 128, C <= 64;
 * at most T/C + N chunks fit the context's index table (about 131K chunks: 1M tokens in
 * chunks of 32 for up to 65K documents).  ws: arl_cuda_kda_chunk_ws_floats(T, N, H, dk, dv, C)
 * floats of device memory, or -1 when the chunks do not fit (the caller refuses the sizes). */
int64_t arl_cuda_kda_chunk_ws_floats(int64_t T, int32_t N, int64_t H, int64_t dk, int64_t dv,
                                     int64_t C);
void arl_cuda_kda_chunk_fwd(float *o, float *S, float *chunk_states, const float *q, const float *k,
                            const float *v, const float *g, const float *beta, const int32_t *cu,
                            int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale,
                            int64_t C, float *ws);
/* The pair products A_kk, A_qk of the chunkwise forward's kernel 1 (and of the chunkwise
 * backward, which runs it too): FACTORED (the default, the CPU reference's form: per 16-row
 * sub-chunk one exp per (row, channel), products of factors; a sub-chunk whose exponents
 * exceed 80 falls back to the difference form) or DIFFERENCE (one exp per (pair, channel)).
 * Equal to fp32 rounding.  arl_cuda_kda_prep_form sets the current context's and returns the
 * previous one (the benchmark times both, the parity tests check both). */
#define ARL_CUDA_KDA_PREP_FACTORED 0
#define ARL_CUDA_KDA_PREP_DIFFERENCE 1
int32_t arl_cuda_kda_prep_form(int32_t form);
/* Kernel (1) of arl_cuda_kda_chunk_fwd alone (the chunk table and every chunk's factors into
 * ws), for the benchmark's split of the forward's time (bench/gpu/bench_gpu.c); the forward
 * and the chunkwise backward run it themselves. */
void arl_cuda_kda_chunk_prep(float *ws, const float *q, const float *k, const float *v,
                             const float *g, const float *beta, const int32_t *cu, int32_t N,
                             int64_t T, int64_t H, int64_t dk, int64_t dv, float scale, int64_t C);

/* arl_kda_recurrent_bwd on the device (spec 3.7): per (document, head) one block keeps S and
 * dS (dk x dv fp32, shared memory), runs the chunks in reverse, recomputes each chunk's
 * per-token states from chunk_states into ws, and walks the tokens backward.  dk, dv <= 128.
 * ws: arl_cuda_kda_bwd_ws_floats(N, H, dk, dv, C) floats. */
int64_t arl_cuda_kda_bwd_ws_floats(int32_t N, int64_t H, int64_t dk, int64_t dv, int64_t C);
void arl_cuda_kda_recurrent_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta,
                                float *dS0, const float *d_o, const float *dS_T, const float *q,
                                const float *k, const float *v, const float *g, const float *beta,
                                const float *chunk_states, const int32_t *cu, int32_t N, int64_t T,
                                int64_t H, int64_t dk, int64_t dv, float scale, int64_t C,
                                float *ws);

/* arl_kda_chunk_bwd on the device (spec 3.8), from the chunk_states of a forward with the
 * same C: (1) the forward's per-chunk prep again (all chunks in parallel), (2) a reverse pass
 * per (32-column slice, head, document) carrying dS through the chunks (dV~ and each chunk's
 * outgoing-state gradient), (3) per (chunk, head), all chunks in parallel, everything inside
 * the chunk (the A_qk, UT-transform and A_kk terms, reverse cumsum of dG).  The products of
 * (2) and those of (3) with a dk- or dv-long reduction run as 3xTF32 as in the forward.  Same
 * contract and limits as arl_cuda_kda_chunk_fwd.  ws: arl_cuda_kda_chunk_bwd_ws_floats floats. */
int64_t arl_cuda_kda_chunk_bwd_ws_floats(int64_t T, int32_t N, int64_t H, int64_t dk, int64_t dv,
                                         int64_t C);
void arl_cuda_kda_chunk_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, float *dS0,
                            const float *d_o, const float *dS_T, const float *q, const float *k,
                            const float *v, const float *g, const float *beta,
                            const float *chunk_states, const int32_t *cu, int32_t N, int64_t T,
                            int64_t H, int64_t dk, int64_t dv, float scale, int64_t C, float *ws);

/* ======================= MLA attention (policy/mla.h) ===================================== */

/* arl_mla_attn_fwd on the device: flash-style (online softmax, one pass over the keys, no
 * (T, T) scores), causal within each document.  lse (T, Hm) may be NULL.  n + r <= 1024,
 * vm <= 512.  fp32 CUDA cores; under ARL_CUDA_MATH_BF16, when n + r <= 192, vm <= 128 and
 * the widths are even and ws is given, tensor cores (bf16 copies of the keys and values made
 * once per call, fp32 accumulation and softmax). */
void arl_cuda_mla_attn_fwd(float *o, float *lse, const float *q_nope, const float *q_pe,
                           const float *k_nope, const float *k_pe, const float *v,
                           const int32_t *cu, int32_t N, int64_t T, int64_t Hm, int64_t n,
                           int64_t r, int64_t vm, float scale, float *ws);
/* The tensor-core forward's warp tile: ROWS32 (the default: 4 warps of 32 queries, each K
 * and V fragment read from shared memory serving 32 queries, a softmax step every 32 keys) or
 * ROWS16 (8 warps of 16, the query fragments held in registers, a step every 64 keys).  The
 * same products; the steps' rescaling differs by fp32 rounding.  arl_cuda_mla_fwd_rows sets
 * the current context's and returns the previous one (the benchmark times both, the parity
 * tests check both). */
#define ARL_CUDA_MLA_FWD_ROWS32 0
#define ARL_CUDA_MLA_FWD_ROWS16 1
int32_t arl_cuda_mla_fwd_rows(int32_t rows);
/* the forward's workspace: the tensor-core path's bf16 copies of the keys and values (0 when
 * the widths do not fit that path); ws NULL leaves the call to the fp32 kernel */
int64_t arl_cuda_mla_attn_fwd_ws_floats(int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm);

/* arl_mla_attn_bwd on the device (spec 4.3) with the forward's o and lse: one warp per
 * (key, head) for dk/dv, one per (query, head) for dq, fp32; under ARL_CUDA_MATH_BF16, when
 * n + r <= 192, vm <= 128 and the widths are even, on tensor cores instead (bf16 operands,
 * fp32 accumulation and softmax; 64 keys per block for dk/dv, 64 queries for dq, no atomics).
 * dk_pe summed over heads in a fixed order: deterministic either way.  n + r <= 256,
 * vm <= 256.
 * ws: arl_cuda_mla_attn_bwd_ws_floats(T, Hm, n, r, vm) floats (with the tensor-core path's
 * bf16 copies of q, k, v and dO when the widths fit it). */
int64_t arl_cuda_mla_attn_bwd_ws_floats(int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm);
void arl_cuda_mla_attn_bwd(float *dq_nope, float *dq_pe, float *dk_nope, float *dk_pe, float *dv,
                           const float *d_o, const float *o, const float *lse, const float *q_nope,
                           const float *q_pe, const float *k_nope, const float *k_pe,
                           const float *v, const int32_t *cu, int32_t N, int64_t T, int64_t Hm,
                           int64_t n, int64_t r, int64_t vm, float scale, float *ws);

/* arl_mla_absorbed_attn on the device, dense (the block-sparse selection of 4.5 is
 * arl_cuda_mla_sparse_attn below): query i attends to cache rows s <= pos0 + i.
 * rkv + r <= 1024, rkv <= 512.  A single query (Tq 1, a decode step) splits its keys in runs
 * of ARL_CUDA_MLA_SPLIT_KEYS (or what arl_cuda_mla_split_keys set) over blocks of their own,
 * their partial softmaxes in ws merged in split order (decoding one token at position 1M ran
 * ceil(Hm / 4) blocks, each walking 1M keys).  ws: arl_cuda_mla_absorbed_ws_floats(rows, Hm,
 * rkv) floats for caches of at most rows rows (0: too short to split), or NULL (never split). */
#define ARL_CUDA_MLA_SPLIT_KEYS 2048
int64_t arl_cuda_mla_absorbed_ws_floats(int64_t max_rows, int64_t Hm, int64_t rkv);
void arl_cuda_mla_absorbed_attn(float *ohat, const float *qhat, const float *q_pe,
                                const float *cache, int64_t pos0, int64_t Tq, int64_t Hm,
                                int64_t rkv, int64_t r, float scale, float *ws);
/* The keys of a split from now on (a multiple of 32; 0: ARL_CUDA_MLA_SPLIT_KEYS); returns the
 * setting it replaces.  Work spaces are sized by the setting: change it only while none sized
 * under another is in use (the tests split short caches). */
int32_t arl_cuda_mla_split_keys(int32_t keys);

/* arl_cuda_mla_absorbed_attn with pos0 = *pos_dev read from device memory when the kernel
 * runs (CUDA-graph replays of decode steps, where the position advances between replays); the
 * splits are fixed for a cache of max_rows rows. */
void arl_cuda_mla_absorbed_attn_dpos(float *ohat, const float *qhat, const float *q_pe,
                                     const float *cache, const int64_t *pos_dev, int64_t Tq,
                                     int64_t Hm, int64_t rkv, int64_t r, float scale,
                                     int64_t max_rows, float *ws);

/* ======================= AttnRes mix (policy/attnres.h) =================================== */

#define ARL_CUDA_ATTNRES_MAX 64

/* src: HOST array of N device pointers, each (T, d) (copied into the launch). */
void arl_cuda_attnres_mix_fwd(float *out, float *a, const float *const *src, int32_t N, int64_t T,
                              int64_t d, const float *w_norm, const float *w_proj, float eps);
/* dsrc: HOST array of N device pointers (entries may be NULL).  ws: 2*N*T floats. */
void arl_cuda_attnres_mix_bwd(float *const *dsrc, float *dw_norm, float *dw_proj, const float *dh,
                              const float *const *src, int32_t N, int64_t T, int64_t d,
                              const float *w_norm, const float *w_proj, float eps, float *ws);

/* ======================= router (policy/router.h) ========================================= */

/* From logits l (T, E) (= x W_r^T, a table GEMM): s (T, E) = sigmoid(l), sel (T, k) the k best
 * of s + bias (ties to the lower expert), or a copy of forced (T, k) when not NULL, and
 * p (T, k) = rho s_sel / (sum s_sel + 1e-20).  A forced route outside [0, E) or repeated in a
 * token makes arl_cuda_sync return ARL_ERR_RANGE naming the token (that token's outputs are
 * then undefined).  k <= 64. */
void arl_cuda_router_fwd(int32_t *sel, float *p, float *s, const float *logits, const float *bias,
                         const int32_t *forced, int64_t T, int64_t E, int64_t k, float rho);
/* dl (T, E) = the logit gradient of arl_router_bwd (overwritten, zero off the selection);
 * then dW_r += dl^T x and dx += dl W_r are table GEMMs (linear_bwd_w, linear_bwd_x). */
void arl_cuda_router_bwd(float *dl, const float *dp, const float *s, const int32_t *sel, int64_t T,
                         int64_t E, int64_t k, float rho);

/* ======================= Quantile Balancing histogram (policy/qb.h, spec 9.3) ============== */

/* cnt (E, Nb) int64 += the bin counts of r_ij = alpha_i - s_ij, alpha_i the (k+1)-th largest
 * of s_i + b_old: arl_qb_hist_count on the device (one thread per token, integer atomics, so
 * the counts are exact and deterministic).  s (m, E), b_old (E).  k + 1 <= 64.  The all-reduce
 * of cnt and arl_qb_hist_solve stay with the caller (E x Nb integers). */
void arl_cuda_qb_hist_count(int64_t *cnt, const float *s, const float *b_old, int64_t m, int64_t E,
                            int64_t k, float lo, float w, int64_t Nb);

/* ======================= MoE execution (spec 7.2) ========================================= */

/* The routing plan: where each (token, slot) goes in the expert-sorted row order.  Rows of
 * expert e are [offsets[e], offsets[e+1]); inside an expert, rows follow the (token, slot)
 * order, so the plan is deterministic.  All arrays are device int32 inside one block of
 * arl_cuda_moe_plan_ints(T, k, E) ints the caller provides. */
typedef struct arl_cuda_moe_plan {
    int32_t *counts;   /* (E) tokens per expert */
    int32_t *offsets;  /* (E + 1) exclusive prefix sum of counts */
    int32_t *tiles;    /* (E + 1) prefix sum of ceil(counts / 64) (grouped GEMM row tiles) */
    int32_t *row_src;  /* (T*k) token of each sorted row */
    int32_t *slot_row; /* (T*k) sorted row of each (token, slot) */
    int64_t T, k, E;
} arl_cuda_moe_plan;

int64_t arl_cuda_moe_plan_ints(int64_t T, int64_t k, int64_t E);
/* Points the plan into buf (device, arl_cuda_moe_plan_ints ints) and fills it from sel (T, k). */
void arl_cuda_moe_plan_build(arl_cuda_moe_plan *plan, int32_t *buf, const int32_t *sel, int64_t T,
                             int64_t k, int64_t E);

/* xp (T*k, d) = x rows in sorted order (fp32, or bf16 for the _bf16 grouped GEMM). */
void arl_cuda_moe_gather(float *xp, const float *x, const arl_cuda_moe_plan *plan, int64_t d);
void arl_cuda_moe_gather_bf16(uint16_t *xp, const float *x, const arl_cuda_moe_plan *plan,
                              int64_t d);
/* dx (T, d) += sum over slots j of dxp[slot_row[t, j]] (j in order). */
void arl_cuda_moe_gather_bwd(float *dx, const float *dxp, const arl_cuda_moe_plan *plan, int64_t d);
/* y (T, d) = sum_j p[t, j] yp[slot_row[t, j]] (j in order, fp32). */
void arl_cuda_moe_combine(float *y, const float *yp, const float *p, const arl_cuda_moe_plan *plan,
                          int64_t d);
/* dyp (T*k, d) = p dy (overwritten); dp (T, k) += dy . yp. */
void arl_cuda_moe_combine_bwd(float *dyp, float *dp, const float *dy, const float *yp,
                              const float *p, const arl_cuda_moe_plan *plan, int64_t d);
/* The same with dyp rounded to bf16 (nearest even): the experts' bf16 operands. */
void arl_cuda_moe_combine_bwd_bf16(uint16_t *dyp, float *dp, const float *dy, const float *yp,
                                   const float *p, const arl_cuda_moe_plan *plan, int64_t d);
/* The experts' GLU (kernels/kernels.h swiglu / situ_glu: situ != 0 SiTU-GLU with caps b1, b2)
 * with bf16 outputs, the operands of the grouped GEMMs after it: h (T, f) = act(g, u) rounded
 * to bf16 (nearest even); dg, du (T, ld) = the gradients (overwritten, not added: the fp32
 * backward's on zeroed buffers) rounded.  fp32 arithmetic as the fp32 ops'. */
void arl_cuda_glu_fwd_bf16(uint16_t *h, const float *g, const float *u, int64_t T, int64_t f,
                           int64_t ld, int32_t situ, float b1, float b2);
void arl_cuda_glu_bwd_bf16(uint16_t *dg, uint16_t *du, const float *dh, const float *g,
                           const float *u, int64_t T, int64_t f, int64_t ld, int32_t situ, float b1,
                           float b2);

/* Grouped GEMM, all experts in one launch: for each expert e and its rows R_e,
 *   Y[R_e] (n_e, N) = X[R_e] (n_e, K) op(W_e) + beta * Y[R_e]
 * W (E, N, K) with trans_w = 1 (nn.Linear weights: Y = X W_e^T), or W (E, K, N) with
 * trans_w = 0 (Y = X W_e, e.g. the input gradient dX = dY W_e).  beta is 0 or 1.  Under
 * ARL_CUDA_MATH_BF16 (N, K multiples of 16; X, W 16-byte aligned) the operands are rounded to
 * bf16 as they are staged and multiplied on tensor cores (fp32 accumulation), as the bf16 math
 * mode does for GEMMs. */
void arl_cuda_grouped_gemm(float *Y, const float *X, const float *W, int32_t trans_w,
                           const arl_cuda_moe_plan *plan, int64_t N, int64_t K, float beta);
/* The same with bf16 X and W on tensor cores (fp32 accumulation, fp32 Y).  N, K multiples
 * of 16; with trans_w = 0, X and W 16-byte aligned and Y 8-byte (the tiles of the bf16 math
 * mode's trans_w = 0, on operands already bf16: the same sums, bit for bit, as
 * arl_cuda_grouped_gemm under ARL_CUDA_MATH_BF16 on the same values). */
void arl_cuda_grouped_gemm_bf16(float *Y, const uint16_t *X, const uint16_t *W, int32_t trans_w,
                                const arl_cuda_moe_plan *plan, int64_t N, int64_t K, float beta);
/* The experts' gate and up products with their GLU, one launch: G, U (T*k, f) = X W1_e^T,
 * X W3_e^T (W1, W3 (E, f, K) bf16, X (T*k, K) bf16; the sums of arl_cuda_grouped_gemm_bf16
 * with trans_w = 1 on the mma.sync tile, bit for bit) and H (T*k, f) = their GLU rounded to
 * bf16 (arl_cuda_glu_fwd_bf16 of G and U, bit for bit) without G and U going through memory;
 * G and U may be NULL (an inference forward needs H only).  f, K multiples of 16.  The mma.sync
 * tile whatever arl_cuda_moe_tn_form says. */
void arl_cuda_grouped_glu_bf16(float *G, float *U, uint16_t *H, const uint16_t *X,
                               const uint16_t *W1, const uint16_t *W3,
                               const arl_cuda_moe_plan *plan, int64_t f, int64_t K, int32_t situ,
                               float b1, float b2);
/* The GLU output's gradient and the GLU backward in one launch: dh (T*k, f) = dY W2_e (dY
 * (T*k, K) bf16, W2 (E, K, f) bf16: arl_cuda_grouped_gemm_bf16 with trans_w = 0, the same
 * sums) never stored; dg, du (T*k, f) = the GLU's gradients in g and u (fp32, (T*k, f)) for
 * dh, rounded to bf16 (arl_cuda_glu_bwd_bf16 of dh, bit for bit).  f, K multiples of 16; dY,
 * W2 16-byte aligned, g, u 8-byte, dg, du 4-byte. */
void arl_cuda_grouped_glu_bwd_bf16(uint16_t *dg, uint16_t *du, const uint16_t *dY,
                                   const uint16_t *W2, const float *g, const float *u,
                                   const arl_cuda_moe_plan *plan, int64_t f, int64_t K,
                                   int32_t situ, float b1, float b2);
/* Which kernel runs arl_cuda_grouped_gemm_bf16 with trans_w = 1 on the current context:
 * ARL_CUDA_MOE_TN_MMA (the default: 64 x 256 tiles of mma.sync products, any sm_80+ GPU) or
 * ARL_CUDA_MOE_TN_WGMMA (the same tiles as two warpgroups of Hopper wgmma products; only where
 * arl_cuda_moe_wgmma_available() is 1: an sm_90 GPU, the kernel being built for sm_90a).  Both
 * accumulate each output over K in fp32; the products' internal order differs.  Returns the
 * setting it replaces (bench_gpu times both, test_moe_wide checks both). */
#define ARL_CUDA_MOE_TN_MMA 0
#define ARL_CUDA_MOE_TN_WGMMA 1
int32_t arl_cuda_moe_tn_form(int32_t form);
int32_t arl_cuda_moe_wgmma_available(void);
/* Weight gradient: dW_e (N, K) += dY[R_e]^T X[R_e] for every expert (experts without rows
 * unchanged); dY (T*k, N), X (T*k, K) fp32.  Under ARL_CUDA_MATH_BF16 (N, K multiples of 16;
 * dY, X 16-byte aligned) dY and X are rounded to bf16 and multiplied on tensor cores (fp32
 * accumulation). */
void arl_cuda_grouped_gemm_wgrad(float *dW, const float *dY, const float *X,
                                 const arl_cuda_moe_plan *plan, int64_t N, int64_t K);
/* The same with bf16 dY and X (N, K multiples of 16; dY, X 16-byte aligned, dW 8-byte): the
 * sums of arl_cuda_grouped_gemm_wgrad under ARL_CUDA_MATH_BF16 on the same values, bit for
 * bit. */
void arl_cuda_grouped_gemm_wgrad_bf16(float *dW, const uint16_t *dY, const uint16_t *X,
                                      const arl_cuda_moe_plan *plan, int64_t N, int64_t K);

/* bf16 x bf16 -> fp32 dense GEMM through cuBLAS (the benchmark's denominator and the path of
 * bf16 weights): row-major C (M, N) = alpha op(A) op(B) + beta C, layout of kernels/gemm.h. */
arl_status arl_cuda_gemm_bf16(int32_t ta, int32_t tb, int64_t M, int64_t N, int64_t K, float alpha,
                              const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
                              float beta, float *C, int64_t ldc);

/* ======================= AdamW (policy/optimizer.c step_range) ============================ */

/* Host-computed per-step constants, exactly as the CPU step computes them. */
typedef struct arl_cuda_adamw_hp {
    float coef;  /* clip coefficient */
    float decay; /* 1 - lr * weight_decay */
    float beta1, beta2, omb1, omb2;
    float step_size;    /* lr / (1 - beta1^t) */
    float inv_sqrt_bc2; /* 1 / sqrt(1 - beta2^t) */
    float eps;
} arl_cuda_adamw_hp;

/* For i < n: g' = g coef; p *= decay (apply_decay only); m = b1 m + (1-b1) g';
 * v = b2 v + (1-b2) g'^2; p -= step_size m / (sqrt(v) inv_sqrt_bc2 + eps); and with pb non-NULL
 * pb[i] = the new p[i] rounded to bf16 (nearest even, the bits arl_cuda_f32_to_bf16 gives):
 * the bf16 weight copy refreshed in the same pass.  One call per contiguous range with the
 * same decay rule.  hp is a host struct (copied). */
void arl_cuda_adamw_step(float *p, uint16_t *pb, float *m, float *v, const float *g, int64_t n,
                         int32_t apply_decay, const arl_cuda_adamw_hp *hp);

/* ======================= whole-model glue (kernels/cuda/model.cu) ======================== */

/* dst rows (rows, cols) with leading dimension ldd = src rows with leading dimension lds
 * (head splits of the MLA projections; policy/model_device.c). */
void arl_cuda_copy_rows(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t rows,
                        int64_t cols);
/* x (T, d) = table rows of tokens (T) (device int32); an id outside [0, V) gives zeros and
 * makes arl_cuda_sync return ARL_ERR_RANGE (callers check ids on the host first). */
void arl_cuda_embed(float *x, const float *table, const int32_t *tokens, int64_t T, int64_t d,
                    int64_t V);
/* arl_kda_gate_k3_fwd / arl_kda_gate_softplus_fwd (policy/kda.h) on the device, fp32. */
void arl_cuda_kda_gate_k3_fwd(float *g, const float *f, const float *A_log, const float *dt_bias,
                              int64_t T, int64_t H, int64_t dk, float g_min);
void arl_cuda_kda_gate_softplus_fwd(float *g, const float *f, const float *A_log,
                                    const float *dt_bias, int64_t T, int64_t H, int64_t dk);
/* cache rows [*pos_dev, *pos_dev + n) (R wide) = rows (n, R); the position is read from
 * device memory when the kernel runs (graph replays). */
void arl_cuda_cache_append_dpos(float *cache, const int64_t *pos_dev, const float *rows, int64_t n,
                                int64_t R);
/* arl_kda_conv_tail (policy/kda.h) on the device; tail_out must not alias tail_in. */
void arl_cuda_kda_conv_tail(float *tail_out, const float *x, int64_t n, const float *tail_in,
                            int64_t C, int64_t W);
/* arl_kda_onorm_fwd (policy/kda.h) on the device: row statistics in double, rstd (n) or NULL. */
void arl_cuda_kda_onorm_fwd(float *ob, float *rstd, const float *o, const float *gam,
                            const float *w, int64_t n, int64_t dv, float eps);

/* ======================= training glue (kernels/cuda/train.cu) =========================== */

/* arl_kda_gate_k3_bwd / arl_kda_gate_softplus_bwd (policy/kda.h) on the device: df (T, P) +=,
 * dA_log (H) +=, ddt_bias (P) += (each may be NULL); per-channel sums over the tokens in
 * ascending order in double, dA_log summed over a head's channels in order.  dk <= 256. */
void arl_cuda_kda_gate_k3_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg,
                              const float *f, const float *A_log, const float *dt_bias, int64_t T,
                              int64_t H, int64_t dk, float g_min);
void arl_cuda_kda_gate_softplus_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg,
                                    const float *f, const float *A_log, const float *dt_bias,
                                    int64_t T, int64_t H, int64_t dk);
/* arl_kda_onorm_bwd (policy/kda.h) on the device: d_o, dgam (n, dv) +=, dw (dv) += (may be
 * NULL; each column summed over 32 row groups, added in a fixed order). */
void arl_cuda_kda_onorm_bwd(float *d_o, float *dgam, float *dw, const float *dob, const float *o,
                            const float *gam, const float *w, const float *rstd, int64_t n,
                            int64_t dv);
/* dtable (V, d) row tokens[t] += dx (T, d) row t, t ascending (tokens: device int32, ids
 * checked by the caller; one outside [0, V) is skipped and reported at the next sync).  ws:
 * arl_cuda_embed_bwd_ws_ints(T, V) device ints. */
int64_t arl_cuda_embed_bwd_ws_ints(int64_t T, int64_t V);
void arl_cuda_embed_bwd(float *dtable, const float *dx, const int32_t *tokens, int64_t T, int64_t d,
                        int64_t V, int32_t *ws);
/* out[c] (double) = sum of g[i]^2 over i in [ranges[2c], ranges[2c+1]) for c < n (ranges:
 * device int64): the per-chunk sums of the AdamW gradient norm (policy/optimizer.c). */
void arl_cuda_grad_sumsq(double *out, const float *g, const int64_t *ranges, int64_t n);

/* ======================= segment-wise training (kernels/cuda/segment.cu) ================= */

/* The contracts of policy/model_device.h arl_dev_ops kda_conv_tail_bwd, kda_conv_tail_out_bwd
 * (cu: device int32 (N + 1) or NULL for one document) and mla_abs_train_ws_floats,
 * mla_abs_fwd_save, mla_abs_bwd (one document per call, rows: its (p0 + Tq, rkv + r) latent
 * rows; ws: arl_cuda_mla_abs_train_ws_floats(S >= p0 + Tq, ...) floats).  fp32, every output
 * written by one thread, sums in a fixed order: deterministic run to run. */
void arl_cuda_kda_conv_tail_bwd(float *dtail, const float *dz, const float *x, const float *w,
                                const float *tails, const int32_t *cu, int32_t N, int64_t T,
                                int64_t C, int64_t W);
void arl_cuda_kda_conv_tail_out_bwd(float *dpre, float *dtail_in, const float *dtail_out,
                                    const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W);
int64_t arl_cuda_mla_abs_train_ws_floats(int64_t S, int64_t Hm, int64_t rkv, int64_t r);
void arl_cuda_mla_abs_fwd_save(float *ohat, float *lse, const float *qhat, const float *q_pe,
                               const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                               int64_t r, float scale, float *ws);
void arl_cuda_mla_abs_bwd(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                          const float *dohat, const float *ohat, const float *lse,
                          const float *qhat, const float *q_pe, const float *rows, int64_t p0,
                          int64_t Tq, int64_t Hm, int64_t rkv, int64_t r, float scale, float *ws);

/* ======================= block-sparse MLA inference (kernels/cuda/sparse.cu) ============== */

/* arl_mla_chunk_means_update (policy/mla.h) on the device: means (ceil(to / n_c), R) of cache
 * (to, R) brought from `from` to `to` rows; one thread per (chunk, column) adds the chunk's new
 * rows in row order to its running sum (0 at a chunk start) and divides a chunk completed here
 * by n_c once: the CPU's operations in the CPU's order, so the same bits. */
void arl_cuda_mla_chunk_means_update(float *means, const float *cache, int64_t from, int64_t to,
                                     int64_t R, int64_t n_c);

/* arl_mla_sparse_attn (policy/mla.h, spec 4.5) on the device, without the selection mask:
 * query i (position t = pos0 + i, own chunk J = t / n_c) and head h attend to the rows s <= t
 * of the chunks Sel = {the k_c complete chunks j < J with the largest [qhat; q_pe] . means_j,
 * ties to the lower j} U {J}; every chunk when J <= k_c (then exactly the dense rows 0..t).
 * One warp per (query, head): sigma and the selection (the CPU's insertion rule) into ws, then
 * one online-softmax pass over the selected rows in increasing order.  fp32, fixed order.
 * rkv <= 512, rkv + r <= 1024.  ws: arl_cuda_mla_sparse_ws_floats(Tq_max >= Tq, Hm,
 * S >= pos0 + Tq, ...) floats. */
int64_t arl_cuda_mla_sparse_ws_floats(int64_t Tq_max, int64_t Hm, int64_t S, int64_t rkv,
                                      int64_t r, int64_t n_c, int64_t k_c);
void arl_cuda_mla_sparse_attn(float *ohat, const float *qhat, const float *q_pe,
                              const float *cache, const float *means, int64_t pos0, int64_t Tq,
                              int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                              int64_t k_c, float *ws);
/* The decode-step forms (CUDA graphs): one row / query at position *pos_dev, read when the
 * kernels run (the same kernels, so the same bits); ws as above with S rows. */
void arl_cuda_mla_chunk_means_update_dpos(float *means, const float *cache, const int64_t *pos_dev,
                                          int64_t R, int64_t n_c);
void arl_cuda_mla_sparse_attn_dpos(float *ohat, const float *qhat, const float *q_pe,
                                   const float *cache, const float *means, const int64_t *pos_dev,
                                   int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                                   int64_t k_c, int64_t S, float *ws);

/* Block-sparse MLA training (policy/mla_layer_backward.h arl_mla_sparse_doc_*, the contracts of
 * policy/model_device.h mla_sparse_train_ws_floats / mla_sparse_fwd_save / mla_sparse_bwd), one
 * document per call.  Forward: the summaries of rows 0 .. p0+Tq-1 (as above), then the kernel
 * of arl_cuda_mla_sparse_attn in launches of at most 16384 (query, head) pairs, also writing
 * lse and the selected list.  Backward over the list, in blocks of queries: per (query, head)
 * P and dZ over its (k_c + 1) n_c entries into ws, dqhat and dq_pe += (sums over the entries in
 * order); then the block's entries sorted by chunk, stably (kernels/cuda/sort.cu, a window
 * of at most ARL_SPT_WINDOW chunks a sort; was a thread a chunk scanning all the block's
 * entries), and per (row, column) the sum over its chunk's entries in pair order, added to dnew
 * or dprefix.  fp32, no atomics: deterministic run to run. */
int64_t arl_cuda_mla_sparse_train_ws_floats(int64_t Tq_max, int64_t S, int64_t Hm, int64_t rkv,
                                            int64_t r, int64_t n_c, int64_t k_c);
void arl_cuda_mla_sparse_fwd_save(float *ohat, float *lse, int32_t *list, const float *qhat,
                                  const float *q_pe, const float *rows, int64_t p0, int64_t Tq,
                                  int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                                  int64_t k_c, float *ws);
void arl_cuda_mla_sparse_bwd(float *dqhat, float *dq_pe, float *dnew, float *dprefix,
                             const float *dohat, const float *ohat, const float *lse,
                             const int32_t *list, const float *qhat, const float *q_pe,
                             const float *rows, int64_t p0, int64_t Tq, int64_t Hm, int64_t rkv,
                             int64_t r, float scale, int64_t n_c, int64_t k_c, float *ws);
/* The chunks a window of the backward's sort from now on (1 .. ARL_SPT_WINDOW; 0: that
 * default); returns the setting it replaces (the tests' many windows over few chunks). */
int32_t arl_cuda_mla_sparse_bwd_window(int32_t chunks);

#ifdef __cplusplus
}
#endif

#endif
