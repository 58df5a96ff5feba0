/* Checkpoint save/load (spec/policy.md section 14): bit-exact round trips (single file and
 * sharded), storage dtypes of a bf16 config, A_log padding rules, the K3 release's MXFP4
 * experts, config mismatch, one error message listing every missing, unexpected and
 * mis-shaped tensor, and replacing a checkpoint directory in one step. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/dtype.h"
#include "policy/checkpoint.h"
#include "policy/safetensors.h"
#include "tests/test.h"

static int load_tiny(arl_model_config *c, const char *obj, const char *key, const char *val) {
    json_t *j = json_load_file(test_src_path("configs/tiny/config.json"), 0, NULL);
    if (!j) return 0;
    if (key) {
        json_t *o = !strcmp(obj, "text")
                        ? json_object_get(j, "text_config")
                        : json_object_get(json_object_get(j, "text_config"), "linear_attn_config");
        json_object_set_new(o, key, json_loads(val, JSON_DECODE_ANY, NULL));
    }
    char *text = json_dumps(j, JSON_PRESERVE_ORDER);
    arl_status s = arl_model_config_parse(text, "configs/tiny/config.json", 1, c);
    free(text);
    json_decref(j);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    return s == ARL_OK;
}

static void rm_rf(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[1200];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (!lstat(p, &st) && S_ISDIR(st.st_mode))
            rm_rf(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static int count_entries(const char *dir, const char *contains) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strstr(e->d_name, contains)) n++;
    if (d) closedir(d);
    return n;
}

static void test_round_trip(void) {
    arl_model_config c;
    if (!load_tiny(&c, NULL, NULL, NULL)) return;
    arl_model_params p, q;
    CHECK(arl_model_params_alloc(&p, &c) == ARL_OK);
    CHECK(arl_params_init(&p, &c, 11, 0) == ARL_OK);
    /* A_log non-zero so that its round trip through padding is visible */
    p.layers[0].kda.A_log[0] = 0.25f;
    p.layers[0].kda.A_log[1] = -1.5f;
    size_t bytes = (size_t)p.inv.arena_floats * sizeof(float);
    char root[600], single[700], sharded[700];
    snprintf(root, sizeof root, "%s", test_tmpdir("ckpt"));
    snprintf(single, sizeof single, "%s/single", root);
    snprintf(sharded, sizeof sharded, "%s/sharded", root);

    CHECK_MSG(arl_checkpoint_save(single, &c, &p, 0) == ARL_OK, "%s", arl_error_msg());
    CHECK(count_entries(root, ".tmp-") == 0); /* the temporary directory was renamed */
    CHECK(arl_checkpoint_verify(single, &c) == ARL_OK);
    CHECK(arl_model_params_alloc(&q, &c) == ARL_OK);
    CHECK_MSG(arl_checkpoint_load(single, &c, &q) == ARL_OK, "%s", arl_error_msg());
    CHECK(!memcmp(p.arena, q.arena, bytes));
    /* the file: F32 everywhere (float32 config), A_log padded to 128 with zeros */
    arl_st_dir *d;
    CHECK(arl_st_dir_open(single, &d) == ARL_OK);
    CHECK_EQ_INT(arl_st_dir_shard_count(d), 1);
    CHECK_EQ_INT(arl_st_dir_count(d), p.inv.n);
    const arl_st_tensor *t = arl_st_dir_find(d, "language_model.model.layers.0.self_attn.A_log");
    CHECK(t && t->rank == 1 && t->shape[0] == 128 && t->dtype == ARL_DTYPE_F32);
    if (t) {
        float a[128];
        CHECK(arl_st_tensor_read_f32(t, a, 128) == ARL_OK);
        CHECK(a[0] == 0.25f && a[1] == -1.5f && a[2] == 0 && a[127] == 0);
    }
    t = arl_st_dir_find(d, "language_model.model.layers.3.self_attn.q_b_proj.weight");
    CHECK(t && t->dtype == ARL_DTYPE_F32);
    CHECK(arl_st_file_metadata(arl_st_dir_shard(d, 0), "format") &&
          !strcmp(arl_st_file_metadata(arl_st_dir_shard(d, 0), "format"), "pt"));
    arl_st_dir_close(d);
    /* config.json beside it reads back to the same config */
    arl_model_config c2;
    CHECK(arl_model_config_read(single, &c2) == ARL_OK);
    char h1[ARL_SHA256_HEX_CHARS], h2[ARL_SHA256_HEX_CHARS];
    arl_model_config_hash_hex(&c, h1);
    arl_model_config_hash_hex(&c2, h2);
    CHECK_STR_EQ(h1, h2);
    arl_model_config_free(&c2);

    /* sharded: 1 MB shards of a 12 MB checkpoint */
    CHECK_MSG(arl_checkpoint_save(sharded, &c, &p, 1u << 20) == ARL_OK, "%s", arl_error_msg());
    char idx[800];
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", sharded);
    CHECK(access(idx, F_OK) == 0);
    CHECK(count_entries(sharded, "-of-") >= 10);
    memset(q.arena, 0, bytes);
    CHECK_MSG(arl_checkpoint_load(sharded, &c, &q) == ARL_OK, "%s", arl_error_msg());
    CHECK(!memcmp(p.arena, q.arena, bytes));

    /* save again into the existing (non-empty) directory as a single file: replaced in place */
    p.embed_tokens[5] = 3.0f;
    CHECK(arl_checkpoint_save(sharded, &c, &p, 0) == ARL_OK);
    CHECK(access(idx, F_OK) != 0); /* the stale index is gone */
    CHECK(arl_checkpoint_load(sharded, &c, &q) == ARL_OK);
    CHECK(!memcmp(p.arena, q.arena, bytes));

    /* into a folder whose parents do not exist yet: made, as mkdir -p (`model init tiny
     * out/tiny` on a fresh clone); under a file: a clear error, nothing made */
    char nested[800], under_file[800];
    snprintf(nested, sizeof nested, "%s/new/deeper/ck", root);
    CHECK_MSG(arl_checkpoint_save(nested, &c, &p, 0) == ARL_OK, "%s", arl_error_msg());
    CHECK(arl_checkpoint_load(nested, &c, &q) == ARL_OK);
    CHECK(!memcmp(p.arena, q.arena, bytes));
    snprintf(under_file, sizeof under_file, "%s/config.json/ck", single);
    CHECK(arl_checkpoint_save(under_file, &c, &p, 0) == ARL_ERR_IO);
    CHECK_MSG(strstr(arl_error_msg(), "config.json") != NULL, "%s", arl_error_msg());
    arl_error_clear();

    /* a checkpoint whose config.json describes another model */
    arl_model_config other;
    if (load_tiny(&other, "text", "rms_norm_eps", "1e-06")) {
        CHECK(arl_checkpoint_load(single, &other, &q) == ARL_ERR_CONFIG);
        CHECK(strstr(arl_error_msg(), "different model") != NULL);
        arl_model_config_free(&other);
    }
    arl_model_params_free(&p);
    arl_model_params_free(&q);
    arl_model_config_free(&c);
    rm_rf(root);
}

