/* envs/aep_json.c: JSON plumbing of AEP/1 (see envs/aep_json.h): strict decoding, member spans,
 * identity comparison, canonical base64, PNG IHDR, SHA-256 and the wire forms of observations
 * and actions.  Response validation is in envs/aep_parse.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "envs/aep_json.h"

#include "core/json_dump.h"
#include "core/sha256.h"

int64_t aep_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t aep_now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- depth and strict decoding ---- */

int aep_json_depth(const char *buf, size_t len, int stop) {
    int depth = 0, maxd = 0;
    for (size_t i = 0; i < len; i++) {
        char c = buf[i];
        if (c == '"') {
            for (i++; i < len && buf[i] != '"'; i++)
                if (buf[i] == '\\') i++;
        } else if (c == '[' || c == '{') {
            if (++depth > maxd) {
                maxd = depth;
                if (maxd > stop) return stop + 1;
            }
        } else if (c == ']' || c == '}') {
            if (depth > 0) depth--;
        }
    }
    return maxd;
}

/* A strict recursive-descent parser producing jansson values.  jansson's own parser is
 * correct but slow for our small bodies (about 8 us for a 250-byte step response); this one
 * checks the same rules (RFC 8259 grammar, UTF-8, surrogate pairs, duplicate member names,
 * finite numbers, integers within json_int_t) and the depth limit while it parses. */
typedef struct jp {
    const char *s, *p, *end;
    int depth, max_depth;
    char *err;
    size_t cap;
    char *buf; /* string scratch */
    size_t bcap;
} jp;

static json_t *jp_fail(jp *j, const char *why) {
    if (j->cap && !j->err[0]) snprintf(j->err, j->cap, "invalid JSON: %s at offset %zu", why, (size_t)(j->p - j->s));
    return NULL;
}

/* a failed allocation of the parser's own (jansson's are counted by core/json_dump.c's watch) */
static json_t *jp_nomem(jp *j) {
    arl_nomem_note();
    return jp_fail(j, "out of memory");
}

