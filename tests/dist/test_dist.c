/* tests/dist/test_dist.c: the distribution layer (learner/dist.h) and expert parallelism
 * (learner/ep.h), run as one process (MPI singleton) or under mpirun -np 2 / -np 3.
 *
 * usage: test_dist CASE[,CASE...] | all
 *   layout       role layout from the options (pure; no communication)
 *   collectives  deterministic all-reduce (f32, f64), exact int64/max/min, broadcasts,
 *                all-gather, all-to-all(v) with empty pairs
 *   roles        communicators per role, per expert group and per data-parallel group
 *   dp           2+-rank data-parallel SGD of a toy linear model vs one process, full batch
 *   ep           expert-parallel dispatch/combine vs the unsharded computation (linear
 *                experts; uneven loads, empty experts, ranks with no rows or no tokens, a rank
 *                with no experts, per-slot rows, invalid routes)
 *   moe          the real Stable LatentMoE expert math (policy/moe.h) with sharded experts vs
 *                arl_moe_fwd
 * Every rank checks its own results; a failure on any rank makes mpirun exit non-zero.
 * Inputs of every rank are generated from (seed, rank), so each rank can compute the serial
 * reference of the whole job by itself without trusting the code under test.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/kernels.h"
#include "learner/dist.h"
#include "learner/ep.h"
#include "policy/moe.h"
#include "policy/router.h"
#include "tests/test.h"

static arl_dist *g_dist; /* the job's world (roles: defaults) */
static int g_R, g_rank;

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static uint64_t fnv1a(const void *buf, size_t n) {
    const unsigned char *b = buf;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* 1 when every rank of c holds the same bytes (hash compared with MIN/MAX). */
static int same_on_all_ranks(arl_dist_comm *c, const void *buf, size_t n) {
    int64_t h = (int64_t)(fnv1a(buf, n) >> 1), lo = h, hi = h;
    CHECK(arl_dist_allreduce_i64(c, &lo, 1, ARL_DIST_MIN) == ARL_OK);
    CHECK(arl_dist_allreduce_i64(c, &hi, 1, ARL_DIST_MAX) == ARL_OK);
    return lo == hi;
}

/* ---------------------------------------------------------------- layout */

static void test_layout(void) {
    arl_dist_opts o;
    arl_dist_opts_default(&o);
    CHECK_EQ_INT(o.learners, 0);
    CHECK_EQ_INT(o.expert_parallel, 1);
    CHECK_EQ_INT(o.reduce_block, 4194304);
    arl_dist_layout L;

    /* one process: both roles */
    CHECK(arl_dist_layout_make(&L, &o, 1, 0) == ARL_OK);
    CHECK(L.colocated && L.roles == (ARL_DIST_ROLE_LEARNER | ARL_DIST_ROLE_ROLLOUT));
    CHECK_EQ_INT(L.n_learners, 1);
    CHECK_EQ_INT(L.learner_index, 0);
    CHECK_EQ_INT(L.rollout_index, 0);

    /* 6 ranks: 4 learners in 2 expert groups of 2, 2 rollout workers */
    o.learners = 4;
    o.expert_parallel = 2;
    static const int32_t ep_index[6] = {0, 1, 0, 1, -1, -1}, dp_index[6] = {0, 0, 1, 1, -1, -1},
                         ro_index[6] = {-1, -1, -1, -1, 0, 1};
    for (int32_t r = 0; r < 6; r++) {
        CHECK(arl_dist_layout_make(&L, &o, 6, r) == ARL_OK);
        CHECK(!L.colocated);
        CHECK_EQ_INT(L.n_learners, 4);
        CHECK_EQ_INT(L.n_rollout, 2);
        CHECK_EQ_INT(L.roles, r < 4 ? ARL_DIST_ROLE_LEARNER : ARL_DIST_ROLE_ROLLOUT);
        CHECK_EQ_INT(L.learner_index, r < 4 ? r : -1);
        CHECK_EQ_INT(L.ep_index, ep_index[r]);
        CHECK_EQ_INT(L.dp_index, dp_index[r]);
        CHECK_EQ_INT(L.rollout_index, ro_index[r]);
    }
    /* learners = world size: colocated */
    o.learners = 4;
    o.expert_parallel = 4;
    CHECK(arl_dist_layout_make(&L, &o, 4, 3) == ARL_OK);
    CHECK(L.colocated && L.roles == (ARL_DIST_ROLE_LEARNER | ARL_DIST_ROLE_ROLLOUT));
    CHECK_EQ_INT(L.ep_index, 3);
    CHECK_EQ_INT(L.dp_index, 0);
    CHECK_EQ_INT(L.rollout_index, 3);

    /* errors name the option */
    o.learners = 5;
    o.expert_parallel = 1;
    CHECK(arl_dist_layout_make(&L, &o, 4, 0) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "dist-learners") != NULL);
    o.learners = 4;
    o.expert_parallel = 3;
    CHECK(arl_dist_layout_make(&L, &o, 4, 0) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "dist-expert-parallel") != NULL);
    o.learners = 0; /* all 6 learners; 4 does not divide 6 */
    o.expert_parallel = 4;
    CHECK(arl_dist_layout_make(&L, &o, 6, 0) == ARL_ERR_CONFIG);

    /* the option table parses the experiment keys */
    arl_dist_opts_default(&o);
    CHECK(arl_options_parse_json_text(arl_dist_options, arl_dist_options_count,
                                      "{\"dist_learners\": 3, \"dist-expert-parallel\": 3}",
                                      "x.json", &o) == ARL_OK);
    CHECK_EQ_INT(o.learners, 3);
    CHECK_EQ_INT(o.expert_parallel, 3);
    CHECK(arl_options_parse_json_text(arl_dist_options, arl_dist_options_count,
                                      "{\"dist-expert-parallel\": 0}", "x.json", &o) != ARL_OK);

    /* expert sharding: contiguous blocks, owner consistent with the blocks */
    for (int32_t R = 1; R <= 5; R++)
        for (int64_t E = 1; E <= 13; E++) {
            CHECK_EQ_INT(arl_ep_expert_lo(E, R, 0), 0);
            CHECK_EQ_INT(arl_ep_expert_lo(E, R, R), E);
            for (int32_t r = 0; r < R; r++) {
                int64_t lo = arl_ep_expert_lo(E, R, r), hi = arl_ep_expert_lo(E, R, r + 1);
                CHECK(hi - lo == E / R || hi - lo == E / R + 1);
                for (int64_t e = lo; e < hi; e++)
                    CHECK_EQ_INT(arl_ep_expert_owner(E, R, e), r);
            }
        }
}

/* ---------------------------------------------------------------- collectives */

/* Input element i of rank r: normal values with magnitudes spread over 2^-40..2^40, so the
 * order of a sum changes its rounding even in double (exponent gaps above 29 bits). */
static void gen_f32(float *x, int64_t n, uint64_t seed, int32_t r) {
    arl_rng g;
    arl_rng_seed_stream(&g, seed, (uint64_t)r);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)ldexp(arl_rng_normal(&g), (int)arl_rng_below(&g, 81) - 40);
}

