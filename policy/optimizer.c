/* policy/optimizer.c: AdamW, clipping, schedule and the QB hook (see optimizer.h). */
#include "policy/optimizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/threadpool.h"
#include "policy/optimizer_internal.h"
#include "policy/qb.h"

/* ------------------------------------------------------------------------------------ */
/* options                                                                               */

static const arl_option optim_tab[] = {
    {"lr", ARL_OPT_FLOAT, offsetof(arl_optim_config, lr), "3e-4", "peak learning rate", 0, 10, NULL,
     0, "LR"},
    {"beta1", ARL_OPT_FLOAT, offsetof(arl_optim_config, beta1), "0.9", "AdamW first-moment decay",
     0, 0.999999, NULL, 0, NULL},
    {"beta2", ARL_OPT_FLOAT, offsetof(arl_optim_config, beta2), "0.95", "AdamW second-moment decay",
     0, 0.99999999, NULL, 0, NULL},
    {"eps", ARL_OPT_FLOAT, offsetof(arl_optim_config, eps), "1e-8", "AdamW denominator epsilon",
     1e-30, 1, NULL, 0, NULL},
    {"weight-decay", ARL_OPT_FLOAT, offsetof(arl_optim_config, weight_decay), "0.1",
     "decoupled weight decay of matrices (scaled by the learning rate)", 0, 10, NULL, 0, NULL},
    {"clip-norm", ARL_OPT_FLOAT, offsetof(arl_optim_config, clip_norm), "1.0",
     "clip the global gradient norm to this value (0 = no clipping)", 0, 1e30, NULL, 0, NULL},
    {"warmup-steps", ARL_OPT_INT, offsetof(arl_optim_config, warmup_steps), "0",
     "linear learning-rate warmup steps", 0, 1e15, NULL, 0, NULL},
    {"total-steps", ARL_OPT_INT, offsetof(arl_optim_config, total_steps), "0",
     "length of the cosine schedule (0 = the run's number of steps)", 0, 1e15, NULL, 0, NULL},
    {"min-lr-ratio", ARL_OPT_FLOAT, offsetof(arl_optim_config, min_lr_ratio), "0.1",
     "final learning rate as a fraction of lr", 0, 1, NULL, 0, NULL},
    {"qb-method", ARL_OPT_CHOICE, offsetof(arl_optim_config, qb_method), "exact",
     "router bias update per step: exact quantiles (spec 9.2), histogram estimator (9.3) or off", 0,
     0, "exact|histogram|off", 0, NULL},
    {"qb-num-bins", ARL_OPT_INT, offsetof(arl_optim_config, qb_num_bins), "1024",
     "bins of the QB histogram estimator", 1, 1 << 20, NULL, 0, NULL},
    {"qb-band-low", ARL_OPT_FLOAT, offsetof(arl_optim_config, qb_band_low), "0",
     "QB banded targets lambda_lo (spec 9.5; 0 and 0 = plain QB)", 0, 1, NULL, 0, NULL},
    {"qb-band-high", ARL_OPT_FLOAT, offsetof(arl_optim_config, qb_band_high), "0",
     "QB banded targets lambda_hi (spec 9.5)", 0, 1e6, NULL, 0, NULL},
};

const arl_option *arl_optim_options(size_t *n) {
    *n = ARL_OPTIONS_COUNT(optim_tab);
    return optim_tab;
}

arl_status arl_optim_config_defaults(arl_optim_config *c) {
    return arl_options_defaults(optim_tab, ARL_OPTIONS_COUNT(optim_tab), c);
}

void arl_optim_config_free(arl_optim_config *c) {
    if (!c) return;
    arl_options_free(optim_tab, ARL_OPTIONS_COUNT(optim_tab), c);
    c->qb_method = NULL;
}

