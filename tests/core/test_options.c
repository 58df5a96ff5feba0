/* Option tables: defaults, argv and JSON parsing, validation errors that name the option. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/options.h"
#include "tests/test.h"

typedef struct cfg {
    char *path;
    int64_t n;
    double t;
    int flag;
    char *dev;
    arl_strlist set;
} cfg;

static const arl_option tab[] = {
    {"path", ARL_OPT_STRING, offsetof(cfg, path), NULL, "input file", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "FILE"},
    {"max-tokens", ARL_OPT_INT, offsetof(cfg, n), "16", "tokens to sample", 1, 1000, NULL, 0, NULL},
    {"temperature", ARL_OPT_FLOAT, offsetof(cfg, t), "1.0", "sampling temperature", 0, 10, NULL, 0,
     NULL},
    {"json", ARL_OPT_BOOL, offsetof(cfg, flag), NULL, "print JSON", 0, 0, NULL, 0, NULL},
    {"device", ARL_OPT_CHOICE, offsetof(cfg, dev), "cpu", "backend", 0, 0, "cpu|cuda", 0, NULL},
    {"set", ARL_OPT_LIST, offsetof(cfg, set), NULL, "override key=value", 0, 0, NULL, 0,
     "KEY=VALUE"},
};
#define N ARL_OPTIONS_COUNT(tab)

static void test_defaults_and_argv(void) {
    cfg c;
    int help;
    arl_options_defaults(tab, N, &c);
    CHECK_EQ_INT(c.n, 16);
    CHECK(c.t == 1.0);
    CHECK_STR_EQ(c.dev, "cpu");
    char *argv[] = {"in.txt", "--max-tokens", "5", "--temperature=0.5", "--json",
                    "--device", "cuda", "--set", "a=1", "--set", "b=2"};
    CHECK(arl_options_parse_argv(tab, N, 11, argv, &c, &help) == ARL_OK);
    CHECK(!help);
    CHECK(arl_options_check_required(tab, N, &c) == ARL_OK);
    CHECK_STR_EQ(c.path, "in.txt");
    CHECK_EQ_INT(c.n, 5);
    CHECK(c.t == 0.5);
    CHECK(c.flag == 1);
    CHECK_STR_EQ(c.dev, "cuda");
    CHECK_EQ_INT(c.set.n, 2);
    CHECK_STR_EQ(c.set.v[1], "b=2");
    char *j = arl_options_to_json(tab, N, &c);
    CHECK(j && strstr(j, "\"max-tokens\":5"));
    free(j);
    arl_options_free(tab, N, &c);
}

static void test_errors_name_the_option(void) {
    cfg c;
    int help;
    arl_options_defaults(tab, N, &c);
    char *a1[] = {"x", "--bogus"};
    CHECK(arl_options_parse_argv(tab, N, 2, a1, &c, &help) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "--bogus") != NULL);
    char *a2[] = {"x", "--max-tokens", "abc"};
    CHECK(arl_options_parse_argv(tab, N, 3, a2, &c, &help) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "max-tokens") != NULL);
    char *a3[] = {"x", "--max-tokens", "0"};
    CHECK(arl_options_parse_argv(tab, N, 3, a3, &c, &help) == ARL_ERR_ARG);
    char *a4[] = {"x", "--device", "tpu"};
    CHECK(arl_options_parse_argv(tab, N, 3, a4, &c, &help) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "cpu|cuda") != NULL);
    char *a5[] = {"x", "--temperature"};
    CHECK(arl_options_parse_argv(tab, N, 2, a5, &c, &help) == ARL_ERR_ARG);
    char *a6[] = {"x", "y"};
    CHECK(arl_options_parse_argv(tab, N, 2, a6, &c, &help) == ARL_ERR_ARG);
    arl_options_free(tab, N, &c);
    arl_options_defaults(tab, N, &c);
    CHECK(arl_options_check_required(tab, N, &c) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "FILE") != NULL);
    char *a7[] = {"--help"};
    CHECK(arl_options_parse_argv(tab, N, 1, a7, &c, &help) == ARL_OK && help);
    arl_options_free(tab, N, &c);
}

static void test_json(void) {
    cfg c;
    arl_options_defaults(tab, N, &c);
    CHECK(arl_options_parse_json_text(tab, N,
                                      "{\"max_tokens\": 7, \"temperature\": 2, \"json\": true, "
                                      "\"set\": [\"k=v\"]}",
                                      "x.json", &c) == ARL_OK);
    CHECK_EQ_INT(c.n, 7);
    CHECK(c.t == 2.0);
    CHECK(c.flag);
    CHECK_EQ_INT(c.set.n, 1);
    CHECK(arl_options_parse_json_text(tab, N, "{\"nope\": 1}", "x.json", &c) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "'nope'") != NULL);
    CHECK(arl_options_parse_json_text(tab, N, "{\"max_tokens\": \"7\"}", "x.json", &c) ==
          ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "max-tokens") != NULL);
    CHECK(arl_options_parse_json_text(tab, N, "{\"json\": true, \"json\": false}", "x.json", &c) ==
          ARL_ERR_CONFIG);
    CHECK(arl_options_parse_json_text(tab, N, "{\"max_tokens\": 5000}", "x.json", &c) ==
          ARL_ERR_CONFIG);
    CHECK(arl_options_parse_json_text(tab, N, "[1]", "x.json", &c) == ARL_ERR_CONFIG);
    CHECK(arl_options_parse_json_text(tab, N, "{bad", "x.json", &c) == ARL_ERR_CONFIG);
    arl_options_free(tab, N, &c);
}

/* What arl_options_to_json writes reads back (an experiment's recorded experiment.json): an
 * unset string (null) stays unset, and null unsets a string without a default; null is still
 * refused where the key has a default. */
