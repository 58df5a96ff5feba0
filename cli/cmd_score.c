/* cli/cmd_score.c: `agentrl score`: the log-probability of every token of one or more sequences
 * given the tokens before it, under a checkpoint (policy/model.h), and their sums; optionally
 * the logits as a float32 .npy.
 *
 * Input: --text FILE (the file's bytes as byte-level ids, after <|bos|> unless --no-bos) or
 * --tokens FILE.npy (int32 or int64, shape [T] or [B, T]: B sequences of T tokens).  The model
 * is built from the checkpoint's config.json, whatever its dimensions.  Sequences that fit a
 * forward (--max-tokens) are packed together; longer ones run in chunks through a decode state.
 *
 * Output (stdout): a header line "seq pos token logprob", one line per scored position
 * (positions 1..T-1 of each sequence), then "sum SEQ VALUE" per sequence and, for B > 1,
 * "sum all VALUE".
 *
 * --grads-out FILE.safetensors: also the gradient of the summed log-probability (all scored
 * positions of all sequences) with respect to every parameter, under the checkpoint's tensor
 * names, F32 (policy/model_backward.h); tensors without a gradient (the router bias, the vision
 * tower for text input) are written as zeros.  Each sequence must fit one forward
 * (T <= --max-tokens).
 *
 * Output files are checked before any work (their folder exists; none of them is the input file,
 * a file of the checkpoint or the other output) and each is written whole or not at all, an
 * interrupt during its write deferred until it is in place.
 *
 * --device cuda: the forward runs on the GPU (policy/model_device.h: fp32 weights, the same
 * packing and chunking), and so does --grads-out (policy/model_device_backward.h: the device
 * training forward and backward, gradients copied back); cpu-device runs the same device code
 * over host memory (bit-identical to cpu: for tests).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "core/file.h"
#include "core/log.h"
#include "core/npy.h"
#include "kernels/threadpool.h"
#include "policy/checkpoint.h"
#include "policy/model.h"
#include "policy/model_backward.h"
#include "policy/model_device.h"
#include "policy/model_device_backward.h"
#include "policy/tokenizer.h"

typedef struct score_opts {
    char *ckpt;
    char *text;
    char *tokens;
    char *logits_out;
    char *grads_out;
    char *device;
    int bos;
    int64_t max_tokens;
    int64_t threads;
} score_opts;

static const arl_option score_tab[] = {
    {"ckpt", ARL_OPT_STRING, offsetof(score_opts, ckpt), NULL,
     "checkpoint directory (config.json + safetensors)", 0, 0, NULL, ARL_OPT_REQUIRED, "DIR"},
    {"text", ARL_OPT_STRING, offsetof(score_opts, text), NULL,
     "score the bytes of this file (byte-level ids)", 0, 0, NULL, 0, "FILE"},
    {"tokens", ARL_OPT_STRING, offsetof(score_opts, tokens), NULL,
     "score token ids from a .npy file: int32 or int64, shape [T] or [B, T]", 0, 0, NULL, 0,
     "FILE.npy"},
    {"logits-out", ARL_OPT_STRING, offsetof(score_opts, logits_out), NULL,
     "write the logits as float32 .npy, shape [B, T, V] ([T, V] for one sequence given as "
     "--text or a 1-D array)",
     0, 0, NULL, 0, "OUT.npy"},
    {"grads-out", ARL_OPT_STRING, offsetof(score_opts, grads_out), NULL,
     "write the gradient of the summed log-probability w.r.t. every parameter as F32 "
     "safetensors under the checkpoint's names (zeros where none); needs T <= --max-tokens",
     0, 0, NULL, 0, "OUT.safetensors"},
    {"bos", ARL_OPT_BOOL, offsetof(score_opts, bos), "true",
     "--text: put <|bos|> before the text's bytes (--no-bos: score the bytes alone)", 0, 0, NULL, 0,
     NULL},
    {"max-tokens", ARL_OPT_INT, offsetof(score_opts, max_tokens), "2048",
     "most tokens in one forward; longer sequences run in chunks", 1, 1 << 24, NULL, 0, "N"},
    {"device", ARL_OPT_CHOICE, offsetof(score_opts, device), "cpu",
     "where the forward (and --grads-out) runs: cpu, cuda (a GPU; needs a CUDA build and a "
     "visible device), or cpu-device (the device code over host memory, bit-identical to cpu)",
     0, 0, "cpu|cuda|cpu-device", 0, "DEV"},
    {"threads", ARL_OPT_INT, offsetof(score_opts, threads), "0",
     "CPU threads (0: the default of the kernels' pool)", 0, 1024, NULL, 0, "N"},
};
#define SCORE_N ARL_OPTIONS_COUNT(score_tab)

static const char *score_usage =
    "agentrl score --ckpt DIR (--text FILE | --tokens FILE.npy) [--logits-out OUT.npy] "
    "[--grads-out OUT.safetensors] [--device cpu|cuda|cpu-device]";
static const char *score_summary =
    "Print the log-probability of each token given the tokens before it (positions 1..T-1 of "
    "each sequence) and their sum, under the checkpoint's model.";

/* The checkpoint: its config.json, parameters checked and loaded. */
static arl_status load_ckpt(const char *dir, arl_model_config *cfg, arl_model_params *w) {
    ARL_TRY(cli_check_ckpt_dir("--ckpt", dir));
    ARL_TRY(arl_model_config_read(dir, cfg));
    ARL_TRY(arl_model_params_alloc(w, cfg));
    return arl_checkpoint_load(dir, cfg, w);
}

