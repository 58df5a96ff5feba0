/* policy/chat.c: conversations, the chat/tool template (rendering with loss mask), the
 * tool-call parser and the extension check.  The format is docs/chat_template.md; the API
 * policy/chat.h.  Not sampling, not the AEP action JSON (rollout/). */
#include "policy/chat.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/file.h"
#include "core/json_dump.h"
#include "policy/image.h"

/* Spec limits used here (spec/aep.md): tool names §3, argument depth §4.6, message §4.5. */
#define TOOL_NAME_MAX 64
#define ARGS_MAX_DEPTH 24
#define PARSE_MESSAGE_MAX 512
#define IMAGE_SIDE_MAX (1 << 24)

/* ------------------------------------------------------------------------------------------ */
/* small helpers */

static char *mem_dup(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (!d) return NULL;
    if (n) memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

static arl_status oom(const char *what) {
    return arl_errorf(ARL_ERR_NOMEM, "chat: out of memory (%s)", what);
}

void arl_chat_template_default(arl_chat_template *t) {
    arl_tokenizer_spec_default(&t->tok);
    t->patch_size = 14;
    t->image_max_patches = 16384;
}

static const char *const role_names[] = {"system", "user", "assistant", "tool"};

const char *arl_chat_role_str(arl_chat_role r) {
    return (int)r >= 0 && r <= ARL_CHAT_TOOL ? role_names[r] : "?";
}

static const char *const status_names[] = {
    "ok",           "no_tool_call",   "invalid_json",       "arguments_not_object",
    "missing_name", "unclosed_block", "malformed_structure"};

const char *arl_chat_parse_status_str(arl_chat_parse_status s) {
    return (int)s >= 0 && s <= ARL_CHAT_PARSE_MALFORMED_STRUCTURE ? status_names[s] : "?";
}

int arl_chat_parse_status_from_str(const char *s) {
    for (int i = 0; i <= ARL_CHAT_PARSE_MALFORMED_STRUCTURE; i++)
        if (s && !strcmp(s, status_names[i])) return i;
    return -1;
}

const char *arl_chat_finish_str(arl_chat_finish f) {
    switch (f) {
    case ARL_CHAT_FINISH_STOP:
        return "stop";
    case ARL_CHAT_FINISH_TOOL_CALLS:
        return "tool_calls";
    case ARL_CHAT_FINISH_LENGTH:
        return "length";
    }
    return "?";
}

/* Tool names of spec/aep.md §3: ^[A-Za-z0-9_-]{1,64}$. */
static int tool_name_valid(const char *s, size_t n) {
    if (n < 1 || n > TOOL_NAME_MAX) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* Printable copy of s for messages: at most max bytes, other bytes as '?'. */
static void printable(char *dst, size_t cap, const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap; i++)
        dst[k++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    if (n && k + 4 >= cap && k < n) {
        dst[k++] = '.';
        dst[k++] = '.';
        dst[k++] = '.';
    }
    dst[k] = '\0';
}

/* Copy of a parse message with every byte outside printable ASCII as '?', so that it is valid
 * UTF-8 whatever the model sampled (it goes into an AEP action as a JSON string). */
static char *message_dup(const char *msg) {
    char *d = mem_dup(msg, strlen(msg));
    if (d)
        for (char *p = d; *p; p++)
            if (*p < 0x20 || *p >= 0x7f) *p = '?';
    return d;
}

/* Maximum nesting of arrays/objects in JSON-like text, counting outside strings only (the
 * top-level object is level 1, spec/aep.md §2.3).  Works on invalid JSON too. */
static int json_text_depth(const char *s, size_t n) {
    int depth = 0, max = 0, in_str = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            if (++depth > max) max = depth;
        } else if (c == '}' || c == ']') {
            if (depth > 0) depth--;
        }
    }
    return max;
}

/* Classify argument text into *st: OK, MALFORMED_STRUCTURE (too deep), INVALID_JSON,
 * ARGUMENTS_NOT_OBJECT; msg gets the reason for a failure.  ARL_ERR_NOMEM (set) when the
 * parse ran out of memory: the text is then not classified (never INVALID_JSON for it). */
static arl_status args_check(const char *s, size_t n, char *msg, size_t cap,
                             arl_chat_parse_status *st) {
    if (json_text_depth(s, n) > ARGS_MAX_DEPTH) {
        snprintf(msg, cap, "arguments nested deeper than %d levels", ARGS_MAX_DEPTH);
        *st = ARL_CHAT_PARSE_MALFORMED_STRUCTURE;
        return ARL_OK;
    }
    json_error_t err;
    json_t *v =
        arl_json_loadb(s, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!v) {
        if (arl_json_error_nomem(&err))
            return arl_errorf(ARL_ERR_NOMEM, "out of memory parsing tool-call arguments");
        snprintf(msg, cap, "arguments are not valid JSON: %s (at byte %d)", err.text, err.position);
        *st = ARL_CHAT_PARSE_INVALID_JSON;
        return ARL_OK;
    }
    int obj = json_is_object(v);
    json_decref(v);
    if (!obj) {
        snprintf(msg, cap, "arguments are valid JSON but not an object");
        *st = ARL_CHAT_PARSE_ARGUMENTS_NOT_OBJECT;
        return ARL_OK;
    }
    *st = ARL_CHAT_PARSE_OK;
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* tokens */

void arl_chat_tokens_init(arl_chat_tokens *t) {
    memset(t, 0, sizeof *t);
}

void arl_chat_tokens_free(arl_chat_tokens *t) {
    if (!t) return;
    free(t->ids);
    free(t->mask);
    free(t->msg);
    memset(t, 0, sizeof *t);
}

void arl_chat_tokens_clear(arl_chat_tokens *t) {
    t->n = 0;
}

static arl_status tokens_reserve(arl_chat_tokens *t, size_t extra) {
    if (t->n + extra <= t->cap) return ARL_OK;
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->n + extra)
        cap *= 2;
    int32_t *ids = realloc(t->ids, cap * sizeof *ids);
    if (ids) t->ids = ids;
    uint8_t *mask = realloc(t->mask, cap * sizeof *mask);
    if (mask) t->mask = mask;
    int32_t *msg = realloc(t->msg, cap * sizeof *msg);
    if (msg) t->msg = msg;
    if (!ids || !mask || !msg) return oom("rendered tokens");
    t->cap = cap;
    return ARL_OK;
}

static arl_status push1(arl_chat_tokens *t, int32_t id, uint8_t mask, int32_t msg) {
    ARL_TRY(tokens_reserve(t, 1));
    t->ids[t->n] = id;
    t->mask[t->n] = mask;
    t->msg[t->n] = msg;
    t->n++;
    return ARL_OK;
}

static arl_status push_bytes(arl_chat_tokens *t, const char *s, size_t n, uint8_t mask,
                             int32_t msg) {
    ARL_TRY(tokens_reserve(t, n));
    arl_tokenizer_encode(s, n, t->ids + t->n);
    memset(t->mask + t->n, mask, n);
    for (size_t i = 0; i < n; i++)
        t->msg[t->n + i] = msg;
    t->n += n;
    return ARL_OK;
}

static arl_status push_str(arl_chat_tokens *t, const char *s, uint8_t mask, int32_t msg) {
    return push_bytes(t, s, strlen(s), mask, msg);
}

/* ------------------------------------------------------------------------------------------ */
/* conversation memory */

static void call_free(arl_chat_call *k) {
    free(k->id);
    free(k->name);
    free(k->arguments);
    free(k->raw);
    free(k->message);
    memset(k, 0, sizeof *k);
}

