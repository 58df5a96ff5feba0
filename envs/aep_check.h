/* envs/aep_check.h: the AEP/1 conformance suite (spec §15.1, §15.2, §15.4) against a server at a
 * base URL, driven by the environment author's conformance script or by one derived from /info.
 *
 * Conformance script (JSON, documented in envs/examples/README.md):
 *   {"task": {"id": "...", "seed": 7, "data": {...}},      required: a deterministic task
 *    "options": {...},                                     optional: create options
 *    "actions": [action, ...],                             required: reaches terminated: true at
 *                                                          the last action and not before
 *    "bad_args_action": action,                            optional: a call failing validation
 *    "slow_action": action,                                optional: execution takes > 2 s
 *    "reset_action": action}                               optional: answered with a reset
 * Each action is an action object of §4.5; tool-call and parse-error ids of the form
 * call_<k>_<n> (or call_<step>_<n>) are rewritten to the index of the step that sends them.
 * bad_args_action, slow_action and reset_action are sent as step 1 of a fresh session.
 */
#ifndef ARL_ENVS_AEP_CHECK_H
#define ARL_ENVS_AEP_CHECK_H

#include <stdio.h>

#include "envs/env.h"

#define ARL_CHECK_COUNT 26

typedef enum arl_check_result {
    ARL_CHECK_PASS = 0,
    ARL_CHECK_FAIL = 1, /* a MUST failed */
    ARL_CHECK_SKIP = 2, /* needs a script member or capability that is absent */
    ARL_CHECK_WARN = 3, /* only a SHOULD failed */
} arl_check_result;

typedef struct arl_check_item {
    int id;            /* 1..26, §15.2 */
    const char *name;  /* "step replay" (static) */
    arl_check_result result;
    char message[1024]; /* first failure, or the reason for a skip */
} arl_check_item;

typedef struct arl_check_report {
    char url[512];
    char env_name[65], env_version[65];
    char info_sha256[65];
    int script_given;
    arl_check_item items[ARL_CHECK_COUNT];
    int n_pass, n_fail, n_skip, n_warn;
    double seconds;
} arl_check_report;

typedef struct arl_check_config {
    const char *url;         /* base URL, without /aep/v1 (a trailing /aep/v1 is stripped) */
    const char *script_json; /* script text, or NULL to derive one from /info */
    const char *token;       /* bearer token, or NULL */
    int64_t step_deadline_ms; /* deadline_ms of ordinary steps; 0: limits.default_step_timeout_ms */
    int verbose;             /* log each request to stderr */
} arl_check_config;

/* Run every check.  ARL_OK when the suite ran (whatever the verdicts); ARL_ERR_ARG for an
 * invalid script (message names the member); ARL_ERR_NOMEM when an allocation of this thread
 * failed during the run (a verdict may be this process's, not the server's).  An unreachable
 * server fails every check. */
arl_status arl_aep_check_run(const arl_check_config *cfg, arl_check_report *rep);
/* Human-readable report: one line per check and a summary. */
void arl_aep_check_print(FILE *f, const arl_check_report *rep);
/* The report as JSON (§15.4, stored by the client as envs.conformance_json); caller frees; NULL
 * out of memory (never a report with a part left out). */
char *arl_aep_check_json(const arl_check_report *rep);
/* 0 when no MUST check failed, else 1 (§15.4). */
int arl_aep_check_exit_code(const arl_check_report *rep);

/* §15.1 argument synthesis from a tool's parameters schema (new reference). */
json_t *arl_aep_check_synth(const json_t *schema);

#endif
