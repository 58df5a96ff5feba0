/* tests/cuda/test_model_train_state.c: segment-wise training over the device tables
 * (policy/model_device_backward.h arl_model_dev_train_forward_state / _backward_state and the
 * state-gradient slots) against the CPU reference (policy/model_backward.h
 * arl_model_train_forward(st, slots) / arl_model_backward(dstate)) on the tiny model with the
 * model_tiny golden weights (KDA, MLA, dense and MoE layers, AttnRes blocks; conv width 4).
 *
 * The sequence run on both sides, in lockstep:
 *   segment 1: two documents starting fresh in slots 0 and 1 (every document at position 0:
 *              the expanded MLA form with the rows appended to the slots), trained with
 *              random gradients of the states after the segment;
 *   segment 2: slot 0 continues (20 tokens), slot 2 starts fresh (17 tokens, crosses a KDA
 *              chunk of 16), slot 1 continues with 2 tokens (shorter than the conv tail
 *              W-1 = 3: the final-tail gradient flows partly into the incoming tail); the
 *              absorbed MLA form over the prefix rows, with random state gradients;
 *   segment 3: slot 0 continues, plain backward (parameter gradients only).
 * After each: the target log-probabilities, every parameter gradient, the advanced states
 * (S, conv tails, latent rows, positions; downloaded into a host arl_decode_state) and, for
 * segments 1 and 2, the state gradients before the segment (downloaded into a host gradient
 * state) are compared with the reference's.
 *
 *   test_model_train_state cpu   (unit) BIT-identical (memcmp): the "cpu" ops make the
 *                                reference's calls in the same order; plus the error cases.
 *   test_model_train_state cuda  (gpu; exit 77 without a device or a CUDA build) first the new
 *                                ops of the "cuda" table against the "cpu" table one by one
 *                                (tolerances at test_cuda_ops); then the segments, fp32 math
 *                                (ARL_CUDA_MATH_FP32), routes forced to the CPU's (a near-tie in
 *                                top-k cannot switch an expert).  Tolerances in the max|ref|
 *                                form, atol 0: log-probs rtol 1e-4 (~1e-6 relative per op
 *                                through 8 layers, as test_model_train.c's loss); parameter
 *                                gradients rtol 2e-3 and state gradients rtol 2e-3 (only
 *                                reduction orders differ; test_model_train.c's gradient bound;
 *                                the state gradients go through the same backward); states
 *                                rtol 1e-4 (forward values).  A wrong index, boundary or
 *                                missing term gives errors of order max|ref|.
 * The same segments with the device slots sharing 128 latent rows (shared: slot ranges made,
 * moved and grown with their contents and state gradients, policy/model_device_rows.c).
 * The same segments with block-sparse MLA (spec 4.5: chunks of 5 rows, k_c = 2; the documents
 * reach 8 chunks, so most queries select among earlier chunks): the absorbed form for fresh
 * documents too, each (token, head)'s selection kept for the backward (ops mla_sparse_*).
 * On the GPU with the cuda tolerances: the chunk scores are fp32 sums in another order, so a
 * (token, head) whose two best scores agree to ~1e-7 relative could select the other chunk
 * (a failure of order max|ref|, not of the kernels); random rows make that a ~1% event here.
 *   test_model_train_state cuda-emu  under tests/cuda/emu (every kernel on the CPU; each launch is
 *                                slow there): segment 1 on the reference only, its states
 *                                uploaded to the device's slots, then a shorter mixed segment 2,
 *                                with the cuda tolerances.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/ops.h"
#include "policy/model_backward.h"
#include "policy/model_device_backward.h"
#include "tests/cuda/cuda_open.h"
#include "tests/policy_model/tiny.h"

static tiny_model TM;
static const arl_dev_ops *OPS;
static int EXACT;  /* 1: "cpu" ops, memcmp */
static int SPARSE; /* 1: block-sparse MLA (SP_CHUNK, SP_TOPK) */
static int64_t SHARED; /* > 0: the device slots share that many latent rows (dopts.slot_rows) */

#define SP_CHUNK 5
#define SP_TOPK 2

#define NSLOT 4
#define MAXCTX 128

static arl_model_opts test_opts(void) {
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = 64;
    o.max_docs = 4;
    o.max_context = MAXCTX;
    o.kda_chunk = 16;
    if (SPARSE) {
        o.mla_sparse_topk = SP_TOPK;
        o.mla_sparse_chunk = SP_CHUNK;
    }
    return o;
}

static void optim_cfg(arl_optim_config *c) {
    arl_optim_config_defaults(c);
    c->lr = 1e-3;
}

static void rand_tokens(int32_t *t, uint64_t seed, int64_t n) {
    arl_rng r;
    arl_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)arl_rng_below(&r, 256);
}

/* Compare dev with ref (n floats): memcmp on "cpu", the max|ref| form otherwise. */
static void cmp(const char *what, const float *dev, const float *ref, int64_t n, double rtol) {
    if (n <= 0) return;
    if (EXACT) {
        CHECK_MSG(!memcmp(dev, ref, sizeof(float) * (size_t)n), "%s: not bit-identical", what);
        return;
    }
    check_close_maxref_f32(what, dev, ref, (size_t)n, 0.0, rtol);
}

