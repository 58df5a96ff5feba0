/* experiments/train.c: `agentrl train` (experiments/train.h) - the experiment's composed
 * configuration, and the run: SFT warm start, reference, evaluation, the synchronous
 * rollout -> update loop with checkpoints, ledger commits and metrics, exact resume, report. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/defer.h"
#include "core/dirlock.h"
#include "core/file.h"
#include "core/json_dump.h"
#include "core/log.h"
#include "core/sha256.h"
#include "envs/builtin/teacher.h"
#include "envs/env.h"
#include "experiments/heldout.h"
#include "experiments/mc_forks.h"
#include "experiments/report.h"
#include "experiments/set_arg.h"
#include "experiments/train.h"
#include "kernels/cuda/cuda.h"
#include "kernels/threadpool.h"
#include "learner/ledger.h"
#include "policy/checkpoint.h"
#include "policy/train_state.h"

#define BIG 9007199254740991.0

/* ------------------------------------------------------------------------------------------ */
/* options                                                                                      */

#define F(x) offsetof(arl_train_config, x)
static const arl_option train_tab[] = {
    {"model", ARL_OPT_STRING, F(model), NULL, ARL_SFT_MODEL_HELP, 0, 0, NULL, 0, "CONFIG"},
    {"init", ARL_OPT_STRING, F(init), NULL,
     "checkpoint to start from, before the SFT stage (default: initialise from scratch)", 0, 0,
     NULL, 0, "DIR"},
    {"init-seed", ARL_OPT_INT, F(init_seed), "0", "seed of the from-scratch initialisation", 0, BIG,
     NULL, 0, NULL},
    {"out", ARL_OPT_STRING, F(out), NULL, "output directory", 0, 0, NULL, ARL_OPT_REQUIRED, "DIR"},
    {"steps", ARL_OPT_INT, F(steps), "10", "RL updates (0: the SFT stage and evaluation only)", 0,
     1e9, NULL, 0, "N"},
    {"tasks-per-update", ARL_OPT_INT, F(tasks_per_update), "4",
     "B: tasks rolled out per update, each a group of rollout.group-size samples", 1, 1e7, NULL, 0,
     "B"},
    {"seed", ARL_OPT_INT, F(seed), "0", "learner seed (minibatch shuffles)", 0, BIG, NULL, 0, NULL},
    {"threads", ARL_OPT_INT, F(threads), "0", "CPU threads (0: the kernels' default)", 0, 1024,
     NULL, 0, "N"},
    {"checkpoint-interval", ARL_OPT_INT, F(checkpoint_interval), "1",
     "training checkpoint every N updates (and after the last)", 1, 1e9, NULL, 0, "N"},
    {"keep-last", ARL_OPT_INT, F(keep_last), "3", "training checkpoints kept (0: all)", 0, 1e9,
     NULL, 0, "N"},
    {"eval-tasks", ARL_OPT_INT, F(eval_tasks), "0",
     "held-out tasks evaluated before and after RL, one episode each (0: no evaluation)", 0, 1e7,
     NULL, 0, "E"},
    {"eval-task-seed", ARL_OPT_INT, F(eval_task_seed), "1000000000",
     "seed of held-out task j is eval-task-seed + j", 0, BIG, NULL, 0, "S"},
    {"eval-split", ARL_OPT_FLOAT, F(eval_split), "0",
     "hold out this fraction of the task PROMPTS (experiments/heldout.h): evaluation draws only "
     "held-out prompts, SFT demonstrations and RL tasks only the others, so that no evaluated "
     "question is trained on under another seed (0: off; evaluation uses seeds eval-task-seed + "
     "j, disjoint from the training seeds only)",
     0, 0.9, NULL, 0, "F"},
    {"validation-split", ARL_OPT_FLOAT, F(validation_split), "0",
     "hold out a further fraction of the task prompts, disjoint from the eval-split ones and "
     "never trained on, as a validation set for tuning (experiments/heldout.h; needs eval-split "
     "> 0; 0: none)",
     0, 0.9, NULL, 0, "F"},
    {"eval-set", ARL_OPT_CHOICE, F(eval_set), "test",
     "which held-out prompts the evaluation draws: test (eval-split, the reported result) or "
     "validation (validation-split: tune on it, then report one run on test)",
     0, 0, "test|validation", 0, NULL},
    {"eval-temperature", ARL_OPT_FLOAT, F(eval_temperature), "0",
     "sampling temperature of the evaluation (0: greedy)", 0, 100, NULL, 0, "T"},
    {"eval-before", ARL_OPT_BOOL, F(eval_before), "true", "evaluate the initial policy", 0, 0, NULL,
     0, NULL},
    {"eval-after", ARL_OPT_BOOL, F(eval_after), "true", "evaluate the final policy", 0, 0, NULL, 0,
     NULL},
    {"sft-demos", ARL_OPT_INT, F(sft_demos), "0",
     "teacher demonstrations for an SFT warm start before RL (0: no SFT stage)", 0, 1e9, NULL, 0,
     "N"},
    {"sft-demo-seed", ARL_OPT_INT, F(sft_demo_seed), "500000000",
     "task seed of demonstration j is sft-demo-seed + j", 0, BIG, NULL, 0, "S"},
    {"sft-demo-options", ARL_OPT_STRING, F(sft_demo_options), NULL,
     "options of the demonstration episodes, a JSON object (default: rollout.task-data)", 0, 0,
     NULL, 0, "JSON"},
    {"context-stages", ARL_OPT_LIST, F(context_stages), NULL,
     "staged context: STEP:TOKENS sets the rollout's context and trajectory budget to TOKENS "
     "(at most rollout.context-tokens) from update STEP on",
     0, 0, NULL, 0, "STEP:TOKENS"},
    {"progress", ARL_OPT_CHOICE, F(progress), "auto",
     "progress display: one carriage-return line (line), plain periodic lines (plain) or none "
     "(off); auto: line when standard error is a terminal, else plain",
     0, 0, "auto|line|plain|off", 0, NULL},
    {"title", ARL_OPT_STRING, F(title), NULL, "title of the report (default: the output directory)",
     0, 0, NULL, 0, "TEXT"},
};
#undef F

const arl_option *arl_train_options(size_t *n) {
    *n = ARL_OPTIONS_COUNT(train_tab);
    return train_tab;
}

/* SFT keys the driver sets. */
static const char *const sft_reserved[] = {"model",     "init", "init-seed", "data",
                                           "eval-data", "out",  "threads",   "progress"};

static int sft_key_reserved(const char *key) {
    for (size_t i = 0; i < sizeof sft_reserved / sizeof sft_reserved[0]; i++) {
        const char *a = sft_reserved[i], *b = key;
        while (*a && *b && (*a == *b || ((*a == '-' || *a == '_') && (*b == '-' || *b == '_')))) {
            a++;
            b++;
        }
        if (!*a && !*b) return 1;
    }
    return 0;
}

void arl_train_config_free(arl_train_config *c) {
    if (!c) return;
    size_t n;
    const arl_option *t = arl_sft_options(&n);
    arl_options_free(t, n, &c->sft);
    arl_learner_opts_free(&c->learner);
    arl_rollout_config_free(&c->rollout);
    arl_options_free(train_tab, ARL_OPTIONS_COUNT(train_tab), c);
}

static arl_status parse_section(const arl_option *tab, size_t n, json_t *obj, const char *where,
                                void *cfg) {
    char *text = arl_json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", where);
    arl_status s = arl_options_parse_json_text(tab, n, text, where, cfg);
    free(text);
    return s;
}

/* One key=value of --set: "key" (top level) or "section.key". */
static arl_status apply_set(arl_train_config *c, const char *kv) {
    char key[160];
    const char *val;
    ARL_TRY(arl_set_arg_split(kv, key, sizeof key, &val));
    char *dot = strchr(key, '.');
    arl_status s;
    if (!dot) {
        s = arl_options_set(train_tab, ARL_OPTIONS_COUNT(train_tab), key, val, c);
    } else {
        *dot = 0;
        const char *sec = key, *k = dot + 1;
        size_t n;
        if (!strcmp(sec, "rollout")) {
            s = arl_options_set(arl_rollout_options, arl_rollout_n_options, k, val, &c->rollout);
        } else if (!strcmp(sec, "learner")) {
            const arl_option *t = arl_learner_options(&n);
            s = arl_options_set(t, n, k, val, &c->learner);
        } else if (!strcmp(sec, "sft")) {
            if (sft_key_reserved(k))
                return arl_errorf(ARL_ERR_ARG,
                                  "--set sft.%s: set by the train driver (use the "
                                  "top-level keys)",
                                  k);
            const arl_option *t = arl_sft_options(&n);
            s = arl_options_set(t, n, k, val, &c->sft);
        } else {
            return arl_errorf(ARL_ERR_ARG,
                              "--set '%s': unknown section '%s' (rollout, learner, sft)", kv, sec);
        }
    }
    if (s) return arl_error_prefix(ARL_ERR_ARG, "--set '%s'", kv);
    return ARL_OK;
}

static int is_builtin_env(const char *env) {
    return env && strncmp(env, "http://", 7) && strncmp(env, "https://", 8);
}

static const char *builtin_name(const char *env) {
    return !strncmp(env, "builtin:", 8) ? env + 8 : env;
}

/* "STEP:TOKENS" entries. */
static arl_status parse_stage(const char *s, int64_t *step, int64_t *tokens) {
    char *end;
    long long a = strtoll(s, &end, 10);
    if (end == s || *end != ':' || a < 0)
        return arl_errorf(ARL_ERR_CONFIG, "key 'context-stages': '%s': expected STEP:TOKENS", s);
    const char *p = end + 1;
    long long b = strtoll(p, &end, 10);
    if (end == p || *end || b < 2)
        return arl_errorf(ARL_ERR_CONFIG, "key 'context-stages': '%s': expected STEP:TOKENS", s);
    *step = a;
    *tokens = b;
    return ARL_OK;
}

arl_status arl_train_config_check(const arl_train_config *c) {
    if (!c->model && !c->init)
        return arl_errorf(ARL_ERR_CONFIG, "key 'model': give a model config (or 'init', a "
                                          "checkpoint to start from)");
    ARL_TRY(arl_options_check_required(train_tab, ARL_OPTIONS_COUNT(train_tab), c));
    arl_status e = arl_rollout_config_validate(&c->rollout);
    if (e) return arl_error_prefix(e, "section 'rollout'");
    const arl_rollout_config *r = &c->rollout;
    for (int i = 0; i < c->context_stages.n; i++) {
        int64_t st, tok;
        ARL_TRY(parse_stage(c->context_stages.v[i], &st, &tok));
        /* a stage is a budget within the run's context limit (which the learner's workspaces
         * are sized for): beyond it the run would fail late, out of memory */
        if (tok > r->context_tokens)
            return arl_errorf(ARL_ERR_CONFIG,
                              "key 'context-stages': '%s': %s tokens is more than "
                              "rollout.context-tokens (%lld), the run's context limit; raise "
                              "rollout.context-tokens (and rollout.trajectory-tokens) to stage "
                              "more",
                              c->context_stages.v[i], strchr(c->context_stages.v[i], ':') + 1,
                              (long long)r->context_tokens);
        if (r->observation_tokens + r->turn_tokens > tok)
            return arl_errorf(ARL_ERR_CONFIG,
                              "key 'context-stages': '%s': %lld tokens cannot hold "
                              "rollout.observation-tokens + rollout.turn-tokens (%lld)",
                              c->context_stages.v[i], (long long)tok,
                              (long long)(r->observation_tokens + r->turn_tokens));
    }
    if (c->sft_demos > 0 && !is_builtin_env(r->env))
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'sft-demos': the SFT warm start needs a built-in environment's "
                          "teacher, and rollout.env is %s",
                          r->env);
    if (c->eval_split > 0 && !is_builtin_env(r->env))
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'eval-split': the prompt split needs a built-in environment's "
                          "teacher, and rollout.env is %s",
                          r->env);
    if (c->validation_split > 0 && !(c->eval_split > 0))
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'validation-split': needs eval-split > 0 (the validation prompts "
                          "are taken after the test prompts)");
    if (c->eval_split + c->validation_split > 0.9)
        return arl_errorf(ARL_ERR_CONFIG,
                          "keys 'eval-split' (%g) and 'validation-split' (%g): together at most "
                          "0.9, so that training keeps a tenth of the prompts",
                          c->eval_split, c->validation_split);
    if (!strcmp(c->eval_set, "validation") && !(c->validation_split > 0))
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'eval-set': 'validation' needs validation-split > 0");
    if (c->eval_split > 0 && r->task_file)
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'eval-split': not with rollout.task-file (split the task file "
                          "yourself)");
    if (c->sft_demo_options) {
        json_t *j = arl_json_loads(c->sft_demo_options, 0, NULL);
        int ok = json_is_object(j);
        json_decref(j);
        if (!ok)
            return arl_errorf(ARL_ERR_CONFIG,
                              "key 'sft-demo-options': expected a JSON object, got "
                              "'%.80s'",
                              c->sft_demo_options);
    }
    arl_reward_config rc;
    arl_loss_config lc;
    arl_kl_config kc;
    ARL_TRY(arl_reward_config_from_opts(&c->learner.reward, &rc));
    /* a built-in environment's name and its reward components (spec/aep.md 4.8), before
     * anything is written; an AEP/1 server's /info is read when its first rollout starts, and
     * the learner checks the components against it (arl_reward_sources_from_info) */
    if (is_builtin_env(r->env)) {
        const arl_env_def *d = arl_env_builtin_find(builtin_name(r->env));
        if (!d) {
            char names[256] = "";
            size_t k = 0;
            for (size_t i = 0; arl_env_builtins[i] && k < sizeof names; i++) {
                const int m = snprintf(names + k, sizeof names - k, "%s%s", i ? ", " : "",
                                       arl_env_builtins[i]->name);
                k += m > 0 ? (size_t)m : 0;
            }
            return arl_errorf(ARL_ERR_CONFIG,
                              "key 'rollout.env': no built-in environment '%s' (%s; or an "
                              "AEP/1 server's http:// URL)",
                              builtin_name(r->env), names);
        }
        ARL_TRY(arl_reward_config_check_info(&rc, d->name, d->info_json));
        if (c->sft_demos > 0) { /* the SFT data pipeline takes text conversations only */
            json_t *info = arl_json_loads(d->info_json, 0, NULL);
            const int mm =
                json_is_true(json_object_get(json_object_get(info, "capabilities"), "multimodal"));
            json_decref(info);
            if (mm)
                return arl_errorf(ARL_ERR_CONFIG,
                                  "key 'sft-demos': the tasks of %s carry images, which the SFT "
                                  "warm start does not take yet; set sft-demos 0 (or start from a "
                                  "checkpoint with init)",
                                  d->name);
        }
    }
    if (rc.segment_baseline == ARL_REWARD_SB_MC && rc.w[ARL_REWARD_LEVEL_SEGMENT] == 0)
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'learner.segment-baseline' is mc while learner.w-segment is 0: "
                          "the segment level is off, so its forks would be made for nothing");
    ARL_TRY(arl_loss_config_from_opts(&c->learner.loss, &lc));
    ARL_TRY(arl_kl_config_from_opts(&c->learner.kl, &kc));
    arl_optim_config o = c->learner.optim;
    if (o.total_steps == 0) o.total_steps = c->steps * c->learner.own.minibatches;
    if (o.total_steps == 0) o.total_steps = 1;
    e = arl_optim_config_check(&o);
    if (e) return arl_error_prefix(e, "section 'learner'");
    if (c->sft_demos > 0) {
        arl_optim_config so = c->sft.optim;
        if (so.total_steps == 0) so.total_steps = c->sft.steps;
        ARL_TRY(arl_optim_config_check(&so));
    }
    return ARL_OK;
}

