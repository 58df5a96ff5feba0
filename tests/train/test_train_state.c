/* Train state: train_state.json round trip, refusal of newer versions and of other configs,
 * optimizer moments as safetensors, numbered checkpoints (atomic save, keep-last pruning,
 * leftovers of interrupted saves, latest), and the full checkpoint round trip. */
#include <dirent.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/rng.h"
#include "policy/checkpoint.h"
#include "policy/config.h"
#include "policy/optimizer.h"
#include "policy/params.h"
#include "policy/safetensors.h"
#include "policy/train_state.h"
#include "tests/test.h"

static arl_model_config g_cfg;

static const char *path_in(const char *dir, const char *name) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static void fill_state(arl_train_state *st) {
    arl_train_state_init(st);
    st->step = 1234;
    st->tokens = 987654321012LL;
    st->lr = 3.0000000000000004e-4; /* needs 17 significant digits */
    arl_model_config_hash_hex(&g_cfg, st->model_sha256);
    memset(st->run_sha256, 'a', 64);
    st->run_sha256[64] = 0;
    arl_rng r;
    arl_rng_seed(&r, 99);
    for (int i = 0; i < 17; i++)
        arl_rng_next(&r);
    CHECK(arl_train_state_set_rng(st, "train", &r) == ARL_OK);
    arl_rng_seed_stream(&r, 5, 6);
    CHECK(arl_train_state_set_rng(st, "rollout", &r) == ARL_OK);
    st->data.epoch = 3;
    st->data.index = 41;
    st->data.items = 500;
    st->data.seed = 0xfedcba9876543210ULL; /* above INT64_MAX */
    st->data.offset = 123456789;
    st->data.line = 77;
    memset(st->data.sha256, 'b', 64);
    st->data.sha256[64] = 0;
    CHECK(arl_train_state_set_extra(st, "{\"kl\": {\"beta\": 0.05}, \"threads\": 2}") == ARL_OK);
    CHECK(arl_train_state_set_run_config(
              st,
              "{\"steps\": 5, \"lr\": 0.0003, \"rollout\": {\"temperature\": 1, \"top-p\": 1}}") ==
          ARL_OK);
}

static void test_state_round_trip(void) {
    const char *dir = test_tmpdir("train-state");
    arl_train_state a, b;
    fill_state(&a);
    CHECK(arl_train_state_write(path_in(dir, "train_state.json"), &a) == ARL_OK);
    CHECK(arl_train_state_read(path_in(dir, "train_state.json"), &b) == ARL_OK);
    CHECK_EQ_INT(b.step, a.step);
    CHECK_EQ_INT(b.tokens, a.tokens);
    CHECK(memcmp(&a.lr, &b.lr, sizeof a.lr) == 0); /* exact */
    CHECK_STR_EQ(b.model_sha256, a.model_sha256);
    CHECK_STR_EQ(b.run_sha256, a.run_sha256);
    CHECK_EQ_INT(b.n_rng, 2);
    arl_rng r1, r2;
    CHECK(arl_train_state_get_rng(&b, "train", &r1) == ARL_OK);
    CHECK(arl_train_state_get_rng(&a, "train", &r2) == ARL_OK);
    CHECK(memcmp(&r1, &r2, sizeof r1) == 0);
    CHECK(arl_rng_next(&r1) == arl_rng_next(&r2));
    CHECK(arl_train_state_get_rng(&b, "rollout", &r1) == ARL_OK);
    CHECK(arl_train_state_get_rng(&b, "nope", &r1) == ARL_ERR_NOT_FOUND);
    CHECK(memcmp(&a.data, &b.data, sizeof a.data) == 0);
    CHECK(b.extra_json && strstr(b.extra_json, "\"beta\":0.05"));
    CHECK_STR_EQ(b.run_config_json, a.run_config_json);
    CHECK(arl_train_state_set_run_config(&b, "[1]") == ARL_ERR_ARG); /* an object only */
    arl_error_clear();
    CHECK(arl_train_state_check(&b, "x", a.model_sha256, a.run_sha256) == ARL_OK);
    CHECK(arl_train_state_check(&b, "x", a.model_sha256, "") == ARL_OK); /* run hash unchecked */
    arl_train_state_free(&a);
    arl_train_state_free(&b);
}

