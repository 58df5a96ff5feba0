/* tests/policy_model/test_model_equiv.c: equivalences of the model's execution paths on the
 * tiny model with the model_tiny golden weights (spec/policy.md 3.5, 4.2, 4.4, 4.5):
 *   - a full forward over N + M tokens = prefill of N then M one-token decode steps
 *     = export after N, import into another state, then M steps (the import reproduces the
 *     state bit for bit, so those steps must be bit-identical to the direct ones);
 *   - a packed batch with ragged lengths = each sequence alone;
 *   - prefill in chunks of several sizes (absorbed MLA over the cache, KDA from the slot's
 *     state) = one forward; mixed batches of prefill chunks and decode tokens;
 *   - continuous batching: sequences join and leave between steps;
 *   - forced routes equal to the natural ones reproduce the forward bit for bit;
 *   - block-sparse MLA selecting every chunk = dense; sparse prefill = sparse decode;
 *   - KDA chunk lengths 16 and 64 agree; repeated runs are bit-identical.
 *
 * Tolerance: spec 16.4 whole-model form, max|ref| over each compared block of logits, atol 0,
 * rtol 1e-4.  The paths differ only in fp32 rounding (chunkwise vs recurrent KDA, expanded vs
 * absorbed MLA, GEMM blocking by row count), which gives ~1e-6 relative; a wrong state, cache
 * row, conv tail or document boundary gives errors of order max|ref|.
 */
#include <math.h>

#include "core/rng.h"
#include "kernels/threadpool.h"
#include "tests/policy_model/tiny.h"

#define RTOL 1e-4

static tiny_model TM;

static int32_t *rand_tokens(uint64_t seed, int64_t n) {
    arl_rng r;
    arl_rng_seed(&r, seed);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    t[0] = 256; /* <|bos|> */
    for (int64_t i = 1; i < n; i++)
        t[i] = (int32_t)arl_rng_below(&r, 266);
    return t;
}

/* logits (n, V) of one fresh document. */
static void full_logits(arl_model *m, const int32_t *tok, int64_t n, float *logits) {
    arl_batch b = {.tokens = tok, .T = n};
    arl_forward_out o = {.logits = logits};
    arl_status s = arl_model_forward(m, &b, &o);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
}

static void cmp(const char *what, const float *a, const float *ref, int64_t n) {
    check_close_maxref_f32(what, a, ref, (size_t)n, 0.0, RTOL);
}

static int64_t count_diff(const void *a, const void *b, size_t bytes) {
    const uint8_t *x = a, *y = b;
    int64_t n = 0;
    for (size_t i = 0; i < bytes; i++)
        n += x[i] != y[i];
    return n;
}

