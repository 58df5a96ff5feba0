/* cli/cmd_model.c: `agentrl model info` (parameter counts by component, memory figures,
 * optional checkpoint check) and `agentrl model init` (config.json + a checkpoint
 * initialised from scratch, spec/policy.md section 12.5). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/json_dump.h"
#include "core/log.h"
#include "policy/checkpoint.h"
#include "policy/config.h"
#include "policy/params.h"
#include "policy/safetensors.h"

/* "1,234,567" */
static const char *commas(int64_t v, char *buf, size_t cap) {
    char raw[32];
    snprintf(raw, sizeof raw, "%lld", (long long)(v < 0 ? -v : v));
    size_t n = strlen(raw), k = 0;
    if (v < 0 && k < cap - 1) buf[k++] = '-';
    for (size_t i = 0; i < n && k < cap - 1; i++) {
        if (i && (n - i) % 3 == 0 && k < cap - 1) buf[k++] = ',';
        if (k < cap - 1) buf[k++] = raw[i];
    }
    buf[k] = 0;
    return buf;
}

/* "5.56 TB (5.06 TiB)" */
static const char *human_bytes(int64_t b, char *buf, size_t cap) {
    static const char *const dec[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    static const char *const bin[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double x = (double)b, y = (double)b;
    int i = 0, j = 0;
    while (x >= 1000 && i < 5)
        x /= 1000, i++;
    while (y >= 1024 && j < 5)
        y /= 1024, j++;
    if (i == 0)
        snprintf(buf, cap, "%lld B", (long long)b);
    else
        snprintf(buf, cap, "%.2f %s (%.2f %s)", x, dec[i], y, bin[j]);
    return buf;
}

/* "2.78T", "104.19B", "3.01M" */
static const char *human_count(int64_t v, char *buf, size_t cap) {
    double x = (double)v;
    if (x >= 1e12)
        snprintf(buf, cap, "%.2fT", x / 1e12);
    else if (x >= 1e9)
        snprintf(buf, cap, "%.2fB", x / 1e9);
    else if (x >= 1e6)
        snprintf(buf, cap, "%.2fM", x / 1e6);
    else if (x >= 1e3)
        snprintf(buf, cap, "%.2fk", x / 1e3);
    else
        snprintf(buf, cap, "%lld", (long long)v);
    return buf;
}

/* ------------------------------------------------------------------------------------ */
/* model info                                                                            */

typedef struct model_info_opts {
    char *config;
    int json;
    int check;
} model_info_opts;

static const arl_option model_info_tab[] = {
    {"config", ARL_OPT_STRING, offsetof(model_info_opts, config), NULL,
     "config.json, a directory holding one (e.g. a checkpoint), or a shipped name: tiny, mini, "
     "kimi-k3",
     0, 0, NULL, ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "CONFIG"},
    {"json", ARL_OPT_BOOL, offsetof(model_info_opts, json), "false",
     "print one JSON object instead of the table", 0, 0, NULL, 0, NULL},
    {"check", ARL_OPT_BOOL, offsetof(model_info_opts, check), "false",
     "CONFIG is a checkpoint directory: check every tensor's name, dtype and shape and load it", 0,
     0, NULL, 0, NULL},
};

typedef struct ckpt_report {
    int checked;
    int64_t tensors;
    int32_t shards;
    uint64_t bytes;
} ckpt_report;

static arl_status check_checkpoint(const char *arg, const arl_model_config *cfg, ckpt_report *r) {
    struct stat st;
    if (stat(arg, &st) != 0 || !S_ISDIR(st.st_mode))
        return arl_errorf(ARL_ERR_ARG,
                          "--check needs CONFIG to be a checkpoint directory, got '%s'", arg);
    arl_model_params p;
    ARL_TRY(arl_model_params_alloc(&p, cfg));
    arl_status s = arl_checkpoint_load(arg, cfg, &p);
    if (!s) {
        arl_st_dir *d;
        s = arl_st_dir_open(arg, &d);
        if (!s) {
            r->checked = 1;
            r->tensors = arl_st_dir_count(d);
            r->shards = arl_st_dir_shard_count(d);
            r->bytes = arl_st_dir_data_bytes(d);
            arl_st_dir_close(d);
        }
    }
    arl_model_params_free(&p);
    return s;
}

static void print_info_table(const arl_model_config *cfg, const char *h, const arl_param_counts *c,
                             const arl_model_memory *m, const ckpt_report *r) {
    const arl_model_dims *D = &cfg->dims;
    char a[64], b[64];
    printf("model      %s (%s)\n", cfg->path,
           cfg->model_type[0] ? cfg->model_type : cfg->text.model_type);
    printf("config     sha256 %s\n", h);
    printf("layers     %lld: %lld KDA + %lld MLA; %lld dense + %lld MoE\n", (long long)D->L,
           (long long)D->n_kda, (long long)D->n_mla, (long long)D->n_dense, (long long)D->n_moe);
    printf("sizes      d %lld, vocab %lld, KDA %lld x %lld, MLA %lld heads, experts %lld top-%lld "
           "(+%lld shared), f %lld, d_z %lld, AttnRes block ",
           (long long)D->d, (long long)D->V, (long long)D->H, (long long)D->dk, (long long)D->Hm,
           (long long)D->E, (long long)D->k, (long long)D->ns, (long long)D->f, (long long)D->dz);
    if (D->B)
        printf("%lld\n", (long long)D->B);
    else
        printf("none\n");
    printf("vision     %s\n", cfg->has_vision ? "yes" : "no (text only)");
    printf("\nparameters by component\n");
    for (int i = 0; i < ARL_COMP_COUNT_; i++) {
        if ((i == ARL_COMP_VISION || i == ARL_COMP_PROJECTOR) && !cfg->has_vision) continue;
        printf("  %-20s %22s", arl_param_component_name((arl_param_component)i),
               commas(c->component[i], a, sizeof a));
        if (i == ARL_COMP_KDA && D->n_kda)
            printf("   %lld x %s", (long long)D->n_kda, commas(c->kda_layer, b, sizeof b));
        if (i == ARL_COMP_MLA && D->n_mla)
            printf("   %lld x %s", (long long)D->n_mla, commas(c->mla_layer, b, sizeof b));
        if (i == ARL_COMP_DENSE_FFN && D->n_dense)
            printf("   %lld x %s", (long long)D->n_dense, commas(c->dense_layer, b, sizeof b));
        if (i == ARL_COMP_ROUTED_EXPERTS && D->n_moe)
            printf("   %lld x %lld x %s", (long long)D->n_moe, (long long)D->E,
                   commas(c->expert, b, sizeof b));
        printf("\n");
        if (i == ARL_COMP_LM_HEAD)
            printf("  %-20s %22s\n", "text total", commas(c->text_total, a, sizeof a));
    }
    printf("  %-20s %22s   %s\n", "total_params", commas(c->total_params, a, sizeof a),
           human_count(c->total_params, b, sizeof b));
    printf("  %-20s %22s   %s (input embedding and vision excluded, lm_head included)\n",
           "active_params", commas(c->active_params, a, sizeof a),
           human_count(c->active_params, b, sizeof b));
    printf("\nmemory\n");
    char label[96];
    printf("  %-50s %s\n", "weights bf16 (release form, fp32-class in F32)",
           human_bytes(m->weights_bf16_bytes, a, sizeof a));
    printf("  %-50s %s\n", "weights fp32", human_bytes(m->weights_fp32_bytes, a, sizeof a));
    printf("  %-50s %s\n", "fp32 weights + grads + Adam moments (16 B/param)",
           human_bytes(m->train_fp32_adam_bytes, a, sizeof a));
    snprintf(label, sizeof label, "KDA state S per sequence, fp32 (%lld layers)",
             (long long)D->n_kda);
    printf("  %-50s %s\n", label, human_bytes(m->kda_state_bytes, a, sizeof a));
    printf("  %-50s %s\n", "KDA conv tails per sequence, fp32",
           human_bytes(m->kda_conv_bytes, a, sizeof a));
    snprintf(label, sizeof label, "MLA latent cache per token (%lld layers x %lld)",
             (long long)D->n_mla, (long long)(D->rkv + D->r));
    printf("  %-50s %s B bf16, %s B fp32\n", label,
           commas(m->mla_bytes_per_token_bf16, a, sizeof a),
           commas(m->mla_bytes_per_token_fp32, b, sizeof b));
    snprintf(label, sizeof label, "MLA latent cache at %s tokens, bf16",
             commas(ARL_LONG_CONTEXT_TOKENS, b, sizeof b));
    printf("  %-50s %s\n", label, human_bytes(m->mla_bytes_1m_bf16, a, sizeof a));
    snprintf(label, sizeof label, "MLA latent cache at %s tokens, fp32",
             commas(ARL_LONG_CONTEXT_TOKENS, b, sizeof b));
    printf("  %-50s %s\n", label, human_bytes(m->mla_bytes_1m_fp32, a, sizeof a));
    if (r->checked)
        printf("\ncheckpoint OK: %lld tensors in %d shard%s, %s of data\n", (long long)r->tensors,
               r->shards, r->shards == 1 ? "" : "s", human_bytes((int64_t)r->bytes, a, sizeof a));
}

static int print_info_json(const arl_model_config *cfg, const char *h, const arl_param_counts *c,
                           const arl_model_memory *m, const ckpt_report *r) {
    const arl_model_dims *D = &cfg->dims;
    json_t *o = json_object();
    json_t *layers = json_pack("{s:I,s:I,s:I,s:I,s:I}", "total", (json_int_t)D->L, "kda",
                               (json_int_t)D->n_kda, "mla", (json_int_t)D->n_mla, "dense",
                               (json_int_t)D->n_dense, "moe", (json_int_t)D->n_moe);
    json_t *comp = json_object();
    int bad = 0; /* a key not set (out of memory): the JSON would lack it */
    for (int i = 0; i < ARL_COMP_COUNT_; i++)
        bad |= json_object_set_new(comp, arl_param_component_name((arl_param_component)i),
                                   json_integer((json_int_t)c->component[i]));
    json_t *per =
        json_pack("{s:I,s:I,s:I,s:I,s:I}", "kda_layer", (json_int_t)c->kda_layer, "mla_layer",
                  (json_int_t)c->mla_layer, "routed_expert", (json_int_t)c->expert, "moe_fixed",
                  (json_int_t)c->moe_fixed, "dense_layer", (json_int_t)c->dense_layer);
    json_t *mem = json_pack(
        "{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "weights_bf16_bytes",
        (json_int_t)m->weights_bf16_bytes, "weights_fp32_bytes", (json_int_t)m->weights_fp32_bytes,
        "train_fp32_adam_bytes", (json_int_t)m->train_fp32_adam_bytes,
        "kda_state_bytes_per_sequence", (json_int_t)m->kda_state_bytes,
        "kda_conv_tail_bytes_per_sequence", (json_int_t)m->kda_conv_bytes,
        "mla_cache_values_per_token", (json_int_t)m->mla_values_per_token,
        "mla_cache_bytes_per_token_bf16", (json_int_t)m->mla_bytes_per_token_bf16,
        "mla_cache_bytes_per_token_fp32", (json_int_t)m->mla_bytes_per_token_fp32,
        "long_context_tokens", (json_int_t)ARL_LONG_CONTEXT_TOKENS,
        "mla_cache_bytes_long_context_bf16", (json_int_t)m->mla_bytes_1m_bf16,
        "mla_cache_bytes_long_context_fp32", (json_int_t)m->mla_bytes_1m_fp32);
    if (!o || !layers || !comp || !per || !mem) {
        json_decref(o);
        json_decref(layers);
        json_decref(comp);
        json_decref(per);
        json_decref(mem);
        return cli_fail(arl_errorf(ARL_ERR_NOMEM, "out of memory"));
    }
    bad |= json_object_set_new(o, "config", json_string(cfg->path));
    bad |= json_object_set_new(o, "config_sha256", json_string(h));
    bad |= json_object_set_new(o, "has_vision", json_boolean(cfg->has_vision));
    bad |= json_object_set_new(o, "layers", layers);
    bad |= json_object_set_new(o, "components", comp);
    bad |= json_object_set_new(o, "per_unit", per);
    bad |= json_object_set_new(o, "text_params", json_integer((json_int_t)c->text_total));
    bad |= json_object_set_new(o, "vision_params", json_integer((json_int_t)c->vision_tower));
    bad |= json_object_set_new(o, "projector_params", json_integer((json_int_t)c->projector));
    bad |= json_object_set_new(o, "total_params", json_integer((json_int_t)c->total_params));
    bad |= json_object_set_new(o, "active_params", json_integer((json_int_t)c->active_params));
    bad |= json_object_set_new(o, "memory", mem);
    if (r->checked)
        bad |= json_object_set_new(o, "checkpoint",
                                   json_pack("{s:b,s:I,s:i,s:I}", "ok", 1, "tensors",
                                             (json_int_t)r->tensors, "shards", (int)r->shards,
                                             "bytes", (json_int_t)r->bytes));
    if (bad) {
        json_decref(o);
        return cli_fail(arl_errorf(ARL_ERR_NOMEM, "out of memory"));
    }
    char *text = arl_json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text) return cli_fail(arl_errorf(ARL_ERR_NOMEM, "out of memory"));
    printf("%s\n", text);
    free(text);
    return ARL_EXIT_OK;
}

int cmd_model_info(int argc, char **argv) {
    model_info_opts o;
    int rc = cli_parse(model_info_tab, ARL_OPTIONS_COUNT(model_info_tab), argc, argv, &o,
                       "agentrl model info CONFIG [--json] [--check]",
                       "Print the parameter counts by component (spec/policy.md section 13), the "
                       "total and activated parameters, and memory figures of a model config.");
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    arl_model_config cfg;
    arl_status s = arl_model_config_load(o.config, &cfg);
    if (s) {
        rc = cli_fail(s);
        arl_options_free(model_info_tab, ARL_OPTIONS_COUNT(model_info_tab), &o);
        return rc;
    }
    ckpt_report r = {0, 0, 0, 0};
    if (o.check) s = check_checkpoint(o.config, &cfg, &r);
    char h[ARL_SHA256_HEX_CHARS];
    if (!s) s = arl_model_config_hash_hex(&cfg, h);
    if (s) {
        rc = cli_fail(s);
    } else {
        arl_param_counts c;
        arl_model_memory m;
        arl_param_counts_compute(&cfg, &c);
        arl_model_memory_compute(&cfg, &m);
        if (o.json)
            rc = print_info_json(&cfg, h, &c, &m, &r);
        else {
            print_info_table(&cfg, h, &c, &m, &r);
            rc = ARL_EXIT_OK;
        }
    }
    arl_model_config_free(&cfg);
    arl_options_free(model_info_tab, ARL_OPTIONS_COUNT(model_info_tab), &o);
    return rc;
}

/* ------------------------------------------------------------------------------------ */
/* model init                                                                            */

typedef struct model_init_opts {
    char *config;
    char *out;
    char *seed; /* required: options.h supports ARL_OPT_REQUIRED only for strings */
    int64_t shard_size;
    int64_t threads;
    int force;
} model_init_opts;

static const arl_option model_init_tab[] = {
    {"config", ARL_OPT_STRING, offsetof(model_init_opts, config), NULL,
     "config.json, a directory holding one, or a shipped name: tiny, mini, kimi-k3", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "CONFIG"},
    {"out", ARL_OPT_STRING, offsetof(model_init_opts, out), NULL,
     "checkpoint directory to write (created; must be empty unless --force)", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "OUT_DIR"},
    {"seed", ARL_OPT_STRING, offsetof(model_init_opts, seed), NULL,
     "random seed, an integer in [0, 2^64) (the same seed gives bit-identical weights)", 0, 0, NULL,
     ARL_OPT_REQUIRED, "S"},
    {"shard-size", ARL_OPT_INT, offsetof(model_init_opts, shard_size), "5000000000",
     "maximum data bytes per safetensors shard (0: one model.safetensors)", 0, 1e15, NULL, 0,
     "BYTES"},
    {"threads", ARL_OPT_INT, offsetof(model_init_opts, threads), "0",
     "initialisation threads (0: one per CPU, at most 16)", 0, 16, NULL, 0, "N"},
    {"force", ARL_OPT_BOOL, offsetof(model_init_opts, force), "false",
     "replace the checkpoint in OUT_DIR if it holds one (in one step, when the new one is "
     "complete; OUT_DIR must hold nothing else)",
     0, 0, NULL, 0, NULL},
};

/* 1 if path is a directory with entries other than . and .. */
static int dir_nonempty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 0;
    struct dirent *e;
    int any = 0;
    while (!any && (e = readdir(d)))
        any = strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return any;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The interrupt notes of model init, out is OUT_DIR: before and after the commit. */
static void note_interrupt(const char *out, int committed) {
    char note[4400];
    if (committed)
        snprintf(note, sizeof note,
                 "\nagentrl: interrupted: model init stops here; the new checkpoint in %s is "
                 "complete\n",
                 out);
    else
        snprintf(note, sizeof note,
                 "\nagentrl: interrupted: model init stops here; %s is as it was (the unfinished "
                 "checkpoint beside it is removed)\n",
                 out);
    cli_note_on_interrupt_text(note);
}

int cmd_model_init(int argc, char **argv) {
    model_init_opts o;
    const size_t nopt = ARL_OPTIONS_COUNT(model_init_tab);
    int rc = cli_parse(model_init_tab, nopt, argc, argv, &o,
                       "agentrl model init CONFIG OUT_DIR --seed S [--shard-size BYTES] "
                       "[--threads N] [--force]",
                       "Write config.json and a checkpoint initialised from scratch "
                       "(spec/policy.md section 12.5) into OUT_DIR.");
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    arl_model_config cfg;
    memset(&cfg, 0, sizeof cfg);
    arl_model_params p;
    memset(&p, 0, sizeof p);
    arl_status s = ARL_OK;
    char *end = NULL, *target = NULL, tmp[1200] = "";
    errno = 0;
    unsigned long long seed = strtoull(o.seed, &end, 10);
    if (o.seed[0] < '0' || o.seed[0] > '9' || *end || errno) { /* strtoull took " 5", "-1" */
        s = arl_errorf(ARL_ERR_ARG, "option '--seed': expected an integer in [0, 2^64), got '%s'",
                       o.seed);
        goto done;
    }
    struct stat st;
    if (!o.out[0]) {
        s = arl_errorf(ARL_ERR_ARG, "OUT_DIR: empty path (give the checkpoint directory to write)");
        goto done;
    }
    if (stat(o.out, &st) == 0 && !S_ISDIR(st.st_mode)) {
        s = arl_errorf(ARL_ERR_ARG, "%s: exists and is not a directory", o.out);
        goto done;
    }
    if (!o.force && dir_nonempty(o.out)) {
        s = arl_errorf(ARL_ERR_STATE,
                       "%s: directory is not empty; refusing to overwrite (use --force to replace "
                       "the checkpoint in it)",
                       o.out);
        goto done;
    }
    /* the checkpoint is written beside the directory it goes to (a symbolic link's target) and
     * takes its place when complete: refused now, before the work, if that would remove more */
    target = lstat(o.out, &st) == 0 && S_ISLNK(st.st_mode) ? realpath(o.out, NULL) : strdup(o.out);
    if (!target) {
        s = arl_errorf(ARL_ERR_IO, "%s: %s", o.out, strerror(errno));
        goto done;
    }
    s = arl_checkpoint_check_replaceable(target);
    if (s) goto done;
    s = arl_model_config_load(o.config, &cfg);
    if (s) goto done;
    cli_print_resolved("model init", model_init_tab, nopt, &o);
    arl_param_counts c;
    arl_param_counts_compute(&cfg, &c);
    char a[64];
    arl_log_info("initialising %s parameters with seed %llu", commas(c.total_params, a, sizeof a),
                 seed);
    double t0 = now_s();
    s = arl_model_params_alloc(&p, &cfg);
    if (s) goto done;
    s = arl_params_init(&p, &cfg, (uint64_t)seed, (int)o.threads);
    if (s) goto done;
    double t1 = now_s();
    /* an interrupt from here removes the unfinished checkpoint; the commit is not cut in two */
    note_interrupt(o.out, 0);
    cli_interrupt_defer();
    s = arl_checkpoint_tmp_create(target, tmp, sizeof tmp);
    if (s)
        tmp[0] = 0;
    else
        cli_remove_dir_on_interrupt(tmp);
    cli_interrupt_resume();
    if (s) goto done;
    s = arl_checkpoint_save(tmp, &cfg, &p, (uint64_t)o.shard_size);
    if (s) goto done;
    int64_t old_files = -1;
    cli_interrupt_defer();
    s = arl_checkpoint_commit(tmp, target, &old_files);
    if (!s) {
        tmp[0] = 0;
        cli_remove_dir_on_interrupt(NULL);
        note_interrupt(o.out, 1);
    }
    cli_interrupt_resume();
    if (s) goto done;
    double t2 = now_s();
    {
        arl_st_dir *d;
        s = arl_st_dir_open(o.out, &d);
        if (s) goto done;
        char b[64];
        printf("wrote %s: config.json + %d safetensors file%s, %lld tensors, %s parameters, %s "
               "(init %.1f s, write %.1f s)\n",
               o.out, arl_st_dir_shard_count(d), arl_st_dir_shard_count(d) == 1 ? "" : "s",
               (long long)arl_st_dir_count(d), commas(c.total_params, a, sizeof a),
               human_bytes((int64_t)arl_st_dir_data_bytes(d), b, sizeof b), t1 - t0, t2 - t1);
        if (old_files > 0)
            printf("replaced the checkpoint that was in %s (its %lld file%s removed)\n", o.out,
                   (long long)old_files, old_files == 1 ? "" : "s");
        arl_st_dir_close(d);
    }
done:
    if (tmp[0]) { /* a failure: the unfinished checkpoint goes, OUT_DIR is as it was */
        arl_checkpoint_tmp_remove(tmp);
        cli_remove_dir_on_interrupt(NULL);
    }
    rc = s ? cli_fail(s) : ARL_EXIT_OK;
    free(target);
    arl_model_params_free(&p);
    arl_model_config_free(&cfg);
    arl_options_free(model_init_tab, nopt, &o);
    return rc;
}