arl_status arl_train_config_load(const char *path, const arl_strlist *sets, arl_train_config *c) {
    memset(c, 0, sizeof *c);
    ARL_TRY(arl_options_defaults(train_tab, ARL_OPTIONS_COUNT(train_tab), c));
    ARL_TRY(arl_rollout_config_defaults(&c->rollout));
    ARL_TRY(arl_learner_opts_defaults(&c->learner));
    size_t nsft;
    const arl_option *sft_tab = arl_sft_options(&nsft);
    ARL_TRY(arl_options_defaults(sft_tab, nsft, &c->sft));
    if (path) {
        char *text;
        ARL_TRY(arl_file_read(path, 0, &text, NULL));
        json_error_t je;
        json_t *root = arl_json_loads(text, JSON_REJECT_DUPLICATES, &je);
        free(text);
        if (!root && arl_json_error_nomem(&je)) /* this process's, not the file's */
            return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
        if (!root)
            return arl_errorf(ARL_ERR_CONFIG, "%s:%d:%d: invalid JSON: %s", path, je.line,
                              je.column, je.text);
        if (!json_is_object(root)) {
            json_decref(root);
            return arl_errorf(ARL_ERR_CONFIG, "%s: expected a JSON object at the top level", path);
        }
        json_t *top = json_object();
        arl_status s = top ? ARL_OK : arl_errorf(ARL_ERR_NOMEM, "out of memory");
        const char *key;
        json_t *v;
        json_object_foreach(root, key, v) {
            if (s) break;
            char where[4200];
            if (!strcmp(key, "rollout") || !strcmp(key, "learner") || !strcmp(key, "sft")) {
                if (!json_is_object(v)) {
                    s = arl_errorf(ARL_ERR_CONFIG, "%s: section '%s': expected an object", path,
                                   key);
                    break;
                }
                snprintf(where, sizeof where, "%s: section '%s'", path, key);
                if (!strcmp(key, "rollout")) {
                    json_t *w = json_pack("{sO}", "rollout", v);
                    char *t = w ? arl_json_dumps(w, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
                    json_decref(w);
                    s = t ? arl_rollout_config_load_json(&c->rollout, t, path)
                          : arl_errorf(ARL_ERR_NOMEM, "out of memory");
                    free(t);
                } else if (!strcmp(key, "learner")) {
                    size_t n;
                    const arl_option *t = arl_learner_options(&n);
                    s = parse_section(t, n, v, where, &c->learner);
                } else {
                    const char *k2;
                    json_t *v2;
                    json_object_foreach(v, k2, v2) {
                        if (sft_key_reserved(k2)) {
                            s = arl_errorf(ARL_ERR_CONFIG,
                                           "%s: key '%s' is set by the train driver (use the "
                                           "top-level keys model, init, init-seed, out, threads, "
                                           "progress; the data are the teacher's demonstrations)",
                                           where, k2);
                            break;
                        }
                    }
                    if (!s) s = parse_section(sft_tab, nsft, v, where, &c->sft);
                }
            } else if ((!strcmp(key, "sft-demo-options") || !strcmp(key, "sft_demo_options")) &&
                       json_is_object(v)) {
                char *t = arl_json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
                s = t ? (json_object_set_new(top, key, json_string(t)) ? ARL_ERR_NOMEM : ARL_OK)
                      : ARL_ERR_NOMEM;
                free(t);
                if (s) s = arl_errorf(ARL_ERR_NOMEM, "out of memory");
            } else {
                if (json_object_set(top, key, v)) s = arl_errorf(ARL_ERR_NOMEM, "out of memory");
            }
        }
        if (!s) s = parse_section(train_tab, ARL_OPTIONS_COUNT(train_tab), top, path, c);
        json_decref(top);
        json_decref(root);
        ARL_TRY(s);
    }
    for (int i = 0; sets && i < sets->n; i++)
        ARL_TRY(apply_set(c, sets->v[i]));
    return arl_train_config_check(c);
}

/* A table's resolved JSON without unset strings (so that the file reads back). */
static json_t *section_json(const arl_option *tab, size_t n, const void *cfg, int sft) {
    char *t = arl_options_to_json(tab, n, cfg);
    json_t *j = t ? arl_json_loads(t, 0, NULL) : NULL;
    free(t);
    if (!j) return NULL;
    const char *key;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(j, tmp, key, v) {
        if (json_is_null(v) || (sft && sft_key_reserved(key))) json_object_del(j, key);
    }
    return j;
}

/* JSON-object keys held as text become objects again. */
static void objectify(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return;
    json_t *p = arl_json_loads(json_string_value(v), 0, NULL);
    if (json_is_object(p))
        json_object_set_new(o, key, p);
    else
        json_decref(p);
}

char *arl_train_config_json(const arl_train_config *c) {
    json_t *top = section_json(train_tab, ARL_OPTIONS_COUNT(train_tab), c, 0);
    json_t *ro = section_json(arl_rollout_options, arl_rollout_n_options, &c->rollout, 0);
    size_t n;
    const arl_option *lt = arl_learner_options(&n);
    json_t *le = section_json(lt, n, &c->learner, 0);
    const arl_option *st = arl_sft_options(&n);
    json_t *sf = section_json(st, n, &c->sft, 1);
    char *out = NULL;
    if (top && ro && le && sf) {
        objectify(top, "sft-demo-options");
        objectify(ro, "env-config");
        objectify(ro, "env-options");
        objectify(ro, "task-data");
        json_object_set(top, "rollout", ro);
        json_object_set(top, "learner", le);
        json_object_set(top, "sft", sf);
        out = arl_json_dumps(top, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    }
    json_decref(top);
    json_decref(ro);
    json_decref(le);
    json_decref(sf);
    return out;
}

void arl_train_config_print(const arl_train_config *c, FILE *f) {
    size_t n;
    arl_options_print_resolved(f, "train: resolved configuration:", train_tab,
                               ARL_OPTIONS_COUNT(train_tab), c);
    arl_options_print_resolved(f, "train: section rollout:", arl_rollout_options,
                               arl_rollout_n_options, &c->rollout);
    const arl_option *lt = arl_learner_options(&n);
    arl_options_print_resolved(f, "train: section learner:", lt, n, &c->learner);
    if (c->sft_demos > 0) {
        const arl_option *st = arl_sft_options(&n);
        arl_options_print_resolved(
            f, "train: section sft (model, data, out set by the driver):", st, n, &c->sft);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* files                                                                                        */

static int path_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static int rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return remove(path);
    struct dirent *e;
    char sub[4200];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        struct stat sb;
        if (lstat(sub, &sb) == 0 && S_ISDIR(sb.st_mode))
            rm_tree(sub);
        else
            remove(sub);
    }
    closedir(d);
    return rmdir(path);
}

static arl_status write_text(const char *path, const char *text) {
    return arl_write_file_atomic(path, text, strlen(text));
}

/* The names of the files and checkpoints train writes atomically (NAME.tmp-XXXXXX first) in
 * OUT, OUT/policy and OUT/sft (the SFT stage's own files are sft's, experiments/sft.c). */
static int out_tmp_owned(const char *name) {
    static const char *const names[] = {"experiment.json", "metrics.jsonl", "eval-before.outcomes",
                                        "eval-after.outcomes", "reference"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i])) return 1;
    return !strncmp(name, "metrics.jsonl.damaged-", 22);
}

static int policy_tmp_owned(const char *name) {
    return name[0] == 'v' && name[1] && strspn(name + 1, "0123456789") == strlen(name + 1);
}

static int sft_tmp_owned(const char *name) {
    return !strcmp(name, "demos.done");
}

/* PREFIX<digits>SUFFIX */
static int numbered_name(const char *name, const char *prefix, const char *suffix) {
    const size_t a = strlen(prefix);
    if (strncmp(name, prefix, a)) return 0;
    const size_t d = strspn(name + a, "0123456789");
    return d > 0 && !strcmp(name + a + d, suffix);
}

/* the rollout ranks' files beside their stores in OUT/replay/<dir>: tasks-r<k>.jsonl, and for
 * a training rollout window-r<k>.json (its alert window) */
static int replay_tmp_owned(const char *name) {
    return numbered_name(name, "tasks-r", ".jsonl") || numbered_name(name, "window-r", ".json");
}

/* rank 0, holding OUT's lock: remove the temporaries that a run killed while it wrote one of
 * its files or checkpoints left (NAME.tmp-XXXXXX beside NAME, whole or cut short, never
 * renamed onto NAME) */
