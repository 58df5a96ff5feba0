/* tests/cuda/test_model_sparse.c: block-sparse MLA (spec/policy.md 4.5) in the device model's
 * inference paths (policy/model_device.h with mla_sparse_topk > 0) against the reference
 * (policy/model.h), on the tiny model with the model_tiny golden weights, chunks of n_c = 8
 * rows and k_c = 2 selected chunks: contexts of up to 13 chunks, so that the selection really
 * skips chunks (checked: the logits differ from dense MLA's).
 *
 *   test_model_sparse cpu   (unit) the "cpu" ops call the reference's own functions
 *                           (arl_mla_chunk_means_update, arl_mla_sparse_attn) in the reference's
 *                           order, so everything is compared BIT for bit (memcmp): the ops
 *                           themselves (and k_c >= the chunk count equal to the dense absorbed
 *                           op); the forward over fresh packed documents; forward_state over
 *                           several calls continuing three slots at mixed positions (a fresh
 *                           slot beside continuing ones, a reset slot, one-token steps);
 *                           prefill (two forwards over max_tokens) and decode steps; a slot
 *                           downloaded to a host state and uploaded into another slot (its
 *                           summaries recomputed there) continuing beside the original; a
 *                           reference state exported, imported and uploaded (a resume).  Also
 *                           the refusals: device training of a block-sparse model, a bad
 *                           mla_sparse_chunk; and that the sparse buffers are counted in
 *                           arl_model_dev_bytes.
 *   test_model_sparse cuda  (gpu; exit 77 without a device or CUDA) the same with the "cuda"
 *                           ops (kernels/cuda/sparse.cu), fp32 math:
 *                           - the summaries: bit-identical to the CPU's (the same fp32 adds in
 *                             the same order, one division);
 *                           - k_c >= the chunk count: bit-identical to the dense absorbed op
 *                             (kernels/cuda/mla.cu: the same arithmetic over rows 0..t);
 *                           - the sparse op on random rows: max|ref| form, atol 0, rtol 1e-5
 *                             (fp32 dot products and softmax sums in another order than the
 *                             CPU's GEMMs: ~1e-7 relative per sum of <= 48 terms; a wrong
 *                             chunk selected gives O(max|ref|));
 *                           - the model paths with the reference's routes forced (a near-tie of
 *                             the fp32 router scores must not switch an expert): max|ref| form,
 *                             atol 0, rtol 1e-3 per document block of logits, as
 *                             test_model_device's fp32 bound (reduction orders differ by ~1e-6
 *                             relative per op over 8 layers).  The chunk selection itself could
 *                             flip on a near-tie of sigma (|gap| ~ 1e-6 relative); the golden
 *                             weights' random rows give gaps far larger;
 *                           - decode steps with decode_graphs: captured once, replayed (the
 *                             summaries' update and the selection read the positions on the
 *                             device), the same bits as without.
 *                           Under tests/cuda/emu (tests/cuda/emu/run_emu.sh with
 *                           EMU_TESTS=test_model_sparse, mode "cuda-emu") every .cu kernel runs
 *                           on the CPU; the graph case runs there only when ARL_TEST_CASES
 *                           names it (slow).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "policy/mla.h"
#include "policy/model_device.h"
#include "policy/model_device_backward.h"
#include "policy/optimizer.h"
#include "tests/policy_model/tiny.h"

#define NC 8 /* mla_sparse_chunk */
#define KC 2 /* mla_sparse_topk */

static tiny_model TM;
static const arl_dev_ops *OPS;
static int EMU;       /* "cuda-emu": the emulator (every launch is slow): fewer steps */
static double RTOL;   /* < 0: bit for bit ("cpu"); else the max|ref| bound of the model paths */
static int FORCE;     /* 1: the device takes the reference's routes ("cuda") */

