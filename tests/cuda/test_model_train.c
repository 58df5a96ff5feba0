/* tests/cuda/test_model_train.c: the training step over the device tables
 * (policy/model_device_backward.h) against the CPU reference (policy/model_backward.h
 * arl_model_loss_and_grad + policy/optimizer.h arl_adamw_step), on the tiny model with the
 * model_tiny golden weights (O(1) activations in every stage; KDA, MLA, dense and MoE layers,
 * AttnRes blocks, shared experts, latent norm).
 *
 *   test_model_train cpu   (unit) the "cpu" ops make exactly the reference's calls in the same
 *                          order, so loss, every gradient, the grad norm, both AdamW moments and
 *                          the updated weights must be BIT-identical (memcmp over the whole
 *                          arenas): two steps (the second from the first one's weights and
 *                          moments: bias correction of step 2), a packed batch of ragged
 *                          documents crossing KDA chunk boundaries (kda_chunk 16), then the
 *                          same batch with forced routes; plus the error cases.
 *   test_model_train cuda  (gpu; exit 77 without a device or a CUDA build) one full step with
 *                          the "cuda" ops vs the CPU reference, routes forced to the CPU's (a
 *                          near-tie in top-k cannot switch an expert):
 *                          - fp32 math (ARL_CUDA_MATH_FP32): loss rtol 1e-4; every tensor's
 *                            gradient in the max|ref| form, atol 0, rtol 2e-3 (fp32
 *                            throughout, only reduction orders differ, ~1e-6 relative per op,
 *                            grown through 8 layers forward and back; a wrong index or
 *                            boundary gives O(max|ref|)); the AdamW update delta = p_new -
 *                            p_old: on the first step it is ~ -lr sign(g) (m / sqrt(v) = g /
 *                            |g|), so an element whose gradient is near 0 may flip sign under
 *                            any rounding difference: every |delta_dev - delta_ref| <= 2.2 lr
 *                            (a flip plus the decay term) and >= 99% of elements within
 *                            1e-2 lr;
 *                          - bf16 GEMM inputs (ARL_CUDA_MATH_BF16; dense GEMMs, the MoE
 *                            grouped GEMMs and their weight gradients and the MLA attention,
 *                            forward and backward, on tensor cores): loss rtol 2e-2;
 *                            gradients rtol 0.15 in the max|ref| form per tensor, and the
 *                            relative L2 error of all gradients together <= 0.05.  bf16
 *                            operands carry 2^-9 relative rounding each (spec 16.4 allows 2e-2
 *                            on outputs); gradients go through twice as many GEMMs, and the
 *                            small tensors' gradients are sums with heavy
 *                            cancellation (A_log: one value per head, a sum over T x dk terms
 *                            each far larger than the total), where the H200 measured up to 8%
 *                            of max|ref| (A_log of layer 2; expert w3 5.6%).  A wrong index,
 *                            boundary or missing term gives errors of order max|ref|.
 *                          - bf16 weight copies (test_cuda_bf16_weights_step): two bf16
 *                            steps; after each, every copy is the new fp32 weight rounded,
 *                            exactly; the losses those of a model without copies within
 *                            2e-2 relative and the weights within 5 lr (the copies model's
 *                            forward GEMMs take other kernels: sums in other orders, each
 *                            able to flip a bf16 rounding downstream; AdamW moves a weight
 *                            by at most about lr a step whatever its gradient: two models
 *                            differ by 2 lr a step at most, plus the decay's part);
 *                          - which weights the training forward reads
 *                            (test_cuda_bf16_weights_forward): with copies, under the bf16
 *                            math mode its log-probs are the inference forward's within 2e-3
 *                            of max|ref| (the same bf16 operands, sums perhaps in other
 *                            orders); with the copies replaced by halved weights both move
 *                            (by far more) and still agree, while under the fp32 math mode
 *                            the training forward's do not move at all (it reads the masters);
 *                            and the copies' log-probs are the fp32 masters' within 3e-2 of
 *                            max|ref| (test_model_device's bf16-weights bound).
 *   test_model_train cuda-emu  the fp32 case under tests/cuda/emu (every kernel on the CPU);
 *                          ARL_TEST_CASES=test_cuda_bf16 (or test_cuda_bf16_weights_step,
 *                          test_cuda_bf16_weights_forward) runs that case there instead.
 * Both devices also train on image rows in place of the <|media_pad|> placeholders
 * (test_cpu_media bit-identical, test_cuda_media in the fp32 bounds), and a block-sparse MLA
 * model (spec 4.5, chunks of 5 tokens, k_c 2: the 33-token document's queries choose among up
 * to 6 earlier chunks; test_cpu_sparse bit-identical with and without activation
 * checkpointing, test_cuda_sparse in the fp32 bounds).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "policy/model_backward.h"
#include "policy/model_device_backward.h"
#include "tests/cuda/cuda_open.h"
#include "tests/policy_model/tiny.h"

static tiny_model TM;
static const arl_dev_ops *OPS;
static int g_sparse; /* the models of a case (reference and device) are block-sparse */

static const int32_t CU[4] = {0, 17, 50, 57}; /* ragged; crosses chunks of 16 */
#define NT 57
#define ND 3

