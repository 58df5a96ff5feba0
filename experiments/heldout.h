/* experiments/heldout.h: a held-out split of a built-in environment's tasks by their PROMPT, so
 * that no held-out task is ever trained on, not even as a different seed that renders the same
 * question (level 1 of the calculator has only ~770 distinct questions: seeds alone would put
 * most evaluation questions into the SFT demonstrations or the RL tasks).
 *
 * The prompt of task (seed, options) is the list of messages before the first assistant turn
 * in the environment teacher's episode (envs/builtin/teacher.h), as compact JSON with sorted
 * keys.  Its SHA-256, read as a number u in [0, 1) (the first 8 bytes, big-endian, / 2^64),
 * decides: the task is held out when u < frac.  The same question is therefore always on the
 * same side, whatever its seed and whichever stage draws it.
 *
 * Not here: which seeds a stage draws (experiments/train.c), the teacher, the environments.
 */
#ifndef ARL_EXPERIMENTS_HELDOUT_H
#define ARL_EXPERIMENTS_HELDOUT_H

#include <stdint.h>

#include "core/status.h"

/* *heldout = 1 if the task of seed with options (JSON object text, NULL: none) is held out at
 * fraction frac (0 <= frac < 1; 0: never).  env: a built-in environment with a teacher.
 * Errors: those of arl_env_demo_episode (unknown environment, bad options). */
arl_status arl_heldout_task(const char *env, uint64_t seed, const char *options_json, double frac,
                            int *heldout);

/* seeds[0..n): the first n seeds s >= seed0 (in increasing order) whose task is held out
 * (want_heldout = 1) or not (0).  ARL_ERR_RANGE when max_scan seeds are examined without
 * finding n (a fraction too close to 0 or 1 for the request). */
arl_status arl_heldout_seeds(const char *env, uint64_t seed0, const char *options_json,
                             double frac, int want_heldout, int64_t n, int64_t max_scan,
                             int64_t *seeds);

#endif