static void test_state_refusals(void) {
    const char *dir = test_tmpdir("train-state-bad");
    arl_train_state a, b;
    fill_state(&a);
    const char *p = path_in(dir, "train_state.json");
    CHECK(arl_train_state_write(p, &a) == ARL_OK);
    /* another model config: the message names both hashes and the file */
    char other[65];
    memset(other, 'c', 64);
    other[64] = 0;
    CHECK(arl_train_state_read(p, &b) == ARL_OK);
    CHECK(arl_train_state_check(&b, p, other, NULL) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), a.model_sha256) && strstr(arl_error_msg(), other));
    CHECK(strstr(arl_error_msg(), "train_state.json") != NULL);
    CHECK(arl_train_state_check(&b, p, a.model_sha256, other) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), a.run_sha256) && strstr(arl_error_msg(), other));
    arl_train_state_free(&b);
    /* a newer version */
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    CHECK(j != NULL);
    json_object_set_new(j, "version", json_integer(ARL_TRAIN_STATE_VERSION + 1));
    CHECK(json_dump_file(j, p, 0) == 0);
    CHECK(arl_train_state_read(p, &b) == ARL_ERR_VERSION);
    CHECK(strstr(arl_error_msg(), "newer") != NULL);
    /* another format, a missing member, a bad hex string */
    json_object_set_new(j, "version", json_integer(1));
    json_object_set_new(j, "format", json_string("something-else"));
    CHECK(json_dump_file(j, p, 0) == 0);
    CHECK(arl_train_state_read(p, &b) == ARL_ERR_FORMAT);
    json_object_set_new(j, "format", json_string(ARL_TRAIN_STATE_FORMAT));
    json_object_del(j, "step");
    CHECK(json_dump_file(j, p, 0) == 0);
    CHECK(arl_train_state_read(p, &b) == ARL_ERR_FORMAT);
    CHECK(strstr(arl_error_msg(), "'step'") != NULL);
    json_object_set_new(j, "step", json_integer(3));
    json_object_set_new(json_object_get(j, "data"), "seed", json_string("0xZZ"));
    CHECK(json_dump_file(j, p, 0) == 0);
    CHECK(arl_train_state_read(p, &b) == ARL_ERR_FORMAT);
    CHECK(strstr(arl_error_msg(), "data.seed") != NULL);
    json_decref(j);
    CHECK(arl_train_state_read(path_in(dir, "absent.json"), &b) == ARL_ERR_NOT_FOUND);
    arl_train_state_free(&a);
}

static void random_moments(arl_adamw *opt, uint64_t seed) {
    arl_rng r;
    arl_rng_seed(&r, seed);
    for (int64_t i = 0; i < opt->m.inv.arena_floats; i++) {
        opt->m_arena[i] = (float)arl_rng_normal(&r);
        opt->v_arena[i] = (float)arl_rng_uniform(&r);
    }
    /* moments of untrained tensors are never saved: keep them zero */
    for (int64_t i = 0; i < opt->m.inv.n; i++)
        if (!(opt->rule[i] & ARL_OPTIM_TRAIN)) {
            memset(opt->m_arena + opt->m.inv.t[i].offset, 0, (size_t)opt->m.inv.t[i].numel * 4);
            memset(opt->v_arena + opt->m.inv.t[i].offset, 0, (size_t)opt->m.inv.t[i].numel * 4);
        }
}

