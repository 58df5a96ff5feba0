/* The SFT driver end to end with the stand-in model (tests/train/embed_lm.h) - and, built as
 * test_train_sft_policy, with the CPU policy on the micro config - on a synthetic
 * task: exact gradients of the stand-in (finite differences), the experiment configuration
 * (JSON + --set, errors naming keys), training that drives the held-out loss below a stated
 * threshold, bit-identical losses and parameters for the same seed, and runs killed with
 * SIGKILL (by a hook right after a step, and by the parent at an arbitrary moment, possibly
 * inside a checkpoint save) that, resumed, end bit-identical to an uninterrupted run.
 *
 * Task: the assistant answers "go" with 8 consecutive letters from a random start (wrapping
 * z -> a).  A bigram model's best held-out loss is
 *   (ln 26 + 8 H(1/8)) / 9 = (3.258 + 8 * 0.377) / 9 = 0.697 nats per target token
 * (first letter uniform; after each letter: the next letter, or the end of the message with
 * probability 1/8); the untrained loss is ln 384 = 5.95.  The threshold is 1.0.
 *
 * The killed runs are separate processes (this program re-executed with "child" arguments),
 * so that no thread of the parent is lost across fork. */
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/dirlock.h"
#include "core/rng.h"
#include "experiments/sft.h"
#include "policy/checkpoint.h"
#include "policy/train_state.h"
#include "tests/test.h"
#include "tests/train/embed_lm.h"

#define STEPS 120
#define EVAL_THRESHOLD 1.0

/* Built twice: test_train_sft drives the stand-in model, test_train_sft_policy (with
 * SFT_TEST_POLICY defined) the CPU policy itself (experiments/sft_model.c) on the micro
 * config of tests/train/data/micro, through the same driver tests and the same threshold. */
static const arl_sft_model_ops *test_ops(void) {
#ifdef SFT_TEST_POLICY
    return arl_sft_model_ops_default();
#else
    return embed_lm_ops();
#endif
}

static char g_dir[512];
static char g_train[600], g_eval[600], g_exp[600];

static const char *path_in(const char *dir, const char *name) {
    static char buf[8][1024];
    static int k;
    char *b = buf[k++ % 8];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static void write_task(const char *path, int n, uint64_t seed) {
    FILE *f = fopen(path, "w");
    arl_rng r;
    arl_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) {
        int s = (int)arl_rng_below(&r, 26);
        char a[9];
        for (int k = 0; k < 8; k++)
            a[k] = (char)('a' + (s + k) % 26);
        a[8] = 0;
        fprintf(f,
                "{\"messages\": [{\"role\": \"user\", \"content\": \"go\"}, {\"role\": "
                "\"assistant\", \"content\": \"%s\"}], \"tools\": null}\n",
                a);
    }
    fclose(f);
}

static void write_experiment(void) {
    FILE *f = fopen(g_exp, "w");
    fprintf(f,
            "{\n"
            "  \"model\": \"%s\",\n"
            "  \"init-seed\": 1,\n"
            "  \"data\": \"%s\",\n"
            "  \"eval-data\": \"%s\",\n"
            "  \"batch-tokens\": 512,\n"
            "  \"steps\": %d,\n"
            "  \"eval-interval\": 40,\n"
            "  \"checkpoint-interval\": 10,\n"
            "  \"keep-last\": 2,\n"
            "  \"seed\": 3,\n"
            "  \"threads\": 1,\n"
            "  \"progress\": \"plain\",\n"
            "  \"log-interval\": 40,\n"
            "  \"lr\": 0.03,\n"
            "  \"beta2\": 0.99,\n"
            "  \"warmup_steps\": 10,\n"
            "  \"weight_decay\": 0.01,\n"
            "  \"clip_norm\": 1.0\n"
            "}\n",
            test_src_path("tests/train/data/micro/config.json"), g_train, g_eval, STEPS);
    fclose(f);
}

/* Load the experiment with out = dir (and extra --set values). */
static arl_status load_cfg(arl_sft_config *c, const char *out, const char *extra_set) {
    char outset[1100];
    snprintf(outset, sizeof outset, "out=%s", out);
    char *v[2] = {outset, (char *)extra_set};
    arl_strlist sets = {v, extra_set ? 2 : 1};
    return arl_sft_config_load(g_exp, &sets, c);
}

