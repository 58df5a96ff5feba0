/* cli/cmd_env.c: `agentrl env serve NAME` (a built-in environment over AEP/1 HTTP) and
 * `agentrl env check URL` (the AEP/1 conformance suite, spec §15).
 * The work is in envs/ (env_host.c, aep_server.c, aep_check.c); this file parses options,
 * handles signals and prints. */
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "core/file.h"
#include "core/log.h"
#include "envs/aep_check.h"
#include "envs/aep_server.h"
#include "envs/env.h"

/* ---- env serve ---- */

typedef struct serve_opts {
    char *name;
    char *host;
    int64_t port;
    int64_t max_sessions;
    int64_t idle_timeout_ms;
    int64_t drain_timeout_ms;
    int64_t connection_timeout_s;
    char *token;
    char *config;
} serve_opts;

static const arl_option serve_tab[] = {
    {"name", ARL_OPT_STRING, offsetof(serve_opts, name), NULL,
     "built-in environment: calculator, needle, kvstore, shapes, or echo (the test "
     "environment of envs/test_env.c)",
     0, 0, NULL, ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "NAME"},
    {"host", ARL_OPT_STRING, offsetof(serve_opts, host), "127.0.0.1",
     "address to listen on (loopback unless told otherwise)", 0, 0, NULL, 0, "ADDR"},
    {"port", ARL_OPT_INT, offsetof(serve_opts, port), "8000",
     "TCP port; 0 picks a free one (printed)", 0, 65535, NULL, 0, "P"},
    {"max-sessions", ARL_OPT_INT, offsetof(serve_opts, max_sessions), "0",
     "lower the environment's limits.max_sessions (0: keep)", 0, 1000000, NULL, 0, "N"},
    {"idle-timeout-ms", ARL_OPT_INT, offsetof(serve_opts, idle_timeout_ms), "0",
     "reap sessions idle this long (0: the environment's limit; else >= 600000)", 0, 1e12, NULL, 0,
     "MS"},
    {"drain-timeout-ms", ARL_OPT_INT, offsetof(serve_opts, drain_timeout_ms), "30000",
     "on SIGTERM/SIGINT, wait this long for sessions to finish before exiting", 0, 1e9, NULL, 0,
     "MS"},
    {"connection-timeout-s", ARL_OPT_INT, offsetof(serve_opts, connection_timeout_s), "900",
     "close a connection idle this long: between requests, or a client that stops sending "
     "mid-request",
     1, ARL_AEP_MAX_CONNECTION_TIMEOUT_S, NULL, 0, "S"},
    {"token", ARL_OPT_STRING, offsetof(serve_opts, token), NULL,
     "require 'Authorization: Bearer TOKEN'", 0, 0, NULL, ARL_OPT_HIDDEN, "TOKEN"},
    {"config", ARL_OPT_STRING, offsetof(serve_opts, config), NULL,
     "environment configuration as a JSON object", 0, 0, NULL, 0, "JSON"},
};

static volatile sig_atomic_t serve_signals;
static volatile sig_atomic_t serve_stop; /* a second signal: stop draining now */

static void on_signal(int sig) {
    (void)sig;
    if (++serve_signals >= 2) serve_stop = 1;
}

