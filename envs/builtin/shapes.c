/* envs/builtin/shapes.c: the "shapes" built-in environment (multimodal): the first
 * observation carries a small RGB PNG image of coloured shapes (circle, square, triangle in
 * red, green, blue or yellow on black) and a question about it; the agent answers with
 * answer(value) and may look closer with zoom(quadrant), whose tool message carries a 2x
 * enlarged quadrant as an image.
 *
 * Options (or task.data): size 28 (2x2 grid, 1-4 shapes, default) or 56 (3x3 grid, 1-6
 * shapes); question "any" (default: drawn from the seed), "count", "count_color", "color"
 * ("What color is the triangle?", a shape type present once) or "shape" ("Which shape is
 * red?", a colour present once).
 * Answers are compared after normalisation: lower case, surrounding spaces, a final '.', a
 * leading "a "/"an "/"the " and a plural 's' removed; numbers as digits or words
 * ("3", "three").
 * Rewards: process format (-0.1 per malformed call or turn without a call, at least -0.5);
 * outcome answer_correct (1 or 0).  No segment level (segment_score false).
 * Not here: PNG encoding (png_write.c), the AEP state machine (envs/env_host.c).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "envs/builtin/builtin.h"
#include "envs/builtin/png_write.h"

#define SH_MAX 6
#define SH_MAX_SIZE 56

static const char sh_info_json[] =
    "{\"tools\": ["
    "{\"type\": \"function\", \"function\": {\"name\": \"answer\", "
    "\"description\": \"Give the final answer (a number, a colour or a shape name). Ends the "
    "task.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"value\": {\"type\": "
    "\"string\", \"maxLength\": 64}}, \"required\": [\"value\"], "
    "\"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"zoom\", "
    "\"description\": \"Return one quadrant of the image enlarged 2x.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"quadrant\": {\"type\": "
    "\"string\", \"enum\": [\"top_left\", \"top_right\", \"bottom_left\", \"bottom_right\"]}}, "
    "\"required\": [\"quadrant\"], \"additionalProperties\": false}}}],"
    "\"reward_levels\": {\"process\": {\"range\": [-0.5, 0]}, \"outcome\": {\"range\": [0, 1]}},"
    "\"reward_components\": ["
    "{\"name\": \"answer_correct\", \"level\": \"outcome\", \"range\": [0, 1], "
    "\"description\": \"1 if the normalised answer equals the expected one\"},"
    "{\"name\": \"format\", \"level\": \"process\", \"range\": [-0.5, 0], "
    "\"description\": \"-0.1 per malformed call or turn without a call\"}],"
    "\"capabilities\": {\"fork\": true, \"segment_score\": false, \"deterministic_replay\": "
    "true, \"parallel_tool_calls\": true, \"multimodal\": true, \"context_reset\": false},"
    "\"limits\": {\"max_sessions\": 4096, \"max_steps\": 16, \"default_step_timeout_ms\": "
    "10000, \"max_observation_bytes\": 262144, \"max_image_bytes\": 65536, "
    "\"max_image_pixels\": 16384}}";

enum { SH_CIRCLE, SH_SQUARE, SH_TRIANGLE, SH_NTYPES };
enum { SH_RED, SH_GREEN, SH_BLUE, SH_YELLOW, SH_NCOLORS };
static const char *const sh_type_names[SH_NTYPES] = {"circle", "square", "triangle"};
static const char *const sh_color_names[SH_NCOLORS] = {"red", "green", "blue", "yellow"};
static const uint8_t sh_rgb[SH_NCOLORS][3] = {
    {230, 40, 40}, {40, 200, 60}, {50, 90, 240}, {240, 220, 40}};

typedef struct sh_shape {
    int type, color;
    int cx, cy, r; /* centre and half size in pixels */
} sh_shape;

typedef struct sh_state {
    int size;
    int n;
    sh_shape shapes[SH_MAX];
    char question[128];
    char expected[32];
    int64_t steps;
    int answered, correct;
    char given[72];
} sh_state;

