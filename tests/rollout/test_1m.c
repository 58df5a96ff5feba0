/* tests/rollout/test_1m.c (label slow): a million-token trajectory on the CPU with the tiny
 * model, in bounded memory.
 *
 * The environment is needle's document read in 64 KiB observations: "needle_scan" (registered
 * here) wraps the needle built-in and, whatever the random tiny policy writes, answers each turn
 * with the next read(offset, 65536) of needle's document as a user message (the policy's own
 * calls are answered TOOL_NOT_FOUND, its parse errors as usual), until the stream holds the
 * requested number of tokens.  Turns are short (16 tokens); observations arrive by chunked
 * prefill; segments of 131072 tokens are committed with their boundary states as the trajectory
 * grows; long-context MLA uses block-sparse selection (spec/policy.md 4.5: 4 chunks of 1024 plus
 * the query's own chunk; policy/mla.h reads only those, so a token costs O(T/1024 + 5 * 1024)
 * in each MLA layer).
 *
 * Peak RSS (VmHWM) is reported when the stream passes 64K, 256K and 1M tokens.  The tiny config
 * may grow only by its MLA latent cache (2 MLA layers x 48 floats = 384 B per token of context,
 * allowed x1.25 + 64 MiB); a KDA-only config (every layer KDA) must stay flat (growth <= 48 MiB:
 * the conversation text and allocator noise).  The store verifies at the end.
 *
 * Usage: test_rollout_1m [--kda-tokens N] [--tiny-tokens N] [--tokens N (both)]
 *                       [--mla-chunk N] [--mla-topk K]
 *        (defaults: 1048576 tokens for both configs, chunks of 1024, top 4; 0 skips a config) */
#include <sys/stat.h>
#include <time.h>

#include "envs/builtin/builtin.h"
#include "tests/rollout/helpers.h"

/* ---- needle_scan ---- */

typedef struct scan_state {
    void *needle;
    int64_t offset, size, total_bytes, max_read, sent;
} scan_state;

static const arl_env_def *needle_def(void) { return arl_env_builtin_find("needle"); }

static arl_status scan_instance(const json_t *config, void **inst) {
    return needle_def()->ops->instance_create(config, inst);
}
static void scan_instance_free(void *inst) { needle_def()->ops->instance_destroy(inst); }

/* One synthetic needle step: call `name` with args; returns its first message's text. */
static arl_status needle_call(void *inst, scan_state *s, int64_t k, const char *name, json_t *args,
                              char **text) {
    arl_env_action a;
    memset(&a, 0, sizeof a);
    ARL_TRY(arl_env_action_add_call(&a, "call_x_0", name, args));
    arl_env_action_set_parse_status(&a);
    a.finish_reason = ARL_ENV_FINISH_TOOL_CALLS;
    arl_env_step_req r = {.step_index = k, .action = &a, .max_steps = 1 << 30, .deadline_ms = 60000};
    arl_env_result out;
    memset(&out, 0, sizeof out);
    arl_status st = needle_def()->ops->step(inst, s->needle, &r, &out);
    *text = NULL;
    if (st == ARL_OK && out.obs.n_messages > 0 && out.obs.messages[0].content)
        *text = strdup(out.obs.messages[0].content);
    arl_env_result_clear(&out);
    arl_env_action_clear(&a);
    return st;
}

static arl_status scan_reset(void *inst, const arl_env_reset_req *req, void **state,
                             arl_env_result *out) {
    scan_state *s = calloc(1, sizeof *s);
    if (!s) return arl_errorf(ARL_ERR_NOMEM, "scan: out of memory");
    s->total_bytes = json_integer_value(json_object_get(req->task.data, "total_bytes"));
    s->max_read = json_integer_value(json_object_get(req->task.data, "read_bytes"));
    json_t *opts = json_pack("{s:I,s:I}", "doc_tokens",
                             (json_int_t)(s->total_bytes / 4 + 4096), "max_read",
                             (json_int_t)s->max_read);
    arl_env_reset_req nr = *req;
    nr.task.data = opts;
    nr.options = NULL;
    arl_env_result tmp;
    memset(&tmp, 0, sizeof tmp);
    arl_status st = needle_def()->ops->reset(inst, &nr, &s->needle, &tmp);
    arl_env_result_clear(&tmp);
    json_decref(opts);
    char *t = NULL;
    if (st == ARL_OK) st = needle_call(inst, s, 1, "open", json_object(), &t);
    free(t);
    if (st) {
        free(s);
        return st;
    }
    *state = s;
    out->obs.context = ARL_ENV_CONTEXT_RESET;
    return arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER,
                                "Read the document that follows, one block per turn.");
}

