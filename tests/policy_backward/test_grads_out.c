/* tests/policy_backward/test_grads_out.c: `agentrl score --grads-out` ($ARL_BIN) on a tiny
 * checkpoint with the model_tiny golden weights.  The file must hold every tensor of the
 * checkpoint under its name, F32, in checkpoint shape (A_log padded), with the gradient of the
 * summed log-probability of positions 1..T-1 of both sequences - compared with the same
 * gradient computed in process (arl_model_nll_grad with scale -1 over the same packed batch) -
 * and zeros for the router bias and the vision tower; the scores printed are unchanged by the
 * option.  A sequence longer than --max-tokens is a usage error (exit 2), and no file is written.
 * --device cpu-device (the device training step over host memory) gives the same file; --device
 * cuda on a GPU within fp32 bounds, without one a clear error.
 *
 * Tolerance: max|ref| form per tensor, atol 0, rtol 1e-4: the CLI and the reference run the
 * same code on the same packed batch (the CLI with checkpointing, which is bit-identical), but
 * in another process whose GEMM partition may differ (thread pool, build): measured up to
 * 1.4e-5 of a tensor's largest entry in the sanitizer build; a wrong sign, target shift or
 * missing sequence is O(1).
 */
#include <sys/stat.h>
#include <unistd.h>

#include "core/npy.h"
#include "policy/checkpoint.h"
#include "policy/safetensors.h"
#include "tests/policy_backward/bw_util.h"

static tiny_model TM;
static const char *BIN;
static char DIR_[512], CKPT[600];

static int run(const char *cmd, char *out, size_t cap) {
    char err[600];
    snprintf(err, sizeof err, "%s/stderr.txt", DIR_);
    return test_run_cmd(cmd, err, out, cap);
}

static int stderr_has(const char *needle) {
    char path[600];
    snprintf(path, sizeof path, "%s/stderr.txt", DIR_);
    return test_file_has(path, needle);
}

/* The gradient file at path against the reference G: every tensor under its name, F32, in
 * checkpoint shape (A_log padded), within rtol of its max|ref|, zeros where no gradient. */
static void check_file(const char *path, const bw_grads *G, double rtol, const char *label) {
    const char *gpath = path;
    arl_st_file *f = NULL;
    CHECK_MSG(arl_st_file_open(gpath, &f) == ARL_OK, "%s: %s", label, arl_error_msg());
    if (f) {
        const arl_param_inventory *inv = &TM.w.inv;
        CHECK_EQ_INT(arl_st_file_count(f), inv->n);
        float *buf = malloc(sizeof(float) * 1 << 20);
        for (int64_t i = 0; i < inv->n; i++) {
            const arl_param_tensor *t = &inv->t[i];
            const arl_st_tensor *st = arl_st_file_find(f, t->name);
            CHECK_MSG(st != NULL, "%s missing from the gradient file", t->name);
            if (!st) continue;
            int64_t n = t->is_a_log ? t->stored_numel : t->numel;
            CHECK_MSG(arl_st_tensor_check_shape(st, t->is_a_log ? 1 : t->rank,
                                                t->is_a_log ? &t->stored_numel : t->shape) ==
                          ARL_OK,
                      "%s: shape", t->name);
            CHECK(n <= (1 << 20) && arl_st_tensor_read_f32(st, buf, n) == ARL_OK);
            const float *ref = arl_model_params_tensor(&G->g, i);
            char what[600];
            snprintf(what, sizeof what, "%s %s", label, t->name);
            check_close_maxref_f32(what, buf, ref, (size_t)t->numel, 0.0, rtol);
            for (int64_t j = t->numel; j < n; j++)
                CHECK(buf[j] == 0.0f); /* A_log padding */
            if (t->no_grad || t->component == ARL_COMP_VISION || t->component == ARL_COMP_PROJECTOR)
                for (int64_t j = 0; j < n; j++)
                    CHECK(buf[j] == 0.0f);
        }
        free(buf);
        arl_st_file_close(f);
    }

}

