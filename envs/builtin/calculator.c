/* envs/builtin/calculator.c: the "calculator" built-in environment: arithmetic word problems
 * solved with a calc(expression) tool and an answer(value) tool.
 *
 * Levels (options.level or task.data.level, default 1):
 *   1  one operation on small integers, bare:  "What is 7 + 5?"            (+ - * /, <= 20)
 *   2  one-operation word problem:             "Ann has 12 apples and buys 7 more. ..."
 *   3  two-operation word problem (two calc steps)
 *   4  expression with parentheses, three operations: "Compute (12 + 8) * 3 - 45 / 5."
 *   5  money word problem with decimals (four calc steps): prices, quantities, change
 * Every answer is exact (divisions divide evenly; prices are multiples of 0.25).  Level 1 is
 * made for a tiny byte-level policy: short prompt, short numbers, one fixed format.
 *
 * Rewards (declared in info_json below):
 *   process  result_used  +0.1 for each earlier calc result first used in a later calc or the
 *                         answer (a result counts when its expression had an operator and its
 *                         value is not a number of the problem; at most +0.3 per step)
 *            format       -0.1 per malformed call, failing calc (syntax, division by zero),
 *                         non-numeric answer or turn without a tool call (at least -0.5)
 *   segment  progress     fraction of the reference solution's intermediate values computed
 *                         during the segment's steps
 *   outcome  answer_correct  1 when |answer - expected| <= 1e-6 * max(1, |expected|), else 0
 * The episode ends (terminated) with the first valid answer call; the host truncates at
 * max_steps.  Not here: the AEP state machine (envs/env_host.c), demonstrations (teacher.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "envs/builtin/builtin.h"
#include "envs/builtin/calc_eval.h"

#define CALC_MAX_PLAN 4
#define CALC_MAX_RESULTS 128
#define CALC_MAX_STEPS 32
#define CALC_MAX_NUMS 8

static const char calc_info_json[] =
    "{\"tools\": ["
    "{\"type\": \"function\", \"function\": {\"name\": \"calc\", "
    "\"description\": \"Evaluate + - * / and parentheses.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"expression\": {\"type\": "
    "\"string\"}}, \"required\": [\"expression\"], \"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"answer\", "
    "\"description\": \"Give the final number.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"value\": {\"type\": "
    "\"string\"}}, \"required\": [\"value\"], \"additionalProperties\": false}}}],"
    "\"reward_levels\": {\"process\": {\"range\": [-0.5, 0.3]}, "
    "\"segment\": {\"range\": [0, 1]}, \"outcome\": {\"range\": [0, 1]}},"
    "\"reward_components\": ["
    "{\"name\": \"answer_correct\", \"level\": \"outcome\", \"range\": [0, 1], "
    "\"description\": \"1 if the answer equals the expected value within 1e-6*max(1,|x|)\"},"
    "{\"name\": \"progress\", \"level\": \"segment\", \"range\": [0, 1], "
    "\"description\": \"fraction of the reference intermediate values computed in the "
    "segment\"},"
    "{\"name\": \"result_used\", \"level\": \"process\", \"range\": [0, 0.3], "
    "\"description\": \"+0.1 per earlier calc result first used in this step\"},"
    "{\"name\": \"format\", \"level\": \"process\", \"range\": [-0.5, 0], "
    "\"description\": \"-0.1 per malformed or failing call or turn without a call\"}],"
    "\"capabilities\": {\"fork\": true, \"segment_score\": true, \"deterministic_replay\": "
    "true, \"parallel_tool_calls\": true, \"multimodal\": false, \"context_reset\": false},"
    "\"limits\": {\"max_sessions\": 4096, \"max_steps\": 32, \"default_step_timeout_ms\": "
    "10000, \"max_observation_bytes\": 65536}}";

typedef struct calc_state {
    int level;
    char question[512];
    double expected;
    int nplan;
    char plan_expr[CALC_MAX_PLAN][96]; /* reference calc steps, literal numbers */
    double plan_value[CALC_MAX_PLAN];
    double nums[CALC_MAX_NUMS]; /* the numbers of the problem text */
    int nnums;
    /* progress */
    int64_t steps;
    uint32_t obtained;                /* bit i: plan_value[i] computed by a calc call */
    double results[CALC_MAX_RESULTS]; /* distinct creditable calc results, in order */
    uint8_t credited[CALC_MAX_RESULTS];
    int nresults;
    int progress_at[CALC_MAX_STEPS + 1]; /* popcount(obtained) after each step */
    int answered, correct;
    char given[72];
} calc_state;

