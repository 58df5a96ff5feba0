/* policy/tokenizer.h: the byte-level tokenizer of the development configs
 * (spec/policy.md §12.4): ids 0-255 are raw bytes, special tokens sit above them.
 *
 * Text always encodes to its bytes, one id per byte: a special token's name written in text
 * ("<|end_of_msg|>") stays bytes and never becomes the special id.  Special ids enter a
 * sequence only through the chat template (policy/chat.h).  The one exception is
 * arl_tokenizer_encode_special(), which reads special names back from trusted text (test
 * fixtures, the CLI, a model's own decoded output) and must never see environment text.
 *
 * Not here: the chat/tool template (policy/chat.h), BPE vocabularies (a K3 release uses
 * tiktoken BPE; this tokenizer covers the byte-level configs tiny and mini only).
 */
#ifndef ARL_POLICY_TOKENIZER_H
#define ARL_POLICY_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define ARL_TOKENIZER_N_BYTES 256

/* The special tokens, as indices into arl_tokenizer_spec.special[].  Ids and names in
 * docs/chat_template.md; the first ten are spec/policy.md §12.4, the last three are taken
 * from the reserved range 266-383 for the tool-call syntax of the chat template. */
typedef enum arl_special {
    ARL_SPECIAL_BOS = 0,       /* <|bos|>          256  config bos_token_id */
    ARL_SPECIAL_EOS,           /* <|eos|>          257  config eos_token_id */
    ARL_SPECIAL_PAD,           /* <|pad|>          258  config pad_token_id */
    ARL_SPECIAL_MEDIA_PAD,     /* <|media_pad|>    259  config media_placeholder_token_id */
    ARL_SPECIAL_MEDIA_BEGIN,   /* <|media_begin|>  260 */
    ARL_SPECIAL_MEDIA_END,     /* <|media_end|>    261 */
    ARL_SPECIAL_OPEN,          /* <|open|>         262  opens a message header */
    ARL_SPECIAL_CLOSE,         /* <|close|>        263  closes a message header */
    ARL_SPECIAL_SEP,           /* <|sep|>          264  separates header fields */
    ARL_SPECIAL_END_OF_MSG,    /* <|end_of_msg|>   265  ends a message; the stop token */
    ARL_SPECIAL_TOOL_CALL,     /* <|tool_call|>    266  opens a tool-call block */
    ARL_SPECIAL_TOOL_ARGS,     /* <|tool_args|>    267  separates the name from the arguments */
    ARL_SPECIAL_TOOL_CALL_END, /* <|tool_call_end|> 268 closes a tool-call block */
    ARL_SPECIAL_COUNT
} arl_special;

/* Vocabulary size and the id of every special token.  Plain data; copy freely. */
typedef struct arl_tokenizer_spec {
    int32_t vocab_size;                 /* V: ids are in [0, V) */
    int32_t special[ARL_SPECIAL_COUNT]; /* id of each special token, in [256, V), distinct */
} arl_tokenizer_spec;

/* The byte-level defaults of spec/policy.md §12.4: V = 384, ids 256-268 as listed above. */
void arl_tokenizer_spec_default(arl_tokenizer_spec *s);

/* Check that V >= 256 + ARL_SPECIAL_COUNT and every special id is in [256, V) and distinct.
 * ARL_ERR_CONFIG naming the offending token otherwise. */
arl_status arl_tokenizer_spec_validate(const arl_tokenizer_spec *s);

/* "<|bos|>", ... for k < ARL_SPECIAL_COUNT; NULL otherwise.  Static storage. */
const char *arl_tokenizer_special_name(arl_special k);

/* The arl_special whose id is `id`, or -1 when id is a byte, reserved or out of range. */
int arl_tokenizer_special_of(const arl_tokenizer_spec *s, int32_t id);

/* Check every id is in [0, V).  ARL_ERR_RANGE naming the first bad position otherwise. */
arl_status arl_tokenizer_check_ids(const arl_tokenizer_spec *s, const int32_t *ids, size_t n);

/* Encode text as bytes: ids[i] = (uint8_t)text[i].  Always exactly len ids, any bytes
 * (NUL and invalid UTF-8 included).  ids: (len), caller-allocated. */
void arl_tokenizer_encode(const char *text, size_t len, int32_t *ids);

/* TRUSTED text only: like arl_tokenizer_encode, but "<|name|>" for a special of s (and
 * "<|reserved_N|>" for an unassigned id N in [256, V)) becomes that id.  For fixtures, the
 * CLI and re-reading a model's own decoded output; never for environment or user text.
 * *ids: caller frees with free(); *n its length.  ARL_ERR_NOMEM on allocation failure. */
arl_status arl_tokenizer_encode_special(const arl_tokenizer_spec *s, const char *text, size_t len,
                                        int32_t **ids, size_t *n);

enum {
    ARL_DECODE_SKIP_SPECIAL = 1u << 0, /* leave out every id >= 256 */
    ARL_DECODE_UTF8_REPLACE = 1u << 1, /* replace invalid UTF-8 by U+FFFD (spec/aep.md §4.5) */
};

/* Decode ids to text: bytes as themselves, specials as their names ("<|sep|>"), unassigned
 * ids in [256, V) as "<|reserved_N|>".  flags: ARL_DECODE_*.  *text is NUL-terminated (the
 * text itself may contain NUL bytes; *len is its length without the terminator) and the
 * caller frees it with free().  ARL_ERR_RANGE naming the position of an id outside [0, V). */
arl_status arl_tokenizer_decode(const arl_tokenizer_spec *s, const int32_t *ids, size_t n,
                                unsigned flags, char **text, size_t *len);

/* 1 if text[0..len) is valid UTF-8 (no overlong forms, surrogates or code points above
 * U+10FFFF), else 0. */
int arl_utf8_valid(const char *text, size_t len);

/* Length of the valid UTF-8 character at p[0..len) (len >= 1; 1 for ASCII), 0 if invalid or
 * truncated (the rules of arl_utf8_valid). */
size_t arl_utf8_char_len(const unsigned char *p, size_t len);

/* Length of the longest prefix of text[0..len) that is at most max bytes and does not cut a
 * UTF-8 character (an invalid byte counts as a character of its own).  For cutting text to a
 * byte limit, e.g. the 4096-byte `raw` of spec/aep.md §4.5. */
size_t arl_utf8_prefix(const char *text, size_t len, size_t max);

/* Text that arrives in pieces (the bytes of tokens as they are drawn), passed on as valid UTF-8:
 * a character cut between pieces is held back until it completes, every byte that cannot be
 * (part of) a valid character becomes U+FFFD, and so does every held byte at the end.  The
 * pieces of a stream, then its end, give exactly the text of arl_tokenizer_decode with
 * ARL_DECODE_UTF8_REPLACE of the whole, however it is cut.  Zero it to begin a stream. */
typedef struct arl_utf8_stream {
    unsigned char held[4]; /* the start of a character not yet complete */
    size_t n_held;         /* 0..3 */
} arl_utf8_stream;

/* Pass on in[0..n): writes the text now complete to out, which holds at least
 * ARL_UTF8_STREAM_OUT(n) bytes, and returns its length. */
#define ARL_UTF8_STREAM_OUT(n) (3 * ((n) + 3))
size_t arl_utf8_stream_put(arl_utf8_stream *u, const char *in, size_t n, char *out);
/* End the stream: U+FFFD for each byte still held, in out (at least ARL_UTF8_STREAM_OUT(0)
 * bytes); returns the length written (0 when nothing was held).  u is empty again after. */
size_t arl_utf8_stream_end(arl_utf8_stream *u, char *out);

#endif