/* run_dir with any number of --set values. */
static arl_status run_sets(const char *out, int resume, int n, const char *const *sets,
                           const arl_sft_model_ops *ops, arl_sft_result *res) {
    char outset[1100];
    snprintf(outset, sizeof outset, "out=%s", out);
    char *v[8] = {outset};
    for (int i = 0; i < n && i < 7; i++)
        v[1 + i] = (char *)sets[i];
    arl_strlist sl = {v, 1 + n};
    arl_sft_config c;
    arl_status s = arl_sft_config_load(g_exp, &sl, &c);
    if (!s) s = arl_sft_run(&c, ops, resume, NULL, NULL, res);
    arl_sft_config_free(&c);
    return s;
}

static arl_status run_dir(const char *out, int resume, const char *extra_set, FILE *log,
                          arl_sft_result *res, const arl_sft_hooks *hooks) {
    arl_sft_config c;
    arl_status s = load_cfg(&c, out, extra_set);
    if (!s) s = arl_sft_run(&c, test_ops(), resume, hooks, log, res);
    arl_sft_config_free(&c);
    return s;
}

/* Losses by step (index step-1) from metrics.jsonl; returns the number of step lines. */
static int read_losses(const char *out, double *loss, int cap, int *n_eval) {
    FILE *f = fopen(path_in(out, "metrics.jsonl"), "r");
    if (!f) return -1;
    char *line = NULL;
    size_t lc = 0;
    int n = 0;
    *n_eval = 0;
    for (int i = 0; i < cap; i++)
        loss[i] = NAN;
    while (getline(&line, &lc, f) > 0) {
        json_error_t e;
        json_t *j = json_loads(line, 0, &e);
        CHECK_MSG(j != NULL, "metrics line is not JSON: %s", line);
        if (!j) continue;
        json_int_t st = json_integer_value(json_object_get(j, "step"));
        json_t *l = json_object_get(j, "loss");
        if (l && st >= 1 && st <= cap) {
            CHECK_MSG(isnan(loss[st - 1]), "step %lld listed twice", (long long)st);
            loss[st - 1] = json_real_value(l);
            n++;
        }
        if (json_object_get(j, "eval_loss")) (*n_eval)++;
        json_decref(j);
    }
    free(line);
    fclose(f);
    return n;
}

/* The parameters of the newest checkpoint of a run. */
static float *final_params(const char *out, int64_t *n, int64_t *step) {
    char root[1100], latest[1200];
    snprintf(root, sizeof root, "%s/checkpoints", out);
    if (arl_train_ckpt_latest(root, latest, sizeof latest, step) != ARL_OK) return NULL;
    arl_model_config cfg;
    if (arl_model_config_read(latest, &cfg) != ARL_OK) return NULL;
    arl_model_params p;
    float *copy = NULL;
    if (arl_model_params_alloc(&p, &cfg) == ARL_OK &&
        arl_checkpoint_load(latest, &cfg, &p) == ARL_OK) {
        *n = p.inv.arena_floats;
        copy = malloc((size_t)*n * sizeof(float));
        memcpy(copy, p.arena, (size_t)*n * sizeof(float));
    }
    arl_model_params_free(&p);
    arl_model_config_free(&cfg);
    return copy;
}

/* ---- child mode: this program re-executed ---- */

typedef struct kill_ctx {
    int64_t after;
} kill_ctx;

static arl_status kill_after(void *ctx, int64_t step, double loss) {
    (void)loss;
    if (step == ((kill_ctx *)ctx)->after) raise(SIGKILL);
    return ARL_OK;
}

static int child_main(int argc, char **argv) {
    /* child EXP OUT KILL_AFTER RESUME */
    if (argc != 6) return 2;
    snprintf(g_exp, sizeof g_exp, "%s", argv[2]);
    kill_ctx kc = {atoll(argv[4])};
    arl_sft_hooks hooks = {&kc, kill_after};
    arl_sft_result res;
    arl_status s = run_dir(argv[3], atoi(argv[5]), NULL, NULL, &res, kc.after > 0 ? &hooks : NULL);
    if (s) fprintf(stderr, "child: %s\n", arl_error_msg());
    return s ? 1 : 0;
}

