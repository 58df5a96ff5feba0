/* Chat/tool template (policy/chat.h, docs/chat_template.md): golden rendering with loss mask
 * and message index, image placeholder counts, input errors, the tool-call parser on valid
 * and malformed turns, exact inverse of parse and render, and the extension property over
 * random conversations (deterministic seed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "policy/chat.h"
#include "tests/test.h"

static arl_chat_template T;

/* ids of trusted text with special names; caller frees */
static int32_t *ids_of(const char *text, size_t *n) {
    int32_t *ids;
    if (arl_tokenizer_encode_special(&T.tok, text, strlen(text), &ids, n) != ARL_OK) abort();
    return ids;
}

static char *text_of(const int32_t *ids, size_t n) {
    char *t;
    size_t len;
    if (arl_tokenizer_decode(&T.tok, ids, n, 0, &t, &len) != ARL_OK) abort();
    return t;
}

static int32_t sp(arl_special k) {
    return T.tok.special[k];
}

/* append one id (mask 0, message 0) to a token buffer; 1 on success */
static int push_ok(arl_chat_tokens *t, int32_t id) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        int32_t *ids = realloc(t->ids, cap * sizeof *ids);
        uint8_t *mask = realloc(t->mask, cap);
        int32_t *msg = realloc(t->msg, cap * sizeof *msg);
        if (!ids || !mask || !msg) abort();
        t->ids = ids;
        t->mask = mask;
        t->msg = msg;
        t->cap = cap;
    }
    t->ids[t->n] = id;
    t->mask[t->n] = 0;
    t->msg[t->n] = 0;
    t->n++;
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* golden rendering */

static void test_golden(void) {
    arl_chat_conv c;
    arl_chat_conv_init(&c);
    arl_status s = arl_chat_conv_load(
        &c, &T, test_src_path("tests/tokenizer/fixtures/golden_conversation.json"));
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(c.n_msgs, 5);
    arl_chat_tokens r;
    arl_chat_tokens_init(&r);
    CHECK(arl_chat_render(&T, &c, 1, &r) == ARL_OK);

    /* expected, span by span, from the hand-written fixture */
    FILE *f = fopen(test_src_path("tests/tokenizer/fixtures/golden_expected.txt"), "r");
    CHECK(f != NULL);
    if (!f) return;
    arl_chat_tokens e;
    arl_chat_tokens_init(&e);
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        size_t L = strlen(line);
        if (L && line[L - 1] == '\n') line[--L] = '\0';
        if (!L || line[0] == '#') continue;
        int msg, mask, off = 0;
        CHECK(sscanf(line, "%d %d %n", &msg, &mask, &off) == 2);
        size_t n;
        int32_t *ids = ids_of(line + off, &n);
        for (size_t i = 0; i < n; i++) {
            if (e.n == e.cap) {
                e.cap = e.cap ? 2 * e.cap : 1024;
                e.ids = realloc(e.ids, e.cap * sizeof *e.ids);
                e.mask = realloc(e.mask, e.cap);
                e.msg = realloc(e.msg, e.cap * sizeof *e.msg);
            }
            e.ids[e.n] = ids[i];
            e.mask[e.n] = (uint8_t)mask;
            e.msg[e.n] = msg;
            e.n++;
        }
        free(ids);
    }
    fclose(f);
    CHECK_EQ_INT(r.n, e.n);
    size_t first_bad = (size_t)-1;
    for (size_t i = 0; i < r.n && i < e.n; i++)
        if (r.ids[i] != e.ids[i] || r.mask[i] != e.mask[i] || r.msg[i] != e.msg[i]) {
            first_bad = i;
            break;
        }
    CHECK_MSG(first_bad == (size_t)-1, "first difference at token %zu", first_bad);
    if (first_bad != (size_t)-1 || r.n != e.n) {
        char *a = text_of(r.ids, r.n);
        fprintf(stderr, "rendered: %s\n", a);
        free(a);
    }
    /* absolute ids, as in docs/chat_template.md §9 */
    static const int32_t head[16] = {256, 262, 115, 121, 115, 116, 101, 109,
                                     264, 116, 111, 111, 108, 115, 263, 91};
    for (int i = 0; i < 16 && (size_t)i < r.n; i++)
        CHECK_EQ_INT(r.ids[i], head[i]);
    static const int32_t gen[11] = {262, 97, 115, 115, 105, 115, 116, 97, 110, 116, 263};
    CHECK(r.n >= 11 && !memcmp(r.ids + r.n - 11, gen, sizeof gen));
    /* the 2 image placeholders (56x28 at p = 14: grid 2x4, N = 1*2) */
    size_t pads = 0;
    for (size_t i = 0; i < r.n; i++)
        pads += r.ids[i] == 259;
    CHECK_EQ_INT(pads, 2);
    arl_chat_tokens_free(&r);
    arl_chat_tokens_free(&e);
    arl_chat_conv_free(&c);
}

/* ---------------------------------------------------------------------------------------- */
/* images */

static void test_image_tokens(void) {
    int64_t n;
    CHECK(arl_chat_image_tokens(&T, 56, 28, &n) == ARL_OK && n == 2);
    CHECK(arl_chat_image_tokens(&T, 28, 28, &n) == ARL_OK && n == 1);
    CHECK(arl_chat_image_tokens(&T, 1, 1, &n) == ARL_OK && n == 1); /* grid at least 2x2 */
    CHECK(arl_chat_image_tokens(&T, 448, 224, &n) == ARL_OK && n == 8 * 16);
    CHECK(arl_chat_image_tokens(&T, 420, 280, &n) == ARL_OK && n == 15 * 10);
    /* a 4096x4096 image is scaled down to the cap of 16384 patches = 4096 placeholders */
    CHECK(arl_chat_image_tokens(&T, 4096, 4096, &n) == ARL_OK);
    CHECK(n <= 4096 && n > 3500);
    arl_chat_template text_only = T;
    text_only.patch_size = 0;
    CHECK(arl_chat_image_tokens(&text_only, 56, 28, &n) == ARL_ERR_UNSUPPORTED);
    CHECK(strstr(arl_error_msg(), "no vision tower") != NULL);

    /* the rendering: <|media_begin|> N x <|media_pad|> <|media_end|>, mask 0, in place */
    arl_chat_conv c;
    arl_chat_conv_init(&c);
    CHECK(arl_chat_conv_add_text(&c, ARL_CHAT_USER, "a", 1) == ARL_OK);
    CHECK(arl_chat_conv_add_part_image(&c, 448, 224) == ARL_OK);
    CHECK(arl_chat_conv_add_part_text(&c, "b", 1) == ARL_OK);
    CHECK(arl_chat_conv_add_part_image(&c, 28, 56) == ARL_OK);
    arl_chat_tokens r;
    arl_chat_tokens_init(&r);
    CHECK(arl_chat_render(&T, &c, 0, &r) == ARL_OK);
    /* <|bos|><|open|>user<|close|> a <|media_begin|> 128 pads <|media_end|> b <|media_begin|> 2
     * pads <|media_end|> <|end_of_msg|> */
    CHECK_EQ_INT(r.n, 1 + 6 + 1 + 130 + 1 + 4 + 1);
    CHECK_EQ_INT(r.ids[7], 'a');
    CHECK_EQ_INT(r.ids[8], sp(ARL_SPECIAL_MEDIA_BEGIN));
    for (int i = 9; i < 9 + 128; i++)
        CHECK(r.ids[i] == sp(ARL_SPECIAL_MEDIA_PAD));
    CHECK_EQ_INT(r.ids[137], sp(ARL_SPECIAL_MEDIA_END));
    CHECK_EQ_INT(r.ids[138], 'b');
    for (size_t i = 0; i < r.n; i++)
        CHECK(r.mask[i] == 0);
    arl_chat_tokens_clear(&r);
    CHECK(arl_chat_render(&text_only, &c, 0, &r) == ARL_ERR_UNSUPPORTED);
    CHECK(strstr(arl_error_msg(), "message 0 (user): content[1]") != NULL);
    /* images only in user and tool messages */
    CHECK(arl_chat_conv_add_text(&c, ARL_CHAT_ASSISTANT, "x", 1) == ARL_OK);
    CHECK(arl_chat_conv_add_part_image(&c, 28, 28) == ARL_ERR_FORMAT);
    CHECK(strstr(arl_error_msg(), "message 1 (assistant): images may appear only") != NULL);
    arl_chat_tokens_free(&r);
    arl_chat_conv_free(&c);
}

