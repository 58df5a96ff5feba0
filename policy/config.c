/* policy/config.c: config.json reading, validation (spec/policy.md section 12.2), writing
 * and hashing.  Each JSON object of the config is described once by a field table; the
 * parser, the writer and the hash all walk the same tables.  Value rules that span fields
 * live in config_check(). */
#include "policy/config.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/assert.h"
#include "core/file.h"
#include "core/json_dump.h"
#include "core/log.h"
#include "policy/params.h"

/* ------------------------------------------------------------------------------------ */
/* field tables                                                                          */

typedef enum fkind { FK_INT, FK_FLOAT, FK_BOOL, FK_STR, FK_INTS, FK_STRS } fkind;

enum {
    FF_REQ = 1u << 0,  /* must be present */
    FF_NULL = 1u << 1, /* null allowed (int: stored as 0, float: NAN) */
    FF_OPT = 1u << 2,  /* optional without default: absent marker, not written back */
};

typedef struct cfield {
    const char *name;
    fkind kind;
    size_t off;
    unsigned flags;
    const char *def; /* JSON text of the default when absent (NULL: none) */
} cfield;

#define TOP(f) offsetof(arl_model_config, f)
#define TXT(f) offsetof(arl_text_config, f)
#define LIN(f) offsetof(arl_linear_attn_config, f)
#define VIS(f) offsetof(arl_vision_config, f)

static const cfield top_fields[] = {
    {"architectures", FK_STRS, TOP(architectures), FF_OPT, NULL},
    {"model_type", FK_STR, TOP(model_type), FF_OPT, NULL},
    {"bos_token_id", FK_INT, TOP(bos_token_id), FF_OPT, NULL},
    {"eos_token_id", FK_INT, TOP(eos_token_id), FF_OPT, NULL},
    {"pad_token_id", FK_INT, TOP(pad_token_id), FF_OPT, NULL},
    {"media_placeholder_token_id", FK_INT, TOP(media_placeholder_token_id), FF_OPT, NULL},
    {"image_placeholder", FK_STR, TOP(image_placeholder), FF_OPT, NULL},
    {"ignore_index", FK_INT, TOP(ignore_index), FF_OPT, NULL},
    {"tie_word_embeddings", FK_BOOL, TOP(tie_word_embeddings), FF_OPT, NULL},
    {"dtype", FK_STR, TOP(dtype), FF_OPT, NULL},
};

static const cfield text_fields[] = {
    {"model_type", FK_STR, TXT(model_type), 0, "\"kimi_linear\""},
    {"architectures", FK_STRS, TXT(architectures), 0, "[\"KimiLinearForCausalLM\"]"},
    {"vocab_size", FK_INT, TXT(vocab_size), FF_REQ, NULL},
    {"hidden_size", FK_INT, TXT(hidden_size), FF_REQ, NULL},
    {"num_hidden_layers", FK_INT, TXT(num_hidden_layers), FF_REQ, NULL},
    {"intermediate_size", FK_INT, TXT(intermediate_size), FF_REQ, NULL},
    {"first_k_dense_replace", FK_INT, TXT(first_k_dense_replace), FF_REQ, NULL},
    {"moe_layer_freq", FK_INT, TXT(moe_layer_freq), 0, "1"},
    {"num_attention_heads", FK_INT, TXT(num_attention_heads), FF_REQ, NULL},
    {"num_key_value_heads", FK_INT, TXT(num_key_value_heads), FF_REQ, NULL},
    {"q_lora_rank", FK_INT, TXT(q_lora_rank), FF_REQ | FF_NULL, NULL},
    {"kv_lora_rank", FK_INT, TXT(kv_lora_rank), FF_REQ, NULL},
    {"qk_nope_head_dim", FK_INT, TXT(qk_nope_head_dim), FF_REQ, NULL},
    {"qk_rope_head_dim", FK_INT, TXT(qk_rope_head_dim), FF_REQ, NULL},
    {"v_head_dim", FK_INT, TXT(v_head_dim), FF_REQ, NULL},
    {"mla_use_nope", FK_BOOL, TXT(mla_use_nope), FF_REQ, NULL},
    {"mla_use_output_gate", FK_BOOL, TXT(mla_use_output_gate), 0, "false"},
    /* linear_attn_config: nested table below */
    {"num_experts", FK_INT, TXT(num_experts), FF_REQ, NULL},
    {"num_experts_per_token", FK_INT, TXT(num_experts_per_token), FF_REQ, NULL},
    {"num_shared_experts", FK_INT, TXT(num_shared_experts), FF_REQ, NULL},
    {"moe_intermediate_size", FK_INT, TXT(moe_intermediate_size), FF_REQ, NULL},
    {"routed_expert_hidden_size", FK_INT, TXT(routed_expert_hidden_size), FF_REQ, NULL},
    {"latent_moe_use_norm", FK_BOOL, TXT(latent_moe_use_norm), 0, "false"},
    {"moe_router_activation_func", FK_STR, TXT(moe_router_activation_func), 0, "\"sigmoid\""},
    {"moe_renormalize", FK_BOOL, TXT(moe_renormalize), 0, "true"},
    {"routed_scaling_factor", FK_FLOAT, TXT(routed_scaling_factor), 0, "1.0"},
    {"use_grouped_topk", FK_BOOL, TXT(use_grouped_topk), 0, "true"},
    {"num_expert_group", FK_INT, TXT(num_expert_group), 0, "1"},
    {"topk_group", FK_INT, TXT(topk_group), 0, "1"},
    {"topk_method", FK_STR, TXT(topk_method), 0, "\"noaux_tc\""},
    {"hidden_act", FK_STR, TXT(hidden_act), FF_REQ, NULL},
    {"activation_situ_beta", FK_FLOAT, TXT(activation_situ_beta), 0, "4.0"},
    {"activation_situ_linear_beta", FK_FLOAT, TXT(activation_situ_linear_beta), 0, "25.0"},
    {"attn_res_block_size", FK_INT, TXT(attn_res_block_size), FF_NULL, "null"},
    {"rms_norm_eps", FK_FLOAT, TXT(rms_norm_eps), FF_REQ, NULL},
    {"initializer_range", FK_FLOAT, TXT(initializer_range), 0, "0.02"},
    {"max_position_embeddings", FK_INT, TXT(max_position_embeddings), FF_REQ, NULL},
    {"tie_word_embeddings", FK_BOOL, TXT(tie_word_embeddings), 0, "false"},
    {"num_nextn_predict_layers", FK_INT, TXT(num_nextn_predict_layers), 0, "0"},
    {"bos_token_id", FK_INT, TXT(bos_token_id), FF_REQ, NULL},
    {"eos_token_id", FK_INT, TXT(eos_token_id), FF_REQ, NULL},
    {"pad_token_id", FK_INT, TXT(pad_token_id), FF_REQ, NULL},
    {"dtype", FK_STR, TXT(dtype), 0, "\"bfloat16\""},
    {"use_cache", FK_BOOL, TXT(use_cache), 0, "true"},
};

static const cfield linear_fields[] = {
    {"head_dim", FK_INT, LIN(head_dim), FF_REQ, NULL},
    {"num_heads", FK_INT, LIN(num_heads), FF_REQ, NULL},
    {"short_conv_kernel_size", FK_INT, LIN(short_conv_kernel_size), FF_REQ, NULL},
    {"gate_lower_bound", FK_FLOAT, LIN(gate_lower_bound), FF_NULL, "null"},
    {"use_full_rank_gate", FK_BOOL, LIN(use_full_rank_gate), 0, "false"},
    {"full_attn_layers", FK_INTS, LIN(full_attn_layers), FF_REQ, NULL},
    {"kda_layers", FK_INTS, LIN(kda_layers), FF_REQ, NULL},
};