static pid_t spawn_child(const char *out, int64_t kill_after_step, int resume) {
    char ka[32], rs[8];
    snprintf(ka, sizeof ka, "%lld", (long long)kill_after_step);
    snprintf(rs, sizeof rs, "%d", resume);
    pid_t pid = fork();
    if (pid == 0) {
        char *args[] = {"test_train_sft", "child", g_exp, (char *)out, ka, rs, NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    return pid;
}

/* ---- tests ---- */

static void test_gradient_fd(void) {
    arl_model_config cfg;
    CHECK(arl_model_config_read(test_src_path("tests/train/data/micro/config.json"), &cfg) ==
          ARL_OK);
    arl_model_params p, g;
    CHECK(arl_model_params_alloc(&p, &cfg) == ARL_OK);
    CHECK(arl_model_params_alloc(&g, &cfg) == ARL_OK);
    arl_rng r;
    arl_rng_seed(&r, 5);
    /* a scale at which the softmax is far from uniform */
    for (int64_t i = 0; i < cfg.dims.V * cfg.dims.d; i++) {
        p.embed_tokens[i] = (float)(0.5 * arl_rng_normal(&r));
        p.lm_head[i] = (float)(0.5 * arl_rng_normal(&r));
    }
    arl_chat_template t;
    arl_chat_template_default(&t);
    arl_sft_data_config dc = {512, ARL_SFT_MALFORMED_FAIL, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *d;
    CHECK(arl_sft_data_open(g_train, &dc, &t, &d) == ARL_OK);
    arl_sft_batch b;
    CHECK(arl_sft_batch_init(&b, 128) == ARL_OK);
    arl_data_cursor c;
    arl_sft_data_cursor_start(d, 0, &c);
    CHECK(arl_sft_data_next_batch(d, &c, 0, 128, &b) == ARL_OK);
    void *ws;
    const arl_sft_model_ops *ops = embed_lm_ops();
    CHECK(ops->create(&ws, &cfg, 128, 128, 1) == ARL_OK);
    double loss = 0;
    const double scale = 0.5;
    CHECK(ops->train_step(ws, &p, &b, scale, &g, &loss, NULL) == ARL_OK);
    CHECK_CLOSE(loss, embed_lm_loss_ref(&p, &b), 1e-9, 1e-12);
    /* accumulation: a second call adds the same gradient */
    float g0 = g.lm_head[5 * cfg.dims.d + 3];
    double loss2;
    CHECK(ops->train_step(ws, &p, &b, scale, &g, &loss2, NULL) == ARL_OK);
    CHECK_CLOSE(g.lm_head[5 * cfg.dims.d + 3], 2 * g0, 1e-7, 1e-6);
    for (int64_t i = 0; i < g.inv.arena_floats; i++)
        g.arena[i] *= 0.5f;
    /* central differences on entries the batch touches: embedding rows of its tokens and
       lm_head rows of its targets and of random ids.  h = 1e-2 on O(1) logits: truncation
       error O(h^2) ~ 1e-4 relative; the double loss from float parameters adds ~1e-7 / h */
    int checked = 0;
    for (int k = 0; k < 40; k++) {
        int64_t t = (int64_t)arl_rng_below(&r, (uint64_t)b.T);
        float *w, *gw;
        int64_t row =
            k % 2 ? b.ids[t] : (b.labels[t] >= 0 ? b.labels[t] : (int64_t)arl_rng_below(&r, 384));
        int64_t col = (int64_t)arl_rng_below(&r, (uint64_t)cfg.dims.d);
        if (k % 2) {
            w = &p.embed_tokens[row * cfg.dims.d + col];
            gw = &g.embed_tokens[row * cfg.dims.d + col];
        } else {
            w = &p.lm_head[row * cfg.dims.d + col];
            gw = &g.lm_head[row * cfg.dims.d + col];
        }
        float w0 = *w;
        *w = w0 + 1e-2f;
        double up = embed_lm_loss_ref(&p, &b), dup = (double)*w - w0;
        *w = w0 - 1e-2f;
        double dn = embed_lm_loss_ref(&p, &b), ddn = w0 - (double)*w;
        *w = w0;
        double fd = scale * (up - dn) / (dup + ddn);
        CHECK_CLOSE(*gw, fd, 2e-5, 2e-3);
        checked++;
    }
    CHECK_EQ_INT(checked, 40);
    /* untouched tensors get no gradient */
    CHECK(g.norm[0] == 0 && g.layers[0].input_norm[0] == 0);
    ops->destroy(ws);
    arl_sft_batch_free(&b);
    arl_sft_data_close(d);
    arl_model_params_free(&p);
    arl_model_params_free(&g);
    arl_model_config_free(&cfg);
}

static void test_config(void) {
    arl_sft_config c;
    CHECK(load_cfg(&c, path_in(g_dir, "cfgtest"), "lr=0.001") == ARL_OK);
    CHECK(c.optim.lr == 0.001 && c.batch_tokens == 512 && c.optim.warmup_steps == 10);
    CHECK(c.shuffle == 1 && !strcmp(c.on_malformed, "fail")); /* defaults */
    arl_sft_config_free(&c);
    CHECK(load_cfg(&c, "x", "no-such-key=1") == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "no-such-key") != NULL);
    arl_sft_config_free(&c);
    CHECK(load_cfg(&c, "x", "max-seq-tokens=1000") == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "max-seq-tokens") != NULL);
    arl_sft_config_free(&c);
    /* an unknown key in the file names the file and the key */
    const char *bad = path_in(g_dir, "bad.json");
    FILE *f = fopen(bad, "w");
    fputs("{\"data\": \"x\", \"out\": \"y\", \"model\": \"tiny\", \"learning_rate\": 1}", f);
    fclose(f);
    CHECK(arl_sft_config_load(bad, NULL, &c) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "bad.json") && strstr(arl_error_msg(), "learning_rate"));
    arl_sft_config_free(&c);
    f = fopen(bad, "w");
    fputs("{\"data\": \"x\", \"model\": \"tiny\"}", f);
    fclose(f);
    CHECK(arl_sft_config_load(bad, NULL, &c) == ARL_ERR_CONFIG); /* out is required */
    CHECK(strstr(arl_error_msg(), "out") != NULL);
    arl_sft_config_free(&c);
    /* a key whose value leaves nothing to train on, or an empty path, is refused at load */
    CHECK(load_cfg(&c, "x", "max-seq-tokens=1") == ARL_ERR_CONFIG);
    CHECK_MSG(strstr(arl_error_msg(), "'max-seq-tokens'") != NULL, "%s", arl_error_msg());
    arl_sft_config_free(&c);
    CHECK(load_cfg(&c, "", NULL) == ARL_ERR_CONFIG);
    CHECK_MSG(strstr(arl_error_msg(), "key 'out': empty") != NULL, "%s", arl_error_msg());
    arl_sft_config_free(&c);
    CHECK(load_cfg(&c, "x", "eval-data=") == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "key 'eval-data': empty") != NULL);
    arl_sft_config_free(&c);
    /* evaluation settings without an eval file would silently do nothing */
    const char *no_eval[] = {"eval-data=/dev/null", "eval-interval=5"};
    char outset[] = "out=x", *v[] = {outset, (char *)no_eval[0], (char *)no_eval[1]};
    arl_strlist sl = {v, 3};
    CHECK(arl_sft_config_load(g_exp, &sl, &c) == ARL_OK); /* with one: fine */
    arl_sft_config_free(&c);
    FILE *ne = fopen(path_in(g_dir, "no_eval.json"), "w");
    fprintf(ne, "{\"model\": \"tiny\", \"data\": \"x\", \"out\": \"y\", \"eval-interval\": 5}");
    fclose(ne);
    CHECK(arl_sft_config_load(path_in(g_dir, "no_eval.json"), NULL, &c) == ARL_ERR_CONFIG);
    CHECK_MSG(strstr(arl_error_msg(), "key 'eval-interval': 5, but no 'eval-data'") != NULL, "%s",
              arl_error_msg());
    arl_sft_config_free(&c);
    /* this build's model: the CPU policy (experiments/sft_model.c) */
    CHECK(arl_sft_model_ops_default() != NULL);
}

