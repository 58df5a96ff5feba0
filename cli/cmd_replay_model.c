/* cli/cmd_replay_model.c: the replay operations that need the policy model (spec/replay.md 13.6,
 * 13.7), on top of rollout/rescore.h and rollout/rollout.h:
 *   agentrl replay rescore DB TRAJ... --ckpt DIR [--version auto|N|none] [--save-states]
 *                          [--routing replay|natural] [--rewards [--env SPEC]]
 *   agentrl replay rescore DB TRAJ... --rewards [--env SPEC] [--label L]
 *   agentrl replay fork DB TRAJ --segment S [--ckpt DIR | --version N] [--count M]
 *                       [--use-rollout-state] [EXPERIMENT / rollout keys]
 * rescore prints, per trajectory, how each segment started (cached state or recomputed prefix),
 * the mean, p99 and max of |l - l_mu| over its action tokens, the mean entropy there and the
 * router agreement with the stored routes (overlap, exact layer, exact token), and writes one
 * rescores row per segment (RESCORE_LOGPROBS and stats_json) into a tool file of the store
 * (--no-save: not);
 * with --rewards (with or without --ckpt) it also replays each trajectory's stored actions against
 * its environment (deterministic_replay; rollout/rescore_rewards.h), writes the re-scored rewards
 * rows (source 'rescore:<label>') into the tool file and prints the drift per reward level;
 * fork writes the continuations into a tool file of the store and prints their ids. */
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "core/file.h"
#include "replay/replay.h"
#include "rollout/rescore.h"
#include "rollout/rescore_rewards.h"
#include "rollout/rollout.h"

/* A policy version as --version gives it: a whole number 0..4294967295 (policy_versions'
 * range) into *v; 0 when text is anything else. */
static int version_number(const char *text, int64_t *v) {
    char *end = NULL;
    const long long x = strtoll(text, &end, 10);
    if (!text[0] || *end || x < 0 || x > 4294967295LL) return 0;
    *v = x;
    return 1;
}

/* ---- rescore ---- */

typedef struct rescore_cli {
    char *db;
    arl_strlist traj;
    char *ckpt;
    char *version;
    char *routing;
    int64_t sparse_topk, sparse_chunk;
    char *device;
    int json;
    char *label;
    int no_save;
    int save_states;
    int rewards;
    char *env;
    char *env_config;
} rescore_cli;

static arl_status fork_ckpt_of(replay_store *st, const char *db, const char *traj, int64_t *version,
                               char *ckpt, size_t cap, const char *who, const char *what);

static const arl_option rescore_tab[] = {
    {"db", ARL_OPT_STRING, offsetof(rescore_cli, db), NULL, "replay store root", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "DB"},
    /* required, checked after the parse: its message names TRAJ in the command's terms */
    {"traj", ARL_OPT_LIST, offsetof(rescore_cli, traj), NULL,
     "trajectories to re-score (traj_uid or traj_id, as 'agentrl replay list DB' shows them)", 0, 0,
     NULL, ARL_OPT_POSITIONAL, "TRAJ..."},
    {"ckpt", ARL_OPT_STRING, offsetof(rescore_cli, ckpt), NULL,
     "checkpoint to score under (required unless --version N or --rewards)", 0, 0, NULL, 0, "DIR"},
    {"version", ARL_OPT_STRING, offsetof(rescore_cli, version), "auto",
     "policy version of --ckpt, whose rollout states (computed entirely at it) may start "
     "segments: auto = the run's version with the checkpoint's weights (recorded "
     "weights_sha256, else checkpoint_uri), none if no version matches; N asserts one (refused "
     "where the run records other weights for N); -1 or none: always recompute the prefix. "
     "Without --ckpt, N scores under the checkpoint the store records for version N of the "
     "run (label vN)",
     0, 0, NULL, 0, "auto|N|none"},
    {"routing", ARL_OPT_CHOICE, offsetof(rescore_cli, routing), "replay",
     "MoE routes: the stored ones (replay) or the router's own (natural)", 0, 0, "replay|natural",
     0, NULL},
    {"mla-sparse-topk", ARL_OPT_INT, offsetof(rescore_cli, sparse_topk), "0",
     "block-sparse MLA as the rollout ran it (0: dense)", 0, 1 << 20, NULL, 0, "K"},
    {"mla-sparse-chunk", ARL_OPT_INT, offsetof(rescore_cli, sparse_chunk), "4096",
     "block-sparse MLA chunk length", 1, 1 << 24, NULL, 0, "N"},
    {"device", ARL_OPT_CHOICE, offsetof(rescore_cli, device), "cpu",
     "where the checkpoint runs: cpu, cuda (a GPU; dense or block-sparse MLA; its saved "
     "states are tagged cuda-f32) or cpu-device (the device code over host memory, bit-identical "
     "to cpu)",
     0, 0, "cpu|cuda|cpu-device", 0, NULL},
    {"json", ARL_OPT_BOOL, offsetof(rescore_cli, json), NULL, "one JSON object per trajectory", 0,
     0, NULL, 0, NULL},
    {"label", ARL_OPT_STRING, offsetof(rescore_cli, label), NULL,
     "name of this re-score in the rescores rows and the rewards rows' source 'rescore:L' "
     "(default: the checkpoint directory's name; 'rewards' without --ckpt)",
     0, 0, NULL, 0, "L"},
    {"no-save", ARL_OPT_BOOL, offsetof(rescore_cli, no_save), NULL,
     "do not write rescores rows into a tool file of the store", 0, 0, NULL, 0, NULL},
    {"save-states", ARL_OPT_BOOL, offsetof(rescore_cli, save_states), NULL,
     "also write each segment's end state (producer tool) into the tool file's states file: a "
     "later rescore under the same checkpoint and routing starts its segments from them; this "
     "pass computes every state itself",
     0, 0, NULL, 0, NULL},
    {"rewards", ARL_OPT_BOOL, offsetof(rescore_cli, rewards), NULL,
     "also re-score the rewards: replay each trajectory's stored actions in a new session of its "
     "environment (it must declare deterministic_replay), request the scores again, write them as "
     "rewards rows with source 'rescore:<label>' into the tool file and print the drift from the "
     "stored ones per level; a response whose observation or episode end differs stops the "
     "trajectory (diverged, nothing written for it)",
     0, 0, NULL, 0, NULL},
    {"env", ARL_OPT_STRING, offsetof(rescore_cli, env), NULL,
     "with --rewards: the environment to replay against (builtin:NAME, NAME or an AEP/1 base "
     "URL); default: the one the trajectory's run used (its config key env)",
     0, 0, NULL, 0, "SPEC"},
    {"env-config", ARL_OPT_STRING, offsetof(rescore_cli, env_config), NULL,
     "with --rewards: configuration JSON of a built-in environment (default: the run's "
     "env-config when --env is the run's environment)",
     0, 0, NULL, 0, "JSON"},
};
#define RESCORE_N ARL_OPTIONS_COUNT(rescore_tab)

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The rescores rows of one trajectory (spec/replay.md 13.6 step 2): per segment of its stream,
 * the re-scored log-probabilities lp[tok_start .. +n_tokens) and stats over its action tokens:
 * mean, p99 and max of |l - l_mu|, the k3 divergence from mu (mean of (r - 1) - log r with
 * r = exp(l - l_mu)), the segment mean log-ratio, the mean entropy at those tokens, and the
 * router agreement with the stored routes (spec/objective.md 11.4: overlap, exact_layer,
 * exact_token and the per-layer overlap, over the segment's tokens whose routes are stored in
 * every layer; det from arl_rollout_rescore_ex).  Rows of a fork's prefix are keyed by the
 * parent's uid (the segment's owner). */
