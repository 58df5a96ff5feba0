/* tests/fuzz/fuzz_chat.c: libFuzzer target for the chat template (policy/chat.c): the parser of
 * a sampled assistant turn, and the conversation JSON reader with the rendering.
 *
 * The first byte of an input picks the mode; the rest is its data.
 *   odd:  the data are the sampled tokens of one turn: each byte is a byte token, except 0x01,
 *         whose next byte k is the id 256 + k (k < 128: the special tokens and the reserved
 *         ids up to V = 384) or byte k - 128.  What spec/aep.md §4.6 and policy/chat.h promise
 *         is checked: the parse never fails on what a model can sample (every id in [0, V),
 *         nothing after the stop token), tokens after a stop token are ARL_ERR_ARG, every
 *         block has a status of the closed set and the turn's status agrees with them; and
 *         the round trip: after arl_chat_conv_add_turn, the rendering is the previous one, the
 *         generation prompt and exactly the sampled tokens (mask 1), plus <|end_of_msg|>
 *         (mask 0) when the turn had no stop token.
 *   even: the data are a conversation's JSON (arl_chat_conv_from_json; images are decoded,
 *         tools read); what loads renders, its ids in [0, V), masks 0 or 1, message indices in
 *         [-1, n_msgs], and the rendering is an extension of itself.
 * Built by tests/tokenizer/CMakeLists.txt with clang and -DAGENTRL_FUZZ=ON:
 *   build-fuzz/tests/tokenizer/fuzz_chat -max_total_time=60 CORPUS_DIR
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "policy/chat.h"

static const char tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"calc\",\"parameters\":{\"type\":\"object\"}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\"}}}]";

static void tokens_check(const arl_chat_template *t, const arl_chat_conv *c,
                         const arl_chat_tokens *r) {
    for (size_t i = 0; i < r->n; i++) {
        ARL_ASSERT(r->ids[i] >= 0 && r->ids[i] < t->tok.vocab_size);
        ARL_ASSERT(r->mask[i] <= 1);
        ARL_ASSERT(r->msg[i] >= -1 && r->msg[i] <= (int32_t)c->n_msgs);
    }
}

static void turn_mode(const arl_chat_template *t, const uint8_t *d, size_t n) {
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    ARL_ASSERT(ids);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (d[i] == 0x01 && i + 1 < n) {
            uint8_t k = d[++i];
            ids[m++] = k < 128 ? 256 + k : k - 128;
        } else {
            ids[m++] = d[i];
        }
    }
    const int32_t stop = t->tok.special[ARL_SPECIAL_END_OF_MSG];
    size_t first_stop = m;
    for (size_t i = 0; i < m; i++)
        if (ids[i] == stop) {
            first_stop = i;
            break;
        }
    arl_chat_conv c;
    arl_chat_conv_init(&c);
    ARL_ASSERT(arl_chat_conv_set_tools_json(&c, tools, sizeof tools - 1) == ARL_OK);
    ARL_ASSERT(arl_chat_conv_add_text(&c, ARL_CHAT_USER, "q", 1) == ARL_OK);
    arl_chat_turn turn;
    arl_status s = arl_chat_parse_tool_calls(t, ids, m, 3, &c, &turn);
    if (first_stop + 1 < m) { /* tokens after the stop token */
        ARL_ASSERT(s == ARL_ERR_ARG);
        goto out;
    }
    ARL_ASSERT(s == ARL_OK);
    ARL_ASSERT(turn.n_tokens == m);
    /* no stop token: the turn was cut by the cap */
    ARL_ASSERT((turn.finish == ARL_CHAT_FINISH_LENGTH) == (first_stop == m));
    ARL_ASSERT(turn.content && turn.content[turn.content_len] == 0);
    ARL_ASSERT((int)turn.status >= ARL_CHAT_PARSE_OK &&
               turn.status <= ARL_CHAT_PARSE_MALFORMED_STRUCTURE);
    ARL_ASSERT((turn.status == ARL_CHAT_PARSE_NO_TOOL_CALL) == (turn.n_calls == 0));
    for (size_t i = 0; i < turn.n_calls; i++) {
        const arl_chat_call *k = &turn.calls[i];
        ARL_ASSERT(k->id && k->status != ARL_CHAT_PARSE_NO_TOOL_CALL &&
                   k->status <= ARL_CHAT_PARSE_MALFORMED_STRUCTURE);
        if (k->status == ARL_CHAT_PARSE_OK) { /* the exact JSON text of an object */
            ARL_ASSERT(k->name && k->arguments && !k->raw && !k->message &&
                       (k->known_tool == 0 || k->known_tool == 1));
            ARL_ASSERT(k->arguments[strspn(k->arguments, " \t\n\r")] == '{');
        } else { /* why, and the block's exact tokens */
            ARL_ASSERT(!k->arguments && k->message && k->raw && k->n_raw > 0);
        }
        if (turn.status == ARL_CHAT_PARSE_OK) ARL_ASSERT(k->status == ARL_CHAT_PARSE_OK);
    }
    /* the round trip */
    arl_chat_tokens before, after;
    arl_chat_tokens_init(&before);
    arl_chat_tokens_init(&after);
    ARL_ASSERT(arl_chat_render(t, &c, 1, &before) == ARL_OK);
    s = arl_chat_conv_add_turn(&c, t, &turn);
    ARL_ASSERT(s == ARL_OK);
    ARL_ASSERT(arl_chat_render(t, &c, 0, &after) == ARL_OK);
    tokens_check(t, &c, &after);
    size_t cut = first_stop == m;
    ARL_ASSERT(after.n == before.n + m + cut);
    ARL_ASSERT(!memcmp(after.ids, before.ids, before.n * sizeof *after.ids));
    for (size_t i = 0; i < m; i++)
        ARL_ASSERT(after.ids[before.n + i] == ids[i] && after.mask[before.n + i] == 1);
    if (cut) ARL_ASSERT(after.ids[after.n - 1] == stop && after.mask[after.n - 1] == 0);
    arl_chat_tokens_free(&before);
    arl_chat_tokens_free(&after);
    arl_chat_turn_free(&turn);
out:
    arl_chat_conv_free(&c);
    free(ids);
}

static void json_mode(const arl_chat_template *t, const uint8_t *d, size_t n) {
    arl_chat_conv c;
    arl_chat_conv_init(&c);
    if (arl_chat_conv_from_json(&c, t, (const char *)d, n, "fuzz") == ARL_OK) {
        arl_chat_tokens r;
        arl_chat_tokens_init(&r);
        if (arl_chat_render(t, &c, 1, &r) == ARL_OK) {
            tokens_check(t, &c, &r);
            int holds = 0;
            size_t at = 0;
            ARL_ASSERT(arl_chat_check_extension(t, &c, r.ids, r.n, &holds, &at) == ARL_OK);
            ARL_ASSERT(holds);
        }
        arl_chat_tokens_free(&r);
    }
    arl_chat_conv_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    arl_chat_template t;
    arl_chat_template_default(&t);
    t.image_max_patches = 64; /* small images: the fuzzer's time goes to the parsers */
    if (data[0] & 1)
        turn_mode(&t, data + 1, size - 1);
    else
        json_mode(&t, data + 1, size - 1);
    return 0;
}