static void gen_f64(double *x, int64_t n, uint64_t seed, int32_t r) {
    arl_rng g;
    arl_rng_seed_stream(&g, seed, (uint64_t)r);
    for (int64_t i = 0; i < n; i++)
        x[i] = ldexp(arl_rng_normal(&g), (int)arl_rng_below(&g, 161) - 80);
}

/* The promise of learner/dist.h: left-to-right over ranks in double, rounded once. */
static void serial_sum_f32(float *out, int64_t n, uint64_t seed, int32_t R, int reverse) {
    float *x = xmalloc(sizeof(float) * (size_t)(n * R));
    for (int32_t r = 0; r < R; r++)
        gen_f32(x + (int64_t)r * n, n, seed, r);
    for (int64_t i = 0; i < n; i++) {
        double acc = 0;
        for (int32_t q = 0; q < R; q++) {
            int32_t r = reverse ? R - 1 - q : q;
            acc = q == 0 ? (double)x[(int64_t)r * n + i] : acc + (double)x[(int64_t)r * n + i];
        }
        out[i] = (float)acc;
    }
    free(x);
}

static void check_allreduce_f32(arl_dist_comm *c, int64_t n, uint64_t seed) {
    const int32_t R = arl_dist_comm_size(c), me = arl_dist_comm_rank(c);
    float *ref = xmalloc(sizeof(float) * (size_t)n), *buf = xmalloc(sizeof(float) * (size_t)n);
    serial_sum_f32(ref, n, seed, R, 0);
    for (int rep = 0; rep < 3; rep++) { /* bit-identical on every repetition */
        gen_f32(buf, n, seed, me);
        CHECK(arl_dist_allreduce_f32(c, buf, n) == ARL_OK);
        CHECK_MSG(n == 0 || memcmp(buf, ref, sizeof(float) * (size_t)n) == 0,
                  "n %lld rep %d: all-reduce differs from the serial rank-order sum", (long long)n,
                  rep);
        CHECK_MSG(same_on_all_ranks(c, buf, sizeof(float) * (size_t)n),
                  "n %lld: ranks hold different sums", (long long)n);
    }
    if (R >= 3 && n >= 100000) {
        /* the inputs make the order visible: the reverse order rounds differently somewhere,
         * so the equality above really pins the order (this test could fail) */
        serial_sum_f32(buf, n, seed, R, 1);
        int64_t diff = 0;
        for (int64_t i = 0; i < n; i++)
            diff += memcmp(&buf[i], &ref[i], sizeof(float)) != 0;
        CHECK_MSG(diff > 0, "reverse-order sums never differ: the inputs do not test the order");
    }
    free(ref);
    free(buf);
}

static void test_collectives(void) {
    arl_dist_comm *w = g_dist->world;
    const int32_t R = g_R, me = g_rank;
    CHECK_EQ_INT(arl_dist_comm_size(w), R);
    CHECK_STR_EQ(arl_dist_comm_name(w), "world");
    CHECK(arl_dist_barrier(w) == ARL_OK);

    /* f32 SUM: sizes below R (empty chunks), the small all-gather path, its boundary, the
     * chunked path with a size no rank count divides */
    static const int64_t sizes[] = {0, 1, 2, 5, 1365, 1366, 2048, 2049, 4097, 1000003};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        check_allreduce_f32(w, sizes[i], 100 + i);

    /* the same function with many small rounds (dist-reduce-block 1024) */
    {
        arl_dist *d2 = NULL;
        CHECK(arl_dist_init(&d2, NULL, NULL) == ARL_OK);
        arl_dist_opts o;
        arl_dist_opts_default(&o);
        o.reduce_block = 1024;
        CHECK(arl_dist_assign_roles(d2, &o) == ARL_OK);
        CHECK(arl_dist_assign_roles(d2, &o) == ARL_ERR_STATE);
        check_allreduce_f32(d2->world, 100003, 107);
        check_allreduce_f32(d2->learners, 5000, 108);
        arl_dist_finalize(d2);
    }

    /* f64 SUM in rank order; MAX and MIN exact */
    {
        const int64_t n = 20011;
        double *x = xmalloc(sizeof(double) * (size_t)(n * R)), *buf = xmalloc(sizeof(double) * n);
        for (int32_t r = 0; r < R; r++)
            gen_f64(x + (int64_t)r * n, n, 7, r);
        for (int op = 0; op < 3; op++) {
            memcpy(buf, x + (int64_t)me * n, sizeof(double) * (size_t)n);
            CHECK(arl_dist_allreduce_f64(w, buf, n, (arl_dist_op)op) == ARL_OK);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++) {
                double acc = x[i];
                for (int32_t r = 1; r < R; r++) {
                    double v = x[(int64_t)r * n + i];
                    acc = op == ARL_DIST_SUM   ? acc + v
                          : op == ARL_DIST_MAX ? fmax(acc, v)
                                               : fmin(acc, v);
                }
                bad += memcmp(&acc, &buf[i], sizeof acc) != 0;
            }
            CHECK_MSG(bad == 0, "f64 op %d: %lld elements differ from the serial result", op,
                      (long long)bad);
        }
        double s = 1.5 * me; /* a scalar (loss statistics) */
        CHECK(arl_dist_allreduce_f64(w, &s, 1, ARL_DIST_SUM) == ARL_OK);
        CHECK(s == 1.5 * R * (R - 1) / 2);
        free(x);
        free(buf);
    }

    /* int64 (QB histogram counts [E, N_b]) */
    {
        const int64_t n = 8 * 1024;
        int64_t *h = xmalloc(sizeof(int64_t) * n);
        for (int op = 0; op < 3; op++) {
            for (int64_t i = 0; i < n; i++)
                h[i] = (i * 7919 + me * 104729) % 1000 - 300 + ((int64_t)me << 40);
            CHECK(arl_dist_allreduce_i64(w, h, n, (arl_dist_op)op) == ARL_OK);
            int64_t bad = 0;
            for (int64_t i = 0; i < n; i++) {
                int64_t ref = 0;
                for (int32_t r = 0; r < R; r++) {
                    int64_t v = (i * 7919 + r * 104729) % 1000 - 300 + ((int64_t)r << 40);
                    ref = r == 0               ? v
                          : op == ARL_DIST_SUM ? ref + v
                          : op == ARL_DIST_MAX ? (v > ref ? v : ref)
                                               : (v < ref ? v : ref);
                }
                bad += h[i] != ref;
            }
            CHECK_EQ_INT(bad, 0);
        }
        free(h);
    }

    /* broadcast of a parameter arena from the last rank (odd size) */
    {
        const int64_t n = ((int64_t)1 << 20) + 3;
        const int32_t root = R - 1;
        float *a = xmalloc(sizeof(float) * n), *ref = xmalloc(sizeof(float) * n);
        gen_f32(ref, n, 55, root);
        if (me == root)
            memcpy(a, ref, sizeof(float) * n);
        else
            for (int64_t i = 0; i < n; i++)
                a[i] = NAN;
        CHECK(arl_dist_bcast_f32(w, a, n, root) == ARL_OK);
        CHECK(memcmp(a, ref, sizeof(float) * n) == 0);
        free(a);
        free(ref);
    }

    /* small byte messages: fixed size and root-only length (incl. empty) */
    {
        char fixed[16];
        memset(fixed, me == 0 ? 'w' : '?', sizeof fixed);
        CHECK(arl_dist_bcast_bytes(w, fixed, sizeof fixed, 0) == ARL_OK);
        for (size_t i = 0; i < sizeof fixed; i++)
            CHECK(fixed[i] == 'w');
        static const char text[] = "{\"weights_version\": 17, \"path\": \"ckpt/step-17\"}";
        for (int empty = 0; empty < 2; empty++) {
            void *msg = me == 0 ? (void *)text : NULL;
            int64_t len = me == 0 ? (empty ? 0 : (int64_t)sizeof text) : -1;
            CHECK(arl_dist_bcast_msg(w, &msg, &len, 0) == ARL_OK);
            CHECK_EQ_INT(len, empty ? 0 : (int64_t)sizeof text);
            CHECK(msg != NULL);
            if (msg && !empty) CHECK_STR_EQ((const char *)msg, text);
            if (me != 0) free(msg);
        }
    }

    /* all-gather and all-to-all of int64 */
    {
        int64_t mine[2] = {me, 10 * me}, *all = xmalloc(sizeof(int64_t) * 2 * R);
        CHECK(arl_dist_allgather_i64(w, mine, all, 2) == ARL_OK);
        for (int32_t r = 0; r < R; r++)
            CHECK(all[2 * r] == r && all[2 * r + 1] == 10 * r);
        int64_t *snd = xmalloc(sizeof(int64_t) * R), *rcv = xmalloc(sizeof(int64_t) * R);
        for (int32_t r = 0; r < R; r++)
            snd[r] = 100 * me + r;
        CHECK(arl_dist_alltoall_i64(w, snd, rcv, 1) == ARL_OK);
        for (int32_t s = 0; s < R; s++)
            CHECK_EQ_INT(rcv[s], 100 * s + me);
        free(all);
        free(snd);
        free(rcv);
    }

    /* all-to-all of float rows with empty pairs; two widths (the row type is re-made) */
    static const int64_t widths[] = {5, 7, 5};
    for (int wi = 0; wi < 3; wi++) {
        const int64_t W = widths[wi];
        int64_t *sr = xmalloc(sizeof(int64_t) * R), *rr = xmalloc(sizeof(int64_t) * R);
        int64_t ns = 0, nr = 0;
        for (int32_t r = 0; r < R; r++) {
            sr[r] = (me + 2 * r) % 3; /* rows me -> r */
            rr[r] = (r + 2 * me) % 3; /* rows r -> me */
            ns += sr[r];
            nr += rr[r];
        }
        float *snd = xmalloc(sizeof(float) * (size_t)(ns * W)),
              *rcv = xmalloc(sizeof(float) * (size_t)(nr * W));
        for (int32_t r = 0, at = 0; r < R; r++)
            for (int64_t i = 0; i < sr[r]; i++, at++)
                for (int64_t c = 0; c < W; c++)
                    snd[at * W + c] = (float)(1000 * me + 100 * r + 10 * i + c);
        CHECK(arl_dist_alltoallv_f32(w, snd, sr, rcv, rr, W) == ARL_OK);
        int64_t bad = 0;
        for (int32_t s = 0, at = 0; s < R; s++)
            for (int64_t i = 0; i < rr[s]; i++, at++)
                for (int64_t c = 0; c < W; c++)
                    bad += rcv[at * W + c] != (float)(1000 * s + 100 * me + 10 * i + c);
        CHECK_EQ_INT(bad, 0);
        free(sr);
        free(rr);
        free(snd);
        free(rcv);
    }
}