static void jp_ws(jp *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

static int jp_hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static int jp_reserve(jp *j, size_t n) {
    if (n <= j->bcap) return 0;
    size_t cap = j->bcap ? j->bcap : 256;
    while (cap < n) cap *= 2;
    char *b = realloc(j->buf, cap);
    if (!b) return -1;
    j->buf = b;
    j->bcap = cap;
    return 0;
}

/* Decode the string at j->p (on the opening quote) into j->buf; returns its length or -1. */
static long jp_string(jp *j) {
    j->p++;
    size_t n = 0;
    for (;;) {
        const char *q = j->p;
        while (q < j->end) { /* fast path: plain ASCII */
            unsigned char c = (unsigned char)*q;
            if (c == '"' || c == '\\' || c < 0x20 || c >= 0x80) break;
            q++;
        }
        size_t run = (size_t)(q - j->p);
        if (jp_reserve(j, n + run + 8)) return jp_nomem(j), -1;
        memcpy(j->buf + n, j->p, run);
        n += run;
        j->p = q;
        if (q >= j->end) return jp_fail(j, "unterminated string"), -1;
        unsigned char c = (unsigned char)*q;
        if (c == '"') {
            j->p++;
            j->buf[n] = 0;
            return (long)n;
        }
        if (c < 0x20) return jp_fail(j, "control character in string"), -1;
        if (c == '\\') {
            if (q + 1 >= j->end) return jp_fail(j, "unterminated escape"), -1;
            char e = q[1];
            j->p = q + 2;
            char out = 0;
            switch (e) {
            case '"': out = '"'; break;
            case '\\': out = '\\'; break;
            case '/': out = '/'; break;
            case 'b': out = '\b'; break;
            case 'f': out = '\f'; break;
            case 'n': out = '\n'; break;
            case 'r': out = '\r'; break;
            case 't': out = '\t'; break;
            case 'u': {
                unsigned cp;
                if (j->end - j->p < 4 || jp_hex4(j->p, &cp)) return jp_fail(j, "invalid \\u escape"), -1;
                j->p += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return jp_fail(j, "unpaired low surrogate"), -1;
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || jp_hex4(j->p + 2, &lo) ||
                        lo < 0xDC00 || lo > 0xDFFF)
                        return jp_fail(j, "unpaired high surrogate"), -1;
                    j->p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                char *b = j->buf + n;
                if (cp < 0x80) {
                    b[0] = (char)cp;
                    n += 1;
                } else if (cp < 0x800) {
                    b[0] = (char)(0xC0 | (cp >> 6));
                    b[1] = (char)(0x80 | (cp & 0x3F));
                    n += 2;
                } else if (cp < 0x10000) {
                    b[0] = (char)(0xE0 | (cp >> 12));
                    b[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    b[2] = (char)(0x80 | (cp & 0x3F));
                    n += 3;
                } else {
                    b[0] = (char)(0xF0 | (cp >> 18));
                    b[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
                    b[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    b[3] = (char)(0x80 | (cp & 0x3F));
                    n += 4;
                }
                continue;
            }
            default: return jp_fail(j, "invalid escape"), -1;
            }
            j->buf[n++] = out;
            continue;
        }
        /* multi-byte UTF-8: shortest form, no surrogates, <= U+10FFFF */
        int k;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) {
            k = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            k = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            k = 3;
            cp = c & 0x07;
        } else {
            return jp_fail(j, "invalid UTF-8"), -1;
        }
        if (j->end - q <= k) return jp_fail(j, "invalid UTF-8"), -1;
        for (int i = 1; i <= k; i++) {
            if (((unsigned char)q[i] & 0xC0) != 0x80) return jp_fail(j, "invalid UTF-8"), -1;
            cp = cp << 6 | ((unsigned char)q[i] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
            return jp_fail(j, "invalid UTF-8"), -1;
        memcpy(j->buf + n, q, (size_t)k + 1);
        n += (size_t)k + 1;
        j->p = q + k + 1;
    }
}

static json_t *jp_number(jp *j) {
    const char *q = j->p;
    int real = 0;
    if (q < j->end && *q == '-') q++;
    if (q >= j->end) return jp_fail(j, "invalid number");
    if (*q == '0')
        q++;
    else if (*q >= '1' && *q <= '9')
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    else
        return jp_fail(j, "invalid number");
    if (q < j->end && *q == '.') {
        real = 1;
        q++;
        if (q >= j->end || *q < '0' || *q > '9') return jp_fail(j, "invalid number");
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    if (q < j->end && (*q == 'e' || *q == 'E')) {
        real = 1;
        q++;
        if (q < j->end && (*q == '+' || *q == '-')) q++;
        if (q >= j->end || *q < '0' || *q > '9') return jp_fail(j, "invalid number");
        while (q < j->end && *q >= '0' && *q <= '9') q++;
    }
    char tmp[64];
    size_t n = (size_t)(q - j->p);
    char *num = n < sizeof tmp ? tmp : malloc(n + 1);
    if (!num) return jp_nomem(j);
    memcpy(num, j->p, n);
    num[n] = 0;
    json_t *v;
    errno = 0;
    if (!real) {
        long long x = strtoll(num, NULL, 10);
        v = errno == ERANGE ? jp_fail(j, "too big integer") : json_integer(x);
    } else {
        double x = strtod(num, NULL);
        v = !isfinite(x) ? jp_fail(j, "real number overflow") : json_real(x);
    }
    if (num != tmp) free(num);
    j->p = q;
    return v;
}

static json_t *jp_value(jp *j);

static json_t *jp_container(jp *j, char open) {
    char close = open == '{' ? '}' : ']';
    if (++j->depth > j->max_depth) return jp_fail(j, "nesting too deep");
    j->p++;
    json_t *v = open == '{' ? json_object() : json_array();
    if (!v) return jp_nomem(j);
    jp_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        j->depth--;
        return v;
    }
    for (;;) {
        jp_ws(j);
        json_t *x = NULL;
        if (open == '{') {
            if (j->p >= j->end || *j->p != '"') goto fail_msg_member;
            long kl = jp_string(j);
            if (kl < 0) goto fail;
            if (memchr(j->buf, 0, (size_t)kl)) {
                jp_fail(j, "NUL in a member name");
                goto fail;
            }
            if (json_object_get(v, j->buf)) {
                jp_fail(j, "duplicate member name");
                goto fail;
            }
            char kb[128];
            char *key = (size_t)kl < sizeof kb ? kb : malloc((size_t)kl + 1);
            if (!key) {
                jp_nomem(j);
                goto fail;
            }
            memcpy(key, j->buf, (size_t)kl + 1);
            jp_ws(j);
            if (j->p >= j->end || *j->p != ':') {
                if (key != kb) free(key);
                jp_fail(j, "expected ':'");
                goto fail;
            }
            j->p++;
            x = jp_value(j);
            int bad = !x || json_object_set_new_nocheck(v, key, x);
            if (key != kb) free(key);
            if (bad) {
                if (x) jp_nomem(j);
                goto fail;
            }
        } else {
            x = jp_value(j);
            if (!x) goto fail;
            if (json_array_append_new(v, x)) {
                jp_nomem(j);
                goto fail;
            }
        }
        jp_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) {
            j->p++;
            j->depth--;
            return v;
        }
        jp_fail(j, open == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
        goto fail;
    }
fail_msg_member:
    jp_fail(j, "expected a member name");
fail:
    json_decref(v);
    return NULL;
}

static json_t *jp_value(jp *j) {
    jp_ws(j);
    if (j->p >= j->end) return jp_fail(j, "unexpected end of input");
    char c = *j->p;
    if (c == '{' || c == '[') return jp_container(j, c);
    if (c == '"') {
        long n = jp_string(j);
        if (n < 0) return NULL;
        json_t *v = json_stringn_nocheck(j->buf, (size_t)n);
        return v ? v : jp_nomem(j);
    }
    if (c == '-' || (c >= '0' && c <= '9')) return jp_number(j);
    if (j->end - j->p >= 4 && !memcmp(j->p, "true", 4)) {
        j->p += 4;
        return json_true();
    }
    if (j->end - j->p >= 5 && !memcmp(j->p, "false", 5)) {
        j->p += 5;
        return json_false();
    }
    if (j->end - j->p >= 4 && !memcmp(j->p, "null", 4)) {
        j->p += 4;
        return json_null();
    }
    return jp_fail(j, "invalid token");
}

json_t *aep_json_loads(const char *buf, size_t len, int max_depth, char *err, size_t cap) {
    jp j = {.s = buf, .p = buf, .end = buf + len, .max_depth = max_depth, .err = err, .cap = cap};
    if (cap) err[0] = 0;
    json_t *v = jp_value(&j);
    if (v) {
        jp_ws(&j);
        if (j.p != j.end) {
            json_decref(v);
            v = jp_fail(&j, "end of input expected");
        }
    }
    if (!v && cap && strstr(err, "nesting too deep")) snprintf(err, cap, "JSON nests deeper than %d levels", max_depth);
    /* every syntax error says what it is: a NULL without a word is a failed allocation (one of
     * jansson's builders) */
    if (!v && cap && !err[0]) snprintf(err, cap, "invalid JSON: out of memory");
    free(j.buf);
    return v;
}

/* Skip a JSON value starting at i (assumes valid JSON); returns the index after it. */
static size_t skip_ws(const char *b, size_t n, size_t i) {
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r')) i++;
    return i;
}
static size_t skip_string(const char *b, size_t n, size_t i) {
    for (i++; i < n && b[i] != '"'; i++)
        if (b[i] == '\\') i++;
    return i < n ? i + 1 : n;
}
static size_t skip_value(const char *b, size_t n, size_t i) {
    if (i >= n) return n;
    if (b[i] == '"') return skip_string(b, n, i);
    if (b[i] == '{' || b[i] == '[') {
        int depth = 0;
        for (; i < n; i++) {
            if (b[i] == '"') {
                i = skip_string(b, n, i) - 1;
            } else if (b[i] == '{' || b[i] == '[') {
                depth++;
            } else if (b[i] == '}' || b[i] == ']') {
                if (--depth == 0) return i + 1;
            }
        }
        return n;
    }
    while (i < n && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' &&
           b[i] != '\r' && b[i] != '\t')
        i++;
    return i;
}

/* Compare the raw key text b[s..e) (without quotes, possibly escaped) with key. */
static int key_equals(const char *b, size_t s, size_t e, const char *key) {
    size_t k = 0;
    for (size_t i = s; i < e; i++) {
        unsigned c = (unsigned char)b[i];
        if (c == '\\' && i + 1 < e) {
            char x = b[++i];
            if (x == 'u' && i + 4 < e) {
                char hex[5] = {b[i + 1], b[i + 2], b[i + 3], b[i + 4], 0};
                c = (unsigned)strtoul(hex, NULL, 16);
                i += 4;
                if (c > 0x7f) return 0; /* keys we look up are ASCII */
            } else {
                c = x == 'n' ? '\n' : x == 't' ? '\t' : x == 'r' ? '\r' : x == 'b' ? '\b'
                    : x == 'f' ? '\f' : (unsigned char)x;
            }
        }
        if (key[k] == 0 || (unsigned char)key[k] != c) return 0;
        k++;
    }
    return key[k] == 0;
}

int aep_json_member_span(const char *b, size_t n, const char *key, size_t *off, size_t *vlen) {
    size_t i = skip_ws(b, n, 0);
    if (i >= n || b[i] != '{') return 0;
    i++;
    for (;;) {
        i = skip_ws(b, n, i);
        if (i >= n || b[i] != '"') return 0;
        size_t ks = i + 1;
        size_t ke = skip_string(b, n, i);
        int match = key_equals(b, ks, ke - 1, key);
        i = skip_ws(b, n, ke);
        if (i >= n || b[i] != ':') return 0;
        i = skip_ws(b, n, i + 1);
        size_t vs = i;
        i = skip_value(b, n, i);
        if (match) {
            *off = vs;
            *vlen = i - vs;
            return 1;
        }
        i = skip_ws(b, n, i);
        if (i >= n || b[i] != ',') return 0;
        i++;
    }
}

int aep_json_ident_equal(const json_t *a, const json_t *b) {
    if (!a || json_is_null(a)) return !b || json_is_null(b);
    if (!b || json_is_null(b)) return 0;
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b))
            return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    if (json_typeof(a) != json_typeof(b)) return 0;
    switch (json_typeof(a)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)a, k, v) {
            if (!aep_json_ident_equal(v, json_object_get(b, k))) return 0;
        }
        json_object_foreach((json_t *)b, k, v) {
            if (!json_is_null(v) && !json_object_get(a, k)) return 0;
        }
        return 1;
    }
    case JSON_ARRAY: {
        if (json_array_size(a) != json_array_size(b)) return 0;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!aep_json_ident_equal(json_array_get(a, i), json_array_get(b, i))) return 0;
        return 1;
    }
    case JSON_STRING:
        return json_string_length(a) == json_string_length(b) &&
               !memcmp(json_string_value(a), json_string_value(b), json_string_length(a));
    default:
        return json_equal((json_t *)a, (json_t *)b);
    }
}

