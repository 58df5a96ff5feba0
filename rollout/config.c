/* rollout/config.c: the rollout keys of an experiment - one arl_option table (parser, --help,
 * resolved config and JSON all come from it), the "rollout" section of an experiment file, the
 * JSON-object keys, and the budget checks of spec/objective.md 3.2.  Not the worker. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "rollout/rollout.h"

#define F(x) offsetof(arl_rollout_config, x)
#define BIG 9007199254740991.0 /* 2^53 - 1 */

const arl_option arl_rollout_options[] = {
    {"env", ARL_OPT_STRING, F(env), NULL,
     "environment: builtin:NAME (or NAME) for a built-in, or an AEP/1 base URL", 0, 0, NULL,
     ARL_OPT_REQUIRED, "ENV"},
    {"env-config", ARL_OPT_STRING, F(env_config), NULL,
     "built-in environment instance configuration (JSON object)", 0, 0, NULL, 0, "JSON"},
    {"env-options", ARL_OPT_STRING, F(env_options), NULL,
     "AEP create `options` of every session, e.g. {\"max_steps\": 8} (JSON object)", 0, 0, NULL, 0,
     "JSON"},
    {"step-deadline-ms", ARL_OPT_INT, F(step_deadline_ms), "0",
     "deadline_ms of step requests (0: the environment's default_step_timeout_ms)", 0, 3.6e6, NULL,
     0, "MS"},
    {"env-backoff-ms", ARL_OPT_INT, F(env_backoff_ms), "250",
     "base delay of the client's retry back-off (spec/aep.md 10.3)", 1, 60000, NULL, 0, "MS"},
    {"task-file", ARL_OPT_STRING, F(task_file), NULL,
     "tasks as JSON lines {\"id\", \"seed\", \"data\"} (default: generated tasks task<i>)", 0, 0,
     NULL, 0, "FILE"},
    {"task-data", ARL_OPT_STRING, F(task_data), "{}",
     "task.data of generated tasks (JSON object), e.g. {\"level\": 2}", 0, 0, NULL, 0, "JSON"},
    {"tasks", ARL_OPT_INT, F(tasks), "1",
     "number of tasks; each is one group of G trajectories (0 with task-file: every line)", 0, BIG,
     NULL, 0, "N"},
    {"task-seed", ARL_OPT_INT, F(task_seed), "0",
     "seed of generated task i is task-seed + task-offset + i", 0, BIG, NULL, 0, "S"},
    {"task-offset", ARL_OPT_INT, F(task_offset), "0",
     "global index of this worker's first task: its task i is global task task-offset + i "
     "(group <run-uid>/g<task-offset + i>, generated id task<task-offset + i>); sampling "
     "streams follow from the group names, so workers over disjoint slices of one task list "
     "draw distinct streams and a task draws the same stream whichever worker runs it",
     0, BIG, NULL, 0, "N"},
    {"group-size", ARL_OPT_INT, F(group_size), "8",
     "G: trajectories per task (same task, seed and initial state)", 1, 4096, NULL, 0, "G"},
    {"group-kind", ARL_OPT_CHOICE, F(group_kind), "train", "catalog kind of the groups", 0, 0,
     "train|eval", 0, NULL},
    {"run-uid", ARL_OPT_STRING, F(run_uid), "rollout",
     "run identifier; group ids are <run-uid>/g<task-offset + task>, trajectory ids "
     "<group>/r<slot>",
     0, 0, NULL, 0, "UID"},
    {"temperature", ARL_OPT_FLOAT, F(temperature), "1.0", "sampling temperature (0: greedy)", 0,
     100, NULL, 0, "T"},
    {"top-p", ARL_OPT_FLOAT, F(top_p), "1.0", "nucleus sampling mass (1: no truncation)", 1e-9, 1,
     NULL, 0, "P"},
    {"seed", ARL_OPT_INT, F(seed), "0", "sampling seed (each trajectory draws from its own stream)",
     0, BIG, NULL, 0, "S"},
    {"segment-tokens", ARL_OPT_INT, F(segment_tokens), "131072", "L_seg: segment token budget", 2,
     BIG, NULL, 0, "N"},
    {"turn-tokens", ARL_OPT_INT, F(turn_tokens), "32768",
     "L_turn: most tokens sampled in one turn (finish_reason length)", 1, BIG, NULL, 0, "N"},
    {"observation-tokens", ARL_OPT_INT, F(observation_tokens), "32768",
     "L_obs: most tokens of one appended observation (OBSERVATION_TOO_LONG)", 1, BIG, NULL, 0, "N"},
    {"context-tokens", ARL_OPT_INT, F(context_tokens), "1048576",
     "L_ctx: model context limit since the last fresh start (context_budget)", 2, BIG, NULL, 0,
     "N"},
    {"trajectory-tokens", ARL_OPT_INT, F(trajectory_tokens), "1048576",
     "L_traj: trajectory token budget (context_budget)", 2, BIG, NULL, 0, "N"},
    {"max-turns", ARL_OPT_INT, F(max_turns), "1000", "K_max: turn budget (turn_budget)", 1, BIG,
     NULL, 0, "N"},
    {"wall-clock-s", ARL_OPT_FLOAT, F(wall_clock_s), "0",
     "episode wall-clock limit in seconds, checked between turns (0: off)", 0, 1e9, NULL, 0, "S"},
    {"wall-clock-truncates", ARL_OPT_BOOL, F(wall_clock_truncates), "false",
     "an expired wall clock ends the trajectory as truncated (default: masked)", 0, 0, NULL, 0,
     NULL},
    {"extension-check", ARL_OPT_BOOL, F(extension_check), "true",
     "check the template's extension property after every turn (template_break boundaries)", 0, 0,
     NULL, 0, NULL},
    {"segment-scores", ARL_OPT_BOOL, F(segment_scores), "true",
     "score every segment when the environment declares segment_score", 0, 0, NULL, 0, NULL},
    {"unscorable-outcome", ARL_OPT_CHOICE, F(unscorable_outcome), "range_lo",
     "an unscorable outcome counts as the range's low end, or masks (UNSCORABLE)", 0, 0,
     "range_lo|mask", 0, NULL},
    {"batch-size", ARL_OPT_INT, F(batch_size), "16",
     "trajectories decoded together (continuous batching)", 1, 4096, NULL, 0, "N"},
    {"prefill-chunk", ARL_OPT_INT, F(prefill_chunk), "2048",
     "most tokens in one forward (chunked prefill of observations)", 1, 1 << 20, NULL, 0, "N"},
    {"mla-sparse-topk", ARL_OPT_INT, F(mla_sparse_topk), "0",
     "block-sparse MLA: context chunks each query reads (0: dense)", 0, 1 << 20, NULL, 0, "K"},
    {"mla-sparse-chunk", ARL_OPT_INT, F(mla_sparse_chunk), "4096",
     "block-sparse MLA: chunk length in tokens", 1, 1 << 24, NULL, 0, "N"},
    {"threads", ARL_OPT_INT, F(threads), "0", "CPU threads (0: the kernels' default)", 0, 1024,
     NULL, 0, "N"},
    {"reserve-context", ARL_OPT_BOOL, F(reserve_context), "false",
     "allocate each slot's MLA latent cache for context-tokens rows up front (address space; "
     "pages are touched as the context grows), so that it never grows by copying",
     0, 0, NULL, 0, NULL},
    {"device", ARL_OPT_CHOICE, F(device), "cpu",
     "where the policy runs: cpu (policy/model.h, the reference), cuda (policy/model_device.h "
     "on GPU 0: slots' states on the device, copied to the host at segment boundaries; dense "
     "or block-sparse MLA; image rows are encoded on the CPU), or cpu-device (the device code "
     "over host memory, bit-identical to cpu: for tests)",
     0, 0, "cpu|cuda|cpu-device", 0, NULL},
    {"device-bf16", ARL_OPT_BOOL, F(device_bf16), "false",
     "device cuda: run the weight GEMMs on bf16 copies of the weights (fp32 accumulation; "
     "stored states are tagged cuda-bf16w instead of cuda-f32)",
     0, 0, NULL, 0, NULL},
    {"device-index", ARL_OPT_INT, F(device_index), "-1",
     "device cuda: the GPU this worker uses (-1: its local MPI rank modulo the GPU count, so "
     "the rollout ranks of a node spread over its GPUs)",
     -1, 4096, NULL, 0, "N"},
    {"device-graphs", ARL_OPT_BOOL, F(device_graphs), "false",
     "device cuda: replay each decode step as a CUDA graph, captured once per set of decoding "
     "slots (again when a trajectory joins or leaves the set); the same kernels, the same bits",
     0, 0, NULL, 0, NULL},
    {"state-cache", ARL_OPT_CHOICE, F(state_cache), "last",
     "rollout states written at token_budget boundaries: only the newest boundary of each "
     "running trajectory and none of finished ones (last, spec/replay.md 9.3), all kept (all: "
     "re-scoring and forking finished trajectories start from them instead of recomputing "
     "their prefixes), or none written (off)",
     0, 0, "last|all|off", 0, NULL},
    {"state-budget-bytes", ARL_OPT_INT, F(state_budget_bytes), "274877906944",
     "state_cache.budget_bytes of this worker's states file (spec/replay.md 9.3; default 256 "
     "GiB): beyond it, its GC evicts complete, unpinned states, least recently used first and "
     "those of running trajectories last (0: no budget)",
     0, BIG, NULL, 0, "BYTES"},
    {"state-gc-interval-s", ARL_OPT_INT, F(state_gc_interval_s), "600",
     "seconds between the GC passes over this worker's states file (spec/replay.md 7.6: at "
     "open, then at the first commit after each interval): stale 'writing' and unreferenced "
     "states over an hour old deleted, state-cache and state-budget-bytes applied",
     1, BIG, NULL, 0, "S"},
    {"resume-interrupted", ARL_OPT_BOOL, F(resume_interrupted), "true",
     "resume trajectories a dead worker left running (else mask them INTERRUPTED)", 0, 0, NULL, 0,
     NULL},
    {"refill-infra-masked", ARL_OPT_BOOL, F(refill_infra_masked), "true",
     "give a slot masked with attribution infra one new attempt", 0, 0, NULL, 0, NULL},
    {"alert-masked-frac", ARL_OPT_FLOAT, F(alert_masked_frac), "0.2",
     "client-fault alert (spec/aep.md 8.6): no new group is admitted, and the run ends in an "
     "error, once more than this fraction of the last 200 finished trajectories (at least 20) "
     "were masked; 1: never",
     0, 1, NULL, 0, "F"},
    {"alert-client-codes", ARL_OPT_INT, F(alert_client_codes), "10",
     "... or once one client-attributed code masked more than this many of them", 0, 200, NULL, 0,
     "N"},
    {"policy-dir", ARL_OPT_STRING, F(policy_dir), NULL,
     "directory where new policy versions are published (file LATEST: \"VERSION CKPT_DIR\")", 0, 0,
     NULL, 0, "DIR"},
    {"policy-poll-ms", ARL_OPT_INT, F(policy_poll_ms), "1000",
     "how often policy-dir/LATEST is read", 1, 3.6e6, NULL, 0, "MS"},
    {"policy-version", ARL_OPT_INT, F(policy_version), "0",
     "policy version of the initial checkpoint", 0, 4294967295.0, NULL, 0, "N"},
    {"progress-s", ARL_OPT_FLOAT, F(progress_s), "10", "seconds between progress lines (0: none)",
     0, 1e6, NULL, 0, "S"},
};
const size_t arl_rollout_n_options = sizeof arl_rollout_options / sizeof arl_rollout_options[0];

