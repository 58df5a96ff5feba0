/* Top-k and argmax (kernels/topk.h) against a naive reference: sort all (value, index) pairs by
 * "value descending, then index ascending, NaN last" and take the first k.  Integer outputs must
 * match exactly; values are copies, so they match bit for bit. */
#include "kernels/topk.h"
#include "tests/kernels/kref.h"

/* Does (a, ia) come before (b, ib) in the order of kernels/topk.h? */
static int before(float a, int ia, float b, int ib) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b) ? ia < ib : isnan(b);
    if (a != b) return a > b;
    return ia < ib;
}

/* Naive: k passes, each picking the best element not yet taken. */
static void ref_topk(int32_t *idx, const float *x, int64_t d, int64_t k, char *taken) {
    memset(taken, 0, (size_t)d);
    for (int64_t s = 0; s < k; s++) {
        int64_t best = -1;
        for (int64_t j = 0; j < d; j++)
            if (!taken[j] && (best < 0 || before(x[j], (int)j, x[best], (int)best))) best = j;
        taken[best] = 1;
        idx[s] = (int32_t)best;
    }
}

/* Values with many ties: small integers, some NaN, +-inf, and -0.0 next to +0.0. */
static void fill_tied(arl_rng *r, float *x, int64_t n, int with_nan) {
    for (int64_t i = 0; i < n; i++) {
        uint64_t u = arl_rng_below(r, 20);
        x[i] = (float)u - 8.0f;
        if (u == 8) x[i] = arl_rng_below(r, 2) ? -0.0f : 0.0f;
        if (with_nan && u == 19) x[i] = NAN;
        if (u == 18) x[i] = arl_rng_below(r, 2) ? INFINITY : -INFINITY;
    }
}

static void check_case(arl_rng *r, int64_t n, int64_t d, int64_t k, int tied, int with_nan) {
    float *x = kt_floats(n * d), *val = kt_floats(n * k);
    int32_t *idx = kt_alloc((size_t)(n * k) * sizeof *idx), *ref = kt_alloc((size_t)k * 4 + 4);
    int32_t *am = kt_alloc((size_t)n * sizeof *am);
    char *taken = kt_alloc((size_t)d);
    if (tied)
        fill_tied(r, x, n * d, with_nan);
    else
        kt_normal(r, x, n * d, 0, 1);
    arl_k_topk_rows(idx, val, x, n, d, k);
    arl_k_argmax_rows(am, x, n, d);
    int ok = 1, ok_am = 1;
    for (int64_t t = 0; t < n; t++) {
        ref_topk(ref, x + t * d, d, k, taken);
        for (int64_t s = 0; s < k; s++) {
            ok &= idx[t * k + s] == ref[s];
            ok &= kt_same_bits(&val[t * k + s], &x[t * d + ref[s]], sizeof(float));
        }
        ref_topk(ref, x + t * d, d, 1, taken);
        ok_am &= am[t] == ref[0];
    }
    CHECK_MSG(ok, "topk n %lld d %lld k %lld tied %d nan %d", (long long)n, (long long)d,
              (long long)k, tied, with_nan);
    CHECK_MSG(ok_am, "argmax n %lld d %lld tied %d nan %d", (long long)n, (long long)d, tied,
              with_nan);
    /* val == NULL: the same indices */
    int32_t *idx2 = kt_alloc((size_t)(n * k) * sizeof *idx2);
    arl_k_topk_rows(idx2, NULL, x, n, d, k);
    CHECK(kt_same_bits(idx, idx2, (size_t)(n * k) * sizeof *idx));
    free(x), free(val), free(idx), free(ref), free(am), free(taken), free(idx2);
}

static void test_topk_against_reference(void) {
    arl_rng r;
    arl_rng_seed(&r, 51);
    for (int tc = 0; tc < KT_N_THREAD_COUNTS; tc++) {
        kt_threads(kt_thread_counts[tc]);
        check_case(&r, 0, 5, 2, 0, 0);
        check_case(&r, 3, 1, 1, 0, 0);
        check_case(&r, 3, 1, 0, 1, 0);
        for (int64_t k = 0; k <= 17; k++) {
            check_case(&r, 5, 17, k, 0, 0);
            check_case(&r, 5, 17, k, 1, 0);
            check_case(&r, 5, 17, k, 1, 1);
        }
        check_case(&r, 37, 896, 16, 0, 0); /* K3 router: E = 896, k = 16 */
        check_case(&r, 37, 896, 16, 1, 1);
        check_case(&r, 4, 300, 300, 1, 1); /* k = d: a full sort */
        check_case(&r, 300, 129, 8, 1, 0); /* enough rows for the threaded path */
    }
}

/* The documented tie rules, spelled out. */
static void test_tie_rules(void) {
    kt_threads(2);
    float x[8] = {1, 3, 3, NAN, 2, 3, -0.0f, 0.0f};
    int32_t idx[8];
    float val[8];
    arl_k_topk_rows(idx, val, x, 1, 8, 8);
    static const int32_t want[8] = {1, 2, 5, 4, 0, 6, 7, 3}; /* 3s by index, -0 == +0, NaN last */
    int ok = 1;
    for (int i = 0; i < 8; i++)
        ok &= idx[i] == want[i];
    CHECK(ok);
    int32_t am;
    arl_k_argmax_rows(&am, x, 1, 8);
    CHECK_EQ_INT(am, 1);
    float nan_first[3] = {NAN, -INFINITY, NAN};
    arl_k_argmax_rows(&am, nan_first, 1, 3);
    CHECK_EQ_INT(am, 1);
    float all_nan[2] = {NAN, NAN};
    arl_k_argmax_rows(&am, all_nan, 1, 2);
    CHECK_EQ_INT(am, 0);
}

int main(void) {
    TEST_RUN(test_topk_against_reference);
    TEST_RUN(test_tie_rules);
    arl_k_threads_free();
    return test_finish();
}
