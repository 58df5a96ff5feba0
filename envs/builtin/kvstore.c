/* envs/builtin/kvstore.c: the "kvstore" built-in environment: bring a small key-value store
 * into a goal state with get/put/delete/list, through transient tool failures, then finish().
 *
 * A task is an initial store (5-9 keys) and 1-4 goals drawn from the seed:
 *   set K to V; copy the value of A to B (needs a get first); increase the number at C by n
 *   (needs a get first); delete K; delete every key starting with "tmp:" (needs a list first).
 * Every other key must stay unchanged.  Success (outcome goal_met = 1) means the final store
 * equals the goal store exactly.
 *
 * Transient failures: every get/put/delete/list call fails with probability failure_rate
 * (options, default 0.2, 0..0.9) with error code TOOL_TIMEOUT and no effect.  The decision for
 * the n-th executed call is a function of (seed, n) only, so sessions are deterministic and
 * replayable; after two consecutive failures the next call always succeeds, so every goal is
 * reachable.  Failures are not penalised: the agent is rewarded for recovering.
 *
 * Rewards: process progress (change in the fraction of goals met, -1..1), recovered (+0.1 when
 * a call that failed transiently succeeds on a retry with the same arguments, at most 0.2 per
 * step), format (-0.1 per malformed call, failing get of a missing key or turn without a call,
 * at least -0.5); segment progress (change in the fraction of goals met over the segment,
 * -1..1); outcome goal_met.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "core/rng.h"
#include "envs/builtin/builtin.h"

#define KV_MAX_KEYS 48
#define KV_STR 33 /* keys and values: at most 32 bytes */
#define KV_MAX_GOALS 4
#define KV_MAX_STEPS 256
#define KV_MAX_OBSERVED 16
#define KV_MAX_PENDING 8

static const char kv_info_json[] =
    "{\"tools\": ["
    "{\"type\": \"function\", \"function\": {\"name\": \"get\", "
    "\"description\": \"Read the value of a key.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"key\": {\"type\": \"string\", "
    "\"minLength\": 1, \"maxLength\": 32}}, \"required\": [\"key\"], "
    "\"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"put\", "
    "\"description\": \"Set a key to a value.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"key\": {\"type\": \"string\", "
    "\"minLength\": 1, \"maxLength\": 32}, \"value\": {\"type\": \"string\", \"maxLength\": "
    "32}}, \"required\": [\"key\", \"value\"], \"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"delete\", "
    "\"description\": \"Delete a key.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"key\": {\"type\": \"string\", "
    "\"minLength\": 1, \"maxLength\": 32}}, \"required\": [\"key\"], "
    "\"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"list\", "
    "\"description\": \"List the keys that start with prefix (all keys without one).\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {\"prefix\": {\"type\": "
    "\"string\", \"maxLength\": 32}}, \"required\": [], \"additionalProperties\": false}}},"
    "{\"type\": \"function\", \"function\": {\"name\": \"finish\", "
    "\"description\": \"Declare the store complete. Ends the task.\", "
    "\"parameters\": {\"type\": \"object\", \"properties\": {}, \"required\": [], "
    "\"additionalProperties\": false}}}],"
    "\"reward_levels\": {\"process\": {\"range\": [-1.5, 1.2]}, "
    "\"segment\": {\"range\": [-1, 1]}, \"outcome\": {\"range\": [0, 1]}},"
    "\"reward_components\": ["
    "{\"name\": \"goal_met\", \"level\": \"outcome\", \"range\": [0, 1], "
    "\"description\": \"1 if the final store equals the goal store\"},"
    "{\"name\": \"progress\", \"level\": \"segment\", \"range\": [-1, 1], "
    "\"description\": \"change in the fraction of goals met over the segment\"},"
    "{\"name\": \"step_progress\", \"level\": \"process\", \"range\": [-1, 1], "
    "\"description\": \"change in the fraction of goals met in this step\"},"
    "{\"name\": \"recovered\", \"level\": \"process\", \"range\": [0, 0.2], "
    "\"description\": \"+0.1 per transiently failed call retried successfully\"},"
    "{\"name\": \"format\", \"level\": \"process\", \"range\": [-0.5, 0], "
    "\"description\": \"-0.1 per malformed or failing call or turn without a call\"}],"
    "\"capabilities\": {\"fork\": true, \"segment_score\": true, \"deterministic_replay\": "
    "true, \"parallel_tool_calls\": true, \"multimodal\": false, \"context_reset\": false},"
    "\"limits\": {\"max_sessions\": 4096, \"max_steps\": 256, \"default_step_timeout_ms\": "
    "10000, \"max_observation_bytes\": 65536}}";