/* The two sides. */
typedef struct sides {
    arl_model_params w, g; /* reference weights (copy) and gradients */
    arl_model m;
    arl_model_train tr;
    arl_decode_state st, gst; /* reference states and state gradients */
    arl_model_dev md;
    arl_model_dev_train dt;
    arl_decode_state dst, dgst; /* device states / state gradients, downloaded */
    float *gdev;                /* (weight floats) device gradients, downloaded */
} sides;

static void sides_init(sides *S) {
    memset(S, 0, sizeof *S);
    arl_model_opts o = test_opts();
    arl_optim_config oc;
    optim_cfg(&oc);
    CHECK(arl_model_params_alloc(&S->w, &TM.cfg) == ARL_OK);
    memcpy(S->w.arena, TM.w.arena, sizeof(float) * (size_t)TM.w.inv.arena_floats);
    CHECK(arl_model_params_alloc(&S->g, &TM.cfg) == ARL_OK);
    arl_model_dev_opts dopts = {.n_slots = NSLOT, .slot_rows = SHARED};
    if (arl_model_init(&S->m, &TM.cfg, &S->w, &o) ||
        arl_model_train_init(&S->tr, &S->m, NULL, NULL) ||
        arl_decode_state_init(&S->st, &TM.cfg, NSLOT, MAXCTX) ||
        arl_decode_state_init(&S->gst, &TM.cfg, NSLOT, MAXCTX) ||
        arl_decode_state_init(&S->dst, &TM.cfg, NSLOT, MAXCTX) ||
        arl_decode_state_init(&S->dgst, &TM.cfg, NSLOT, MAXCTX) ||
        arl_model_dev_init(&S->md, OPS, &TM.cfg, &TM.w, &o, &dopts) ||
        arl_model_dev_train_init(&S->dt, &S->md, &oc) || arl_model_dev_state_grads_init(&S->dt)) {
        fprintf(stderr, "init: %s\n", arl_error_msg());
        exit(1);
    }
    for (int i = 0; i < NSLOT; i++) {
        int32_t s;
        CHECK(arl_decode_state_join(&S->st, &s) == ARL_OK && s == i);
        CHECK(arl_decode_state_join(&S->dst, &s) == ARL_OK && s == i);
        CHECK(arl_decode_state_join(&S->dgst, &s) == ARL_OK && s == i);
    }
    S->gdev = malloc(sizeof(float) * (size_t)TM.w.inv.arena_floats);
    arl_optim_config_free(&oc);
}

static void sides_free(sides *S) {
    free(S->gdev);
    arl_model_dev_train_free(&S->dt);
    arl_model_dev_free(&S->md);
    arl_decode_state_free(&S->dgst);
    arl_decode_state_free(&S->dst);
    arl_decode_state_free(&S->gst);
    arl_decode_state_free(&S->st);
    arl_model_train_free(&S->tr);
    arl_model_free(&S->m);
    arl_model_params_free(&S->g);
    arl_model_params_free(&S->w);
}

/* Gradient slot `slot` of the reference at `end` with random values (S, tails, rows [0, end)),
 * uploaded to the device's gradient slot. */
static void rand_state_grad(sides *S, int32_t slot, int64_t end, uint64_t seed) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1), R = dm->rkv + dm->r;
    CHECK(arl_state_grad_prepare(&S->gst, slot, end) == ARL_OK);
    arl_decode_slot *h = &S->gst.slots[slot];
    arl_rng g;
    arl_rng_seed(&g, seed);
    for (int64_t i = 0; i < dm->n_kda * sn; i++)
        h->kda_S[i] = 0.1f * (float)arl_rng_normal(&g);
    for (int64_t i = 0; i < dm->n_kda * tn; i++)
        h->kda_conv[i] = 0.1f * (float)arl_rng_normal(&g);
    for (int64_t j = 0; j < dm->n_mla; j++)
        for (int64_t i = 0; i < end * R; i++)
            h->latent[j][i] = 0.1f * (float)arl_rng_normal(&g);
    CHECK_MSG(arl_model_dev_state_grad_upload(&S->dt, slot, &S->gst, slot) == ARL_OK, "%s",
              arl_error_msg());
}

/* Compare the slots of two host states: position, S, tails, latent rows. */
static void cmp_states(const char *what, const arl_decode_state *dev, const arl_decode_state *ref,
                       const int32_t *slots, int32_t n, double rtol) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t sn = dm->H * dm->dk * dm->dv, tn = 3 * dm->P * (dm->W - 1), R = dm->rkv + dm->r;
    char w[160];
    for (int32_t i = 0; i < n; i++) {
        const arl_decode_slot *a = &dev->slots[slots[i]], *b = &ref->slots[slots[i]];
        CHECK_MSG(a->pos == b->pos, "%s slot %d: position %lld vs %lld", what, slots[i],
                  (long long)a->pos, (long long)b->pos);
        snprintf(w, sizeof w, "%s slot %d S", what, slots[i]);
        cmp(w, a->kda_S, b->kda_S, dm->n_kda * sn, rtol);
        snprintf(w, sizeof w, "%s slot %d tails", what, slots[i]);
        cmp(w, a->kda_conv, b->kda_conv, dm->n_kda * tn, rtol);
        for (int64_t j = 0; j < dm->n_mla && b->pos > 0; j++) {
            snprintf(w, sizeof w, "%s slot %d latent rows of MLA layer %lld", what, slots[i],
                     (long long)j);
            cmp(w, a->latent[j], b->latent[j], b->pos * R, rtol);
        }
    }
}

