/* tests/rollout/test_device.c: the rollout engine on a device (rollout.device,
 * policy/model_device.h) against the reference engine (policy/model.h).
 *
 *   - device cpu-device (the device code over host memory, every op the reference's own): the
 *     same rollout as device cpu, bit for bit: every stored token, behaviour log-probability,
 *     route, version, status and every stored state's bytes (KDA states, conv tails, latent
 *     rows: copied back from the device slots at the boundaries), over the calculator with
 *     segments short enough for continue boundaries, and over builtin:shapes (image rows placed
 *     by the device forward); their numerics tag is "cpu-f32" on both;
 *   - replay rescore on the device (cpu-device): log-probabilities, cached-state starts, router
 *     agreement, entropy and saved tool states identical to the reference's;
 *   - a worker on the device killed after its first boundary resumes the trajectory on restart
 *     from the cached state (imported into the device slot), and the finished trajectory
 *     re-scores (reference engine) to its behaviour log-probabilities (< 1e-3 nats, as
 *     tests/rollout/helpers.h explains);
 *   - block-sparse MLA (mla-sparse-topk 2, chunks of 16 rows: trajectories of many chunks) on
 *     cpu-device: the same rollout as cpu with the same settings, bit for bit, and its replay
 *     rescore from the cached states (imported into the device slots, whose chunk summaries are
 *     recomputed there) identical to the reference's;
 *   - refusals before anything is written: device cuda in a build or on a machine without a GPU
 *     (the error names the device), bf16 weights or CUDA graphs off cuda;
 *   - `test_rollout_device cuda` (gpu; exit 77 without one): the calculator rollout on the GPU
 *     re-scores on the CPU within 1e-3 nats and its states are tagged cuda-f32; with
 *     device-graphs (decode steps replayed as CUDA graphs) the store is the same bit for bit.
 */
#include "policy/model_device.h"
#include "tests/rollout/helpers.h"

static char ckpt[600], tmp[512];

/* Run a worker of config c over a new store at tmp/name; returns the store (caller closes). */
static replay_store *run_into(const char *name, arl_rollout_config *c) {
    char db[700];
    snprintf(db, sizeof db, "%s/%s", tmp, name);
    replay_store *st = h_store(db);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(c, ckpt, st, 0, NULL, &w), name);
    H_DIE(arl_rollout_worker_run(w), name);
    CHECK_EQ_INT(arl_rollout_worker_stats(w)->masked, 0);
    arl_rollout_worker_close(w);
    CHECK_EQ_INT(h_verify(st), 0);
    return st;
}

/* 1 when state a and b (ids in their stores) hold the same chunks, byte for byte. */
static int same_state(replay_store *sa, int32_t shard_a, int64_t a, replay_store *sb,
                      int32_t shard_b, int64_t b, const char *numerics) {
    if (a < 0 || b < 0) return a == b;
    replay_state_data da, db;
    memset(&da, 0, sizeof da);
    memset(&db, 0, sizeof db);
    H_DIE(replay_state_load(sa, shard_a, a, &da), "state a");
    H_DIE(replay_state_load(sb, shard_b, b, &db), "state b");
    int same = da.n_chunks == db.n_chunks && !strcmp(da.kind, db.kind) &&
               da.n_tokens == db.n_tokens && da.ctx_start == db.ctx_start &&
               !strcmp(da.numerics, numerics) && !strcmp(db.numerics, numerics);
    for (size_t i = 0; same && i < da.n_chunks; i++) {
        const replay_state_chunk_data *x = &da.chunks[i], *y = &db.chunks[i];
        same = x->layer == y->layer && !strcmp(x->tensor, y->tensor) &&
               x->row_start == y->row_start &&
               x->h.payload_nbytes == y->h.payload_nbytes &&
               !memcmp(x->data, y->data, (size_t)x->h.payload_nbytes);
    }
    replay_state_data_free(&da);
    replay_state_data_free(&db);
    return same;
}

/* Every stored column and state of trajectory uid equal in both stores; returns the number of
 * states compared. */
