/* experiments/sft.c: the SFT experiment -- option table, configuration, the training loop
 * with evaluation, metrics, progress, checkpoints and exact resume (see sft.h). */
#include "experiments/sft.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/assert.h"
#include "core/dirlock.h"
#include "core/file.h"
#include "core/json_dump.h"
#include "core/log.h"
#include "core/rng.h"
#include "core/sha256.h"
#include "experiments/set_arg.h"
#include "kernels/threadpool.h"
#include "policy/checkpoint.h"
#include "policy/train_state.h"

extern const arl_sft_model_ops arl_sft_model_ops_cpu; /* experiments/sft_model.c */

const arl_sft_model_ops *arl_sft_model_ops_default(void) {
    return &arl_sft_model_ops_cpu;
}

/* ------------------------------------------------------------------------------------ */
/* options                                                                               */

#define F(x) offsetof(arl_sft_config, x)
static const arl_option sft_own_tab[] = {
    {"model", ARL_OPT_STRING, F(model), NULL, ARL_SFT_MODEL_HELP, 0, 0, NULL, 0, "CONFIG"},
    {"init", ARL_OPT_STRING, F(init), NULL,
     "checkpoint directory to start from (default: initialise from scratch)", 0, 0, NULL, 0, "DIR"},
    {"init-seed", ARL_OPT_INT, F(init_seed), "0", "seed of the from-scratch initialisation", 0,
     9007199254740991.0, NULL, 0, NULL},
    {"data", ARL_OPT_STRING, F(data), NULL,
     "training conversations, JSONL ({\"messages\": [...], \"tools\": [...]} per line)", 0, 0, NULL,
     ARL_OPT_REQUIRED, "FILE"},
    {"eval-data", ARL_OPT_STRING, F(eval_data), NULL, "held-out conversations, JSONL", 0, 0, NULL,
     0, "FILE"},
    {"batch-tokens", ARL_OPT_INT, F(batch_tokens), "4096",
     "token budget of one step's packed batch", 2, 1 << 30, NULL, 0, NULL},
    {"max-seq-tokens", ARL_OPT_INT, F(max_seq_tokens), "0",
     "token budget of one conversation (0 = batch-tokens)", 0, 1 << 30, NULL, 0, NULL},
    {"on-long", ARL_OPT_CHOICE, F(on_long), "truncate",
     "conversations above max-seq-tokens: keep their first tokens, or drop them (counted)", 0, 0,
     "truncate|drop", 0, NULL},
    {"on-malformed", ARL_OPT_CHOICE, F(on_malformed), "fail",
     "malformed data lines: stop with an error naming the line, or skip and count them", 0, 0,
     "fail|skip", 0, NULL},
    {"shuffle", ARL_OPT_BOOL, F(shuffle), "true", "shuffle the conversations every epoch", 0, 0,
     NULL, 0, NULL},
    {"shared-prefix", ARL_OPT_BOOL, F(shared_prefix), "false",
     "split off the token prefix that every conversation shares (tool declarations, system "
     "prompt; no target in it), compute it once per batch and let each sequence continue its "
     "state: batch-tokens then counts only the rest of each conversation, and no gradient flows "
     "through the prefix's activations (experiments/sft_data.h)",
     0, 0, NULL, 0, NULL},
    {"steps", ARL_OPT_INT, F(steps), "1000", "optimizer steps", 1, 1e15, NULL, 0, NULL},
    {"eval-interval", ARL_OPT_INT, F(eval_interval), "0",
     "evaluate on eval-data every N steps (0 = at the end only)", 0, 1e15, NULL, 0, NULL},
    {"eval-max-batches", ARL_OPT_INT, F(eval_max_batches), "0",
     "batches per evaluation (0 = the whole eval file)", 0, 1e15, NULL, 0, NULL},
    {"checkpoint-interval", ARL_OPT_INT, F(checkpoint_interval), "0",
     "save a training checkpoint every N steps (0 = at the end only)", 0, 1e15, NULL, 0, NULL},
    {"keep-last", ARL_OPT_INT, F(keep_last), "3", "training checkpoints kept (0 = all)", 0, 1e9,
     NULL, 0, NULL},
    {"out", ARL_OPT_STRING, F(out), NULL, "output directory", 0, 0, NULL, ARL_OPT_REQUIRED, "DIR"},
    {"seed", ARL_OPT_INT, F(seed), "0", "seed of the data order", 0, 9007199254740991.0, NULL, 0,
     NULL},
    {"threads", ARL_OPT_INT, F(threads), "0", "CPU threads (0 = the default)", 0, 1024, NULL, 0,
     NULL},
    {"log-interval", ARL_OPT_INT, F(log_interval), "10",
     "steps between progress lines when the output is not a terminal", 1, 1e15, NULL, 0, NULL},
    {"progress", ARL_OPT_CHOICE, F(progress), "auto",
     "progress display: one carriage-return line (line), plain periodic lines (plain) or none "
     "(off); auto: line when standard error is a terminal, else plain",
     0, 0, "auto|line|plain|off", 0, NULL},
};
#undef F