/* ---------------------------------------------------------------------------------------- */
/* input errors */

typedef struct err_case {
    const char *json;
    arl_status status;
    const char *msg; /* substring of the error message */
} err_case;

static const err_case err_cases[] = {
    {"[{\"role\": \"user\", \"content\": \"x\"}", ARL_ERR_FORMAT,
     "conv.json: invalid JSON at line 1"},
    {"[{\"role\": \"user\", \"content\": \"\xff\"}]", ARL_ERR_FORMAT, "invalid JSON"},
    {"\"hello\"", ARL_ERR_FORMAT, "expected an array of messages"},
    {"{\"tools\": []}", ARL_ERR_FORMAT, "missing field 'messages'"},
    {"[42]", ARL_ERR_FORMAT, "message 0: expected a JSON object"},
    {"[{\"content\": \"x\"}]", ARL_ERR_FORMAT, "message 0: missing field 'role'"},
    {"[{\"role\": \"developer\", \"content\": \"x\"}]", ARL_ERR_FORMAT,
     "message 0: field 'role': unknown role 'developer'"},
    {"[{\"role\": \"user\"}]", ARL_ERR_FORMAT, "message 0 (user): missing field 'content'"},
    {"[{\"role\": \"user\", \"content\": 7}]", ARL_ERR_FORMAT,
     "message 0 (user): field 'content': expected a string or an array of parts"},
    {"[{\"role\": \"user\", \"content\": [{\"type\": \"audio\"}]}]", ARL_ERR_FORMAT,
     "content[0]: unknown part type 'audio'"},
    {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]", ARL_ERR_FORMAT,
     "content[0]: missing field 'text'"},
    {"[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": "
     "\"image\", "
     "\"image\": {\"format\": \"png\", \"data\": \"AA==\"}}]}]",
     ARL_ERR_FORMAT, "message 0 (user): content[1]: image has no 'width' and 'height'"},
    {"[{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {\"url\": "
     "\"x\"}}]}]",
     ARL_ERR_FORMAT, "image has no 'width' and 'height'"},
    {"[{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"image\": {\"width\": 0, "
     "\"height\": 5}}]}]",
     ARL_ERR_FORMAT, "content[0]: image 'width' and 'height' must be integers"},
    {"[{\"role\": \"system\", \"content\": [{\"type\": \"image\", \"width\": 4, \"height\": 5}]}]",
     ARL_ERR_FORMAT, "message 0 (system): content[0]: images may appear only in user and tool"},
    {"[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"tool\", \"content\": \"r\"}]",
     ARL_ERR_FORMAT, "message 1 (tool): missing field 'tool_call_id'"},
    {"[{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"tool\", \"tool_call_id\": "
     "\"call_9_0\", "
     "\"content\": \"r\"}]",
     ARL_ERR_FORMAT,
     "message 1 (tool): field 'tool_call_id': 'call_9_0' answers no tool call of an "
     "earlier assistant message"},
    {"[{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", "
     "\"function\": "
     "{\"name\": \"f\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", "
     "\"content\": \"a\"}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"b\"}]",
     ARL_ERR_FORMAT,
     "message 2 (tool): field 'tool_call_id': call 'c1' was already answered by message 1"},
    {"[{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", "
     "\"function\": "
     "{\"name\": \"f\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", "
     "\"is_error\": true, \"content\": \"a\"}]",
     ARL_ERR_FORMAT,
     "message 1 (tool): field 'is_error' is true but field 'error_code' is missing"},
    {"[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": [{\"id\": \"c1\", "
     "\"function\": "
     "{\"name\": \"f\", \"arguments\": \"{\\\"a\\\":\"}}]}]",
     ARL_ERR_FORMAT, "message 0 (assistant): tool_calls[0]: arguments are not valid JSON"},
    {"[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": [{\"id\": \"c1\", "
     "\"function\": "
     "{\"name\": \"f\", \"arguments\": \"[1]\"}}]}]",
     ARL_ERR_FORMAT, "tool_calls[0]: arguments are valid JSON but not an object"},
    {"[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": [{\"id\": \"c1\", "
     "\"function\": "
     "{\"name\": \"get weather\", \"arguments\": \"{}\"}}]}]",
     ARL_ERR_FORMAT, "tool_calls[0]: function name 'get weather' is not a valid tool name"},
    {"[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": [{\"id\": \"c1\", "
     "\"function\": "
     "{\"arguments\": \"{}\"}}]}]",
     ARL_ERR_FORMAT, "tool_calls[0]: missing field 'function.name'"},
    {"[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": [{\"id\": \"c1\", "
     "\"function\": "
     "{\"name\": \"f\"}}]}]",
     ARL_ERR_FORMAT, "tool_calls[0]: missing field 'function.arguments'"},
    {"[{\"role\": \"assistant\", \"content\": \"x\", \"tool_calls\": [{\"function\": "
     "{\"name\": \"f\", \"arguments\": \"{}\"}}]}]",
     ARL_ERR_FORMAT, "tool_calls[0]: expected an object with a string field 'id'"},
    {"[{\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", \"name\": "
     "\"f\", "
     "\"arguments\": {}}]}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": "
     "\"c1\", \"name\": \"g\", \"arguments\": {}}]}]",
     ARL_ERR_FORMAT, "message 1 (assistant): tool call id 'c1' is already used by message 0"},
    {"[{\"role\": \"assistant\", \"content\": \"x\", \"parse_errors\": [{\"id\": \"call_1_0\", "
     "\"status\": \"invalid_json\"}]}]",
     ARL_ERR_FORMAT, "parse_errors[0]: missing field 'raw'"},
    {"[{\"role\": \"assistant\", \"content\": \"x\", \"parse_errors\": [{\"id\": \"call_1_0\", "
     "\"status\": \"bad\", \"raw\": \"x\"}]}]",
     ARL_ERR_FORMAT, "parse_errors[0]: field 'status'"},
    {"[{\"role\": \"assistant\", \"content\": \"x\", \"reasoning\": \"hmm\"}]", ARL_ERR_UNSUPPORTED,
     "message 0 (assistant): field 'reasoning': this chat template has no reasoning block"},
    {"[{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": [{\"id\": \"c\"}]}]",
     ARL_ERR_FORMAT, "message 0 (user): field 'tool_calls': only assistant messages"},
    {"{\"tools\": {}, \"messages\": []}", ARL_ERR_FORMAT, "conv.json: tools: expected an array"},
    {"{\"tools\": [{\"type\": \"function\", \"function\": {\"description\": \"d\"}}], "
     "\"messages\": []}",
     ARL_ERR_FORMAT, "tools[0]: missing field 'function.name'"},
    {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, {\"type\": "
     "\"function\", "
     "\"function\": {\"name\": \"a\"}}], \"messages\": []}",
     ARL_ERR_FORMAT, "tools[1]: function name 'a' repeats tools[0]"},
    {"{\"tools\": [{\"type\": \"retrieval\"}], \"messages\": []}", ARL_ERR_FORMAT,
     "tools[0]: field 'type': expected \"function\""},
};

static void test_errors(void) {
    for (size_t i = 0; i < sizeof err_cases / sizeof err_cases[0]; i++) {
        const err_case *ec = &err_cases[i];
        arl_chat_conv c;
        arl_chat_conv_init(&c);
        arl_status s = arl_chat_conv_from_json(&c, &T, ec->json, strlen(ec->json), "conv.json");
        CHECK_MSG(s == ec->status, "case %zu: status %s, expected %s (%s)", i, arl_status_str(s),
                  arl_status_str(ec->status), arl_error_msg());
        CHECK_MSG(strstr(arl_error_msg(), ec->msg) != NULL, "case %zu: message '%s' lacks '%s'", i,
                  arl_error_msg(), ec->msg);
        CHECK(c.n_msgs == 0 && c.msgs == NULL && c.tools_json == NULL); /* freed on error */
        arl_chat_conv_free(&c);
    }
    /* a missing file */
    arl_chat_conv c;
    arl_chat_conv_init(&c);
    CHECK(arl_chat_conv_load(&c, &T, "/nonexistent/conv.json") == ARL_ERR_NOT_FOUND);
    CHECK(strstr(arl_error_msg(), "/nonexistent/conv.json") != NULL);
    /* C API: a failed append leaves the conversation unchanged */
    CHECK(arl_chat_conv_add_text(&c, ARL_CHAT_USER, "q", 1) == ARL_OK);
    CHECK(arl_chat_conv_add_tool_result(&c, "nope", "r", 1, NULL) == ARL_ERR_FORMAT);
    CHECK_EQ_INT(c.n_msgs, 1);
    CHECK(arl_chat_conv_add_call(&c, "c1", "f", "{}", 2) == ARL_ERR_STATE);
    CHECK(arl_chat_conv_add_text(&c, ARL_CHAT_TOOL, "r", 1) == ARL_ERR_ARG);
    CHECK(arl_chat_conv_add_json_text(&c, &T, "{\"role\": \"user\", \"content\": \"a\"", 33) ==
          ARL_ERR_FORMAT);
    CHECK(strstr(arl_error_msg(), "message 1: invalid JSON") != NULL);
    CHECK_EQ_INT(c.n_msgs, 1);
    /* non-UTF-8 bytes through the C API are bytes */
    CHECK(arl_chat_conv_add_text(&c, ARL_CHAT_USER, "\xff\xfe", 2) == ARL_OK);
    arl_chat_tokens r;
    arl_chat_tokens_init(&r);
    CHECK(arl_chat_render_messages(&T, &c, 1, 2, &r) == ARL_OK);
    CHECK(r.n == 9 && r.ids[6] == 0xff && r.ids[7] == 0xfe);
    arl_chat_tokens_free(&r);
    arl_chat_conv_free(&c);
}

/* Accepted JSON variants: flat AEP calls, argument objects, parse_errors in id order, error
 * tool results, finish_reason length. */
static void test_json_variants(void) {
    const char *js =
        "{\"tools\": null, \"trajectory\": {\"ignored\": true}, \"messages\": ["
        "{\"role\": \"user\", \"content\": \"go\"},"
        "{\"role\": \"assistant\", \"content\": null, \"reasoning\": null,"
        " \"tool_calls\": [{\"id\": \"call_1_1\", \"name\": \"g\", \"arguments\": {\"b\": [1, 2], "
        "\"a\": \"x\"}}],"
        " \"parse_errors\": [{\"id\": \"call_1_0\", \"status\": \"invalid_json\","
        "   \"raw\": \"<|tool_call|>f<|tool_args|>{oops<|tool_call_end|>\"}]},"
        "{\"role\": \"tool\", \"tool_call_id\": \"call_1_0\", \"is_error\": true,"
        " \"error_code\": \"TOOL_PARSE_ERROR\", \"content\": \"bad\"},"
        "{\"role\": \"tool\", \"tool_call_id\": \"call_1_1\", \"content\": \"ok\"},"
        "{\"role\": \"assistant\", \"content\": \"cut\", \"finish_reason\": \"length\"}]}";
    arl_chat_conv c;
    arl_chat_conv_init(&c);
    arl_status s = arl_chat_conv_from_json(&c, &T, js, strlen(js), "v.json");
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    arl_chat_tokens r;
    arl_chat_tokens_init(&r);
    CHECK(arl_chat_render(&T, &c, 0, &r) == ARL_OK);
    char *txt = text_of(r.ids, r.n);
    const char *want =
        "<|bos|><|open|>user<|close|>go<|end_of_msg|>"
        "<|open|>assistant<|close|><|tool_call|>f<|tool_args|>{oops<|tool_call_end|>"
        "<|tool_call|>g<|tool_args|>{\"b\":[1,2],\"a\":\"x\"}<|tool_call_end|><|end_of_msg|>"
        "<|open|>tool<|sep|><|sep|>call_1_0<|sep|>TOOL_PARSE_ERROR<|close|>bad<|end_of_msg|>"
        "<|open|>tool<|sep|>g<|sep|>call_1_1<|close|>ok<|end_of_msg|>"
        "<|open|>assistant<|close|>cut<|end_of_msg|>";
    CHECK_STR_EQ(txt, want);
    free(txt);
    /* the length-cut turn's <|end_of_msg|> is context (mask 0); its text is mask 1 */
    CHECK_EQ_INT(r.mask[r.n - 1], 0);
    CHECK_EQ_INT(r.mask[r.n - 2], 1);
    arl_chat_tokens_free(&r);
    arl_chat_conv_free(&c);
}

/* ---------------------------------------------------------------------------------------- */
/* tool-call parser */

typedef struct parse_case {
    const char *text; /* the sampled turn, special names as text */
    const char *content;
    arl_chat_parse_status turn_status;
    arl_chat_finish finish;
    int n_calls;
    arl_chat_parse_status st[3];
    const char *name[3]; /* NULL: no name */
    const char *args[3]; /* for OK blocks */
} parse_case;

#define OK ARL_CHAT_PARSE_OK
#define NOC ARL_CHAT_PARSE_NO_TOOL_CALL
#define IJ ARL_CHAT_PARSE_INVALID_JSON
#define NOBJ ARL_CHAT_PARSE_ARGUMENTS_NOT_OBJECT
#define MN ARL_CHAT_PARSE_MISSING_NAME
#define UB ARL_CHAT_PARSE_UNCLOSED_BLOCK
#define MS ARL_CHAT_PARSE_MALFORMED_STRUCTURE
#define F_STOP ARL_CHAT_FINISH_STOP
#define F_TC ARL_CHAT_FINISH_TOOL_CALLS
#define F_LEN ARL_CHAT_FINISH_LENGTH

static const parse_case parse_cases[] = {
    {"Hello there.<|end_of_msg|>", "Hello there.", NOC, F_STOP, 0, {0}, {0}, {0}},
    {"<|end_of_msg|>", "", NOC, F_STOP, 0, {0}, {0}, {0}},
    {"Partial answ", "Partial answ", NOC, F_LEN, 0, {0}, {0}, {0}},
    {"Hi<|tool_call|>get_weather<|tool_args|>{\"city\":\"Paris\"}<|tool_call_end|><|end_of_msg|>",
     "Hi",
     OK,
     F_TC,
     1,
     {OK},
     {"get_weather"},
     {"{\"city\":\"Paris\"}"}},
    {"<|tool_call|>a<|tool_args|>{}<|tool_call_end|><|tool_call|>b-2<|tool_args|> {\"x\": [1, "
     "{\"y\": null}]}\n<|tool_call_end|><|end_of_msg|>",
     "",
     OK,
     F_TC,
     2,
     {OK, OK},
     {"a", "b-2"},
     {"{}", " {\"x\": [1, {\"y\": null}]}\n"}},
    {"<|tool_call|>f<|tool_args|>{\"a\":<|tool_call_end|><|end_of_msg|>",
     "",
     IJ,
     F_TC,
     1,
     {IJ},
     {"f"},
     {0}},
    {"<|tool_call|>f<|tool_args|><|tool_call_end|><|end_of_msg|>",
     "",
     IJ,
     F_TC,
     1,
     {IJ},
     {"f"},
     {0}},
    {"<|tool_call|>f<|tool_args|>{\"a\":1,\"a\":2}<|tool_call_end|><|end_of_msg|>",
     "",
     IJ,
     F_TC,
     1,
     {IJ},
     {"f"},
     {0}},
    {"<|tool_call|>f<|tool_args|>{\"a\":NaN}<|tool_call_end|><|end_of_msg|>",
     "",
     IJ,
     F_TC,
     1,
     {IJ},
     {"f"},
     {0}},
    {"<|tool_call|>f<|tool_args|>{\"a\":\"\xff\"}<|tool_call_end|><|end_of_msg|>",
     "",
     IJ,
     F_TC,
     1,
     {IJ},
     {"f"},
     {0}},
    {"<|tool_call|>f<|tool_args|>[1,2]<|tool_call_end|><|end_of_msg|>",
     "",
     NOBJ,
     F_TC,
     1,
     {NOBJ},
     {"f"},
     {0}},
    {"<|tool_call|>f<|tool_args|>\"s\"<|tool_call_end|><|end_of_msg|>",
     "",
     NOBJ,
     F_TC,
     1,
     {NOBJ},
     {"f"},
     {0}},
    {"<|tool_call|><|tool_args|>{}<|tool_call_end|><|end_of_msg|>",
     "",
     MN,
     F_TC,
     1,
     {MN},
     {0},
     {0}},
    {"<|tool_call|>f<|tool_args|>{}<|end_of_msg|>", "", UB, F_STOP, 1, {UB}, {"f"}, {0}},
    {"ok<|tool_call|>f<|tool_args|>{\"a\"", "ok", UB, F_LEN, 1, {UB}, {"f"}, {0}},
    {"<|tool_call|>fo", "", UB, F_LEN, 1, {UB}, {0}, {0}},
    {"<|tool_call|>f<|tool_args|>{}<|tool_call|>g<|tool_args|>{}<|tool_call_end|><|end_of_msg|>",
     "",
     UB,
     F_TC,
     2,
     {UB, OK},
     {"f", "g"},
     {0, "{}"}},
    {"<|tool_call|>f{}<|tool_call_end|><|end_of_msg|>", "", MS, F_TC, 1, {MS}, {0}, {0}},
    {"<|tool_call|>f<|tool_args|>{}<|tool_args|>{}<|tool_call_end|><|end_of_msg|>",
     "",
     MS,
     F_TC,
     1,
     {MS},
     {"f"},
     {0}},
    {"<|tool_call|>f<|tool_args|>{<|sep|>}<|tool_call_end|><|end_of_msg|>",
     "",
     MS,
     F_TC,
     1,
     {MS},
     {"f"},
     {0}},
    {"<|tool_call|>get weather<|tool_args|>{}<|tool_call_end|><|end_of_msg|>",
     "",
     MS,
     F_TC,
     1,
     {MS},
     {"get weather"},
     {0}},
    {"<|tool_call|>f.g<|tool_args|>{}<|tool_call_end|><|end_of_msg|>",
     "",
     MS,
     F_TC,
     1,
     {MS},
     {"f.g"},
     {0}},
    {"<|tool_call|>f<|tool_args|>{}<|tool_call_end|>thanks<|end_of_msg|>",
     "",
     MS,
     F_STOP,
     2,
     {OK, MS},
     {"f", 0},
     {"{}", 0}},
    {"<|tool_call|>f<|tool_args|>{}<|tool_call_end|><|tool_call_end|><|end_of_msg|>",
     "",
     MS,
     F_STOP,
     2,
     {OK, MS},
     {"f", 0},
     {"{}", 0}},
    {"Hi<|sep|>there<|tool_call|>f<|tool_args|>{}<|tool_call_end|><|end_of_msg|>",
     "Hi",
     MS,
     F_TC,
     2,
     {MS, OK},
     {0, "f"},
     {0, "{}"}},
    {"A<|media_pad|><|end_of_msg|>", "A", MS, F_STOP, 1, {MS}, {0}, {0}},
    {"<|tool_call|><|tool_args|>{x<|tool_call_end|><|end_of_msg|>",
     "",
     MN,
     F_TC,
     1,
     {MN},
     {0},
     {0}},
};

static void test_parser_cases(void) {
    for (size_t i = 0; i < sizeof parse_cases / sizeof parse_cases[0]; i++) {
        const parse_case *pc = &parse_cases[i];
        arl_chat_turn turn;
        arl_status s =
            arl_chat_parse_tool_calls_text(&T, pc->text, strlen(pc->text), 3, NULL, &turn);
        CHECK_MSG(s == ARL_OK, "case %zu: %s", i, arl_error_msg());
        if (s) continue;
        CHECK_MSG(turn.content_len == strlen(pc->content) && !strcmp(turn.content, pc->content),
                  "case %zu: content '%s'", i, turn.content);
        CHECK_MSG(turn.status == pc->turn_status, "case %zu: turn status %s, expected %s", i,
                  arl_chat_parse_status_str(turn.status),
                  arl_chat_parse_status_str(pc->turn_status));
        CHECK_MSG(turn.finish == pc->finish, "case %zu: finish %s", i,
                  arl_chat_finish_str(turn.finish));
        CHECK_MSG((int)turn.n_calls == pc->n_calls, "case %zu: %zu calls", i, turn.n_calls);
        for (size_t j = 0; j < turn.n_calls && (int)j < pc->n_calls; j++) {
            const arl_chat_call *k = &turn.calls[j];
            char id[32];
            snprintf(id, sizeof id, "call_3_%zu", j);
            CHECK_STR_EQ(k->id, id);
            CHECK_MSG(k->status == pc->st[j], "case %zu block %zu: status %s, expected %s (%s)", i,
                      j, arl_chat_parse_status_str(k->status), arl_chat_parse_status_str(pc->st[j]),
                      k->message ? k->message : "");
            if (pc->name[j])
                CHECK_MSG(k->name && !strcmp(k->name, pc->name[j]), "case %zu block %zu: name", i,
                          j);
            else
                CHECK_MSG(k->name == NULL, "case %zu block %zu: unexpected name %s", i, j, k->name);
            if (k->status == OK) {
                CHECK(k->raw == NULL && k->message == NULL);
                CHECK_MSG(k->arguments && !strcmp(k->arguments, pc->args[j]),
                          "case %zu block %zu: args", i, j);
            } else {
                CHECK(k->arguments == NULL && k->raw != NULL && k->message != NULL);
                CHECK(k->message && strlen(k->message) <= 512);
            }
        }
        /* the parsed turn renders back to exactly the sampled tokens */
        size_t n;
        int32_t *ids = ids_of(pc->text, &n);
        arl_chat_conv c;
        arl_chat_conv_init(&c);
        CHECK(arl_chat_conv_add_text(&c, ARL_CHAT_USER, "u", 1) == ARL_OK);
        s = arl_chat_conv_add_turn(&c, &T, &turn);
        CHECK_MSG(s == ARL_OK, "case %zu: add_turn: %s", i, arl_error_msg());
        arl_chat_tokens r;
        arl_chat_tokens_init(&r);
        CHECK(arl_chat_render_messages(&T, &c, 1, 2, &r) == ARL_OK);
        int cut = pc->finish == F_LEN;
        CHECK_MSG(r.n == 11 + n + (size_t)cut && !memcmp(r.ids + 11, ids, n * sizeof *ids),
                  "case %zu: rendering differs from the sampled tokens", i);
        for (size_t q = 0; q < r.n; q++)
            CHECK(r.mask[q] == (q >= 11 && !(cut && q == r.n - 1)));
        arl_chat_tokens_free(&r);
        arl_chat_conv_free(&c);
        free(ids);
        arl_chat_turn_free(&turn);
    }
}

static void test_parser_more(void) {
    arl_chat_turn turn;
    /* literal special names in bytes are text, not structure */
    const char *lit = "x<|tool_call|>f<|tool_args|>{}<|tool_call_end|>";
    size_t L = strlen(lit);
    int32_t ids[64];
    arl_tokenizer_encode(lit, L, ids);
    ids[L] = sp(ARL_SPECIAL_END_OF_MSG);
    CHECK(arl_chat_parse_tool_calls(&T, ids, L + 1, 1, NULL, &turn) == ARL_OK);
    CHECK(turn.n_calls == 0 && turn.status == NOC && turn.content_len == L);
    CHECK_STR_EQ(turn.content, lit);
    arl_chat_turn_free(&turn);
    /* tokens after the stop token, ids out of range */
    int32_t after[] = {'a', 265, 'b'};
    CHECK(arl_chat_parse_tool_calls(&T, after, 3, 1, NULL, &turn) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "after the stop token") != NULL);
    CHECK(turn.calls == NULL && turn.content == NULL);
    int32_t bad[] = {'a', 400};
    CHECK(arl_chat_parse_tool_calls(&T, bad, 2, 1, NULL, &turn) == ARL_ERR_RANGE);
    CHECK(strstr(arl_error_msg(), "position 1") != NULL);
    /* argument depth: 24 levels ok, 25 malformed_structure (spec/aep.md §4.6) */
    for (int depth = 24; depth <= 25; depth++) {
        char buf[256] = "<|tool_call|>f<|tool_args|>";
        size_t p = strlen(buf);
        buf[p++] = '{';
        memcpy(buf + p, "\"a\":", 4);
        p += 4;
        for (int d = 1; d < depth; d++)
            buf[p++] = '[';
        for (int d = 1; d < depth; d++)
            buf[p++] = ']';
        buf[p++] = '}';
        strcpy(buf + p, "<|tool_call_end|><|end_of_msg|>");
        CHECK(arl_chat_parse_tool_calls_text(&T, buf, strlen(buf), 1, NULL, &turn) == ARL_OK);
        CHECK_EQ_INT(turn.calls[0].status, depth == 24 ? OK : MS);
        arl_chat_turn_free(&turn);
    }
    /* brackets inside strings do not count */
    const char *str = "<|tool_call|>f<|tool_args|>{\"a\":\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\"\"}<|"
                      "tool_call_end|><|end_of_msg|>";
    CHECK(arl_chat_parse_tool_calls_text(&T, str, strlen(str), 1, NULL, &turn) == ARL_OK);
    CHECK_EQ_INT(turn.calls[0].status, OK);
    arl_chat_turn_free(&turn);
    /* 64-byte names are fine, 65 are not */
    char nm[200];
    strcpy(nm, "<|tool_call|>");
    memset(nm + 13, 'n', 64);
    strcpy(nm + 77, "<|tool_args|>{}<|tool_call_end|><|end_of_msg|>");
    CHECK(arl_chat_parse_tool_calls_text(&T, nm, strlen(nm), 1, NULL, &turn) == ARL_OK);
    CHECK_EQ_INT(turn.calls[0].status, OK);
    arl_chat_turn_free(&turn);
    memset(nm + 13, 'n', 65);
    strcpy(nm + 78, "<|tool_args|>{}<|tool_call_end|><|end_of_msg|>");
    CHECK(arl_chat_parse_tool_calls_text(&T, nm, strlen(nm), 1, NULL, &turn) == ARL_OK);
    CHECK_EQ_INT(turn.calls[0].status, MS);
    arl_chat_turn_free(&turn);
    /* known_tool from the conversation's tool set (unknown tool: not a parse failure) */
    arl_chat_conv c;
    arl_chat_conv_init(&c);
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"search\"}}]";
    CHECK(arl_chat_conv_set_tools_json(&c, tools, strlen(tools)) == ARL_OK);
    const char *two = "<|tool_call|>search<|tool_args|>{}<|tool_call_end|><|tool_call|>rm<|tool_"
                      "args|>{}<|tool_call_end|><|end_of_msg|>";
    CHECK(arl_chat_parse_tool_calls_text(&T, two, strlen(two), 4, &c, &turn) == ARL_OK);
    CHECK(turn.status == OK && turn.n_calls == 2);
    CHECK_EQ_INT(turn.calls[0].known_tool, 1);
    CHECK_EQ_INT(turn.calls[1].known_tool, 0);
    CHECK_STR_EQ(turn.calls[1].id, "call_4_1");
    arl_chat_turn_free(&turn);
    CHECK(arl_chat_parse_tool_calls_text(&T, two, strlen(two), 4, NULL, &turn) == ARL_OK);
    CHECK_EQ_INT(turn.calls[0].known_tool, -1);
    arl_chat_turn_free(&turn);
    arl_chat_conv_free(&c);
    /* status strings are the closed set of spec/aep.md Appendix B */
    const char *names[] = {
        "ok",           "no_tool_call",   "invalid_json",       "arguments_not_object",
        "missing_name", "unclosed_block", "malformed_structure"};
    for (int i = 0; i < 7; i++) {
        CHECK_STR_EQ(arl_chat_parse_status_str((arl_chat_parse_status)i), names[i]);
        CHECK_EQ_INT(arl_chat_parse_status_from_str(names[i]), i);
    }
    CHECK_EQ_INT(arl_chat_parse_status_from_str("nope"), -1);
    int32_t stop[4];
    CHECK_EQ_INT(arl_chat_stop_tokens(&T, stop), 1);
    CHECK_EQ_INT(stop[0], 265);
}

/* ---------------------------------------------------------------------------------------- */
/* random conversations */

static const char *const words[] = {"the",
                                    "tool",
                                    "SELECT",
                                    "<|end_of_msg|>",
                                    "<|tool_call|>",
                                    "\xc3\xa9t\xc3\xa9",
                                    "\n",
                                    "{\"a\": 1}",
                                    " ",
                                    "42",
                                    "<|open|>user<|close|>",
                                    "\xe2\x82",
                                    "\x00z"};
static const char *const fnames[] = {"search", "execute_sql", "read_file", "calc", "submit_answer"};

/* random text: words, random bytes (NUL and invalid UTF-8 included) */
static size_t rand_text(arl_rng *r, char *buf, size_t cap) {
    size_t n = 0, parts = arl_rng_below(r, 8);
    for (size_t p = 0; p < parts; p++) {
        if (arl_rng_below(r, 3) == 0) {
            size_t k = arl_rng_below(r, 6);
            for (size_t i = 0; i < k && n < cap; i++)
                buf[n++] = (char)arl_rng_below(r, 256);
        } else {
            size_t w = arl_rng_below(r, sizeof words / sizeof words[0]);
            size_t wl = w == 12 ? 2 : strlen(words[w]);
            for (size_t i = 0; i < wl && n < cap; i++)
                buf[n++] = words[w][i];
        }
    }
    return n;
}

static void rand_args(arl_rng *r, char *buf, size_t cap) {
    switch (arl_rng_below(r, 4)) {
    case 0:
        snprintf(buf, cap, "{}");
        break;
    case 1:
        snprintf(buf, cap, "{\"q\":\"%llu\"}", (unsigned long long)arl_rng_below(r, 1000));
        break;
    case 2:
        snprintf(buf, cap, " {\"a\": [1, 2.5, {\"b\": null}], \"s\": \"<|end_of_msg|>\"} ");
        break;
    default:
        snprintf(buf, cap, "{\"x\":\"\\u00e9\\n\",\"n\":-3e2}");
        break;
    }
}

typedef struct tokbuf {
    int32_t v[1024];
    size_t n;
} tokbuf;

static void tb_push(tokbuf *b, int32_t id) {
    if (b->n < sizeof b->v / sizeof b->v[0]) b->v[b->n++] = id;
}
static void tb_text(tokbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        tb_push(b, (unsigned char)s[i]);
}

/* A random sampled turn: mostly well-formed, sometimes corrupted; ends with the stop token
 * unless it was cut (finish length). */
static void rand_turn(arl_rng *r, tokbuf *b) {
    char txt[256];
    b->n = 0;
    if (arl_rng_below(r, 2)) tb_text(b, txt, rand_text(r, txt, 64));
    size_t ncalls = arl_rng_below(r, 4);
    for (size_t j = 0; j < ncalls; j++) {
        tb_push(b, sp(ARL_SPECIAL_TOOL_CALL));
        const char *f = arl_rng_below(r, 10) == 0 ? "" : fnames[arl_rng_below(r, 5)];
        tb_text(b, f, strlen(f));
        tb_push(b, sp(ARL_SPECIAL_TOOL_ARGS));
        uint64_t a = arl_rng_below(r, 10);
        if (a == 0)
            snprintf(txt, sizeof txt, "[1, 2]");
        else if (a == 1)
            snprintf(txt, sizeof txt, "{\"a\": ");
        else
            rand_args(r, txt, sizeof txt);
        tb_text(b, txt, strlen(txt));
        tb_push(b, sp(ARL_SPECIAL_TOOL_CALL_END));
    }
    /* corruption: replace, insert or delete a few tokens (any id but the stop token) */
    if (arl_rng_below(r, 3) == 0) {
        size_t k = 1 + arl_rng_below(r, 3);
        for (size_t q = 0; q < k; q++) {
            int32_t id = (int32_t)arl_rng_below(r, 384);
            if (id == sp(ARL_SPECIAL_END_OF_MSG)) id = sp(ARL_SPECIAL_TOOL_CALL);
            if (arl_rng_below(r, 2)) id = 256 + (int32_t)arl_rng_below(r, 13);
            if (id == sp(ARL_SPECIAL_END_OF_MSG)) id = sp(ARL_SPECIAL_TOOL_ARGS);
            size_t at = b->n ? arl_rng_below(r, b->n) : 0;
            switch (arl_rng_below(r, 3)) {
            case 0:
                if (b->n) b->v[at] = id;
                break;
            case 1:
                if (b->n < 1000) {
                    memmove(b->v + at + 1, b->v + at, (b->n - at) * sizeof *b->v);
                    b->v[at] = id;
                    b->n++;
                }
                break;
            default:
                if (b->n) {
                    memmove(b->v + at, b->v + at + 1, (b->n - at - 1) * sizeof *b->v);
                    b->n--;
                }
            }
        }
    }
    if (arl_rng_below(r, 8) == 0 && b->n)
        b->n = arl_rng_below(r, b->n); /* cut: no stop */
    else
        tb_push(b, sp(ARL_SPECIAL_END_OF_MSG));
}

/* Check the rendering invariants of c: prefixes extend, incremental equals full, loss mask
 * and message index structure. */
static void check_conv(const arl_chat_conv *c) {
    arl_chat_tokens full, part;
    arl_chat_tokens_init(&full);
    arl_chat_tokens_init(&part);
    CHECK(arl_chat_render(&T, c, 0, &full) == ARL_OK);
    /* incremental: preamble, then messages one at a time == full */
    CHECK(arl_chat_render_preamble(&T, c, &part) == ARL_OK);
    for (size_t k = 0; k < c->n_msgs; k++) {
        /* extension property: render(msgs[0..k]) is a prefix of render(msgs[0..k+1]) */
        CHECK(part.n <= full.n && !memcmp(part.ids, full.ids, part.n * sizeof *part.ids));
        CHECK(arl_chat_render_messages(&T, c, k, k + 1, &part) == ARL_OK);
    }
    CHECK(part.n == full.n && !memcmp(part.ids, full.ids, full.n * sizeof *full.ids) &&
          !memcmp(part.mask, full.mask, full.n) &&
          !memcmp(part.msg, full.msg, full.n * sizeof *full.msg));
    /* prefix check through the conversation API too */
    arl_chat_conv pre = *c;
    for (size_t k = 0; k <= c->n_msgs; k++) {
        pre.n_msgs = k; /* a view of the first k messages (no ownership change) */
        int holds = 0;
        CHECK(arl_chat_extends(&T, &pre, c, &holds) == ARL_OK && holds);
    }
    /* mask: 1 exactly on assistant bodies (after the 11-token header), except the
     * <|end_of_msg|> of a length-cut turn; message index non-decreasing */
    size_t i = 0;
    while (i < full.n && full.msg[i] == -1)
        CHECK(full.mask[i++] == 0);
    for (size_t k = 0; k < c->n_msgs; k++) {
        size_t b = i;
        while (i < full.n && full.msg[i] == (int32_t)k)
            i++;
        const arl_chat_message *m = &c->msgs[k];
        CHECK(full.ids[b] == sp(ARL_SPECIAL_OPEN) && full.ids[i - 1] == sp(ARL_SPECIAL_END_OF_MSG));
        for (size_t q = b; q < i; q++) {
            int want =
                m->role == ARL_CHAT_ASSISTANT && q >= b + 11 && !(m->finish_length && q == i - 1);
            CHECK_MSG(full.mask[q] == want, "message %zu token %zu: mask %d", k, q - b,
                      full.mask[q]);
        }
    }
    CHECK_EQ_INT(i, full.n);
    arl_chat_tokens_free(&full);
    arl_chat_tokens_free(&part);
}

/* A rollout simulation: the context stream C grows by generation prompt + sampled turn +
 * template additions + observations; after every step the extension check must hold. */
static void test_extension_random(void) {
    arl_rng r;
    arl_rng_seed(&r, 20240601);
    int n_conv = 300, checked_turns = 0, checked_breaks = 0;
    int seen_status[7] = {0}, seen_finish[3] = {0};
    for (int it = 0; it < n_conv; it++) {
        arl_chat_conv c;
        arl_chat_conv_init(&c);
        if (arl_rng_below(&r, 2)) {
            char tools[512];
            snprintf(tools, sizeof tools,
                     "[{\"type\":\"function\",\"function\":{\"name\":\"%s\",\"description\":\"d\","
                     "\"parameters\":{\"type\":\"object\",\"properties\":{\"q\":{\"type\":"
                     "\"string\"}}}}},"
                     "{\"type\":\"function\",\"function\":{\"name\":\"calc\"}}]",
                     fnames[arl_rng_below(&r, 3)]);
            CHECK(arl_chat_conv_set_tools_json(&c, tools, strlen(tools)) == ARL_OK);
        }
        char txt[256];
        if (arl_rng_below(&r, 2))
            CHECK(arl_chat_conv_add_text(&c, ARL_CHAT_SYSTEM, txt, rand_text(&r, txt, 64)) ==
                  ARL_OK);
        CHECK(arl_chat_conv_add_text(&c, ARL_CHAT_USER, txt, rand_text(&r, txt, 64)) == ARL_OK);
        if (arl_rng_below(&r, 3) == 0)
            CHECK(arl_chat_conv_add_part_image(&c, 14 + (int32_t)arl_rng_below(&r, 200),
                                               14 + (int32_t)arl_rng_below(&r, 200)) == ARL_OK);
        arl_chat_tokens ctx;
        arl_chat_tokens_init(&ctx);
        CHECK(arl_chat_render(&T, &c, 1, &ctx) == ARL_OK);
        size_t steps = 1 + arl_rng_below(&r, 5);
        for (size_t step = 1; step <= steps; step++) {
            size_t before = c.n_msgs;
            tokbuf b;
            if (arl_rng_below(&r, 5) == 0) {
                /* an assistant message built through the C API (well-formed calls) */
                size_t tl = rand_text(&r, txt, 64);
                CHECK(arl_chat_conv_add_text(&c, ARL_CHAT_ASSISTANT, txt, tl) == ARL_OK);
                size_t nc = arl_rng_below(&r, 3);
                for (size_t j = 0; j < nc; j++) {
                    char id[32], args[128];
                    snprintf(id, sizeof id, "call_%zu_%zu", step, j);
                    rand_args(&r, args, sizeof args);
                    CHECK(arl_chat_conv_add_call(&c, id, fnames[j], args, strlen(args)) == ARL_OK);
                }
                /* its rendering parses back to the same content and calls */
                arl_chat_tokens one;
                arl_chat_tokens_init(&one);
                CHECK(arl_chat_render_messages(&T, &c, before, before + 1, &one) == ARL_OK);
                arl_chat_turn turn;
                CHECK(arl_chat_parse_tool_calls(&T, one.ids + 11, one.n - 11, (int64_t)step, NULL,
                                                &turn) == ARL_OK);
                const arl_chat_message *m = &c.msgs[before];
                CHECK(turn.content_len == tl && !memcmp(turn.content, txt, tl));
                CHECK(turn.n_calls == m->n_calls);
                CHECK(turn.status == (nc ? OK : NOC));
                for (size_t j = 0; j < turn.n_calls && j < m->n_calls; j++) {
                    CHECK(turn.calls[j].status == OK);
                    CHECK_STR_EQ(turn.calls[j].id, m->calls[j].id);
                    CHECK_STR_EQ(turn.calls[j].name, m->calls[j].name);
                    CHECK_STR_EQ(turn.calls[j].arguments, m->calls[j].arguments);
                }
                arl_chat_turn_free(&turn);
                /* for the stream, the sampled tokens are the message body */
                b.n = 0;
                for (size_t q = 11; q < one.n; q++)
                    tb_push(&b, one.ids[q]);
                arl_chat_tokens_free(&one);
            } else {
                rand_turn(&r, &b);
                arl_chat_turn turn;
                CHECK(arl_chat_parse_tool_calls(&T, b.v, b.n, (int64_t)step, &c, &turn) == ARL_OK);
                seen_status[turn.status]++;
                seen_finish[turn.finish]++;
                arl_status s = arl_chat_conv_add_turn(&c, &T, &turn);
                CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
                arl_chat_turn_free(&turn);
            }
            checked_turns++;
            /* the stream: the sampled tokens follow the generation prompt verbatim */
            size_t ctx_before = ctx.n;
            for (size_t q = 0; q < b.n; q++)
                CHECK(push_ok(&ctx, b.v[q]));
            int holds = 0;
            size_t mis = 0;
            /* before the observation: rendering of c (no gen prompt needed: ctx ends with the
             * turn, which the rendering + gen prompt covers as a prefix) */
            CHECK(arl_chat_check_extension(&T, &c, ctx.ids, ctx.n, &holds, &mis) == ARL_OK);
            CHECK_MSG(holds,
                      "conversation %d step %zu: sampled turn not reproduced (mismatch at %zu)", it,
                      step, mis);
            /* the observation: one tool result per block, in order, sometimes a user message */
            const arl_chat_message *am = &c.msgs[before];
            size_t nb = am->n_calls;
            for (size_t j = 0; j < nb; j++) {
                const arl_chat_call *k = &c.msgs[before].calls[j];
                size_t tl = rand_text(&r, txt, 64);
                const char *code = k->status != OK             ? "TOOL_PARSE_ERROR"
                                   : arl_rng_below(&r, 4) == 0 ? "TOOL_RUNTIME_ERROR"
                                                               : NULL;
                char id[64];
                snprintf(id, sizeof id, "%s", k->id);
                CHECK(arl_chat_conv_add_tool_result(&c, id, txt, tl, code) == ARL_OK);
                if (arl_rng_below(&r, 4) == 0)
                    CHECK(arl_chat_conv_add_part_image(&c, 28 + (int32_t)arl_rng_below(&r, 100),
                                                       28) == ARL_OK);
            }
            if (!nb || arl_rng_below(&r, 3) == 0)
                CHECK(arl_chat_conv_add_text(&c, ARL_CHAT_USER, txt, rand_text(&r, txt, 32)) ==
                      ARL_OK);
            /* e = what the template appends: rendered incrementally */
            arl_chat_tokens e;
            arl_chat_tokens_init(&e);
            if (c.msgs[before].finish_length) CHECK(push_ok(&e, sp(ARL_SPECIAL_END_OF_MSG)));
            CHECK(arl_chat_render_messages(&T, &c, before + 1, c.n_msgs, &e) == ARL_OK);
            CHECK(arl_chat_render_gen_prompt(&T, &c, &e) == ARL_OK);
            for (size_t q = 0; q < e.n; q++)
                CHECK(push_ok(&ctx, e.ids[q]));
            arl_chat_tokens_free(&e);
            /* the full check of spec/objective.md §3.2 rule 5 */
            CHECK(arl_chat_check_extension(&T, &c, ctx.ids, ctx.n, &holds, &mis) == ARL_OK);
            CHECK_MSG(holds, "conversation %d step %zu: extension fails at %zu", it, step, mis);
            /* and the stream equals the full rendering exactly */
            arl_chat_tokens full;
            arl_chat_tokens_init(&full);
            CHECK(arl_chat_render(&T, &c, 1, &full) == ARL_OK);
            CHECK(full.n == ctx.n && !memcmp(full.ids, ctx.ids, ctx.n * sizeof *ctx.ids));
            /* the sampled tokens carry mask 1 in the rendering */
            for (size_t q = ctx_before; q < ctx_before + b.n; q++)
                CHECK(full.mask[q] == 1);
            arl_chat_tokens_free(&full);
        }
        check_conv(&c);
        /* template break: the same messages under another tool set */
        arl_chat_conv d;
        arl_chat_conv_init(&d);
        const char *tools2 = "[{\"type\":\"function\",\"function\":{\"name\":\"other\"}}]";
        CHECK(arl_chat_conv_set_tools_json(&d, tools2, strlen(tools2)) == ARL_OK);
        int holds = 1;
        arl_chat_conv d_view = c; /* c's messages under another tool set (a view, not owned) */
        d_view.tools_json = d.tools_json;
        d_view.tools_len = d.tools_len;
        CHECK(arl_chat_extends(&T, &c, &d_view, &holds) == ARL_OK && !holds);
        CHECK(arl_chat_check_extension(&T, &d_view, ctx.ids, ctx.n, &holds, NULL) == ARL_OK &&
              !holds);
        checked_breaks++;
        arl_chat_conv_free(&d);
        arl_chat_tokens_free(&ctx);
        arl_chat_conv_free(&c);
    }
    CHECK(checked_turns > n_conv);
    /* the generator reaches every turn status and finish reason, so the property is tested on
     * malformed and cut turns too */
    for (int i = 0; i < 7; i++)
        CHECK_MSG(seen_status[i] > 0, "no random turn with status %s",
                  arl_chat_parse_status_str((arl_chat_parse_status)i));
    for (int i = 0; i < 3; i++)
        CHECK_MSG(seen_finish[i] > 0, "no random turn with finish %s",
                  arl_chat_finish_str((arl_chat_finish)i));
    fprintf(stderr, "  %d conversations, %d assistant turns, %d template breaks checked\n", n_conv,
            checked_turns, checked_breaks);
}

/* A changed system prompt is a template break; appending is not. */
static void test_template_break(void) {
    arl_chat_conv a, b;
    arl_chat_conv_init(&a);
    arl_chat_conv_init(&b);
    CHECK(arl_chat_conv_add_text(&a, ARL_CHAT_SYSTEM, "You are A.", 10) == ARL_OK);
    CHECK(arl_chat_conv_add_text(&a, ARL_CHAT_USER, "hi", 2) == ARL_OK);
    CHECK(arl_chat_conv_add_text(&b, ARL_CHAT_SYSTEM, "You are B.", 10) == ARL_OK);
    CHECK(arl_chat_conv_add_text(&b, ARL_CHAT_USER, "hi", 2) == ARL_OK);
    CHECK(arl_chat_conv_add_text(&b, ARL_CHAT_ASSISTANT, "yo", 2) == ARL_OK);
    int holds = 1;
    CHECK(arl_chat_extends(&T, &a, &b, &holds) == ARL_OK && !holds);
    arl_chat_conv_truncate(&b, 0);
    CHECK(arl_chat_conv_add_text(&b, ARL_CHAT_SYSTEM, "You are A.", 10) == ARL_OK);
    CHECK(arl_chat_conv_add_text(&b, ARL_CHAT_USER, "hi", 2) == ARL_OK);
    CHECK(arl_chat_conv_add_text(&b, ARL_CHAT_ASSISTANT, "yo", 2) == ARL_OK);
    CHECK(arl_chat_extends(&T, &a, &b, &holds) == ARL_OK && holds);
    /* adding tools to a conversation that had none breaks */
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]";
    CHECK(arl_chat_conv_set_tools_json(&b, tools, strlen(tools)) == ARL_OK);
    CHECK(arl_chat_extends(&T, &a, &b, &holds) == ARL_OK && !holds);
    /* an empty tool array is no tools turn */
    CHECK(arl_chat_conv_set_tools_json(&b, "[]", 2) == ARL_OK);
    CHECK(b.tools_json == NULL);
    CHECK(arl_chat_extends(&T, &a, &b, &holds) == ARL_OK && holds);
    /* mismatch position of the full check */
    arl_chat_tokens ra;
    arl_chat_tokens_init(&ra);
    CHECK(arl_chat_render(&T, &a, 1, &ra) == ARL_OK);
    ra.ids[5] = 'X';
    size_t mis = 0;
    CHECK(arl_chat_check_extension(&T, &a, ra.ids, ra.n, &holds, &mis) == ARL_OK);
    CHECK(!holds && mis == 5);
    arl_chat_tokens_free(&ra);
    arl_chat_conv_free(&a);
    arl_chat_conv_free(&b);
}

int main(void) {
    arl_chat_template_default(&T);
    TEST_RUN(test_golden);
    TEST_RUN(test_image_tokens);
    TEST_RUN(test_errors);
    TEST_RUN(test_json_variants);
    TEST_RUN(test_parser_cases);
    TEST_RUN(test_parser_more);
    TEST_RUN(test_extension_random);
    TEST_RUN(test_template_break);
    return test_finish();
}