/* ---------------------------------------------------------------- roles */

static void test_roles(void) {
    const int32_t R = g_R, me = g_rank;
    /* colocated (the default): every rank learns and rolls out; P = R when R is small */
    {
        arl_dist *d = NULL;
        CHECK(arl_dist_init(&d, NULL, NULL) == ARL_OK);
        CHECK(!d->owns_mpi); /* main's arl_dist initialised MPI */
        arl_dist_opts o;
        arl_dist_opts_default(&o);
        o.expert_parallel = R;
        CHECK(arl_dist_assign_roles(d, &o) == ARL_OK);
        CHECK(d->layout.colocated);
        CHECK(d->learners && d->rollout && d->ep && d->dp);
        CHECK_EQ_INT(arl_dist_comm_size(d->learners), R);
        CHECK_EQ_INT(arl_dist_comm_size(d->rollout), R);
        CHECK_EQ_INT(arl_dist_comm_size(d->ep), R);
        CHECK_EQ_INT(arl_dist_comm_size(d->dp), 1);
        CHECK_EQ_INT(arl_dist_comm_rank(d->ep), me);
        arl_dist_finalize(d);
    }
    /* learners 0..L-1 with L = R-1 (at least 1), one or more rollout workers */
    if (R >= 2) {
        arl_dist *d = NULL;
        CHECK(arl_dist_init(&d, NULL, NULL) == ARL_OK);
        arl_dist_opts o;
        arl_dist_opts_default(&o);
        o.learners = R - 1;
        o.expert_parallel = (R - 1) % 2 == 0 ? 2 : 1;
        CHECK(arl_dist_assign_roles(d, &o) == ARL_OK);
        const int learner = me < R - 1;
        CHECK(!d->layout.colocated);
        CHECK_EQ_INT(d->layout.roles, learner ? ARL_DIST_ROLE_LEARNER : ARL_DIST_ROLE_ROLLOUT);
        CHECK((d->learners != NULL) == learner);
        CHECK((d->ep != NULL) == learner && (d->dp != NULL) == learner);
        CHECK((d->rollout != NULL) == !learner);
        if (learner) {
            const int32_t P = (int32_t)o.expert_parallel;
            CHECK_EQ_INT(arl_dist_comm_size(d->learners), R - 1);
            CHECK_EQ_INT(arl_dist_comm_rank(d->learners), me);
            CHECK_EQ_INT(arl_dist_comm_size(d->ep), P);
            CHECK_EQ_INT(arl_dist_comm_rank(d->ep), me % P);
            CHECK_EQ_INT(arl_dist_comm_size(d->dp), (R - 1) / P);
            CHECK_EQ_INT(arl_dist_comm_rank(d->dp), me / P);
            /* a reduction over the learners only: the rollout rank does not take part */
            double s = (double)me;
            CHECK(arl_dist_allreduce_f64(d->learners, &s, 1, ARL_DIST_SUM) == ARL_OK);
            CHECK(s == (double)(R - 1) * (R - 2) / 2);
            /* ep-group members: world ranks dp_index*P .. dp_index*P + P-1 */
            int64_t wr = me, sum = wr;
            CHECK(arl_dist_allreduce_i64(d->ep, &sum, 1, ARL_DIST_SUM) == ARL_OK);
            int64_t g0 = (me / P) * P;
            CHECK_EQ_INT(sum, P * g0 + P * (P - 1) / 2);
        } else {
            CHECK_EQ_INT(arl_dist_comm_size(d->rollout), 1);
            CHECK_EQ_INT(d->layout.rollout_index, 0);
        }
        /* weights to the rollout workers: broadcast over the world from learner 0 */
        float wts[33];
        for (int i = 0; i < 33; i++)
            wts[i] = me == 0 ? 0.25f * i : -1.0f;
        CHECK(arl_dist_bcast_f32(d->world, wts, 33, 0) == ARL_OK);
        for (int i = 0; i < 33; i++)
            CHECK(wts[i] == 0.25f * i);
        arl_dist_finalize(d);
    }
    /* ranks that read different options get the same error and split nothing */
    if (R >= 2) {
        arl_dist *d = NULL;
        CHECK(arl_dist_init(&d, NULL, NULL) == ARL_OK);
        arl_dist_opts o;
        arl_dist_opts_default(&o);
        o.learners = me == 0 ? 1 : 0;
        CHECK(arl_dist_assign_roles(d, &o) == ARL_ERR_CONFIG);
        CHECK(strstr(arl_error_msg(), "dist-learners") != NULL);
        CHECK(d->learners == NULL && d->rollout == NULL);
        arl_dist_finalize(d);
    }
    /* too many learners for the job: a config error on every rank */
    {
        arl_dist *d = NULL;
        CHECK(arl_dist_init(&d, NULL, NULL) == ARL_OK);
        arl_dist_opts o;
        arl_dist_opts_default(&o);
        o.learners = R + 1;
        CHECK(arl_dist_assign_roles(d, &o) == ARL_ERR_CONFIG);
        arl_dist_finalize(d);
    }
}

