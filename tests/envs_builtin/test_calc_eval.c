/* tests/envs_builtin/test_calc_eval.c: the calculator's safe expression evaluator against a
 * table of expressions and errors, its literal scanner, and the number helpers shared by the
 * built-in environments (formatting, parsing of answers, answer tolerance). */
#include <math.h>
#include <string.h>

#include "envs/builtin/builtin.h"
#include "envs/builtin/calc_eval.h"
#include "tests/test.h"

typedef struct calc_case {
    const char *expr;
    arl_calc_result want;
    double value;        /* when OK */
    const char *msg_has; /* substring of the message when failing */
} calc_case;

static const calc_case cases[] = {
    {"7 + 5", ARL_CALC_OK, 12, NULL},
    {"7+5", ARL_CALC_OK, 12, NULL},
    {"  20 - 8 ", ARL_CALC_OK, 12, NULL},
    {"6 * 7", ARL_CALC_OK, 42, NULL},
    {"45 / 9", ARL_CALC_OK, 5, NULL},
    {"1 / 4", ARL_CALC_OK, 0.25, NULL},
    {"2 + 3 * 4", ARL_CALC_OK, 14, NULL}, /* precedence */
    {"(2 + 3) * 4", ARL_CALC_OK, 20, NULL},
    {"10 - 4 - 3", ARL_CALC_OK, 3, NULL}, /* left associative */
    {"48 / 4 / 2", ARL_CALC_OK, 6, NULL},
    {"-3 + 5", ARL_CALC_OK, 2, NULL},
    {"2 * -3", ARL_CALC_OK, -6, NULL},
    {"--4", ARL_CALC_OK, 4, NULL},
    {"+4", ARL_CALC_OK, 4, NULL},
    {"((((1))))", ARL_CALC_OK, 1, NULL},
    {"(12 + 8) * 3 - 45 / 5", ARL_CALC_OK, 51, NULL},
    {"3 * 1.25 + 2 * 3.50", ARL_CALC_OK, 10.75, NULL},
    {"20 - 10.75", ARL_CALC_OK, 9.25, NULL},
    {".5 + 5.", ARL_CALC_OK, 5.5, NULL},
    {"0.1 + 0.2", ARL_CALC_OK, 0.3, NULL}, /* tolerance below covers the rounding */
    {"5 - 5", ARL_CALC_OK, 0, NULL},
    {"", ARL_CALC_EMPTY, 0, "empty"},
    {"   ", ARL_CALC_EMPTY, 0, "empty"},
    {"7 +", ARL_CALC_SYNTAX, 0, "end of the expression"},
    {"* 3", ARL_CALC_SYNTAX, 0, "character 1"},
    {"(1 + 2", ARL_CALC_SYNTAX, 0, "missing ')'"},
    {"1 + 2)", ARL_CALC_SYNTAX, 0, "without a matching '('"},
    {"2 (3)", ARL_CALC_SYNTAX, 0, "expected an operator"},
    {"1.2.3", ARL_CALC_SYNTAX, 0, "second '.'"},
    {"2 ^ 3", ARL_CALC_SYNTAX, 0, "'^'"},
    {"x + 1", ARL_CALC_SYNTAX, 0, "'x'"},
    {"1e5", ARL_CALC_SYNTAX, 0, "'e'"},
    {"0x10", ARL_CALC_SYNTAX, 0, "'x'"},
    {"sqrt(4)", ARL_CALC_SYNTAX, 0, "'s'"},
    {"()", ARL_CALC_SYNTAX, 0, "')'"},
    {"1 / 0", ARL_CALC_DIV_ZERO, 0, "division by zero"},
    {"1 / (2 - 2)", ARL_CALC_DIV_ZERO, 0, "division by zero"},
    {"5 / 0.0", ARL_CALC_DIV_ZERO, 0, "division by zero"},
    {"1234567890123456789012345", ARL_CALC_SYNTAX, 0, "too long"},
    {"\xc3\xa9", ARL_CALC_SYNTAX, 0, "0xc3"},
};

static void test_table(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const calc_case *c = &cases[i];
        double v = -12345;
        char msg[256];
        arl_calc_result r = arl_calc_eval(c->expr, strlen(c->expr), &v, msg, sizeof msg);
        CHECK_MSG(r == c->want, "'%s': got %d want %d (%s)", c->expr, r, c->want, msg);
        if (c->want == ARL_CALC_OK) {
            /* 1e-12 relative: every case is exact in binary except 0.1 + 0.2 (off by 4e-17) */
            CHECK_CLOSE(v, c->value, 1e-12, 1e-12);
        } else {
            CHECK_MSG(strstr(msg, c->msg_has) != NULL, "'%s': message '%s' lacks '%s'", c->expr,
                      msg, c->msg_has);
            CHECK_MSG(v == -12345, "'%s': value written on failure", c->expr);
        }
    }
}