arl_status arl_optim_config_check(const arl_optim_config *c) {
    if (!(c->beta1 >= 0 && c->beta1 < 1))
        return arl_errorf(ARL_ERR_CONFIG, "key 'beta1': expected a value in [0, 1), got %g",
                          c->beta1);
    if (!(c->beta2 >= 0 && c->beta2 < 1))
        return arl_errorf(ARL_ERR_CONFIG, "key 'beta2': expected a value in [0, 1), got %g",
                          c->beta2);
    if (!(c->eps > 0))
        return arl_errorf(ARL_ERR_CONFIG, "key 'eps': expected a positive value, got %g", c->eps);
    if (!(c->lr >= 0) || !(c->weight_decay >= 0) || !(c->clip_norm >= 0))
        return arl_errorf(ARL_ERR_CONFIG, "keys 'lr', 'weight-decay', 'clip-norm' must be >= 0");
    if (c->warmup_steps < 0 || c->total_steps < 0)
        return arl_errorf(ARL_ERR_CONFIG, "keys 'warmup-steps', 'total-steps' must be >= 0");
    if (c->total_steps > 0 && c->warmup_steps > c->total_steps)
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'warmup-steps': %lld is more than 'total-steps' %lld (the cosine "
                          "phase would never start; lower warmup-steps)",
                          (long long)c->warmup_steps, (long long)c->total_steps);
    if (!(c->min_lr_ratio >= 0 && c->min_lr_ratio <= 1))
        return arl_errorf(ARL_ERR_CONFIG, "key 'min-lr-ratio': expected [0, 1], got %g",
                          c->min_lr_ratio);
    const char *q = c->qb_method ? c->qb_method : "exact";
    if (strcmp(q, "exact") && strcmp(q, "histogram") && strcmp(q, "off"))
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'qb-method': expected exact, histogram or off, got '%s'", q);
    if (c->qb_band_low < 0 || c->qb_band_high < 0)
        return arl_errorf(ARL_ERR_CONFIG, "keys 'qb-band-low', 'qb-band-high' must be >= 0");
    if ((c->qb_band_low > 0 || c->qb_band_high > 0) && strcmp(q, "exact"))
        return arl_errorf(ARL_ERR_CONFIG,
                          "keys 'qb-band-low'/'qb-band-high' (spec 9.5) need qb-method 'exact', "
                          "got '%s'",
                          q);
    if (!strcmp(q, "histogram") && c->qb_num_bins < 1)
        return arl_errorf(ARL_ERR_CONFIG, "key 'qb-num-bins': expected >= 1, got %lld",
                          (long long)c->qb_num_bins);
    return ARL_OK;
}

double arl_optim_lr(const arl_optim_config *c, int64_t s) {
    if (s < 0) s = 0;
    const int64_t W = c->warmup_steps;
    if (s < W) return c->lr * (double)(s + 1) / (double)W;
    if (c->total_steps <= 0) return c->lr;
    int64_t span = c->total_steps - W;
    if (span < 1) span = 1;
    double q = (double)(s - W) / (double)span;
    if (q > 1) q = 1;
    const double r = c->min_lr_ratio;
    return c->lr * (r + (1.0 - r) * 0.5 * (1.0 + cos(M_PI * q)));
}

/* ------------------------------------------------------------------------------------ */
/* per-tensor rule                                                                       */

unsigned arl_optim_tensor_rule(const arl_param_tensor *t) {
    if (t->no_grad) return 0;
    unsigned r = ARL_OPTIM_TRAIN;
    int big = 0;
    for (int i = 0; i < t->rank; i++)
        big += t->shape[i] > 1;
    if (big >= 2 && t->init != ARL_INIT_CONV) r |= ARL_OPTIM_DECAY;
    return r;
}

/* ------------------------------------------------------------------------------------ */
/* state                                                                                 */

