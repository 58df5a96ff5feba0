/* policy/model.h: the policy network on the CPU, fp32 (spec/policy.md sections 2-8): forward
 * over a packed batch of documents with ragged lengths, returning logits and/or the
 * log-probabilities of given targets, the MoE routes and expert loads; and the same forward
 * continuing the sequences of a decode state (chunked prefill, one-token decode steps,
 * continuous batching).
 *
 * What this is: the whole-model composition - embedding (with image tokens in place of the
 * <|media_pad|> placeholders), the 3:1 KDA/MLA layer schedule, dense FFN / LatentMoE, Block
 * AttnRes bookkeeping (5.2) or the plain pre-norm residual, final norm, untied lm_head - over
 * one workspace arena sized at init from the config and the largest forward, so a forward
 * allocates nothing.  The components live in one file each: policy/kda_layer.c (KDA mixer),
 * policy/mla_layer.c (MLA mixer), policy/moe.c (FFNs), policy/attnres.h (the mix),
 * policy/vision.c (image front end), policy/state.c (decode state storage and export).
 * What this is not: the backward (next step; see arl_model_acts for what a forward saves for
 * it), sampling (policy/sample.h), checkpoint I/O (policy/checkpoint.h).
 *
 * Documents never attend across each other; at every document start the KDA state and conv
 * history reset, unless the document continues a decode-state slot (arl_model_forward_state).
 *
 * Threads: every op runs on the kernels' pool (kernels/threadpool.h); for a fixed thread
 * count results are bit-identical run to run.  A batch's rows may round differently from the
 * same sequence run alone (GEMM blocking depends on the row count), within the fp32 tolerance
 * of spec 16.4.  An arl_model is used by one thread at a time.
 *
 * Symbols: T tokens of a batch, N documents, d width, V vocabulary, L layers, E experts,
 * k experts per token, n_moe MoE layers.
 */
#ifndef ARL_POLICY_MODEL_H
#define ARL_POLICY_MODEL_H

#include <stdint.h>

#include "core/status.h"
#include "policy/config.h"
#include "policy/kda_layer.h"
#include "policy/mla_layer.h"
#include "policy/moe.h"
#include "policy/params.h"
#include "policy/state.h"

/* Settings of a model instance (not part of config.json). */
typedef struct arl_model_opts {
    int64_t max_tokens;       /* most tokens in one forward, all documents together (2048) */
    int32_t max_docs;         /* most documents in one forward (64) */
    int64_t max_context;      /* most positions of a sequence continued from a decode state
                                 (MLA cache rows); 0 = max_position_embeddings */
    int64_t kda_chunk;        /* C of the chunkwise KDA core, 1..256 (64) */
    int64_t mla_sparse_chunk; /* n_c of spec 4.5 (4096) */
    int64_t mla_sparse_topk;  /* k_c of spec 4.5; 0 = dense MLA (0) */
    const char *max_context_key; /* the setting max_context comes from, named by a workspace
                                    too large for memory (e.g. "context-tokens"); NULL: none */
} arl_model_opts;

void arl_model_opts_default(arl_model_opts *o);