static void test_bounds(void) {
    char buf[512];
    double v;
    char msg[256];
    /* length: exactly the limit is fine, one more is an error */
    memset(buf, ' ', sizeof buf);
    buf[0] = '1';
    CHECK_EQ_INT(arl_calc_eval(buf, ARL_CALC_MAX_LEN, &v, msg, sizeof msg), ARL_CALC_OK);
    CHECK_EQ_INT(arl_calc_eval(buf, ARL_CALC_MAX_LEN + 1, &v, msg, sizeof msg), ARL_CALC_TOO_LONG);
    CHECK(strstr(msg, "too long") != NULL);
    /* nesting: 32 parentheses are fine, 33 are an error; no stack overflow for 100 '-' */
    int n = 0;
    for (int i = 0; i < ARL_CALC_MAX_DEPTH; i++)
        buf[n++] = '(';
    buf[n++] = '1';
    for (int i = 0; i < ARL_CALC_MAX_DEPTH; i++)
        buf[n++] = ')';
    CHECK_EQ_INT(arl_calc_eval(buf, (size_t)n, &v, msg, sizeof msg), ARL_CALC_OK);
    n = 0;
    for (int i = 0; i < ARL_CALC_MAX_DEPTH + 1; i++)
        buf[n++] = '(';
    buf[n++] = '1';
    for (int i = 0; i < ARL_CALC_MAX_DEPTH + 1; i++)
        buf[n++] = ')';
    CHECK_EQ_INT(arl_calc_eval(buf, (size_t)n, &v, msg, sizeof msg), ARL_CALC_DEPTH);
    memset(buf, '-', 100);
    buf[100] = '1';
    CHECK_EQ_INT(arl_calc_eval(buf, 101, &v, msg, sizeof msg), ARL_CALC_DEPTH);
    /* the largest values reachable within the length bound stay finite: eight 24-digit
     * factors give about 1e192 (ARL_CALC_RANGE is a defensive check) */
    n = 0;
    for (int i = 0; i < 8; i++)
        n += snprintf(buf + n, sizeof buf - (size_t)n, "%s99999999999999999999999", i ? "*" : "");
    CHECK_EQ_INT(arl_calc_eval(buf, (size_t)n, &v, msg, sizeof msg), ARL_CALC_OK);
    CHECK(isfinite(v) && v > 1e180);
    /* not NUL-terminated input: only len bytes are read */
    const char raw[] = {'4', '+', '4', '9'};
    CHECK_EQ_INT(arl_calc_eval(raw, 3, &v, msg, sizeof msg), ARL_CALC_OK);
    CHECK_CLOSE(v, 8, 0, 0);
}

static void test_literals(void) {
    double vals[8];
    const char *e = "(19 - 5) * 2.5 + .5";
    int n = arl_calc_literals(e, strlen(e), vals, 8);
    CHECK_EQ_INT(n, 4);
    CHECK_CLOSE(vals[0], 19, 0, 0);
    CHECK_CLOSE(vals[1], 5, 0, 0);
    CHECK_CLOSE(vals[2], 2.5, 0, 0);
    CHECK_CLOSE(vals[3], 0.5, 0, 0);
    CHECK_EQ_INT(arl_calc_literals(e, strlen(e), vals, 2), 2);
    CHECK(arl_calc_has_operator("7 + 5", 5));
    CHECK(arl_calc_has_operator("(2)*(3)", 7));
    CHECK(!arl_calc_has_operator("12", 2));
    CHECK(!arl_calc_has_operator("-12", 3));
    CHECK(!arl_calc_has_operator("(-(12))", 7));
    CHECK(arl_calc_has_operator("-1 - -2", 7));
}

static void test_numbers(void) {
    char b[64];
    arl_bi_format_number(12, b, sizeof b);
    CHECK_STR_EQ(b, "12");
    arl_bi_format_number(-3, b, sizeof b);
    CHECK_STR_EQ(b, "-3");
    arl_bi_format_number(-0.0, b, sizeof b);
    CHECK_STR_EQ(b, "0");
    arl_bi_format_number(9.25, b, sizeof b);
    CHECK_STR_EQ(b, "9.25");
    arl_bi_format_number(0.1 + 0.2, b, sizeof b);
    CHECK_STR_EQ(b, "0.3");
    arl_bi_format_number(1.0 / 3, b, sizeof b);
    CHECK_STR_EQ(b, "0.333333333333");
    double v;
    CHECK(arl_bi_parse_number("12", &v) && v == 12);
    CHECK(arl_bi_parse_number("  12.50 ", &v) && v == 12.5);
    CHECK(arl_bi_parse_number("1,234", &v) && v == 1234);
    CHECK(arl_bi_parse_number("$3", &v) && v == 3);
    CHECK(arl_bi_parse_number("-4.", &v) && v == -4);
    CHECK(!arl_bi_parse_number("", &v));
    CHECK(!arl_bi_parse_number("twelve", &v));
    CHECK(!arl_bi_parse_number("12 apples", &v));
    CHECK(!arl_bi_parse_number("nan", &v));
    CHECK(!arl_bi_parse_number("inf", &v));
    CHECK(!arl_bi_parse_number("0x10", &v));
    CHECK(!arl_bi_parse_number("1e3", &v));
    CHECK(!arl_bi_parse_number("1.2.3", &v));
    CHECK(!arl_bi_parse_number("-", &v));
    /* tolerance 1e-6 * max(1, |e|) */
    CHECK(arl_bi_numbers_equal(12.00002, 12) == 0); /* 2e-5 > 1.2e-5 */
    CHECK(arl_bi_numbers_equal(12.000005, 12) == 1);
    CHECK(arl_bi_numbers_equal(0.3, 0.1 + 0.2));
    CHECK(!arl_bi_numbers_equal(0.31, 0.3));
    CHECK(arl_bi_numbers_equal(1e9 + 100, 1e9));
    CHECK(!arl_bi_numbers_equal(1e9 + 10000, 1e9));
}

int main(void) {
    TEST_RUN(test_table);
    TEST_RUN(test_bounds);
    TEST_RUN(test_literals);
    TEST_RUN(test_numbers);
    return test_finish();
}