static int64_t compare_traj(replay_store *a, replay_store *b, const char *uid,
                            const char *numerics) {
    replay_traj_row ra, rb;
    H_DIE(replay_traj_get(a, uid, &ra), "traj a");
    H_DIE(replay_traj_get(b, uid, &rb), "traj b");
    CHECK_EQ_INT(ra.status, rb.status);
    CHECK_EQ_INT(ra.n_tokens, rb.n_tokens);
    CHECK_EQ_INT(ra.n_action_tokens, rb.n_action_tokens);
    replay_seg_ref *fa, *fb;
    size_t na, nb;
    H_DIE(replay_traj_segments(a, ra.traj_id, &fa, &na), "segments a");
    H_DIE(replay_traj_segments(b, rb.traj_id, &fb, &nb), "segments b");
    CHECK_EQ_INT(na, nb);
    int64_t states = 0;
    replay_seg_data da, db;
    memset(&da, 0, sizeof da);
    memset(&db, 0, sizeof db);
    for (size_t i = 0; i < na && i < nb; i++) {
        H_DIE(replay_segment_load(a, ra.traj_id, (int32_t)i, REPLAY_LOAD_TOKENS | REPLAY_LOAD_ROUTES,
                                  &da),
              "load a");
        H_DIE(replay_segment_load(b, rb.traj_id, (int32_t)i, REPLAY_LOAD_TOKENS | REPLAY_LOAD_ROUTES,
                                  &db),
              "load b");
        const int64_t T = fa[i].n_tokens;
        CHECK_EQ_INT(T, fb[i].n_tokens);
        CHECK(!strcmp(fa[i].start_kind, fb[i].start_kind) && !strcmp(fa[i].end_cause, fb[i].end_cause));
        if (T != fb[i].n_tokens) break;
        CHECK_MSG(!memcmp(da.tokens, db.tokens, sizeof(uint32_t) * (size_t)T), "%s seg %zu tokens",
                  uid, i);
        CHECK_MSG(!memcmp(da.logprobs, db.logprobs, sizeof(float) * (size_t)T),
                  "%s seg %zu log-probs", uid, i);
        CHECK(!memcmp(da.loss_mask, db.loss_mask, (size_t)T));
        CHECK(!memcmp(da.versions, db.versions, sizeof(uint32_t) * (size_t)T));
        CHECK_EQ_INT(da.n_moe_layers, db.n_moe_layers);
        const size_t rb_ = (size_t)da.n_moe_layers * (size_t)T * (size_t)da.route_k *
                           (da.route_dtype == ARL_BLOB_U8 ? 1 : 2);
        CHECK_MSG(da.n_moe_layers > 0 && !memcmp(da.routes, db.routes, rb_), "%s seg %zu routes",
                  uid, i);
        CHECK_MSG(same_state(a, fa[i].shard_id, fa[i].end_state_id, b, fb[i].shard_id,
                             fb[i].end_state_id, numerics),
                  "%s seg %zu boundary state", uid, i);
        CHECK_MSG(same_state(a, fa[i].shard_id, fa[i].latent_state_id, b, fb[i].shard_id,
                             fb[i].latent_state_id, numerics),
                  "%s seg %zu latent state", uid, i);
        states += (fa[i].end_state_id >= 0) + (fa[i].latent_state_id >= 0);
    }
    replay_seg_data_free(&da);
    replay_seg_data_free(&db);
    free(fa);
    free(fb);
    return states;
}

static void test_calculator_bit_identical(void) {
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.observation_tokens = 576;
    c.segment_tokens = 600; /* continue boundaries with states in every trajectory */
    h_set(&c, "state-cache", "all");
    replay_store *ref = run_into("calc-ref", &c);
    h_set(&c, "device", "cpu-device");
    replay_store *dev = run_into("calc-dev", &c);
    const char *uids[] = {"rollout/g000000/r0", "rollout/g000000/r1", "rollout/g000001/r0",
                          "rollout/g000001/r1"};
    int64_t states = 0;
    for (int i = 0; i < 4; i++)
        states += compare_traj(ref, dev, uids[i], "cpu-f32");
    fprintf(stderr, "  calculator: 4 trajectories and %lld stored states identical\n",
            (long long)states);
    CHECK(states >= 4);
    replay_store_close(ref);
    replay_store_close(dev);
    arl_rollout_config_free(&c);
}