/* One segment on both sides: forward from the slots, backward (with random state gradients
 * after the segment when dstate), comparisons.  The reference runs first; its routes are
 * forced on the device when not exact.  ref_only: the reference's forward only, its states
 * then uploaded into the device's slots (arl_model_dev_slot_upload). */
static void segment(sides *S, const char *name, const int32_t *slots, const int32_t *cu, int32_t N,
                    uint64_t seed, int dstate, int ref_only) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t T = cu[N], nf = TM.w.inv.arena_floats;
    int32_t tok[64], tgt[64];
    float lp_ref[64], lp_dev[64], dlogp[64];
    int32_t *routes = malloc(sizeof(int32_t) * (size_t)(dm->n_moe * T * dm->k + 1));
    rand_tokens(tok, seed, T);
    arl_batch_next_token_targets(tgt, tok, cu, N, T);
    for (int64_t t = 0; t < T; t++)
        dlogp[t] = tgt[t] >= 0 ? -0.05f * (float)(1 + t % 3) : 0.0f;
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = N, .targets = tgt};
    int64_t end[8];
    for (int32_t i = 0; i < N; i++)
        end[i] = S->st.slots[slots[i]].pos + cu[i + 1] - cu[i];
    if (dstate)
        for (int32_t i = 0; i < N; i++)
            rand_state_grad(S, slots[i], end[i], seed * 31 + (uint64_t)i);

    /* reference */
    memset(S->g.arena, 0, sizeof(float) * (size_t)nf);
    arl_forward_out oref = {.logprobs = lp_ref, .routes = routes};
    CHECK_MSG(arl_model_train_forward(&S->tr, &b, &S->st, slots, &oref) == ARL_OK,
              "%s reference forward: %s", name, arl_error_msg());
    if (ref_only) {
        for (int32_t i = 0; i < N; i++)
            CHECK_MSG(arl_model_dev_slot_upload(&S->md, slots[i], &S->st, slots[i]) == ARL_OK, "%s",
                      arl_error_msg());
        free(routes);
        return;
    }
    CHECK_MSG(arl_model_backward(&S->tr, &b, dlogp, &S->g, dstate ? &S->gst : NULL, NULL) == ARL_OK,
              "%s reference backward: %s", name, arl_error_msg());

    /* device */
    arl_batch bd = b;
    if (!EXACT) bd.forced_routes = routes;
    CHECK(arl_model_dev_zero_grad(&S->dt) == ARL_OK);
    arl_forward_out odev = {.logprobs = lp_dev};
    CHECK_MSG(arl_model_dev_train_forward_state(&S->dt, &bd, slots, &odev) == ARL_OK,
              "%s device forward: %s", name, arl_error_msg());
    arl_status s = dstate ? arl_model_dev_backward_state(&S->dt, &bd, dlogp)
                          : arl_model_dev_backward(&S->dt, &bd, dlogp);
    CHECK_MSG(s == ARL_OK, "%s device backward: %s", name, arl_error_msg());

    char w[160];
    snprintf(w, sizeof w, "%s log-probs", name);
    cmp(w, lp_dev, lp_ref, T, 1e-4);
    CHECK(arl_model_dev_grads_download(&S->dt, S->gdev) == ARL_OK);
    for (int64_t i = 0; i < S->g.inv.n; i++) {
        const arl_param_tensor *t = &S->g.inv.t[i];
        snprintf(w, sizeof w, "%s grad %s", name, t->name);
        cmp(w, S->gdev + t->offset, S->g.arena + t->offset, t->numel, 2e-3);
    }
    /* the gradients are not trivially equal: most layer tensors receive one */
    int64_t nonzero = 0, trained = 0;
    for (int64_t i = 0; i < S->g.inv.n; i++) {
        const arl_param_tensor *t = &S->g.inv.t[i];
        if (t->no_grad || t->layer < 0) continue;
        trained++;
        for (int64_t j = 0; j < t->numel; j++)
            if (S->g.arena[t->offset + j] != 0.0f) {
                nonzero++;
                break;
            }
    }
    CHECK_MSG(nonzero >= trained * 9 / 10, "%s: only %lld of %lld layer tensors have gradients",
              name, (long long)nonzero, (long long)trained);

    /* the advanced states */
    for (int32_t i = 0; i < N; i++) {
        CHECK(arl_model_dev_slot_pos(&S->md, slots[i]) == end[i]);
        CHECK_MSG(arl_model_dev_slot_download(&S->md, slots[i], &S->dst, slots[i], 0) == ARL_OK,
                  "%s", arl_error_msg());
    }
    snprintf(w, sizeof w, "%s state", name);
    cmp_states(w, &S->dst, &S->st, slots, N, 1e-4);

    /* the state gradients before the segment */
    if (dstate) {
        for (int32_t i = 0; i < N; i++) {
            CHECK(arl_model_dev_state_grad_pos(&S->dt, slots[i]) == end[i] - (cu[i + 1] - cu[i]));
            CHECK_MSG(arl_model_dev_state_grad_download(&S->dt, slots[i], &S->dgst, slots[i]) ==
                          ARL_OK,
                      "%s", arl_error_msg());
        }
        snprintf(w, sizeof w, "%s state gradient", name);
        cmp_states(w, &S->dgst, &S->gst, slots, N, 2e-3);
        /* not trivially zero: the gradient of a continuing document's prefix rows */
        const arl_decode_slot *g0 = &S->gst.slots[slots[0]];
        double mx = 0;
        for (int64_t j = 0; j < dm->n_kda * dm->H * dm->dk * dm->dv; j++)
            mx = fabs(g0->kda_S[j]) > mx ? fabs(g0->kda_S[j]) : mx;
        CHECK_MSG(mx > 0, "%s: zero state gradient", name);
    }
    free(routes);
}

