/* policy/train_state.h: the train state saved beside a model checkpoint, and the directory
 * of numbered training checkpoints of a run (DESIGN section 6, spec/policy.md section 14.1).
 *
 * A training checkpoint is one directory ROOT/step-NNNNNNNN (8+ digits, the number of
 * optimizer steps completed) holding
 *   config.json, model.safetensors (or shards)  the parameters (policy/checkpoint.h)
 *   optimizer.safetensors                        AdamW moments, F32, keyed by the parameter
 *                                                key + ".exp_avg" / ".exp_avg_sq" (memory
 *                                                shapes; A_log as [H]); trained tensors only
 *                                                (no_grad tensors have no moments); metadata
 *                                                format "agentrl-optimizer", version, step
 *   train_state.json                             the scalars (below), written last
 * Saving is atomic: everything is written into ROOT/.tmp-step-NNNNNNNN-XXXXXX (each file
 * fsync'ed), the directory is fsync'ed and renamed to its final name, and ROOT is fsync'ed; a
 * crash at any point leaves either the complete new checkpoint or none (plus a .tmp-
 * directory that a resume or the next save removes).  Re-saving an existing step moves the old
 * one to ROOT/.old-step-NNNNNNNN-XXXXXX first; a crash before the new one is in place leaves
 * no step-N, and a resume (arl_train_ckpt_load_newest) or the next save puts the old one back.
 * After a save only the newest keep_last checkpoints are kept.
 *
 * train_state.json (format "agentrl-train-state", version ARL_TRAIN_STATE_VERSION):
 *   {"format", "version", "step", "tokens", "lr",
 *    "model_config_sha256": config hash of the model (spec/policy.md section 12.1),
 *    "run_config_sha256": hash of the run settings that decide the trajectory (the driver's),
 *    "rng": {"name": ["0x<16 hex>" x 4], ...}   xoshiro256** states, verbatim,
 *    "data": {"epoch", "index", "items", "seed": "0x..", "offset", "line", "sha256"},
 *    "extra": {...}}                              a caller-defined object (e.g. KL controller)
 * Unsigned 64-bit values are hex strings (JSON integers are signed); reals are written with
 * 17 significant digits and read back exactly.  A file with a newer version is refused
 * (ARL_ERR_VERSION); a train state of another model config or run config is refused
 * (ARL_ERR_CONFIG naming both hashes).
 *
 * What this is not: the model checkpoint format itself (policy/checkpoint.h), the optimizer
 * math (policy/optimizer.h), what a data cursor means (the data pipeline's business: here it
 * is stored verbatim).
 */
#ifndef ARL_POLICY_TRAIN_STATE_H
#define ARL_POLICY_TRAIN_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/rng.h"
#include "core/sha256.h"
#include "core/status.h"
#include "policy/config.h"
#include "policy/optimizer.h"
#include "policy/params.h"

#define ARL_TRAIN_STATE_FORMAT "agentrl-train-state"
#define ARL_TRAIN_STATE_VERSION 1
#define ARL_TRAIN_STATE_FILE "train_state.json"
#define ARL_OPTIM_STATE_FORMAT "agentrl-optimizer"
#define ARL_OPTIM_STATE_VERSION 1
#define ARL_OPTIM_STATE_FILE "optimizer.safetensors"
#define ARL_TRAIN_MAX_RNG 8
#define ARL_TRAIN_RNG_NAME 32

/* Position of a data stream: which item comes next. */
typedef struct arl_data_cursor {
    int64_t epoch;  /* 0-based epoch of the next item */
    int64_t index;  /* position of the next item in the epoch's order */
    int64_t items;  /* items per epoch (a resume checks it) */
    uint64_t seed;  /* shuffle seed */
    int64_t offset; /* byte offset of the next item in its file (informational) */
    int64_t line;   /* 1-based line of the next item (informational) */
    char sha256[ARL_SHA256_HEX_CHARS]; /* identity of the data ("" if none) */
} arl_data_cursor;