/* path in canonical form into buf (cap bytes): realpath of the file when it exists, else
 * realpath of its directory and its last name.  0 when neither resolves (no such directory). */
static int canonical_path(const char *path, char *buf, size_t cap) {
    char *r = realpath(path, NULL);
    if (r) {
        snprintf(buf, cap, "%s", r);
        free(r);
        return 1;
    }
    const char *slash = strrchr(path, '/');
    char dir[4096];
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == path)
        snprintf(dir, sizeof dir, "/");
    else
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    r = realpath(dir, NULL);
    if (!r) return 0;
    snprintf(buf, cap, "%s/%s", strcmp(r, "/") ? r : "", slash ? slash + 1 : path);
    free(r);
    return 1;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* Before any work: the output file path of option opt ("--logits-out") can be written and
 * replaces none of the run's inputs (the token or text file, the checkpoint's files) nor the
 * other output (other, may be NULL).  ARL_ERR_ARG naming the option otherwise. */
static arl_status check_out_path(const char *opt, const char *path, const score_opts *o,
                                 const char *other) {
    char out[8192], in[8192];
    struct stat st;
    if (!*path) return arl_errorf(ARL_ERR_ARG, "%s: empty file name", opt);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return arl_errorf(ARL_ERR_ARG, "%s %s: is a directory; give the name of the file to write",
                          opt, path);
    if (!canonical_path(path, out, sizeof out))
        return arl_errorf(ARL_ERR_ARG,
                          "%s %s: its directory does not exist or cannot be searched (create it "
                          "first)",
                          opt, path);
    const char *input = o->text ? o->text : o->tokens;
    if (input && canonical_path(input, in, sizeof in) && !strcmp(in, out))
        return arl_errorf(ARL_ERR_ARG,
                          "%s %s: is the input file %s; refusing to replace it (choose another "
                          "output path)",
                          opt, path, o->text ? "--text" : "--tokens");
    if (other && canonical_path(other, in, sizeof in) && !strcmp(in, out))
        return arl_errorf(ARL_ERR_ARG,
                          "%s %s: --logits-out and --grads-out name the same file (give two "
                          "paths)",
                          opt, path);
    char *slash = strrchr(out, '/'); /* out is absolute: "DIR/NAME" or "/NAME" */
    const char *name = slash + 1;
    *slash = 0;
    char *ck = realpath(o->ckpt, NULL);
    const int in_ckpt = ck && !strcmp(ck, *out ? out : "/");
    free(ck);
    if (in_ckpt && (!strcmp(name, "config.json") || ends_with(name, ".safetensors") ||
                    ends_with(name, ".safetensors.index.json")))
        return arl_errorf(ARL_ERR_ARG,
                          "%s %s: would replace a file of the checkpoint --ckpt %s; refusing "
                          "(write it outside the checkpoint directory or under another name)",
                          opt, path, o->ckpt);
    return ARL_OK;
}

