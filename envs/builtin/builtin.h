/* envs/builtin/builtin.h: what agentrl's built-in environments (calculator, needle, kvstore,
 * shapes) share, and their teachers.
 *
 * Each environment is an arl_env_def of envs/env.h (part A: typed callbacks; the host of
 * envs/env_host.c turns it into a complete AEP/1 server).  This header adds:
 *  - the turn dispatcher that answers every call and parse error of an action with the
 *    model-attributed tool messages of spec/aep.md 4.6-4.7 (unknown tool, invalid arguments,
 *    call limit, parse error), validating arguments against the tool schemas of the
 *    environment's own info_json (one source of truth for the prompt and the checks);
 *  - small helpers (numbers, option readers, anchors);
 *  - arl_builtin: an environment plus its TEACHER, a policy that knows the task and acts as a
 *    competent agent would; teacher.c drives it to write demonstration conversations.
 * Everything here is deterministic for (task.seed, task.data, options, actions): no clock, no
 * global RNG.
 *
 * Ownership: json_t * arguments are borrowed; functions returning json_t * return a NEW
 * reference.
 */
#ifndef ARL_ENVS_BUILTIN_BUILTIN_H
#define ARL_ENVS_BUILTIN_BUILTIN_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "envs/env.h"

/* ---- instances: every built-in instance starts with this (the parsed tool set) ---- */

typedef struct arl_bi_instance {
    json_t *tools; /* array of OpenAI function tools parsed from the def's info_json, owned */
} arl_bi_instance;

/* Parse info_json's "tools" into a new instance (ops.instance_create of every built-in).
 * ARL_ERR_CONFIG when config is not an object or has members (built-ins take none). */
arl_status arl_bi_instance_open(const char *info_json, const json_t *config, void **inst);
void arl_bi_instance_close(void *inst);

/* ---- the turn dispatcher ---- */

typedef enum arl_bi_call_kind {
    ARL_BI_CALL_OK = 0,        /* the call did what it asked */
    ARL_BI_CALL_RUNTIME = 1,   /* it ran and failed because of what it asked (RUNTIME_ERROR) */
    ARL_BI_CALL_TRANSIENT = 2, /* a transient failure the agent should retry (TOOL_TIMEOUT) */
    ARL_BI_CALL_MALFORMED = 3, /* not run: parse error, unknown tool, bad args, call limit */
} arl_bi_call_kind;

typedef struct arl_bi_turn_stats {
    int n_calls;      /* entries of tool_calls */
    int n_ok;         /* calls with ARL_BI_CALL_OK */
    int n_malformed;  /* parse errors, unknown tools, invalid arguments, call-limit answers */
    int n_runtime;    /* ARL_BI_CALL_RUNTIME */
    int n_transient;  /* ARL_BI_CALL_TRANSIENT */
    int no_tool_call; /* plain text turn: no calls and no parse errors */
    int cut_off;      /* finish_reason "length" */
} arl_bi_turn_stats;

typedef struct arl_bi_dispatch {
    int max_calls_per_turn; /* further calls are answered TOOL_CALL_LIMIT */
    /* Run one call whose tool exists and whose arguments are valid.  Must append exactly one
     * tool message answering call->id (arl_env_obs_add_tool, optionally images after it), set
     * *kind, and set *stop to 1 when the call ends the episode (later calls of the turn are
     * answered TOOL_CALL_LIMIT).  Returns ARL_OK or an environment fault (NOMEM). */
    arl_status (*run_call)(void *state, const arl_env_tool_call *call, arl_env_observation *obs,
                           arl_bi_call_kind *kind, int *stop);
    /* User message after a turn without any tool call. */
    const char *nudge_no_call;
    /* Name of the tool whose "value" argument may also be a JSON number (answer); NULL. */
    const char *lenient_tool;
} arl_bi_dispatch;

/* Answer the action's calls (in order) and parse errors (after them), then a nudge user
 * message after a plain-text turn (spec/aep.md 4.3 order).  obs->context is set to APPEND.
 * *ended: 1 when a call set stop. */