static double g_losses_a[STEPS];
static float *g_params_a;
static int64_t g_n_params;

static void test_train_and_determinism(void) {
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s/run_a", g_dir);
    snprintf(b, sizeof b, "%s/run_b", g_dir);
    arl_sft_result ra, rb;
    CHECK(run_dir(a, 0, NULL, stderr, &ra, NULL) == ARL_OK);
    CHECK_EQ_INT(ra.step, STEPS);
    CHECK_EQ_INT(ra.resumed_from, -1);
    fprintf(stderr, "held-out loss after %d steps: %.4f (threshold %.2f, bigram optimum 0.697)\n",
            STEPS, ra.eval_loss, EVAL_THRESHOLD);
    CHECK(ra.eval_loss < EVAL_THRESHOLD);
    int n_eval;
    CHECK_EQ_INT(read_losses(a, g_losses_a, STEPS, &n_eval), STEPS);
    CHECK_EQ_INT(n_eval, 3);    /* steps 40, 80, 120 */
    CHECK(g_losses_a[0] > 5.0); /* untrained: ~ln 384 */
    CHECK(strstr(ra.checkpoint, "step-00000120") != NULL);
    /* outputs: resolved configuration, keep-last 2 */
    struct stat sb;
    CHECK(stat(path_in(a, "experiment.json"), &sb) == 0);
    int64_t *steps, n;
    CHECK(arl_train_ckpt_list(path_in(a, "checkpoints"), &steps, &n) == ARL_OK);
    CHECK(n == 2 && steps[0] == 110 && steps[1] == 120);
    free(steps);

    /* the same experiment again: bit-identical losses and parameters */
    CHECK(run_dir(b, 0, NULL, NULL, &rb, NULL) == ARL_OK);
    double lb[STEPS];
    CHECK_EQ_INT(read_losses(b, lb, STEPS, &n_eval), STEPS);
    CHECK(memcmp(g_losses_a, lb, sizeof lb) == 0);
    CHECK(memcmp(&ra.eval_loss, &rb.eval_loss, sizeof(double)) == 0);
    int64_t st, nb;
    g_params_a = final_params(a, &g_n_params, &st);
    float *pb = final_params(b, &nb, &st);
    CHECK(g_params_a && pb && nb == g_n_params);
    CHECK(g_params_a && pb && memcmp(g_params_a, pb, (size_t)nb * 4) == 0);
    free(pb);

    /* another seed changes the data order and thus the losses */
    arl_sft_result rc;
    CHECK(run_dir(path_in(g_dir, "run_seed"), 0, "seed=4", NULL, &rc, NULL) == ARL_OK);
    double lc[STEPS];
    CHECK_EQ_INT(read_losses(path_in(g_dir, "run_seed"), lc, STEPS, &n_eval), STEPS);
    CHECK(lc[0] != g_losses_a[0] && lc[1] != g_losses_a[1]);

    /* a run without --resume refuses a directory that holds one; --resume past the end
       changes nothing; a resume with other settings is refused naming them */
    CHECK(run_dir(a, 0, NULL, NULL, &rc, NULL) == ARL_ERR_STATE);
    CHECK(strstr(arl_error_msg(), "--resume") != NULL);
    CHECK(run_dir(a, 1, NULL, NULL, &rc, NULL) == ARL_OK);
    CHECK_EQ_INT(rc.resumed_from, STEPS);
    double la2[STEPS];
    CHECK_EQ_INT(read_losses(a, la2, STEPS, &n_eval), STEPS);
    CHECK(memcmp(g_losses_a, la2, sizeof la2) == 0);
    CHECK(run_dir(a, 1, "lr=0.02", NULL, &rc, NULL) == ARL_ERR_CONFIG);
    CHECK_MSG(strstr(arl_error_msg(), "other settings (as saved -> as now): lr ") &&
                  strstr(arl_error_msg(), " -> 0.02;"),
              "%s", arl_error_msg());
    /* more steps with total-steps 0 would stretch the schedule: refused as well, naming the
     * resolved total */
    CHECK(run_dir(a, 1, "steps=130", NULL, &rc, NULL) == ARL_ERR_CONFIG);
    CHECK_MSG(strstr(arl_error_msg(), "total-steps 120 -> 130"), "%s", arl_error_msg());
    /* settings that do not change the trajectory may change */
    CHECK(run_dir(a, 1, "keep-last=5", NULL, &rc, NULL) == ARL_OK);
}