static const cfield vision_fields[] = {
    {"patch_size", FK_INT, VIS(patch_size), FF_REQ, NULL},
    {"init_pos_emb_height", FK_INT, VIS(init_pos_emb_height), FF_REQ, NULL},
    {"init_pos_emb_width", FK_INT, VIS(init_pos_emb_width), FF_REQ, NULL},
    {"init_pos_emb_time", FK_INT, VIS(init_pos_emb_time), 0, "4"},
    {"pos_emb_type", FK_STR, VIS(pos_emb_type), 0, "\"divided_fixed\""},
    {"pos_emb_interpolation_mode", FK_STR, VIS(pos_emb_interpolation_mode), 0, "\"bilinear\""},
    {"vt_hidden_size", FK_INT, VIS(vt_hidden_size), FF_REQ, NULL},
    {"vt_num_hidden_layers", FK_INT, VIS(vt_num_hidden_layers), FF_REQ, NULL},
    {"vt_num_attention_heads", FK_INT, VIS(vt_num_attention_heads), FF_REQ, NULL},
    {"qkv_hidden_size", FK_INT, VIS(qkv_hidden_size), FF_REQ, NULL},
    {"vt_intermediate_size", FK_INT, VIS(vt_intermediate_size), FF_REQ, NULL},
    {"norm_type", FK_STR, VIS(norm_type), 0, "\"rmsnorm\""},
    {"mlp_type", FK_STR, VIS(mlp_type), 0, "\"mlp2\""},
    {"activation_func", FK_STR, VIS(activation_func), 0, "\"gelu_pytorch_tanh\""},
    {"attn_bias", FK_BOOL, VIS(attn_bias), 0, "false"},
    {"linear_bias", FK_BOOL, VIS(linear_bias), 0, "false"},
    {"patch_embed_proj_bias", FK_BOOL, VIS(patch_embed_proj_bias), 0, "false"},
    {"merge_kernel_size", FK_INTS, VIS(merge_kernel_size), FF_REQ, NULL},
    {"merge_type", FK_STR, VIS(merge_type), 0, "\"sd2_tpool\""},
    {"mm_projector_type", FK_STR, VIS(mm_projector_type), 0, "\"patchmergerv2\""},
    {"mm_hidden_size", FK_INT, VIS(mm_hidden_size), FF_REQ, NULL},
    {"projector_hidden_act", FK_STR, VIS(projector_hidden_act), 0, "\"gelu\""},
    {"projector_ln_eps", FK_FLOAT, VIS(projector_ln_eps), 0, "1e-05"},
    {"text_hidden_size", FK_INT, VIS(text_hidden_size), FF_REQ, NULL},
};

#define NFIELDS(t) (sizeof(t) / sizeof((t)[0]))

/* Fields of section 12.1 that are never written (also ignored when read). */
static const char *const not_written[] = {
    "head_dim",         "rope_theta",  "rope_scaling", "n_routed_experts", "num_experts_per_tok",
    "n_shared_experts", "scoring_func"};

/* ------------------------------------------------------------------------------------ */
/* small string builder                                                                  */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void sb_putn(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_puts(sbuf *b, const char *s) {
    sb_putn(b, s, strlen(s));
}
static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    sb_putn(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}
static char *sb_take(sbuf *b) {
    if (b->oom) {
        free(b->p);
        return NULL;
    }
    if (!b->p) return strdup("");
    return b->p;
}

/* ------------------------------------------------------------------------------------ */
/* JSON text output: Python-compatible number formatting                                 */

/* Shortest round-trip repr of a finite double, formatted as Python's repr(float).  -1 when
 * out of memory (out is "" then). */
static int fmt_real(double x, char *out, size_t cap) {
    char buf[48];
    if (x == 0) {
        snprintf(out, cap, signbit(x) ? "-0.0" : "0.0");
        return 0;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    /* buf: [-]D[.DDD]e[+-]XX */
    char digits[32];
    int nd = 0, neg = 0;
    const char *s = buf;
    if (*s == '-') {
        neg = 1;
        s++;
    }
    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9') digits[nd++] = *s;
    int e10 = atoi(s + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = 0;
    int decpt = e10 + 1;
    sbuf b = {0};
    if (neg) sb_puts(&b, "-");
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            sb_puts(&b, "0.");
            for (int i = 0; i < -decpt; i++)
                sb_puts(&b, "0");
            sb_puts(&b, digits);
        } else if (decpt >= nd) {
            sb_puts(&b, digits);
            for (int i = nd; i < decpt; i++)
                sb_puts(&b, "0");
            sb_puts(&b, ".0");
        } else {
            sb_putn(&b, digits, (size_t)decpt);
            sb_puts(&b, ".");
            sb_puts(&b, digits + decpt);
        }
    } else {
        sb_putn(&b, digits, 1);
        if (nd > 1) {
            sb_puts(&b, ".");
            sb_puts(&b, digits + 1);
        }
        sb_printf(&b, "e%c%02d", e10 < 0 ? '-' : '+', abs(e10));
    }
    char *r = sb_take(&b);
    const int ok = r != NULL;
    snprintf(out, cap, "%s", ok ? r : ""); /* not "0.0": a hash of another number */
    free(r);
    return ok ? 0 : -1;
}

/* JSON string; ascii_only escapes non-ASCII as \uXXXX (UTF-16) like Python's default. */
static void dump_string(sbuf *b, const char *s, size_t len, int ascii_only) {
    sb_puts(b, "\"");
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"')
            sb_puts(b, "\\\""), i++;
        else if (c == '\\')
            sb_puts(b, "\\\\"), i++;
        else if (c == '\n')
            sb_puts(b, "\\n"), i++;
        else if (c == '\r')
            sb_puts(b, "\\r"), i++;
        else if (c == '\t')
            sb_puts(b, "\\t"), i++;
        else if (c == '\b')
            sb_puts(b, "\\b"), i++;
        else if (c == '\f')
            sb_puts(b, "\\f"), i++;
        else if (c < 0x20)
            sb_printf(b, "\\u%04x", c), i++;
        else if (c < 0x80 || !ascii_only)
            sb_putn(b, (const char *)&s[i], 1), i++;
        else {
            /* jansson guarantees valid UTF-8 */
            uint32_t cp;
            int n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
            cp = c & (n == 4 ? 0x07 : n == 3 ? 0x0f : 0x1f);
            for (int k = 1; k < n && i + (size_t)k < len; k++)
                cp = cp << 6 | ((unsigned char)s[i + k] & 0x3f);
            i += (size_t)n;
            if (cp >= 0x10000) {
                cp -= 0x10000;
                sb_printf(b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
            } else {
                sb_printf(b, "\\u%04x", cp);
            }
        }
    }
    sb_puts(b, "\"");
}

static int key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int is_scalar(const json_t *v) {
    return !json_is_object(v) && !json_is_array(v);
}

/* pretty = 0: compact, sorted keys (canonical form); pretty = 1: indented, file order. */
static void dump_value(sbuf *b, const json_t *v, int pretty, int level) {
    char num[64];
    switch (json_typeof(v)) {
    case JSON_NULL:
        sb_puts(b, "null");
        break;
    case JSON_TRUE:
        sb_puts(b, "true");
        break;
    case JSON_FALSE:
        sb_puts(b, "false");
        break;
    case JSON_INTEGER:
        sb_printf(b, "%lld", (long long)json_integer_value(v));
        break;
    case JSON_REAL:
        if (fmt_real(json_real_value(v), num, sizeof num))
            b->oom = 1; /* the text fails as a whole */
        else
            sb_puts(b, num);
        break;
    case JSON_STRING:
        dump_string(b, json_string_value(v), json_string_length(v), !pretty);
        break;
    case JSON_ARRAY: {
        size_t n = json_array_size(v);
        int flat = !pretty;
        if (pretty) {
            flat = 1;
            for (size_t i = 0; i < n; i++)
                if (!is_scalar(json_array_get(v, i))) flat = 0;
        }
        sb_puts(b, "[");
        for (size_t i = 0; i < n; i++) {
            if (i) sb_puts(b, pretty && flat ? ", " : ",");
            if (!flat) {
                sb_puts(b, "\n");
                for (int k = 0; k <= level; k++)
                    sb_puts(b, "  ");
            }
            dump_value(b, json_array_get(v, i), pretty, level + 1);
        }
        if (!flat && n) {
            sb_puts(b, "\n");
            for (int k = 0; k < level; k++)
                sb_puts(b, "  ");
        }
        sb_puts(b, "]");
        break;
    }
    case JSON_OBJECT: {
        size_t n = json_object_size(v);
        const char **keys = malloc((n ? n : 1) * sizeof *keys);
        if (!keys) {
            b->oom = 1;
            return;
        }
        size_t i = 0;
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)v, key, val) keys[i++] = key;
        if (!pretty) qsort(keys, n, sizeof *keys, key_cmp);
        sb_puts(b, "{");
        for (i = 0; i < n; i++) {
            if (i) sb_puts(b, ",");
            if (pretty) {
                sb_puts(b, "\n");
                for (int k = 0; k <= level; k++)
                    sb_puts(b, "  ");
            }
            dump_string(b, keys[i], strlen(keys[i]), !pretty);
            sb_puts(b, pretty ? ": " : ":");
            dump_value(b, json_object_get(v, keys[i]), pretty, level + 1);
        }
        if (pretty && n) {
            sb_puts(b, "\n");
            for (int k = 0; k < level; k++)
                sb_puts(b, "  ");
        }
        sb_puts(b, "}");
        free(keys);
        break;
    }
    }
}

