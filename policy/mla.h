/* policy/mla.h: gated NoPE Multi-head Latent Attention on the CPU (fp32), spec/policy.md
 * section 4: the attention core after the projections.
 *
 * What this is: (1) the expanded ("naive") attention of 4.1 over a packed batch with causal
 * and document masks, forward and backward (4.3); (2) the absorbed form of 4.2 over the
 * latent cache rows [c; k_pe] - the decode path, also usable for prefill - with the optional
 * block-sparse chunk selection of 4.5, and the training backward of the block-sparse core over
 * the selected rows; (3) the two per-head maps between them (q_hat = W_UK^T q_nope and
 * o = W_UV o_hat).
 * What this is not: the projections, their RMSNorms and the output gate (kernels/gemm.h,
 * kernels/norm.h, kernels/activation.h compose them; see tests/golden/test_mla.c), the cache
 * storage or its export (section 4.4).
 *
 * Symbols: T tokens, N documents, Hm heads, n = qk_nope_head_dim, r = qk_rope_head_dim,
 * vm = v_head_dim, rkv = kv_lora_rank; scale = (n + r)^-1/2 (no rotation: NoPE).
 * Layouts (row-major, token-major, head-major):
 *   q_nope, k_nope (T, Hm, n)   q_pe (T, Hm, r)   k_pe (T, r) shared by the heads
 *   v, o (T, Hm, vm)            lse (T, Hm) log-sum-exp of each softmax row (for backward)
 *   qhat, ohat (T, Hm, rkv)     kv_b (Hm*(n+vm), rkv) = kv_b_proj.weight: head h's rows
 *                               [h(n+vm), h(n+vm)+n) are W_UK^h, the next vm rows W_UV^h
 *   cache (S, rkv + r)          latent rows [c_s; k_pe,s] of one sequence, s = 0..S-1
 *   cu (N + 1) int32            document boundaries; NULL means one document [0, T)
 * Softmax in fp32 with the row maximum subtracted.  Forward outputs are overwritten;
 * backward gradients are ACCUMULATED (+=).  Work buffers come from the caller (sizes from
 * the *_ws_floats functions) and nothing here allocates.  Every pointer is borrowed for the
 * duration of the call only; outputs must not alias inputs.  Heads run in parallel on the
 * kernels' pool; results are bit-identical for any thread count (GEMMs: for a fixed count).
 */
#ifndef ARL_POLICY_MLA_H
#define ARL_POLICY_MLA_H

#include <stdint.h>

/* ---- expanded attention (4.1, 4.3) ---- */

/* Floats of work buffer for arl_mla_attn_fwd / _bwd over T tokens and Hm heads. */
int64_t arl_mla_attn_ws_floats(int64_t T, int64_t Hm, int64_t r);

/* o (T, Hm, vm) and lse (T, Hm) (lse may be NULL when no backward follows): for every head,
 * query t attends to the keys s <= t of its own document. */
void arl_mla_attn_fwd(float *o, float *lse, const float *q_nope, const float *q_pe,
                      const float *k_nope, const float *k_pe, const float *v, const int32_t *cu,
                      int32_t N, int64_t T, int64_t Hm, int64_t n, int64_t r, int64_t vm,
                      float scale, float *ws);

/* Spec 4.3 with the forward's o and lse: dq_nope, dk_nope (T, Hm, n), dq_pe (T, Hm, r),
 * dk_pe (T, r) (summed over heads), dv (T, Hm, vm), all +=; d_o (T, Hm, vm). */
void arl_mla_attn_bwd(float *dq_nope, float *dq_pe, float *dk_nope, float *dk_pe, float *dv,
                      const float *d_o, const float *o, const float *lse, const float *q_nope,
                      const float *q_pe, const float *k_nope, const float *k_pe, const float *v,
                      const int32_t *cu, int32_t N, int64_t T, int64_t Hm, int64_t n, int64_t r,
                      int64_t vm, float scale, float *ws);

