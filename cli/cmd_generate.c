/* cli/cmd_generate.c: `agentrl generate`: sample a continuation of a prompt under a checkpoint.
 *
 * The prompt (--prompt, or --prompt-file read whole: a message longer than a command line;
 * - is standard input) and an optional PNG/PPM image become one user message rendered with the chat
 * template plus the generation prompt (docs/chat_template.md); the prompt is prefilled into a
 * decode state (policy/model.h), then tokens are drawn one at a time (policy/sample.h) until
 * <|end_of_msg|> or --max-tokens.  The decoded text of the drawn tokens (without the stop
 * token; special tokens by name) goes to stdout as each is drawn, so that an interrupted or
 * failed generation shows what it had sampled; a summary line goes to stderr.  The text is valid
 * UTF-8: a character whose bytes are spread over tokens is written once its last byte is drawn,
 * invalid bytes and a character cut by the end of the reply are written as U+FFFD (the reply as
 * arl_tokenizer_decode with ARL_DECODE_UTF8_REPLACE has it; an interrupt loses the up to 3 bytes
 * of a character not yet complete).
 * --device cuda: prefill and decode steps run on the GPU (policy/model_device.h, decode steps
 * replayed as a CUDA graph); an --image's rows are encoded by the vision tower on the CPU and
 * placed by the device prefill.
 */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "core/file.h"
#include "core/log.h"
#include "core/rng.h"
#include "kernels/threadpool.h"
#include "policy/chat.h"
#include "policy/checkpoint.h"
#include "policy/image.h"
#include "policy/model.h"
#include "policy/model_device.h"
#include "policy/sample.h"
#include "policy/vision.h"

typedef struct generate_opts {
    char *ckpt;
    char *prompt;
    char *prompt_file;
    char *image;
    double temperature;
    double top_p;
    int64_t seed;
    int64_t max_tokens;
    int64_t max_patches;
    int64_t max_pixels;
    int64_t threads;
    char *device;
} generate_opts;

static const arl_option generate_tab[] = {
    {"ckpt", ARL_OPT_STRING, offsetof(generate_opts, ckpt), NULL,
     "checkpoint directory (config.json + safetensors)", 0, 0, NULL, ARL_OPT_REQUIRED, "DIR"},
    {"prompt", ARL_OPT_STRING, offsetof(generate_opts, prompt), NULL,
     "the user message (text); or give --prompt-file", 0, 0, NULL, 0, "TEXT"},
    {"prompt-file", ARL_OPT_STRING, offsetof(generate_opts, prompt_file), NULL,
     "read the user message from this file, its bytes as they are (a final newline included); "
     "- reads standard input (for a message longer than a command line takes)",
     0, 0, NULL, 0, "FILE"},
    {"image", ARL_OPT_STRING, offsetof(generate_opts, image), NULL,
     "an image (PNG or PPM) appended to the user message; needs a model with vision_config", 0, 0,
     NULL, 0, "FILE"},
    {"temperature", ARL_OPT_FLOAT, offsetof(generate_opts, temperature), "1.0",
     "sampling temperature (0: greedy)", 0, 100, NULL, 0, "T"},
    {"top-p", ARL_OPT_FLOAT, offsetof(generate_opts, top_p), "1.0",
     "nucleus sampling: keep the most likely tokens up to this mass (1: all)", 1e-9, 1, NULL, 0,
     "P"},
    {"seed", ARL_OPT_INT, offsetof(generate_opts, seed), "0",
     "random seed (the same seed gives the same tokens)", 0, 9.2e18, NULL, 0, "S"},
    {"max-tokens", ARL_OPT_INT, offsetof(generate_opts, max_tokens), "256",
     "most tokens to generate", 1, 1 << 24, NULL, 0, "N"},
    {"max-patches", ARL_OPT_INT, offsetof(generate_opts, max_patches), "1024",
     "--image: cap on the image's patch grid (gh * gw); the image is scaled down to fit", 4,
     1 << 20, NULL, 0, "N"},
    {"max-pixels", ARL_OPT_INT, offsetof(generate_opts, max_pixels), "16777216",
     "--image: largest image (width * height) accepted", 1, 1LL << 32, NULL, 0, "N"},
    {"threads", ARL_OPT_INT, offsetof(generate_opts, threads), "0",
     "CPU threads (0: the default of the kernels' pool)", 0, 1024, NULL, 0, "N"},
    {"device", ARL_OPT_CHOICE, offsetof(generate_opts, device), "cpu",
     "where the model runs: cpu, or cuda (a GPU; needs a CUDA build and a visible device; an "
     "--image is encoded on the CPU)",
     0, 0, "cpu|cuda", 0, "DEV"},
};
#define GENERATE_N ARL_OPTIONS_COUNT(generate_tab)