/* Token ids (B, T) from the options; *rank_out 1 for [T]-shaped output, 2 for [B, T]. */
static arl_status load_tokens(const score_opts *o, const arl_model_config *cfg, int32_t **ids,
                              int64_t *B, int64_t *T, int *rank_out) {
    *ids = NULL;
    if (o->text) {
        char *txt = NULL;
        size_t len = 0;
        ARL_TRY(arl_file_read(o->text, 0, &txt, &len));
        if (len == 0) {
            free(txt);
            return arl_errorf(ARL_ERR_ARG, "--text %s: the file is empty: nothing to score",
                              o->text);
        }
        int64_t n = (int64_t)len + (o->bos ? 1 : 0);
        int32_t *t = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
        if (!t) {
            free(txt);
            return arl_errorf(ARL_ERR_NOMEM, "out of memory");
        }
        if (o->bos) t[0] = (int32_t)cfg->text.bos_token_id;
        arl_tokenizer_encode(txt, len, t + (o->bos ? 1 : 0));
        free(txt);
        *ids = t;
        *B = 1;
        *T = n;
        *rank_out = 1;
    } else {
        arl_npy a;
        ARL_TRY(arl_npy_read(o->tokens, &a));
        if ((a.dtype != ARL_DTYPE_I32 && a.dtype != ARL_DTYPE_I64) || a.rank < 1 || a.rank > 2) {
            /* the message before arl_npy_free, which zeroes a */
            arl_status s = arl_errorf(ARL_ERR_SHAPE,
                                      "%s: expected an int32 or int64 array of shape [T] or "
                                      "[B, T], got %s of rank %d",
                                      o->tokens, arl_dtype_name(a.dtype), a.rank);
            arl_npy_free(&a);
            return s;
        }
        *B = a.rank == 2 ? a.shape[0] : 1;
        *T = a.shape[a.rank - 1];
        *rank_out = a.rank;
        int32_t *t = malloc(sizeof(int32_t) * (size_t)(a.numel > 0 ? a.numel : 1));
        if (!t) {
            arl_npy_free(&a);
            return arl_errorf(ARL_ERR_NOMEM, "out of memory");
        }
        for (int64_t i = 0; i < a.numel; i++) {
            int64_t v = a.dtype == ARL_DTYPE_I32 ? ((int32_t *)a.data)[i] : ((int64_t *)a.data)[i];
            if (v < 0 || v >= cfg->dims.V) {
                arl_npy_free(&a);
                free(t);
                return arl_errorf(ARL_ERR_RANGE,
                                  "%s: token id %lld of sequence %lld at position "
                                  "%lld is outside the vocabulary [0, %lld)",
                                  o->tokens, (long long)v, (long long)(i / *T), (long long)(i % *T),
                                  (long long)cfg->dims.V);
            }
            t[i] = (int32_t)v;
        }
        arl_npy_free(&a);
        *ids = t;
    }
    if (*B < 1 || *T < 1) {
        free(*ids);
        *ids = NULL;
        return arl_errorf(ARL_ERR_ARG,
                          "--tokens %s: nothing to score: %lld sequence(s) of %lld "
                          "tokens",
                          o->tokens, (long long)*B, (long long)*T);
    }
    return ARL_OK;
}