/* ---- absorbed form (4.2) and block-sparse selection (4.5) ---- */

/* qhat (T, Hm, rkv) = W_UK^h^T q_nope[t, h] for every token and head. */
void arl_mla_absorb_q(float *qhat, const float *q_nope, const float *kv_b, int64_t T, int64_t Hm,
                      int64_t n, int64_t vm, int64_t rkv);

/* o (T, Hm, vm) = W_UV^h ohat[t, h]. */
void arl_mla_expand_o(float *o, const float *ohat, const float *kv_b, int64_t T, int64_t Hm,
                      int64_t n, int64_t vm, int64_t rkv);

/* Floats of work buffer for arl_mla_absorbed_attn with at most S cache rows (any k_c). */
int64_t arl_mla_absorbed_ws_floats(int64_t S, int64_t rkv, int64_t r, int64_t n_c);

/* Absorbed attention of Tq query tokens of one sequence at positions pos0 .. pos0+Tq-1
 * (positions since the sequence's last fresh start); cache holds rows 0 .. pos0+Tq-1 (the
 * queries' own rows included).  Query i attends to rows s <= pos0 + i:
 *   ohat[i, h] = sum_s softmax_s(scale ([qhat; q_pe] . cache_s)) c_s.
 * Block-sparse (k_c > 0, chunk length n_c >= 1): only rows of the chunks in
 * Sel = {k_c complete earlier chunks with the largest [qhat; q_pe] . mean(chunk rows), ties to
 * the lower chunk} U {the query's own chunk}; k_c = 0 is dense (n_c then unused, may be 0).
 * sel (Tq, Hm, sel_stride) uint8 receives 1 for each chunk in Sel, 0 otherwise (chunks up to
 * the query's own), unless NULL; sel_stride >= number of chunks covering pos0+Tq rows.
 * qhat (Tq, Hm, rkv), q_pe (Tq, Hm, r), ohat (Tq, Hm, rkv).  Forward only: selection carries
 * no gradient; training uses arl_mla_sparse_attn_save / _bwd below. */
void arl_mla_absorbed_attn(float *ohat, uint8_t *sel, int64_t sel_stride, const float *qhat,
                           const float *q_pe, const float *cache, int64_t pos0, int64_t Tq,
                           int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                           int64_t k_c, float *ws);

/* ---- block-sparse selection that skips unselected chunks (4.5) ----
 * The chunk summaries m_j live beside the cache and grow with it, so that a query costs
 * O(J_t (rkv + r)) for its selection plus O((k_c + 1) n_c (2 rkv + r)) for the attention,
 * whatever the context length: unselected chunks are never read.  (arl_mla_absorbed_attn with
 * k_c > 0 is the same core, the summaries recomputed from the cache on every call.)  The means
 * are fp32 sums in row order divided by n_c, sigma an fp32 product; the attention over the
 * selected rows equals the masked softmax of 4.5 to rounding.  When every chunk up to the
 * query's own is selected (k_c >= J_t) the dense code of arl_mla_absorbed_attn runs, so that
 * case equals dense attention bit for bit. */

/* Bring the summaries of a cache up to `to` rows, from `from` rows already summarised
 * (0 <= from <= to): means (ceil(to / n_c), R) row j = the fp32 mean of chunk j's rows once
 * the chunk is complete ((j + 1) n_c <= to), the running sum of its rows so far while it is
 * open.  Rows are added in order, each complete chunk divided by n_c once, so the result does
 * not depend on how the rows arrived.  cache (to, R), R = rkv + r. */
void arl_mla_chunk_means_update(float *means, const float *cache, int64_t from, int64_t to,
                                int64_t R, int64_t n_c);

/* Floats of work buffer for arl_mla_sparse_attn over at most Tq_max queries of Hm heads and at
 * most S cache rows. */
