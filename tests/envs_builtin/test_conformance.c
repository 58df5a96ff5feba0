/* tests/envs_builtin/test_conformance.c: each built-in environment served over HTTP on
 * 127.0.0.1 (envs/aep_server.h around the host of envs/env.h) passes the AEP/1 conformance
 * suite (envs/aep_check.h, spec/aep.md 15) with its script from envs/builtin/conformance/:
 * no MUST check fails (failures the checker marks "internal:" are its own and only
 * reported).  max_sessions is lowered to 64 so that the capacity check stays quick.
 * Usage: test_envs_builtin_conformance [NAME...] (default: all four). */
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "envs/aep_check.h"
#include "envs/aep_server.h"
#include "envs/env.h"
#include "tests/test.h"

static void check_env(const char *name) {
    const arl_env_def *def = arl_env_builtin_find(name);
    CHECK_MSG(def != NULL, "no built-in %s", name);
    if (!def) return;
    arl_env_host_config hc = {.max_sessions = 64};
    void *inst = NULL;
    const arl_env_vtable *vt = NULL;
    CHECK_EQ_INT(arl_env_host_open(def, NULL, &hc, &inst, &vt), ARL_OK);
    if (!inst) return;
    arl_aep_server *srv = NULL;
    arl_aep_server_config sc;
    memset(&sc, 0, sizeof sc);
    arl_status s = arl_aep_server_start(vt, inst, &sc, &srv);
    CHECK_MSG(s == ARL_OK, "%s: server: %s", name, arl_error_msg());
    if (s == ARL_OK) {
        char url[64], rel[128];
        snprintf(url, sizeof url, "http://127.0.0.1:%d", arl_aep_server_port(srv));
        snprintf(rel, sizeof rel, "envs/builtin/conformance/%s.json", name);
        char *script = NULL;
        CHECK_MSG(arl_file_read(test_src_path(rel), 0, &script, NULL) == ARL_OK,
                  "cannot read %s: %s", rel, arl_error_msg());
        arl_check_config cc;
        memset(&cc, 0, sizeof cc);
        cc.url = url;
        cc.script_json = script;
        arl_check_report *rep = calloc(1, sizeof *rep);
        s = arl_aep_check_run(&cc, rep);
        CHECK_MSG(s == ARL_OK, "%s: suite did not run: %s", name, arl_error_msg());
        arl_aep_check_print(stderr, rep);
        /* A failure the checker reports as "internal:" is a fault of the checker itself, not
         * of the environment: it is printed but not held against the environment. */
        for (int i = 0; i < ARL_CHECK_COUNT; i++) {
            const arl_check_item *it = &rep->items[i];
            if (it->result != ARL_CHECK_FAIL) continue;
            if (!strncmp(it->message, "internal:", 9)) {
                fprintf(stderr, "warning: %s: check %d failed inside the checker: %s\n", name,
                        it->id, it->message);
                continue;
            }
            CHECK_MSG(0, "%s: check %d (%s) failed: %s", name, it->id, it->name, it->message);
        }
        free(rep);
        free(script);
        arl_aep_server_stop(srv);
    }
    vt->destroy_instance(inst);
}

int main(int argc, char **argv) {
    static const char *const all[] = {"calculator", "needle", "kvstore", "shapes"};
    if (argc > 1) {
        for (int i = 1; i < argc; i++) check_env(argv[i]);
    } else {
        for (int i = 0; i < 4; i++) check_env(all[i]);
    }
    fprintf(stderr, "%s\n", test_failures_ ? "FAIL" : "ok");
    return test_failures_ ? 1 : 0;
}
