/* learner/ep.h: expert parallelism - the token dispatch and combine of a MoE layer whose E
 * experts are sharded over the R ranks of an expert-parallel communicator (learner/dist.h,
 * arl_dist.ep), spec/policy.md 7.2.
 *
 * What this is: a plan built from each rank's routes (T tokens, k experts per token) that
 * packs one width-wide row per (token, slot) for the rank owning the slot's expert, exchanges
 * the rows with one all-to-all, groups the rows each rank receives by local expert, sends the
 * expert results back along the same paths, and combines them per token with the router
 * weights in slot order.  width is the latent width d_z of Stable LatentMoE: the all-to-all
 * carries z = W_down x forward and p_i du / dz backward, never full-width rows.
 * What this is not: the router, the expert math (a callback, or the caller's code between
 * arl_ep_dispatch and arl_ep_return), the latent norm and up-projection (they run on the
 * token's own rank), gradient reduction of expert weights (arl_dist.dp, learner/dist.h).
 *
 * Sharding: contiguous blocks; rank r owns experts [lo_r, lo_{r+1}) with
 * lo_r = r*(E/R) + min(r, E%R) (the first E%R ranks own one expert more).  A rank may own zero
 * experts (E < R), receive zero rows, or hold zero tokens (T = 0): all are valid.
 *
 * Order and equality with the unsharded layer.  Each local expert receives its rows ordered
 * by source rank, then by the source's token index.  If the ranks' tokens are consecutive
 * blocks of one global batch in rank order (rank 0 holds global tokens [0, T_0), rank 1 the
 * next T_1, ...), this is exactly the row set and row order of the unsharded grouping of
 * policy/moe.c (all tokens routed to e, in global token order).  Rows travel bit-unchanged and
 * arl_ep_combine sums in slot order j = 0..k-1 in fp32 starting from 0, as policy/moe.c does.
 * Hence, given the same latent inputs and an expert function that computes the same bits for
 * the same input block, the per-slot outputs and the combined u are bit-identical to the
 * unsharded computation (tests/dist/test_dist.c, cases ep and moe); so are the expert weight
 * gradients computed on the grouped rows (same rows, same order, same GEMM shapes).  When the
 * ranks' token blocks are not consecutive in rank order the same holds up to the row order inside
 * an expert's block (for fp32 GEMMs: agreement to GEMM rounding, kernels/gemm.h).
 *
 * Collectives: arl_ep_plan_build, arl_ep_dispatch, arl_ep_return and arl_ep_apply are called
 * by every rank of the communicator, in the same sequence.  Invalid routes on one rank make
 * every rank's arl_ep_plan_build fail (ARL_ERR_RANGE there, ARL_ERR_PROTOCOL elsewhere) without
 * hanging.  Any other error of a collective is fatal for the group (learner/dist.h).
 *
 * Memory: the plan owns its index arrays and staging buffers; they grow to the high-water
 * mark of T*k and of the received rows and are then reused (no allocation in steady state).
 *
 * Symbols: T tokens of this rank, k experts per token, E experts, R ranks, n_recv rows this
 * rank's experts process, El experts owned by this rank.
 */
#ifndef ARL_LEARNER_EP_H
#define ARL_LEARNER_EP_H

#include <stdint.h>

#include "core/status.h"
#include "learner/dist.h"

typedef struct arl_ep_plan arl_ep_plan;

/* First expert of rank r for E experts over R ranks (r = R gives E). */
int64_t arl_ep_expert_lo(int64_t E, int32_t R, int32_t r);
/* The rank owning expert e. */
int32_t arl_ep_expert_owner(int64_t E, int32_t R, int64_t e);

/* A plan for E experts, k per token, rows of width floats, over comm (borrowed: it must
 * outlive the plan).  *out is freed with arl_ep_plan_free.  ARL_ERR_ARG (E < 1, k < 1, k > E,
 * width < 1), ARL_ERR_NOMEM.  Not collective. */
arl_status arl_ep_plan_init(arl_ep_plan **out, arl_dist_comm *comm, int64_t E, int64_t k,
                            int64_t width);
void arl_ep_plan_free(arl_ep_plan *p);

/* Collective.  Build the exchange for this rank's routes (T, k) (expert ids, e.g. the
 * router's selection or replayed routes); T may differ between ranks, and may be 0 (routes
 * may then be NULL).  Exchanges the per-expert row counts.  Valid until the next build;
 * dispatch/return may be called any number of times in between (forward and backward of one
 * layer share a plan). */
arl_status arl_ep_plan_build(arl_ep_plan *p, const int32_t *routes, int64_t T);

/* After a build: this rank's experts [*e_lo, *e_hi) and the rows they receive in total. */
void arl_ep_local_experts(const arl_ep_plan *p, int64_t *e_lo, int64_t *e_hi);
int64_t arl_ep_recv_rows(const arl_ep_plan *p);
/* Local expert e (e_lo <= e < e_hi): its rows in the grouped layout start at *row0, count *n. */
void arl_ep_expert_rows(const arl_ep_plan *p, int64_t e, int64_t *row0, int64_t *n);
/* (E) rows this rank sends to each expert in the last build (its tokens' expert load);
 * valid until the next build or free.  Sum over the group with arl_dist_allreduce_i64. */
const int64_t *arl_ep_send_load(const arl_ep_plan *p);

/* Collective.  Send rows to the experts.  src is (T, width), one row per token sent to each of
 * its k experts (forward: z), or with per_slot = 1, (T*k, width), row t*k+j for slot j of
 * token t (backward: p_j du).  grouped (n_recv, width) receives the rows grouped by local
 * expert (arl_ep_expert_rows). */
arl_status arl_ep_dispatch(arl_ep_plan *p, const float *src, int32_t per_slot, float *grouped);

/* Collective.  grouped (n_recv, width) results, row for row aligned with arl_ep_dispatch's
 * output, go back to their tokens: slots (T*k, width), row t*k+j = the result for slot j of
 * token t. */
arl_status arl_ep_return(arl_ep_plan *p, const float *grouped, float *slots);

/* Local.  u (T, width) = sum_{j=0..k-1} w[t, j] * slots[t*k + j] accumulated in fp32 in slot
 * order from 0 (as policy/moe.c); w (T, k) or NULL for plain sums (backward: dz). */
void arl_ep_combine(float *u, const float *slots, const float *w, int64_t T, int64_t k,
                    int64_t width);

/* Expert e (global id) on n >= 1 rows: out (n, width) from in (n, width).  Return ARL_OK or
 * a status with a message. */
typedef arl_status (*arl_ep_expert_fn)(void *user, int64_t e, int64_t n, const float *in,
                                       float *out);

/* Collective.  Forward of the routed experts: dispatch src (T, width) per token, run fn on
 * every local expert with rows (ascending e; experts without rows are skipped, spec 7.2),
 * return, and combine into u (T, width) with w (T, k).  slots (T*k, width) receives the
 * per-slot expert outputs E_j(z_t) (kept for the backward's dp) or may be NULL.  The grouped
 * buffers are the plan's.  An error of fn is returned after the exchange completes (so the
 * other ranks do not hang); u is then undefined. */
arl_status arl_ep_apply(arl_ep_plan *p, const float *src, const float *w, arl_ep_expert_fn fn,
                        void *user, float *u, float *slots);

#endif
