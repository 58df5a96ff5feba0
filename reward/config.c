/* reward/config.c: the reward side of the objective's configuration -- defaults
 * (spec/objective.md section 13), the option table and its resolution into arl_reward_config,
 * including the per-level component lists "name=weight[:form]".
 * Not here: the math (reward/advantage.c), the loss and KL options (learner/). */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "reward/reward.h"

const char *arl_reward_level_name(arl_reward_level l) {
    switch (l) {
    case ARL_REWARD_LEVEL_OUTCOME:
        return "outcome";
    case ARL_REWARD_LEVEL_SEGMENT:
        return "segment";
    case ARL_REWARD_LEVEL_PROCESS:
        return "process";
    default:
        return "?";
    }
}

void arl_reward_config_default(arl_reward_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->w[ARL_REWARD_LEVEL_OUTCOME] = 1.0;
    cfg->w[ARL_REWARD_LEVEL_SEGMENT] = 0.5;
    cfg->w[ARL_REWARD_LEVEL_PROCESS] = 0.5;
    cfg->gamma_segment = 1.0;
    cfg->gamma_process = 0.95;
    cfg->process_form = ARL_REWARD_FORM_SUM;
    cfg->process_baseline = ARL_REWARD_PB_TURN_INDEX;
    cfg->segment_baseline = ARL_REWARD_SB_LOO;
    cfg->mc_forks = 4;
    cfg->norm[ARL_REWARD_LEVEL_OUTCOME] = ARL_REWARD_NORM_NONE;
    cfg->norm[ARL_REWARD_LEVEL_SEGMENT] = ARL_REWARD_NORM_BATCH;
    cfg->norm[ARL_REWARD_LEVEL_PROCESS] = ARL_REWARD_NORM_BATCH;
    cfg->sigma_min = 1e-6;
    cfg->kl_scope = ARL_REWARD_KL_TRAJECTORY;
}

int32_t arl_reward_config_ncols(const arl_reward_config *cfg, arl_reward_level l) {
    return cfg->n_comp[l] > 0 ? cfg->n_comp[l] : 1;
}

void arl_reward_config_set_source(arl_reward_config *cfg, const char *name, int source_model) {
    for (int32_t c = 0; c < cfg->n_comp[ARL_REWARD_LEVEL_PROCESS]; c++) {
        arl_reward_component *k = &cfg->comp[ARL_REWARD_LEVEL_PROCESS][c];
        if (k->form == ARL_REWARD_FORM_AUTO && !strcmp(k->name, name))
            k->form = source_model ? ARL_REWARD_FORM_MIN : ARL_REWARD_FORM_SUM;
    }
}

/* The check of arl_reward_config_check_info on a parsed reward_components array (NULL or not
 * an array: nothing to check). */
static arl_status check_declared(const arl_reward_config *cfg, const char *env, const json_t *arr) {
    if (!json_is_array(arr)) return ARL_OK;
    for (int l = 0; l < ARL_REWARD_NLEVELS; l++) {
        const char *ln = arl_reward_level_name((arl_reward_level)l);
        for (int32_t c = 0; c < cfg->n_comp[l]; c++) {
            const char *name = cfg->comp[l][c].name;
            char declared[256] = "", other[32] = "";
            size_t n = 0;
            int found = 0;
            for (size_t i = 0; i < json_array_size(arr); i++) {
                const json_t *e = json_array_get(arr, i);
                const char *en = json_string_value(json_object_get(e, "name"));
                const char *el = json_string_value(json_object_get(e, "level"));
                if (!en || !el) continue;
                if (!strcmp(el, ln)) {
                    if (!strcmp(en, name)) found = 1;
                    if (n < sizeof declared) {
                        int k =
                            snprintf(declared + n, sizeof declared - n, "%s%s", n ? ", " : "", en);
                        n += k > 0 ? (size_t)k : 0;
                    }
                } else if (!strcmp(en, name)) {
                    snprintf(other, sizeof other, "%s", el);
                }
            }
            if (found) continue;
            return arl_errorf(ARL_ERR_CONFIG,
                              "key 'learner.%s-components': %s declares no %s component '%s' "
                              "(%s%s%sits %s components: %s): a component it does not declare "
                              "would count as 0 in every trajectory",
                              ln, env ? env : "the environment", ln, name,
                              other[0] ? "it is declared at the " : "", other,
                              other[0] ? " level; " : "", ln, n ? declared : "none");
        }
    }
    return ARL_OK;
}