static arl_model_opts test_opts(int64_t topk) {
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = 64;
    o.max_docs = 4;
    o.max_context = 160;
    o.kda_chunk = 16;
    o.mla_sparse_chunk = NC;
    o.mla_sparse_topk = topk;
    return o;
}

static int32_t *rand_tokens(uint64_t seed, int64_t n) {
    arl_rng r;
    arl_rng_seed(&r, seed);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)arl_rng_below(&r, 256);
    t[0] = 256; /* <|bos|> */
    return t;
}

static void cmp_f32(const char *what, const float *dev, const float *ref, size_t n, double rtol) {
    if (rtol < 0)
        CHECK_MSG(!memcmp(dev, ref, sizeof(float) * n), "%s differ", what);
    else
        check_close_maxref_f32(what, dev, ref, n, 0.0, rtol);
}

/* Logits (T, V) compared per document block (cu, N). */
static void cmp_docs(const char *what, const float *dev, const float *ref, const int32_t *cu,
                     int32_t N) {
    const int64_t V = TM.cfg.dims.V;
    char name[160];
    for (int32_t i = 0; i < N; i++) {
        snprintf(name, sizeof name, "%s: logits of document %d", what, i);
        cmp_f32(name, dev + cu[i] * V, ref + cu[i] * V, (size_t)((cu[i + 1] - cu[i]) * V), RTOL);
    }
}

static void ref_init(arl_model *m, int64_t topk) {
    arl_model_opts o = test_opts(topk);
    if (arl_model_init(m, &TM.cfg, &TM.w, &o)) {
        fprintf(stderr, "model init: %s\n", arl_error_msg());
        exit(1);
    }
}

static void dev_init(arl_model_dev *md, int32_t n_slots, int32_t graphs) {
    arl_model_opts o = test_opts(KC);
    arl_model_dev_opts d = {.n_slots = n_slots, .bf16_weights = 0, .decode_graphs = graphs};
    if (arl_model_dev_init(md, OPS, &TM.cfg, &TM.w, &o, &d)) {
        fprintf(stderr, "device model init: %s\n", arl_error_msg());
        exit(1);
    }
}

/* ---- the ops on their own ---- */

static float *dev_put(const float *host, int64_t n, size_t *tok) {
    void *p = NULL;
    CHECK(OPS->mem_alloc(sizeof(float) * (size_t)(n > 0 ? n : 1), "test", &p, tok) == ARL_OK);
    if (host) CHECK(OPS->upload(p, host, sizeof(float) * (size_t)n) == ARL_OK);
    return p;
}
static void dev_get(float *host, const float *dev, int64_t n) {
    CHECK(OPS->sync() == ARL_OK);
    CHECK(OPS->download(host, dev, sizeof(float) * (size_t)n) == ARL_OK);
}

/* Random rows and queries of one sequence: the summaries in three pieces (a chunk left open
 * between them) against the reference's in one; the sparse op against arl_mla_sparse_attn;
 * with k_c >= the chunk count, against the dense absorbed op. */