arl_status arl_rollout_config_defaults(arl_rollout_config *c) {
    memset(c, 0, sizeof *c);
    return arl_options_defaults(arl_rollout_options, arl_rollout_n_options, c);
}

void arl_rollout_config_free(arl_rollout_config *c) {
    if (!c) return;
    arl_options_free(arl_rollout_options, arl_rollout_n_options, c);
}

/* The keys whose value is a JSON object held as text. */
static int is_object_key(const char *k) {
    static const char *const keys[] = {"env-config", "env_config", "env-options",
                                       "env_options", "task-data", "task_data"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!strcmp(k, keys[i])) return 1;
    return 0;
}

arl_status arl_rollout_config_load_json(arl_rollout_config *c, const char *text, const char *where) {
    json_error_t jerr;
    json_t *root = arl_json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && arl_json_error_nomem(&jerr)) /* this process's, not the configuration's */
        return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", where);
    if (!root)
        return arl_errorf(ARL_ERR_CONFIG, "%s:%d:%d: invalid JSON: %s", where, jerr.line,
                          jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return arl_errorf(ARL_ERR_CONFIG, "%s: expected a JSON object at the top level", where);
    }
    json_t *sec = json_object_get(root, "rollout");
    if (sec && !json_is_object(sec)) {
        json_decref(root);
        return arl_errorf(ARL_ERR_CONFIG, "%s: key 'rollout': expected an object", where);
    }
    json_t *obj = json_deep_copy(sec ? sec : root);
    json_decref(root);
    if (!obj) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", where);
    /* object-valued keys become their compact JSON text */
    const char *key;
    json_t *v;
    void *tmp;
    arl_status s = ARL_OK;
    json_object_foreach_safe(obj, tmp, key, v) {
        if (!is_object_key(key) || json_is_string(v)) continue;
        if (!json_is_object(v)) {
            s = arl_errorf(ARL_ERR_CONFIG, "%s: key '%s': expected a JSON object", where, key);
            break;
        }
        char *t = arl_json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
        if (!t || json_object_set_new(obj, key, json_string(t))) {
            free(t);
            s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", where);
            break;
        }
        free(t);
    }
    char *flat = s == ARL_OK ? arl_json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
    if (s != ARL_OK) return s;
    if (!flat) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", where);
    s = arl_options_parse_json_text(arl_rollout_options, arl_rollout_n_options, flat,
                                    sec ? "rollout section" : where, c);
    free(flat);
    if (s != ARL_OK && sec) return arl_error_prefix(s, "%s", where);
    return s;
}