arl_status arl_reward_config_check_info(const arl_reward_config *cfg, const char *env,
                                        const char *info_json) {
    json_error_t je;
    json_t *j = info_json ? arl_json_loads(info_json, 0, &je) : NULL;
    if (!j && info_json && arl_json_error_nomem(&je))
        return arl_errorf(ARL_ERR_NOMEM, "reward: out of memory reading the environment's "
                                         "reward_components");
    arl_status s = check_declared(cfg, env, j ? json_object_get(j, "reward_components") : NULL);
    json_decref(j);
    return s;
}

arl_status arl_reward_sources_from_info(const arl_reward_config *cfg, const char *info_json,
                                        uint8_t flags[ARL_REWARD_MAX_COMPONENTS]) {
    memset(flags, 0, ARL_REWARD_MAX_COMPONENTS);
    json_error_t je;
    json_t *j = info_json ? arl_json_loads(info_json, 0, &je) : NULL;
    if (!j && info_json && arl_json_error_nomem(&je)) /* not "no model sources": ours */
        return arl_errorf(ARL_ERR_NOMEM, "reward: out of memory reading the environment's "
                                         "reward_components");
    json_t *arr = j ? json_object_get(j, "reward_components") : NULL;
    const char *env =
        j ? json_string_value(json_object_get(json_object_get(j, "env"), "name")) : NULL;
    arl_status s = check_declared(cfg, env, arr);
    if (s) {
        json_decref(j);
        return s;
    }
    for (size_t i = 0; json_is_array(arr) && i < json_array_size(arr); i++) {
        const json_t *e = json_array_get(arr, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *level = json_string_value(json_object_get(e, "level"));
        const char *src = json_string_value(json_object_get(e, "source"));
        if (!name || !level || !src || strcmp(level, "process") || strcmp(src, "model")) continue;
        for (int32_t c = 0; c < cfg->n_comp[ARL_REWARD_LEVEL_PROCESS]; c++)
            if (!strcmp(cfg->comp[ARL_REWARD_LEVEL_PROCESS][c].name, name)) flags[c] = 1;
    }
    json_decref(j);
    return ARL_OK;
}

/* ---- option table ---- */

#define OFF(f) offsetof(arl_reward_opts, f)
const arl_option arl_reward_options[] = {
    {"w-outcome", ARL_OPT_FLOAT, OFF(w_outcome), "1.0",
     "weight w_O of the outcome advantage (0: level not used)", 0, 1e6, NULL, 0, "W"},
    {"w-segment", ARL_OPT_FLOAT, OFF(w_segment), "0.5",
     "weight w_S of the segment advantage (0: level not used)", 0, 1e6, NULL, 0, "W"},
    {"w-process", ARL_OPT_FLOAT, OFF(w_process), "0.5",
     "weight w_P of the process advantage (0: level not used)", 0, 1e6, NULL, 0, "W"},
    {"gamma-segment", ARL_OPT_FLOAT, OFF(gamma_segment), "1.0",
     "segment discount gamma_S of the segment return-to-go", 0, 1, NULL, 0, "G"},
    {"gamma-process", ARL_OPT_FLOAT, OFF(gamma_process), "0.95",
     "process discount gamma_P (sum form)", 0, 1, NULL, 0, "G"},
    {"process-form", ARL_OPT_CHOICE, OFF(process_form), "sum",
     "return-to-go form of the scalar process reward (no components)", 0, 0, "sum|min", 0, NULL},
    {"process-baseline", ARL_OPT_CHOICE, OFF(process_baseline), "turn_index",
     "process baseline: leave-one-out by turn index, or anchor groups first", 0, 0,
     "turn_index|anchor", 0, NULL},
    {"segment-baseline", ARL_OPT_CHOICE, OFF(segment_baseline), "loo",
     "segment baseline: leave-one-out, or the mean return of the Monte-Carlo forks (mc-forks) at "
     "the segment's start where it has finished ones",
     0, 0, "loo|mc", 0, NULL},
    {"mc-forks", ARL_OPT_INT, OFF(mc_forks), "4",
     "segment-baseline mc: continuations forked under the current policy at each inner segment "
     "boundary of every trained trajectory (spec/objective.md 5.3), never trained on; they "
     "start from the rollout's boundary states (kept until they are made under state-cache "
     "last)",
     1, 64, NULL, 0, "M"},
    {"norm-outcome", ARL_OPT_CHOICE, OFF(norm_outcome), "none",
     "normalisation scope of the outcome advantage", 0, 0, "none|batch|group", 0, NULL},
    {"norm-segment", ARL_OPT_CHOICE, OFF(norm_segment), "batch",
     "normalisation scope of the segment advantage", 0, 0, "none|batch|group", 0, NULL},
    {"norm-process", ARL_OPT_CHOICE, OFF(norm_process), "batch",
     "normalisation scope of the process advantage", 0, 0, "none|batch|group", 0, NULL},
    {"sigma-min", ARL_OPT_FLOAT, OFF(sigma_min), "1e-6",
     "no division by a standard deviation below this", 0, 1e6, NULL, 0, "S"},
    {"kl-rtg-scope", ARL_OPT_CHOICE, OFF(kl_rtg_scope), "trajectory",
     "KL return-to-go to the trajectory end (unbiased) or the segment end", 0, 0,
     "trajectory|segment", 0, NULL},
    {"outcome-components", ARL_OPT_LIST, OFF(outcome_components), NULL,
     "outcome component weight (repeatable; none given: the scalar reward; an entry none drops "
     "the entries before it)",
     0, 0, NULL, 0, "NAME=W"},
    {"segment-components", ARL_OPT_LIST, OFF(segment_components), NULL,
     "segment component weight (repeatable; none given: the scalar reward; an entry none drops "
     "the entries before it)",
     0, 0, NULL, 0, "NAME=W"},
    {"process-components", ARL_OPT_LIST, OFF(process_components), NULL,
     "process component weight and form (repeatable; form auto: min for source model, else "
     "sum; none given: the scalar reward; an entry none drops the entries before it)",
     0, 0, NULL, 0, "NAME=W[:sum|min|auto]"},
};
#undef OFF
const size_t arl_reward_options_count = sizeof arl_reward_options / sizeof arl_reward_options[0];

static int choice_index(const char *v, const char *const *words, int n) {
    for (int i = 0; i < n; i++)
        if (v && !strcmp(v, words[i])) return i;
    return -1;
}

static arl_status parse_choice(const char *opt, const char *v, const char *const *words, int n,
                               int *out) {
    int i = choice_index(v, words, n);
    if (i < 0)
        return arl_errorf(ARL_ERR_CONFIG, "option '%s': unknown value '%s'", opt, v ? v : "(null)");
    *out = i;
    return ARL_OK;
}

static int valid_name(const char *s, size_t n) {
    if (n == 0 || n > ARL_REWARD_NAME_BYTES) return 0;
    if (!(s[0] >= 'a' && s[0] <= 'z')) return 0;
    for (size_t i = 1; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return 0;
    }
    return 1;
}

/* The entries of a component list in order: "NAME=WEIGHT[:FORM]" adds a component; "none"
 * drops the ones before it (the list read so far: the experiment file's, then each --set
 * entry's), so "--set learner.process-components=none" trains on the scalar reward and a
 * following --set entry starts a new list. */
static arl_status parse_components(const char *opt, const arl_strlist *l, arl_reward_level lev,
                                   arl_reward_config *cfg) {
    int first = 0; /* entries before the last "none" are dropped */
    for (int i = 0; i < l->n; i++)
        if (!strcmp(l->v[i], "none")) first = i + 1;
    if (l->n - first > ARL_REWARD_MAX_COMPONENTS)
        return arl_errorf(ARL_ERR_CONFIG, "option '%s': %d components, at most %d are supported",
                          opt, l->n - first, ARL_REWARD_MAX_COMPONENTS);
    for (int k = first; k < l->n; k++) {
        const int i = k - first;
        const char *e = l->v[k];
        const char *eq = strchr(e, '=');
        if (!eq || !valid_name(e, (size_t)(eq - e)))
            return arl_errorf(ARL_ERR_CONFIG,
                              "option '%s': entry '%s': expected NAME=WEIGHT with NAME matching "
                              "[a-z][a-z0-9_]{0,63}",
                              opt, e);
        arl_reward_component *c = &cfg->comp[lev][i];
        memcpy(c->name, e, (size_t)(eq - e));
        c->name[eq - e] = '\0';
        char *end = NULL;
        double w = strtod(eq + 1, &end);
        if (end == eq + 1 || !isfinite(w))
            return arl_errorf(ARL_ERR_CONFIG,
                              "option '%s': entry '%s': weight is not a finite "
                              "number",
                              opt, e);
        c->weight = w;
        c->form = ARL_REWARD_FORM_AUTO;
        if (*end == ':') {
            if (lev != ARL_REWARD_LEVEL_PROCESS)
                return arl_errorf(ARL_ERR_CONFIG,
                                  "option '%s': entry '%s': a form is only "
                                  "allowed for process components",
                                  opt, e);
            static const char *const forms[] = {"auto", "sum", "min"};
            int f = choice_index(end + 1, forms, 3);
            if (f < 0)
                return arl_errorf(ARL_ERR_CONFIG,
                                  "option '%s': entry '%s': form must be "
                                  "sum, min or auto",
                                  opt, e);
            c->form = (arl_reward_form)f;
        } else if (*end) {
            return arl_errorf(ARL_ERR_CONFIG,
                              "option '%s': entry '%s': unexpected text after "
                              "the weight",
                              opt, e);
        }
        for (int j = 0; j < i; j++)
            if (!strcmp(cfg->comp[lev][j].name, c->name))
                return arl_errorf(ARL_ERR_CONFIG,
                                  "option '%s': component '%s' given twice (a --set entry adds "
                                  "to the experiment file's list; an entry 'none' first drops "
                                  "the entries before it)",
                                  opt, c->name);
    }
    cfg->n_comp[lev] = l->n - first;
    return ARL_OK;
}

arl_status arl_reward_config_from_opts(const arl_reward_opts *o, arl_reward_config *cfg) {
    arl_reward_config_default(cfg);
    cfg->w[ARL_REWARD_LEVEL_OUTCOME] = o->w_outcome;
    cfg->w[ARL_REWARD_LEVEL_SEGMENT] = o->w_segment;
    cfg->w[ARL_REWARD_LEVEL_PROCESS] = o->w_process;
    cfg->gamma_segment = o->gamma_segment;
    cfg->gamma_process = o->gamma_process;
    cfg->sigma_min = o->sigma_min;
    for (int l = 0; l < ARL_REWARD_NLEVELS; l++)
        if (!(cfg->w[l] >= 0) || !isfinite(cfg->w[l]))
            return arl_errorf(ARL_ERR_CONFIG, "option 'w-%s': expected a finite weight >= 0",
                              arl_reward_level_name((arl_reward_level)l));
    if (!(o->gamma_segment >= 0 && o->gamma_segment <= 1))
        return arl_errorf(ARL_ERR_CONFIG, "option 'gamma-segment': expected a value in [0, 1]");
    if (!(o->gamma_process >= 0 && o->gamma_process <= 1))
        return arl_errorf(ARL_ERR_CONFIG, "option 'gamma-process': expected a value in [0, 1]");
    if (!(o->sigma_min >= 0) || !isfinite(o->sigma_min))
        return arl_errorf(ARL_ERR_CONFIG, "option 'sigma-min': expected a finite value >= 0");
    int v;
    static const char *const forms[] = {"auto", "sum", "min"};
    ARL_TRY(parse_choice("process-form", o->process_form, forms, 3, &v));
    if (v == 0) return arl_errorf(ARL_ERR_CONFIG, "option 'process-form': expected sum or min");
    cfg->process_form = (arl_reward_form)v;
    static const char *const pb[] = {"turn_index", "anchor"};
    ARL_TRY(parse_choice("process-baseline", o->process_baseline, pb, 2, &v));
    cfg->process_baseline = (arl_reward_process_baseline)v;
    static const char *const sb[] = {"loo", "mc"};
    ARL_TRY(parse_choice("segment-baseline", o->segment_baseline, sb, 2, &v));
    cfg->segment_baseline = (arl_reward_segment_baseline)v;
    cfg->mc_forks = (int32_t)o->mc_forks;
    static const char *const ns[] = {"none", "batch", "group"};
    ARL_TRY(parse_choice("norm-outcome", o->norm_outcome, ns, 3, &v));
    cfg->norm[ARL_REWARD_LEVEL_OUTCOME] = (arl_reward_norm)v;
    ARL_TRY(parse_choice("norm-segment", o->norm_segment, ns, 3, &v));
    cfg->norm[ARL_REWARD_LEVEL_SEGMENT] = (arl_reward_norm)v;
    ARL_TRY(parse_choice("norm-process", o->norm_process, ns, 3, &v));
    cfg->norm[ARL_REWARD_LEVEL_PROCESS] = (arl_reward_norm)v;
    static const char *const ks[] = {"trajectory", "segment"};
    ARL_TRY(parse_choice("kl-rtg-scope", o->kl_rtg_scope, ks, 2, &v));
    cfg->kl_scope = (arl_reward_kl_scope)v;
    ARL_TRY(parse_components("outcome-components", &o->outcome_components, ARL_REWARD_LEVEL_OUTCOME,
                             cfg));
    ARL_TRY(parse_components("segment-components", &o->segment_components, ARL_REWARD_LEVEL_SEGMENT,
                             cfg));
    ARL_TRY(parse_components("process-components", &o->process_components, ARL_REWARD_LEVEL_PROCESS,
                             cfg));
    return ARL_OK;
}