/* Options left out of the run hash, so that a resume may change them: those that do not
 * change the training trajectory, and those whose content is checked on its own ("model": the
 * model config hash; "data": the data file's SHA-256 in the cursor; "init": used at step 0
 * only), so that moved files do not block a resume.  "steps" is covered by the resolved
 * total-steps of the schedule (extending a run with total-steps 0 changes the schedule and is
 * refused; with an explicit total-steps it is allowed). */
static const char *const sft_unhashed[] = {
    "out",
    "threads",
    "steps",
    "eval-data",
    "eval-interval",
    "eval-max-batches",
    "checkpoint-interval",
    "keep-last",
    "log-interval",
    "progress",
    "model",
    "init",
    "data",
};

#define SFT_TAB_MAX 64
static arl_option sft_tab[SFT_TAB_MAX];
static size_t sft_tab_n;
static pthread_once_t sft_tab_once = PTHREAD_ONCE_INIT;

static void sft_tab_build(void) {
    size_t n_own = ARL_OPTIONS_COUNT(sft_own_tab), n_opt;
    const arl_option *opt = arl_optim_options(&n_opt);
    ARL_ASSERT(n_own + n_opt <= SFT_TAB_MAX);
    memcpy(sft_tab, sft_own_tab, sizeof sft_own_tab);
    for (size_t i = 0; i < n_opt; i++) {
        sft_tab[n_own + i] = opt[i];
        sft_tab[n_own + i].offset += offsetof(arl_sft_config, optim);
    }
    sft_tab_n = n_own + n_opt;
}

const arl_option *arl_sft_options(size_t *n) {
    pthread_once(&sft_tab_once, sft_tab_build);
    *n = sft_tab_n;
    return sft_tab;
}

void arl_sft_config_free(arl_sft_config *c) {
    if (!c) return;
    size_t n;
    const arl_option *tab = arl_sft_options(&n);
    arl_options_free(tab, n, c);
}

arl_status arl_sft_config_check(const arl_sft_config *c) {
    if (!c->model && !c->init)
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'model': give a model config (or 'init', a checkpoint to start "
                          "from)");
    const struct {
        const char *key, *value;
    } paths[] = {{"model", c->model},
                 {"init", c->init},
                 {"data", c->data},
                 {"eval-data", c->eval_data},
                 {"out", c->out}};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
        if (paths[i].value && !paths[i].value[0])
            return arl_errorf(ARL_ERR_CONFIG, "key '%s': empty path", paths[i].key);
    if (!c->eval_data && (c->eval_interval > 0 || c->eval_max_batches > 0))
        return arl_errorf(
            ARL_ERR_CONFIG,
            "key '%s': %lld, but no 'eval-data' to evaluate on (give one, or leave "
            "the key out)",
            c->eval_interval > 0 ? "eval-interval" : "eval-max-batches",
            (long long)(c->eval_interval > 0 ? c->eval_interval : c->eval_max_batches));
    if (c->max_seq_tokens == 1)
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'max-seq-tokens': 1 leaves no token to predict (0 = batch-tokens, "
                          "or at least 2)");
    if (c->max_seq_tokens > c->batch_tokens)
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'max-seq-tokens': %lld is more than 'batch-tokens' %lld (a "
                          "conversation must fit one batch)",
                          (long long)c->max_seq_tokens, (long long)c->batch_tokens);
    arl_optim_config o = c->optim;
    if (o.total_steps == 0) o.total_steps = c->steps;
    return arl_optim_config_check(&o);
}

