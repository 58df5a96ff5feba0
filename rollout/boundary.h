/* rollout/boundary.h: the decode state of one engine slot at the end of a segment, written to
 * the store as its two states (spec/replay.md 4.12): the kda_boundary (every KDA layer's S and
 * convolution tail, covering positions 0..end) and the mla_segment (the segment's own latent rows
 * of every MLA layer, split into chunks under the blob limit, spec/replay.md 5.4).
 *
 * What this is: the one place that turns slot state into state chunks, for the rollout worker
 * (producer 'rollout', rollout/commit.c), `replay rescore --save-states` (producer 'tool') and
 * the learner's pi_old pass (producer 'learner', learner/states.c).
 * Also the version test the callers' validity rules share (ro_boundary_at_version).
 * What this is not: the choice of which cached states may start a segment (validity rules stay
 * with the callers), or reading states back (arl_rollout_state_assemble, rollout/rescore.h).
 */
#ifndef ARL_ROLLOUT_BOUNDARY_H
#define ARL_ROLLOUT_BOUNDARY_H

#include <stdint.h>

#include "core/status.h"
#include "replay/replay.h"
#include "rollout/engine.h"

/* Write the state of `slot` at the end of the segment [seg_ctx_start, seg_ctx_start + seg_n).
 * id names the states: traj_uid, seg_index, producer, pass_uid, routing, and the version range
 * of the whole covered computation (version_min/max, for the kda_boundary); kind, numerics,
 * model_config_sha256, ctx_start and n_tokens are filled here.  seg_vmin/seg_vmax: the versions
 * of the segment's own tokens (the mla_segment's range).  *end_id, *lat_id: the new state ids
 * (-1 until written).  ARL_ERR_INTERNAL when the slot's position is not the segment's end;
 * ARL_ERR_NOMEM; the store's errors. */
arl_status ro_boundary_put(replay_writer *w, const ro_engine *e, int32_t slot,
                           const replay_state_desc *id, int64_t seg_ctx_start, int64_t seg_n,
                           int64_t seg_vmin, int64_t seg_vmax, int64_t *end_id, int64_t *lat_id);

/* ro_boundary_put over any decode state: slot of ds, computed by a model of configuration cfg
 * (cfg_hash: arl_model_config_hash_hex) with kernels tagged `numerics`. */
arl_status ro_boundary_put_state(replay_writer *w, const arl_model_config *cfg,
                                 const char *cfg_hash, const char *numerics,
                                 const arl_decode_state *ds, int32_t slot,
                                 const replay_state_desc *id, int64_t seg_ctx_start, int64_t seg_n,
                                 int64_t seg_vmin, int64_t seg_vmax, int64_t *end_id,
                                 int64_t *lat_id);

/* *yes = 1 when every part (a full boundary, replay_boundary_load) was computed entirely at
 * policy version `version` of run run_id: its version range is [version, version] and the
 * trajectory it belongs to is in that run (a fork's prefix parts are its parent's, whose run
 * may be another, with versions of its own).  The store's errors. */
arl_status ro_boundary_at_version(replay_store *st, const replay_state_data *parts, size_t np,
                                  int64_t run_id, int64_t version, int *yes);

/* Record the use of the loaded states parts[0..np) that are of w's own states file (shard_id
 * of w; spec/replay.md 9.3: their last_used_at_ms, the budget's LRU order); the others are
 * other writers' files, left alone (spec/replay.md 13).  The store's errors. */
arl_status ro_states_touch(replay_writer *w, const replay_state_data *parts, size_t np);

/* The end of a cached-state import: when s is ARL_OK, the boundary parts (replay_boundary_load
 * or replay_state_find, the kda_boundary first) assembled into an ARLS export and imported into
 * `slot` (a part that does not fit is a miss, ARL_ERR_NOT_FOUND); parts are freed in every
 * case.  Returns s or the first error. */
arl_status ro_boundary_import_parts(ro_engine *e, int32_t slot, replay_state_data *parts, size_t np,
                                    arl_status s);

/* Import into `slot` the states of `producer` ("tool" or "learner") and pass `pass` for the
 * boundary at the end of refs[si - 1] of trajectory traj_uid: its kda_boundary and the
 * mla_segment states of refs[f..si-1] from the last fresh start f.  ARL_OK, ARL_ERR_NOT_FOUND
 * (a miss) or another error. */
arl_status ro_pass_boundary_import(replay_store *st, ro_engine *e, int32_t slot,
                                   const char *traj_uid, const replay_seg_ref *refs, size_t si,
                                   const char *producer, const char *pass);

/* The pass_uid of the states that `producer` writes under weights whose SHA-256 is wsha
 * (ro_engine_weights_sha256; for the learner, the weights_sha256 the store's policy_versions
 * row of its version records), with the router's own routes (natural) or the stored ones, and
 * block-sparse MLA (sparse_topk 0: dense): "rescore:..." for `replay rescore --save-states`
 * (producer "tool"), "learner:..." for the learner's pi_old pass.  A pass that computes the same
 * states under the same weights has the same uid, so a later pass may start from them. */
void ro_pass_uid(const char *producer, const char *wsha, int natural, int64_t sparse_topk,
                 int64_t sparse_chunk, char *out, size_t cap);

#endif
