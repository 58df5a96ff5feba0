/* tests/experiments/test_sft_prefix.c: SFT with a shared prefix (experiments/sft_data.h
 * "Shared prefix", experiments/sft_model.c) on calculator demonstrations with the CPU policy
 * on the micro config:
 *   - the data split: P > 0 tokens, no target inside the prefix, every suffix is the tail of
 *     its full conversation with the same labels, and the budget counts suffix tokens;
 *   - the model: the loss of a batch of suffixes continued from the prefix's state equals the
 *     loss of the same conversations in full, for the eval forward and the train step, and the
 *     lm_head gradient (which sees the prefix only through the suffix positions' hidden
 *     states) is the same too.
 * Tolerance: the continued sequences run MLA in its absorbed form over cached latent rows and
 * KDA from a carried state, the full ones the expanded form and a fresh chunked scan: fp32
 * rounding of the same math, ~1e-7 per operation over two layers and 100s of positions, so
 * 1e-5 relative on the summed loss, and 1e-4 of the largest |entry| on lm_head gradient
 * entries (an entry is a sum over ~1000 positions with cancellation, so its own relative error
 * can be larger; measured: 2.3e-4 relative on an entry 1/6 of the largest). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "envs/builtin/teacher.h"
#include "experiments/sft.h"
#include "policy/params.h"
#include "tests/test.h"

#define NDEMO 6

static void test_prefix(void) {
    const char *dir = test_tmpdir("sft-prefix");
    char path[1024];
    snprintf(path, sizeof path, "%s/demos.jsonl", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    CHECK_EQ_INT(arl_env_demos_write("calculator", NDEMO, 77, "{\"level\": 1}", f, NULL), ARL_OK);
    fclose(f);
    arl_chat_template t;
    arl_chat_template_default(&t);
    arl_sft_data_config dc = {4096, ARL_SFT_MALFORMED_FAIL, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *df = NULL, *dp = NULL;
    CHECK_EQ_INT(arl_sft_data_open(path, &dc, &t, &df), ARL_OK);
    CHECK_EQ_INT(arl_sft_data_open_prefix(path, &dc, 1, &t, &dp), ARL_OK);
    if (!df || !dp) return;
    const int64_t P = arl_sft_data_stats(dp)->prefix_tokens;
    CHECK_EQ_INT(arl_sft_data_stats(df)->prefix_tokens, 0);
    CHECK(P > 0 && P < arl_sft_data_stats(dp)->min_tokens);
    arl_sft_batch bf, bp;
    CHECK_EQ_INT(arl_sft_batch_init(&bf, 8192), ARL_OK);
    CHECK_EQ_INT(arl_sft_batch_init(&bp, 8192), ARL_OK);
    arl_data_cursor cf, cp;
    arl_sft_data_cursor_start(df, 0, &cf);
    arl_sft_data_cursor_start(dp, 0, &cp);
    CHECK_EQ_INT(arl_sft_data_next_batch(df, &cf, 0, 8192, &bf), ARL_OK);
    CHECK_EQ_INT(arl_sft_data_next_batch(dp, &cp, 0, 8192, &bp), ARL_OK);
    CHECK_EQ_INT(bf.n_seqs, NDEMO);
    CHECK_EQ_INT(bp.n_seqs, NDEMO);
    CHECK_EQ_INT(bp.prefix_len, P);
    CHECK_EQ_INT(bp.T, bf.T - NDEMO * P);
    CHECK_EQ_INT(bp.n_targets, bf.n_targets);
    for (int64_t i = 0; i < NDEMO; i++) {
        const int64_t f0 = bf.cu_seqlens[i], p0 = bp.cu_seqlens[i];
        const int64_t np = bp.cu_seqlens[i + 1] - p0;
        CHECK_EQ_INT(bf.cu_seqlens[i + 1] - f0, np + P);
        for (int64_t k = 0; k < P; k++) {
            CHECK(bf.ids[f0 + k] == bp.prefix_ids[k]);
            CHECK(bf.labels[f0 + k] == ARL_SFT_IGNORE); /* no target in the prefix */
        }
        for (int64_t k = 0; k < np; k++) {
            CHECK(bf.ids[f0 + P + k] == bp.ids[p0 + k]);
            CHECK(bf.labels[f0 + P + k] == bp.labels[p0 + k]);
        }
    }
    /* the budget counts suffixes: a batch too small for a full conversation holds suffixes */
    arl_sft_data_cursor_start(dp, 0, &cp);
    CHECK_EQ_INT(arl_sft_data_next_batch(dp, &cp, 0, bp.T / 2 + 200, &bp), ARL_OK);
    CHECK(bp.n_seqs >= 2);
    arl_sft_data_cursor_start(dp, 0, &cp);
    CHECK_EQ_INT(arl_sft_data_next_batch(dp, &cp, 0, 8192, &bp), ARL_OK);

    /* the model */
    arl_model_config cfg;
    CHECK_EQ_INT(arl_model_config_read(test_src_path("tests/train/data/micro/config.json"), &cfg),
                 ARL_OK);
    arl_model_params p, gf, gp;
    CHECK_EQ_INT(arl_model_params_alloc(&p, &cfg), ARL_OK);
    CHECK_EQ_INT(arl_model_params_alloc(&gf, &cfg), ARL_OK);
    CHECK_EQ_INT(arl_model_params_alloc(&gp, &cfg), ARL_OK);
    CHECK_EQ_INT(arl_params_init(&p, &cfg, 3, 0), ARL_OK);
    memset(gf.arena, 0, sizeof(float) * (size_t)gf.inv.arena_floats);
    memset(gp.arena, 0, sizeof(float) * (size_t)gp.inv.arena_floats);
    const arl_sft_model_ops *ops = arl_sft_model_ops_default();
    void *wf = NULL, *wp = NULL;
    CHECK_EQ_INT(ops->create(&wf, &cfg, 8192, NDEMO, 1), ARL_OK);
    CHECK_EQ_INT(ops->create(&wp, &cfg, 8192, NDEMO, 1), ARL_OK);
    double ef = 0, ep = 0, lf = 0, lp = 0;
    CHECK_EQ_INT(ops->eval(wf, &p, &bf, &ef), ARL_OK);
    CHECK_EQ_INT(ops->eval(wp, &p, &bp, &ep), ARL_OK);
    CHECK(ef > 0);
    CHECK_CLOSE(ep, ef, 0, 1e-5);
    CHECK_EQ_INT(ops->train_step(wf, &p, &bf, 1.0, &gf, &lf, NULL), ARL_OK);
    CHECK_EQ_INT(ops->train_step(wp, &p, &bp, 1.0, &gp, &lp, NULL), ARL_OK);
    CHECK_CLOSE(lf, ef, 0, 1e-6);
    CHECK_CLOSE(lp, lf, 0, 1e-5);
    /* twice in a row (the prefix state is rebuilt, not advanced): the same loss */
    double lp2 = 0;
    CHECK_EQ_INT(ops->train_step(wp, &p, &bp, 0.0, &gp, &lp2, NULL), ARL_OK);
    CHECK_CLOSE(lp2, lp, 0, 1e-12);
    const int64_t nh = cfg.dims.V * cfg.dims.d;
    double gmax = 0;
    for (int64_t i = 0; i < nh; i++)
        gmax = fmax(gmax, fabs(gf.lm_head[i]));
    CHECK(gmax > 0);
    for (int64_t i = 0; i < nh; i++)
        CHECK_CLOSE(gp.lm_head[i], gf.lm_head[i], 1e-4 * gmax, 0);
    ops->destroy(wf);
    ops->destroy(wp);
    arl_model_params_free(&p);
    arl_model_params_free(&gf);
    arl_model_params_free(&gp);
    arl_model_config_free(&cfg);
    arl_sft_batch_free(&bf);
    arl_sft_batch_free(&bp);
    arl_sft_data_close(df);
    arl_sft_data_close(dp);
}

int main(void) {
    TEST_RUN(test_prefix);
    return test_finish();
}
