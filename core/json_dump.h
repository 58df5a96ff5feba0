/* core/json_dump.h: jansson's json_dumps and json_load* without a silent loss out of memory.
 * jansson (<= 2.14) ignores some failed allocations:
 *  - json_dumps ignores a failed write of an object's key into its growing buffer: the text it
 *    returns can lack a key (valid JSON of another object, or invalid JSON), where it should
 *    return NULL.  arl_json_dumps measures the text first (json_dumpb with no buffer: nothing
 *    grows) and writes it into one buffer of that size, so any failure is NULL.
 *  - the parser's lexer drops a byte it cannot save when its token buffer cannot grow
 *    (akheron/jansson#362, lex_save): json_loads can return a document with a byte missing from
 *    a string ("Solve the probem"), a crash or a false syntax error.  arl_json_loads and the
 *    others below watch jansson's allocations (json_set_alloc_funcs; per thread) and return
 *    NULL with json_error_out_of_memory ("out of memory") when one failed during the parse,
 *    whatever jansson made of it.  arl_json_watch installs the watch (once; the wrappers call
 *    it, and main calls it before any thread starts, so that the install races nothing). */
#ifndef ARL_CORE_JSON_DUMP_H
#define ARL_CORE_JSON_DUMP_H

#include <jansson.h>
#include <stdio.h>
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

/* Install the watch of jansson's allocations (idempotent, thread-safe). */
void arl_json_watch(void);

/* The number of jansson's allocations that failed in this thread so far (installs the watch).
 * jansson's builders fail quietly (json_object_set_new of a NULL value leaves the key out): a
 * document built while this count did not move holds everything it was given. */
unsigned long arl_json_alloc_failures(void);

/* Failed allocations of this thread: jansson's (the watch) and those our own code notes with
 * arl_nomem_note where it turns one into an answer rather than a status (the in-process AEP
 * host answers "500 ENV_INTERNAL: out of memory"; the response parser reports a violation).
 * A call that runs in the caller's thread (the client's in-process environment transport)
 * compares the count before and after: when it moved, the outcome is this process's out of
 * memory, not the environment's answer. */
void arl_nomem_note(void);
unsigned long arl_nomem_count(void);

/* json_loads, json_loadb, json_loadf and json_load_file (same arguments and results), but NULL
 * with the error json_error_out_of_memory, text "out of memory", when an allocation of jansson
 * failed while the text was parsed (the document it built may lack a byte). */
json_t *arl_json_loads(const char *text, size_t flags, json_error_t *e);
json_t *arl_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *e);
json_t *arl_json_loadf(FILE *f, size_t flags, json_error_t *e);
json_t *arl_json_load_file(const char *path, size_t flags, json_error_t *e);

/* Whether the failed parse that filled e (arl_json_load* above) failed for want of memory:
 * json_error_out_of_memory, or an empty text (how jansson reports some failed allocations).
 * Such a failure is this process's (ARL_ERR_NOMEM, "out of memory"), never the input's: a site
 * that turns a failed parse into a status, or records it as data (a parse status, a model's
 * malformed tool call, a violation), checks this first.  A site that passes no json_error_t
 * cannot tell; it passes one. */
static inline int arl_json_error_nomem(const json_error_t *e) {
    return json_error_code(e) == json_error_out_of_memory || !e->text[0];
}

#endif
