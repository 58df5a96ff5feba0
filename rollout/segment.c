/* rollout/segment.c: the open segment of a trajectory (per-token arrays growing in blocks, the
 * rows committed with it) and the boundary rules of spec/objective.md 3.2 as one pure function.
 * Not the commit itself (rollout/commit.c). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rollout/internal.h"

int64_t ro_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double ro_mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double ro_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- owned strings ---- */

char *ro_strs_take(ro_strs *p, char *s) {
    if (!s) return NULL;
    if (p->n == p->cap) {
        size_t c = p->cap ? 2 * p->cap : 32;
        char **v = realloc(p->v, c * sizeof *v);
        if (!v) {
            free(s);
            return NULL;
        }
        p->v = v;
        p->cap = c;
    }
    p->v[p->n++] = s;
    return s;
}

char *ro_strs_dup(ro_strs *p, const char *s, size_t len) {
    if (!s) return NULL;
    char *c = malloc(len + 1);
    if (!c) return NULL;
    memcpy(c, s, len);
    c[len] = 0;
    return ro_strs_take(p, c);
}

char *ro_strs_cstr(ro_strs *p, const char *s) { return s ? ro_strs_dup(p, s, strlen(s)) : NULL; }

void ro_strs_free(ro_strs *p) {
    for (size_t i = 0; i < p->n; i++)
        free(p->v[i]);
    p->n = 0;
}

/* ---- the segment ---- */

void ro_seg_free(ro_seg *s) {
    if (!s) return;
    free(s->tokens);
    free(s->logprobs);
    free(s->mask);
    free(s->versions);
    free(s->routes);
    free(s->turns);
    free(s->calls);
    free(s->tools);
    free(s->rewards);
    ro_strs_free(&s->strs);
    free(s->strs.v);
    memset(s, 0, sizeof *s);
}

void ro_seg_reset(ro_seg *s, int32_t seg_index, const char *start_kind, int32_t first_step,
                  int64_t tok_start, int64_t ctx_start) {
    s->seg_index = seg_index;
    s->start_kind = start_kind;
    s->first_step = first_step;
    s->last_step = first_step - 1;
    s->tok_start = tok_start;
    s->ctx_start = ctx_start;
    s->n = 0;
    s->n_action = 0;
    s->vmin = s->vmax = -1;
    s->n_turns = s->n_calls = s->n_tools = s->n_rewards = 0;
    ro_strs_free(&s->strs);
}

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

arl_status ro_seg_append(ro_seg *s, const int32_t *ids, int64_t n, int action, int64_t *at) {
    if (s->n + n > s->cap) {
        int64_t c = s->cap ? s->cap : 1024;
        while (c < s->n + n) c *= 2;
        uint32_t *t = realloc(s->tokens, sizeof(uint32_t) * (size_t)c);
        if (t) s->tokens = t;
        float *l = realloc(s->logprobs, sizeof(float) * (size_t)c);
        if (l) s->logprobs = l;
        uint8_t *m = realloc(s->mask, (size_t)c);
        if (m) s->mask = m;
        uint32_t *v = realloc(s->versions, sizeof(uint32_t) * (size_t)c);
        if (v) s->versions = v;
        uint8_t *r = s->rk ? realloc(s->routes, (size_t)c * (size_t)s->rk * (size_t)s->route_bytes)
                           : s->routes;
        if (r) s->routes = r;
        if (!t || !l || !m || !v || (s->rk && !r))
            return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory (segment of %lld tokens)",
                              (long long)c);
        s->cap = c;
    }
    for (int64_t i = 0; i < n; i++) {
        s->tokens[s->n + i] = (uint32_t)ids[i];
        s->logprobs[s->n + i] = 0.0f;
        s->mask[s->n + i] = action ? 1 : 0;
        s->versions[s->n + i] = 0;
    }
    if (s->rk)
        memset(s->routes + (size_t)s->n * (size_t)s->rk * (size_t)s->route_bytes, 0xFF,
               (size_t)n * (size_t)s->rk * (size_t)s->route_bytes);
    if (action) s->n_action += n;
    if (at) *at = s->n;
    s->n += n;
    return ARL_OK;
}