/* ---- problem generation ---- */

static const char *const calc_names[] = {"Ann", "Ben",  "Cara", "Dan", "Eva", "Finn",
                                         "Gus", "Hana", "Ivan", "Jo",  "Kim", "Leo"};
static const char *const calc_items[] = {"apples", "pens",   "cards",  "books",   "eggs",
                                         "coins",  "stamps", "shells", "marbles", "cookies"};
#define NNAMES (sizeof calc_names / sizeof calc_names[0])
#define NITEMS (sizeof calc_items / sizeof calc_items[0])

static int64_t rnd(arl_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)arl_rng_below(r, (uint64_t)(hi - lo + 1));
}

static void add_plan(calc_state *s, const char *expr) {
    double v = 0;
    char msg[128];
    arl_calc_result e = arl_calc_eval(expr, strlen(expr), &v, msg, sizeof msg);
    (void)e; /* generated expressions always evaluate (checked by the tests) */
    snprintf(s->plan_expr[s->nplan], sizeof s->plan_expr[0], "%s", expr);
    s->plan_value[s->nplan++] = v;
    s->expected = v;
}

static void add_num(calc_state *s, double v) {
    if (s->nnums < CALC_MAX_NUMS) s->nums[s->nnums++] = v;
}

static void gen_level1(calc_state *s, arl_rng *r) {
    int64_t a, b;
    char op = "+-*/"[arl_rng_below(r, 4)];
    switch (op) {
    case '+':
        a = rnd(r, 1, 20);
        b = rnd(r, 1, 20);
        break;
    case '-':
        a = rnd(r, 2, 20);
        b = rnd(r, 1, a);
        break;
    case '*':
        a = rnd(r, 2, 12);
        b = rnd(r, 2, 9);
        break;
    default:
        b = rnd(r, 2, 9);
        a = b * rnd(r, 1, 9);
        break;
    }
    char e[64];
    snprintf(e, sizeof e, "%lld %c %lld", (long long)a, op, (long long)b);
    snprintf(s->question, sizeof s->question, "What is %s?", e);
    add_num(s, (double)a);
    add_num(s, (double)b);
    add_plan(s, e);
}

static void gen_level2(calc_state *s, arl_rng *r) {
    const char *n = calc_names[arl_rng_below(r, NNAMES)];
    const char *it = calc_items[arl_rng_below(r, NITEMS)];
    int64_t a, b;
    char e[64];
    switch (arl_rng_below(r, 4)) {
    case 0:
        a = rnd(r, 2, 50), b = rnd(r, 2, 50);
        snprintf(s->question, sizeof s->question,
                 "%s has %lld %s and buys %lld more. How many %s does %s have now?", n,
                 (long long)a, it, (long long)b, it, n);
        snprintf(e, sizeof e, "%lld + %lld", (long long)a, (long long)b);
        break;
    case 1:
        a = rnd(r, 5, 50), b = rnd(r, 1, a - 1);
        snprintf(s->question, sizeof s->question,
                 "%s has %lld %s and gives away %lld. How many %s are left?", n, (long long)a, it,
                 (long long)b, it);
        snprintf(e, sizeof e, "%lld - %lld", (long long)a, (long long)b);
        break;
    case 2:
        a = rnd(r, 2, 12), b = rnd(r, 2, 12);
        snprintf(s->question, sizeof s->question,
                 "%s buys %lld bags with %lld %s in each. How many %s does %s buy?", n,
                 (long long)a, (long long)b, it, it, n);
        snprintf(e, sizeof e, "%lld * %lld", (long long)a, (long long)b);
        break;
    default:
        b = rnd(r, 2, 9), a = b * rnd(r, 2, 12);
        snprintf(s->question, sizeof s->question,
                 "%s shares %lld %s equally among %lld friends. How many %s does each friend "
                 "get?",
                 n, (long long)a, it, (long long)b, it);
        snprintf(e, sizeof e, "%lld / %lld", (long long)a, (long long)b);
        break;
    }
    add_num(s, (double)a);
    add_num(s, (double)b);
    add_plan(s, e);
}

