/* rollout/turn.c: between the token stream and the environment - a parsed assistant turn
 * becomes the AEP action (spec/aep.md 4.5-4.6: every block, well formed or not, is sent), and an
 * observation's messages become conversation messages for the chat template (images as parts
 * whose pixels go to the vision front end).  Not the scheduling (rollout/worker.c). */
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "core/log.h"
#include "rollout/internal.h"

#define RAW_MAX 4096 /* spec/aep.md 4.5: parse_errors[].raw */

/* Decode ids as text (specials by name when `special`), invalid UTF-8 replaced by U+FFFD. */
static arl_status decode_text(const arl_chat_template *t, const int32_t *ids, size_t n,
                              char **text, size_t *len) {
    return arl_tokenizer_decode(&t->tok, ids, n, ARL_DECODE_UTF8_REPLACE, text, len);
}

static arl_status bytes_text(const arl_chat_template *t, const char *b, size_t n, char **text,
                             size_t *len) {
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!ids) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
    arl_tokenizer_encode(b, n, ids);
    arl_status s = decode_text(t, ids, n, text, len);
    free(ids);
    return s;
}

static arl_env_parse_status env_status(arl_chat_parse_status s) {
    int v = arl_env_parse_status_parse(arl_chat_parse_status_str(s));
    return v < 0 ? ARL_ENV_PARSE_MALFORMED_STRUCTURE : (arl_env_parse_status)v;
}

/* The block's text for parse_errors[].raw (cut at a character boundary). */
static arl_status block_raw(const arl_chat_template *t, const arl_chat_call *c, char **raw) {
    char *text = NULL;
    size_t len = 0;
    if (c->raw) {
        ARL_TRY(decode_text(t, c->raw, c->n_raw, &text, &len));
    } else { /* an ok block: <|tool_call|>NAME<|tool_args|>ARGS<|tool_call_end|> */
        size_t cap = c->name_len + c->arguments_len + 64;
        text = malloc(cap);
        if (!text) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
        len = (size_t)snprintf(text, cap, "<|tool_call|>%.*s<|tool_args|>%.*s<|tool_call_end|>",
                               (int)c->name_len, c->name ? c->name : "", (int)c->arguments_len,
                               c->arguments ? c->arguments : "");
    }
    size_t keep = arl_utf8_prefix(text, len, RAW_MAX);
    text[keep] = 0;
    *raw = text;
    return ARL_OK;
}

arl_status ro_action_from_turn(const arl_chat_template *t, const arl_chat_turn *turn,
                               int64_t n_tokens, arl_env_action *a) {
    char *content = NULL;
    size_t clen = 0;
    ARL_TRY(bytes_text(t, turn->content ? turn->content : "", turn->content_len, &content, &clen));
    a->content = content;
    a->reasoning = NULL;
    for (size_t i = 0; i < turn->n_calls; i++) {
        const arl_chat_call *c = &turn->calls[i];
        arl_env_parse_status st = env_status(c->status);
        char msg[512] = "";
        if (c->status == ARL_CHAT_PARSE_OK) {
            json_t *args = NULL;
            const unsigned long n0 = arl_nomem_count();
            st = arl_env_tool_args_parse(c->arguments, c->arguments_len, &args, msg, sizeof msg);
            if (st != ARL_ENV_PARSE_OK && arl_nomem_count() != n0) /* ours, not the model's */
                return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory parsing a tool call's "
                                                 "arguments");
            if (st == ARL_ENV_PARSE_OK) {
                char *name = malloc(c->name_len + 1);
                if (!name) {
                    json_decref(args);
                    return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
                }
                memcpy(name, c->name, c->name_len);
                name[c->name_len] = 0;
                arl_status s = arl_env_action_add_call(a, c->id, name, args);
                free(name);
                ARL_TRY(s);
                continue;
            }
            /* the template's grammar accepted the block, the AEP argument rules did not */
        } else if (c->message) {
            snprintf(msg, sizeof msg, "%s", c->message);
        }
        char *raw = NULL;
        ARL_TRY(block_raw(t, c, &raw));
        arl_status s = arl_env_action_add_parse_error(a, c->id, st, msg, raw);
        free(raw);
        ARL_TRY(s);
    }
    a->finish_reason = turn->finish == ARL_CHAT_FINISH_STOP         ? ARL_ENV_FINISH_STOP
                       : turn->finish == ARL_CHAT_FINISH_TOOL_CALLS ? ARL_ENV_FINISH_TOOL_CALLS
                                                                    : ARL_ENV_FINISH_LENGTH;
    a->num_tokens = n_tokens;
    arl_env_action_set_parse_status(a);
    return ARL_OK;
}