int64_t arl_mla_sparse_ws_floats(int64_t Tq_max, int64_t Hm, int64_t S, int64_t rkv, int64_t r,
                                 int64_t n_c, int64_t k_c);

/* arl_mla_absorbed_attn with k_c >= 1 and the summaries given: means (>= J rows, R) as
 * arl_mla_chunk_means_update leaves them for the cache's rows 0 .. pos0+Tq-1 (only the complete
 * chunks j < J_t of each query are read).  Queries are processed in blocks of one chunk: the
 * query's own chunk (rows J_t n_c .. t) as one product for the block's (query, head) pairs,
 * each selected earlier chunk as one product per pair.  Tq <= the Tq_max of the work buffer;
 * other arguments as arl_mla_absorbed_attn. */
void arl_mla_sparse_attn(float *ohat, uint8_t *sel, int64_t sel_stride, const float *qhat,
                         const float *q_pe, const float *cache, const float *means, int64_t pos0,
                         int64_t Tq, int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                         int64_t k_c, float *ws);

/* arl_mla_sparse_attn that also keeps what its backward needs (training, spec 4.5 with 4.3):
 * lse (Tq, Hm) the log-sum-exp of each pair's softmax over its selected rows, unless NULL;
 * list (Tq, Hm, k_c) int32 the earlier chunks the pair selected, increasing, -1 after the last
 * (all chunks 0 .. J_t - 1 when J_t <= k_c), unless NULL.  ohat and sel exactly as
 * arl_mla_sparse_attn (which is this call with lse = list = NULL). */
void arl_mla_sparse_attn_save(float *ohat, uint8_t *sel, int64_t sel_stride, float *lse,
                              int32_t *list, const float *qhat, const float *q_pe,
                              const float *cache, const float *means, int64_t pos0, int64_t Tq,
                              int64_t Hm, int64_t rkv, int64_t r, float scale, int64_t n_c,
                              int64_t k_c, float *ws);

/* Floats of work buffer for arl_mla_sparse_attn_bwd over at most Tq_max queries, S rows. */
int64_t arl_mla_sparse_bwd_ws_floats(int64_t Tq_max, int64_t Hm, int64_t S, int64_t rkv,
                                     int64_t r, int64_t n_c, int64_t k_c);

/* Backward of arl_mla_sparse_attn_save for its queries (same pos0, Tq, cache) with the lse and
 * list it returned and its ohat; the selection is taken as given (no gradient).  Over each
 * pair's selected rows (its own chunk's rows up to the query, and the listed chunks):
 *   P = exp(Z - lse), dP = dohat C^T, dZ = P (dP - dohat . ohat),
 *   dqhat += scale dZ C, dq_pe += scale dZ Kpe,
 *   drow += P^T dohat (its c part) + scale dZ^T [qhat; q_pe].
 * Row gradients: cache row s < split goes to dpre (s, R) (dropped when dpre is NULL), s >= split
 * to dnew (s - split, R); split <= pos0 (the first row of the current segment).  All +=.
 * Queries are processed in blocks inside one chunk; each selected chunk's products run once
 * for all the block's pairs that chose it (rows read once per block, as the forward); sums run in a fixed order (entries of a chunk in pair
 * order, chunks in order), so the result does not depend on the thread count beyond the GEMMs'.
 * Cost per query O((k_c + 1) n_c (2 rkv + r)).  dohat, ohat, qhat (Tq, Hm, rkv), q_pe, dq_pe
 * (Tq, Hm, r); Tq <= the work buffer's Tq_max. */
void arl_mla_sparse_attn_bwd(float *dqhat, float *dq_pe, float *dpre, float *dnew, int64_t split,
                             const float *dohat, const float *ohat, const float *lse,
                             const int32_t *list, const float *qhat, const float *q_pe,
                             const float *cache, int64_t pos0, int64_t Tq, int64_t Hm,
                             int64_t rkv, int64_t r, float scale, int64_t n_c, int64_t k_c,
                             float *ws);

#endif
