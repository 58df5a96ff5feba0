/* tests/policy_backward/test_backward_golden.c: the gradient of the whole tiny model against the
 * model_tiny golden case (spec/policy.md 16.2): loss = mean next-token NLL over a packed batch
 * of two documents (29 and 35 tokens), grad.<key> for every text parameter.
 *
 * Tolerance (spec 16.4, whole-model backward on the fp32 CPU): max|ref| form per tensor, atol 0,
 * rtol 1e-3.  The float64 reference and this fp32 backward differ by the rounding of eight
 * layers of fp32 GEMMs, norms, softmaxes and the KDA recurrence, forward and backward; long
 * fp32 reductions (weight gradients sum over all 64 tokens) give relative errors up to ~1e-5
 * of a tensor's largest entry, and the max|ref| form keeps tiny entries of a tensor from
 * failing on absolute noise.  A missing term, a wrong sign, a wrong source of an AttnRes mix
 * or a gradient into the wrong expert gives errors of order max|ref|.  Tensors without a
 * gradient (e_score_correction_bias, the vision tower for text input) must be exactly 0.
 * The loss uses the forward's rtol 1e-4.
 */
#include "kernels/threadpool.h"
#include "policy/model_backward.h"
#include "tests/policy_model/tiny.h"

#define RTOL_BWD 1e-3
#define RTOL_FWD 1e-4

static tiny_model TM;

static void run_golden(int checkpoint, int recurrent, int absorbed, float *keep_grads) {
    const arl_model_dims *dm = &TM.cfg.dims;
    int64_t T;
    golden_numel(TM.gc, "tokens", &T, NULL);
    int32_t *tok = golden_i32(TM.gc, "tokens", T);
    int32_t *cu = golden_i32(TM.gc, "cu_seqlens", 3);
    arl_model m;
    tiny_model_init(&m, &TM, 128, 4);
    arl_train_opts o;
    arl_train_opts_default(&o);
    o.checkpoint = checkpoint;
    o.kda_recurrent_bwd = recurrent;
    o.mla_absorbed = absorbed;
    arl_model_train tr;
    CHECK(arl_model_train_init(&tr, &m, &o, NULL) == ARL_OK);
    arl_model_params g;
    float *garena = calloc((size_t)TM.w.inv.arena_floats, sizeof(float));
    CHECK(arl_model_params_view(&g, &TM.cfg, garena) == ARL_OK);
    arl_batch b = {.tokens = tok, .T = T, .cu = cu, .N = 2};
    double loss = 0;
    arl_status s = arl_model_loss_and_grad(&tr, &b, &g, &loss);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK_CLOSE(loss, golden_f64(TM.gc, "loss", 1)[0], 0.0, RTOL_FWD);

    const arl_param_inventory *inv = &TM.w.inv;
    double worst = 0;
    const char *worst_name = "";
    for (int64_t i = 0; i < inv->n; i++) {
        const arl_param_tensor *t = &inv->t[i];
        const float *got = arl_model_params_tensor(&g, i);
        char key[600];
        snprintf(key, sizeof key, "grad.%s", t->name);
        if (!golden_has(TM.gc, key)) {
            /* no gradient: the router bias (QB) and the vision tower (text-only batch) */
            int64_t nz = 0;
            for (int64_t j = 0; j < t->numel; j++)
                nz += got[j] != 0.0f;
            CHECK_MSG(nz == 0, "%s: %lld non-zero gradient entries, expected none", t->name,
                      (long long)nz);
            continue;
        }
        /* A_log's gradient is stored zero-padded like the tensor (spec 14.3) */
        const float *ref = golden_f32(TM.gc, key, t->is_a_log ? t->stored_numel : t->numel);
        char what[700];
        snprintf(what, sizeof what, "model_tiny/%s (checkpoint %d, recurrent %d, absorbed %d)", key,
                 checkpoint, recurrent, absorbed);
        check_close_maxref_f32(what, got, ref, (size_t)t->numel, 0.0, RTOL_BWD);
        double mr = 0, md = 0;
        for (int64_t j = 0; j < t->numel; j++) {
            mr = fabs(ref[j]) > mr ? fabs(ref[j]) : mr;
            md = fabs(got[j] - ref[j]) > md ? fabs(got[j] - ref[j]) : md;
        }
        if (mr > 0 && md / mr > worst) {
            worst = md / mr;
            worst_name = t->name;
        }
    }
    fprintf(stderr,
            "  checkpoint %d recurrent %d absorbed %d: loss %.9f, worst max|diff|/max|ref| "
            "%.3g (%s)\n",
            checkpoint, recurrent, absorbed, loss, worst, worst_name);
    if (keep_grads) memcpy(keep_grads, garena, sizeof(float) * (size_t)inv->arena_floats);
    arl_model_params_free(&g);
    free(garena);
    arl_model_train_free(&tr);
    arl_model_free(&m);
    (void)dm;
}

static void test_golden_default(void) {
    run_golden(0, 0, 0, NULL);
}

static void test_golden_checkpoint(void) {
    run_golden(1, 0, 0, NULL);
}

static void test_golden_recurrent(void) {
    run_golden(0, 1, 0, NULL);
}

static void test_golden_absorbed(void) {
    run_golden(0, 0, 1, NULL);
}

int main(void) {
    arl_k_threads_init(2);
    tiny_load(&TM);
    TEST_RUN(test_golden_default);
    TEST_RUN(test_golden_checkpoint);
    TEST_RUN(test_golden_recurrent);
    TEST_RUN(test_golden_absorbed);
    tiny_free(&TM);
    return test_finish();
}
