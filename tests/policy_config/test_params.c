/* Parameter inventory, counts (spec/policy.md section 13: must reproduce 13.2 and 13.3
 * exactly), memory figures, the parameter arena and its named fields, and initialisation
 * (section 12.5): determinism per seed and rough statistics of each rule. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>

#include "policy/params.h"
#include "tests/test.h"

static arl_model_config load(const char *name) {
    char rel[64];
    snprintf(rel, sizeof rel, "configs/%s/config.json", name);
    arl_model_config c;
    if (arl_model_config_read(test_src_path(rel), &c)) {
        fprintf(stderr, "%s: %s\n", rel, arl_error_msg());
        exit(1);
    }
    return c;
}

/* tiny with fields changed: pairs of (object, key, JSON value) */
static int load_variant(arl_model_config *c, const char *obj, const char *key, const char *val) {
    json_t *j = json_load_file(test_src_path("configs/tiny/config.json"), 0, NULL);
    json_t *o = !strcmp(obj, "")       ? j
                : !strcmp(obj, "text") ? json_object_get(j, "text_config")
                : !strcmp(obj, "linear")
                    ? json_object_get(json_object_get(j, "text_config"), "linear_attn_config")
                    : json_object_get(j, "vision_config");
    if (val)
        json_object_set_new(o, key, json_loads(val, JSON_DECODE_ANY, NULL));
    else
        json_object_del(o, key);
    char *text = json_dumps(j, JSON_PRESERVE_ORDER);
    arl_status s = arl_model_config_parse(text, "variant", 1, c);
    free(text);
    json_decref(j);
    CHECK_MSG(s == ARL_OK, "%s.%s: %s", obj, key, arl_error_msg());
    return s == ARL_OK;
}

static void test_counts_k3(void) {
    arl_model_config c = load("kimi-k3");
    arl_param_counts k;
    arl_param_counts_compute(&c, &k);
    /* section 13.2 row by row */
    CHECK_EQ_INT(k.kda_layer, 443740384LL);
    CHECK_EQ_INT(k.component[ARL_COMP_KDA], 30618086496LL);
    CHECK_EQ_INT(k.mla_layer, 232196096LL);
    CHECK_EQ_INT(k.component[ARL_COMP_MLA], 5572706304LL);
    CHECK_EQ_INT(k.expert, 33030144LL);
    CHECK_EQ_INT(k.component[ARL_COMP_ROUTED_EXPERTS], 2722740830208LL);
    CHECK_EQ_INT(k.moe_fixed, 189927808LL);
    CHECK_EQ_INT(k.component[ARL_COMP_ROUTER], 92LL * (6422528 + 896));
    CHECK_EQ_INT(k.component[ARL_COMP_SHARED_EXPERTS], 92LL * 132120576);
    CHECK_EQ_INT(k.component[ARL_COMP_LATENT], 92LL * (51380224 + 3584));
    CHECK_EQ_INT(k.component[ARL_COMP_ROUTER] + k.component[ARL_COMP_SHARED_EXPERTS] +
                     k.component[ARL_COMP_LATENT],
                 17473358336LL);
    CHECK_EQ_INT(k.component[ARL_COMP_DENSE_FFN], 726663168LL);
    CHECK_EQ_INT(k.component[ARL_COMP_NORMS], 4021248LL);
    CHECK_EQ_INT(k.component[ARL_COMP_EMBED], 1174405120LL);
    CHECK_EQ_INT(k.component[ARL_COMP_LM_HEAD], 1174405120LL);
    CHECK_EQ_INT(k.text_total, 2779484476000LL);
    CHECK_EQ_INT(k.vision_tower, 401214464LL);
    CHECK_EQ_INT(k.projector, 46144512LL);
    CHECK_EQ_INT(k.total_params, 2779931834976LL);
    CHECK_EQ_INT(k.active_params, 104189612640LL);
    /* memory: 414 MiB of KDA state, 29 MiB conv tails, 576 latent values per MLA layer */
    arl_model_memory m;
    arl_model_memory_compute(&c, &m);
    CHECK_EQ_INT(m.kda_state_bytes, 414LL * 1024 * 1024);
    CHECK_EQ_INT(m.kda_conv_bytes, 69LL * 3 * 12288 * 3 * 4);
    CHECK_EQ_INT(m.mla_values_per_token, 24 * 576);
    CHECK_EQ_INT(m.mla_bytes_per_token_bf16, 27648);
    CHECK_EQ_INT(m.mla_bytes_1m_bf16, 27648LL * 1048576);
    CHECK_EQ_INT(m.mla_bytes_1m_fp32, 2 * 27648LL * 1048576);
    CHECK_EQ_INT(m.train_fp32_adam_bytes, 16 * 2779931834976LL);
    /* bf16 release form: fp32-class values (convs, dt_bias, o_norm, padded A_log, QB bias) at 4 B
     */
    int64_t f32 = 69LL * (3 * 12288 * 4 + 12288 + 128 + 128) + 92LL * 896;
    int64_t f32_counted = f32 - 69LL * (128 - 96);
    CHECK_EQ_INT(m.weights_bf16_bytes, 2 * (2779931834976LL - f32_counted) + 4 * f32);
    arl_model_config_free(&c);
}