static void message_free(arl_chat_message *m) {
    for (size_t i = 0; i < m->n_parts; i++)
        free(m->parts[i].text);
    free(m->parts);
    for (size_t i = 0; i < m->n_calls; i++)
        call_free(&m->calls[i]);
    free(m->calls);
    free(m->tool_call_id);
    free(m->tool_name);
    free(m->error_code);
    memset(m, 0, sizeof *m);
}

static void tools_clear(arl_chat_conv *c) {
    free(c->tools_json);
    for (size_t i = 0; i < c->n_tools; i++)
        free(c->tool_names[i]);
    free(c->tool_names);
    c->tools_json = NULL;
    c->tools_len = 0;
    c->tool_names = NULL;
    c->n_tools = 0;
}

void arl_chat_conv_init(arl_chat_conv *c) {
    memset(c, 0, sizeof *c);
}

void arl_chat_conv_free(arl_chat_conv *c) {
    if (!c) return;
    tools_clear(c);
    for (size_t i = 0; i < c->n_msgs; i++)
        message_free(&c->msgs[i]);
    free(c->msgs);
    memset(c, 0, sizeof *c);
}

void arl_chat_conv_truncate(arl_chat_conv *c, size_t n) {
    ARL_ASSERT(n <= c->n_msgs);
    for (size_t i = n; i < c->n_msgs; i++)
        message_free(&c->msgs[i]);
    c->n_msgs = n;
}

int arl_chat_conv_has_tool(const arl_chat_conv *c, const char *name, size_t len) {
    for (size_t i = 0; i < c->n_tools; i++)
        if (strlen(c->tool_names[i]) == len && !memcmp(c->tool_names[i], name, len)) return 1;
    return 0;
}

arl_status arl_chat_conv_set_tools_json(arl_chat_conv *c, const char *text, size_t len) {
    if (!text) {
        tools_clear(c);
        return ARL_OK;
    }
    json_error_t err;
    json_t *root = arl_json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return arl_json_error_nomem(&err)
                   ? arl_errorf(ARL_ERR_NOMEM, "tools: out of memory reading the JSON")
                   : arl_errorf(ARL_ERR_FORMAT, "tools: invalid JSON at line %d column %d: %s",
                                err.line, err.column, err.text);
    arl_status s = ARL_OK;
    char **names = NULL;
    size_t n = 0;
    char *dump = NULL;
    if (json_is_null(root)) goto done_clear;
    if (!json_is_array(root)) {
        s = arl_errorf(ARL_ERR_FORMAT, "tools: expected an array of tool definitions or null");
        goto out;
    }
    n = json_array_size(root);
    if (n == 0) goto done_clear;
    names = calloc(n, sizeof *names);
    if (!names) {
        s = oom("tools");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *tool = json_array_get(root, i);
        if (!json_is_object(tool)) {
            s = arl_errorf(ARL_ERR_FORMAT, "tools[%zu]: expected an object", i);
            goto out;
        }
        json_t *type = json_object_get(tool, "type");
        if (!json_is_string(type) || strcmp(json_string_value(type), "function")) {
            s = arl_errorf(ARL_ERR_FORMAT, "tools[%zu]: field 'type': expected \"function\"", i);
            goto out;
        }
        json_t *fn = json_object_get(tool, "function");
        if (!json_is_object(fn)) {
            s = arl_errorf(ARL_ERR_FORMAT, "tools[%zu]: missing field 'function' (an object)", i);
            goto out;
        }
        json_t *nm = json_object_get(fn, "name");
        if (!json_is_string(nm)) {
            s = arl_errorf(ARL_ERR_FORMAT, "tools[%zu]: missing field 'function.name' (a string)",
                           i);
            goto out;
        }
        const char *ns = json_string_value(nm);
        size_t nl = json_string_length(nm);
        if (!tool_name_valid(ns, nl)) {
            char pr[80];
            printable(pr, sizeof pr, ns, nl);
            s = arl_errorf(ARL_ERR_FORMAT,
                           "tools[%zu]: field 'function.name': '%s' is not a valid tool name "
                           "(1-64 characters of A-Z a-z 0-9 _ -)",
                           i, pr);
            goto out;
        }
        for (size_t j = 0; j < i; j++)
            if (!strcmp(names[j], ns)) {
                s = arl_errorf(ARL_ERR_FORMAT, "tools[%zu]: function name '%s' repeats tools[%zu]",
                               i, ns, j);
                goto out;
            }
        json_t *desc = json_object_get(fn, "description");
        if (desc && !json_is_string(desc) && !json_is_null(desc)) {
            s = arl_errorf(ARL_ERR_FORMAT,
                           "tools[%zu]: field 'function.description': expected "
                           "a string",
                           i);
            goto out;
        }
        json_t *par = json_object_get(fn, "parameters");
        if (par && !json_is_object(par) && !json_is_null(par)) {
            s = arl_errorf(ARL_ERR_FORMAT,
                           "tools[%zu]: field 'function.parameters': expected "
                           "a JSON Schema object",
                           i);
            goto out;
        }
        names[i] = mem_dup(ns, nl);
        if (!names[i]) {
            s = oom("tools");
            goto out;
        }
    }
    dump = arl_json_dumps(root, JSON_COMPACT);
    if (!dump) {
        s = oom("tools");
        goto out;
    }
    tools_clear(c);
    c->tools_json = dump;
    c->tools_len = strlen(dump);
    c->tool_names = names;
    c->n_tools = n;
    json_decref(root);
    return ARL_OK;
done_clear:
    tools_clear(c);
out:
    if (names)
        for (size_t i = 0; i < n; i++)
            free(names[i]);
    free(names);
    json_decref(root);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* adding messages: a message is built aside, validated against the conversation, then moved in */

/* Error "message I (role): ...". role -1: no role known yet. */
static arl_status msg_err(arl_status st, size_t idx, int role, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static arl_status msg_err(arl_status st, size_t idx, int role, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (role >= 0) return arl_errorf(st, "message %zu (%s): %s", idx, role_names[role], buf);
    return arl_errorf(st, "message %zu: %s", idx, buf);
}

/* Find the call with id among messages [0, upto). Returns the message index or -1. */
static long find_call(const arl_chat_conv *c, size_t upto, const char *id, size_t *call_idx) {
    for (size_t i = upto; i-- > 0;) {
        const arl_chat_message *m = &c->msgs[i];
        if (m->role != ARL_CHAT_ASSISTANT) continue;
        for (size_t j = 0; j < m->n_calls; j++)
            if (!strcmp(m->calls[j].id, id)) {
                if (call_idx) *call_idx = j;
                return (long)i;
            }
    }
    return -1;
}

/* Validate m as message index c->n_msgs and move it into c (m is emptied).  On error m is
 * left for the caller to free. */
static arl_status conv_push(arl_chat_conv *c, arl_chat_message *m) {
    size_t idx = c->n_msgs;
    int r = (int)m->role;
    for (size_t p = 0; p < m->n_parts; p++)
        if (m->parts[p].is_image) {
            if (m->role != ARL_CHAT_USER && m->role != ARL_CHAT_TOOL)
                return msg_err(ARL_ERR_FORMAT, idx, r,
                               "content[%zu]: images may appear only in user and tool messages "
                               "(spec/aep.md §4.2)",
                               p);
            if (m->parts[p].width < 1 || m->parts[p].height < 1 ||
                m->parts[p].width > IMAGE_SIDE_MAX || m->parts[p].height > IMAGE_SIDE_MAX)
                return msg_err(ARL_ERR_FORMAT, idx, r,
                               "content[%zu]: image size %dx%d is not a valid pixel size", p,
                               m->parts[p].width, m->parts[p].height);
        }
    if (m->role == ARL_CHAT_ASSISTANT) {
        for (size_t j = 0; j < m->n_calls; j++) {
            const arl_chat_call *k = &m->calls[j];
            if (!k->id || !*k->id)
                return msg_err(ARL_ERR_FORMAT, idx, r, "tool call %zu has no id", j);
            for (size_t q = 0; q < j; q++)
                if (!strcmp(m->calls[q].id, k->id))
                    return msg_err(ARL_ERR_FORMAT, idx, r,
                                   "tool call id '%s' appears twice in the message", k->id);
            long prev = find_call(c, idx, k->id, NULL);
            if (prev >= 0)
                return msg_err(ARL_ERR_FORMAT, idx, r,
                               "tool call id '%s' is already used by message %ld", k->id, prev);
        }
    } else if (m->n_calls) {
        return msg_err(ARL_ERR_FORMAT, idx, r, "only assistant messages may have tool calls");
    }
    if (m->role == ARL_CHAT_TOOL) {
        if (!m->tool_call_id)
            return msg_err(ARL_ERR_FORMAT, idx, r, "missing field 'tool_call_id'");
        size_t j = 0;
        long a = find_call(c, idx, m->tool_call_id, &j);
        if (a < 0)
            return msg_err(ARL_ERR_FORMAT, idx, r,
                           "field 'tool_call_id': '%s' answers no tool call of an earlier "
                           "assistant message",
                           m->tool_call_id);
        for (size_t i = (size_t)a + 1; i < idx; i++)
            if (c->msgs[i].role == ARL_CHAT_TOOL &&
                !strcmp(c->msgs[i].tool_call_id, m->tool_call_id))
                return msg_err(
                    ARL_ERR_FORMAT, idx, r,
                    "field 'tool_call_id': call '%s' was already answered by message %zu",
                    m->tool_call_id, i);
        const arl_chat_call *k = &c->msgs[a].calls[j];
        free(m->tool_name);
        m->tool_name = mem_dup(k->name ? k->name : "", k->name ? k->name_len : 0);
        if (!m->tool_name) return oom("message");
    }
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? 2 * c->cap_msgs : 16;
        arl_chat_message *nm = realloc(c->msgs, cap * sizeof *nm);
        if (!nm) return oom("messages");
        c->msgs = nm;
        c->cap_msgs = cap;
    }
    c->msgs[c->n_msgs++] = *m;
    memset(m, 0, sizeof *m);
    return ARL_OK;
}

static arl_status parts_append(arl_chat_message *m, const arl_chat_part *p) {
    arl_chat_part *np = realloc(m->parts, (m->n_parts + 1) * sizeof *np);
    if (!np) return oom("content parts");
    m->parts = np;
    m->parts[m->n_parts++] = *p;
    return ARL_OK;
}

static arl_status parts_append_text(arl_chat_message *m, const char *s, size_t n) {
    arl_chat_part p = {0};
    p.text = mem_dup(s, n);
    if (!p.text) return oom("content");
    p.len = n;
    arl_status st = parts_append(m, &p);
    if (st) free(p.text);
    return st;
}

static arl_status calls_append(arl_chat_message *m, arl_chat_call *k) {
    arl_chat_call *nk = realloc(m->calls, (m->n_calls + 1) * sizeof *nk);
    if (!nk) return oom("tool calls");
    m->calls = nk;
    m->calls[m->n_calls++] = *k;
    memset(k, 0, sizeof *k);
    return ARL_OK;
}

/* Build a well-formed call; validates name and arguments. `where` names the field for
 * messages ("tool_calls[1]"). */
static arl_status call_make_ok(arl_chat_call *k, size_t idx, const char *where, const char *id,
                               const char *name, size_t name_len, const char *args,
                               size_t args_len) {
    memset(k, 0, sizeof *k);
    if (!tool_name_valid(name, name_len)) {
        char pr[80];
        printable(pr, sizeof pr, name, name_len);
        return msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                       "%s: function name '%s' is not a valid tool name (1-64 characters of "
                       "A-Z a-z 0-9 _ -)",
                       where, pr);
    }
    char why[PARSE_MESSAGE_MAX];
    arl_chat_parse_status ast;
    ARL_TRY(args_check(args, args_len, why, sizeof why, &ast));
    if (ast != ARL_CHAT_PARSE_OK)
        return msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT, "%s: %s", where, why);
    k->status = ARL_CHAT_PARSE_OK;
    k->known_tool = -1;
    k->id = mem_dup(id, strlen(id));
    k->name = mem_dup(name, name_len);
    k->name_len = name_len;
    k->arguments = mem_dup(args, args_len);
    k->arguments_len = args_len;
    if (!k->id || !k->name || !k->arguments) {
        call_free(k);
        return oom("tool call");
    }
    return ARL_OK;
}