static void test_bf16_storage(void) {
    arl_model_config c;
    if (!load_tiny(&c, "text", "dtype", "\"bfloat16\"")) return;
    arl_model_params p, q;
    CHECK(arl_model_params_alloc(&p, &c) == ARL_OK);
    CHECK(arl_model_params_alloc(&q, &c) == ARL_OK);
    CHECK(arl_params_init(&p, &c, 3, 0) == ARL_OK);
    const char *dir = test_tmpdir("ckbf16");
    char ck[700];
    snprintf(ck, sizeof ck, "%s/ck", dir);
    CHECK(arl_checkpoint_save(ck, &c, &p, 0) == ARL_OK);
    arl_st_dir *d;
    CHECK(arl_st_dir_open(ck, &d) == ARL_OK);
    for (int64_t i = 0; i < p.inv.n; i++) {
        const arl_param_tensor *t = &p.inv.t[i];
        const arl_st_tensor *s = arl_st_dir_find(d, t->name);
        CHECK_MSG(s && s->dtype == (t->fp32_storage ? ARL_DTYPE_F32 : ARL_DTYPE_BF16), "%s",
                  t->name);
    }
    arl_st_dir_close(d);
    CHECK(arl_checkpoint_load(ck, &c, &q) == ARL_OK);
    /* fp32-class tensors exact, the rest equal to the bf16 rounding of the original */
    int64_t mism = 0;
    for (int64_t i = 0; i < p.inv.n; i++) {
        const arl_param_tensor *t = &p.inv.t[i];
        const float *a = p.arena + t->offset, *b = q.arena + t->offset;
        for (int64_t j = 0; j < t->numel; j++) {
            float want = t->fp32_storage ? a[j] : arl_bf16_to_f32(arl_f32_to_bf16(a[j]));
            mism += want != b[j];
        }
    }
    CHECK_EQ_INT(mism, 0);
    arl_model_params_free(&p);
    arl_model_params_free(&q);
    arl_model_config_free(&c);
    rm_rf(dir);
}