typedef struct arl_train_state {
    int64_t step;                            /* optimizer steps completed */
    int64_t tokens;                          /* tokens trained on so far */
    double lr;                               /* learning rate of the last step */
    char model_sha256[ARL_SHA256_HEX_CHARS]; /* model config hash */
    char run_sha256[ARL_SHA256_HEX_CHARS];   /* run settings hash ("" = not checked) */
    int32_t n_rng;
    char rng_name[ARL_TRAIN_MAX_RNG][ARL_TRAIN_RNG_NAME];
    arl_rng rng[ARL_TRAIN_MAX_RNG];
    arl_data_cursor data;
    char *extra_json; /* compact JSON object text or NULL; owned (malloc) */
    /* the settings hashed into run_sha256 as a compact JSON object text, or NULL (not kept:
     * states written before it); owned (malloc).  A refused resume names what differs. */
    char *run_config_json;
} arl_train_state;

void arl_train_state_init(arl_train_state *st); /* zero */
void arl_train_state_free(arl_train_state *st); /* NULL-safe; frees the JSON texts, zeroes */

/* Store (add or replace) the named generator state.  ARL_ERR_FULL beyond ARL_TRAIN_MAX_RNG,
 * ARL_ERR_ARG for an empty or too long name. */
arl_status arl_train_state_set_rng(arl_train_state *st, const char *name, const arl_rng *r);
/* Fetch it; ARL_ERR_NOT_FOUND naming the generator when absent. */
arl_status arl_train_state_get_rng(const arl_train_state *st, const char *name, arl_rng *r);
/* Replace extra_json with a copy of text (a JSON object; NULL clears).  ARL_ERR_ARG if text
 * is not a JSON object. */
arl_status arl_train_state_set_extra(arl_train_state *st, const char *text);
/* The same for run_config_json (the settings whose hash is run_sha256). */
arl_status arl_train_state_set_run_config(arl_train_state *st, const char *text);

/* train_state.json, written atomically (temp file, fsync, rename, fsync of the directory). */
arl_status arl_train_state_write(const char *path, const arl_train_state *st);
/* Read it into st (initialised first).  ARL_ERR_FORMAT for a malformed file (naming the
 * member), ARL_ERR_VERSION for a newer version.  Hashes are not checked here. */
arl_status arl_train_state_read(const char *path, arl_train_state *st);
/* ARL_ERR_CONFIG unless st's hashes equal the expected ones (run_sha256 NULL or "" skips
 * that check); the message names `where`, both hashes and what to do. */
arl_status arl_train_state_check(const arl_train_state *st, const char *where,
                                 const char *model_sha256, const char *run_sha256);

/* ---- optimizer moments ---- */

/* Write opt's moments to path (one safetensors file, atomic). */
arl_status arl_optim_state_save(const char *path, const arl_adamw *opt);
/* Read them into opt (allocated for the same model config) and set opt->step from the
 * metadata.  Every trained tensor's two keys must be present, F32, with the memory shape;
 * missing, unexpected and mis-shaped keys are reported in one ARL_ERR_SHAPE message.
 * ARL_ERR_VERSION for a newer version, ARL_ERR_FORMAT for a file of another format. */
arl_status arl_optim_state_load(const char *path, arl_adamw *opt);

/* ---- numbered checkpoints of a run ---- */

/* Save the model, moments and state as ROOT/step-<st->step> (atomic, see above; ROOT is
 * created if absent), then prune to the newest keep_last checkpoints (0 = keep all).
 * shard_bytes as for arl_checkpoint_save.  path_out (may be NULL) receives the final
 * directory (cap bytes). */
arl_status arl_train_ckpt_save(const char *root, const arl_model_config *cfg,
                               const arl_model_params *params, const arl_adamw *opt,
                               const arl_train_state *st, int64_t keep_last, uint64_t shard_bytes,
                               char *path_out, size_t cap);