/* ------------------------------------------------------------------------------------ */
/* parsing                                                                               */

/* Short description of a JSON value for error messages ("a string \"x\"", "-3", ...). */
static const char *describe(const json_t *v, char *buf, size_t cap) {
    if (!v) return "nothing";
    switch (json_typeof(v)) {
    case JSON_NULL:
        return "null";
    case JSON_TRUE:
        return "true";
    case JSON_FALSE:
        return "false";
    case JSON_INTEGER:
        snprintf(buf, cap, "%lld", (long long)json_integer_value(v));
        return buf;
    case JSON_REAL:
        fmt_real(json_real_value(v), buf, cap);
        return buf;
    case JSON_STRING:
        snprintf(buf, cap, "the string \"%.40s\"", json_string_value(v));
        return buf;
    case JSON_ARRAY:
        return "an array";
    case JSON_OBJECT:
        return "an object";
    }
    return "?";
}

static const char *kind_expect(const cfield *f) {
    switch (f->kind) {
    case FK_INT:
        return (f->flags & FF_NULL) ? "an integer or null" : "an integer";
    case FK_FLOAT:
        return (f->flags & FF_NULL) ? "a number or null" : "a number";
    case FK_BOOL:
        return "true or false";
    case FK_STR:
        return "a string";
    case FK_INTS:
        return "an array of integers";
    case FK_STRS:
        return "an array of strings";
    }
    return "?";
}

/* Every integer of a config is a size, a count, an index or a token id: 32-bit (token ids and
 * positions are int32 throughout), which also keeps the products of validation exact. */
static int int_in_range(json_int_t v) {
    return v >= INT32_MIN && v <= INT32_MAX;
}
#define INT_RANGE_TEXT "[-2^31, 2^31) (sizes, indices and token ids are 32-bit)"

/* Store JSON value v into the field (type checks only).  path: "text_config." etc. */
static arl_status field_set(const cfield *f, const json_t *v, void *base, const char *where,
                            const char *path) {
    char got[96];
    char *dst = (char *)base + f->off;
    int bad = 0;
    if (json_is_null(v) && (f->flags & FF_NULL)) {
        if (f->kind == FK_INT)
            *(int64_t *)dst = 0;
        else if (f->kind == FK_FLOAT)
            *(double *)dst = NAN;
        else
            bad = 1;
        if (!bad) return ARL_OK;
    }
    switch (f->kind) {
    case FK_INT:
        if (!json_is_integer(v))
            bad = 1;
        else if ((f->flags & FF_NULL) && json_integer_value(v) <= 0)
            /* 0 is the in-memory form of null: an explicit 0 or less is an error */
            return arl_errorf(ARL_ERR_CONFIG,
                              "%s: field '%s%s': expected a positive integer or null, got %lld",
                              where, path, f->name, (long long)json_integer_value(v));
        else if (!int_in_range(json_integer_value(v)))
            return arl_errorf(ARL_ERR_CONFIG, "%s: field '%s%s': %lld is outside %s", where, path,
                              f->name, (long long)json_integer_value(v), INT_RANGE_TEXT);
        else
            *(int64_t *)dst = (int64_t)json_integer_value(v);
        break;
    case FK_FLOAT:
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            bad = 1;
        else
            *(double *)dst = json_number_value(v);
        break;
    case FK_BOOL:
        if (!json_is_boolean(v))
            bad = 1;
        else
            *(int32_t *)dst = json_is_true(v);
        break;
    case FK_STR:
        if (!json_is_string(v))
            bad = 1;
        else if (json_string_length(v) >= ARL_CONFIG_STR)
            return arl_errorf(ARL_ERR_CONFIG,
                              "%s: field '%s%s': expected a string of at most %d bytes, got %zu",
                              where, path, f->name, ARL_CONFIG_STR - 1, json_string_length(v));
        else
            snprintf(dst, ARL_CONFIG_STR, "%s", json_string_value(v));
        break;
    case FK_INTS: {
        arl_config_ints *L = (arl_config_ints *)dst;
        if (!json_is_array(v)) {
            bad = 1;
            break;
        }
        size_t n = json_array_size(v);
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_array_get(v, i);
            if (!json_is_integer(e))
                return arl_errorf(ARL_ERR_CONFIG,
                                  "%s: field '%s%s': expected an array of integers, element %zu "
                                  "is %s",
                                  where, path, f->name, i, describe(e, got, sizeof got));
            if (!int_in_range(json_integer_value(e)))
                return arl_errorf(ARL_ERR_CONFIG,
                                  "%s: field '%s%s': element %zu, %lld, is outside %s", where, path,
                                  f->name, i, (long long)json_integer_value(e), INT_RANGE_TEXT);
        }
        int64_t *p = malloc((n ? n : 1) * sizeof *p);
        if (!p) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", where);
        for (size_t i = 0; i < n; i++)
            p[i] = (int64_t)json_integer_value(json_array_get(v, i));
        free(L->v);
        L->v = p;
        L->n = (int64_t)n;
        break;
    }
    case FK_STRS: {
        arl_config_strs *S = (arl_config_strs *)dst;
        if (!json_is_array(v)) {
            bad = 1;
            break;
        }
        size_t n = json_array_size(v);
        if (n > ARL_CONFIG_MAX_ARCH)
            return arl_errorf(ARL_ERR_CONFIG,
                              "%s: field '%s%s': expected at most %d strings, got %zu", where, path,
                              f->name, ARL_CONFIG_MAX_ARCH, n);
        for (size_t i = 0; i < n; i++) {
            const json_t *e = json_array_get(v, i);
            if (!json_is_string(e) || json_string_length(e) >= ARL_CONFIG_STR)
                return arl_errorf(ARL_ERR_CONFIG,
                                  "%s: field '%s%s': expected an array of strings (< %d bytes), "
                                  "element %zu is %s",
                                  where, path, f->name, ARL_CONFIG_STR, i,
                                  describe(e, got, sizeof got));
            snprintf(S->v[i], ARL_CONFIG_STR, "%s", json_string_value(e));
        }
        S->n = (int32_t)n;
        break;
    }
    }
    if (bad)
        return arl_errorf(ARL_ERR_CONFIG, "%s: field '%s%s': expected %s, got %s", where, path,
                          f->name, kind_expect(f), describe(v, got, sizeof got));
    return ARL_OK;
}