/* Build a failed block from its raw tokens. */
static arl_status call_make_failed(const arl_chat_template *t, arl_chat_call *k, size_t idx,
                                   const char *where, const char *id, arl_chat_parse_status status,
                                   const char *name, size_t name_len, const int32_t *raw,
                                   size_t n_raw, const char *message) {
    memset(k, 0, sizeof *k);
    if (status == ARL_CHAT_PARSE_OK || status == ARL_CHAT_PARSE_NO_TOOL_CALL)
        return msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                       "%s: status '%s' is not a block failure", where,
                       arl_chat_parse_status_str(status));
    if (n_raw == 0)
        return msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                       "%s: a failed block needs its raw tokens (field 'raw') to be rendered",
                       where);
    int32_t stop = t->tok.special[ARL_SPECIAL_END_OF_MSG];
    for (size_t i = 0; i < n_raw; i++) {
        if (raw[i] < 0 || raw[i] >= t->tok.vocab_size)
            return msg_err(ARL_ERR_RANGE, idx, ARL_CHAT_ASSISTANT,
                           "%s: raw token %zu has id %d outside [0, %d)", where, i, raw[i],
                           t->tok.vocab_size);
        if (raw[i] == stop)
            return msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                           "%s: raw block contains the stop token <|end_of_msg|>", where);
    }
    k->status = status;
    k->known_tool = -1;
    k->id = mem_dup(id, strlen(id));
    k->raw = malloc(n_raw * sizeof *k->raw);
    if (name) {
        k->name = mem_dup(name, name_len);
        k->name_len = name_len;
    }
    k->message = message ? mem_dup(message, strlen(message)) : NULL;
    if (!k->id || !k->raw || (name && !k->name) || (message && !k->message)) {
        call_free(k);
        return oom("tool call");
    }
    memcpy(k->raw, raw, n_raw * sizeof *raw);
    k->n_raw = n_raw;
    return ARL_OK;
}

arl_status arl_chat_conv_add_text(arl_chat_conv *c, arl_chat_role role, const char *text,
                                  size_t len) {
    if ((int)role < 0 || role > ARL_CHAT_TOOL)
        return arl_errorf(ARL_ERR_ARG, "message %zu: unknown role %d", c->n_msgs, (int)role);
    if (role == ARL_CHAT_TOOL)
        return msg_err(ARL_ERR_ARG, c->n_msgs, role,
                       "use arl_chat_conv_add_tool_result for tool messages");
    arl_chat_message m = {0};
    m.role = role;
    arl_status s = parts_append_text(&m, text ? text : "", text ? len : 0);
    if (!s) s = conv_push(c, &m);
    message_free(&m);
    return s;
}

