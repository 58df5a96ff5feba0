/* tests/policy/test_mla_sparse.c: block-sparse MLA selection that skips unselected chunks
 * (spec/policy.md 4.5; policy/mla.h arl_mla_sparse_attn, arl_mla_chunk_means_update) and the
 * chunk summaries kept in a decode state (policy/state.h, policy/model.h).
 *
 *   - summaries built in pieces (as a cache grows) equal summaries built at once, bit for bit;
 *   - the sparse core against a float64 reference of 4.5 written here: the same selection
 *     (given the same fp32 sigma; checked exactly) and the softmax over the selected rows;
 *   - it never reads an unselected chunk: rows of chunks no query selected are set to NaN and
 *     the output is unchanged, bit for bit;
 *   - k_c >= J_t equals dense attention bit for bit; any split of the queries into calls
 *     gives the same result to rounding;
 *   - the model: a block-sparse prefill + decode through a decode state keeps the summaries
 *     current (they cover every row after each step, no recomputation), an exported and
 *     imported state continues bit for bit like the original (summaries redone from the
 *     rows), and sparse decode equals the fresh-document sparse forward.
 *
 * Tolerances: the sparse core vs the float64 reference |a - b| <= 1e-5 + 1e-5 |ref|: fp32
 * scores of 12-wide dot products and a softmax over at most (k_c + 1) n_c = 40 rows of O(1)
 * values round to ~1e-6; a wrong chunk or row gives O(0.1) errors.  Query splits: the same
 * bound (only the GEMM blocking and the online-softmax rescaling differ).  The model
 * comparison uses spec 16.4's whole-model form, rtol 1e-4 of max|ref|.
 */
#include <math.h>

#include "core/rng.h"
#include "policy/mla.h"
#include "tests/policy_model/tiny.h"

enum { HM = 3, RKV = 8, RR = 4, W = RKV + RR, NC = 8, KC = 3 };

static float *rand_f(arl_rng *g, int64_t n, double sd) {
    float *x = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(sd * arl_rng_normal(g));
    return x;
}

/* A cache whose chunks differ: row s = base noise + a per-chunk offset, so that sigma ranks
 * the chunks clearly (no near-ties that fp32 rounding could flip). */
static float *rand_cache(arl_rng *g, int64_t S) {
    float *c = rand_f(g, S * W, 0.5);
    float off[W];
    for (int64_t s = 0; s < S; s++) {
        if (s % NC == 0)
            for (int e = 0; e < W; e++)
                off[e] = (float)(1.5 * arl_rng_normal(g));
        for (int e = 0; e < W; e++)
            c[s * W + e] += off[e];
    }
    return c;
}

static void test_means_incremental(void) {
    arl_rng g;
    arl_rng_seed(&g, 1);
    const int64_t S = 101;
    float *c = rand_cache(&g, S);
    float *a = calloc((size_t)((S / NC + 1) * W), sizeof(float));
    float *b = calloc((size_t)((S / NC + 1) * W), sizeof(float));
    arl_mla_chunk_means_update(a, c, 0, S, W, NC);
    const int64_t cuts[] = {0, 1, 3, 8, 17, 40, 64, 65, S};
    for (size_t i = 0; i + 1 < sizeof cuts / sizeof cuts[0]; i++)
        arl_mla_chunk_means_update(b, c, cuts[i], cuts[i + 1], W, NC);
    CHECK(memcmp(a, b, sizeof(float) * (size_t)((S / NC + 1) * W)) == 0);
    /* complete chunk: the mean; the open chunk (rows 96..100): the running sum */
    double mean0 = 0, open0 = 0;
    for (int64_t s = 0; s < NC; s++)
        mean0 += c[s * W];
    for (int64_t s = 96; s < S; s++)
        open0 += c[s * W];
    CHECK_CLOSE(a[0], mean0 / NC, 1e-5, 1e-5);
    CHECK_CLOSE(a[12 * W], open0, 1e-5, 1e-5);
    free(a);
    free(b);
    free(c);
}

/* float64 reference of 4.5 for one query (position t) and head; sel_ref (J_t + 1) receives
 * the selection (greedy, ties to the lower j).  The cache's chunks are far apart in sigma,
 * so fp32 and float64 sigma rank them alike. */