static arl_status out_tmp_sweep(const char *out) {
    char p[4200];
    int64_t k[3], kr = 0;
    ARL_TRY(arl_checkpoint_tmp_sweep(out, out_tmp_owned, &k[0]));
    snprintf(p, sizeof p, "%s/policy", out);
    ARL_TRY(arl_checkpoint_tmp_sweep(p, policy_tmp_owned, &k[1]));
    snprintf(p, sizeof p, "%s/sft", out);
    ARL_TRY(arl_checkpoint_tmp_sweep(p, sft_tmp_owned, &k[2]));
    snprintf(p, sizeof p, "%s/replay", out);
    DIR *dir = opendir(p);
    struct dirent *e;
    arl_status s = ARL_OK;
    while (!s && dir && (e = readdir(dir))) {
        if (e->d_name[0] == '.') continue;
        char sub[4500];
        int64_t n = 0;
        snprintf(sub, sizeof sub, "%s/%s", p, e->d_name);
        s = arl_checkpoint_tmp_sweep(sub, replay_tmp_owned, &n);
        kr += n;
    }
    if (dir) closedir(dir);
    ARL_TRY(s);
    if (k[0] + k[1] + k[2] + kr > 0)
        arl_log_debug("train: %s: removed %lld temporaries of interrupted writes", out,
                      (long long)(k[0] + k[1] + k[2] + kr));
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* the run                                                                                      */

typedef struct tr_run {
    const arl_train_config *c;
    arl_dist *d;
    const arl_dist_layout *L;
    int rank0;
    FILE *log;
    int progress_line; /* 1: carriage return; 0: plain lines; -1: none */
    int line_open;
    char out[4096];
    arl_model_config mcfg;
    int have_mcfg;
    arl_model_params params, ref;
    int have_params;
    arl_adamw opt;
    int have_opt;
    arl_optim_config ocfg; /* RL optimizer (total steps resolved); strings borrowed from c */
    arl_klctl kl;
    arl_reward_config rc;
    arl_loss_config lossc;
    arl_kl_config klc;
    arl_learner_config lc;
    arl_learner *lr;
    char model_sha[ARL_SHA256_HEX_CHARS];
    char run_sha[ARL_SHA256_HEX_CHARS];
    char *run_canon; /* the settings hashed into run_sha (compact JSON) */
    /* the client-fault alert window of the training rollouts (spec/aep.md 8.6), kept across
     * the updates' workers: the last 200 finished trajectories of the run, not of one update */
    arl_rollout_alert_window win;
    int win_exact; /* win is the uninterrupted run's (0: a resume of a run of an older build) */
    int64_t B, G, R;
    json_t **dataset; /* task-file lines (n_dataset), or NULL */
    int64_t n_dataset;
    int64_t *train_seeds; /* eval-split > 0: seed of RL task i (steps * B), else NULL */
    int64_t *eval_seeds;  /* eval-split > 0: seed of held-out task j (eval-tasks), else NULL */
    int64_t tokens;       /* tokens trained on (all updates) */
    double last_lr;
    double t0;
    arl_dirlock lock; /* rank 0: the output directory's (core/dirlock.h) */
    int broken; /* a failure inside the learner's collectives: sync_status makes no more calls */
    int agreed; /* sync_status told every rank of a failure (they all return one) */
    double states_gc_s; /* keep-states: now_s() of the last GC of the learner states files */
    int policy_saved;   /* rank 0: save_policy wrote a version in this process */
} tr_run;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void say(tr_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(tr_run *r, const char *fmt, ...) {
    if (!r->rank0 || !r->log) return;
    if (r->line_open) {
        fputc('\n', r->log);
        r->line_open = 0;
    }
    va_list ap;
    va_start(ap, fmt);
    vfprintf(r->log, fmt, ap);
    va_end(ap);
    fputc('\n', r->log);
    fflush(r->log);
}

/* Every rank learns whether any rank failed (collective over the world).  After a failure
 * that may have cut a collective in two (r->broken) it only returns the failure: the other
 * ranks may wait in that collective, so this rank makes no more calls and main aborts the job
 * (arl_dist_abort). */
static arl_status sync_status(tr_run *r, arl_status s) {
    if (r->broken) return s ? s : ARL_ERR_INTERNAL;
    /* the status and the rank that had it (the highest status, then the highest rank) */
    int64_t v = s ? ((int64_t)s << 24) | r->L->world_rank : 0;
    arl_status e = arl_dist_allreduce_i64(r->d->world, &v, 1, ARL_DIST_MAX);
    if (e) return e;
    if (v) r->agreed = 1;
    if (s) return s;
    if (v)
        return arl_errorf((arl_status)(v >> 24), "train: rank %d failed (see its message)",
                          (int)(v & 0xffffff));
    return ARL_OK;
}

static void pathf(char *buf, size_t cap, const tr_run *r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void pathf(char *buf, size_t cap, const tr_run *r, const char *fmt, ...) {
    int n = snprintf(buf, cap, "%s/", r->out);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - (size_t)n, fmt, ap);
    va_end(ap);
}

/* The RL optimizer's total steps as resolved for c (0 in the options: steps x minibatches). */
static int64_t resolved_total_steps(const arl_train_config *c) {
    int64_t t = c->learner.optim.total_steps;
    if (t == 0) t = c->steps * c->learner.own.minibatches;
    return t == 0 ? 1 : t;
}

/* The settings hashed into the run hash of c: its resolved configuration without the keys a
 * resume may change, as compact JSON with sorted keys (*canon malloc'ed, caller frees). */
static arl_status run_canon_of(const arl_train_config *c, char **canon) {
    *canon = NULL;
    char *t = arl_train_config_json(c);
    json_t *j = t ? arl_json_loads(t, 0, NULL) : NULL;
    free(t);
    if (!j) return arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
    /* "model" and "init" are used at the start only (the model config hash is checked on its
     * own), so that a moved file does not block a resume */
    static const char *const unhashed[] = {
        "out",         "model",      "init",           "threads",
        "steps",       "progress",   "title",          "checkpoint-interval",
        "keep-last",   "eval-tasks", "eval-task-seed", "eval-temperature",
        "eval-before", "eval-after", "eval-set"};
    for (size_t i = 0; i < sizeof unhashed / sizeof unhashed[0]; i++)
        json_object_del(j, unhashed[i]);
    json_t *ro = json_object_get(j, "rollout");
    json_object_del(ro, "threads");
    json_object_del(ro, "progress-s");
    /* the GC of the states files (the rollout's, the learner's below): a cache's upkeep, not
     * the run's bits */
    json_object_del(ro, "state-budget-bytes");
    json_object_del(ro, "state-gc-interval-s");
    json_t *le = json_object_get(j, "learner");
    /* memory: the same bits unless a forward's documents outgrow the rows (then its calls are
     * split and the gradient is summed in more parts, equal to fp32 rounding) */
    json_object_del(le, "device-slot-rows");
    json_object_del(le, "state-budget-bytes");
    json_object_del(le, "state-gc-interval-s");
    json_object_set_new(le, "resolved-total-steps", json_integer(resolved_total_steps(c)));
    *canon = arl_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(j);
    return *canon ? ARL_OK : arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
}

/* The run hash: SHA-256 of run_canon_of. */
static arl_status run_hash(tr_run *r) {
    char *canon;
    ARL_TRY(run_canon_of(r->c, &canon));
    uint8_t dg[ARL_SHA256_BYTES];
    arl_sha256(canon, strlen(canon), dg);
    arl_sha256_hex(dg, r->run_sha);
    free(r->run_canon);
    r->run_canon = canon;
    return ARL_OK;
}

/* The settings every rank of an MPI job must share, as compact JSON with sorted keys (*canon
 * malloc'ed): c's resolved configuration without the keys that are each process's own
 * (progress, threads, rollout.threads, rollout.progress-s), with the model config's hash. */
static arl_status settings_canon_of(const arl_train_config *c, const char *model_sha,
                                    char **canon) {
    *canon = NULL;
    char *t = arl_train_config_json(c);
    json_t *j = t ? arl_json_loads(t, 0, NULL) : NULL;
    free(t);
    if (!j) return arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
    json_object_del(j, "progress");
    json_object_del(j, "threads");
    json_t *ro = json_object_get(j, "rollout");
    json_object_del(ro, "threads");
    json_object_del(ro, "progress-s");
    json_object_set_new(j, "model-config-sha256", json_string(model_sha));
    *canon = arl_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(j);
    return *canon ? ARL_OK : arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
}

/* Under mpirun: every rank runs with rank 0's settings (collective over the world; call on
 * every rank).  A rank started with other --set options (an MPMD command line) or reading
 * another copy of the experiment file or model config would otherwise train on other settings
 * without a word (a learner's own learning rate: the learners' weights part) or wait for ever in
 * a collective the others never reach (fewer steps).  The rank that differs fails naming the
 * keys (rank 0's value -> its own). */
static arl_status settings_agree(tr_run *r) {
    if (r->L->world_size == 1) return ARL_OK;
    char sha[ARL_SHA256_HEX_CHARS];
    char *mine = NULL;
    arl_status s = arl_model_config_hash_hex(&r->mcfg, sha);
    if (!s) s = settings_canon_of(r->c, sha, &mine);
    s = sync_status(r, s);
    void *theirs = r->rank0 ? mine : NULL;
    int64_t n = r->rank0 && mine ? (int64_t)strlen(mine) + 1 : 0; /* none: s says why */
    if (!s) {
        s = arl_dist_bcast_msg(r->d->world, &theirs, &n, 0);
        if (s) r->broken = 1;
    }
    if (!s && !r->rank0 && (n < 1 || ((char *)theirs)[n - 1] || strcmp(theirs, mine))) {
        char text[1600];
        const int k = arl_run_config_diff(theirs, mine, text, sizeof text);
        /* a usage error of the launch command (exit 2 on every rank: sync_status spreads it) */
        s = arl_errorf(ARL_ERR_ARG,
                       "train: rank %d runs with other settings than rank 0 (rank 0 -> rank %d): "
                       "%s; every rank must run the same experiment file with the same --set "
                       "options (one command line for all ranks, the same experiment file and "
                       "model config on every node)",
                       r->L->world_rank, r->L->world_rank,
                       k > 0 ? text : "(the resolved configurations differ)");
    }
    if (!r->rank0) free(theirs);
    free(mine);
    return s;
}

/* Copy a rollout config (strings duplicated; the rollout table has no lists). */
static arl_status rollout_copy(arl_rollout_config *dst, const arl_rollout_config *src) {
    *dst = *src;
    for (size_t i = 0; i < arl_rollout_n_options; i++) {
        const arl_option *o = &arl_rollout_options[i];
        if (o->type != ARL_OPT_STRING && o->type != ARL_OPT_CHOICE) continue;
        char **f = (char **)((char *)dst + o->offset);
        if (*f && !(*f = strdup(*f))) {
            for (size_t j = 0; j < i; j++) {
                const arl_option *q = &arl_rollout_options[j];
                if (q->type == ARL_OPT_STRING || q->type == ARL_OPT_CHOICE)
                    free(*(char **)((char *)dst + q->offset));
            }
            memset(dst, 0, sizeof *dst);
            return arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
        }
    }
    return ARL_OK;
}

static int64_t stage_tokens(const tr_run *r, int64_t n) {
    int64_t best_step = -1, tok = 0;
    for (int i = 0; i < r->c->context_stages.n; i++) {
        int64_t st, t;
        if (parse_stage(r->c->context_stages.v[i], &st, &t)) continue;
        if (st <= n && st >= best_step) {
            best_step = st;
            tok = t;
        }
    }
    return tok;
}

/* ---- tasks ---- */

static arl_status load_dataset(tr_run *r) {
    const char *f = r->c->rollout.task_file;
    if (!f) return ARL_OK;
    FILE *fp = fopen(f, "r");
    if (!fp) return arl_errorf(ARL_ERR_IO, "train: cannot open rollout.task-file %s", f);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int64_t ln = 0, capd = 0;
    arl_status s = ARL_OK;
    while ((len = getline(&line, &cap, fp)) >= 0) {
        ln++;
        if (len <= 1) continue;
        json_t *j = arl_json_loadb(line, (size_t)len, 0, NULL);
        if (!json_is_object(j) || !json_is_string(json_object_get(j, "id"))) {
            json_decref(j);
            s = arl_errorf(ARL_ERR_CONFIG, "%s:%lld: expected {\"id\", \"seed\", \"data\"}", f,
                           (long long)ln);
            break;
        }
        if (r->n_dataset == capd) {
            capd = capd ? 2 * capd : 64;
            json_t **v = realloc(r->dataset, (size_t)capd * sizeof *v);
            if (!v) {
                json_decref(j);
                s = arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
                break;
            }
            r->dataset = v;
        }
        r->dataset[r->n_dataset++] = j;
    }
    free(line);
    fclose(fp);
    if (!s && r->n_dataset == 0) s = arl_errorf(ARL_ERR_CONFIG, "%s: no tasks", f);
    return s;
}

/* eval-split > 0: the seeds of the RL tasks (training prompts, from rollout.task-seed) and of
 * the held-out tasks (held-out prompts, from eval-task-seed).  Every rank computes the same. */
static int64_t scan_cap(int64_t n, double frac) {
    return (int64_t)((double)n / frac * 4) + 10000;
}

static arl_status split_seeds(tr_run *r) {
    const arl_train_config *c = r->c;
    if (!(c->eval_split > 0)) return ARL_OK;
    const char *env = builtin_name(c->rollout.env);
    const int64_t nt = c->steps * r->B, ne = c->eval_tasks;
    r->train_seeds = malloc(sizeof(int64_t) * (size_t)(nt > 0 ? nt : 1));
    r->eval_seeds = malloc(sizeof(int64_t) * (size_t)(ne > 0 ? ne : 1));
    if (!r->train_seeds || !r->eval_seeds) return arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
    const arl_heldout_split sp = {c->eval_split, c->validation_split};
    const int val = !strcmp(c->eval_set, "validation");
    ARL_TRY(arl_heldout_side_seeds(env, (uint64_t)c->rollout.task_seed, c->rollout.task_data, &sp,
                                   ARL_HELDOUT_SIDE_TRAIN, nt,
                                   scan_cap(nt, 1 - sp.test - sp.validation), r->train_seeds));
    ARL_TRY(arl_heldout_side_seeds(env, (uint64_t)c->eval_task_seed, c->rollout.task_data, &sp,
                                   val ? ARL_HELDOUT_SIDE_VALIDATION : ARL_HELDOUT_SIDE_TEST, ne,
                                   scan_cap(ne, val ? sp.validation : sp.test), r->eval_seeds));
    return ARL_OK;
}

/* Write the tasks [lo, hi) of a kind ("task": training index i, "eval": held-out index j) as a
 * task file. */
static arl_status write_tasks(tr_run *r, const char *path, int eval, int64_t lo, int64_t hi) {
    json_t *data =
        arl_json_loads(r->c->rollout.task_data ? r->c->rollout.task_data : "{}", 0, NULL);
    if (!data) return arl_errorf(ARL_ERR_CONFIG, "rollout.task-data: invalid JSON");
    size_t cap = 1024, n = 0;
    char *buf = malloc(cap);
    arl_status s = buf ? ARL_OK : arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
    for (int64_t i = lo; s == ARL_OK && i < hi; i++) {
        json_t *t;
        if (!eval && r->dataset) {
            t = json_deep_copy(r->dataset[i % r->n_dataset]);
        } else {
            char id[64];
            snprintf(id, sizeof id, "%s%lld", eval ? "eval" : "task", (long long)i);
            int64_t seed = eval ? r->c->eval_task_seed + i : r->c->rollout.task_seed + i;
            if (eval && r->eval_seeds) seed = r->eval_seeds[i];
            if (!eval && r->train_seeds) seed = r->train_seeds[i];
            t = json_pack("{sssIsO}", "id", id, "seed", (json_int_t)seed, "data", data);
        }
        char *line = t ? arl_json_dumps(t, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        json_decref(t);
        if (!line) {
            s = arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
            break;
        }
        size_t ll = strlen(line);
        if (n + ll + 2 > cap) {
            while (n + ll + 2 > cap)
                cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(line);
                s = arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
                break;
            }
            buf = nb;
        }
        memcpy(buf + n, line, ll);
        n += ll;
        buf[n++] = '\n';
        free(line);
    }
    json_decref(data);
    if (s == ARL_OK) s = arl_write_file_atomic(path, buf, n);
    free(buf);
    return s;
}

/* ---- stores ---- */

/* Outcomes of the groups of run_uid in the store at root: members, valid ones, successes (the
 * outcome at the top of the environment's declared range) and the outcome sum. */
typedef struct tr_counts {
    int64_t groups, members, valid, successes;
    double outcome_sum;
} tr_counts;

/* The task index of a trajectory: the rollout names global task j (task-offset + the line of
 * the worker's task file) "<run_uid>/g<j>" and the trajectory "<group>/r<slot>"
 * (rollout/worker.c); -1 if not so. */
static int64_t traj_task_index(const char *traj_uid) {
    const char *g = strstr(traj_uid, "/g");
    for (const char *q = g; q && (q = strstr(q + 1, "/g"));)
        g = q; /* the last "/g" */
    if (!g || g[2] < '0' || g[2] > '9') return -1;
    char *end;
    long long v = strtoll(g + 2, &end, 10);
    return *end == '/' || !*end ? (int64_t)v : -1;
}

/* outcomes (may be NULL): n_out characters, entry j set for the trajectory of task j of the
 * store's task file: '1' success, '0' valid but no success (entries of no valid trajectory
 * are left as they are). */
static arl_status store_counts(const char *root, const char *run_uid, const char *kind,
                               tr_counts *k, char *outcomes, int64_t n_out) {
    memset(k, 0, sizeof *k);
    arl_ledger *led = NULL;
    replay_store *st = NULL;
    replay_open_opts o = {.flags = REPLAY_OPEN_READONLY};
    int64_t *ids = NULL, ng = 0, run_id;
    arl_ledger_member mem[256];
    arl_status s = arl_ledger_open(root, &led);
    if (!s) s = replay_store_open(root, &o, &st);
    if (!s) s = arl_ledger_run_id(led, run_uid, &run_id);
    if (!s) s = arl_ledger_groups_alloc(led, run_id, kind, &ids, &ng);
    for (int64_t g = 0; !s && g < ng; g++) {
        int32_t sz, nm = 0;
        char env[64], *info = NULL;
        s = arl_ledger_group_env(led, ids[g], &sz, env, sizeof env, &info);
        double hi = 1.0;
        json_t *j = info ? arl_json_loads(info, 0, NULL) : NULL;
        json_t *rg = json_object_get(
            json_object_get(json_object_get(j, "reward_levels"), "outcome"), "range");
        if (json_is_array(rg) && json_is_number(json_array_get(rg, 1)))
            hi = json_number_value(json_array_get(rg, 1));
        json_decref(j);
        free(info);
        if (!s) s = arl_ledger_members(led, ids[g], mem, 256, &nm);
        k->groups++;
        for (int32_t i = 0; !s && i < nm; i++) {
            replay_traj_row row;
            s = replay_traj_get_id(st, mem[i].traj_id, &row);
            if (s) break;
            k->members++;
            if (row.status != REPLAY_COMPLETE && row.status != REPLAY_TRUNCATED) continue;
            k->valid++;
            int ok = 0;
            if (isfinite(row.outcome_reward)) {
                k->outcome_sum += row.outcome_reward;
                ok = row.outcome_reward >= hi - 1e-9;
                k->successes += ok;
            }
            int64_t tj = outcomes ? traj_task_index(row.traj_uid) : -1;
            if (tj >= 0 && tj < n_out) outcomes[tj] = ok ? '1' : '0';
        }
    }
    free(ids);
    replay_store_close(st);
    arl_ledger_close(led);
    return s;
}

/* 1 if the store at root holds n_groups groups of run_uid, every one final or consumed. */
static int store_complete(const char *root, const char *run_uid, const char *kind,
                          int64_t n_groups) {
    char cat[4200];
    snprintf(cat, sizeof cat, "%s/catalog.sqlite", root);
    if (!path_exists(cat)) return 0;
    arl_ledger *led = NULL;
    int64_t run_id;
    arl_ledger_counts k;
    int ok = arl_ledger_open(root, &led) == ARL_OK &&
             arl_ledger_run_id(led, run_uid, &run_id) == ARL_OK &&
             arl_ledger_group_counts(led, run_id, kind, &k) == ARL_OK && k.open == 0 &&
             k.final + k.consumed == n_groups;
    arl_ledger_close(led);
    arl_error_clear();
    return ok;
}

/* The rollout configuration of rollout rank ri's store for tasks [lo, hi) of run_uid: the
 * experiment's rollout section with the run's task file, run, group kind, policy version,
 * threads and context stage. */
/* Under segment-baseline mc with the default state-cache 'last', the train rollout keeps its
 * boundary states for the forks (an explicit 'all' keeps them anyway, 'off' makes the forks
 * prefill their prefixes). */
static int mc_keeps_states(const tr_run *r) {
    return r->rc.segment_baseline == ARL_REWARD_SB_MC && !strcmp(r->c->rollout.state_cache, "last");
}

static arl_status rollout_cfg(tr_run *r, arl_rollout_config *rc, const char *tasks_path,
                              const char *run_uid, int eval, int64_t lo, int64_t hi,
                              int64_t version, int64_t ctx_tokens) {
    const char *kind = eval ? "eval" : "train";
    ARL_TRY(rollout_copy(rc, &r->c->rollout));
    const arl_option *T = arl_rollout_options;
    const size_t nT = arl_rollout_n_options;
    arl_status s = arl_options_set(T, nT, "task-file", tasks_path, rc);
    if (!s) s = arl_options_set(T, nT, "run-uid", run_uid, rc);
    if (!s) s = arl_options_set(T, nT, "group-kind", kind, rc);
    if (!s) {
        free(rc->policy_dir);
        rc->policy_dir = NULL;
        rc->tasks = hi - lo;
        rc->policy_version = version;
        rc->threads = r->c->threads;
        rc->task_offset = lo; /* streams follow the global task, not the rank */
        if (eval) {
            rc->group_size = 1;
            rc->temperature = r->c->eval_temperature;
        } else if (mc_keeps_states(r)) {
            /* every boundary state stays until the Monte-Carlo forks start from them
             * (arl_mc_states_release then evicts them as 'last' would have) */
            s = arl_options_set(T, nT, "state-cache", "all", rc);
        }
        if (ctx_tokens > 0) {
            rc->context_tokens = ctx_tokens;
            rc->trajectory_tokens = ctx_tokens;
            if (rc->segment_tokens > ctx_tokens) rc->segment_tokens = ctx_tokens;
        }
        if (!r->log || !r->rank0) rc->progress_s = 0;
    }
    if (s) arl_rollout_config_free(rc);
    return s;
}

/* Move the store at root to root.<tag>-<k> (the first free k), saying what it held. */
static arl_status set_aside_as(const char *root, const char *tag, const char *what) {
    char aside[4300];
    for (int k = 1;; k++) {
        snprintf(aside, sizeof aside, "%s.%s-%d", root, tag, k);
        if (!path_exists(aside)) break;
    }
    if (rename(root, aside))
        return arl_errorf(ARL_ERR_IO, "train: cannot set aside %s: %s", root, strerror(errno));
    arl_log_warn("train: %s held %s; kept as %s, rolling out again", root, what, aside);
    return ARL_OK;
}

/* set_aside_as "interrupted": a rollout that did not finish. */
static arl_status set_aside(const char *root, const char *what) {
    return set_aside_as(root, "interrupted", what);
}

/* ---- the client-fault alert window across resumes (spec/aep.md 8.6) ----
 * Rollout rank ri keeps one window over the run's training rollouts (tr_run.win; an
 * evaluation's rollouts never touch it).  After the training rollout of update n has finished,
 * the rank writes the window as it then is to replay/uNNNNNN/window-r<ri>.json (atomically): the
 * window before the rollout of update n + 1.  So what a resume needs is on disk wherever it
 * starts: a resume from the checkpoint after update n - 1 reads replay/u(n-1)/window-r<ri>.json
 * (each rollout rank its own: the layout is the checkpoint's, layout_check); an update whose
 * store is complete (a kill after its rollout, before its checkpoint) is not rolled out again
 * and reads its own file; an update whose rollout is redone (a store cut short) starts from the
 * window before it, as an uninterrupted run did, and meets the alert at the same trajectory.
 * The file is written only when the rollout succeeded: a store left complete without it (a
 * kill before the write, or a rollout ended by the alert) is rolled out again.  Format: JSON
 * {"format": "agentrl alert window", "version": 1, "env", "n", "at", "halted", "alert",
 * "entries": [[masked, client, code] for ring positions 0..n-1]}.  A run of an older build has
 * no such files: its resume starts the window empty, with a warning (tr_run.win_exact 0). */

static const char window_format[] = "agentrl alert window";
enum { WINDOW_VERSION = 1 };

static arl_status window_save(const char *path, const arl_rollout_alert_window *w) {
    const unsigned long jfail = arl_json_alloc_failures();
    json_t *o = json_object(), *e = json_array();
    for (int32_t i = 0; i < w->n; i++)
        json_array_append_new(e,
                              json_pack("[iis]", (int)w->masked[i], (int)w->client[i], w->code[i]));
    json_object_set_new(o, "format", json_string(window_format));
    json_object_set_new(o, "version", json_integer(WINDOW_VERSION));
    json_object_set_new(o, "env", json_string(w->env));
    json_object_set_new(o, "n", json_integer(w->n));
    json_object_set_new(o, "at", json_integer(w->at));
    json_object_set_new(o, "halted", json_integer(w->halted != 0));
    json_object_set_new(o, "alert", json_string(w->alert));
    json_object_set_new(o, "entries", e);
    char *t = arl_json_alloc_failures() == jfail
                  ? arl_json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER)
                  : NULL;
    json_decref(o);
    arl_status s = t ? write_text(path, t) : arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
    free(t);
    return s;
}

/* The window in path into *w; *found 0 (w unchanged) when there is no such file.  A file this
 * build cannot read is an error naming it. */
static arl_status window_load(const char *path, arl_rollout_alert_window *w, int *found) {
    *found = 0;
    if (!path_exists(path)) return ARL_OK;
    json_error_t je;
    json_t *o = arl_json_load_file(path, 0, &je);
    if (!o)
        return arl_errorf(ARL_ERR_STATE,
                          "train: %s: not JSON (%s); remove it to roll the update out again", path,
                          je.text);
    arl_rollout_alert_window v;
    memset(&v, 0, sizeof v);
    const char *fmt = json_string_value(json_object_get(o, "format"));
    json_t *ver = json_object_get(o, "version"), *e = json_object_get(o, "entries");
    const char *env = json_string_value(json_object_get(o, "env"));
    const char *alert = json_string_value(json_object_get(o, "alert"));
    json_t *jn = json_object_get(o, "n"), *ja = json_object_get(o, "at");
    json_t *jh = json_object_get(o, "halted");
    const char *bad = NULL;
    if (!fmt || strcmp(fmt, window_format) || !json_is_integer(ver))
        bad = "not an alert window";
    else if (json_integer_value(ver) != WINDOW_VERSION)
        bad = "an alert window of another version than this build's (1)";
    else if (!env || strlen(env) >= sizeof v.env || !alert || strlen(alert) >= sizeof v.alert ||
             !json_is_integer(jn) || !json_is_integer(ja) || !json_is_integer(jh) ||
             !json_is_array(e) || json_integer_value(jn) < 0 ||
             json_integer_value(jn) > ARL_ROLLOUT_ALERT_WINDOW || json_integer_value(ja) < 0 ||
             json_integer_value(ja) >= ARL_ROLLOUT_ALERT_WINDOW ||
             (json_integer_value(jn) < ARL_ROLLOUT_ALERT_WINDOW &&
              json_integer_value(ja) != json_integer_value(jn)) ||
             json_array_size(e) != (size_t)json_integer_value(jn))
        bad = "an alert window with a missing or out-of-range field";
    for (size_t i = 0; !bad && i < json_array_size(e); i++) {
        json_t *x = json_array_get(e, i);
        json_t *m = json_array_get(x, 0), *c = json_array_get(x, 1);
        const char *code = json_string_value(json_array_get(x, 2));
        if (json_array_size(x) != 3 || !json_is_integer(m) || !json_is_integer(c) || !code ||
            strlen(code) >= sizeof v.code[0] || (uint64_t)json_integer_value(m) > 1 ||
            (uint64_t)json_integer_value(c) > 1) {
            bad = "an alert window with a malformed entry";
            break;
        }
        v.masked[i] = (uint8_t)json_integer_value(m);
        v.client[i] = (uint8_t)json_integer_value(c);
        snprintf(v.code[i], sizeof v.code[i], "%s", code);
    }
    if (!bad) {
        snprintf(v.env, sizeof v.env, "%s", env);
        snprintf(v.alert, sizeof v.alert, "%s", alert);
        v.n = (int32_t)json_integer_value(jn);
        v.at = (int32_t)json_integer_value(ja);
        v.halted = json_integer_value(jh) != 0;
    }
    json_decref(o);
    if (bad)
        return arl_errorf(ARL_ERR_STATE, "train: %s: %s; remove it to roll the update out again",
                          path, bad);
    *w = v;
    *found = 1;
    return ARL_OK;
}

/* Roll out tasks [lo, hi) into the store at root (replay/<dir>/r<R>): done if the store is
 * complete; an incomplete one is set aside first. */
/* Rollout rank ri rolls out tasks lo..hi-1 into its store at root.  The worker's task-offset
 * is lo, so its groups are named by the tasks' global indices ("<uid>/g<lo + j>") and each
 * trajectory's sampling stream, seeded from (rollout.seed, its name), is the same whichever
 * rank runs the task.  The bits still depend on the number of rollout ranks: a worker decodes
 * its tasks in one batch, and another batch rounds the stored behaviour log-probs differently
 * in the last bit (measured: the same tokens, other weights after the update), so a run keeps
 * its layout (layout_check). */
/* win_path: a training rollout's window file (above; NULL for an evaluation's). */
static arl_status rollout_store(tr_run *r, const char *root, const char *tasks_path,
                                const char *win_path, const char *run_uid, int eval, int64_t lo,
                                int64_t hi, int64_t version, const char *ckpt_dir,
                                int64_t ctx_tokens, arl_rollout_stats *stats) {
    memset(stats, 0, sizeof *stats);
    const char *kind = eval ? "eval" : "train";
    if (hi <= lo) return ARL_OK;
    if (store_complete(root, run_uid, kind, hi - lo)) {
        if (!win_path) return ARL_OK;
        int found = 0;
        ARL_TRY(window_load(win_path, &r->win, &found));
        /* a run of an older build (no window before it either): the store is kept, the
         * window goes on as it is */
        if (found || !r->win_exact) return ARL_OK;
        ARL_TRY(set_aside(root, "a rollout that stopped before it was recorded as finished (an "
                                "error such as the environment alert, or a kill)"));
    }
    if (path_exists(root)) ARL_TRY(set_aside(root, "an interrupted rollout"));
    ARL_TRY(write_tasks(r, tasks_path, eval, lo, hi));
    arl_rollout_config rc;
    ARL_TRY(rollout_cfg(r, &rc, tasks_path, run_uid, eval, lo, hi, version, ctx_tokens));
    arl_status s = ARL_OK;
    replay_store *st = NULL;
    arl_rollout_worker *w = NULL;
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    if (!s) s = replay_store_open(root, &oo, &st);
    arl_rollout_hooks hk = {.window = eval ? NULL : &r->win}; /* an evaluation measures */
    if (!s) s = arl_rollout_worker_open(&rc, ckpt_dir, st, 0, &hk, &w);
    if (!s) s = arl_rollout_worker_run(w);
    if (!s && win_path) s = window_save(win_path, &r->win);
    if (!s) *stats = *arl_rollout_worker_stats(w);
    arl_rollout_worker_close(w);
    replay_store_close(st);
    arl_rollout_config_free(&rc);
    return s;
}

/* ---- weights ---- */

/* Write the weights in r->params as policy/v<version>, the rollout workers' policy.  A version
 * found complete is kept, except at a process's first save: a resume's weights are its
 * checkpoint's, bit for bit those the version on disk was saved from, and that copy may have
 * been damaged since (a changed byte in its tensors is not detected when it is loaded; the
 * rollout made again after a kill would then use it, and the run go on with other bits). */
static arl_status save_policy(tr_run *r, int64_t version) {
    char dir[4200];
    pathf(dir, sizeof dir, r, "policy/v%lld", (long long)version);
    char cfgp[4300];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir);
    if (!r->policy_saved || !path_exists(cfgp)) {
        r->policy_saved = 1;
        char parent[4200];
        pathf(parent, sizeof parent, r, "policy");
        ARL_TRY(arl_mkdir_p(parent));
        if (path_exists(dir)) rm_tree(dir); /* a partial save, or the copy rewritten */
        const arl_status s = arl_checkpoint_save(dir, &r->mcfg, &r->params, 0);
        if (s)
            return arl_error_prefix(s, "saving policy version %lld for the rollout workers",
                                    (long long)version);
    }
    if (version >= 2) { /* keep the last two versions */
        char old[4200];
        pathf(old, sizeof old, r, "policy/v%lld", (long long)(version - 2));
        if (path_exists(old)) rm_tree(old);
    }
    return ARL_OK;
}