arl_status arl_sft_config_load(const char *path, const arl_strlist *sets, arl_sft_config *c) {
    size_t n;
    const arl_option *tab = arl_sft_options(&n);
    ARL_TRY(arl_options_defaults(tab, n, c));
    if (path) {
        char *text;
        ARL_TRY(arl_file_read(path, 0, &text, NULL));
        arl_status s = arl_options_parse_json_text(tab, n, text, path, c);
        free(text);
        ARL_TRY(s);
    }
    for (int i = 0; sets && i < sets->n; i++) {
        char key[128];
        const char *val;
        ARL_TRY(arl_set_arg_split(sets->v[i], key, sizeof key, &val));
        arl_status s = arl_options_set(tab, n, key, val, c);
        if (s) return arl_error_prefix(s, "--set");
    }
    arl_status s = arl_options_check_required(tab, n, c);
    if (s) return arl_error_prefix(ARL_ERR_CONFIG, "%s", path ? path : "experiment");
    s = arl_sft_config_check(c);
    if (s) return arl_error_prefix(s, "%s", path ? path : "experiment");
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------ */
/* helpers                                                                               */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The chat template of a model config: byte-level ids with the config's special ids. */
static arl_status template_for(const arl_model_config *cfg, arl_chat_template *t) {
    arl_chat_template_default(t);
    t->tok.vocab_size = (int32_t)cfg->text.vocab_size;
    t->tok.special[ARL_SPECIAL_BOS] = (int32_t)cfg->text.bos_token_id;
    t->tok.special[ARL_SPECIAL_EOS] = (int32_t)cfg->text.eos_token_id;
    t->tok.special[ARL_SPECIAL_PAD] = (int32_t)cfg->text.pad_token_id;
    if (cfg->media_placeholder_token_id != ARL_CONFIG_ABSENT)
        t->tok.special[ARL_SPECIAL_MEDIA_PAD] = (int32_t)cfg->media_placeholder_token_id;
    t->patch_size = cfg->has_vision ? (int32_t)cfg->vision.patch_size : 0;
    arl_status s = arl_tokenizer_spec_validate(&t->tok);
    if (s)
        return arl_error_prefix(s, "%s: the byte-level chat template does not fit this config",
                                cfg->path[0] ? cfg->path : "model config");
    return ARL_OK;
}

/* SHA-256 of the resolved options that decide the trajectory into hex, and those settings
 * (compact JSON, malloc'd; train_state.json keeps them) into *canon_out. */
static arl_status run_hash(const arl_sft_config *c, char hex[ARL_SHA256_HEX_CHARS],
                           char **canon_out) {
    size_t n;
    const arl_option *tab = arl_sft_options(&n);
    char *text = arl_options_to_json(tab, n, c);
    if (!text) return arl_errorf(ARL_ERR_NOMEM, "sft: out of memory");
    json_error_t e;
    json_t *j = arl_json_loads(text, 0, &e);
    free(text);
    if (!j) return arl_errorf(ARL_ERR_INTERNAL, "sft: resolved options are not JSON: %s", e.text);
    for (size_t i = 0; i < sizeof sft_unhashed / sizeof *sft_unhashed; i++)
        json_object_del(j, sft_unhashed[i]);
    char *canon = arl_json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(j);
    if (!canon) return arl_errorf(ARL_ERR_NOMEM, "sft: out of memory");
    uint8_t d[ARL_SHA256_BYTES];
    arl_sha256(canon, strlen(canon), d);
    *canon_out = canon;
    arl_sha256_hex(d, hex);
    return ARL_OK;
}

static arl_status write_resolved(const arl_sft_config *c, const char *path) {
    size_t n;
    const arl_option *tab = arl_sft_options(&n);
    char *text = arl_options_to_json(tab, n, c);
    if (!text) return arl_errorf(ARL_ERR_NOMEM, "sft: out of memory");
    json_error_t e;
    json_t *j = arl_json_loads(text, 0, &e);
    free(text);
    if (!j) return arl_errorf(ARL_ERR_INTERNAL, "sft: resolved options are not JSON");
    char *pretty = arl_json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(17));
    json_decref(j);
    if (!pretty) return arl_errorf(ARL_ERR_NOMEM, "sft: out of memory");
    size_t len = strlen(pretty);
    char *nl = realloc(pretty, len + 2);
    if (!nl) {
        free(pretty);
        return arl_errorf(ARL_ERR_NOMEM, "sft: out of memory");
    }
    nl[len] = '\n';
    nl[len + 1] = 0;
    arl_status s = arl_write_file_atomic(path, nl, len + 1);
    free(nl);
    return s;
}

/* The names of the files sft writes atomically (NAME.tmp-XXXXXX first) in its output
 * directory; its checkpoints clean up after themselves (policy/train_state.h). */
static int out_tmp_owned(const char *name) {
    return !strcmp(name, "experiment.json") || !strcmp(name, "metrics.jsonl");
}

/* Keep the metrics lines of steps <= last_step (a resume repeats the steps after it). */
static arl_status metrics_trim(const char *path, int64_t last_step) {
    FILE *f = fopen(path, "rb");
    if (!f) return ARL_OK;
    char *line = NULL, *keep = NULL;
    size_t cap = 0, kn = 0, kcap = 0;
    ssize_t got;
    arl_status s = ARL_OK;
    while ((got = getline(&line, &cap, f)) > 0) {
        json_error_t e;
        json_t *j = arl_json_loadb(line, (size_t)got, 0, &e);
        if (!j && arl_json_error_nomem(&e)) { /* (never a line dropped for it) */
            s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
            break;
        }
        json_t *st = j ? json_object_get(j, "step") : NULL;
        int ok =
            json_is_integer(st) && json_integer_value(st) <= last_step && line[got - 1] == '\n';
        json_decref(j);
        if (!ok) continue; /* a later step, or a line cut by the interruption */
        if (kn + (size_t)got + 1 > kcap) {
            size_t nc = (kn + (size_t)got + 1) * 2;
            char *nk = realloc(keep, nc);
            if (!nk) {
                s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
                break;
            }
            keep = nk;
            kcap = nc;
        }
        memcpy(keep + kn, line, (size_t)got);
        kn += (size_t)got;
    }
    free(line);
    fclose(f);
    if (!s) s = arl_write_file_atomic(path, keep ? keep : "", kn);
    free(keep);
    return s;
}

static void fmt_duration(double s, char *buf, size_t cap) {
    if (!(s >= 0) || s > 1e9) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60)
        snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, cap, "%lds", t);
}

/* ------------------------------------------------------------------------------------ */
/* the run                                                                               */

