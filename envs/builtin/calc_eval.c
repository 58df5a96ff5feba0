/* envs/builtin/calc_eval.c: recursive-descent evaluator of calc_eval.h.  The recursion is
 * bounded by ARL_CALC_MAX_DEPTH (each '(' and each unary sign counts one level). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "envs/builtin/calc_eval.h"

typedef struct calc_parser {
    const char *s;
    size_t n, i;
    int depth;
    arl_calc_result err;
    char *msg;
    size_t msg_size;
} calc_parser;

static void skip_ws(calc_parser *p) {
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int fail(calc_parser *p, arl_calc_result e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(calc_parser *p, arl_calc_result e, const char *fmt, ...) {
    if (p->err != ARL_CALC_OK) return 0;
    p->err = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, p->msg_size, fmt, ap);
    va_end(ap);
    return 0;
}

static int unexpected(calc_parser *p, const char *wanted) {
    if (p->i >= p->n)
        return fail(p, ARL_CALC_SYNTAX, "syntax error: expected %s at the end of the expression",
                    wanted);
    unsigned char c = (unsigned char)p->s[p->i];
    if (c >= 0x20 && c < 0x7f)
        return fail(p, ARL_CALC_SYNTAX, "syntax error at character %zu: expected %s, got '%c'",
                    p->i + 1, wanted, c);
    return fail(p, ARL_CALC_SYNTAX,
                "syntax error at character %zu: expected %s, got a byte 0x%02x (only digits, "
                "'.', + - * / ( ) and spaces are allowed)",
                p->i + 1, wanted, c);
}

static int is_digit(char c) {
    return c >= '0' && c <= '9';
}

/* Length of the number literal at s[i..n-1] (0 if none). */
static size_t number_len(const char *s, size_t n, size_t i) {
    size_t j = i, digits = 0;
    while (j < n && is_digit(s[j]))
        j++, digits++;
    if (j < n && s[j] == '.') {
        j++;
        while (j < n && is_digit(s[j]))
            j++, digits++;
    }
    return digits ? j - i : 0;
}

static int parse_expr(calc_parser *p, double *v);

static int parse_primary(calc_parser *p, double *v) {
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == '(') {
        if (++p->depth > ARL_CALC_MAX_DEPTH)
            return fail(p, ARL_CALC_DEPTH, "expression nested too deeply (more than %d levels)",
                        ARL_CALC_MAX_DEPTH);
        p->i++;
        if (!parse_expr(p, v)) return 0;
        skip_ws(p);
        if (p->i >= p->n || p->s[p->i] != ')') {
            if (p->i >= p->n)
                return fail(p, ARL_CALC_SYNTAX,
                            "syntax error: missing ')' at the end of the "
                            "expression");
            return unexpected(p, "an operator or ')'");
        }
        p->i++;
        p->depth--;
        return 1;
    }
    size_t len = p->i < p->n ? number_len(p->s, p->n, p->i) : 0;
    if (!len) return unexpected(p, "a number or '('");
    if (len > 24)
        return fail(p, ARL_CALC_SYNTAX,
                    "number at character %zu is too long (at most 24 "
                    "characters)",
                    p->i + 1);
    char buf[32];
    memcpy(buf, p->s + p->i, len);
    buf[len] = 0;
    *v = strtod(buf, NULL);
    p->i += len;
    if (p->i < p->n && p->s[p->i] == '.')
        return fail(p, ARL_CALC_SYNTAX,
                    "syntax error at character %zu: a number has a second "
                    "'.'",
                    p->i + 1);
    return 1;
}

static int parse_unary(calc_parser *p, double *v) {
    skip_ws(p);
    if (p->i < p->n && (p->s[p->i] == '-' || p->s[p->i] == '+')) {
        char op = p->s[p->i++];
        if (++p->depth > ARL_CALC_MAX_DEPTH)
            return fail(p, ARL_CALC_DEPTH, "expression nested too deeply (more than %d levels)",
                        ARL_CALC_MAX_DEPTH);
        if (!parse_unary(p, v)) return 0;
        p->depth--;
        if (op == '-') *v = -*v;
        return 1;
    }
    return parse_primary(p, v);
}

static int parse_term(calc_parser *p, double *v) {
    if (!parse_unary(p, v)) return 0;
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n || (p->s[p->i] != '*' && p->s[p->i] != '/')) return 1;
        char op = p->s[p->i++];
        double r;
        if (!parse_unary(p, &r)) return 0;
        if (op == '/') {
            if (r == 0) return fail(p, ARL_CALC_DIV_ZERO, "division by zero");
            *v /= r;
        } else {
            *v *= r;
        }
        if (!isfinite(*v))
            return fail(p, ARL_CALC_RANGE, "result out of range (not a finite number)");
    }
}

static int parse_expr(calc_parser *p, double *v) {
    if (!parse_term(p, v)) return 0;
    for (;;) {
        skip_ws(p);
        if (p->i >= p->n || (p->s[p->i] != '+' && p->s[p->i] != '-')) return 1;
        char op = p->s[p->i++];
        double r;
        if (!parse_term(p, &r)) return 0;
        *v = op == '+' ? *v + r : *v - r;
        if (!isfinite(*v))
            return fail(p, ARL_CALC_RANGE, "result out of range (not a finite number)");
    }
}

arl_calc_result arl_calc_eval(const char *expr, size_t len, double *value, char *msg,
                              size_t msg_size) {
    calc_parser p = {expr, len, 0, 0, ARL_CALC_OK, msg, msg_size};
    if (msg_size) msg[0] = 0;
    if (len > ARL_CALC_MAX_LEN) {
        fail(&p, ARL_CALC_TOO_LONG, "expression too long (%zu characters, at most %d)", len,
             ARL_CALC_MAX_LEN);
        return p.err;
    }
    skip_ws(&p);
    if (p.i >= p.n) {
        fail(&p, ARL_CALC_EMPTY, "empty expression");
        return p.err;
    }
    double v = 0;
    if (parse_expr(&p, &v)) {
        skip_ws(&p);
        if (p.i < p.n) {
            if (p.s[p.i] == ')')
                fail(&p, ARL_CALC_SYNTAX,
                     "syntax error at character %zu: ')' without a "
                     "matching '('",
                     p.i + 1);
            else
                unexpected(&p, "an operator");
        }
    }
    if (p.err != ARL_CALC_OK) return p.err;
    if (v == 0) v = 0; /* no negative zero */
    *value = v;
    return ARL_CALC_OK;
}

int arl_calc_literals(const char *expr, size_t len, double *vals, int max) {
    int k = 0;
    for (size_t i = 0; i < len && k < max;) {
        size_t n = number_len(expr, len, i);
        if (n && n <= 24 && (i == 0 || (!is_digit(expr[i - 1]) && expr[i - 1] != '.'))) {
            char buf[32];
            memcpy(buf, expr + i, n);
            buf[n] = 0;
            vals[k++] = strtod(buf, NULL);
            i += n;
        } else {
            i++;
        }
    }
    return k;
}

int arl_calc_has_operator(const char *expr, size_t len) {
    /* A binary operator is an operator that follows an operand (a digit, '.' or ')'). */
    int after_operand = 0;
    for (size_t i = 0; i < len; i++) {
        char c = expr[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
        if (is_digit(c) || c == '.' || c == ')') {
            after_operand = 1;
        } else {
            if (after_operand && (c == '+' || c == '-' || c == '*' || c == '/')) return 1;
            after_operand = 0;
        }
    }
    return 0;
}