/* ---- SFT stage and the initial policy ---- */

/* resume: the user's --resume (the SFT stage continues what an earlier attempt left either
 * way; this only decides whether it says that it found no checkpoint). */
static arl_status sft_stage(tr_run *r, int resume, char *init_out, size_t cap) {
    const arl_train_config *c = r->c;
    char dir[4200], demos[4300], done[4300];
    pathf(dir, sizeof dir, r, "sft");
    ARL_TRY(arl_mkdir_p(dir));
    snprintf(demos, sizeof demos, "%s/demos.jsonl", dir);
    snprintf(done, sizeof done, "%s/demos.done", dir);
    const char *env = builtin_name(c->rollout.env);
    if (!path_exists(done)) {
        char tmp[4400];
        snprintf(tmp, sizeof tmp, "%s.tmp", demos);
        FILE *f = fopen(tmp, "w");
        if (!f) return arl_file_write_failed(tmp, "train: cannot open for writing", errno);
        arl_env_demos_stats ds;
        const char *opts = c->sft_demo_options ? c->sft_demo_options : c->rollout.task_data;
        arl_status s;
        if (c->eval_split > 0) {
            /* training prompts only: the demonstrations of the first sft-demos seeds from
             * sft-demo-seed whose prompt is not held out */
            int64_t *seeds = malloc(sizeof(int64_t) * (size_t)c->sft_demos);
            const arl_heldout_split sp = {c->eval_split, c->validation_split};
            s = seeds ? arl_heldout_side_seeds(env, (uint64_t)c->sft_demo_seed, opts, &sp,
                                               ARL_HELDOUT_SIDE_TRAIN, c->sft_demos,
                                               scan_cap(c->sft_demos, 1 - sp.test - sp.validation),
                                               seeds)
                      : arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
            memset(&ds, 0, sizeof ds);
            for (int64_t j = 0; !s && j < c->sft_demos; j++) {
                arl_env_demos_stats d1;
                s = arl_env_demos_write(env, 1, (uint64_t)seeds[j], opts, f, &d1);
                ds.episodes += d1.episodes;
                ds.written += d1.written;
            }
            free(seeds);
        } else {
            s = arl_env_demos_write(env, c->sft_demos, (uint64_t)c->sft_demo_seed, opts, f, &ds);
        }
        /* a failed write: the file and the system's reason (the writer's message has neither;
         * stdio goes on failing on a full disk, so errno is the failed write's) */
        if (ferror(f) || (!s && (fflush(f) || fsync(fileno(f)))))
            s = arl_file_write_failed(tmp, "train: cannot write", errno);
        if (fclose(f) && !s) s = arl_file_write_failed(tmp, "train: cannot write", errno);
        if (s) {
            remove(tmp);
            return arl_error_prefix(s, "train: SFT demonstrations of %s", env);
        }
        if (rename(tmp, demos))
            return arl_errorf(ARL_ERR_IO, "train: cannot rename %s: %s", tmp, strerror(errno));
        char note[256];
        snprintf(note, sizeof note, "{\"episodes\": %lld, \"written\": %lld}\n",
                 (long long)ds.episodes, (long long)ds.written);
        ARL_TRY(write_text(done, note));
        say(r, "train: SFT stage: %lld teacher demonstrations of %s (%lld written) in %s",
            (long long)ds.episodes, env, (long long)ds.written, demos);
    }
    arl_sft_config sc;
    size_t n;
    const arl_option *t = arl_sft_options(&n);
    memset(&sc, 0, sizeof sc);
    arl_status s = arl_options_defaults(t, n, &sc);
    /* copy the section: its resolved values through JSON, then the driver's keys */
    char *js = s ? NULL : arl_options_to_json(t, n, &c->sft);
    json_t *j = js ? arl_json_loads(js, 0, NULL) : NULL;
    free(js);
    if (!s && !j) s = arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
    if (!s) {
        const char *key;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(j, tmp, key, v) {
            if (json_is_null(v) || sft_key_reserved(key)) json_object_del(j, key);
        }
        s = parse_section(t, n, j, "sft section", &sc);
    }
    json_decref(j);
    char num[64];
    if (!s && c->model) s = arl_options_set(t, n, "model", c->model, &sc);
    if (!s && c->init) s = arl_options_set(t, n, "init", c->init, &sc);
    snprintf(num, sizeof num, "%lld", (long long)c->init_seed);
    if (!s) s = arl_options_set(t, n, "init-seed", num, &sc);
    if (!s) s = arl_options_set(t, n, "data", demos, &sc);
    if (!s) s = arl_options_set(t, n, "out", dir, &sc);
    snprintf(num, sizeof num, "%lld", (long long)c->threads);
    if (!s) s = arl_options_set(t, n, "threads", num, &sc);
    if (!s) s = arl_options_set(t, n, "progress", r->rank0 && r->log ? c->progress : "off", &sc);
    arl_sft_result sres;
    if (!s)
        s = arl_sft_run(&sc, arl_sft_model_ops_default(), resume ? 1 : 2, NULL,
                        r->rank0 ? r->log : NULL, &sres);
    if (!s && !sres.checkpoint[0])
        s = arl_errorf(ARL_ERR_STATE, "train: the SFT stage wrote no checkpoint");
    if (!s) snprintf(init_out, cap, "%s", sres.checkpoint);
    arl_options_free(t, n, &sc);
    return s ? arl_error_prefix(s, "train: SFT stage") : ARL_OK;
}