typedef struct sft_run {
    const arl_sft_config *c;
    const arl_sft_model_ops *ops;
    FILE *log;
    arl_model_config mcfg;
    int have_mcfg;
    arl_chat_template tmpl;
    arl_sft_data *train, *eval;
    arl_model_params params, grads;
    arl_adamw opt;
    arl_router_scores router;
    arl_sft_batch batch;
    arl_train_state st;
    arl_optim_config optim; /* c->optim with total_steps resolved */
    void *ws;
    int64_t batch_cap; /* the batches' budget: batch-tokens, or one epoch of the larger file
                          when that is less (the same batches, less memory) */
    FILE *metrics;
    char metrics_path[4200];
    char out_ckpt[4200];
    char run_sha[ARL_SHA256_HEX_CHARS];
    char *run_canon;   /* the settings hashed into run_sha (compact JSON) */
    int progress_line; /* 1: carriage-return line; 0: plain lines; -1: none */
    int line_open;     /* a carriage-return line is on the terminal */
    arl_dirlock lock;  /* the output directory's (core/dirlock.h) */
} sft_run;

static void log_data_stats(FILE *log, const char *what, const arl_sft_data *d) {
    if (!log) return;
    const arl_sft_stats *s = arl_sft_data_stats(d);
    fprintf(log,
            "sft: %s %s: %lld conversations, %lld tokens (%lld loss tokens, longest %lld), %lld "
            "lines",
            what, arl_sft_data_path(d), (long long)s->conversations, (long long)s->tokens,
            (long long)s->loss_tokens, (long long)s->max_tokens, (long long)s->lines);
    if (s->prefix_tokens)
        fprintf(log, ", shared prefix of %lld tokens computed once per batch",
                (long long)s->prefix_tokens);
    if (s->truncated) fprintf(log, ", %lld truncated", (long long)s->truncated);
    if (s->dropped_long) fprintf(log, ", %lld dropped as too long", (long long)s->dropped_long);
    if (s->no_loss)
        fprintf(log, ", %lld without assistant tokens within max-seq-tokens (skipped)",
                (long long)s->no_loss);
    if (s->malformed) {
        fprintf(log, ", %lld malformed skipped (lines", (long long)s->malformed);
        for (int64_t i = 0; i < s->malformed && i < ARL_SFT_MAX_LISTED; i++)
            fprintf(log, "%s%lld", i ? ", " : " ", (long long)s->malformed_line[i]);
        fprintf(log, "%s)", s->malformed > ARL_SFT_MAX_LISTED ? ", ..." : "");
    }
    fprintf(log, "\n");
}

static void progress_end_line(sft_run *r) {
    if (r->line_open && r->log) {
        fprintf(r->log, "\n");
        fflush(r->log);
    }
    r->line_open = 0;
}

/* Flush the metrics lines written so far to the disk (fsync, as train's: a checkpoint saved
 * after them must not outlive them in a power cut, or a resume from it has a gap in the
 * metrics); a write error (a full disk) stops the run instead of losing its lines. */
static arl_status metrics_flush(sft_run *r) {
    errno = 0;
    if (fflush(r->metrics) == 0 && !ferror(r->metrics) && fsync(fileno(r->metrics)) == 0)
        return ARL_OK;
    return arl_file_write_failed(r->metrics_path, "cannot write the metrics", errno);
}

static arl_status evaluate(sft_run *r, int64_t step, double *eval_loss) {
    const arl_sft_config *c = r->c;
    arl_data_cursor cur;
    arl_sft_data_cursor_start(r->eval, 0, &cur);
    double sum = 0;
    int64_t targets = 0, seqs = 0, batches = 0;
    do {
        ARL_TRY(arl_sft_data_next_batch(r->eval, &cur, 0, r->batch_cap, &r->batch));
        double ls = 0;
        ARL_TRY(r->ops->eval(r->ws, &r->params, &r->batch, &ls));
        sum += ls;
        targets += r->batch.n_targets;
        seqs += r->batch.n_seqs;
        batches++;
    } while (cur.epoch == 0 && (c->eval_max_batches == 0 || batches < c->eval_max_batches));
    *eval_loss = targets ? sum / (double)targets : NAN;
    fprintf(r->metrics,
            "{\"step\": %lld, \"eval_loss\": %.17g, \"eval_targets\": %lld, "
            "\"eval_seqs\": %lld}\n",
            (long long)step, *eval_loss, (long long)targets, (long long)seqs);
    ARL_TRY(metrics_flush(r));
    if (r->log && r->progress_line >= 0) {
        progress_end_line(r);
        fprintf(r->log, "sft: step %lld: eval loss %.4f over %lld tokens\n", (long long)step,
                *eval_loss, (long long)targets);
        fflush(r->log);
    }
    return ARL_OK;
}

static arl_status checkpoint(sft_run *r) {
    char extra[64];
    snprintf(extra, sizeof extra, "{\"threads\": %lld}", (long long)r->c->threads);
    ARL_TRY(arl_train_state_set_extra(&r->st, extra));
    arl_status s = arl_train_ckpt_save(r->out_ckpt, &r->mcfg, &r->params, &r->opt, &r->st,
                                       r->c->keep_last, 0, NULL, 0);
    return s;
}

/* Before any output: every conversation of d fits one batch (only a shared prefix with
 * max-seq-tokens 0 lets one exceed batch-tokens). */
