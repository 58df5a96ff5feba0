/* replay/select.c: trajectory selections (spec section 13.1 filters) turned into one SQL query
 * per shard over `trajectories t`, using the indexes of section 4.14; and the plan log. */
#include <ctype.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "replay/inspect.h"
#include "replay/select.h"

void replay_filter_init(replay_filter *f) {
    memset(f, 0, sizeof *f);
    f->min_tokens = f->max_tokens = f->min_turns = -1;
    f->min_reward = NAN;
    f->version_lo = f->version_hi = -1;
    f->since_ms = f->until_ms = -1;
}

void replay_plan_log_enable(replay_store *st, int on) {
    st->plan.enabled = on;
}

const char *replay_plan_log(replay_store *st) {
    return st->plan.text ? st->plan.text : "";
}

void replay_plan_log_clear(replay_store *st) {
    st->plan.len = 0;
    if (st->plan.text) st->plan.text[0] = 0;
}

static const char *const ops[] = {"<=", ">=", "!=", "<", ">", "="};

static arl_status parse_where(const char *e, rsel_where *w) {
    const char *dot = strchr(e, '.');
    if (!dot) goto bad;
    size_t ll = (size_t)(dot - e);
    if (ll == 7 && !strncmp(e, "outcome", 7))
        w->level = "outcome";
    else if (ll == 7 && !strncmp(e, "segment", 7))
        w->level = "segment";
    else if (ll == 7 && !strncmp(e, "process", 7))
        w->level = "process";
    else
        goto bad;
    const char *p = dot + 1, *q = p;
    while (*q && (islower((unsigned char)*q) || isdigit((unsigned char)*q) || *q == '_'))
        q++;
    if (q == p || (size_t)(q - p) >= sizeof w->comp) goto bad;
    memcpy(w->comp, p, (size_t)(q - p));
    w->comp[q - p] = 0;
    if (!strcmp(w->comp, "reward"))
        w->comp[0] = 0;
    else if (!strcmp(w->comp, "derived"))
        strcpy(w->comp, "@derived");
    w->op = NULL;
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++)
        if (!strncmp(q, ops[i], strlen(ops[i]))) {
            w->op = ops[i];
            q += strlen(ops[i]);
            break;
        }
    if (!w->op) goto bad;
    char *end;
    w->value = strtod(q, &end);
    if (end == q || *end || !isfinite(w->value)) goto bad;
    return ARL_OK;
bad:
    return arl_errorf(ARL_ERR_ARG,
                      "--where '%s': expected LEVEL.NAME OP NUMBER with LEVEL outcome|segment|"
                      "process and OP one of < <= = != >= > (e.g. outcome.answer_correct<1)",
                      e);
}

/* Catalog ids matching a query with one text parameter; appended to *ids. */
static arl_status cat_ids(replay_store *st, const char *sql, const char *v, int64_t **ids,
                          size_t *n) {
    sqlite3_stmt *q;
    ARL_TRY(rdb_prepare(&st->cat, sql, &q));
    sqlite3_bind_text(q, 1, v, -1, SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        int64_t *p = realloc(*ids, (*n + 1) * sizeof *p);
        if (!p) {
            sqlite3_finalize(q);
            return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
        }
        *ids = p;
        (*ids)[(*n)++] = sqlite3_column_int64(q, 0);
    }
    sqlite3_finalize(q);
    if (rc != SQLITE_DONE) return rdb_fail(&st->cat, rc, "resolving a filter");
    return ARL_OK;
}

/* "#123" or "123" as a raw id for stores without a catalog. */
static int raw_id(const char *v, int64_t *id) {
    if (*v == '#') v++;
    if (!*v) return 0;
    for (const char *p = v; *p; p++)
        if (!isdigit((unsigned char)*p)) return 0;
    *id = atoll(v);
    return 1;
}

