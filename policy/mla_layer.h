/* policy/mla_layer.h: one gated NoPE Multi-head Latent Attention mixer layer on the CPU, fp32
 * (spec/policy.md sections 4.1, 4.2, 4.5): query and latent projections with their RMSNorms,
 * the latent cache rows [c; k_pe], attention (expanded form for fresh documents, absorbed
 * form over a per-sequence cache), the sigmoid output gate and the output projection.
 *
 * What this is: the composition of policy/mla.h's cores with the GEMMs and norms of
 * kernels/.  What this is not: the attention cores (policy/mla.h), the storage and growth of
 * the caches or their export (policy/state.h), the residual stream (policy/model.c).
 *
 * Which form runs: the expanded form of 4.1 when every document starts fresh (no caches, or
 * all pos = 0) and block-sparse selection is off; otherwise the absorbed form of 4.2 (with
 * the selection of 4.5 when sparse_topk > 0), each query attending over its sequence's cache
 * rows up to and including its own.  Both compute 4.1 to rounding.  Block-sparse attention
 * reads only the selected chunks when chunk summaries are at hand (fresh documents, or caches
 * with summaries kept: arl_mla_layer_fwd_means).
 *
 * Symbols: T tokens, N documents, d width, Hm heads, rq/rkv latent ranks (rq 0 = direct
 * q_proj), n/r/vm head dims, R = rkv + r the width of a cache row.
 */
#ifndef ARL_POLICY_MLA_LAYER_H
#define ARL_POLICY_MLA_LAYER_H

#include <stdint.h>

#include "policy/params.h"

typedef struct arl_mla_layer_cfg {
    int64_t d, Hm, rq, rkv, n, r, vm;
    int64_t sparse_chunk; /* n_c of spec 4.5 */
    int64_t sparse_topk;  /* k_c; 0 = dense attention */
    int64_t max_rows;     /* most cache rows of one sequence (positions), sizes the work buffer */
} arl_mla_layer_cfg;

/* Floats of work buffer for arl_mla_layer_fwd over T tokens and N documents, with `lanes`
 * parallel lanes for the absorbed form (each has its own score buffer of max_rows floats). */
int64_t arl_mla_layer_ws_floats(const arl_mla_layer_cfg *c, int64_t T, int32_t N, int32_t lanes);

/* y (T, d) = MLA mixer of x (T, d) (x = RMSNorm_in(h)).  cu (N + 1) or NULL (one document).
 * caches: NULL (every document starts fresh, nothing is kept), or N pointers: caches[i] holds
 *   the pos[i] latent rows (R wide) of document i's sequence and has room for pos[i] + len_i
 *   rows; the document's new rows are written at rows pos[i] .. pos[i] + len_i - 1.
 *   pos[i] + len_i <= c->max_rows.
 * latent (T, R): receives the new rows of every token (also without caches) unless NULL.
 * lanes: the value given to arl_mla_layer_ws_floats.  ws: that many floats.  y must not alias x. */
void arl_mla_layer_fwd(float *y, float *latent, const float *x, const arl_mla_params *p,
                       const arl_mla_layer_cfg *c, const int32_t *cu, int32_t N, int64_t T,
                       float *const *caches, const int64_t *pos, int32_t lanes, float *ws);

/* The same, with the block-sparse chunk summaries of the caches kept by the caller (spec 4.5;
 * policy/mla.h arl_mla_chunk_means_update), so that a query reads only its selected chunks:
 * means (N) or NULL: means[i] is document i's summary buffer (room for
 * ceil((pos[i] + len_i) / sparse_chunk) rows of R) covering its cache's first *means_rows[i]
 * rows.  The call brings each up to pos[i] + len_i rows (and sets *means_rows[i] to that); a
 * count above pos[i] means the sequence restarted, and the summaries are redone from row 0.
 * Rows below *means_rows[i] must not have changed since they were summarised.  Used only
 * when c->sparse_topk > 0 (ignored otherwise); NULL with sparse_topk > 0 recomputes the
 * summaries of every cache for every block of queries, O(rows) each.  Without caches the
 * summaries of fresh documents are always computed once per call. */
void arl_mla_layer_fwd_means(float *y, float *latent, const float *x, const arl_mla_params *p,
                             const arl_mla_layer_cfg *c, const int32_t *cu, int32_t N, int64_t T,
                             float *const *caches, const int64_t *pos, float *const *means,
                             int64_t *const *means_rows, int32_t lanes, float *ws);

#endif