static void test_prefill_decode_export(void) {
    const int64_t V = TM.cfg.dims.V, N0 = 70, M = 12, n = N0 + M; /* N0 crosses a KDA chunk */
    int32_t *tok = rand_tokens(11, n);
    arl_model m;
    tiny_model_init(&m, &TM, 128, 8);
    float *ref = malloc(sizeof(float) * n * V);
    full_logits(&m, tok, n, ref);

    arl_decode_state st, st2;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 2, 1024) == ARL_OK);
    CHECK(arl_decode_state_init(&st2, &TM.cfg, 3, 1024) == ARL_OK);
    int32_t a, b0, b;
    CHECK(arl_decode_state_join(&st, &a) == ARL_OK);
    float *pre = malloc(sizeof(float) * N0 * V), *last = malloc(sizeof(float) * V);
    CHECK(arl_model_prefill(&m, &st, a, tok, N0, NULL, 0, pre, last) == ARL_OK);
    cmp("prefill rows vs full forward", pre, ref, N0 * V);
    CHECK_EQ_INT(count_diff(last, pre + (N0 - 1) * V, sizeof(float) * V), 0);

    /* export after N0, import into slot 1 of another state */
    uint8_t *blob;
    size_t len;
    CHECK(arl_decode_state_export_alloc(&st, a, &blob, &len) == ARL_OK);
    CHECK_EQ_INT(len, arl_decode_state_export_size(&st, a));
    CHECK(arl_decode_state_join(&st2, &b0) == ARL_OK);
    CHECK(arl_decode_state_join(&st2, &b) == ARL_OK);
    arl_status s = arl_decode_state_import(&st2, b, blob, len);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(arl_decode_state_position(&st2, b), N0);
    uint8_t *blob2;
    size_t len2;
    CHECK(arl_decode_state_export_alloc(&st2, b, &blob2, &len2) == ARL_OK);
    CHECK(len2 == len && count_diff(blob, blob2, len) == 0); /* round trip is exact */

    float *dec = malloc(sizeof(float) * M * V), *dec2 = malloc(sizeof(float) * M * V);
    for (int64_t i = 0; i < M; i++) {
        CHECK(arl_model_decode_step(&m, &st, &a, 1, tok + N0 + i, dec + i * V, NULL) == ARL_OK);
        CHECK(arl_model_decode_step(&m, &st2, &b, 1, tok + N0 + i, dec2 + i * V, NULL) == ARL_OK);
    }
    cmp("decode steps vs full forward", dec, ref + N0 * V, M * V);
    CHECK_EQ_INT(count_diff(dec, dec2, sizeof(float) * M * V), 0);
    CHECK_EQ_INT(arl_decode_state_position(&st, a), n);
    free(blob);
    free(blob2);
    free(dec);
    free(dec2);
    free(pre);
    free(last);
    free(ref);
    free(tok);
    arl_decode_state_free(&st);
    arl_decode_state_free(&st2);
    arl_model_free(&m);
}

static void test_ragged_batch(void) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t V = dm->V;
    const int32_t lens[4] = {7, 66, 1, 41}; /* crosses the chunk length, includes 1 token */
    int32_t cu[5] = {0};
    for (int i = 0; i < 4; i++)
        cu[i + 1] = cu[i] + lens[i];
    const int64_t T = cu[4];
    int32_t *tok = rand_tokens(12, T);
    for (int i = 0; i < 4; i++)
        tok[cu[i]] = 256;
    arl_model m;
    tiny_model_init(&m, &TM, 256, 8);
    float *lg = malloc(sizeof(float) * T * V), *alone = malloc(sizeof(float) * T * V);
    int32_t *targets = malloc(sizeof(int32_t) * T);
    float *lp = malloc(sizeof(float) * T), *lp1 = malloc(sizeof(float) * T);
    arl_batch_next_token_targets(targets, tok, cu, 4, T);
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = 4, .targets = targets};
    arl_forward_out o = {.logits = lg, .logprobs = lp};
    CHECK(arl_model_forward(&m, &b, &o) == ARL_OK);
    for (int i = 0; i < 4; i++) {
        full_logits(&m, tok + cu[i], lens[i], alone + (int64_t)cu[i] * V);
        char what[64];
        snprintf(what, sizeof what, "ragged batch document %d vs alone", i);
        cmp(what, lg + (int64_t)cu[i] * V, alone + (int64_t)cu[i] * V, (int64_t)lens[i] * V);
        arl_batch b1 = {.tokens = tok + cu[i], .T = lens[i], .targets = targets + cu[i]};
        arl_forward_out o1 = {.logprobs = lp1 + cu[i]};
        CHECK(arl_model_forward(&m, &b1, &o1) == ARL_OK);
    }
    cmp("ragged batch target log-probs vs alone", lp, lp1, T);
    for (int i = 0; i < 4; i++)
        CHECK(lp[cu[i + 1] - 1] == 0.0f); /* no target at a doc end */

    /* determinism: the same forward twice gives the same bits */
    float *lg2 = malloc(sizeof(float) * T * V);
    arl_forward_out o2 = {.logits = lg2};
    CHECK(arl_model_forward(&m, &b, &o2) == ARL_OK);
    CHECK_EQ_INT(count_diff(lg, lg2, sizeof(float) * T * V), 0);
    free(lg2);
    free(lg);
    free(alone);
    free(targets);
    free(lp);
    free(lp1);
    free(tok);
    arl_model_free(&m);
}