static void test_counts_dev(void) {
    arl_model_config c = load("tiny");
    arl_param_counts k;
    arl_param_counts_compute(&c, &k);
    CHECK_EQ_INT(k.kda_layer, 100290);
    CHECK_EQ_INT(k.mla_layer, 59488);
    CHECK_EQ_INT(k.component[ARL_COMP_ROUTED_EXPERTS], 1376256);
    CHECK_EQ_INT(k.moe_fixed, 67664);
    CHECK_EQ_INT(k.dense_layer, 147456);
    CHECK_EQ_INT(k.component[ARL_COMP_NORMS], 6528);
    CHECK_EQ_INT(k.component[ARL_COMP_EMBED], 49152);
    CHECK_EQ_INT(k.text_total, 2822908);
    CHECK_EQ_INT(k.active_params, 1741564);
    CHECK_EQ_INT(k.vision_tower, 86976);
    CHECK_EQ_INT(k.projector, 98432);
    CHECK_EQ_INT(k.total_params, 3008316);
    arl_model_config_free(&c);

    c = load("mini");
    arl_param_counts_compute(&c, &k);
    CHECK_EQ_INT(k.kda_layer, 5526664);
    CHECK_EQ_INT(k.mla_layer, 3474048);
    CHECK_EQ_INT(k.component[ARL_COMP_ROUTED_EXPERTS], 2516582400LL);
    CHECK_EQ_INT(k.moe_fixed, 4326016);
    CHECK_EQ_INT(k.dense_layer, 12582912);
    CHECK_EQ_INT(k.component[ARL_COMP_NORMS], 162816);
    CHECK_EQ_INT(k.component[ARL_COMP_EMBED], 393216);
    CHECK_EQ_INT(k.text_total, 2767589912LL);
    CHECK_EQ_INT(k.active_params, 407900696LL);
    CHECK_EQ_INT(k.vision_tower, 3560704);
    CHECK_EQ_INT(k.projector, 2098176);
    CHECK_EQ_INT(k.total_params, 2773248792LL);
    arl_model_config_free(&c);

    /* without vision_config: total = text total, active unchanged */
    CHECK(load_variant(&c, "", "vision_config", NULL));
    arl_param_counts_compute(&c, &k);
    CHECK_EQ_INT(k.total_params, 2822908);
    CHECK_EQ_INT(k.active_params, 1741564);
    arl_model_config_free(&c);
}

/* The inventory (tensor by tensor) and the closed form agree component by component. */
static void check_inventory_matches_counts(const arl_model_config *c, const char *what) {
    arl_param_inventory inv;
    if (arl_param_inventory_build(c, &inv)) {
        CHECK_MSG(0, "%s: %s", what, arl_error_msg());
        return;
    }
    arl_param_counts k;
    arl_param_counts_compute(c, &k);
    int64_t by[ARL_COMP_COUNT_] = {0};
    for (int64_t i = 0; i < inv.n; i++)
        by[inv.t[i].component] += inv.t[i].numel;
    for (int i = 0; i < ARL_COMP_COUNT_; i++)
        CHECK_MSG(by[i] == k.component[i], "%s: component %s: inventory %lld, formula %lld", what,
                  arl_param_component_name((arl_param_component)i), (long long)by[i],
                  (long long)k.component[i]);
    CHECK_EQ_INT(inv.total_numel, k.total_params);
    CHECK(inv.arena_floats >= inv.total_numel);
    arl_param_inventory_free(&inv);
}