static void ref_query(double *out, uint8_t *sel_ref, const float *qh, const float *qp,
                      const float *cache, const float *means, int64_t t, float scale) {
    const int64_t Jt = t / NC;
    double sig[64];
    float qrow[W];
    memcpy(qrow, qh, sizeof(float) * RKV);
    memcpy(qrow + RKV, qp, sizeof(float) * RR);
    for (int64_t j = 0; j < Jt; j++) {
        sig[j] = 0;
        for (int e = 0; e < W; e++)
            sig[j] += (double)qrow[e] * means[j * W + e];
    }
    memset(sel_ref, 0, (size_t)(Jt + 1));
    sel_ref[Jt] = 1;
    for (int64_t pick = 0; pick < KC && pick < Jt; pick++) { /* greedy, ties to the lower j */
        int64_t best = -1;
        for (int64_t j = 0; j < Jt; j++)
            if (!sel_ref[j] && (best < 0 || sig[j] > sig[best])) best = j;
        sel_ref[best] = 1;
    }
    double mx = -INFINITY, sc[512], sum = 0;
    for (int64_t s = 0; s <= t; s++) {
        sc[s] = -INFINITY;
        if (!sel_ref[s / NC]) continue;
        double d = 0;
        for (int e = 0; e < W; e++)
            d += (double)qrow[e] * cache[s * W + e];
        sc[s] = d * scale;
        if (sc[s] > mx) mx = sc[s];
    }
    for (int e = 0; e < RKV; e++)
        out[e] = 0;
    for (int64_t s = 0; s <= t; s++) {
        if (sc[s] == -INFINITY) continue;
        double p = exp(sc[s] - mx);
        sum += p;
        for (int e = 0; e < RKV; e++)
            out[e] += p * cache[s * W + e];
    }
    for (int e = 0; e < RKV; e++)
        out[e] /= sum;
}

typedef struct fixture {
    int64_t pos0, Tq, S, J;
    float *cache, *means, *qh, *qp;
} fixture;

static fixture make_fixture(uint64_t seed, int64_t pos0, int64_t Tq) {
    arl_rng g;
    arl_rng_seed(&g, seed);
    fixture f = {.pos0 = pos0, .Tq = Tq, .S = pos0 + Tq, .J = (pos0 + Tq) / NC + 1};
    f.cache = rand_cache(&g, f.S);
    f.means = calloc((size_t)(f.J * W), sizeof(float));
    arl_mla_chunk_means_update(f.means, f.cache, 0, f.S, W, NC);
    f.qh = rand_f(&g, Tq * HM * RKV, 0.5);
    f.qp = rand_f(&g, Tq * HM * RR, 0.5);
    return f;
}

static void fixture_free(fixture *f) {
    free(f->cache);
    free(f->means);
    free(f->qh);
    free(f->qp);
}

/* The core over queries [0, Tq) in calls of `step` queries. */
static void run_core(const fixture *f, float *oh, uint8_t *sel, int64_t sel_w, int64_t step,
                     int64_t k_c, float scale) {
    float *ws =
        malloc(sizeof(float) * (size_t)arl_mla_sparse_ws_floats(step, HM, f->S, RKV, RR, NC, k_c));
    for (int64_t i = 0; i < f->Tq; i += step) {
        int64_t n = f->Tq - i < step ? f->Tq - i : step;
        arl_mla_sparse_attn(oh + i * HM * RKV, sel ? sel + i * HM * sel_w : NULL, sel_w,
                            f->qh + i * HM * RKV, f->qp + i * HM * RR, f->cache, f->means,
                            f->pos0 + i, n, HM, RKV, RR, scale, NC, k_c, ws);
    }
    free(ws);
}