/* Prefill in forwards of `chunk` tokens (model max_tokens) against one full forward. */
static void test_chunked_prefill(void) {
    const int64_t V = TM.cfg.dims.V, n = 150;
    int32_t *tok = rand_tokens(13, n);
    arl_model full;
    tiny_model_init(&full, &TM, 256, 4);
    float *ref = malloc(sizeof(float) * n * V), *got = malloc(sizeof(float) * n * V);
    full_logits(&full, tok, n, ref);
    const int64_t chunks[3] = {1, 17, 64};
    for (int c = 0; c < 3; c++) {
        arl_model m;
        tiny_model_init(&m, &TM, chunks[c], 4);
        arl_decode_state st;
        CHECK(arl_decode_state_init(&st, &TM.cfg, 1, 512) == ARL_OK);
        int32_t slot;
        CHECK(arl_decode_state_join(&st, &slot) == ARL_OK);
        arl_status s = arl_model_prefill(&m, &st, slot, tok, n, NULL, 0, got, NULL);
        CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
        char what[64];
        snprintf(what, sizeof what, "prefill in chunks of %lld", (long long)chunks[c]);
        cmp(what, got, ref, n * V);
        arl_decode_state_free(&st);
        arl_model_free(&m);
    }
    free(ref);
    free(got);
    free(tok);
    arl_model_free(&full);
}

/* Three sequences share a state; they join at different times, run prefill chunks and decode
 * steps in mixed batches, and leave; every logit row must match its sequence's full forward. */
static void test_continuous_batching(void) {
    const int64_t V = TM.cfg.dims.V;
    enum { NSEQ = 3, LEN = 60 };
    int32_t *tok[NSEQ];
    float *ref[NSEQ], *got[NSEQ];
    arl_model m;
    tiny_model_init(&m, &TM, 64, 4);
    for (int i = 0; i < NSEQ; i++) {
        tok[i] = rand_tokens(20 + i, LEN);
        ref[i] = malloc(sizeof(float) * LEN * V);
        got[i] = malloc(sizeof(float) * LEN * V);
        full_logits(&m, tok[i], LEN, ref[i]);
    }
    arl_decode_state st;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 2, 512) == ARL_OK); /* fewer slots than seqs */
    int32_t slot[NSEQ] = {-1, -1, -1};
    int64_t done[NSEQ] = {0};
    /* schedule: 0 joins (prefill 10); 1 joins; then mixed steps; 0 leaves at LEN, 2 takes
     * its slot (reusing its latent buffers) */
    CHECK(arl_decode_state_join(&st, &slot[0]) == ARL_OK);
    CHECK(arl_model_prefill(&m, &st, slot[0], tok[0], 10, NULL, 0, got[0], NULL) == ARL_OK);
    done[0] = 10;
    CHECK(arl_decode_state_join(&st, &slot[1]) == ARL_OK);
    int32_t extra;
    CHECK(arl_decode_state_join(&st, &extra) == ARL_ERR_FULL);
    int step = 0;
    while (done[0] < LEN || done[1] < LEN || done[2] < LEN) {
        /* build one forward: each active sequence contributes 1 token, or a prefill chunk of
         * up to 9 tokens on every third step */
        int32_t cu[NSEQ + 1] = {0}, sl[NSEQ], who[NSEQ], nd = 0;
        int32_t buf[64];
        for (int i = 0; i < NSEQ; i++) {
            if (slot[i] < 0 || done[i] >= LEN) continue;
            int64_t c = (step % 3 == 0) ? 9 : 1;
            if (c > LEN - done[i]) c = LEN - done[i];
            memcpy(buf + cu[nd], tok[i] + done[i], sizeof(int32_t) * c);
            cu[nd + 1] = cu[nd] + (int32_t)c;
            sl[nd] = slot[i];
            who[nd++] = i;
        }
        float *lg = malloc(sizeof(float) * cu[nd] * V);
        arl_batch b = {.tokens = buf, .T = cu[nd], .cu = cu, .N = nd};
        arl_forward_out o = {.logits = lg};
        arl_status s = arl_model_forward_state(&m, &st, sl, &b, &o);
        CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
        for (int j = 0; j < nd; j++) {
            int i = who[j];
            memcpy(got[i] + done[i] * V, lg + (int64_t)cu[j] * V,
                   sizeof(float) * (cu[j + 1] - cu[j]) * V);
            done[i] += cu[j + 1] - cu[j];
            if (done[i] == LEN) {
                arl_decode_state_leave(&st, slot[i]);
                slot[i] = -1;
                if (i == 0) { /* sequence 2 joins in the freed slot */
                    CHECK(arl_decode_state_join(&st, &slot[2]) == ARL_OK);
                    CHECK_EQ_INT(arl_decode_state_position(&st, slot[2]), 0);
                }
            }
        }
        free(lg);
        step++;
        if (step > 400) break;
    }
    for (int i = 0; i < NSEQ; i++) {
        char what[64];
        snprintf(what, sizeof what, "continuous batching sequence %d", i);
        CHECK_EQ_INT(done[i], LEN);
        cmp(what, got[i], ref[i], LEN * V);
        free(tok[i]);
        free(ref[i]);
        free(got[i]);
    }
    arl_decode_state_free(&st);
    arl_model_free(&m);
}