/* ---------------------------------------------------------------- dp */

/* Toy linear model y = W x + b, loss = 1/(2N) sum_i |W x_i + b - y_i|^2 over N examples.
 * Gradient accumulated in float over examples i0..i1-1, each term divided by N (the constant
 * normaliser of spec/objective.md 8.4: every rank divides its partial sum by the same N). */
enum { DP_IN = 8, DP_OUT = 3, DP_N = 64, DP_P = DP_OUT * (DP_IN + 1), DP_STEPS = 25 };
#define DP_LR 0.1f

static void dp_data(float *X, float *Y) {
    arl_rng g;
    arl_rng_seed(&g, 2024);
    float Wt[DP_OUT][DP_IN + 1];
    for (int o = 0; o < DP_OUT; o++)
        for (int j = 0; j <= DP_IN; j++)
            Wt[o][j] = (float)arl_rng_normal(&g);
    for (int i = 0; i < DP_N; i++) {
        for (int j = 0; j < DP_IN; j++)
            X[i * DP_IN + j] = (float)arl_rng_normal(&g);
        for (int o = 0; o < DP_OUT; o++) {
            float y = Wt[o][DP_IN];
            for (int j = 0; j < DP_IN; j++)
                y += Wt[o][j] * X[i * DP_IN + j];
            Y[i * DP_OUT + o] = y + 0.1f * (float)arl_rng_normal(&g);
        }
    }
}

/* g (DP_P) = sum_{i in [i0, i1)} dloss_i/dtheta, float, in example order; S (DP_P) (may be
 * NULL) += sum |term| in double (for the rounding bound). */
static void dp_grad(float *g, double *S, const float *th, const float *X, const float *Y, int i0,
                    int i1) {
    memset(g, 0, sizeof(float) * DP_P);
    for (int i = i0; i < i1; i++)
        for (int o = 0; o < DP_OUT; o++) {
            const float *w = th + o * (DP_IN + 1);
            float y = w[DP_IN];
            for (int j = 0; j < DP_IN; j++)
                y += w[j] * X[i * DP_IN + j];
            const float r = (y - Y[i * DP_OUT + o]) / (float)DP_N;
            for (int j = 0; j <= DP_IN; j++) {
                float term = j < DP_IN ? r * X[i * DP_IN + j] : r;
                g[o * (DP_IN + 1) + j] += term;
                if (S) S[o * (DP_IN + 1) + j] += fabs((double)term);
            }
        }
}

static double dp_loss(const float *th, const float *X, const float *Y) {
    double L = 0;
    for (int i = 0; i < DP_N; i++)
        for (int o = 0; o < DP_OUT; o++) {
            const float *w = th + o * (DP_IN + 1);
            double y = w[DP_IN];
            for (int j = 0; j < DP_IN; j++)
                y += (double)w[j] * X[i * DP_IN + j];
            L += 0.5 * (y - Y[i * DP_OUT + o]) * (y - Y[i * DP_OUT + o]) / DP_N;
        }
    return L;
}

/* DP_STEPS of SGD; dp = 1: this rank's contiguous shard + all-reduce; dp = 0: full batch.
 * bound (may be NULL) accumulates the rounding bound of the difference between the two. */
static void dp_train(float *th, int dp, double *bound, const float *X, const float *Y) {
    const int32_t R = g_R, me = g_rank;
    const int i0 = dp ? (int)((int64_t)DP_N * me / R) : 0;
    const int i1 = dp ? (int)((int64_t)DP_N * (me + 1) / R) : DP_N;
    arl_rng g;
    arl_rng_seed(&g, 99);
    for (int p = 0; p < DP_P; p++)
        th[p] = 0.1f * (float)arl_rng_normal(&g);
    float grad[DP_P];
    double S[DP_P];
    int max_shard = 0; /* largest shard: the partial sums' rounding */
    for (int32_t r = 0; r < R; r++) {
        int a = (int)((int64_t)DP_N * r / R), b = (int)((int64_t)DP_N * (r + 1) / R);
        if (b - a > max_shard) max_shard = b - a;
    }
    for (int step = 0; step < DP_STEPS; step++) {
        memset(S, 0, sizeof S);
        dp_grad(grad, S, th, X, Y, i0, i1);
        if (dp) CHECK(arl_dist_allreduce_f32(g_dist->world, grad, DP_P) == ARL_OK);
        double Smax = 0, thmax = 0;
        for (int p = 0; p < DP_P; p++) {
            if (S[p] > Smax) Smax = S[p];
            if (fabs(th[p]) > thmax) thmax = fabs(th[p]);
        }
        if (bound) {
            /* Tolerance (accumulated per step, from the full-batch run's S = sum |term|):
             * the one-process gradient is a recursive float sum of N terms (error <= (N-1) u S,
             * u = 2^-24); the data-parallel one sums each shard in float (<= (shard-1) u S)
             * and rounds the double sum over ranks once (<= u |g| <= u S).  So per step
             * |g_dp - g_1proc| <= (N + max shard) u S, times lr in the parameters, plus the
             * rounding of th - lr g in each run (<= 2u |th| each).  The SGD map is
             * non-expansive here (lr times the largest Hessian eigenvalue, about 1.8, is < 2),
             * so earlier differences do not grow: the bound is the sum over steps. */
            *bound +=
                DP_LR * (DP_N + max_shard) * ldexp(1.0, -24) * Smax + 4 * ldexp(1.0, -24) * thmax;
        }
        for (int p = 0; p < DP_P; p++)
            th[p] -= DP_LR * grad[p];
    }
}