/* ---- rendering ---- */

static void sh_render(const sh_state *s, uint8_t *rgb /* (size, size, 3) */) {
    int S = s->size;
    memset(rgb, 0, (size_t)S * S * 3);
    for (int k = 0; k < s->n; k++) {
        const sh_shape *p = &s->shapes[k];
        for (int y = p->cy - p->r; y <= p->cy + p->r; y++) {
            for (int x = p->cx - p->r; x <= p->cx + p->r; x++) {
                if (x < 0 || y < 0 || x >= S || y >= S) continue;
                int dx = x - p->cx, dy = y - p->cy, in = 0;
                if (p->type == SH_SQUARE) {
                    in = 1;
                } else if (p->type == SH_CIRCLE) {
                    in = dx * dx + dy * dy <= p->r * p->r + p->r / 2;
                } else { /* triangle pointing up: apex at the top, base at the bottom */
                    int row = y - (p->cy - p->r); /* 0..2r */
                    in = 2 * abs(dx) <= row;
                }
                if (in) memcpy(rgb + ((size_t)y * S + x) * 3, sh_rgb[p->color], 3);
            }
        }
    }
}

static arl_status sh_png(const sh_state *s, int quadrant, uint8_t **png, size_t *len) {
    uint8_t full[SH_MAX_SIZE * SH_MAX_SIZE * 3];
    sh_render(s, full);
    if (quadrant < 0) return arl_png_write_rgb(full, s->size, s->size, png, len);
    /* quadrant q: 2x nearest-neighbour enlargement of the (size/2)^2 block. */
    uint8_t big[SH_MAX_SIZE * SH_MAX_SIZE * 3];
    int S = s->size, h = S / 2, ox = (quadrant & 1) * h, oy = (quadrant >> 1) * h;
    for (int y = 0; y < 2 * h; y++)
        for (int x = 0; x < 2 * h; x++)
            memcpy(big + ((size_t)y * 2 * h + x) * 3,
                   full + ((size_t)(oy + y / 2) * S + (ox + x / 2)) * 3, 3);
    return arl_png_write_rgb(big, 2 * h, 2 * h, png, len);
}

/* ---- generation ---- */

static const char *const sh_keys[] = {"size", "question", NULL};
static const char *const sh_option_keys[] = {"size", "question", "max_steps", NULL};
static const char *const sh_qkinds[] = {"any", "count", "count_color", "color", "shape", NULL};
static const char *const sh_numwords[] = {"zero", "one", "two",   "three", "four",
                                          "five", "six", "seven", "eight", "nine"};