arl_status rsel_init(replay_store *st, const replay_filter *f, rsel *s) {
    memset(s, 0, sizeof *s);
    if (f)
        s->f = *f;
    else
        replay_filter_init(&s->f);
    const replay_filter *ff = &s->f;
    if (ff->status && replay_status_parse(ff->status) < 0)
        return arl_errorf(ARL_ERR_ARG,
                          "--status '%s': expected running, complete, truncated or masked",
                          ff->status);
    if (ff->n_where > RSEL_MAX_WHERE)
        return arl_errorf(ARL_ERR_ARG, "at most %d --where expressions", RSEL_MAX_WHERE);
    for (size_t i = 0; i < ff->n_where; i++)
        ARL_TRY(parse_where(ff->where[i], &s->where[i]));
    s->n_where = (int)ff->n_where;
    struct {
        const char *v, *sql, *what;
        int64_t **ids;
        size_t *n;
    } look[] = {
        {ff->run, "SELECT run_id FROM runs WHERE run_uid = ?1", "--run", &s->run_ids, &s->n_run},
        {ff->group, "SELECT group_id FROM task_groups WHERE group_uid = ?1", "--group",
         &s->group_ids, &s->n_group},
        {ff->env, "SELECT env_id FROM envs WHERE name = ?1", "--env", &s->env_ids, &s->n_env},
        {ff->task, "SELECT task_id FROM tasks WHERE task_uid = ?1", "--task", &s->task_ids,
         &s->n_task},
    };
    for (size_t i = 0; i < sizeof look / sizeof *look; i++) {
        if (!look[i].v) continue;
        int64_t id;
        if (st->cat.db) ARL_TRY(cat_ids(st, look[i].sql, look[i].v, look[i].ids, look[i].n));
        if (!*look[i].n && raw_id(look[i].v, &id)) {
            *look[i].ids = malloc(sizeof id);
            if (!*look[i].ids) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
            **look[i].ids = id;
            *look[i].n = 1;
        }
        if (!*look[i].n) s->none = 1; /* nothing can match */
    }
    if (ff->sort && strcmp(ff->sort, "time") && strcmp(ff->sort, "reward") &&
        strcmp(ff->sort, "tokens") && strcmp(ff->sort, "turns") && strcmp(ff->sort, "uid"))
        return arl_errorf(ARL_ERR_ARG, "--sort '%s': expected time, reward, tokens, turns or uid",
                          ff->sort);
    if (ff->pinned) {
        /* the pinned uids as one JSON array, matched through the traj_uid UNIQUE index */
        s->none |= !st->cat.db;
        sqlite3_stmt *q;
        if (st->cat.db) {
            ARL_TRY(rdb_prepare(&st->cat,
                                "SELECT coalesce(json_group_array(traj_uid), '[]'), count(*) "
                                "FROM pins",
                                &q));
            int rc = sqlite3_step(q);
            if (rc == SQLITE_ROW) {
                const char *t = (const char *)sqlite3_column_text(q, 0);
                s->pinned_json = strdup(t ? t : "[]");
                if (!sqlite3_column_int64(q, 1)) s->none = 1;
            }
            sqlite3_finalize(q);
            if (rc != SQLITE_ROW) return rdb_fail(&st->cat, rc, "reading pins");
            if (!s->pinned_json) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
        }
    }
    return ARL_OK;
}

void rsel_free(rsel *s) {
    free(s->run_ids);
    free(s->group_ids);
    free(s->env_ids);
    free(s->task_ids);
    free(s->pinned_json);
    memset(s, 0, sizeof *s);
}

/* Out of memory, the text is freed and *b stays NULL (*cap SIZE_MAX) through the later calls:
 * a query without one of its conditions (a filter) must not come out of it. */
static void append(char **b, size_t *n, size_t *cap, const char *t) {
    if (*cap == SIZE_MAX) return;
    size_t l = strlen(t);
    if (*n + l + 1 > *cap) {
        size_t c = (*cap + l + 1) * 2;
        char *p = realloc(*b, c);
        if (!p) {
            free(*b);
            *b = NULL;
            *cap = SIZE_MAX;
            return;
        }
        *b = p;
        *cap = c;
    }
    memcpy(*b + *n, t, l + 1);
    *n += l;
}

static void append_ids(char **b, size_t *n, size_t *cap, const char *col, const int64_t *ids,
                       size_t k) {
    char t[64];
    append(b, n, cap, " AND ");
    append(b, n, cap, col);
    append(b, n, cap, k == 1 ? " = " : " IN (");
    for (size_t i = 0; i < k; i++) {
        snprintf(t, sizeof t, "%s%lld", i ? "," : "", (long long)ids[i]);
        append(b, n, cap, t);
    }
    if (k != 1) append(b, n, cap, ")");
}