static arl_status save_rescores(replay_store *st, replay_writer *tw, const char *traj,
                                const rescore_cli *o, int64_t version, const char *label,
                                const float *lp,
                                const float *mu, size_t n, const arl_rollout_rescore_detail *det) {
    replay_traj_row tr;
    ARL_TRY(replay_traj_get(st, traj, &tr));
    replay_seg_ref *refs = NULL;
    size_t nref = 0;
    ARL_TRY(replay_traj_segments(st, tr.traj_id, &refs, &nref));
    replay_run_info run;
    char rid[32];
    snprintf(rid, sizeof rid, "%lld", (long long)tr.run_id);
    int have_run = replay_run_get(st, rid, &run) == ARL_OK;
    replay_seg_data d;
    memset(&d, 0, sizeof d);
    double *abs_d = NULL;
    const int64_t nm = det->n_moe;
    int64_t *lay = calloc((size_t)(nm ? nm : 1), sizeof *lay); /* per-layer sum of |N ∩ R| */
    size_t cap = 640 + (size_t)nm * 24;
    char *stats = malloc(cap);
    arl_status s = lay && stats ? ARL_OK : arl_errorf(ARL_ERR_NOMEM, "out of memory");
    for (size_t i = 0; s == ARL_OK && i < nref; i++) {
        const replay_seg_ref *r = &refs[i];
        if (r->tok_start < 0 || (size_t)(r->tok_start + r->n_tokens) > n) {
            s = arl_errorf(ARL_ERR_INTERNAL, "rescore of %s: segment %d outside the %zu scored tokens",
                           traj, (int)r->seg_index, n);
            break;
        }
        if ((s = replay_segment_load(st, r->traj_id, r->seg_index, REPLAY_LOAD_TOKENS, &d)) !=
            ARL_OK)
            break;
        double *p = realloc(abs_d, (size_t)r->n_tokens * sizeof *p);
        if (!p) {
            s = arl_errorf(ARL_ERR_NOMEM, "out of memory");
            break;
        }
        abs_d = p;
        size_t na = 0, ne = 0;
        double sum_abs = 0, sum_lr = 0, sum_k3 = 0, mx = 0, sum_ent = 0;
        int64_t rt = 0, ov = 0, exl = 0, ext = 0;
        memset(lay, 0, sizeof *lay * (size_t)(nm ? nm : 1));
        for (int64_t t = 0; t < r->n_tokens; t++) {
            const size_t at = (size_t)(r->tok_start + t);
            int routed = nm > 0;
            for (int64_t l = 0; l < nm; l++)
                routed &= det->overlap[(size_t)l * n + at] != 0xFF;
            if (routed) {
                int all = 1;
                for (int64_t l = 0; l < nm; l++) {
                    int64_t in = det->overlap[(size_t)l * n + at];
                    ov += in;
                    lay[l] += in;
                    exl += in == det->k;
                    all &= in == det->k;
                }
                rt++;
                ext += all;
            }
            if (!d.loss_mask[t]) continue;
            if (t > 0) {
                sum_ent += det->entropy[at];
                ne++;
            }
            double x = (double)lp[r->tok_start + t] - (double)mu[r->tok_start + t];
            double a = x < 0 ? -x : x;
            abs_d[na++] = a;
            sum_abs += a;
            sum_lr += x;
            sum_k3 += exp(x) - 1.0 - x;
            if (a > mx) mx = a;
        }
        double p99 = 0;
        if (na) {
            qsort(abs_d, na, sizeof *abs_d, cmp_double);
            size_t k = (size_t)ceil(0.99 * (double)na);
            p99 = abs_d[k ? k - 1 : 0];
        }
        size_t w;
        if (na)
            w = (size_t)snprintf(stats, cap,
                                 "{\"action_tokens\":%zu,\"mean_abs\":%.9g,\"p99_abs\":%.9g,"
                                 "\"max_abs\":%.9g,\"k3\":%.9g,\"seg_mean_logratio\":%.9g,"
                                 "\"entropy_mean\":%.9g",
                                 na, sum_abs / (double)na, p99, mx, sum_k3 / (double)na,
                                 sum_lr / (double)na, ne ? sum_ent / (double)ne : 0.0);
        else
            w = (size_t)snprintf(stats, cap, "{\"action_tokens\":0");
        if (rt) {
            const double pairs = (double)rt * (double)nm;
            w += (size_t)snprintf(stats + w, cap - w,
                                  ",\"router_agreement\":{\"tokens\":%lld,\"overlap\":%.9g,"
                                  "\"exact_layer\":%.9g,\"exact_token\":%.9g,\"layer\":[",
                                  (long long)rt, (double)ov / (pairs * (double)det->k),
                                  (double)exl / pairs, (double)ext / (double)rt);
            for (int64_t l = 0; l < nm; l++)
                w += (size_t)snprintf(stats + w, cap - w, "%s%.9g", l ? "," : "",
                                      (double)lay[l] / ((double)rt * (double)det->k));
            w += (size_t)snprintf(stats + w, cap - w, "]}");
        }
        snprintf(stats + w, cap - w, "}");
        replay_rescore_desc rd = {.label = label,
                                  .traj_uid = r->traj_uid,
                                  .seg_index = r->seg_index,
                                  .run_uid = have_run ? run.run_uid : NULL,
                                  .version = version,
                                  .checkpoint_uri = o->ckpt,
                                  .routing = o->routing,
                                  .stats_json = stats,
                                  .n_tokens = r->n_tokens,
                                  .logprobs = lp + r->tok_start};
        s = replay_rescore_put(tw, &rd);
    }
    free(abs_d);
    free(lay);
    free(stats);
    replay_seg_data_free(&d);
    free(refs);
    if (have_run) replay_run_info_free(&run);
    return s;
}

static const char *version_how_name(int how) {
    switch (how) {
    case ARL_ROLLOUT_RESCORE_VERSION_GIVEN:
        return "given";
    case ARL_ROLLOUT_RESCORE_VERSION_WEIGHTS:
        return "the run's version with these weights";
    case ARL_ROLLOUT_RESCORE_VERSION_PATH:
        return "the run's version at this checkpoint path";
    case ARL_ROLLOUT_RESCORE_VERSION_REFUSED:
        return "refused: the run records other weights for the given version";
    case ARL_ROLLOUT_RESCORE_VERSION_UNKNOWN:
        return "unknown: the run records no such version";
    default:
        return "no version of the run matches this checkpoint";
    }
}

static const char *version_how_key(int how) {
    static const char *const k[] = {"none", "given", "weights", "path", "refused", "unknown"};
    return how >= 0 && how <= 5 ? k[how] : "none";
}

/* --version N of trajectory tr: a version its run records in the catalog (without a catalog
 * there is nothing to check it against: it is taken as asserted).  An unknown one is
 * ARL_ERR_NOT_FOUND naming the run and its newest version: a typo, not a silent recompute. */
