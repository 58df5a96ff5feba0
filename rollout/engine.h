/* rollout/engine.h: the inference engine of a rollout worker - the policy model over one decode
 * state (policy/model.h, policy/state.h), its sampler, its chat template, and the policy
 * version it runs (two parameter buffers: the current weights and the next version, loaded
 * ahead and swapped in between turns).
 *
 * What this is: batched forwards that continue decode-state slots (chunked prefill of several
 * sequences at once, one-token decode steps) returning the MoE routes of every token and the
 * logits of the rows asked for.  What this is not: scheduling, segments or the store
 * (rollout/worker.c).
 *
 * Symbols: V vocabulary, d width, n_moe MoE layers, k experts per token, T tokens of a forward,
 * N sequences of a forward.
 */
#ifndef ARL_ROLLOUT_ENGINE_H
#define ARL_ROLLOUT_ENGINE_H

#include <stdint.h>

#include "core/status.h"
#include "policy/chat.h"
#include "policy/config.h"
#include "policy/model.h"
#include "policy/model_device.h"
#include "policy/params.h"
#include "policy/sample.h"
#include "policy/state.h"

typedef struct ro_engine_opts {
    int32_t n_slots;      /* sequences decoded together */
    int64_t max_tokens;   /* most tokens of one forward (>= n_slots) */
    int64_t max_context;  /* most positions of one sequence since its fresh start */
    const char *max_context_key; /* the setting it comes from (arl_model_opts); NULL: none */
    int64_t sparse_topk;  /* block-sparse MLA chunks (0: dense) */
    int64_t sparse_chunk; /* block-sparse MLA chunk length */
    const char *device;   /* NULL: policy/model.h on the CPU (the reference); else a device of
                             policy/model_device.h (arl_dev_ops_get: "cuda", or "cpu", the
                             device code over host memory, bit-identical to the reference) */
    int32_t bf16_weights; /* with device "cuda": GEMMs on bf16 copies of the weights */
    int32_t decode_graphs; /* with device "cuda": decode steps replayed as CUDA graphs */
    int32_t device_index;  /* with device "cuda": the GPU ordinal; -1: the process's local MPI
                              rank (OMPI_COMM_WORLD_LOCAL_RANK, else 0) modulo the GPU count.
                              Applies when the thread has no current CUDA context yet. */
} ro_engine_opts;

typedef struct ro_engine {
    arl_model_config cfg;
    arl_model_params params[2]; /* [cur] runs; [1 - cur] holds a loaded next version */
    int cur;
    int64_t version;            /* policy version of params[cur] */
    int have_next;              /* params[1 - cur] holds version next_version */
    int64_t next_version;
    char wsha[2][65];     /* params[i]'s weights SHA-256 once computed, "" before */
    arl_model m;          /* the reference path (o.device NULL) */
    arl_decode_state st;  /* the slots: on the reference path the state itself; on a device
                             the bookkeeping (join / leave / reserve) and a host copy of each
                             slot, current only after ro_engine_slot_sync */
    const arl_dev_ops *ops; /* the device (o.device set), else NULL */
    arl_model_dev md;       /* the model on that device; its slot i is st's slot i */
    int64_t *dev_rows;      /* (n_slots) rows whose logits a device forward returns */
    char numerics[32];      /* the states' numerics tag (spec/replay.md 9.2): "cpu-f32", ... */
    int ctx_user;           /* 1: the model lives in the CUDA context the engines opened */
    arl_sampler smp;
    arl_chat_template tpl;
    char cfg_hash[65];          /* config hash, hex */
    ro_engine_opts o;
    int64_t V, d, n_moe, k, E;
    int route_bytes;            /* 1 (E <= 255) or 2 */
    float *logits;   /* (n_slots, V) logits of the last decode step / prefill rows */
    int32_t *routes; /* (n_moe, max_tokens, k) routes of the last forward (layout (n_moe, T, k)) */
    int32_t *tok;    /* (max_tokens) packing buffer */
    int32_t *cu;     /* (n_slots + 1) */
    int32_t *slots;  /* (n_slots) */
    float *media;    /* (max_tokens, d) media rows of one forward */
} ro_engine;

