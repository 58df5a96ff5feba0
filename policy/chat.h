/* policy/chat.h: the chat/tool template of agentrl: conversations (OpenAI-style messages,
 * spec/aep.md §4.1-4.4) rendered to token ids with a loss mask and a message index per
 * token, the generation prompt and stop token, the tool-call parser that inverts the
 * rendering of an assistant turn (parse statuses of spec/aep.md §4.6), and the extension
 * check of spec/objective.md §3.2 rule 5.
 *
 * The exact token format is written down in docs/chat_template.md; this header is the API.
 * In short:
 *
 *   <|bos|> [<|open|>system<|sep|>tools<|close|>TOOLS_JSON<|end_of_msg|>]
 *   <|open|>ROLE<|close|>CONTENT<|end_of_msg|>                           system, user
 *   <|open|>assistant<|close|>CONTENT{<|tool_call|>NAME<|tool_args|>ARGS<|tool_call_end|>}<|end_of_msg|>
 *   <|open|>tool<|sep|>NAME<|sep|>CALL_ID[<|sep|>ERROR_CODE]<|close|>CONTENT<|end_of_msg|>
 *   image: <|media_begin|> N x <|media_pad|> <|media_end|>
 *
 * Every message renders from itself and the messages before it only, so appending messages
 * appends tokens (the extension property); an assistant turn parsed from sampled ids renders
 * back to exactly those ids.
 *
 * Not here: sampling, the AEP action JSON (rollout/), image decoding (policy/image.h).
 *
 * Symbols: n number of tokens, V vocabulary size.
 */
#ifndef ARL_POLICY_CHAT_H
#define ARL_POLICY_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "policy/tokenizer.h"

struct json_t; /* jansson */

/* ---- template ---- */

typedef struct arl_chat_template {
    arl_tokenizer_spec tok;    /* vocabulary and special ids */
    int32_t patch_size;        /* vision patch size p in pixels; 0 = text-only model (images
                                  are rejected: "the model has no vision tower") */
    int64_t image_max_patches; /* cap on gh*gw per image (arl_image_grid); >= 4 */
} arl_chat_template;

/* Byte-level ids (arl_tokenizer_spec_default), patch_size 14, image_max_patches 16384
 * (at most 4096 <|media_pad|> per image). */
void arl_chat_template_default(arl_chat_template *t);

/* ---- conversation ---- */

typedef enum arl_chat_role {
    ARL_CHAT_SYSTEM = 0,
    ARL_CHAT_USER,
    ARL_CHAT_ASSISTANT,
    ARL_CHAT_TOOL,
} arl_chat_role;

/* "system", "user", "assistant", "tool". */
const char *arl_chat_role_str(arl_chat_role r);

/* Parse statuses of spec/aep.md §4.6 (closed set; strings as in Appendix B).  A block gets
 * OK or one of the failures; a turn also NO_TOOL_CALL. */
typedef enum arl_chat_parse_status {
    ARL_CHAT_PARSE_OK = 0,
    ARL_CHAT_PARSE_NO_TOOL_CALL,
    ARL_CHAT_PARSE_INVALID_JSON,
    ARL_CHAT_PARSE_ARGUMENTS_NOT_OBJECT,
    ARL_CHAT_PARSE_MISSING_NAME,
    ARL_CHAT_PARSE_UNCLOSED_BLOCK,
    ARL_CHAT_PARSE_MALFORMED_STRUCTURE,
} arl_chat_parse_status;

/* "ok", "no_tool_call", "invalid_json", ... */
const char *arl_chat_parse_status_str(arl_chat_parse_status s);
/* Inverse of arl_chat_parse_status_str; -1 for an unknown string. */
int arl_chat_parse_status_from_str(const char *s);

typedef enum arl_chat_finish {
    ARL_CHAT_FINISH_STOP = 0,   /* <|end_of_msg|> sampled, last block not a closed call */
    ARL_CHAT_FINISH_TOOL_CALLS, /* <|end_of_msg|> sampled right after a closed call block */
    ARL_CHAT_FINISH_LENGTH,     /* no stop token: the per-turn cap was reached */
} arl_chat_finish;

/* "stop", "tool_calls", "length" (spec/aep.md §4.5 finish_reason). */
const char *arl_chat_finish_str(arl_chat_finish f);

/* A content part: text bytes or an image of a given pixel size. */
typedef struct arl_chat_part {
    int is_image;          /* 0 text, 1 image */
    char *text;            /* text: bytes, owned, NUL-terminated; NULL for an image */
    size_t len;            /* text: length in bytes (may contain NUL and non-UTF-8 bytes) */
    int32_t width, height; /* image: size in pixels, >= 1 */
} arl_chat_part;

/* One tool-call block of an assistant turn.  OK blocks render canonically from name and
 * arguments; failed blocks render their exact tokens `raw`. */