static void test_forced_routes(void) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t V = dm->V, T = 40, k = dm->k;
    int32_t *tok = rand_tokens(14, T);
    arl_model m;
    tiny_model_init(&m, &TM, 64, 2);
    float *a = malloc(sizeof(float) * T * V), *b2 = malloc(sizeof(float) * T * V);
    int32_t *routes = malloc(sizeof(int32_t) * dm->n_moe * T * k);
    int32_t *routes2 = malloc(sizeof(int32_t) * dm->n_moe * T * k);
    arl_batch b = {.tokens = tok, .T = T};
    arl_forward_out o = {.logits = a, .routes = routes};
    CHECK(arl_model_forward(&m, &b, &o) == ARL_OK);
    /* forcing the natural routes changes nothing */
    b.forced_routes = routes;
    arl_forward_out o2 = {.logits = b2, .routes = routes2};
    CHECK(arl_model_forward(&m, &b, &o2) == ARL_OK);
    CHECK_EQ_INT(count_diff(a, b2, sizeof(float) * T * V), 0);
    CHECK_EQ_INT(count_diff(routes, routes2, sizeof(int32_t) * dm->n_moe * T * k), 0);
    /* other routes (reversed order, one expert swapped) are used as given */
    for (int64_t i = 0; i < dm->n_moe * T; i++) {
        int32_t *r = routes + i * k;
        int32_t used[64] = {0};
        for (int64_t j = 0; j < k; j++)
            used[r[j]] = 1;
        for (int32_t e = 0; e < dm->E; e++)
            if (!used[e]) {
                r[0] = e;
                break;
            }
    }
    CHECK(arl_model_forward(&m, &b, &o2) == ARL_OK);
    CHECK_EQ_INT(count_diff(routes, routes2, sizeof(int32_t) * dm->n_moe * T * k), 0);
    CHECK(count_diff(a, b2, sizeof(float) * T * V) > 0);
    free(a);
    free(b2);
    free(routes);
    free(routes2);
    free(tok);
    arl_model_free(&m);
}

