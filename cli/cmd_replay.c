/* cli/cmd_replay.c: `agentrl replay list|show|export|import|stats|verify|recover DB ...`
 * (spec/replay.md section 13).  DB is a store root (or a directory of shard files, or one shard
 * file for the read-only commands).  The work is in replay/inspect.h; this file declares the
 * options, opens the store and maps statuses to exit codes: 0 ok, 1 failure, 2 usage error or
 * (verify) findings of severity error.  rescore and fork (they need the policy model) are in
 * cli/cmd_replay_model.c; pin, unpin, gc, seal and migrate in cli/cmd_replay_admin.c. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "policy/tokenizer.h"
#include "replay/inspect.h"

/* ---- the selection options shared by list, stats and export ---- */

typedef struct sel_opts {
    char *db;
    char *run, *status, *env, *group, *task, *error_code, *end_cause;
    int64_t min_tokens, max_tokens, min_turns;
    char *min_reward, *version_range;
    int64_t since, until;
    int parse_failures;
    char *tool, *tool_error, *forks_of;
    arl_strlist where;
    int64_t limit;
    int pinned;
    char *sort;
    int json;
    /* show */
    char *traj;
    int tokens, raw, show_group;
    char *turns, *rescore;
    /* export */
    char *format, *output;
    int learner, full;
    /* import */
    arl_strlist files;
    /* verify, recover */
    int mask, repair;
} sel_opts;

#define O(f) offsetof(sel_opts, f)
#define OPT_DB_HELP(help)                                                                          \
    {                                                                                              \
        "db", ARL_OPT_STRING, O(db), NULL, help, 0, 0, NULL,                                       \
            ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "DB"                                            \
    }
/* the read-only commands open a store root or one shard file; import and recover write the
 * catalog, so they need a store root (import creates a missing one) */