/* The canonical form hashed by aep_json_ident_hash: a type letter, then the value; strings and
 * keys carry their length, objects their non-null members sorted by key. */
static void ident_put(arl_sha256_ctx *c, const char *s, size_t n) {
    arl_sha256_update(c, s, n);
}

static void ident_put_str(arl_sha256_ctx *c, char tag, const char *s, size_t n) {
    char hdr[32];
    int k = snprintf(hdr, sizeof hdr, "%c%zu:", tag, n);
    ident_put(c, hdr, (size_t)k);
    ident_put(c, s, n);
}

typedef struct ident_member {
    const char *key;
    const json_t *val;
} ident_member;

static int ident_member_cmp(const void *a, const void *b) {
    return strcmp(((const ident_member *)a)->key, ((const ident_member *)b)->key);
}

int aep_json_ident_hash(arl_sha256_ctx *c, const json_t *v) {
    char num[48];
    int k;
    if (!v || json_is_null(v)) {
        ident_put(c, "n", 1);
        return 0;
    }
    switch (json_typeof(v)) {
    case JSON_TRUE:
        ident_put(c, "t", 1);
        return 0;
    case JSON_FALSE:
        ident_put(c, "f", 1);
        return 0;
    case JSON_INTEGER:
        k = snprintf(num, sizeof num, "i%lld;", (long long)json_integer_value(v));
        ident_put(c, num, (size_t)k);
        return 0;
    case JSON_REAL: {
        double x = json_real_value(v);
        if (x == floor(x) && fabs(x) <= 9007199254740992.0) /* 2.0 equals 2 (§10.1) */
            k = snprintf(num, sizeof num, "i%lld;", (long long)x);
        else
            k = snprintf(num, sizeof num, "r%.17g;", x);
        ident_put(c, num, (size_t)k);
        return 0;
    }
    case JSON_STRING:
        ident_put_str(c, 's', json_string_value(v), json_string_length(v));
        return 0;
    case JSON_ARRAY: {
        k = snprintf(num, sizeof num, "[%zu:", json_array_size(v));
        ident_put(c, num, (size_t)k);
        for (size_t i = 0; i < json_array_size(v); i++)
            if (aep_json_ident_hash(c, json_array_get(v, i))) return -1;
        ident_put(c, "]", 1);
        return 0;
    }
    case JSON_OBJECT: {
        size_t n = 0;
        ident_member *ms = malloc((json_object_size(v) + 1) * sizeof *ms);
        if (!ms) return -1;
        const char *key;
        json_t *m;
        json_object_foreach((json_t *)v, key, m) {
            if (!json_is_null(m)) ms[n++] = (ident_member){key, m}; /* null equals absent */
        }
        qsort(ms, n, sizeof *ms, ident_member_cmp);
        ident_put(c, "{", 1);
        int rc = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            ident_put_str(c, 'k', ms[i].key, strlen(ms[i].key));
            rc = aep_json_ident_hash(c, ms[i].val);
        }
        ident_put(c, "}", 1);
        free(ms);
        return rc;
    }
    default:
        return -1;
    }
}

