/* experiments/train.h: `agentrl train EXPERIMENT.json [--set key=value ...] [--resume]` - the
 * end-to-end RL post-training run: optional SFT warm start on the environment teacher's
 * demonstrations, held-out evaluation before and after, and the synchronous loop
 *   rollout (B tasks x G samples with policy version n) -> update n (learner/update.h)
 *   -> version n + 1 -> rollout ...
 * with atomic checkpoints, exact resume, metrics, a progress line and the report.
 *
 * ---- The experiment file ----
 * One JSON object.  Its top-level keys are the driver's (arl_train_options: model, out, steps,
 * tasks-per-update, evaluation, SFT demonstrations, checkpoints, staged context, ...); three
 * sections hold the other option tables, each key under its table's own name:
 *   "rollout": {...}  rollout/rollout.h arl_rollout_options (environment, group-size,
 *                     sampling, budgets, batch-size, ...)
 *   "learner": {...}  learner/update.h arl_learner_options: the learner's keys plus the
 *                     objective's reward keys, loss keys, kl-* keys, dist-* keys and the RL
 *                     optimizer's keys (lr, clip-norm, qb-method, ...), one flat table
 *   "sft":     {...}  experiments/sft.h arl_sft_options except the keys the driver sets
 *                     (model, init, init-seed, data, eval-data, out, threads, progress)
 * Unknown keys and sections are errors naming them.  On the command line
 * `--set key=value` sets a top-level key and `--set section.key=value` a section's key
 * (`--set rollout.temperature=0.7`, `--set learner.kl-target=0.01`, `--set sft.steps=50`);
 * --set is applied after the file.  The rollout keys tasks, task-file (when given it is the task
 * dataset: update n takes lines n*B .. n*B+B-1, cyclically), group-kind, run-uid (the base of
 * the per-update run uids), policy-dir, policy-version and threads are managed by the driver.
 * The resolved configuration (every key, defaults included, in the same shape) is printed at
 * the start and stored as OUT/experiment.json; that file is a valid experiment.
 *
 * ---- Tasks and seeds ----
 * Update n rolls out tasks i = n*B .. n*B+B-1 with seed rollout.task-seed + i (generated tasks,
 * id "task<i>", data rollout.task-data).  Held-out evaluation uses eval-tasks tasks with seeds
 * eval-task-seed + j (greedy at eval-temperature 0), SFT demonstrations the teacher's episodes
 * with seeds sft-demo-seed + j: the defaults keep the three seed ranges apart.  Distinct seeds
 * can still render the same question; with eval-split F > 0 (built-in environments) the split
 * is by prompt instead (experiments/heldout.h): held-out task j is the j-th seed from
 * eval-task-seed whose prompt is held out, RL task i and SFT demonstration j the i-th / j-th
 * seed from their bases whose prompt is not, so no evaluated question is ever trained on.
 *
 * ---- Output directory (out) ----
 *   experiment.json        resolved configuration
 *   sft/                   the SFT stage (experiments/sft.h: demos.jsonl, metrics, checkpoints)
 *   reference/             the initial policy = the frozen KL reference (model checkpoint)
 *   policy/v<N>/           the weights of policy version N that rollouts load (last two kept)
 *   replay/u<NNNNNN>/r<R>/ update n's replay store written by rollout rank R (its own catalog
 *                          and ledger); an interrupted rollout's store is renamed
 *                          u<NNNNNN>.interrupted-<K> (kept for inspection, never trained on)
 *                          and the update's tasks are rolled out again from the start
 *   replay/u<NNNNNN>/tasks-r<R>.jsonl, window-r<R>.json   rollout rank R's task file and, once
 *                          its rollout succeeded, its client-fault alert window after it
 *   replay/eval-before/, replay/eval-after/   the evaluation episodes (an evaluation of another
 *                          policy version - steps raised on a finished run - is renamed
 *                          eval-after.stale-<K> and the arm evaluated again)
 *   checkpoints/step-N/    training checkpoints after N optimizer steps (= updates x
 *                          minibatches; policy/train_state.h: model, AdamW moments,
 *                          train_state.json whose "extra" holds the update count, the KL
 *                          controller, the next task index and the ledger of the update)
 *   metrics.jsonl          one JSON object per update: every metric of spec/objective.md
 *                          section 12 (learner/update.h) plus "step", rollout and time figures
 *   eval-before.json, eval-after.json, eval.json   held-out results (experiments/report.h)
 *   eval-before.outcomes, eval-after.outcomes      one character per held-out task j ('1'
 *                          success, '0' failure, '-' no valid episode): eval.json's "paired"
 *                          table compares the two arms task by task
 *   metrics.csv, plots/, summary.md               the report (experiments/report.h)
 *
 * ---- Exactness and resume ----
 * For a fixed thread count a run is a pure function of the experiment: rollouts sample from
 * per-trajectory streams, updates are deterministic.  --resume continues from the newest
 * checkpoint (refusing another model or run configuration, also before the first checkpoint:
 * the settings hashed into the run hash must equal those of OUT/experiment.json, which a refused
 * resume leaves as it was; a run without --resume is refused where a run left checkpoints, a
 * reference, an SFT stage or replay stores): updates after it are re-done on
 * the same stored groups when their rollout completed (the ledger re-plans the same groups;
 * committing a committed update is a no-op), an incomplete rollout is set aside and repeated, a
 * planned update whose checkpoint exists is committed, metrics lines after the checkpoint are
 * dropped (an update's line is written before its checkpoint; a damaged line is named and the
 * file kept as metrics.jsonl.damaged-<k>), an evaluation arm without its outcomes file is counted
 * again from its store, and each rollout rank's client-fault alert window (spec/aep.md 8.6) is
 * the one its rollout of the update before left (replay/uNNNNNN/window-rK.json; train.c, "the
 * client-fault alert window across resumes"), so an alert halts the resumed run at the same
 * trajectory.  So a run killed at any point and resumed ends bit-identical to one never
 * interrupted, and every task is trained on exactly once.  The SFT stage resumes by itself.
 *
 * ---- Staleness ----
 * The loop is synchronous: the tasks of update n are admitted and rolled out with policy
 * version n after it is published, so every segment of update n has staleness 0 and the
 * admission bound of spec/objective.md section 9 holds trivially; the staleness mask and its
 * metrics (learner/loss.h) apply unchanged to stores written by asynchronous workers.
 *
 * ---- MPI ----
 * `mpirun -np N agentrl train x.json`: roles from learner.dist-learners (learner/dist.h).
 * Rollout ranks split each update's tasks in contiguous blocks (rank R writes its own store
 * replay/u<n>/r<R>; rank R > 0 samples with seed rollout.seed + R * 2^32, so that its streams
 * differ from rank 0's: the rollout seeds a trajectory's stream from its group's index within
 * the worker's own block); learner ranks split the update's groups (learner/update.h) and keep
 * identical weights through the deterministic all-reduce; rank 0 runs the SFT stage, writes
 * checkpoints, policy versions, metrics and the report.  All ranks need the output directory
 * (one machine, or a shared file system).
 *
 * Not here: the update's math (learner/), generation (rollout/), SFT (experiments/sft.c).
 */