typedef struct kv_entry {
    char k[KV_STR], v[KV_STR];
} kv_entry;

typedef struct kv_store {
    kv_entry e[KV_MAX_KEYS]; /* sorted by key (strcmp) */
    int n;
} kv_store;

enum { KG_SET, KG_COPY, KG_INCR, KG_DELETE, KG_DELPREFIX };

typedef struct kv_goal {
    int kind;
    char a[KV_STR], b[KV_STR]; /* SET: key a, value b; COPY: from a to b; INCR: key a;
                                  DELETE: key a; DELPREFIX: prefix a */
    int64_t n;                 /* INCR amount */
    char expect[KV_STR];       /* COPY: the value of a; INCR: the resulting number */
} kv_goal;

typedef struct kv_state {
    uint64_t seed;
    double failure_rate;
    kv_store store, target;
    kv_goal goals[KV_MAX_GOALS];
    int ngoals;
    char prompt[1024];
    /* progress */
    int64_t steps, calls; /* steps applied; store calls executed (failure stream index) */
    int consecutive_fail;
    int last_transient;               /* the last step had a transient failure */
    uint64_t pending[KV_MAX_PENDING]; /* hashes of calls that failed transiently */
    int npending;
    kv_entry observed[KV_MAX_OBSERVED]; /* values returned by successful gets */
    int nobserved;
    uint32_t listed;                 /* bit g: goal g's prefix has been listed */
    int8_t met_at[KV_MAX_STEPS + 1]; /* goals met after each step */
    int finished;
} kv_state;

/* ---- the store ---- */

/* Copy a key or value (at most KV_STR - 1 bytes); dst and src may be in the same state. */
static void kv_cpy(char *dst, const char *src) {
    size_t n = strnlen(src, KV_STR - 1);
    memmove(dst, src, n);
    dst[n] = 0;
}

static int kv_find(const kv_store *s, const char *k) {
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->e[i].k, k)) return i;
    return -1;
}

static const char *kv_get(const kv_store *s, const char *k) {
    int i = kv_find(s, k);
    return i < 0 ? NULL : s->e[i].v;
}

/* 0 on success, -1 when full. */
static int kv_put(kv_store *s, const char *k, const char *v) {
    int i = kv_find(s, k);
    if (i >= 0) {
        snprintf(s->e[i].v, KV_STR, "%s", v);
        return 0;
    }
    if (s->n >= KV_MAX_KEYS) return -1;
    int pos = 0;
    while (pos < s->n && strcmp(s->e[pos].k, k) < 0)
        pos++;
    memmove(&s->e[pos + 1], &s->e[pos], sizeof s->e[0] * (size_t)(s->n - pos));
    snprintf(s->e[pos].k, KV_STR, "%s", k);
    snprintf(s->e[pos].v, KV_STR, "%s", v);
    s->n++;
    return 0;
}

static int kv_del(kv_store *s, const char *k) {
    int i = kv_find(s, k);
    if (i < 0) return 0;
    memmove(&s->e[i], &s->e[i + 1], sizeof s->e[0] * (size_t)(s->n - i - 1));
    s->n--;
    return 1;
}