static void test_core_vs_reference(void) {
    const float scale = 0.3f;
    fixture f = make_fixture(2, 37, 163); /* queries cross 21 chunk boundaries */
    const int64_t SW = f.J;
    float *oh = malloc(sizeof(float) * (size_t)(f.Tq * HM * RKV));
    uint8_t *sel = malloc((size_t)(f.Tq * HM * SW));
    run_core(&f, oh, sel, SW, 16, KC, scale);
    int bad_sel = 0, n_sparse = 0;
    double err = 0;
    for (int64_t i = 0; i < f.Tq; i++)
        for (int64_t h = 0; h < HM; h++) {
            int64_t t = f.pos0 + i, Jt = t / NC;
            double ref[RKV];
            uint8_t sref[64];
            ref_query(ref, sref, f.qh + (i * HM + h) * RKV, f.qp + (i * HM + h) * RR, f.cache,
                      f.means, t, scale);
            const uint8_t *srow = sel + (i * HM + h) * SW;
            for (int64_t j = 0; j < SW; j++)
                bad_sel += srow[j] != (j <= Jt ? sref[j] : 0);
            n_sparse += Jt > KC;
            for (int e = 0; e < RKV; e++) {
                double d = fabs(oh[(i * HM + h) * RKV + e] - ref[e]) - 1e-5 * fabs(ref[e]);
                if (d > err) err = d;
            }
        }
    CHECK_EQ_INT(bad_sel, 0);
    CHECK(n_sparse > 300); /* most queries select among more chunks than k_c */
    CHECK_MSG(err <= 1e-5, "sparse core vs float64 reference: excess error %g", err);

    /* other splits of the queries into calls: same to rounding */
    float *oh2 = malloc(sizeof(float) * (size_t)(f.Tq * HM * RKV));
    const int64_t steps[] = {1, 5, 163};
    for (size_t k = 0; k < 3; k++) {
        run_core(&f, oh2, NULL, 0, steps[k], KC, scale);
        check_close_f32("sparse core, other query split", oh2, oh, (size_t)(f.Tq * HM * RKV), 1e-5,
                        1e-5);
    }

    free(oh);
    free(oh2);
    free(sel);
    fixture_free(&f);

    /* never reads an unselected chunk: with two queries (6 pairs, at most 18 of 25 chunks
     * selected) poison the rows of every chunk no pair selected */
    f = make_fixture(5, 200, 2);
    const int64_t SW2 = f.J, n = f.Tq * HM * RKV;
    oh = malloc(sizeof(float) * (size_t)n);
    oh2 = malloc(sizeof(float) * (size_t)n);
    sel = malloc((size_t)(f.Tq * HM * SW2));
    run_core(&f, oh, sel, SW2, 16, KC, scale);
    int64_t poisoned = 0;
    for (int64_t j = 0; j < f.J; j++) {
        int used = 0;
        for (int64_t q = 0; q < f.Tq * HM; q++)
            used |= sel[q * SW2 + j];
        if (used) continue;
        for (int64_t s = j * NC; s < (j + 1) * NC && s < f.S; s++)
            for (int e = 0; e < W; e++)
                f.cache[s * W + e] = NAN;
        poisoned++;
    }
    CHECK(poisoned >= 7);
    run_core(&f, oh2, NULL, 0, 16, KC, scale);
    CHECK(memcmp(oh2, oh, sizeof(float) * (size_t)n) == 0);
    free(oh);
    free(oh2);
    free(sel);
    fixture_free(&f);
}

/* k_c >= J_t: every chunk is selected, and the result is dense attention bit for bit; the
 * legacy entry point (summaries recomputed) gives the same as the kept summaries. */
static void test_all_chunks_is_dense(void) {
    const float scale = 0.3f;
    fixture f = make_fixture(3, 5, 60);
    const int64_t n = f.Tq * HM * RKV;
    float *dense = malloc(sizeof(float) * (size_t)n), *all = malloc(sizeof(float) * (size_t)n);
    float *ws = malloc(sizeof(float) * (size_t)arl_mla_absorbed_ws_floats(f.S, RKV, RR, NC));
    arl_mla_absorbed_attn(dense, NULL, 0, f.qh, f.qp, f.cache, f.pos0, f.Tq, HM, RKV, RR, scale, 0,
                          0, ws);
    run_core(&f, all, NULL, 0, 16, 100, scale);
    CHECK(memcmp(dense, all, sizeof(float) * (size_t)n) == 0);
    float *sp = malloc(sizeof(float) * (size_t)n), *leg = malloc(sizeof(float) * (size_t)n);
    run_core(&f, sp, NULL, 0, 1, KC, scale);
    arl_mla_absorbed_attn(leg, NULL, 0, f.qh, f.qp, f.cache, f.pos0, f.Tq, HM, RKV, RR, scale, NC,
                          KC, ws);
    CHECK(memcmp(sp, leg, sizeof(float) * (size_t)n) == 0); /* same core, one pair at a time */
    free(dense);
    free(all);
    free(sp);
    free(leg);
    free(ws);
    fixture_free(&f);
}

/* ---- the model with a decode state ---- */

static tiny_model TM;

static void sparse_model(arl_model *m) {
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = 64; /* prefill in several forwards */
    o.max_docs = 2;
    o.max_context = 1024;
    o.mla_sparse_chunk = 16;
    o.mla_sparse_topk = 2;
    arl_status s = arl_model_init(m, &TM.cfg, &TM.w, &o);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
}