int aep_json_get_index(const json_t *obj, const char *key, int64_t *out) {
    const json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v)) return 0;
    json_int_t x = json_integer_value(v);
    if (x < 0 || x > ARL_AEP_MAX_SAFE_INT) return 0;
    *out = (int64_t)x;
    return 1;
}

const char *aep_json_cstr(const json_t *v) {
    if (!json_is_string(v)) return NULL;
    const char *s = json_string_value(v);
    return strlen(s) == json_string_length(v) ? s : NULL;
}

/* ---- base64 ---- */

static const char b64_alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *aep_b64_encode(const uint8_t *d, size_t n, size_t *out_len) {
    size_t m = 4 * ((n + 2) / 3);
    char *s = malloc(m + 1);
    if (!s) return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16;
        if (i + 1 < n) v |= (uint32_t)d[i + 1] << 8;
        if (i + 2 < n) v |= d[i + 2];
        s[j++] = b64_alpha[(v >> 18) & 63];
        s[j++] = b64_alpha[(v >> 12) & 63];
        s[j++] = i + 1 < n ? b64_alpha[(v >> 6) & 63] : '=';
        s[j++] = i + 2 < n ? b64_alpha[v & 63] : '=';
    }
    s[j] = 0;
    if (out_len) *out_len = j;
    return s;
}

static int b64_val(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

int aep_b64_decode_canonical(const char *s, size_t n, uint8_t **out, size_t *out_len) {
    *out = NULL;
    *out_len = 0;
    if (n % 4) return -1;
    size_t pad = 0;
    if (n >= 4 && s[n - 1] == '=') pad = s[n - 2] == '=' ? 2 : 1;
    uint8_t *d = malloc(n / 4 * 3 + 1);
    if (!d) return -2;
    size_t j = 0;
    for (size_t i = 0; i < n; i += 4) {
        int last = i + 4 == n;
        int nv = last ? 4 - (int)pad : 4; /* significant characters of this quad */
        uint32_t x = 0;
        for (int k = 0; k < 4; k++) {
            int v = 0;
            if (k < nv) {
                v = b64_val(s[i + k]);
                if (v < 0) {
                    free(d);
                    return -1;
                }
            }
            x = x << 6 | (uint32_t)v;
        }
        if ((pad == 2 && last && (x & 0xFFFF)) || (pad == 1 && last && (x & 0xFF))) {
            free(d); /* non-zero padding bits: not canonical */
            return -1;
        }
        d[j++] = (uint8_t)(x >> 16);
        if (nv >= 3) d[j++] = (uint8_t)(x >> 8);
        if (nv == 4) d[j++] = (uint8_t)x;
    }
    *out = d;
    *out_len = j;
    return 0;
}

int aep_png_dims(const uint8_t *p, size_t n, int64_t *w, int64_t *h) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
    if (!p || n < 33 || memcmp(p, sig, 8)) return -1;
    uint32_t clen = (uint32_t)p[8] << 24 | (uint32_t)p[9] << 16 | (uint32_t)p[10] << 8 | p[11];
    if (clen != 13 || memcmp(p + 12, "IHDR", 4)) return -1;
    uint32_t ww = (uint32_t)p[16] << 24 | (uint32_t)p[17] << 16 | (uint32_t)p[18] << 8 | p[19];
    uint32_t hh = (uint32_t)p[20] << 24 | (uint32_t)p[21] << 16 | (uint32_t)p[22] << 8 | p[23];
    if (ww == 0 || hh == 0 || ww > 0x7fffffffu || hh > 0x7fffffffu) return -1;
    *w = ww;
    *h = hh;
    return 0;
}

/* ---- SHA-256 (core/sha256.c) ---- */

void aep_sha256_hex(const void *data, size_t len, char hex[65]) {
    uint8_t d[ARL_SHA256_BYTES];
    arl_sha256(data, len, d);
    arl_sha256_hex(d, hex);
}

/* ---- text checks ---- */