static int kv_equal(const kv_store *a, const kv_store *b) {
    if (a->n != b->n) return 0;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->e[i].k, b->e[i].k) || strcmp(a->e[i].v, b->e[i].v)) return 0;
    return 1;
}

static int kv_has_prefix(const kv_store *s, const char *p) {
    size_t n = strlen(p);
    for (int i = 0; i < s->n; i++)
        if (!strncmp(s->e[i].k, p, n)) return 1;
    return 0;
}

static int kv_goal_met(const kv_state *s, const kv_goal *g) {
    const char *v;
    switch (g->kind) {
    case KG_SET:
        v = kv_get(&s->store, g->a);
        return v && !strcmp(v, g->b);
    case KG_COPY:
        v = kv_get(&s->store, g->b);
        return v && !strcmp(v, g->expect);
    case KG_INCR:
        v = kv_get(&s->store, g->a);
        return v && !strcmp(v, g->expect);
    case KG_DELETE:
        return kv_find(&s->store, g->a) < 0;
    default:
        return !kv_has_prefix(&s->store, g->a);
    }
}

static int kv_goals_met(const kv_state *s) {
    int n = 0;
    for (int i = 0; i < s->ngoals; i++)
        n += kv_goal_met(s, &s->goals[i]);
    return n;
}

/* ---- generation ---- */

static const char *const kv_people[] = {"ann", "ben", "cara", "dan", "eva", "finn", "gus", "hana"};
static const char *const kv_colors[] = {"red", "blue", "green", "amber", "teal", "violet"};
static const char *const kv_cities[] = {"oslo", "lima", "cairo", "perth", "quito", "kyoto"};
static const char *const kv_things[] = {"sky", "car", "door", "lamp", "boat", "kite"};

#define PICK(r, a) (a[arl_rng_below(r, sizeof a / sizeof a[0])])