/* rank 0: the initial policy (SFT result, init checkpoint or from scratch) as OUT/reference. */
static arl_status make_reference(tr_run *r, int resume) {
    char ref[4200], cfgp[4300];
    pathf(ref, sizeof ref, r, "reference");
    snprintf(cfgp, sizeof cfgp, "%s/config.json", ref);
    if (path_exists(cfgp)) return ARL_OK;
    char init[4200] = "";
    if (r->c->sft_demos > 0)
        ARL_TRY(sft_stage(r, resume, init, sizeof init));
    else if (r->c->init)
        snprintf(init, sizeof init, "%s", r->c->init);
    arl_model_params p;
    ARL_TRY(arl_model_params_alloc(&p, &r->mcfg));
    arl_status s = init[0] ? arl_checkpoint_load(init, &r->mcfg, &p)
                           : arl_params_init(&p, &r->mcfg, (uint64_t)r->c->init_seed, 0);
    if (path_exists(ref)) rm_tree(ref);
    if (!s) s = arl_checkpoint_save(ref, &r->mcfg, &p, 0);
    arl_model_params_free(&p);
    if (!s)
        say(r, "train: initial policy (the KL reference) %s%s", init[0] ? "from " : "from scratch",
            init[0] ? init : "");
    return s;
}

/* ---- evaluation ---- */

/* Evaluate the policy at ckpt on the held-out tasks (once: a finished arm is read back from
 * OUT/eval-<name>.json).  outc (rank 0; eval_tasks + 1 bytes): the outcome of task j as
 * outc[j] ('1' success, '0' failure, '-' no valid episode), kept in OUT/eval-<name>.outcomes
 * for the paired comparison of the two arms; left all '-' when that file is missing. */
/* Whether a store of the evaluation under dir (dir/r<ri>, run uid) evaluated a policy other
 * than `version`: its run records no such version (the final policy of a run whose steps were
 * raised after it finished).  An unreadable store is the rollout's to deal with: not stale. */
static int eval_store_stale(const tr_run *r, const char *dir, const char *uid, int64_t version) {
    int stale = 0;
    for (int64_t ri = 0; !stale && ri < r->R; ri++) {
        char root[4300];
        snprintf(root, sizeof root, "%s/r%lld", dir, (long long)ri);
        char cat[4400];
        snprintf(cat, sizeof cat, "%s/catalog.sqlite", root);
        if (!path_exists(cat)) continue;
        replay_store *st = NULL;
        replay_open_opts oo = {.flags = REPLAY_OPEN_READONLY};
        int64_t run_id;
        replay_version_row v;
        if (replay_store_open(root, &oo, &st) == ARL_OK &&
            replay_run_find(st, uid, &run_id) == ARL_OK)
            stale = replay_version_get(st, run_id, version, &v) == ARL_ERR_NOT_FOUND;
        replay_store_close(st);
        arl_error_clear();
    }
    return stale;
}

static arl_status eval_arm(tr_run *r, const char *name, const char *ckpt, int64_t version,
                           arl_report_eval_arm *arm, char *outc) {
    char file[4200], dir[4200], ofile[4200];
    pathf(file, sizeof file, r, "eval-%s.json", name);
    pathf(ofile, sizeof ofile, r, "eval-%s.outcomes", name);
    const int64_t E = r->c->eval_tasks;
    memset(outc, '-', (size_t)E);
    outc[E] = 0;
    arm->episodes = -1;
    arm->successes = 0;
    /* the held-out set of this run ("": seeds, no prompt split); an arm evaluated on another
     * set (eval-set changed before a resume) is not read back as this one */
    const char *set = r->c->eval_split > 0 ? r->c->eval_set : "";
    arl_status bad = ARL_OK;
    char uid[256];
    snprintf(uid, sizeof uid, "%s-eval-%s", r->c->rollout.run_uid, name);
    pathf(dir, sizeof dir, r, "replay/eval-%s", name);
    /* an evaluation of another policy (steps raised on a finished run): not this arm's */
    if (r->rank0 && path_exists(dir) && eval_store_stale(r, dir, uid, version)) {
        if (unlink(file) && errno != ENOENT)
            bad = arl_errorf(ARL_ERR_IO, "train: cannot remove %s: %s", file, strerror(errno));
        if (!bad && unlink(ofile) && errno != ENOENT)
            bad = arl_errorf(ARL_ERR_IO, "train: cannot remove %s: %s", ofile, strerror(errno));
        if (!bad) {
            char what[200];
            snprintf(what, sizeof what, "an evaluation of another policy than version %lld",
                     (long long)version);
            bad = set_aside_as(dir, "stale", what);
        }
    }
    if (r->rank0 && !bad && path_exists(file)) {
        arl_report_eval e;
        if (arl_report_eval_read(file, &e) != ARL_OK) {
            arl_error_clear();
        } else if (e.set[0] && strcmp(e.set, set)) {
            bad = arl_errorf(ARL_ERR_STATE,
                             "train: %s holds an evaluation of the %s set, and this run "
                             "evaluates the %s set (eval-set): remove %s, eval-%s.outcomes and "
                             "replay/eval-%s to evaluate again",
                             file, e.set, set[0] ? set : "seed", file, name, name);
        } else {
            /* read back with its per-task outcomes; without them (a stop between the two files,
             * or one removed) the arm is counted again from its store, which is kept */
            char *t = NULL;
            if (arl_file_read(ofile, 0, &t, NULL) == ARL_OK && (int64_t)strcspn(t, "\n") == E) {
                memcpy(outc, t, (size_t)E);
                *arm = strcmp(name, "after") ? e.before : e.after;
            } else {
                arl_error_clear();
            }
            free(t);
        }
    }
    ARL_TRY(sync_status(r, bad));
    int64_t have = arm->episodes;
    ARL_TRY(arl_dist_bcast_bytes(r->d->world, &have, sizeof have, 0));
    if (have >= 0) return ARL_OK;
    const double t0 = now_s();
    arl_status s = ARL_OK;
    if (r->L->roles & ARL_DIST_ROLE_ROLLOUT) {
        const int64_t ri = r->L->rollout_index, R = r->R;
        char root[4300], tasks[4300];
        snprintf(root, sizeof root, "%s/r%lld", dir, (long long)ri);
        snprintf(tasks, sizeof tasks, "%s/tasks-r%lld.jsonl", dir, (long long)ri);
        s = arl_mkdir_p(dir);
        arl_rollout_stats rs;
        if (!s)
            s = rollout_store(r, root, tasks, NULL, uid, 1, ri * E / R, (ri + 1) * E / R, version,
                              ckpt, 0, &rs);
    }
    ARL_TRY(sync_status(r, s));
    if (r->rank0) {
        tr_counts tot = {0};
        for (int64_t ri = 0; !s && ri < r->R; ri++) {
            if ((ri + 1) * E / r->R <= ri * E / r->R) continue;
            char root[4300];
            snprintf(root, sizeof root, "%s/r%lld", dir, (long long)ri);
            tr_counts k;
            s = store_counts(root, uid, "eval", &k, outc, E); /* groups carry global indices */
            tot.members += k.members;
            tot.successes += k.successes;
        }
        if (!s) {
            arm->episodes = tot.members;
            arm->successes = tot.successes;
            arl_report_eval e;
            arl_report_eval_init(&e);
            if (strcmp(name, "after"))
                e.before = *arm;
            else
                e.after = *arm;
            snprintf(e.set, sizeof e.set, "%s", set);
            /* the outcomes first: eval-<name>.json marks the arm done */
            outc[E] = '\n';
            s = arl_write_file_atomic(ofile, outc, (size_t)E + 1);
            outc[E] = 0;
            if (!s) s = arl_report_eval_write(file, &e);
            double lo, hi;
            double p = arl_report_wilson(arm->successes, arm->episodes, ARL_REPORT_Z95, &lo, &hi);
            say(r,
                "train: evaluation %s: %lld/%lld held-out episodes succeed (%.3f, 95%% CI "
                "[%.3f, %.3f]; %s set), %.1f s",
                name, (long long)arm->successes, (long long)arm->episodes, p, lo, hi,
                r->c->eval_split > 0 ? r->c->eval_set : "seed", now_s() - t0);
        }
    }
    return sync_status(r, s);
}

/* ---- metrics file ---- */

/* Keep the lines of updates < keep (a resume repeats the updates after its checkpoint).  A cut
 * last line (a stop while it was written) is dropped; a whole line that is no metrics line
 * (the file damaged) is dropped with a warning naming it, the file as it was kept beside it as
 * PATH.damaged-<k>; updates < keep without a line are named in a warning. */
static arl_status metrics_truncate(const char *path, int64_t keep) {
    if (!path_exists(path)) {
        if (keep > 0)
            arl_log_warn("train: %s is missing: the report and metrics.csv lack updates 0 to %lld",
                         path, (long long)keep - 1);
        return ARL_OK;
    }
    char *text;
    ARL_TRY(arl_file_read(path, 0, &text, NULL));
    size_t n = strlen(text), o = 0;
    char *out = malloc(n + 1);
    unsigned char *seen = calloc((size_t)(keep > 0 ? keep : 1), 1);
    if (!out || !seen) {
        free(out);
        free(seen);
        free(text);
        return arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
    }
    char *p = text;
    int64_t line = 0, bad = 0, first_bad = 0;
    while (*p) {
        char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        line++;
        json_error_t je;
        json_t *j = arl_json_loadb(p, len, 0, &je);
        if (!j && len > 0 && arl_json_error_nomem(&je)) { /* (never a line dropped for it) */
            free(out);
            free(seen);
            free(text);
            return arl_errorf(ARL_ERR_NOMEM, "%s:%lld: out of memory", path, (long long)line);
        }
        json_t *st = json_object_get(j, "step");
        const int ok = json_is_integer(st) && json_integer_value(st) >= 0;
        if (e && ok && json_integer_value(st) < keep) { /* complete lines only */
            memcpy(out + o, p, len);
            o += len;
            out[o++] = '\n';
            seen[json_integer_value(st)] = 1;
        } else if (e && !ok && len > 0) {
            if (!bad++) first_bad = line;
        }
        json_decref(j);
        p += len + (e ? 1 : 0);
    }
    arl_status s = ARL_OK;
    if (bad) {
        char aside[4300];
        for (int k = 1;; k++) {
            snprintf(aside, sizeof aside, "%s.damaged-%d", path, k);
            if (!path_exists(aside)) break;
        }
        s = arl_write_file_atomic(aside, text, n);
        if (!s)
            arl_log_warn("train: %s: %lld line%s (the first: line %lld) %s no metrics line "
                         "(damaged): dropped; the file as it was is kept as %s",
                         path, (long long)bad, bad > 1 ? "s" : "", (long long)first_bad,
                         bad > 1 ? "are" : "is", aside);
    }
    int64_t missing = 0, first_missing = -1;
    for (int64_t u = 0; u < keep; u++)
        if (!seen[u] && !missing++) first_missing = u;
    if (!s && missing)
        arl_log_warn("train: %s has no line of %lld update%s before %lld (the first: update "
                     "%lld): the report and metrics.csv lack %s",
                     path, (long long)missing, missing > 1 ? "s" : "", (long long)keep,
                     (long long)first_missing, missing > 1 ? "them" : "it");
    if (!s) s = arl_write_file_atomic(path, out, o);
    free(seen);
    free(out);
    free(text);
    return s;
}