static arl_status check_version(replay_store *st, const replay_traj_row *tr, int64_t version) {
    if (!replay_store_has_catalog(st)) return ARL_OK;
    replay_version_row rec;
    arl_status s = replay_version_get(st, tr->run_id, version, &rec);
    if (s != ARL_ERR_NOT_FOUND) return s;
    arl_error_clear();
    replay_run_info run;
    char rid[32], newest[64] = "it records no policy version";
    snprintf(rid, sizeof rid, "%lld", (long long)tr->run_id);
    const int have_run = replay_run_get(st, rid, &run) == ARL_OK;
    arl_error_clear();
    if (replay_version_get(st, tr->run_id, -1, &rec) == ARL_OK)
        snprintf(newest, sizeof newest, "its newest is %lld", (long long)rec.version);
    arl_error_clear();
    s = arl_errorf(ARL_ERR_NOT_FOUND,
                   "replay rescore: --version %lld: run '%s' of %s records no policy version "
                   "%lld (%s): give a version it records, auto (found from the checkpoint's "
                   "weights) or none",
                   (long long)version, have_run ? run.run_uid : rid, tr->traj_uid,
                   (long long)version, newest);
    if (have_run) replay_run_info_free(&run);
    return s;
}

/* --label default: the checkpoint directory's last path component */
static void default_label(const char *ckpt, char *out, size_t cap) {
    size_t n = strlen(ckpt);
    while (n > 1 && ckpt[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && ckpt[b - 1] != '/')
        b--;
    snprintf(out, cap, "%.*s", (int)(n - b), ckpt + b);
    if (!out[0]) snprintf(out, cap, "rescore");
}

static const char *const level_key[3] = {"process", "segment", "outcome"};

/* The --rewards report of one trajectory as a JSON object (caller decrefs). */
static json_t *rewards_json(const arl_rollout_rescore_rewards_stats *r) {
    json_t *o = json_object(), *lv = json_object(), *dif = json_array();
    json_object_set_new(o, "env", json_string(r->env_name));
    json_object_set_new(o, "env_version", json_string(r->env_version));
    json_object_set_new(o, "where", json_string(r->env_where));
    json_object_set_new(o, "steps", json_integer(r->steps));
    json_object_set_new(o, "segment_scores", json_integer(r->segment_scores));
    json_object_set_new(o, "episode_scores", json_integer(r->episode_scores));
    json_object_set_new(o, "partial", json_boolean(r->partial));
    json_object_set_new(o, "note", json_string(r->note));
    json_object_set_new(o, "mismatched_responses", json_integer(r->mismatched));
    json_object_set_new(o, "first_mismatch", json_string(r->first_mismatch));
    json_object_set_new(o, "rows_written", json_integer(r->rows_written));
    for (int l = 0; l < 3; l++) {
        const arl_rollout_reward_drift *d = &r->level[l];
        json_t *x = json_object();
        json_object_set_new(x, "compared", json_integer(d->compared));
        json_object_set_new(x, "differing", json_integer(d->differing));
        json_object_set_new(x, "missing", json_integer(d->missing));
        json_object_set_new(x, "extra", json_integer(d->extra));
        json_object_set_new(x, "max_abs", json_real(d->max_abs));
        const double nv = (double)d->n_values;
        json_object_set_new(x, "stored_mean",
                            d->n_values ? json_real(d->stored_sum / nv) : json_null());
        json_object_set_new(x, "rescored_mean",
                            d->n_values ? json_real(d->rescored_sum / nv) : json_null());
        json_object_set_new(lv, level_key[l], x);
    }
    json_object_set_new(o, "levels", lv);
    for (size_t i = 0; i < r->n_pairs; i++) {
        const arl_rollout_reward_pair *p = &r->pairs[i];
        const int same = p->present == 3 && ((isnan(p->stored) && isnan(p->rescored)) ||
                                             p->stored == p->rescored);
        if (same) continue;
        json_array_append_new(
            dif, json_pack("{s:s,s:I,s:s,s:o,s:o}", "level", level_key[p->level], "scope",
                           (json_int_t)p->scope_index, "component", p->component, "stored",
                           isnan(p->stored) ? json_null() : json_real(p->stored), "rescored",
                           isnan(p->rescored) ? json_null() : json_real(p->rescored)));
    }
    json_object_set_new(o, "differing", dif);
    return o;
}

static void fmt_value(char *buf, size_t cap, double v, int present) {
    if (!present)
        snprintf(buf, cap, "absent");
    else if (isnan(v))
        snprintf(buf, cap, "null");
    else
        snprintf(buf, cap, "%.9g", v);
}

static void rewards_print(const char *traj, const arl_rollout_rescore_rewards_stats *r) {
    printf("%s: rewards re-scored against %s %s (%s): %lld steps, %lld segment scores, %s; %lld "
           "responses differ from the stored bytes%s%s\n",
           traj, r->env_name, r->env_version, r->env_where, (long long)r->steps,
           (long long)r->segment_scores, r->episode_scores ? "episode score" : "no episode score",
           (long long)r->mismatched, r->mismatched ? ", first: " : "", r->first_mismatch);
    if (r->partial) printf("  partial: %s\n", r->note);
    for (int l = 0; l < 3; l++) {
        const arl_rollout_reward_drift *d = &r->level[l];
        printf("  %-7s: %lld rows compared, %lld differ, max |diff| %.6g", level_key[l],
               (long long)d->compared, (long long)d->differing, d->max_abs);
        if (d->n_values)
            printf(" (mean stored %.6g, re-scored %.6g)", d->stored_sum / (double)d->n_values,
                   d->rescored_sum / (double)d->n_values);
        if (d->missing || d->extra)
            printf("; %lld stored rows not reproduced, %lld new rows", (long long)d->missing,
                   (long long)d->extra);
        printf("\n");
    }
    size_t shown = 0, total = 0;
    for (size_t i = 0; i < r->n_pairs; i++) {
        const arl_rollout_reward_pair *p = &r->pairs[i];
        if (p->present == 3 &&
            ((isnan(p->stored) && isnan(p->rescored)) || p->stored == p->rescored))
            continue;
        total++;
        if (shown == 20) continue;
        char a[32], b[32];
        fmt_value(a, sizeof a, p->stored, p->present & 1);
        fmt_value(b, sizeof b, p->rescored, p->present & 2);
        printf("    %s %s %lld '%s': stored %s, re-scored %s\n", level_key[p->level],
               p->level == 0 ? "step" : p->level == 1 ? "segment" : "scope",
               (long long)p->scope_index, p->component, a, b);
        shown++;
    }
    if (total > shown)
        printf("    ... %zu more differing rows (--json lists all)\n", total - shown);
}

/* 1 if arg is option name ("--label" or "--label=...") */
static int is_option(const char *arg, const char *name) {
    const size_t n = strlen(name);
    return !strncmp(arg, "--", 2) && !strncmp(arg + 2, name, n) &&
           (!arg[2 + n] || arg[2 + n] == '=');
}

/* The interrupt note of a re-score about to start trajectory i of o->traj (done of those before
 * it reported and, with a tool file, saved in it): the command that re-scores the rest, which
 * is this one with trajectories i.. and the options ow[0..now) (every argument but DB and the
 * trajectories).  Called between cli_interrupt_defer and cli_interrupt_resume, so that a signal
 * finds the note whole and in step with what was reported. */
static void rescore_note(const rescore_cli *o, int i, int done, int save, const replay_writer *tw,
                         char *const *ow, int now) {
    char then[4352];
    if (i == o->traj.n) { /* all done: only the store's files are being closed */
        snprintf(then, sizeof then,
                 "\nagentrl: interrupted: replay rescore stops here; all %d trajectories were "
                 "re-scored%s%.4000s%s%s\n",
                 done, save && tw ? ", saved in " : "", save && tw ? o->db : "",
                 save && tw ? "/" : "", save && tw ? replay_writer_file(tw) : "");
        cli_note_on_interrupt_text(then);
        return;
    }
    const char *trajs = done == 1 ? "trajectory" : "trajectories";
    if (done > 0 && save && tw)
        snprintf(then, sizeof then,
                 "the re-scores of the %d %s reported above are saved in %.4000s/%s; re-score "
                 "the others with",
                 done, trajs, o->db, replay_writer_file(tw));
    else if (done > 0)
        snprintf(then, sizeof then, "%d %s reported above; re-score the others with", done,
                 done == 1 ? "trajectory was" : "trajectories were");
    else
        snprintf(then, sizeof then, "nothing was re-scored; run it again with");
    const int n = 3 + (o->traj.n - i) + now;
    const char **w = malloc(sizeof *w * (size_t)n);
    size_t len = strlen(then);
    int k = 0;
    if (w) {
        w[k++] = "replay";
        w[k++] = "rescore";
        w[k++] = o->db;
        for (int j = i; j < o->traj.n; j++)
            w[k++] = o->traj.v[j];
        for (int j = 0; j < now; j++)
            w[k++] = ow[j];
        for (int j = 0; j < k; j++)
            len += 4 + 4 * strlen(w[j]); /* (quoted, at worst) */
    }
    if (w && len < 7800) {
        cli_note_on_interrupt_then("replay rescore", then, k, w);
    } else { /* too long to repeat */
        char text[4608];
        snprintf(text, sizeof text,
                 "\nagentrl: interrupted: replay rescore stops here; %s the same command, naming "
                 "only the trajectories not reported above\n",
                 then);
        cli_note_on_interrupt_text(text);
    }
    free(w);
}

int cmd_replay_rescore(int argc, char **argv) {
    rescore_cli o;
    /* DB and TRAJ... are positional; the other arguments (ow, options and their values) are
     * repeated by the command an interrupt note gives */
    char **ow = calloc((size_t)(argc + 1), sizeof *ow);
    int now = 0;
    if (!ow) return cli_fail(arl_errorf(ARL_ERR_NOMEM, "out of memory"));
    for (int i = 0; i < argc; i++) {
        if (argv[i][0] == '-' && argv[i][1]) {
            ow[now++] = argv[i];
            const arl_option *opt = NULL;
            for (size_t k = 0; k < RESCORE_N; k++)
                if (!(rescore_tab[k].flags & ARL_OPT_POSITIONAL) &&
                    is_option(argv[i], rescore_tab[k].name))
                    opt = &rescore_tab[k];
            if (opt && opt->type != ARL_OPT_BOOL && !strchr(argv[i], '=') && i + 1 < argc)
                ow[now++] = argv[++i];
        }
    }
    const char *usage = "agentrl replay rescore DB TRAJ... --ckpt DIR [--version auto|N|none] "
                        "[--save-states] [--routing replay|natural] [--rewards [--env SPEC]] "
                        "[--json]\n       agentrl replay rescore DB TRAJ... --version N [...]: "
                        "under the checkpoint the store records for version N of the run"
                        "\n       agentrl replay rescore DB TRAJ... --rewards [--env SPEC] "
                        "[--label L] [--json]";
    int rc = cli_parse(rescore_tab, RESCORE_N, argc, argv, &o, usage,
                       "Re-score stored trajectories under a checkpoint: each segment from its "
                       "cached boundary state (or the recomputed prefix), and compare with the "
                       "behaviour log-probabilities.  With --rewards, also replay the stored "
                       "actions against the environment and compare its rewards with the stored "
                       "ones.");
    if (rc) {
        free(ow);
        return rc < 0 ? ARL_EXIT_OK : rc;
    }
    if (o.traj.n == 0) {
        fprintf(stderr,
                "agentrl: error: missing TRAJ: name the trajectories to re-score after DB, each "
                "a traj_uid or traj_id ('agentrl replay list %s' shows them)\nusage: %s\n",
                o.db, usage);
        arl_options_free(rescore_tab, RESCORE_N, &o);
        free(ow);
        return ARL_EXIT_USAGE;
    }
    int64_t version = ARL_ROLLOUT_RESCORE_VERSION_AUTO;
    if (!strcmp(o.version, "none") || !strcmp(o.version, "-1")) {
        version = -1;
    } else if (strcmp(o.version, "auto") && !version_number(o.version, &version)) {
        fprintf(stderr,
                "agentrl: error: replay rescore: --version: expected auto, none, -1 or a "
                "version 0..4294967295, got '%s'\nusage: %s\n",
                o.version, usage);
        arl_options_free(rescore_tab, RESCORE_N, &o);
        free(ow);
        return ARL_EXIT_USAGE;
    }
    /* --version N without --ckpt: the checkpoint the store records for version N of the run
     * (spec 13.6: --ckpt DIR, or --version n of the run) */
    const int ckpt_of_version = !o.ckpt && version >= 0;
    if (!o.ckpt && !o.rewards && !ckpt_of_version) {
        fprintf(stderr,
                "agentrl: error: replay rescore: missing required option '--ckpt DIR' (or "
                "--version N of the run, or --rewards for a rewards-only re-score)\nusage: %s\n",
                usage);
        arl_options_free(rescore_tab, RESCORE_N, &o);
        free(ow);
        return ARL_EXIT_USAGE;
    }
    if (!o.ckpt && !ckpt_of_version && o.save_states) {
        fprintf(stderr,
                "agentrl: error: replay rescore: --save-states needs --ckpt or --version N\n"
                "usage: %s\n",
                usage);
        arl_options_free(rescore_tab, RESCORE_N, &o);
        free(ow);
        return ARL_EXIT_USAGE;
    }
    if (!o.rewards && (o.env || o.env_config)) {
        fprintf(stderr,
                "agentrl: error: replay rescore: --env and --env-config go with --rewards\n"
                "usage: %s\n",
                usage);
        arl_options_free(rescore_tab, RESCORE_N, &o);
        free(ow);
        return ARL_EXIT_USAGE;
    }
    if (o.save_states && o.no_save) {
        fprintf(stderr,
                "agentrl: error: replay rescore: --save-states writes into a tool file: it "
                "cannot go with --no-save\nusage: %s\n",
                usage);
        arl_options_free(rescore_tab, RESCORE_N, &o);
        free(ow);
        return ARL_EXIT_USAGE;
    }
    char label[256];
    if (o.label && (!o.label[0] || strlen(o.label) >= sizeof label)) {
        fprintf(stderr,
                "agentrl: error: replay rescore: --label: %s (give a name of 1 to %zu bytes)\n"
                "usage: %s\n",
                o.label[0] ? "too long" : "empty", sizeof label - 1, usage);
        arl_options_free(rescore_tab, RESCORE_N, &o);
        free(ow);
        return ARL_EXIT_USAGE;
    }
    if (o.ckpt)
        default_label(o.ckpt, label, sizeof label);
    else if (ckpt_of_version)
        snprintf(label, sizeof label, "v%lld", (long long)version);
    else
        snprintf(label, sizeof label, "rewards");
    if (o.label) snprintf(label, sizeof label, "%s", o.label);
    /* the rows go into a tool file (spec 13.6): read-write when the store has a catalog */
    replay_open_opts so = {.flags = o.no_save ? REPLAY_OPEN_READONLY : 0};
    replay_store *st = NULL;
    replay_writer *tw = NULL;
    /* the checkpoint and every trajectory first: a typo stops the command before anything is
     * computed or written */
    arl_status s = o.ckpt ? cli_check_ckpt_dir("--ckpt", o.ckpt) : ARL_OK;
    if (s == ARL_OK) s = replay_store_open(o.db, &so, &st);
    for (int i = 0; s == ARL_OK && i < o.traj.n; i++) {
        replay_traj_row tr;
        s = replay_traj_get(st, o.traj.v[i], &tr);
        if (s == ARL_OK && o.ckpt && version >= 0) s = check_version(st, &tr, version);
    }
    /* --version N alone: every TRAJ's run must record one checkpoint for N */
    char vckpt[4096] = "";
    for (int i = 0; s == ARL_OK && ckpt_of_version && i < o.traj.n; i++) {
        int64_t v = version;
        char c[sizeof vckpt];
        s = fork_ckpt_of(st, o.db, o.traj.v[i], &v, c, sizeof c, "replay rescore",
                         "the checkpoint to score under");
        if (s == ARL_OK && i && strcmp(c, vckpt))
            s = arl_errorf(ARL_ERR_ARG,
                           "replay rescore: --version %lld is %s for %s but %s for %s (their runs "
                           "differ): re-score them apart, or give --ckpt DIR",
                           (long long)version, vckpt, o.traj.v[0], c, o.traj.v[i]);
        if (s == ARL_OK && !i) snprintf(vckpt, sizeof vckpt, "%s", c);
    }
    if (s == ARL_OK && ckpt_of_version && !(o.ckpt = strdup(vckpt)))
        s = arl_errorf(ARL_ERR_NOMEM, "replay rescore: out of memory");
    int save = s == ARL_OK && !o.no_save && replay_store_has_catalog(st);
    if (s == ARL_OK && !o.no_save && !save)
        fprintf(stderr, "agentrl: note: %s has no catalog: re-scores are not saved\n", o.db);
    if (s == ARL_OK && o.save_states && !save)
        s = arl_errorf(ARL_ERR_STATE, "replay rescore: --save-states needs a store root with its "
                                      "catalog.sqlite (%s has none)",
                       o.db);
    /* the states go into the tool file's states file as they are computed */
    if (s == ARL_OK && o.save_states) s = replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, &tw);
    int done = 0; /* trajectories reported (and saved, with a tool file) */
    int at = 0;   /* the trajectory being re-scored */
    if (s == ARL_OK) {
        cli_interrupt_defer();
        rescore_note(&o, 0, done, save, tw, ow, now);
        cli_interrupt_resume();
    }
    for (int i = 0; s == ARL_OK && i < o.traj.n; i++) {
        at = i;
        /* the rewards first: an environment that cannot replay stops before anything of this
         * trajectory is computed; their rows are saved with the model's, below, so that an
         * interrupt between the two leaves neither (the note's command re-scores it whole:
         * rows saved before would be there twice, in two tool files) */
        arl_rollout_rescore_rewards_stats rw;
        memset(&rw, 0, sizeof rw);
        if (o.rewards) {
            arl_rollout_rescore_rewards_opts rro = {.env = o.env, .env_config = o.env_config,
                                                    .label = label};
            s = arl_rollout_rescore_rewards(st, o.traj.v[i], &rro, NULL, &rw);
            if (s) break;
        }
        if (!o.ckpt) {
            /* the rows, the report and the note: one step an interrupt does not cut */
            cli_interrupt_defer();
            if (save && !tw) s = replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, &tw);
            if (s == ARL_OK && save)
                s = arl_rollout_rescore_rewards_save(st, o.traj.v[i], label, &tw, &rw);
            if (s) {
                cli_interrupt_resume();
                free(rw.pairs);
                break;
            }
            if (o.json) {
                json_t *j = json_pack("{s:s,s:o}", "traj", o.traj.v[i], "rewards",
                                      rewards_json(&rw));
                char *txt = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
                printf("%s\n", txt ? txt : "{}");
                free(txt);
                json_decref(j);
            } else {
                rewards_print(o.traj.v[i], &rw);
            }
            free(rw.pairs);
            fflush(stdout);
            done++;
            rescore_note(&o, i + 1, done, save, tw, ow, now);
            cli_interrupt_resume();
            continue;
        }
        arl_rollout_rescore_opts ro = {.ckpt_dir = o.ckpt, .version = version,
                                       .save_states = o.save_states ? tw : NULL,
                                       .natural_routing = !strcmp(o.routing, "natural"),
                                       .sparse_topk = o.sparse_topk,
                                       .sparse_chunk = o.sparse_chunk,
                                       .device = o.device};
        arl_rollout_rescore_stats r;
        float *lp = NULL, *mu = NULL;
        size_t nlp = 0;
        arl_rollout_rescore_detail det;
        memset(&det, 0, sizeof det);
        s = arl_rollout_rescore_ex(st, o.traj.v[i], &ro, &r, save ? &lp : NULL,
                                   save ? &mu : NULL, save ? &nlp : NULL, save ? &det : NULL);
        /* --version N alone scores under the checkpoint recorded for N (label vN): its weights
         * must be N's (a checkpoint overwritten, or one found where a copied run has it) */
        if (s == ARL_OK && ckpt_of_version && r.version_how == ARL_ROLLOUT_RESCORE_VERSION_REFUSED)
            s = arl_errorf(ARL_ERR_STATE,
                           "replay rescore: %s holds other weights than the run of %s recorded "
                           "for policy version %lld (weights_sha256); give --ckpt "
                           "DIR to score under it anyway",
                           o.ckpt, o.traj.v[i], (long long)version);
        if (s == ARL_OK && save && !tw) s = replay_writer_open(st, REPLAY_FILE_TOOL, 0, NULL, &tw);
        /* the trajectory's rows and its report are one step that an interrupt does not cut:
         * a trajectory reported above the interrupt note is saved whole, one below it not; its
         * rewards and model rows are one transaction, which a crash (SIGKILL) does not cut */
        cli_interrupt_defer();
        if (s == ARL_OK && save && (s = replay_rescore_tx_begin(tw)) == ARL_OK) {
            if (o.rewards) s = arl_rollout_rescore_rewards_save(st, o.traj.v[i], label, &tw, &rw);
            if (s == ARL_OK)
                s = save_rescores(st, tw, o.traj.v[i], &o, r.version, label, lp, mu, nlp, &det);
            s = replay_rescore_tx_end(tw, s);
        }
        free(lp);
        free(mu);
        free(det.entropy);
        free(det.overlap);
        if (s) {
            cli_interrupt_resume();
            free(rw.pairs);
            break;
        }
        if (o.json)
            printf("{\"traj\":\"%s\",\"segments\":%lld,\"from_state\":%lld,\"recomputed\":%lld,"
                   "\"fresh\":%lld,\"skipped\":%lld,\"action_tokens\":%lld,"
                   "\"mean_abs\":%.9g,\"p99_abs\":%.9g,\"max_abs\":%.9g,\"worst_token\":%lld,"
                   "\"entropy_mean\":%.9g,\"route_tokens\":%lld,\"agree_overlap\":%.9g,"
                   "\"agree_exact_layer\":%.9g,\"agree_exact_token\":%.9g,\"version\":%lld,"
                   "\"version_how\":\"%s\",\"from_tool_state\":%lld,\"states_saved\":%lld,"
                   "\"from_learner_state\":%lld,\"routes_other_layout\":%lld",
                   o.traj.v[i], (long long)r.segments, (long long)r.from_state,
                   (long long)r.recomputed, (long long)r.fresh, (long long)r.skipped,
                   (long long)r.action_tokens, r.mean_abs, r.p99_abs, r.max_abs,
                   (long long)r.worst_token, r.entropy_mean, (long long)r.route_tokens,
                   r.agree_overlap, r.agree_exact_layer, r.agree_exact_token, (long long)r.version,
                   version_how_key(r.version_how), (long long)r.from_tool_state,
                   (long long)r.states_saved, (long long)r.from_learner_state,
                   (long long)r.routes_other_layout);
        if (o.json && o.rewards) {
            json_t *j = rewards_json(&rw);
            char *txt = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
            printf(",\"rewards\":%s", txt ? txt : "{}");
            free(txt);
            json_decref(j);
        }
        if (o.json)
            printf("}\n");
        else
            printf("%s: %lld segments (%lld fresh, %lld from cached states, %lld "
                   "recomputed prefixes, %lld skipped: images), %lld action tokens: |l - l_mu| "
                   "mean %.3g p99 %.3g max %.3g (token %lld), entropy mean %.4g; router agreement "
                   "over %lld tokens: overlap %.4f exact layer %.4f exact token %.4f\n",
                   o.traj.v[i], (long long)r.segments, (long long)r.fresh, (long long)r.from_state,
                   (long long)r.recomputed, (long long)r.skipped, (long long)r.action_tokens,
                   r.mean_abs, r.p99_abs, r.max_abs, (long long)r.worst_token, r.entropy_mean,
                   (long long)r.route_tokens, r.agree_overlap, r.agree_exact_layer,
                   r.agree_exact_token);
        if (!o.json && r.routes_other_layout)
            printf("  router agreement not measured in %lld segments: their stored routes are "
                   "of another MoE layout than the checkpoint's (another model)\n",
                   (long long)r.routes_other_layout);
        if (!o.json) {
            if (r.version >= 0)
                printf("  start states: rollout states of version %lld (%s)",
                       (long long)r.version, version_how_name(r.version_how));
            else
                printf("  start states: no rollout states (%s)",
                       version == -1 ? "--version none" : version_how_name(r.version_how));
            printf("; %lld from tool states of this checkpoint", (long long)r.from_tool_state);
            if (r.from_learner_state)
                printf("; %lld from learner states of these weights",
                       (long long)r.from_learner_state);
            if (o.save_states) printf("; %lld boundaries saved", (long long)r.states_saved);
            printf("\n");
            if (o.rewards) rewards_print(o.traj.v[i], &rw);
        }
        free(rw.pairs);
        fflush(stdout);
        done++;
        rescore_note(&o, i + 1, done, save, tw, ow, now);
        cli_interrupt_resume();
    }
    rc = s ? cli_fail(s) : ARL_EXIT_OK;
    if (tw && !rc)
        fprintf(stderr, "re-scores '%s' saved in %s/%s\n", label, o.db, replay_writer_file(tw));
    else if (rc && done > 0)
        fprintf(stderr,
                "agentrl: replay rescore stopped at %s; %d %s reported above%s%s%s%s (re-score "
                "the others with the same command, naming them)\n",
                o.traj.v[at], done, done == 1 ? "trajectory was" : "trajectories were",
                save && tw ? ", their re-scores saved in " : "", save && tw ? o.db : "",
                save && tw ? "/" : "", save && tw ? replay_writer_file(tw) : "");
    replay_writer_close(tw);
    replay_store_close(st);
    arl_options_free(rescore_tab, RESCORE_N, &o);
    free(ow);
    return rc;
}

