/* cli/cmd_tokenize.c: `agentrl tokenize`: render a conversation JSON file with the chat
 * template (docs/chat_template.md) as text, ids or a per-token table with loss mask and message
 * index; decode ids; parse a sampled assistant turn into tool calls. */
#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/file.h"
#include "core/json_dump.h"
#include "policy/chat.h"
#include "policy/tokenizer.h"

typedef struct tokenize_opts {
    char *conv;
    char *decode;
    char *parse;
    int ids;
    int mask;
    int gen;
    int skip_special;
    int64_t patch_size;
    int64_t max_patches;
    int64_t step;
    int64_t line;
} tokenize_opts;

static const arl_option tokenize_tab[] = {
    {"conv", ARL_OPT_STRING, offsetof(tokenize_opts, conv), NULL,
     "conversation JSON: an array of messages or {\"tools\": [...], \"messages\": [...]}", 0, 0,
     NULL, ARL_OPT_POSITIONAL, "CONV"},
    {"decode", ARL_OPT_STRING, offsetof(tokenize_opts, decode), NULL,
     "decode token ids instead (separated by spaces or commas), e.g. \"256 262 117\"", 0, 0, NULL,
     0, "IDS"},
    {"parse", ARL_OPT_STRING, offsetof(tokenize_opts, parse), NULL,
     "parse a sampled assistant turn given as text with special names and print its tool calls "
     "as JSON",
     0, 0, NULL, 0, "TEXT"},
    {"ids", ARL_OPT_BOOL, offsetof(tokenize_opts, ids), "false",
     "print the rendering as token ids (one line)", 0, 0, NULL, 0, NULL},
    {"mask", ARL_OPT_BOOL, offsetof(tokenize_opts, mask), "false",
     "print one line per token: position, id, loss mask, message index, token", 0, 0, NULL, 0,
     NULL},
    {"gen", ARL_OPT_BOOL, offsetof(tokenize_opts, gen), "false",
     "append the generation prompt <|open|>assistant<|close|>", 0, 0, NULL, 0, NULL},
    {"skip-special", ARL_OPT_BOOL, offsetof(tokenize_opts, skip_special), "false",
     "--decode: leave special tokens out", 0, 0, NULL, 0, NULL},
    {"patch-size", ARL_OPT_INT, offsetof(tokenize_opts, patch_size), "14",
     "vision patch size in pixels (0: text-only model, images are rejected)", 0, 4096, NULL, 0,
     "P"},
    {"max-patches", ARL_OPT_INT, offsetof(tokenize_opts, max_patches), "16384",
     "cap on the patch grid of one image", 4, 1 << 30, NULL, 0, "N"},
    {"line", ARL_OPT_INT, offsetof(tokenize_opts, line), "0",
     "CONV is JSON Lines (SFT data, env demos): render its line N (1-based; 0: CONV is one "
     "conversation)",
     0, 1e15, NULL, 0, "N"},
    {"step", ARL_OPT_INT, offsetof(tokenize_opts, step), "1",
     "--parse: step index used in the call ids call_<step>_<n>", 0, 1e15, NULL, 0, "K"},
};
#define TOKENIZE_N ARL_OPTIONS_COUNT(tokenize_tab)

static const char *tokenize_usage =
    "agentrl tokenize CONV [--line N] [--ids | --mask] [--gen] [--patch-size P] [--max-patches N] "
    "| --decode IDS [--skip-special] | --parse TEXT [--step K]";
static const char *tokenize_summary =
    "Render a conversation with the chat/tool template (docs/chat_template.md), decode token "
    "ids, or parse an assistant turn's tool calls.";

/* one token for the --mask table: a byte as itself when printable, else \xNN; a special by name */
static void print_token(const arl_tokenizer_spec *s, int32_t id) {
    if (id >= 256) {
        int k = arl_tokenizer_special_of(s, id);
        if (k >= 0)
            fputs(arl_tokenizer_special_name((arl_special)k), stdout);
        else
            printf("<|reserved_%d|>", id);
    } else if (id >= 0x21 && id < 0x7f) {
        putchar(id);
    } else {
        printf("\\x%02x", id);
    }
}

