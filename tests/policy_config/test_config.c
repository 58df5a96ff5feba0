/* Model config (spec/policy.md section 12): shipped configs parse; every validation rule of
 * section 12.2 rejects with a message naming the field; unknown fields give ONE warning line
 * and survive a write; "not to be written" fields are dropped; the config hash is stable,
 * matches an independent Python computation, and reacts only to listed fields; config
 * argument resolution. */
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "policy/config.h"
#include "policy/params.h"
#include "tests/test.h"

/* The whole file at path, NUL-terminated (malloc'd); NULL if it cannot be read. */
static char *slurp(const char *path) {
    char *b = NULL;
    return arl_file_read(path, 0, &b, NULL) == ARL_OK ? b : NULL;
}

static json_t *tiny_json(void) {
    json_error_t e;
    json_t *j = json_load_file(test_src_path("configs/tiny/config.json"), 0, &e);
    if (!j) {
        fprintf(stderr, "cannot read configs/tiny/config.json: %s\n", e.text);
        exit(1);
    }
    return j;
}

/* Parse a JSON document quietly; returns the status, config freed unless out given. */
static arl_status parse_json(json_t *j, arl_model_config *out) {
    char *text = json_dumps(j, JSON_PRESERVE_ORDER);
    arl_model_config c;
    arl_status s = arl_model_config_parse(text, "test.json", 1, &c);
    free(text);
    if (out)
        *out = c;
    else if (s == ARL_OK)
        arl_model_config_free(&c);
    return s;
}

static json_t *path_obj(json_t *root, const char *which) {
    if (!strcmp(which, "")) return root;
    if (!strcmp(which, "text")) return json_object_get(root, "text_config");
    if (!strcmp(which, "linear"))
        return json_object_get(json_object_get(root, "text_config"), "linear_attn_config");
    if (!strcmp(which, "vision")) return json_object_get(root, "vision_config");
    return NULL;
}

/* Set (value JSON text) or delete (value NULL) a field of tiny and expect a config error
 * whose message contains every `need` string. */
static void expect_error(const char *obj, const char *key, const char *value, arl_status code,
                         const char *need1, const char *need2) {
    json_t *j = tiny_json();
    json_t *o = path_obj(j, obj);
    if (value)
        json_object_set_new(o, key, json_loads(value, JSON_DECODE_ANY, NULL));
    else
        json_object_del(o, key);
    arl_status s = parse_json(j, NULL);
    const char *m = arl_error_msg();
    CHECK_MSG(s == code, "%s.%s = %s: status %d, want %d (%s)", obj, key,
              value ? value : "(deleted)", (int)s, (int)code, m);
    CHECK_MSG(!need1 || strstr(m, need1), "message lacks '%s': %s", need1, m);
    CHECK_MSG(!need2 || strstr(m, need2), "message lacks '%s': %s", need2, m);
    json_decref(j);
}

static void expect_ok(const char *obj, const char *key, const char *value) {
    json_t *j = tiny_json();
    json_t *o = path_obj(j, obj);
    json_object_set_new(o, key, json_loads(value, JSON_DECODE_ANY, NULL));
    arl_status s = parse_json(j, NULL);
    CHECK_MSG(s == ARL_OK, "%s.%s = %s rejected: %s", obj, key, value, arl_error_msg());
    json_decref(j);
}