static const char *generate_usage =
    "agentrl generate --ckpt DIR (--prompt TEXT | --prompt-file FILE) [--image FILE] "
    "[--temperature T] [--top-p P] [--seed S] [--max-tokens N] [--device cpu|cuda]";
static const char *generate_summary =
    "Sample an assistant reply to a user message (text and optional image) under a checkpoint "
    "and print its text.";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Everything a generation holds, freed in one place. */
typedef struct gen_run {
    arl_model_config cfg;
    arl_model_params w;
    arl_model m;
    arl_decode_state st;
    arl_model_dev md; /* --device other than cpu: the model and its one decode slot */
    int on_dev;
    arl_sampler smp;
    arl_chat_conv conv;
    arl_chat_tokens prompt;
    arl_image img;
    float *media;
    int64_t n_media;
    float *logits;
    arl_utf8_stream utf8; /* the bytes of a character not yet complete */
    int printed;          /* text went to stdout (a newline ends it) */
} gen_run;

static void gen_run_free(gen_run *g) {
    free(g->media);
    free(g->logits);
    arl_image_free(&g->img);
    arl_chat_tokens_free(&g->prompt);
    arl_chat_conv_free(&g->conv);
    arl_sampler_free(&g->smp);
    arl_decode_state_free(&g->st);
    arl_model_dev_free(&g->md);
    arl_model_free(&g->m);
    arl_model_params_free(&g->w);
    arl_model_config_free(&g->cfg);
}

/* The chat template of this model: byte-level ids with the config's bos/eos/pad/media ids,
 * patch size from vision_config (0: text-only, images rejected). */
static arl_status make_template(const arl_model_config *cfg, int64_t max_patches,
                                arl_chat_template *t) {
    arl_chat_template_default(t);
    t->tok.vocab_size = (int32_t)cfg->dims.V;
    t->tok.special[ARL_SPECIAL_BOS] = (int32_t)cfg->text.bos_token_id;
    t->tok.special[ARL_SPECIAL_EOS] = (int32_t)cfg->text.eos_token_id;
    t->tok.special[ARL_SPECIAL_PAD] = (int32_t)cfg->text.pad_token_id;
    if (cfg->media_placeholder_token_id != ARL_CONFIG_ABSENT)
        t->tok.special[ARL_SPECIAL_MEDIA_PAD] = (int32_t)cfg->media_placeholder_token_id;
    t->patch_size = cfg->has_vision ? (int32_t)cfg->dims.vp : 0;
    t->image_max_patches = max_patches;
    arl_status s = arl_tokenizer_spec_validate(&t->tok);
    if (s)
        return arl_error_prefix(s, "the checkpoint's vocabulary does not fit the byte-level "
                                   "chat template");
    return ARL_OK;
}

/* Write text[0..len) of the reply through g->utf8 to stdout, flushed, so that what was sampled
 * is there when the process is interrupted; end: also what g->utf8 still holds, as U+FFFD. */
static arl_status print_text(gen_run *g, const char *text, size_t len, int end) {
    char out[ARL_UTF8_STREAM_OUT(32)];
    int ok = 1;
    for (size_t at = 0; at < len; at += 32) {
        const size_t k =
            arl_utf8_stream_put(&g->utf8, text + at, len - at < 32 ? len - at : 32, out);
        ok &= fwrite(out, 1, k, stdout) == k;
    }
    if (end) {
        const size_t k = arl_utf8_stream_end(&g->utf8, out);
        ok &= fwrite(out, 1, k, stdout) == k;
    }
    if (!ok || fflush(stdout) != 0)
        return arl_errorf(ARL_ERR_IO, "standard output: write failed: %s", strerror(errno));
    return ARL_OK;
}

