/* learner/media.c: the image rows of the learner's passes (learner/update.h, "Images") - each
 * trajectory's observation images loaded from the store through rollout/media.h (the same
 * loading and the same placeholder-to-row rule as re-scoring and resume), encoded by the vision
 * tower under the weights of a pass, placed for the placeholders of one forward, and the
 * gradient of those rows taken back through the vision tower's backward.
 * Not the passes themselves (learner/passes.c) nor image decoding (policy/image.h).
 *
 * Symbols: d text width, Np patches of one observation, Tm tokens of one forward. */
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/log.h"
#include "learner/update_internal.h"
#include "policy/chat.h"
#include "policy/vision.h"
#include "policy/vision_backward.h"
#include "rollout/engine.h"

void lr_media_free(lr_media *m) {
    if (!m) return;
    ro_media_input_free(&m->in);
    ro_media_free(&m->cur);
    free(m->rows);
    free(m->drows);
    free(m);
}

/* Mark t as not trainable for its images: every segment masked, natural routing, its
 * placeholders fed as plain tokens. */
static void media_bad(arl_learner *l, arl_upd_traj *t, const char *why) {
    t->media_bad = 1;
    snprintf(t->media_error, sizeof t->media_error, "%s", why);
    arl_log_warn("learner: trajectory %s: its image placeholders cannot be given image rows "
                 "(%s); none of its segments is trained",
                 t->row.traj_uid, t->media_error);
    for (int32_t j = 0; j < t->n_segs; j++) {
        arl_upd_seg *s = &l->b.segs[t->seg0 + j];
        free(s->media_idx);
        s->media_idx = NULL;
        s->routes_ok = 0;
        free(s->routes);
        s->routes = NULL;
        s->n_fed = s->T;
    }
    lr_media_free(t->media);
    t->media = NULL;
}

arl_status lr_media_load(arl_learner *l, replay_store *st, arl_upd_traj *t) {
    int any = 0;
    for (int32_t j = 0; j < t->n_segs; j++)
        any |= l->b.segs[t->seg0 + j].has_media;
    if (!any) return ARL_OK;
    arl_chat_template tpl;
    ARL_TRY(ro_template_from_config(l->cfg, &tpl));
    lr_media *m = calloc(1, sizeof *m);
    if (!m) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (image inputs)");
    t->media = m;
    arl_status s =
        ro_media_load_input(st, t->traj_id, l->cfg, tpl.image_max_patches, &m->in, &m->cur);
    /* the store or the machine failing is an error of the update; what the store holds (a
     * stored body or image unreadable, ARL_ERR_CORRUPT and the like) masks the trajectory */
    if (s == ARL_ERR_NOMEM || s == ARL_ERR_IO || s == ARL_ERR_DB) return s;
    if (s == ARL_OK && !l->cfg->has_vision)
        s = arl_errorf(ARL_ERR_UNSUPPORTED, "the model has no vision tower");
    if (s) {
        media_bad(l, t, arl_error_msg());
        arl_error_clear();
        return ARL_OK;
    }
    m->n_rows = m->cur.n_rows;
    /* each segment's placeholders in stream order, by the cursor rule of rollout/media.h */
    for (int32_t j = 0; s == ARL_OK && j < t->n_segs; j++) {
        arl_upd_seg *g = &l->b.segs[t->seg0 + j];
        if (g->fresh) ro_media_fresh(&m->cur, (int64_t)g->first_step - 1);
        int64_t n = 0;
        for (int64_t i = 0; i < g->T; i++)
            n += g->tokens[i] == m->cur.media_id;
        if (n == 0) continue;
        g->media_idx = malloc(sizeof(int64_t) * (size_t)n);
        if (!g->media_idx) return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory");
        int64_t got = 0;
        /* ARL_ERR_NOT_FOUND: more placeholders than the stored observations' images */
        s = ro_media_take_index(&m->cur, (const uint32_t *)g->tokens, g->amask, g->T, g->media_idx,
                                &got);
        ARL_ASSERT(s != ARL_OK || got == n);
        if (s == ARL_OK) g->n_media = n;
    }
    if (s) {
        char why[240];
        snprintf(why, sizeof why, "%s", arl_error_msg());
        arl_error_clear();
        media_bad(l, t, why);
        return ARL_OK;
    }
    if (m->n_rows > 0) {
        m->rows = malloc(sizeof(float) * (size_t)(m->n_rows * l->dm.d));
        m->drows = calloc((size_t)(m->n_rows * l->dm.d), sizeof(float));
        if (!m->rows || !m->drows)
            return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (%lld image rows)",
                              (long long)m->n_rows);
    }
    return ARL_OK;
}

arl_status lr_media_prepare(arl_learner *l) {
    if (!l->cfg->has_vision) return ARL_OK;
    int64_t maxNp = 0;
    for (int32_t i = 0; i < l->b.n_trajs; i++)
        if (l->b.trajs[i].media && l->b.trajs[i].media->in.max_Np > maxNp)
            maxNp = l->b.trajs[i].media->in.max_Np;
    if (maxNp == 0) return ARL_OK;
    int64_t need = arl_vision_ws_floats(l->cfg, maxNp);
    const int64_t nb = arl_vision_train_ws_floats(l->cfg, maxNp);
    if (nb > need) need = nb;
    if (need > l->vws_n) {
        free(l->vws);
        l->vws = malloc(sizeof(float) * (size_t)need);
        l->vws_n = l->vws ? need : 0;
        if (!l->vws)
            return arl_errorf(ARL_ERR_NOMEM,
                              "learner: out of memory (vision work buffer of %lld "
                              "floats)",
                              (long long)need);
    }
    return ARL_OK;
}