static void test_shipped_configs(void) {
    const char *names[3] = {"tiny", "mini", "kimi-k3"};
    const int64_t L[3] = {8, 26, 93}, nmla[3] = {2, 7, 24};
    for (int i = 0; i < 3; i++) {
        arl_model_config c;
        char rel[64];
        snprintf(rel, sizeof rel, "configs/%s/config.json", names[i]);
        arl_status s = arl_model_config_read(test_src_path(rel), &c);
        CHECK_MSG(s == ARL_OK, "%s: %s", names[i], arl_error_msg());
        if (s) continue;
        CHECK_EQ_INT(c.dims.L, L[i]);
        CHECK_EQ_INT(c.dims.n_mla, nmla[i]);
        CHECK_EQ_INT(c.dims.n_kda, L[i] - nmla[i]);
        CHECK(c.has_vision);
        CHECK(c.ignored_fields == NULL);
        /* the last layer is MLA, layer 0 KDA, layer 3 MLA (1-based 4) */
        CHECK(arl_model_config_layer_kind(&c, L[i] - 1) == ARL_LAYER_MLA);
        CHECK(arl_model_config_layer_kind(&c, 0) == ARL_LAYER_KDA);
        CHECK(arl_model_config_layer_kind(&c, 3) == ARL_LAYER_MLA);
        CHECK(arl_model_config_layer_kind(&c, 4) == ARL_LAYER_KDA);
        CHECK(!arl_model_config_layer_is_moe(&c, 0));
        CHECK(arl_model_config_layer_is_moe(&c, 1));
        CHECK(arl_model_config_has_gate_lower_bound(&c));
        CHECK_EQ_INT(c.dims.P, c.dims.H * c.dims.dk);
        CHECK_EQ_INT(c.dims.a_log_padded, 128);
        CHECK_EQ_INT(c.dims.fs, 2 * c.dims.f);
        if (i < 2) {
            CHECK_EQ_INT(c.text.bos_token_id, 256);
            CHECK_EQ_INT(c.media_placeholder_token_id, 259);
            CHECK_STR_EQ(c.text.dtype, "float32");
            CHECK(!arl_model_config_stores_bf16(&c));
        } else {
            CHECK_EQ_INT(c.media_placeholder_token_id, 163605);
            CHECK(arl_model_config_stores_bf16(&c));
            CHECK_EQ_INT(c.dims.n_kda, 69);
        }
        /* written back unchanged: the shipped files are in the writer's format */
        char *text = slurp(test_src_path(rel));
        char *out = arl_model_config_dumps(&c);
        CHECK_MSG(text && out && !strcmp(text, out), "%s: dumps differs from the file", names[i]);
        free(text);
        free(out);
        arl_model_config_free(&c);
    }
    arl_model_config_free(NULL);
}

/* Digests computed independently with Python:
 *   json.dumps({"text_config": d["text_config"], "vision_config": d["vision_config"]},
 *              sort_keys=True, separators=(",", ":"))  -> hashlib.sha256
 * over the shipped files (which hold exactly the listed fields). */
static void test_hash_golden(void) {
    const char *names[3] = {"tiny", "mini", "kimi-k3"};
    const char *want[3] = {"478bcacdb291bfec18a7c0872bdcdfa346c32e76de2e77e67d327b2a6cb92cba",
                           "ef12f693ee4bdb44959eb386319aa7564e7a0b506d0805d1a25a2d906c4ada8b",
                           "d81d4140942287cb03a9ffc4c530c5c294ccbe1198b037717cd161edd143701a"};
    for (int i = 0; i < 3; i++) {
        arl_model_config c;
        char rel[64], hex[ARL_SHA256_HEX_CHARS];
        snprintf(rel, sizeof rel, "configs/%s/config.json", names[i]);
        if (arl_model_config_read(test_src_path(rel), &c)) {
            CHECK_MSG(0, "%s", arl_error_msg());
            continue;
        }
        arl_model_config_hash_hex(&c, hex);
        CHECK_STR_EQ(hex, want[i]);
        arl_model_config_free(&c);
    }
}

static void hash_of(json_t *j, char hex[ARL_SHA256_HEX_CHARS]) {
    arl_model_config c;
    arl_status s = parse_json(j, &c);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    if (s) {
        hex[0] = 0;
        return;
    }
    arl_model_config_hash_hex(&c, hex);
    arl_model_config_free(&c);
}