static arl_status check_fits(const arl_sft_data *d, const arl_sft_config *c) {
    const arl_sft_stats *s = arl_sft_data_stats(d);
    if (s->max_tokens - s->prefix_tokens <= c->batch_tokens) return ARL_OK;
    return arl_errorf(ARL_ERR_ARG,
                      "%s: the longest conversation has %lld tokens after the shared prefix of "
                      "%lld, more than 'batch-tokens' %lld: raise batch-tokens, or set "
                      "max-seq-tokens (longer conversations are then truncated or dropped, "
                      "on-long)",
                      arl_sft_data_path(d), (long long)(s->max_tokens - s->prefix_tokens),
                      (long long)s->prefix_tokens, (long long)c->batch_tokens);
}

/* A warning when evaluation conversations also occur in the training data: their eval loss is
 * not a held-out loss. */
static arl_status warn_overlap(const arl_sft_data *train, const arl_sft_data *eval) {
    int64_t n, lines[ARL_SFT_MAX_LISTED];
    ARL_TRY(arl_sft_data_overlap(train, eval, &n, lines, ARL_SFT_MAX_LISTED));
    if (n == 0) return ARL_OK;
    char list[256];
    size_t k = 0;
    for (int64_t i = 0; i < n && i < ARL_SFT_MAX_LISTED && k < sizeof list; i++)
        k += (size_t)snprintf(list + k, sizeof list - k, "%s%lld", i ? ", " : "",
                              (long long)lines[i]);
    arl_log_warn("sft: %lld of the %lld eval conversations (%s lines %s%s) also occur in the "
                 "training data %s: their eval loss is not a held-out loss",
                 (long long)n, (long long)arl_sft_data_count(eval), arl_sft_data_path(eval), list,
                 n > ARL_SFT_MAX_LISTED ? ", ..." : "", arl_sft_data_path(train));
    return ARL_OK;
}

/* A resume whose eval-data differs from the run's so far (OUT/experiment.json, path): a warning,
 * since the eval losses of metrics.jsonl before and after step are then of other conversations
 * (eval-data is not part of the run's identity: it does not change the training). */
static void warn_eval_changed(const char *path, const arl_sft_config *c, int64_t step) {
    char *text;
    if (arl_file_read(path, 0, &text, NULL) != ARL_OK) { /* (no record: nothing to compare) */
        arl_error_clear();
        return;
    }
    json_t *j = arl_json_loads(text, 0, NULL);
    free(text);
    const json_t *v = j ? json_object_get(j, "eval-data") : NULL;
    const char *was = json_is_string(v) ? json_string_value(v) : NULL;
    if (j && (was ? !c->eval_data || strcmp(was, c->eval_data) : c->eval_data != NULL))
        arl_log_warn("sft: eval-data is %s%s%s, the run's was %s%s%s until step %lld: its eval "
                     "losses before and after are of other conversations",
                     c->eval_data ? "'" : "", c->eval_data ? c->eval_data : "none",
                     c->eval_data ? "'" : "", was ? "'" : "", was ? was : "none", was ? "'" : "",
                     (long long)step);
    json_decref(j);
}

/* The record of an earlier run that a fresh run would overwrite: "" if none. */
static const char *earlier_run_file(const char *out, char *path, size_t cap) {
    static const char *const files[] = {"metrics.jsonl", "experiment.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        struct stat sb;
        snprintf(path, cap, "%s/%s", out, files[i]);
        if (lstat(path, &sb) == 0) return files[i];
    }
    return "";
}