static void gen_level3(calc_state *s, arl_rng *r) {
    const char *n = calc_names[arl_rng_below(r, NNAMES)];
    const char *it = calc_items[arl_rng_below(r, NITEMS)];
    int64_t a, b, c, m;
    char e1[64], e2[64];
    switch (arl_rng_below(r, 5)) {
    case 0: /* (a + b) - c */
        a = rnd(r, 5, 60), b = rnd(r, 2, 40), c = rnd(r, 1, a + b - 1);
        snprintf(s->question, sizeof s->question,
                 "%s has %lld %s, buys %lld more and then gives away %lld. How many %s does %s "
                 "have now?",
                 n, (long long)a, it, (long long)b, (long long)c, it, n);
        snprintf(e1, sizeof e1, "%lld + %lld", (long long)a, (long long)b);
        snprintf(e2, sizeof e2, "%lld - %lld", (long long)(a + b), (long long)c);
        break;
    case 1: /* a * b + c */
        a = rnd(r, 2, 12), b = rnd(r, 2, 12), c = rnd(r, 1, 40);
        snprintf(s->question, sizeof s->question,
                 "%s buys %lld boxes of %lld %s and already had %lld. How many %s does %s have "
                 "now?",
                 n, (long long)a, (long long)b, it, (long long)c, it, n);
        snprintf(e1, sizeof e1, "%lld * %lld", (long long)a, (long long)b);
        snprintf(e2, sizeof e2, "%lld + %lld", (long long)(a * b), (long long)c);
        break;
    case 2: /* a * b - c */
        a = rnd(r, 2, 12), b = rnd(r, 2, 12), c = rnd(r, 1, a * b - 1);
        snprintf(s->question, sizeof s->question,
                 "%s buys %lld boxes of %lld %s and gives away %lld. How many %s are left?", n,
                 (long long)a, (long long)b, it, (long long)c, it);
        snprintf(e1, sizeof e1, "%lld * %lld", (long long)a, (long long)b);
        snprintf(e2, sizeof e2, "%lld - %lld", (long long)(a * b), (long long)c);
        break;
    case 3: /* a / b + c */
        b = rnd(r, 2, 9), m = rnd(r, 2, 12), a = b * m, c = rnd(r, 1, 20);
        snprintf(s->question, sizeof s->question,
                 "%s shares %lld %s equally among %lld friends. Each friend already had %lld. "
                 "How many %s does each friend have now?",
                 n, (long long)a, it, (long long)b, (long long)c, it);
        snprintf(e1, sizeof e1, "%lld / %lld", (long long)a, (long long)b);
        snprintf(e2, sizeof e2, "%lld + %lld", (long long)m, (long long)c);
        break;
    default: /* a - b * c */
        b = rnd(r, 2, 9), c = rnd(r, 2, 7), a = b * c + rnd(r, 1, 50);
        snprintf(s->question, sizeof s->question,
                 "A shop has %lld %s and sells %lld each day for %lld days. How many %s are "
                 "left?",
                 (long long)a, it, (long long)b, (long long)c, it);
        snprintf(e1, sizeof e1, "%lld * %lld", (long long)b, (long long)c);
        snprintf(e2, sizeof e2, "%lld - %lld", (long long)a, (long long)(b * c));
        break;
    }
    add_num(s, (double)a);
    add_num(s, (double)b);
    add_num(s, (double)c);
    add_plan(s, e1);
    add_plan(s, e2);
}