static arl_model_opts test_opts(void) {
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = 64;
    o.max_docs = 8;
    o.max_context = 256;
    o.kda_chunk = 16;
    if (g_sparse) {
        o.mla_sparse_topk = 2;
        o.mla_sparse_chunk = 5;
    }
    return o;
}

static void optim_cfg(arl_optim_config *c) {
    arl_optim_config_defaults(c);
    c->lr = 1e-3;
    c->weight_decay = 0.1;
    c->clip_norm = 1.0; /* the tiny model's gradient norm is above 1: clipping runs */
    c->warmup_steps = 0;
}

static void rand_tokens(int32_t *t, uint64_t seed, int64_t n) {
    arl_rng r;
    arl_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++)
        t[i] = (int32_t)arl_rng_below(&r, 266);
    for (int i = 0; i < ND; i++)
        t[CU[i]] = 256; /* <|bos|> */
}

/* k distinct experts per (MoE layer, token), random. */
static void rand_routes(int32_t *r, uint64_t seed) {
    const arl_model_dims *dm = &TM.cfg.dims;
    arl_rng g;
    arl_rng_seed(&g, seed);
    for (int64_t j = 0; j < dm->n_moe * NT; j++)
        for (int64_t a = 0; a < dm->k; a++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)arl_rng_below(&g, (uint64_t)dm->E);
                dup = 0;
                for (int64_t c = 0; c < a; c++)
                    dup |= r[j * dm->k + c] == e;
            } while (dup);
            r[j * dm->k + a] = e;
        }
}

/* The CPU reference: model, trainer, gradient arena and optimizer over a copy of the weights. */
typedef struct ref_run {
    arl_model_params w, g;
    arl_model m;
    arl_model_train tr;
    arl_adamw opt;
} ref_run;

static void ref_init(ref_run *R, const arl_optim_config *oc) {
    arl_model_opts o = test_opts();
    CHECK(arl_model_params_alloc(&R->w, &TM.cfg) == ARL_OK);
    memcpy(R->w.arena, TM.w.arena, sizeof(float) * (size_t)TM.w.inv.arena_floats);
    CHECK(arl_model_params_alloc(&R->g, &TM.cfg) == ARL_OK);
    if (arl_model_init(&R->m, &TM.cfg, &R->w, &o) ||
        arl_model_train_init(&R->tr, &R->m, NULL, NULL) || arl_adamw_init(&R->opt, &TM.cfg, oc)) {
        fprintf(stderr, "reference init: %s\n", arl_error_msg());
        exit(1);
    }
}

static void ref_free(ref_run *R) {
    arl_adamw_free(&R->opt);
    arl_model_train_free(&R->tr);
    arl_model_free(&R->m);
    arl_model_params_free(&R->g);
    arl_model_params_free(&R->w);
}

static void ref_step(ref_run *R, const arl_batch *b, double *loss, arl_optim_report *rep) {
    memset(R->g.arena, 0, sizeof(float) * (size_t)R->g.inv.arena_floats);
    CHECK_MSG(arl_model_loss_and_grad(&R->tr, b, &R->g, loss) == ARL_OK, "reference: %s",
              arl_error_msg());
    CHECK_MSG(arl_adamw_step(&R->opt, &R->w, R->g.arena, rep) == ARL_OK, "reference step: %s",
              arl_error_msg());
}

static int g_ckpt;  /* the device trainers of a case checkpoint activations */
static int g_bf16w; /* ... keep bf16 weight copies (arl_model_dev_opts bf16_weights) */

static void init_dev(arl_model_dev *md, arl_model_dev_train *dt, const arl_optim_config *oc) {
    arl_model_opts o = test_opts();
    arl_model_dev_opts dopts = {.train_checkpoint = g_ckpt, .bf16_weights = g_bf16w};
    if (arl_model_dev_init(md, OPS, &TM.cfg, &TM.w, &o, &dopts) ||
        arl_model_dev_train_init(dt, md, oc)) {
        fprintf(stderr, "device init: %s\n", arl_error_msg());
        exit(1);
    }
}

/* ---- cpu: bit-identical ---- */

