/* replay/select.h: internal: a resolved trajectory selection (replay_filter) and the SQL it
 * becomes on each shard (alias t = trajectories).  Used by list, stats and export. */
#ifndef ARL_REPLAY_SELECT_H
#define ARL_REPLAY_SELECT_H

#include "replay/inspect.h"
#include "replay/internal.h"

#define RSEL_MAX_WHERE 16

typedef struct rsel_where {
    const char *level; /* static */
    char comp[72];     /* '' = reward, '@derived' = derived */
    const char *op;    /* static */
    double value;
} rsel_where;

typedef struct rsel {
    replay_filter f;
    int64_t *run_ids, *group_ids, *env_ids, *task_ids; /* catalog ids the uids resolve to */
    size_t n_run, n_group, n_env, n_task;
    rsel_where where[RSEL_MAX_WHERE];
    int n_where;
    int none;          /* a uid matched nothing: the selection is empty */
    char *pinned_json; /* --pinned: JSON array of the pinned traj_uids (owned) */
} rsel;

arl_status rsel_init(replay_store *st, const replay_filter *f, rsel *s);
void rsel_free(rsel *s);
/* head (e.g. "SELECT ... FROM trajectories t") + " WHERE <filters>" + tail; caller frees.
 * NULL on OOM. */
char *rsel_sql(const rsel *s, const char *head, const char *tail);
void rsel_bind(const rsel *s, sqlite3_stmt *q);

#endif