static void test_hash_sensitivity(void) {
    char base[ARL_SHA256_HEX_CHARS], h[ARL_SHA256_HEX_CHARS];
    json_t *j = tiny_json();
    hash_of(j, base);
    /* unknown fields and top-level fields: no change */
    json_object_set_new(json_object_get(j, "text_config"), "some_future_field", json_integer(5));
    json_object_set_new(j, "quantization_config", json_pack("{s:s}", "format", "x"));
    json_object_set_new(j, "ignore_index", json_integer(-1));
    json_object_set_new(json_object_get(j, "vision_config"), "unused", json_true());
    hash_of(j, h);
    CHECK_STR_EQ(h, base);
    /* an integral float written as an integer is the same config */
    json_object_set_new(json_object_get(j, "text_config"), "activation_situ_beta", json_integer(4));
    hash_of(j, h);
    CHECK_STR_EQ(h, base);
    json_decref(j);
    /* listed fields: each change changes the hash */
    const struct {
        const char *obj, *key, *value;
    } cases[] = {
        {"text", "rms_norm_eps", "1e-06"},           {"text", "use_cache", "false"},
        {"text", "max_position_embeddings", "4096"}, {"text", "model_type", "\"other\""},
        {"linear", "gate_lower_bound", "-4.0"},      {"linear", "gate_lower_bound", "null"},
        {"vision", "projector_ln_eps", "1e-06"},     {"vision", "init_pos_emb_time", "2"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        j = tiny_json();
        json_object_set_new(path_obj(j, cases[i].obj), cases[i].key,
                            json_loads(cases[i].value, JSON_DECODE_ANY, NULL));
        hash_of(j, h);
        CHECK_MSG(strcmp(h, base) != 0, "changing %s.%s did not change the hash", cases[i].obj,
                  cases[i].key);
        json_decref(j);
    }
    /* no vision_config: a different (text-only) hash */
    j = tiny_json();
    json_object_del(j, "vision_config");
    hash_of(j, h);
    CHECK(strcmp(h, base) != 0);
    arl_model_config c;
    CHECK(parse_json(j, &c) == ARL_OK);
    char *canon = arl_model_config_canonical_json(&c);
    CHECK(canon && !strstr(canon, "vision_config") && !strncmp(canon, "{\"text_config\":{", 16));
    free(canon);
    arl_model_config_free(&c);
    json_decref(j);
}

static void test_canonical_number_format(void) {
    arl_model_config c;
    json_t *j = tiny_json();
    CHECK(parse_json(j, &c) == ARL_OK);
    char *canon = arl_model_config_canonical_json(&c);
    /* Python json.dumps forms */
    CHECK(canon && strstr(canon, "\"rms_norm_eps\":1e-05"));
    CHECK(canon && strstr(canon, "\"gate_lower_bound\":-5.0"));
    CHECK(canon && strstr(canon, "\"initializer_range\":0.02"));
    CHECK(canon && strstr(canon, "\"activation_situ_linear_beta\":25.0"));
    CHECK(canon && strstr(canon, "\"full_attn_layers\":[4,8]"));
    free(canon);
    /* more values through the same formatter: set and read back */
    const char *vals[] = {"0.0001", "1e+16", "1234567.5", "0.1", "1e-07", "123456789012345.0"};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        c.text.routed_scaling_factor = strtod(vals[i], NULL);
        canon = arl_model_config_canonical_json(&c);
        char want[64];
        snprintf(want, sizeof want, "\"routed_scaling_factor\":%s,", vals[i]);
        CHECK_MSG(canon && strstr(canon, want), "want %s", want);
        free(canon);
    }
    arl_model_config_free(&c);
    json_decref(j);
}