/* emu (the emulator's case: every launch is slow there): segment 1 on the reference only,
 * its states uploaded; then a shorter mixed segment 2 (a continuing document, a fresh one
 * crossing a KDA chunk, a 2-token one) with state gradients, compared; no segment 3. */
static void run_segments(int emu) {
    sides S;
    sides_init(&S);
    const int32_t s1[2] = {0, 1}, cu1[3] = {0, 23, 41};
    segment(&S, emu ? "segment 1 (reference, uploaded)" : "segment 1 (fresh)", s1, cu1, 2, 0x5E61,
            !emu, emu);
    const int32_t s2[3] = {0, 2, 1}, cu2[4] = {0, 20, 37, 39}, cu2e[4] = {0, 9, 26, 28};
    segment(&S, "segment 2 (mixed)", s2, emu ? cu2e : cu2, 3, 0x5E62, 1, 0);
    const int32_t s3[1] = {0}, cu3[2] = {0, 12};
    if (!emu) segment(&S, "segment 3 (no state gradient)", s3, cu3, 1, 0x5E63, 0, 0);
    sides_free(&S);
}

static void test_segments(void) {
    run_segments(0);
}

static void test_segments_emu(void) {
    run_segments(1);
}

static void test_segments_sparse(void) {
    SPARSE = 1;
    run_segments(0);
    SPARSE = 0;
}

/* The device slots sharing 128 latent rows (dopts.slot_rows; 4 x 128 otherwise): segment 2's
 * state gradients move slot 0's range (its rows and its gradient rows) past slot 1's, slot 2
 * takes the rows slot 0 left, segment 3 grows slot 0 in place; the same bits. */
static void test_segments_shared(void) {
    SHARED = 128;
    run_segments(0);
    SHARED = 0;
}

static void test_segments_sparse_emu(void) {
    SPARSE = 1;
    run_segments(1);
    SPARSE = 0;
}