void lr_media_invalidate(arl_learner *l) {
    for (int32_t i = 0; i < l->b.n_trajs; i++)
        if (l->b.trajs[i].media) l->b.trajs[i].media->key_w = NULL;
}

/* t's rows under (w, step), encoded one observation at a time as the rollout did. */
static arl_status media_rows(arl_learner *l, arl_upd_traj *t, const arl_model_params *w,
                             int64_t step) {
    lr_media *m = t->media;
    if (m->key_w == w && m->key_step == step) return ARL_OK;
    m->key_w = NULL;
    for (int32_t i = 0; i < m->in.n_obs; i++) {
        const ro_media_obs *o = &m->in.obs[i];
        arl_status s = arl_vision_fwd(m->rows + o->row0 * l->dm.d, w, l->cfg, o->patches, o->grids,
                                      o->n_img, l->vws, l->vws_n, NULL);
        if (s)
            return arl_error_prefix(s, "learner: trajectory %s: the images of its observation %d",
                                    t->row.traj_uid, (int)i);
    }
    m->key_w = w;
    m->key_step = step;
    return ARL_OK;
}

/* Append the rows of positions [a, b) of segment sg to l->media at *n. */
static arl_status span_rows(arl_learner *l, int32_t sg, int64_t a, int64_t b,
                            const arl_model_params *w, int64_t step, int64_t *n) {
    const arl_upd_seg *s = &l->b.segs[sg];
    const int32_t id = (int32_t)l->cfg->media_placeholder_token_id;
    int64_t k = 0; /* ordinal of the first placeholder at or after a */
    int any = 0;
    for (int64_t i = 0; i < b; i++)
        if (s->tokens[i] == id) {
            if (i < a)
                k++;
            else
                any = 1;
        }
    if (!any) return ARL_OK;
    arl_upd_traj *t = &l->b.trajs[s->traj];
    const int64_t d = l->dm.d;
    if (s->media_idx && t->media) ARL_TRY(media_rows(l, t, w, step));
    const float *pad = w->embed_tokens + (int64_t)id * d;
    for (int64_t i = a; i < b; i++) {
        if (s->tokens[i] != id) continue;
        ARL_ASSERT(*n < l->media_max);
        const int64_t r = s->media_idx ? s->media_idx[k] : -1;
        k++;
        memcpy(l->media + *n * d, r >= 0 ? t->media->rows + r * d : pad, sizeof(float) * (size_t)d);
        l->media_traj[*n] = s->traj;
        l->media_row[*n] = r;
        (*n)++;
    }
    return ARL_OK;
}

arl_status lr_media_call(arl_learner *l, int64_t p0, int64_t p1, const arl_model_params *w,
                         int64_t step, int64_t *n_media) {
    *n_media = 0;
    if (!l->media) return ARL_OK;
    for (int64_t q = p0; q < p1; q++) {
        const lr_piece *p = &l->pieces[q];
        ARL_TRY(span_rows(l, p->seg, p->a, p->b, w, step, n_media));
    }
    return ARL_OK;
}

arl_status lr_media_span(arl_learner *l, int32_t sg, int64_t a, int64_t b,
                         const arl_model_params *w, int64_t step, int64_t *n_media) {
    *n_media = 0;
    if (!l->media) return ARL_OK;
    return span_rows(l, sg, a, b, w, step, n_media);
}

void lr_media_grad(arl_learner *l, int64_t n_media) {
    const int64_t d = l->dm.d;
    const int32_t id = (int32_t)l->cfg->media_placeholder_token_id;
    for (int64_t j = 0; j < n_media; j++) {
        const float *g = l->dmedia + j * d;
        float *dst;
        if (l->media_row[j] >= 0) {
            lr_media *m = l->b.trajs[l->media_traj[j]].media;
            dst = m->drows + l->media_row[j] * d;
            m->dirty = 1;
        } else {
            dst = l->grads.embed_tokens + (int64_t)id * d;
        }
        for (int64_t c = 0; c < d; c++)
            dst[c] += g[c];
    }
    if (n_media > 0) l->host_grads = 1;
}

arl_status lr_media_backward(arl_learner *l) {
    const int64_t d = l->dm.d;
    for (int32_t i = 0; i < l->b.n_trajs; i++) {
        arl_upd_traj *t = &l->b.trajs[i];
        lr_media *m = t->media;
        if (!m || !m->dirty) continue;
        for (int32_t j = 0; j < m->in.n_obs; j++) {
            const ro_media_obs *o = &m->in.obs[j];
            float *g = m->drows + o->row0 * d;
            const int64_t n = o->Np / 4 * d;
            int64_t nz = 0;
            while (nz < n && g[nz] == 0.0f)
                nz++;
            if (nz == n) continue; /* no gradient reached this observation's rows */
            l->host_grads = 1;
            arl_status s = arl_vision_bwd(&l->grads, NULL, g, l->in.params, l->cfg, o->patches,
                                          o->grids, o->n_img, l->vws, l->vws_n);
            if (s)
                return arl_error_prefix(s,
                                        "learner: trajectory %s: vision backward of its "
                                        "observation %d",
                                        t->row.traj_uid, (int)j);
            memset(g, 0, sizeof(float) * (size_t)n);
        }
        m->dirty = 0;
    }
    return ARL_OK;
}