static void test_grads_out(void) {
    enum { B = 2, T = 45 };
    int32_t ids[B * T], cu[B + 1] = {0, T, 2 * T};
    bw_tokens(ids, T, 11);
    bw_tokens(ids + T, T, 12);
    char npy[700], gpath[700], cmd[2048];
    snprintf(npy, sizeof npy, "%s/tok.npy", DIR_);
    snprintf(gpath, sizeof gpath, "%s/grads.safetensors", DIR_);
    int64_t shape[2] = {B, T};
    CHECK(arl_npy_write(npy, ARL_DTYPE_I32, 2, shape, ids) == ARL_OK);
    char *out1 = malloc(1 << 20), *out2 = malloc(1 << 20);
    snprintf(cmd, sizeof cmd, "%s score --ckpt %s --tokens %s", BIN, CKPT, npy);
    CHECK_EQ_INT(run(cmd, out1, 1 << 20), 0);
    snprintf(cmd, sizeof cmd, "%s score --ckpt %s --tokens %s --grads-out %s", BIN, CKPT, npy,
             gpath);
    CHECK_EQ_INT(run(cmd, out2, 1 << 20), 0);
    CHECK_MSG(strcmp(out1, out2) == 0, "--grads-out changes the printed scores");

    /* the reference: d/dtheta sum log pi = gradient of -1 * (sum of -log pi) */
    arl_model m;
    bw_model_init(&m, &TM, B * T, B, 64);
    arl_model_train tr;
    bw_train_init(&tr, &m, 0);
    bw_grads G;
    bw_grads_init(&G, &TM);
    arl_batch b = {.tokens = ids, .T = B * T, .cu = cu, .N = B};
    double nll;
    CHECK(arl_model_nll_grad(&tr, &b, NULL, NULL, -1.0, &G.g, &nll, NULL) == ARL_OK);

    check_file(gpath, &G, 1e-4, "--grads-out");
    /* --device cpu-device: the device training step over host memory, the same gradients;
     * --device cuda: on a GPU within test_cuda_model_train's fp32 bound (rtol 2e-3 of each
     * tensor's max|ref|: reduction orders differ, grown through 8 layers forward and back),
     * without one a clear error and no file */
    char dpath[700];
    snprintf(dpath, sizeof dpath, "%s/grads-dev.safetensors", DIR_);
    snprintf(cmd, sizeof cmd, "%s score --ckpt %s --tokens %s --device cpu-device --grads-out %s",
             BIN, CKPT, npy, dpath);
    CHECK_EQ_INT(run(cmd, out2, 1 << 20), 0);
    CHECK_MSG(strcmp(out1, out2) == 0, "--device cpu-device changes the printed scores");
    check_file(dpath, &G, 1e-4, "--device cpu-device --grads-out");
    unlink(dpath);
    snprintf(cmd, sizeof cmd, "%s score --ckpt %s --tokens %s --device cuda --grads-out %s", BIN,
             CKPT, npy, dpath);
    int rc = run(cmd, out2, 1 << 20);
    if (rc == 0) {
        check_file(dpath, &G, 2e-3, "--device cuda --grads-out");
    } else {
        CHECK_EQ_INT(rc, 1);
        CHECK(stderr_has("cuda"));
        CHECK(access(dpath, F_OK) != 0);
    }

    /* a sequence longer than --max-tokens: a usage error, nothing written */
    unlink(gpath);
    snprintf(cmd, sizeof cmd, "%s score --ckpt %s --tokens %s --max-tokens 16 --grads-out %s", BIN,
             CKPT, npy, gpath);
    CHECK_EQ_INT(run(cmd, out2, 1 << 20), 2);
    CHECK(stderr_has("--max-tokens"));
    CHECK(access(gpath, F_OK) != 0);
    free(out1);
    free(out2);
    bw_grads_free(&G);
    arl_model_train_free(&tr);
    arl_model_free(&m);
}

int main(void) {
    BIN = getenv("ARL_BIN");
    if (!BIN || access(BIN, X_OK) != 0) {
        fprintf(stderr, "skip: ARL_BIN (the agentrl binary) is not set or not executable\n");
        return TEST_SKIP;
    }
    arl_k_threads_init(2);
    tiny_load(&TM);
    snprintf(DIR_, sizeof DIR_, "%s", test_tmpdir("grads-out"));
    snprintf(CKPT, sizeof CKPT, "%s/ckpt", DIR_);
    if (arl_checkpoint_save(CKPT, &TM.cfg, &TM.w, 0) != ARL_OK) {
        fprintf(stderr, "checkpoint save: %s\n", arl_error_msg());
        return 1;
    }
    TEST_RUN(test_grads_out);
    tiny_free(&TM);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", DIR_);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", DIR_);
    return test_finish();
}