static void test_errors(void) {
    sides S;
    sides_init(&S);
    int32_t tok[20], tgt[20];
    float dlogp[20] = {0};
    rand_tokens(tok, 9, 20);
    const int32_t cu[3] = {0, 12, 20};
    arl_batch_next_token_targets(tgt, tok, cu, 2, 20);
    arl_batch b = {.tokens = tok, .T = 20, .cu = cu, .N = 2, .targets = tgt};
    arl_model_dev_train *dt = &S.dt;
    const int32_t out_of_range[2] = {0, NSLOT}, negative[2] = {-1, 0}, repeated[2] = {1, 1};
    CHECK(arl_model_dev_train_forward_state(dt, &b, out_of_range, NULL) == ARL_ERR_STATE);
    CHECK(strstr(arl_error_msg(), "slot 4") != NULL);
    CHECK(arl_model_dev_train_forward_state(dt, &b, negative, NULL) == ARL_ERR_STATE);
    CHECK(arl_model_dev_train_forward_state(dt, &b, repeated, NULL) == ARL_ERR_STATE);
    CHECK(strstr(arl_error_msg(), "twice") != NULL);
    CHECK(arl_model_dev_train_forward_state(dt, &b, NULL, NULL) == ARL_ERR_ARG);
    CHECK(arl_model_dev_slot_pos(&S.md, 0) == 0); /* nothing advanced */
    /* backward_state after a fresh forward, and without a forward */
    CHECK(arl_model_dev_backward_state(dt, &b, dlogp) == ARL_ERR_STATE);
    CHECK(arl_model_dev_train_forward(dt, &b, NULL) == ARL_OK);
    CHECK(arl_model_dev_backward_state(dt, &b, dlogp) == ARL_ERR_ARG);
    /* a gradient slot at another position than the end of the segment */
    const int32_t ok[2] = {2, 3};
    CHECK(arl_model_dev_train_forward_state(dt, &b, ok, NULL) == ARL_OK);
    CHECK(arl_model_dev_slot_pos(&S.md, 2) == 12 && arl_model_dev_slot_pos(&S.md, 3) == 8);
    CHECK(arl_model_dev_state_grad_prepare(dt, 2, 12) == ARL_OK);
    CHECK(arl_model_dev_state_grad_prepare(dt, 3, 7) == ARL_OK);
    CHECK(arl_model_dev_backward_state(dt, &b, dlogp) == ARL_ERR_STATE);
    CHECK(strstr(arl_error_msg(), "slot 3") != NULL);
    CHECK(arl_model_dev_state_grad_prepare(dt, 3, 8) == ARL_OK);
    CHECK(arl_model_dev_backward_state(dt, &b, dlogp) == ARL_OK);
    CHECK(arl_model_dev_state_grad_pos(dt, 2) == 0 && arl_model_dev_state_grad_pos(dt, 3) == 0);
    /* past max_context */
    CHECK(arl_model_dev_state_grad_prepare(dt, 0, MAXCTX + 1) == ARL_ERR_RANGE);
    CHECK(arl_model_dev_state_grad_prepare(dt, NSLOT, 0) == ARL_ERR_RANGE);
    int32_t big[64];
    rand_tokens(big, 3, 64);
    arl_batch bb = {.tokens = big, .T = 64};
    const int32_t one[1] = {1};
    CHECK(arl_model_dev_train_forward_state(dt, &bb, one, NULL) == ARL_OK); /* 64 */
    CHECK(arl_model_dev_train_forward_state(dt, &bb, one, NULL) == ARL_OK); /* 128 */
    CHECK(arl_model_dev_train_forward_state(dt, &bb, one, NULL) == ARL_ERR_RANGE);
    CHECK(strstr(arl_error_msg(), "max_context") != NULL);
    /* a train object without state-gradient slots */
    arl_model_dev_train t2;
    arl_optim_config oc;
    optim_cfg(&oc);
    arl_model_dev_train_free(&S.dt);
    CHECK(arl_model_dev_train_init(&t2, &S.md, &oc) == ARL_OK);
    CHECK(arl_model_dev_train_forward_state(&t2, &b, ok, NULL) == ARL_OK);
    CHECK(arl_model_dev_backward_state(&t2, &b, dlogp) == ARL_ERR_STATE);
    CHECK(strstr(arl_error_msg(), "arl_model_dev_state_grads_init") != NULL);
    CHECK(arl_model_dev_state_grad_prepare(&t2, 0, 0) == ARL_ERR_STATE);
    arl_model_dev_train_free(&t2);
    arl_optim_config_free(&oc);
    /* a model without slots */
    arl_model_dev m2;
    arl_model_opts o = test_opts();
    CHECK(arl_model_dev_init(&m2, OPS, &TM.cfg, &TM.w, &o, NULL) == ARL_OK);
    optim_cfg(&oc);
    CHECK(arl_model_dev_train_init(&t2, &m2, &oc) == ARL_OK);
    CHECK(arl_model_dev_state_grads_init(&t2) == ARL_ERR_STATE);
    CHECK(arl_model_dev_train_forward_state(&t2, &b, ok, NULL) == ARL_ERR_STATE);
    arl_model_dev_train_free(&t2);
    arl_model_dev_free(&m2);
    arl_optim_config_free(&oc);
    sides_free(&S);
}

/* ---- cuda: the new ops against the "cpu" table, op by op ---- */

/* One device block for the op tests: bump pieces of it, uploaded from host arrays. */
typedef struct dblock {
    void *base;
    size_t token, used, cap;
} dblock;

static float *dput(dblock *B, const float *host, int64_t n) {
    float *p = (float *)((char *)B->base + B->used);
    B->used += ((size_t)n * sizeof(float) + 255) & ~(size_t)255;
    ARL_ASSERT(B->used <= B->cap);
    if (host) CHECK(OPS->upload(p, host, sizeof(float) * (size_t)n) == ARL_OK);
    return p;
}

static float *rnd(int64_t n, uint64_t seed, float scale) {
    float *x = malloc(sizeof(float) * (size_t)n);
    arl_rng g;
    arl_rng_seed(&g, seed);
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * (float)arl_rng_normal(&g);
    return x;
}

/* Download n floats of dev and compare with ref in the max|ref| form. */
static void dcmp(const char *what, const float *dev, const float *ref, int64_t n, double rtol) {
    float *h = malloc(sizeof(float) * (size_t)n);
    CHECK(OPS->sync() == ARL_OK && OPS->download(h, dev, sizeof(float) * (size_t)n) == ARL_OK);
    check_close_maxref_f32(what, h, ref, (size_t)n, 0.0, rtol);
    free(h);
}

/* Tolerances (max|ref| form): the conv-tail ops rtol 1e-5 (the same fp32 expression per element;
 * expf may differ by an ulp on the device); the absorbed core rtol 1e-4 (the dot products and
 * the softmax sums run in another order, and the softmax sum in double: ~1e-6 relative; a wrong
 * row, head or boundary gives O(max|ref|)). */