#define OPT_DB OPT_DB_HELP("store root (or shard file)")
#define OPT_FILTERS                                                                                \
    {"run", ARL_OPT_STRING, O(run), NULL, "only this run (run_uid)", 0, 0, NULL, 0, "R"},          \
        {"status",                                                                                 \
         ARL_OPT_CHOICE,                                                                           \
         O(status),                                                                                \
         NULL,                                                                                     \
         "only this status: running, complete, truncated or masked",                               \
         0,                                                                                        \
         0,                                                                                        \
         "running|complete|truncated|masked",                                                      \
         0,                                                                                        \
         "S"},                                                                                     \
        {"env", ARL_OPT_STRING, O(env), NULL, "only this environment name", 0, 0, NULL, 0, "E"},   \
        {"group", ARL_OPT_STRING, O(group), NULL, "only this group (group_uid)", 0,                \
         0,       NULL,           0,        "G"},                                                  \
        {"task", ARL_OPT_STRING, O(task), NULL, "only this task (task_uid)", 0, 0, NULL, 0, "T"},  \
        {"error-code",                                                                             \
         ARL_OPT_STRING,                                                                           \
         O(error_code),                                                                            \
         NULL,                                                                                     \
         "only masked with this error code",                                                       \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "CODE"},                                                                                  \
        {"end-cause", ARL_OPT_STRING, O(end_cause), NULL, "only this end cause", 0, 0, NULL, 0,    \
         "C"},                                                                                     \
        {"min-tokens", ARL_OPT_INT, O(min_tokens), "-1", "at least N tokens (-1: no bound)",       \
         -1,           1e15,        NULL,          0,    "N"},                                     \
        {"max-tokens", ARL_OPT_INT, O(max_tokens), "-1", "at most N tokens (-1: no bound)",        \
         -1,           1e15,        NULL,          0,    "N"},                                     \
        {"min-turns", ARL_OPT_INT, O(min_turns), "-1", "at least N turns (-1: no bound)",          \
         -1,          1e9,         NULL,         0,    "N"},                                       \
        {"min-reward", ARL_OPT_STRING, O(min_reward), NULL, "derived outcome >= X", 0, 0, NULL, 0, \
         "X"},                                                                                     \
        {"version-range",                                                                          \
         ARL_OPT_STRING,                                                                           \
         O(version_range),                                                                         \
         NULL,                                                                                     \
         "all policy versions within A:B (either may be empty)",                                   \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "A:B"},                                                                                   \
        {"since",                                                                                  \
         ARL_OPT_INT,                                                                              \
         O(since),                                                                                 \
         "-1",                                                                                     \
         "finished at or after this time (ms since the epoch)",                                    \
         -1,                                                                                       \
         1e15,                                                                                     \
         NULL,                                                                                     \
         0,                                                                                        \
         "MS"},                                                                                    \
        {"until",                                                                                  \
         ARL_OPT_INT,                                                                              \
         O(until),                                                                                 \
         "-1",                                                                                     \
         "finished at or before this time (ms since the epoch)",                                   \
         -1,                                                                                       \
         1e15,                                                                                     \
         NULL,                                                                                     \
         0,                                                                                        \
         "MS"},                                                                                    \
        {"parse-failures",                                                                         \
         ARL_OPT_BOOL,                                                                             \
         O(parse_failures),                                                                        \
         NULL,                                                                                     \
         "only trajectories with a failed tool-call parse",                                        \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         NULL},                                                                                    \
        {"tool", ARL_OPT_STRING, O(tool), NULL,  "only trajectories that called this tool", 0,     \
         0,      NULL,           0,       "NAME"},                                                 \
        {"tool-error",                                                                             \
         ARL_OPT_STRING,                                                                           \
         O(tool_error),                                                                            \
         NULL,                                                                                     \
         "only trajectories with a tool result error code",                                        \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "CODE"},                                                                                  \
        {"where",                                                                                  \
         ARL_OPT_LIST,                                                                             \
         O(where),                                                                                 \
         NULL,                                                                                     \
         "reward filter LEVEL.NAME OP NUMBER (e.g. outcome.answer_correct<1)",                     \
         0,                                                                                        \
         0,                                                                                        \
         NULL,                                                                                     \
         0,                                                                                        \
         "EXPR"},                                                                                  \
        {"forks-of", ARL_OPT_STRING, O(forks_of), NULL,      "only forks of this trajectory", 0,   \
         0,          NULL,           0,           "TRAJ_UID"},                                     \
        {"pinned", ARL_OPT_BOOL, O(pinned), NULL, "only pinned trajectories ('replay pin')", 0,    \
         0,        NULL,         0,         NULL},                                                 \
    {                                                                                              \
        "limit", ARL_OPT_INT, O(limit), "0", "at most N trajectories (0: all)", 0, 1e15, NULL, 0,  \
            "N"                                                                                    \
    }

static int to_filter(const sel_opts *o, replay_filter *f) {
    replay_filter_init(f);
    f->run = o->run;
    f->status = o->status;
    f->env = o->env;
    f->group = o->group;
    f->task = o->task;
    f->error_code = o->error_code;
    f->end_cause = o->end_cause;
    f->min_tokens = o->min_tokens;
    f->max_tokens = o->max_tokens;
    f->min_turns = o->min_turns;
    if (o->min_reward) {
        char *end;
        errno = 0;
        f->min_reward = strtod(o->min_reward, &end);
        if (end == o->min_reward || *end || !isfinite(f->min_reward)) {
            fprintf(stderr, "agentrl: error: --min-reward '%s': expected a finite number\n",
                    o->min_reward);
            return ARL_EXIT_USAGE;
        }
    }
    if (o->version_range) {
        const char *c = strchr(o->version_range, ':');
        char *end;
        if (!c) goto bad_range;
        if (c > o->version_range) {
            f->version_lo = strtoll(o->version_range, &end, 10);
            if (end != c || f->version_lo < 0) goto bad_range;
        }
        if (c[1]) {
            f->version_hi = strtoll(c + 1, &end, 10);
            if (*end || f->version_hi < 0) goto bad_range;
        }
    }
    f->since_ms = o->since;
    f->until_ms = o->until;
    f->parse_failures = o->parse_failures;
    f->tool = o->tool;
    f->tool_error = o->tool_error;
    f->where = (const char *const *)o->where.v;
    f->n_where = (size_t)o->where.n;
    f->forks_of = o->forks_of;
    f->limit = o->limit;
    f->pinned = o->pinned;
    f->sort = o->sort;
    return 0;
bad_range:
    fprintf(stderr,
            "agentrl: error: --version-range '%s': expected A:B with non-negative integers\n",
            o->version_range);
    return ARL_EXIT_USAGE;
}