/* ---- hand-made checkpoints ---- */

typedef enum { KEEP, SKIP, RESHAPE, AS_BF16, A_LOG_SHORT, A_LOG_BADTAIL, PACK } action;
typedef action (*chooser)(const arl_param_tensor *t, void *ctx);

/* Write params as a checkpoint (no config.json) applying per-tensor actions; `extra`
 * names an additional tensor to add (or NULL). */
static arl_status write_custom(const char *dir, const arl_model_params *p, chooser ch, void *ctx,
                               const char *extra, uint8_t *packbuf) {
    arl_st_dir_writer *w;
    ARL_TRY(arl_st_dir_writer_open(dir, 0, &w));
    static float alog[64][128];
    static float zeros[16];
    int na = 0;
    arl_status s = ARL_OK;
    for (int64_t i = 0; i < p->inv.n && !s; i++) {
        const arl_param_tensor *t = &p->inv.t[i];
        const float *src = p->arena + t->offset;
        action a = ch ? ch(t, ctx) : KEEP;
        if (a == KEEP && t->is_a_log) a = A_LOG_SHORT + 10; /* padded (default form) */
        switch ((int)a) {
        case SKIP:
            break;
        case KEEP:
            s = arl_st_dir_writer_add_f32(w, t->name, ARL_DTYPE_F32, t->rank, t->shape, src);
            break;
        case AS_BF16:
            s = arl_st_dir_writer_add_f32(w, t->name, ARL_DTYPE_BF16, t->rank, t->shape, src);
            break;
        case RESHAPE: {
            int64_t sh[4];
            memcpy(sh, t->shape, sizeof sh);
            sh[t->rank - 1] -= 1;
            s = arl_st_dir_writer_add_f32(w, t->name, ARL_DTYPE_F32, t->rank, sh, src);
            break;
        }
        case A_LOG_SHORT:
            s = arl_st_dir_writer_add_f32(w, t->name, ARL_DTYPE_F32, 1, t->shape, src);
            break;
        case A_LOG_SHORT + 10:
        case A_LOG_BADTAIL: {
            float *buf = alog[na++];
            memset(buf, 0, sizeof alog[0]);
            memcpy(buf, src, (size_t)t->numel * sizeof *buf);
            if (a == A_LOG_BADTAIL) buf[100] = 0.5f;
            int64_t n = 128;
            s = arl_st_dir_writer_add_f32(w, t->name, ARL_DTYPE_F32, 1, &n, buf);
            break;
        }
        case PACK: {
            /* weight -> weight_packed (U8 [out, in/2]) + weight_scale (U8 [out, in/32]) */
            char nm[300];
            size_t base = strlen(t->name) - strlen("weight");
            int64_t out = t->shape[0], in = t->shape[1];
            int64_t ps[2] = {out, in / 2}, ss[2] = {out, in / 32};
            snprintf(nm, sizeof nm, "%.*sweight_packed", (int)base, t->name);
            s = arl_st_dir_writer_add(w, nm, ARL_DTYPE_U8, 2, ps, packbuf);
            snprintf(nm, sizeof nm, "%.*sweight_scale", (int)base, t->name);
            if (!s) s = arl_st_dir_writer_add(w, nm, ARL_DTYPE_U8, 2, ss, packbuf + out * in / 2);
            break;
        }
        }
    }
    if (!s && extra) {
        int64_t n = 16;
        s = arl_st_dir_writer_add_f32(w, extra, ARL_DTYPE_F32, 1, &n, zeros);
    }
    if (s) {
        arl_st_dir_writer_abort(w);
        return s;
    }
    return arl_st_dir_writer_close(w);
}

typedef struct three {
    const char *skip, *reshape;
} three;

static action choose_three(const arl_param_tensor *t, void *ctx) {
    three *x = ctx;
    if (!strcmp(t->name, x->skip)) return SKIP;
    if (!strcmp(t->name, x->reshape)) return RESHAPE;
    return KEEP;
}