static void test_dp(void) {
    float *X = xmalloc(sizeof(float) * DP_N * DP_IN), *Y = xmalloc(sizeof(float) * DP_N * DP_OUT);
    dp_data(X, Y);
    float th_ser[DP_P], th_dp[DP_P], th_dp2[DP_P], th0[DP_P];
    double bound = 0;
    dp_train(th_ser, 0, &bound, X, Y);
    dp_train(th_dp, 1, NULL, X, Y);
    dp_train(th_dp2, 1, NULL, X, Y);
    /* data-parallel training is bit-reproducible for a fixed rank count, on every rank */
    CHECK(memcmp(th_dp, th_dp2, sizeof th_dp) == 0);
    CHECK(same_on_all_ranks(g_dist->world, th_dp, sizeof th_dp));
    /* and equals the one-process full-batch run within the rounding bound */
    double maxdiff = 0;
    for (int p = 0; p < DP_P; p++)
        maxdiff = fmax(maxdiff, fabs((double)th_dp[p] - th_ser[p]));
    CHECK_MSG(maxdiff <= bound, "max |theta_dp - theta_serial| %.3g > bound %.3g", maxdiff, bound);
    if (g_rank == 0)
        fprintf(stderr,
                "dp: %d ranks, %d steps: max |theta_dp - theta_1proc| = %.3g (bound %.3g)\n", g_R,
                DP_STEPS, maxdiff, bound);
    /* training did something much larger than the tolerance (a test that can fail) */
    arl_rng g;
    arl_rng_seed(&g, 99);
    for (int p = 0; p < DP_P; p++)
        th0[p] = 0.1f * (float)arl_rng_normal(&g);
    double moved = 0;
    for (int p = 0; p < DP_P; p++)
        moved = fmax(moved, fabs((double)th_dp[p] - th0[p]));
    CHECK(moved > 1000 * bound);
    CHECK(dp_loss(th_dp, X, Y) < 0.5 * dp_loss(th0, X, Y));
    /* the all-reduce is needed: without it a multi-rank run is off by far more than the bound */
    if (g_R > 1) {
        float gl[DP_P], gf[DP_P];
        const int i0 = (int)((int64_t)DP_N * g_rank / g_R),
                  i1 = (int)((int64_t)DP_N * (g_rank + 1) / g_R);
        dp_grad(gl, NULL, th0, X, Y, i0, i1);
        dp_grad(gf, NULL, th0, X, Y, 0, DP_N);
        double d = 0;
        for (int p = 0; p < DP_P; p++)
            d = fmax(d, fabs((double)gl[p] - gf[p]));
        CHECK(d > 1e-3);
    }
    free(X);
    free(Y);
}

/* ---------------------------------------------------------------- ep (linear experts) */

enum { EP_W = 6 }; /* d_z of the test */

/* Expert e: out = A_e in + c_e, row by row in a fixed order (a row's result does not depend
 * on the block it is in). */
typedef struct lin_experts {
    int64_t E;
    float *A; /* (E, W, W) */
    float *c; /* (E, W) */
    /* checks of what each expert receives */
    const float *ref_in;      /* (sum of loads, W) unsharded grouped rows, expert by expert */
    const int64_t *ref_start; /* (E + 1) */
    int64_t calls_bad;
    int64_t rows_seen;
} lin_experts;

static void lin_row(const lin_experts *L, int64_t e, const float *x, float *y) {
    for (int a = 0; a < EP_W; a++) {
        float acc = L->c[e * EP_W + a];
        for (int b = 0; b < EP_W; b++)
            acc += L->A[(e * EP_W + a) * EP_W + b] * x[b];
        y[a] = acc;
    }
}

static arl_status lin_fn(void *user, int64_t e, int64_t n, const float *in, float *out) {
    lin_experts *L = user;
    /* the rows must be exactly the unsharded grouping: all tokens routed to e, global order */
    const int64_t r0 = L->ref_start[e], rn = L->ref_start[e + 1] - r0;
    if (n != rn || memcmp(in, L->ref_in + r0 * EP_W, sizeof(float) * (size_t)(n * EP_W)) != 0)
        L->calls_bad++;
    L->rows_seen += n;
    for (int64_t i = 0; i < n; i++)
        lin_row(L, e, in + i * EP_W, out + i * EP_W);
    return ARL_OK;
}

static arl_status failing_fn(void *user, int64_t e, int64_t n, const float *in, float *out) {
    (void)user;
    (void)n;
    (void)in;
    (void)out;
    return arl_errorf(ARL_ERR_INTERNAL, "expert %lld failed on purpose", (long long)e);
}

/* One scenario: global tokens Tg, rank r holds [t0[r], t0[r+1]); routes (Tg, k), z (Tg, W),
 * weights (Tg, k).  Reference: the unsharded grouped computation of policy/moe.c. */