/* The block-sparse core (chunks of 5, k_c 2): a document after a prefix of 37 rows (70
 * queries: crosses the device backward's blocks of 64 queries; up to 21 chunks), one from
 * position 0 (a query's own chunk and the dense case J <= k_c included).  The selected lists
 * must be equal (random rows: no near-ties), the rest within the absorbed core's bounds.  The
 * backward runs three times (gradients accumulating): without and with dprefix, then with the
 * entries sorted by chunk in windows of 4 chunks (6 windows, the last of 2 chunks). */
static void sparse_ops(dblock *B) {
    const arl_dev_ops *C = arl_dev_ops_cpu();
    const int64_t Hm = 2, rkv = 16, r = 8, R = rkv + r, n_c = 5, k_c = 2;
    const float scale = 0.2f;
    for (int c = 0; c < 2; c++) {
        const int64_t p0 = c == 0 ? 37 : 0, Tq = c == 0 ? 70 : 23, M = p0 + Tq;
        B->used = 0;
        float *rows = rnd(M * R, 110 + c, 1.0f), *qh = rnd(Tq * Hm * rkv, 120 + c, 1.0f);
        float *qp = rnd(Tq * Hm * r, 130 + c, 1.0f), *dO = rnd(Tq * Hm * rkv, 140 + c, 1.0f);
        float *ohat = malloc(sizeof(float) * (size_t)(Tq * Hm * rkv));
        float *lse = malloc(sizeof(float) * (size_t)(Tq * Hm));
        int32_t *list = malloc(sizeof(int32_t) * (size_t)(Tq * Hm * k_c));
        int32_t *dlist_h = malloc(sizeof(int32_t) * (size_t)(Tq * Hm * k_c));
        float *dqh = rnd(Tq * Hm * rkv, 150 + c, 0.1f), *dqp = rnd(Tq * Hm * r, 160 + c, 0.1f);
        float *dnew = rnd(Tq * R, 170 + c, 0.1f), *dpre = rnd(p0 > 0 ? p0 * R : 1, 180 + c, 0.1f);
        float *ws = malloc(sizeof(float) *
                           (size_t)C->mla_sparse_train_ws_floats(Tq, M, Hm, rkv, r, n_c, k_c));
        float *drows = dput(B, rows, M * R), *dqh_in = dput(B, qh, Tq * Hm * rkv);
        float *dqp_in = dput(B, qp, Tq * Hm * r), *ddO = dput(B, dO, Tq * Hm * rkv);
        float *dohat = dput(B, NULL, Tq * Hm * rkv), *dlse = dput(B, NULL, Tq * Hm);
        int32_t *dlist = (int32_t *)dput(B, NULL, Tq * Hm * k_c);
        float *ddqh = dput(B, dqh, Tq * Hm * rkv), *ddqp = dput(B, dqp, Tq * Hm * r);
        float *ddnew = dput(B, dnew, Tq * R), *ddpre = dput(B, dpre, p0 > 0 ? p0 * R : 1);
        float *dws = dput(B, NULL, OPS->mla_sparse_train_ws_floats(Tq, M, Hm, rkv, r, n_c, k_c));
        C->mla_sparse_fwd_save(ohat, lse, list, qh, qp, rows, p0, Tq, Hm, rkv, r, scale, n_c, k_c,
                               ws);
        OPS->mla_sparse_fwd_save(dohat, dlse, dlist, dqh_in, dqp_in, drows, p0, Tq, Hm, rkv, r,
                                 scale, n_c, k_c, dws);
        dcmp("mla_sparse_fwd_save ohat", dohat, ohat, Tq * Hm * rkv, 1e-4);
        dcmp("mla_sparse_fwd_save lse", dlse, lse, Tq * Hm, 1e-4);
        CHECK(OPS->download(dlist_h, dlist, sizeof(int32_t) * (size_t)(Tq * Hm * k_c)) == ARL_OK);
        CHECK_MSG(!memcmp(dlist_h, list, sizeof(int32_t) * (size_t)(Tq * Hm * k_c)),
                  "mla_sparse_fwd_save: the selected chunks differ");
        /* not the dense case everywhere: the last query selected fewer chunks than it has */
        const int64_t J_last = (M - 1) / n_c;
        CHECK(J_last > k_c && list[(Tq * Hm - 1) * k_c + k_c - 1] >= 0);
        for (int pass = 0; pass < 3; pass++) { /* pass 2: the entries' sort in 4-chunk windows */
            const int with_pre = pass > 0;
            const int32_t was = arl_cuda_mla_sparse_bwd_window(pass == 2 ? 4 : 0);
            CHECK(OPS->upload(dohat, ohat, sizeof(float) * (size_t)(Tq * Hm * rkv)) == ARL_OK);
            CHECK(OPS->upload(dlse, lse, sizeof(float) * (size_t)(Tq * Hm)) == ARL_OK);
            C->mla_sparse_bwd(dqh, dqp, dnew, with_pre ? dpre : NULL, dO, ohat, lse, list, qh, qp,
                              rows, p0, Tq, Hm, rkv, r, scale, n_c, k_c, ws);
            OPS->mla_sparse_bwd(ddqh, ddqp, ddnew, with_pre ? ddpre : NULL, ddO, dohat, dlse, dlist,
                                dqh_in, dqp_in, drows, p0, Tq, Hm, rkv, r, scale, n_c, k_c, dws);
            arl_cuda_mla_sparse_bwd_window(was);
            dcmp("mla_sparse_bwd dqhat", ddqh, dqh, Tq * Hm * rkv, 1e-4);
            dcmp("mla_sparse_bwd dq_pe", ddqp, dqp, Tq * Hm * r, 1e-4);
            dcmp("mla_sparse_bwd dnew", ddnew, dnew, Tq * R, 1e-4);
            if (p0 > 0) dcmp("mla_sparse_bwd dprefix", ddpre, dpre, p0 * R, 1e-4);
        }
        free(rows), free(qh), free(qp), free(dO), free(ohat), free(lse), free(list), free(dlist_h);
        free(dqh), free(dqp), free(dnew), free(dpre), free(ws);
    }
}