/* Block-sparse MLA: the calculator with continue boundaries, cpu-device against cpu. */
static void test_calculator_sparse_bit_identical(void) {
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.observation_tokens = 576;
    c.segment_tokens = 600;
    h_set(&c, "state-cache", "all");
    h_set(&c, "mla-sparse-topk", "2");
    h_set(&c, "mla-sparse-chunk", "16");
    replay_store *ref = run_into("calc-sparse-ref", &c);
    h_set(&c, "device", "cpu-device");
    replay_store *dev = run_into("calc-sparse-dev", &c);
    const char *uids[] = {"rollout/g000000/r0", "rollout/g000000/r1"};
    int64_t states = 0;
    for (int i = 0; i < 2; i++)
        states += compare_traj(ref, dev, uids[i], "cpu-f32");
    fprintf(stderr, "  calculator, block-sparse MLA: 2 trajectories and %lld stored states "
                    "identical\n",
            (long long)states);
    CHECK(states >= 2);
    /* replay rescore with the rollout's sparse setting: segments start from its cached states
     * (uploaded into the device slot, the summaries recomputed there), identical on cpu-device */
    arl_rollout_rescore_opts ro = {.ckpt_dir = ckpt, .version = ARL_ROLLOUT_RESCORE_VERSION_AUTO,
                                   .sparse_topk = 2, .sparse_chunk = 16};
    arl_rollout_rescore_stats sa, sb;
    float *la = NULL, *lb = NULL;
    size_t nla = 0, nlb = 0;
    H_DIE(arl_rollout_rescore(ref, uids[0], &ro, &sa, &la, NULL, &nla), "rescore sparse cpu");
    ro.device = "cpu-device";
    H_DIE(arl_rollout_rescore(ref, uids[0], &ro, &sb, &lb, NULL, &nlb), "rescore sparse dev");
    CHECK(sa.from_state > 0 && sa.from_state == sb.from_state);
    CHECK(nla > 0 && nla == nlb && !memcmp(la, lb, sizeof(float) * nla));
    CHECK_MSG(sa.max_abs < 1e-3, "sparse rescore max |diff| %g", sa.max_abs);
    free(la);
    free(lb);
    /* the sparse setting is used: the dense rollout of the same task (test_calculator_bit_
     * identical's store, when it ran) has other log-probabilities */
    char db[700];
    snprintf(db, sizeof db, "%s/calc-ref", tmp);
    if (access(db, F_OK) == 0) {
        replay_store *dense = h_store(db);
        replay_traj_row ra, rb;
        H_DIE(replay_traj_get(ref, uids[0], &ra), "traj sparse");
        H_DIE(replay_traj_get(dense, uids[0], &rb), "traj dense");
        replay_seg_data da, db_;
        memset(&da, 0, sizeof da);
        memset(&db_, 0, sizeof db_);
        H_DIE(replay_segment_load(ref, ra.traj_id, 0, REPLAY_LOAD_TOKENS, &da), "load sparse");
        H_DIE(replay_segment_load(dense, rb.traj_id, 0, REPLAY_LOAD_TOKENS, &db_), "load dense");
        const int64_t T = da.ref.n_tokens < db_.ref.n_tokens ? da.ref.n_tokens : db_.ref.n_tokens;
        CHECK(T > 0);
        CHECK_MSG(memcmp(da.logprobs, db_.logprobs, sizeof(float) * (size_t)T) != 0,
                  "block-sparse and dense rollouts have the same log-probabilities");
        replay_seg_data_free(&da);
        replay_seg_data_free(&db_);
        replay_store_close(dense);
    }
    replay_store_close(ref);
    replay_store_close(dev);
    arl_rollout_config_free(&c);
}

static void test_images_bit_identical(void) {
    arl_rollout_config c;
    h_config(&c, "builtin:shapes");
    c.tasks = 1;
    h_set(&c, "state-cache", "all");
    replay_store *ref = run_into("shapes-ref", &c);
    h_set(&c, "device", "cpu-device");
    replay_store *dev = run_into("shapes-dev", &c);
    compare_traj(ref, dev, "rollout/g000000/r0", "cpu-f32");
    compare_traj(ref, dev, "rollout/g000000/r1", "cpu-f32");
    replay_store_close(ref);
    replay_store_close(dev);
    arl_rollout_config_free(&c);
}

