/* core/json_dump.c: the watch of jansson's allocations behind arl_json_loads (json_dump.h). */
#include "core/json_dump.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static json_malloc_t watch_prev_malloc;
static _Thread_local unsigned long watch_failed; /* jansson's failed allocations, this thread */
static pthread_once_t watch_once = PTHREAD_ONCE_INIT;

static void *watch_malloc(size_t n) {
    void *p = watch_prev_malloc(n);
    if (!p) watch_failed++;
    return p;
}

static void watch_install(void) {
    json_free_t f;
    json_get_alloc_funcs(&watch_prev_malloc, &f);
    json_set_alloc_funcs(watch_malloc, f);
}

void arl_json_watch(void) {
    pthread_once(&watch_once, watch_install);
}

unsigned long arl_json_alloc_failures(void) {
    arl_json_watch();
    return watch_failed;
}

static _Thread_local unsigned long own_failed; /* arl_nomem_note, this thread */

void arl_nomem_note(void) {
    own_failed++;
}

unsigned long arl_nomem_count(void) {
    arl_json_watch();
    return watch_failed + own_failed;
}

/* j, or NULL (and e says out of memory) when an allocation failed since `before` */
static json_t *watch_check(json_t *j, unsigned long before, json_error_t *e) {
    if (watch_failed == before) return j;
    json_decref(j);
    if (e) {
        memset(e, 0, sizeof *e);
        e->line = e->column = -1;
        snprintf(e->text, sizeof e->text, "out of memory");
        e->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_out_of_memory;
    }
    return NULL;
}

json_t *arl_json_loads(const char *text, size_t flags, json_error_t *e) {
    arl_json_watch();
    const unsigned long before = watch_failed;
    return watch_check(json_loads(text, flags, e), before, e);
}

json_t *arl_json_loadb(const char *buf, size_t len, size_t flags, json_error_t *e) {
    arl_json_watch();
    const unsigned long before = watch_failed;
    return watch_check(json_loadb(buf, len, flags, e), before, e);
}

json_t *arl_json_loadf(FILE *f, size_t flags, json_error_t *e) {
    arl_json_watch();
    const unsigned long before = watch_failed;
    return watch_check(json_loadf(f, flags, e), before, e);
}

json_t *arl_json_load_file(const char *path, size_t flags, json_error_t *e) {
    arl_json_watch();
    const unsigned long before = watch_failed;
    return watch_check(json_load_file(path, flags, e), before, e);
}