static void field_set_absent(const cfield *f, void *base) {
    char *dst = (char *)base + f->off;
    switch (f->kind) {
    case FK_INT:
        *(int64_t *)dst = ARL_CONFIG_ABSENT;
        break;
    case FK_FLOAT:
        *(double *)dst = NAN;
        break;
    case FK_BOOL:
        *(int32_t *)dst = -1;
        break;
    case FK_STR:
        dst[0] = 0;
        break;
    case FK_INTS:
        ((arl_config_ints *)dst)->n = -1;
        break;
    case FK_STRS:
        ((arl_config_strs *)dst)->n = -1;
        break;
    }
}

static int field_is_absent(const cfield *f, const void *base) {
    const char *src = (const char *)base + f->off;
    switch (f->kind) {
    case FK_INT:
        return *(const int64_t *)src == ARL_CONFIG_ABSENT;
    case FK_FLOAT:
        return isnan(*(const double *)src);
    case FK_BOOL:
        return *(const int32_t *)src < 0;
    case FK_STR:
        return src[0] == 0;
    case FK_INTS:
        return ((const arl_config_ints *)src)->n < 0;
    case FK_STRS:
        return ((const arl_config_strs *)src)->n < 0;
    }
    return 0;
}

typedef struct unknown_list {
    sbuf names;
    int count;
} unknown_list;

/* Fill base from object obj with table tab; record keys not in tab (and not in `nested`)
 * as unknown. */
static arl_status parse_object(const json_t *obj, const cfield *tab, size_t n, void *base,
                               const char *where, const char *path, const char *const *nested,
                               unknown_list *unk) {
    for (size_t i = 0; i < n; i++) {
        const cfield *f = &tab[i];
        const json_t *v = json_object_get(obj, f->name);
        if (!v && !strcmp(f->name, "dtype")) v = json_object_get(obj, "torch_dtype");
        if (v) {
            ARL_TRY(field_set(f, v, base, where, path));
        } else if (f->flags & FF_REQ) {
            return arl_errorf(ARL_ERR_CONFIG, "%s: missing required field '%s%s' (expected %s)",
                              where, path, f->name, kind_expect(f));
        } else if (f->def) {
            json_t *d = arl_json_loads(f->def, JSON_DECODE_ANY, NULL);
            if (!d) /* the defaults are valid JSON: only out of memory */
                return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory reading the default of '%s%s'",
                                  where, path, f->name);
            arl_status s = field_set(f, d, base, where, path);
            json_decref(d);
            ARL_TRY(s);
        } else {
            field_set_absent(f, base);
        }
    }
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)obj, key, val) {
        int known = 0;
        for (size_t i = 0; i < n && !known; i++)
            known = !strcmp(tab[i].name, key);
        for (size_t i = 0; nested && nested[i] && !known; i++)
            known = !strcmp(nested[i], key);
        if (!strcmp(key, "torch_dtype") && !json_object_get(obj, "dtype") &&
            (tab == text_fields || tab == top_fields))
            known = 1;
        if (known) continue;
        if (unk->count) sb_puts(&unk->names, ", ");
        sb_printf(&unk->names, "%s%s", path, key);
        unk->count++;
    }
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------ */
/* validation                                                                            */

#define CFGERR(...) arl_errorf(ARL_ERR_CONFIG, __VA_ARGS__)

static arl_status check_pos(const char *where, const char *path, int64_t v) {
    if (v <= 0)
        return CFGERR("%s: field '%s': expected a positive integer, got %lld", where, path,
                      (long long)v);
    return ARL_OK;
}

static arl_status check_token(const char *where, const char *path, int64_t v, int64_t V) {
    if (v < 0 || v >= V)
        return CFGERR("%s: field '%s': expected a token id in [0, %lld) (vocab_size), got %lld",
                      where, path, (long long)V, (long long)v);
    return ARL_OK;
}

static arl_status check_layer_lists(const char *where, arl_model_config *cfg) {
    const arl_linear_attn_config *la = &cfg->text.linear_attn_config;
    int64_t L = cfg->text.num_hidden_layers;
    uint8_t *seen = calloc((size_t)L + 1, 1); /* bit 1: kda, bit 2: full */
    if (!seen) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", where);
    const arl_config_ints *lists[2] = {&la->kda_layers, &la->full_attn_layers};
    const char *names[2] = {"kda_layers", "full_attn_layers"};
    arl_status s = ARL_OK;
    for (int w = 0; w < 2 && s == ARL_OK; w++) {
        for (int64_t i = 0; i < lists[w]->n; i++) {
            int64_t x = lists[w]->v[i];
            if (x < 1 || x > L) {
                s = CFGERR("%s: field 'text_config.linear_attn_config.%s': expected 1-based layer "
                           "numbers in [1, %lld] (num_hidden_layers), got %lld",
                           where, names[w], (long long)L, (long long)x);
                break;
            }
            if (seen[x] & (1u << w)) {
                s = CFGERR("%s: field 'text_config.linear_attn_config.%s': layer %lld is listed "
                           "twice",
                           where, names[w], (long long)x);
                break;
            }
            if (seen[x]) {
                s = CFGERR("%s: field 'text_config.linear_attn_config.%s': layer %lld is also in "
                           "'%s' (the lists must be disjoint)",
                           where, names[w], (long long)x, names[1 - w]);
                break;
            }
            seen[x] |= (uint8_t)(1u << w);
        }
    }
    for (int64_t x = 1; x <= L && s == ARL_OK; x++)
        if (!seen[x])
            s = CFGERR(
                "%s: field 'text_config.linear_attn_config.kda_layers': layer %lld (1-based) "
                "is in neither kda_layers nor full_attn_layers (together they must cover "
                "1..%lld)",
                where, (long long)x, (long long)L);
    if (s == ARL_OK) {
        uint8_t *kind = malloc((size_t)L);
        if (!kind) {
            free(seen);
            return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", where);
        }
        for (int64_t l = 0; l < L; l++)
            kind[l] = (seen[l + 1] & 2) ? ARL_LAYER_MLA : ARL_LAYER_KDA;
        free(cfg->layer_kind);
        cfg->layer_kind = kind;
    }
    free(seen);
    return s;
}

static int str_in(const char *s, const char *const *set) {
    for (; *set; set++)
        if (!strcmp(s, *set)) return 1;
    return 0;
}