static void kv_generate(kv_state *s, int ngoals) {
    arl_rng r;
    arl_rng_seed_stream(&r, s->seed, 0x6b767374u /* "kvst" */);
    kv_store *st = &s->store;
    char k[KV_STR], v[KV_STR];
    /* initial store: 2 names, 1-2 colours, 1-2 counters, 1 city, 2-3 tmp keys */
    int np = 2, nc = 1 + (int)arl_rng_below(&r, 2), nn = 1 + (int)arl_rng_below(&r, 2);
    int nt = 2 + (int)arl_rng_below(&r, 2);
    while (np) {
        snprintf(k, sizeof k, "name:%s", PICK(&r, kv_people));
        if (kv_find(st, k) >= 0) continue;
        snprintf(v, sizeof v, "%s", PICK(&r, kv_people));
        v[0] = (char)(v[0] - 'a' + 'A');
        kv_put(st, k, v);
        np--;
    }
    while (nc) {
        snprintf(k, sizeof k, "color:%s", PICK(&r, kv_things));
        if (kv_find(st, k) >= 0) continue;
        kv_put(st, k, PICK(&r, kv_colors));
        nc--;
    }
    while (nn) {
        snprintf(k, sizeof k, "count:%s", PICK(&r, kv_things));
        if (kv_find(st, k) >= 0) continue;
        snprintf(v, sizeof v, "%d", (int)arl_rng_below(&r, 50));
        kv_put(st, k, v);
        nn--;
    }
    snprintf(k, sizeof k, "city:%s", PICK(&r, kv_people));
    kv_put(st, k, PICK(&r, kv_cities));
    for (int i = 0; i < nt; i++) {
        snprintf(k, sizeof k, "tmp:%d", 1 + (int)arl_rng_below(&r, 99));
        if (kv_find(st, k) >= 0) {
            i--;
            continue;
        }
        kv_put(st, k, "x");
    }
    /* goals: distinct kinds in a seeded order, on keys no other goal touches */
    int kinds[5] = {KG_SET, KG_COPY, KG_INCR, KG_DELETE, KG_DELPREFIX};
    for (int i = 4; i > 0; i--) {
        int j = (int)arl_rng_below(&r, (uint64_t)i + 1), t = kinds[i];
        kinds[i] = kinds[j];
        kinds[j] = t;
    }
    s->target = *st;
    char used[2 * KV_MAX_GOALS][KV_STR];
    int nused = 0;
    s->ngoals = 0;
    for (int gi = 0; gi < 5 && s->ngoals < ngoals; gi++) {
        kv_goal *g = &s->goals[s->ngoals];
        memset(g, 0, sizeof *g);
        g->kind = kinds[gi];
        /* candidates among existing keys of the right family, not used yet */
        const char *fam = g->kind == KG_INCR     ? "count:"
                          : g->kind == KG_COPY   ? "name:"
                          : g->kind == KG_DELETE ? "city:"
                                                 : NULL;
        if (fam) {
            int idx[KV_MAX_KEYS], nidx = 0;
            for (int i = 0; i < st->n; i++) {
                if (strncmp(st->e[i].k, fam, strlen(fam))) continue;
                int u = 0;
                for (int j = 0; j < nused; j++)
                    u |= !strcmp(used[j], st->e[i].k);
                if (!u) idx[nidx++] = i;
            }
            if (!nidx) continue;
            kv_cpy(g->a, st->e[idx[arl_rng_below(&r, (uint64_t)nidx)]].k);
        }
        switch (g->kind) {
        case KG_SET:
            /* an existing or a new colour key; no other goal touches color: keys */
            snprintf(g->a, KV_STR, "color:%s", PICK(&r, kv_things));
            do
                snprintf(g->b, KV_STR, "%s", PICK(&r, kv_colors));
            while (kv_get(st, g->a) && !strcmp(kv_get(st, g->a), g->b));
            kv_put(&s->target, g->a, g->b);
            break;
        case KG_COPY: {
            char key[KV_STR]; /* g->a's name apart (GCC's -Wrestrict cannot tell a from b) */
            snprintf(key, sizeof key, "%s", g->a + 5);
            snprintf(g->b, KV_STR, "backup:%s", key);
            snprintf(g->expect, KV_STR, "%s", kv_get(st, g->a));
            kv_put(&s->target, g->b, g->expect);
            break;
        }
        case KG_INCR:
            g->n = 1 + (int64_t)arl_rng_below(&r, 20);
            snprintf(g->expect, KV_STR, "%lld", atoll(kv_get(st, g->a)) + (long long)g->n);
            kv_put(&s->target, g->a, g->expect);
            break;
        case KG_DELETE:
            kv_del(&s->target, g->a);
            break;
        default:
            snprintf(g->a, KV_STR, "tmp:");
            for (int i = s->target.n - 1; i >= 0; i--)
                if (!strncmp(s->target.e[i].k, "tmp:", 4)) kv_del(&s->target, s->target.e[i].k);
            break;
        }
        snprintf(used[nused++], KV_STR, "%s", g->a);
        if (g->kind == KG_COPY) snprintf(used[nused++], KV_STR, "%s", g->b);
        s->ngoals++;
    }
    int off = snprintf(s->prompt, sizeof s->prompt, "Bring the key-value store to this state:\n");
    for (int i = 0; i < s->ngoals; i++) {
        const kv_goal *g = &s->goals[i];
        char line[160];
        switch (g->kind) {
        case KG_SET:
            snprintf(line, sizeof line, "Set key %s to %s.", g->a, g->b);
            break;
        case KG_COPY:
            snprintf(line, sizeof line, "Copy the value of key %s to key %s.", g->a, g->b);
            break;
        case KG_INCR:
            snprintf(line, sizeof line, "Increase the number stored at key %s by %lld.", g->a,
                     (long long)g->n);
            break;
        case KG_DELETE:
            snprintf(line, sizeof line, "Delete key %s.", g->a);
            break;
        default:
            snprintf(line, sizeof line, "Delete every key that starts with %s", g->a);
            break;
        }
        off += snprintf(s->prompt + off, sizeof s->prompt - (size_t)off, "%d. %s\n", i + 1, line);
    }
    snprintf(s->prompt + off, sizeof s->prompt - (size_t)off,
             "Leave every other key unchanged. Calls can fail transiently: retry them. Call "
             "finish when done.");
}

