/* experiments/sft.h: supervised fine-tuning (`agentrl sft EXPERIMENT.json`): the experiment's
 * option table, the training loop, and the interface through which it calls the model.
 *
 * The loop, per optimizer step s = 0, 1, ... (one packed batch per step):
 *   batch  = next batch of the training data (experiments/sft_data.h)
 *   grads  = 0;  ops->train_step(batch, scale = 1 / batch.n_targets) accumulates
 *            d(mean token loss)/dtheta and returns the summed loss
 *   AdamW step (policy/optimizer.h; clipping, schedule), then the QB router-bias update from
 *   the router scores the train step reported
 *   metrics line; progress; evaluation every eval-interval steps; a training checkpoint
 *   (policy/train_state.h) every checkpoint-interval steps and at the end
 * Everything is a pure function of the experiment and the data, so the same experiment gives
 * bit-identical losses and parameters (with the same thread count), and a run resumed from a
 * checkpoint ends bit-identical to one that was never interrupted.
 *
 * Output directory (`out`):
 *   experiment.json          the resolved configuration (every option, defaults included)
 *   metrics.jsonl            one object per step {"step", "loss", "lr", "grad_norm",
 *                            "clip_coef", "tokens", "targets", "seqs", "epoch",
 *                            "tokens_total", "elapsed_s"} and one per evaluation {"step",
 *                            "eval_loss", "eval_targets", "eval_seqs"}; losses are mean
 *                            nats per target token, written with 17 significant digits
 *   checkpoints/step-N/      model + optimizer moments + train state (keep-last newest)
 * A run refuses an output directory that already holds checkpoints, or an earlier run's
 * metrics.jsonl or experiment.json, unless resuming; --resume continues from the newest
 * checkpoint (refusing another model or run configuration, naming the settings that differ),
 * drops metrics lines of steps after it, and starts fresh when there is none.  A metrics line
 * that cannot be written (a full disk: ARL_ERR_FULL) stops the run.
 *
 * Before any output: both data files are indexed (sft_data.h), every conversation must fit
 * batch-tokens, and a warning counts the eval conversations whose tokens also occur in the
 * training data (their eval loss is not held out).  The model's working memory is sized for
 * min(batch-tokens, one epoch's tokens of the larger file): a batch never spans two epochs, so
 * a larger budget packs the same batches.
 *
 * Paths in the experiment file are taken relative to the current directory.
 * Not here: the model's math (ops), the CLI glue (cli/cmd_sft.c), images in SFT data.
 */
#ifndef ARL_EXPERIMENTS_SFT_H
#define ARL_EXPERIMENTS_SFT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/options.h"
#include "core/status.h"
#include "experiments/sft_data.h"
#include "policy/config.h"
#include "policy/optimizer.h"
#include "policy/params.h"

/* ---- the interface the model implements for SFT ---- */

typedef struct arl_sft_model_ops {
    const char *name; /* shown in the log */

    /* Allocate the model's working memory (activations, scratch) for batches of at most
     * max_tokens tokens in at most max_seqs sequences; nothing is allocated per step.
     * cfg is borrowed and outlives the workspace.  threads: the run's thread setting (0 =
     * default).  *ws is freed with destroy. */
    arl_status (*create)(void **ws, const arl_model_config *cfg, int64_t max_tokens,
                         int64_t max_seqs, int threads);
    void (*destroy)(void *ws); /* NULL-safe */

    /* Forward and backward of one packed batch (experiments/sft_data.h: ids, labels,
     * cu_seqlens; every sequence starts from the empty state and sees only its own tokens).
     * With z_t the logits (V) at position t:
     *   *loss_sum = sum over t with labels[t] != ARL_SFT_IGNORE of -log softmax(z_t)[labels[t]]
     * (accumulated in double), and the gradient of scale * loss_sum with respect to every
     * trained parameter is ADDED (+=) into grads (a view of the parameters' layout; the
     * caller zeroes it once per optimizer step; no_grad tensors are left alone).
     * router (may be NULL): append each MoE layer's router scores and selected experts of the
     * batch's tokens with arl_router_scores_append, for the QB update.  params are not
     * modified.  Errors are returned with a message; the step is then abandoned. */
    arl_status (*train_step)(void *ws, const arl_model_params *params, const arl_sft_batch *b,
                             double scale, arl_model_params *grads, double *loss_sum,
                             arl_router_scores *router);

    /* Forward only: *loss_sum as above. */
    arl_status (*eval)(void *ws, const arl_model_params *params, const arl_sft_batch *b,
                       double *loss_sum);
} arl_sft_model_ops;

