/* tests/replay/fixture.h: realistic, deterministic trajectories for the replay tests, the crash
 * writer and the benchmark.  A segment is a run of whole turns: each turn is some context
 * (observation) tokens followed by sampled action tokens, with behaviour log-probs on action
 * tokens only, the turn's policy version on every token, the loss mask equal to the action
 * ranges, routes per MoE layer, and the AEP create/step bodies of its steps (the first step of
 * a trajectory carries an image in its observation, to exercise image elision).  Everything is
 * a function of (seed, seg_index), so a checker can regenerate what a writer stored. */
#ifndef ARL_TESTS_REPLAY_FIXTURE_H
#define ARL_TESTS_REPLAY_FIXTURE_H

#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay/codec.h"
#include "replay/inspect.h"
#include "replay/replay.h"

#define FX_MAX_STEPS 16

static inline int fx_rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb;
    (void)flag;
    (void)f;
    return remove(p);
}

static inline void fx_rmtree(const char *dir);
/* Remove the test directory holding store root "<dir>/store" if the test has not failed. */
#define FX_CLEANUP(root)                                                                           \
    do {                                                                                           \
        if (!test_failures_) {                                                                     \
            char d_[512];                                                                          \
            snprintf(d_, sizeof d_, "%s", root);                                                   \
            char *sl_ = strrchr(d_, '/');                                                          \
            if (sl_) *sl_ = 0;                                                                     \
            fx_rmtree(d_);                                                                         \
        }                                                                                          \
    } while (0)