/* Starting from a checkpoint (init): the first loss is the trained model's, not ~ln 384. */
static void test_init_from_checkpoint(void) {
    char a[1024], out[1024], set[1200];
    snprintf(a, sizeof a, "%s/run_a/checkpoints/step-00000120", g_dir);
    snprintf(out, sizeof out, "%s/run_init", g_dir);
    snprintf(set, sizeof set, "init=%s", a);
    arl_sft_config c;
    CHECK(load_cfg(&c, out, set) == ARL_OK);
    arl_sft_result r;
    CHECK(arl_sft_run(&c, test_ops(), 0, NULL, NULL, &r) == ARL_OK);
    arl_sft_config_free(&c);
    double l[STEPS];
    int n_eval;
    CHECK_EQ_INT(read_losses(out, l, STEPS, &n_eval), STEPS);
    CHECK(l[0] < 1.0);
}

/* A directory another run holds (core/dirlock.h; here this process, as a second `agentrl sft
 * --resume` beside a running one would find it) is refused with ARL_ERR_BUSY before anything is
 * written; free again, the same run goes on. */
static void test_busy_dir(void) {
    char out[1024], p[1200];
    snprintf(out, sizeof out, "%s/run_busy", g_dir);
    CHECK(mkdir(out, 0755) == 0);
    arl_dirlock held;
    CHECK(arl_dirlock_take(&held, out, "test") == ARL_OK);
    arl_sft_result r;
    CHECK(run_dir(out, 1, NULL, NULL, &r, NULL) == ARL_ERR_BUSY);
    CHECK_MSG(strstr(arl_error_msg(), "in use by another process") != NULL, "message: %s",
              arl_error_msg());
    arl_error_clear();
    struct stat sb;
    snprintf(p, sizeof p, "%s/checkpoints", out);
    CHECK(stat(p, &sb) != 0);
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    CHECK(stat(p, &sb) != 0);
    arl_dirlock_release(&held);
    CHECK_MSG(run_dir(out, 1, NULL, NULL, &r, NULL) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(r.step, STEPS);
}

static void check_resumed_equals_a(const char *out) {
    double l[STEPS];
    int n_eval;
    CHECK_EQ_INT(read_losses(out, l, STEPS, &n_eval), STEPS);
    CHECK(memcmp(l, g_losses_a, sizeof l) == 0);
    CHECK_EQ_INT(n_eval, 3);
    int64_t n, st;
    float *p = final_params(out, &n, &st);
    CHECK_EQ_INT(st, STEPS);
    CHECK(p && g_params_a && n == g_n_params && memcmp(p, g_params_a, (size_t)n * 4) == 0);
    free(p);
}

/* Killed by SIGKILL right after step 27 (last checkpoint: 20), resumed to the end. */
static void test_kill_after_step_resume(void) {
    char out[1024];
    snprintf(out, sizeof out, "%s/run_kill", g_dir);
    pid_t pid = spawn_child(out, 27, 0);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child status %d", status);
    double l[STEPS];
    int n_eval;
    CHECK_EQ_INT(read_losses(out, l, STEPS, &n_eval), 27); /* 21..27 will be redone */
    arl_sft_result r;
    CHECK(run_dir(out, 1, NULL, NULL, &r, NULL) == ARL_OK);
    CHECK_EQ_INT(r.resumed_from, 20);
    check_resumed_equals_a(out);
}

/* A finished run whose newest checkpoint (120) is damaged - its weights file cut short -
 * resumes from the one before it (110): the damaged one is moved to damaged-step-00000120 and
 * the run ends as run A did.  A checkpoint refused for another reason (a changed setting) is
 * left where it is. */
static void test_damaged_checkpoint_resume(void) {
    char out[1024], p[1200];
    snprintf(out, sizeof out, "%s/run_damaged", g_dir);
    arl_sft_result r;
    CHECK(run_dir(out, 0, NULL, NULL, &r, NULL) == ARL_OK);
    CHECK(run_dir(out, 1, "lr=0.5", NULL, &r, NULL) == ARL_ERR_CONFIG); /* not damage */
    arl_error_clear();
    struct stat sb;
    snprintf(p, sizeof p, "%s/checkpoints/damaged-step-00000120", out);
    CHECK(stat(p, &sb) != 0);
    snprintf(p, sizeof p, "%s/checkpoints/step-00000120/model.safetensors", out);
    CHECK(truncate(p, 100) == 0);
    CHECK_MSG(run_dir(out, 1, NULL, NULL, &r, NULL) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(r.resumed_from, 110);
    snprintf(p, sizeof p, "%s/checkpoints/damaged-step-00000120/model.safetensors", out);
    CHECK(stat(p, &sb) == 0 && sb.st_size == 100);
    check_resumed_equals_a(out);
}

/* Killed by the parent at an arbitrary moment (checkpoints every 10 steps are being written
   all the time), resumed in a second process. */
static void test_kill_anytime_resume(void) {
    char out[1024], ckroot[1100];
    snprintf(out, sizeof out, "%s/run_kill2", g_dir);
    snprintf(ckroot, sizeof ckroot, "%s/checkpoints", out);
    pid_t pid = spawn_child(out, 0, 0);
    /* wait until the run is past its third checkpoint, then kill it */
    struct timespec ts = {0, 1000000};
    for (int i = 0; i < 20000; i++) {
        int64_t st = -1;
        char latest[1200];
        if (arl_train_ckpt_latest(ckroot, latest, sizeof latest, &st) == ARL_OK && st >= 30) break;
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status)) {
        /* the child finished before the kill landed (a very fast machine): still valid */
        fprintf(stderr, "note: the child finished before SIGKILL\n");
    }
    pid = spawn_child(out, 0, 1);
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "resumed child status %d", status);
    check_resumed_equals_a(out);
}