#ifndef ARL_EXPERIMENTS_TRAIN_H
#define ARL_EXPERIMENTS_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/options.h"
#include "core/status.h"
#include "experiments/sft.h"
#include "learner/dist.h"
#include "learner/update.h"
#include "rollout/rollout.h"

typedef struct arl_train_config {
    /* top level (arl_train_options) */
    char *model;              /* model config (file, directory or shipped name) */
    char *init;               /* checkpoint to start from (before SFT); NULL: from scratch */
    int64_t init_seed;        /* seed of the from-scratch initialisation */
    char *out;                /* output directory */
    int64_t steps;            /* RL updates */
    int64_t tasks_per_update; /* B */
    int64_t seed;             /* learner seed (minibatch shuffles) */
    int64_t threads;          /* CPU threads (0: the kernels' default) */
    int64_t checkpoint_interval;
    int64_t keep_last;
    int64_t eval_tasks; /* held-out episodes before and after (0: none) */
    int64_t eval_task_seed;
    double eval_split; /* fraction of task prompts held out (experiments/heldout.h); 0: off */
    double validation_split; /* further fraction held out for tuning (needs eval_split > 0) */
    char *eval_set;          /* test|validation: the held-out side the evaluation draws */
    double eval_temperature;
    int eval_before, eval_after;
    int64_t sft_demos; /* teacher episodes for the SFT warm start (0: no SFT) */
    int64_t sft_demo_seed;
    char *sft_demo_options;     /* JSON object text: options of the demonstration episodes */
    arl_strlist context_stages; /* "STEP:TOKENS": from update STEP on, context budget TOKENS
                                 * (2 <= TOKENS <= rollout.context_tokens) */
    char *progress;             /* auto|line|plain|off */
    char *title;                /* report title */
    /* sections */
    arl_rollout_config rollout;
    arl_learner_opts learner;
    arl_sft_config sft;
} arl_train_config;

/* The top-level table (static storage). */
const arl_option *arl_train_options(size_t *n);

/* Defaults, the experiment file at path (NULL: none), then each --set of sets (may be NULL),
 * then the checks.  Errors name the file, section and key.  Free c with arl_train_config_free
 * (also after an error). */
arl_status arl_train_config_load(const char *path, const arl_strlist *sets, arl_train_config *c);
/* Cross-section checks (budgets, stages, SFT demonstrations need a built-in environment). */
arl_status arl_train_config_check(const arl_train_config *c);
void arl_train_config_free(arl_train_config *c); /* NULL-safe */

/* The resolved configuration as one JSON object in the experiment's shape; caller frees. */
char *arl_train_config_json(const arl_train_config *c);
/* The same as "key = value" lines, section by section. */
void arl_train_config_print(const arl_train_config *c, FILE *f);

typedef struct arl_train_result {
    int64_t updates;       /* updates completed */
    int64_t resumed_from;  /* updates of the checkpoint resumed from (-1: none) */
    int64_t eval_episodes; /* per arm (0: no evaluation) */
    int64_t before_successes, after_successes;
    double seconds;
    /* on failure: 1 when every rank returns a failure at the same point (each prints its own
     * message, and the job can end with MPI_Finalize); 0 when other ranks may wait in a
     * collective for ever (main calls arl_dist_abort) */
    int failure_shared;
} arl_train_result;

/* Run the experiment.  dist: the process's arl_dist with roles assigned (every rank calls
 * this).  log: progress and the resolved configuration (NULL: quiet; only rank 0 writes).
 * res may be NULL. */
arl_status arl_train_run(const arl_train_config *c, int resume, arl_dist *dist, FILE *log,
                         arl_train_result *res);

#endif