static void ep_scenario(arl_dist_comm *c, const char *what, int64_t E, int64_t k, int64_t Tg,
                        const int64_t *t0, const int32_t *routes, const float *z,
                        const float *wts) {
    const int32_t R = arl_dist_comm_size(c), me = arl_dist_comm_rank(c);
    lin_experts L = {.E = E};
    arl_rng g;
    arl_rng_seed(&g, 31337);
    L.A = xmalloc(sizeof(float) * (size_t)(E * EP_W * EP_W));
    L.c = xmalloc(sizeof(float) * (size_t)(E * EP_W));
    for (int64_t i = 0; i < E * EP_W * EP_W; i++)
        L.A[i] = (float)(0.5 * arl_rng_normal(&g));
    for (int64_t i = 0; i < E * EP_W; i++)
        L.c[i] = (float)(0.1 * arl_rng_normal(&g));

    /* unsharded reference: group by expert in global token order, run, scatter, combine */
    int64_t *start = calloc((size_t)E + 1, sizeof(int64_t)), *fill = xmalloc(sizeof(int64_t) * E);
    for (int64_t s = 0; s < Tg * k; s++)
        start[routes[s] + 1]++;
    for (int64_t e = 0; e < E; e++)
        start[e + 1] += start[e];
    memcpy(fill, start, sizeof(int64_t) * E);
    float *gin = xmalloc(sizeof(float) * (size_t)(Tg * k * EP_W)),
          *gout = xmalloc(sizeof(float) * (size_t)(Tg * k * EP_W));
    int64_t *row = xmalloc(sizeof(int64_t) * (size_t)(Tg * k));
    for (int64_t t = 0; t < Tg; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t rr = fill[routes[t * k + j]]++;
            row[t * k + j] = rr;
            memcpy(gin + rr * EP_W, z + t * EP_W, sizeof(float) * EP_W);
        }
    for (int64_t e = 0; e < E; e++)
        for (int64_t i = start[e]; i < start[e + 1]; i++)
            lin_row(&L, e, gin + i * EP_W, gout + i * EP_W);
    float *slots_ref = xmalloc(sizeof(float) * (size_t)(Tg * k * EP_W)),
          *u_ref = xmalloc(sizeof(float) * (size_t)(Tg * EP_W));
    for (int64_t s = 0; s < Tg * k; s++)
        memcpy(slots_ref + s * EP_W, gout + row[s] * EP_W, sizeof(float) * EP_W);
    /* the combine of policy/moe.c (combine_rows): fp32 from 0, slot order j = 0..k-1 */
    for (int64_t t = 0; t < Tg; t++)
        for (int q = 0; q < EP_W; q++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < k; j++)
                acc += wts[t * k + j] * slots_ref[(t * k + j) * EP_W + q];
            u_ref[t * EP_W + q] = acc;
        }
    L.ref_in = gin;
    L.ref_start = start;

    /* sharded */
    const int64_t a = t0[me], T = t0[me + 1] - t0[me];
    arl_ep_plan *p = NULL;
    CHECK(arl_ep_plan_init(&p, c, E, k, EP_W) == ARL_OK);
    float *u = xmalloc(sizeof(float) * (size_t)(T * EP_W)),
          *slots = xmalloc(sizeof(float) * (size_t)(T * k * EP_W));
    for (int rep = 0; rep < 2; rep++) { /* a plan is rebuilt and reused */
        CHECK(arl_ep_plan_build(p, routes + a * k, T) == ARL_OK);
        CHECK(arl_ep_apply(p, z + a * EP_W, wts + a * k, lin_fn, &L, u, slots) == ARL_OK);
        CHECK_MSG(L.calls_bad == 0, "%s: an expert received rows other than the unsharded ones",
                  what);
        CHECK_MSG(T == 0 || memcmp(u, u_ref + a * EP_W, sizeof(float) * (size_t)(T * EP_W)) == 0,
                  "%s: combined u differs from the unsharded result", what);
        CHECK_MSG(T == 0 || memcmp(slots, slots_ref + a * k * EP_W,
                                   sizeof(float) * (size_t)(T * k * EP_W)) == 0,
                  "%s: per-slot outputs differ from the unsharded result", what);
    }
    /* this rank's experts processed exactly their global loads; all rows went somewhere */
    int64_t e_lo, e_hi, mine = 0;
    arl_ep_local_experts(p, &e_lo, &e_hi);
    CHECK_EQ_INT(e_lo, arl_ep_expert_lo(E, R, me));
    for (int64_t e = e_lo; e < e_hi; e++) {
        int64_t r0, n;
        arl_ep_expert_rows(p, e, &r0, &n);
        CHECK_EQ_INT(n, start[e + 1] - start[e]);
        mine += n;
    }
    CHECK_EQ_INT(arl_ep_recv_rows(p), mine);
    CHECK_EQ_INT(L.rows_seen, 2 * mine);
    int64_t *load = xmalloc(sizeof(int64_t) * E);
    memcpy(load, arl_ep_send_load(p), sizeof(int64_t) * E);
    CHECK(arl_dist_allreduce_i64(c, load, E, ARL_DIST_SUM) == ARL_OK);
    for (int64_t e = 0; e < E; e++)
        CHECK_EQ_INT(load[e], start[e + 1] - start[e]);

    /* backward-like exchange: per-slot rows out, plain per-token sums back */
    {
        float *src = xmalloc(sizeof(float) * (size_t)(T * k * EP_W)),
              *grp = xmalloc(sizeof(float) * (size_t)(arl_ep_recv_rows(p) * EP_W)),
              *back = xmalloc(sizeof(float) * (size_t)(T * k * EP_W)),
              *dz = xmalloc(sizeof(float) * (size_t)(T * EP_W));
        for (int64_t s = 0; s < T * k; s++)
            for (int q = 0; q < EP_W; q++)
                src[s * EP_W + q] = wts[a * k + s] * z[(a + s / k) * EP_W + q];
        CHECK(arl_ep_dispatch(p, src, 1, grp) == ARL_OK);
        for (int64_t e = e_lo; e < e_hi; e++) { /* "expert backward": scale rows by e + 1 */
            int64_t r0, n;
            arl_ep_expert_rows(p, e, &r0, &n);
            for (int64_t i = r0 * EP_W; i < (r0 + n) * EP_W; i++)
                grp[i] *= (float)(e + 1);
        }
        CHECK(arl_ep_return(p, grp, back) == ARL_OK);
        arl_ep_combine(dz, back, NULL, T, k, EP_W);
        int64_t bad = 0;
        for (int64_t t = 0; t < T; t++)
            for (int q = 0; q < EP_W; q++) {
                float ref = 0.0f;
                for (int64_t j = 0; j < k; j++) {
                    int64_t s = (a + t) * k + j;
                    ref += (wts[s] * z[(a + t) * EP_W + q]) * (float)(routes[s] + 1);
                }
                bad += dz[t * EP_W + q] != ref;
            }
        CHECK_MSG(bad == 0, "%s: per-slot dispatch/return: %lld values differ", what,
                  (long long)bad);
        free(src);
        free(grp);
        free(back);
        free(dz);
    }
    /* a failing expert on one rank: every rank completes the exchange (no hang) */
    CHECK(arl_ep_plan_build(p, routes + a * k, T) == ARL_OK);
    int fails_here = me == R - 1 && mine > 0;
    arl_status st =
        arl_ep_apply(p, z + a * EP_W, wts + a * k, fails_here ? failing_fn : lin_fn, &L, u, NULL);
    CHECK(st == (fails_here ? ARL_ERR_INTERNAL : ARL_OK));

    arl_ep_plan_free(p);
    free(load);
    free(u);
    free(slots);
    free(L.A);
    free(L.c);
    free(start);
    free(fill);
    free(gin);
    free(gout);
    free(row);
    free(slots_ref);
    free(u_ref);
}

/* routes of Tg tokens, k distinct experts each, drawn from [e0, e0 + ne) */
static void gen_routes(int32_t *routes, int64_t Tg, int64_t k, int64_t e0, int64_t ne,
                       uint64_t seed) {
    arl_rng g;
    arl_rng_seed(&g, seed);
    for (int64_t t = 0; t < Tg; t++)
        for (int64_t j = 0; j < k; j++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(e0 + (int64_t)arl_rng_below(&g, (uint64_t)ne));
                dup = 0;
                for (int64_t q = 0; q < j; q++)
                    dup |= routes[t * k + q] == e;
            } while (dup);
            routes[t * k + j] = e;
        }
}