/* ---- session ---- */

static const char *const kv_data_keys[] = {"goals", "failure_rate", NULL};
static const char *const kv_option_keys[] = {"goals", "failure_rate", "max_steps", NULL};

static uint64_t kv_anchor_hash(const kv_state *s) {
    uint64_t h = arl_bi_hash(&s->seed, sizeof s->seed, 0);
    for (int i = 0; i < s->store.n; i++) {
        h = arl_bi_hash(s->store.e[i].k, strlen(s->store.e[i].k) + 1, h);
        h = arl_bi_hash(s->store.e[i].v, strlen(s->store.e[i].v) + 1, h);
    }
    return arl_bi_hash(&s->finished, sizeof s->finished, h);
}

static arl_status kv_instance_create(const json_t *config, void **inst) {
    return arl_bi_instance_open(kv_info_json, config, inst);
}

static void kv_instance_destroy(void *inst) {
    arl_bi_instance_close(inst);
}

static arl_status kv_reset(void *inst, const arl_env_reset_req *req, void **state,
                           arl_env_result *out) {
    ARL_TRY(arl_bi_check_keys(req->task.data, "task.data", kv_data_keys));
    ARL_TRY(arl_bi_check_keys(req->options, "options", kv_option_keys));
    int64_t ngoals;
    double rate;
    ARL_TRY(arl_bi_get_int(req->options, "goals", "options", 3, 1, 4, &ngoals));
    ARL_TRY(arl_bi_get_int(req->task.data, "goals", "task.data", ngoals, 1, 4, &ngoals));
    ARL_TRY(arl_bi_get_double(req->options, "failure_rate", "options", 0.2, 0, 0.9, &rate));
    ARL_TRY(arl_bi_get_double(req->task.data, "failure_rate", "task.data", rate, 0, 0.9, &rate));
    kv_state *s = calloc(1, sizeof *s);
    if (!s) return arl_errorf(ARL_ERR_NOMEM, "kvstore: out of memory");
    s->seed = req->task.seed;
    s->failure_rate = rate;
    kv_generate(s, (int)ngoals);
    s->met_at[0] = (int8_t)kv_goals_met(s);
    out->obs.context = ARL_ENV_CONTEXT_RESET;
    arl_status st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_SYSTEM,
                                         "You manage a key-value store with the get, put, "
                                         "delete, list and finish tools.");
    if (st == ARL_OK) st = arl_env_obs_add_text(&out->obs, ARL_ENV_ROLE_USER, s->prompt);
    if (st == ARL_OK) st = arl_bi_set_anchor(&out->info, "kvstore", kv_anchor_hash(s));
    if (st != ARL_OK) {
        free(s);
        return st;
    }
    *state = s;
    return ARL_OK;
}

static uint64_t kv_call_hash(const arl_env_tool_call *c) {
    char *a = arl_json_dumps(c->arguments, JSON_COMPACT | JSON_SORT_KEYS);
    uint64_t h = arl_bi_hash(c->name, strlen(c->name) + 1, 0);
    if (a) h = arl_bi_hash(a, strlen(a), h);
    free(a);
    return h;
}

typedef struct kv_turn {
    kv_state *s;
    int recovered;
} kv_turn;