/* Remove a test's temporary directory tree (call on success; failures keep it to inspect). */
static inline void fx_rmtree(const char *dir) {
    if (dir && !strncmp(dir, "/tmp/arl-test-", 14)) nftw(dir, fx_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

typedef struct fx_ids {
    int64_t run_id, env_id, task_id, group_id;
} fx_ids;

/* replay verify of st with its report thrown away: the number of errors, -1 when verify itself
 * failed. */
static inline int64_t fx_verify_errors(replay_store *st) {
    int64_t errors = -1, warnings = -1;
    FILE *devnull = fopen("/dev/null", "w");
    replay_verify_opts vo = {0};
    if (replay_verify(st, &vo, devnull, &errors, &warnings) != ARL_OK) errors = -1;
    if (devnull) fclose(devnull);
    return errors;
}

/* Catalog rows every test uses: run "run1", env "calc" 1.0, task "t1", group "run1/g<n>". */
static inline arl_status fx_catalog(replay_store *st, int group_n, int size, fx_ids *ids) {
    replay_run_desc rd = {.run_uid = "run1",
                          .config_json = "{\"lr\":1e-5}",
                          .model_config_json = "{\"model\":\"tiny\"}"};
    ARL_TRY(replay_run_ensure(st, &rd, &ids->run_id));
    replay_env_desc ed = {.name = "calc",
                          .version = "1.0",
                          .info_json = "{\"name\":\"calc\",\"version\":\"1.0\"}",
                          .transport = "c_abi"};
    ARL_TRY(replay_env_ensure(st, &ed, &ids->env_id));
    replay_task_desc td = {.task_uid = "t1",
                           .env_name = "calc",
                           .seed = 7,
                           .data_json = "{\"question\":\"2+2?\"}",
                           .dataset = "toy",
                           .split = "train"};
    ARL_TRY(replay_task_ensure(st, &td, &ids->task_id));
    char g[64];
    snprintf(g, sizeof g, "run1/g%06d", group_n);
    replay_group_desc gd = {.group_uid = g,
                            .run_id = ids->run_id,
                            .task_id = ids->task_id,
                            .env_id = ids->env_id,
                            .kind = "train",
                            .size = size,
                            .admitted_version = 0,
                            .parent_seg_index = -1};
    return replay_group_ensure(st, &gd, &ids->group_id);
}

static inline uint64_t fx_hash(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* One generated segment with owned buffers (fx_seg_free). */
typedef struct fx_seg {
    replay_segment_desc d;
    uint32_t *tokens, *versions;
    float *logprobs;
    uint8_t *mask;
    uint8_t *routes;
    replay_turn turns[FX_MAX_STEPS + 1];
    replay_env_call calls[FX_MAX_STEPS + 1];
    replay_tool_call tools[FX_MAX_STEPS];
    replay_reward rewards[3 * FX_MAX_STEPS + 3];
    char *bodies[2 * (FX_MAX_STEPS + 1)];
    char *actions[FX_MAX_STEPS];
    int n_bodies;
} fx_seg;

/* A tiny PNG-shaped byte string (signature + IHDR of w x h + filler): enough for elision. */
static inline size_t fx_png(uint8_t *out, uint32_t w, uint32_t h, uint32_t salt) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
    memcpy(out, sig, 8);
    uint8_t ihdr[] = {0,
                      0,
                      0,
                      13,
                      'I',
                      'H',
                      'D',
                      'R',
                      (uint8_t)(w >> 24),
                      (uint8_t)(w >> 16),
                      (uint8_t)(w >> 8),
                      (uint8_t)w,
                      (uint8_t)(h >> 24),
                      (uint8_t)(h >> 16),
                      (uint8_t)(h >> 8),
                      (uint8_t)h,
                      8,
                      6,
                      0,
                      0,
                      0};
    memcpy(out + 8, ihdr, sizeof ihdr);
    size_t n = 8 + sizeof ihdr;
    for (int i = 0; i < 70; i++)
        out[n++] = (uint8_t)fx_hash(salt * 131u + (uint32_t)i);
    return n;
}

static inline char *fx_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

/* Generate segment seg_index of trajectory `seed`: n_tokens tokens over n_steps turns, routes
 * for moe_layers layers of k experts (u8), versions `version` (+1 for the last turn of odd
 * segments: a weight update between turns).  tok_start/ctx_start/first_step continue the
 * previous segment; with_image puts one image into the create response (segment 0 only). */
static inline void fx_seg_make(fx_seg *f, uint64_t seed, int32_t seg_index, int64_t n_tokens,
                               int n_steps, int32_t moe_layers, int32_t k, int64_t tok_start,
                               int64_t ctx_start, int32_t first_step, uint32_t version,
                               int with_image) {
    memset(f, 0, sizeof *f);
    if (n_steps > FX_MAX_STEPS) n_steps = FX_MAX_STEPS;
    const int64_t n = n_tokens;
    f->tokens = malloc((size_t)n * 4);
    f->versions = malloc((size_t)n * 4);
    f->logprobs = malloc((size_t)n * 4);
    f->mask = malloc((size_t)n);
    f->routes = moe_layers ? malloc((size_t)moe_layers * (size_t)n * (size_t)k) : NULL;
    uint64_t h = fx_hash(seed * 1000003ULL + (uint64_t)seg_index);
    int64_t per = n / n_steps;
    int nt = 0, nc = 0, nr = 0, ntool = 0;
    int64_t now = 1700000000000LL + (int64_t)seg_index * 1000;
    if (seg_index == 0) { /* step 0: session creation */
        char *req = malloc(256), *resp = malloc(1024);
        snprintf(req, 256,
                 "{\"trajectory_id\":\"t%llu\",\"group_id\":\"g\",\"task\":{\"id\":\"t1\","
                 "\"seed\":7,\"data\":{}},\"deadline_ms\":120000}",
                 (unsigned long long)seed);
        if (with_image) {
            uint8_t png[128];
            size_t pn = fx_png(png, 4, 3, (uint32_t)seed);
            char b64[256];
            replay_base64_encode(png, pn, b64);
            snprintf(resp, 1024,
                     "{\"session_id\":\"s-%llu\",\"step_index\":0,\"observation\":"
                     "{\"context\":\"reset\",\"messages\":[{\"role\":\"system\",\"content\":\"You "
                     "compute.\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                     "\"What is 2+2? See:\"},{\"type\":\"image\",\"image\":{\"format\":\"png\","
                     "\"width\":4,\"height\":3,\"data\":\"%s\"}}]}],\"tools\":null}}",
                     (unsigned long long)seed, b64);
        } else {
            snprintf(
                resp, 1024,
                "{\"session_id\":\"s-%llu\",\"step_index\":0,\"observation\":"
                "{\"context\":\"reset\",\"messages\":[{\"role\":\"system\",\"content\":\"You "
                "compute.\"},{\"role\":\"user\",\"content\":\"What is 2+2?\"}],\"tools\":null}}",
                (unsigned long long)seed);
        }
        f->bodies[f->n_bodies++] = req;
        f->bodies[f->n_bodies++] = resp;
        f->calls[nc++] = (replay_env_call){.call_seq = 0,
                                           .endpoint = "create",
                                           .step_index = 0,
                                           .segment_index = -1,
                                           .http_status = 201,
                                           .attempts = 1,
                                           .started_at_ms = now,
                                           .latency_ms = 3,
                                           .response_complete = 1,
                                           .response_len = -1,
                                           .request = (const uint8_t *)req,
                                           .request_nbytes = strlen(req),
                                           .response = (const uint8_t *)resp,
                                           .response_nbytes = strlen(resp)};
        f->turns[nt++] = (replay_turn){.step_index = 0,
                                       .act_tok_start = -1,
                                       .act_tok_end = -1,
                                       .obs_seg_index = 0,
                                       .obs_tok_start = 0,
                                       .obs_tok_end = per / 2,
                                       .policy_version = -1,
                                       .context = "reset",
                                       .reward = NAN,
                                       .call_seq = 0,
                                       .started_at_ms = now,
                                       .finished_at_ms = now + 3};
    }
    for (int st = 0; st < n_steps; st++) {
        int64_t a = st * per, b = st == n_steps - 1 ? n : (st + 1) * per;
        int64_t act0 = a + (b - a) / 2; /* first half context, second half sampled */
        int32_t step = first_step + st;
        uint32_t v = version + ((seg_index & 1) && st == n_steps - 1 ? 1 : 0);
        for (int64_t i = a; i < b; i++) {
            uint64_t r = fx_hash(h + (uint64_t)i);
            f->tokens[i] = (uint32_t)(r % 160000u);
            f->mask[i] = i >= act0;
            f->logprobs[i] = i >= act0 ? -(float)((r >> 20) % 1000) / 250.0f : 0.0f;
            f->versions[i] = v;
            for (int32_t l = 0; l < moe_layers; l++)
                for (int32_t j = 0; j < k; j++)
                    f->routes[((size_t)l * (size_t)n + (size_t)i) * (size_t)k + (size_t)j] =
                        (uint8_t)((r >> (8 + ((l + j) % 40))) % 16);
        }
        int64_t call_seq = (int64_t)step; /* create is 0, step k is k */
        char *act = malloc(512), *req = malloc(768), *resp = malloc(768);
        int bad = (fx_hash(h + 77 + (uint64_t)st) % 5) == 0; /* some parse failures */
        if (bad)
            snprintf(act, 512,
                     "{\"content\":\"\",\"reasoning\":null,\"tool_calls\":[],"
                     "\"parse_status\":\"invalid_json\",\"parse_errors\":[{\"id\":\"call_%d_0\","
                     "\"status\":\"invalid_json\",\"message\":\"bad\",\"raw\":\"{x\"}],"
                     "\"finish_reason\":\"tool_calls\",\"num_tokens\":%lld}",
                     (int)step, (long long)(b - act0));
        else
            snprintf(act, 512,
                     "{\"content\":\"Let me add.\",\"reasoning\":\"2+2\",\"tool_calls\":"
                     "[{\"id\":\"call_%d_0\",\"name\":\"add\",\"arguments\":{\"a\":2,\"b\":%d}}],"
                     "\"parse_status\":\"ok\",\"parse_errors\":[],\"finish_reason\":\"tool_calls\","
                     "\"num_tokens\":%lld}",
                     (int)step, (int)step, (long long)(b - act0));
        snprintf(req, 768, "{\"step_index\":%d,\"action\":%s,\"deadline_ms\":60000}", (int)step,
                 act);
        snprintf(resp, 768,
                 "{\"step_index\":%d,\"observation\":{\"context\":\"append\",\"messages\":"
                 "[{\"role\":\"tool\",\"tool_call_id\":\"call_%d_0\",\"content\":\"%d\"%s}]},"
                 "\"reward\":%s,\"reward_components\":{\"tool_ok\":%s},\"terminated\":false,"
                 "\"truncated\":false,\"info\":{\"anchor\":\"a%d\"}}",
                 (int)step, (int)step, bad ? 0 : 2 + step,
                 bad ? ",\"is_error\":true,\"error_code\":\"TOOL_PARSE_ERROR\"" : "",
                 bad ? "-0.5" : "0.1", bad ? "-0.5" : "0.1", (int)step);
        f->actions[st] = act;
        f->bodies[f->n_bodies++] = req;
        f->bodies[f->n_bodies++] = resp;
        double rew = bad ? -0.5 : 0.1;
        f->turns[nt++] = (replay_turn){.step_index = step,
                                       .act_tok_start = tok_start + act0,
                                       .act_tok_end = tok_start + b,
                                       .obs_seg_index = -1,
                                       .obs_tok_start = -1,
                                       .obs_tok_end = -1,
                                       .policy_version = v,
                                       .finish_reason = "tool_calls",
                                       .parse_status = bad ? "invalid_json" : "ok",
                                       .n_tool_calls = bad ? 0 : 1,
                                       .context = "append",
                                       .reward = rew,
                                       .anchor = "a",
                                       .call_seq = call_seq,
                                       .started_at_ms = now + st,
                                       .finished_at_ms = now + st + 1,
                                       .action_json = act};
        f->calls[nc++] = (replay_env_call){.call_seq = call_seq,
                                           .endpoint = "step",
                                           .session_id = "s",
                                           .step_index = step,
                                           .segment_index = -1,
                                           .http_status = 200,
                                           .attempts = 1,
                                           .started_at_ms = now + st,
                                           .latency_ms = 2,
                                           .response_complete = 1,
                                           .response_len = -1,
                                           .request = (const uint8_t *)req,
                                           .request_nbytes = strlen(req),
                                           .response = (const uint8_t *)resp,
                                           .response_nbytes = strlen(resp)};
        f->tools[ntool++] = (replay_tool_call){.step_index = step,
                                               .call_index = 0,
                                               .call_id = bad ? "call_x_0" : "call_y_0",
                                               .name = bad ? NULL : "add",
                                               .parse_status = bad ? "invalid_json" : "ok",
                                               .result_is_error = bad,
                                               .result_error_code = bad ? "TOOL_PARSE_ERROR" : NULL,
                                               .result_bytes = 1,
                                               .result_truncated = 0,
                                               .arguments_json = bad ? NULL : "{\"a\":2}"};
        f->rewards[nr++] = (replay_reward){"process", step, "", NULL, rew, call_seq};
        f->rewards[nr++] = (replay_reward){"process", step, "tool_ok", NULL, rew, call_seq};
        f->rewards[nr++] = (replay_reward){"process", step, "@derived", NULL, rew, call_seq};
    }
    f->rewards[nr++] = (replay_reward){"segment", seg_index, "", NULL, 0.5, -1};
    f->rewards[nr++] = (replay_reward){"segment", seg_index, "@derived", NULL, 0.5, -1};
    replay_segment_desc *d = &f->d;
    d->seg_index = seg_index;
    d->start_kind = seg_index == 0 ? "fresh" : "continue";
    d->end_cause = "token_budget";
    d->first_step = first_step;
    d->last_step = first_step + n_steps - 1;
    d->tok_start = tok_start;
    d->ctx_start = ctx_start;
    d->n_tokens = n;
    d->tokens = f->tokens;
    d->logprobs = f->logprobs;
    d->loss_mask = f->mask;
    d->versions = f->versions;
    d->n_moe_layers = moe_layers;
    d->route_k = k;
    d->route_dtype = ARL_BLOB_U8;
    d->routes = f->routes;
    d->routes_layout = moe_layers ? "moe_layers=7;k=4;experts=16;dtype=u8" : NULL;
    d->end_state_id = -1;
    d->latent_state_id = -1;
    d->turns = f->turns;
    d->n_turns = (size_t)nt;
    d->env_calls = f->calls;
    d->n_env_calls = (size_t)nc;
    d->tool_calls = f->tools;
    d->n_tool_calls = (size_t)ntool;
    d->rewards = f->rewards;
    d->n_rewards = (size_t)nr;
    /* tool call ids must be unique per step: fix them up now that the strings exist */
    for (int i = 0; i < ntool; i++) {
        char *id = malloc(32);
        snprintf(id, 32, "call_%d_0", (int)f->tools[i].step_index);
        f->bodies[f->n_bodies++] = id;
        f->tools[i].call_id = id;
    }
}

static inline void fx_seg_free(fx_seg *f) {
    free(f->tokens);
    free(f->versions);
    free(f->logprobs);
    free(f->mask);
    free(f->routes);
    for (int i = 0; i < f->n_bodies; i++)
        free(f->bodies[i]);
    for (int i = 0; i < FX_MAX_STEPS; i++)
        free(f->actions[i]);
    memset(f, 0, sizeof *f);
}

/* Outcome rewards and an episode-score call for a finished trajectory. */
typedef struct fx_finish {
    replay_finish f;
    replay_reward r[3];
    replay_env_call call;
    char req[128], resp[256];
} fx_finish;

static inline void fx_finish_make(fx_finish *x, int64_t call_seq, double outcome) {
    memset(x, 0, sizeof *x);
    snprintf(x->req, sizeof x->req,
             "{\"scope\":\"episode\",\"reason\":\"terminated\",\"deadline_ms\":300000}");
    snprintf(x->resp, sizeof x->resp,
             "{\"scope\":\"episode\",\"scorable\":true,\"reward\":%g,"
             "\"reward_components\":{\"answer_correct\":%g}}",
             outcome, outcome);
    x->call = (replay_env_call){.call_seq = call_seq,
                                .endpoint = "score_episode",
                                .step_index = -1,
                                .segment_index = -1,
                                .http_status = 200,
                                .attempts = 1,
                                .started_at_ms = 1700000009000LL,
                                .latency_ms = 5,
                                .response_complete = 1,
                                .response_len = -1,
                                .request = (const uint8_t *)x->req,
                                .request_nbytes = strlen(x->req),
                                .response = (const uint8_t *)x->resp,
                                .response_nbytes = strlen(x->resp)};
    x->r[0] = (replay_reward){"outcome", 0, "", NULL, outcome, call_seq};
    x->r[1] = (replay_reward){"outcome", 0, "answer_correct", NULL, outcome, call_seq};
    x->r[2] = (replay_reward){"outcome", 0, "@derived", NULL, outcome, call_seq};
    x->f = (replay_finish){.status = REPLAY_COMPLETE,
                           .end_cause = "terminated",
                           .outcome_reward = NAN,
                           .env_calls = &x->call,
                           .n_env_calls = 1,
                           .rewards = x->r,
                           .n_rewards = 3};
}

/* The descriptor of trajectory uid in the catalog rows ids, at slot, not a fork (policy version
 * 0: set .policy_version after). */
static inline replay_traj_desc fx_traj_desc(const fx_ids *ids, const char *uid, int slot) {
    return (replay_traj_desc){.traj_uid = uid,
                              .run_id = ids->run_id,
                              .group_id = ids->group_id,
                              .task_id = ids->task_id,
                              .env_id = ids->env_id,
                              .slot = slot,
                              .fork_seg_index = -1};
}

/* Commit generated segment f to trajectory t: appended, or, when last, with end cause "end" and
 * the outcome of fx_finish_make(call_seq, outcome) as the trajectory's end (C_end). */
static inline arl_status fx_seg_commit(replay_writer *w, int64_t t, fx_seg *f, int last,
                                       int64_t call_seq, double outcome) {
    if (!last) return replay_segment_append(w, t, &f->d);
    f->d.end_cause = "end";
    fx_finish x;
    fx_finish_make(&x, call_seq, outcome);
    return replay_traj_finish(w, t, &f->d, &x.f);
}

/* A raw-tensor state chunk (blob NULL) of layer: kind, dtype, ndim dims; data is borrowed. */
static inline replay_state_chunk fx_chunk(int32_t layer, const char *tensor, arl_blob_kind kind,
                                          arl_blob_dtype dtype, int ndim, const uint64_t *dims,
                                          const void *data) {
    replay_state_chunk c;
    memset(&c, 0, sizeof c);
    c.layer = layer;
    c.tensor = tensor;
    c.kind = kind;
    c.dtype = dtype;
    c.ndim = ndim;
    for (int i = 0; i < ndim; i++)
        c.dims[i] = dims[i];
    c.data = data;
    return c;
}

/* Put a deterministic cached state of kind for (uid, seg) from pass, version 3, covering
 * n_tokens tokens from ctx_start; its id goes to *id.  "kda_boundary" is 2 layers of S (2,8,8)
 * f32 = seg*1000 + i and conv tail (3,16,3) f32 = -i; any other kind is one MLA latent chunk
 * (n_tokens,48) bf16 on layer 3, every element 0x3F80 + seg. */
static inline arl_status fx_state_put(replay_writer *w, const char *uid, int32_t seg,
                                      const char *kind, const char *pass, int64_t ctx_start,
                                      int64_t n_tokens, int64_t *id) {
    float s[2 * 8 * 8], conv[3 * 16 * 3];
    for (int i = 0; i < 128; i++)
        s[i] = (float)(seg * 1000 + i);
    for (int i = 0; i < 144; i++)
        conv[i] = (float)-i;
    replay_state_chunk c[4];
    size_t nc = 0;
    uint16_t *lat = NULL;
    if (!strcmp(kind, "kda_boundary")) {
        for (int l = 0; l < 2; l++) {
            c[nc++] =
                fx_chunk(l, "S", ARL_BLOB_KDA_STATE, ARL_BLOB_F32, 3, (uint64_t[]){2, 8, 8}, s);
            c[nc++] = fx_chunk(l, "conv", ARL_BLOB_CONV_TAIL, ARL_BLOB_F32, 3,
                               (uint64_t[]){3, 16, 3}, conv);
        }
    } else {
        lat = malloc((size_t)n_tokens * 48 * 2);
        if (!lat)
            return arl_errorf(ARL_ERR_NOMEM, "fx_state_put: %lld latent rows", (long long)n_tokens);
        for (int64_t i = 0; i < n_tokens * 48; i++)
            lat[i] = (uint16_t)(0x3F80 + seg);
        c[nc++] = fx_chunk(3, "latent", ARL_BLOB_MLA_LATENT, ARL_BLOB_BF16, 2,
                           (uint64_t[]){(uint64_t)n_tokens, 48}, lat);
    }
    replay_state_desc d = {.traj_uid = uid,
                           .seg_index = seg,
                           .kind = kind,
                           .pass_uid = pass,
                           .version_min = 3,
                           .version_max = 3,
                           .numerics = "cpu-f32",
                           .model_config_sha256 = "00",
                           .ctx_start = ctx_start,
                           .n_tokens = n_tokens};
    *id = -1;
    arl_status st = replay_state_put(w, &d, c, nc, id);
    free(lat);
    return st;
}

/* Write a complete trajectory of n_seg segments of n_tok tokens and n_steps turns each.
 * The last segment ends 'end' and is committed with the outcome (C_end). */
static inline arl_status fx_write_traj(replay_writer *w, const fx_ids *ids, const char *uid,
                                       uint64_t seed, int slot, int n_seg, int64_t n_tok,
                                       int n_steps, int32_t moe_layers, double outcome,
                                       int64_t *traj_id) {
    replay_traj_desc td = fx_traj_desc(ids, uid, slot);
    td.policy_version = 3;
    ARL_TRY(replay_traj_begin(w, &td, traj_id));
    int64_t tok = 0;
    int32_t step = 1;
    for (int s = 0; s < n_seg; s++) {
        fx_seg f;
        fx_seg_make(&f, seed, s, n_tok, n_steps, moe_layers, 4, tok, tok, step, 3, s == 0);
        arl_status st = fx_seg_commit(w, *traj_id, &f, s == n_seg - 1, step + n_steps, outcome);
        tok += n_tok;
        step += n_steps;
        fx_seg_free(&f);
        ARL_TRY(st);
    }
    return ARL_OK;
}

#endif