typedef struct rcfg {
    char *init;
    char *dev;
    int64_t n;
} rcfg;

static const arl_option rtab[] = {
    {"init", ARL_OPT_STRING, offsetof(rcfg, init), NULL, "checkpoint", 0, 0, NULL, 0, "DIR"},
    {"device", ARL_OPT_CHOICE, offsetof(rcfg, dev), "cpu", "backend", 0, 0, "cpu|cuda", 0, NULL},
    {"steps", ARL_OPT_INT, offsetof(rcfg, n), "16", "steps", 1, 1000, NULL, 0, NULL},
};

static void test_json_round_trip(void) {
    const size_t n = ARL_OPTIONS_COUNT(rtab);
    rcfg c, d;
    arl_options_defaults(rtab, n, &c);
    CHECK(arl_options_set(rtab, n, "steps", "9", &c) == ARL_OK);
    char *j = arl_options_to_json(rtab, n, &c);
    CHECK(j && strstr(j, "\"init\":null"));
    arl_options_defaults(rtab, n, &d);
    CHECK(arl_options_parse_json_text(rtab, n, j, "experiment.json", &d) == ARL_OK);
    CHECK(d.init == NULL);
    CHECK_EQ_INT(d.n, 9);
    CHECK_STR_EQ(d.dev, "cpu");
    free(j);
    CHECK(arl_options_parse_json_text(rtab, n, "{\"init\": \"ck\"}", "x.json", &d) == ARL_OK);
    CHECK_STR_EQ(d.init, "ck");
    CHECK(arl_options_parse_json_text(rtab, n, "{\"init\": null}", "x.json", &d) == ARL_OK);
    CHECK(d.init == NULL);
    CHECK(arl_options_parse_json_text(rtab, n, "{\"device\": null}", "x.json", &d) ==
          ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), "'device'") != NULL);
    CHECK_STR_EQ(d.dev, "cpu");
    arl_options_free(rtab, n, &c);
    arl_options_free(rtab, n, &d);
}

/* --help: an empty default says nothing (it printed "(default )"), a default says itself */
static void test_help_defaults(void) {
    typedef struct hc {
        char *note, *dev;
    } hc;
    static const arl_option htab[] = {
        {"note", ARL_OPT_STRING, offsetof(hc, note), "", "a note", 0, 0, NULL, 0, "TEXT"},
        {"device", ARL_OPT_CHOICE, offsetof(hc, dev), "cpu", "backend", 0, 0, "cpu|cuda", 0, NULL},
    };
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    if (!f) return;
    arl_options_print_help(f, "usage", "summary", htab, ARL_OPTIONS_COUNT(htab));
    fclose(f);
    CHECK_MSG(!strstr(buf, "(default )"), "help: %s", buf);
    CHECK_MSG(strstr(buf, "(default cpu)") != NULL, "help: %s", buf);
    free(buf);
}

int main(void) {
    TEST_RUN(test_defaults_and_argv);
    TEST_RUN(test_help_defaults);
    TEST_RUN(test_errors_name_the_option);
    TEST_RUN(test_json);
    TEST_RUN(test_json_round_trip);
    return test_finish();
}