/* The byte-level chat template of a model config (bos/eos/pad/media ids from the config, the
 * vision patch size, 0 for a text-only model). */
arl_status ro_template_from_config(const arl_model_config *cfg, arl_chat_template *t);

/* Load ckpt_dir (config.json + weights) as `version` and set up the model and decode state. */
arl_status ro_engine_open(ro_engine *e, const char *ckpt_dir, int64_t version,
                          const ro_engine_opts *o);
void ro_engine_close(ro_engine *e); /* NULL-safe */

/* Load ckpt_dir into the spare parameter buffer as version `version` (the running weights are
 * untouched).  Its config must hash like the running one (ARL_ERR_CONFIG otherwise). */
arl_status ro_engine_load_next(ro_engine *e, const char *ckpt_dir, int64_t version);
/* Make the loaded next version the running one (no-op without one). */
arl_status ro_engine_swap(ro_engine *e); /* uploads the weights to a device */

/* One forward continuing N sequences: document i (tokens[cu[i] .. cu[i+1])) continues slot
 * slots[i].  media: (n_media, d) rows for the <|media_pad|> tokens in order, or NULL.
 * Routes of every token land in e->routes (n_moe, T, k).  For each i with want[i] != 0 the
 * logits of the document's last row go to logits + i * V.  want/logits may be NULL. */
arl_status ro_engine_forward(ro_engine *e, int32_t N, const int32_t *slots, const int32_t *cu,
                             const int32_t *tokens, int64_t T, const float *media,
                             int64_t n_media, const int *want, float *logits);

/* One decode step: token tokens[i] appended to slot slots[i]; logits (n, V) into e->logits,
 * routes (n_moe, n, k) into e->routes. */
arl_status ro_engine_decode(ro_engine *e, int32_t n, const int32_t *slots, const int32_t *tokens);

/* Slots (both paths; st's slot bookkeeping, and the device slot with it).  join: a free slot,
 * fresh; reset: the slot starts fresh; import: the slot's state becomes an export
 * (arl_decode_state_import's checks); sync: st's copy of the slot made current, its latent
 * rows from row0 on (rows below are taken as current: the caller's last sync reached them;
 * no-op on the reference path). */
arl_status ro_engine_slot_join(ro_engine *e, int32_t *slot);
arl_status ro_engine_slot_reset(ro_engine *e, int32_t slot);
arl_status ro_engine_slot_import(ro_engine *e, int32_t slot, const void *buf, size_t len);
arl_status ro_engine_slot_sync(ro_engine *e, int32_t slot, int64_t row0);

/* A forward of b continuing the engine's slots (either path): document i continues slot
 * slots[i] (active); out as arl_model_forward_state's (HOST arrays: log-probabilities,
 * entropy, routes, router scores, expert loads, logits). */
arl_status ro_engine_score(ro_engine *e, const int32_t *slots, const arl_batch *b,
                           const arl_forward_out *out);
/* Tokens held by an active slot (either path). */
int64_t ro_engine_slot_pos(const ro_engine *e, int32_t slot);

/* The running weights (host fp32; the vision tower reads them). */
const arl_model_params *ro_engine_params(const ro_engine *e);

/* The identity of parameter buffer `which` (0 or 1, an index into params) as loaded: SHA-256 of
 * its fp32 arena as lower-case hex into hex[65].  Recorded as policy_versions.weights_sha256
 * by the worker and matched by `replay rescore` (spec/replay.md 13.6) to find a checkpoint's
 * version.  It reads the whole arena (milliseconds for the tiny configs, hours for the 11 TB
 * of a full-scale one), so it is computed once per loaded version and kept (wsha) for the
 * version check, the version record and the fork state that ask for it. */
void ro_engine_weights_sha256(ro_engine *e, int which, char hex[65]);

#endif