static void test_cpu_bit_identical(void) {
    const int64_t nf = TM.w.inv.arena_floats;
    const size_t bytes = sizeof(float) * (size_t)nf;
    const arl_model_dims *dm = &TM.cfg.dims;
    arl_optim_config oc;
    optim_cfg(&oc);
    ref_run R;
    ref_init(&R, &oc);
    arl_model_dev md;
    arl_model_dev_train dt;
    init_dev(&md, &dt, &oc);
    float *host = malloc(bytes), *hv = malloc(bytes);
    int32_t tok[NT], *forced = malloc(sizeof(int32_t) * (size_t)(dm->n_moe * NT * dm->k));
    rand_routes(forced, 77);
    for (int step = 0; step < 3; step++) {
        rand_tokens(tok, 0x7A11 + (uint64_t)step, NT);
        arl_batch b = {.tokens = tok, .T = NT, .cu = CU, .N = ND};
        if (step == 2) b.forced_routes = forced;
        double lr_ = 0, ld = 0;
        arl_optim_report rr, rd;
        ref_step(&R, &b, &lr_, &rr);
        CHECK_MSG(arl_model_dev_zero_grad(&dt) == ARL_OK &&
                      arl_model_dev_loss_and_grad(&dt, &b, &ld) == ARL_OK,
                  "device step %d: %s", step, arl_error_msg());
        CHECK(arl_model_dev_grads_download(&dt, host) == ARL_OK);
        CHECK_MSG(lr_ == ld && isfinite(ld) && ld > 0, "step %d: loss %.9g vs %.9g", step, ld, lr_);
        CHECK_MSG(!memcmp(host, R.g.arena, bytes), "step %d: gradients differ", step);
        for (int64_t i = 0; i < R.g.inv.n; i++) { /* name the first tensor that differs */
            const arl_param_tensor *t = &R.g.inv.t[i];
            if (memcmp(host + t->offset, R.g.arena + t->offset, sizeof(float) * (size_t)t->numel)) {
                fprintf(stderr, "  first differing gradient: %s\n", t->name);
                break;
            }
        }
        /* the gradients are not trivially equal: most trained tensors receive one */
        int64_t nonzero = 0, trained = 0;
        for (int64_t i = 0; i < R.g.inv.n; i++) {
            const arl_param_tensor *t = &R.g.inv.t[i];
            if (t->no_grad || t->layer < 0) continue;
            trained++;
            for (int64_t j = 0; j < t->numel; j++)
                if (R.g.arena[t->offset + j] != 0.0f) {
                    nonzero++;
                    break;
                }
        }
        CHECK_MSG(nonzero >= trained * 9 / 10, "only %lld of %lld layer tensors have gradients",
                  (long long)nonzero, (long long)trained);
        CHECK_MSG(arl_model_dev_optim_step(&dt, &rd) == ARL_OK, "device optim: %s",
                  arl_error_msg());
        CHECK_MSG(rr.grad_norm == rd.grad_norm && rr.clip_coef == rd.clip_coef && rr.lr == rd.lr &&
                      rr.step == rd.step,
                  "step %d: report differs (norm %.9g vs %.9g)", step, rd.grad_norm, rr.grad_norm);
        CHECK_MSG(rr.clip_coef < 1.0, "step %d: clipping did not run (norm %g)", step,
                  rr.grad_norm);
        CHECK(arl_model_dev_params_download(&dt, host) == ARL_OK);
        CHECK_MSG(!memcmp(host, R.w.arena, bytes), "step %d: updated weights differ", step);
        CHECK_MSG(memcmp(host, TM.w.arena, bytes) != 0, "step %d: the weights did not change",
                  step);
        CHECK(arl_model_dev_moments_download(&dt, host, hv) == ARL_OK);
        CHECK_MSG(!memcmp(host, R.opt.m_arena, bytes) && !memcmp(hv, R.opt.v_arena, bytes),
                  "step %d: AdamW moments differ", step);
    }
    free(forced);
    free(host);
    free(hv);
    arl_model_dev_train_free(&dt);
    arl_model_dev_free(&md);
    ref_free(&R);
    arl_optim_config_free(&oc);
}

/* The training forward's outputs against arl_model_train_forward's: log-probabilities, routes,
 * router scores (the rows Quantile Balancing reads) and expert loads; the device takes the
 * reference's routes (forced; a near-tie of the fp32 scores must not switch an expert between
 * the CPU and the GPU).  rtol < 0: bit-identical ("cpu"); else the max|ref| form (the scores
 * are sigmoids of the router's fp32 products, whose input carries the layers' differences),
 * the loads exactly (they follow the identical routes). */
typedef struct pair_run { /* the reference and the device trainer over the same weights */
    arl_optim_config oc;
    ref_run R;
    arl_model_dev md;
    arl_model_dev_train dt;
} pair_run;

static void pair_init(pair_run *P) {
    optim_cfg(&P->oc);
    ref_init(&P->R, &P->oc);
    init_dev(&P->md, &P->dt, &P->oc);
}

static void pair_free(pair_run *P) {
    arl_model_dev_train_free(&P->dt);
    arl_model_dev_free(&P->md);
    ref_free(&P->R);
    arl_optim_config_free(&P->oc);
}

