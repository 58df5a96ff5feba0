/* envs/builtin/calc_eval.h: the safe arithmetic evaluator behind the calculator
 * environment's calc tool.
 *
 * Grammar (whitespace allowed between tokens):
 *     expr   := term (('+' | '-') term)*
 *     term   := unary (('*' | '/') unary)*
 *     unary  := ('+' | '-') unary | primary
 *     primary:= number | '(' expr ')'
 *     number := digits ['.' digits] | '.' digits | digits '.'      (no exponents, no hex)
 * Evaluated in IEEE double precision, left to right.  Bounded: at most ARL_CALC_MAX_LEN
 * bytes, nesting (parentheses and unary signs) at most ARL_CALC_MAX_DEPTH, a number literal
 * at most 24 characters.  Never allocates, never recurses deeper than the nesting bound.
 * Not a general math library: no functions, powers or variables.
 */
#ifndef ARL_ENVS_BUILTIN_CALC_EVAL_H
#define ARL_ENVS_BUILTIN_CALC_EVAL_H

#include <stddef.h>

#define ARL_CALC_MAX_LEN 200
#define ARL_CALC_MAX_DEPTH 32

typedef enum arl_calc_result {
    ARL_CALC_OK = 0,
    ARL_CALC_EMPTY,    /* no token at all */
    ARL_CALC_TOO_LONG, /* over ARL_CALC_MAX_LEN bytes */
    ARL_CALC_SYNTAX,   /* unexpected or invalid character, missing operand or ')' */
    ARL_CALC_DEPTH,    /* nesting over ARL_CALC_MAX_DEPTH */
    ARL_CALC_DIV_ZERO, /* division by zero */
    ARL_CALC_RANGE,    /* a result that is not a finite double */
} arl_calc_result;

/* Evaluate expr[0..len-1] into *value.  On failure writes a message for the model into
 * msg[0..msg_size-1] ("syntax error at character 4: unexpected ')'") and leaves *value
 * untouched. */
arl_calc_result arl_calc_eval(const char *expr, size_t len, double *value, char *msg,
                              size_t msg_size);

/* The values of the number literals of expr (as the evaluator reads them, signs not
 * included), at most max of them; returns how many were stored. */
int arl_calc_literals(const char *expr, size_t len, double *vals, int max);

/* Whether expr contains at least one binary operator (a real computation, not a bare
 * number). Only meaningful for expressions that evaluate. */
int arl_calc_has_operator(const char *expr, size_t len);

#endif