/* The output directory.  One that holds an earlier run's metrics.jsonl without a checkpoint (a
 * run stopped before its first one) is refused without --resume, the file left as it was;
 * --resume starts that run again.  A metrics file that cannot be written (a full disk:
 * /dev/full) stops the run with ARL_ERR_FULL naming it, instead of finishing without its lines.
 * A shared prefix with a conversation longer than batch-tokens is refused before anything is
 * written. */
static void test_output_dir(void) {
    char out[1024], p[1200];
    const char *two[] = {"steps=2", "warmup-steps=0", "shared-prefix=true", "batch-tokens=8"};
    arl_sft_result r;
    struct stat sb;

    snprintf(out, sizeof out, "%s/run_earlier", g_dir);
    CHECK(mkdir(out, 0755) == 0);
    snprintf(p, sizeof p, "%s/metrics.jsonl", out);
    FILE *f = fopen(p, "w");
    fputs("{\"step\": 1, \"loss\": 5}\n", f);
    fclose(f);
    CHECK(run_sets(out, 0, 2, two, test_ops(), &r) == ARL_ERR_STATE);
    CHECK_MSG(strstr(arl_error_msg(), "earlier run's metrics.jsonl") &&
                  strstr(arl_error_msg(), "--resume"),
              "%s", arl_error_msg());
    CHECK(stat(p, &sb) == 0 && sb.st_size == 23);
    CHECK_MSG(run_sets(out, 1, 2, two, test_ops(), &r) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(r.step, 2);

    if (stat("/dev/full", &sb) == 0) {
        snprintf(out, sizeof out, "%s/run_full", g_dir);
        CHECK(mkdir(out, 0755) == 0);
        snprintf(p, sizeof p, "%s/metrics.jsonl", out);
        CHECK(symlink("/dev/full", p) == 0);
        CHECK(run_sets(out, 1, 2, two, test_ops(), &r) == ARL_ERR_FULL);
        CHECK_MSG(strstr(arl_error_msg(), "metrics.jsonl: cannot write") != NULL, "%s",
                  arl_error_msg());
    }

    snprintf(out, sizeof out, "%s/run_prefix", g_dir);
    CHECK(run_sets(out, 0, 4, two, test_ops(), &r) == ARL_ERR_ARG);
    CHECK_MSG(strstr(arl_error_msg(), "'batch-tokens' 8") != NULL, "%s", arl_error_msg());
    CHECK(stat(out, &sb) != 0);
}

/* The model is asked for working memory of at most one epoch's tokens of the larger file when
 * batch-tokens is above that (a batch never spans two epochs), and trains exactly as with
 * that budget. */
static arl_sft_model_ops g_cap_ops;
static int64_t g_cap_tokens;
static arl_status cap_create(void **ws, const arl_model_config *cfg, int64_t max_tokens,
                             int64_t max_seqs, int threads) {
    g_cap_tokens = max_tokens;
    return test_ops()->create(ws, cfg, max_tokens, max_seqs, threads);
}

static void test_budget_above_data(void) {
    g_cap_ops = *test_ops();
    g_cap_ops.create = cap_create;
    char a[1024], b[1024], budget[64];
    snprintf(a, sizeof a, "%s/run_budget_big", g_dir);
    snprintf(b, sizeof b, "%s/run_budget_epoch", g_dir);
    const char *big[] = {"steps=3", "warmup-steps=0", "batch-tokens=200000"};
    arl_sft_result ra, rb;
    CHECK_MSG(run_sets(a, 0, 3, big, &g_cap_ops, &ra) == ARL_OK, "%s", arl_error_msg());
    const int64_t cap = g_cap_tokens;
    /* 300 conversations of about 30 tokens; the eval file has 40 */
    CHECK_MSG(cap > 1000 && cap < 100000, "workspace of %lld tokens", (long long)cap);
    snprintf(budget, sizeof budget, "batch-tokens=%lld", (long long)cap);
    const char *epoch[] = {"steps=3", "warmup-steps=0", budget};
    CHECK_MSG(run_sets(b, 0, 3, epoch, &g_cap_ops, &rb) == ARL_OK, "%s", arl_error_msg());
    double la[3], lb[3];
    int na, nb;
    CHECK_EQ_INT(read_losses(a, la, 3, &na), 3);
    CHECK_EQ_INT(read_losses(b, lb, 3, &nb), 3);
    CHECK(memcmp(la, lb, sizeof la) == 0 && ra.eval_loss == rb.eval_loss);
    int64_t n1, n2, s1, s2;
    float *p1 = final_params(a, &n1, &s1), *p2 = final_params(b, &n2, &s2);
    CHECK(p1 && p2 && n1 == n2 && memcmp(p1, p2, (size_t)n1 * 4) == 0);
    free(p1);
    free(p2);
}

static int rm_cb(const char *p, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)type;
    (void)ftw;
    return remove(p);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "child")) return child_main(argc, argv);
    snprintf(g_dir, sizeof g_dir, "%s", test_tmpdir("sft"));
    snprintf(g_train, sizeof g_train, "%s/train.jsonl", g_dir);
    snprintf(g_eval, sizeof g_eval, "%s/eval.jsonl", g_dir);
    snprintf(g_exp, sizeof g_exp, "%s/experiment.json", g_dir);
    write_task(g_train, 300, 1);
    write_task(g_eval, 40, 2);
    write_experiment();
#ifndef SFT_TEST_POLICY
    TEST_RUN(test_gradient_fd); /* the stand-in's own gradient; the policy's: tests/policy_backward */
#else
    (void)test_gradient_fd;
#endif
    TEST_RUN(test_config);
    TEST_RUN(test_train_and_determinism);
    TEST_RUN(test_init_from_checkpoint);
    TEST_RUN(test_busy_dir);
    TEST_RUN(test_kill_after_step_resume);
    TEST_RUN(test_kill_anytime_resume);
    TEST_RUN(test_damaged_checkpoint_resume);
    TEST_RUN(test_output_dir);
    TEST_RUN(test_budget_above_data);
    free(g_params_a);
    int rc = test_finish();
    if (rc == 0) nftw(g_dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS); /* keep it for a failure */
    return rc;
}