typedef struct arl_chat_call {
    char *id;                     /* "call_<step>_<n>", owned, NUL-terminated */
    arl_chat_parse_status status; /* OK or a block failure (never NO_TOOL_CALL) */
    char *name;                   /* function name, owned; NULL when absent or unreadable */
    size_t name_len;
    char *arguments; /* OK: exact JSON text of the object, owned; else NULL */
    size_t arguments_len;
    int32_t *raw; /* failed: the block's exact tokens (n_raw), owned; else NULL */
    size_t n_raw;
    char *message;  /* failed: why (<= 512 bytes), owned; NULL for OK */
    int known_tool; /* parser: 1 name in the tool set, 0 not, -1 no set given */
} arl_chat_call;

typedef struct arl_chat_message {
    arl_chat_role role;
    arl_chat_part *parts; /* (n_parts) content, owned; a string content is one text part */
    size_t n_parts;
    arl_chat_call *calls; /* (n_calls) assistant: blocks in order of appearance, owned */
    size_t n_calls;
    int finish_length;  /* assistant: the turn was cut by the token cap; the template
                           appends <|end_of_msg|> with loss mask 0 */
    char *tool_call_id; /* tool: the call answered, owned */
    char *tool_name;    /* tool: name of that call (resolved when added; "" if none) */
    char *error_code;   /* tool: error code when is_error, owned; NULL otherwise */
} arl_chat_message;

/* A conversation since its last fresh start: the tool set and the messages.  Owns all its
 * memory; valid until arl_chat_conv_free. */
typedef struct arl_chat_conv {
    char *tools_json; /* compact JSON array of tool definitions, owned; NULL: none */
    size_t tools_len;
    char **tool_names; /* (n_tools) function names of tools_json, owned */
    size_t n_tools;
    arl_chat_message *msgs; /* (n_msgs) owned */
    size_t n_msgs, cap_msgs;
} arl_chat_conv;

void arl_chat_conv_init(arl_chat_conv *c);
void arl_chat_conv_free(arl_chat_conv *c); /* NULL-safe; leaves c initialised and empty */

/* Set (or with text NULL or "null" clear) the tool set from the JSON text of an array of
 * OpenAI function tools (spec/aep.md §4.4).  Stored as its compact serialisation.  Errors
 * name the tool index and field.  Changing the tools of a conversation that already has a
 * rendering breaks the extension property (a template break). */
arl_status arl_chat_conv_set_tools_json(arl_chat_conv *c, const char *text, size_t len);

/* 1 if `name` is a function of the tool set, else 0. */
int arl_chat_conv_has_tool(const arl_chat_conv *c, const char *name, size_t len);

/* Append one message given as a JSON object (spec/aep.md §4.1, OpenAI format, plus the
 * replay export's `parse_errors` and `finish_reason` on assistant messages; see
 * docs/chat_template.md).  Validated against the messages already present: errors name the
 * message index and field.  On error the conversation is unchanged.  t supplies the special
 * ids for the `raw` text of failed blocks (read with arl_tokenizer_encode_special). */
arl_status arl_chat_conv_add_json(arl_chat_conv *c, const arl_chat_template *t,
                                  const struct json_t *msg);
arl_status arl_chat_conv_add_json_text(arl_chat_conv *c, const arl_chat_template *t,
                                       const char *text, size_t len);

/* Load a conversation from JSON text: either an array of messages, or an object with
 * "messages" (array) and optional "tools" (array or null); other members are ignored.
 * `where` (a file name) prefixes error messages.  c must be empty (freshly initialised). */
arl_status arl_chat_conv_from_json(arl_chat_conv *c, const arl_chat_template *t, const char *text,
                                   size_t len, const char *where);
arl_status arl_chat_conv_load(arl_chat_conv *c, const arl_chat_template *t, const char *path);

/* C builders (rollout).  Text is bytes, copied. */
arl_status arl_chat_conv_add_text(arl_chat_conv *c, arl_chat_role role, const char *text,
                                  size_t len);
/* Append a tool result answering call `call_id` of an earlier assistant message;
 * error_code NULL for a successful call, else the spec/aep.md §4.7 code (is_error). */
arl_status arl_chat_conv_add_tool_result(arl_chat_conv *c, const char *call_id, const char *text,
                                         size_t len, const char *error_code);
/* Append a text / image part to the last message (images: user and tool messages only). */
arl_status arl_chat_conv_add_part_text(arl_chat_conv *c, const char *text, size_t len);
arl_status arl_chat_conv_add_part_image(arl_chat_conv *c, int32_t width, int32_t height);
/* Append a well-formed call to the last message, which must be an assistant message.
 * `arguments` must be the JSON text of an object (rendered verbatim). */
arl_status arl_chat_conv_add_call(arl_chat_conv *c, const char *id, const char *name,
                                  const char *arguments, size_t arguments_len);

/* Drop messages from index n on (n <= n_msgs). */
void arl_chat_conv_truncate(arl_chat_conv *c, size_t n);

/* ---- rendering ---- */

/* Rendered tokens.  All three arrays have n valid entries; memory owned, freed by
 * arl_chat_tokens_free. */