arl_status arl_chat_conv_add_tool_result(arl_chat_conv *c, const char *call_id, const char *text,
                                         size_t len, const char *error_code) {
    arl_chat_message m = {0};
    m.role = ARL_CHAT_TOOL;
    arl_status s = ARL_OK;
    if (!call_id) s = msg_err(ARL_ERR_ARG, c->n_msgs, ARL_CHAT_TOOL, "no tool_call_id");
    if (!s && !(m.tool_call_id = mem_dup(call_id, strlen(call_id)))) s = oom("message");
    if (!s && error_code && !(m.error_code = mem_dup(error_code, strlen(error_code))))
        s = oom("message");
    if (!s) s = parts_append_text(&m, text ? text : "", text ? len : 0);
    if (!s) s = conv_push(c, &m);
    message_free(&m);
    return s;
}

arl_status arl_chat_conv_add_part_text(arl_chat_conv *c, const char *text, size_t len) {
    if (!c->n_msgs) return arl_errorf(ARL_ERR_STATE, "chat: no message to add a text part to");
    return parts_append_text(&c->msgs[c->n_msgs - 1], text ? text : "", text ? len : 0);
}

arl_status arl_chat_conv_add_part_image(arl_chat_conv *c, int32_t width, int32_t height) {
    if (!c->n_msgs) return arl_errorf(ARL_ERR_STATE, "chat: no message to add an image to");
    size_t idx = c->n_msgs - 1;
    arl_chat_message *m = &c->msgs[idx];
    if (m->role != ARL_CHAT_USER && m->role != ARL_CHAT_TOOL)
        return msg_err(ARL_ERR_FORMAT, idx, m->role,
                       "images may appear only in user and tool messages (spec/aep.md §4.2)");
    if (width < 1 || height < 1 || width > IMAGE_SIDE_MAX || height > IMAGE_SIDE_MAX)
        return msg_err(ARL_ERR_FORMAT, idx, m->role, "image size %dx%d is not a valid pixel size",
                       width, height);
    arl_chat_part p = {0};
    p.is_image = 1;
    p.width = width;
    p.height = height;
    return parts_append(m, &p);
}

arl_status arl_chat_conv_add_call(arl_chat_conv *c, const char *id, const char *name,
                                  const char *arguments, size_t arguments_len) {
    if (!c->n_msgs || c->msgs[c->n_msgs - 1].role != ARL_CHAT_ASSISTANT)
        return arl_errorf(ARL_ERR_STATE, "chat: tool calls go into an assistant message, and "
                                         "the last message is not one");
    size_t idx = c->n_msgs - 1;
    arl_chat_message *m = &c->msgs[idx];
    if (!id || !*id) return msg_err(ARL_ERR_ARG, idx, ARL_CHAT_ASSISTANT, "tool call without id");
    if (find_call(c, c->n_msgs, id, NULL) >= 0)
        return msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT, "tool call id '%s' is already used",
                       id);
    arl_chat_call k;
    char where[64];
    snprintf(where, sizeof where, "tool_calls[%zu]", m->n_calls);
    ARL_TRY(call_make_ok(&k, idx, where, id, name ? name : "", name ? strlen(name) : 0,
                         arguments ? arguments : "", arguments ? arguments_len : 0));
    arl_status s = calls_append(m, &k);
    call_free(&k);
    return s;
}

arl_status arl_chat_conv_add_turn(arl_chat_conv *c, const arl_chat_template *t,
                                  const arl_chat_turn *turn) {
    size_t idx = c->n_msgs;
    arl_chat_message m = {0};
    m.role = ARL_CHAT_ASSISTANT;
    m.finish_length = turn->finish == ARL_CHAT_FINISH_LENGTH;
    arl_status s = parts_append_text(&m, turn->content ? turn->content : "",
                                     turn->content ? turn->content_len : 0);
    for (size_t j = 0; !s && j < turn->n_calls; j++) {
        const arl_chat_call *q = &turn->calls[j];
        arl_chat_call k;
        char where[64];
        snprintf(where, sizeof where, "block %zu", j);
        if (!q->id) {
            s = msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT, "%s has no id", where);
            break;
        }
        if (q->status == ARL_CHAT_PARSE_OK)
            s = call_make_ok(&k, idx, where, q->id, q->name ? q->name : "", q->name_len,
                             q->arguments ? q->arguments : "", q->arguments_len);
        else
            s = call_make_failed(t, &k, idx, where, q->id, q->status, q->name, q->name_len, q->raw,
                                 q->n_raw, q->message);
        if (!s) {
            k.known_tool = q->known_tool;
            s = calls_append(&m, &k);
            call_free(&k);
        }
    }
    if (!s) s = conv_push(c, &m);
    message_free(&m);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* messages from JSON */

/* Image size of a part: from part.image, part.image_url, or the part itself. */
static arl_status json_image_size(const json_t *part, size_t idx, int role, size_t p, int32_t *w,
                                  int32_t *h) {
    const json_t *src[3] = {json_object_get(part, "image"), json_object_get(part, "image_url"),
                            part};
    for (int i = 0; i < 3; i++) {
        if (!json_is_object(src[i])) continue;
        json_t *jw = json_object_get(src[i], "width"), *jh = json_object_get(src[i], "height");
        if (!jw && !jh) continue;
        if (!json_is_integer(jw) || !json_is_integer(jh) || json_integer_value(jw) < 1 ||
            json_integer_value(jh) < 1 || json_integer_value(jw) > IMAGE_SIDE_MAX ||
            json_integer_value(jh) > IMAGE_SIDE_MAX)
            return msg_err(ARL_ERR_FORMAT, idx, role,
                           "content[%zu]: image 'width' and 'height' must be integers in "
                           "[1, %d]",
                           p, IMAGE_SIDE_MAX);
        *w = (int32_t)json_integer_value(jw);
        *h = (int32_t)json_integer_value(jh);
        return ARL_OK;
    }
    return msg_err(ARL_ERR_FORMAT, idx, role,
                   "content[%zu]: image has no 'width' and 'height' (the template needs the "
                   "pixel size to count <|media_pad|> placeholders)",
                   p);
}

static arl_status json_content(const json_t *content, arl_chat_message *m, size_t idx) {
    int r = (int)m->role;
    if (json_is_string(content))
        return parts_append_text(m, json_string_value(content), json_string_length(content));
    if (!json_is_array(content))
        return msg_err(ARL_ERR_FORMAT, idx, r,
                       "field 'content': expected a string or an array of parts");
    for (size_t p = 0; p < json_array_size(content); p++) {
        const json_t *part = json_array_get(content, p);
        const json_t *type = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(type))
            return msg_err(ARL_ERR_FORMAT, idx, r,
                           "content[%zu]: expected an object with a string field 'type'", p);
        const char *ts = json_string_value(type);
        if (!strcmp(ts, "text")) {
            const json_t *tx = json_object_get(part, "text");
            if (!json_is_string(tx))
                return msg_err(ARL_ERR_FORMAT, idx, r, "content[%zu]: missing field 'text'", p);
            ARL_TRY(parts_append_text(m, json_string_value(tx), json_string_length(tx)));
        } else if (!strcmp(ts, "image") || !strcmp(ts, "image_url")) {
            arl_chat_part ip = {0};
            ip.is_image = 1;
            ARL_TRY(json_image_size(part, idx, r, p, &ip.width, &ip.height));
            if (m->role != ARL_CHAT_USER && m->role != ARL_CHAT_TOOL)
                return msg_err(ARL_ERR_FORMAT, idx, r,
                               "content[%zu]: images may appear only in user and tool messages "
                               "(spec/aep.md §4.2)",
                               p);
            ARL_TRY(parts_append(m, &ip));
        } else {
            return msg_err(ARL_ERR_FORMAT, idx, r,
                           "content[%zu]: unknown part type '%s' (expected text or image)", p, ts);
        }
    }
    return ARL_OK;
}