static arl_status metrics_append(const char *path, const char *line) {
    FILE *f = fopen(path, "a");
    if (!f) return arl_file_write_failed(path, "train: cannot open for appending", errno);
    int bad = fputs(line, f) < 0 || fputc('\n', f) < 0 || fflush(f) || fsync(fileno(f));
    int e = errno;
    if (fclose(f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    return bad ? arl_file_write_failed(path, "train: cannot append the metrics", e) : ARL_OK;
}

/* Mean kl/k3 over the last quarter of the updates in the metrics file (NaN: none). */
static double kl_mean_of(const char *path) {
    char *text;
    if (arl_file_read(path, 0, &text, NULL)) {
        arl_error_clear();
        return NAN;
    }
    double *v = NULL;
    size_t n = 0, cap = 0;
    for (char *p = text; *p;) {
        char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        json_t *j = arl_json_loadb(p, len, 0, NULL);
        json_t *k = json_object_get(j, "kl/k3");
        if (json_is_number(k)) {
            if (n == cap) {
                cap = cap ? 2 * cap : 64;
                double *nv = realloc(v, cap * sizeof *nv);
                if (!nv) break;
                v = nv;
            }
            v[n++] = json_number_value(k);
        }
        json_decref(j);
        p += len + (e ? 1 : 0);
    }
    free(text);
    double s = 0;
    size_t from = n - (n + 3) / 4;
    for (size_t i = from; i < n; i++)
        s += v[i];
    double m = n ? s / (double)(n - from) : NAN;
    free(v);
    return m;
}

/* ---- one update ---- */

static arl_status train_state_save(tr_run *r, int64_t done, int64_t n, const int64_t *const *gids,
                                   const int64_t *ngs) {
    arl_train_state ts;
    arl_train_state_init(&ts);
    ts.step = r->opt.step; /* optimizer steps (the moments' file is checked against it) */
    ts.tokens = r->tokens;
    ts.lr = r->last_lr;
    snprintf(ts.model_sha256, sizeof ts.model_sha256, "%s", r->model_sha);
    snprintf(ts.run_sha256, sizeof ts.run_sha256, "%s", r->run_sha);
    arl_rng rng;
    arl_rng_seed_stream(&rng, (uint64_t)r->c->seed, (uint64_t)done);
    arl_status s = arl_train_state_set_rng(&ts, "train", &rng);
    if (!s) s = arl_train_state_set_run_config(&ts, r->run_canon);
    ts.data.epoch = 0;
    ts.data.index = done * r->B;
    ts.data.items = 0;
    ts.data.seed = (uint64_t)r->c->rollout.task_seed;
    arl_klctl_state ks;
    arl_klctl_state_get(&r->kl, &ks);
    /* jansson's builders leave a part out quietly when an allocation fails: the state's extra
     * is written only when none did */
    const unsigned long jfail = arl_json_alloc_failures();
    json_t *extra = json_object();
    json_t *led = json_object();
    json_t *stores = json_array(), *groups = json_array();
    for (int64_t ri = 0; gids && ri < r->R; ri++) {
        char rel[256];
        snprintf(rel, sizeof rel, "replay/u%06lld/r%lld", (long long)n, (long long)ri);
        json_array_append_new(stores, json_string(rel));
        json_t *g = json_array();
        for (int64_t i = 0; i < ngs[ri]; i++)
            json_array_append_new(g, json_integer(gids[ri][i]));
        json_array_append_new(groups, g);
    }
    json_object_set_new(led, "update", json_integer(n));
    json_object_set_new(led, "stores", stores);
    json_object_set_new(led, "groups", groups);
    json_object_set_new(extra, "kl",
                        json_pack("{sfsI}", "coef", ks.coef, "updates", (json_int_t)ks.updates));
    json_object_set_new(extra, "updates", json_integer(done));
    json_object_set_new(extra, "tasks_next", json_integer(done * r->B));
    json_object_set_new(extra, "optimizer_steps", json_integer(r->opt.step));
    json_object_set_new(extra, "threads", json_integer(r->c->threads));
    /* the MPI layout: the stores are laid out by rollout rank, and the numbers depend on the
     * learner count (and on the rollout ranks' batches); a resume needs the same */
    json_object_set_new(extra, "mpi",
                        json_pack("{sIsIsI}", "ranks", (json_int_t)r->L->world_size, "learners",
                                  (json_int_t)r->L->n_learners, "rollout_ranks", (json_int_t)r->R));
    json_object_set_new(extra, "ledger", led);
    char *et =
        arl_json_alloc_failures() == jfail
            ? arl_json_dumps(extra, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))
            : NULL;
    json_decref(extra);
    if (!s)
        s = et ? arl_train_state_set_extra(&ts, et) : arl_errorf(ARL_ERR_NOMEM, "out of memory");
    free(et);
    char root[4200];
    pathf(root, sizeof root, r, "checkpoints");
    if (!s)
        s = arl_train_ckpt_save(root, &r->mcfg, &r->params, &r->opt, &ts, r->c->keep_last, 0, NULL,
                                0);
    arl_train_state_free(&ts);
    return s;
}

static arl_status ledger_commit(tr_run *r, int64_t n, double kl_next) {
    arl_status s = ARL_OK;
    char uid[256], pol[4200];
    snprintf(uid, sizeof uid, "%s-u%06lld", r->c->rollout.run_uid, (long long)n);
    pathf(pol, sizeof pol, r, "policy/v%lld", (long long)(n + 1));
    for (int64_t ri = 0; !s && ri < r->R; ri++) {
        if ((ri + 1) * r->B / r->R <= ri * r->B / r->R) continue;
        char root[4200];
        pathf(root, sizeof root, r, "replay/u%06lld/r%lld", (long long)n, (long long)ri);
        replay_store *st = NULL;
        replay_open_opts oo = {0};
        int64_t run_id, pending = -1;
        s = replay_store_open(root, &oo, &st);
        if (!s) s = replay_run_find(st, uid, &run_id);
        if (!s) s = replay_update_pending(st, run_id, &pending);
        if (!s && pending == n) { /* committed already (a resume): nothing to do */
            replay_version_desc next = {.checkpoint_uri = pol, .kl_coef = kl_next};
            s = replay_update_commit(st, run_id, n, -1, &next);
        }
        replay_store_close(st);
    }
    return s;
}

static void progress(tr_run *r, int64_t n, const char *mj, double t_roll, double t_learn,
                     double success) {
    if (!r->rank0 || !r->log || r->progress_line < 0) return;
    json_t *j = arl_json_loads(mj, 0, NULL);
#define M(k)                                                                                       \
    (json_is_number(json_object_get(j, k)) ? json_number_value(json_object_get(j, k)) : NAN)
    const double done = (double)(n + 1), total = (double)r->c->steps;
    const double el = now_s() - r->t0;
    const double per = (t_roll + t_learn);
    const double eta = per * (total - done);
    char line[512];
    snprintf(line, sizeof line,
             "train: update %lld/%lld  success %.3f  reward %.3f  kl %.2e (coef %.2e)  "
             "loss %.3e  rollout %.1fs  learn %.1fs  elapsed %.0fs  eta %.0fs",
             (long long)(n + 1), (long long)r->c->steps, success, M("reward/outcome/mean"),
             M("kl/k3"), M("kl/coef"), M("loss/total"), t_roll, t_learn, el, eta);
#undef M
    json_decref(j);
    if (r->progress_line == 1) {
        fprintf(r->log, "\r%s\033[K", line);
        r->line_open = 1;
    } else {
        fprintf(r->log, "%s\n", line);
    }
    fflush(r->log);
}

/* At least `want` learner files in the store (new ones registered, created and closed). */
static arl_status learner_files_ensure(replay_store *st, int32_t want) {
    size_t have = 0;
    ARL_TRY(replay_shards_of_kind(st, REPLAY_FILE_LEARNER, NULL, 0, &have));
    for (size_t i = have; i < (size_t)want; i++) {
        replay_writer *w = NULL;
        ARL_TRY(replay_writer_open(st, REPLAY_FILE_LEARNER, 0, NULL, &w));
        replay_writer_close(w);
    }
    return ARL_OK;
}

/* *id: this learner rank's learner file in the store of src (the learner_index-th in id order,
 * learner_files_ensure). */
static arl_status my_learner_file(const tr_run *r, const arl_update_source *src, int32_t *id) {
    const size_t me = r->L->learner_index > 0 ? (size_t)r->L->learner_index : 0;
    int32_t ids[256];
    size_t k = 0;
    ARL_TRY(replay_shards_of_kind(src->store, REPLAY_FILE_LEARNER, ids, 256, &k));
    if (me >= k || me >= 256)
        return arl_errorf(ARL_ERR_INTERNAL, "train: %s has %zu learner files, rank %zu's missing",
                          src->root, k, me);
    *id = ids[me];
    return ARL_OK;
}

/* This learner rank's learner_records of update n, each into its learner file of the
 * trajectory's store. */
static arl_status records_write(tr_run *r, int64_t n, const arl_update_source *src, int32_t nsrc) {
    int32_t shards[64];
    for (int32_t i = 0; i < nsrc; i++)
        ARL_TRY(my_learner_file(r, &src[i], &shards[i]));
    int64_t nr = 0;
    ARL_TRY(arl_learner_records_write(r->lr, n, src, nsrc, shards, &nr));
    arl_log_debug("train: update %lld: %lld learner records", (long long)n, (long long)nr);
    return ARL_OK;
}

static arl_status one_update(tr_run *r, int64_t n, const char *metrics_path) {
    const double t0 = now_s();
    char pol[4200], udir[4200], uid[256];
    pathf(pol, sizeof pol, r, "policy/v%lld", (long long)n);
    pathf(udir, sizeof udir, r, "replay/u%06lld", (long long)n);
    snprintf(uid, sizeof uid, "%s-u%06lld", r->c->rollout.run_uid, (long long)n);
    arl_status s = r->rank0 ? save_policy(r, n) : ARL_OK;
    if (!s && r->rank0) s = arl_mkdir_p(udir);
    ARL_TRY(sync_status(r, s));
    /* rollout */
    arl_rollout_stats rs;
    memset(&rs, 0, sizeof rs);
    const int64_t ctx = stage_tokens(r, n);
    if (r->L->roles & ARL_DIST_ROLE_ROLLOUT) {
        const int64_t ri = r->L->rollout_index;
        char root[4300], tasks[4300], win[4300];
        snprintf(root, sizeof root, "%s/r%lld", udir, (long long)ri);
        snprintf(tasks, sizeof tasks, "%s/tasks-r%lld.jsonl", udir, (long long)ri);
        snprintf(win, sizeof win, "%s/window-r%lld.json", udir, (long long)ri);
        const int64_t lo = n * r->B + ri * r->B / r->R, hi = n * r->B + (ri + 1) * r->B / r->R;
        /* the window before this update's rollout, for a rollout made again below */
        const arl_rollout_alert_window win0 = r->win;
        s = rollout_store(r, root, tasks, win, uid, 0, lo, hi, n, pol, ctx, &rs);
        if (!s && r->rc.segment_baseline == ARL_REWARD_SB_MC && hi > lo) {
            /* the continuations behind the Monte-Carlo segment baselines (spec/objective.md
             * 5.3), under this update's policy; a resumed update tops them up */
            arl_rollout_config fc;
            s = rollout_cfg(r, &fc, tasks, uid, 0, lo, hi, n, ctx);
            int interrupted = 0;
            if (!s) {
                fc.progress_s = 0;
                /* the forks' own states: as the user asked */
                s = arl_options_set(arl_rollout_options, arl_rollout_n_options, "state-cache",
                                    r->c->rollout.state_cache, &fc);
            }
            if (!s) s = arl_mc_forks_make(&fc, root, uid, pol, n, r->rc.mc_forks, &interrupted);
            if (!s && interrupted) {
                /* forks a kill left running: the rollout and its forks are made again, the
                 * same bits (streams follow the trajectories' names), as an uninterrupted run */
                s = set_aside(root, "forks of an interrupted run");
                r->win = win0;
                if (!s) s = rollout_store(r, root, tasks, win, uid, 0, lo, hi, n, pol, ctx, &rs);
                if (!s) s = arl_mc_forks_make(&fc, root, uid, pol, n, r->rc.mc_forks, &interrupted);
                if (!s && interrupted)
                    s = arl_errorf(ARL_ERR_INTERNAL, "train: %s: forks running after a new rollout",
                                   root);
            }
            if (!s && mc_keeps_states(r)) s = arl_mc_states_release(root);
            arl_rollout_config_free(&fc);
        }
    }
    ARL_TRY(sync_status(r, s));
    const double t1 = now_s();
    /* update */
    arl_update_source src[64];
    replay_store *stores[64] = {0};
    replay_writer *swriters[64] = {0}; /* keep-states: the learner files of the stores */
    int64_t *gids[64] = {0};
    int64_t ngs[64] = {0};
    int32_t nsrc = 0;
    char roots[64][4300];
    arl_update_result res;
    memset(&res, 0, sizeof res);
    if (r->R > 64) s = arl_errorf(ARL_ERR_CONFIG, "train: more than 64 rollout ranks");
    if (!s && (r->L->roles & ARL_DIST_ROLE_LEARNER)) {
        for (int64_t ri = 0; !s && ri < r->R; ri++) {
            const int64_t want = (ri + 1) * r->B / r->R - ri * r->B / r->R;
            if (want <= 0) continue;
            snprintf(roots[nsrc], sizeof roots[nsrc], "%s/r%lld", udir, (long long)ri);
            replay_open_opts oo = {0};
            int64_t run_id, ng = 0;
            size_t nplan = 0;
            s = replay_store_open(roots[nsrc], &oo, &stores[nsrc]);
            if (!s) s = replay_run_find(stores[nsrc], uid, &run_id);
            /* the consumption ledger (spec/replay.md 7.7): plan update n over the store's
             * final groups; a resume re-doing a committed update (its checkpoint was lost)
             * gets that update's recorded groups, the same ones */
            int64_t pending = -1;
            if (!s) s = replay_update_pending(stores[nsrc], run_id, &pending);
            if (!s && pending < 0) {
                s = replay_update_groups(stores[nsrc], run_id, n, &gids[nsrc], &nplan);
                if (!s && nplan == 0) {
                    free(gids[nsrc]);
                    gids[nsrc] = NULL;
                }
            }
            if (!s && !gids[nsrc])
                s = replay_update_plan(stores[nsrc], run_id, n, "train", (int32_t)want, &gids[nsrc],
                                       &nplan);
            ng = (int64_t)nplan;
            if (!s && ng != want)
                s = arl_errorf(ARL_ERR_STATE,
                               "train: %s: update %lld planned %lld groups, %lld "
                               "expected (the rollout did not finish its tasks)",
                               roots[nsrc], (long long)n, (long long)ng, (long long)want);
            if (s) {
                nsrc++;
                break;
            }
            src[nsrc] = (arl_update_source){.store = stores[nsrc],
                                            .root = roots[nsrc],
                                            .group_ids = gids[nsrc],
                                            .n_groups = ng};
            ngs[nsrc] = ng;
            nsrc++;
        }
        /* learner_records: the first learner rank registers one learner file per learner
         * rank in each store before the update, so that rank k writes into the k-th (in id
         * order) on a first attempt and on a re-run alike (its rows then replace the
         * attempt's); the update's collectives order the registration before the lookups */
        const int records = r->c->learner.own.records;
        const int keep = r->lc.keep_states != ARL_LEARNER_KEEP_OFF;
        if (!s && (records || keep) && r->L->learner_index <= 0)
            for (int32_t i = 0; !s && i < nsrc; i++)
                s = learner_files_ensure(stores[i], r->L->n_learners > 0 ? r->L->n_learners : 1);
        /* keep-states: the pi_old pass writes its states into this rank's learner file of each
         * store, looked up before the update (the learners agree on the registration first) */
        if (keep && r->d->learners) {
            int64_t v = s;
            const arl_status e = arl_dist_allreduce_i64(r->d->learners, &v, 1, ARL_DIST_MAX);
            if (!s && e) s = e;
            if (!s && v)
                s = arl_errorf((arl_status)v, "train: another learner failed (see its message)");
        }
        for (int32_t i = 0; !s && keep && i < nsrc; i++) {
            int32_t id = -1;
            s = my_learner_file(r, &src[i], &id);
            /* its writer collects it (spec/replay.md 7.6): the GC at open */
            if (!s)
                s = arl_learner_states_open(stores[i], id, r->lc.keep_states,
                                            r->c->learner.own.state_budget_bytes, &swriters[i]);
            if (s) s = arl_error_prefix(s, "train: the learner file of %s", roots[i]);
            src[i].states_out = swriters[i];
            r->states_gc_s = now_s();
        }
    }
    /* every rank agrees on entering the update: a learner that failed to set it up (a store it
     * cannot open, say) would otherwise wait here while the others wait in the update's
     * collectives, for ever */
    s = sync_status(r, s);
    if (!s && (r->L->roles & ARL_DIST_ROLE_LEARNER)) {
        s = arl_learner_update(r->lr, n, src, nsrc, &res);
        /* a learner that fails inside the update may leave the others in one of its
         * collectives: no more collectives, main aborts the job */
        if (s) r->broken = 1;
    }
    if (r->L->roles & ARL_DIST_ROLE_LEARNER) {
        const int records = r->c->learner.own.records;
        const int keep = r->lc.keep_states != ARL_LEARNER_KEEP_OFF;
        /* ... and between updates, once learner.state-gc-interval-s have passed since */
        if (!s && keep &&
            now_s() - r->states_gc_s >= (double)r->c->learner.own.state_gc_interval_s) {
            for (int32_t i = 0; !s && i < nsrc; i++)
                if (swriters[i])
                    s = arl_learner_states_gc(swriters[i], r->lc.keep_states,
                                              r->c->learner.own.state_budget_bytes, NULL);
            r->states_gc_s = now_s();
        }
        for (int32_t i = 0; i < nsrc; i++) {
            replay_writer_close(swriters[i]);
            swriters[i] = NULL;
            src[i].states_out = NULL;
        }
        if (!s && keep)
            arl_log_info("train: update %lld: %lld learner states kept", (long long)n,
                         (long long)res.states_saved);
        if (!s && records) s = records_write(r, n, src, nsrc);
    }
    for (int32_t i = 0; i < nsrc; i++)
        replay_store_close(stores[i]);
    s = sync_status(r, s);
    const double t2 = now_s();
    /* checkpoint, ledger, metrics (rank 0) */
    if (!s && r->rank0) {
        r->tokens += res.tokens;
        /* the metrics line is written only when no allocation of jansson failed as it was built
         * (a builder leaves the key out quietly) */
        const unsigned long jfail = arl_json_alloc_failures();
        json_t *lm = arl_json_loads(res.metrics_json, 0, NULL);
        json_t *lr = json_object_get(lm, "optim/lr");
        if (json_is_number(lr)) r->last_lr = json_number_value(lr);
        /* rollout figures from the stores (also right for a rollout done before a resume) */
        tr_counts tot = {0};
        int64_t forks = 0;
        for (int64_t ri = 0; !s && ri < r->R; ri++) {
            if ((ri + 1) * r->B / r->R <= ri * r->B / r->R) continue;
            char root[4300];
            snprintf(root, sizeof root, "%s/r%lld", udir, (long long)ri);
            tr_counts k;
            s = store_counts(root, uid, "train", &k, NULL, 0);
            tot.members += k.members;
            tot.valid += k.valid;
            tot.successes += k.successes;
            tot.outcome_sum += k.outcome_sum;
            if (!s && r->rc.segment_baseline == ARL_REWARD_SB_MC) {
                s = store_counts(root, uid, "fork", &k, NULL, 0);
                forks += k.members;
            }
        }
        const double success = tot.valid ? (double)tot.successes / (double)tot.valid : 0;
        json_t *m = json_object();
        json_object_set_new(m, "step", json_integer(n));
        json_object_set_new(m, "version", json_integer(n));
        json_object_set_new(m, "rollout/success_rate", json_real(success));
        json_object_set_new(m, "rollout/trajectories", json_integer(tot.members));
        json_object_set_new(m, "rollout/context_tokens", json_integer(ctx));
        if (r->rc.segment_baseline == ARL_REWARD_SB_MC)
            json_object_set_new(m, "rollout/mc_forks", json_integer(forks));
        json_object_set_new(m, "time/rollout_s", json_real(t1 - t0));
        json_object_set_new(m, "time/learn_s", json_real(t2 - t1));
        json_object_set_new(m, "time/step_s", json_real(now_s() - t0));
        json_object_update(m, lm);
        json_decref(lm);
        char *line =
            arl_json_alloc_failures() == jfail
                ? arl_json_dumps(m, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12))
                : NULL;
        json_decref(m);
        if (!s)
            s = line ? metrics_append(metrics_path, line)
                     : arl_errorf(ARL_ERR_NOMEM, "out of memory");
        free(line);
        /* the checkpoint after the metrics line: a resume from it keeps the lines of the
         * updates it holds, and drops (then writes again) those of the updates it re-does, so
         * that a stop between the two loses no line */
        const int last = n + 1 == r->c->steps;
        if (!s && ((n + 1) % r->c->checkpoint_interval == 0 || last))
            s = train_state_save(r, n + 1, n, (const int64_t *const *)gids, ngs);
        if (!s) s = ledger_commit(r, n, res.kl_coef_next);
        if (!s) progress(r, n, res.metrics_json, t1 - t0, t2 - t1, success);
    }
    free(res.metrics_json);
    for (int32_t i = 0; i < 64; i++)
        free(gids[i]);
    return sync_status(r, s);
}