static arl_status kv_run_call(void *ctx, const arl_env_tool_call *c, arl_env_observation *obs,
                              arl_bi_call_kind *kind, int *stop) {
    kv_turn *t = ctx;
    kv_state *s = t->s;
    char buf[1024];
    if (!strcmp(c->name, "finish")) {
        s->finished = 1;
        *stop = 1;
        *kind = ARL_BI_CALL_OK;
        return arl_env_obs_add_tool(obs, c->id, "Finished.", NULL);
    }
    /* the failure decision of this executed call */
    arl_rng r;
    arl_rng_seed_stream(&r, s->seed ^ 0x6661696cull /* "fail" */, (uint64_t)s->calls++);
    int fail = arl_rng_uniform(&r) < s->failure_rate && s->consecutive_fail < 2;
    uint64_t h = kv_call_hash(c);
    if (fail) {
        s->consecutive_fail++;
        s->last_transient = 1;
        int known = 0;
        for (int i = 0; i < s->npending; i++)
            known |= s->pending[i] == h;
        if (!known && s->npending < KV_MAX_PENDING) s->pending[s->npending++] = h;
        *kind = ARL_BI_CALL_TRANSIENT;
        return arl_env_obs_add_tool(obs, c->id,
                                    "Error: the store timed out (transient; the call had no "
                                    "effect). Retry it.",
                                    ARL_ENV_TOOL_TIMEOUT);
    }
    s->consecutive_fail = 0;
    for (int i = 0; i < s->npending; i++)
        if (s->pending[i] == h) {
            t->recovered++;
            s->pending[i] = s->pending[--s->npending];
            break;
        }
    const char *key = json_string_value(json_object_get(c->arguments, "key"));
    *kind = ARL_BI_CALL_OK;
    if (!strcmp(c->name, "get")) {
        const char *v = kv_get(&s->store, key);
        if (!v) {
            *kind = ARL_BI_CALL_RUNTIME;
            snprintf(buf, sizeof buf, "Error: key %s does not exist.", key);
            return arl_env_obs_add_tool(obs, c->id, buf, ARL_ENV_TOOL_RUNTIME_ERROR);
        }
        int i;
        for (i = 0; i < s->nobserved; i++)
            if (!strcmp(s->observed[i].k, key)) break;
        if (i == s->nobserved && s->nobserved < KV_MAX_OBSERVED) s->nobserved++;
        if (i < s->nobserved) {
            kv_cpy(s->observed[i].k, key);
            kv_cpy(s->observed[i].v, v);
        }
        return arl_env_obs_add_tool(obs, c->id, v, NULL);
    }
    if (!strcmp(c->name, "put")) {
        const char *v = json_string_value(json_object_get(c->arguments, "value"));
        if (kv_put(&s->store, key, v)) {
            *kind = ARL_BI_CALL_RUNTIME;
            snprintf(buf, sizeof buf, "Error: the store is full (%d keys).", KV_MAX_KEYS);
            return arl_env_obs_add_tool(obs, c->id, buf, ARL_ENV_TOOL_RUNTIME_ERROR);
        }
        return arl_env_obs_add_tool(obs, c->id, "OK", NULL);
    }
    if (!strcmp(c->name, "delete")) {
        int had = kv_del(&s->store, key);
        snprintf(buf, sizeof buf, had ? "Deleted %s." : "Key %s did not exist.", key);
        return arl_env_obs_add_tool(obs, c->id, buf, NULL);
    }
    /* list */
    const char *p = json_string_value(json_object_get(c->arguments, "prefix"));
    if (!p) p = "";
    size_t pn = strlen(p);
    int n = 0, off = 0;
    char keys[KV_MAX_KEYS * (KV_STR + 2)];
    keys[0] = 0;
    for (int i = 0; i < s->store.n; i++) {
        if (strncmp(s->store.e[i].k, p, pn)) continue;
        off +=
            snprintf(keys + off, sizeof keys - (size_t)off, "%s%s", n ? ", " : "", s->store.e[i].k);
        n++;
    }
    for (int g = 0; g < s->ngoals; g++)
        if (s->goals[g].kind == KG_DELPREFIX && !strncmp(p, s->goals[g].a, pn))
            s->listed |= 1u << g;
    if (n == 0)
        snprintf(buf, sizeof buf, "No keys start with \"%s\".", p);
    else
        snprintf(buf, sizeof buf, "%d key%s: %s", n, n == 1 ? "" : "s", keys);
    return arl_env_obs_add_tool(obs, c->id, buf, NULL);
}