/* Log-probs lp (B, T) (lp[b, t] = log pi(ids[b, t+1] | ids[b, ..t])) and logits (B, T, V) or
 * NULL, sequences packed into forwards when they fit, else chunked through a decode state: m's
 * (the CPU reference), or md's one decode slot when md is non-NULL (--device). */
static arl_status score_all(arl_model *m, arl_model_dev *md, const arl_model_config *cfg,
                            const int32_t *ids, int64_t B, int64_t T, float *lp, float *logits) {
    const int64_t V = cfg->dims.V;
    int32_t *targets = malloc(sizeof(int32_t) * (size_t)(B * T));
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(m->opts.max_docs + 1));
    if (!targets || !cu) {
        free(targets);
        free(cu);
        return arl_errorf(ARL_ERR_NOMEM, "out of memory");
    }
    for (int64_t b = 0; b < B; b++)
        arl_batch_next_token_targets(targets + b * T, ids + b * T, NULL, 1, T);
    arl_status s = ARL_OK;
    if (T <= m->opts.max_tokens) {
        int64_t per = m->opts.max_tokens / T;
        if (per > m->opts.max_docs) per = m->opts.max_docs;
        for (int64_t b0 = 0; b0 < B && !s; b0 += per) {
            int64_t nb = B - b0 < per ? B - b0 : per;
            for (int64_t i = 0; i <= nb; i++)
                cu[i] = (int32_t)(i * T);
            arl_batch bt = {.tokens = ids + b0 * T,
                            .T = nb * T,
                            .cu = cu,
                            .N = (int32_t)nb,
                            .targets = targets + b0 * T};
            arl_forward_out o = {.logits = logits ? logits + b0 * T * V : NULL,
                                 .logprobs = lp + b0 * T};
            s = md ? arl_model_dev_forward(md, &bt, &o) : arl_model_forward(m, &bt, &o);
        }
    } else if (md) {
        for (int64_t b = 0; b < B && !s; b++) {
            int32_t slot = 0;
            s = arl_model_dev_slot_reset(md, slot);
            for (int64_t t0 = 0; t0 < T && !s; t0 += m->opts.max_tokens) {
                int64_t c = T - t0 < m->opts.max_tokens ? T - t0 : m->opts.max_tokens;
                arl_batch bt = {
                    .tokens = ids + b * T + t0, .T = c, .targets = targets + b * T + t0};
                arl_forward_out o = {.logits = logits ? logits + (b * T + t0) * V : NULL,
                                     .logprobs = lp + b * T + t0};
                s = arl_model_dev_forward_state(md, &slot, &bt, &o);
            }
        }
    } else {
        arl_decode_state st;
        s = arl_decode_state_init(&st, cfg, 1, T);
        for (int64_t b = 0; b < B && !s; b++) {
            int32_t slot;
            s = arl_decode_state_join(&st, &slot);
            for (int64_t t0 = 0; t0 < T && !s; t0 += m->opts.max_tokens) {
                int64_t c = T - t0 < m->opts.max_tokens ? T - t0 : m->opts.max_tokens;
                arl_batch bt = {
                    .tokens = ids + b * T + t0, .T = c, .targets = targets + b * T + t0};
                arl_forward_out o = {.logits = logits ? logits + (b * T + t0) * V : NULL,
                                     .logprobs = lp + b * T + t0};
                s = arl_model_forward_state(m, &st, &slot, &bt, &o);
            }
            if (!s) arl_decode_state_leave(&st, slot);
        }
        arl_decode_state_free(&st);
    }
    free(targets);
    free(cu);
    return s;
}

/* The packed batch of sequences b0 .. b0 + per - 1 (fewer at the end) of ids (B, T) for the
 * gradient of their summed log-probability: cu, targets and dlogp (1 at every target) filled. */