typedef struct arl_chat_tokens {
    int32_t *ids;  /* (n) token ids */
    uint8_t *mask; /* (n) loss mask: 1 on assistant-generated tokens, else 0 */
    int32_t *msg;  /* (n) message index; -1 for the preamble (<|bos|>, tools turn);
                      n_msgs for the generation prompt */
    size_t n, cap;
} arl_chat_tokens;

void arl_chat_tokens_init(arl_chat_tokens *t);
void arl_chat_tokens_free(arl_chat_tokens *t);  /* NULL-safe; leaves t initialised, empty */
void arl_chat_tokens_clear(arl_chat_tokens *t); /* n = 0, memory kept */

/* Every render function APPENDS to out. */

/* <|bos|> and, when the conversation has tools, the tools turn. */
arl_status arl_chat_render_preamble(const arl_chat_template *t, const arl_chat_conv *c,
                                    arl_chat_tokens *out);
/* Messages [first, last) of c (incremental rendering: rendering [0, k) then [k, n) gives the
 * same tokens as [0, n)). */
arl_status arl_chat_render_messages(const arl_chat_template *t, const arl_chat_conv *c,
                                    size_t first, size_t last, arl_chat_tokens *out);
/* The assistant header <|open|>assistant<|close|> that starts generation (mask 0). */
arl_status arl_chat_render_gen_prompt(const arl_chat_template *t, const arl_chat_conv *c,
                                      arl_chat_tokens *out);
/* Preamble + all messages (+ the generation prompt when gen_prompt is non-zero). */
arl_status arl_chat_render(const arl_chat_template *t, const arl_chat_conv *c, int gen_prompt,
                           arl_chat_tokens *out);

/* Stop tokens of an assistant turn: writes them to stop[0..] (capacity 4) and returns their
 * number.  With this template: one, <|end_of_msg|>. */
size_t arl_chat_stop_tokens(const arl_chat_template *t, int32_t stop[4]);

/* Number of <|media_pad|> placeholders of a width x height image: N = (gh/2)*(gw/2) with the
 * patch grid of arl_image_grid (policy/image.h).  ARL_ERR_UNSUPPORTED for a text-only
 * template, ARL_ERR_ARG for a bad size. */
arl_status arl_chat_image_tokens(const arl_chat_template *t, int32_t width, int32_t height,
                                 int64_t *n);

/* ---- tool-call parser ---- */

/* One parsed assistant turn. */
typedef struct arl_chat_turn {
    char *content; /* bytes before the first block, owned, NUL-terminated;
                      raw bytes (may be invalid UTF-8) */
    size_t content_len;
    arl_chat_call *calls; /* (n_calls) every block in order, owned */
    size_t n_calls;
    arl_chat_parse_status status; /* turn status of spec/aep.md §4.6 */
    arl_chat_finish finish;
    size_t n_tokens; /* tokens parsed (the sampled turn, stop token included) */
} arl_chat_turn;

/* Parse the sampled tokens of one assistant turn: everything after the generation prompt, up
 * to and including the stop token (absent when the turn was cut by the token cap).  Blocks
 * get ids "call_<step>_<n>".  conv, when not NULL, supplies the tool set for known_tool.
 * The parse never fails on what a model can sample; ARL_ERR_RANGE for an id outside [0, V),
 * ARL_ERR_ARG for tokens after the stop token.  *out is freed with arl_chat_turn_free. */
arl_status arl_chat_parse_tool_calls(const arl_chat_template *t, const int32_t *ids, size_t n,
                                     int64_t step, const arl_chat_conv *conv, arl_chat_turn *out);
/* The same on decoded text with special names (arl_tokenizer_encode_special: trusted text). */
arl_status arl_chat_parse_tool_calls_text(const arl_chat_template *t, const char *text, size_t len,
                                          int64_t step, const arl_chat_conv *conv,
                                          arl_chat_turn *out);
void arl_chat_turn_free(arl_chat_turn *turn); /* NULL-safe */

/* Append a parsed turn as an assistant message (content, every block, finish_length).  Its
 * rendering is the generation prompt followed by exactly the parsed tokens (plus
 * <|end_of_msg|> with mask 0 when the turn was cut by the token cap).  t: the template the
 * turn was parsed with (its stop id and vocabulary check the raw blocks). */
arl_status arl_chat_conv_add_turn(arl_chat_conv *c, const arl_chat_template *t,
                                  const arl_chat_turn *turn);

/* ---- extension property (spec/objective.md §3.2 rule 5) ---- */

/* *holds = 1 when the rendering of c followed by the generation prompt has ctx[0..n_ctx) as
 * a prefix, else 0 and *mismatch = the first position that differs (or the rendering's
 * length when ctx is longer).  mismatch may be NULL. */
arl_status arl_chat_check_extension(const arl_chat_template *t, const arl_chat_conv *c,
                                    const int32_t *ctx, size_t n_ctx, int *holds, size_t *mismatch);

/* *holds = 1 when render(prev) is a prefix of render(next) (appending next's extra messages
 * keeps every earlier token), else 0: a template break (changed tools or earlier messages). */
arl_status arl_chat_extends(const arl_chat_template *t, const arl_chat_conv *prev,
                            const arl_chat_conv *next, int *holds);

#endif