/* Print the text of one drawn token (a byte as itself, a special by name) at once. */
static arl_status print_token(gen_run *g, const arl_tokenizer_spec *tok, int32_t id) {
    char *text;
    size_t len;
    ARL_TRY(arl_tokenizer_decode(tok, &id, 1, 0, &text, &len));
    const arl_status s = print_text(g, text, len, 0);
    free(text);
    return s;
}

/* prompt: the text of --prompt, or of --prompt-file read whole (owned by the caller). */
static arl_status generate(const generate_opts *o, const char *prompt, size_t prompt_len,
                           gen_run *g) {
    ARL_TRY(cli_check_ckpt_dir("--ckpt", o->ckpt));
    ARL_TRY(arl_model_config_read(o->ckpt, &g->cfg));
    const arl_model_config *cfg = &g->cfg;
    arl_chat_template t;
    ARL_TRY(make_template(cfg, o->max_patches, &t));
    if (o->image && !cfg->has_vision)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "--image %s: the model has no vision tower (its "
                          "config.json has no vision_config)",
                          o->image);
    if (o->image) {
        arl_status s = arl_image_load(o->image, o->max_pixels, &g->img);
        if (s == ARL_ERR_RANGE)
            return arl_error_prefix(s, "--image (--max-pixels %lld)", (long long)o->max_pixels);
        if (s) return arl_error_prefix(s, "--image");
    }
    ARL_TRY(arl_model_params_alloc(&g->w, cfg));
    ARL_TRY(arl_checkpoint_load(o->ckpt, cfg, &g->w));

    /* the prompt: one user message (text, then the image) and the generation prompt */
    ARL_TRY(arl_chat_conv_add_text(&g->conv, ARL_CHAT_USER, prompt, prompt_len));
    if (o->image) ARL_TRY(arl_chat_conv_add_part_image(&g->conv, g->img.width, g->img.height));
    ARL_TRY(arl_chat_render(&t, &g->conv, 1, &g->prompt));
    const int64_t n_prompt = (int64_t)g->prompt.n;
    if (o->image)
        ARL_TRY(arl_vision_encode_images(&g->w, cfg, &g->img, 1, o->max_patches, &g->media,
                                         &g->n_media));

    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_tokens = n_prompt < 2048 ? n_prompt : 2048;
    mo.max_docs = 1;
    mo.max_context = n_prompt + o->max_tokens;
    if (strcmp(o->device, "cpu") != 0) {
        const arl_dev_ops *ops = NULL;
        arl_model_dev_opts dopts = {.n_slots = 1, .bf16_weights = 0, .decode_graphs = 1};
        /* the model's block plus the context's own part (cuBLAS workspace, tables) */
        int64_t need = arl_model_dev_bytes(cfg, &mo, arl_dev_ops_cuda(), &dopts);
        ARL_TRY(arl_dev_ops_get(o->device, (size_t)need + ((size_t)64 << 20), &ops));
        ARL_TRY(arl_model_dev_init(&g->md, ops, cfg, &g->w, &mo, &dopts));
        g->on_dev = 1;
    } else {
        ARL_TRY(arl_model_init(&g->m, cfg, &g->w, &mo));
        ARL_TRY(arl_decode_state_init(&g->st, cfg, 1, mo.max_context));
    }
    ARL_TRY(arl_sampler_init(&g->smp, cfg->dims.V));
    const int64_t V = cfg->dims.V;
    g->logits = malloc(sizeof(float) * (size_t)V);
    if (!g->logits) return arl_errorf(ARL_ERR_NOMEM, "out of memory");

    double t0 = now_s();
    int32_t slot = 0;
    if (g->on_dev) {
        ARL_TRY(arl_model_dev_prefill(&g->md, slot, g->prompt.ids, n_prompt, g->media, g->n_media,
                                      NULL, g->logits));
    } else {
        ARL_TRY(arl_decode_state_join(&g->st, &slot));
        ARL_TRY(arl_model_prefill(&g->m, &g->st, slot, g->prompt.ids, n_prompt, g->media,
                                  g->n_media, NULL, g->logits));
    }
    double t1 = now_s();

    int32_t stop[4];
    size_t n_stop = arl_chat_stop_tokens(&t, stop);
    arl_sample_params sp = {.temperature = o->temperature, .top_p = o->top_p};
    ARL_TRY(arl_sample_params_check(&sp));
    arl_rng rng;
    arl_rng_seed(&rng, (uint64_t)o->seed);
    int64_t n_out = 0;
    int stopped = 0;
    double sum_lp = 0;
    cli_note_on_interrupt_text("\nagentrl: interrupted: generate stops here; the text above is "
                               "what it had sampled\n");
    while (n_out < o->max_tokens) {
        float lp_raw;
        int32_t tok = arl_sample(&g->smp, g->logits, &sp, &rng, NULL, &lp_raw);
        sum_lp += lp_raw;
        for (size_t i = 0; i < n_stop; i++)
            stopped |= tok == stop[i];
        if (stopped) break;
        n_out++;
        ARL_TRY(print_token(g, &t.tok, tok));
        g->printed = 1;
        if (n_out == o->max_tokens) break;
        if (g->on_dev)
            ARL_TRY(arl_model_dev_decode_step(&g->md, &slot, 1, &tok, g->logits, NULL));
        else
            ARL_TRY(arl_model_decode_step(&g->m, &g->st, &slot, 1, &tok, g->logits, NULL));
    }
    double t2 = now_s();

    g->printed = 0;
    ARL_TRY(print_text(g, "\n", 1, 1)); /* (a character cut by the end: U+FFFD, then the newline) */
    arl_log_info("prompt %lld tokens (prefill %.2f s), generated %lld tokens in %.2f s "
                 "(%.1f tokens/s), %s, sum log-prob %.4f (temperature 1, no top-p)",
                 (long long)n_prompt, t1 - t0, (long long)n_out, t2 - t1,
                 t2 > t1 ? (double)n_out / (t2 - t1) : 0.0,
                 stopped ? "stopped at <|end_of_msg|>" : "stopped at --max-tokens", sum_lp);
    return ARL_OK;
}