arl_status arl_adamw_init(arl_adamw *opt, const arl_model_config *model_cfg,
                          const arl_optim_config *c) {
    memset(opt, 0, sizeof *opt);
    ARL_TRY(arl_optim_config_check(c));
    char *qb = strdup(c->qb_method ? c->qb_method : "exact");
    if (!qb) return arl_errorf(ARL_ERR_NOMEM, "optimizer: out of memory");
    opt->cfg = *c;
    opt->cfg.qb_method = qb;

    arl_status s = arl_model_params_view(&opt->m, model_cfg, NULL);
    if (s) goto fail;
    const arl_param_inventory *inv = &opt->m.inv;
    size_t bytes = (size_t)inv->arena_floats * sizeof(float);
    /* the two moment arenas are refused up front where they do not fit the available memory,
     * and written at once below: calloc's untouched pages would be committed only by the first
     * step, when an overcommitted allocation ends in an out-of-memory kill */
    char what[160];
    snprintf(what, sizeof what, "the two AdamW moment arenas of this config (2 x %lld floats)",
             (long long)inv->arena_floats);
    if ((s = arl_params_memory_check(2 * (uint64_t)bytes, what))) goto fail;
    opt->m_arena = calloc((size_t)inv->arena_floats ? (size_t)inv->arena_floats : 1, sizeof(float));
    opt->v_arena = calloc((size_t)inv->arena_floats ? (size_t)inv->arena_floats : 1, sizeof(float));
    opt->rule = calloc((size_t)inv->n ? (size_t)inv->n : 1, 1);
    if (!opt->m_arena || !opt->v_arena || !opt->rule) {
        s = arl_errorf(ARL_ERR_NOMEM, "optimizer: cannot allocate two moment arenas of %zu bytes",
                       bytes);
        goto fail;
    }
    memset(opt->m_arena, 0, bytes);
    memset(opt->v_arena, 0, bytes);
    arl_model_params_free(&opt->m);
    if ((s = arl_model_params_view(&opt->m, model_cfg, opt->m_arena))) goto fail;
    if ((s = arl_model_params_view(&opt->v, model_cfg, opt->v_arena))) goto fail;

    int64_t nch = 0;
    for (int64_t i = 0; i < inv->n; i++) {
        opt->rule[i] = (uint8_t)arl_optim_tensor_rule(&inv->t[i]);
        if (opt->rule[i] & ARL_OPTIM_TRAIN)
            nch += (inv->t[i].numel + ARL_OPTIM_CHUNK - 1) / ARL_OPTIM_CHUNK;
    }
    opt->chunk = calloc((size_t)(nch ? nch : 1), sizeof *opt->chunk);
    opt->chunk_sumsq = calloc((size_t)(nch ? nch : 1), sizeof *opt->chunk_sumsq);
    if (!opt->chunk || !opt->chunk_sumsq) {
        s = arl_errorf(ARL_ERR_NOMEM, "optimizer: out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < inv->n; i++) {
        if (!(opt->rule[i] & ARL_OPTIM_TRAIN)) continue;
        const arl_param_tensor *t = &inv->t[i];
        for (int64_t b = 0; b < t->numel; b += ARL_OPTIM_CHUNK) {
            arl_optim_chunk *ch = &opt->chunk[opt->n_chunks++];
            ch->tensor = i;
            ch->begin = t->offset + b;
            ch->end = t->offset + (b + ARL_OPTIM_CHUNK < t->numel ? b + ARL_OPTIM_CHUNK : t->numel);
        }
    }
    ARL_ASSERT(opt->n_chunks == nch);
    return ARL_OK;
fail:
    arl_adamw_free(opt);
    return s;
}

void arl_adamw_free(arl_adamw *opt) {
    if (!opt) return;
    arl_model_params_free(&opt->m);
    arl_model_params_free(&opt->v);
    free(opt->m_arena);
    free(opt->v_arena);
    free(opt->rule);
    free(opt->chunk);
    free(opt->chunk_sumsq);
    free(opt->cfg.qb_method);
    memset(opt, 0, sizeof *opt);
}

/* ------------------------------------------------------------------------------------ */
/* norm                                                                                  */

typedef struct norm_ctx {
    const arl_adamw *opt;
    const float *g;
} norm_ctx;

double arl_optim_sumsq(const float *g, int64_t n) {
    double acc = 0;
    for (int64_t i = 0; i < n; i++)
        acc += (double)g[i] * (double)g[i];
    return acc;
}

static void norm_range(void *vctx, int64_t begin, int64_t end) {
    norm_ctx *c = vctx;
    for (int64_t k = begin; k < end; k++) {
        const arl_optim_chunk *ch = &c->opt->chunk[k];
        c->opt->chunk_sumsq[k] = arl_optim_sumsq(c->g + ch->begin, ch->end - ch->begin);
    }
}

double arl_adamw_grad_norm(arl_adamw *opt, const float *grad_arena) {
    norm_ctx c = {opt, grad_arena};
    arl_k_parallel_for(opt->n_chunks, 4, norm_range, &c);
    double total = 0;
    for (int64_t k = 0; k < opt->n_chunks; k++)
        total += opt->chunk_sumsq[k];
    return sqrt(total);
}

/* ------------------------------------------------------------------------------------ */
/* step                                                                                  */

typedef struct step_ctx {
    const arl_adamw *opt;
    float *p;             /* parameter arena */
    const float *g;       /* gradient arena */
    float *m, *v;         /* moment arenas */
    arl_cuda_adamw_hp hp; /* the step's scalars */
} step_ctx;

/* The element update of n floats (the op the CUDA mirror reproduces). */
void arl_optim_update(float *pp, float *mm, float *vv, const float *gg, int64_t n, int32_t decay,
                      const arl_cuda_adamw_hp *c) {
    for (int64_t i = 0; i < n; i++) {
        float g = gg[i] * c->coef;
        float p = pp[i];
        if (decay) p *= c->decay;
        float m = c->beta1 * mm[i] + c->omb1 * g;
        float v = c->beta2 * vv[i] + c->omb2 * (g * g);
        mm[i] = m;
        vv[i] = v;
        float denom = sqrtf(v) * c->inv_sqrt_bc2 + c->eps;
        pp[i] = p - c->step_size * (m / denom);
    }
}

static void step_range(void *vctx, int64_t begin, int64_t end) {
    const step_ctx *c = vctx;
    for (int64_t k = begin; k < end; k++) {
        const arl_optim_chunk *ch = &c->opt->chunk[k];
        const int32_t decay = (c->opt->rule[ch->tensor] & ARL_OPTIM_DECAY) != 0;
        const int64_t b = ch->begin;
        arl_optim_update(c->p + b, c->m + b, c->v + b, c->g + b, ch->end - b, decay, &c->hp);
    }
}

void arl_optim_step_scalars(arl_cuda_adamw_hp *hp, double *coef_out, double *lr_out,
                            const arl_optim_config *c, int64_t step, double norm) {
    double coef = 1.0;
    if (c->clip_norm > 0 && norm > c->clip_norm) coef = c->clip_norm / (norm + 1e-6);
    double lr = arl_optim_lr(c, step);
    double t = (double)(step + 1);
    double bc1 = 1.0 - pow(c->beta1, t);
    double bc2 = 1.0 - pow(c->beta2, t);
    *hp = (arl_cuda_adamw_hp){
        .coef = (float)coef,
        .decay = (float)(1.0 - lr * c->weight_decay),
        .beta1 = (float)c->beta1,
        .beta2 = (float)c->beta2,
        .omb1 = (float)(1.0 - c->beta1),
        .omb2 = (float)(1.0 - c->beta2),
        .step_size = (float)(lr / bc1),
        .inv_sqrt_bc2 = (float)(1.0 / sqrt(bc2)),
        .eps = (float)c->eps,
    };
    *coef_out = coef;
    *lr_out = lr;
}

static int64_t first_nonfinite_tensor(const arl_adamw *opt, const float *g) {
    for (int64_t k = 0; k < opt->n_chunks; k++) {
        const arl_optim_chunk *ch = &opt->chunk[k];
        for (int64_t i = ch->begin; i < ch->end; i++)
            if (!isfinite(g[i])) return ch->tensor;
    }
    return -1;
}

arl_status arl_adamw_step(arl_adamw *opt, arl_model_params *params, const float *grad_arena,
                          arl_optim_report *rep) {
    ARL_ASSERT(params && params->arena && grad_arena);
    ARL_ASSERT(params->inv.arena_floats == opt->m.inv.arena_floats);
    const arl_optim_config *c = &opt->cfg;
    double norm = arl_adamw_grad_norm(opt, grad_arena);
    if (!isfinite(norm)) {
        int64_t ti = first_nonfinite_tensor(opt, grad_arena);
        return arl_errorf(ARL_ERR_RANGE,
                          "optimizer step %lld: the gradient norm is not finite (%g); first "
                          "tensor with a non-finite gradient: %s; the step was skipped and no "
                          "parameter changed",
                          (long long)opt->step, norm, ti >= 0 ? opt->m.inv.t[ti].name : "?");
    }
    double coef, lr;
    step_ctx sc = {
        .opt = opt,
        .p = params->arena,
        .g = grad_arena,
        .m = opt->m_arena,
        .v = opt->v_arena,
    };
    arl_optim_step_scalars(&sc.hp, &coef, &lr, c, opt->step, norm);
    arl_k_parallel_for(opt->n_chunks, 1, step_range, &sc);
    if (rep) {
        rep->grad_norm = norm;
        rep->clip_coef = coef;
        rep->lr = lr;
        rep->step = opt->step;
    }
    opt->step++;
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------ */
/* router scores and the QB hook                                                         */

arl_status arl_router_scores_init(arl_router_scores *rs, const arl_model_config *cfg, int64_t cap,
                                  int64_t n_bins) {
    memset(rs, 0, sizeof *rs);
    const arl_model_dims *D = &cfg->dims;
    rs->L = D->L;
    rs->E = D->E;
    rs->k = D->k;
    rs->cap = cap < 1 ? 1 : cap;
    rs->n_bins = n_bins < 1 ? 1 : n_bins;
    int64_t n_moe = 0;
    rs->is_moe = calloc((size_t)(rs->L ? rs->L : 1), 1);
    rs->m = calloc((size_t)(rs->L ? rs->L : 1), sizeof *rs->m);
    if (!rs->is_moe || !rs->m) goto nomem;
    for (int64_t l = 0; l < rs->L; l++)
        n_moe += rs->is_moe[l] = (uint8_t)arl_model_config_layer_is_moe(cfg, l);
    if (n_moe > 0 && rs->E > 0) {
        /* scores only for every layer index (simple addressing); dense layers' rows unused */
        size_t ns = (size_t)rs->L * (size_t)rs->cap * (size_t)rs->E;
        size_t nsel = (size_t)rs->L * (size_t)rs->cap * (size_t)(rs->k ? rs->k : 1);
        rs->s = malloc(ns * sizeof *rs->s);
        rs->sel = malloc(nsel * sizeof *rs->sel);
        rs->ws = malloc((size_t)arl_qb_ws_floats(rs->cap, rs->E) * sizeof *rs->ws);
        size_t nc = (size_t)rs->E * (size_t)rs->n_bins;
        rs->counts = malloc(nc * sizeof *rs->counts);
        rs->bnew = malloc((size_t)rs->E * sizeof *rs->bnew);
        if (!rs->s || !rs->sel || !rs->ws || !rs->counts || !rs->bnew) goto nomem;
    }
    return ARL_OK;
nomem:
    arl_router_scores_free(rs);
    return arl_errorf(ARL_ERR_NOMEM,
                      "router scores: cannot allocate buffers for %lld tokens x %lld layers",
                      (long long)cap, (long long)cfg->dims.L);
}

void arl_router_scores_free(arl_router_scores *rs) {
    if (!rs) return;
    free(rs->s);
    free(rs->sel);
    free(rs->m);
    free(rs->is_moe);
    free(rs->ws);
    free(rs->counts);
    free(rs->bnew);
    memset(rs, 0, sizeof *rs);
}

void arl_router_scores_reset(arl_router_scores *rs) {
    for (int64_t l = 0; l < rs->L; l++)
        rs->m[l] = 0;
}

arl_status arl_router_scores_append(arl_router_scores *rs, int64_t l, int64_t T, float **s,
                                    int32_t **sel) {
    ARL_ASSERT(l >= 0 && l < rs->L && T >= 0 && rs->is_moe[l] && rs->s);
    if (rs->m[l] + T > rs->cap)
        return arl_errorf(ARL_ERR_FULL,
                          "router scores: layer %lld: %lld + %lld tokens exceed the capacity "
                          "%lld of one step",
                          (long long)l, (long long)rs->m[l], (long long)T, (long long)rs->cap);
    int64_t row = l * rs->cap + rs->m[l];
    *s = rs->s + row * rs->E;
    *sel = rs->sel + row * rs->k;
    rs->m[l] += T;
    return ARL_OK;
}

arl_status arl_qb_update(const arl_optim_config *c, arl_model_params *params,
                         arl_router_scores *rs) {
    const char *method = c->qb_method ? c->qb_method : "exact";
    if (!strcmp(method, "off")) return ARL_OK;
    const int hist = !strcmp(method, "histogram");
    const int band = c->qb_band_low > 0 || c->qb_band_high > 0;
    const int64_t E = rs->E, k = rs->k;
    for (int64_t l = 0; l < rs->L; l++) {
        if (!rs->is_moe[l] || rs->m[l] == 0) continue;
        float *bias = params->layers[l].moe.gate_bias;
        ARL_ASSERT(bias);
        const int64_t m = rs->m[l];
        const float *s = rs->s + l * rs->cap * E;
        /* a non-finite score (a diverged forward) would set the bias from nothing meaningful,
         * and no bias of the layer is moved */
        for (int64_t x = 0; x < m * E; x++)
            if (!isfinite(s[x]))
                return arl_errorf(ARL_ERR_RANGE,
                                  "qb: layer %lld: the router score of token %lld for expert %lld "
                                  "is not finite (%g); the router biases were not updated",
                                  (long long)l, (long long)(x / E), (long long)(x % E),
                                  (double)s[x]);
        arl_status st;
        if (hist) {
            int64_t Nb = c->qb_num_bins;
            if (Nb > rs->n_bins)
                return arl_errorf(ARL_ERR_ARG,
                                  "qb: %lld bins requested, buffers hold %lld (init the router "
                                  "scores with qb-num-bins)",
                                  (long long)Nb, (long long)rs->n_bins);
            float lo, w;
            arl_qb_hist_range(&lo, &w, bias, E, Nb);
            memset(rs->counts, 0, (size_t)(E * Nb) * sizeof *rs->counts);
            arl_qb_hist_count(rs->counts, s, bias, m, E, k, lo, w, Nb, rs->ws);
            /* learner/ would all-reduce counts and m here */
            st = arl_qb_hist_solve(rs->bnew, NULL, rs->counts, m, E, k, lo, w, Nb);
        } else if (band) {
            arl_qb_count_loads(rs->counts, rs->sel + l * rs->cap * k, m, k, E);
            st = arl_qb_band(rs->bnew, NULL, rs->counts, s, bias, m, E, k, (float)c->qb_band_low,
                             (float)c->qb_band_high, rs->ws);
        } else {
            st = arl_qb_exact(rs->bnew, NULL, s, bias, m, E, k, rs->ws);
        }
        if (st) return arl_error_prefix(st, "qb: layer %lld", (long long)l);
        memcpy(bias, rs->bnew, (size_t)E * sizeof *bias);
    }
    return ARL_OK;
}