/* ---- fork ---- */

typedef struct fork_cli {
    arl_rollout_config rc; /* first: the rollout table's offsets apply */
    char *db;
    char *traj;
    char *ckpt;
    char *version;
    char *experiment;
    int64_t segment;
    int64_t count;
    char *group_uid;
    int use_rollout_state;
} fork_cli;

static const arl_option fork_own[] = {
    {"db", ARL_OPT_STRING, offsetof(fork_cli, db), NULL, "replay store root", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED | ARL_OPT_CLI_ONLY, "DB"},
    {"traj", ARL_OPT_STRING, offsetof(fork_cli, traj), NULL, "the parent (traj_uid or traj_id)", 0,
     0, NULL, ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED | ARL_OPT_CLI_ONLY, "TRAJ"},
    {"segment", ARL_OPT_INT, offsetof(fork_cli, segment), "0",
     "keep the first S >= 1 segments as the prefix (the fork point is the end of segment S-1); "
     "required",
     0, 1 << 30, NULL, ARL_OPT_CLI_ONLY, "S"},
    {"ckpt", ARL_OPT_STRING, offsetof(fork_cli, ckpt), NULL,
     "policy that continues the forks (default: the checkpoint the store records for --version)", 0,
     0, NULL, ARL_OPT_CLI_ONLY, "DIR"},
    {"version", ARL_OPT_STRING, offsetof(fork_cli, version), "newest",
     "policy version of the parent's run that continues the forks: its checkpoint as the store "
     "records it, or, with --ckpt, the version --ckpt must be; newest = the run's highest",
     0, 0, NULL, ARL_OPT_CLI_ONLY, "N"},
    {"use-rollout-state", ARL_OPT_BOOL, offsetof(fork_cli, use_rollout_state), "false",
     "start from the parent's cached rollout state whatever versions computed it (default: only "
     "a state computed at the forks' version; else the prefix is prefilled again)",
     0, 0, NULL, ARL_OPT_CLI_ONLY, NULL},
    {"count", ARL_OPT_INT, offsetof(fork_cli, count), "1", "continuations", 1, 4096, NULL,
     ARL_OPT_CLI_ONLY, "M"},
    {"group-uid", ARL_OPT_STRING, offsetof(fork_cli, group_uid), NULL,
     "group of the forks (default <TRAJ>/fork<S>)", 0, 0, NULL, ARL_OPT_CLI_ONLY, "UID"},
    {"experiment", ARL_OPT_STRING, offsetof(fork_cli, experiment), NULL,
     "experiment JSON whose rollout keys replace those of the parent's run (by default the forks "
     "continue with its run's environment, budgets and sampling)",
     0, 0, NULL, ARL_OPT_CLI_ONLY, "FILE"},
};

