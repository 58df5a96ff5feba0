/* rollout/rescore.c: re-scoring stored trajectories under a checkpoint (spec/replay.md 13.6):
 * the token log-probabilities of every segment recomputed, each segment starting from the
 * cached boundary state of its predecessor when that state is usable, else from the prefix
 * this pass computed; MoE routes replayed from the store by default.  It also measures the router
 * agreement with the stored routes (the natural top-k of each layer's router scores, at the
 * replayed input with --routing replay; policy/router.h arl_router_overlap) and the entropy of the predicting
 * rows.  Start states: tool states that an earlier pass under the same checkpoint saved (pass_uid
 * from the weights' SHA-256, routing and MLA sparsity), else rollout states of the checkpoint's
 * policy version (derived from the run's policy_versions by default), else recomputed; with
 * save_states every segment's end state is written as producer 'tool'.  Forks are in fork.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/sha256.h"
#include "rollout/boundary.h"
#include "rollout/engine.h"
#include "rollout/media.h"
#include "rollout/rescore.h"
#include "policy/router.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Import the cached full boundary of segment seg_index of traj into slot 0, if every part was
 * computed at `version` of run run_id (a fork's prefix parts may be another run's).  Returns
 * ARL_OK (imported), ARL_ERR_NOT_FOUND (a miss: go on with the recomputed state) or another
 * error. */
static arl_status import_boundary(replay_store *st, ro_engine *e, int64_t traj_id,
                                  int32_t seg_index, int64_t run_id, int64_t version) {
    replay_state_data *parts = NULL;
    size_t np = 0;
    arl_status s = replay_boundary_load(st, traj_id, seg_index, &parts, &np);
    if (s) return s;
    int yes = 0;
    s = ro_boundary_at_version(st, parts, np, run_id, version, &yes);
    if (s == ARL_OK && !yes)
        s = arl_errorf(ARL_ERR_NOT_FOUND,
                       "the cached state was not computed at version %lld of "
                       "run %lld alone",
                       (long long)version, (long long)run_id);
    return ro_boundary_import_parts(e, 0, parts, np, s);
}

/* Write the state of slot at the end of segment r (spec 13.6 step 3) as producer 'tool' of pass
 * `pass`, as the rollout writes its own (rollout/boundary.h). */
static arl_status save_boundary(replay_writer *w, ro_engine *e, int32_t slot, const char *traj_uid,
                                const replay_seg_ref *r, const char *pass, int64_t version,
                                const char *routing) {
    replay_state_desc id = {.traj_uid = traj_uid, .seg_index = r->seg_index, .producer = "tool",
                            .pass_uid = pass, .version_min = version, .version_max = version,
                            .routing = routing};
    int64_t end_id, lat_id;
    arl_status s = ro_engine_slot_sync(e, slot, r->ctx_start);
    if (s == ARL_OK)
        s = ro_boundary_put(w, e, slot, &id, r->ctx_start, r->n_tokens, version, version, &end_id,
                            &lat_id);
    return s ? arl_error_prefix(s, "rescore --save-states") : ARL_OK;
}

/* Which version's rollout states may start segments (opts->version, section on
 * ARL_ROLLOUT_RESCORE_VERSION_AUTO in rescore.h), given the checkpoint's weights hash. */