static arl_status scan_step(void *inst, void *state, const arl_env_step_req *req,
                            arl_env_result *out) {
    scan_state *s = state;
    out->obs.context = ARL_ENV_CONTEXT_APPEND;
    const arl_env_action *a = req->action;
    for (int32_t i = 0; i < a->n_tool_calls; i++)
        ARL_TRY(arl_env_obs_add_tool(&out->obs, a->tool_calls[i].id, "no tools here",
                                     ARL_ENV_TOOL_NOT_FOUND));
    ARL_TRY(arl_env_obs_answer_parse_errors(&out->obs, a));
    char *text = NULL;
    ARL_TRY(needle_call(inst, s, req->step_index + 1, "read",
                        json_pack("{s:I,s:I}", "offset", (json_int_t)s->offset, "length",
                                  (json_int_t)s->max_read),
                        &text));
    if (!text || !*text) text = strdup("(end of document)");
    s->offset += s->max_read;
    s->sent += (int64_t)strlen(text);
    arl_status st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, text);
    free(text);
    out->terminated = s->sent >= s->total_bytes;
    return st;
}

static arl_status scan_score(void *inst, void *state, const arl_env_score_req *req,
                             arl_env_score_result *out) {
    (void)inst;
    (void)state;
    (void)req;
    out->scorable = 1;
    out->reward = 0;
    return ARL_OK;
}

static void scan_free(void *inst, void *state) {
    scan_state *s = state;
    if (!s) return;
    needle_def()->ops->free_state(inst, s->needle);
    free(s);
}

static const arl_env_ops scan_ops = {.thread_safety = 0, .instance_create = scan_instance,
                                     .instance_destroy = scan_instance_free, .reset = scan_reset,
                                     .step = scan_step, .score = scan_score, .free_state = scan_free};
static const arl_env_def scan_def = {
    .name = "needle_scan", .version = "1.0.0",
    .description = "needle's document in 64 KiB observations, whatever the policy does",
    .info_json = "{\"tools\": [], \"reward_levels\": {\"outcome\": {\"range\": [0, 1]}}, "
                 "\"reward_components\": [], \"capabilities\": {\"deterministic_replay\": true}, "
                 "\"limits\": {\"max_sessions\": 8, \"max_steps\": 100000, "
                 "\"max_observation_bytes\": 1048576}}",
    .ops = &scan_ops};

/* ---- memory probes ---- */

static double ro_mono_s_test(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t vm_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int64_t v = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n)) v = atoll(line + n + 1);
    if (f) fclose(f);
    return v;
}

typedef struct probe {
    replay_store *st;
    int64_t marks[3];
    int64_t hwm_kb[3];
    int64_t tokens_at[3];
} probe;

static int on_commit(void *user, const char *uid, int32_t seg, int final) {
    (void)seg;
    (void)final;
    probe *p = user;
    replay_traj_row r;
    if (replay_traj_get(p->st, uid, &r)) return 0;
    for (int i = 0; i < 3; i++)
        if (p->hwm_kb[i] < 0 && r.n_tokens >= p->marks[i]) {
            p->hwm_kb[i] = vm_kb("VmHWM:");
            p->tokens_at[i] = r.n_tokens;
            fprintf(stderr, "  %lld tokens committed: peak RSS %.1f MiB (RSS %.1f MiB)\n",
                    (long long)r.n_tokens, (double)p->hwm_kb[i] / 1024.0,
                    (double)vm_kb("VmRSS:") / 1024.0);
        }
    return 0;
}

static char tmp[512];
static int64_t mla_chunk = 1024, mla_topk = 4;