static arl_status setup(sft_run *r, int resume, arl_sft_result *res) {
    const arl_sft_config *c = r->c;
    if (c->threads > 0) ARL_TRY(arl_k_threads_init((int)c->threads));
    /* an 'out' that is a file: a usage error, as train's (it failed at the mkdir, exit 1, after
     * the data was indexed) */
    struct stat sb;
    if (stat(c->out, &sb) == 0 && !S_ISDIR(sb.st_mode))
        return arl_errorf(ARL_ERR_ARG, "key 'out': %s exists and is not a directory", c->out);

    /* model config */
    ARL_TRY(arl_model_config_load(c->model ? c->model : c->init, &r->mcfg));
    r->have_mcfg = 1;
    ARL_TRY(template_for(&r->mcfg, &r->tmpl));

    /* data */
    arl_sft_data_config dc = {
        .max_seq_tokens = c->max_seq_tokens  ? c->max_seq_tokens
                          : c->shared_prefix ? (1 << 30) /* the batch check counts suffixes */
                                             : c->batch_tokens,
        .on_malformed =
            strcmp(c->on_malformed, "skip") ? ARL_SFT_MALFORMED_FAIL : ARL_SFT_MALFORMED_SKIP,
        .on_long = strcmp(c->on_long, "drop") ? ARL_SFT_LONG_TRUNCATE : ARL_SFT_LONG_DROP,
    };
    ARL_TRY(arl_sft_data_open_prefix(c->data, &dc, c->shared_prefix, &r->tmpl, &r->train));
    log_data_stats(r->log, "training data", r->train);
    if (arl_sft_data_count(r->train) == 0)
        return arl_errorf(ARL_ERR_ARG, "%s: no usable conversation to train on", c->data);
    ARL_TRY(check_fits(r->train, c));
    if (c->eval_data) {
        ARL_TRY(arl_sft_data_open_prefix(c->eval_data, &dc, c->shared_prefix, &r->tmpl, &r->eval));
        log_data_stats(r->log, "eval data", r->eval);
        if (arl_sft_data_count(r->eval) == 0)
            return arl_errorf(ARL_ERR_ARG, "%s: no usable conversation to evaluate on",
                              c->eval_data);
        ARL_TRY(check_fits(r->eval, c));
        ARL_TRY(warn_overlap(r->train, r->eval));
    }

    /* configuration */
    r->optim = c->optim;
    if (r->optim.total_steps == 0) r->optim.total_steps = c->steps;
    arl_sft_config resolved = *c; /* shallow: only read */
    resolved.optim.total_steps = r->optim.total_steps;
    ARL_TRY(run_hash(&resolved, r->run_sha, &r->run_canon));
    /* the four arenas of the state at once, before anything is written (a run refused here has
     * no output directory to continue; each is checked again as it is allocated, against what
     * the others left) */
    ARL_TRY(arl_params_memory_check_copies(&r->mcfg, 4,
                                           "sft: the weights, gradients and two AdamW "
                                           "moments of this model"));
    /* a fresh run's init checkpoint, its tensors' names, shapes and extents, also before
     * anything is written (a missing, cut-short or other-config checkpoint leaves no out) */
    if (c->init && !resume) ARL_TRY(arl_checkpoint_verify(c->init, &r->mcfg));
    ARL_TRY(arl_mkdir_p(c->out));
    /* one process in the directory (a second --resume of a running run, say) */
    ARL_TRY(arl_dirlock_take(&r->lock, c->out, "sft"));
    snprintf(r->out_ckpt, sizeof r->out_ckpt, "%s/checkpoints", c->out);

    /* state */
    ARL_TRY(arl_model_params_alloc(&r->params, &r->mcfg));
    ARL_TRY(arl_model_params_alloc(&r->grads, &r->mcfg));
    ARL_TRY(arl_adamw_init(&r->opt, &r->mcfg, &r->optim));
    arl_train_state_init(&r->st);

    char latest[4200] = "";
    int64_t latest_step = -1;
    arl_status ls;
    if (resume) {
        /* the newest that loads, once what an interrupted save left is repaired: a damaged or
           incomplete checkpoint is set aside with a warning, as train does */
        ls = arl_train_ckpt_load_newest(r->out_ckpt, &r->mcfg, r->run_sha, &r->params, &r->opt,
                                        &r->st, 1, latest, sizeof latest, &latest_step);
        if (ls != ARL_ERR_NOT_FOUND)
            ls = arl_train_ckpt_explain(ls, latest, &r->mcfg, r->run_canon);
    } else {
        ls = arl_train_ckpt_latest(r->out_ckpt, latest, sizeof latest, &latest_step);
        if (ls == ARL_OK)
            return arl_errorf(ARL_ERR_STATE,
                              "%s already holds a run (checkpoint %s); continue it with --resume, "
                              "or choose another output directory",
                              c->out, latest);
        char path[4200];
        const char *f = ls == ARL_ERR_NOT_FOUND ? earlier_run_file(c->out, path, sizeof path) : "";
        if (f[0])
            return arl_errorf(ARL_ERR_STATE,
                              "%s already holds an earlier run's %s (and no checkpoint); "
                              "--resume starts that run again from step 0, replacing it, or "
                              "choose another output directory",
                              c->out, f);
    }
    if (ls != ARL_OK && ls != ARL_ERR_NOT_FOUND) return ls;
    if (ls == ARL_OK) {
        ARL_TRY(arl_train_state_set_run_config(&r->st, r->run_canon)); /* (older states lack it) */
        ARL_TRY(arl_sft_data_cursor_check(r->train, (uint64_t)c->seed, &r->st.data));
        if (r->st.extra_json) {
            json_error_t e;
            json_t *x = arl_json_loads(r->st.extra_json, 0, &e);
            json_t *th = x ? json_object_get(x, "threads") : NULL;
            if (json_is_integer(th) && json_integer_value(th) != c->threads)
                arl_log_warn("sft: the checkpoint was written with threads = %lld, this run "
                             "uses %lld: matrix products may round differently, so the resumed "
                             "run is not bit-identical to an uninterrupted one",
                             (long long)json_integer_value(th), (long long)c->threads);
            json_decref(x);
        }
        res->resumed_from = r->st.step;
        if (r->log)
            fprintf(r->log, "sft: resuming from %s (step %lld, epoch %lld, item %lld)\n", latest,
                    (long long)r->st.step, (long long)r->st.data.epoch,
                    (long long)r->st.data.index);
    } else {
        if (resume == 1 && r->log) /* (2: a caller's stage, fresh or continued) */
            fprintf(r->log, "sft: --resume: no checkpoint in %s yet, starting from step 0\n",
                    r->out_ckpt);
        if (c->init) {
            ARL_TRY(arl_checkpoint_load(c->init, &r->mcfg, &r->params));
        } else {
            ARL_TRY(arl_params_init(&r->params, &r->mcfg, (uint64_t)c->init_seed, (int)c->threads));
        }
        ARL_TRY(arl_model_config_hash_hex(&r->mcfg, r->st.model_sha256));
        memcpy(r->st.run_sha256, r->run_sha, sizeof r->run_sha);
        ARL_TRY(arl_train_state_set_run_config(&r->st, r->run_canon));
        arl_sft_data_cursor_start(r->train, (uint64_t)c->seed, &r->st.data);
        arl_rng rng;
        arl_rng_seed_stream(&rng, (uint64_t)c->seed, 1);
        ARL_TRY(arl_train_state_set_rng(&r->st, "train", &rng));
    }

    /* outputs; first what a kill in the middle of writing one left (the directory is this
     * run's: its lock is held) */
    ARL_TRY(arl_checkpoint_tmp_sweep(c->out, out_tmp_owned, NULL));
    char path[4200];
    snprintf(path, sizeof path, "%s/experiment.json", c->out);
    if (ls == ARL_OK) warn_eval_changed(path, c, r->st.step);
    ARL_TRY(write_resolved(c, path));
    snprintf(r->metrics_path, sizeof r->metrics_path, "%s/metrics.jsonl", c->out);
    if (ls == ARL_OK) ARL_TRY(metrics_trim(r->metrics_path, r->st.step));
    r->metrics = fopen(r->metrics_path, ls == ARL_OK ? "ab" : "wb");
    if (!r->metrics)
        return arl_errorf(errno == ENOSPC || errno == EDQUOT ? ARL_ERR_FULL : ARL_ERR_IO,
                          "%s: cannot open for writing: %s", r->metrics_path, strerror(errno));

    /* model workspace */
    /* a batch never spans two epochs: a budget above one epoch's tokens (suffixes) of either
     * file packs the same batches as that epoch's size */
    r->batch_cap = 2;
    for (int k = 0; k < 2; k++) {
        const arl_sft_data *dd = k ? r->eval : r->train;
        if (!dd) continue;
        const arl_sft_stats *ds = arl_sft_data_stats(dd);
        const int64_t epoch_tokens = ds->tokens - ds->conversations * ds->prefix_tokens;
        if (epoch_tokens > r->batch_cap) r->batch_cap = epoch_tokens;
    }
    if (r->batch_cap > c->batch_tokens) r->batch_cap = c->batch_tokens;
    /* sequences per batch: with a shared prefix, at most batch-tokens / (shortest suffix) */
    int64_t max_seqs = r->batch_cap;
    for (int k = 0; k < 2; k++) {
        const arl_sft_data *dd = k ? r->eval : r->train;
        if (!dd || !c->shared_prefix) continue;
        const arl_sft_stats *ds = arl_sft_data_stats(dd);
        int64_t shortest = ds->min_tokens - ds->prefix_tokens;
        int64_t m = r->batch_cap / (shortest > 0 ? shortest : 1) + 1;
        if (k == 0 || m > max_seqs) max_seqs = m;
    }
    if (max_seqs > r->batch_cap) max_seqs = r->batch_cap;
    ARL_TRY(r->ops->create(&r->ws, &r->mcfg, r->batch_cap, max_seqs, (int)c->threads));
    ARL_TRY(arl_sft_batch_init(&r->batch, r->batch_cap));
    ARL_TRY(arl_router_scores_init(&r->router, &r->mcfg, r->batch_cap, r->optim.qb_num_bins));
    return ARL_OK;
}