static void gen_level4(calc_state *s, arl_rng *r) {
    int64_t a = rnd(r, 2, 30), b = rnd(r, 2, 30), c = rnd(r, 2, 9), d = rnd(r, 2, 9);
    char e[96];
    switch (arl_rng_below(r, 4)) {
    case 0: { /* (a + b) * c - (q*d) / d: the division is exact */
        int64_t q = rnd(r, 1, 9);
        snprintf(e, sizeof e, "(%lld + %lld) * %lld - %lld / %lld", (long long)a, (long long)b,
                 (long long)c, (long long)(q * d), (long long)d);
        add_num(s, (double)(q * d));
        break;
    }
    case 1:
        if (a <= b) a = b + rnd(r, 1, 20);
        snprintf(e, sizeof e, "(%lld - %lld) * (%lld + %lld)", (long long)a, (long long)b,
                 (long long)c, (long long)d);
        break;
    case 2:
        snprintf(e, sizeof e, "%lld * %lld + %lld * %lld", (long long)a, (long long)c, (long long)b,
                 (long long)d);
        break;
    default: {
        int64_t sum = a + b;
        int64_t k = rnd(r, 2, 9);
        sum = ((sum + k - 1) / k) * k; /* make (a + b) divisible by k */
        b = sum - a;
        snprintf(e, sizeof e, "(%lld + %lld) / %lld + %lld", (long long)a, (long long)b,
                 (long long)k, (long long)c);
        add_num(s, (double)k);
        break;
    }
    }
    snprintf(s->question, sizeof s->question, "Compute %s.", e);
    add_num(s, (double)a);
    add_num(s, (double)b);
    add_num(s, (double)c);
    add_num(s, (double)d);
    add_plan(s, e);
}

static void gen_level5(calc_state *s, arl_rng *r) {
    static const char *const goods[][2] = {{"pen", "pens"},       {"notebook", "notebooks"},
                                           {"apple", "apples"},   {"ticket", "tickets"},
                                           {"candle", "candles"}, {"ruler", "rulers"}};
    const char *n = calc_names[arl_rng_below(r, NNAMES)];
    int g1 = (int)arl_rng_below(r, 6), g2 = (int)((g1 + 1 + arl_rng_below(r, 5)) % 6);
    int64_t p1 = rnd(r, 1, 20), p2 = rnd(r, 1, 20); /* prices in quarters */
    int64_t q1 = rnd(r, 2, 5), q2 = rnd(r, 2, 5);
    double price1 = p1 * 0.25, price2 = p2 * 0.25;
    double total = q1 * price1 + q2 * price2;
    double pay = total < 10 ? 10 : total < 20 ? 20 : total < 50 ? 50 : 100;
    char sp1[32], sp2[32], sq[32], e[96];
    snprintf(sp1, sizeof sp1, "%.2f", price1);
    snprintf(sp2, sizeof sp2, "%.2f", price2);
    snprintf(s->question, sizeof s->question,
             "A %s costs %s and a %s costs %s. %s buys %lld %s and %lld %s and pays with %.0f. "
             "How much change does %s get?",
             goods[g1][0], sp1, goods[g2][0], sp2, n, (long long)q1, goods[g1][1], (long long)q2,
             goods[g2][1], pay, n);
    add_num(s, price1);
    add_num(s, price2);
    add_num(s, (double)q1);
    add_num(s, (double)q2);
    add_num(s, pay);
    snprintf(e, sizeof e, "%lld * %s", (long long)q1, sp1);
    add_plan(s, e);
    snprintf(e, sizeof e, "%lld * %s", (long long)q2, sp2);
    add_plan(s, e);
    char a1[32], a2[32];
    arl_bi_format_number(s->plan_value[0], a1, sizeof a1);
    arl_bi_format_number(s->plan_value[1], a2, sizeof a2);
    snprintf(e, sizeof e, "%s + %s", a1, a2);
    add_plan(s, e);
    arl_bi_format_number(s->plan_value[2], a1, sizeof a1);
    snprintf(sq, sizeof sq, "%.0f", pay);
    snprintf(e, sizeof e, "%s - %s", sq, a1);
    add_plan(s, e);
}