static void forward_outputs(double rtol, const char *mode) {
    const arl_model_dims *dm = &TM.cfg.dims;
    pair_run P;
    pair_init(&P);
    int32_t tok[NT], tgt[NT];
    rand_tokens(tok, 0x5C0, NT);
    arl_batch_next_token_targets(tgt, tok, CU, ND, NT);
    const size_t nr = (size_t)(dm->n_moe * NT * dm->k), ns = (size_t)(dm->n_moe * NT * dm->E);
    float lp[2][NT], *sc[2];
    int32_t *ro[2];
    int64_t *ld[2];
    for (int i = 0; i < 2; i++) {
        sc[i] = malloc(sizeof(float) * ns);
        ro[i] = malloc(sizeof(int32_t) * nr);
        ld[i] = malloc(sizeof(int64_t) * (size_t)(dm->n_moe * dm->E));
    }
    arl_batch b = {.tokens = tok, .T = NT, .cu = CU, .N = ND, .targets = tgt};
    arl_forward_out o = {
        .logprobs = lp[0], .routes = ro[0], .router_scores = sc[0], .expert_load = ld[0]};
    CHECK(arl_model_train_forward(&P.R.tr, &b, NULL, NULL, &o) == ARL_OK);
    b.forced_routes = ro[0];
    arl_forward_out od = {
        .logprobs = lp[1], .routes = ro[1], .router_scores = sc[1], .expert_load = ld[1]};
    CHECK_MSG(arl_model_dev_train_forward(&P.dt, &b, &od) == ARL_OK, "%s: %s", mode,
              arl_error_msg());
    char what[128];
    snprintf(what, sizeof what, "%s training forward log-probs", mode);
    if (rtol < 0) {
        CHECK_MSG(!memcmp(lp[0], lp[1], sizeof lp[0]), "%s differ", what);
        CHECK_MSG(!memcmp(sc[0], sc[1], sizeof(float) * ns), "%s: router scores differ", mode);
    } else {
        check_close_maxref_f32(what, lp[1], lp[0], NT, 0.0, rtol);
        snprintf(what, sizeof what, "%s training forward router scores", mode);
        check_close_maxref_f32(what, sc[1], sc[0], ns, 0.0, rtol);
    }
    CHECK_MSG(!memcmp(ro[0], ro[1], sizeof(int32_t) * nr), "%s: routes differ", mode);
    CHECK_MSG(!memcmp(ld[0], ld[1], sizeof(int64_t) * (size_t)(dm->n_moe * dm->E)),
              "%s: expert loads differ", mode);
    int64_t total = 0; /* every (token, slot) pair counted once per layer */
    for (int64_t e = 0; e < dm->E; e++)
        total += ld[1][e];
    CHECK_EQ_INT(total, NT * dm->k);
    for (int i = 0; i < 2; i++) {
        free(sc[i]);
        free(ro[i]);
        free(ld[i]);
    }
    pair_free(&P);
}

/* Image rows in the training step (spec/policy.md 10.1): the rows replace the <|media_pad|>
 * placeholders' embeddings in the forward, and the backward returns their gradient (dmedia +=)
 * and gives the placeholders' embedding row none - against arl_model_train_forward +
 * arl_model_backward with d_media.  A run of three placeholders in document 1 and one in
 * document 2; dmedia starts at 1 (the += is checked).  rtol < 0: bit-identical; else the
 * max|ref| form on log-probs, the image-row gradient and the embedding gradient. */
static void media_step(double rtol, const char *mode) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t d = dm->d, NM = 4, ph = TM.cfg.media_placeholder_token_id;
    pair_run P;
    pair_init(&P);
    int32_t tok[NT], tgt[NT];
    rand_tokens(tok, 0x1AA6E, NT);
    for (int64_t t = 0; t < NT; t++)
        if (tok[t] == ph) tok[t] = 7;
    tok[20] = tok[21] = tok[22] = tok[52] = (int32_t)ph;
    arl_batch_next_token_targets(tgt, tok, CU, ND, NT);
    float *rows = malloc(sizeof(float) * (size_t)(NM * d)), *dm_[2], dlogp[NT], lp[2][NT];
    arl_rng g;
    arl_rng_seed(&g, 0x1AA6E);
    for (int64_t i = 0; i < NM * d; i++)
        rows[i] = (float)(arl_rng_uniform(&g) * 2.0 - 1.0);
    for (int64_t t = 0; t < NT; t++)
        dlogp[t] = (float)(-(0.5 + arl_rng_uniform(&g)) / NT);
    for (int i = 0; i < 2; i++) {
        dm_[i] = malloc(sizeof(float) * (size_t)(NM * d));
        for (int64_t j = 0; j < NM * d; j++)
            dm_[i][j] = 1.0f;
    }
    arl_batch b = {
        .tokens = tok, .T = NT, .cu = CU, .N = ND, .targets = tgt, .media = rows, .n_media = NM};
    memset(P.R.g.arena, 0, sizeof(float) * (size_t)P.R.g.inv.arena_floats);
    arl_forward_out o = {.logprobs = lp[0]};
    CHECK(arl_model_train_forward(&P.R.tr, &b, NULL, NULL, &o) == ARL_OK);
    CHECK(arl_model_backward(&P.R.tr, &b, dlogp, &P.R.g, NULL, dm_[0]) == ARL_OK);
    arl_forward_out od = {.logprobs = lp[1]};
    CHECK_MSG(arl_model_dev_zero_grad(&P.dt) == ARL_OK &&
                  arl_model_dev_train_forward(&P.dt, &b, &od) == ARL_OK &&
                  arl_model_dev_backward_media(&P.dt, &b, dlogp, dm_[1]) == ARL_OK,
              "%s: %s", mode, arl_error_msg());
    const size_t bytes = sizeof(float) * (size_t)P.R.g.inv.arena_floats;
    float *gd = malloc(bytes);
    CHECK(arl_model_dev_grads_download(&P.dt, gd) == ARL_OK);
    const size_t eo = (size_t)(P.R.g.embed_tokens - P.R.g.arena);
    /* the placeholders' embedding row got nothing; the rows' gradient is not trivial */
    for (int64_t i = 0; i < d; i++)
        CHECK(gd[eo + (size_t)(ph * d + i)] == 0.0f && P.R.g.embed_tokens[ph * d + i] == 0.0f);
    double moved = 0;
    for (int64_t i = 0; i < NM * d; i++)
        moved += fabs(dm_[0][i] - 1.0);
    CHECK(moved > 0);
    char what[128];
    if (rtol < 0) {
        CHECK_MSG(!memcmp(lp[0], lp[1], sizeof lp[0]), "%s: log-probs differ", mode);
        CHECK_MSG(!memcmp(dm_[0], dm_[1], sizeof(float) * (size_t)(NM * d)),
                  "%s: image-row gradients differ", mode);
        CHECK_MSG(!memcmp(gd, P.R.g.arena, bytes), "%s: gradients differ", mode);
    } else {
        snprintf(what, sizeof what, "%s log-probs with image rows", mode);
        check_close_maxref_f32(what, lp[1], lp[0], NT, 0.0, rtol);
        snprintf(what, sizeof what, "%s image-row gradient", mode);
        check_close_maxref_f32(what, dm_[1], dm_[0], (size_t)(NM * d), 0.0, rtol);
        snprintf(what, sizeof what, "%s embedding gradient", mode);
        check_close_maxref_f32(what, gd + eo, P.R.g.embed_tokens, (size_t)(dm->V * d), 0.0, rtol);
    }
    free(gd);
    free(rows);
    free(dm_[0]);
    free(dm_[1]);
    pair_free(&P);
}