static void teardown(sft_run *r) {
    arl_dirlock_release(&r->lock);
    if (r->ops && r->ws) r->ops->destroy(r->ws);
    if (r->metrics) fclose(r->metrics);
    arl_sft_batch_free(&r->batch);
    arl_router_scores_free(&r->router);
    arl_adamw_free(&r->opt);
    arl_model_params_free(&r->params);
    arl_model_params_free(&r->grads);
    arl_train_state_free(&r->st);
    free(r->run_canon);
    arl_sft_data_close(r->train);
    arl_sft_data_close(r->eval);
    if (r->have_mcfg) arl_model_config_free(&r->mcfg);
}

static void progress(sft_run *r, int64_t step, double loss, double lr, double t0, int64_t step0,
                     int64_t tokens_here) {
    if (!r->log || r->progress_line < 0) return;
    const arl_sft_config *c = r->c;
    double el = now_s() - t0;
    double done = (double)(step - step0);
    double tps = el > 0 ? (double)tokens_here / el : 0;
    char eta[32];
    fmt_duration(done > 0 ? el / done * (double)(c->steps - step) : -1, eta, sizeof eta);
    if (r->progress_line == 1) {
        fprintf(r->log, "\rsft: step %lld/%lld  loss %.4f  lr %.3g  %.0f tok/s  ETA %s   ",
                (long long)step, (long long)c->steps, loss, lr, tps, eta);
        r->line_open = 1;
        fflush(r->log);
    } else if (step % c->log_interval == 0 || step == c->steps) {
        fprintf(r->log, "sft: step %lld/%lld loss %.4f lr %.3g %.0f tok/s ETA %s\n",
                (long long)step, (long long)c->steps, loss, lr, tps, eta);
        fflush(r->log);
    }
}