static const arl_bi_dispatch kv_dispatch = {
    .max_calls_per_turn = 8,
    .run_call = kv_run_call,
    .nudge_no_call = "Act with the tools (get, put, delete, list) and call finish when done.",
    .lenient_tool = NULL,
};

static arl_status kv_step(void *inst, void *state, const arl_env_step_req *req,
                          arl_env_result *out) {
    kv_state *s = state;
    kv_state *saved = malloc(sizeof *saved);
    if (!saved) return arl_errorf(ARL_ERR_NOMEM, "kvstore: out of memory");
    *saved = *s;
    int before = kv_goals_met(s);
    s->last_transient = 0;
    kv_turn t = {s, 0};
    arl_bi_turn_stats st;
    int ended;
    arl_status r =
        arl_bi_dispatch_turn(&kv_dispatch, inst, &t, req->action, &out->obs, &st, &ended);
    if (r == ARL_OK) {
        s->steps++;
        int after = kv_goals_met(s);
        if (s->steps <= KV_MAX_STEPS) s->met_at[s->steps] = (int8_t)after;
        double prog = (double)(after - before) / s->ngoals;
        double rec = 0.1 * t.recovered;
        if (rec > 0.2) rec = 0.2;
        double fmt = -0.1 * (st.n_malformed + st.n_runtime + st.no_tool_call);
        if (fmt < -0.5) fmt = -0.5;
        out->reward = prog + rec + fmt;
        out->terminated = ended;
        r = arl_env_result_component(out, "step_progress", prog);
        if (r == ARL_OK) r = arl_env_result_component(out, "recovered", rec);
        if (r == ARL_OK) r = arl_env_result_component(out, "format", fmt);
        if (r == ARL_OK) r = arl_bi_set_anchor(&out->info, "kvstore", kv_anchor_hash(s));
    }
    if (r != ARL_OK) *s = *saved;
    free(saved);
    return r;
}

static arl_status kv_score(void *inst, void *state, const arl_env_score_req *req,
                           arl_env_score_result *out) {
    kv_state *s = state;
    out->scorable = 1;
    if (req->scope == ARL_ENV_SCOPE_SEGMENT) {
        int64_t first = req->first < 1 ? 1 : req->first;
        int64_t last = req->last > KV_MAX_STEPS ? KV_MAX_STEPS : req->last;
        out->reward = (double)(s->met_at[last] - s->met_at[first - 1]) / s->ngoals;
        out->info = json_pack("{s:i, s:i}", "goals_met", s->met_at[last], "of", s->ngoals);
        return arl_env_score_component(out, "progress", out->reward);
    }
    int ok = kv_equal(&s->store, &s->target);
    out->reward = ok ? 1.0 : 0.0;
    out->info = json_pack("{s:i, s:i, s:b, s:b}", "goals_met", kv_goals_met(s), "of", s->ngoals,
                          "exact", ok, "finished", s->finished);
    return arl_env_score_component(out, "goal_met", out->reward);
}

static arl_status kv_fork(void *inst, const void *state, void **child) {
    kv_state *c = malloc(sizeof *c);
    if (!c) return arl_errorf(ARL_ERR_NOMEM, "kvstore: out of memory");
    memcpy(c, state, sizeof *c);
    *child = c;
    return ARL_OK;
}

static void kv_free_state(void *inst, void *state) {
    free(state);
}