/* ---- session ---- */

static const char *const calc_data_keys[] = {"level", NULL};
static const char *const calc_option_keys[] = {"level", "max_steps", NULL};

static uint64_t calc_anchor_hash(const calc_state *s) {
    uint64_t h = arl_bi_hash(s->question, strlen(s->question), 0);
    h = arl_bi_hash(&s->obtained, sizeof s->obtained, h);
    int a[2] = {s->answered, s->correct};
    return arl_bi_hash(a, sizeof a, h);
}

static arl_status calc_instance_create(const json_t *config, void **inst) {
    return arl_bi_instance_open(calc_info_json, config, inst);
}

static void calc_instance_destroy(void *inst) {
    arl_bi_instance_close(inst);
}

static arl_status calc_reset(void *inst, const arl_env_reset_req *req, void **state,
                             arl_env_result *out) {
    ARL_TRY(arl_bi_check_keys(req->task.data, "task.data", calc_data_keys));
    ARL_TRY(arl_bi_check_keys(req->options, "options", calc_option_keys));
    int64_t level;
    ARL_TRY(arl_bi_get_int(req->options, "level", "options", 1, 1, 5, &level));
    ARL_TRY(arl_bi_get_int(req->task.data, "level", "task.data", level, 1, 5, &level));
    calc_state *s = calloc(1, sizeof *s);
    if (!s) return arl_errorf(ARL_ERR_NOMEM, "calculator: out of memory");
    s->level = (int)level;
    arl_rng r;
    arl_rng_seed_stream(&r, req->task.seed, 0x63616c63u /* "calc" */ + (uint64_t)level);
    switch (s->level) {
    case 1:
        gen_level1(s, &r);
        break;
    case 2:
        gen_level2(s, &r);
        break;
    case 3:
        gen_level3(s, &r);
        break;
    case 4:
        gen_level4(s, &r);
        break;
    default:
        gen_level5(s, &r);
        break;
    }
    out->obs.context = ARL_ENV_CONTEXT_RESET;
    arl_status st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_SYSTEM,
                                         "Solve the problem. Use calc to compute, then answer "
                                         "with the number.");
    if (st == ARL_OK) st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, s->question);
    if (st == ARL_OK) st = arl_bi_set_anchor(&out->info, "calculator", calc_anchor_hash(s));
    if (st != ARL_OK) {
        free(s);
        return arl_errorf(ARL_ERR_NOMEM, "calculator: out of memory");
    }
    *state = s;
    return ARL_OK;
}

/* Credit earlier creditable results equal to v and not yet credited; returns how many. */
static int credit_use(calc_state *s, double v, int upto) {
    int n = 0;
    for (int i = 0; i < upto; i++)
        if (!s->credited[i] && arl_bi_numbers_equal(v, s->results[i])) {
            s->credited[i] = 1;
            n++;
        }
    return n;
}

typedef struct calc_turn {
    calc_state *s;
    int used;    /* results first used in this step */
    int nbefore; /* results recorded before this step (only those can be "used") */
} calc_turn;