int cmd_generate(int argc, char **argv) {
    generate_opts o;
    int rc = cli_parse(generate_tab, GENERATE_N, argc, argv, &o, generate_usage, generate_summary);
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    const char *usage_err = NULL;
    if (!o.prompt == !o.prompt_file)
        usage_err = "give the user message as exactly one of --prompt TEXT or --prompt-file FILE";
    else if (o.prompt && !o.prompt[0] && !o.image) /* (an image alone is a user message) */
        usage_err = "--prompt: empty (give the user message text)";
    if (usage_err) {
        fprintf(stderr, "agentrl: error: %s\nusage: %s\n", usage_err, generate_usage);
        arl_options_free(generate_tab, GENERATE_N, &o);
        return ARL_EXIT_USAGE;
    }
    cli_print_resolved("generate", generate_tab, GENERATE_N, &o);
    gen_run g;
    memset(&g, 0, sizeof g);
    arl_chat_conv_init(&g.conv);
    arl_chat_tokens_init(&g.prompt);
    arl_status s = ARL_OK;
    char *file_text = NULL;
    size_t prompt_len = o.prompt ? strlen(o.prompt) : 0;
    if (o.prompt_file) {
        const char *path = strcmp(o.prompt_file, "-") ? o.prompt_file : "/dev/stdin";
        s = arl_file_read(path, 0, &file_text, &prompt_len);
        if (s)
            s = arl_error_prefix(s, "--prompt-file");
        else if (prompt_len == 0 && !o.image)
            s = arl_errorf(ARL_ERR_ARG,
                           "--prompt-file %s: the file is empty (give the user "
                           "message text)",
                           o.prompt_file);
    }
    if (!s && o.threads > 0) s = arl_k_threads_init((int)o.threads);
    if (!s) s = generate(&o, o.prompt_file ? file_text : o.prompt, prompt_len, &g);
    if (g.printed) /* the end of the text drawn before the failure */
        (void)print_text(&g, "\n", 1, 1);
    rc = s ? cli_fail(s) : ARL_EXIT_OK;
    gen_run_free(&g);
    free(file_text);
    arl_options_free(generate_tab, GENERATE_N, &o);
    return rc;
}