static arl_status resolve_version(replay_store *st, const replay_traj_row *row,
                                  const arl_rollout_rescore_opts *o, const char *wsha,
                                  arl_rollout_rescore_stats *out) {
    out->version = -1;
    out->version_how = ARL_ROLLOUT_RESCORE_VERSION_NONE;
    if (o->version == -1) return ARL_OK;
    if (o->version >= 0) {
        replay_version_row rec; /* (weights_sha256 "" when not recorded) */
        const arl_status g = replay_version_get(st, row->run_id, o->version, &rec);
        if (g == ARL_ERR_NOT_FOUND && replay_store_has_catalog(st)) {
            arl_error_clear(); /* the run never recorded it: no state is of it */
            out->version_how = ARL_ROLLOUT_RESCORE_VERSION_UNKNOWN;
            return ARL_OK;
        }
        if (g == ARL_ERR_NOT_FOUND) /* no catalog to check it against: as asserted */
            arl_error_clear();
        else
            ARL_TRY(g);
        if (rec.weights_sha256[0] && strcmp(rec.weights_sha256, wsha)) {
            out->version_how = ARL_ROLLOUT_RESCORE_VERSION_REFUSED;
            return ARL_OK;
        }
        out->version = o->version;
        out->version_how = ARL_ROLLOUT_RESCORE_VERSION_GIVEN;
        return ARL_OK;
    }
    int how = 0;
    arl_status s = replay_version_find(st, row->run_id, wsha, o->ckpt_dir, &out->version, &how);
    if (s == ARL_ERR_NOT_FOUND) {
        arl_error_clear();
        out->version = -1;
        return ARL_OK;
    }
    ARL_TRY(s);
    out->version_how = how == 1 ? ARL_ROLLOUT_RESCORE_VERSION_WEIGHTS
                                : ARL_ROLLOUT_RESCORE_VERSION_PATH;
    return ARL_OK;
}

arl_status arl_rollout_rescore(replay_store *st, const char *traj,
                               const arl_rollout_rescore_opts *opts,
                               arl_rollout_rescore_stats *out, float **logprobs_out,
                               float **mu_out, size_t *n_out) {
    return arl_rollout_rescore_ex(st, traj, opts, out, logprobs_out, mu_out, n_out, NULL);
}