int aep_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int k;
        unsigned cp;
        if (c >= 0xC2 && c <= 0xDF) { k = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { k = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 3; cp = c & 0x07; }
        else return 0;
        for (int j = 1; j <= k; j++) {
            if (i + (size_t)j >= n || (p[i + j] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (p[i + j] & 0x3F);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += (size_t)k + 1;
    }
    return 1;
}

static int chars_ok(const char *s, size_t maxlen, const char *extra, int alnum) {
    size_t n = s ? strlen(s) : 0;
    if (n < 1 || n > maxlen) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (alnum && ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) ||
                 (c && strchr(extra, c));
        if (!ok) return 0;
    }
    return 1;
}

int aep_valid_traj_id(const char *s) { return chars_ok(s, ARL_AEP_MAX_ID_BYTES, "._:/@#+-", 1); }
int aep_valid_session_id(const char *s) { return chars_ok(s, ARL_AEP_MAX_SID_BYTES, "._~-", 1); }
int aep_valid_tool_name(const char *s) { return chars_ok(s, 64, "_-", 1); }

int aep_valid_component_name(const char *s) {
    if (!s || !(s[0] >= 'a' && s[0] <= 'z')) return 0;
    size_t n = strlen(s);
    if (n > 64) return 0;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_')) return 0;
    return 1;
}

int aep_valid_env_name(const char *s) {
    if (!s || !((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= '0' && s[0] <= '9'))) return 0;
    size_t n = strlen(s);
    if (n > 64) return 0;
    for (size_t i = 1; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
              s[i] == '.' || s[i] == '-'))
            return 0;
    return 1;
}

int aep_ctype_is_json(const char *ct) {
    if (!ct) return 0;
    while (*ct == ' ') ct++;
    if (strncasecmp(ct, "application/json", 16)) return 0;
    const char *p = ct + 16;
    while (*p == ' ') p++;
    if (*p == 0) return 1;
    if (*p != ';') return 0;
    /* parameters: only charset=utf-8 is allowed */
    const char *cs = strcasestr(p, "charset");
    if (!cs) return 1;
    cs += 7;
    while (*cs == ' ') cs++;
    if (*cs != '=') return 0;
    cs++;
    while (*cs == ' ') cs++;
    if (*cs == '"') cs++;
    return !strncasecmp(cs, "utf-8", 5);
}

/* ---- wire forms ---- */

static int set_new(json_t *o, const char *k, json_t *v) {
    return v ? json_object_set_new(o, k, v) : -1;
}