typedef struct arl_model {
    const arl_model_config *cfg; /* borrowed: must outlive the model */
    const arl_model_params *w;   /* borrowed: must outlive the model; read only */
    arl_model_dims dm;           /* copy of cfg->dims */
    arl_model_opts opts;         /* resolved settings */
    arl_kda_layer_cfg kda;
    arl_mla_layer_cfg mla;
    arl_moe_cfg moe;
    arl_glu_act act;
    float eps;          /* rms_norm_eps */
    int32_t lanes;      /* parallel lanes of the absorbed MLA core */
    int32_t n_blocks;   /* AttnRes block entries ceil(L / B); 0 without AttnRes */
    int32_t *moe_index; /* (L) index among MoE layers or -1; owned */
    float *arena;       /* the workspace, owned */
    int64_t arena_floats;
    /* named buffers inside the arena (T = opts.max_tokens, N = opts.max_docs) */
    float *res;          /* (n_blocks + 1, T, d) AttnRes block entries, then the partial sum p;
                            without AttnRes only slot 0: the residual stream h */
    float *hbuf;         /* (T, d) the mix before a sublayer */
    float *xbuf;         /* (T, d) its RMSNorm */
    float *ybuf;         /* (T, d) the sublayer output */
    float *kda_S;        /* (N, H, dk, dv) gathered KDA states */
    float *kda_tails;    /* (N, 3, P, W-1) gathered conv tails */
    int32_t *routes;     /* (T, k) routes when the caller keeps none */
    int32_t *cu1;        /* (N + 1) boundaries of a one-token-per-document step */
    int32_t *no_targets; /* (T) all -1 */
    float *scratch;      /* sublayer work buffer */
    int64_t scratch_floats;
    float *logits; /* (logit_rows, V) logits of a row block when the caller keeps none */
    int64_t logit_rows;
    float **caches;       /* (N) latent cache pointers of one layer's documents; owned */
    int64_t *pos;         /* (N) positions of the documents; owned */
    float **means;        /* (N) their block-sparse chunk summaries (policy/state.h); owned array */
    int64_t **means_rows; /* (N) the rows those cover; owned array */
} arl_model;

/* Build a model over cfg and params (both borrowed), with its workspace.  opts NULL = the
 * defaults.  ARL_ERR_ARG for settings out of range, ARL_ERR_NOMEM naming the bytes. */
arl_status arl_model_init(arl_model *m, const arl_model_config *cfg, const arl_model_params *w,
                          const arl_model_opts *opts);
void arl_model_free(arl_model *m); /* NULL is a no-op */

/* Bytes of the workspace a model with these settings allocates. */
int64_t arl_model_workspace_bytes(const arl_model_config *cfg, const arl_model_opts *opts);

/* A packed batch.  Every pointer is borrowed for the call. */
typedef struct arl_batch {
    const int32_t *tokens; /* (T) ids in [0, V) */
    int64_t T;
    const int32_t *cu; /* (N + 1) document boundaries, cu[0] = 0 < cu[1] < ... <
                          cu[N] = T (no empty document); NULL = one document */
    int32_t N;
    const float *media; /* (n_media, d) rows that replace the <|media_pad|> tokens of
                           the batch in order (policy/vision.h); NULL: placeholders
                           are embedded as ordinary tokens */
    int64_t n_media;
    const int32_t *targets;       /* (T) ids whose log-probability to return (< 0: none at
                                     that position), or NULL */
    const int32_t *forced_routes; /* (n_moe, T, k) routes to use instead of the router's
                                     choice (spec 6.1), or NULL */
} arl_batch;

/* Saved activations for a backward that recomputes each layer from its inputs (spec 5.4),
 * for a forward over fresh documents.  Bind to a caller arena of arl_model_acts_floats floats.
 * What a backward rebuilds from them, layer l = L-1 .. 0: the pre-mixer mix over block entries
 * 0 .. ceil(l/B)-1 and layer_in[l] (p); after the block start (l mod B = 0) p restarts from 0;
 * the mixer from RMSNorm_in(mix) (KDA with its saved chunk states, the incoming state of every
 * chunk, which the chunkwise backward of spec 3.8 needs; MLA recomputes its expanded form);
 * the post-mixer mix over entries 0 .. floor(l/B) and p + mixer output; the FFN from
 * RMSNorm_post(mix) with the saved routes forced (so the recomputation selects the same
 * experts bit for bit).  The final mix reads all entries and final_in. */
typedef struct arl_model_acts {
    float *layer_in;   /* (L, T, d) p (or h without AttnRes) at the start of every layer */
    float *blocks;     /* (n_blocks, T, d) the AttnRes block entries at the end */
    float *final_in;   /* (T, d) p after the last layer (input of the final mix) */
    int32_t *routes;   /* (n_moe, T, k) the routes used */
    float *kda_chunks; /* per KDA layer, in layer order, (n_chunks, H, dk, dv) incoming
                          chunk states (n_chunks = arl_kda_num_chunks(cu, N, T, C)) */
    int64_t n_chunks;
} arl_model_acts;