/* The rollout settings of TRAJ's run (its resolved configuration, kept in the store at db) into
 * rc: the forks continue with the environment, budgets and sampling of their parent's run.  The
 * keys of the machine (device, threads), the progress output, the policy source and the run's
 * task list are not taken (the forks continue the parent's task).  A run that kept no
 * configuration leaves rc as it is. */
static arl_status fork_run_defaults(const char *db, const char *traj, arl_rollout_config *rc) {
    static const char *const not_taken[] = {
        "threads",        "progress-s",    "device",     "device-bf16",
        "device-index",   "device-graphs", "policy-dir", "policy-poll-ms",
        "policy-version", "tasks",         "task-file",  "task-data",
        "task-seed",      "task-offset",   "run-uid",    "group-kind"};
    replay_open_opts so = {.flags = REPLAY_OPEN_READONLY};
    replay_store *st = NULL;
    replay_traj_row t;
    replay_run_info run = {0};
    arl_status s = replay_store_open(db, &so, &st);
    if (s == ARL_OK) s = replay_traj_get(st, traj, &t);
    if (s == ARL_OK) {
        char rid[32];
        snprintf(rid, sizeof rid, "%lld", (long long)t.run_id);
        s = replay_run_get(st, rid, &run);
    }
    json_t *j = s == ARL_OK && run.config_json ? json_loads(run.config_json, 0, NULL) : NULL;
    if (json_is_object(j)) {
        for (size_t i = 0; i < sizeof not_taken / sizeof *not_taken; i++)
            json_object_del(j, not_taken[i]);
        const char *k;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(j, tmp, k, v) {
            if (json_is_null(v)) json_object_del(j, k); /* unset */
        }
        char *text = json_dumps(j, JSON_COMPACT);
        char where[REPLAY_UID_MAX + 64];
        snprintf(where, sizeof where, "the run of %s", traj);
        s = text ? arl_rollout_config_load_json(rc, text, where)
                 : arl_errorf(ARL_ERR_NOMEM, "out of memory");
        free(text);
    }
    json_decref(j);
    replay_run_info_free(&run);
    replay_store_close(st);
    return s;
}