static json_t *tool_call_json(const arl_env_tool_call *c) {
    json_t *o = json_object();
    if (!o) return NULL;
    if (set_new(o, "id", json_string(c->id ? c->id : "")) ||
        set_new(o, "name", json_string(c->name ? c->name : "")) ||
        set_new(o, "arguments", c->arguments ? json_incref(c->arguments) : json_object())) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *message_json(const arl_env_message *m) {
    json_t *o = json_object();
    if (!o) return NULL;
    int bad = set_new(o, "role", json_string(arl_env_role_str(m->role)));
    if (m->role == ARL_ENV_ROLE_TOOL && !bad)
        bad = set_new(o, "tool_call_id", json_string(m->tool_call_id ? m->tool_call_id : ""));
    if (m->content_is_parts) {
        json_t *arr = json_array();
        bad |= set_new(o, "content", arr);
        for (int32_t i = 0; !bad && i < m->n_parts; i++) {
            const arl_env_part *p = &m->parts[i];
            json_t *po = json_object();
            if (!po || json_array_append_new(arr, po)) { bad = 1; break; }
            if (p->type == ARL_ENV_PART_TEXT) {
                bad |= set_new(po, "type", json_string("text"));
                bad |= set_new(po, "text", json_stringn(p->text ? p->text : "", p->text ? strlen(p->text) : 0));
            } else {
                size_t bl;
                char *b64 = aep_b64_encode(p->image.png, p->image.png_len, &bl);
                json_t *img = json_object();
                bad |= set_new(po, "type", json_string("image"));
                bad |= set_new(po, "image", img);
                if (!b64 || !img) { free(b64); bad = 1; break; }
                bad |= set_new(img, "format", json_string("png"));
                bad |= set_new(img, "width", json_integer(p->image.width));
                bad |= set_new(img, "height", json_integer(p->image.height));
                bad |= set_new(img, "data", json_stringn(b64, bl));
                free(b64);
            }
        }
    } else if (!bad) {
        bad = set_new(o, "content", json_string(m->content ? m->content : ""));
    }
    if (!bad && m->n_tool_calls > 0) {
        json_t *arr = json_array();
        bad = set_new(o, "tool_calls", arr);
        for (int32_t i = 0; !bad && i < m->n_tool_calls; i++)
            bad = json_array_append_new(arr, tool_call_json(&m->tool_calls[i])) ? 1 : 0;
    }
    if (!bad && m->reasoning) bad = set_new(o, "reasoning", json_string(m->reasoning));
    if (!bad && m->is_error) {
        bad = set_new(o, "is_error", json_true());
        if (!bad) bad = set_new(o, "error_code", json_string(m->error_code ? m->error_code : "X_ERROR"));
    }
    if (!bad && m->output_truncated) {
        bad = set_new(o, "output_truncated", json_true());
        if (!bad) bad = set_new(o, "original_bytes", json_integer(m->original_bytes));
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *aep_obs_to_json(const arl_env_observation *ob) {
    json_t *o = json_object();
    json_t *msgs = json_array();
    if (!o || !msgs || set_new(o, "context", json_string(arl_env_context_str(ob->context))) ||
        json_object_set_new(o, "messages", msgs)) {
        json_decref(o);
        return NULL;
    }
    for (int32_t i = 0; i < ob->n_messages; i++) {
        json_t *m = message_json(&ob->messages[i]);
        if (!m || json_array_append_new(msgs, m)) {
            json_decref(o);
            return NULL;
        }
    }
    if (ob->context == ARL_ENV_CONTEXT_RESET &&
        set_new(o, "tools", ob->tools ? json_incref(ob->tools) : json_null())) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *aep_action_to_json_value(const arl_env_action *a) {
    json_t *o = json_object(), *tc = json_array(), *pe = json_array();
    int bad = !o || !tc || !pe;
    if (!bad) bad = set_new(o, "content", json_string(a->content ? a->content : ""));
    if (!bad) bad = set_new(o, "reasoning", a->reasoning ? json_string(a->reasoning) : json_null());
    if (!bad) { bad = json_object_set_new(o, "tool_calls", tc); tc = NULL; }
    for (int32_t i = 0; !bad && i < a->n_tool_calls; i++)
        bad = json_array_append_new(json_object_get(o, "tool_calls"), tool_call_json(&a->tool_calls[i]));
    if (!bad) bad = set_new(o, "parse_status", json_string(arl_env_parse_status_str(a->parse_status)));
    if (!bad) { bad = json_object_set_new(o, "parse_errors", pe); pe = NULL; }
    for (int32_t i = 0; !bad && i < a->n_parse_errors; i++) {
        const arl_env_parse_error *p = &a->parse_errors[i];
        json_t *e = json_object();
        bad = !e || json_array_append_new(json_object_get(o, "parse_errors"), e);
        if (!bad) bad = set_new(e, "id", json_string(p->id ? p->id : ""));
        if (!bad) bad = set_new(e, "status", json_string(arl_env_parse_status_str(p->status)));
        if (!bad) bad = set_new(e, "message", json_string(p->message ? p->message : ""));
        if (!bad) bad = set_new(e, "raw", json_string(p->raw ? p->raw : ""));
    }
    if (!bad) bad = set_new(o, "finish_reason", json_string(arl_env_finish_reason_str(a->finish_reason)));
    if (!bad) bad = set_new(o, "num_tokens", json_integer(a->num_tokens));
    if (tc) json_decref(tc);
    if (pe) json_decref(pe);
    if (bad) {
        if (o) json_decref(o);
        return NULL;
    }
    return o;
}

/* A copy of a JSON string's text (caller frees) in which each U+0000 is replaced by U+FFFD:
 * text members of an action reach the environment as C strings, whole (a model can sample a
 * NUL byte; a tool name "calc\u0000x" must be an unknown tool, not "calc").  NULL on OOM. */
static char *text_dup(const json_t *v) {
    const char *s = json_string_value(v);
    size_t n = json_string_length(v), nul = 0;
    for (size_t i = 0; i < n; i++)
        nul += !s[i];
    char *d = malloc(n + 2 * nul + 1), *q = d;
    if (!d) return NULL;
    for (size_t i = 0; i < n; i++) {
        if (s[i]) {
            *q++ = s[i];
        } else {
            memcpy(q, "\xef\xbf\xbd", 3);
            q += 3;
        }
    }
    *q = 0;
    return d;
}

static int opt_string(const json_t *o, const char *k, char **out, char *err, size_t cap,
                      const char *where) {
    const json_t *v = json_object_get(o, k);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) {
        snprintf(err, cap, "%s/%s: expected a string, got %s", where, k,
                 json_is_object(v) ? "object" : json_is_array(v) ? "array" : "another type");
        return -1;
    }
    if (!(*out = text_dup(v))) {
        arl_nomem_note();
        snprintf(err, cap, "out of memory");
        return -1;
    }
    return 0;
}

int aep_action_from_json(const json_t *v, arl_env_action *a, char *err, size_t cap) {
    memset(a, 0, sizeof *a);
#define AFAIL(...)                                                                                 \
    do {                                                                                           \
        snprintf(err, cap, __VA_ARGS__);                                                           \
        goto fail;                                                                                 \
    } while (0)
    if (!json_is_object(v)) AFAIL("/action: expected an object");
    if (opt_string(v, "content", &a->content, err, cap, "/action")) goto fail;
    if (opt_string(v, "reasoning", &a->reasoning, err, cap, "/action")) goto fail;
    const json_t *ps = json_object_get(v, "parse_status");
    if (!ps) AFAIL("/action/parse_status: required member missing");
    int p = aep_json_cstr(ps) ? arl_env_parse_status_parse(aep_json_cstr(ps)) : -1;
    if (p < 0) AFAIL("/action/parse_status: expected one of ok, no_tool_call, invalid_json, "
                     "arguments_not_object, missing_name, unclosed_block, malformed_structure");
    a->parse_status = (arl_env_parse_status)p;
    const json_t *fr = json_object_get(v, "finish_reason");
    if (fr && !json_is_null(fr)) {
        int f = aep_json_cstr(fr) ? arl_env_finish_reason_parse(aep_json_cstr(fr)) : -1;
        if (f < 0) AFAIL("/action/finish_reason: expected stop, tool_calls or length");
        a->finish_reason = (arl_env_finish_reason)f;
    }
    const json_t *nt = json_object_get(v, "num_tokens");
    if (nt && !json_is_null(nt)) {
        if (!json_is_integer(nt) || json_integer_value(nt) < 0)
            AFAIL("/action/num_tokens: expected a non-negative integer");
        a->num_tokens = json_integer_value(nt);
    }
    const json_t *tc = json_object_get(v, "tool_calls");
    if (tc && !json_is_null(tc)) {
        if (!json_is_array(tc)) AFAIL("/action/tool_calls: expected an array");
        size_t i;
        const json_t *c;
        json_array_foreach(tc, i, c) {
            const json_t *id = json_object_get(c, "id"), *nm = json_object_get(c, "name"),
                         *ar = json_object_get(c, "arguments");
            if (!json_is_object(c)) AFAIL("/action/tool_calls/%zu: expected an object", i);
            if (!json_is_string(id)) AFAIL("/action/tool_calls/%zu/id: expected a string", i);
            if (!json_is_string(nm)) AFAIL("/action/tool_calls/%zu/name: expected a string", i);
            if (!json_is_object(ar)) AFAIL("/action/tool_calls/%zu/arguments: expected an object", i);
            if (!aep_json_cstr(id))
                AFAIL("/action/tool_calls/%zu/id: contains U+0000 (it could not be answered as "
                      "sent)",
                      i);
            char *name = text_dup(nm);
            if (!name || arl_env_action_add_call(a, json_string_value(id), name,
                                                 json_incref((json_t *)ar))) {
                free(name);
                arl_nomem_note();
                AFAIL("out of memory");
            }
            free(name);
        }
    }
    const json_t *pe = json_object_get(v, "parse_errors");
    if (pe && !json_is_null(pe)) {
        if (!json_is_array(pe)) AFAIL("/action/parse_errors: expected an array");
        size_t i;
        const json_t *e;
        json_array_foreach(pe, i, e) {
            const json_t *id = json_object_get(e, "id"), *st = json_object_get(e, "status");
            const json_t *ms = json_object_get(e, "message"), *rw = json_object_get(e, "raw");
            if (!json_is_object(e)) AFAIL("/action/parse_errors/%zu: expected an object", i);
            if (!json_is_string(id)) AFAIL("/action/parse_errors/%zu/id: expected a string", i);
            int s = aep_json_cstr(st) ? arl_env_parse_status_parse(aep_json_cstr(st)) : -1;
            if (s < 0 || s == ARL_ENV_PARSE_OK || s == ARL_ENV_PARSE_NO_TOOL_CALL)
                AFAIL("/action/parse_errors/%zu/status: expected a block status of §4.6", i);
            if (ms && !json_is_null(ms) && !json_is_string(ms))
                AFAIL("/action/parse_errors/%zu/message: expected a string", i);
            if (rw && !json_is_null(rw) && !json_is_string(rw))
                AFAIL("/action/parse_errors/%zu/raw: expected a string", i);
            if (!aep_json_cstr(id))
                AFAIL("/action/parse_errors/%zu/id: contains U+0000 (it could not be answered as "
                      "sent)",
                      i);
            char *m = json_is_string(ms) ? text_dup(ms) : strdup(""),
                 *r = json_is_string(rw) ? text_dup(rw) : strdup("");
            arl_status as = m && r ? arl_env_action_add_parse_error(a, json_string_value(id),
                                                                    (arl_env_parse_status)s, m, r)
                                   : ARL_ERR_NOMEM;
            free(m);
            free(r);
            if (as != ARL_OK) {
                arl_nomem_note();
                AFAIL("out of memory");
            }
        }
    }
    if (arl_env_action_check(a) != ARL_OK) AFAIL("/action: %s", arl_error_msg());
    return 0;
#undef AFAIL
fail:
    arl_env_action_clear(a);
    return -1;
}

json_t *aep_components_to_json(const arl_env_component *c, int32_t n) {
    json_t *o = json_object();
    for (int32_t i = 0; o && i < n; i++)
        if (json_object_set_new(o, c[i].name, json_real(c[i].value))) {
            json_decref(o);
            return NULL;
        }
    return o;
}

char *aep_envelope(arl_env_errcode code, const char *code_str, const char *message,
                   int64_t retry_after_ms, size_t *len) {
    json_t *e = json_object(), *o = json_object();
    if (!e || !o) {
        if (e) json_decref(e);
        if (o) json_decref(o);
        return NULL;
    }
    json_object_set_new(o, "error", e);
    json_object_set_new(e, "code", json_string(code_str ? code_str : arl_env_errcode_str(code)));
    /* messages are cut to 4 KiB at a character boundary and made valid UTF-8 */
    char msg[4096];
    snprintf(msg, sizeof msg, "%s", message ? message : "");
    size_t ml = strlen(msg);
    while (ml > 0 && !aep_utf8_valid(msg, ml)) msg[--ml] = 0;
    json_object_set_new(e, "message", json_string(msg));
    json_object_set_new(e, "retryable", json_boolean(arl_env_errcode_retryable(code)));
    if (retry_after_ms >= 0) json_object_set_new(e, "retry_after_ms", json_integer(retry_after_ms));
    json_object_set_new(e, "attribution",
                        json_string(arl_env_attribution_str(arl_env_errcode_attribution(code))));
    json_object_set_new(e, "details", json_object());
    char *s = aep_json_dumps(o, len);
    json_decref(o);
    return s;
}

/* ---- serialisation (compact; member order kept; reals in their shortest exact form) ---- */

typedef struct sb {
    char *p;
    size_t n, cap;
    int oom;
} sb;

static void sb_need(sb *b, size_t k) {
    if (b->oom || b->n + k + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 512;
    while (cap < b->n + k + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = 1;
        return;
    }
    b->p = p;
    b->cap = cap;
}
static void sb_putn(sb *b, const char *s, size_t k) {
    sb_need(b, k);
    if (b->oom || !k) return;
    memcpy(b->p + b->n, s, k);
    b->n += k;
}
static void sb_puts(sb *b, const char *s) { sb_putn(b, s, strlen(s)); }
static void sb_int(sb *b, long long x) {
    char t[32];
    int k = snprintf(t, sizeof t, "%lld", x);
    sb_putn(b, t, (size_t)k);
}
/* The shortest of %.15g, %.16g, %.17g that reads back exactly; integral values get ".0" so that
 * they stay reals. */
static void sb_real(sb *b, double x) {
    char t[48];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*g", prec, x);
        if (strtod(t, NULL) == x) break;
    }
    if (!strpbrk(t, ".eEn")) strcat(t, ".0");
    sb_puts(b, t);
}
static void sb_str(sb *b, const char *s, size_t k) {
    static const char hex[] = "0123456789abcdef";
    sb_need(b, k + 2);
    sb_putn(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < k; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') {
            run++;
            continue;
        }
        sb_putn(b, s + i - run, run);
        run = 0;
        char e[7] = {'\\', 0, 0, 0, 0, 0, 0};
        size_t el = 2;
        switch (c) {
        case '"': e[1] = '"'; break;
        case '\\': e[1] = '\\'; break;
        case '\n': e[1] = 'n'; break;
        case '\r': e[1] = 'r'; break;
        case '\t': e[1] = 't'; break;
        case '\b': e[1] = 'b'; break;
        case '\f': e[1] = 'f'; break;
        default:
            e[1] = 'u';
            e[2] = '0';
            e[3] = '0';
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            el = 6;
        }
        sb_putn(b, e, el);
    }
    sb_putn(b, s + k - run, run);
    sb_putn(b, "\"", 1);
}
static void sb_json(sb *b, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        sb_putn(b, "{", 1);
        const char *k;
        json_t *x;
        int first = 1;
        json_object_foreach((json_t *)v, k, x) {
            if (!first) sb_putn(b, ",", 1);
            first = 0;
            sb_str(b, k, strlen(k));
            sb_putn(b, ":", 1);
            sb_json(b, x);
        }
        sb_putn(b, "}", 1);
        break;
    }
    case JSON_ARRAY:
        sb_putn(b, "[", 1);
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) sb_putn(b, ",", 1);
            sb_json(b, json_array_get(v, i));
        }
        sb_putn(b, "]", 1);
        break;
    case JSON_STRING: sb_str(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: sb_int(b, (long long)json_integer_value(v)); break;
    case JSON_REAL: sb_real(b, json_real_value(v)); break;
    case JSON_TRUE: sb_puts(b, "true"); break;
    case JSON_FALSE: sb_puts(b, "false"); break;
    default: sb_puts(b, "null"); break;
    }
}