static void test_inventory_vs_formula(void) {
    const char *names[3] = {"tiny", "mini", "kimi-k3"};
    for (int i = 0; i < 3; i++) {
        arl_model_config c = load(names[i]);
        check_inventory_matches_counts(&c, names[i]);
        arl_model_config_free(&c);
    }
    /* the optional structures of section 13.1 */
    const struct {
        const char *obj, *key, *val;
    } v[] = {{"text", "q_lora_rank", "null"},
             {"text", "mla_use_output_gate", "false"},
             {"linear", "use_full_rank_gate", "false"},
             {"linear", "gate_lower_bound", "null"},
             {"text", "latent_moe_use_norm", "false"},
             {"text", "num_shared_experts", "0"},
             {"text", "attn_res_block_size", "null"},
             {"text", "first_k_dense_replace", "3"},
             {"", "vision_config", NULL},
             {"vision", "vt_num_hidden_layers", "0"},
             {"vision", "init_pos_emb_width", "12"},
             {"linear", "num_heads", "3"}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        arl_model_config c;
        if (!load_variant(&c, v[i].obj, v[i].key, v[i].val)) continue;
        check_inventory_matches_counts(&c, v[i].key);
        arl_model_config_free(&c);
    }
    /* spot checks of the formula's variants against hand arithmetic (tiny: d 128, P 128) */
    arl_model_config c;
    arl_param_counts k, base;
    arl_model_config t = load("tiny");
    arl_param_counts_compute(&t, &base);
    arl_model_config_free(&t);
    CHECK(load_variant(&c, "text", "q_lora_rank", "null"));
    arl_param_counts_compute(&c, &k);
    /* d*rq + rq + rq*Hm(n+r) -> d*Hm(n+r): 128*64 + 64 + 64*96 = 14400 -> 128*96 = 12288 */
    CHECK_EQ_INT(k.mla_layer, base.mla_layer - 14400 + 12288);
    arl_model_config_free(&c);
    CHECK(load_variant(&c, "text", "attn_res_block_size", "null"));
    arl_param_counts_compute(&c, &k);
    CHECK_EQ_INT(k.component[ARL_COMP_NORMS], 8 * 2 * 128 + 128);
    arl_model_config_free(&c);
    CHECK(load_variant(&c, "linear", "use_full_rank_gate", "false"));
    arl_param_counts_compute(&c, &k);
    CHECK_EQ_INT(k.kda_layer, base.kda_layer - 128 * 128 + (128 * 64 + 64 * 128));
    arl_model_config_free(&c);
}

static void test_inventory_layout(void) {
    arl_model_config c = load("tiny");
    arl_param_inventory inv;
    CHECK(arl_param_inventory_build(&c, &inv) == ARL_OK);
    /* 560 tensors: embed, lm_head, norm, 2 output AttnRes; per layer 6 norm/AttnRes vectors;
     * KDA 14 (q k v, 3 convs, f_a f_b, dt_bias A_log b_proj g_proj o_norm o_proj), MLA 8;
     * dense 3; MoE 8 + 3*16 experts; vision 2 + 6 + 1 + 3 */
    CHECK_EQ_INT(inv.n, 5 + 8 * 6 + 6 * 14 + 2 * 8 + 3 + 7 * (8 + 48) + 12);
    CHECK_STR_EQ(inv.t[0].name, "language_model.model.embed_tokens.weight");
    /* names unique, sorted index consistent, offsets disjoint and in the arena */
    for (int64_t i = 0; i < inv.n; i++) {
        CHECK_EQ_INT(arl_param_inventory_find(&inv, inv.t[i].name), i);
        if (i) CHECK(strcmp(inv.t[inv.by_name[i - 1]].name, inv.t[inv.by_name[i]].name) < 0);
        if (i) CHECK(inv.t[i].offset >= inv.t[i - 1].offset + inv.t[i - 1].numel);
        CHECK(inv.t[i].offset + inv.t[i].numel <= inv.arena_floats);
        if (inv.t[i].expert <= 0) CHECK_EQ_INT(inv.t[i].offset % 16, 0);
        CHECK_EQ_INT(inv.t[i].stored_numel, inv.t[i].is_a_log ? 128 : inv.t[i].numel);
    }
    CHECK_EQ_INT(arl_param_inventory_find(&inv, "no.such.tensor"), -1);
    int64_t a = arl_param_inventory_find(&inv, "language_model.model.layers.0.self_attn.A_log");
    CHECK(a >= 0 && inv.t[a].is_a_log && inv.t[a].rank == 1 && inv.t[a].shape[0] == 2 &&
          inv.t[a].fp32_storage && inv.t[a].component == ARL_COMP_KDA);
    int64_t b = arl_param_inventory_find(
        &inv, "language_model.model.layers.2.block_sparse_moe.gate.e_score_correction_bias");
    CHECK(b >= 0 && inv.t[b].no_grad && inv.t[b].fp32_storage && inv.t[b].init == ARL_INIT_ZEROS);
    int64_t q =
        arl_param_inventory_find(&inv, "language_model.model.layers.3.self_attn.q_b_proj.weight");
    CHECK(q >= 0 && inv.t[q].shape[0] == 2 * 48 && inv.t[q].shape[1] == 64 && inv.t[q].layer == 3);
    CHECK(arl_param_inventory_find(&inv,
                                   "language_model.model.layers.3.self_attn.q_conv1d.weight") < 0);
    int64_t pe = arl_param_inventory_find(&inv, "vision_tower.patch_embed.proj.weight");
    CHECK(pe >= 0 && inv.t[pe].rank == 4 && inv.t[pe].shape[1] == 3 && inv.t[pe].shape[3] == 14);
    CHECK(arl_param_inventory_find(&inv, "language_model.model.layers.0.mlp.gate_proj.weight") >=
          0);
    CHECK(arl_param_inventory_find(&inv, "language_model.model.layers.1.mlp.gate_proj.weight") < 0);
    /* expert banks are contiguous: e at bank + e * f * dz */
    int64_t e0 = arl_param_inventory_find(
        &inv, "language_model.model.layers.5.block_sparse_moe.experts.0.w2.weight");
    int64_t e7 = arl_param_inventory_find(
        &inv, "language_model.model.layers.5.block_sparse_moe.experts.7.w2.weight");
    CHECK(e0 >= 0 && e7 >= 0 && inv.t[e7].offset == inv.t[e0].offset + 7 * 64 * 64);
    CHECK(inv.t[e7].expert == 7 && inv.t[e7].component == ARL_COMP_ROUTED_EXPERTS);
    arl_param_inventory_free(&inv);
    arl_param_inventory_free(NULL);
    arl_model_config_free(&c);
}