void cli_replay_token_text(uint32_t id, char *buf, size_t cap) {
    arl_tokenizer_spec ts;
    arl_tokenizer_spec_default(&ts); /* the tokenizer of every policy rollout writes with */
    if (id >= (uint32_t)ts.vocab_size) {
        snprintf(buf, cap, "?");
    } else if (id >= ARL_TOKENIZER_N_BYTES) { /* as arl_tokenizer_decode names it */
        const int k = arl_tokenizer_special_of(&ts, (int32_t)id);
        if (k >= 0)
            snprintf(buf, cap, "%s", arl_tokenizer_special_name((arl_special)k));
        else
            snprintf(buf, cap, "<|reserved_%u|>", id);
    } else if (id == '\\' || id == '\'') {
        snprintf(buf, cap, "'\\%c'", (char)id);
    } else if (id == '\n' || id == '\t' || id == '\r') {
        snprintf(buf, cap, "'\\%c'", id == '\n' ? 'n' : id == '\t' ? 't' : 'r');
    } else if (id >= 0x20 && id < 0x7F) {
        snprintf(buf, cap, "'%c'", (char)id);
    } else {
        snprintf(buf, cap, "'\\x%02x'", id);
    }
}

static int open_store(const char *db, unsigned flags, replay_store **st) {
    replay_open_opts oo = {.flags = flags};
    arl_status s = replay_store_open(db, &oo, st);
    return s == ARL_OK ? 0 : cli_fail(s);
}

/* Parse, open read-only, run fn; shared by list and stats. */
typedef arl_status (*sel_fn)(replay_store *st, const replay_filter *f, int json, FILE *out);

static int run_selection(const arl_option *tab, size_t n, int argc, char **argv, const char *usage,
                         const char *summary, sel_fn fn) {
    sel_opts o;
    memset(&o, 0, sizeof o); /* fields of other commands stay NULL/0 */
    int rc = cli_parse(tab, n, argc, argv, &o, usage, summary);
    if (rc) return rc < 0 ? 0 : rc;
    replay_filter f;
    replay_store *st = NULL;
    if (!(rc = to_filter(&o, &f)) && !(rc = open_store(o.db, REPLAY_OPEN_READONLY, &st))) {
        replay_shards_warn_unreadable(st, stderr); /* their trajectories are left out */
        arl_status s = fn(st, &f, o.json, stdout);
        rc = s == ARL_OK ? 0 : cli_fail(s);
    }
    replay_store_close(st);
    arl_options_free(tab, n, &o);
    return rc;
}

static const arl_option list_tab[] = {
    OPT_DB,
    OPT_FILTERS,
    {"sort", ARL_OPT_CHOICE, O(sort), "time",
     "order: finish time (newest first), outcome reward (highest first), tokens, turns (most "
     "first), uid",
     0, 0, "time|reward|tokens|turns|uid", 0, NULL},
    {"json", ARL_OPT_BOOL, O(json), NULL, "JSON lines with the same fields", 0, 0, NULL, 0, NULL},
};

int cmd_replay_list(int argc, char **argv) {
    return run_selection(
        list_tab, ARL_OPTIONS_COUNT(list_tab), argc, argv,
        "agentrl replay list DB [--run R] [--status S] [--env E] [--min-reward X] [--pinned] "
        "[--sort time|reward|tokens|turns|uid] [--limit N] [--json]",
        "List stored trajectories, newest first unless --sort: uid, status, end cause or error, "
        "environment, turns, segments, tokens (action), versions, outcome, time.",
        replay_list);
}