static void test_cpu_media(void) {
    media_step(-1.0, "cpu");
}

static void test_cuda_media(void) {
    arl_cuda_set_math(arl_cuda_current(), ARL_CUDA_MATH_FP32);
    media_step(2e-3, "cuda fp32"); /* test_cuda_fp32's gradient bound (file comment) */
}

static void test_cpu_forward_outputs(void) {
    forward_outputs(-1.0, "cpu");
}

static void test_cuda_forward_outputs(void) {
    arl_cuda_set_math(arl_cuda_current(), ARL_CUDA_MATH_FP32);
    /* fp32 throughout, 8 layers of reduction-order differences: test_cuda_model_device's bound */
    forward_outputs(1e-3, "cuda fp32");
}

static void test_cpu_errors(void) {
    arl_optim_config oc;
    optim_cfg(&oc);
    arl_model_dev md;
    arl_model_dev_train dt;
    init_dev(&md, &dt, &oc);
    int32_t tok[NT], tgt[NT];
    rand_tokens(tok, 5, NT);
    arl_batch_next_token_targets(tgt, tok, CU, ND, NT);
    float dlogp[NT] = {0};
    arl_batch b = {.tokens = tok, .T = NT, .cu = CU, .N = ND, .targets = tgt};
    CHECK(arl_model_dev_backward(&dt, &b, dlogp) == ARL_ERR_STATE);
    tok[3] = 400; /* >= V */
    double loss;
    CHECK(arl_model_dev_loss_and_grad(&dt, &b, &loss) == ARL_ERR_RANGE);
    CHECK(strstr(arl_error_msg(), "position 3") != NULL);
    tok[3] = 7;
    CHECK(arl_model_dev_train_forward(&dt, &b, NULL) == ARL_OK);
    arl_batch b2 = b;
    b2.T = 50;
    b2.cu = NULL;
    b2.N = 1;
    CHECK(arl_model_dev_backward(&dt, &b2, dlogp) == ARL_ERR_ARG);
    float img[128];
    b2 = b;
    b2.media = img;
    b2.n_media = 1; /* image rows for placeholders the batch does not have */
    CHECK(arl_model_dev_train_forward(&dt, &b2, NULL) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "placeholders") != NULL);
    /* a NaN gradient: the step is refused and names a tensor; nothing changes */
    int64_t ti = 0;
    while (dt.g.inv.t[ti].no_grad || dt.g.inv.t[ti].layer < 0)
        ti++; /* the first trained tensor of a layer */
    float nan = NAN;
    CHECK(OPS->upload(dt.grads + dt.g.inv.t[ti].offset + 1, &nan, sizeof nan) == ARL_OK);
    arl_optim_report rep;
    CHECK(arl_model_dev_optim_step(&dt, &rep) == ARL_ERR_RANGE);
    CHECK(strstr(arl_error_msg(), dt.g.inv.t[ti].name) != NULL);
    CHECK(dt.step == 0);
    arl_model_dev_train_free(&dt);
    arl_model_dev_free(&md);
    arl_optim_config_free(&oc);
}

/* ---- cuda: parity of one full step with the CPU reference ---- */