static void test_named_fields(void) {
    arl_model_config c = load("tiny");
    arl_model_params p;
    CHECK(arl_model_params_alloc(&p, &c) == ARL_OK);
    CHECK(p.embed_tokens == p.arena);
    CHECK(p.embed_tokens == arl_model_params_find(&p, "language_model.model.embed_tokens.weight"));
    CHECK(p.lm_head == arl_model_params_find(&p, "language_model.lm_head.weight"));
    CHECK(p.out_res_proj ==
          arl_model_params_find(&p, "language_model.model.output_attn_res_proj.weight"));
    for (int64_t l = 0; l < c.dims.L; l++) {
        arl_layer_params *lp = &p.layers[l];
        char name[128];
        snprintf(name, sizeof name, "language_model.model.layers.%lld.mlp_res_proj.weight",
                 (long long)l);
        CHECK(lp->mlp_res_proj == arl_model_params_find(&p, name));
        if (lp->kind == ARL_LAYER_KDA) {
            snprintf(name, sizeof name, "language_model.model.layers.%lld.self_attn.A_log",
                     (long long)l);
            CHECK(lp->kda.A_log && lp->kda.A_log == arl_model_params_find(&p, name));
            CHECK(lp->kda.g_proj && !lp->kda.g_a && !lp->mla.kv_b && !lp->mla.o_proj);
        } else {
            snprintf(name, sizeof name,
                     "language_model.model.layers.%lld.self_attn.kv_b_proj.weight", (long long)l);
            CHECK(lp->mla.kv_b && lp->mla.kv_b == arl_model_params_find(&p, name));
            CHECK(lp->mla.q_a && !lp->mla.q_proj && !lp->kda.q_proj);
        }
        CHECK_EQ_INT(lp->is_moe, l >= 1);
        if (lp->is_moe) {
            CHECK(lp->moe.w1 && lp->moe.w3 && lp->moe.w2 && !lp->dense.gate_proj);
            snprintf(name, sizeof name,
                     "language_model.model.layers.%lld.block_sparse_moe.experts.9.w3.weight",
                     (long long)l);
            CHECK(lp->moe.w3 + 9 * c.dims.f * c.dims.dz == arl_model_params_find(&p, name));
        } else {
            CHECK(lp->dense.down_proj && !lp->moe.gate);
        }
    }
    CHECK(p.vision.blocks &&
          p.vision.blocks[0].fc1 ==
              arl_model_params_find(&p, "vision_tower.encoder.blocks.0.mlp.fc1.weight"));
    CHECK(p.vision.post_norm == arl_model_params_find(&p, "mm_projector.post_norm.weight"));
    /* every pointer 64-byte aligned for the non-bank tensors */
    CHECK(((uintptr_t)p.layers[3].mla.o_proj & 63) == 0);
    /* a view over another arena with the same layout (e.g. gradients) */
    float *g = calloc((size_t)p.inv.arena_floats, sizeof *g);
    arl_model_params gv;
    CHECK(arl_model_params_view(&gv, &c, g) == ARL_OK);
    CHECK(!gv.owns_arena && gv.arena == g);
    CHECK(gv.layers[5].moe.w2 - g == p.layers[5].moe.w2 - p.arena);
    CHECK(gv.vision.proj0 - g == p.vision.proj0 - p.arena);
    arl_model_params_free(&gv);
    free(g);
    /* a view without an arena: inventory only */
    CHECK(arl_model_params_view(&gv, &c, NULL) == ARL_OK);
    CHECK(gv.embed_tokens == NULL && gv.layers[0].kda.q_proj == NULL && gv.inv.n == p.inv.n);
    arl_model_params_free(&gv);
    arl_model_params_free(&p);
    arl_model_params_free(NULL);
    arl_model_config_free(&c);
}

