/* tests/golden/test_data.c: the committed golden data itself - every case of spec/policy.md
 * 16.2 has its file, every F32 copy NAME.f32 is exactly the F64 reference NAME rounded to
 * nearest, and the sizes the other golden tests rely on are there.  It catches a truncated or
 * stale commit of tests/golden/data (e.g. a Git LFS pointer instead of the file).
 */
#include <string.h>

#include "policy/safetensors.h"
#include "tests/golden/golden.h"
#include "tests/test.h"

static const char *const CASES[] = {
    "kda_recurrent", "kda_chunk_16",      "kda_chunk_64", "kda_varlen",
    "kda_gate_k3",   "kda_gate_softplus", "kda_layer",    "l2norm",
    "rmsnorm_gated", "short_conv",        "mla_prefill",  "mla_decode_absorbed",
    "attnres_mix",   "attnres_stack",     "router",       "situ",
    "latent_moe",    "qb_exact",          "qb_hist",      "qb_band",
    "vision_front",  "model_tiny"};

static void test_golden_files(void) {
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        golden_case *gc = golden_open(CASES[c]);
        const arl_st_file *f = golden_file(gc);
        int64_t n = arl_st_file_count(f), copies = 0;
        CHECK_MSG(n > 0, "%s: no tensors", CASES[c]);
        for (int64_t i = 0; i < n; i++) {
            const arl_st_tensor *t = arl_st_file_tensor(f, i);
            size_t len = strlen(t->name);
            if (len < 5 || strcmp(t->name + len - 4, ".f32") != 0) continue;
            char base[512];
            snprintf(base, sizeof base, "%.*s", (int)(len - 4), t->name);
            const arl_st_tensor *r = arl_st_file_find(f, base);
            CHECK_MSG(r && r->dtype == ARL_DTYPE_F64 && t->dtype == ARL_DTYPE_F32 &&
                          r->numel == t->numel,
                      "%s: %s has no matching F64 reference", CASES[c], t->name);
            if (!r || r->numel != t->numel) continue;
            const double *ref = golden_f64(gc, base, r->numel);
            const float *cp = golden_f32(gc, base, t->numel);
            int64_t bad = 0;
            for (int64_t j = 0; j < t->numel; j++)
                bad += (float)ref[j] != cp[j];
            CHECK_MSG(bad == 0, "%s: %s: %lld elements are not the rounded reference", CASES[c],
                      t->name, (long long)bad);
            copies++;
        }
        CHECK_MSG(copies > 0, "%s: no F32 copies", CASES[c]);
        golden_close(gc);
    }
}

/* model_tiny is a full tiny checkpoint: spot-check keys and shapes of spec 14.2. */
static void test_model_tiny_keys(void) {
    golden_case *gc = golden_open("model_tiny");
    int64_t shape[8];
    int32_t rank;
    CHECK_EQ_INT(golden_numel(gc, "language_model.model.embed_tokens.weight", shape, &rank),
                 384 * 128);
    CHECK_EQ_INT(golden_numel(gc, "language_model.model.layers.0.self_attn.A_log", shape, &rank),
                 128); /* zero-padded to ceil(H/128)*128 */
    CHECK_EQ_INT(
        golden_numel(gc, "language_model.model.layers.0.self_attn.q_conv1d.weight", shape, &rank),
        128 * 4);
    CHECK_EQ_INT(rank, 3);
    CHECK_EQ_INT(
        golden_numel(gc, "language_model.model.layers.3.self_attn.kv_b_proj.weight", NULL, NULL),
        2 * (32 + 64) * 32);
    CHECK_EQ_INT(golden_numel(gc,
                              "language_model.model.layers.7.block_sparse_moe.experts.15.w2.weight",
                              NULL, NULL),
                 64 * 64);
    CHECK(golden_has(gc, "grad.language_model.lm_head.weight"));
    CHECK(golden_has(gc, "vision_tower.patch_embed.pos_emb.weight"));
    CHECK_EQ_INT(golden_numel(gc, "decode_logits", NULL, NULL), 16 * 384);
    golden_close(gc);
}

int main(void) {
    TEST_RUN(test_golden_files);
    TEST_RUN(test_model_tiny_keys);
    return test_finish();
}