static void sh_generate(sh_state *s, arl_rng *r, const char *qkind) {
    int S = s->size, g = S == 28 ? 2 : 3, cell = S / g, maxn = g * g > SH_MAX ? SH_MAX : g * g;
    int cells[9];
    for (int i = 0; i < g * g; i++)
        cells[i] = i;
    for (int i = g * g - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)arl_rng_below(r, (uint64_t)i + 1), t = cells[i];
        cells[i] = cells[j];
        cells[j] = t;
    }
    s->n = 1 + (int)arl_rng_below(r, (uint64_t)maxn);
    for (int k = 0; k < s->n; k++) {
        sh_shape *p = &s->shapes[k];
        int cx0 = (cells[k] % g) * cell, cy0 = (cells[k] / g) * cell;
        p->type = (int)arl_rng_below(r, SH_NTYPES);
        p->color = (int)arl_rng_below(r, SH_NCOLORS);
        int rmax = (cell - 2) / 2, rmin = rmax * 2 / 3;
        p->r = rmin + (int)arl_rng_below(r, (uint64_t)(rmax - rmin + 1));
        int slack = cell - 2 * p->r - 1; /* free pixels inside the cell */
        p->cx = cx0 + p->r + (slack > 0 ? (int)arl_rng_below(r, (uint64_t)slack) : 0);
        p->cy = cy0 + p->r + (slack > 0 ? (int)arl_rng_below(r, (uint64_t)slack) : 0);
    }
    int type_count[SH_NTYPES] = {0}, color_count[SH_NCOLORS] = {0};
    for (int k = 0; k < s->n; k++)
        type_count[s->shapes[k].type]++, color_count[s->shapes[k].color]++;
    /* question kind: "any" draws one; kinds whose condition fails fall back to "count" */
    int kind = 0; /* 0 count, 1 count_color, 2 color, 3 shape */
    if (!strcmp(qkind, "any"))
        kind = (int)arl_rng_below(r, 4);
    else if (!strcmp(qkind, "count_color"))
        kind = 1;
    else if (!strcmp(qkind, "color"))
        kind = 2;
    else if (!strcmp(qkind, "shape"))
        kind = 3;
    if (kind == 2) {
        int t = -1;
        for (int i = 0; i < SH_NTYPES; i++)
            if (type_count[i] == 1 && t < 0) t = i;
        if (t < 0) {
            kind = 0;
        } else {
            for (int k = 0; k < s->n; k++)
                if (s->shapes[k].type == t)
                    snprintf(s->expected, sizeof s->expected, "%s",
                             sh_color_names[s->shapes[k].color]);
            snprintf(s->question, sizeof s->question, "What color is the %s?", sh_type_names[t]);
        }
    }
    if (kind == 3) {
        int c = -1;
        for (int i = 0; i < SH_NCOLORS; i++)
            if (color_count[i] == 1 && c < 0) c = i;
        if (c < 0) {
            kind = 0;
        } else {
            for (int k = 0; k < s->n; k++)
                if (s->shapes[k].color == c)
                    snprintf(s->expected, sizeof s->expected, "%s",
                             sh_type_names[s->shapes[k].type]);
            snprintf(s->question, sizeof s->question, "Which shape is %s?", sh_color_names[c]);
        }
    }
    if (kind == 1) {
        int c = s->shapes[arl_rng_below(r, (uint64_t)s->n)].color;
        snprintf(s->question, sizeof s->question, "How many %s shapes are in the image?",
                 sh_color_names[c]);
        snprintf(s->expected, sizeof s->expected, "%d", color_count[c]);
    }
    if (kind == 0) {
        snprintf(s->question, sizeof s->question, "How many shapes are in the image?");
        snprintf(s->expected, sizeof s->expected, "%d", s->n);
    }
}

/* Normalised form of an answer into out (lower case, trimmed, no final '.', no article, no
 * plural 's', number words as digits). */
static void sh_normalise(const char *in, char *out, size_t size) {
    char b[80];
    size_t n = 0;
    while (*in && isspace((unsigned char)*in))
        in++;
    for (; *in && n < sizeof b - 1; in++)
        b[n++] = (char)tolower((unsigned char)*in);
    while (n && (isspace((unsigned char)b[n - 1]) || b[n - 1] == '.'))
        n--;
    b[n] = 0;
    const char *p = b;
    if (!strncmp(p, "a ", 2))
        p += 2;
    else if (!strncmp(p, "an ", 3))
        p += 3;
    else if (!strncmp(p, "the ", 4))
        p += 4;
    snprintf(out, size, "%s", p);
    size_t m = strlen(out);
    if (m > 3 && out[m - 1] == 's' && strcmp(out, "yes")) out[m - 1] = 0; /* circles -> circle */
    for (int i = 0; i < 10; i++)
        if (!strcmp(out, sh_numwords[i])) snprintf(out, size, "%d", i);
}

/* ---- session ---- */

static uint64_t sh_anchor_hash(const sh_state *s) {
    uint64_t h = arl_bi_hash(s->shapes, sizeof s->shapes[0] * (size_t)s->n, 0);
    h = arl_bi_hash(s->question, strlen(s->question), h);
    int a[2] = {s->answered, s->correct};
    return arl_bi_hash(a, sizeof a, h);
}

static arl_status sh_instance_create(const json_t *config, void **inst) {
    return arl_bi_instance_open(sh_info_json, config, inst);
}