static json_t *kv_debug_state(void *inst, const void *state) {
    const kv_state *s = state;
    json_t *store = json_object(), *target = json_object();
    for (int i = 0; i < s->store.n; i++)
        json_object_set_new(store, s->store.e[i].k, json_string(s->store.e[i].v));
    for (int i = 0; i < s->target.n; i++)
        json_object_set_new(target, s->target.e[i].k, json_string(s->target.e[i].v));
    return json_pack("{s:o, s:o, s:i, s:I, s:b}", "store", store, "target", target, "goals_met",
                     kv_goals_met(s), "calls", (json_int_t)s->calls, "finished", s->finished);
}

/* ---- teacher ---- */

static const char *kv_observed(const kv_state *s, const char *k) {
    for (int i = 0; i < s->nobserved; i++)
        if (!strcmp(s->observed[i].k, k)) return s->observed[i].v;
    return NULL;
}

arl_status arl_env_kvstore_teacher(void *inst, const void *state, int64_t next_step,
                                   arl_env_action *out) {
    const kv_state *s = state;
    if (s->finished) return arl_errorf(ARL_ERR_STATE, "kvstore: the episode has ended");
    const char *retry = s->last_transient ? "The call timed out; retrying. " : "";
    char text[160];
    for (int gi = 0; gi < s->ngoals; gi++) {
        const kv_goal *g = &s->goals[gi];
        if (kv_goal_met(s, g)) continue;
        const char *seen;
        json_t *args = NULL;
        const char *tool = NULL, *why = "";
        char v[KV_STR];
        switch (g->kind) {
        case KG_SET:
            tool = "put", why = "Setting the key.";
            args = json_pack("{s:s, s:s}", "key", g->a, "value", g->b);
            break;
        case KG_COPY:
            if (!(seen = kv_observed(s, g->a))) {
                tool = "get", why = "Reading the value to copy.";
                args = json_pack("{s:s}", "key", g->a);
            } else {
                tool = "put", why = "Writing the copy.";
                args = json_pack("{s:s, s:s}", "key", g->b, "value", seen);
            }
            break;
        case KG_INCR:
            if (!(seen = kv_observed(s, g->a))) {
                tool = "get", why = "Reading the number.";
                args = json_pack("{s:s}", "key", g->a);
            } else {
                snprintf(v, sizeof v, "%lld", atoll(seen) + (long long)g->n);
                tool = "put", why = "Writing the increased number.";
                args = json_pack("{s:s, s:s}", "key", g->a, "value", v);
            }
            break;
        case KG_DELETE:
            tool = "delete", why = "Deleting the key.";
            args = json_pack("{s:s}", "key", g->a);
            break;
        default:
            if (!(s->listed >> gi & 1u)) {
                tool = "list", why = "Listing the keys to delete.";
                args = json_pack("{s:s}", "prefix", g->a);
            } else {
                for (int i = 0; i < s->store.n; i++)
                    if (!strncmp(s->store.e[i].k, g->a, strlen(g->a))) {
                        tool = "delete", why = "Deleting a listed key.";
                        args = json_pack("{s:s}", "key", s->store.e[i].k);
                        break;
                    }
            }
            break;
        }
        ARL_TRY(arl_bi_teacher_call(out, next_step, tool, args));
        snprintf(text, sizeof text, "%s%s", retry, why);
        return arl_bi_teacher_finish(out, text);
    }
    ARL_TRY(arl_bi_teacher_call(out, next_step, "finish", json_object()));
    return arl_bi_teacher_finish(out, "All goals are met.");
}

static const arl_env_ops kv_ops = {
    .thread_safety = 1,
    .instance_create = kv_instance_create,
    .instance_destroy = kv_instance_destroy,
    .reset = kv_reset,
    .step = kv_step,
    .score = kv_score,
    .fork = kv_fork,
    .free_state = kv_free_state,
    .debug_state = kv_debug_state,
};

const arl_env_def arl_env_kvstore = {
    .name = "kvstore",
    .version = "1.0.0",
    .description = "Bring a key-value store to a goal state through transient tool failures.",
    .info_json = kv_info_json,
    .ops = &kv_ops,
};