static void opt_for(arl_adamw *opt, const arl_model_config *cfg) {
    arl_optim_config c;
    arl_optim_config_defaults(&c);
    CHECK(arl_adamw_init(opt, cfg, &c) == ARL_OK);
    arl_optim_config_free(&c);
}

/* Moments only at positions that belong to tensors (alignment gaps are not saved). */
static int moments_equal(const arl_adamw *a, const arl_adamw *b) {
    for (int64_t i = 0; i < a->m.inv.n; i++) {
        const arl_param_tensor *t = &a->m.inv.t[i];
        if (memcmp(a->m_arena + t->offset, b->m_arena + t->offset, (size_t)t->numel * 4) ||
            memcmp(a->v_arena + t->offset, b->v_arena + t->offset, (size_t)t->numel * 4))
            return 0;
    }
    return 1;
}

static void test_optim_state(void) {
    const char *dir = test_tmpdir("optim-state");
    arl_adamw a, b;
    opt_for(&a, &g_cfg);
    opt_for(&b, &g_cfg);
    random_moments(&a, 1);
    a.step = 42;
    const char *p = path_in(dir, ARL_OPTIM_STATE_FILE);
    CHECK(arl_optim_state_save(p, &a) == ARL_OK);
    CHECK(arl_optim_state_load(p, &b) == ARL_OK);
    CHECK_EQ_INT(b.step, 42);
    CHECK(moments_equal(&a, &b));
    /* keys: parameter key + suffix, F32, memory shapes; no moments for the QB bias */
    arl_st_file *f;
    CHECK(arl_st_file_open(p, &f) == ARL_OK);
    const arl_st_tensor *t =
        arl_st_file_find(f, "language_model.model.layers.0.self_attn.q_proj.weight.exp_avg_sq");
    CHECK(t && t->dtype == ARL_DTYPE_F32 && t->rank == 2 && t->shape[0] == 16 && t->shape[1] == 32);
    CHECK(arl_st_file_find(f, "language_model.model.layers.0.self_attn.A_log.exp_avg") != NULL);
    CHECK(arl_st_file_find(
              f, "language_model.model.layers.1.block_sparse_moe.gate.e_score_correction_bias"
                 ".exp_avg") == NULL);
    CHECK_STR_EQ(arl_st_file_metadata(f, "format"), ARL_OPTIM_STATE_FORMAT);
    arl_st_file_close(f);

    /* a model of another shape: one message listing what does not match */
    arl_model_config other;
    CHECK(arl_model_config_copy(&other, &g_cfg) == ARL_OK);
    other.text.vocab_size = 400;
    CHECK(arl_model_config_validate(&other) == ARL_OK);
    arl_adamw c;
    opt_for(&c, &other);
    CHECK(arl_optim_state_load(p, &c) == ARL_ERR_SHAPE);
    CHECK(strstr(arl_error_msg(), "embed_tokens.weight.exp_avg (expected F32 [400, 32], got F32 "
                                  "[384, 32])") != NULL);
    arl_adamw_free(&c);
    arl_model_config_free(&other);

    /* a file that is not an optimizer state */
    arl_model_params pp;
    CHECK(arl_model_params_alloc(&pp, &g_cfg) == ARL_OK);
    CHECK(arl_checkpoint_save(dir, &g_cfg, &pp, 0) == ARL_OK);
    CHECK(arl_optim_state_load(path_in(dir, "model.safetensors"), &b) == ARL_ERR_FORMAT);
    arl_model_params_free(&pp);
    arl_adamw_free(&a);
    arl_adamw_free(&b);
}

static int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d) closedir(d);
    return n;
}

/* What a checkpoint test saves and loads back: two parameter sets and optimizer states of
 * g_cfg (p, a saved; q, b loaded into) and a filled train state. */
static void ckpt_objects(arl_model_params *p, arl_model_params *q, arl_adamw *a, arl_adamw *b,
                         arl_train_state *st) {
    CHECK(arl_model_params_alloc(p, &g_cfg) == ARL_OK);
    CHECK(arl_model_params_alloc(q, &g_cfg) == ARL_OK);
    opt_for(a, &g_cfg);
    opt_for(b, &g_cfg);
    fill_state(st);
}