/* ---- setup and the whole run ---- */

static void run_free(tr_run *r) {
    arl_dirlock_release(&r->lock);
    free(r->run_canon);
    arl_learner_free(r->lr);
    if (r->have_opt) arl_adamw_free(&r->opt);
    if (r->have_params) {
        arl_model_params_free(&r->params);
        arl_model_params_free(&r->ref);
    }
    if (r->have_mcfg) arl_model_config_free(&r->mcfg);
    for (int64_t i = 0; i < r->n_dataset; i++)
        json_decref(r->dataset[i]);
    free(r->dataset);
    free(r->train_seeds);
    free(r->eval_seeds);
}

static arl_status any_checkpoint(const char *root, int64_t *step) {
    char p[4200];
    arl_status s = arl_train_ckpt_latest(root, p, sizeof p, step);
    if (s == ARL_ERR_NOT_FOUND) {
        arl_error_clear();
        *step = -1;
        return ARL_OK;
    }
    return s;
}

/* "N ranks (L learners, R rollout workers)" for the layout, or "R rollout workers" (L < 0:
 * a checkpoint that records its rollout ranks only). */
static void layout_text(char *buf, size_t cap, int64_t ranks, int64_t learners, int64_t rollout) {
    if (learners < 0)
        snprintf(buf, cap, "%lld rollout worker%s", (long long)rollout, rollout == 1 ? "" : "s");
    else
        snprintf(buf, cap, "%lld MPI rank%s (%lld learner%s, %lld rollout worker%s)",
                 (long long)ranks, ranks == 1 ? "" : "s", (long long)learners,
                 learners == 1 ? "" : "s", (long long)rollout, rollout == 1 ? "" : "s");
}

/* --resume: the checkpoint at dir (its train_state's extra x) was written by a job of this
 * run's MPI layout.  Another number of ranks finds the stores of the updates laid out by other
 * rollout ranks (it failed on a store that was never made) and trains with another learner
 * count: refused, naming both.  A checkpoint without the record (older builds) is compared by
 * the stores its ledger lists, one per rollout rank. */
static arl_status layout_check(const tr_run *r, json_t *x, const char *dir) {
    const json_t *m = json_object_get(x, "mpi");
    int64_t ranks = -1, learners = -1, rollout = -1;
    if (json_is_object(m)) {
        ranks = json_integer_value(json_object_get(m, "ranks"));
        learners = json_integer_value(json_object_get(m, "learners"));
        rollout = json_integer_value(json_object_get(m, "rollout_ranks"));
    } else {
        const json_t *st = json_object_get(json_object_get(x, "ledger"), "stores");
        if (!json_is_array(st) || json_array_size(st) == 0) return ARL_OK;
        rollout = (int64_t)json_array_size(st);
    }
    const arl_dist_layout *L = r->L;
    if ((ranks < 0 || ranks == L->world_size) && (learners < 0 || learners == L->n_learners) &&
        rollout == r->R)
        return ARL_OK;
    char was[160], now[160], hint[64] = "";
    layout_text(was, sizeof was, ranks, learners, rollout);
    layout_text(now, sizeof now, L->world_size, learners < 0 ? -1 : L->n_learners, r->R);
    if (ranks > 0) snprintf(hint, sizeof hint, " (mpirun -np %lld)", (long long)ranks);
    return arl_errorf(
        ARL_ERR_STATE,
        "train: %s was written by a job with %s, and this one has %s: a run continues "
        "with the layout it started with (its stores are laid out by rollout rank, "
        "its numbers depend on the learner count); resume with the same number of "
        "ranks%s, or start a new run in another output directory",
        dir, was, now, hint);
}

/* Load the newest training checkpoint (weights, moments, KL controller) into r; *start: the
 * updates it holds (0 without a checkpoint).  Rank 0 sets a damaged one aside and loads the one
 * before it (arl_train_ckpt_load_newest): the run re-does the updates after it (their rollouts
 * are in the stores, the ledger says which were committed) and ends as it would have.  The other
 * ranks load after rank 0 and find the damaged one gone. */
static arl_status resume_load(tr_run *r, int64_t *start, arl_train_result *res) {
    char root[4200], dir[4300];
    pathf(root, sizeof root, r, "checkpoints");
    int64_t step;
    arl_train_state ts;
    arl_status s = arl_train_ckpt_load_newest(root, &r->mcfg, r->run_sha, &r->params, &r->opt, &ts,
                                              r->rank0, dir, sizeof dir, &step);
    s = arl_train_ckpt_explain(s, dir, &r->mcfg, r->run_canon);
    if (s == ARL_ERR_NOT_FOUND) {
        arl_error_clear();
        return ARL_OK;
    }
    if (!s) {
        json_t *x = ts.extra_json ? arl_json_loads(ts.extra_json, 0, NULL) : NULL;
        json_t *k = json_object_get(x, "kl");
        json_t *u = json_object_get(x, "updates");
        arl_klctl_state ks = {.coef = json_number_value(json_object_get(k, "coef")),
                              .updates = json_integer_value(json_object_get(k, "updates"))};
        if (!json_is_object(k) || !json_is_integer(u))
            s = arl_errorf(ARL_ERR_CORRUPT,
                           "train: %s: train_state.json has no KL "
                           "controller state or update count in 'extra'",
                           dir);
        if (!s) s = arl_klctl_state_set(&r->kl, &ks);
        *start = json_integer_value(u);
        json_t *th = json_object_get(x, "threads"); /* (absent in states before it was kept) */
        if (!s && r->rank0 && json_is_integer(th) && json_integer_value(th) != r->c->threads)
            arl_log_warn("train: the checkpoint was written with threads = %lld, this run uses "
                         "%lld: matrix products may round differently (where the kernels' sums "
                         "depend on the split), so the resumed run may not be bit-identical to "
                         "an uninterrupted one",
                         (long long)json_integer_value(th), (long long)r->c->threads);
        if (!s) s = layout_check(r, x, dir);
        json_decref(x);
        r->tokens = ts.tokens;
        r->last_lr = ts.lr;
        if (!s && ts.data.index != *start * r->B)
            s = arl_errorf(ARL_ERR_CORRUPT,
                           "train: %s: data cursor %lld, expected %lld "
                           "(tasks-per-update changed?)",
                           dir, (long long)ts.data.index, (long long)(*start * r->B));
    }
    arl_train_state_free(&ts);
    if (!s) {
        res->resumed_from = *start;
        say(r, "train: resuming after update %lld from %s", (long long)*start, dir);
    }
    return s;
}

/* This rollout rank's alert window at the start of update start: empty at 0, else read from
 * the file its rollout of update start - 1 wrote (the window section above). */
static arl_status window_resume(tr_run *r, int64_t start) {
    const int64_t ri = r->L->rollout_index;
    r->win_exact = 1;
    if (start <= 0 || (ri + 1) * r->B / r->R <= ri * r->B / r->R) return ARL_OK;
    char p[4300];
    pathf(p, sizeof p, r, "replay/u%06lld/window-r%lld.json", (long long)(start - 1),
          (long long)ri);
    int found = 0;
    ARL_TRY(window_load(p, &r->win, &found));
    if (!found) {
        r->win_exact = 0;
        arl_log_warn("train: --resume: %s is missing (a run of an older build, or a removed "
                     "file): the client-fault alert window (spec/aep.md 8.6) starts empty, so an "
                     "alert may come at another trajectory than in an uninterrupted run",
                     p);
    }
    return ARL_OK;
}

/* Whether OUT holds what a run makes before its first training checkpoint (rank 0, fresh runs:
 * these would be taken up as this run's; *what names the first found). */
static int holds_run_outputs(const tr_run *r, char *what, size_t cap) {
    static const char *const made[] = {"reference", "sft", "replay"};
    for (size_t i = 0; i < sizeof made / sizeof made[0]; i++) {
        pathf(what, cap, r, "%s", made[i]);
        if (path_exists(what)) return 1;
    }
    return 0;
}

/* --resume: the settings of the run in the directory (its experiment.json) are this run's, as
 * far as they are hashed into the run hash: a run interrupted before its first training
 * checkpoint has no other record of them, and its stores, reference and SFT stage were made
 * with them.  No experiment.json: nothing to compare (the checkpoints keep their own). */
static arl_status snapshot_check(tr_run *r) {
    char p[4200];
    pathf(p, sizeof p, r, "experiment.json");
    if (!path_exists(p)) return ARL_OK;
    arl_train_config old;
    char *canon = NULL;
    arl_status s = arl_train_config_load(p, NULL, &old);
    if (!s) s = run_canon_of(&old, &canon);
    arl_train_config_free(&old);
    if (s)
        return arl_error_prefix(ARL_ERR_STATE,
                                "train: %s (the settings of the run to resume) cannot be read: "
                                "restore it, or remove it to resume without comparing the "
                                "settings (the training checkpoints keep their own)",
                                p);
    if (!strcmp(canon, r->run_canon)) {
        free(canon);
        return ARL_OK;
    }
    char text[1600];
    const int n = arl_run_config_diff(canon, r->run_canon, text, sizeof text);
    free(canon);
    /* a run that stopped before it saved anything but its settings (a set-up failure: no
     * reference, stores or checkpoints) has nothing they bind: it starts with these, and
     * snapshot_write replaces them */
    char what[4200];
    int64_t st1 = -1, st2 = -1;
    char p1[4200], p2[4200];
    pathf(p1, sizeof p1, r, "checkpoints");
    pathf(p2, sizeof p2, r, "sft/checkpoints");
    s = any_checkpoint(p1, &st1);
    if (!s) s = any_checkpoint(p2, &st2);
    if (s) return s;
    if (st1 < 0 && st2 < 0 && !holds_run_outputs(r, what, sizeof what)) {
        say(r,
            "train: --resume: the run in %s saved nothing but its settings; it starts with "
            "the settings as now (as saved -> as now: %s)",
            r->out, n > 0 ? text : "(the resolved configurations differ)");
        return ARL_OK;
    }
    return arl_errorf(ARL_ERR_STATE,
                      "train: %s: the run in %s has other settings (as saved -> as now): %s; "
                      "--resume needs the same settings: restore them, or start a new run in "
                      "another output directory",
                      p, r->out, n > 0 ? text : "(the resolved configurations differ)");
}

/* rank 0: the resolved configuration as OUT/experiment.json. */
static arl_status snapshot_write(tr_run *r) {
    char *j = arl_train_config_json(r->c);
    char p[4200];
    pathf(p, sizeof p, r, "experiment.json");
    const arl_status s = j ? write_text(p, j) : arl_errorf(ARL_ERR_NOMEM, "out of memory");
    free(j);
    return s;
}

/* rank 0, before the output directory is made: out must not lie inside another run's output
 * directory (a directory above it holds run.lock: train or sft) nor inside a replay store (out
 * or a directory above it holds catalog.sqlite), where this run's checkpoints, stores and
 * report would mix with that run's files (`replay list` of the outer store then finds this
 * run's stores as its own).  ARL_ERR_ARG naming both. */