static void sh_instance_destroy(void *inst) {
    arl_bi_instance_close(inst);
}

static arl_status sh_reset(void *inst, const arl_env_reset_req *req, void **state,
                           arl_env_result *out) {
    ARL_TRY(arl_bi_check_keys(req->task.data, "task.data", sh_keys));
    ARL_TRY(arl_bi_check_keys(req->options, "options", sh_option_keys));
    int64_t size;
    const char *q;
    ARL_TRY(arl_bi_get_int(req->options, "size", "options", 28, 28, 56, &size));
    ARL_TRY(arl_bi_get_int(req->task.data, "size", "task.data", size, 28, 56, &size));
    if (size != 28 && size != 56)
        return arl_errorf(ARL_ERR_ARG, "size: expected 28 or 56, got %lld", (long long)size);
    ARL_TRY(arl_bi_get_string(req->options, "question", "options", "any", sh_qkinds, &q));
    ARL_TRY(arl_bi_get_string(req->task.data, "question", "task.data", q, sh_qkinds, &q));
    sh_state *s = calloc(1, sizeof *s);
    if (!s) return arl_errorf(ARL_ERR_NOMEM, "shapes: out of memory");
    s->size = (int)size;
    arl_rng r;
    arl_rng_seed_stream(&r, req->task.seed, 0x73686170u /* "shap" */);
    sh_generate(s, &r, q);
    uint8_t *png = NULL;
    size_t len = 0;
    out->obs.context = ARL_ENV_CONTEXT_RESET;
    arl_status st = sh_png(s, -1, &png, &len);
    if (st == ARL_OK)
        st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_SYSTEM,
                                  "Look at the image and answer the question with the answer "
                                  "tool.");
    if (st == ARL_OK) st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, s->question);
    if (st == ARL_OK) st = arl_env_obs_add_image(&out->obs, png, len);
    if (st == ARL_OK) st = arl_bi_set_anchor(&out->info, "shapes", sh_anchor_hash(s));
    free(png);
    if (st != ARL_OK) {
        free(s);
        return st;
    }
    *state = s;
    return ARL_OK;
}

static arl_status sh_run_call(void *state, const arl_env_tool_call *c, arl_env_observation *obs,
                              arl_bi_call_kind *kind, int *stop) {
    sh_state *s = state;
    if (!strcmp(c->name, "zoom")) {
        static const char *const quads[] = {"top_left", "top_right", "bottom_left", "bottom_right"};
        const char *q = json_string_value(json_object_get(c->arguments, "quadrant"));
        int qi = 0;
        for (int i = 0; i < 4; i++)
            if (!strcmp(q, quads[i])) qi = i;
        uint8_t *png;
        size_t len;
        ARL_TRY(sh_png(s, qi, &png, &len));
        char text[64];
        snprintf(text, sizeof text, "The %s quadrant, enlarged 2x:", q);
        arl_status st = arl_env_obs_add_tool(obs, c->id, text, NULL);
        if (st == ARL_OK) st = arl_env_obs_add_image(obs, png, len);
        free(png);
        *kind = ARL_BI_CALL_OK;
        return st;
    }
    char nb[64], norm[80], exp[80];
    const char *txt = arl_bi_arg_text(c->arguments, "value", nb, sizeof nb);
    sh_normalise(txt ? txt : "", norm, sizeof norm);
    if (!norm[0]) {
        *kind = ARL_BI_CALL_MALFORMED;
        return arl_env_obs_add_tool(obs, c->id, "Error: the answer is empty.",
                                    ARL_ENV_TOOL_ARGS_INVALID);
    }
    sh_normalise(s->expected, exp, sizeof exp);
    s->answered = 1;
    s->correct = !strcmp(norm, exp);
    snprintf(s->given, sizeof s->given, "%.64s", txt);
    *kind = ARL_BI_CALL_OK;
    *stop = 1;
    return arl_env_obs_add_tool(obs, c->id, "Answer recorded.", NULL);
}