static void run_config(const char *name, const char *config_path, int64_t target,
                       int64_t read_bytes, const int64_t marks[3], double per_token,
                       double flat_mb) {
    char ckpt[700], db[700];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt-%s", tmp, name);
    snprintf(db, sizeof db, "%s/db-%s", tmp, name);
    h_make_ckpt(ckpt, config_path, 5);
    arl_rollout_config c;
    h_config(&c, "builtin:needle_scan");
    char data[96];
    /* the environment ends the episode on the read that passes total_bytes; that last
     * observation is not appended (spec/objective.md 3.2 rule 1): ask for two reads more */
    snprintf(data, sizeof data, "{\"total_bytes\": %lld, \"read_bytes\": %lld}",
             (long long)(target + 2 * read_bytes), (long long)read_bytes);
    h_set(&c, "task-data", data);
    c.tasks = 1;
    c.group_size = 1;
    c.batch_size = 1;
    c.turn_tokens = 16;
    /* a segment holds one observation: a boundary (and a memory probe) after every read */
    c.observation_tokens = read_bytes + read_bytes / 2;
    c.segment_tokens = 2 * read_bytes;
    c.context_tokens = c.trajectory_tokens = target + 524288;
    c.max_turns = 100000;
    c.prefill_chunk = 2048;
    c.mla_sparse_topk = mla_topk;
    c.mla_sparse_chunk = mla_chunk;
    c.progress_s = 30;
    c.reserve_context = 1; /* no realloc copies of the latent cache: peak RSS follows the rows */
    probe p = {.st = h_store(db), .marks = {marks[0], marks[1], marks[2]}, .hwm_kb = {-1, -1, -1}};
    arl_rollout_hooks hk = {.user = &p, .on_commit = on_commit};
    arl_rollout_worker *w;
    double t0 = ro_mono_s_test();
    H_DIE(arl_rollout_worker_open(&c, ckpt, p.st, 0, &hk, &w), "open");
    H_DIE(arl_rollout_worker_run(w), "run");
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    arl_rollout_stats_print(s, stderr);
    CHECK_EQ_INT(s->masked, 0);
    CHECK(s->tokens >= target);
    arl_rollout_worker_close(w);
    printf("%s: %lld tokens in %.0f s; peak RSS %.1f / %.1f / %.1f MiB at %lld / %lld / %lld tokens\n",
           name, (long long)s->tokens, ro_mono_s_test() - t0, p.hwm_kb[0] / 1024.0,
           p.hwm_kb[1] / 1024.0, p.hwm_kb[2] / 1024.0, (long long)p.tokens_at[0],
           (long long)p.tokens_at[1], (long long)p.tokens_at[2]);
    CHECK(p.hwm_kb[0] > 0 && p.hwm_kb[2] > 0);
    double growth_mb = (double)(p.hwm_kb[2] - p.hwm_kb[0]) / 1024.0;
    double allowed_mb = per_token * (double)(p.tokens_at[2] - p.tokens_at[0]) * 1.25 / 1048576.0 + flat_mb;
    CHECK_MSG(growth_mb <= allowed_mb, "%s: peak RSS grew %.1f MiB from %lld to %lld tokens, allowed %.1f",
              name, growth_mb, (long long)p.tokens_at[0], (long long)p.tokens_at[2], allowed_mb);
    CHECK_EQ_INT(h_verify(p.st), 0);
    replay_store_close(p.st);
    arl_rollout_config_free(&c);
}

/* configs/tiny with every layer KDA */
static void write_kda_config(const char *path) {
    json_t *j = json_load_file(test_src_path("configs/tiny/config.json"), 0, NULL);
    json_t *la = json_object_get(json_object_get(j, "text_config"), "linear_attn_config");
    json_object_set_new(la, "full_attn_layers", json_array());
    json_object_set_new(la, "kda_layers", json_pack("[i,i,i,i,i,i,i,i]", 1, 2, 3, 4, 5, 6, 7, 8));
    json_dump_file(j, path, JSON_INDENT(2));
    json_decref(j);
}

static int64_t kda_tokens = 1048576, tiny_tokens = 1048576;

/* KDA-only: the whole million tokens (linear cost), memory flat */
static void test_kda_only(void) {
    if (kda_tokens <= 0) return;
    char kda[700];
    snprintf(kda, sizeof kda, "%s/kda-config.json", tmp);
    write_kda_config(kda);
    const int64_t m[3] = {65536, 262144, kda_tokens};
    run_config("kda", kda, kda_tokens, 65536, m, 0.0, 48.0);
}

/* tiny (2 MLA layers): memory grows by the latent cache only (2 x 48 fp32 = 384 B per token of
 * context; the slot's cache is reserved for the whole context up front and its pages are
 * touched as rows arrive).  Block-sparse MLA skips the unselected chunks, so the whole million
 * runs at a cost linear in the length (plus the T/n_c chunk scores per query). */
static void test_tiny(void) {
    if (tiny_tokens <= 0) return;
    const int64_t m[3] = {tiny_tokens / 8 < 65536 ? tiny_tokens / 8 : 65536,
                          tiny_tokens / 4 < 262144 ? tiny_tokens / 4 : 262144, tiny_tokens};
    run_config("tiny", NULL, tiny_tokens, tiny_tokens >= 262144 ? 65536 : 4096, m, 384.0, 64.0);
}

int main(int argc, char **argv) {
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokens")) kda_tokens = tiny_tokens = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--kda-tokens")) kda_tokens = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--tiny-tokens")) tiny_tokens = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--mla-chunk")) mla_chunk = atoll(argv[i + 1]);
        if (!strcmp(argv[i], "--mla-topk")) mla_topk = atoll(argv[i + 1]);
    }
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-1m"));
    H_DIE(arl_env_builtin_register(&scan_def), "register");
    TEST_RUN(test_kda_only);
    TEST_RUN(test_tiny);
    return test_finish();
}