/* Trailing "_<digits>" of an id as a number, or -1. */
static long id_position(const char *id) {
    size_t n = strlen(id), i = n;
    while (i > 0 && id[i - 1] >= '0' && id[i - 1] <= '9')
        i--;
    if (i == n || i == 0 || id[i - 1] != '_' || n - i > 9) return -1;
    return strtol(id + i, NULL, 10);
}

typedef struct json_block {
    const json_t *v;
    int failed; /* 0: tool_calls entry, 1: parse_errors entry */
    size_t k;   /* index in its array */
    long pos;
} json_block;

static int json_block_cmp(const void *a, const void *b) {
    const json_block *x = a, *y = b;
    if (x->pos != y->pos) return x->pos < y->pos ? -1 : 1;
    if (x->failed != y->failed) return x->failed - y->failed;
    return x->k < y->k ? -1 : x->k > y->k;
}

static arl_status json_calls(const arl_chat_template *t, const json_t *msg, arl_chat_message *m,
                             size_t idx) {
    const json_t *tc = json_object_get(msg, "tool_calls"),
                 *pe = json_object_get(msg, "parse_errors");
    if (tc && !json_is_null(tc) && !json_is_array(tc))
        return msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                       "field 'tool_calls': expected an array");
    if (pe && !json_is_null(pe) && !json_is_array(pe))
        return msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                       "field 'parse_errors': expected an array");
    size_t ntc = json_is_array(tc) ? json_array_size(tc) : 0;
    size_t npe = json_is_array(pe) ? json_array_size(pe) : 0;
    if (!ntc && !npe) return ARL_OK;
    json_block *bl = calloc(ntc + npe, sizeof *bl);
    if (!bl) return oom("tool calls");
    int ordered = 1;
    arl_status s = ARL_OK;
    for (size_t i = 0; i < ntc + npe; i++) {
        bl[i].failed = i >= ntc;
        bl[i].k = bl[i].failed ? i - ntc : i;
        bl[i].v = bl[i].failed ? json_array_get(pe, bl[i].k) : json_array_get(tc, bl[i].k);
        const char *field = bl[i].failed ? "parse_errors" : "tool_calls";
        const json_t *id = json_object_get(bl[i].v, "id");
        if (!json_is_object(bl[i].v) || !json_is_string(id)) {
            s = msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                        "%s[%zu]: expected an object with a string field 'id'", field, bl[i].k);
            goto out;
        }
        bl[i].pos = id_position(json_string_value(id));
        if (bl[i].pos < 0) ordered = 0;
    }
    if (ordered) {
        qsort(bl, ntc + npe, sizeof *bl, json_block_cmp);
        for (size_t i = 1; i < ntc + npe; i++)
            if (bl[i].pos == bl[i - 1].pos) ordered = 0;
        if (!ordered) /* back to tool_calls then parse_errors */
            for (size_t i = 0; i < ntc + npe; i++)
                bl[i].pos = 0;
        if (!ordered) qsort(bl, ntc + npe, sizeof *bl, json_block_cmp);
    }
    for (size_t i = 0; i < ntc + npe; i++) {
        const json_t *v = bl[i].v;
        const char *id = json_string_value(json_object_get(v, "id"));
        char where[64];
        snprintf(where, sizeof where, "%s[%zu]", bl[i].failed ? "parse_errors" : "tool_calls",
                 bl[i].k);
        arl_chat_call k;
        if (!bl[i].failed) {
            const json_t *type = json_object_get(v, "type");
            if (type && !json_is_null(type) &&
                (!json_is_string(type) || strcmp(json_string_value(type), "function"))) {
                s = msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                            "%s: field 'type': expected \"function\"", where);
                goto out;
            }
            const json_t *fn = json_object_get(v, "function");
            const json_t *holder = json_is_object(fn) ? fn : v;
            const char *pfx = json_is_object(fn) ? "function." : "";
            const json_t *nm = json_object_get(holder, "name");
            const json_t *args = json_object_get(holder, "arguments");
            if (!json_is_string(nm)) {
                s = msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                            "%s: missing field '%sname' (a string)", where, pfx);
                goto out;
            }
            char *dump = NULL;
            const char *at;
            size_t al;
            if (json_is_string(args)) {
                at = json_string_value(args);
                al = json_string_length(args);
            } else if (json_is_object(args)) {
                dump = arl_json_dumps(args, JSON_COMPACT);
                if (!dump) {
                    s = oom("tool call");
                    goto out;
                }
                at = dump;
                al = strlen(dump);
            } else {
                s = msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                            "%s: missing field '%sarguments' (a JSON string or an object)", where,
                            pfx);
                goto out;
            }
            s = call_make_ok(&k, idx, where, id, json_string_value(nm), json_string_length(nm), at,
                             al);
            free(dump);
            if (s) goto out;
        } else {
            const json_t *st = json_object_get(v, "status"), *raw = json_object_get(v, "raw");
            int status =
                json_is_string(st) ? arl_chat_parse_status_from_str(json_string_value(st)) : -1;
            if (status < 0) {
                s = msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                            "%s: field 'status': expected a parse status of spec/aep.md §4.6",
                            where);
                goto out;
            }
            if (!json_is_string(raw)) {
                s = msg_err(ARL_ERR_FORMAT, idx, ARL_CHAT_ASSISTANT,
                            "%s: missing field 'raw' (the block text is needed to render it)",
                            where);
                goto out;
            }
            int32_t *ids = NULL;
            size_t nids = 0;
            s = arl_tokenizer_encode_special(&t->tok, json_string_value(raw),
                                             json_string_length(raw), &ids, &nids);
            if (s) goto out;
            const json_t *nm = json_object_get(v, "name"), *mg = json_object_get(v, "message");
            s = call_make_failed(t, &k, idx, where, id, (arl_chat_parse_status)status,
                                 json_is_string(nm) ? json_string_value(nm) : NULL,
                                 json_is_string(nm) ? json_string_length(nm) : 0, ids, nids,
                                 json_is_string(mg) ? json_string_value(mg) : NULL);
            free(ids);
            if (s) goto out;
        }
        s = calls_append(m, &k);
        call_free(&k);
        if (s) goto out;
    }
out:
    free(bl);
    return s;
}