arl_status arl_bi_dispatch_turn(const arl_bi_dispatch *d, const arl_bi_instance *inst, void *state,
                                const arl_env_action *a, arl_env_observation *obs,
                                arl_bi_turn_stats *st, int *ended);

/* ---- helpers ---- */

/* Format a number the way tools print it: integers without a fraction ("12", "-3"), others
 * with up to 12 significant digits ("2.5", "0.333333333333"). */
void arl_bi_format_number(double x, char *buf, size_t size);
/* Parse a model's numeric answer ("12", " 12.50 ", "1,234", "$3", "-4."); 1 on success. */
int arl_bi_parse_number(const char *s, double *out);
/* |a - e| <= 1e-6 * max(1, |e|): generated answers are exact with at most 4 decimals, so this
 * only absorbs the rounding of printed doubles. */
int arl_bi_numbers_equal(double a, double expected);
/* The "value" argument of a call as text (string as is, number formatted); NULL if neither. */
const char *arl_bi_arg_text(const json_t *args, const char *key, char *buf, size_t size);
/* 64-bit FNV-1a of bytes continuing from h (0: start). */
uint64_t arl_bi_hash(const void *p, size_t n, uint64_t h);
/* Options and task.data readers: absent/null -> def; present with a wrong type or out of
 * range -> ARL_ERR_ARG naming `where.key` (the host answers 422). */
arl_status arl_bi_get_int(const json_t *obj, const char *key, const char *where, int64_t def,
                          int64_t lo, int64_t hi, int64_t *out);
arl_status arl_bi_get_double(const json_t *obj, const char *key, const char *where, double def,
                             double lo, double hi, double *out);
/* *out is borrowed from obj (or def). choices: NULL-terminated list or NULL for any. */
arl_status arl_bi_get_string(const json_t *obj, const char *key, const char *where, const char *def,
                             const char *const *choices, const char **out);
/* ARL_ERR_ARG naming the first member of obj that is not in keys (NULL-terminated); obj NULL
 * is fine, a non-object is an error. */
arl_status arl_bi_check_keys(const json_t *obj, const char *where, const char *const *keys);
/* Set out->info = {"anchor": "<env>:<16 hex digits of h>"} (spec/aep.md 4.10). */
arl_status arl_bi_set_anchor(json_t **info, const char *env, uint64_t h);
/* Teacher helpers: append a call "call_<step>_<n>" with args (stolen). */
arl_status arl_bi_teacher_call(arl_env_action *a, int64_t step, const char *name, json_t *args);
/* Set the action's content (copied) and its finish_reason/parse_status from its calls. */
arl_status arl_bi_teacher_finish(arl_env_action *a, const char *content);

/* ---- built-ins with their teachers ---- */

typedef struct arl_builtin {
    const arl_env_def *def;
    /* The action a competent agent takes at step next_step (= steps applied + 1) in this
     * state: filled into *out (zeroed by the caller).  ARL_ERR_STATE after the episode ended. */
    arl_status (*teacher)(void *inst, const void *state, int64_t next_step, arl_env_action *out);
} arl_builtin;

extern const arl_env_def arl_env_calculator;
extern const arl_env_def arl_env_needle;
extern const arl_env_def arl_env_kvstore;
extern const arl_env_def arl_env_shapes;

arl_status arl_env_calculator_teacher(void *inst, const void *state, int64_t next_step,
                                      arl_env_action *out);
arl_status arl_env_needle_teacher(void *inst, const void *state, int64_t next_step,
                                  arl_env_action *out);
arl_status arl_env_kvstore_teacher(void *inst, const void *state, int64_t next_step,
                                   arl_env_action *out);
arl_status arl_env_shapes_teacher(void *inst, const void *state, int64_t next_step,
                                  arl_env_action *out);

/* The built-in named `name` with its teacher, or NULL (teacher.c). */
const arl_builtin *arl_builtin_find(const char *name);
/* The i-th built-in with a teacher; NULL past the end. */
const arl_builtin *arl_builtin_at(size_t i);

#endif
