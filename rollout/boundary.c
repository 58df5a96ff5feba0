/* rollout/boundary.c: slot state -> kda_boundary and mla_segment states (see boundary.h). */
#include "rollout/boundary.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/blob.h"
#include "rollout/rescore.h"

/* Rows of one latent blob of width R (f32) under the 64 MiB chunk limit. */
static int64_t latent_rows_per_chunk(int64_t R) {
    int64_t r = (int64_t)((ARL_BLOB_MAX_BYTES - ARL_BLOB_HEADER_SIZE) / (uint64_t)(R * 4));
    return r > 0 ? r : 1;
}

arl_status ro_boundary_put_state(replay_writer *w, const arl_model_config *cfg,
                                 const char *cfg_hash, const char *numerics,
                                 const arl_decode_state *ds, int32_t slot,
                                 const replay_state_desc *id, int64_t seg_ctx_start, int64_t seg_n,
                                 int64_t seg_vmin, int64_t seg_vmax, int64_t *end_id,
                                 int64_t *lat_id) {
    *end_id = *lat_id = -1;
    const arl_model_dims *dm = &cfg->dims;
    const int64_t pos = arl_decode_state_position(ds, slot);
    if (pos != seg_ctx_start + seg_n)
        return arl_errorf(ARL_ERR_INTERNAL,
                          "%s segment %d: decode position %lld, the segment ends at %lld",
                          id->traj_uid, (int)id->seg_index, (long long)pos,
                          (long long)(seg_ctx_start + seg_n));
    const int64_t R = dm->rkv + dm->r, rpc = latent_rows_per_chunk(R);
    size_t n_lat = dm->n_mla ? (size_t)dm->n_mla * (size_t)((seg_n + rpc - 1) / rpc) : 0;
    replay_state_chunk *ch = calloc((size_t)(2 * dm->n_kda) + n_lat + 1, sizeof *ch);
    if (!ch) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory for the state chunks", id->traj_uid);
    size_t n = 0;
    for (int64_t l = 0; l < dm->L; l++) {
        if (arl_model_config_layer_kind(cfg, l) != ARL_LAYER_KDA) continue;
        ch[n++] = (replay_state_chunk){.layer = (int32_t)l, .tensor = "S",
                                       .kind = ARL_BLOB_KDA_STATE, .dtype = ARL_BLOB_F32, .ndim = 3,
                                       .dims = {(uint64_t)dm->H, (uint64_t)dm->dk, (uint64_t)dm->dv},
                                       .data = arl_decode_state_kda_S(ds, slot, l)};
        ch[n++] = (replay_state_chunk){.layer = (int32_t)l, .tensor = "conv",
                                       .kind = ARL_BLOB_CONV_TAIL, .dtype = ARL_BLOB_F32, .ndim = 3,
                                       .dims = {3, (uint64_t)dm->P, (uint64_t)(dm->W - 1)},
                                       .data = arl_decode_state_kda_conv(ds, slot, l)};
    }
    replay_state_desc sd = *id;
    sd.kind = "kda_boundary";
    sd.numerics = numerics;
    sd.model_config_sha256 = cfg_hash;
    sd.ctx_start = 0;
    sd.n_tokens = pos;
    arl_status st = replay_state_put(w, &sd, ch, n, end_id);
    if (st == ARL_OK) {
        n = 0;
        for (int64_t l = 0; l < dm->L; l++) {
            if (arl_model_config_layer_kind(cfg, l) != ARL_LAYER_MLA) continue;
            const float *lat = arl_decode_state_latent(ds, slot, l);
            for (int64_t r0 = 0; r0 < seg_n; r0 += rpc) {
                int64_t rows = seg_n - r0 < rpc ? seg_n - r0 : rpc;
                ch[n++] = (replay_state_chunk){.layer = (int32_t)l, .tensor = "latent",
                                               .row_start = r0, .kind = ARL_BLOB_MLA_LATENT,
                                               .dtype = ARL_BLOB_F32, .ndim = 2,
                                               .dims = {(uint64_t)rows, (uint64_t)R},
                                               .data = lat + (seg_ctx_start + r0) * R};
            }
        }
        sd.kind = "mla_segment";
        sd.version_min = seg_vmin;
        sd.version_max = seg_vmax;
        sd.ctx_start = seg_ctx_start;
        sd.n_tokens = seg_n;
        st = replay_state_put(w, &sd, ch, n, lat_id);
    }
    free(ch);
    return st;
}