/* The newest complete checkpoint under ROOT (highest step with a train_state.json): its path
 * into path (cap bytes) and its step.  ARL_ERR_NOT_FOUND when there is none (also when ROOT
 * does not exist). */
arl_status arl_train_ckpt_latest(const char *root, char *path, size_t cap, int64_t *step);

/* Steps of the complete checkpoints under ROOT in increasing order: *steps malloc'ed
 * (caller frees), *n their number (0 and NULL when none). */
arl_status arl_train_ckpt_list(const char *root, int64_t **steps, int64_t *n);

/* Load a checkpoint directory written by arl_train_ckpt_save: the state first (refusing a
 * newer version, another model config or, when run_sha256 is non-empty, another run
 * config), then the parameters (params allocated for cfg) and the moments (opt initialised
 * for cfg).  On failure params and opt may be partly written; st is initialised. */
arl_status arl_train_ckpt_load(const char *dir, const arl_model_config *cfg, const char *run_sha256,
                               arl_model_params *params, arl_adamw *opt, arl_train_state *st);

/* Load the newest checkpoint under ROOT that loads (arl_train_ckpt_latest, then
 * arl_train_ckpt_load): its directory into path (cap bytes), its step into *step.  With
 * set_aside (given by the one process that owns ROOT), what interrupted saves left is repaired
 * first: a step-N that a save had moved aside to .old-step-N-XXXXXX and not replaced yet is put
 * back (with a warning), the other .old-step-* and every .tmp-step-* are removed, and a step-N
 * without train_state.json (a save never leaves one) is moved to ROOT/damaged-step-N with a
 * warning.  Then, with set_aside, one whose own files are damaged (truncated or malformed, a
 * checksum or a shape off, a file missing) is moved to ROOT/damaged-step-N (or damaged-step-N.K,
 * the first K free), which the listing no longer sees, with a warning on the log, and the one
 * before it is tried: a resume continues from there and saves step N again.  Any other failure
 * (another model or run configuration, a newer version, a read error; without set_aside a
 * damaged file too) is returned; without set_aside nothing is moved or removed.
 * ARL_ERR_NOT_FOUND when no checkpoint is (left) there. */
arl_status arl_train_ckpt_load_newest(const char *root, const arl_model_config *cfg,
                                      const char *run_sha256, arl_model_params *params,
                                      arl_adamw *opt, arl_train_state *st, int set_aside,
                                      char *path, size_t cap, int64_t *step);

/* The settings that differ between two run configurations (JSON objects, as
 * arl_train_state_set_run_config keeps them), flattened and in key order - "learner.lr 0.0001 ->
 * 0.001, rollout.temperature 1 -> 0.5" - up to eight named, then " and N more", into out (cap
 * bytes).  Returns how many differ (0 when none, or when either is not a JSON object). */
int arl_run_config_diff(const char *saved_json, const char *now_json, char *out, size_t cap);

/* For a failure s of loading checkpoint DIR (arl_train_ckpt_load, _load_newest) for model config
 * cfg: when it is the refusal of another run configuration (DIR's state has cfg's model hash and
 * a run hash other than SHA-256 of run_config_json) and the state kept its settings, the message
 * names the settings that differ from run_config_json (this run's, as hashed) instead of the two
 * hashes: "DIR/train_state.json: this checkpoint belongs to a run with other settings (as saved
 * -> as now): learner.lr 0.0001 -> 0.001, rollout.temperature 1 -> 0.5; ..." (up to eight
 * named, then a count).  Returns s; any other failure is left as it is. */
arl_status arl_train_ckpt_explain(arl_status s, const char *dir, const arl_model_config *cfg,
                                  const char *run_config_json);

/* Write len bytes to path atomically (temp file in the same directory, fsync, rename, fsync
 * of the directory). */
arl_status arl_write_file_atomic(const char *path, const void *data, size_t len);

#endif