/* Capture stderr while parsing with warnings on. */
static void test_unknown_fields_warn_once_and_survive(void) {
    json_t *j = tiny_json();
    json_object_set_new(j, "quantization_config",
                        json_pack("{s:s,s:i}", "format", "mxfp4-pack-quantized", "group_size", 32));
    json_object_set_new(json_object_get(j, "text_config"), "foo_bar", json_integer(1));
    json_object_set_new(json_object_get(j, "text_config"), "rope_theta", json_real(50000.0));
    json_object_set_new(json_object_get(j, "text_config"), "num_experts_per_tok", json_integer(4));
    json_object_set_new(path_obj(j, "linear"), "lin_extra", json_integer(2));
    json_object_set_new(path_obj(j, "vision"), "zzz", json_string("x"));
    char *text = json_dumps(j, JSON_PRESERVE_ORDER);
    const char *dir = test_tmpdir("cfgwarn");
    char logpath[600];
    snprintf(logpath, sizeof logpath, "%s/stderr.txt", dir);
    fflush(stderr);
    int saved = dup(2);
    int fd = open(logpath, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    dup2(fd, 2);
    close(fd);
    arl_model_config c;
    arl_status s = arl_model_config_parse(text, "warn.json", 0, &c);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    free(text);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    char *log = slurp(logpath);
    int lines = 0;
    for (char *p = log; p && *p; p++)
        lines += *p == '\n';
    CHECK_EQ_INT(lines, 1);
    const char *names[] = {"quantization_config",
                           "text_config.foo_bar",
                           "text_config.rope_theta",
                           "text_config.num_experts_per_tok",
                           "text_config.linear_attn_config.lin_extra",
                           "vision_config.zzz"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        CHECK_MSG(log && strstr(log, names[i]), "warning lacks %s: %s", names[i], log);
        CHECK(c.ignored_fields && strstr(c.ignored_fields, names[i]));
    }
    free(log);
    if (s) {
        json_decref(j);
        return;
    }
    /* written back: unknown fields kept, "not to be written" fields dropped */
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    CHECK(arl_model_config_write(&c, path) == ARL_OK);
    char *out = slurp(path);
    CHECK(out && strstr(out, "\"quantization_config\""));
    CHECK(out && strstr(out, "\"mxfp4-pack-quantized\""));
    CHECK(out && strstr(out, "\"foo_bar\": 1"));
    CHECK(out && strstr(out, "\"lin_extra\": 2"));
    CHECK(out && strstr(out, "\"zzz\": \"x\""));
    CHECK(out && !strstr(out, "rope_theta"));
    CHECK(out && !strstr(out, "num_experts_per_tok\""));
    /* and it reads back to the same config */
    arl_model_config c2;
    CHECK(arl_model_config_parse(out, path, 1, &c2) == ARL_OK);
    char h1[ARL_SHA256_HEX_CHARS], h2[ARL_SHA256_HEX_CHARS];
    arl_model_config_hash_hex(&c, h1);
    arl_model_config_hash_hex(&c2, h2);
    CHECK_STR_EQ(h1, h2);
    arl_model_config_free(&c2);
    free(out);
    /* an in-memory change is written */
    c.text.max_position_embeddings = 2048;
    CHECK(arl_model_config_write(&c, path) == ARL_OK);
    out = slurp(path);
    CHECK(out && strstr(out, "\"max_position_embeddings\": 2048"));
    free(out);
    /* copies are deep */
    arl_model_config cp;
    CHECK(arl_model_config_copy(&cp, &c) == ARL_OK);
    arl_model_config_free(&c);
    CHECK_EQ_INT(cp.text.linear_attn_config.kda_layers.n, 6);
    CHECK_EQ_INT(cp.text.linear_attn_config.kda_layers.v[5], 7);
    char *d2 = arl_model_config_dumps(&cp);
    CHECK(d2 && strstr(d2, "foo_bar"));
    free(d2);
    arl_model_config_free(&cp);
    unlink(path);
    unlink(logpath);
    rmdir(dir);
    json_decref(j);
}

/* Sizes a config may not have: an integer beyond 32 bits, a model beyond 2^50 parameters, one
 * whose counts overflow int64 (they stop at INT64_MAX instead; before, vocab_size 2^62 passed
 * validation and the parameter counts overflowed). */
static void test_size_limits(void) {
    expect_error("text", "vocab_size", "4611686018427387904", ARL_ERR_CONFIG,
                 "text_config.vocab_size", "outside [-2^31, 2^31)");
    expect_error("text", "hidden_size", "2147483648", ARL_ERR_CONFIG, "text_config.hidden_size",
                 "outside");
    expect_error("linear", "kda_layers", "[1, 2, 3, 5, 6, 7, -4294967296]", ARL_ERR_CONFIG,
                 "kda_layers", "element 6");
    expect_ok("text", "vocab_size", "2147483647"); /* 2^38 parameters: exact counts */
    json_t *j = tiny_json();
    json_object_set_new(j, "vision_config", json_null());
    json_t *tc = path_obj(j, "text");
    arl_model_config c;
    CHECK(parse_json(j, &c) == ARL_OK);
    arl_param_counts small;
    arl_param_counts_compute(&c, &small);
    arl_model_config_free(&c);
    /* V (2^31 - 1) x d (2^20) twice (embedding and head): over 2^50 */
    json_object_set_new(tc, "vocab_size", json_integer(2147483647));
    json_object_set_new(tc, "hidden_size", json_integer(1 << 20));
    CHECK(parse_json(j, NULL) == ARL_ERR_CONFIG);
    CHECK_MSG(strstr(arl_error_msg(), "parameters, more than the 2^50 handled"), "%s",
              arl_error_msg());
    /* every expert 3 x (2^31 - 1)^2 values, 2^31 - 1 experts a layer: beyond 2^63 */
    json_object_set_new(tc, "num_experts", json_integer(2147483647));
    json_object_set_new(tc, "moe_intermediate_size", json_integer(2147483647));
    json_object_set_new(tc, "routed_expert_hidden_size", json_integer(2147483647));
    CHECK(parse_json(j, NULL) == ARL_ERR_CONFIG);
    CHECK_MSG(strstr(arl_error_msg(), "more than 2^63 parameters"), "%s", arl_error_msg());
    json_decref(j);
    /* a large valid model's counts are exact: tiny with a 2^31 - 1 vocabulary */
    j = tiny_json();
    json_object_set_new(j, "vision_config", json_null());
    json_object_set_new(path_obj(j, "text"), "vocab_size", json_integer(2147483647));
    CHECK(parse_json(j, &c) == ARL_OK);
    arl_param_counts big;
    arl_param_counts_compute(&c, &big);
    const int64_t more = 2 * (2147483647LL - 384) * 128; /* embedding and head rows */
    CHECK(big.total_params == small.total_params + more);
    CHECK(big.active_params == small.active_params + more / 2); /* the embedding is not active */
    arl_model_config_free(&c);
    json_decref(j);
}

static void test_validation_errors(void) {
    /* missing and wrongly typed fields name the JSON path */
    expect_error("text", "hidden_size", NULL, ARL_ERR_CONFIG, "text_config.hidden_size", "missing");
    expect_error("linear", "num_heads", NULL, ARL_ERR_CONFIG,
                 "text_config.linear_attn_config.num_heads", "missing");
    expect_error("text", "hidden_size", "\"128\"", ARL_ERR_CONFIG, "text_config.hidden_size",
                 "expected an integer");
    expect_error("text", "hidden_size", "128.0", ARL_ERR_CONFIG, "text_config.hidden_size", NULL);
    expect_error("text", "hidden_size", "-4", ARL_ERR_CONFIG, "text_config.hidden_size",
                 "positive");
    expect_error("text", "rms_norm_eps", "\"x\"", ARL_ERR_CONFIG, "text_config.rms_norm_eps",
                 "a number");
    expect_error("text", "mla_use_output_gate", "1", ARL_ERR_CONFIG,
                 "text_config.mla_use_output_gate", "true or false");
    expect_error("vision", "vt_hidden_size", NULL, ARL_ERR_CONFIG, "vision_config.vt_hidden_size",
                 NULL);
    expect_error("", "text_config", NULL, ARL_ERR_CONFIG, "text_config", "missing");
    expect_error("text", "linear_attn_config", "[]", ARL_ERR_CONFIG,
                 "text_config.linear_attn_config", "object");
    expect_error("linear", "kda_layers", "[1, \"2\"]", ARL_ERR_CONFIG, "kda_layers", "element 1");
    /* layer lists: overlap, gap, out of range, duplicate */
    expect_error("linear", "kda_layers", "[1, 2, 3, 4, 5, 6, 7]", ARL_ERR_CONFIG, "kda_layers",
                 "disjoint");
    expect_error("linear", "kda_layers", "[1, 2, 3, 5, 6]", ARL_ERR_CONFIG, "layer 7", "neither");
    expect_error("linear", "full_attn_layers", "[4, 9]", ARL_ERR_CONFIG, "full_attn_layers",
                 "[1, 8]");
    expect_error("linear", "full_attn_layers", "[4, 8, 0]", ARL_ERR_CONFIG, "full_attn_layers",
                 NULL);
    expect_error("linear", "kda_layers", "[1, 2, 2, 3, 5, 6, 7]", ARL_ERR_CONFIG, "kda_layers",
                 "twice");
    /* section 12.2 rules */
    expect_error("text", "mla_use_nope", "false", ARL_ERR_CONFIG, "text_config.mla_use_nope",
                 "RoPE");
    expect_error("text", "moe_layer_freq", "2", ARL_ERR_CONFIG, "moe_layer_freq", NULL);
    expect_error("text", "num_key_value_heads", "1", ARL_ERR_CONFIG, "num_key_value_heads", NULL);
    expect_error("text", "moe_router_activation_func", "\"softmax\"", ARL_ERR_CONFIG,
                 "moe_router_activation_func", "sigmoid");
    expect_error("text", "moe_renormalize", "false", ARL_ERR_CONFIG, "moe_renormalize", NULL);
    expect_error("text", "num_expert_group", "2", ARL_ERR_CONFIG, "num_expert_group", NULL);
    expect_error("text", "topk_group", "2", ARL_ERR_CONFIG, "topk_group", NULL);
    expect_error("text", "num_experts_per_token", "16", ARL_ERR_CONFIG, "num_experts_per_token",
                 "0 < k < 16");
    expect_error("text", "num_experts_per_token", "17", ARL_ERR_CONFIG, "num_experts_per_token",
                 NULL);
    expect_error("text", "num_experts_per_token", "0", ARL_ERR_CONFIG, "num_experts_per_token",
                 NULL);
    expect_error("linear", "gate_lower_bound", "0.0", ARL_ERR_CONFIG, "gate_lower_bound",
                 "[-5, 0)");
    expect_error("linear", "gate_lower_bound", "-5.5", ARL_ERR_CONFIG, "gate_lower_bound", NULL);
    expect_error("text", "attn_res_block_size", "0", ARL_ERR_CONFIG, "attn_res_block_size", NULL);
    expect_error("text", "q_lora_rank", "0", ARL_ERR_CONFIG, "q_lora_rank", NULL);
    expect_error("text", "q_lora_rank", NULL, ARL_ERR_CONFIG, "q_lora_rank", "missing");
    expect_error("vision", "merge_kernel_size", "[3, 3]", ARL_ERR_CONFIG,
                 "vision_config.merge_kernel_size", "[2, 2]");
    expect_error("vision", "text_hidden_size", "64", ARL_ERR_CONFIG,
                 "vision_config.text_hidden_size", NULL);
    expect_error("vision", "mm_hidden_size", "32", ARL_ERR_CONFIG, "vision_config.mm_hidden_size",
                 NULL);
    expect_error("vision", "linear_bias", "true", ARL_ERR_CONFIG, "vision_config.linear_bias",
                 NULL);
    expect_error("text", "tie_word_embeddings", "true", ARL_ERR_CONFIG,
                 "text_config.tie_word_embeddings", NULL);
    expect_error("text", "num_nextn_predict_layers", "1", ARL_ERR_CONFIG,
                 "num_nextn_predict_layers", NULL);
    expect_error("text", "bos_token_id", "384", ARL_ERR_CONFIG, "text_config.bos_token_id",
                 "[0, 384)");
    expect_error("", "media_placeholder_token_id", "1000", ARL_ERR_CONFIG,
                 "media_placeholder_token_id", NULL);
    expect_error("text", "hidden_act", "\"gelu\"", ARL_ERR_CONFIG, "hidden_act", NULL);
    expect_error("text", "dtype", "\"float8\"", ARL_ERR_CONFIG, "text_config.dtype", NULL);
    expect_error("text", "model_type",
                 "\"a string longer than sixty-three bytes, which does not "
                 "fit in the field of the struct\"",
                 ARL_ERR_CONFIG, "text_config.model_type", "at most");
    /* valid variants */
    expect_ok("linear", "gate_lower_bound", "null");
    expect_ok("linear", "gate_lower_bound", "-5");
    expect_ok("text", "attn_res_block_size", "null");
    expect_ok("text", "q_lora_rank", "null");
    expect_ok("", "vision_config", "null");
    expect_ok("text", "num_shared_experts", "0");
    expect_ok("text", "first_k_dense_replace", "0");
    /* not JSON / not an object */
    arl_model_config c;
    CHECK(arl_model_config_parse("{\"a\": ", "bad.json", 1, &c) == ARL_ERR_FORMAT);
    CHECK(strstr(arl_error_msg(), "bad.json") != NULL);
    CHECK(arl_model_config_parse("[1]", "arr.json", 1, &c) == ARL_ERR_CONFIG);
    CHECK(arl_model_config_parse("{\"a\": 1, \"a\": 2}", "dup.json", 1, &c) == ARL_ERR_FORMAT);
}

static void test_validate_in_memory(void) {
    arl_model_config c;
    CHECK(arl_model_config_read(test_src_path("configs/tiny"), &c) == ARL_OK);
    c.text.num_experts_per_token = c.text.num_experts;
    CHECK(arl_model_config_validate(&c) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "num_experts_per_token") != NULL);
    c.text.num_experts_per_token = 2;
    CHECK(arl_model_config_validate(&c) == ARL_OK);
    c.text.attn_res_block_size = 0; /* null */
    CHECK(arl_model_config_validate(&c) == ARL_OK);
    CHECK_EQ_INT(c.dims.B, 0);
    arl_model_config_free(&c);
}