/* ---- observations ---- */

void ro_images_clear(ro_images *im) {
    for (int32_t i = 0; i < im->n; i++)
        arl_image_free(&im->v[i]);
    im->n = 0;
}

static arl_status add_parts(arl_chat_conv *conv, const arl_env_message *m, ro_images *imgs) {
    for (int32_t i = 0; i < m->n_parts; i++) {
        const arl_env_part *p = &m->parts[i];
        if (p->type == ARL_ENV_PART_TEXT) {
            ARL_TRY(arl_chat_conv_add_part_text(conv, p->text ? p->text : "",
                                                p->text ? strlen(p->text) : 0));
            continue;
        }
        ARL_TRY(arl_chat_conv_add_part_image(conv, (int32_t)p->image.width,
                                             (int32_t)p->image.height));
        if (imgs->n == imgs->cap) {
            int32_t c = imgs->cap ? 2 * imgs->cap : 4;
            arl_image *v = realloc(imgs->v, (size_t)c * sizeof *v);
            if (!v) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
            imgs->v = v;
            imgs->cap = c;
        }
        ARL_TRY(arl_image_decode(p->image.png, p->image.png_len, ARL_IMAGE_MAX_PIXELS_DEFAULT,
                                 "observation image", &imgs->v[imgs->n]));
        imgs->n++;
    }
    return ARL_OK;
}

arl_status ro_conv_add_obs(arl_chat_conv *conv, const arl_chat_template *t,
                           const arl_env_observation *obs, ro_images *imgs) {
    (void)t;
    for (int32_t i = 0; i < obs->n_messages; i++) {
        const arl_env_message *m = &obs->messages[i];
        const char *text = m->content_is_parts ? "" : (m->content ? m->content : "");
        switch (m->role) {
        case ARL_ENV_ROLE_SYSTEM:
        case ARL_ENV_ROLE_USER:
            ARL_TRY(arl_chat_conv_add_text(conv,
                                           m->role == ARL_ENV_ROLE_SYSTEM ? ARL_CHAT_SYSTEM
                                                                          : ARL_CHAT_USER,
                                           text, strlen(text)));
            break;
        case ARL_ENV_ROLE_TOOL:
            ARL_TRY(arl_chat_conv_add_tool_result(conv, m->tool_call_id ? m->tool_call_id : "",
                                                  text, strlen(text),
                                                  m->is_error ? (m->error_code ? m->error_code
                                                                               : "TOOL_RUNTIME_ERROR")
                                                              : NULL));
            break;
        case ARL_ENV_ROLE_ASSISTANT:
            if (m->reasoning && *m->reasoning)
                arl_log_warn("rollout: a reset observation's assistant message carries "
                             "reasoning, which this chat template cannot render; it is left out "
                             "of the model's context (it stays in the stored response)");
            ARL_TRY(arl_chat_conv_add_text(conv, ARL_CHAT_ASSISTANT, text, strlen(text)));
            for (int32_t j = 0; j < m->n_tool_calls; j++) {
                const arl_env_tool_call *c = &m->tool_calls[j];
                char *args = arl_json_dumps(c->arguments, JSON_COMPACT | JSON_PRESERVE_ORDER);
                if (!args) return arl_errorf(ARL_ERR_NOMEM, "rollout: out of memory");
                arl_status s = arl_chat_conv_add_call(conv, c->id, c->name, args, strlen(args));
                free(args);
                ARL_TRY(s);
            }
            break;
        }
        if (m->content_is_parts) ARL_TRY(add_parts(conv, m, imgs));
    }
    return ARL_OK;
}