static arl_status calc_run_call(void *ctx, const arl_env_tool_call *c, arl_env_observation *obs,
                                arl_bi_call_kind *kind, int *stop) {
    calc_turn *t = ctx;
    calc_state *s = t->s;
    char buf[256];
    if (!strcmp(c->name, "calc")) {
        const char *e = json_string_value(json_object_get(c->arguments, "expression"));
        size_t len = strlen(e);
        double v;
        char msg[200];
        if (arl_calc_eval(e, len, &v, msg, sizeof msg) != ARL_CALC_OK) {
            *kind = ARL_BI_CALL_RUNTIME;
            snprintf(buf, sizeof buf, "Error: %s", msg);
            return arl_env_obs_add_tool(obs, c->id, buf, ARL_ENV_TOOL_RUNTIME_ERROR);
        }
        double lit[32];
        int nl = arl_calc_literals(e, len, lit, 32);
        for (int i = 0; i < nl; i++)
            t->used += credit_use(s, lit[i], t->nbefore);
        int fresh = arl_calc_has_operator(e, len);
        for (int i = 0; i < s->nnums && fresh; i++)
            if (arl_bi_numbers_equal(v, s->nums[i])) fresh = 0;
        for (int i = 0; i < s->nresults && fresh; i++)
            if (arl_bi_numbers_equal(v, s->results[i])) fresh = 0;
        if (fresh && s->nresults < CALC_MAX_RESULTS) s->results[s->nresults++] = v;
        if (arl_calc_has_operator(e, len))
            for (int i = 0; i < s->nplan; i++)
                if (arl_bi_numbers_equal(v, s->plan_value[i])) s->obtained |= 1u << i;
        arl_bi_format_number(v, buf, sizeof buf);
        *kind = ARL_BI_CALL_OK;
        return arl_env_obs_add_tool(obs, c->id, buf, NULL);
    }
    /* answer */
    char nb[64];
    const char *txt = arl_bi_arg_text(c->arguments, "value", nb, sizeof nb);
    double v;
    if (!txt || !arl_bi_parse_number(txt, &v)) {
        *kind = ARL_BI_CALL_MALFORMED;
        snprintf(buf, sizeof buf, "Error: the answer must be a number, got \"%.40s\".",
                 txt ? txt : "");
        return arl_env_obs_add_tool(obs, c->id, buf, ARL_ENV_TOOL_ARGS_INVALID);
    }
    t->used += credit_use(s, v, t->nbefore);
    s->answered = 1;
    s->correct = arl_bi_numbers_equal(v, s->expected);
    snprintf(s->given, sizeof s->given, "%.64s", txt);
    *kind = ARL_BI_CALL_OK;
    *stop = 1;
    return arl_env_obs_add_tool(obs, c->id, "Answer recorded.", NULL);
}

static const arl_bi_dispatch calc_dispatch = {
    .max_calls_per_turn = 4,
    .run_call = calc_run_call,
    .nudge_no_call = "Use the calc tool to compute, then call answer with the number.",
    .lenient_tool = "answer",
};

static int popcount32(uint32_t x) {
    int n = 0;
    for (; x; x &= x - 1)
        n++;
    return n;
}

static arl_status calc_step(void *inst, void *state, const arl_env_step_req *req,
                            arl_env_result *out) {
    calc_state *s = state;
    calc_state saved = *s; /* atomic steps: restore on failure */
    calc_turn t = {s, 0, s->nresults};
    arl_bi_turn_stats st;
    int ended;
    arl_status r =
        arl_bi_dispatch_turn(&calc_dispatch, inst, &t, req->action, &out->obs, &st, &ended);
    if (r != ARL_OK) {
        *s = saved;
        return r;
    }
    s->steps++;
    if (s->steps <= CALC_MAX_STEPS) s->progress_at[s->steps] = popcount32(s->obtained);
    double used = 0.1 * t.used;
    if (used > 0.3) used = 0.3;
    double fmt = -0.1 * (st.n_malformed + st.n_runtime + st.no_tool_call);
    if (fmt < -0.5) fmt = -0.5;
    out->reward = used + fmt;
    out->terminated = ended;
    if (arl_env_result_component(out, "result_used", used) != ARL_OK ||
        arl_env_result_component(out, "format", fmt) != ARL_OK ||
        arl_bi_set_anchor(&out->info, "calculator", calc_anchor_hash(s)) != ARL_OK) {
        *s = saved;
        return arl_errorf(ARL_ERR_NOMEM, "calculator: out of memory");
    }
    return ARL_OK;
}