static void test_sparse_mla_and_chunk_len(void) {
    const int64_t V = TM.cfg.dims.V, n = 90;
    int32_t *tok = rand_tokens(15, n);
    arl_model dense;
    tiny_model_init(&dense, &TM, 128, 2);
    float *ref = malloc(sizeof(float) * n * V), *got = malloc(sizeof(float) * n * V);
    full_logits(&dense, tok, n, ref);
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = 128;
    o.max_context = 512;

    /* k_c >= number of chunks: every chunk is selected, equal to dense */
    o.mla_sparse_chunk = 8;
    o.mla_sparse_topk = 100;
    arl_model m;
    CHECK(arl_model_init(&m, &TM.cfg, &TM.w, &o) == ARL_OK);
    full_logits(&m, tok, n, got);
    cmp("sparse MLA selecting all chunks vs dense", got, ref, n * V);
    arl_model_free(&m);

    /* k_c = 1: prefill (absorbed, per query) equals token-by-token decode */
    o.mla_sparse_topk = 1;
    CHECK(arl_model_init(&m, &TM.cfg, &TM.w, &o) == ARL_OK);
    full_logits(&m, tok, n, got);
    CHECK(fabsf(got[(n - 1) * V] - ref[(n - 1) * V]) > 0.0f); /* it does select */
    arl_decode_state st;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 1, 512) == ARL_OK);
    int32_t slot;
    CHECK(arl_decode_state_join(&st, &slot) == ARL_OK);
    float *dec = malloc(sizeof(float) * n * V);
    CHECK(arl_model_prefill(&m, &st, slot, tok, 30, NULL, 0, dec, NULL) == ARL_OK);
    for (int64_t i = 30; i < n; i++)
        CHECK(arl_model_decode_step(&m, &st, &slot, 1, tok + i, dec + i * V, NULL) == ARL_OK);
    cmp("sparse MLA prefill vs decode", dec, got, n * V);
    arl_decode_state_free(&st);
    arl_model_free(&m);

    /* KDA chunk length 16 vs 64 */
    arl_model_opts_default(&o);
    o.max_tokens = 128;
    o.max_context = 512;
    o.kda_chunk = 16;
    CHECK(arl_model_init(&m, &TM.cfg, &TM.w, &o) == ARL_OK);
    full_logits(&m, tok, n, got);
    cmp("KDA chunk 16 vs 64", got, ref, n * V);
    arl_model_free(&m);
    free(dec);
    free(ref);
    free(got);
    free(tok);
    arl_model_free(&dense);
}

/* Saved activations (arl_model_acts): layer 0's input and block entry 0 are the embedding
 * rows, the routes are those of the output, the first chunk of every document starts from the
 * zero state; and the run with a different thread count agrees within the tolerance. */
static void test_acts_and_threads(void) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t V = dm->V, d = dm->d;
    int32_t cu[3] = {0, 70, 100};
    const int64_t T = 100;
    int32_t *tok = rand_tokens(16, T);
    arl_model m;
    tiny_model_init(&m, &TM, 128, 2);
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = 2};
    float *arena = calloc((size_t)arl_model_acts_floats(&m, &b), sizeof(float));
    arl_model_acts acts;
    arl_model_acts_bind(&acts, &m, &b, arena);
    CHECK_EQ_INT(acts.n_chunks, 2 + 1); /* 70 = 64 + 6, 30 */
    float *lg = malloc(sizeof(float) * T * V), *lg1 = malloc(sizeof(float) * T * V);
    int32_t *routes = malloc(sizeof(int32_t) * dm->n_moe * T * dm->k);
    arl_forward_out o = {.logits = lg, .routes = routes, .acts = &acts};
    CHECK(arl_model_forward(&m, &b, &o) == ARL_OK);
    int64_t bad = 0;
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < d; i++) {
            float e = TM.w.embed_tokens[(int64_t)tok[t] * d + i];
            bad += acts.layer_in[t * d + i] != e || acts.blocks[t * d + i] != e;
        }
    CHECK_EQ_INT(bad, 0);
    CHECK(memcmp(acts.routes, routes, sizeof(int32_t) * dm->n_moe * T * dm->k) == 0);
    const int64_t S = dm->H * dm->dk * dm->dv;
    for (int64_t j = 0; j < dm->n_kda; j++) {
        const float *cs = acts.kda_chunks + j * acts.n_chunks * S;
        int64_t nz0 = 0, nz1 = 0, nz2 = 0;
        for (int64_t i = 0; i < S; i++) {
            nz0 += cs[i] != 0.0f;         /* document 0, chunk 0: fresh */
            nz1 += cs[S + i] != 0.0f;     /* document 0, chunk 1: carries the state */
            nz2 += cs[2 * S + i] != 0.0f; /* document 1, chunk 0: fresh again */
        }
        CHECK(nz0 == 0 && nz1 > 0 && nz2 == 0);
    }
    /* one thread: same values within the tolerance (GEMM blocking may move rounding) */
    CHECK(arl_k_threads_init(1) == ARL_OK);
    arl_forward_out o1 = {.logits = lg1};
    CHECK(arl_model_forward(&m, &b, &o1) == ARL_OK);
    CHECK(arl_k_threads_init(2) == ARL_OK);
    cmp("1 thread vs 2 threads", lg1, lg, T * V);
    free(arena);
    free(lg);
    free(lg1);
    free(routes);
    free(tok);
    arl_model_free(&m);
}