static void test_ep(void) {
    arl_dist_comm *c = g_dist->world;
    const int32_t R = g_R, me = g_rank;
    enum { TG = 37 };
    int32_t routes[TG * 3];
    float z[TG * EP_W], wts[TG * 3];
    arl_rng g;
    arl_rng_seed(&g, 4242);
    for (int i = 0; i < TG * EP_W; i++)
        z[i] = (float)arl_rng_normal(&g);
    for (int i = 0; i < TG * 3; i++)
        wts[i] = (float)(0.2 + arl_rng_uniform(&g));
    int64_t *t0 = xmalloc(sizeof(int64_t) * (R + 1));

    /* uneven token blocks: rank r holds about (r + 1) shares */
    int64_t shares = (int64_t)R * (R + 1) / 2, acc = 0;
    for (int32_t r = 0; r <= R; r++) {
        t0[r] = r == R ? TG : TG * acc / shares;
        acc += r + 1;
    }

    /* E = 5 (blocks 3+2 over 2 ranks, 2+2+1 over 3), k = 2, random routes */
    gen_routes(routes, TG, 2, 0, 5, 1);
    ep_scenario(c, "random routes", 5, 2, TG, t0, routes, z, wts);

    /* all tokens on experts {0, 1} of rank 0: experts 2..4 and every other rank get no rows */
    gen_routes(routes, TG, 2, 0, 2, 2);
    ep_scenario(c, "rank 0 only", 5, 2, TG, t0, routes, z, wts);

    /* skewed: experts 0..3 only with k = 3, expert 4 (the last rank's) empty */
    gen_routes(routes, TG, 3, 0, 4, 3);
    ep_scenario(c, "skewed, empty expert", 5, 3, TG, t0, routes, z, wts);

    /* the last rank holds no tokens (and rank 0 all of them when R = 2) */
    if (R > 1) {
        int64_t *t1 = xmalloc(sizeof(int64_t) * (R + 1));
        for (int32_t r = 0; r <= R; r++)
            t1[r] = r >= R - 1 ? TG : TG * r / (R - 1);
        gen_routes(routes, TG, 2, 0, 5, 4);
        ep_scenario(c, "rank without tokens", 5, 2, TG, t1, routes, z, wts);
        free(t1);
    }

    /* E = 2, k = 1 over up to 3 ranks: the third rank owns no expert */
    gen_routes(routes, TG, 1, 0, 2, 5);
    ep_scenario(c, "fewer experts than ranks", 2, 1, TG, t0, routes, z, wts);

    /* E = 7, k = 3, many experts per rank */
    gen_routes(routes, TG, 3, 0, 7, 6);
    ep_scenario(c, "E 7 k 3", 7, 3, TG, t0, routes, z, wts);

    /* an invalid route on the last rank: it gets ARL_ERR_RANGE, the others ARL_ERR_PROTOCOL,
     * nobody hangs, and the plan works again afterwards */
    {
        arl_ep_plan *p = NULL;
        CHECK(arl_ep_plan_init(&p, c, 5, 2, EP_W) == ARL_OK);
        int32_t bad[4] = {0, 1, 2, me == R - 1 ? 9 : 3};
        arl_status st = arl_ep_plan_build(p, bad, 2);
        if (me == R - 1) {
            CHECK(st == ARL_ERR_RANGE);
            CHECK(strstr(arl_error_msg(), "token 1 slot 1") != NULL);
        } else {
            CHECK(st == ARL_ERR_PROTOCOL);
        }
        bad[3] = 3;
        CHECK(arl_ep_plan_build(p, bad, 2) == ARL_OK);
        float zz[2 * EP_W], back[4 * EP_W];
        for (int i = 0; i < 2 * EP_W; i++)
            zz[i] = (float)(i + 100 * me);
        float *grp = xmalloc(sizeof(float) * (size_t)(arl_ep_recv_rows(p) * EP_W + 1));
        CHECK(arl_ep_dispatch(p, zz, 0, grp) == ARL_OK);
        CHECK(arl_ep_return(p, grp, back) == ARL_OK); /* identity experts: rows come back */
        for (int s = 0; s < 4; s++)
            CHECK(memcmp(back + s * EP_W, zz + (s / 2) * EP_W, sizeof(float) * EP_W) == 0);
        free(grp);
        arl_ep_plan_free(p);
    }
    /* bad plan arguments */
    {
        arl_ep_plan *p = NULL;
        CHECK(arl_ep_plan_init(&p, c, 4, 5, EP_W) == ARL_ERR_ARG);
        CHECK(p == NULL);
        arl_ep_plan_free(NULL);
    }
    free(t0);
}

/* ---------------------------------------------------------------- moe (real expert math) */

typedef struct moe_ctx {
    const arl_moe_params *p;
    const arl_moe_cfg *c;
    float *gu, *h; /* (T_max, 2f), (T_max, f) */
} moe_ctx;

/* Routed expert e of policy/moe.c on n latent rows: W2_e act(W1_e z, W3_e z) (spec 7.1),
 * with the same GEMM calls as policy/moe.c's glu_fwd.  policy/moe.h exposes no per-expert
 * function, so the four calls are repeated here. */
static arl_status moe_expert_fn(void *user, int64_t e, int64_t n, const float *in, float *out) {
    const moe_ctx *X = user;
    const int64_t f = X->c->f, dz = X->c->dz;
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, n, f, dz, 1.0f, in, dz, X->p->w1 + e * f * dz, dz, 0.0f,
               X->gu, 2 * f);
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, n, f, dz, 1.0f, in, dz, X->p->w3 + e * f * dz, dz, 0.0f,
               X->gu + f, 2 * f);
    arl_glu_act_fwd(&X->c->act, X->h, X->gu, X->gu + f, n, f, 2 * f);
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, n, dz, f, 1.0f, X->h, f, X->p->w2 + e * dz * f, f, 0.0f,
               out, dz);
    return ARL_OK;
}

/* y (T, d) of Stable LatentMoE for this rank's tokens x (T, d) with the experts sharded over
 * c: routing and W_down on the own tokens, the experts through learner/ep, then the latent
 * norm, W_up and the shared experts on the own tokens. */
static void moe_ep_fwd(arl_dist_comm *c, float *y, int32_t *sel, const float *x, int64_t T,
                       const arl_moe_params *p, const arl_moe_cfg *cfg, int64_t T_max) {
    const int64_t d = cfg->d, E = cfg->E, k = cfg->k, dz = cfg->dz, f = cfg->f, fs = cfg->fs;
    float *pw = xmalloc(sizeof(float) * (size_t)(T * k + 1)),
          *s = xmalloc(sizeof(float) * (size_t)(T * E + 1)),
          *rws = xmalloc(sizeof(float) * (size_t)arl_router_ws_floats(T, E) + 16),
          *z = xmalloc(sizeof(float) * (size_t)(T * dz + 1)),
          *u = xmalloc(sizeof(float) * (size_t)(T * dz + 1));
    moe_ctx X = {p, cfg, xmalloc(sizeof(float) * (size_t)(T_max * k * 2 * f)),
                 xmalloc(sizeof(float) * (size_t)(T_max * k * f))};
    if (T > 0) {
        CHECK(arl_router_fwd(sel, pw, s, x, p->gate, p->gate_bias, NULL, T, d, E, k, cfg->rho,
                             rws) == ARL_OK);
        arl_k_linear_fwd(z, x, p->down_proj, T, d, dz);
    }
    arl_ep_plan *plan = NULL;
    CHECK(arl_ep_plan_init(&plan, c, E, k, dz) == ARL_OK);
    CHECK(arl_ep_plan_build(plan, sel, T) == ARL_OK);
    CHECK(arl_ep_apply(plan, z, pw, moe_expert_fn, &X, u, NULL) == ARL_OK);
    arl_ep_plan_free(plan);
    if (T > 0) {
        if (p->latent_norm) arl_k_rmsnorm_fwd(u, NULL, u, p->latent_norm, T, dz, cfg->eps);
        arl_k_linear_fwd(y, u, p->up_proj, T, dz, d);
        float *sgu = xmalloc(sizeof(float) * (size_t)(T * 2 * fs)),
              *sh = xmalloc(sizeof(float) * (size_t)(T * fs));
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, fs, d, 1.0f, x, d, p->shared_gate_proj, d, 0.0f,
                   sgu, 2 * fs);
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, fs, d, 1.0f, x, d, p->shared_up_proj, d, 0.0f,
                   sgu + fs, 2 * fs);
        arl_glu_act_fwd(&cfg->act, sh, sgu, sgu + fs, T, fs, 2 * fs);
        arl_k_gemm(ARL_K_NOTRANS, ARL_K_TRANS, T, d, fs, 1.0f, sh, fs, p->shared_down_proj, fs,
                   1.0f, y, d);
        free(sgu);
        free(sh);
    }
    free(pw);
    free(s);
    free(rws);
    free(z);
    free(u);
    free(X.gu);
    free(X.h);
}