static char *sb_finish(sb *b, size_t *len) {
    sb_need(b, 0);
    if (b->oom || !b->p) {
        free(b->p);
        return NULL;
    }
    b->p[b->n] = 0;
    if (len) *len = b->n;
    return b->p;
}

char *aep_json_dumps(const json_t *v, size_t *len) {
    if (!v) return NULL; /* a document a failed builder did not make (out of memory) */
    sb b = {0};
    sb_need(&b, 64);
    sb_json(&b, v);
    return sb_finish(&b, len);
}

static void sb_cstr(sb *b, const char *s) { sb_str(b, s ? s : "", s ? strlen(s) : 0); }

char *aep_step_request(int64_t step_index, const arl_env_action *a, int64_t deadline_ms, size_t *len) {
    sb b = {0};
    sb_need(&b, 256);
    sb_puts(&b, "{\"step_index\":");
    sb_int(&b, (long long)step_index);
    sb_puts(&b, ",\"action\":{\"content\":");
    sb_cstr(&b, a->content);
    sb_puts(&b, ",\"reasoning\":");
    if (a->reasoning)
        sb_cstr(&b, a->reasoning);
    else
        sb_puts(&b, "null");
    sb_puts(&b, ",\"tool_calls\":[");
    for (int32_t i = 0; i < a->n_tool_calls; i++) {
        const arl_env_tool_call *c = &a->tool_calls[i];
        sb_puts(&b, i ? ",{\"id\":" : "{\"id\":");
        sb_cstr(&b, c->id);
        sb_puts(&b, ",\"name\":");
        sb_cstr(&b, c->name);
        sb_puts(&b, ",\"arguments\":");
        if (c->arguments)
            sb_json(&b, c->arguments);
        else
            sb_puts(&b, "{}");
        sb_puts(&b, "}");
    }
    sb_puts(&b, "],\"parse_status\":\"");
    sb_puts(&b, arl_env_parse_status_str(a->parse_status));
    sb_puts(&b, "\",\"parse_errors\":[");
    for (int32_t i = 0; i < a->n_parse_errors; i++) {
        const arl_env_parse_error *p = &a->parse_errors[i];
        sb_puts(&b, i ? ",{\"id\":" : "{\"id\":");
        sb_cstr(&b, p->id);
        sb_puts(&b, ",\"status\":\"");
        sb_puts(&b, arl_env_parse_status_str(p->status));
        sb_puts(&b, "\",\"message\":");
        sb_cstr(&b, p->message);
        sb_puts(&b, ",\"raw\":");
        sb_cstr(&b, p->raw);
        sb_puts(&b, "}");
    }
    sb_puts(&b, "],\"finish_reason\":\"");
    sb_puts(&b, arl_env_finish_reason_str(a->finish_reason));
    sb_puts(&b, "\",\"num_tokens\":");
    sb_int(&b, (long long)a->num_tokens);
    sb_puts(&b, "},\"deadline_ms\":");
    sb_int(&b, (long long)deadline_ms);
    sb_puts(&b, "}");
    return sb_finish(&b, len);
}