static int is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* A recorded checkpoint that is not where it was saved, found where a copied or moved run puts
 * it: the last 1..4 components of its path (policy/v3, reference) under the store root or one of
 * its first 6 ancestors (a train run's stores are OUT/replay/uN/rK, its checkpoints
 * OUT/policy/vN), nearest ancestor and shortest suffix first.  Stores record
 * absolute paths, so a run copied elsewhere still names the original's.  The weights are not
 * checked here: the fork and the re-score refuse a checkpoint whose weights are not the
 * version's (recorded weights_sha256).  Into out (cap bytes); 0 if none is there. */
static int ckpt_relocated(const char *recorded, const char *db, char *out, size_t cap) {
    char *anc = realpath(db, NULL);
    if (!anc) return 0;
    const size_t n = strlen(recorded);
    int found = 0;
    for (int up = 0; !found && up <= 6; up++) {
        size_t at = n;
        for (int k = 1; !found && k <= 4; k++) {
            while (at > 0 && recorded[at - 1] == '/') /* the suffix's start: k components */
                at--;
            while (at > 0 && recorded[at - 1] != '/')
                at--;
            if (at == 0) break; /* the whole path: that is the recorded one */
            const int w =
                snprintf(out, cap, "%s%s", strcmp(anc, "/") ? anc : "", recorded + at - 1);
            found = w > 0 && (size_t)w < cap && strcmp(out, recorded) && is_dir(out);
        }
        char *slash = strrchr(anc, '/');
        if (!slash || slash == anc) break; /* (the root itself is not searched) */
        *slash = 0;
    }
    free(anc);
    return found;
}