static arl_status json_message(const arl_chat_template *t, const json_t *msg, arl_chat_message *m,
                               size_t idx) {
    if (!json_is_object(msg))
        return arl_errorf(ARL_ERR_FORMAT, "message %zu: expected a JSON object", idx);
    const json_t *role = json_object_get(msg, "role");
    if (!json_is_string(role))
        return arl_errorf(ARL_ERR_FORMAT, "message %zu: missing field 'role' (a string)", idx);
    int r = -1;
    for (int i = 0; i <= ARL_CHAT_TOOL; i++)
        if (!strcmp(json_string_value(role), role_names[i])) r = i;
    if (r < 0) {
        char pr[64];
        printable(pr, sizeof pr, json_string_value(role), json_string_length(role));
        return arl_errorf(ARL_ERR_FORMAT,
                          "message %zu: field 'role': unknown role '%s' (expected system, user, "
                          "assistant or tool)",
                          idx, pr);
    }
    m->role = (arl_chat_role)r;
    const json_t *content = json_object_get(msg, "content");
    if (!content || json_is_null(content)) {
        if (m->role != ARL_CHAT_ASSISTANT)
            return msg_err(ARL_ERR_FORMAT, idx, r,
                           "missing field 'content' (use \"\" for an empty message)");
        ARL_TRY(parts_append_text(m, "", 0));
    } else {
        ARL_TRY(json_content(content, m, idx));
    }
    if (m->role == ARL_CHAT_ASSISTANT) {
        const json_t *rs = json_object_get(msg, "reasoning");
        if (rs && !json_is_null(rs) && !(json_is_string(rs) && json_string_length(rs) == 0))
            return msg_err(ARL_ERR_UNSUPPORTED, idx, r,
                           "field 'reasoning': this chat template has no reasoning block "
                           "(docs/chat_template.md)");
        const json_t *fr = json_object_get(msg, "finish_reason");
        if (fr && !json_is_null(fr)) {
            const char *fs = json_is_string(fr) ? json_string_value(fr) : "";
            if (!strcmp(fs, "length"))
                m->finish_length = 1;
            else if (strcmp(fs, "stop") && strcmp(fs, "tool_calls"))
                return msg_err(ARL_ERR_FORMAT, idx, r,
                               "field 'finish_reason': expected stop, tool_calls or length");
        }
        ARL_TRY(json_calls(t, msg, m, idx));
    } else {
        const json_t *tc = json_object_get(msg, "tool_calls");
        if (tc && !json_is_null(tc) && !(json_is_array(tc) && json_array_size(tc) == 0))
            return msg_err(ARL_ERR_FORMAT, idx, r,
                           "field 'tool_calls': only assistant messages may have tool calls");
    }
    if (m->role == ARL_CHAT_TOOL) {
        const json_t *id = json_object_get(msg, "tool_call_id");
        if (!json_is_string(id))
            return msg_err(ARL_ERR_FORMAT, idx, r, "missing field 'tool_call_id' (a string)");
        m->tool_call_id = mem_dup(json_string_value(id), json_string_length(id));
        if (!m->tool_call_id) return oom("message");
        const json_t *ie = json_object_get(msg, "is_error");
        if (ie && !json_is_null(ie) && !json_is_boolean(ie))
            return msg_err(ARL_ERR_FORMAT, idx, r, "field 'is_error': expected a boolean");
        if (json_is_true(ie)) {
            const json_t *ec = json_object_get(msg, "error_code");
            if (!json_is_string(ec) || !json_string_length(ec))
                return msg_err(ARL_ERR_FORMAT, idx, r,
                               "field 'is_error' is true but field 'error_code' is missing "
                               "(spec/aep.md §4.7)");
            m->error_code = mem_dup(json_string_value(ec), json_string_length(ec));
            if (!m->error_code) return oom("message");
        }
    }
    return ARL_OK;
}

arl_status arl_chat_conv_add_json(arl_chat_conv *c, const arl_chat_template *t,
                                  const struct json_t *msg) {
    arl_chat_message m = {0};
    arl_status s = json_message(t, (const json_t *)msg, &m, c->n_msgs);
    if (!s) s = conv_push(c, &m);
    message_free(&m);
    return s;
}

arl_status arl_chat_conv_add_json_text(arl_chat_conv *c, const arl_chat_template *t,
                                       const char *text, size_t len) {
    json_error_t err;
    json_t *v = arl_json_loadb(text, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!v)
        return arl_json_error_nomem(&err)
                   ? arl_errorf(ARL_ERR_NOMEM, "message %zu: out of memory reading the JSON",
                                c->n_msgs)
                   : arl_errorf(ARL_ERR_FORMAT,
                                "message %zu: invalid JSON at line %d column %d: %s", c->n_msgs,
                                err.line, err.column, err.text);
    arl_status s = arl_chat_conv_add_json(c, t, v);
    json_decref(v);
    return s;
}

arl_status arl_chat_conv_from_json(arl_chat_conv *c, const arl_chat_template *t, const char *text,
                                   size_t len, const char *where) {
    ARL_ASSERT(c->n_msgs == 0 && c->tools_json == NULL);
    if (!where) where = "conversation";
    json_error_t err;
    json_t *root =
        arl_json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!root)
        return arl_json_error_nomem(&err)
                   ? arl_errorf(ARL_ERR_NOMEM, "%s: out of memory reading the JSON", where)
                   : arl_errorf(ARL_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", where,
                                err.line, err.column, err.text);
    arl_status s = ARL_OK;
    const json_t *msgs = root;
    if (json_is_object(root)) {
        msgs = json_object_get(root, "messages");
        const json_t *tools = json_object_get(root, "tools");
        if (!json_is_array(msgs)) {
            s = arl_errorf(ARL_ERR_FORMAT, "%s: missing field 'messages' (an array)", where);
            goto out;
        }
        if (tools && !json_is_null(tools)) {
            char *dump = arl_json_dumps(tools, JSON_COMPACT | JSON_ENCODE_ANY);
            if (!dump) {
                s = oom("tools");
                goto out;
            }
            s = arl_chat_conv_set_tools_json(c, dump, strlen(dump));
            free(dump);
            if (s) {
                arl_error_prefix(s, "%s", where);
                goto out;
            }
        }
    } else if (!json_is_array(root)) {
        s = arl_errorf(ARL_ERR_FORMAT,
                       "%s: expected an array of messages or an object with 'messages'", where);
        goto out;
    }
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        s = arl_chat_conv_add_json(c, t, json_array_get(msgs, i));
        if (s) {
            arl_error_prefix(s, "%s", where);
            goto out;
        }
    }
out:
    json_decref(root);
    if (s) arl_chat_conv_free(c);
    return s;
}

arl_status arl_chat_conv_load(arl_chat_conv *c, const arl_chat_template *t, const char *path) {
    char *buf;
    size_t n;
    ARL_TRY(arl_file_read(path, 0, &buf, &n));
    arl_status s = arl_chat_conv_from_json(c, t, buf, n, path);
    free(buf);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* rendering */

#define SP(t, k) ((t)->tok.special[ARL_SPECIAL_##k])

arl_status arl_chat_image_tokens(const arl_chat_template *t, int32_t width, int32_t height,
                                 int64_t *n) {
    if (t->patch_size <= 0)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "image input, but the model has no vision tower (no vision_config)");
    int32_t gh, gw;
    ARL_TRY(arl_image_grid(width, height, t->patch_size, t->image_max_patches, &gh, &gw));
    *n = (int64_t)(gh / 2) * (gw / 2);
    return ARL_OK;
}

size_t arl_chat_stop_tokens(const arl_chat_template *t, int32_t stop[4]) {
    stop[0] = SP(t, END_OF_MSG);
    return 1;
}

arl_status arl_chat_render_preamble(const arl_chat_template *t, const arl_chat_conv *c,
                                    arl_chat_tokens *out) {
    ARL_TRY(push1(out, SP(t, BOS), 0, -1));
    if (c->tools_json) {
        ARL_TRY(push1(out, SP(t, OPEN), 0, -1));
        ARL_TRY(push_str(out, "system", 0, -1));
        ARL_TRY(push1(out, SP(t, SEP), 0, -1));
        ARL_TRY(push_str(out, "tools", 0, -1));
        ARL_TRY(push1(out, SP(t, CLOSE), 0, -1));
        ARL_TRY(push_bytes(out, c->tools_json, c->tools_len, 0, -1));
        ARL_TRY(push1(out, SP(t, END_OF_MSG), 0, -1));
    }
    return ARL_OK;
}

static arl_status render_parts(const arl_chat_template *t, const arl_chat_message *m, size_t i,
                               uint8_t mask, arl_chat_tokens *out) {
    int32_t mi = (int32_t)i;
    for (size_t p = 0; p < m->n_parts; p++) {
        const arl_chat_part *pt = &m->parts[p];
        if (!pt->is_image) {
            ARL_TRY(push_bytes(out, pt->text, pt->len, mask, mi));
            continue;
        }
        int64_t n;
        arl_status s = arl_chat_image_tokens(t, pt->width, pt->height, &n);
        if (s)
            return arl_error_prefix(s, "message %zu (%s): content[%zu]", i, role_names[m->role], p);
        ARL_TRY(tokens_reserve(out, (size_t)n + 2));
        ARL_TRY(push1(out, SP(t, MEDIA_BEGIN), 0, mi));
        for (int64_t k = 0; k < n; k++)
            ARL_TRY(push1(out, SP(t, MEDIA_PAD), 0, mi));
        ARL_TRY(push1(out, SP(t, MEDIA_END), 0, mi));
    }
    return ARL_OK;
}

