/* replay/jsonout.c: compact JSON text of a jansson value with the shortest decimal form of each
 * real that reads back to the same double ("0.1", not jansson's "0.10000000000000001").  Member
 * order is the object's insertion order; strings are UTF-8 with only '"', '\\' and control
 * characters escaped.  Deterministic: equal values give equal bytes (export round trips). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay/internal.h"

static void put_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"':
            fputs("\\\"", f);
            break;
        case '\\':
            fputs("\\\\", f);
            break;
        case '\b':
            fputs("\\b", f);
            break;
        case '\f':
            fputs("\\f", f);
            break;
        case '\n':
            fputs("\\n", f);
            break;
        case '\r':
            fputs("\\r", f);
            break;
        case '\t':
            fputs("\\t", f);
            break;
        default:
            if (c < 0x20)
                fprintf(f, "\\u%04x", c);
            else
                fputc(c, f);
        }
    }
    fputc('"', f);
}

static void put_real(FILE *f, double v) {
    char buf[40];
    if (!isfinite(v)) { /* not representable in JSON */
        fputs("null", f);
        return;
    }
    for (int p = 1; p <= 17; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, v);
        if (strtod(buf, NULL) == v) break;
    }
    fputs(buf, f);
    if (!strpbrk(buf, ".eEn")) fputs(".0", f); /* keep it a real */
}

void rjson_dump(json_t *j, FILE *f) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *v;
        int first = 1;
        fputc('{', f);
        json_object_foreach(j, k, v) {
            if (!first) fputc(',', f);
            first = 0;
            put_string(f, k, strlen(k));
            fputc(':', f);
            rjson_dump(v, f);
        }
        fputc('}', f);
        break;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *v;
        fputc('[', f);
        json_array_foreach(j, i, v) {
            if (i) fputc(',', f);
            rjson_dump(v, f);
        }
        fputc(']', f);
        break;
    }
    case JSON_STRING:
        put_string(f, json_string_value(j), json_string_length(j));
        break;
    case JSON_INTEGER:
        fprintf(f, "%" JSON_INTEGER_FORMAT, json_integer_value(j));
        break;
    case JSON_REAL:
        put_real(f, json_real_value(j));
        break;
    case JSON_TRUE:
        fputs("true", f);
        break;
    case JSON_FALSE:
        fputs("false", f);
        break;
    default:
        fputs("null", f);
        break;
    }
}

char *rjson_dumps(json_t *j) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    rjson_dump(j, f);
    if (fclose(f)) {
        free(buf);
        return NULL;
    }
    return buf;
}