static arl_status config_check(arl_model_config *cfg) {
    const char *w = cfg->path[0] ? cfg->path : "config";
    arl_text_config *t = &cfg->text;
    arl_linear_attn_config *la = &t->linear_attn_config;
#define POS(field) ARL_TRY(check_pos(w, "text_config." #field, t->field))
    POS(vocab_size);
    POS(hidden_size);
    POS(num_hidden_layers);
    if (t->num_hidden_layers > 100000)
        return CFGERR("%s: field 'text_config.num_hidden_layers': expected at most 100000, got "
                      "%lld",
                      w, (long long)t->num_hidden_layers);
    if (t->first_k_dense_replace < 0 || t->first_k_dense_replace > t->num_hidden_layers)
        return CFGERR("%s: field 'text_config.first_k_dense_replace': expected an integer in "
                      "[0, %lld] (num_hidden_layers), got %lld",
                      w, (long long)t->num_hidden_layers, (long long)t->first_k_dense_replace);
    if (t->first_k_dense_replace > 0)
        POS(intermediate_size);
    else if (t->intermediate_size < 0)
        return CFGERR("%s: field 'text_config.intermediate_size': expected a non-negative "
                      "integer, got %lld",
                      w, (long long)t->intermediate_size);
    if (t->moe_layer_freq != 1)
        return CFGERR("%s: field 'text_config.moe_layer_freq': expected 1 (every layer from "
                      "first_k_dense_replace on is MoE), got %lld",
                      w, (long long)t->moe_layer_freq);
    POS(num_attention_heads);
    if (t->num_key_value_heads != t->num_attention_heads)
        return CFGERR("%s: field 'text_config.num_key_value_heads': expected %lld (equal to "
                      "num_attention_heads), got %lld",
                      w, (long long)t->num_attention_heads, (long long)t->num_key_value_heads);
    if (t->q_lora_rank < 0)
        return CFGERR("%s: field 'text_config.q_lora_rank': expected a positive integer or null, "
                      "got %lld",
                      w, (long long)t->q_lora_rank);
    POS(kv_lora_rank);
    POS(qk_nope_head_dim);
    if (t->qk_rope_head_dim < 0)
        return CFGERR("%s: field 'text_config.qk_rope_head_dim': expected a non-negative integer, "
                      "got %lld",
                      w, (long long)t->qk_rope_head_dim);
    POS(v_head_dim);
    if (!t->mla_use_nope)
        return CFGERR("%s: field 'text_config.mla_use_nope': expected true (RoPE is not "
                      "supported: the model is NoPE), got false",
                      w);
    ARL_TRY(check_pos(w, "text_config.linear_attn_config.head_dim", la->head_dim));
    ARL_TRY(check_pos(w, "text_config.linear_attn_config.num_heads", la->num_heads));
    ARL_TRY(check_pos(w, "text_config.linear_attn_config.short_conv_kernel_size",
                      la->short_conv_kernel_size));
    if (!isnan(la->gate_lower_bound) && !(la->gate_lower_bound >= -5.0 && la->gate_lower_bound < 0))
        return CFGERR("%s: field 'text_config.linear_attn_config.gate_lower_bound': expected null "
                      "or a number in [-5, 0), got %g",
                      w, la->gate_lower_bound);
    ARL_TRY(check_layer_lists(w, cfg));
    POS(num_experts);
    if (t->num_experts_per_token <= 0 || t->num_experts_per_token >= t->num_experts)
        return CFGERR("%s: field 'text_config.num_experts_per_token': expected 0 < k < %lld "
                      "(num_experts), got %lld",
                      w, (long long)t->num_experts, (long long)t->num_experts_per_token);
    if (t->num_shared_experts < 0)
        return CFGERR("%s: field 'text_config.num_shared_experts': expected a non-negative "
                      "integer, got %lld",
                      w, (long long)t->num_shared_experts);
    POS(moe_intermediate_size);
    POS(routed_expert_hidden_size);
    if (strcmp(t->moe_router_activation_func, "sigmoid"))
        return CFGERR("%s: field 'text_config.moe_router_activation_func': expected \"sigmoid\", "
                      "got \"%s\"",
                      w, t->moe_router_activation_func);
    if (!t->moe_renormalize)
        return CFGERR("%s: field 'text_config.moe_renormalize': expected true, got false", w);
    if (!(t->routed_scaling_factor > 0))
        return CFGERR("%s: field 'text_config.routed_scaling_factor': expected a positive number, "
                      "got %g",
                      w, t->routed_scaling_factor);
    if (t->num_expert_group != 1)
        return CFGERR("%s: field 'text_config.num_expert_group': expected 1 (grouped top-k is "
                      "not supported), got %lld",
                      w, (long long)t->num_expert_group);
    if (t->topk_group != 1)
        return CFGERR("%s: field 'text_config.topk_group': expected 1, got %lld", w,
                      (long long)t->topk_group);
    static const char *const topk_methods[] = {"noaux_tc", "greedy", NULL};
    if (!str_in(t->topk_method, topk_methods))
        return CFGERR("%s: field 'text_config.topk_method': expected \"noaux_tc\" or \"greedy\", "
                      "got \"%s\"",
                      w, t->topk_method);
    static const char *const acts[] = {"situ", "silu", NULL};
    if (!str_in(t->hidden_act, acts))
        return CFGERR("%s: field 'text_config.hidden_act': expected \"situ\" or \"silu\", got "
                      "\"%s\"",
                      w, t->hidden_act);
    if (!(t->activation_situ_beta > 0))
        return CFGERR("%s: field 'text_config.activation_situ_beta': expected a positive number, "
                      "got %g",
                      w, t->activation_situ_beta);
    if (!(t->activation_situ_linear_beta > 0))
        return CFGERR("%s: field 'text_config.activation_situ_linear_beta': expected a positive "
                      "number, got %g",
                      w, t->activation_situ_linear_beta);
    if (t->attn_res_block_size < 0)
        return CFGERR("%s: field 'text_config.attn_res_block_size': expected null or an integer "
                      ">= 1, got %lld",
                      w, (long long)t->attn_res_block_size);
    if (!(t->rms_norm_eps > 0))
        return CFGERR("%s: field 'text_config.rms_norm_eps': expected a positive number, got %g", w,
                      t->rms_norm_eps);
    if (!(t->initializer_range > 0))
        return CFGERR("%s: field 'text_config.initializer_range': expected a positive number, "
                      "got %g",
                      w, t->initializer_range);
    POS(max_position_embeddings);
    if (t->tie_word_embeddings)
        return CFGERR("%s: field 'text_config.tie_word_embeddings': expected false (lm_head is "
                      "untied from embed_tokens), got true",
                      w);
    if (t->num_nextn_predict_layers != 0)
        return CFGERR("%s: field 'text_config.num_nextn_predict_layers': expected 0 "
                      "(multi-token prediction layers are not supported), got %lld",
                      w, (long long)t->num_nextn_predict_layers);
    ARL_TRY(check_token(w, "text_config.bos_token_id", t->bos_token_id, t->vocab_size));
    ARL_TRY(check_token(w, "text_config.eos_token_id", t->eos_token_id, t->vocab_size));
    ARL_TRY(check_token(w, "text_config.pad_token_id", t->pad_token_id, t->vocab_size));
    static const char *const dtypes[] = {"bfloat16", "float32", NULL};
    if (!str_in(t->dtype, dtypes))
        return CFGERR("%s: field 'text_config.dtype': expected \"bfloat16\" or \"float32\", got "
                      "\"%s\"",
                      w, t->dtype);
#undef POS

    /* top level */
    if (cfg->tie_word_embeddings > 0)
        return CFGERR("%s: field 'tie_word_embeddings': expected false (lm_head is untied), got "
                      "true",
                      w);
    if (cfg->dtype[0] && !str_in(cfg->dtype, dtypes))
        return CFGERR("%s: field 'dtype': expected \"bfloat16\" or \"float32\", got \"%s\"", w,
                      cfg->dtype);
    const int64_t *top_ids[4] = {&cfg->bos_token_id, &cfg->eos_token_id, &cfg->pad_token_id,
                                 &cfg->media_placeholder_token_id};
    const char *top_names[4] = {"bos_token_id", "eos_token_id", "pad_token_id",
                                "media_placeholder_token_id"};
    for (int i = 0; i < 4; i++)
        if (*top_ids[i] != ARL_CONFIG_ABSENT)
            ARL_TRY(check_token(w, top_names[i], *top_ids[i], t->vocab_size));

    /* vision */
    if (cfg->has_vision) {
        arl_vision_config *v = &cfg->vision;
#define VPOS(field) ARL_TRY(check_pos(w, "vision_config." #field, v->field))
        VPOS(patch_size);
        VPOS(init_pos_emb_height);
        VPOS(init_pos_emb_width);
        VPOS(init_pos_emb_time);
        VPOS(vt_hidden_size);
        if (v->vt_num_hidden_layers < 0)
            return CFGERR("%s: field 'vision_config.vt_num_hidden_layers': expected a "
                          "non-negative integer, got %lld",
                          w, (long long)v->vt_num_hidden_layers);
        VPOS(vt_num_attention_heads);
        VPOS(qkv_hidden_size);
        VPOS(vt_intermediate_size);
#undef VPOS
        if (v->qkv_hidden_size % v->vt_num_attention_heads)
            return CFGERR("%s: field 'vision_config.qkv_hidden_size': expected a multiple of "
                          "vt_num_attention_heads (%lld), got %lld",
                          w, (long long)v->vt_num_attention_heads, (long long)v->qkv_hidden_size);
        if (v->merge_kernel_size.n != 2 || v->merge_kernel_size.v[0] != 2 ||
            v->merge_kernel_size.v[1] != 2)
            return CFGERR("%s: field 'vision_config.merge_kernel_size': expected [2, 2] (the only "
                          "supported merge)",
                          w);
        if (v->mm_hidden_size != v->vt_hidden_size)
            return CFGERR("%s: field 'vision_config.mm_hidden_size': expected %lld (equal to "
                          "vt_hidden_size), got %lld",
                          w, (long long)v->vt_hidden_size, (long long)v->mm_hidden_size);
        if (v->text_hidden_size != t->hidden_size)
            return CFGERR("%s: field 'vision_config.text_hidden_size': expected %lld (equal to "
                          "text_config.hidden_size), got %lld",
                          w, (long long)t->hidden_size, (long long)v->text_hidden_size);
        if (!(v->projector_ln_eps > 0))
            return CFGERR("%s: field 'vision_config.projector_ln_eps': expected a positive number, "
                          "got %g",
                          w, v->projector_ln_eps);
        const int32_t *biases[3] = {&v->attn_bias, &v->linear_bias, &v->patch_embed_proj_bias};
        const char *bnames[3] = {"attn_bias", "linear_bias", "patch_embed_proj_bias"};
        for (int i = 0; i < 3; i++)
            if (*biases[i])
                return CFGERR("%s: field 'vision_config.%s': expected false (the model has no "
                              "biases), got true",
                              w, bnames[i]);
        if (strcmp(v->norm_type, "rmsnorm"))
            return CFGERR("%s: field 'vision_config.norm_type': expected \"rmsnorm\", got \"%s\"",
                          w, v->norm_type);
        if (strcmp(v->mlp_type, "mlp2"))
            return CFGERR("%s: field 'vision_config.mlp_type': expected \"mlp2\", got \"%s\"", w,
                          v->mlp_type);
        if (strcmp(v->merge_type, "sd2_tpool"))
            return CFGERR("%s: field 'vision_config.merge_type': expected \"sd2_tpool\", got "
                          "\"%s\"",
                          w, v->merge_type);
        if (strcmp(v->mm_projector_type, "patchmergerv2"))
            return CFGERR("%s: field 'vision_config.mm_projector_type': expected "
                          "\"patchmergerv2\", got \"%s\"",
                          w, v->mm_projector_type);
    }

    /* derived sizes */
    arl_model_dims *D = &cfg->dims;
    memset(D, 0, sizeof *D);
    D->d = t->hidden_size;
    D->L = t->num_hidden_layers;
    D->V = t->vocab_size;
    D->H = la->num_heads;
    D->dk = D->dv = la->head_dim;
    D->P = D->H * D->dk;
    D->W = la->short_conv_kernel_size;
    D->Hm = t->num_attention_heads;
    D->rq = t->q_lora_rank;
    D->rkv = t->kv_lora_rank;
    D->n = t->qk_nope_head_dim;
    D->r = t->qk_rope_head_dim;
    D->vm = t->v_head_dim;
    D->E = t->num_experts;
    D->k = t->num_experts_per_token;
    D->f = t->moe_intermediate_size;
    D->dz = t->routed_expert_hidden_size;
    D->ns = t->num_shared_experts;
    D->fs = D->ns * D->f;
    D->fd = t->intermediate_size;
    D->B = t->attn_res_block_size;
    for (int64_t l = 0; l < D->L; l++) {
        if (cfg->layer_kind[l] == ARL_LAYER_MLA)
            D->n_mla++;
        else
            D->n_kda++;
    }
    D->n_dense = t->first_k_dense_replace;
    D->n_moe = D->L - D->n_dense;
    D->a_log_padded = (D->H + 127) / 128 * 128;
    if (cfg->has_vision) {
        D->vD = cfg->vision.vt_hidden_size;
        D->vQ = cfg->vision.qkv_hidden_size;
        D->vF = cfg->vision.vt_intermediate_size;
        D->vL = cfg->vision.vt_num_hidden_layers;
        D->vp = cfg->vision.patch_size;
        D->vGh = cfg->vision.init_pos_emb_height;
        D->vGw = cfg->vision.init_pos_emb_width;
        D->vheads = cfg->vision.vt_num_attention_heads;
    }
    /* the model's size: its counts and memory must be exact int64 values */
    arl_param_counts pc;
    arl_param_counts_compute(cfg, &pc);
    if (pc.total_params == INT64_MAX)
        return CFGERR("%s: the model has more than 2^63 parameters (at most 2^50 are handled)", w);
    if (pc.total_params > ARL_MODEL_MAX_PARAMS)
        return CFGERR("%s: the model has %lld parameters, more than the 2^50 handled", w,
                      (long long)pc.total_params);
    arl_model_memory mem;
    arl_model_memory_compute(cfg, &mem);
    _Static_assert(sizeof mem % sizeof(int64_t) == 0, "arl_model_memory holds int64 sizes only");
    const int64_t *mv = (const int64_t *)&mem;
    for (size_t i = 0; i < sizeof mem / sizeof *mv; i++)
        if (mv[i] == INT64_MAX)
            return CFGERR("%s: the model's state or cache per sequence is beyond 2^63 bytes", w);
    return ARL_OK;
}