static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int cmd_env_serve(int argc, char **argv) {
    serve_opts o;
    static const char *usage = "agentrl env serve NAME [--host 127.0.0.1] [--port P] [options]";
    static const char *summary =
        "Serve a built-in environment over AEP/1 HTTP.  Prints 'listening on http://HOST:PORT' once ready; "
        "SIGTERM or SIGINT drains (new sessions get 503 DRAINING) and exits when sessions are done.";
    int rc = cli_parse(serve_tab, ARL_OPTIONS_COUNT(serve_tab), argc, argv, &o, usage, summary);
    if (rc) return rc < 0 ? 0 : rc;
    int ret = ARL_EXIT_FAIL;
    const arl_env_def *def = arl_env_builtin_find(o.name);
    if (!def) {
        fprintf(stderr, "agentrl: error: no built-in environment named '%s'; available:", o.name);
        for (size_t i = 0; arl_env_builtin_at(i); i++) fprintf(stderr, " %s", arl_env_builtin_at(i)->name);
        fprintf(stderr, "\n");
        arl_options_free(serve_tab, ARL_OPTIONS_COUNT(serve_tab), &o);
        return ARL_EXIT_USAGE;
    }
    if (o.idle_timeout_ms && o.idle_timeout_ms < 600000) {
        fprintf(stderr, "agentrl: error: --idle-timeout-ms must be 0 or >= 600000 (spec §6.1), got %lld\n",
                (long long)o.idle_timeout_ms);
        arl_options_free(serve_tab, ARL_OPTIONS_COUNT(serve_tab), &o);
        return ARL_EXIT_USAGE;
    }
    arl_env_host_config hc = {.max_sessions = o.max_sessions, .session_idle_timeout_ms = o.idle_timeout_ms};
    void *inst = NULL;
    const arl_env_vtable *vt = NULL;
    arl_aep_server *srv = NULL;
    arl_status st = arl_env_host_open(def, o.config, &hc, &inst, &vt);
    if (st != ARL_OK) {
        ret = cli_fail(st);
        goto out;
    }
    arl_aep_server_config sc = {.host = o.host,
                                .port = (int)o.port,
                                .token = o.token,
                                .connection_timeout_s = o.connection_timeout_s};
    st = arl_aep_server_start(vt, inst, &sc, &srv);
    if (st != ARL_OK) {
        ret = cli_fail(st);
        goto out;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    const char *h = o.host;
    int v6 = strchr(h, ':') != NULL;
    printf("agentrl env serve: %s %s (AEP/1)\nlistening on http://%s%s%s:%d\n", def->name, def->version, v6 ? "[" : "",
           h, v6 ? "]" : "", arl_aep_server_port(srv));
    fflush(stdout);
    long tick = 0;
    while (!serve_signals) {
        nap_ms(100);
        if (++tick % 50 == 0) arl_aep_server_reap(srv); /* every 5 s */
    }
    arl_aep_server_drain(srv);
    cli_say("agentrl env serve: draining; waiting up to %lld ms for %lld sessions\n",
            (long long)o.drain_timeout_ms, (long long)arl_aep_server_active_sessions(srv));
    int64_t left = -1;
    st = arl_aep_server_drain_wait(srv, o.drain_timeout_ms, &serve_stop, &left);
    if (st != ARL_OK) {
        ret = cli_fail(st);
        goto out;
    }
    cli_say("agentrl env serve: stopped (%lld sessions left)\n", (long long)left);
    ret = ARL_EXIT_OK;
out:
    arl_aep_server_stop(srv);
    if (inst) vt->destroy_instance(inst);
    arl_options_free(serve_tab, ARL_OPTIONS_COUNT(serve_tab), &o);
    return ret;
}

/* ---- env check ---- */

typedef struct check_opts {
    char *url;
    char *script;
    int json;
    int verbose;
    char *token;
    int64_t step_deadline_ms;
} check_opts;

static const arl_option check_tab[] = {
    {"url", ARL_OPT_STRING, offsetof(check_opts, url), NULL,
     "base URL of the server (http://HOST:PORT, without /aep/v1), or builtin:NAME to check a built-in "
     "environment served on a loopback port",
     0, 0, NULL, ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "URL"},
    {"script", ARL_OPT_STRING, offsetof(check_opts, script), NULL,
     "the environment's conformance script (JSON); default: derived from /info", 0, 0, NULL, 0, "FILE"},
    {"json", ARL_OPT_BOOL, offsetof(check_opts, json), NULL, "write the report as JSON to standard output", 0, 0, NULL,
     0, NULL},
    {"verbose", ARL_OPT_BOOL, offsetof(check_opts, verbose), NULL, "log every request to standard error", 0, 0, NULL,
     0, NULL},
    {"token", ARL_OPT_STRING, offsetof(check_opts, token), NULL, "bearer token to send", 0, 0, NULL, ARL_OPT_HIDDEN,
     "TOKEN"},
    {"step-deadline-ms", ARL_OPT_INT, offsetof(check_opts, step_deadline_ms), "0",
     "deadline_ms of ordinary steps (0: limits.default_step_timeout_ms)", 0, 1e9, NULL, 0, "MS"},
};

int cmd_env_check(int argc, char **argv) {
    check_opts o;
    static const char *usage = "agentrl env check URL [--script FILE] [--json]";
    static const char *summary =
        "Run the AEP/1 conformance suite (spec/aep.md §15) against a server.  Prints pass, fail or skipped per "
        "check; exit status 0 when no MUST check failed, 1 otherwise, 2 for a usage error.";
    int rc = cli_parse(check_tab, ARL_OPTIONS_COUNT(check_tab), argc, argv, &o, usage, summary);
    if (rc) return rc < 0 ? 0 : rc;
    int ret = ARL_EXIT_FAIL;
    char *script = NULL;
    void *inst = NULL;
    const arl_env_vtable *vt = NULL;
    arl_aep_server *srv = NULL;
    char url[600];
    snprintf(url, sizeof url, "%s", o.url);
    if (o.script && arl_file_read(o.script, 0, &script, NULL) != ARL_OK) {
        fprintf(stderr, "agentrl: error: --script: %s\n", arl_error_msg());
        ret = ARL_EXIT_USAGE;
        goto out;
    }
    if (!strncmp(o.url, "builtin:", 8)) {
        const arl_env_def *def = arl_env_builtin_find(o.url + 8);
        if (!def) {
            fprintf(stderr, "agentrl: error: no built-in environment named '%s'\n", o.url + 8);
            ret = ARL_EXIT_USAGE;
            goto out;
        }
        arl_status st = arl_env_host_open(def, NULL, NULL, &inst, &vt);
        arl_aep_server_config sc = {.host = "127.0.0.1", .port = 0};
        if (st == ARL_OK) st = arl_aep_server_start(vt, inst, &sc, &srv);
        if (st != ARL_OK) {
            ret = cli_fail(st);
            goto out;
        }
        snprintf(url, sizeof url, "http://127.0.0.1:%d", arl_aep_server_port(srv));
    } else if (strncmp(o.url, "http://", 7) && strncmp(o.url, "https://", 8)) {
        fprintf(stderr, "agentrl: error: URL '%s' must start with http:// or https:// (or be builtin:NAME)\n", o.url);
        ret = ARL_EXIT_USAGE;
        goto out;
    }
    arl_check_config cfg = {.url = url, .script_json = script, .token = o.token, .verbose = o.verbose,
                            .step_deadline_ms = o.step_deadline_ms};
    arl_check_report rep;
    arl_status st = arl_aep_check_run(&cfg, &rep);
    if (st == ARL_ERR_ARG) { /* (the script's errors) */
        fprintf(stderr, "agentrl: error: %s%s%s%s\n", o.script ? "--script " : "",
                o.script ? o.script : "", o.script ? ": " : "", arl_error_msg());
        ret = ARL_EXIT_USAGE;
        goto out;
    }
    if (st != ARL_OK) {
        ret = cli_fail(st);
        goto out;
    }
    if (o.json) {
        char *j = arl_aep_check_json(&rep);
        if (j) printf("%s\n", j);
        free(j);
        arl_aep_check_print(stderr, &rep);
        if (!j) {
            ret =
                cli_fail(arl_errorf(ARL_ERR_NOMEM, "env check: out of memory writing the report"));
            goto out;
        }
    } else {
        arl_aep_check_print(stdout, &rep);
    }
    ret = arl_aep_check_exit_code(&rep);
out:
    arl_aep_server_stop(srv);
    if (inst) vt->destroy_instance(inst);
    free(script);
    arl_options_free(check_tab, ARL_OPTIONS_COUNT(check_tab), &o);
    return ret;
}