static arl_batch grads_batch(const int32_t *ids, int64_t B, int64_t T, int64_t b0, int64_t per,
                             int32_t *cu, int32_t *targets, float *dlogp) {
    int64_t nb = B - b0 < per ? B - b0 : per;
    for (int64_t i = 0; i <= nb; i++)
        cu[i] = (int32_t)(i * T);
    arl_batch_next_token_targets(targets, ids + b0 * T, cu, (int32_t)nb, nb * T);
    for (int64_t t = 0; t < nb * T; t++)
        dlogp[t] = targets[t] >= 0 ? 1.0f : 0.0f;
    return (arl_batch){
        .tokens = ids + b0 * T, .T = nb * T, .cu = cu, .N = (int32_t)nb, .targets = targets};
}

/* The gradients written to path, an interrupt (Ctrl-C) deferred until the file is in place. */
static arl_status save_grads(const char *path, const arl_model_params *g) {
    cli_interrupt_defer();
    arl_status s = arl_model_grads_save(
        path, g, "gradient of the summed target log-probability (agentrl score)");
    cli_interrupt_resume();
    return s;
}

/* Gradient of sum over sequences and positions 1..T-1 of log pi(ids[b, t] | ids[b, <t]) into a
 * zeroed gradient arena, sequences packed as score_all packs them; written to path. */
static arl_status score_grads(arl_model *m, const arl_model_config *cfg, const arl_model_params *w,
                              const int32_t *ids, int64_t B, int64_t T, const char *path) {
    if (T > m->opts.max_tokens)
        return arl_errorf(ARL_ERR_ARG,
                          "--grads-out needs every sequence in one forward: sequences of %lld "
                          "tokens, --max-tokens %lld (raise it to at least %lld)",
                          (long long)T, (long long)m->opts.max_tokens, (long long)T);
    arl_train_opts to;
    arl_train_opts_default(&to);
    to.checkpoint = 1;     /* activation memory of one layer; the same gradients */
    to.max_state_docs = 1; /* fresh documents only: no room for initial states */
    arl_model_train tr;
    arl_model_params g;
    memset(&g, 0, sizeof g);
    float *garena = calloc((size_t)w->inv.arena_floats, sizeof(float));
    const int64_t n = m->opts.max_tokens;
    int32_t *targets = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(m->opts.max_docs + 1));
    float *dlogp = malloc(sizeof(float) * (size_t)n);
    arl_status s = ARL_OK;
    if (!garena || !targets || !cu || !dlogp)
        s = arl_errorf(ARL_ERR_NOMEM, "out of memory for the gradients (%.1f MiB)",
                       (double)w->inv.arena_floats * 4.0 / 1048576.0);
    if (!s) s = arl_model_params_view(&g, cfg, garena);
    if (!s)
        s = arl_model_train_init(&tr, m, &to, NULL);
    else
        memset(&tr, 0, sizeof tr);
    int64_t per = m->opts.max_tokens / T;
    if (per > m->opts.max_docs) per = m->opts.max_docs;
    for (int64_t b0 = 0; b0 < B && !s; b0 += per) {
        arl_batch bt = grads_batch(ids, B, T, b0, per, cu, targets, dlogp);
        s = arl_model_train_forward(&tr, &bt, NULL, NULL, NULL);
        if (!s) s = arl_model_backward(&tr, &bt, dlogp, &g, NULL, NULL);
    }
    if (!s) s = save_grads(path, &g);
    if (!s) arl_log_info("gradients of %lld tensors in %s", (long long)g.inv.n, path);
    arl_model_train_free(&tr);
    arl_model_params_free(&g);
    free(garena);
    free(targets);
    free(cu);
    free(dlogp);
    return s;
}

/* score_grads on the device model md (fresh documents, the same packing): the device training
 * forward and backward, the gradients downloaded into a host arena and written to path. */