/* Re-score trajectory uid of st under device `device` (NULL: the reference), version auto
 * (the rollout states of the checkpoint's version may start segments), saving its states into
 * tw when non-NULL; returns the per-token log-probabilities (caller frees). */
static float *rescore_on(replay_store *st, const char *uid, const char *device, replay_writer *tw,
                         arl_rollout_rescore_stats *rs, size_t *n) {
    arl_rollout_rescore_opts o = {.ckpt_dir = ckpt, .version = ARL_ROLLOUT_RESCORE_VERSION_AUTO,
                                  .device = device, .save_states = tw};
    float *lp = NULL;
    H_DIE(arl_rollout_rescore(st, uid, &o, rs, &lp, NULL, n), "rescore");
    return lp;
}

/* replay rescore on a device: the same log-probabilities, cached-state starts, router
 * agreement and entropy as the reference bit for bit (cpu-device), from the rollout's states
 * (imported into the device slot) and, with save_states, writing the same tool states */
static void test_rescore_on_device(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/calc-ref", tmp); /* test_calculator_bit_identical's store */
    replay_store *st = h_store(db);
    const char *uid = "rollout/g000001/r0";
    arl_rollout_rescore_stats a, b;
    size_t na = 0, nb = 0;
    float *la = rescore_on(st, uid, NULL, NULL, &a, &na);
    float *lb = rescore_on(st, uid, "cpu-device", NULL, &b, &nb);
    CHECK_EQ_INT(na, nb);
    CHECK(la && lb && na > 0 && !memcmp(la, lb, sizeof(float) * na));
    CHECK(a.from_state > 0); /* segments started from the rollout's cached states */
    CHECK_EQ_INT(a.from_state, b.from_state);
    CHECK_EQ_INT(a.action_tokens, b.action_tokens);
    CHECK(a.max_abs == b.max_abs && a.mean_abs == b.mean_abs);
    CHECK(a.route_tokens > 0 && a.route_tokens == b.route_tokens);
    CHECK(a.agree_overlap == b.agree_overlap && a.agree_exact_token == b.agree_exact_token);
    CHECK(a.entropy_mean == b.entropy_mean);
    fprintf(stderr, "  rescore on cpu-device: %lld segments (%lld from cached states), max |diff| "
                    "%.3g, agreement %.4f: identical to the reference\n",
            (long long)b.segments, (long long)b.from_state, b.max_abs, b.agree_overlap);
    /* save_states: the device pass writes the same tool states as the reference pass */
    replay_writer *tw;
    H_DIE(replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, &tw), "tool writer");
    free(rescore_on(st, uid, NULL, tw, &a, &na));
    replay_writer_close(tw);
    CHECK(a.states_saved > 0);
    snprintf(db, sizeof db, "%s/calc-dev", tmp); /* the same trajectory, bit for bit */
    replay_store *sd = h_store(db);
    H_DIE(replay_writer_open(sd, REPLAY_FILE_TOOL, 0, NULL, &tw), "tool writer");
    free(rescore_on(sd, uid, "cpu-device", tw, &b, &nb));
    replay_writer_close(tw);
    CHECK_EQ_INT(a.states_saved, b.states_saved);
    CHECK(!strcmp(a.pass_uid, b.pass_uid));
    int64_t same = 0;
    const char *kinds[2] = {"kda_boundary", "mla_segment"};
    for (int32_t seg = 0; seg < 64; seg++)
        for (int q = 0; q < 2; q++) {
            replay_state_data x, y;
            memset(&x, 0, sizeof x);
            memset(&y, 0, sizeof y);
            arl_status sx = replay_state_find(st, uid, seg, kinds[q], "tool", a.pass_uid, &x);
            arl_status sy = replay_state_find(sd, uid, seg, kinds[q], "tool", b.pass_uid, &y);
            arl_error_clear();
            CHECK_EQ_INT(sx, sy);
            if (sx == ARL_OK && sy == ARL_OK) {
                int ok = x.n_chunks == y.n_chunks && !strcmp(x.numerics, y.numerics);
                for (size_t c = 0; ok && c < x.n_chunks; c++)
                    ok = x.chunks[c].h.payload_nbytes == y.chunks[c].h.payload_nbytes &&
                         !memcmp(x.chunks[c].data, y.chunks[c].data,
                                 (size_t)x.chunks[c].h.payload_nbytes);
                CHECK_MSG(ok, "tool state %s of segment %d differs", kinds[q], seg);
                same += ok && q == 0;
            }
            replay_state_data_free(&x);
            replay_state_data_free(&y);
        }
    CHECK_EQ_INT(same, a.states_saved);
    free(la);
    free(lb);
    replay_store_close(sd);
    replay_store_close(st);
}