arl_status ro_boundary_put(replay_writer *w, const ro_engine *e, int32_t slot,
                           const replay_state_desc *id, int64_t seg_ctx_start, int64_t seg_n,
                           int64_t seg_vmin, int64_t seg_vmax, int64_t *end_id, int64_t *lat_id) {
    return ro_boundary_put_state(w, &e->cfg, e->cfg_hash, e->numerics, &e->st, slot, id,
                                 seg_ctx_start, seg_n, seg_vmin, seg_vmax, end_id, lat_id);
}

arl_status ro_boundary_at_version(replay_store *st, const replay_state_data *parts, size_t np,
                                  int64_t run_id, int64_t version, int *yes) {
    *yes = 1;
    const char *seen = NULL; /* the last trajectory found in run_id */
    for (size_t i = 0; *yes && i < np; i++) {
        const replay_state_data *p = &parts[i];
        *yes = p->version_min == version && p->version_max == version;
        if (!*yes || (seen && !strcmp(seen, p->traj_uid))) continue;
        replay_traj_row t;
        ARL_TRY(replay_traj_get(st, p->traj_uid, &t));
        *yes = t.run_id == run_id;
        seen = p->traj_uid;
    }
    return ARL_OK;
}

arl_status ro_states_touch(replay_writer *w, const replay_state_data *parts, size_t np) {
    int64_t ids[64]; /* a boundary: its kda_boundary and the mla_segment states since the last
                        fresh start; more are touched in batches */
    size_t n = 0;
    const int32_t own = replay_writer_shard_id(w);
    for (size_t i = 0; i < np; i++) {
        if (parts[i].shard_id != own) continue;
        ids[n++] = parts[i].state_id;
        if (n == sizeof ids / sizeof ids[0]) {
            ARL_TRY(replay_states_touch(w, ids, n));
            n = 0;
        }
    }
    return replay_states_touch(w, ids, n);
}

arl_status ro_boundary_import_parts(ro_engine *e, int32_t slot, replay_state_data *parts, size_t np,
                                    arl_status s) {
    uint8_t *buf = NULL;
    size_t len = 0;
    if (s == ARL_OK)
        s = arl_rollout_state_assemble(&e->cfg, e->cfg_hash, e->numerics, parts, np, &buf, &len);
    replay_boundary_free(parts, np);
    if (s == ARL_OK) {
        s = ro_engine_slot_import(e, slot, buf, len);
        if (s) s = arl_error_prefix(ARL_ERR_NOT_FOUND, "importing the cached boundary");
    }
    free(buf);
    return s;
}

arl_status ro_pass_boundary_import(replay_store *st, ro_engine *e, int32_t slot,
                                   const char *traj_uid, const replay_seg_ref *refs, size_t si,
                                   const char *producer, const char *pass) {
    size_t f = si - 1;
    while (f > 0 && strcmp(refs[f].start_kind, "fresh"))
        f--;
    size_t np = 1 + (si - f);
    replay_state_data *parts = calloc(np, sizeof *parts);
    if (!parts) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", traj_uid);
    arl_status s = replay_state_find(st, traj_uid, refs[si - 1].seg_index, "kda_boundary", producer,
                                     pass, &parts[0]);
    for (size_t j = f; s == ARL_OK && j < si; j++)
        s = replay_state_find(st, traj_uid, refs[j].seg_index, "mla_segment", producer, pass,
                              &parts[1 + j - f]);
    return ro_boundary_import_parts(e, slot, parts, np, s);
}

void ro_pass_uid(const char *producer, const char *wsha, int natural, int64_t sparse_topk,
                 int64_t sparse_chunk, char *out, size_t cap) {
    snprintf(out, cap, "%s:%.32s:%s:mla%lld/%lld", strcmp(producer, "tool") ? producer : "rescore",
             wsha, natural ? "natural" : "replay", (long long)sparse_topk,
             (long long)(sparse_topk > 0 ? sparse_chunk : 0));
}