static action choose_many_missing(const arl_param_tensor *t, void *ctx) {
    (void)ctx;
    return t->expert >= 0 && t->expert < 20 && t->layer == 2 && strstr(t->name, ".w3.") ? SKIP
                                                                                        : KEEP;
}

static void test_reports_all_problems(void) {
    arl_model_config c;
    if (!load_tiny(&c, NULL, NULL, NULL)) return;
    arl_model_params p;
    CHECK(arl_model_params_alloc(&p, &c) == ARL_OK);
    CHECK(arl_params_init(&p, &c, 1, 0) == ARL_OK);
    const char *root = test_tmpdir("ckbad");
    char dir[700];
    snprintf(dir, sizeof dir, "%s/three", root);
    three x = {"language_model.model.layers.4.self_attn.k_proj.weight",
               "language_model.model.layers.7.self_attn.kv_b_proj.weight"};
    CHECK(write_custom(dir, &p, choose_three, &x, "language_model.model.layers.0.bogus.weight",
                       NULL) == ARL_OK);
    arl_status s = arl_checkpoint_load(dir, &c, &p);
    const char *m = arl_error_msg();
    CHECK(s == ARL_ERR_SHAPE);
    CHECK_MSG(strstr(m, "1 missing, 1 unexpected, 1 mis-shaped"), "%s", m);
    CHECK_MSG(strstr(m, x.skip) && strstr(m, x.reshape) &&
                  strstr(m, "language_model.model.layers.0.bogus.weight"),
              "%s", m);
    CHECK_MSG(strstr(m, "expected F32/BF16/F16 [192, 32], got F32 [192, 31]"), "%s", m);
    CHECK(arl_checkpoint_verify(dir, &c) == ARL_ERR_SHAPE);
    rm_rf(dir);

    /* 20 missing: the list is cut with "and N more" */
    snprintf(dir, sizeof dir, "%s/many", root);
    CHECK(write_custom(dir, &p, choose_many_missing, NULL, NULL, NULL) == ARL_OK);
    CHECK(arl_checkpoint_load(dir, &c, &p) == ARL_ERR_SHAPE);
    m = arl_error_msg();
    CHECK_MSG(strstr(m, "missing (16)") && strstr(m, "and 11 more"), "%s", m);
    rm_rf(dir);
    rmdir(root);
    arl_model_params_free(&p);
    arl_model_config_free(&c);
}

static const char *g_target;
static action choose_one(const arl_param_tensor *t, void *ctx) {
    return !strcmp(t->name, g_target) ? *(action *)ctx : KEEP;
}