static void test_ops(void) {
    const int64_t Hm = 2, rkv = 32, r = 16, R = rkv + r, S = 75, pos0 = 59, Tq = S - pos0;
    const int64_t nch = (S + NC - 1) / NC;
    const float scale = 1.0f / sqrtf(48.0f);
    float *cache = malloc(sizeof(float) * (size_t)(S * R));
    float *q = malloc(sizeof(float) * (size_t)(Tq * Hm * rkv));
    float *qp = malloc(sizeof(float) * (size_t)(Tq * Hm * r));
    arl_rng g;
    arl_rng_seed(&g, 4242);
    for (int64_t i = 0; i < S * R; i++)
        cache[i] = (float)arl_rng_normal(&g);
    for (int64_t i = 0; i < Tq * Hm * rkv; i++)
        q[i] = (float)arl_rng_normal(&g);
    for (int64_t i = 0; i < Tq * Hm * r; i++)
        qp[i] = (float)arl_rng_normal(&g);
    float *ref_means = calloc((size_t)(nch * R), sizeof(float));
    arl_mla_chunk_means_update(ref_means, cache, 0, S, R, NC);
    size_t t1, t2, t3, t4, t5, t6, t7;
    float *dc = dev_put(cache, S * R, &t1), *dq = dev_put(q, Tq * Hm * rkv, &t2);
    float *dqp = dev_put(qp, Tq * Hm * r, &t3), *dm = dev_put(NULL, nch * R, &t4);
    const int64_t pieces[4] = {0, 13, 40, S}; /* 13 and 75 leave chunks open */
    for (int i = 0; i < 3; i++)
        OPS->mla_chunk_means_update(dm, dc, pieces[i], pieces[i + 1], R, NC);
    float *got = malloc(sizeof(float) * (size_t)(nch * R));
    dev_get(got, dm, nch * R);
    CHECK_MSG(!memcmp(got, ref_means, sizeof(float) * (size_t)(nch * R)),
              "chunk summaries (three updates) differ from the reference's");
    /* the sparse op: queries at 59..74 (own chunks 7..9, k_c = 2 of 7..9 complete chunks) */
    const int64_t nout = Tq * Hm * rkv;
    float *ref_o = malloc(sizeof(float) * (size_t)nout), *o = malloc(sizeof(float) * (size_t)nout);
    const int64_t wsn = arl_mla_sparse_ws_floats(Tq, Hm, S, rkv, r, NC, 100);
    float *ws = malloc(sizeof(float) * (size_t)wsn);
    uint8_t *sel = malloc((size_t)(Tq * Hm * (nch + 1)));
    arl_mla_sparse_attn(ref_o, sel, nch + 1, q, qp, cache, ref_means, pos0, Tq, Hm, rkv, r, scale,
                        NC, KC, ws);
    int64_t skipped = 0; /* the selection must leave chunks out */
    for (int64_t p = 0; p < Tq * Hm; p++)
        for (int64_t j = 0; j < (pos0 + p / Hm) / NC; j++)
            skipped += sel[p * (nch + 1) + j] == 0;
    CHECK_MSG(skipped > 0, "the test selection skips no chunk");
    float *dws = dev_put(NULL, OPS->mla_sparse_ws_floats(Tq, Hm, S, rkv, r, NC, 100), &t5);
    float *dout = dev_put(NULL, nout, &t6);
    OPS->mla_sparse_attn(dout, dq, dqp, dc, dm, pos0, Tq, Hm, rkv, r, scale, NC, KC, dws);
    dev_get(o, dout, nout);
    cmp_f32("sparse op", o, ref_o, (size_t)nout, RTOL < 0 ? -1.0 : 1e-5);
    /* k_c = 100 >= every chunk count: the dense absorbed op's bits */
    float *dense = malloc(sizeof(float) * (size_t)nout);
    float *dws2 = dev_put(NULL, OPS->mla_absorbed_ws_floats(S, Hm, rkv, r) + 16, &t7);
    OPS->mla_absorbed_attn(dout, dq, dqp, dc, pos0, Tq, Hm, rkv, r, scale, dws2);
    dev_get(dense, dout, nout);
    OPS->mla_sparse_attn(dout, dq, dqp, dc, dm, pos0, Tq, Hm, rkv, r, scale, NC, 100, dws);
    dev_get(o, dout, nout);
    CHECK_MSG(!memcmp(o, dense, sizeof(float) * (size_t)nout),
              "sparse op with k_c >= the chunk count differs from the dense absorbed op");
    CHECK_MSG(memcmp(ref_o, dense, sizeof(float) * (size_t)nout) != 0,
              "k_c = 2 gave the dense result (nothing skipped)");
    OPS->mem_free(dws2, t7); /* the "cuda" arena releases in stack order */
    OPS->mem_free(dout, t6);
    OPS->mem_free(dws, t5);
    OPS->mem_free(dm, t4);
    OPS->mem_free(dqp, t3);
    OPS->mem_free(dq, t2);
    OPS->mem_free(dc, t1);
    free(cache);
    free(q);
    free(qp);
    free(ref_means);
    free(got);
    free(ref_o);
    free(o);
    free(ws);
    free(sel);
    free(dense);
}