static void test_checkpoints(void) {
    const char *base = test_tmpdir("train-ckpt");
    char root[1024];
    snprintf(root, sizeof root, "%s/run/checkpoints", base); /* created on the first save */
    char latest[1200];
    int64_t step = -1;
    CHECK(arl_train_ckpt_latest(root, latest, sizeof latest, &step) == ARL_ERR_NOT_FOUND);

    arl_model_params p, q;
    arl_adamw a, b;
    arl_train_state st, st2;
    ckpt_objects(&p, &q, &a, &b, &st);
    for (int64_t s = 5; s <= 25; s += 5) {
        CHECK(arl_params_init(&p, &g_cfg, (uint64_t)s, 1) == ARL_OK);
        random_moments(&a, (uint64_t)s);
        a.step = st.step = s;
        char out[1200];
        CHECK(arl_train_ckpt_save(root, &g_cfg, &p, &a, &st, 3, 0, out, sizeof out) == ARL_OK);
        CHECK(strstr(out, "step-000000") != NULL);
    }
    int64_t *steps, n;
    CHECK(arl_train_ckpt_list(root, &steps, &n) == ARL_OK);
    CHECK_EQ_INT(n, 3); /* keep-last 3 */
    CHECK(n == 3 && steps[0] == 15 && steps[1] == 20 && steps[2] == 25);
    free(steps);
    CHECK(arl_train_ckpt_latest(root, latest, sizeof latest, &step) == ARL_OK);
    CHECK_EQ_INT(step, 25);

    /* the newest checkpoint loads back bit-identical */
    CHECK(arl_train_ckpt_load(latest, &g_cfg, st.run_sha256, &q, &b, &st2) == ARL_OK);
    CHECK(memcmp(p.arena, q.arena, (size_t)p.inv.arena_floats * 4) == 0);
    CHECK(moments_equal(&a, &b));
    CHECK_EQ_INT(b.step, 25);
    CHECK_EQ_INT(st2.step, 25);
    CHECK(memcmp(&st.data, &st2.data, sizeof st.data) == 0);
    arl_train_state_free(&st2);

    /* another run configuration or model config is refused, naming both hashes */
    char other[65];
    memset(other, 'd', 64);
    other[64] = 0;
    CHECK(arl_train_ckpt_load(latest, &g_cfg, other, &q, &b, &st2) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), other) && strstr(arl_error_msg(), st.run_sha256));
    /* with this run's settings at hand, the refusal names the ones that differ (flattened,
     * sorted; a key on one side only as unset on the other) instead of the hashes */
    const char *now =
        "{\"lr\": 0.001, \"rollout\": {\"temperature\": 0.5, \"top-p\": 1}, \"seed\": 3}";
    CHECK(arl_train_ckpt_explain(ARL_ERR_CONFIG, latest, &g_cfg, now) == ARL_ERR_CONFIG);
    CHECK_MSG(strstr(arl_error_msg(),
                     "train_state.json: this checkpoint belongs to a run with other settings (as "
                     "saved -> as now): lr 0.0003 -> 0.001, rollout.temperature 1 -> 0.5, seed "
                     "(unset) -> 3, steps 5 -> (unset); an exact resume needs the same settings"),
              "%s", arl_error_msg());
    /* other failures are left as they are */
    arl_errorf(ARL_ERR_IO, "cannot read");
    CHECK(arl_train_ckpt_explain(ARL_ERR_IO, latest, &g_cfg, now) == ARL_ERR_IO);
    CHECK_STR_EQ(arl_error_msg(), "cannot read");
    arl_error_clear();
    arl_model_config tiny;
    CHECK(arl_model_config_read(test_src_path("configs/tiny/config.json"), &tiny) == ARL_OK);
    arl_model_params pt;
    arl_adamw at;
    CHECK(arl_model_params_alloc(&pt, &tiny) == ARL_OK);
    opt_for(&at, &tiny);
    CHECK(arl_train_ckpt_load(latest, &tiny, NULL, &pt, &at, &st2) == ARL_ERR_CONFIG);
    char tiny_hex[65];
    arl_model_config_hash_hex(&tiny, tiny_hex);
    CHECK(strstr(arl_error_msg(), tiny_hex) && strstr(arl_error_msg(), st.model_sha256));
    /* the refusal of another model config stays that refusal, whatever the settings */
    char model_msg[2048];
    snprintf(model_msg, sizeof model_msg, "%s", arl_error_msg());
    CHECK(arl_train_ckpt_explain(ARL_ERR_CONFIG, latest, &tiny, now) == ARL_ERR_CONFIG);
    CHECK_STR_EQ(arl_error_msg(), model_msg);
    arl_error_clear();
    arl_model_params_free(&pt);
    arl_adamw_free(&at);
    arl_model_config_free(&tiny);

    /* leftovers of an interrupted save and an incomplete step directory are ignored, the
       leftovers removed by the next save */
    char junk[1200];
    snprintf(junk, sizeof junk, "%s/.tmp-step-00000030-abcdef", root);
    CHECK(mkdir(junk, 0755) == 0);
    FILE *jf = fopen(path_in(junk, "model.safetensors"), "w");
    fputs("partial", jf);
    fclose(jf);
    snprintf(junk, sizeof junk, "%s/step-00000099", root); /* no train_state.json */
    CHECK(mkdir(junk, 0755) == 0);
    CHECK(arl_train_ckpt_latest(root, latest, sizeof latest, &step) == ARL_OK);
    CHECK_EQ_INT(step, 25);
    /* re-saving an existing step (a resumed run) replaces it */
    random_moments(&a, 777);
    a.step = st.step = 25;
    CHECK(arl_train_ckpt_save(root, &g_cfg, &p, &a, &st, 3, 0, NULL, 0) == ARL_OK);
    CHECK_EQ_INT(count_entries(root, ".tmp-"), 0);
    CHECK_EQ_INT(count_entries(root, ".old-"), 0);
    CHECK(arl_train_ckpt_latest(root, latest, sizeof latest, &step) == ARL_OK);
    CHECK(arl_train_ckpt_load(latest, &g_cfg, NULL, &q, &b, &st2) == ARL_OK);
    CHECK(moments_equal(&a, &b));
    arl_train_state_free(&st2);
    /* a step file with mismatched optimizer step is corrupt */
    char moved[1200];
    snprintf(moved, sizeof moved, "%s/step-00000020/%s", root, ARL_OPTIM_STATE_FILE);
    a.step = 21;
    CHECK(arl_optim_state_save(moved, &a) == ARL_OK);
    snprintf(moved, sizeof moved, "%s/step-00000020", root);
    CHECK(arl_train_ckpt_load(moved, &g_cfg, NULL, &q, &b, &st2) == ARL_ERR_CORRUPT);

    /* keep-last 0 keeps everything */
    for (int64_t s = 30; s <= 40; s += 5) {
        a.step = st.step = s;
        CHECK(arl_train_ckpt_save(root, &g_cfg, &p, &a, &st, 0, 0, NULL, 0) == ARL_OK);
    }
    CHECK(arl_train_ckpt_list(root, &steps, &n) == ARL_OK);
    CHECK_EQ_INT(n, 6); /* 15 ... 40; the incomplete step-00000099 does not count */
    free(steps);
    arl_train_state_free(&st);
    arl_adamw_free(&a);
    arl_adamw_free(&b);
    arl_model_params_free(&p);
    arl_model_params_free(&q);
}