static void test_init_determinism(void) {
    arl_model_config c = load("tiny");
    arl_model_params a, b;
    CHECK(arl_model_params_alloc(&a, &c) == ARL_OK);
    CHECK(arl_model_params_alloc(&b, &c) == ARL_OK);
    size_t bytes = (size_t)a.inv.arena_floats * sizeof(float);
    CHECK(arl_params_init(&a, &c, 7, 1) == ARL_OK);
    CHECK(arl_params_init(&b, &c, 7, 4) == ARL_OK); /* thread count does not matter */
    CHECK(!memcmp(a.arena, b.arena, bytes));
    CHECK(arl_params_init(&b, &c, 8, 0) == ARL_OK);
    CHECK(memcmp(a.arena, b.arena, bytes) != 0);
    /* each tensor has its own stream: two N(0, s^2) tensors differ, and one tensor's values do
     * not depend on the others (init of one tensor alone gives the same values) */
    CHECK(memcmp(a.layers[0].kda.q_proj, a.layers[0].kda.k_proj, 64 * sizeof(float)) != 0);
    int64_t i =
        arl_param_inventory_find(&a.inv, "language_model.model.layers.4.self_attn.v_proj.weight");
    float *one = malloc((size_t)a.inv.t[i].numel * sizeof *one);
    arl_params_init_tensor(&a.inv.t[i], &c, 7, one);
    CHECK(!memcmp(one, arl_model_params_tensor(&a, i), (size_t)a.inv.t[i].numel * sizeof *one));
    free(one);
    arl_model_params_free(&a);
    arl_model_params_free(&b);
    arl_model_config_free(&c);
}

static void stats(const float *x, int64_t n, double *mean, double *sd, float *lo, float *hi) {
    double s = 0, s2 = 0;
    *lo = x[0];
    *hi = x[0];
    for (int64_t i = 0; i < n; i++) {
        s += x[i];
        s2 += (double)x[i] * x[i];
        if (x[i] < *lo) *lo = x[i];
        if (x[i] > *hi) *hi = x[i];
    }
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
}