/* ---- fresh documents ---- */

static void test_fresh(void) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t V = dm->V, T = 64;
    arl_model ref, dense;
    ref_init(&ref, KC);
    ref_init(&dense, 0);
    arl_model_dev md;
    dev_init(&md, 0, 0);
    /* packed: documents of 17, 33 and 14 tokens (3, 5 and 2 chunks); one document of 64 */
    const int32_t cus[2][5] = {{0, 17, 50, 64, 0}, {0, 64, 0, 0, 0}};
    const int32_t Ns[2] = {3, 1};
    float *lr = malloc(sizeof(float) * (size_t)(T * V));
    float *ld = malloc(sizeof(float) * (size_t)(T * V));
    float *lden = malloc(sizeof(float) * (size_t)(T * V));
    float *pr = malloc(sizeof(float) * T), *pd = malloc(sizeof(float) * T);
    int32_t *rr = malloc(sizeof(int32_t) * (size_t)(dm->n_moe * T * dm->k));
    int32_t *rd = malloc(sizeof(int32_t) * (size_t)(dm->n_moe * T * dm->k));
    for (int c = 0; c < (EMU ? 1 : 2); c++) {
        int32_t *tok = rand_tokens(900 + (uint64_t)c, T), tgt[64];
        arl_batch_next_token_targets(tgt, tok, cus[c], Ns[c], T);
        arl_batch b = {.tokens = tok, .T = T, .cu = cus[c], .N = Ns[c], .targets = tgt};
        arl_forward_out ro = {.logits = lr, .logprobs = pr, .routes = rr};
        CHECK_MSG(arl_model_forward(&ref, &b, &ro) == ARL_OK, "ref: %s", arl_error_msg());
        arl_batch bd = b;
        if (FORCE) bd.forced_routes = rr;
        arl_forward_out dout = {.logits = ld, .logprobs = pd, .routes = rd};
        CHECK_MSG(arl_model_dev_forward(&md, &bd, &dout) == ARL_OK, "dev: %s", arl_error_msg());
        char what[64];
        snprintf(what, sizeof what, "fresh case %d", c);
        cmp_docs(what, ld, lr, cus[c], Ns[c]);
        snprintf(what, sizeof what, "fresh case %d log-probs", c);
        cmp_f32(what, pd, pr, (size_t)T, RTOL);
        if (RTOL < 0)
            CHECK_MSG(!memcmp(rr, rd, sizeof(int32_t) * (size_t)(dm->n_moe * T * dm->k)),
                      "fresh case %d: routes differ", c);
        /* the selection matters: dense MLA gives other logits in the documents of > 3 chunks */
        arl_forward_out oden = {.logits = lden};
        CHECK(arl_model_forward(&dense, &b, &oden) == ARL_OK);
        double diff = 0.0, mx = 0.0;
        for (int64_t i = 0; i < T * V; i++) {
            diff = fmax(diff, fabs((double)lden[i] - lr[i]));
            mx = fmax(mx, fabs((double)lr[i]));
        }
        CHECK_MSG(diff > 1e-3 * mx, "fresh case %d: block-sparse equals dense (%g of %g)", c, diff,
                  mx);
        free(tok);
    }
    free(lr);
    free(ld);
    free(lden);
    free(pr);
    free(pd);
    free(rr);
    free(rd);
    arl_model_dev_free(&md);
    arl_model_free(&dense);
    arl_model_free(&ref);
}

/* ---- decode slots ---- */

/* One forward of documents (lens, N) continuing reference slots rs and device slots ds; the
 * device takes the reference's routes when FORCE.  Logits compared per document. */