static arl_status train_loop(sft_run *r, const arl_sft_hooks *hooks, arl_sft_result *res) {
    const arl_sft_config *c = r->c;
    const double t0 = now_s();
    const int64_t step0 = r->st.step;
    int64_t tokens_here = 0;
    const size_t grad_bytes = (size_t)r->grads.inv.arena_floats * sizeof(float);
    while (r->st.step < c->steps) {
        const int64_t s = r->st.step; /* 0-based step being taken */
        ARL_TRY(
            arl_sft_data_next_batch(r->train, &r->st.data, c->shuffle, r->batch_cap, &r->batch));
        memset(r->grads.arena, 0, grad_bytes);
        arl_router_scores_reset(&r->router);
        double loss_sum = 0;
        const double scale = 1.0 / (double)r->batch.n_targets;
        arl_status st = r->ops->train_step(r->ws, &r->params, &r->batch, scale, &r->grads,
                                           &loss_sum, &r->router);
        if (st) return arl_error_prefix(st, "step %lld: %s", (long long)(s + 1), r->ops->name);
        const double loss = loss_sum * scale;
        if (!isfinite(loss))
            return arl_errorf(ARL_ERR_RANGE,
                              "step %lld: the loss is not finite (%g); stopping (lower lr?)",
                              (long long)(s + 1), loss);
        arl_optim_report rep;
        ARL_TRY(arl_adamw_step(&r->opt, &r->params, r->grads.arena, &rep));
        ARL_TRY(arl_qb_update(&r->optim, &r->params, &r->router));
        r->st.step = s + 1;
        r->st.tokens += r->batch.T;
        r->st.lr = rep.lr;
        tokens_here += r->batch.T;
        res->step = r->st.step;
        res->loss = loss;
        res->tokens = r->st.tokens;
        fprintf(r->metrics,
                "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, "
                "\"clip_coef\": %.17g, \"tokens\": %lld, \"targets\": %lld, \"seqs\": %lld, "
                "\"epoch\": %lld, \"tokens_total\": %lld, \"elapsed_s\": %.3f}\n",
                (long long)r->st.step, loss, rep.lr, rep.grad_norm, rep.clip_coef,
                (long long)r->batch.T, (long long)r->batch.n_targets, (long long)r->batch.n_seqs,
                (long long)r->batch.epoch, (long long)r->st.tokens, now_s() - t0);
        ARL_TRY(metrics_flush(r));
        progress(r, r->st.step, loss, rep.lr, t0, step0, tokens_here);
        const int last = r->st.step == c->steps;
        if (r->eval && ((c->eval_interval > 0 && r->st.step % c->eval_interval == 0) || last)) {
            ARL_TRY(evaluate(r, r->st.step, &res->eval_loss));
        }
        if ((c->checkpoint_interval > 0 && r->st.step % c->checkpoint_interval == 0) || last) {
            ARL_TRY(checkpoint(r));
        }
        if (hooks && hooks->after_step) ARL_TRY(hooks->after_step(hooks->ctx, r->st.step, loss));
    }
    /* a run resumed at its end did nothing: its last step was evaluated and saved before */
    return ARL_OK;
}

arl_status arl_sft_run(const arl_sft_config *c, const arl_sft_model_ops *ops, int resume,
                       const arl_sft_hooks *hooks, FILE *log, arl_sft_result *res) {
    arl_sft_result dummy;
    if (!res) res = &dummy;
    memset(res, 0, sizeof *res);
    res->resumed_from = -1;
    res->eval_loss = NAN;
    if (!ops)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "sft: this build has no model forward/backward for training yet "
                          "(policy/model.h); nothing was run");
    ARL_TRY(arl_sft_config_check(c));
    sft_run r;
    memset(&r, 0, sizeof r);
    r.lock.fd = -1;
    r.c = c;
    r.ops = ops;
    r.log = log;
    if (!log || !strcmp(c->progress, "off"))
        r.progress_line = -1;
    else if (!strcmp(c->progress, "line"))
        r.progress_line = 1;
    else if (!strcmp(c->progress, "plain"))
        r.progress_line = 0;
    else
        r.progress_line = isatty(fileno(log)) ? 1 : 0;

    if (log) {
        size_t n;
        const arl_option *tab = arl_sft_options(&n);
        arl_options_print_resolved(log, "sft: resolved configuration:", tab, n, c);
        fflush(log);
    }
    arl_status s = setup(&r, resume, res);
    if (!s && log)
        fprintf(log, "sft: model %s (%s), %lld parameters, run %.12s, output %s\n",
                r.mcfg.path[0] ? r.mcfg.path : "(config)", ops->name,
                (long long)r.params.inv.total_numel, r.run_sha, c->out);
    if (!s) {
        res->step = r.st.step;
        res->tokens = r.st.tokens;
        s = train_loop(&r, hooks, res);
    }
    progress_end_line(&r);
    if (!s) {
        char latest[4200];
        int64_t st;
        if (arl_train_ckpt_latest(r.out_ckpt, latest, sizeof latest, &st) == ARL_OK)
            snprintf(res->checkpoint, sizeof res->checkpoint, "%s", latest);
        if (log) {
            fprintf(log, "sft: done: %lld steps, %lld tokens, last loss %.4f", (long long)res->step,
                    (long long)res->tokens, res->loss);
            if (!isnan(res->eval_loss)) fprintf(log, ", eval loss %.4f", res->eval_loss);
            fprintf(log, "; checkpoint %s; metrics %s/metrics.jsonl\n",
                    res->checkpoint[0] ? res->checkpoint : "(none)", c->out);
            fflush(log);
        }
    }
    teardown(&r);
    return s;
}
