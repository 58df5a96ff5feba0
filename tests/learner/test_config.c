/* tests/learner/test_config.c: the experiment configuration of `agentrl train`
 * (experiments/train.h): every shipped experiment (experiments/NAME.json) loads and validates,
 * the resolved configuration reads back to the same configuration, --set reaches every section,
 * and bad input (unknown keys and sections, keys the driver owns, malformed values) is an error
 * that names the key. */
#include <dirent.h>
#include <string.h>

#include "experiments/train.h"
#include "tests/test.h"

static char tmp[512];

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputs(text, f);
    fclose(f);
}

/* Load text as an experiment; returns the status (the config is freed). */
static arl_status load_text(const char *text, const char *const *sets, int n_sets) {
    char p[700];
    snprintf(p, sizeof p, "%s/x.json", tmp);
    write_file(p, text);
    arl_strlist sl = {(char **)sets, n_sets};
    arl_train_config c;
    arl_status s = arl_train_config_load(p, &sl, &c);
    arl_train_config_free(&c);
    return s;
}

static const char *base =
    "{\"model\": \"tiny\", \"out\": \"/tmp/x\", \"rollout\": {\"env\": \"builtin:calculator\", "
    "\"task-data\": {\"level\": 1}}}";

static void test_shipped(void) {
    const char *dir = test_src_path("experiments");
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 6 || strcmp(e->d_name + l - 5, ".json")) continue;
        char p[1200];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        arl_train_config c;
        arl_status s = arl_train_config_load(p, NULL, &c);
        CHECK_MSG(s == ARL_OK, "%s: %s", p, arl_error_msg());
        if (s == ARL_OK) {
            /* the resolved configuration is itself an experiment, equal to the original */
            char *j1 = arl_train_config_json(&c);
            char rp[700];
            snprintf(rp, sizeof rp, "%s/resolved.json", tmp);
            write_file(rp, j1);
            arl_train_config c2;
            s = arl_train_config_load(rp, NULL, &c2);
            CHECK_MSG(s == ARL_OK, "%s resolved: %s", p, arl_error_msg());
            char *j2 = s == ARL_OK ? arl_train_config_json(&c2) : NULL;
            CHECK_MSG(j2 && !strcmp(j1, j2), "%s: the resolved configuration does not read back",
                      p);
            free(j1);
            free(j2);
            arl_train_config_free(&c2);
        }
        arl_train_config_free(&c);
        n++;
    }
    if (d) closedir(d);
    CHECK_MSG(n >= 3, "expected calculator.json, calculator-ci.json, needle-1m.json; found %d", n);
}

static void test_sets(void) {
    char p[700];
    snprintf(p, sizeof p, "%s/x.json", tmp);
    write_file(p, base);
    const char *sets[] = {"steps=3",
                          "rollout.temperature=0.5",
                          "learner.kl-target=0.02",
                          "learner.minibatches=2",
                          "learner.lr=1e-5",
                          "sft.steps=7"};
    arl_strlist sl = {(char **)sets, 6};
    arl_train_config c;
    arl_status s = arl_train_config_load(p, &sl, &c);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    if (s == ARL_OK) {
        CHECK_EQ_INT(c.steps, 3);
        CHECK(c.rollout.temperature == 0.5);
        CHECK(c.learner.kl.target == 0.02);
        CHECK_EQ_INT(c.learner.own.minibatches, 2);
        CHECK(c.learner.optim.lr == 1e-5);
        CHECK_EQ_INT(c.sft.steps, 7);
        /* the RL optimizer's defaults are the objective's (spec/objective.md 13), not SFT's */
        arl_train_config d;
        CHECK(load_text(base, NULL, 0) == ARL_OK);
        snprintf(p, sizeof p, "%s/x.json", tmp);
        write_file(p, base);
        CHECK(arl_train_config_load(p, NULL, &d) == ARL_OK);
        CHECK(d.learner.optim.lr == 1e-6);
        CHECK(d.learner.optim.weight_decay == 0.1);
        CHECK_EQ_INT(d.learner.own.minibatches, 4);
        arl_train_config_free(&d);
    }
    arl_train_config_free(&c);
}

static void expect_error(const char *text, const char *const *sets, int n, const char *needle) {
    arl_status s = load_text(text, sets, n);
    CHECK_MSG(s != ARL_OK, "accepted: %s", text);
    if (s != ARL_OK)
        CHECK_MSG(strstr(arl_error_msg(), needle) != NULL, "message '%s' lacks '%s'",
                  arl_error_msg(), needle);
}

static void test_errors(void) {
    expect_error("{\"model\": \"tiny\", \"out\": \"/tmp/x\", \"stepz\": 3, \"rollout\": {\"env\": "
                 "\"calculator\"}}",
                 NULL, 0, "stepz");
    expect_error(
        "{\"model\": \"tiny\", \"out\": \"/tmp/x\", \"rollout\": {\"env\": \"calculator\", "
        "\"temprature\": 1}}",
        NULL, 0, "temprature");
    expect_error(
        "{\"model\": \"tiny\", \"out\": \"/tmp/x\", \"rollout\": {\"env\": \"calculator\"}, "
        "\"learner\": {\"kl-targt\": 1}}",
        NULL, 0, "kl-targt");
    expect_error(
        "{\"model\": \"tiny\", \"out\": \"/tmp/x\", \"rollout\": {\"env\": \"calculator\"}, "
        "\"sft\": {\"data\": \"x.jsonl\"}}",
        NULL, 0, "data");
    expect_error(
        "{\"model\": \"tiny\", \"out\": \"/tmp/x\", \"rollout\": {\"env\": \"calculator\"}, "
        "\"extra\": {}}",
        NULL, 0, "extra");
    expect_error(
        "{\"model\": \"tiny\", \"out\": \"/tmp/x\", \"rollout\": {\"env\": \"calculator\"}, "
        "\"steps\": \"ten\"}",
        NULL, 0, "steps");
    const char *bad_sec[] = {"trainer.lr=1"};
    expect_error(base, bad_sec, 1, "trainer");
    const char *bad_sft[] = {"sft.out=/tmp/y"};
    expect_error(base, bad_sft, 1, "sft.out");
    const char *bad_stage[] = {"context-stages=5"};
    expect_error(base, bad_stage, 1, "context-stages");
    /* budgets of spec/objective.md 3.2 */
    const char *bad_budget[] = {"rollout.segment-tokens=100"};
    expect_error(base, bad_budget, 1, "segment-tokens");
    /* an unknown device name */
    const char *bad_dev2[] = {"learner.device=tpu"};
    expect_error(base, bad_dev2, 1, "device");
    /* Monte-Carlo segment baselines with the segment level off: forks for nothing */
    const char *bad_mc[] = {"learner.segment-baseline=mc", "learner.w-segment=0"};
    expect_error(base, bad_mc, 2, "w-segment");
    const char *bad_mc_n[] = {"learner.segment-baseline=mc", "learner.mc-forks=0"};
    expect_error(base, bad_mc_n, 2, "mc-forks");
    /* the teacher's demonstrations need a built-in environment */
    expect_error(
        "{\"model\": \"tiny\", \"out\": \"/tmp/x\", \"sft-demos\": 4, \"rollout\": {\"env\": "
        "\"http://127.0.0.1:9/\"}}",
        NULL, 0, "sft-demos");
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("learner-config"));
    TEST_RUN(test_shipped);
    TEST_RUN(test_sets);
    TEST_RUN(test_errors);
    return test_finish();
}