/* A crash of a save that re-saves step N between its two renames (step-N moved aside to
 * .old-step-N-XXXXXX, the new one still .tmp-step-N-XXXXXX) leaves no step-N: a resume puts the
 * old one back instead of falling back to an older checkpoint (or to none with keep-last 1),
 * and removes the partial save; prune's .old-step-N-pruned is never put back.  A step-N without
 * train_state.json (never left by a save) is set aside as damaged with a warning.  Without
 * set_aside nothing is moved. */
static void test_checkpoint_recovery(void) {
    const char *base = test_tmpdir("train-ckpt-recover");
    char root[1024], dir[1200], moved[1200], latest[1200];
    arl_model_params p, q;
    arl_adamw a, b;
    arl_train_state st, st2;
    ckpt_objects(&p, &q, &a, &b, &st);
    CHECK(arl_params_init(&p, &g_cfg, 3, 1) == ARL_OK);
    random_moments(&a, 3);
    for (int keep = 1; keep <= 2; keep++) {
        snprintf(root, sizeof root, "%s/checkpoints-%d", base, keep);
        /* keep-last 1: step 10 is the only checkpoint; keep-last 2: step 5 is before it */
        for (int64_t s = 5; s <= 10; s += 5) {
            a.step = st.step = s;
            CHECK(arl_train_ckpt_save(root, &g_cfg, &p, &a, &st, keep, 0, NULL, 0) == ARL_OK);
        }
        snprintf(dir, sizeof dir, "%s/step-00000010", root);
        snprintf(moved, sizeof moved, "%s/.old-step-00000010-Ab12Cd", root);
        CHECK(rename(dir, moved) == 0);
        snprintf(dir, sizeof dir, "%s/.tmp-step-00000010-Xy34Zw", root);
        CHECK(mkdir(dir, 0755) == 0);
        FILE *jf = fopen(path_in(dir, "model.safetensors"), "w");
        fputs("partial", jf);
        fclose(jf);
        /* prune's removal of step 3, interrupted: complete-looking, but never put back */
        snprintf(dir, sizeof dir, "%s/.old-step-3-pruned", root);
        CHECK(mkdir(dir, 0755) == 0);
        jf = fopen(path_in(dir, ARL_TRAIN_STATE_FILE), "w");
        fputs("{}", jf);
        fclose(jf);
        /* an incomplete step directory, newer than all */
        snprintf(dir, sizeof dir, "%s/step-00000020", root);
        CHECK(mkdir(dir, 0755) == 0);

        /* without set_aside nothing moves */
        int64_t step = -1;
        arl_status s = arl_train_ckpt_load_newest(root, &g_cfg, NULL, &q, &b, &st2, 0, latest,
                                                  sizeof latest, &step);
        CHECK(keep == 1 ? s == ARL_ERR_NOT_FOUND : s == ARL_OK && step == 5);
        if (s == ARL_OK) arl_train_state_free(&st2);
        arl_error_clear();
        CHECK_EQ_INT(count_entries(root, ".old-"), 2);
        CHECK_EQ_INT(count_entries(root, ".tmp-"), 1);

        s = arl_train_ckpt_load_newest(root, &g_cfg, NULL, &q, &b, &st2, 1, latest, sizeof latest,
                                       &step);
        CHECK_MSG(s == ARL_OK, "keep %d: %s", keep, arl_error_msg());
        CHECK_EQ_INT(step, 10);
        CHECK(strstr(latest, "/step-00000010") != NULL);
        if (s == ARL_OK) {
            CHECK(memcmp(p.arena, q.arena, (size_t)p.inv.arena_floats * 4) == 0);
            CHECK(moments_equal(&a, &b));
            CHECK_EQ_INT(st2.step, 10);
            arl_train_state_free(&st2);
        }
        CHECK_EQ_INT(count_entries(root, ".old-"), 0);
        CHECK_EQ_INT(count_entries(root, ".tmp-"), 0);
        CHECK_EQ_INT(count_entries(root, "step-00000003"), 0);
        CHECK_EQ_INT(count_entries(root, "step-00000020"), 0);
        CHECK_EQ_INT(count_entries(root, "damaged-step-00000020"), 1);
        int64_t *steps, n;
        CHECK(arl_train_ckpt_list(root, &steps, &n) == ARL_OK);
        CHECK_EQ_INT(n, keep);
        free(steps);
        /* a complete .old- beside its step-N (the crash came after the second rename): removed */
        snprintf(dir, sizeof dir, "%s/step-00000010", root);
        snprintf(moved, sizeof moved, "%s/.old-step-00000010-Qr56St", root);
        CHECK(mkdir(moved, 0755) == 0);
        jf = fopen(path_in(moved, ARL_TRAIN_STATE_FILE), "w");
        fputs("{}", jf);
        fclose(jf);
        CHECK(arl_train_ckpt_load_newest(root, &g_cfg, NULL, &q, &b, &st2, 1, latest, sizeof latest,
                                         &step) == ARL_OK);
        CHECK_EQ_INT(step, 10);
        arl_train_state_free(&st2);
        CHECK_EQ_INT(count_entries(root, ".old-"), 0);
        /* an incomplete step-10 beside the complete one a save moved aside: the incomplete one
         * is set aside first, so the complete one goes back (not removed as a leftover) */
        snprintf(moved, sizeof moved, "%s/.old-step-00000010-Zz78Yy", root);
        CHECK(rename(dir, moved) == 0);
        CHECK(mkdir(dir, 0755) == 0);
        s = arl_train_ckpt_load_newest(root, &g_cfg, NULL, &q, &b, &st2, 1, latest, sizeof latest,
                                       &step);
        CHECK_MSG(s == ARL_OK && step == 10, "keep %d: step %lld: %s", keep, (long long)step,
                  arl_error_msg());
        if (s == ARL_OK) arl_train_state_free(&st2);
        CHECK_EQ_INT(count_entries(root, ".old-"), 0);
        CHECK_EQ_INT(count_entries(root, "damaged-step-00000010"), 1);
    }
    arl_train_state_free(&st);
    arl_adamw_free(&a);
    arl_adamw_free(&b);
    arl_model_params_free(&p);
    arl_model_params_free(&q);
}