static arl_status out_check_place(const char *out) {
    char buf[4096], real[4096], p[4200];
    if (snprintf(buf, sizeof buf, "%s", out) >= (int)sizeof buf)
        return arl_errorf(ARL_ERR_ARG, "key 'out': path too long");
    /* the deepest directory of out's path that exists (out itself when it does) */
    const char *got;
    while (!(got = realpath(buf, real))) {
        char *slash = strrchr(buf, '/');
        if (!slash) {
            snprintf(buf, sizeof buf, ".");
            if (!(got = realpath(buf, real))) return ARL_OK;
            break;
        }
        if (slash == buf) {
            snprintf(buf, sizeof buf, "/");
            if (!(got = realpath(buf, real))) return ARL_OK;
            break;
        }
        *slash = 0;
    }
    const int is_out = !strcmp(buf, out); /* real is out itself */
    struct stat sb;
    if (is_out && stat(real, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return arl_errorf(ARL_ERR_ARG, "key 'out': %s exists and is not a directory", out);
    for (int first = 1;; first = 0) {
        snprintf(p, sizeof p, "%s/catalog.sqlite", strcmp(real, "/") ? real : "");
        if (path_exists(p))
            return arl_errorf(ARL_ERR_ARG,
                              "key 'out': %s is %sthe replay store %s: choose an 'out' "
                              "outside it",
                              out, first && is_out ? "" : "inside ", real);
        snprintf(p, sizeof p, "%s/run.lock", strcmp(real, "/") ? real : "");
        if (!(first && is_out) && path_exists(p))
            return arl_errorf(ARL_ERR_ARG,
                              "key 'out': %s is inside the output directory of another run, %s "
                              "(it holds run.lock): choose an 'out' outside it",
                              out, real);
        char *slash = strrchr(real, '/');
        if (!slash || !strcmp(real, "/")) break;
        if (slash == real)
            real[1] = 0;
        else
            *slash = 0;
    }
    return ARL_OK;
}

arl_status arl_train_run(const arl_train_config *c, int resume, arl_dist *d, FILE *log,
                         arl_train_result *res) {
    arl_train_result dummy;
    if (!res) res = &dummy;
    memset(res, 0, sizeof *res);
    res->resumed_from = -1;
    tr_run rr, *r = &rr;
    memset(r, 0, sizeof *r);
    r->c = c;
    r->d = d;
    r->L = &d->layout;
    r->rank0 = d->layout.world_rank == 0;
    r->log = log;
    r->t0 = now_s();
    r->lock.fd = -1;
    r->B = c->tasks_per_update;
    r->G = c->rollout.group_size;
    r->R = d->layout.n_rollout;
    if (!log || !strcmp(c->progress, "off"))
        r->progress_line = -1;
    else if (!strcmp(c->progress, "line"))
        r->progress_line = 1;
    else if (!strcmp(c->progress, "plain"))
        r->progress_line = 0;
    else
        r->progress_line = isatty(fileno(log)) ? 1 : 0;
    if (!realpath(c->out, r->out)) snprintf(r->out, sizeof r->out, "%s", c->out);
    if (c->threads > 0) ARL_TRY(arl_k_threads_init((int)c->threads));
    /* the model first: a config that cannot be found or read from here (a shipped name such as
     * "tiny" is looked up from the current directory and the binary) writes nothing */
    arl_status s;
    if (c->model)
        s = arl_model_config_load(c->model, &r->mcfg);
    else {
        char p[4300];
        snprintf(p, sizeof p, "%s/config.json", c->init);
        s = arl_model_config_read(p, &r->mcfg);
    }
    r->have_mcfg = s == ARL_OK;
    if (s) arl_error_prefix(s, "key '%s'", c->model ? "model" : "init");
    /* the checkpoint to start from, with a model config beside it: read after the SFT
     * demonstrations otherwise (a missing one left sft/ behind) */
    static const char *const ckpt_files[] = {"config.json", "model.safetensors"};
    for (size_t i = 0; !s && c->model && c->init && i < 2; i++) {
        char p[4300];
        snprintf(p, sizeof p, "%s/%s", c->init, ckpt_files[i]);
        struct stat sb;
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode))
            s = arl_errorf(ARL_ERR_NOT_FOUND,
                           "key 'init': %s: no checkpoint there (no %s; a checkpoint is "
                           "config.json and model.safetensors, as agentrl model init or train "
                           "writes)",
                           c->init, ckpt_files[i]);
    }
    /* under mpirun, every rank has rank 0's settings, before anything is written */
    if (d->layout.world_size > 1) {
        s = sync_status(r, s);
        if (!s) s = settings_agree(r);
        s = sync_status(r, s);
    }
    /* a GPU asked for and none here: refused before anything is written, as the memory check
     * below (a run refused here has no output directory, and nothing to continue) */
    const char *gpu_key = NULL;
    if (!strcmp(c->learner.own.device, "cuda")) gpu_key = "learner";
    if (c->rollout.device && !strcmp(c->rollout.device, "cuda")) gpu_key = "rollout";
    if (!s && gpu_key && arl_cuda_device_count() <= 0)
        s = arl_errorf(ARL_ERR_DEVICE,
                       "train: %s.device is cuda, and this machine has no usable CUDA device (or "
                       "this build has no CUDA); use cpu",
                       gpu_key);
    /* what a learner rank will hold, before anything is written (a run refused here has no
     * output directory to continue): its weights and the reference weights, and on the CPU the
     * gradients and two AdamW moments */
    if (!s && (d->layout.roles & ARL_DIST_ROLE_LEARNER)) {
        const int cpu = strcmp(c->learner.own.device, "cuda") != 0;
        s = arl_params_memory_check_copies(&r->mcfg, cpu ? 5 : 2,
                                           cpu ? "train: a learner's weights, reference weights, "
                                                 "gradients and two AdamW moments"
                                               : "train: a learner's weights and reference "
                                                 "weights");
    }
    if (d->layout.world_size > 1) s = sync_status(r, s);
    /* output directory and the resume rule */
    if (r->rank0 && !s) {
        s = out_check_place(c->out);
        if (!s) s = arl_mkdir_p(c->out);
        if (!s && !realpath(c->out, r->out)) snprintf(r->out, sizeof r->out, "%s", c->out);
        /* one process in the directory (a second --resume of a running run, say) */
        if (!s) s = arl_dirlock_take(&r->lock, r->out, "train");
        int64_t st1 = -1, st2 = -1;
        char p1[4200], p2[4200], p3[4200];
        pathf(p1, sizeof p1, r, "checkpoints");
        pathf(p2, sizeof p2, r, "sft/checkpoints");
        if (!s) s = any_checkpoint(p1, &st1);
        if (!s) s = any_checkpoint(p2, &st2);
        if (!s && !resume && (st1 >= 0 || st2 >= 0))
            s = arl_errorf(ARL_ERR_STATE,
                           "train: %s already holds a run (checkpoints in %s); continue it with "
                           "--resume, or choose another 'out'",
                           r->out, st1 >= 0 ? p1 : p2);
        /* an interrupted run before its first checkpoint: its reference and stores would be
         * taken up as this run's, whatever its settings */
        if (!s && !resume && holds_run_outputs(r, p3, sizeof p3))
            s = arl_errorf(ARL_ERR_STATE,
                           "train: %s already holds a run (%s); continue it with --resume, or "
                           "choose another 'out'",
                           r->out, p3);
        /* what a kill in the middle of a write left (the run is this one's from here) */
        if (!s) s = out_tmp_sweep(r->out);
        /* a resume writes it once its settings are known to be the run's (below) */
        if (!s && !resume) s = snapshot_write(r);
        if (!s && log) {
            arl_train_config_print(c, log);
            fflush(log);
        }
    }
    s = sync_status(r, s);
    if (!s) s = arl_dist_bcast_bytes(d->world, r->out, sizeof r->out, 0);
    if (s) {
        res->failure_shared = r->agreed && !r->broken;
        run_free(r);
        return s;
    }
    /* configuration of the objective */
    s = arl_model_config_hash_hex(&r->mcfg, r->model_sha);
    r->ocfg = c->learner.optim;
    r->ocfg.total_steps = resolved_total_steps(c);
    if (!s) s = arl_reward_config_from_opts(&c->learner.reward, &r->rc);
    if (!s) s = arl_loss_config_from_opts(&c->learner.loss, &r->lossc);
    if (!s) s = arl_kl_config_from_opts(&c->learner.kl, &r->klc);
    if (!s) s = run_hash(r);
    /* a refused resume leaves the run's own experiment.json as it was */
    if (!s && resume && r->rank0) s = snapshot_check(r);
    if (!s) s = load_dataset(r);
    if (!s) s = split_seeds(r);
    r->lc.minibatches = (int32_t)c->learner.own.minibatches;
    r->lc.max_tokens = c->learner.own.max_tokens;
    r->lc.max_docs = (int32_t)c->learner.own.max_docs;
    r->lc.routing_replay = c->learner.own.routing_replay;
    r->lc.ref_routing_replay = !strcmp(c->learner.own.ref_routing, "replay");
    r->lc.prefix_per_minibatch = !strcmp(c->learner.own.prefix_refresh, "per_minibatch");
    r->lc.act_checkpoint = c->learner.own.act_checkpoint;
    snprintf(r->lc.device, sizeof r->lc.device, "%s", c->learner.own.device);
    snprintf(r->lc.device_allreduce, sizeof r->lc.device_allreduce, "%s",
             c->learner.own.device_allreduce);
    snprintf(r->lc.device_math, sizeof r->lc.device_math, "%s", c->learner.own.device_math);
    r->lc.device_slot_rows = c->learner.own.device_slot_rows;
    r->lc.state_cache_bytes = (int64_t)(c->learner.own.state_cache_mb * 1048576.0);
    r->lc.drift_sample = c->learner.own.drift_sample;
    r->lc.shared_prefix = c->learner.own.shared_prefix;
    r->lc.keep_states = !strcmp(c->learner.own.keep_states, "all")      ? ARL_LEARNER_KEEP_ALL
                        : !strcmp(c->learner.own.keep_states, "pinned") ? ARL_LEARNER_KEEP_PINNED
                                                                        : ARL_LEARNER_KEEP_OFF;
    r->lc.shared_prefix_min = c->learner.own.shared_prefix_min;
    r->lc.seed = (uint64_t)c->seed;
    r->lc.n_traj_per_update = r->B * r->G;
    r->lc.segment_tokens = c->rollout.segment_tokens;
    r->lc.max_context = c->rollout.context_tokens;      /* (every context stage is within it) */
    r->lc.max_context_key = "rollout.context-tokens";
    r->lc.mla_sparse_topk = c->rollout.mla_sparse_topk; /* one setting for rollout and learner */
    r->lc.mla_sparse_chunk = c->rollout.mla_sparse_chunk;
    s = sync_status(r, s);
    /* SFT stage and the reference (rank 0) */
    if (!s && r->rank0) s = make_reference(r, resume);
    s = sync_status(r, s);
    char refdir[4200];
    pathf(refdir, sizeof refdir, r, "reference");
    const int learner = (r->L->roles & ARL_DIST_ROLE_LEARNER) != 0;
    if (!s && learner) {
        s = arl_model_params_alloc(&r->params, &r->mcfg);
        if (!s) s = arl_model_params_alloc(&r->ref, &r->mcfg);
        r->have_params = !s;
        if (!s) s = arl_checkpoint_load(refdir, &r->mcfg, &r->ref);
        if (!s) s = arl_checkpoint_load(refdir, &r->mcfg, &r->params);
        if (!s) s = arl_adamw_init(&r->opt, &r->mcfg, &r->ocfg);
        r->have_opt = !s;
        if (!s) s = arl_klctl_init(&r->kl, &r->klc);
    }
    s = sync_status(r, s);
    /* resume from the newest training checkpoint that loads: rank 0 first (it sets a damaged
     * one aside), then the other learner ranks */
    int64_t start = 0;
    if (!s && resume && learner && r->rank0) s = resume_load(r, &start, res);
    if (!s && resume && r->rank0) s = snapshot_write(r);
    s = sync_status(r, s);
    if (!s && resume && learner && !r->rank0) s = resume_load(r, &start, res);
    s = sync_status(r, s);
    if (!s) s = arl_dist_bcast_bytes(d->world, &start, sizeof start, 0);
    /* each rollout rank's alert window as it was after the rollout of update start - 1 */
    if (!s && (r->L->roles & ARL_DIST_ROLE_ROLLOUT)) s = window_resume(r, start);
    s = sync_status(r, s);
    /* a planned update whose checkpoint exists is committed (spec/replay.md 7.7) */
    if (!s && r->rank0 && start > 0) s = ledger_commit(r, start - 1, arl_klctl_beta(&r->kl));
    s = sync_status(r, s);
    /* evaluation before */
    char polfinal[4200];
    arl_report_eval ev;
    arl_report_eval_init(&ev);
    char *outc[2] = {NULL, NULL}; /* per-task outcomes of the arms before, after */
    if (!s && c->eval_tasks > 0) {
        outc[0] = malloc((size_t)c->eval_tasks + 1);
        outc[1] = malloc((size_t)c->eval_tasks + 1);
        if (!outc[0] || !outc[1]) s = arl_errorf(ARL_ERR_NOMEM, "train: out of memory");
    }
    if (!s && c->eval_tasks > 0 && c->eval_before)
        s = eval_arm(r, "before", refdir, 0, &ev.before, outc[0]);
    /* learner */
    if (!s && learner) {
        arl_learner_init in = {.cfg = &r->mcfg,
                               .params = &r->params,
                               .ref_params = &r->ref,
                               .opt = &r->opt,
                               .kl = &r->kl,
                               .reward = &r->rc,
                               .loss = &r->lossc,
                               .lc = &r->lc,
                               .dist = d->layout.world_size > 1 ? d : NULL};
        s = arl_learner_create(&r->lr, &in);
        if (s) r->broken = 1; /* (its device set-up broadcasts over the learners) */
    }
    s = sync_status(r, s);
    char metrics[4200];
    pathf(metrics, sizeof metrics, r, "metrics.jsonl");
    if (!s && r->rank0) s = metrics_truncate(metrics, start);
    s = sync_status(r, s);
    if (!s && start < c->steps)
        say(r, "train: %lld updates of %lld tasks x %lld samples (%s), output %s",
            (long long)(c->steps - start), (long long)r->B, (long long)r->G, c->rollout.env,
            r->out);
    if (!s && start < c->steps && r->G == 1 && r->rank0)
        arl_log_warn("train: rollout.group-size is 1: every group is degenerate "
                     "(spec/objective.md 5.9), so outcome advantages are 0 and segment and "
                     "process returns have no baseline from other samples%s",
                     r->rc.segment_baseline == ARL_REWARD_SB_MC
                         ? " (the Monte-Carlo forks give segments one)"
                         : "; use group-size >= 2 to learn from outcomes");
    for (int64_t n = start; !s && n < c->steps; n++) {
        s = one_update(r, n, metrics);
        if (!s) res->updates = n + 1;
    }
    if (!s) res->updates = c->steps;
    /* evaluation after */
    if (!s && c->eval_tasks > 0 && c->eval_after) {
        if (r->rank0) s = save_policy(r, c->steps);
        s = sync_status(r, s);
        pathf(polfinal, sizeof polfinal, r, "policy/v%lld", (long long)c->steps);
        if (!s) s = eval_arm(r, "after", polfinal, c->steps, &ev.after, outc[1]);
    }
    /* the paired table: tasks with a valid episode in both arms */
    if (!s && r->rank0 && c->eval_tasks > 0 && c->eval_before && c->eval_after) {
        arl_report_eval_paired pp = {0};
        for (int64_t j = 0; j < c->eval_tasks; j++) {
            const char a = outc[0][j], b = outc[1][j];
            if (a == '-' || b == '-') continue;
            pp.tasks++;
            if (a == '1' && b == '1') pp.both++;
            if (a == '1' && b == '0') pp.before_only++;
            if (a == '0' && b == '1') pp.after_only++;
            if (a == '0' && b == '0') pp.neither++;
        }
        if (pp.tasks > 0) ev.paired = pp;
    }
    free(outc[0]);
    free(outc[1]);
    /* eval.json and the report: files an interrupt does not leave half written (the CLI holds
     * the signal until they are, core/defer.h) */
    if (!s && r->rank0) {
        arl_defer_begin();
        char p[4200];
        if (c->eval_tasks > 0) {
            ev.kl_target = r->klc.target;
            ev.kl_mean = kl_mean_of(metrics);
            if (c->eval_split > 0) snprintf(ev.set, sizeof ev.set, "%s", c->eval_set);
            pathf(p, sizeof p, r, "eval.json");
            s = arl_report_eval_write(p, &ev);
            res->eval_episodes = ev.before.episodes > 0 ? ev.before.episodes : ev.after.episodes;
            res->before_successes = ev.before.successes;
            res->after_successes = ev.after.successes;
        }
        if (!s && path_exists(metrics)) {
            char title[4400];
            snprintf(title, sizeof title, "%s", c->title ? c->title : r->out);
            arl_report_result rep;
            s = arl_report_generate(r->out, NULL, title, &rep, NULL);
            if (!s)
                say(r, "train: report: %s/summary.md, %d plots, metrics.csv", r->out, rep.plots);
        }
        arl_defer_end();
        if (!s && c->eval_tasks > 0 && ev.before.episodes > 0 && ev.after.episodes > 0) {
            double lo, hi;
            double dlt =
                arl_report_newcombe(ev.after.successes, ev.after.episodes, ev.before.successes,
                                    ev.before.episodes, ARL_REPORT_Z95, &lo, &hi);
            say(r,
                "train: held-out success %lld/%lld -> %lld/%lld (difference %+.3f, 95%% CI "
                "[%+.3f, %+.3f] unpaired)",
                (long long)ev.before.successes, (long long)ev.before.episodes,
                (long long)ev.after.successes, (long long)ev.after.episodes, dlt, lo, hi);
            if (ev.paired.tasks > 0) {
                dlt = arl_report_newcombe_paired(&ev.paired, ARL_REPORT_Z95, &lo, &hi);
                say(r,
                    "train: paired over %lld tasks: %lld fail -> succeed, %lld succeed -> fail "
                    "(difference %+.3f, 95%% CI [%+.3f, %+.3f], McNemar exact p = %.3g)",
                    (long long)ev.paired.tasks, (long long)ev.paired.after_only,
                    (long long)ev.paired.before_only, dlt, lo, hi,
                    arl_report_mcnemar_exact(ev.paired.before_only, ev.paired.after_only));
            }
        }
    }
    s = sync_status(r, s);
    res->seconds = now_s() - r->t0;
    if (!s)
        say(r, "train: done: %lld updates in %.0f s; output %s", (long long)res->updates,
            res->seconds, r->out);
    if (s) res->failure_shared = r->agreed && !r->broken;
    run_free(r);
    return s;
}