int64_t arl_model_acts_floats(const arl_model *m, const arl_batch *b);
void arl_model_acts_bind(arl_model_acts *a, const arl_model *m, const arl_batch *b, float *arena);

/* Outputs of a forward; every pointer may be NULL (not wanted). */
typedef struct arl_forward_out {
    float *logits;        /* (T, V) */
    float *logprobs;      /* (T) log pi(targets[t]) (fp32 log-softmax), 0 where no target */
    float *entropy;       /* (T) entropy of pi at each position */
    int32_t *routes;      /* (n_moe, T, k) selected experts per MoE layer, best first */
    int64_t *expert_load; /* (n_moe, E) tokens routed to each expert */
    float *router_scores; /* (n_moe, T, E) sigmoid router scores (Quantile Balancing) */
    arl_model_acts *acts; /* saved activations (fresh documents only) */
} arl_forward_out;

/* The component settings every forward derives from a config and resolved options: the norm
 * epsilon, the GLU activation, the KDA, MLA and LatentMoE layer settings (this model and the
 * device model of policy/model_device.h). */
void arl_model_layer_cfgs_make(const arl_model_config *cfg, const arl_model_opts *o, float *eps,
                               arl_glu_act *act, arl_kda_layer_cfg *kda, arl_mla_layer_cfg *mla,
                               arl_moe_cfg *moe);

/* The checks of every entry point that takes a batch (forward, training step): T and N within
 * the model's limits, cu, token and target ids, media rows against placeholders, forced routes.
 * ARL_OK, or the error described under arl_model_forward with who ("model", "training") as the
 * message's prefix. */
arl_status arl_model_batch_check(const arl_model *m, const arl_batch *b, const char *who);

/* Forward over fresh documents.  Errors (nothing is computed): ARL_ERR_RANGE for T or N
 * above the model's limits, a token or target id outside [0, V) or a bad forced route (each
 * naming the position); ARL_ERR_ARG for bad cu, or a media row count that differs from the
 * number of placeholders. */
arl_status arl_model_forward(arl_model *m, const arl_batch *b, const arl_forward_out *out);

/* Forward in which document i continues the sequence of decode-state slot slots[i] (distinct,
 * active): it reads the slot's state and position, and leaves the state after the document
 * in the slot.  Rules and errors as arl_model_forward, plus ARL_ERR_STATE for an inactive or
 * repeated slot and ARL_ERR_RANGE when a sequence would pass max_context.  out->acts must be
 * NULL.  The state must belong to this model's config. */
arl_status arl_model_forward_state(arl_model *m, arl_decode_state *st, const int32_t *slots,
                                   const arl_batch *b, const arl_forward_out *out);

/* Prefill n >= 1 tokens of one sequence into `slot` in forwards of at most max_tokens.
 * media: (n_media, d) rows for the placeholders among the tokens, or NULL.
 * logits (n, V) receives every row, or NULL; last_logits (V) the last row, or NULL. */
arl_status arl_model_prefill(arl_model *m, arl_decode_state *st, int32_t slot,
                             const int32_t *tokens, int64_t n, const float *media, int64_t n_media,
                             float *logits, float *last_logits);

/* One decode step: token tokens[i] appended to slot slots[i] for i < n; logits (n, V)
 * (required), routes (n_moe, n, k) or NULL. */
arl_status arl_model_decode_step(arl_model *m, arl_decode_state *st, const int32_t *slots,
                                 int32_t n, const int32_t *tokens, float *logits, int32_t *routes);

/* targets[t] = tokens[t + 1] inside each document, -1 at each document's last token: the
 * next-token targets of scoring and training.  targets (T). */
void arl_batch_next_token_targets(int32_t *targets, const int32_t *tokens, const int32_t *cu,
                                  int32_t N, int64_t T);

#endif