static void test_resume_from_cached_state(void) {
    char db[700];
    snprintf(db, sizeof db, "%s/calc-resume", tmp);
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.group_size = 1;
    c.observation_tokens = 576;
    c.segment_tokens = 600;
    h_set(&c, "state-cache", "last");
    h_set(&c, "device", "cpu-device");
    h_run_until_first_boundary(&c, ckpt, db, 1);
    replay_store *st = h_store(db);
    replay_traj_row r;
    H_DIE(replay_traj_get(st, "rollout/g000000/r0", &r), "traj");
    CHECK(r.status == REPLAY_RUNNING);
    arl_rollout_worker *w;
    H_DIE(arl_rollout_worker_open(&c, ckpt, st, 1, NULL, &w), "reopen");
    H_DIE(arl_rollout_worker_run(w), "rerun");
    const arl_rollout_stats *s = arl_rollout_worker_stats(w);
    CHECK_EQ_INT(s->resumed, 1);
    CHECK_EQ_INT(s->masked, 0);
    CHECK_EQ_INT(s->resumed_from_state, 1); /* the cached boundary, imported into the device */
    arl_rollout_worker_close(w);
    H_DIE(replay_traj_get(st, "rollout/g000000/r0", &r), "traj");
    CHECK(r.status == REPLAY_COMPLETE || r.status == REPLAY_TRUNCATED);
    CHECK_EQ_INT(h_verify(st), 0);
    h_rescore_check(st, ckpt, "rollout/g000000/r0");
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

/* Opening a worker with c fails with code `want` and a message containing `needle`; the store
 * holds no trajectory. */
static void expect_refusal(arl_rollout_config *c, const char *name, arl_status want,
                           const char *needle) {
    char db[700];
    snprintf(db, sizeof db, "%s/%s", tmp, name);
    replay_store *st = h_store(db);
    arl_rollout_worker *w = NULL;
    arl_status s = arl_rollout_worker_open(c, ckpt, st, 0, NULL, &w);
    if (s == ARL_OK) s = arl_rollout_worker_run(w);
    CHECK_MSG(s == want, "%s: status %d, want %d (%s)", name, s, want, arl_error_msg());
    CHECK_MSG(strstr(arl_error_msg(), needle) != NULL, "%s: message '%s' lacks '%s'", name,
              arl_error_msg(), needle);
    arl_error_clear();
    arl_rollout_worker_close(w);
    replay_traj_row r;
    CHECK(replay_traj_get(st, "rollout/g000000/r0", &r) == ARL_ERR_NOT_FOUND);
    arl_error_clear();
    replay_store_close(st);
}

static void test_refusals(void) {
    arl_rollout_config c;
    h_config(&c, "calculator");
    h_set(&c, "device", "cpu-device");
    h_set(&c, "device-bf16", "true");
    expect_refusal(&c, "refuse-bf16", ARL_ERR_ARG, "bf16 weights");
    h_set(&c, "device-bf16", "false");
    h_set(&c, "device-graphs", "true");
    expect_refusal(&c, "refuse-graphs", ARL_ERR_ARG, "CUDA graphs");
    h_set(&c, "device-graphs", "false");
    CHECK(arl_options_set(arl_rollout_options, arl_rollout_n_options, "device", "tpu", &c) != ARL_OK);
    arl_error_clear();

    /* device cuda without a GPU (or in a build without CUDA): refused, naming the device */
    const arl_dev_ops *ops = NULL;
    arl_status want = arl_dev_ops_get("cuda", 0, &ops);
    if (want != ARL_OK) {
        arl_error_clear();
        h_set(&c, "device", "cuda");
        expect_refusal(&c, "refuse-cuda", want, "device cuda");
    }
    arl_error_clear();
    arl_rollout_config_free(&c);
}

/* (cuda) the calculator rollout on the GPU: states tagged cuda-f32, and the CPU re-score of
 * the stored routes reproduces the behaviour log-probabilities: fp32 cuBLAS and the CUDA
 * kernels differ from the CPU by ~1e-5 nats; 1e-3 as tests/rollout/helpers.h explains */
static void test_cuda_rollout(void) {
    arl_rollout_config c;
    h_config(&c, "calculator");
    c.tasks = 1;
    c.observation_tokens = 576;
    c.segment_tokens = 600;
    h_set(&c, "state-cache", "all");
    h_set(&c, "device", "cuda");
    replay_store *st = run_into("calc-cuda", &c);
    const char *uids[] = {"rollout/g000000/r0", "rollout/g000000/r1"};
    int64_t states = 0;
    for (int i = 0; i < 2; i++) {
        replay_traj_row r;
        H_DIE(replay_traj_get(st, uids[i], &r), "traj");
        replay_seg_ref *refs;
        size_t n;
        H_DIE(replay_traj_segments(st, r.traj_id, &refs, &n), "segments");
        for (size_t j = 0; j < n; j++)
            if (refs[j].end_state_id >= 0) {
                replay_state_data d;
                memset(&d, 0, sizeof d);
                H_DIE(replay_state_load(st, refs[j].shard_id, refs[j].end_state_id, &d), "state");
                CHECK(!strcmp(d.numerics, "cuda-f32"));
                replay_state_data_free(&d);
                states++;
            }
        free(refs);
        h_rescore_check(st, ckpt, uids[i]);
    }
    CHECK(states >= 2);
    /* re-scored on the GPU: the rollout's cuda-f32 states start segments (same numerics), the
     * log-probabilities within 1e-3 nats of the behaviour's (other batch compositions) */
    arl_rollout_rescore_stats rs;
    size_t nl = 0;
    free(rescore_on(st, uids[0], "cuda", NULL, &rs, &nl));
    CHECK(rs.from_state > 0);
    CHECK_MSG(rs.max_abs < 1e-3, "cuda rescore max |diff| %g", rs.max_abs);
    /* decode steps replayed as CUDA graphs: the same kernels, so the same store bit for bit */
    h_set(&c, "device-graphs", "true");
    replay_store *sg = run_into("calc-cuda-graphs", &c);
    for (int i = 0; i < 2; i++)
        compare_traj(st, sg, uids[i], "cuda-f32");
    replay_store_close(sg);
    /* a later worker of the process with a larger context (an experiment's context stages):
     * its slots need more device memory than the first context's arena holds, so the engine
     * replaces the unused context; the trajectories are those of the first run */
    c.context_tokens = c.trajectory_tokens = 65536;
    replay_store *sb = run_into("calc-cuda-bigger", &c);
    for (int i = 0; i < 2; i++)
        compare_traj(st, sb, uids[i], "cuda-f32");
    replay_store_close(sb);
    replay_store_close(st);
    arl_rollout_config_free(&c);
}

int main(int argc, char **argv) {
    const int cuda = argc > 1 && !strcmp(argv[1], "cuda");
    if (cuda) {
        const arl_dev_ops *ops = NULL;
        if (arl_dev_ops_get("cuda", 0, &ops) != ARL_OK) {
            fprintf(stderr, "skip: %s\n", arl_error_msg());
            return TEST_SKIP;
        }
    }
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("rollout-device"));
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", tmp);
    h_make_ckpt(ckpt, NULL, 3);
    if (cuda) {
        TEST_RUN(test_cuda_rollout);
    } else {
        TEST_RUN(test_calculator_bit_identical);
        TEST_RUN(test_calculator_sparse_bit_identical);
        TEST_RUN(test_rescore_on_device);
        TEST_RUN(test_images_bit_identical);
        TEST_RUN(test_resume_from_cached_state);
        TEST_RUN(test_refusals);
    }
    return test_finish();
}