static void check_means_current(const arl_decode_state *st, int32_t slot) {
    for (int64_t l = 0; l < st->dm.L; l++) {
        if (st->mla_index[l] < 0) continue;
        int64_t *rows = NULL;
        float *m = arl_decode_state_means(st, slot, l, &rows);
        CHECK(m && rows && *rows == st->slots[slot].pos);
    }
}

static void test_state_means(void) {
    /* N0 + M passes 256 rows: the caches and their summaries grow on the way */
    const int64_t V = TM.cfg.dims.V, N0 = 300, M = 40, n = N0 + M;
    arl_rng g;
    arl_rng_seed(&g, 4);
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)n);
    tok[0] = 256;
    for (int64_t i = 1; i < n; i++)
        tok[i] = (int32_t)arl_rng_below(&g, 266);
    arl_model m;
    sparse_model(&m);
    /* fresh-document sparse forward of the whole sequence (summaries built per call) */
    float *ref = malloc(sizeof(float) * (size_t)(n * V));
    arl_batch b = {.tokens = tok, .T = n};
    arl_model_opts o = m.opts;
    o.max_tokens = 512;
    arl_model big;
    CHECK(arl_model_init(&big, &TM.cfg, &TM.w, &o) == ARL_OK);
    arl_forward_out fo = {.logits = ref};
    CHECK(arl_model_forward(&big, &b, &fo) == ARL_OK);
    arl_model_free(&big);

    arl_decode_state st, st2;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 2, 1024) == ARL_OK);
    CHECK(arl_decode_state_init(&st2, &TM.cfg, 1, 1024) == ARL_OK);
    int32_t a, a2;
    CHECK(arl_decode_state_join(&st, &a) == ARL_OK);
    float *dec = malloc(sizeof(float) * (size_t)(n * V)),
          *dec2 = malloc(sizeof(float) * (size_t)(M * V));
    CHECK(arl_model_prefill(&m, &st, a, tok, N0, NULL, 0, dec, NULL) == ARL_OK);
    CHECK(st.means_chunk == 16);
    check_means_current(&st, a);
    /* export here, import into another state: summaries are redone from the imported rows */
    uint8_t *blob = NULL;
    size_t len = 0;
    CHECK(arl_decode_state_export_alloc(&st, a, &blob, &len) == ARL_OK);
    CHECK(arl_decode_state_join(&st2, &a2) == ARL_OK);
    CHECK(arl_decode_state_import(&st2, a2, blob, len) == ARL_OK);
    for (int64_t i = N0; i < n; i++) {
        CHECK(arl_model_decode_step(&m, &st, &a, 1, tok + i, dec + i * V, NULL) == ARL_OK);
        check_means_current(&st, a);
    }
    for (int64_t i = N0; i < n; i++)
        CHECK(arl_model_decode_step(&m, &st2, &a2, 1, tok + i, dec2 + (i - N0) * V, NULL) ==
              ARL_OK);
    CHECK(memcmp(dec2, dec + N0 * V, sizeof(float) * (size_t)(M * V)) == 0);
    check_close_maxref_f32("sparse prefill + decode vs fresh sparse forward", dec, ref,
                           (size_t)(n * V), 0.0, 1e-4);
    CHECK(fabsf(ref[(n - 1) * V]) > 0.0f);

    /* reset: the summaries cover nothing; the restarted sequence gives the same logits */
    arl_decode_state_reset(&st, a);
    int64_t *rows = NULL;
    arl_decode_state_means(&st, a, TM.cfg.dims.L - 1, &rows);
    CHECK(rows && *rows == 0);
    float *again = malloc(sizeof(float) * (size_t)(N0 * V));
    CHECK(arl_model_prefill(&m, &st, a, tok, N0, NULL, 0, again, NULL) == ARL_OK);
    CHECK(memcmp(again, dec, sizeof(float) * (size_t)(N0 * V)) == 0);
    free(again);
    free(blob);
    free(dec);
    free(dec2);
    free(ref);
    free(tok);
    arl_decode_state_free(&st);
    arl_decode_state_free(&st2);
    arl_model_free(&m);
}

int main(void) {
    TEST_RUN(test_means_incremental);
    TEST_RUN(test_core_vs_reference);
    TEST_RUN(test_all_chunks_is_dense);
    tiny_load(&TM);
    TEST_RUN(test_state_means);
    tiny_free(&TM);
    return test_finish();
}