static void cuda_step(arl_cuda_math math, double rtol_loss, double rtol_grad, int check_update,
                      const char *mode) {
    const int64_t nf = TM.w.inv.arena_floats;
    const size_t bytes = sizeof(float) * (size_t)nf;
    const arl_model_dims *dm = &TM.cfg.dims;
    arl_cuda_set_math(arl_cuda_current(), math);
    arl_optim_config oc;
    optim_cfg(&oc);
    ref_run R;
    ref_init(&R, &oc);
    int32_t tok[NT], *routes = malloc(sizeof(int32_t) * (size_t)(dm->n_moe * NT * dm->k));
    rand_tokens(tok, 0x7A11, NT);
    arl_batch b = {.tokens = tok, .T = NT, .cu = CU, .N = ND};
    { /* the CPU's natural routes, forced on both sides */
        int32_t tgt[NT];
        arl_batch_next_token_targets(tgt, tok, CU, ND, NT);
        arl_batch bt = b;
        bt.targets = tgt;
        arl_forward_out o = {.routes = routes};
        CHECK(arl_model_train_forward(&R.tr, &bt, NULL, NULL, &o) == ARL_OK);
    }
    b.forced_routes = routes;
    double lref = 0, ldev = 0;
    arl_optim_report rr, rd;
    ref_step(&R, &b, &lref, &rr);
    arl_model_dev md;
    arl_model_dev_train dt;
    init_dev(&md, &dt, &oc);
    float *gd = malloc(bytes), *pd = malloc(bytes);
    CHECK_MSG(arl_model_dev_zero_grad(&dt) == ARL_OK &&
                  arl_model_dev_loss_and_grad(&dt, &b, &ldev) == ARL_OK,
              "%s: %s", mode, arl_error_msg());
    CHECK(arl_model_dev_grads_download(&dt, gd) == ARL_OK);
    CHECK_MSG(arl_model_dev_optim_step(&dt, &rd) == ARL_OK, "%s: %s", mode, arl_error_msg());
    CHECK(arl_model_dev_params_download(&dt, pd) == ARL_OK);
    CHECK_MSG(fabs(ldev - lref) <= rtol_loss * fabs(lref), "%s: loss %.7g vs %.7g", mode, ldev,
              lref);
    char what[256];
    double worst_rel = 0; /* the largest |diff| / max|ref| over the tensors (printed) */
    const char *worst_name = "";
    double e2 = 0, r2 = 0; /* all gradients: sum (dev - ref)^2, sum ref^2 */
    for (int64_t i = 0; i < R.g.inv.n; i++)
        for (int64_t j = R.g.inv.t[i].offset; j < R.g.inv.t[i].offset + R.g.inv.t[i].numel; j++) {
            const double d = (double)gd[j] - R.g.arena[j];
            e2 += d * d;
            r2 += (double)R.g.arena[j] * R.g.arena[j];
        }
    const double rel_l2 = r2 > 0 ? sqrt(e2 / r2) : sqrt(e2);
    CHECK_MSG(rel_l2 <= (math == ARL_CUDA_MATH_BF16 ? 0.05 : rtol_grad),
              "%s: relative L2 error of all gradients %.3e", mode, rel_l2);
    for (int64_t i = 0; i < R.g.inv.n; i++) {
        const arl_param_tensor *t = &R.g.inv.t[i];
        snprintf(what, sizeof what, "%s grad %s", mode, t->name);
        check_close_maxref_f32(what, gd + t->offset, R.g.arena + t->offset, (size_t)t->numel, 0.0,
                               rtol_grad);
        double m = 0, e = 0;
        for (int64_t j = t->offset; j < t->offset + t->numel; j++) {
            m = fabs(R.g.arena[j]) > m ? fabs(R.g.arena[j]) : m;
            e = fabs(gd[j] - R.g.arena[j]) > e ? fabs(gd[j] - R.g.arena[j]) : e;
        }
        if (m > 0 && e / m > worst_rel) {
            worst_rel = e / m;
            worst_name = t->name;
        }
    }
    fprintf(stderr,
            "%s: loss %.9g vs %.9g (rel %.2e); worst gradient %.2e max|ref| (%s); all gradients "
            "relative L2 %.2e\n",
            mode, ldev, lref, fabs(ldev - lref) / fabs(lref), worst_rel, worst_name, rel_l2);
    if (check_update) {
        const double lr = oc.lr;
        int64_t close = 0, n = 0;
        double worst = 0;
        for (int64_t i = 0; i < R.w.inv.n; i++) {
            const arl_param_tensor *t = &R.w.inv.t[i];
            for (int64_t j = t->offset; j < t->offset + t->numel; j++) {
                double dd = (double)pd[j] - TM.w.arena[j],
                       dr = (double)R.w.arena[j] - TM.w.arena[j];
                double e = fabs(dd - dr);
                worst = e > worst ? e : worst;
                close += e <= 1e-2 * lr;
                n++;
            }
        }
        CHECK_MSG(worst <= 2.2 * lr, "%s: an update differs by %g (lr %g)", mode, worst, lr);
        CHECK_MSG(close >= n * 99 / 100, "%s: %lld of %lld updates within 1e-2 lr", mode,
                  (long long)close, (long long)n);
    }
    free(gd);
    free(pd);
    free(routes);
    arl_model_dev_train_free(&dt);
    arl_model_dev_free(&md);
    ref_free(&R);
    arl_optim_config_free(&oc);
}

static void test_cuda_fp32(void) {
    cuda_step(ARL_CUDA_MATH_FP32, 1e-4, 2e-3, 1, "cuda fp32");
}

/* Activation checkpointing (dopts.train_checkpoint): the layers recomputed in the backward
 * from their saved inputs give the same step - "cpu": bit-identical to the reference (three
 * steps, forced routes, AdamW) and to the device without it; "cuda": test_cuda_fp32's bounds.
 * The training block shrinks from L records to one (printed). */
static void test_cpu_checkpoint(void) {
    arl_model_dev md;
    arl_model_opts o = test_opts();
    arl_model_dev_opts d0 = {0}, d1 = {.train_checkpoint = 1};
    CHECK(arl_model_dev_plan(&md, OPS, &TM.cfg, &o, &d0) == ARL_OK);
    const int64_t full = arl_model_dev_train_bytes(&md);
    CHECK(arl_model_dev_plan(&md, OPS, &TM.cfg, &o, &d1) == ARL_OK);
    const int64_t ck = arl_model_dev_train_bytes(&md);
    fprintf(stderr, "  training block: %lld bytes, %lld with checkpointing\n", (long long)full,
            (long long)ck);
    CHECK(ck < full);
    g_ckpt = 1;
    test_cpu_bit_identical();
    test_cpu_media();
    g_ckpt = 0;
}