/* Overwrite 8 bytes of file path at 3/4 of its length (inside its tensor data). */
static void change_bytes(const char *path) {
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fseek(f, (long)(sb.st_size * 3 / 4), SEEK_SET) == 0);
    CHECK(fwrite("XXXXXXXX", 1, 8, f) == 8);
    fclose(f);
}

/* Checkpoint files carry the CRC-32 of their tensor data (policy/safetensors.h
 * ARL_ST_DATA_CRC_KEY): a byte changed on disk inside a tensor of the newest checkpoint's
 * weights or moments is ARL_ERR_CORRUPT at load, and a resume sets that checkpoint aside and
 * takes the one before it (it loaded the changed weights without a word and the run went on with
 * other bits); a sharded directory's shards each carry theirs; a file without the key (another
 * writer's) is read unchecked. */
static void test_changed_byte(void) {
    const char *base = test_tmpdir("train-ckpt-crc");
    char root[1024], latest[1200], p1[1300];
    arl_model_params p, q;
    arl_adamw a, b;
    arl_train_state st, st2;
    ckpt_objects(&p, &q, &a, &b, &st);
    CHECK(arl_params_init(&p, &g_cfg, 3, 1) == ARL_OK);
    random_moments(&a, 3);
    const char *files[2] = {"model.safetensors", "optimizer.safetensors"};
    for (int k = 0; k < 2; k++) {
        snprintf(root, sizeof root, "%s/checkpoints-%d", base, k);
        for (int64_t s = 5; s <= 10; s += 5) {
            a.step = st.step = s;
            CHECK(arl_train_ckpt_save(root, &g_cfg, &p, &a, &st, 2, 0, NULL, 0) == ARL_OK);
        }
        snprintf(p1, sizeof p1, "%s/step-00000010/%s", root, files[k]);
        change_bytes(p1);
        int64_t step = -1;
        arl_status s = arl_train_ckpt_load_newest(root, &g_cfg, NULL, &q, &b, &st2, 1, latest,
                                                  sizeof latest, &step);
        CHECK_MSG(s == ARL_OK && step == 5, "%s: step %lld: %s", files[k], (long long)step,
                  arl_error_msg());
        if (s == ARL_OK) arl_train_state_free(&st2);
        CHECK_EQ_INT(count_entries(root, "damaged-step-00000010"), 1);
        /* the message names the file */
        snprintf(p1, sizeof p1, "%s/damaged-step-00000010/%s", root, files[k]);
        arl_st_file *f = NULL;
        CHECK(arl_st_file_open(p1, &f) == ARL_OK);
        CHECK(f && arl_st_file_check_data(f) == ARL_ERR_CORRUPT);
        CHECK_MSG(strstr(arl_error_msg(), "does not match the checksum written with it") &&
                      strstr(arl_error_msg(), files[k]),
                  "%s", arl_error_msg());
        arl_st_file_close(f);
    }
    /* a sharded model directory: a changed byte in its second shard */
    snprintf(root, sizeof root, "%s/sharded", base);
    CHECK(arl_checkpoint_save(root, &g_cfg, &p, 64 * 1024) == ARL_OK);
    arl_st_dir *d = NULL;
    CHECK(arl_st_dir_open(root, &d) == ARL_OK);
    const int32_t n_shards = d ? arl_st_dir_shard_count(d) : 0;
    CHECK(n_shards > 1);
    CHECK(d && arl_st_dir_check_data(d) == ARL_OK);
    if (n_shards > 1) snprintf(p1, sizeof p1, "%s", arl_st_file_path(arl_st_dir_shard(d, 1)));
    arl_st_dir_close(d);
    CHECK(arl_checkpoint_load(root, &g_cfg, &q) == ARL_OK);
    if (n_shards > 1) change_bytes(p1);
    CHECK(arl_checkpoint_load(root, &g_cfg, &q) == ARL_ERR_CORRUPT);
    /* without the key: unchecked */
    snprintf(p1, sizeof p1, "%s/plain.safetensors", base);
    arl_st_writer *w = NULL;
    const int64_t shape[1] = {1024};
    CHECK(arl_st_writer_open(p1, &w) == ARL_OK);
    CHECK(w && arl_st_writer_add_f32(w, "x", ARL_DTYPE_F32, 1, shape, p.arena) == ARL_OK);
    CHECK(w && arl_st_writer_close(w) == ARL_OK);
    change_bytes(p1);
    arl_st_file *f = NULL;
    CHECK(arl_st_file_open(p1, &f) == ARL_OK);
    CHECK(f && arl_st_file_metadata(f, ARL_ST_DATA_CRC_KEY) == NULL);
    CHECK(f && arl_st_file_check_data(f) == ARL_OK);
    arl_st_file_close(f);
    arl_train_state_free(&st);
    arl_adamw_free(&a);
    arl_adamw_free(&b);
    arl_model_params_free(&p);
    arl_model_params_free(&q);
}

int main(void) {
    if (arl_model_config_read(test_src_path("tests/train/data/micro/config.json"), &g_cfg)) {
        fprintf(stderr, "%s\n", arl_error_msg());
        return 1;
    }
    TEST_RUN(test_state_round_trip);
    TEST_RUN(test_state_refusals);
    TEST_RUN(test_optim_state);
    TEST_RUN(test_checkpoints);
    TEST_RUN(test_checkpoint_recovery);
    TEST_RUN(test_changed_byte);
    arl_model_config_free(&g_cfg);
    return test_finish();
}