arl_status arl_model_config_validate(arl_model_config *cfg) {
    return config_check(cfg);
}

/* ------------------------------------------------------------------------------------ */
/* public: parse / read / free / copy                                                    */

static void free_lists(arl_model_config *cfg) {
    free(cfg->text.linear_attn_config.full_attn_layers.v);
    free(cfg->text.linear_attn_config.kda_layers.v);
    free(cfg->vision.merge_kernel_size.v);
}

void arl_model_config_free(arl_model_config *cfg) {
    if (!cfg) return;
    free_lists(cfg);
    free(cfg->layer_kind);
    free(cfg->ignored_fields);
    if (cfg->json) json_decref((json_t *)cfg->json);
    memset(cfg, 0, sizeof *cfg);
}

static const char *const text_nested[] = {"linear_attn_config", NULL};
static const char *const top_nested[] = {"text_config", "vision_config", NULL};

arl_status arl_model_config_parse(const char *text, const char *where, int quiet,
                                  arl_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    if (!where) where = "config.json";
    snprintf(cfg->path, sizeof cfg->path, "%s", where);
    json_error_t jerr;
    json_t *root = arl_json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        memset(cfg, 0, sizeof *cfg);
        if (arl_json_error_nomem(&jerr))
            return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory reading the JSON", where);
        return arl_errorf(ARL_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", where,
                          jerr.line, jerr.column, jerr.text);
    }
    cfg->json = root;
    unknown_list unk = {{0}, 0};
    arl_status s = ARL_OK;
    char got[96];
    if (!json_is_object(root)) {
        s = arl_errorf(ARL_ERR_CONFIG, "%s: expected a JSON object at the top level, got %s", where,
                       describe(root, got, sizeof got));
        goto fail;
    }
    s = parse_object(root, top_fields, NFIELDS(top_fields), cfg, where, "", top_nested, &unk);
    if (s) goto fail;
    json_t *tc = json_object_get(root, "text_config");
    if (!tc || !json_is_object(tc)) {
        s = tc ? arl_errorf(ARL_ERR_CONFIG, "%s: field 'text_config': expected an object, got %s",
                            where, describe(tc, got, sizeof got))
               : arl_errorf(ARL_ERR_CONFIG,
                            "%s: missing required field 'text_config' (expected an object with "
                            "the text model's fields, spec/policy.md section 12.1)",
                            where);
        goto fail;
    }
    s = parse_object(tc, text_fields, NFIELDS(text_fields), &cfg->text, where, "text_config.",
                     text_nested, &unk);
    if (s) goto fail;
    json_t *la = json_object_get(tc, "linear_attn_config");
    if (!la || !json_is_object(la)) {
        s = la ? arl_errorf(
                     ARL_ERR_CONFIG,
                     "%s: field 'text_config.linear_attn_config': expected an object, got %s",
                     where, describe(la, got, sizeof got))
               : arl_errorf(ARL_ERR_CONFIG,
                            "%s: missing required field 'text_config.linear_attn_config' (expected "
                            "an object)",
                            where);
        goto fail;
    }
    s = parse_object(la, linear_fields, NFIELDS(linear_fields), &cfg->text.linear_attn_config,
                     where, "text_config.linear_attn_config.", NULL, &unk);
    if (s) goto fail;
    json_t *vc = json_object_get(root, "vision_config");
    if (vc && !json_is_null(vc)) {
        if (!json_is_object(vc)) {
            s = arl_errorf(ARL_ERR_CONFIG,
                           "%s: field 'vision_config': expected an object or null, got %s", where,
                           describe(vc, got, sizeof got));
            goto fail;
        }
        cfg->has_vision = 1;
        s = parse_object(vc, vision_fields, NFIELDS(vision_fields), &cfg->vision, where,
                         "vision_config.", NULL, &unk);
        if (s) goto fail;
    }
    s = config_check(cfg);
    if (s) goto fail;
    if (unk.count) {
        cfg->ignored_fields = sb_take(&unk.names);
        unk.names.p = NULL;
        if (!quiet && cfg->ignored_fields)
            arl_log_warn("%s: ignoring %d field%s agentrl does not use: %s", where, unk.count,
                         unk.count == 1 ? "" : "s", cfg->ignored_fields);
    }
    free(unk.names.p);
    return ARL_OK;