/* The policy that continues forks of traj without --ckpt: the checkpoint the store at db records
 * for version *version (< 0: the newest) of traj's run, into ckpt (cap bytes), or where a copied
 * run has it (ckpt_relocated, with a note); *version becomes the version found. */
static arl_status fork_ckpt_of(replay_store *st, const char *db, const char *traj, int64_t *version,
                               char *ckpt, size_t cap, const char *who, const char *what) {
    replay_traj_row t;
    ARL_TRY(replay_traj_get(st, traj, &t));
    replay_version_row v;
    replay_run_info run = {0};
    char rid[32];
    snprintf(rid, sizeof rid, "%lld", (long long)t.run_id);
    arl_status s = replay_run_get(st, rid, &run);
    if (s == ARL_OK) s = replay_version_get(st, t.run_id, *version, &v);
    if (s == ARL_ERR_NOT_FOUND && run.run_uid[0]) {
        arl_error_clear();
        replay_version_row newest;
        if (*version >= 0 && replay_version_get(st, t.run_id, -1, &newest) == ARL_OK)
            s = arl_errorf(ARL_ERR_NOT_FOUND,
                           "%s: run %s records no policy version %lld (its newest is %lld); "
                           "give another --version, or --ckpt DIR (%s)",
                           who, run.run_uid, (long long)*version, (long long)newest.version, what);
        else
            s = arl_errorf(ARL_ERR_NOT_FOUND,
                           "%s: run %s records no policy versions; give --ckpt DIR (%s)", who,
                           run.run_uid, what);
    }
    if (s == ARL_OK && !v.checkpoint_uri[0])
        s = arl_errorf(ARL_ERR_NOT_FOUND,
                       "%s: the store records no checkpoint for policy version %lld of run %s; "
                       "give --ckpt DIR (%s)",
                       who, (long long)v.version, run.run_uid, what);
    if (s == ARL_OK && is_dir(v.checkpoint_uri)) {
        snprintf(ckpt, cap, "%s", v.checkpoint_uri);
    } else if (s == ARL_OK && ckpt_relocated(v.checkpoint_uri, db, ckpt, cap)) {
        fprintf(stderr,
                "agentrl: note: %s: policy version %lld of run %s was saved at %s, which is not "
                "there; taking %s, at the same place relative to the store (a copied or moved "
                "run; its weights must be the version's)\n",
                who, (long long)v.version, run.run_uid, v.checkpoint_uri, ckpt);
    } else if (s == ARL_OK) {
        s = arl_errorf(ARL_ERR_NOT_FOUND,
                       "%s: policy version %lld of run %s was saved at %s, which is not there "
                       "(moved or deleted?), nor at the same place relative to the store; give "
                       "--ckpt DIR (%s) or --version N",
                       who, (long long)v.version, run.run_uid, v.checkpoint_uri, what);
    }
    if (s == ARL_OK) *version = v.version;
    replay_run_info_free(&run);
    return s;
}

/* 1 if argv gives --segment (as "--segment S" or "--segment=S"). */
static int segment_given(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--segment") || !strncmp(argv[i], "--segment=", 10)) return 1;
    return 0;
}

/* Rollout keys a fork does not use, and why: refused on its command line (an --experiment file
 * or the parent's run may carry them; they are ignored there). */
static const struct {
    const char *key, *why;
} fork_unused[] = {
    {"tasks", "the forks continue the parent's task"},
    {"task-file", "the forks continue the parent's task"},
    {"task-data", "the forks continue the parent's task"},
    {"task-seed", "the forks continue the parent's task"},
    {"task-offset", "the forks continue the parent's task"},
    {"group-size", "give the number of forks with --count M"},
    {"group-kind", "the forks' group is of kind 'fork'"},
    {"run-uid",
     "the forks belong to the parent's run, or to a run of their own when --ckpt is not one of "
     "its versions"},
    {"policy-dir", "give the forks' policy with --ckpt DIR or --version N"},
    {"policy-poll-ms", "give the forks' policy with --ckpt DIR or --version N"},
    {"policy-version", "give the forks' policy with --ckpt DIR or --version N"},
};

static const char *fork_unused_why(const char *key) {
    for (size_t i = 0; i < sizeof fork_unused / sizeof *fork_unused; i++)
        if (!strcmp(fork_unused[i].key, key)) return fork_unused[i].why;
    return NULL;
}