static void pair_step(arl_model *m, arl_decode_state *st, const int32_t *rs, arl_model_dev *md,
                      const int32_t *ds, const int64_t *lens, int32_t N, uint64_t seed,
                      const char *what) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t V = dm->V;
    int32_t cu[8] = {0};
    for (int32_t i = 0; i < N; i++)
        cu[i + 1] = cu[i] + (int32_t)lens[i];
    const int64_t T = cu[N];
    int32_t *tok = rand_tokens(seed, T);
    for (int32_t i = 0; i < N; i++) /* no <|bos|> inside continuing documents */
        if (cu[i] > 0 || arl_model_dev_slot_pos(md, ds[i]) > 0) tok[cu[i]] = (int32_t)(seed % 200);
    float *lr = malloc(sizeof(float) * (size_t)(T * V));
    float *ld = malloc(sizeof(float) * (size_t)(T * V));
    int32_t *routes = malloc(sizeof(int32_t) * (size_t)(dm->n_moe * T * dm->k));
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = N};
    arl_forward_out ro = {.logits = lr, .routes = routes};
    CHECK_MSG(arl_model_forward_state(m, st, rs, &b, &ro) == ARL_OK, "%s: ref: %s", what,
              arl_error_msg());
    arl_batch bd = b;
    if (FORCE) bd.forced_routes = routes;
    arl_forward_out dout = {.logits = ld};
    CHECK_MSG(arl_model_dev_forward_state(md, ds, &bd, &dout) == ARL_OK, "%s: dev: %s", what,
              arl_error_msg());
    cmp_docs(what, ld, lr, cu, N);
    for (int32_t i = 0; i < N; i++)
        CHECK_EQ_INT(arl_model_dev_slot_pos(md, ds[i]), st->slots[rs[i]].pos);
    free(tok);
    free(lr);
    free(ld);
    free(routes);
}

static void test_state(void) {
    arl_model m;
    ref_init(&m, KC);
    arl_decode_state st;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 3, 160) == ARL_OK);
    arl_model_dev md;
    dev_init(&md, 3, 0);
    int32_t h;
    for (int i = 0; i < 3; i++)
        CHECK(arl_decode_state_join(&st, &h) == ARL_OK && h == i);
    const int32_t s01[2] = {0, 1}, s201[3] = {2, 0, 1}, s1[1] = {1}, s012[3] = {0, 1, 2};
    const int64_t l1[2] = {20, 13}, l2[3] = {9, 30, 5}, l3[1] = {40}, one[3] = {1, 1, 1};
    pair_step(&m, &st, s01, &md, s01, l1, 2, 31, "state call 1 (fresh slots 0, 1)");
    /* slot 2 fresh beside slots 0 (at 20) and 1 (at 13) */
    pair_step(&m, &st, s201, &md, s201, l2, 3, 32, "state call 2 (mixed positions)");
    if (!EMU) pair_step(&m, &st, s1, &md, s1, l3, 1, 33, "state call 3 (slot 1: 18 -> 58)");
    for (int k = 0; k < (EMU ? 2 : 4); k++) {
        char what[64];
        snprintf(what, sizeof what, "decode step %d of three slots", k);
        pair_step(&m, &st, s012, &md, s012, one, 3, 40 + (uint64_t)k, what);
    }
    /* slot 2 reset (its summaries emptied) and refilled beside slot 0 continuing */
    arl_decode_state_leave(&st, 2);
    CHECK(arl_decode_state_join(&st, &h) == ARL_OK && h == 2);
    CHECK(arl_model_dev_slot_reset(&md, 2) == ARL_OK);
    const int32_t s20[2] = {2, 0};
    const int64_t l4[2] = {25, 3};
    pair_step(&m, &st, s20, &md, s20, l4, 2, 50, "after a reset of slot 2");
    arl_model_dev_free(&md);
    arl_decode_state_free(&st);
    arl_model_free(&m);
}