fail:
    free(unk.names.p);
    arl_model_config_free(cfg);
    return s;
}

arl_status arl_model_config_read(const char *path, arl_model_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    char file[1024];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(file, sizeof file, "%s/config.json", path);
    else
        snprintf(file, sizeof file, "%s", path);
    char *text;
    ARL_TRY(arl_file_read(file, 0, &text, NULL));
    arl_status s = arl_model_config_parse(text, file, 0, cfg);
    free(text);
    return s;
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

arl_status arl_model_config_resolve(const char *arg, char *out, size_t cap) {
    struct stat st;
    if (!arg || !*arg) return arl_errorf(ARL_ERR_ARG, "empty config argument");
    if (stat(arg, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            snprintf(out, cap, "%s/config.json", arg);
            if (!is_file(out))
                return arl_errorf(ARL_ERR_NOT_FOUND,
                                  "%s: directory has no config.json (give a config.json file, a "
                                  "directory holding one, or a shipped name: tiny, mini, kimi-k3)",
                                  arg);
            return ARL_OK;
        }
        snprintf(out, cap, "%s", arg);
        return ARL_OK;
    }
    if (strchr(arg, '/') || strstr(arg, ".json"))
        return arl_errorf(ARL_ERR_NOT_FOUND, "%s: no such file or directory", arg);
    /* a shipped config name */
    char dirs[4][1024];
    int nd = 0;
    const char *env = getenv("AGENTRL_CONFIG_DIR");
    if (env && *env) snprintf(dirs[nd++], sizeof dirs[0], "%s", env);
    snprintf(dirs[nd++], sizeof dirs[0], "configs");
    char exe[1024];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(dirs[nd++], sizeof dirs[0], "%.900s/configs", exe);
            snprintf(dirs[nd++], sizeof dirs[0], "%.900s/../configs", exe);
        }
    }
    sbuf tried = {0};
    for (int i = 0; i < nd; i++) {
        snprintf(out, cap, "%s/%s/config.json", dirs[i], arg);
        if (is_file(out)) {
            free(tried.p);
            return ARL_OK;
        }
        if (i) sb_puts(&tried, ", ");
        sb_puts(&tried, dirs[i]);
    }
    arl_status s = arl_errorf(ARL_ERR_NOT_FOUND,
                              "config '%s': not a file or directory, and no shipped config of that "
                              "name in %s (give a path, or set AGENTRL_CONFIG_DIR)",
                              arg, tried.p ? tried.p : "");
    free(tried.p);
    return s;
}

arl_status arl_model_config_load(const char *arg, arl_model_config *cfg) {
    char path[1024];
    memset(cfg, 0, sizeof *cfg);
    ARL_TRY(arl_model_config_resolve(arg, path, sizeof path));
    return arl_model_config_read(path, cfg);
}

static arl_status dup_ints(arl_config_ints *dst, const arl_config_ints *src) {
    dst->v = NULL;
    dst->n = src->n;
    if (!src->v) return ARL_OK;
    size_t n = src->n > 0 ? (size_t)src->n : 0;
    dst->v = malloc((n ? n : 1) * sizeof *dst->v);
    if (!dst->v) return arl_errorf(ARL_ERR_NOMEM, "config copy: out of memory");
    if (n) memcpy(dst->v, src->v, n * sizeof *dst->v);
    return ARL_OK;
}

arl_status arl_model_config_copy(arl_model_config *dst, const arl_model_config *src) {
    *dst = *src;
    dst->text.linear_attn_config.full_attn_layers.v = NULL;
    dst->text.linear_attn_config.kda_layers.v = NULL;
    dst->vision.merge_kernel_size.v = NULL;
    dst->layer_kind = NULL;
    dst->ignored_fields = NULL;
    dst->json = NULL;
    arl_status s = dup_ints(&dst->text.linear_attn_config.full_attn_layers,
                            &src->text.linear_attn_config.full_attn_layers);
    if (!s)
        s = dup_ints(&dst->text.linear_attn_config.kda_layers,
                     &src->text.linear_attn_config.kda_layers);
    if (!s) s = dup_ints(&dst->vision.merge_kernel_size, &src->vision.merge_kernel_size);
    if (!s && src->layer_kind) {
        dst->layer_kind = malloc((size_t)src->text.num_hidden_layers);
        if (!dst->layer_kind)
            s = arl_errorf(ARL_ERR_NOMEM, "config copy: out of memory");
        else
            memcpy(dst->layer_kind, src->layer_kind, (size_t)src->text.num_hidden_layers);
    }
    if (!s && src->ignored_fields && !(dst->ignored_fields = strdup(src->ignored_fields)))
        s = arl_errorf(ARL_ERR_NOMEM, "config copy: out of memory");
    if (!s && src->json && !(dst->json = json_deep_copy((json_t *)src->json)))
        s = arl_errorf(ARL_ERR_NOMEM, "config copy: out of memory");
    if (s) arl_model_config_free(dst);
    return s;
}

/* ------------------------------------------------------------------------------------ */
/* writing                                                                               */