/* The Kimi Linear options of the config (spec 2.1, 3.2, 3.4, 4.1, 7.1, 8): plain pre-norm
 * residual (no AttnRes), softplus decay gate, low-rank KDA output gate, direct MLA q_proj, no
 * MLA output gate, no latent norm, no shared experts, SwiGLU.  No golden vectors exist for
 * this mix: the check is that every path runs and that prefill + decode and export/import
 * agree with the full forward as for the K3 layout. */
static void test_kimi_linear_options(void) {
    arl_model_config cfg;
    CHECK(arl_model_config_copy(&cfg, &TM.cfg) == ARL_OK);
    cfg.text.attn_res_block_size = 0;
    cfg.text.q_lora_rank = 0;
    cfg.text.mla_use_output_gate = 0;
    cfg.text.latent_moe_use_norm = 0;
    cfg.text.num_shared_experts = 0;
    cfg.text.linear_attn_config.gate_lower_bound = NAN;
    cfg.text.linear_attn_config.use_full_rank_gate = 0;
    snprintf(cfg.text.hidden_act, sizeof cfg.text.hidden_act, "silu");
    cfg.text.initializer_range = 0.1; /* O(0.1-1) activations through 8 layers */
    arl_status s = arl_model_config_validate(&cfg);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    if (s) return;
    arl_model_params w;
    CHECK(arl_model_params_alloc(&w, &cfg) == ARL_OK);
    CHECK(arl_params_init(&w, &cfg, 5, 1) == ARL_OK);
    CHECK(w.out_res_norm == NULL && w.layers[3].mla.q_proj && !w.layers[3].mla.g_proj);
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = 128;
    o.max_context = 256;
    arl_model m;
    CHECK(arl_model_init(&m, &cfg, &w, &o) == ARL_OK);
    const int64_t V = cfg.dims.V, n = 80, N0 = 67;
    int32_t *tok = rand_tokens(17, n);
    float *ref = malloc(sizeof(float) * n * V), *got = malloc(sizeof(float) * n * V);
    full_logits(&m, tok, n, ref);
    arl_decode_state st;
    CHECK(arl_decode_state_init(&st, &cfg, 2, 256) == ARL_OK);
    int32_t a, b;
    CHECK(arl_decode_state_join(&st, &a) == ARL_OK);
    CHECK(arl_decode_state_join(&st, &b) == ARL_OK);
    CHECK(arl_model_prefill(&m, &st, a, tok, N0, NULL, 0, got, NULL) == ARL_OK);
    uint8_t *blob;
    size_t len;
    CHECK(arl_decode_state_export_alloc(&st, a, &blob, &len) == ARL_OK);
    CHECK(arl_decode_state_import(&st, b, blob, len) == ARL_OK);
    for (int64_t i = N0; i < n; i++)
        CHECK(arl_model_decode_step(&m, &st, &b, 1, tok + i, got + i * V, NULL) == ARL_OK);
    cmp("Kimi Linear options: prefill + import + decode vs full forward", got, ref, n * V);
    free(blob);
    free(tok);
    free(ref);
    free(got);
    arl_decode_state_free(&st);
    arl_model_free(&m);
    arl_model_params_free(&w);
    arl_model_config_free(&cfg);
}

int main(void) {
    tiny_load(&TM);
    TEST_RUN(test_prefill_decode_export);
    TEST_RUN(test_ragged_batch);
    TEST_RUN(test_chunked_prefill);
    TEST_RUN(test_continuous_batching);
    TEST_RUN(test_forced_routes);
    TEST_RUN(test_sparse_mla_and_chunk_len);
    TEST_RUN(test_acts_and_threads);
    TEST_RUN(test_kimi_linear_options);
    tiny_free(&TM);
    return test_finish();
}