static arl_status render_message(const arl_chat_template *t, const arl_chat_message *m, size_t i,
                                 arl_chat_tokens *out) {
    int32_t mi = (int32_t)i;
    ARL_TRY(push1(out, SP(t, OPEN), 0, mi));
    ARL_TRY(push_str(out, role_names[m->role], 0, mi));
    if (m->role == ARL_CHAT_TOOL) {
        ARL_TRY(push1(out, SP(t, SEP), 0, mi));
        ARL_TRY(push_str(out, m->tool_name ? m->tool_name : "", 0, mi));
        ARL_TRY(push1(out, SP(t, SEP), 0, mi));
        ARL_TRY(push_str(out, m->tool_call_id, 0, mi));
        if (m->error_code) {
            ARL_TRY(push1(out, SP(t, SEP), 0, mi));
            ARL_TRY(push_str(out, m->error_code, 0, mi));
        }
    }
    ARL_TRY(push1(out, SP(t, CLOSE), 0, mi));
    uint8_t gen = m->role == ARL_CHAT_ASSISTANT;
    ARL_TRY(render_parts(t, m, i, gen, out));
    for (size_t j = 0; j < m->n_calls; j++) {
        const arl_chat_call *k = &m->calls[j];
        if (k->status == ARL_CHAT_PARSE_OK) {
            ARL_TRY(push1(out, SP(t, TOOL_CALL), 1, mi));
            ARL_TRY(push_bytes(out, k->name, k->name_len, 1, mi));
            ARL_TRY(push1(out, SP(t, TOOL_ARGS), 1, mi));
            ARL_TRY(push_bytes(out, k->arguments, k->arguments_len, 1, mi));
            ARL_TRY(push1(out, SP(t, TOOL_CALL_END), 1, mi));
        } else {
            ARL_TRY(tokens_reserve(out, k->n_raw));
            for (size_t q = 0; q < k->n_raw; q++)
                ARL_TRY(push1(out, k->raw[q], 1, mi));
        }
    }
    ARL_TRY(push1(out, SP(t, END_OF_MSG), gen && !m->finish_length, mi));
    return ARL_OK;
}

arl_status arl_chat_render_messages(const arl_chat_template *t, const arl_chat_conv *c,
                                    size_t first, size_t last, arl_chat_tokens *out) {
    ARL_ASSERT(first <= last && last <= c->n_msgs);
    for (size_t i = first; i < last; i++)
        ARL_TRY(render_message(t, &c->msgs[i], i, out));
    return ARL_OK;
}

arl_status arl_chat_render_gen_prompt(const arl_chat_template *t, const arl_chat_conv *c,
                                      arl_chat_tokens *out) {
    int32_t mi = (int32_t)c->n_msgs;
    ARL_TRY(push1(out, SP(t, OPEN), 0, mi));
    ARL_TRY(push_str(out, "assistant", 0, mi));
    return push1(out, SP(t, CLOSE), 0, mi);
}