/* arl_model_dev_prefill / _decode_step against arl_model_prefill / _decode_step ("cpu": the
 * routes cannot be forced through these calls, so "cuda" covers them with forward_state). */
static void test_prefill_decode(void) {
    const int64_t V = TM.cfg.dims.V;
    arl_model m;
    ref_init(&m, KC);
    arl_decode_state st;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 2, 160) == ARL_OK);
    arl_model_dev md;
    dev_init(&md, 2, 0);
    int32_t s0, s1, slots[2] = {0, 1};
    CHECK(arl_decode_state_join(&st, &s0) == ARL_OK && arl_decode_state_join(&st, &s1) == ARL_OK);
    int32_t *pa = rand_tokens(61, 90), *pb = rand_tokens(62, 21);
    float ra[384], da[384], rl[2 * 384], dl[2 * 384];
    float *rall = malloc(sizeof(float) * 21 * 384), *dall = malloc(sizeof(float) * 21 * 384);
    CHECK(V <= 384);
    /* 90 tokens in forwards of 64 + 26 (the second continues over kept summaries) */
    CHECK(arl_model_prefill(&m, &st, 0, pa, 90, NULL, 0, NULL, ra) == ARL_OK);
    CHECK(arl_model_dev_prefill(&md, 0, pa, 90, NULL, 0, NULL, da) == ARL_OK);
    CHECK_MSG(!memcmp(ra, da, sizeof(float) * (size_t)V), "prefill last logits differ");
    CHECK(arl_model_prefill(&m, &st, 1, pb, 21, NULL, 0, rall, ra) == ARL_OK);
    CHECK(arl_model_dev_prefill(&md, 1, pb, 21, NULL, 0, dall, da) == ARL_OK);
    CHECK_MSG(!memcmp(rall, dall, sizeof(float) * (size_t)(21 * V)), "prefill logits differ");
    for (int i = 0; i < 10; i++) { /* slot 0: 90 -> 100, crossing the chunk boundary at 96 */
        int32_t tok[2] = {pa[i + 1], pb[i + 1]};
        CHECK(arl_model_decode_step(&m, &st, slots, 2, tok, rl, NULL) == ARL_OK);
        CHECK(arl_model_dev_decode_step(&md, slots, 2, tok, dl, NULL) == ARL_OK);
        CHECK_MSG(!memcmp(rl, dl, sizeof(float) * (size_t)(2 * V)), "decode step %d differs", i);
    }
    free(pa);
    free(pb);
    free(rall);
    free(dall);
    arl_model_dev_free(&md);
    arl_decode_state_free(&st);
    arl_model_free(&m);
}

/* Slot transfer: device slot 0 -> host copy -> device slot 1, both continuing beside each
 * other (the uploaded slot's summaries are recomputed from its rows; the original's grew
 * forward by forward); a reference export -> import -> device slot 2 (a resume). */