static void test_cuda_checkpoint(void) {
    g_ckpt = 1;
    cuda_step(ARL_CUDA_MATH_FP32, 1e-4, 2e-3, 1, "cuda fp32 checkpointing");
    g_ckpt = 0;
}
static void test_cpu_sparse(void) {
    g_sparse = 1;
    test_cpu_bit_identical();
    g_ckpt = 1;
    test_cpu_bit_identical();
    g_ckpt = 0;
    g_sparse = 0;
}

static void test_cuda_sparse(void) {
    g_sparse = 1;
    cuda_step(ARL_CUDA_MATH_FP32, 1e-4, 2e-3, 1, "cuda fp32 block-sparse");
    g_sparse = 0;
}

static void test_cuda_bf16(void) {
    cuda_step(ARL_CUDA_MATH_BF16, 2e-2, 0.15, 0, "cuda bf16");
}

/* Training a device model that keeps bf16 weight copies (bf16_weights: its forwards run
 * their weight GEMMs on them - the training forward under the bf16 math mode, as here - its
 * backward on the fp32 masters): after every step the copies are the updated masters rounded
 * to bf16 (nearest even), bit for bit, for every weight (AdamW rewrites the trained ones in its
 * own pass; the others keep the upload's), so that the next forwards run on the new weights.
 * Against a model without copies (cuBLAS rounding the masters itself): the same bf16 values
 * through other kernels, so the losses agree to bf16 rounding and the weights within the
 * updates' size (file comment). */
static void test_cuda_bf16_weights_step(void) {
    const int64_t nf = TM.w.inv.arena_floats;
    arl_optim_config oc;
    optim_cfg(&oc);
    arl_cuda_set_math(arl_cuda_current(), ARL_CUDA_MATH_BF16);
    float *pd[2][2]; /* [copies][step] the weights after the step */
    double losses[2][2];
    for (int wb = 1; wb >= 0; wb--) {
        arl_model_dev md;
        arl_model_dev_train dt;
        g_bf16w = wb;
        init_dev(&md, &dt, &oc);
        g_bf16w = 0;
        CHECK((md.wb16 != NULL) == wb);
        uint16_t *wbh = malloc(sizeof(uint16_t) * (size_t)nf);
        int32_t tok[NT];
        for (int step = 0; step < 2; step++) {
            float *p = pd[wb][step] = malloc(sizeof(float) * (size_t)nf);
            rand_tokens(tok, 0xB16 + (uint64_t)step, NT);
            arl_batch b = {.tokens = tok, .T = NT, .cu = CU, .N = ND};
            double loss = 0;
            arl_optim_report rep;
            CHECK_MSG(arl_model_dev_train_step(&dt, &b, &loss, &rep) == ARL_OK, "step %d: %s", step,
                      arl_error_msg());
            CHECK_MSG(isfinite(loss) && loss > 0, "step %d: loss %g", step, loss);
            losses[wb][step] = loss;
            CHECK(arl_model_dev_params_download(&dt, p) == ARL_OK);
            int64_t moved = 0;
            for (int64_t i = 0; i < nf; i++)
                moved += p[i] != TM.w.arena[i];
            CHECK_MSG(moved > nf / 2, "step %d: only %lld of %lld weights moved", step,
                      (long long)moved, (long long)nf);
            if (!wb) {
                const double lr = oc.lr, bound = 5.0 * lr;
                CHECK_MSG(fabs(loss - losses[1][step]) <= 2e-2 * loss,
                          "step %d: loss %.9g with bf16 copies, %.9g without", step,
                          losses[1][step], loss);
                int64_t bad = 0, first = -1;
                for (int64_t i = 0; i < nf; i++)
                    if (!(fabs((double)p[i] - pd[1][step][i]) <= bound) && bad++ == 0) first = i;
                CHECK_MSG(bad == 0,
                          "step %d: %lld weights differ by more than 5 lr with and without "
                          "copies (first: float %lld, %.9g with, %.9g without)",
                          step, (long long)bad, (long long)first,
                          first >= 0 ? pd[1][step][first] : 0.0, first >= 0 ? p[first] : 0.0);
                continue;
            }
            CHECK(OPS->download(wbh, md.wb16, sizeof(uint16_t) * (size_t)nf) == ARL_OK);
            int64_t bad = 0, first = -1;
            for (int64_t i = 0; i < nf; i++)
                if (wbh[i] != arl_f32_to_bf16(p[i]) && bad++ == 0) first = i;
            CHECK_MSG(bad == 0,
                      "step %d: %lld of %lld bf16 weights are not the new weights rounded "
                      "(first at float %lld)",
                      step, (long long)bad, (long long)nf, (long long)first);
        }
        free(wbh);
        arl_model_dev_train_free(&dt);
        arl_model_dev_free(&md);
    }
    for (int i = 0; i < 4; i++)
        free(pd[i / 2][i % 2]);
    arl_optim_config_free(&oc);
}