static arl_status check_object(const char *text, const char *key) {
    if (!text) return ARL_OK;
    json_error_t e;
    json_t *j = arl_json_loads(text, JSON_REJECT_DUPLICATES, &e);
    int ok = j && json_is_object(j);
    json_decref(j);
    if (!j && arl_json_error_nomem(&e))
        return arl_errorf(ARL_ERR_NOMEM, "key '%s': out of memory", key);
    if (!ok)
        return arl_errorf(ARL_ERR_CONFIG, "key '%s': expected a JSON object, got '%.80s'%s", key,
                          text, j ? "" : " (invalid JSON)");
    return ARL_OK;
}

arl_status arl_rollout_config_validate(const arl_rollout_config *c) {
    ARL_TRY(check_object(c->env_config, "env-config"));
    ARL_TRY(check_object(c->env_options, "env-options"));
    ARL_TRY(check_object(c->task_data, "task-data"));
    if (!c->env || !*c->env) return arl_errorf(ARL_ERR_CONFIG, "key 'env' is required");
    if (!c->task_file && c->tasks < 1)
        return arl_errorf(ARL_ERR_CONFIG,
                          "key 'tasks' must be >= 1 (0 means every line of a task-file, and "
                          "none is given)");
    if (c->observation_tokens + c->turn_tokens > c->segment_tokens)
        return arl_errorf(ARL_ERR_CONFIG,
                          "observation-tokens (%lld) + turn-tokens (%lld) must be <= "
                          "segment-tokens (%lld) (spec/objective.md 3.2)",
                          (long long)c->observation_tokens, (long long)c->turn_tokens,
                          (long long)c->segment_tokens);
    if (c->segment_tokens > c->context_tokens)
        return arl_errorf(ARL_ERR_CONFIG,
                          "segment-tokens (%lld) must be <= context-tokens (%lld) "
                          "(spec/objective.md 3.2)",
                          (long long)c->segment_tokens, (long long)c->context_tokens);
    if (c->context_tokens > c->trajectory_tokens)
        return arl_errorf(ARL_ERR_CONFIG,
                          "context-tokens (%lld) must be <= trajectory-tokens (%lld) "
                          "(spec/objective.md 3.2)",
                          (long long)c->context_tokens, (long long)c->trajectory_tokens);
    if (c->prefill_chunk < c->batch_size)
        return arl_errorf(ARL_ERR_CONFIG,
                          "prefill-chunk (%lld) must be >= batch-size (%lld): a decode step "
                          "feeds one token per trajectory",
                          (long long)c->prefill_chunk, (long long)c->batch_size);
    if (!c->run_uid || !*c->run_uid || strlen(c->run_uid) > 64)
        return arl_errorf(ARL_ERR_CONFIG, "key 'run-uid' must be 1..64 bytes");
    return ARL_OK;
}
