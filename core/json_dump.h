/* core/json_dump.h: json_dumps that never returns a text with a part missing.  jansson (2.14)
 * ignores a failed write of an object's key into json_dumps' growing buffer: out of memory, the
 * text it returns can lack a key (valid JSON of another object, or invalid JSON), where it should
 * return NULL.  arl_json_dumps measures the text first (json_dumpb with no buffer: nothing grows)
 * and writes it into one buffer of that size, so any failure is NULL.  Header only (jansson is
 * the caller's dependency). */
#ifndef ARL_CORE_JSON_DUMP_H
#define ARL_CORE_JSON_DUMP_H

#include <jansson.h>
#include <stdlib.h>

/* The text of j (json_dumps' flags), NUL-terminated, for the caller to free; NULL out of memory
 * (or when j cannot be encoded, as json_dumps). */
static inline char *arl_json_dumps(const json_t *j, size_t flags) {
    size_t n = json_dumpb(j, NULL, 0, flags);
    if (!n) return NULL;
    char *b = malloc(n + 1);
    if (!b) return NULL;
    if (json_dumpb(j, b, n, flags) != n) {
        free(b);
        return NULL;
    }
    b[n] = '\0';
    return b;
}

#endif