static int tokenize_decode(const arl_chat_template *t, const tokenize_opts *o) {
    size_t cap = strlen(o->decode) / 2 + 1, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return cli_fail(arl_errorf(ARL_ERR_NOMEM, "out of memory"));
    const char *p = o->decode;
    while (*p) {
        if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
            p++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < INT32_MIN || v > INT32_MAX) {
            free(ids);
            return cli_fail(arl_errorf(ARL_ERR_ARG, "--decode: '%.20s' is not a token id", p));
        }
        ids[n++] = (int32_t)v;
        p = end;
    }
    if (n == 0) {
        free(ids);
        return cli_fail(arl_errorf(ARL_ERR_ARG, "--decode: no token ids given"));
    }
    char *text;
    size_t len;
    arl_status s = arl_tokenizer_decode(&t->tok, ids, n,
                                        o->skip_special ? ARL_DECODE_SKIP_SPECIAL : 0, &text, &len);
    free(ids);
    if (s) /* (an id outside the vocabulary is a bad argument: exit 2, as a malformed one) */
        return cli_fail(s == ARL_ERR_RANGE ? arl_error_prefix(ARL_ERR_ARG, "--decode")
                                           : arl_error_prefix(s, "--decode"));
    fwrite(text, 1, len, stdout);
    putchar('\n');
    free(text);
    return ARL_EXIT_OK;
}

/* A JSON string of text[0..len): as it is when it is valid UTF-8, else with every invalid byte
 * as U+FFFD (a sampled turn can hold any bytes, and JSON text cannot).  NULL: out of memory. */
static json_t *json_text(const arl_chat_template *t, const char *text, size_t len) {
    if (arl_utf8_valid(text, len)) return json_stringn_nocheck(text, len);
    int32_t *ids = malloc(sizeof *ids * (len ? len : 1));
    char *fixed = NULL;
    size_t n = 0;
    json_t *j = NULL;
    if (ids) {
        arl_tokenizer_encode(text, len, ids);
        if (!arl_tokenizer_decode(&t->tok, ids, len, ARL_DECODE_UTF8_REPLACE, &fixed, &n))
            j = json_stringn_nocheck(fixed, n);
    }
    free(ids);
    free(fixed);
    return j;
}

static int tokenize_parse(const arl_chat_template *t, const tokenize_opts *o) {
    arl_chat_turn turn;
    arl_status s =
        arl_chat_parse_tool_calls_text(t, o->parse, strlen(o->parse), o->step, NULL, &turn);
    if (s) return cli_fail(s);
    json_t *root = json_object();
    json_t *calls = json_array();
    json_object_set_new(root, "content", json_text(t, turn.content, turn.content_len));
    json_object_set_new(root, "parse_status", json_string(arl_chat_parse_status_str(turn.status)));
    json_object_set_new(root, "finish_reason", json_string(arl_chat_finish_str(turn.finish)));
    for (size_t j = 0; j < turn.n_calls; j++) {
        const arl_chat_call *k = &turn.calls[j];
        json_t *c = json_object();
        json_object_set_new(c, "id", json_string(k->id));
        json_object_set_new(c, "status", json_string(arl_chat_parse_status_str(k->status)));
        json_object_set_new(c, "name", k->name ? json_text(t, k->name, k->name_len) : json_null());
        if (k->arguments)
            json_object_set_new(c, "arguments", json_text(t, k->arguments, k->arguments_len));
        if (k->message)
            json_object_set_new(c, "message", json_text(t, k->message, strlen(k->message)));
        json_array_append_new(calls, c);
    }
    json_object_set_new(root, "calls", calls);
    char *out = arl_json_dumps(root, JSON_INDENT(2));
    if (out) puts(out);
    free(out);
    json_decref(root);
    arl_chat_turn_free(&turn);
    return out ? ARL_EXIT_OK : cli_fail(arl_errorf(ARL_ERR_NOMEM, "--parse: out of memory"));
}

/* How errors name the conversation of path (line > 0: its line `line`): "conv.json line 3". */
static void conv_where(char *where, size_t cap, const char *path, int64_t line) {
    if (line > 0)
        snprintf(where, cap, "%s line %lld", path, (long long)line);
    else
        snprintf(where, cap, "%s", path);
}

/* The conversation of path (line > 0: its line `line`, JSON Lines) into c.  A whole file that
 * does not parse but holds several lines of JSON values is named as JSON Lines. */
static arl_status conv_load(arl_chat_conv *c, const arl_chat_template *t, const char *path,
                            int64_t line) {
    char *buf;
    size_t n;
    ARL_TRY(arl_file_read(path, 0, &buf, &n));
    const char *start = buf;
    size_t len = n;
    int64_t lines = 0, objects = 0; /* lines, and lines that open a JSON object or array */
    for (size_t i = 0; i < n;) {
        const char *e = memchr(buf + i, '\n', n - i);
        const size_t end = e ? (size_t)(e - buf) : n;
        lines++;
        size_t k = i;
        while (k < end && (buf[k] == ' ' || buf[k] == '\t' || buf[k] == '\r'))
            k++;
        objects += k < end && (buf[k] == '{' || buf[k] == '[');
        if (lines == line) {
            start = buf + i;
            len = end - i;
        }
        i = end + 1;
    }
    arl_status s;
    char where[4200];
    if (line > lines) {
        s = arl_errorf(ARL_ERR_RANGE, "%s: --line %lld, but it has %lld lines", path,
                       (long long)line, (long long)lines);
    } else {
        conv_where(where, sizeof where, path, line);
        s = arl_chat_conv_from_json(c, t, start, len, where);
        if (s == ARL_ERR_FORMAT && line == 0 && objects > 1)
            s = arl_error_prefix(s,
                                 "%s holds %lld lines of JSON (JSON Lines?): render "
                                 "one with --line N",
                                 path, (long long)lines);
    }
    free(buf);
    return s;
}