static json_t *field_to_json(const cfield *f, const void *base) {
    const char *src = (const char *)base + f->off;
    switch (f->kind) {
    case FK_INT: {
        int64_t v = *(const int64_t *)src;
        if ((f->flags & FF_NULL) && v == 0) return json_null();
        return json_integer((json_int_t)v);
    }
    case FK_FLOAT: {
        double v = *(const double *)src;
        if (isnan(v)) return json_null();
        return json_real(v);
    }
    case FK_BOOL:
        return json_boolean(*(const int32_t *)src);
    case FK_STR:
        return json_string(src);
    case FK_INTS: {
        const arl_config_ints *L = (const arl_config_ints *)src;
        json_t *a = json_array();
        for (int64_t i = 0; a && i < L->n; i++)
            if (json_array_append_new(a, json_integer((json_int_t)L->v[i]))) {
                json_decref(a); /* out of memory: not a shorter list */
                return NULL;
            }
        return a;
    }
    case FK_STRS: {
        const arl_config_strs *S = (const arl_config_strs *)src;
        json_t *a = json_array();
        for (int32_t i = 0; a && i < S->n; i++)
            if (json_array_append_new(a, json_string(S->v[i]))) {
                json_decref(a);
                return NULL;
            }
        return a;
    }
    }
    return NULL;
}

/* Set every field of tab into obj (in place where the key exists, keeping its position). */
static int set_fields(json_t *obj, const cfield *tab, size_t n, const void *base) {
    for (size_t i = 0; i < n; i++) {
        if ((tab[i].flags & FF_OPT) && field_is_absent(&tab[i], base)) {
            json_object_del(obj, tab[i].name);
            continue;
        }
        json_t *v = field_to_json(&tab[i], base);
        if (!v || json_object_set_new(obj, tab[i].name, v)) return -1;
    }
    return 0;
}

static json_t *child_object(json_t *parent, const char *key) {
    json_t *o = json_object_get(parent, key);
    if (o && json_is_object(o)) return o;
    o = json_object();
    if (!o || json_object_set_new(parent, key, o)) return NULL;
    return o;
}

static void drop_not_written(json_t *obj) {
    for (size_t i = 0; i < sizeof not_written / sizeof not_written[0]; i++)
        json_object_del(obj, not_written[i]);
}

/* The document to write: the preserved original with every known field set from cfg. */
static json_t *config_to_json(const arl_model_config *cfg) {
    json_t *root = cfg->json && json_is_object((json_t *)cfg->json)
                       ? json_deep_copy((json_t *)cfg->json)
                       : json_object();
    if (!root) return NULL;
    if (set_fields(root, top_fields, NFIELDS(top_fields), cfg)) goto fail;
    json_t *tc = child_object(root, "text_config");
    if (!tc || set_fields(tc, text_fields, NFIELDS(text_fields), &cfg->text)) goto fail;
    json_t *la = child_object(tc, "linear_attn_config");
    if (!la || set_fields(la, linear_fields, NFIELDS(linear_fields), &cfg->text.linear_attn_config))
        goto fail;
    if (json_object_get(tc, "dtype")) json_object_del(tc, "torch_dtype");
    if (cfg->dtype[0]) json_object_del(root, "torch_dtype");
    if (cfg->has_vision) {
        json_t *vc = child_object(root, "vision_config");
        if (!vc || set_fields(vc, vision_fields, NFIELDS(vision_fields), &cfg->vision)) goto fail;
    } else {
        json_object_del(root, "vision_config");
    }
    drop_not_written(root);
    drop_not_written(tc);
    return root;
fail:
    json_decref(root);
    return NULL;
}

char *arl_model_config_dumps(const arl_model_config *cfg) {
    json_t *root = config_to_json(cfg);
    if (!root) return NULL;
    sbuf b = {0};
    dump_value(&b, root, 1, 0);
    sb_puts(&b, "\n");
    json_decref(root);
    return sb_take(&b);
}

arl_status arl_model_config_write(const arl_model_config *cfg, const char *path) {
    char *text = arl_model_config_dumps(cfg);
    if (!text) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory serialising the config", path);
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp-XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        arl_status s =
            arl_errorf(ARL_ERR_IO, "%s: cannot create a temporary file: %s", path, strerror(errno));
        free(text);
        return s;
    }
    size_t len = strlen(text), done = 0;
    arl_status s = ARL_OK;
    while (done < len) {
        ssize_t w = write(fd, text + done, len - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            s = arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO, "%s: write failed: %s", tmp,
                           strerror(errno));
            break;
        }
        done += (size_t)w;
    }
    free(text);
    if (!s && fchmod(fd, 0644) != 0) { /* mkstemp creates 0600 */
    }
    if (!s && fsync(fd) != 0)
        s = arl_errorf(ARL_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    if (close(fd) != 0 && !s)
        s = arl_errorf(ARL_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
    if (!s && rename(tmp, path) != 0)
        s = arl_errorf(ARL_ERR_IO, "%s: rename from %s failed: %s", path, tmp, strerror(errno));
    if (s) {
        unlink(tmp);
        return s;
    }
    /* make the rename durable */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    else
        snprintf(dir, sizeof dir, ".");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------ */
/* hash                                                                                  */

char *arl_model_config_canonical_json(const arl_model_config *cfg) {
    json_t *root = json_object();
    json_t *tc = json_object();
    json_t *la = json_object();
    if (!root || !tc || !la) goto fail;
    if (json_object_set_new(root, "text_config", tc)) {
        tc = NULL;
        goto fail;
    }
    if (json_object_set_new(tc, "linear_attn_config", la)) {
        la = NULL;
        tc = NULL;
        goto fail;
    }
    tc = la = NULL; /* owned by root now */
    json_t *t = json_object_get(root, "text_config");
    if (set_fields(t, text_fields, NFIELDS(text_fields), &cfg->text)) goto fail;
    if (set_fields(json_object_get(t, "linear_attn_config"), linear_fields, NFIELDS(linear_fields),
                   &cfg->text.linear_attn_config))
        goto fail;
    if (cfg->has_vision) {
        json_t *vc = json_object();
        if (!vc || json_object_set_new(root, "vision_config", vc)) goto fail;
        if (set_fields(vc, vision_fields, NFIELDS(vision_fields), &cfg->vision)) goto fail;
    }
    sbuf b = {0};
    dump_value(&b, root, 0, 0);
    json_decref(root);
    return sb_take(&b);
fail:
    json_decref(root);
    json_decref(tc);
    json_decref(la);
    return NULL;
}

arl_status arl_model_config_hash(const arl_model_config *cfg, uint8_t out[ARL_SHA256_BYTES]) {
    char *text = arl_model_config_canonical_json(cfg);
    if (!text) {
        memset(out, 0, ARL_SHA256_BYTES);
        return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory computing the config hash",
                          cfg->path[0] ? cfg->path : "model config");
    }
    arl_sha256(text, strlen(text), out);
    free(text);
    return ARL_OK;
}

arl_status arl_model_config_hash_hex(const arl_model_config *cfg, char hex[ARL_SHA256_HEX_CHARS]) {
    uint8_t d[ARL_SHA256_BYTES];
    hex[0] = 0;
    ARL_TRY(arl_model_config_hash(cfg, d));
    arl_sha256_hex(d, hex);
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------ */
/* schedule helpers                                                                      */

arl_layer_kind arl_model_config_layer_kind(const arl_model_config *cfg, int64_t l) {
    ARL_ASSERT(cfg->layer_kind && l >= 0 && l < cfg->text.num_hidden_layers);
    return (arl_layer_kind)cfg->layer_kind[l];
}

int arl_model_config_layer_is_moe(const arl_model_config *cfg, int64_t l) {
    ARL_ASSERT(l >= 0 && l < cfg->text.num_hidden_layers);
    return l >= cfg->text.first_k_dense_replace;
}

int arl_model_config_has_gate_lower_bound(const arl_model_config *cfg) {
    return !isnan(cfg->text.linear_attn_config.gate_lower_bound);
}

int arl_model_config_stores_bf16(const arl_model_config *cfg) {
    return strcmp(cfg->text.dtype, "float32") != 0;
}
