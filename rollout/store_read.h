/* rollout/store_read.h: a trajectory's stored environment calls, read back for resuming it
 * (see store_read.c: a read-only workaround until replay/ offers this reader). */
#ifndef ARL_ROLLOUT_STORE_READ_H
#define ARL_ROLLOUT_STORE_READ_H

#include <stddef.h>
#include <stdint.h>

#include "envs/env.h"
#include "replay/replay.h"

typedef struct ro_call {
    int64_t call_seq;
    char endpoint[16];
    int64_t step_index, segment_index; /* -1: NULL */
    int http_status;                   /* -1: NULL */
    int has_error;                     /* error_code set */
    int complete;                      /* response_complete */
    uint8_t sha[32];                   /* response_sha256 when has_sha */
    int has_sha;
    char *request, *response;          /* bodies, NUL-terminated, images restored; owned */
    size_t request_len, response_len;
} ro_call;

typedef struct ro_calls {
    ro_call *v;          /* (n) in call_seq order */
    size_t n;
    int64_t max_seq;
    int64_t *turn_call;  /* (n_turn_call) call_seq of each step's turn, -1 none */
    int64_t n_turn_call;
} ro_calls;

/* Every env_calls row of trajectory traj_id (in its worker file) and the turns' call links. */
arl_status ro_calls_load(replay_store *st, int64_t traj_id, ro_calls *out);
void ro_calls_free(ro_calls *c);
const ro_call *ro_calls_find(const ro_calls *c, int64_t call_seq);
/* The call of step k's turn (create for k = 0), or NULL. */
const ro_call *ro_calls_step(const ro_calls *c, int64_t step);
/* The last complete, error-free score call of segment seg, or NULL. */
const ro_call *ro_calls_segment_score(const ro_calls *c, int64_t seg);
/* The action a stored step call sent (its request body's "action") into *act (cleared first;
 * the caller clears it after use).  ARL_ERR_CORRUPT with why[] filled when c is NULL, has no
 * request body, or the body holds no readable action; ARL_ERR_NOMEM (message set) when this
 * process ran out of memory reading it (not the stored body's fault). */
arl_status ro_call_action(const ro_call *c, arl_env_action *act, char *why, size_t why_size);

#endif