arl_status arl_chat_render(const arl_chat_template *t, const arl_chat_conv *c, int gen_prompt,
                           arl_chat_tokens *out) {
    ARL_TRY(arl_chat_render_preamble(t, c, out));
    ARL_TRY(arl_chat_render_messages(t, c, 0, c->n_msgs, out));
    if (gen_prompt) ARL_TRY(arl_chat_render_gen_prompt(t, c, out));
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* tool-call parser */

void arl_chat_turn_free(arl_chat_turn *turn) {
    if (!turn) return;
    free(turn->content);
    for (size_t i = 0; i < turn->n_calls; i++)
        call_free(&turn->calls[i]);
    free(turn->calls);
    memset(turn, 0, sizeof *turn);
}

static const char *tok_name(const arl_chat_template *t, int32_t id, char *buf, size_t cap) {
    int k = arl_tokenizer_special_of(&t->tok, id);
    if (k >= 0) return arl_tokenizer_special_name((arl_special)k);
    snprintf(buf, cap, "<|reserved_%d|>", id);
    return buf;
}

/* Fill block k from ids[b..e) (the whole block).  closed: ids[e-1] is <|tool_call_end|>
 * and ids[b] is <|tool_call|>. */
static arl_status parse_call_block(const arl_chat_template *t, const int32_t *ids, size_t b,
                                   size_t e, int closed, arl_chat_call *k) {
    char msg[PARSE_MESSAGE_MAX], nb[32];
    msg[0] = '\0';
    size_t inner_end = closed ? e - 1 : e;
    size_t args_at = 0, n_args = 0, bad_at = 0;
    int bad = 0;
    for (size_t i = b + 1; i < inner_end; i++) {
        if (ids[i] == SP(t, TOOL_ARGS)) {
            if (!n_args++) args_at = i;
        } else if (ids[i] >= ARL_TOKENIZER_N_BYTES && !bad) {
            bad = 1;
            bad_at = i;
        }
    }
    /* the name: bytes between <|tool_call|> and the first <|tool_args|> (or a special) */
    size_t name_end = b + 1;
    while (name_end < inner_end && ids[name_end] < ARL_TOKENIZER_N_BYTES)
        name_end++;
    size_t name_len = name_end - (b + 1);
    int name_readable = n_args > 0 && name_end == args_at;
    arl_chat_parse_status st;
    if (!closed) {
        st = ARL_CHAT_PARSE_UNCLOSED_BLOCK;
        snprintf(msg, sizeof msg,
                 "tool-call block opened by <|tool_call|> and not closed by "
                 "<|tool_call_end|>");
    } else if (n_args == 0) {
        st = ARL_CHAT_PARSE_MALFORMED_STRUCTURE;
        snprintf(msg, sizeof msg,
                 "tool-call block has no <|tool_args|> between the name and "
                 "the arguments");
    } else if (n_args > 1) {
        st = ARL_CHAT_PARSE_MALFORMED_STRUCTURE;
        snprintf(msg, sizeof msg, "tool-call block has %zu <|tool_args|> tokens (expected one)",
                 n_args);
    } else if (bad) {
        st = ARL_CHAT_PARSE_MALFORMED_STRUCTURE;
        snprintf(msg, sizeof msg, "unexpected token %s inside a tool-call block",
                 tok_name(t, ids[bad_at], nb, sizeof nb));
    } else if (name_len == 0) {
        st = ARL_CHAT_PARSE_MISSING_NAME;
        snprintf(msg, sizeof msg, "tool-call block has no function name");
    } else {
        char nm[TOOL_NAME_MAX + 1], pr[96];
        size_t cp = name_len < sizeof nm ? name_len : sizeof nm;
        for (size_t i = 0; i < cp; i++)
            nm[i] = (char)ids[b + 1 + i];
        if (name_len > TOOL_NAME_MAX || !tool_name_valid(nm, name_len)) {
            printable(pr, sizeof pr, nm, cp);
            st = ARL_CHAT_PARSE_MALFORMED_STRUCTURE;
            snprintf(msg, sizeof msg,
                     "function name '%s' is not a valid tool name (1-64 characters of A-Z a-z "
                     "0-9 _ -)",
                     pr);
        } else {
            st = ARL_CHAT_PARSE_OK;
        }
    }
    memset(k, 0, sizeof *k);
    k->status = st;
    k->known_tool = -1;
    if (name_readable && name_len > 0) {
        k->name = malloc(name_len + 1);
        if (!k->name) return oom("tool call");
        for (size_t i = 0; i < name_len; i++)
            k->name[i] = (char)ids[b + 1 + i];
        k->name[name_len] = '\0';
        k->name_len = name_len;
    }
    if (st == ARL_CHAT_PARSE_OK) {
        size_t al = inner_end - (args_at + 1);
        char *a = malloc(al + 1);
        if (!a) return oom("tool call");
        for (size_t i = 0; i < al; i++)
            a[i] = (char)ids[args_at + 1 + i];
        a[al] = '\0';
        if (args_check(a, al, msg, sizeof msg, &st) != ARL_OK) {
            free(a);
            call_free(k);
            return ARL_ERR_NOMEM;
        }
        k->status = st;
        if (st == ARL_CHAT_PARSE_OK) {
            k->arguments = a;
            k->arguments_len = al;
        } else {
            free(a);
        }
    }
    if (k->status != ARL_CHAT_PARSE_OK) {
        k->raw = malloc((e - b) * sizeof *k->raw);
        k->message = message_dup(msg);
        if (!k->raw || !k->message) return oom("tool call");
        memcpy(k->raw, ids + b, (e - b) * sizeof *ids);
        k->n_raw = e - b;
    }
    return ARL_OK;
}

arl_status arl_chat_parse_tool_calls(const arl_chat_template *t, const int32_t *ids, size_t n,
                                     int64_t step, const arl_chat_conv *conv, arl_chat_turn *out) {
    memset(out, 0, sizeof *out);
    ARL_TRY(arl_tokenizer_check_ids(&t->tok, ids, n));
    int32_t stop = SP(t, END_OF_MSG), open_call = SP(t, TOOL_CALL), end_call = SP(t, TOOL_CALL_END);
    size_t m = n;
    int ended = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] == stop) {
            if (i + 1 != n)
                return arl_errorf(ARL_ERR_ARG,
                                  "tool-call parser: %zu token(s) after the stop token "
                                  "<|end_of_msg|> at position %zu (pass one turn, ending at its "
                                  "stop token)",
                                  n - i - 1, i);
            ended = 1;
            m = i;
        }
    size_t pos = 0;
    while (pos < m && ids[pos] < ARL_TOKENIZER_N_BYTES)
        pos++;
    out->content = malloc(pos + 1);
    if (!out->content) return oom("turn");
    for (size_t i = 0; i < pos; i++)
        out->content[i] = (char)ids[i];
    out->content[pos] = '\0';
    out->content_len = pos;
    out->n_tokens = n;
    size_t cap = 0;
    int last_closed_call = 0;
    arl_status s = ARL_OK;
    while (pos < m) {
        if (out->n_calls == cap) {
            cap = cap ? 2 * cap : 4;
            arl_chat_call *nc = realloc(out->calls, cap * sizeof *nc);
            if (!nc) {
                s = oom("turn");
                goto fail;
            }
            out->calls = nc;
        }
        arl_chat_call *k = &out->calls[out->n_calls];
        memset(k, 0, sizeof *k);
        out->n_calls++;
        size_t b = pos, e;
        if (ids[b] == open_call) {
            e = b + 1;
            while (e < m && ids[e] != end_call && ids[e] != open_call)
                e++;
            int closed = e < m && ids[e] == end_call;
            if (closed) e++;
            s = parse_call_block(t, ids, b, e, closed, k);
            last_closed_call = closed;
        } else {
            /* stray tokens: up to the next <|tool_call|> or the end of the turn */
            e = b + 1;
            while (e < m && ids[e] != open_call)
                e++;
            char msg[PARSE_MESSAGE_MAX], nb[32];
            if (b == out->content_len)
                snprintf(msg, sizeof msg,
                         "unexpected token %s in the text of the turn (only <|tool_call|> and "
                         "<|end_of_msg|> may follow text)",
                         tok_name(t, ids[b], nb, sizeof nb));
            else
                snprintf(msg, sizeof msg,
                         "text or tokens after a tool-call block (only <|tool_call|> or "
                         "<|end_of_msg|> may follow one)");
            k->status = ARL_CHAT_PARSE_MALFORMED_STRUCTURE;
            k->known_tool = -1;
            k->raw = malloc((e - b) * sizeof *k->raw);
            k->message = message_dup(msg);
            if (!k->raw || !k->message)
                s = oom("turn");
            else {
                memcpy(k->raw, ids + b, (e - b) * sizeof *ids);
                k->n_raw = e - b;
            }
            last_closed_call = 0;
        }
        if (s) goto fail;
        char idb[64];
        snprintf(idb, sizeof idb, "call_%lld_%zu", (long long)step, out->n_calls - 1);
        k->id = mem_dup(idb, strlen(idb));
        if (!k->id) {
            s = oom("turn");
            goto fail;
        }
        if (conv && k->name) k->known_tool = arl_chat_conv_has_tool(conv, k->name, k->name_len);
        pos = e;
    }
    out->finish = !ended ? ARL_CHAT_FINISH_LENGTH
                         : (last_closed_call ? ARL_CHAT_FINISH_TOOL_CALLS : ARL_CHAT_FINISH_STOP);
    out->status = out->n_calls ? ARL_CHAT_PARSE_OK : ARL_CHAT_PARSE_NO_TOOL_CALL;
    for (size_t j = 0; j < out->n_calls; j++)
        if (out->calls[j].status != ARL_CHAT_PARSE_OK) {
            out->status = out->calls[j].status;
            break;
        }
    return ARL_OK;
fail:
    arl_chat_turn_free(out);
    return s;
}

arl_status arl_chat_parse_tool_calls_text(const arl_chat_template *t, const char *text, size_t len,
                                          int64_t step, const arl_chat_conv *conv,
                                          arl_chat_turn *out) {
    memset(out, 0, sizeof *out);
    int32_t *ids;
    size_t n;
    ARL_TRY(arl_tokenizer_encode_special(&t->tok, text, len, &ids, &n));
    arl_status s = arl_chat_parse_tool_calls(t, ids, n, step, conv, out);
    free(ids);
    return s;
}

/* ------------------------------------------------------------------------------------------ */
/* extension property */

arl_status arl_chat_check_extension(const arl_chat_template *t, const arl_chat_conv *c,
                                    const int32_t *ctx, size_t n_ctx, int *holds,
                                    size_t *mismatch) {
    arl_chat_tokens r;
    arl_chat_tokens_init(&r);
    arl_status s = arl_chat_render(t, c, 1, &r);
    if (s) {
        arl_chat_tokens_free(&r);
        return s;
    }
    size_t i = 0;
    while (i < n_ctx && i < r.n && ctx[i] == r.ids[i])
        i++;
    *holds = i == n_ctx;
    if (mismatch) *mismatch = i;
    arl_chat_tokens_free(&r);
    return ARL_OK;
}

arl_status arl_chat_extends(const arl_chat_template *t, const arl_chat_conv *prev,
                            const arl_chat_conv *next, int *holds) {
    arl_chat_tokens a, b;
    arl_chat_tokens_init(&a);
    arl_chat_tokens_init(&b);
    arl_status s = arl_chat_render(t, prev, 0, &a);
    if (!s) s = arl_chat_render(t, next, 0, &b);
    if (!s) *holds = a.n <= b.n && (a.n == 0 || !memcmp(a.ids, b.ids, a.n * sizeof *a.ids));
    arl_chat_tokens_free(&a);
    arl_chat_tokens_free(&b);
    return s;
}
