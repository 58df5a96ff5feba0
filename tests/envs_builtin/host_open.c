/* tests/envs_builtin/host_open.c: open the in-process AEP/1 host of a built-in environment and
 * print its /info body (for host_open_failalloc.sh, which runs it with allocations failing).
 * Usage: envs_host_open NAME.  Exit 0 with the body, or 1 with the error on standard error. */
#include <stdio.h>
#include <stdlib.h>

#include "core/json_dump.h"
#include "core/status.h"
#include "envs/env.h"

int main(int argc, char **argv) {
    arl_json_watch();
    const arl_env_def *def = arl_env_builtin_find(argc > 1 ? argv[1] : "calculator");
    if (!def) {
        fprintf(stderr, "host_open: no built-in environment '%s'\n", argc > 1 ? argv[1] : "");
        return 2;
    }
    void *inst = NULL;
    const arl_env_vtable *vt = NULL;
    arl_status s = arl_env_host_open(def, NULL, NULL, &inst, &vt);
    if (s != ARL_OK) {
        fprintf(stderr, "host_open: error: %s (%s)\n", arl_error_msg(), arl_status_str(s));
        return 1;
    }
    char *body = NULL;
    size_t len = 0;
    int rc = vt->info(inst, &body, &len);
    FILE *out = rc == 200 ? stdout : stderr; /* an answer other than 200 is an error */
    if (rc != 200)                           /* (no body: the host could not allocate its answer) */
        fprintf(stderr, "host_open: error: /info answered %d: %s", rc, body ? "" : "out of memory");
    if (body) fwrite(body, 1, len, out);
    fputc('\n', out);
    if (body) vt->free_buffer(inst, body);
    vt->destroy_instance(inst);
    return rc == 200 ? 0 : 1;
}