arl_status arl_rollout_rescore_ex(replay_store *st, const char *traj,
                                  const arl_rollout_rescore_opts *opts,
                                  arl_rollout_rescore_stats *out, float **logprobs_out,
                                  float **mu_out, size_t *n_out, arl_rollout_rescore_detail *det) {
    memset(out, 0, sizeof *out);
    if (det) {
        det->entropy = NULL;
        det->overlap = NULL;
        det->n_moe = det->k = 0;
    }
    out->worst_token = -1;
    if (logprobs_out) *logprobs_out = NULL;
    if (mu_out) *mu_out = NULL;
    if (n_out) *n_out = 0;
    replay_traj_row row;
    ARL_TRY(replay_traj_get(st, traj, &row));
    replay_seg_ref *refs = NULL;
    size_t n = 0;
    ARL_TRY(replay_traj_segments(st, row.traj_id, &refs, &n));
    int64_t total = 0, max_ctx = 1;
    for (size_t i = 0; i < n; i++) {
        total += refs[i].n_tokens;
        if (refs[i].ctx_start + refs[i].n_tokens > max_ctx)
            max_ctx = refs[i].ctx_start + refs[i].n_tokens;
    }
    const int64_t chunk = opts->max_tokens > 0 ? opts->max_tokens : 2048;
    ro_engine e;
    ro_engine_opts eo = {.n_slots = 1, .max_tokens = chunk, .max_context = max_ctx + 1,
                         .sparse_topk = opts->sparse_topk,
                         .sparse_chunk = opts->sparse_chunk > 0 ? opts->sparse_chunk : 4096,
                         .device = !opts->device || !strcmp(opts->device, "cpu") ? NULL
                                   : !strcmp(opts->device, "cpu-device")        ? "cpu"
                                                                                : opts->device,
                         .device_index = -1};
    arl_status s = ro_engine_open(&e, opts->ckpt_dir, opts->version >= 0 ? opts->version : -1,
                                  &eo);
    /* the checkpoint's identity: SHA-256 of its parameters as loaded (fp32), the key of the
     * version match and of this checkpoint's tool states (pass_uid) */
    char wsha[ARL_SHA256_HEX_CHARS] = "", lpass[sizeof out->pass_uid] = "";
    if (s == ARL_OK && (opts->version != -1 || opts->save_states)) {
        ro_engine_weights_sha256(&e, e.cur, wsha);
        ro_pass_uid("tool", wsha, opts->natural_routing, opts->sparse_topk, eo.sparse_chunk,
                    out->pass_uid, sizeof out->pass_uid);
        ro_pass_uid("learner", wsha, opts->natural_routing, opts->sparse_topk, eo.sparse_chunk,
                    lpass, sizeof lpass);
    }
    if (s == ARL_OK) s = resolve_version(st, &row, opts, wsha, out);
    /* a pass that saves its states computes them all itself */
    const int use_tool = s == ARL_OK && !opts->save_states && opts->version != -1;
    const int64_t use_version = opts->save_states ? -1 : out->version;
    float *lp = calloc((size_t)(total ? total : 1), sizeof(float));
    float *mu = calloc((size_t)(total ? total : 1), sizeof(float));
    double *diffs = calloc((size_t)(total ? total : 1), sizeof(double));
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)chunk);
    int32_t *tgt = malloc(sizeof(int32_t) * (size_t)chunk);
    float *clp = malloc(sizeof(float) * (size_t)chunk);
    int32_t *forced = malloc(sizeof(int32_t) * (size_t)chunk * (size_t)(e.n_moe ? e.n_moe * e.k : 1));
    /* agreement and entropy (spec/replay.md 13.6 step 2): the router scores of every MoE layer
     * give the natural top-k at its input; the entropy of each predicting row */
    const int64_t nm = s == ARL_OK ? e.n_moe : 0, kk = s == ARL_OK ? e.k : 0;
    const int64_t EE = s == ARL_OK && nm ? e.E : 1;
    float *cent = malloc(sizeof(float) * (size_t)chunk);
    float *rsc = nm ? malloc(sizeof(float) * (size_t)chunk * (size_t)(nm * EE)) : NULL;
    float *rws = malloc(sizeof(float) * (size_t)EE);
    int32_t *nat = malloc(sizeof(int32_t) * (size_t)(kk ? kk : 1));
    int32_t *sr = malloc(sizeof(int32_t) * (size_t)(kk ? kk : 1));
    const float **bias = malloc(sizeof *bias * (size_t)(nm ? nm : 1));
    float *ent = calloc((size_t)(total ? total : 1), sizeof(float));
    uint8_t *ovl = malloc((size_t)(total ? total : 1) * (size_t)(nm ? nm : 1));
    if (ovl) memset(ovl, 0xFF, (size_t)(total ? total : 1) * (size_t)(nm ? nm : 1));
    if (s == ARL_OK && bias)
        for (int64_t l = 0, j = 0; l < e.cfg.dims.L; l++)
            if (ro_engine_params(&e)->layers[l].is_moe)
                bias[j++] = ro_engine_params(&e)->layers[l].moe.gate_bias;
    double ov_sum = 0, ent_sum = 0;
    int64_t rt = 0, ex_layer = 0, ex_token = 0;
    int32_t slot = 0;
    /* the image rows of the placeholders, rebuilt from the stored observations */
    ro_media md;
    memset(&md, 0, sizeof md);
    float *mrows = NULL;
    if (s == ARL_OK) {
        arl_status ms = ro_media_load(st, row.traj_id, &e, &md);
        if (ms == ARL_ERR_NOMEM) s = ms;
        else if (ms) arl_error_clear(); /* unreadable: their segments are skipped, as below */
        if (s == ARL_OK && md.n_rows > 0) {
            mrows = malloc(sizeof(float) * (size_t)(chunk * e.d));
            if (!mrows) s = arl_errorf(ARL_ERR_NOMEM, "rescore: out of memory");
        }
    }
    if (s == ARL_OK && (!lp || !mu || !diffs || !tok || !tgt || !clp || !forced || !cent ||
                        (nm && !rsc) || !rws || !nat || !sr || !bias || !ent || !ovl))
        s = arl_errorf(ARL_ERR_NOMEM, "rescore: out of memory");
    if (s == ARL_OK) s = ro_engine_slot_join(&e, &slot);
    replay_seg_data d;
    memset(&d, 0, sizeof d);
    int64_t nd = 0;
    double sum = 0;
    int tainted = 0; /* the running state went through image placeholders without image rows */
    int lost = 0;    /* the image cursor lost its place: no rows until the next fresh start */
    for (size_t si = 0; s == ARL_OK && si < n; si++) {
        const replay_seg_ref *r = &refs[si];
        s = replay_segment_load(st, r->traj_id, r->seg_index,
                                REPLAY_LOAD_TOKENS | (nm ? REPLAY_LOAD_ROUTES : 0),
                                &d);
        if (s) break;
        if (!strcmp(r->start_kind, "fresh")) {
            s = ro_engine_slot_reset(&e, slot);
            if (s) break;
            out->fresh++;
            ro_media_fresh(&md, r->first_step - 1);
            tainted = 0;
            lost = 0;
        } else if ((use_tool || use_version >= 0) && si > 0) {
            arl_status b = ARL_ERR_NOT_FOUND;
            if (use_tool) { /* tool states of this checkpoint, else the learner's */
                b = ro_pass_boundary_import(st, &e, 0, row.traj_uid, refs, si, "tool",
                                            out->pass_uid);
                if (b == ARL_OK) out->from_tool_state++;
                if (b == ARL_ERR_NOT_FOUND) {
                    arl_error_clear();
                    b = ro_pass_boundary_import(st, &e, 0, row.traj_uid, refs, si, "learner",
                                                lpass);
                    if (b == ARL_OK) out->from_learner_state++;
                }
            }
            if (b == ARL_ERR_NOT_FOUND && use_version >= 0) {
                arl_error_clear();
                b = import_boundary(st, &e, row.traj_id, refs[si - 1].seg_index, row.run_id,
                                    use_version);
            }
            if (b == ARL_OK) {
                out->from_state++;
                tainted = 0;
            }
            else if (b == ARL_ERR_NOT_FOUND) {
                arl_error_clear();
                out->recomputed++; /* go on from the state this pass computed */
            } else
                s = b;
            if (s) break;
        } else if (si > 0) {
            out->recomputed++;
        }
        if (ro_engine_slot_pos(&e, slot) != r->ctx_start) {
            s = arl_errorf(ARL_ERR_STATE, "rescore: segment %d starts at context position %lld, the "
                                          "state is at %lld",
                           (int)r->seg_index, (long long)r->ctx_start,
                           (long long)ro_engine_slot_pos(&e, slot));
            break;
        }
        const int64_t T = r->n_tokens;
        /* stored routes of another MoE layout (layer count or top-k): replaying them is
         * impossible, and falling back to the router's own choice would make a --routing
         * replay score a natural one without saying so; with natural routing only the
         * agreement cannot be measured */
        const int other_layout =
            d.n_moe_layers > 0 && d.routes && (d.n_moe_layers != e.n_moe || d.route_k != e.k);
        if (other_layout && !opts->natural_routing) {
            s = arl_errorf(ARL_ERR_CONFIG,
                           "rescore of %s under %s: segment %d's stored routes are for %d MoE "
                           "layers of top-%d, the checkpoint has %lld MoE layers of top-%lld: "
                           "the trajectory was sampled by another model (--routing natural "
                           "scores it without the stored routes)",
                           row.traj_uid, opts->ckpt_dir, (int)r->seg_index, (int)d.n_moe_layers,
                           (int)d.route_k, (long long)e.n_moe, (long long)e.k);
            break;
        }
        if (other_layout) out->routes_other_layout++;
        const int have_routes = d.n_moe_layers == e.n_moe && e.n_moe && d.route_k == e.k &&
                                d.routes;
        const int use_routes = !opts->natural_routing && have_routes;
        int64_t s_rt = 0, s_exl = 0, s_ext = 0; /* this segment's agreement counts */
        double s_ov = 0;
        for (int64_t c0 = 0; s == ARL_OK && c0 < T; c0 += chunk) {
            int64_t c = T - c0 < chunk ? T - c0 : chunk;
            int absent = 0;
            for (int64_t i = 0; i < c; i++) {
                tok[i] = (int32_t)d.tokens[c0 + i];
                tgt[i] = c0 + i + 1 < T ? (int32_t)d.tokens[c0 + i + 1] : -1;
                if ((int64_t)d.tokens[c0 + i] >= e.V) {
                    s = arl_errorf(ARL_ERR_CONFIG,
                                   "rescore of %s under %s: segment %d holds token id %lld, "
                                   "outside the checkpoint's vocabulary [0, %lld): the "
                                   "trajectory was sampled by another model",
                                   row.traj_uid, opts->ckpt_dir, (int)r->seg_index,
                                   (long long)d.tokens[c0 + i], (long long)e.V);
                    break;
                }
            }
            if (s) break;
            if (use_routes)
                for (int64_t l = 0; l < e.n_moe; l++)
                    for (int64_t i = 0; i < c; i++)
                        for (int64_t j = 0; j < e.k; j++) {
                            size_t at = (size_t)((l * T + c0 + i) * e.k + j);
                            int32_t v = d.route_dtype == ARL_BLOB_U8
                                            ? ((const uint8_t *)d.routes)[at]
                                            : ((const uint16_t *)d.routes)[at];
                            const int gap = v == (d.route_dtype == ARL_BLOB_U8 ? 0xFF : 0xFFFF);
                            absent |= gap;
                            forced[(l * c + i) * e.k + j] = v;
                            if (!gap && v >= e.E && s == ARL_OK)
                                s = arl_errorf(ARL_ERR_CONFIG,
                                               "rescore of %s under %s: segment %d's stored "
                                               "route of MoE layer %lld names expert %d, outside "
                                               "the checkpoint's %lld experts: the "
                                               "trajectory was sampled by another model "
                                               "(--routing natural scores it without the "
                                               "stored routes)",
                                               row.traj_uid, opts->ckpt_dir, (int)r->seg_index,
                                               (long long)l, (int)v, (long long)e.E);
                        }
            if (s) break;
            /* The image rows of the <|media_pad|> tokens are not in the segment: they come
             * from the stored observations' PNGs (rollout/media.h).  Where those do not
             * explain the placeholders the tokens run as plain tokens, for the state, and the
             * segment is not compared. */
            int64_t n_ph = 0, n_media = 0;
            for (int64_t i = 0; i < c; i++)
                n_ph += !d.loss_mask[c0 + i] && (int64_t)tok[i] == e.cfg.media_placeholder_token_id;
            if (n_ph > 0) {
                arl_status ms = mrows && !lost ? ro_media_take(&md, d.tokens + c0,
                                                               d.loss_mask + c0, c, mrows,
                                                               &n_media)
                                               : ARL_ERR_NOT_FOUND;
                if (ms == ARL_OK) {
                    out->images += n_ph;
                } else {
                    arl_error_clear();
                    tainted = lost = 1;
                    n_media = 0;
                }
            }
            arl_batch b = {.tokens = tok, .T = c, .N = 1, .targets = tgt,
                           .forced_routes = use_routes && !absent ? forced : NULL,
                           .media = n_media > 0 ? mrows : NULL, .n_media = n_media};
            arl_forward_out fo = {.logprobs = clp, .entropy = cent,
                                  .router_scores = have_routes ? rsc : NULL};
            s = ro_engine_score(&e, &slot, &b, &fo);
            if (s) {
                s = arl_error_prefix(s, "rescore of %s under %s: segment %d", row.traj_uid,
                                     opts->ckpt_dir, (int)r->seg_index);
                break;
            }
            for (int64_t i = 0; i < c; i++)
                if (c0 + i + 1 < T) {
                    lp[r->tok_start + c0 + i + 1] = clp[i];
                    ent[r->tok_start + c0 + i + 1] = cent[i];
                }
            /* router agreement of the tokens whose routes are stored in every layer (with
             * forced routes the scores are those at each layer's replayed input) */
            for (int64_t i = 0; have_routes && i < c; i++) {
                int ok = 1, all = 1;
                for (int64_t l = 0; l < nm && ok; l++)
                    for (int64_t j = 0; j < kk; j++) {
                        size_t at = (size_t)((l * T + c0 + i) * kk + j);
                        int32_t v = d.route_dtype == ARL_BLOB_U8 ? ((const uint8_t *)d.routes)[at]
                                                                : ((const uint16_t *)d.routes)[at];
                        ok &= v != (d.route_dtype == ARL_BLOB_U8 ? 0xFF : 0xFFFF) && v < EE;
                    }
                if (!ok) continue;
                for (int64_t l = 0; l < nm; l++) {
                    for (int64_t j = 0; j < kk; j++) {
                        size_t at = (size_t)((l * T + c0 + i) * kk + j);
                        sr[j] = d.route_dtype == ARL_BLOB_U8 ? ((const uint8_t *)d.routes)[at]
                                                             : ((const uint16_t *)d.routes)[at];
                    }
                    int64_t in = arl_router_overlap(rsc + (l * c + i) * EE, bias[l], EE, kk, sr,
                                                   rws, nat);
                    ovl[(size_t)(l * total + r->tok_start + c0 + i)] = (uint8_t)in;
                    s_ov += (double)in / (double)kk;
                    s_exl += in == kk;
                    all &= in == kk;
                }
                s_rt++;
                s_ext += all;
            }
        }
        if (s) break;
        if (opts->save_states && !tainted) {
            s = save_boundary(opts->save_states, &e, slot, row.traj_uid, r, out->pass_uid,
                              out->version, opts->natural_routing ? "natural" : "replay");
            if (s) break;
            out->states_saved++;
        }
        if (tainted) {
            out->skipped++;
            for (int64_t l = 0; l < nm; l++)
                memset(ovl + (size_t)(l * total + r->tok_start), 0xFF, (size_t)T);
            continue;
        }
        rt += s_rt;
        ov_sum += s_ov;
        ex_layer += s_exl;
        ex_token += s_ext;
        for (int64_t i = 0; i < T; i++) {
            mu[r->tok_start + i] = d.logprobs[i];
            if (!d.loss_mask[i] || i == 0) continue;
            double df = fabs((double)lp[r->tok_start + i] - (double)d.logprobs[i]);
            diffs[nd++] = df;
            sum += df;
            ent_sum += ent[r->tok_start + i];
            if (df > out->max_abs || out->worst_token < 0) {
                out->max_abs = df;
                out->worst_token = r->tok_start + i;
            }
        }
        out->segments++;
    }
    replay_seg_data_free(&d);
    if (s == ARL_OK) {
        out->action_tokens = nd;
        if (nd) {
            out->mean_abs = sum / (double)nd;
            qsort(diffs, (size_t)nd, sizeof *diffs, cmp_double);
            int64_t k = (int64_t)ceil(0.99 * (double)nd) - 1;
            out->p99_abs = diffs[k < 0 ? 0 : k];
        }
        if (logprobs_out) {
            *logprobs_out = lp;
            lp = NULL;
        }
        if (mu_out) {
            *mu_out = mu;
            mu = NULL;
        }
        if (n_out) *n_out = (size_t)total;
        if (nd) out->entropy_mean = ent_sum / (double)nd;
        out->route_tokens = rt;
        if (rt) {
            out->agree_overlap = ov_sum / ((double)rt * (double)nm);
            out->agree_exact_layer = (double)ex_layer / ((double)rt * (double)nm);
            out->agree_exact_token = (double)ex_token / (double)rt;
        }
        if (det) {
            det->entropy = ent;
            det->overlap = ovl;
            det->n_moe = nm;
            det->k = kk;
            ent = NULL;
            ovl = NULL;
        }
    }
    free(lp);
    free(mu);
    free(diffs);
    free(tok);
    free(tgt);
    free(clp);
    free(forced);
    free(cent);
    free(rsc);
    free(rws);
    free(nat);
    free(sr);
    free(bias);
    free(ent);
    free(ovl);
    free(refs);
    free(mrows);
    ro_media_free(&md);
    ro_engine_close(&e);
    return s;
}