static void test_cuda_ops(void) {
    const arl_dev_ops *C = arl_dev_ops_cpu();
    dblock B = {.cap = (size_t)8 << 20};
    CHECK(OPS->mem_alloc(B.cap, "op test", &B.base, &B.token) == ARL_OK);
    { /* conv tails: three documents, one shorter than W-1 */
        const int32_t cu[4] = {0, 2, 9, 20}, N = 3;
        const int64_t T = 20, Cc = 24, W = 4, tl = Cc * (W - 1);
        float *x = rnd(T * Cc, 1, 1.0f), *w = rnd(Cc * W, 2, 0.5f), *tails = rnd(N * tl, 3, 1.0f);
        float *dz = rnd(T * Cc, 4, 1.0f), *dtail = rnd(N * tl, 5, 1.0f);
        float *dpre = rnd(T * Cc, 6, 1.0f), *dout = rnd(N * tl, 7, 1.0f);
        int32_t *dcu = (int32_t *)dput(&B, NULL, 4);
        CHECK(OPS->upload(dcu, cu, sizeof cu) == ARL_OK);
        float *dx = dput(&B, x, T * Cc), *dw = dput(&B, w, Cc * W), *dt = dput(&B, tails, N * tl);
        float *ddz = dput(&B, dz, T * Cc), *ddtail = dput(&B, dtail, N * tl);
        float *ddpre = dput(&B, dpre, T * Cc), *ddout = dput(&B, dout, N * tl);
        for (int with_tails = 0; with_tails < 2; with_tails++) {
            C->kda_conv_tail_bwd(dtail, dz, x, w, with_tails ? tails : NULL, cu, N, T, Cc, W);
            OPS->kda_conv_tail_bwd(ddtail, ddz, dx, dw, with_tails ? dt : NULL, dcu, N, T, Cc, W);
            dcmp(with_tails ? "conv_tail_bwd (tails)" : "conv_tail_bwd (zero tails)", ddtail, dtail,
                 N * tl, 1e-5);
        }
        for (int with_in = 0; with_in < 2; with_in++) {
            C->kda_conv_tail_out_bwd(dpre, with_in ? dtail : NULL, dout, cu, N, T, Cc, W);
            OPS->kda_conv_tail_out_bwd(ddpre, with_in ? ddtail : NULL, ddout, dcu, N, T, Cc, W);
            dcmp("conv_tail_out_bwd dpre", ddpre, dpre, T * Cc, 1e-5);
            dcmp("conv_tail_out_bwd dtail_in", ddtail, dtail, N * tl, 1e-5);
        }
        free(x), free(w), free(tails), free(dz), free(dtail), free(dpre), free(dout);
    }
    /* the absorbed core: a document after a prefix of 37 rows (21 queries: crosses a query
     * block of 16 on the device), and one from position 0 */
    const int64_t Hm = 2, rkv = 16, r = 8, R = rkv + r;
    const float scale = 0.2f;
    for (int c = 0; c < 2; c++) {
        const int64_t p0 = c == 0 ? 37 : 0, Tq = c == 0 ? 21 : 9, M = p0 + Tq;
        B.used = 0;
        float *rows = rnd(M * R, 10 + c, 1.0f), *qh = rnd(Tq * Hm * rkv, 20 + c, 1.0f);
        float *qp = rnd(Tq * Hm * r, 30 + c, 1.0f), *dO = rnd(Tq * Hm * rkv, 40 + c, 1.0f);
        float *ohat = malloc(sizeof(float) * (size_t)(Tq * Hm * rkv));
        float *lse = malloc(sizeof(float) * (size_t)(Tq * Hm));
        float *dqh = rnd(Tq * Hm * rkv, 50 + c, 0.1f), *dqp = rnd(Tq * Hm * r, 60 + c, 0.1f);
        float *dnew = rnd(Tq * R, 70 + c, 0.1f), *dpre = rnd(p0 > 0 ? p0 * R : 1, 80 + c, 0.1f);
        float *ws = malloc(sizeof(float) * (size_t)C->mla_abs_train_ws_floats(M, Hm, rkv, r));
        float *drows = dput(&B, rows, M * R), *dqh_in = dput(&B, qh, Tq * Hm * rkv);
        float *dqp_in = dput(&B, qp, Tq * Hm * r), *ddO = dput(&B, dO, Tq * Hm * rkv);
        float *dohat = dput(&B, NULL, Tq * Hm * rkv), *dlse = dput(&B, NULL, Tq * Hm);
        float *ddqh = dput(&B, dqh, Tq * Hm * rkv), *ddqp = dput(&B, dqp, Tq * Hm * r);
        float *ddnew = dput(&B, dnew, Tq * R), *ddpre = dput(&B, dpre, p0 > 0 ? p0 * R : 1);
        float *dws = dput(&B, NULL, OPS->mla_abs_train_ws_floats(M, Hm, rkv, r));
        C->mla_abs_fwd_save(ohat, lse, qh, qp, rows, p0, Tq, Hm, rkv, r, scale, ws);
        OPS->mla_abs_fwd_save(dohat, dlse, dqh_in, dqp_in, drows, p0, Tq, Hm, rkv, r, scale, dws);
        dcmp("mla_abs_fwd_save ohat", dohat, ohat, Tq * Hm * rkv, 1e-4);
        dcmp("mla_abs_fwd_save lse", dlse, lse, Tq * Hm, 1e-4);
        for (int with_pre = 0; with_pre < 2; with_pre++) {
            /* both sides from the reference's forward, so only the backward is compared */
            CHECK(OPS->upload(dohat, ohat, sizeof(float) * (size_t)(Tq * Hm * rkv)) == ARL_OK);
            CHECK(OPS->upload(dlse, lse, sizeof(float) * (size_t)(Tq * Hm)) == ARL_OK);
            C->mla_abs_bwd(dqh, dqp, dnew, with_pre ? dpre : NULL, dO, ohat, lse, qh, qp, rows, p0,
                           Tq, Hm, rkv, r, scale, ws);
            OPS->mla_abs_bwd(ddqh, ddqp, ddnew, with_pre ? ddpre : NULL, ddO, dohat, dlse, dqh_in,
                             dqp_in, drows, p0, Tq, Hm, rkv, r, scale, dws);
            dcmp("mla_abs_bwd dqhat", ddqh, dqh, Tq * Hm * rkv, 1e-4);
            dcmp("mla_abs_bwd dq_pe", ddqp, dqp, Tq * Hm * r, 1e-4);
            dcmp("mla_abs_bwd dnew", ddnew, dnew, Tq * R, 1e-4);
            if (p0 > 0) dcmp("mla_abs_bwd dprefix", ddpre, dpre, p0 * R, 1e-4);
        }
        free(rows), free(qh), free(qp), free(dO), free(ohat), free(lse), free(dqh), free(dqp);
        free(dnew), free(dpre), free(ws);
    }
    sparse_ops(&B);
    OPS->mem_free(B.base, B.token);
}