char *rsel_sql(const rsel *s, const char *head, const char *tail) {
    char *b = NULL;
    size_t n = 0, cap = 0;
    const replay_filter *f = &s->f;
    append(&b, &n, &cap, head);
    append(&b, &n, &cap, " WHERE 1");
    if (s->none) append(&b, &n, &cap, " AND 0");
    if (s->n_run) append_ids(&b, &n, &cap, "t.run_id", s->run_ids, s->n_run);
    if (f->status) append(&b, &n, &cap, " AND t.status = ?2");
    if (s->n_group) append_ids(&b, &n, &cap, "t.group_id", s->group_ids, s->n_group);
    if (s->n_env) append_ids(&b, &n, &cap, "t.env_id", s->env_ids, s->n_env);
    if (s->n_task) append_ids(&b, &n, &cap, "t.task_id", s->task_ids, s->n_task);
    if (f->error_code) append(&b, &n, &cap, " AND t.error_code = ?4");
    if (f->end_cause) append(&b, &n, &cap, " AND t.end_cause = ?5");
    if (f->min_tokens >= 0) append(&b, &n, &cap, " AND t.n_tokens >= ?6");
    if (f->max_tokens >= 0) append(&b, &n, &cap, " AND t.n_tokens <= ?7");
    if (f->min_turns >= 0) append(&b, &n, &cap, " AND t.n_turns >= ?8");
    if (!isnan(f->min_reward)) append(&b, &n, &cap, " AND t.outcome_reward >= ?9");
    if (f->version_lo >= 0) append(&b, &n, &cap, " AND t.min_version >= ?10");
    if (f->version_hi >= 0) append(&b, &n, &cap, " AND t.max_version <= ?11");
    if (f->since_ms >= 0)
        append(&b, &n, &cap, " AND coalesce(t.finished_at_ms, t.updated_at_ms) >= ?12");
    if (f->until_ms >= 0)
        append(&b, &n, &cap, " AND coalesce(t.finished_at_ms, t.updated_at_ms) <= ?13");
    if (f->parse_failures)
        append(&b, &n, &cap,
               " AND EXISTS (SELECT 1 FROM turns u WHERE u.traj_id = t.traj_id AND "
               "u.parse_status NOT IN ('ok','no_tool_call'))");
    if (f->tool || f->tool_error) {
        append(&b, &n, &cap, " AND EXISTS (SELECT 1 FROM tool_calls c WHERE c.traj_id = t.traj_id");
        if (f->tool) append(&b, &n, &cap, " AND c.name = ?14");
        if (f->tool_error) append(&b, &n, &cap, " AND c.result_error_code = ?15");
        append(&b, &n, &cap, ")");
    }
    if (f->forks_of) append(&b, &n, &cap, " AND t.parent_traj_uid = ?16");
    if (s->pinned_json)
        append(&b, &n, &cap, " AND t.traj_uid IN (SELECT value FROM json_each(?17))");
    for (int i = 0; i < s->n_where; i++) {
        char t[256];
        snprintf(t, sizeof t,
                 " AND EXISTS (SELECT 1 FROM rewards r WHERE r.traj_id = t.traj_id AND r.level = "
                 "'%s' AND r.component = ?%d AND r.value %s ?%d)",
                 s->where[i].level, 20 + 2 * i, s->where[i].op, 21 + 2 * i);
        append(&b, &n, &cap, t);
    }
    if (tail) append(&b, &n, &cap, tail);
    return b;
}

void rsel_bind(const rsel *s, sqlite3_stmt *q) {
    const replay_filter *f = &s->f;
    /* parameters that the SQL does not use are simply not bound (index absent) */
    int np = sqlite3_bind_parameter_count(q);
#define BIND_TEXT(i, v)                                                                            \
    if ((v) && (i) <= np) sqlite3_bind_text(q, i, v, -1, SQLITE_STATIC)
#define BIND_INT(i, v)                                                                             \
    if ((v) >= 0 && (i) <= np) sqlite3_bind_int64(q, i, v)
    BIND_TEXT(2, f->status);
    BIND_TEXT(4, f->error_code);
    BIND_TEXT(5, f->end_cause);
    BIND_INT(6, f->min_tokens);
    BIND_INT(7, f->max_tokens);
    BIND_INT(8, f->min_turns);
    if (!isnan(f->min_reward) && 9 <= np) sqlite3_bind_double(q, 9, f->min_reward);
    BIND_INT(10, f->version_lo);
    BIND_INT(11, f->version_hi);
    BIND_INT(12, f->since_ms);
    BIND_INT(13, f->until_ms);
    BIND_TEXT(14, f->tool);
    BIND_TEXT(15, f->tool_error);
    BIND_TEXT(16, f->forks_of);
    BIND_TEXT(17, s->pinned_json);
    for (int i = 0; i < s->n_where; i++) {
        if (20 + 2 * i <= np) sqlite3_bind_text(q, 20 + 2 * i, s->where[i].comp, -1, SQLITE_STATIC);
        if (21 + 2 * i <= np) sqlite3_bind_double(q, 21 + 2 * i, s->where[i].value);
    }
#undef BIND_TEXT
#undef BIND_INT
}