static void test_dtype_and_a_log_rules(void) {
    arl_model_config c;
    if (!load_tiny(&c, NULL, NULL, NULL)) return;
    arl_model_params p, q;
    CHECK(arl_model_params_alloc(&p, &c) == ARL_OK);
    CHECK(arl_model_params_alloc(&q, &c) == ARL_OK);
    CHECK(arl_params_init(&p, &c, 2, 0) == ARL_OK);
    p.layers[1].kda.A_log[1] = 0.75f;
    size_t bytes = (size_t)p.inv.arena_floats * sizeof(float);
    const char *root = test_tmpdir("ckrules");
    char dir[700];
    action a;

    /* A_log as [H]: accepted */
    snprintf(dir, sizeof dir, "%s/short", root);
    g_target = "language_model.model.layers.1.self_attn.A_log";
    a = A_LOG_SHORT;
    CHECK(write_custom(dir, &p, choose_one, &a, NULL, NULL) == ARL_OK);
    CHECK_MSG(arl_checkpoint_load(dir, &c, &q) == ARL_OK, "%s", arl_error_msg());
    CHECK(!memcmp(p.arena, q.arena, bytes));
    rm_rf(dir);

    /* padded A_log with a non-zero tail: error naming the tensor */
    snprintf(dir, sizeof dir, "%s/tail", root);
    a = A_LOG_BADTAIL;
    CHECK(write_custom(dir, &p, choose_one, &a, NULL, NULL) == ARL_OK);
    CHECK(arl_checkpoint_load(dir, &c, &q) == ARL_ERR_CORRUPT);
    CHECK_MSG(strstr(arl_error_msg(), g_target) && strstr(arl_error_msg(), "100"), "%s",
              arl_error_msg());
    rm_rf(dir);

    /* an fp32-class tensor stored as BF16 is rejected; a BF16 matrix is accepted */
    snprintf(dir, sizeof dir, "%s/bf", root);
    g_target = "language_model.model.layers.2.self_attn.dt_bias";
    a = AS_BF16;
    CHECK(write_custom(dir, &p, choose_one, &a, NULL, NULL) == ARL_OK);
    CHECK(arl_checkpoint_load(dir, &c, &q) == ARL_ERR_SHAPE);
    CHECK_MSG(strstr(arl_error_msg(), "dt_bias (expected F32 [128], got BF16 [128])"), "%s",
              arl_error_msg());
    rm_rf(dir);
    g_target = "language_model.model.layers.2.self_attn.q_proj.weight";
    CHECK(write_custom(dir, &p, choose_one, &a, NULL, NULL) == ARL_OK);
    CHECK_MSG(arl_checkpoint_load(dir, &c, &q) == ARL_OK, "%s", arl_error_msg());
    CHECK(q.layers[2].kda.q_proj[7] == arl_bf16_to_f32(arl_f32_to_bf16(p.layers[2].kda.q_proj[7])));
    rm_rf(dir);

    /* non-finite weights */
    snprintf(dir, sizeof dir, "%s/nan", root);
    float keep = p.layers[5].moe.up_proj[3];
    p.layers[5].moe.up_proj[3] = NAN;
    CHECK(write_custom(dir, &p, NULL, NULL, NULL, NULL) == ARL_OK);
    p.layers[5].moe.up_proj[3] = keep;
    CHECK(arl_checkpoint_load(dir, &c, &q) == ARL_ERR_CORRUPT);
    CHECK(strstr(arl_error_msg(), "routed_expert_up_proj") != NULL);
    rm_rf(dir);

    /* no checkpoint at all */
    snprintf(dir, sizeof dir, "%s/none", root);
    CHECK(arl_checkpoint_load(dir, &c, &q) == ARL_ERR_NOT_FOUND);
    rmdir(root);
    arl_model_params_free(&p);
    arl_model_params_free(&q);
    arl_model_config_free(&c);
}

static void test_mxfp4_experts(void) {
    arl_model_config c;
    if (!load_tiny(&c, NULL, NULL, NULL)) return;
    arl_model_params p, q;
    CHECK(arl_model_params_alloc(&p, &c) == ARL_OK);
    CHECK(arl_model_params_alloc(&q, &c) == ARL_OK);
    CHECK(arl_params_init(&p, &c, 4, 0) == ARL_OK);
    /* expert 3 of layer 1, w2: [dz, f] = [64, 64]: packed [64, 32] bytes, scales [64, 2] */
    const int64_t out = 64, in = 64;
    uint8_t buf[64 * 32 + 64 * 2];
    for (int i = 0; i < 64 * 32; i++)
        buf[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < 64 * 2; i++)
        buf[64 * 32 + i] = (uint8_t)(120 + i % 12);
    const char *root = test_tmpdir("ckfp4");
    char dir[700];
    snprintf(dir, sizeof dir, "%s/fp4", root);
    g_target = "language_model.model.layers.1.block_sparse_moe.experts.3.w2.weight";
    action a = PACK;
    CHECK(write_custom(dir, &p, choose_one, &a, NULL, buf) == ARL_OK);
    CHECK_MSG(arl_checkpoint_load(dir, &c, &q) == ARL_OK, "%s", arl_error_msg());
    /* reference decode written from section 14.3: code = low nibble for even columns, high
     * for odd; value = E2M1(code) * 2^(scale - 127) */
    static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
    const float *w = q.layers[1].moe.w2 + 3 * 64 * 64;
    int bad = 0;
    for (int64_t o = 0; o < out; o++)
        for (int64_t col = 0; col < in; col++) {
            int byte = buf[o * (in / 2) + col / 2];
            int code = col % 2 ? byte >> 4 : byte & 15;
            int sc = buf[64 * 32 + o * (in / 32) + col / 32];
            double v = (code & 8 ? -1 : 1) * mag[code & 7] * pow(2.0, sc - 127);
            bad += (double)w[o * in + col] != v;
        }
    CHECK_EQ_INT(bad, 0);
    /* the other experts of the bank are untouched */
    CHECK(!memcmp(q.layers[1].moe.w2, p.layers[1].moe.w2, 3 * 64 * 64 * sizeof(float)));
    rm_rf(dir);
    rmdir(root);
    arl_model_params_free(&p);
    arl_model_params_free(&q);
    arl_model_config_free(&c);
}