static const arl_option stats_tab[] = {
    OPT_DB,
    OPT_FILTERS,
    {"json", ARL_OPT_BOOL, O(json), NULL, "one JSON object", 0, 0, NULL, 0, NULL},
};

int cmd_replay_stats(int argc, char **argv) {
    return run_selection(
        stats_tab, ARL_OPTIONS_COUNT(stats_tab), argc, argv,
        "agentrl replay stats DB [filters] [--json]",
        "Summarise a store or a selection: counts by status, end cause and error code, token "
        "totals, reward components per level, length distributions, boundary causes, tool and "
        "environment-call rates, policy versions, storage.",
        replay_stats);
}

static const arl_option show_tab[] = {
    OPT_DB,
    {"traj", ARL_OPT_STRING, O(traj), NULL, "trajectory (traj_uid or traj_id)", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "TRAJ"},
    {"tokens", ARL_OPT_BOOL, O(tokens), NULL,
     "per-token table: position, token, mask, version, log-prob, routes", 0, 0, NULL, 0, NULL},
    {"raw", ARL_OPT_BOOL, O(raw), NULL, "exact request and response bytes of every call", 0, 0,
     NULL, 0, NULL},
    {"turns", ARL_OPT_STRING, O(turns), NULL,
     "with --tokens: only the token rows of steps A..B (either may be empty)", 0, 0, NULL, 0,
     "A:B"},
    {"rescore", ARL_OPT_STRING, O(rescore), NULL,
     "with --tokens: add the log-probabilities of re-score LABEL and their difference", 0, 0, NULL,
     0, "LABEL"},
    {"group", ARL_OPT_BOOL, O(show_group), NULL,
     "the group's members side by side: status, turns, tokens, outcome, outcome advantage", 0, 0,
     NULL, 0, NULL},
};

int cmd_replay_show(int argc, char **argv) {
    sel_opts o;
    memset(&o, 0, sizeof o); /* fields of other commands stay NULL/0 */
    const size_t n = ARL_OPTIONS_COUNT(show_tab);
    int rc = cli_parse(
        show_tab, n, argc, argv, &o,
        "agentrl replay show DB TRAJ [--tokens [--turns A:B] [--rescore LABEL]] [--raw] "
        "[--group]",
        "Render one trajectory as a person reads it: roles, tool calls and results, per-step "
        "rewards, segment boundaries, truncation or mask reason.");
    if (rc) return rc < 0 ? 0 : rc;
    replay_show_opts so = {.tokens = o.tokens,
                           .raw = o.raw,
                           .rescore = o.rescore,
                           .group = o.show_group,
                           .token_text = cli_replay_token_text};
    if ((o.turns || o.rescore) && !o.tokens) { /* they choose rows and columns of that table */
        fprintf(stderr, "agentrl: error: --%s chooses the %s of the --tokens table: add --tokens\n",
                o.turns ? "turns" : "rescore", o.turns ? "rows" : "columns");
        arl_options_free(show_tab, n, &o);
        return ARL_EXIT_USAGE;
    }
    if (o.turns && replay_show_turns_parse(o.turns, &so.turn_lo, &so.turn_hi) != ARL_OK) {
        fprintf(stderr, "agentrl: error: --%s\n", arl_error_msg());
        arl_options_free(show_tab, n, &o);
        return ARL_EXIT_USAGE;
    }
    replay_store *st = NULL;
    if (!(rc = open_store(o.db, REPLAY_OPEN_READONLY, &st))) {
        arl_status s = replay_show(st, o.traj, &so, stdout);
        rc = s == ARL_OK ? 0 : cli_fail(s);
    }
    replay_store_close(st);
    arl_options_free(show_tab, n, &o);
    return rc;
}