static void test_resolve(void) {
    char out[1024];
    CHECK(arl_model_config_resolve(test_src_path("configs/tiny/config.json"), out, sizeof out) ==
          ARL_OK);
    CHECK(arl_model_config_resolve(test_src_path("configs/mini"), out, sizeof out) == ARL_OK);
    CHECK(strstr(out, "configs/mini/config.json") != NULL);
    /* a shipped name through $AGENTRL_CONFIG_DIR */
    const char *dir = test_tmpdir("cfgres");
    char sub[700], file[800];
    snprintf(sub, sizeof sub, "%s/custom", dir);
    mkdir(sub, 0755);
    snprintf(file, sizeof file, "%s/config.json", sub);
    char *text = slurp(test_src_path("configs/tiny/config.json"));
    FILE *f = fopen(file, "wb");
    fputs(text, f);
    fclose(f);
    free(text);
    setenv("AGENTRL_CONFIG_DIR", dir, 1);
    CHECK(arl_model_config_resolve("custom", out, sizeof out) == ARL_OK);
    CHECK_STR_EQ(out, file);
    arl_model_config c;
    CHECK(arl_model_config_load("custom", &c) == ARL_OK);
    CHECK_EQ_INT(c.dims.d, 128);
    arl_model_config_free(&c);
    CHECK(arl_model_config_resolve("no-such-config", out, sizeof out) == ARL_ERR_NOT_FOUND);
    CHECK(strstr(arl_error_msg(), "AGENTRL_CONFIG_DIR") != NULL);
    CHECK(strstr(arl_error_msg(), dir) != NULL);
    CHECK(arl_model_config_resolve("/nonexistent/x.json", out, sizeof out) == ARL_ERR_NOT_FOUND);
    CHECK(arl_model_config_resolve(dir, out, sizeof out) == ARL_ERR_NOT_FOUND); /* no config.json */
    unsetenv("AGENTRL_CONFIG_DIR");
    /* shipped names from the working directory (tests run at the repo root) */
    if (!chdir(test_src_path("."))) {
        CHECK(arl_model_config_resolve("kimi-k3", out, sizeof out) == ARL_OK);
        CHECK_STR_EQ(out, "configs/kimi-k3/config.json");
    }
    unlink(file);
    rmdir(sub);
    rmdir(dir);
}

int main(void) {
    TEST_RUN(test_shipped_configs);
    TEST_RUN(test_hash_golden);
    TEST_RUN(test_hash_sensitivity);
    TEST_RUN(test_canonical_number_format);
    TEST_RUN(test_unknown_fields_warn_once_and_survive);
    TEST_RUN(test_validation_errors);
    TEST_RUN(test_size_limits);
    TEST_RUN(test_validate_in_memory);
    TEST_RUN(test_resolve);
    return test_finish();
}
