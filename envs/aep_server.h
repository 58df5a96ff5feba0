/* envs/aep_server.h: an AEP/1 HTTP front end (libmicrohttpd) for any environment of the C ABI
 * (arl_env_vtable, envs/env.h).  It adds what only HTTP has (spec §2, §8.7 checks 1, 2 and the
 * header part of 4, §12.1 413 handling, Retry-After) and passes bodies through unchanged, so a
 * built-in environment served here is byte-for-byte the same environment as in-process.
 * Not here: session semantics (envs/env_host.c), the `agentrl env serve` command (cli/cmd_env.c).
 */
#ifndef ARL_ENVS_AEP_SERVER_H
#define ARL_ENVS_AEP_SERVER_H

#include <signal.h>
#include <stdint.h>

#include "envs/env.h"

typedef struct arl_aep_server arl_aep_server;

#define ARL_AEP_DEFAULT_CONNECTION_TIMEOUT_S 900 /* = §11.6's default session idle timeout */
#define ARL_AEP_MAX_CONNECTION_TIMEOUT_S 86400

typedef struct arl_aep_server_config {
    const char *host;          /* listen address (IPv4 or IPv6 literal); NULL: "127.0.0.1" */
    int port;                  /* 0: pick a free port (see arl_aep_server_port) */
    const char *token;         /* bearer token required on every request; NULL: none */
    int64_t max_request_bytes; /* 0: /info limits.max_request_bytes */
    int64_t connection_timeout_s; /* a connection idle this long (between requests, or a client
                                     that stops sending mid-request) is closed; 0: 900, else
                                     1 .. ARL_AEP_MAX_CONNECTION_TIMEOUT_S (ARL_ERR_ARG) */
} arl_aep_server_config;

/* Start serving (vt, inst) on a background thread per connection.  vt and inst must outlive
 * the server.  ARL_ERR_ARG (bad host), ARL_ERR_NET (cannot bind), ARL_ERR_PROTOCOL (/info of
 * the environment invalid). */
arl_status arl_aep_server_start(const arl_env_vtable *vt, void *inst, const arl_aep_server_config *cfg,
                                arl_aep_server **out);
/* The bound TCP port. */
int arl_aep_server_port(const arl_aep_server *s);
/* Start draining (new sessions 503 DRAINING, health 503; existing sessions continue). */
void arl_aep_server_drain(arl_aep_server *s);
/* Sessions counting towards max_sessions (from the environment's health body); -1 if unknown
 * (out of memory, or a body without the count). */
int64_t arl_aep_server_active_sessions(arl_aep_server *s);
/* After arl_aep_server_drain: wait until no session is active, counting every 100 ms and
 * reaping idle sessions every 5 s, for at most timeout_ms, or until *stop is nonzero (NULL:
 * never; a second signal).  A count that fails (this process out of memory) never ends the wait
 * as "none left": it is taken as sessions still running and counted again 100 ms later, so a
 * count that keeps failing makes the drain wait its whole timeout.  *left (NULL ok): the last
 * count, -1 when it failed.  ARL_OK when the last count succeeded (0, or sessions left at the
 * timeout or the stop); else the last count's status (ARL_ERR_NOMEM; the message says the drain
 * waited its whole time), for main to exit 1 with. */
arl_status arl_aep_server_drain_wait(arl_aep_server *s, int64_t timeout_ms,
                                     const volatile sig_atomic_t *stop, int64_t *left);
/* Reap idle sessions now (the environment's reap_idle); returns how many. */
int arl_aep_server_reap(arl_aep_server *s);
/* Stop accepting, finish running requests, free (NULL ok).  The environment is not destroyed. */
void arl_aep_server_stop(arl_aep_server *s);

#endif