static const arl_option export_tab[] = {
    OPT_DB,
    OPT_FILTERS,
    {"format", ARL_OPT_CHOICE, O(format), "jsonl", "output format", 0, 0, "jsonl", 0, NULL},
    {"output", ARL_OPT_STRING, O(output), NULL, "write to FILE instead of standard output", 0, 0,
     NULL, 0, "FILE"},
    {"tokens", ARL_OPT_BOOL, O(tokens), NULL, "add per-token payloads (base64)", 0, 0, NULL, 0,
     NULL},
    {"learner", ARL_OPT_BOOL, O(learner), NULL, "add learner records", 0, 0, NULL, 0, NULL},
    {"raw", ARL_OPT_BOOL, O(raw), NULL, "add request and response bodies (base64)", 0, 0, NULL, 0,
     NULL},
    {"full", ARL_OPT_BOOL, O(full), NULL,
     "everything plus every row: input for 'agentrl replay import'", 0, 0, NULL, 0, NULL},
};

int cmd_replay_export(int argc, char **argv) {
    sel_opts o;
    memset(&o, 0, sizeof o); /* fields of other commands stay NULL/0 */
    const size_t n = ARL_OPTIONS_COUNT(export_tab);
    int rc = cli_parse(
        export_tab, n, argc, argv, &o,
        "agentrl replay export DB [filters] [--format jsonl] [--tokens] [--learner] [--raw] "
        "[--full] "
        "[--output FILE]",
        "Write one agentrl.trajectory/1 JSON line per selected trajectory (OpenAI-style messages). "
        "With --full, import into another store reproduces the same content.");
    if (rc) return rc < 0 ? 0 : rc;
    replay_filter f;
    replay_store *st = NULL;
    FILE *out = stdout;
    char *tmp = NULL;
    if (!(rc = to_filter(&o, &f)) && !(rc = open_store(o.db, REPLAY_OPEN_READONLY, &st))) {
        /* --output is written under a temporary name and renamed when complete: a failure or
         * an interrupt leaves an existing file as it was */
        arl_status s = o.output ? cli_out_open("--output", o.output, &tmp, &out) : ARL_OK;
        int64_t count = 0;
        if (!s) {
            replay_export_opts eo = {
                .tokens = o.tokens, .learner = o.learner, .raw = o.raw, .full = o.full};
            s = replay_export(st, &f, &eo, out, &count);
            if (o.output) s = cli_out_commit(s, out, tmp, "--output", o.output);
        }
        rc = s == ARL_OK ? 0 : cli_fail(s);
        if (!rc && o.output)
            cli_say("exported %lld trajectories to %s\n", (long long)count, o.output);
    }
    replay_store_close(st);
    arl_options_free(export_tab, n, &o);
    return rc;
}

static const arl_option import_tab[] = {
    OPT_DB_HELP("store root (created if missing)"),
    {"files", ARL_OPT_LIST, O(files), NULL,
     "JSON Lines files from 'export --full' ('-': standard input)", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "FILE"},
};

int cmd_replay_import(int argc, char **argv) {
    sel_opts o;
    memset(&o, 0, sizeof o); /* fields of other commands stay NULL/0 */
    const size_t n = ARL_OPTIONS_COUNT(import_tab);
    int rc = cli_parse(
        import_tab, n, argc, argv, &o, "agentrl replay import DB FILE...",
        "Import 'export --full' lines into a new tool file of the store DB (created if missing), "
        "creating missing catalog rows.  A failing line stores nothing and stops the import; "
        "a trajectory the store holds already is skipped when it is the same (its export --full "
        "line is this one), so an import that stopped can be run again.");
    if (rc) return rc < 0 ? 0 : rc;
    /* every FILE readable before a store is made for them */
    for (int i = 0; i < o.files.n && !rc; i++)
        if (strcmp(o.files.v[i], "-") && access(o.files.v[i], R_OK) != 0) {
            fprintf(stderr, "agentrl: error: cannot read %s: %s\n", o.files.v[i], strerror(errno));
            rc = ARL_EXIT_FAIL;
        }
    if (rc) {
        arl_options_free(import_tab, n, &o);
        return rc;
    }
    replay_store *st = NULL;
    cli_new_store_begin(o.db); /* a new store that the import wrote nothing to is removed */
    if (!(rc = open_store(o.db, REPLAY_OPEN_CREATE, &st))) {
        int64_t total = 0, skipped = 0;
        for (int i = 0; i < o.files.n && !rc; i++) {
            const char *name = o.files.v[i];
            FILE *in = strcmp(name, "-") ? fopen(name, "r") : stdin;
            if (!in) {
                fprintf(stderr, "agentrl: error: cannot read %s: %s\n", name, strerror(errno));
                rc = ARL_EXIT_FAIL;
                break;
            }
            int64_t k = 0, ks = 0;
            arl_status s = replay_import(st, in, name, &k, &ks);
            if (in != stdin) fclose(in);
            total += k;
            skipped += ks;
            if (s != ARL_OK) rc = cli_fail(s);
        }
        cli_say("imported %lld trajectories into %s", (long long)total, o.db);
        if (skipped) cli_say(" (%lld already there, the same: skipped)", (long long)skipped);
        cli_say("\n");
    }
    replay_store_close(st);
    cli_new_store_end(rc != 0);
    arl_options_free(import_tab, n, &o);
    return rc;
}