static void test_transfer(void) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t R = dm->rkv + dm->r;
    arl_model m;
    ref_init(&m, KC);
    arl_decode_state st, cp;
    CHECK(arl_decode_state_init(&st, &TM.cfg, 3, 160) == ARL_OK);
    CHECK(arl_decode_state_init(&cp, &TM.cfg, 2, 160) == ARL_OK);
    arl_model_dev md;
    dev_init(&md, 3, 0);
    int32_t h0, h1, h2, c0, c1;
    CHECK(arl_decode_state_join(&st, &h0) == ARL_OK && arl_decode_state_join(&st, &h1) == ARL_OK);
    CHECK(arl_decode_state_join(&st, &h2) == ARL_OK);
    CHECK(arl_decode_state_join(&cp, &c0) == ARL_OK && arl_decode_state_join(&cp, &c1) == ARL_OK);
    const int32_t r0[1] = {0}, d0[1] = {0};
    const int64_t l45[1] = {45};
    pair_step(&m, &st, r0, &md, d0, l45, 1, 70, "transfer: slot 0 filled");
    /* device slot 0 -> host c0 (equal to the reference's slot 0) -> device slot 1 */
    CHECK(arl_model_dev_slot_download(&md, 0, &cp, c0, 0) == ARL_OK);
    CHECK_EQ_INT(cp.slots[c0].pos, 45);
    for (int64_t j = 0; j < dm->n_mla; j++)
        cmp_f32("transfer: downloaded latent rows", cp.slots[c0].latent[j], st.slots[h0].latent[j],
                (size_t)(45 * R), RTOL);
    CHECK(arl_model_dev_slot_upload(&md, 1, &cp, c0) == ARL_OK);
    /* the reference's twin of slot 0 in its slot 1 (export / import), then both continue:
     * 12 tokens (45 -> 57, over the chunk boundaries at 48 and 56), then a step */
    uint8_t *ex = NULL;
    size_t len = 0;
    CHECK(arl_decode_state_export_alloc(&st, h0, &ex, &len) == ARL_OK);
    CHECK(arl_decode_state_import(&st, h1, ex, len) == ARL_OK);
    const int32_t r01[2] = {0, 1}, d01[2] = {0, 1};
    const int64_t l12[2] = {12, 12}, one[2] = {1, 1};
    pair_step(&m, &st, r01, &md, d01, l12, 2, 71, "transfer: original and uploaded slots");
    pair_step(&m, &st, r01, &md, d01, one, 2, 72, "transfer: a step of both");
    /* a resume: the reference's slot 0 exported, imported into host c1 (summaries stale),
     * uploaded into device slot 2; a step there equals the reference's step on its slot 2 */
    free(ex);
    ex = NULL;
    CHECK(arl_decode_state_export_alloc(&st, h0, &ex, &len) == ARL_OK);
    CHECK(arl_decode_state_import(&cp, c1, ex, len) == ARL_OK);
    CHECK(arl_decode_state_import(&st, h2, ex, len) == ARL_OK);
    CHECK(arl_model_dev_slot_upload(&md, 2, &cp, c1) == ARL_OK);
    CHECK_EQ_INT(arl_model_dev_slot_pos(&md, 2), 58);
    const int32_t r2[1] = {2}, d2[1] = {2};
    const int64_t l9[1] = {9};
    pair_step(&m, &st, r2, &md, d2, l9, 1, 73, "transfer: resumed slot");
    free(ex);
    arl_model_dev_free(&md);
    arl_decode_state_free(&cp);
    arl_decode_state_free(&st);
    arl_model_free(&m);
}

/* ---- refusals and sizing ---- */

static void test_refusals(void) {
    arl_model_dev md;
    arl_model_opts o = test_opts(KC);
    o.mla_sparse_chunk = 0;
    CHECK(arl_model_dev_plan(&md, OPS, &TM.cfg, &o, NULL) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "mla_sparse_chunk") != NULL);
    /* the sparse buffers are counted: summaries of 3 slots x 2 MLA layers x 20 chunks */
    arl_model_opts od = test_opts(0), os = test_opts(KC);
    arl_model_dev_opts d3 = {.n_slots = 3, .bf16_weights = 0, .decode_graphs = 0};
    const arl_model_dims *dm = &TM.cfg.dims;
    int64_t bd = arl_model_dev_bytes(&TM.cfg, &od, OPS, &d3);
    int64_t bs = arl_model_dev_bytes(&TM.cfg, &os, OPS, &d3);
    CHECK_MSG(bd > 0 && bs >= bd + (int64_t)sizeof(float) * dm->n_mla * 3 * (160 / NC) *
                                        (dm->rkv + dm->r),
              "arl_model_dev_bytes: %lld sparse vs %lld dense", (long long)bs, (long long)bd);
    /* a block-sparse model trains on the device (tests/cuda/test_model_train_state.c sparse) */
    dev_init(&md, 1, 0);
    arl_optim_config oc;
    arl_optim_config_defaults(&oc);
    arl_model_dev_train tr;
    CHECK_MSG(arl_model_dev_train_init(&tr, &md, &oc) == ARL_OK, "%s", arl_error_msg());
    arl_model_dev_train_free(&tr);
    arl_optim_config_free(&oc);
    arl_model_dev_free(&md);
    arl_error_clear();
}