/* ARL_ERR_ARG naming the first argument of argv that gives a key of fork_unused. */
static arl_status fork_refuse_unused(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) || !a[2]) continue;
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)strcspn(a + 2, "="), a + 2);
        const char *why = fork_unused_why(key);
        if (why)
            return arl_errorf(ARL_ERR_ARG,
                              "--%s: a rollout key that replay fork does not use (%s); leave it "
                              "out",
                              key, why);
    }
    return ARL_OK;
}

int cmd_replay_fork(int argc, char **argv) {
    const char *usage = "agentrl replay fork DB TRAJ --segment S [--ckpt DIR | --version N] "
                        "[--count M] [--use-rollout-state] [--experiment FILE] [rollout keys: "
                        "--temperature ..., --seed ...]";
    const char *summary = "Continue a stored trajectory from a segment boundary: new trajectories "
                          "that share its first S segments, generated and scored like a rollout "
                          "with the settings of its run (environment, budgets, sampling) unless "
                          "--experiment or rollout keys give others.  A rollout key not given "
                          "takes its run's value, not the default shown below; only threads, "
                          "progress-s and the device keys start from those defaults.";
    size_t n_own = sizeof fork_own / sizeof fork_own[0], n = n_own + arl_rollout_n_options;
    arl_option *tab = malloc(n * sizeof *tab);
    if (!tab) return cli_fail(arl_errorf(ARL_ERR_NOMEM, "out of memory"));
    memcpy(tab, fork_own, sizeof fork_own);
    /* tab[0..n): parsed and shown: fork's own options and the rollout keys a fork uses, none
     * required (the parent's run gives them); tab[n..n_all): the keys it does not use, only for
     * the defaults and arl_options_free */
    const size_t n_all = n;
    size_t at = n_own;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) n = at;
        for (size_t i = 0; i < arl_rollout_n_options; i++) {
            if ((fork_unused_why(arl_rollout_options[i].name) != NULL) != pass) continue;
            tab[at] = arl_rollout_options[i];
            tab[at++].flags &= ~(unsigned)ARL_OPT_REQUIRED;
        }
    }
    fork_cli o;
    int help = 0;
    arl_status s = arl_options_defaults(tab, n_all, &o);
    if (s != ARL_OK) {
        free(tab);
        return cli_fail(s);
    }
    s = fork_refuse_unused(argc, argv);
    if (s == ARL_OK) s = arl_options_parse_argv(tab, n, argc, argv, &o, &help);
    if (s == ARL_OK && help) {
        arl_options_print_help(stdout, usage, summary, tab, n);
        arl_options_free(tab, n_all, &o);
        free(tab);
        return ARL_EXIT_OK;
    }
    if (s == ARL_OK && o.db && o.traj) {
        /* the parent's run's settings first, then the experiment file, the command line over
         * both */
        char *db = strdup(o.db), *traj = strdup(o.traj);
        char *experiment = o.experiment ? strdup(o.experiment) : NULL;
        const int lost = !db || !traj || (o.experiment && !experiment);
        arl_options_free(tab, n_all, &o);
        s = arl_options_defaults(tab, n_all, &o);
        if (s == ARL_OK)
            s = !lost ? fork_run_defaults(db, traj, &o.rc)
                      : arl_errorf(ARL_ERR_NOMEM, "out of memory");
        if (s == ARL_OK && experiment) {
            char *text;
            s = arl_file_read(experiment, 0, &text, NULL);
            if (s == ARL_OK) s = arl_rollout_config_load_json(&o.rc, text, experiment);
            free(text);
        }
        if (s == ARL_OK) s = arl_options_parse_argv(tab, n, argc, argv, &o, &help);
        free(db);
        free(traj);
        free(experiment);
        if (s != ARL_OK && s != ARL_ERR_ARG && s != ARL_ERR_CONFIG) { /* the store, the parent */
            const int rc = cli_fail(s);
            arl_options_free(tab, n_all, &o);
            free(tab);
            return rc;
        }
    }
    if (s == ARL_OK) s = arl_options_check_required(tab, n, &o);
    if (s == ARL_OK && o.segment < 1)
        s = segment_given(argc, argv)
                ? arl_errorf(ARL_ERR_ARG,
                             "--segment %lld: S must be >= 1 (the prefix keeps segments 0..S-1)",
                             (long long)o.segment)
                : arl_errorf(ARL_ERR_ARG, "missing required option '--segment S' (S >= 1)");
    if (s == ARL_OK && !o.rc.env)
        s = arl_errorf(ARL_ERR_ARG,
                       "the run of %s records no environment: give --env ENV or --experiment FILE",
                       o.traj);
    int64_t version = -1; /* --version newest */
    if (s == ARL_OK && strcmp(o.version, "newest") && !version_number(o.version, &version))
        s = arl_errorf(ARL_ERR_ARG,
                       "--version: expected newest or a version 0..4294967295, got '%s'",
                       o.version);
    if (s != ARL_OK) { /* (out of memory: the process's, exit 1 without the usage line) */
        const int rc = s == ARL_ERR_NOMEM ? cli_fail(s) : ARL_EXIT_USAGE;
        if (s != ARL_ERR_NOMEM)
            fprintf(stderr, "agentrl: error: %s\nusage: %s\n", arl_error_msg(), usage);
        arl_options_free(tab, n_all, &o);
        free(tab);
        return rc;
    }
    replay_open_opts so = {.flags = 0};
    replay_store *st = NULL;
    char(*uids)[REPLAY_UID_MAX + 1] = calloc((size_t)o.count, sizeof *uids);
    arl_rollout_stats stats;
    memset(&stats, 0, sizeof stats);
    s = uids ? replay_store_open(o.db, &so, &st) : arl_errorf(ARL_ERR_NOMEM, "out of memory");
    char ckpt[4096];
    if (s == ARL_OK && o.ckpt)
        snprintf(ckpt, sizeof ckpt, "%s", o.ckpt);
    else if (s == ARL_OK)
        s = fork_ckpt_of(st, o.db, o.traj, &version, ckpt, sizeof ckpt, "fork",
                         "the policy that continues the forks");
    const arl_rollout_fork_opts fo = {
        .group_uid = o.group_uid, .version = version, .use_rollout_state = o.use_rollout_state};
    if (s == ARL_OK) {
        /* forks interrupted with segments committed stay 'running' (no worker continues a
         * tool file's trajectories): the note says how to mask them */
        const char *const recover[] = {"replay", "recover", o.db, "--mask"};
        cli_note_on_interrupt_then(
            "replay fork", "the forks it finished stay. Mask those left running with", 4, recover);
        if (!o.ckpt) { /* (before the rollout's log lines) */
            printf("policy: version %lld of the parent's run, %s\n", (long long)version, ckpt);
            fflush(stdout);
        }
        s = arl_rollout_fork(&o.rc, ckpt, st, o.traj, (int32_t)o.segment, (int32_t)o.count, &fo,
                             uids, &stats);
    }
    int rc = s ? cli_fail(s) : ARL_EXIT_OK;
    if (s == ARL_OK) {
        arl_rollout_stats_print(&stats, stdout);
        for (int64_t i = 0; i < o.count; i++) printf("%s\n", uids[i]);
    }
    free(uids);
    replay_store_close(st);
    arl_options_free(tab, n_all, &o);
    free(tab);
    return rc;
}