void ro_seg_set_routes(ro_seg *s, int64_t at, int64_t n, const int32_t *routes, int64_t T,
                       int64_t row0, int64_t n_moe, int64_t k) {
    if (!s->rk) return;
    for (int64_t i = 0; i < n; i++) {
        for (int64_t l = 0; l < n_moe; l++) {
            const int32_t *src = routes + (l * T + row0 + i) * k;
            size_t base = ((size_t)(at + i) * (size_t)s->rk + (size_t)(l * k));
            if (s->route_bytes == 1)
                for (int64_t j = 0; j < k; j++)
                    s->routes[base + (size_t)j] = (uint8_t)src[j];
            else
                for (int64_t j = 0; j < k; j++) {
                    uint16_t v = (uint16_t)src[j];
                    memcpy(s->routes + 2 * (base + (size_t)j), &v, 2);
                }
        }
    }
}

arl_status ro_seg_add_turn(ro_seg *s, const replay_turn *t, replay_turn **out) {
    if (grow((void **)&s->turns, &s->cap_turns, s->n_turns + 1, sizeof *t))
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    s->turns[s->n_turns] = *t;
    if (out) *out = &s->turns[s->n_turns];
    s->n_turns++;
    return ARL_OK;
}

replay_turn *ro_seg_find_turn(ro_seg *s, int32_t step) {
    for (size_t i = 0; i < s->n_turns; i++)
        if (s->turns[i].step_index == step) return &s->turns[i];
    return NULL;
}

arl_status ro_seg_add_call(ro_seg *s, const replay_env_call *c) {
    if (grow((void **)&s->calls, &s->cap_calls, s->n_calls + 1, sizeof *c))
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    s->calls[s->n_calls++] = *c;
    return ARL_OK;
}

arl_status ro_seg_add_tool(ro_seg *s, const replay_tool_call *t) {
    if (grow((void **)&s->tools, &s->cap_tools, s->n_tools + 1, sizeof *t))
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    s->tools[s->n_tools++] = *t;
    return ARL_OK;
}

arl_status ro_seg_add_reward(ro_seg *s, const replay_reward *r) {
    if (grow((void **)&s->rewards, &s->cap_rewards, s->n_rewards + 1, sizeof *r))
        return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    s->rewards[s->n_rewards++] = *r;
    return ARL_OK;
}

/* ---- spec/objective.md 3.2 ---- */

void ro_step_rules(const ro_limits *L, const ro_step_facts *f, ro_step_outcome *o) {
    memset(o, 0, sizeof *o);
    /* 1. episode end */
    if (f->terminated || f->truncated) {
        o->kind = RO_END;
        o->end_cause = f->terminated ? "terminated" : "env_truncated";
        return;
    }
    /* 2. turn budget */
    if (f->k >= L->K_max) {
        o->kind = RO_END;
        o->end_cause = "turn_budget";
        return;
    }
    /* episode wall clock (spec/aep.md 11.5), checked between turns */
    if (f->wall_expired) {
        o->kind = RO_END;
        o->end_cause = "wall_clock";
        return;
    }
    /* 3. observation size: an appended observation's messages against L_obs, a fresh context
     * (its rendering and the generation prompt) against L_seg - L_turn */
    if ((!f->reset && f->obs_tokens > L->L_obs) ||
        (f->reset && f->e_len > L->L_seg - L->L_turn)) {
        o->kind = RO_MASK;
        o->mask_code = "OBSERVATION_TOO_LONG";
        return;
    }
    int64_t n_ctx, n_seg;
    if (f->reset) { /* 4 */
        o->kind = RO_BOUNDARY;
        o->boundary_cause = "env_reset";
        o->next_fresh = 1;
        n_ctx = n_seg = f->e_len;
    } else if (f->template_break) { /* 5 */
        o->kind = RO_BOUNDARY;
        o->boundary_cause = "template_break";
        o->next_fresh = 1;
        n_ctx = n_seg = f->e_len;
    } else if (f->n_seg + f->e_len + L->L_turn > L->L_seg) { /* 6 */
        o->kind = RO_BOUNDARY;
        o->boundary_cause = "token_budget";
        n_ctx = f->n_ctx + f->e_len;
        n_seg = f->e_len;
    } else { /* 7 */
        o->kind = RO_APPEND;
        n_ctx = f->n_ctx + f->e_len;
        n_seg = f->n_seg + f->e_len;
    }
    (void)n_seg;
    /* 8. context budget; a boundary of 4-6 is then discarded */
    if (n_ctx + L->L_turn > L->L_ctx || f->n_total + f->e_len + L->L_turn > L->L_traj) {
        o->kind = RO_END;
        o->end_cause = "context_budget";
        o->boundary_cause = NULL;
        o->next_fresh = 0;
    }
}