int cmd_tokenize(int argc, char **argv) {
    tokenize_opts o;
    int rc = cli_parse(tokenize_tab, TOKENIZE_N, argc, argv, &o, tokenize_usage, tokenize_summary);
    if (rc) return rc < 0 ? ARL_EXIT_OK : rc;
    arl_chat_template t;
    arl_chat_template_default(&t);
    /* (the image options given: other than the template's defaults, which their table's are) */
    const int image_opts = o.patch_size != t.patch_size || o.max_patches != t.image_max_patches;
    t.patch_size = (int32_t)o.patch_size;
    t.image_max_patches = o.max_patches;
    int modes = !!o.conv + !!o.decode + !!o.parse;
    if (modes != 1) {
        fprintf(stderr,
                "agentrl: error: give exactly one of CONV, --decode or --parse\nusage: %s\n",
                tokenize_usage);
        arl_options_free(tokenize_tab, TOKENIZE_N, &o);
        return ARL_EXIT_USAGE;
    }
    /* the options of one mode given in another were ignored: say so (an option is given when
     * its value is not its default) */
    const char *misplaced = NULL;
    if (o.ids && o.mask)
        misplaced = "--ids and --mask: give one of them";
    else if (!o.conv && (o.ids || o.mask || o.gen || o.line))
        misplaced = "--ids, --mask, --gen and --line go with CONV";
    else if (!o.conv && image_opts)
        misplaced = "--patch-size and --max-patches go with CONV";
    else if (!o.decode && o.skip_special)
        misplaced = "--skip-special goes with --decode";
    else if (!o.parse && o.step != 1)
        misplaced = "--step goes with --parse";
    if (misplaced) {
        fprintf(stderr, "agentrl: error: %s\nusage: %s\n", misplaced, tokenize_usage);
        arl_options_free(tokenize_tab, TOKENIZE_N, &o);
        return ARL_EXIT_USAGE;
    }
    if (o.decode)
        rc = tokenize_decode(&t, &o);
    else if (o.parse)
        rc = tokenize_parse(&t, &o);
    else {
        arl_chat_conv c;
        arl_chat_conv_init(&c);
        arl_chat_tokens r;
        arl_chat_tokens_init(&r);
        arl_status s = conv_load(&c, &t, o.conv, o.line);
        if (!s) {
            /* a rendering error ("message 0 (user): content[0]: image input, but ...") names
             * the file first, as conv_load's do (docs/chat_template.md section 8) */
            s = arl_chat_render(&t, &c, o.gen, &r);
            if (s) {
                char where[4200];
                conv_where(where, sizeof where, o.conv, o.line);
                arl_error_prefix(s, "%s", where);
            }
        }
        if (s) {
            rc = cli_fail(s);
        } else if (o.mask) {
            printf("# pos id mask msg token\n");
            for (size_t i = 0; i < r.n; i++) {
                printf("%zu %d %d %d ", i, r.ids[i], r.mask[i], r.msg[i]);
                print_token(&t.tok, r.ids[i]);
                putchar('\n');
            }
        } else if (o.ids) {
            for (size_t i = 0; i < r.n; i++)
                printf(i ? " %d" : "%d", r.ids[i]);
            putchar('\n');
        } else {
            char *text;
            size_t len;
            s = arl_tokenizer_decode(&t.tok, r.ids, r.n, 0, &text, &len);
            if (s)
                rc = cli_fail(s);
            else {
                fwrite(text, 1, len, stdout);
                putchar('\n');
                free(text);
            }
        }
        if (!s && !o.mask && !o.ids) {
            size_t gen_tokens = 0;
            for (size_t i = 0; i < r.n; i++)
                gen_tokens += r.mask[i];
            cli_say("%zu messages, %zu tokens, %zu with loss mask 1\n", c.n_msgs, r.n, gen_tokens);
        }
        arl_chat_tokens_free(&r);
        arl_chat_conv_free(&c);
    }
    arl_options_free(tokenize_tab, TOKENIZE_N, &o);
    return rc;
}