/* decode_graphs on a block-sparse model: the steps captured once and replayed, the same bits
 * as op by op (the prefills reach position 30 and 25: the steps cross chunk boundaries of 8,
 * so the summaries complete a chunk inside the replays). */
static void test_cuda_graphs(void) {
    const int64_t V = TM.cfg.dims.V;
    arl_model_dev a, b;
    dev_init(&a, 2, 0);
    dev_init(&b, 2, 1);
    int32_t *pa = rand_tokens(81, 30), slots[2] = {0, 1};
    float la[384], lb[384], sa[2 * 384], sb[2 * 384];
    for (int s = 0; s < 2; s++) {
        CHECK(arl_model_dev_prefill(&a, s, pa, 30 - 5 * s, NULL, 0, NULL, la) == ARL_OK);
        CHECK(arl_model_dev_prefill(&b, s, pa, 30 - 5 * s, NULL, 0, NULL, lb) == ARL_OK);
    }
    for (int i = 0; i < 6; i++) {
        int32_t tok[2] = {pa[i], pa[i + 1]};
        CHECK(arl_model_dev_decode_step(&a, slots, 2, tok, sa, NULL) == ARL_OK);
        CHECK_MSG(arl_model_dev_decode_step(&b, slots, 2, tok, sb, NULL) == ARL_OK, "%s",
                  arl_error_msg());
        CHECK_MSG(!memcmp(sa, sb, sizeof(float) * (size_t)(2 * V)), "graph step %d differs", i);
    }
    CHECK_MSG(b.graph != NULL && b.graph_replays == 5, "graph %p, %lld replays", b.graph,
              (long long)b.graph_replays);
    free(pa);
    arl_model_dev_free(&b);
    arl_model_dev_free(&a);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "cpu";
    tiny_load(&TM);
    if (strcmp(mode, "cuda") == 0 || strcmp(mode, "cuda-emu") == 0) {
        EMU = strcmp(mode, "cuda-emu") == 0;
        if (arl_cuda_device_count() == 0) {
            fprintf(stderr, "skip: no CUDA device (or a build without CUDA)\n");
            tiny_free(&TM);
            return TEST_SKIP;
        }
        arl_model_opts o = test_opts(KC);
        arl_model_dev_opts d3 = {.n_slots = 3, .bf16_weights = 0, .decode_graphs = 0};
        int64_t need = arl_model_dev_bytes(&TM.cfg, &o, arl_dev_ops_cuda(), &d3);
        /* two models at once (test_cuda_graphs) plus the context's own part */
        if (need < 0 || arl_dev_ops_get("cuda", 2 * (size_t)need + ((size_t)64 << 20), &OPS)) {
            fprintf(stderr, "cuda: %s\n", arl_error_msg());
            return 1;
        }
        arl_cuda_set_math(arl_cuda_current(), ARL_CUDA_MATH_FP32);
        RTOL = 1e-3;
        FORCE = 1;
        TEST_RUN(test_ops);
        TEST_RUN(test_fresh);
        TEST_RUN(test_state);
        TEST_RUN(test_transfer);
        if (!EMU || getenv("ARL_TEST_CASES")) TEST_RUN(test_cuda_graphs);
    } else {
        OPS = arl_dev_ops_cpu();
        RTOL = -1.0;
        FORCE = 0;
        TEST_RUN(test_ops);
        TEST_RUN(test_fresh);
        TEST_RUN(test_state);
        TEST_RUN(test_prefill_decode);
        TEST_RUN(test_transfer);
        TEST_RUN(test_refusals);
    }
    tiny_free(&TM);
    return test_finish();
}
