/* experiments/heldout.h: a held-out split of a built-in environment's tasks by their PROMPT, so
 * that no held-out task is ever trained on, not even as a different seed that renders the same
 * question (level 1 of the calculator has only ~770 distinct questions: seeds alone would put
 * most evaluation questions into the SFT demonstrations or the RL tasks).
 *
 * The prompt of task (seed, options) is the list of messages before the first assistant turn
 * in the environment teacher's episode (envs/builtin/teacher.h), as compact JSON with sorted
 * keys.  Its SHA-256, read as a number u in [0, 1) (the first 8 bytes, big-endian, / 2^64),
 * decides the task's side, with ft the test fraction and fv the validation fraction:
 *     u < ft               test        (the held-out set that reports the result)
 *     ft <= u < ft + fv    validation  (held out too; evaluated while tuning, never trained on)
 *     otherwise            train       (SFT demonstrations and RL tasks)
 * The same question is therefore always on the same side, whatever its seed and whichever stage
 * draws it, and the test side does not depend on fv (adding a validation split takes its
 * questions from the training side only).
 *
 * Not here: which seeds a stage draws (experiments/train.c), the teacher, the environments.
 */
#ifndef ARL_EXPERIMENTS_HELDOUT_H
#define ARL_EXPERIMENTS_HELDOUT_H

#include <stdint.h>

#include "core/status.h"

typedef enum {
    ARL_HELDOUT_SIDE_TRAIN = 0,
    ARL_HELDOUT_SIDE_TEST = 1,
    ARL_HELDOUT_SIDE_VALIDATION = 2,
} arl_heldout_side;

/* The fractions of the split: 0 <= test, 0 <= validation, test + validation < 1. */
typedef struct {
    double test;       /* ft: share of prompts held out for the reported evaluation */
    double validation; /* fv: share held out for tuning (0: no validation side) */
} arl_heldout_split;

/* *side = the side of the task of seed with options (JSON object text, NULL: none) under split.
 * env: a built-in environment with a teacher.  Errors: ARL_ERR_ARG for fractions out of range
 * or bad options; those of arl_env_demo_episode (unknown environment). */
arl_status arl_heldout_task_side(const char *env, uint64_t seed, const char *options_json,
                                 const arl_heldout_split *split, arl_heldout_side *side);

/* seeds[0..n): the first n seeds s >= seed0 (in increasing order) whose task is on side.
 * ARL_ERR_RANGE when max_scan seeds are examined without finding n (a fraction too close to 0
 * or 1 for the request). */
arl_status arl_heldout_side_seeds(const char *env, uint64_t seed0, const char *options_json,
                                  const arl_heldout_split *split, arl_heldout_side side, int64_t n,
                                  int64_t max_scan, int64_t *seeds);

/* The two-sided forms (no validation side): *heldout = 1 if the task is held out (test side)
 * at fraction frac (0 <= frac < 1; 0: never); arl_heldout_seeds lists held-out (want_heldout =
 * 1) or training (0) seeds as arl_heldout_side_seeds does. */
arl_status arl_heldout_task(const char *env, uint64_t seed, const char *options_json, double frac,
                            int *heldout);
arl_status arl_heldout_seeds(const char *env, uint64_t seed0, const char *options_json,
                             double frac, int want_heldout, int64_t n, int64_t max_scan,
                             int64_t *seeds);

#endif