/* The model implementation `agentrl sft` uses: the CPU policy (experiments/sft_model.c). */
const arl_sft_model_ops *arl_sft_model_ops_default(void);

/* ---- configuration ---- */

typedef struct arl_sft_config {
    char *model;                 /* model config (file, directory, shipped name) */
    char *init;                  /* checkpoint directory to start from; NULL: from scratch */
    int64_t init_seed;           /* seed of the from-scratch initialisation */
    char *data;                  /* training JSONL */
    char *eval_data;             /* held-out JSONL; NULL: no evaluation */
    int64_t batch_tokens;        /* token budget of one step's packed batch */
    int64_t max_seq_tokens;      /* budget of one conversation; 0 = batch_tokens */
    char *on_long;               /* "truncate" | "drop" */
    char *on_malformed;          /* "skip" | "fail" */
    int shuffle;                 /* shuffle every epoch */
    int shared_prefix;           /* compute the conversations' shared prefix once per batch */
    int64_t steps;               /* optimizer steps of the run */
    int64_t eval_interval;       /* evaluate every N steps (0: at the end only) */
    int64_t eval_max_batches;    /* batches per evaluation (0: the whole file) */
    int64_t checkpoint_interval; /* checkpoint every N steps (0: at the end only) */
    int64_t keep_last;           /* checkpoints kept (0: all) */
    char *out;                   /* output directory */
    int64_t seed;                /* shuffle seed (and the train RNG) */
    int64_t threads;             /* CPU threads (0: the kernels' default) */
    int64_t log_interval;        /* plain progress line every N steps */
    char *progress;              /* "auto" | "line" | "plain" | "off" */
    arl_optim_config optim;      /* optimizer keys (policy/optimizer.h) */
} arl_sft_config;

/* The experiment's option table (its own keys, then the optimizer's with shifted offsets);
 * static storage. */
const arl_option *arl_sft_options(size_t *n);

/* The help line of the key "model", which the train driver (experiments/train.h) has too and
 * passes on to its SFT stage. */
#define ARL_SFT_MODEL_HELP                                                                         \
    "model config: config.json, a directory holding one, or tiny / mini / kimi-k3 (default: the "  \
    "config.json of init)"

/* Defaults, the JSON experiment file at path (NULL: none), then each "key=value" of sets
 * (may be NULL), then the required keys and cross-checks (arl_sft_config_check).  Errors name
 * the file and key.  c is freed with arl_sft_config_free (also after an error). */
arl_status arl_sft_config_load(const char *path, const arl_strlist *sets, arl_sft_config *c);
/* Cross-field checks: model or init given, no empty path, max-seq-tokens 0 or in
 * [2, batch-tokens], eval-interval / eval-max-batches only with eval-data, optimizer keys. */
arl_status arl_sft_config_check(const arl_sft_config *c);
void arl_sft_config_free(arl_sft_config *c); /* NULL-safe */

/* ---- the run ---- */

/* Called after every step, once its metrics and checkpoint are written; a non-OK status stops
 * the run with that status (after nothing else is written). */
typedef struct arl_sft_hooks {
    void *ctx;
    arl_status (*after_step)(void *ctx, int64_t step, double loss);
} arl_sft_hooks;

typedef struct arl_sft_result {
    int64_t step;          /* steps completed */
    int64_t resumed_from;  /* step of the checkpoint resumed from, -1 if none */
    int64_t tokens;        /* tokens trained on (whole run, resumes included) */
    double loss;           /* loss of the last step */
    double eval_loss;      /* last evaluation (NAN if none) */
    char checkpoint[4096]; /* directory of the last checkpoint written ("" if none) */
} arl_sft_result;

/* Run the experiment c with the model ops.  resume: continue from the newest checkpoint in
 * c->out (1: --resume, which says so when there is none yet; 2: the same, quietly, for a caller
 * whose stage this run is and that continues what it left whether or not its user asked for
 * --resume: experiments/train.c's SFT stage).  log: progress lines and the resolved configuration
 * (NULL: quiet).  hooks and res may be NULL. */
arl_status arl_sft_run(const arl_sft_config *c, const arl_sft_model_ops *ops, int resume,
                       const arl_sft_hooks *hooks, FILE *log, arl_sft_result *res);

#endif