static void test_init_statistics(void) {
    arl_model_config c = load("tiny");
    arl_model_params p;
    CHECK(arl_model_params_alloc(&p, &c) == ARL_OK);
    CHECK(arl_params_init(&p, &c, 123, 0) == ARL_OK);
    double mean, sd;
    float lo, hi;
    /* N(0, 0.02^2) over 49,152 values: the sample std has relative standard error
     * 1/sqrt(2n) = 0.3%, so 3% is > 9 sigma; the mean's standard error is 0.02/sqrt(n) = 9e-5,
     * bound 5e-4 (> 5 sigma). */
    stats(p.embed_tokens, 384 * 128, &mean, &sd, &lo, &hi);
    CHECK_CLOSE(sd, 0.02, 0, 0.03);
    CHECK(fabs(mean) < 5e-4);
    stats(p.layers[5].moe.w1, 16 * 64 * 64, &mean, &sd, &lo, &hi);
    CHECK_CLOSE(sd, 0.02, 0, 0.03);
    stats(p.vision.pos_emb, 16 * 16 * 64, &mean, &sd, &lo, &hi);
    CHECK_CLOSE(sd, 0.02, 0, 0.03);
    for (int64_t l = 0; l < c.dims.L; l++) {
        arl_layer_params *lp = &p.layers[l];
        stats(lp->attn_res_proj, 128, &mean, &sd, &lo, &hi);
        CHECK(lo == 0 && hi == 0);
        stats(lp->mlp_res_proj, 128, &mean, &sd, &lo, &hi);
        CHECK(lo == 0 && hi == 0);
        stats(lp->input_norm, 128, &mean, &sd, &lo, &hi);
        CHECK(lo == 1 && hi == 1);
        stats(lp->attn_res_norm, 128, &mean, &sd, &lo, &hi);
        CHECK(lo == 1 && hi == 1);
        if (lp->kind == ARL_LAYER_KDA) {
            stats(lp->kda.A_log, 2, &mean, &sd, &lo, &hi);
            CHECK(lo == 0 && hi == 0); /* K3 lower-bound gate */
            stats(lp->kda.o_norm, 64, &mean, &sd, &lo, &hi);
            CHECK(lo == 1 && hi == 1);
            /* softplus(dt_bias) = tau in [1e-3, 1e-1] (fp32 rounding: 1e-6 relative) */
            for (int64_t i = 0; i < c.dims.P; i++) {
                double tau = log1p(exp((double)lp->kda.dt_bias[i]));
                CHECK(tau >= 1e-3 * (1 - 1e-5) && tau <= 1e-1 * (1 + 1e-5));
            }
            /* conv ~ U(-1/2, 1/2): var 1/12, std 0.2887; 384 values: 10% */
            stats(lp->kda.q_conv, c.dims.P * c.dims.W, &mean, &sd, &lo, &hi);
            CHECK(lo >= -0.5f && hi <= 0.5f);
            CHECK_CLOSE(sd, sqrt(1.0 / 12), 0, 0.1);
        } else {
            stats(lp->mla.q_a_norm, 64, &mean, &sd, &lo, &hi);
            CHECK(lo == 1 && hi == 1);
            stats(lp->mla.kv_a_norm, 32, &mean, &sd, &lo, &hi);
            CHECK(lo == 1 && hi == 1);
        }
        if (lp->is_moe) {
            stats(lp->moe.gate_bias, 16, &mean, &sd, &lo, &hi);
            CHECK(lo == 0 && hi == 0);
            stats(lp->moe.latent_norm, 64, &mean, &sd, &lo, &hi);
            CHECK(lo == 1 && hi == 1);
        }
    }
    stats(p.vision.blocks[0].norm1, 64, &mean, &sd, &lo, &hi);
    CHECK(lo == 1 && hi == 1);
    /* log-uniform tau: about half the values below the geometric midpoint 1e-2 */
    int below = 0;
    for (int64_t i = 0; i < c.dims.P; i++)
        below += log1p(exp((double)p.layers[0].kda.dt_bias[i])) < 1e-2;
    CHECK(below > 40 && below < 88); /* 128 draws, p = 1/2: mean 64, sd 5.7 */
    arl_model_params_free(&p);
    arl_model_config_free(&c);

    /* softplus gate (gate_lower_bound null): A_log = log U(1, 16) */
    CHECK(load_variant(&c, "linear", "gate_lower_bound", "null"));
    CHECK(arl_model_params_alloc(&p, &c) == ARL_OK);
    CHECK(arl_params_init(&p, &c, 5, 0) == ARL_OK);
    for (int64_t l = 0; l < c.dims.L; l++)
        if (p.layers[l].kind == ARL_LAYER_KDA)
            for (int h = 0; h < 2; h++)
                CHECK(p.layers[l].kda.A_log[h] >= 0 &&
                      p.layers[l].kda.A_log[h] <= (float)log(16.0));
    arl_model_params_free(&p);
    arl_model_config_free(&c);
}

static void test_too_large(void) {
    arl_model_config c = load("kimi-k3");
    arl_model_params p;
    arl_status s = arl_model_params_alloc(&p, &c); /* 11 TB of fp32 */
    CHECK(s == ARL_ERR_NOMEM);
    CHECK(strstr(arl_error_msg(), "GiB") != NULL);
    arl_model_config_free(&c);
}

int main(void) {
    TEST_RUN(test_counts_k3);
    TEST_RUN(test_counts_dev);
    TEST_RUN(test_inventory_vs_formula);
    TEST_RUN(test_inventory_layout);
    TEST_RUN(test_named_fields);
    TEST_RUN(test_init_determinism);
    TEST_RUN(test_init_statistics);
    TEST_RUN(test_too_large);
    return test_finish();
}