/* Which weights the training forward of a model with bf16 copies reads (file comment): lp
 * (NT) the log-probabilities of the training forward (train) or the inference forward. */
static void bf16w_logprobs(arl_model_dev *md, arl_model_dev_train *dt, int train,
                           arl_cuda_math math, const arl_batch *b, float *lp) {
    arl_cuda_set_math(arl_cuda_current(), math);
    arl_forward_out o = {.logprobs = lp};
    arl_status s =
        train ? arl_model_dev_train_forward(dt, b, &o) : arl_model_dev_forward(md, b, &o);
    CHECK_MSG(s == ARL_OK, "%s forward: %s", train ? "training" : "inference", arl_error_msg());
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static void test_cuda_bf16_weights_forward(void) {
    const int64_t nf = TM.w.inv.arena_floats;
    const arl_model_dims *dm = &TM.cfg.dims;
    arl_optim_config oc;
    optim_cfg(&oc);
    arl_model_dev md;
    arl_model_dev_train dt;
    g_bf16w = 1;
    init_dev(&md, &dt, &oc);
    g_bf16w = 0;
    int32_t tok[NT], tgt[NT], *routes = malloc(sizeof(int32_t) * (size_t)(dm->n_moe * NT * dm->k));
    rand_tokens(tok, 0xF0B, NT);
    arl_batch_next_token_targets(tgt, tok, CU, ND, NT);
    rand_routes(routes, 0xF0C); /* forced: other sums must not switch an expert */
    arl_batch b = {
        .tokens = tok, .T = NT, .cu = CU, .N = ND, .targets = tgt, .forced_routes = routes};
    float tr16[2][NT], in16[2][NT], tr32[2][NT]; /* [copies halved] */
    for (int halved = 0; halved < 2; halved++) {
        if (halved) { /* the copies of (weights / 2); the masters stay */
            uint16_t *h = malloc(sizeof(uint16_t) * (size_t)nf);
            for (int64_t i = 0; i < nf; i++)
                h[i] = arl_f32_to_bf16(0.5f * TM.w.arena[i]);
            CHECK(OPS->upload(md.wb16, h, sizeof(uint16_t) * (size_t)nf) == ARL_OK);
            free(h);
        }
        bf16w_logprobs(&md, &dt, 1, ARL_CUDA_MATH_BF16, &b, tr16[halved]);
        bf16w_logprobs(&md, &dt, 0, ARL_CUDA_MATH_BF16, &b, in16[halved]);
        bf16w_logprobs(&md, &dt, 1, ARL_CUDA_MATH_FP32, &b, tr32[halved]);
        char what[96];
        snprintf(what, sizeof what, "bf16 copies%s: training vs inference forward log-probs",
                 halved ? " (halved)" : "");
        check_close_maxref_f32(what, tr16[halved], in16[halved], NT, 0.0, 2e-3);
    }
    /* the copies' forward is the model's (a GEMM on a wrong or stale input is off by O(1)):
     * against the fp32 masters' within test_model_device's bf16-weights bound */
    check_close_maxref_f32("bf16 copies vs fp32 masters: training forward log-probs", tr16[0],
                           tr32[0], NT, 0.0, 3e-2);
    const double moved = max_abs_diff(tr16[0], tr16[1], NT);
    CHECK_MSG(moved > 0.05, "halving the copies moved the bf16 training forward by %.3g only",
              moved);
    CHECK_MSG(!memcmp(tr32[0], tr32[1], sizeof tr32[0]),
              "the fp32 training forward moved with the copies (by %.3g)",
              max_abs_diff(tr32[0], tr32[1], NT));
    free(routes);
    arl_model_dev_train_free(&dt);
    arl_model_dev_free(&md);
    arl_optim_config_free(&oc);
}

int main(int argc, char **argv) {
    const char *dev = argc > 1 ? argv[1] : "cpu";
    tiny_load(&TM);
    if (strcmp(dev, "cpu") == 0) {
        OPS = arl_dev_ops_cpu();
        TEST_RUN(test_cpu_bit_identical);
        TEST_RUN(test_cpu_errors);
        TEST_RUN(test_cpu_forward_outputs);
        TEST_RUN(test_cpu_media);
        TEST_RUN(test_cpu_checkpoint);
        TEST_RUN(test_cpu_sparse);
    } else {
        /* the model, its training block (weights x 4 and the tiny activations) and the
         * context's own part: 256 MiB */
        int rc = test_cuda_open((size_t)256 << 20, &OPS);
        if (rc) {
            tiny_free(&TM);
            return rc;
        }
        TEST_RUN(test_cuda_fp32);
        TEST_RUN(test_cuda_forward_outputs);
        TEST_RUN(test_cuda_media);
        TEST_RUN(test_cuda_checkpoint);
        TEST_RUN(test_cuda_sparse);
        /* the emulator: fp32 only (every launch is slow), unless ARL_TEST_CASES names cases */
        if (strcmp(dev, "cuda-emu") != 0 || getenv("ARL_TEST_CASES")) {
            TEST_RUN(test_cuda_bf16);
            TEST_RUN(test_cuda_bf16_weights_step);
            TEST_RUN(test_cuda_bf16_weights_forward);
        }
    }
    tiny_free(&TM);
    return test_finish();
}