/* Replacing a checkpoint in one step: a sharded checkpoint by a single-file one leaves no stale
 * shard, nothing beside the directory; a directory holding other files is refused, unchanged. */
static void test_replace(void) {
    arl_model_config c;
    if (!load_tiny(&c, NULL, NULL, NULL)) return;
    arl_model_params p, q;
    CHECK(arl_model_params_alloc(&p, &c) == ARL_OK);
    CHECK(arl_model_params_alloc(&q, &c) == ARL_OK);
    CHECK(arl_params_init(&p, &c, 3, 0) == ARL_OK);
    char root[600], dir[700], tmp[1200], note[800];
    snprintf(root, sizeof root, "%s", test_tmpdir("ckpt-replace"));
    snprintf(dir, sizeof dir, "%s/ck", root);
    CHECK_EQ_INT(arl_checkpoint_check_replaceable(dir), ARL_OK); /* (none yet) */
    CHECK_EQ_INT(arl_checkpoint_save(dir, &c, &p, 1u << 20), ARL_OK);
    CHECK(count_entries(dir, "-of-") >= 10);
    CHECK_EQ_INT(arl_checkpoint_check_replaceable(dir), ARL_OK);
    p.embed_tokens[7] = 2.5f;
    CHECK_EQ_INT(arl_checkpoint_tmp_create(dir, tmp, sizeof tmp), ARL_OK);
    CHECK(strstr(tmp, "/ck.tmp-") != NULL);
    CHECK_EQ_INT(arl_checkpoint_save(tmp, &c, &p, 0), ARL_OK);
    int64_t old_files = -1;
    CHECK_MSG(arl_checkpoint_commit(tmp, dir, &old_files) == ARL_OK, "%s", arl_error_msg());
    CHECK(old_files >= 12);                  /* config.json, the index and the shards */
    CHECK_EQ_INT(count_entries(dir, ""), 4); /* ., .., config.json, model.safetensors */
    CHECK_EQ_INT(count_entries(dir, "-of-") + count_entries(dir, "index"), 0);
    CHECK_EQ_INT(count_entries(root, "ck."), 0);
    CHECK_EQ_INT(arl_checkpoint_load(dir, &c, &q), ARL_OK);
    CHECK(q.embed_tokens[7] == 2.5f);
    /* a file that is not the checkpoint's: refused before and at the commit, nothing changed */
    snprintf(note, sizeof note, "%s/notes.txt", dir);
    FILE *f = fopen(note, "w");
    if (f) fclose(f);
    CHECK_EQ_INT(arl_checkpoint_check_replaceable(dir), ARL_ERR_STATE);
    CHECK(strstr(arl_error_msg(), "notes.txt") != NULL);
    CHECK_EQ_INT(arl_checkpoint_tmp_create(dir, tmp, sizeof tmp), ARL_OK);
    CHECK_EQ_INT(arl_checkpoint_save(tmp, &c, &p, 0), ARL_OK);
    CHECK_EQ_INT(arl_checkpoint_commit(tmp, dir, NULL), ARL_ERR_STATE);
    CHECK(access(note, F_OK) == 0 && access(tmp, F_OK) == 0);
    arl_checkpoint_tmp_remove(tmp);
    CHECK(access(tmp, F_OK) != 0);
    /* into a directory that does not exist: a rename */
    snprintf(dir, sizeof dir, "%s/fresh", root);
    CHECK_EQ_INT(arl_checkpoint_tmp_create(dir, tmp, sizeof tmp), ARL_OK);
    CHECK_EQ_INT(arl_checkpoint_save(tmp, &c, &p, 0), ARL_OK);
    CHECK_EQ_INT(arl_checkpoint_commit(tmp, dir, &old_files), ARL_OK);
    CHECK(old_files == -1 && access(tmp, F_OK) != 0);
    CHECK_EQ_INT(arl_checkpoint_load(dir, &c, &q), ARL_OK);
    arl_error_clear();
    arl_model_params_free(&p);
    arl_model_params_free(&q);
    arl_model_config_free(&c);
    rm_rf(root);
}

int main(void) {
    TEST_RUN(test_round_trip);
    TEST_RUN(test_replace);
    TEST_RUN(test_bf16_storage);
    TEST_RUN(test_reports_all_problems);
    TEST_RUN(test_dtype_and_a_log_rules);
    TEST_RUN(test_mxfp4_experts);
    return test_finish();
}