static void test_moe(void) {
    arl_dist_comm *c = g_dist->world;
    const int32_t R = g_R, me = g_rank;
    const arl_moe_cfg cfg = {.d = 16,
                             .E = 6,
                             .k = 2,
                             .f = 8,
                             .dz = 8,
                             .fs = 8,
                             .rho = 2.5f,
                             .eps = 1e-6f,
                             .act = {.situ = 1, .beta1 = 4.0f, .beta2 = 25.0f}};
    const int64_t d = cfg.d, E = cfg.E, k = cfg.k, f = cfg.f, dz = cfg.dz, fs = cfg.fs;
    enum { TG = 29 };
    /* parameters and tokens from one seed (the same on every rank) */
    arl_rng g;
    arl_rng_seed(&g, 777);
    const int64_t n_par = E * d + E + dz * d + dz + d * dz + 3 * fs * d + 3 * E * f * dz;
    float *arena = xmalloc(sizeof(float) * (size_t)n_par), *q = arena;
    for (int64_t i = 0; i < n_par; i++)
        arena[i] = (float)(0.35 * arl_rng_normal(&g));
    arl_moe_params p;
    p.gate = q, q += E * d;
    p.gate_bias = q, q += E;
    p.down_proj = q, q += dz * d;
    p.latent_norm = q, q += dz;
    p.up_proj = q, q += d * dz;
    p.shared_gate_proj = q, q += fs * d;
    p.shared_up_proj = q, q += fs * d;
    p.shared_down_proj = q, q += d * fs;
    p.w1 = q, q += E * f * dz;
    p.w3 = q, q += E * f * dz;
    p.w2 = q, q += E * dz * f;
    for (int64_t i = 0; i < dz; i++)
        p.latent_norm[i] = 1.0f + 0.5f * p.latent_norm[i];
    float *x = xmalloc(sizeof(float) * TG * d);
    for (int64_t i = 0; i < TG * d; i++)
        x[i] = (float)arl_rng_normal(&g);

    /* unsharded reference: the whole batch through arl_moe_fwd */
    float *y_ref = xmalloc(sizeof(float) * TG * d);
    int32_t *sel_ref = xmalloc(sizeof(int32_t) * TG * k);
    float *ws = xmalloc(sizeof(float) * (size_t)arl_moe_ws_floats(&cfg, TG));
    arl_moe_out out = {.routes = sel_ref};
    CHECK(arl_moe_fwd(y_ref, &out, x, &p, &cfg, NULL, TG, ws) == ARL_OK);

    float *y = xmalloc(sizeof(float) * TG * d);
    int32_t *sel = xmalloc(sizeof(int32_t) * TG * k);

    /* (a) rank 0 holds all tokens, the experts are sharded: every GEMM has the shapes of the
     * unsharded layer, so y must be bit-identical to arl_moe_fwd */
    {
        const int64_t T = me == 0 ? TG : 0;
        moe_ep_fwd(c, y, sel, x, T, &p, &cfg, TG);
        if (me == 0) {
            CHECK(memcmp(sel, sel_ref, sizeof(int32_t) * TG * k) == 0);
            CHECK_MSG(memcmp(y, y_ref, sizeof(float) * TG * d) == 0,
                      "LatentMoE with sharded experts differs from arl_moe_fwd (all tokens on "
                      "rank 0)");
        }
    }
    /* (b) the tokens split over the ranks (data parallel + expert parallel) */
    {
        const int64_t a = TG * me / R, T = TG * (me + 1) / R - a;
        moe_ep_fwd(c, y, sel, x + a * d, T, &p, &cfg, TG);
        CHECK(memcmp(sel, sel_ref + a * k, sizeof(int32_t) * (size_t)(T * k)) == 0);
        /* Tolerance: the routed experts see bit-identical row blocks (learner/ep.h), but the
         * router logits, W_down, W_up and the shared-expert GEMMs now run on T < TG rows, and
         * OpenBLAS rounds a row differently depending on its tile position (kernels/gemm.h).
         * Each such product has K <= 16 terms of size O(1): |error| <= K 2^-24 sum|a||b|
         * ~ 16 * 6e-8 * 16 ~ 1.5e-5 before propagation through the norm (gain ~ 1/rms(u));
         * atol 1e-4 + rtol 1e-4 on outputs of size ~1-10 leaves a margin of a few and is far
         * below a real error (a wrong row, weight or expert changes y by O(0.1)). */
        check_close_f32("LatentMoE, tokens split over ranks", y, y_ref + a * d, (size_t)(T * d),
                        1e-4, 1e-4);
        double md = 0;
        for (int64_t i = 0; i < T * d; i++)
            md = fmax(md, fabs((double)y[i] - y_ref[a * d + i]));
        int64_t mdl = (int64_t)(md * 1e12);
        CHECK(arl_dist_allreduce_i64(c, &mdl, 1, ARL_DIST_MAX) == ARL_OK);
        if (me == 0)
            fprintf(stderr, "moe: %d ranks, tokens split: max |y - y_unsharded| = %.3g\n", R,
                    (double)mdl * 1e-12);
    }
    free(arena);
    free(x);
    free(y_ref);
    free(sel_ref);
    free(ws);
    free(y);
    free(sel);
}

/* ---------------------------------------------------------------- main */

static int want(const char *list, const char *name) {
    if (!strcmp(list, "all")) return 1;
    size_t n = strlen(name);
    for (const char *s = list; (s = strstr(s, name)) != NULL; s += n)
        if ((s == list || s[-1] == ',') && (s[n] == '\0' || s[n] == ',')) return 1;
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CASE[,CASE...]|all  (layout collectives roles dp ep moe)\n",
                argv[0]);
        return 2;
    }
    const char *cases = argv[1];
    if (arl_dist_init(&g_dist, &argc, &argv) != ARL_OK) {
        fprintf(stderr, "arl_dist_init: %s\n", arl_error_msg());
        return 1;
    }
    arl_k_threads_init(1); /* one thread per rank: the ranks share the machine's cores */
    g_R = arl_dist_comm_size(g_dist->world);
    g_rank = arl_dist_comm_rank(g_dist->world);
    if (want(cases, "layout")) TEST_RUN(test_layout);
    if (want(cases, "collectives")) TEST_RUN(test_collectives);
    if (want(cases, "roles")) TEST_RUN(test_roles);
    if (want(cases, "dp")) TEST_RUN(test_dp);
    if (want(cases, "ep")) TEST_RUN(test_ep);
    if (want(cases, "moe")) TEST_RUN(test_moe);
    int rc = test_finish();
    arl_k_threads_free();
    arl_dist_finalize(g_dist);
    return rc;
}