static const arl_bi_dispatch sh_dispatch = {
    .max_calls_per_turn = 4,
    .run_call = sh_run_call,
    .nudge_no_call = "Call the answer tool with your answer.",
    .lenient_tool = "answer",
};

static arl_status sh_step(void *inst, void *state, const arl_env_step_req *req,
                          arl_env_result *out) {
    sh_state *s = state, saved = *s;
    arl_bi_turn_stats st;
    int ended;
    arl_status r = arl_bi_dispatch_turn(&sh_dispatch, inst, s, req->action, &out->obs, &st, &ended);
    if (r != ARL_OK) {
        *s = saved;
        return r;
    }
    s->steps++;
    double fmt = -0.1 * (st.n_malformed + st.n_runtime + st.no_tool_call);
    if (fmt < -0.5) fmt = -0.5;
    out->reward = fmt;
    out->terminated = ended;
    r = arl_env_result_component(out, "format", fmt);
    if (r == ARL_OK) r = arl_bi_set_anchor(&out->info, "shapes", sh_anchor_hash(s));
    if (r != ARL_OK) *s = saved;
    return r;
}

static arl_status sh_score(void *inst, void *state, const arl_env_score_req *req,
                           arl_env_score_result *out) {
    sh_state *s = state;
    if (req->scope == ARL_ENV_SCOPE_SEGMENT) {
        out->scorable = 0; /* not declared; the host answers 501 before calling */
        return ARL_OK;
    }
    out->scorable = 1;
    out->reward = s->correct ? 1.0 : 0.0;
    out->info = json_pack("{s:s, s:s?, s:b}", "expected", s->expected, "given",
                          s->answered ? s->given : NULL, "answered", s->answered);
    return arl_env_score_component(out, "answer_correct", out->reward);
}

static arl_status sh_fork(void *inst, const void *state, void **child) {
    sh_state *c = malloc(sizeof *c);
    if (!c) return arl_errorf(ARL_ERR_NOMEM, "shapes: out of memory");
    memcpy(c, state, sizeof *c);
    *child = c;
    return ARL_OK;
}

static void sh_free_state(void *inst, void *state) {
    free(state);
}

static json_t *sh_debug_state(void *inst, const void *state) {
    const sh_state *s = state;
    json_t *shapes = json_array();
    for (int k = 0; k < s->n; k++)
        json_array_append_new(
            shapes, json_pack("{s:s, s:s, s:i, s:i, s:i}", "type", sh_type_names[s->shapes[k].type],
                              "color", sh_color_names[s->shapes[k].color], "x", s->shapes[k].cx,
                              "y", s->shapes[k].cy, "r", s->shapes[k].r));
    return json_pack("{s:i, s:o, s:s, s:s, s:b}", "size", s->size, "shapes", shapes, "question",
                     s->question, "expected", s->expected, "answered", s->answered);
}

/* ---- teacher ---- */

arl_status arl_env_shapes_teacher(void *inst, const void *state, int64_t next_step,
                                  arl_env_action *out) {
    const sh_state *s = state;
    if (s->answered) return arl_errorf(ARL_ERR_STATE, "shapes: the episode has ended");
    ARL_TRY(
        arl_bi_teacher_call(out, next_step, "answer", json_pack("{s:s}", "value", s->expected)));
    return arl_bi_teacher_finish(out, "");
}

static const arl_env_ops sh_ops = {
    .thread_safety = 1,
    .instance_create = sh_instance_create,
    .instance_destroy = sh_instance_destroy,
    .reset = sh_reset,
    .step = sh_step,
    .score = sh_score,
    .fork = sh_fork,
    .free_state = sh_free_state,
    .debug_state = sh_debug_state,
};

const arl_env_def arl_env_shapes = {
    .name = "shapes",
    .version = "1.0.0",
    .description = "Questions about a small PNG image of coloured shapes (multimodal).",
    .info_json = sh_info_json,
    .ops = &sh_ops,
};