static const arl_option verify_tab[] = {
    OPT_DB_HELP("store root (or shard file; --repair: a store root)"),
    {"full", ARL_OPT_BOOL, O(full), NULL, "PRAGMA integrity_check instead of quick_check", 0, 0,
     NULL, 0, NULL},
    {"repair", ARL_OPT_BOOL, O(repair), NULL,
     "mask trajectories with errors STORE_CORRUPT and delete orphan states, through each file's "
     "writer (files with a live writer are skipped); never rewrites data",
     0, 0, NULL, 0, NULL},
};

int cmd_replay_verify(int argc, char **argv) {
    sel_opts o;
    memset(&o, 0, sizeof o); /* fields of other commands stay NULL/0 */
    const size_t n = ARL_OPTIONS_COUNT(verify_tab);
    int rc = cli_parse(
        verify_tab, n, argc, argv, &o, "agentrl replay verify DB [--full] [--repair]",
        "Check every file: SQLite integrity, schema versions, every blob's header, shape and CRCs, "
        "the invariants of committed data, raw I/O hashes, cross-file references, orphans.  Lists "
        "all findings; exit status 2 if any is an error.");
    if (rc) return rc < 0 ? 0 : rc;
    replay_store *st = NULL;
    if (!(rc = open_store(o.db, o.repair ? 0 : REPLAY_OPEN_READONLY, &st))) {
        replay_verify_opts vo = {.full = o.full, .repair = o.repair};
        int64_t errors = 0, warnings = 0;
        arl_status s = replay_verify(st, &vo, stdout, &errors, &warnings);
        rc = s != ARL_OK ? cli_fail(s) : errors ? 2 : 0;
    }
    replay_store_close(st);
    arl_options_free(verify_tab, n, &o);
    return rc;
}

static const arl_option recover_tab[] = {
    OPT_DB_HELP("store root"),
    {"mask", ARL_OPT_BOOL, O(mask), NULL,
     "mask every interrupted trajectory (INTERRUPTED) instead of leaving "
     "those with committed segments resumable",
     0, 0, NULL, 0, NULL},
};

int cmd_replay_recover(int argc, char **argv) {
    sel_opts o;
    memset(&o, 0, sizeof o); /* fields of other commands stay NULL/0 */
    const size_t n = ARL_OPTIONS_COUNT(recover_tab);
    int rc = cli_parse(
        recover_tab, n, argc, argv, &o, "agentrl replay recover DB [--mask]",
        "Find trajectories left running by writers that are gone (their lock is free): mask those "
        "with nothing committed, mark the others interrupted and resumable (or mask them too with "
        "--mask).  Files whose writer is alive are skipped.");
    if (rc) return rc < 0 ? 0 : rc;
    replay_store *st = NULL;
    if (!(rc = open_store(o.db, 0, &st))) {
        int64_t found = 0;
        arl_status s = replay_recover(st, o.mask, stdout, &found);
        rc = s == ARL_OK ? 0 : cli_fail(s);
    }
    replay_store_close(st);
    arl_options_free(recover_tab, n, &o);
    return rc;
}