static arl_status score_grads_dev(arl_model_dev *md, const arl_model_config *cfg,
                                  const arl_model_params *w, const int32_t *ids, int64_t B,
                                  int64_t T, const char *path) {
    arl_optim_config oc;
    arl_status s = arl_optim_config_defaults(&oc);
    arl_model_dev_train dt;
    arl_model_params g;
    memset(&g, 0, sizeof g);
    const int64_t n = md->opts.max_tokens;
    float *garena = calloc((size_t)w->inv.arena_floats, sizeof(float));
    int32_t *targets = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(md->opts.max_docs + 1));
    float *dlogp = malloc(sizeof(float) * (size_t)n);
    if (!s && (!garena || !targets || !cu || !dlogp))
        s = arl_errorf(ARL_ERR_NOMEM, "out of memory for the gradients (%.1f MiB)",
                       (double)w->inv.arena_floats * 4.0 / 1048576.0);
    if (!s)
        s = arl_model_dev_train_init(&dt, md, &oc);
    else
        memset(&dt, 0, sizeof dt);
    if (!s) s = arl_model_dev_zero_grad(&dt);
    int64_t per = n / T;
    if (per > md->opts.max_docs) per = md->opts.max_docs;
    for (int64_t b0 = 0; b0 < B && !s; b0 += per) {
        arl_batch bt = grads_batch(ids, B, T, b0, per, cu, targets, dlogp);
        s = arl_model_dev_train_forward(&dt, &bt, NULL);
        if (!s) s = arl_model_dev_backward(&dt, &bt, dlogp);
    }
    if (!s) s = arl_model_dev_grads_download(&dt, garena);
    if (!s) s = arl_model_params_view(&g, cfg, garena);
    if (!s) s = save_grads(path, &g);
    if (!s)
        arl_log_info("gradients of %lld tensors (device %s) in %s", (long long)g.inv.n,
                     md->ops->name, path);
    arl_model_dev_train_free(&dt);
    arl_model_params_free(&g);
    arl_optim_config_free(&oc);
    free(garena);
    free(targets);
    free(cu);
    free(dlogp);
    return s;
}