static arl_status calc_score(void *inst, void *state, const arl_env_score_req *req,
                             arl_env_score_result *out) {
    calc_state *s = state;
    out->scorable = 1;
    char e[32];
    arl_bi_format_number(s->expected, e, sizeof e);
    if (req->scope == ARL_ENV_SCOPE_SEGMENT) {
        int64_t first = req->first, last = req->last;
        if (last > CALC_MAX_STEPS) last = CALC_MAX_STEPS;
        if (first < 1) first = 1;
        int before = s->progress_at[first - 1], after = s->progress_at[last];
        out->reward = s->nplan ? (double)(after - before) / s->nplan : 0;
        if (out->reward < 0) out->reward = 0;
        out->info = json_pack("{s:i, s:i}", "computed", after, "of", s->nplan);
        return arl_env_score_component(out, "progress", out->reward);
    }
    out->reward = s->correct ? 1.0 : 0.0;
    out->info = json_pack("{s:s, s:s?, s:b}", "expected", e, "given", s->answered ? s->given : NULL,
                          "answered", s->answered);
    return arl_env_score_component(out, "answer_correct", out->reward);
}

static arl_status calc_fork(void *inst, const void *state, void **child) {
    calc_state *c = malloc(sizeof *c);
    if (!c) return arl_errorf(ARL_ERR_NOMEM, "calculator: out of memory");
    memcpy(c, state, sizeof *c);
    *child = c;
    return ARL_OK;
}

static void calc_free_state(void *inst, void *state) {
    free(state);
}

static json_t *calc_debug_state(void *inst, const void *state) {
    const calc_state *s = state;
    char e[32];
    arl_bi_format_number(s->expected, e, sizeof e);
    return json_pack("{s:i, s:s, s:s, s:i, s:i, s:b}", "level", s->level, "question", s->question,
                     "expected", e, "computed", popcount32(s->obtained), "plan", s->nplan,
                     "answered", s->answered);
}

/* ---- teacher ---- */

arl_status arl_env_calculator_teacher(void *inst, const void *state, int64_t next_step,
                                      arl_env_action *out) {
    const calc_state *s = state;
    if (s->answered) return arl_errorf(ARL_ERR_STATE, "calculator: the episode has ended");
    int final_known = (s->obtained >> (s->nplan - 1)) & 1u;
    if (!final_known) {
        for (int i = 0; i < s->nplan; i++) {
            if ((s->obtained >> i) & 1u) continue;
            ARL_TRY(arl_bi_teacher_call(out, next_step, "calc",
                                        json_pack("{s:s}", "expression", s->plan_expr[i])));
            return arl_bi_teacher_finish(out, "");
        }
    }
    char v[32];
    arl_bi_format_number(s->expected, v, sizeof v);
    ARL_TRY(arl_bi_teacher_call(out, next_step, "answer", json_pack("{s:s}", "value", v)));
    return arl_bi_teacher_finish(out, "");
}

static const arl_env_ops calc_ops = {
    .thread_safety = 1,
    .instance_create = calc_instance_create,
    .instance_destroy = calc_instance_destroy,
    .reset = calc_reset,
    .step = calc_step,
    .score = calc_score,
    .fork = calc_fork,
    .free_state = calc_free_state,
    .debug_state = calc_debug_state,
};

const arl_env_def arl_env_calculator = {
    .name = "calculator",
    .version = "1.0.0",
    .description = "Arithmetic word problems solved with a calc tool (levels 1-5).",
    .info_json = calc_info_json,
    .ops = &calc_ops,
};