int main(int argc, char **argv) {
    const char *dev = argc > 1 ? argv[1] : "cpu";
    tiny_load(&TM);
    if (strcmp(dev, "cpu") == 0) {
        OPS = arl_dev_ops_cpu();
        EXACT = 1;
        TEST_RUN(test_segments);
        TEST_RUN(test_segments_sparse);
        TEST_RUN(test_segments_shared);
        TEST_RUN(test_errors);
    } else {
        /* the model with 4 slots of 128 rows, its training block, the state gradients and
         * the context's own part: 256 MiB */
        int rc = test_cuda_open((size_t)256 << 20, &OPS);
        if (rc) {
            tiny_free(&TM);
            return rc;
        }
        arl_cuda_set_math(arl_cuda_current(), ARL_CUDA_MATH_FP32);
        /* ARL_TEST_CASES=ops: the op tests only (a quick run under the emulator, e.g. with
         * EMU_ASAN=1 for the kernels' indexing); =sparse: the ops and the block-sparse
         * segments only (the emulator's default is the dense segments) */
        const char *cases = getenv("ARL_TEST_CASES");
        const int ops_only = cases && strcmp(cases, "ops") == 0;
        const int sparse_only = cases && strcmp(cases, "sparse") == 0;
        const int emu = strcmp(dev, "cuda-emu") == 0;
        TEST_RUN(test_cuda_ops);
        if (!ops_only && !sparse_only) {
            if (emu)
                TEST_RUN(test_segments_emu);
            else
                TEST_RUN(test_segments);
        }
        if (!ops_only && !sparse_only && !emu) TEST_RUN(test_segments_shared);
        if (!ops_only && (sparse_only || !emu)) {
            if (emu)
                TEST_RUN(test_segments_sparse_emu);
            else
                TEST_RUN(test_segments_sparse);
        }
    }
    tiny_free(&TM);
    return test_finish();
}