int cmd_score(int argc, char **argv) {
    score_opts o;
    int rc = cli_parse(score_tab, SCORE_N, argc, argv, &o, score_usage, score_summary);
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    if (!!o.text + !!o.tokens != 1) {
        fprintf(stderr, "agentrl: error: give exactly one of --text or --tokens\nusage: %s\n",
                score_usage);
        arl_options_free(score_tab, SCORE_N, &o);
        return ARL_EXIT_USAGE;
    }
    cli_print_resolved("score", score_tab, SCORE_N, &o);
    arl_model_config cfg;
    arl_model_params w;
    arl_model m;
    arl_model_dev md;
    int on_dev = 0;
    memset(&md, 0, sizeof md);
    memset(&cfg, 0, sizeof cfg);
    memset(&w, 0, sizeof w);
    memset(&m, 0, sizeof m);
    int32_t *ids = NULL;
    float *lp = NULL, *logits = NULL;
    int64_t B = 0, T = 0;
    int rank = 1;
    arl_status s = ARL_OK;
    if (o.logits_out) s = check_out_path("--logits-out", o.logits_out, &o, o.grads_out);
    if (!s && o.grads_out) s = check_out_path("--grads-out", o.grads_out, &o, NULL);
    if (!s && o.threads > 0) s = arl_k_threads_init((int)o.threads);
    if (!s) s = load_ckpt(o.ckpt, &cfg, &w);
    if (!s) s = load_tokens(&o, &cfg, &ids, &B, &T, &rank);
    if (!s && o.grads_out && T > o.max_tokens) /* a usage error, found before any work */
        s = arl_errorf(ARL_ERR_ARG,
                       "--grads-out needs every sequence in one forward: sequences of %lld "
                       "tokens, --max-tokens %lld (raise it to at least %lld)",
                       (long long)T, (long long)o.max_tokens, (long long)T);
    if (!s) {
        arl_model_opts mo;
        arl_model_opts_default(&mo);
        mo.max_tokens = B * T < o.max_tokens ? B * T : o.max_tokens;
        mo.max_docs = (int32_t)(B < 1024 ? B : 1024);
        mo.max_context = T;
        s = arl_model_init(&m, &cfg, &w, &mo);
        if (!s && strcmp(o.device, "cpu") != 0) {
            const arl_dev_ops *ops = NULL;
            arl_model_dev_opts dopts = {.n_slots = 1, .bf16_weights = 0, .decode_graphs = 0};
            /* the model's block (and with --grads-out the training block) plus the context's
             * own part (cuBLAS workspace, tables) */
            int64_t need = arl_model_dev_bytes(&cfg, &mo, arl_dev_ops_cuda(), &dopts);
            arl_model_dev plan;
            if (!s && o.grads_out &&
                !(s = arl_model_dev_plan(&plan, arl_dev_ops_cuda(), &cfg, &mo, &dopts)))
                need += arl_model_dev_train_bytes(&plan);
            const char *dev = strcmp(o.device, "cpu-device") ? o.device : "cpu";
            if (!s) s = arl_dev_ops_get(dev, (size_t)need + ((size_t)64 << 20), &ops);
            if (!s) s = arl_model_dev_init(&md, ops, &cfg, &w, &mo, &dopts);
            on_dev = !s;
        }
    }
    const int64_t V = cfg.dims.V;
    if (!s) {
        lp = malloc(sizeof(float) * (size_t)(B * T));
        if (o.logits_out) logits = malloc(sizeof(float) * (size_t)(B * T * V));
        if (!lp || (o.logits_out && !logits))
            s = arl_errorf(ARL_ERR_NOMEM, "out of memory for %lld x %lld logits", (long long)B,
                           (long long)T);
    }
    if (!s) s = score_all(&m, on_dev ? &md : NULL, &cfg, ids, B, T, lp, logits);
    if (!s && o.grads_out)
        s = on_dev ? score_grads_dev(&md, &cfg, &w, ids, B, T, o.grads_out)
                   : score_grads(&m, &cfg, &w, ids, B, T, o.grads_out);
    if (!s && o.logits_out) {
        int64_t shape[3] = {B, T, V};
        cli_interrupt_defer(); /* the file whole or not at all */
        s = rank == 2 ? arl_npy_write(o.logits_out, ARL_DTYPE_F32, 3, shape, logits)
                      : arl_npy_write(o.logits_out, ARL_DTYPE_F32, 2, shape + 1, logits);
        cli_interrupt_resume();
    }
    if (!s) {
        double total = 0;
        printf("seq pos token logprob\n");
        for (int64_t b = 0; b < B; b++)
            for (int64_t t = 1; t < T; t++)
                printf("%lld %lld %d %.6f\n", (long long)b, (long long)t, ids[b * T + t],
                       (double)lp[b * T + t - 1]);
        for (int64_t b = 0; b < B; b++) {
            double sum = 0;
            for (int64_t t = 0; t + 1 < T; t++)
                sum += lp[b * T + t];
            total += sum;
            printf("sum %lld %.6f\n", (long long)b, sum);
        }
        if (B > 1) printf("sum all %.6f\n", total);
        arl_log_info("scored %lld sequence(s) of %lld tokens: %lld log-probabilities%s%s",
                     (long long)B, (long long)T, (long long)(B * (T - 1)),
                     o.logits_out ? ", logits in " : "", o.logits_out ? o.logits_out : "");
    }
    rc = s ? cli_fail(s) : ARL_EXIT_OK;
    free(ids);
    free(lp);
    free(logits);
    arl_model_dev_free(&md);
    arl_model_free(&m);
    arl_model_params_free(&w);
    arl_model_config_free(&cfg);
    arl_options_free(score_tab, SCORE_N, &o);
    return rc;
}
