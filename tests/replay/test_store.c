/* The replay store API (replay/replay.h): writing trajectories segment by segment and reading
 * them back exactly, the write protocol's checks, states and boundary assembly, forks, takeover
 * and recovery of a dead writer's file, schema versions and migrations, and the clear errors a
 * damaged file or blob must give (spec/replay.md sections 2-12). */
#include <fcntl.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/sha256.h"
#include "replay/inspect.h"
#include "replay/internal.h"
#include "tests/replay/fixture.h"
#include "tests/test.h"

/* A new store under a fresh test directory with the fixture catalog (group 1 of group_size). */
static replay_store *open_new(const char *tag, char *root, size_t cap, int group_size,
                              fx_ids *ids) {
    snprintf(root, cap, "%s/store", test_tmpdir(tag));
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st = NULL;
    arl_status s = replay_store_open(root, &o, &st);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    if (st) CHECK(fx_catalog(st, 1, group_size, ids) == ARL_OK);
    return st;
}

/* open_new, then a worker writer of run1 on a new shard in *w (NULL if it does not open). */
static replay_store *open_writer(const char *tag, char *root, size_t cap, int group_size,
                                 fx_ids *ids, replay_writer **w) {
    *w = NULL;
    replay_store *st = open_new(tag, root, cap, group_size, ids);
    if (st) CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", w) == ARL_OK);
    return st;
}

/* open_new and close it: the store and catalog are on disk for writer processes; 0 on failure. */
static int make_store(const char *tag, char *root, size_t cap, int group_size, fx_ids *ids) {
    replay_store *st = open_new(tag, root, cap, group_size, ids);
    replay_store_close(st);
    return st != NULL;
}

/* Begin trajectory uid (slot 0, not a fork) on w; its descriptor in *td.  The id, or -1. */
static int64_t begin_traj(replay_writer *w, const fx_ids *ids, const char *uid,
                          replay_traj_desc *td) {
    *td = fx_traj_desc(ids, uid, 0);
    int64_t t = -1;
    CHECK(replay_traj_begin(w, td, &t) == ARL_OK);
    return t;
}

/* Segments the learner's iterator yields under flt (NULL: all); -1 if it does not open. */
static int count_segs(replay_store *st, const replay_seg_filter *flt) {
    replay_seg_iter *it = NULL;
    replay_seg_ref ref;
    int done = 0, n = 0;
    CHECK(replay_seg_iter_open(st, flt, &it) == ARL_OK);
    if (!it) return -1;
    while (replay_seg_iter_next(it, &ref, &done) == ARL_OK && !done)
        n++;
    replay_seg_iter_close(it);
    return n;
}

/* Open file rel of the store at root and step sql to its first row (CHECKed); the caller reads
 * the row and ends with query_done. */
static sqlite3_stmt *query_row(const char *root, const char *rel, const char *sql, sqlite3 **db) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    sqlite3_stmt *q = NULL;
    CHECK(sqlite3_open(p, db) == SQLITE_OK);
    CHECK(sqlite3_prepare_v2(*db, sql, -1, &q, NULL) == SQLITE_OK);
    CHECK(sqlite3_step(q) == SQLITE_ROW);
    return q;
}

static void query_done(sqlite3 *db, sqlite3_stmt *q) {
    sqlite3_finalize(q);
    sqlite3_close(db);
}

/* In a forked child: the store at root and a new worker writer on it, or exit 3. */
static replay_writer *child_writer(const char *root, replay_store **cs) {
    replay_writer *w;
    if (replay_store_open(root, NULL, cs) ||
        replay_writer_open(*cs, REPLAY_FILE_WORKER, 0, "run1", &w))
        _exit(3);
    return w;
}

/* Compare a loaded segment with the regenerated one. */
static int seg_equal(const replay_seg_data *d, const fx_seg *f) {
    size_t n = (size_t)f->d.n_tokens;
    if (d->ref.n_tokens != (int64_t)n) return 0;
    if (memcmp(d->tokens, f->tokens, n * 4) || memcmp(d->logprobs, f->logprobs, n * 4) ||
        memcmp(d->loss_mask, f->mask, n) || memcmp(d->versions, f->versions, n * 4))
        return 0;
    if (d->n_moe_layers != f->d.n_moe_layers) return 0;
    if (f->d.n_moe_layers &&
        memcmp(d->routes, f->routes, (size_t)f->d.n_moe_layers * n * (size_t)f->d.route_k))
        return 0;
    return 1;
}

static void test_roundtrip(void) {
    char root[512];
    fx_ids ids;
    replay_writer *w1, *w2 = NULL;
    replay_store *st = open_writer("rt", root, sizeof root, 2, &ids, &w1);
    if (!st) return;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w2) == ARL_OK);
    CHECK_EQ_INT(replay_writer_shard_id(w1), 1);
    CHECK_EQ_INT(replay_writer_shard_id(w2), 2);
    int64_t a, b;
    CHECK_MSG(fx_write_traj(w1, &ids, "run1/g1/r0", 11, 0, 3, 300, 3, 7, 1.0, &a) == ARL_OK, "%s",
              arl_error_msg());
    CHECK_MSG(fx_write_traj(w2, &ids, "run1/g1/r1", 12, 1, 2, 257, 2, 7, 0.0, &b) == ARL_OK, "%s",
              arl_error_msg());
    CHECK_EQ_INT(a >> 40, 1);
    CHECK_EQ_INT(b >> 40, 2);
    CHECK_EQ_INT(a, (int64_t)1 << 40);
    replay_traj_row r;
    CHECK(replay_traj_get(st, "run1/g1/r0", &r) == ARL_OK);
    CHECK_EQ_INT(r.traj_id, a);
    CHECK_EQ_INT(r.status, REPLAY_COMPLETE);
    CHECK_EQ_INT(r.n_segments, 3);
    CHECK_EQ_INT(r.n_turns, 9);
    CHECK_EQ_INT(r.n_tokens, 900);
    CHECK_EQ_INT(r.min_version, 3);
    CHECK_EQ_INT(r.max_version, 4); /* odd segments end with a version bump */
    CHECK_CLOSE(r.outcome_reward, 1.0, 0, 0);
    CHECK_STR_EQ(r.end_cause, "terminated");
    char sel[32];
    snprintf(sel, sizeof sel, "%lld", (long long)b);
    CHECK(replay_traj_get(st, sel, &r) == ARL_OK);
    CHECK_STR_EQ(r.traj_uid, "run1/g1/r1");
    CHECK(replay_traj_get(st, "nope", &r) == ARL_ERR_NOT_FOUND);

    /* the learner's reading: every committed segment of trainable trajectories, in order */
    replay_seg_iter *it;
    CHECK(replay_seg_iter_open(st, NULL, &it) == ARL_OK);
    replay_seg_data d = {0};
    int done = 0, count = 0, ok = 1;
    replay_seg_ref ref;
    while (replay_seg_iter_next(it, &ref, &done) == ARL_OK && !done) {
        CHECK(replay_segment_load(st, ref.traj_id, ref.seg_index,
                                  REPLAY_LOAD_TOKENS | REPLAY_LOAD_ROUTES, &d) == ARL_OK);
        fx_seg f;
        int first = ref.traj_id == a;
        int64_t n = first ? 300 : 257;
        int steps = first ? 3 : 2;
        fx_seg_make(&f, first ? 11 : 12, ref.seg_index, n, steps, 7, 4, n * ref.seg_index,
                    n * ref.seg_index, 1 + steps * ref.seg_index, 3, ref.seg_index == 0);
        if (!seg_equal(&d, &f)) ok = 0;
        CHECK_EQ_INT(d.ref.tok_start, n * ref.seg_index);
        fx_seg_free(&f);
        count++;
    }
    replay_seg_iter_close(it);
    CHECK(ok);
    CHECK_EQ_INT(count, 5);
    /* filters: version range (segments whose min_version is 3: all), run, status */
    replay_seg_filter flt = {.run_id = ids.run_id, .version_lo = 4, .version_hi = -1};
    CHECK_EQ_INT(count_segs(st, &flt), 0);
    flt.status_mask = REPLAY_STATUS_BIT(REPLAY_RUNNING);
    flt.version_lo = -1;
    CHECK_EQ_INT(count_segs(st, &flt), 0);
    replay_seg_data_free(&d);

    /* the catalog mirror: both members final, so the group is final */
    sqlite3 *db;
    sqlite3_stmt *q = query_row(root, "catalog.sqlite", "SELECT status FROM task_groups", &db);
    CHECK_STR_EQ((const char *)sqlite3_column_text(q, 0), "final");
    query_done(db, q);

    /* the image of the create response is stored once, elided from the body, and restores */
    q = query_row(root, "shards/w1.sqlite",
                  "SELECT c.response_body, c.response_sha256, r.body_offset, i.png FROM "
                  "env_calls c JOIN image_refs r USING (traj_id, call_seq) JOIN images i "
                  "USING (image_id) WHERE c.call_seq = 0",
                  &db);
    rimage_ref ir = {(size_t)sqlite3_column_int64(q, 2), sqlite3_column_blob(q, 3),
                     (size_t)sqlite3_column_bytes(q, 3)};
    const uint8_t *body = sqlite3_column_blob(q, 0);
    size_t bn = (size_t)sqlite3_column_bytes(q, 0);
    CHECK(memmem(body, bn, "\"data\":\"sha256:", 15) != NULL);
    uint8_t *full;
    size_t fn;
    CHECK(rimages_restore(body, bn, &ir, 1, &full, &fn) == ARL_OK);
    uint8_t sha[32];
    arl_sha256(full, fn, sha);
    CHECK(!memcmp(sha, sqlite3_column_blob(q, 1), 32));
    free(full);
    query_done(db, q);
    replay_writer_close(w1);
    replay_writer_close(w2);
    replay_store_close(st);
    FX_CLEANUP(root);
}

static void test_protocol_checks(void) {
    char root[512];
    fx_ids ids;
    replay_writer *w;
    replay_store *st = open_writer("proto", root, sizeof root, 1, &ids, &w);
    if (!st) return;
    /* one writer per file, also within a process */
    replay_writer *w2 = NULL;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, replay_writer_shard_id(w), NULL, &w2) ==
          ARL_ERR_BUSY);
    CHECK(strstr(arl_error_msg(), "shards/w1.sqlite") != NULL);
    replay_traj_desc td;
    int64_t t = begin_traj(w, &ids, "x/1", &td);
    CHECK(replay_traj_begin(w, &td, &t) == ARL_ERR_STATE); /* uid reuse */
    fx_seg f;
    fx_seg_make(&f, 1, 1, 100, 2, 0, 4, 0, 0, 1, 0, 0); /* segment 1 before segment 0 */
    CHECK(replay_segment_append(w, t, &f.d) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "expected 0") != NULL);
    fx_seg_free(&f);
    fx_seg_make(&f, 1, 0, 100, 2, 0, 4, 0, 0, 1, 0, 0);
    CHECK(replay_segment_append(w, t, &f.d) == ARL_OK);
    fx_seg_free(&f);
    fx_seg_make(&f, 1, 1, 100, 2, 0, 4, 99, 99, 3, 0, 0); /* tok_start off by one */
    CHECK(replay_segment_append(w, t, &f.d) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "do not continue") != NULL);
    f.d.tok_start = 100;
    f.d.ctx_start = 100;
    f.d.end_cause = "bogus"; /* a CHECK constraint: rejected, nothing stored */
    CHECK(replay_segment_append(w, t, &f.d) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "CHECK") != NULL);
    f.d.end_cause = "end";
    fx_finish x;
    fx_finish_make(&x, 50, 1.0);
    x.r[2].value = NAN; /* no derived outcome: invariant 5 */
    CHECK(replay_traj_finish(w, t, &f.d, &x.f) == ARL_ERR_ARG);
    fx_finish_make(&x, 50, 1.0);
    CHECK(replay_traj_finish(w, t, &f.d, &x.f) == ARL_OK);
    fx_seg_free(&f);
    replay_traj_row r;
    CHECK(replay_traj_get_id(st, t, &r) == ARL_OK);
    CHECK_EQ_INT(r.n_segments, 2); /* the rejected attempts left nothing */
    CHECK_EQ_INT(r.n_tokens, 200);
    fx_seg_make(&f, 1, 2, 100, 2, 0, 4, 200, 200, 5, 0, 0);
    CHECK(replay_segment_append(w, t, &f.d) == ARL_ERR_STATE); /* finished: immutable */
    fx_seg_free(&f);
    /* operator mask of a complete trajectory keeps its end cause */
    CHECK(replay_traj_mask(w, t, "OPERATOR_MASKED", NULL, NULL, "{\"reason\":\"test\"}") == ARL_OK);
    CHECK(replay_traj_get_id(st, t, &r) == ARL_OK);
    CHECK_EQ_INT(r.status, REPLAY_MASKED);
    CHECK_STR_EQ(r.end_cause, "terminated");
    CHECK_STR_EQ(r.error_code, "OPERATOR_MASKED");
    replay_writer_close(w);
    replay_store_close(st);
    FX_CLEANUP(root);
}

/* A state of `kind` for (uid, seg) with a deterministic KDA or latent tensor (fx_state_put). */
static int64_t put_state(replay_writer *w, const char *uid, int seg, const char *kind,
                         const char *pass, int64_t ctx, int64_t n) {
    int64_t id = -1;
    arl_status st = fx_state_put(w, uid, seg, kind, pass, ctx, n, &id);
    CHECK_MSG(st == ARL_OK, "%s", arl_error_msg());
    return id;
}

static void test_states_and_fork(void) {
    char root[512];
    fx_ids ids;
    replay_writer *w;
    replay_store *st = open_writer("states", root, sizeof root, 1, &ids, &w);
    if (!st) return;
    replay_traj_desc td;
    int64_t t = begin_traj(w, &ids, "p/1", &td);
    int64_t tok = 0;
    for (int s = 0; s < 3; s++) {
        fx_seg f;
        fx_seg_make(&f, 5, s, 64, 2, 7, 4, tok, tok, 1 + 2 * s, 3, 0);
        /* S_s before C_s (section 7.3) */
        f.d.latent_state_id = put_state(w, "p/1", s, "mla_segment", "pass1", tok, 64);
        f.d.end_state_id = put_state(w, "p/1", s, "kda_boundary", "pass1", 0, tok + 64);
        CHECK_MSG(replay_segment_append(w, t, &f.d) == ARL_OK, "%s", arl_error_msg());
        tok += 64;
        fx_seg_free(&f);
    }
    int64_t orphan = put_state(w, "p/1", 9, "kda_boundary", "pass1", 0, 1); /* crash before C_s */
    replay_state_data *parts;
    size_t np;
    CHECK_MSG(replay_boundary_load(st, t, 1, &parts, &np) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(np, 3); /* KDA boundary of segment 1 + MLA entries of segments 0 and 1 */
    if (np == 3) {
        CHECK_STR_EQ(parts[0].kind, "kda_boundary");
        CHECK_EQ_INT(parts[0].n_chunks, 4);
        CHECK_STR_EQ(parts[0].chunks[1].tensor, "conv");
        CHECK_EQ_INT(((const float *)parts[0].chunks[0].data)[5], 1005);
        CHECK_EQ_INT(parts[2].seg_index, 1);
        CHECK_EQ_INT(parts[2].chunks[0].h.dims[0], 64);
        CHECK_EQ_INT(((const uint16_t *)parts[2].chunks[0].data)[7], 0x3F81);
    }
    replay_boundary_free(parts, np);

    /* fork at S = 2: prefix = parent segments 0..1, own segments from index 2 */
    replay_writer *tw;
    CHECK(replay_writer_open(st, REPLAY_FILE_TOOL, 0, "run1", &tw) == ARL_OK);
    replay_traj_desc fd = td;
    fd.traj_uid = "p/1#fork1";
    int64_t ft;
    replay_seg_ref next;
    CHECK_MSG(replay_fork_begin(tw, "p/1", 2, &fd, &ft, &next) == ARL_OK, "%s", arl_error_msg());
    CHECK_EQ_INT(next.seg_index, 2);
    CHECK_EQ_INT(next.tok_start, 128);
    CHECK_EQ_INT(next.first_step, 5);
    fx_seg f;
    fx_seg_make(&f, 6, 2, 32, 1, 7, 4, next.tok_start, next.ctx_start, next.first_step, 4, 0);
    CHECK(replay_segment_append(tw, ft, &f.d) == ARL_ERR_ARG); /* start_kind must be 'fork' */
    f.d.start_kind = "fork";
    CHECK_MSG(replay_segment_append(tw, ft, &f.d) == ARL_OK, "%s", arl_error_msg());
    fx_seg_free(&f);
    replay_seg_ref *refs;
    size_t n;
    CHECK(replay_traj_segments(st, ft, &refs, &n) == ARL_OK);
    CHECK_EQ_INT(n, 3);
    if (n == 3) {
        CHECK_EQ_INT(refs[0].traj_id, t);
        CHECK_EQ_INT(refs[1].traj_id, t);
        CHECK_EQ_INT(refs[2].traj_id, ft);
        CHECK_STR_EQ(refs[2].start_kind, "fork");
    }
    free(refs);
    /* the fork's boundary at its segment 1 is the parent's */
    CHECK(replay_boundary_load(st, ft, 1, &parts, &np) == ARL_OK);
    replay_boundary_free(parts, np);
    /* its own segment has no states: a cache miss, not an error */
    CHECK(replay_boundary_load(st, ft, 2, &parts, &np) == ARL_ERR_NOT_FOUND);
    replay_writer_close(tw);

    /* GC: the orphan goes, referenced states stay */
    int64_t deleted = -1;
    CHECK(replay_states_gc(w, -1000, &deleted) == ARL_OK);
    CHECK_EQ_INT(deleted, 1);
    replay_state_data sd = {0};
    CHECK(replay_state_load(st, 1, orphan, &sd) == ARL_ERR_NOT_FOUND);
    CHECK(replay_boundary_load(st, t, 2, &parts, &np) == ARL_OK);
    replay_boundary_free(parts, np);
    replay_state_data_free(&sd);

    /* section 9.2: a state seeds the engine only if its traj_uid, seg_index (and kind) are its
     * segment's; a segment that references another one's state is a cache miss */
    replay_traj_desc td2;
    int64_t t2 = begin_traj(w, &ids, "p/2", &td2);
    /* segment 0's boundary is another trajectory's, segment 1's is an MLA state (its own
     * latent), segment 2's latent state is segment 0's */
    int64_t lat0 = -1;
    tok = 0;
    for (int s = 0; s < 3; s++) {
        fx_seg f2;
        fx_seg_make(&f2, 5, s, 64, 2, 7, 4, tok, tok, 1 + 2 * s, 3, 0);
        f2.d.latent_state_id =
            s == 2 ? lat0 : put_state(w, "p/2", s, "mla_segment", "pass1", tok, 64);
        if (s == 0) lat0 = f2.d.latent_state_id;
        f2.d.end_state_id =
            s == 1 ? f2.d.latent_state_id
                   : put_state(w, s ? "p/2" : "p/9", s, "kda_boundary", "pass1", 0, tok + 64);
        CHECK_MSG(replay_segment_append(w, t2, &f2.d) == ARL_OK, "%s", arl_error_msg());
        tok += 64;
        fx_seg_free(&f2);
    }
    for (int s = 0; s < 3; s++) {
        arl_status r = replay_boundary_load(st, t2, s, &parts, &np);
        CHECK_MSG(r == ARL_ERR_NOT_FOUND, "segment %d: %d %s", s, (int)r, arl_error_msg());
        if (r == ARL_OK) replay_boundary_free(parts, np);
        arl_error_clear();
    }
    replay_writer_close(w);
    replay_store_close(st);
    FX_CLEANUP(root);
}

/* show (spec 13.2 item 2): per segment, the learner mask reason and staleness of the newest
 * update that consumed it; nothing for a segment no update consumed. */
static void test_show_learner(void) {
    char root[512];
    fx_ids ids;
    replay_writer *w, *lw = NULL;
    replay_store *st = open_writer("showlr", root, sizeof root, 1, &ids, &w);
    if (!st) return;
    int64_t t = -1;
    CHECK_MSG(fx_write_traj(w, &ids, "s/1", 1, 0, 3, 64, 2, 0, 1.0, &t) == ARL_OK, "%s",
              arl_error_msg());
    CHECK(replay_writer_open(st, REPLAY_FILE_LEARNER, 0, "run1", &lw) == ARL_OK);
    float z[64] = {0};
    uint8_t fl[64] = {0};
    replay_learner_record r = {.run_id = ids.run_id,
                               .traj_uid = "s/1",
                               .levels_json = "{\"AO\":1.0}",
                               .n_tokens = 64,
                               .old_logprobs = z,
                               .ref_logprobs = z,
                               .is_weights = z,
                               .token_flags = fl,
                               .advantages = z};
    /* segment 0: trained by update 3, then masked (stale) by update 4; segment 1: update 4 */
    const struct {
        int64_t update_n, staleness;
        int32_t seg;
        const char *reason;
    } rows[] = {{3, 0, 0, NULL}, {4, 1, 0, "stale"}, {4, 2, 1, NULL}};
    for (size_t i = 0; lw && i < sizeof rows / sizeof *rows; i++) {
        r.update_n = r.version = rows[i].update_n;
        r.staleness = rows[i].staleness;
        r.seg_index = rows[i].seg;
        r.mask_reason = rows[i].reason;
        CHECK_MSG(replay_learner_record_put(lw, &r) == ARL_OK, "%s", arl_error_msg());
    }
    char *text = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&text, &n);
    CHECK(f != NULL);
    if (f) {
        CHECK_MSG(replay_show(st, "s/1", NULL, f) == ARL_OK, "%s", arl_error_msg());
        fclose(f);
        const char *s0 = text ? strstr(text, "\n== segment 0 ") : NULL;
        const char *s1 = text ? strstr(text, "\n== segment 1 ") : NULL;
        const char *s2 = text ? strstr(text, "\n== segment 2 ") : NULL;
        CHECK(s0 && s1 && s2);
        const char *l0 =
            s0 ? strstr(s0, "\n   learner: update 4, staleness 1, masked (stale)\n") : NULL;
        const char *l1 = s1 ? strstr(s1, "\n   learner: update 4, staleness 2, trained\n") : NULL;
        CHECK_MSG(l0 && l0 < s1, "%s", text ? text : "");
        CHECK_MSG(l1 && l1 < s2, "%s", text ? text : "");
        CHECK_MSG(s2 && !strstr(s2, "learner:"), "%s", text ? text : ""); /* not consumed */
    }
    free(text);
    replay_writer_close(lw);
    replay_writer_close(w);
    replay_store_close(st);
    FX_CLEANUP(root);
}

/* A child process writes and dies without closing; the parent takes the file over. */
static void test_takeover_and_recover(void) {
    char root[512];
    fx_ids ids;
    if (!make_store("takeover", root, sizeof root, 3, &ids)) return;
    replay_store *st;
    pid_t pid = fork();
    if (pid == 0) {
        replay_store *cs;
        replay_writer *w = child_writer(root, &cs);
        replay_traj_desc td = fx_traj_desc(&ids, "k/0", 0);
        int64_t t0, t1;
        if (replay_traj_begin(w, &td, &t0)) _exit(4);
        fx_seg f;
        fx_seg_make(&f, 1, 0, 50, 1, 0, 4, 0, 0, 1, 0, 0);
        if (replay_segment_append(w, t0, &f.d)) _exit(5);
        td.traj_uid = "k/1";
        td.slot = 1;
        if (replay_traj_begin(w, &td, &t1)) _exit(6);
        _exit(0); /* dies holding two running trajectories */
    }
    int stat = 0;
    waitpid(pid, &stat, 0);
    CHECK_EQ_INT(WEXITSTATUS(stat), 0);
    CHECK(replay_store_open(root, NULL, &st) == ARL_OK);
    replay_writer *w;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, NULL, &w) == ARL_OK);
    const int64_t *ids_i;
    size_t n;
    replay_writer_interrupted(w, &ids_i, &n);
    CHECK_EQ_INT(n, 2);
    int64_t masked = 0, resumable = 0;
    CHECK(replay_writer_recover(w, 0, &masked, &resumable) == ARL_OK);
    CHECK_EQ_INT(masked, 1);    /* k/1: nothing committed (section 7.5 step 1) */
    CHECK_EQ_INT(resumable, 1); /* k/0 stays running for a resume */
    replay_traj_row r;
    CHECK(replay_traj_get(st, "k/1", &r) == ARL_OK);
    CHECK_EQ_INT(r.status, REPLAY_MASKED);
    CHECK_STR_EQ(r.error_code, "INTERRUPTED");
    CHECK_STR_EQ(r.end_cause, "interrupted");
    CHECK(replay_traj_get(st, "k/0", &r) == ARL_OK);
    CHECK_EQ_INT(r.status, REPLAY_RUNNING);
    CHECK(replay_traj_resume(w, r.traj_id, "s-new", NULL) == ARL_OK);
    CHECK(replay_traj_get(st, "k/0", &r) == ARL_OK);
    CHECK_EQ_INT(r.resume_count, 1);
    CHECK_STR_EQ(r.session_id, "s-new");
    /* the resumed trajectory continues at segment 1 */
    fx_seg f;
    fx_seg_make(&f, 1, 1, 50, 1, 0, 4, 50, 50, 2, 0, 0);
    CHECK(replay_segment_append(w, r.traj_id, &f.d) == ARL_OK);
    fx_seg_free(&f);
    replay_writer_close(w);
    /* the same process reopening its own file is not a takeover */
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, NULL, &w) == ARL_OK);
    replay_writer_interrupted(w, &ids_i, &n);
    CHECK_EQ_INT(n, 0);
    replay_writer_close(w);
    replay_store_close(st);
    FX_CLEANUP(root);
}

static void set_version(const char *path, int v, int minr) {
    sqlite3 *db;
    char sql[256];
    sqlite3_open(path, &db);
    snprintf(sql, sizeof sql,
             "PRAGMA user_version = %d; UPDATE meta SET value = '%d' WHERE key = "
             "'schema_version'; UPDATE meta SET value = '%d' WHERE key = 'min_reader_version';",
             v, v, minr);
    sqlite3_exec(db, sql, NULL, NULL, NULL);
    sqlite3_close(db);
}

static void test_schema_versions(void) {
    char root[512], cat[600], shard[600];
    fx_ids ids;
    replay_writer *w;
    replay_store *st = open_writer("schema", root, sizeof root, 1, &ids, &w);
    if (!st) return;
    replay_writer_close(w);
    replay_store_close(st);
    snprintf(cat, sizeof cat, "%s/catalog.sqlite", root);
    snprintf(shard, sizeof shard, "%s/shards/w1.sqlite", root);
    /* settings of section 3 */
    sqlite3 *db;
    sqlite3_stmt *q =
        query_row(root, "shards/w1.sqlite",
                  "SELECT (SELECT page_size FROM pragma_page_size), (SELECT journal_mode "
                  "FROM pragma_journal_mode), (SELECT application_id FROM pragma_application_id)",
                  &db);
    CHECK_EQ_INT(sqlite3_column_int(q, 0), 16384);
    CHECK_STR_EQ((const char *)sqlite3_column_text(q, 1), "wal");
    CHECK_EQ_INT(sqlite3_column_int(q, 2), REPLAY_APPLICATION_ID);
    query_done(db, q);
    q = query_row(root, "shards/w1.states.sqlite",
                  "SELECT (SELECT page_size FROM pragma_page_size), (SELECT auto_vacuum FROM "
                  "pragma_auto_vacuum)",
                  &db);
    CHECK_EQ_INT(sqlite3_column_int(q, 0), 65536);
    CHECK_EQ_INT(sqlite3_column_int(q, 1), 2); /* incremental */
    query_done(db, q);

    /* a newer file still declared readable by version 1: readers open it, writers refuse */
    set_version(shard, 2, 1);
    replay_open_opts ro = {.flags = REPLAY_OPEN_READONLY};
    CHECK(replay_store_open(root, &ro, &st) == ARL_OK);
    replay_traj_row r;
    CHECK(replay_traj_get(st, "none", &r) == ARL_ERR_NOT_FOUND); /* opened, searched */
    replay_store_close(st);
    CHECK(replay_store_open(root, NULL, &st) == ARL_OK);
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, NULL, &w) == ARL_ERR_VERSION);
    CHECK(strstr(arl_error_msg(), "schema version 2 is newer") != NULL);
    CHECK(strstr(arl_error_msg(), "shards/w1.sqlite") != NULL);
    replay_store_close(st);
    /* a newer file that readers of version 1 cannot read */
    set_version(shard, 3, 3);
    CHECK(replay_store_open(root, &ro, &st) == ARL_OK);
    CHECK(replay_traj_get(st, "none", &r) == ARL_ERR_VERSION);
    CHECK_MSG(strstr(arl_error_msg(), "schema version 3 (readable by version 3 and newer)") != NULL,
              "%s", arl_error_msg());
    replay_store_close(st);
    /* a file older than any version this build reads or migrates: not "use a newer agentrl" */
    set_version(shard, 0, 0);
    CHECK(replay_store_open(root, &ro, &st) == ARL_OK);
    CHECK(replay_traj_get(st, "none", &r) == ARL_ERR_VERSION);
    CHECK_MSG(strstr(arl_error_msg(), "schema version 0 is older than any this build can read or "
                                      "migrate") != NULL &&
                  strstr(arl_error_msg(), "newer agentrl") == NULL,
              "%s", arl_error_msg());
    replay_store_close(st);
    set_version(shard, 1, 1);

    /* a migration 1 -> 2 (test hook): backup, one transaction, versions updated */
    rschema_test_override(2, "CREATE TABLE extra_v2 (x INTEGER) STRICT;", 0);
    CHECK(replay_store_open(root, NULL, &st) == ARL_OK); /* migrates the catalog */
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 1, NULL, &w) == ARL_OK); /* and the shard */
    replay_writer_close(w);
    replay_store_close(st);
    rschema_test_override(0, NULL, 0);
    char bak[700];
    snprintf(bak, sizeof bak, "%s.pre-v2", shard);
    struct stat sb;
    CHECK(stat(bak, &sb) == 0);
    q = query_row(root, "shards/w1.sqlite",
                  "SELECT (SELECT user_version FROM pragma_user_version), (SELECT value FROM "
                  "meta WHERE key = 'schema_version'), (SELECT count(*) FROM sqlite_schema "
                  "WHERE name = 'extra_v2')",
                  &db);
    CHECK_EQ_INT(sqlite3_column_int(q, 0), 2);
    CHECK_STR_EQ((const char *)sqlite3_column_text(q, 1), "2");
    CHECK_EQ_INT(sqlite3_column_int(q, 2), 1);
    query_done(db, q);
    FX_CLEANUP(root);
}

static void test_damaged_files(void) {
    char root[512], path[600];
    fx_ids ids;
    replay_writer *w;
    replay_store *st = open_writer("damage", root, sizeof root, 1, &ids, &w);
    if (!st) return;
    int64_t t;
    CHECK(fx_write_traj(w, &ids, "d/0", 3, 0, 2, 100, 2, 7, 1.0, &t) == ARL_OK);
    replay_writer_close(w);
    replay_store_close(st);
    snprintf(path, sizeof path, "%s/shards/w1.sqlite", root);
    /* a blob with a bad header: reading names file, trajectory, segment and column */
    sqlite3 *db;
    sqlite3_open(path, &db);
    sqlite3_exec(db,
                 "UPDATE segments SET logprobs = CAST(X'00' || substr(logprobs, 2) AS BLOB) "
                 "WHERE seg_index = 1",
                 NULL, NULL, NULL);
    sqlite3_close(db);
    CHECK(replay_store_open(root, NULL, &st) == ARL_OK);
    replay_seg_data d = {0};
    CHECK(replay_segment_load(st, t, 0, REPLAY_LOAD_TOKENS, &d) == ARL_OK);
    CHECK(replay_segment_load(st, t, 1, REPLAY_LOAD_TOKENS, &d) == ARL_ERR_CORRUPT);
    const char *m = arl_error_msg();
    CHECK_MSG(strstr(m, "shards/w1.sqlite") && strstr(m, "d/0") && strstr(m, "segment 1") &&
                  strstr(m, "logprobs") && strstr(m, "magic"),
              "%s", m);
    replay_seg_data_free(&d);
    replay_store_close(st);
    /* a file that is not a database */
    snprintf(path, sizeof path, "%s/catalog.sqlite", root);
    FILE *f = fopen(path, "r+b");
    fwrite("garbage!garbage!garbage!", 1, 24, f);
    fclose(f);
    CHECK(replay_store_open(root, NULL, &st) == ARL_ERR_CORRUPT);
    CHECK_MSG(strstr(arl_error_msg(), "catalog.sqlite") && strstr(arl_error_msg(), "verify"), "%s",
              arl_error_msg());
    /* the shards are still readable on their own */
    snprintf(path, sizeof path, "%s/shards/w1.sqlite", root);
    CHECK(replay_store_open(path, NULL, &st) == ARL_OK);
    replay_traj_row r;
    CHECK(replay_traj_get(st, "d/0", &r) == ARL_OK);
    CHECK_EQ_INT(r.n_segments, 2);
    replay_store_close(st);
    /* not a store at all */
    CHECK(replay_store_open("/nonexistent/agentrl", NULL, &st) == ARL_ERR_NOT_FOUND);
    FX_CLEANUP(root);
}

/* A folder above stores (a train run's replay/ holds u<N>/r<K>): opening it is refused with the
 * stores below it named (sorted, up to four, with the count), and the one to give when there is
 * one; a folder with none says what a store is. */
static void test_not_a_store(void) {
    char root[512], top[512], p[700];
    fx_ids ids;
    if (!make_store("not-a-store", root, sizeof root, 1, &ids)) return;
    snprintf(top, sizeof top, "%s", root);
    *strrchr(top, '/') = 0; /* the test directory, holding store/ */
    replay_store *st = NULL;
    CHECK(replay_store_open(top, NULL, &st) == ARL_ERR_NOT_FOUND);
    snprintf(p, sizeof p, "is not a store; give the store in it: %s/store", top);
    CHECK_MSG(strstr(arl_error_msg(), p) != NULL, "%s", arl_error_msg());
    replay_open_opts o = {.flags = REPLAY_OPEN_CREATE};
    for (int i = 0; i < 5; i++) { /* replay/u00000<i>/r0, two levels further down */
        snprintf(p, sizeof p, "%s/replay/u00000%d/r0", top, i);
        CHECK_MSG(replay_store_open(p, &o, &st) == ARL_OK, "%s", arl_error_msg());
        replay_store_close(st);
    }
    CHECK(replay_store_open(top, NULL, &st) == ARL_ERR_NOT_FOUND);
    snprintf(p, sizeof p,
             "is not a store but holds 6: replay/u000000/r0, replay/u000001/r0, "
             "replay/u000002/r0, replay/u000003/r0, ... (give one of them, e.g. "
             "%s/replay/u000000/r0)",
             top);
    CHECK_MSG(strstr(arl_error_msg(), p) != NULL, "%s", arl_error_msg());
    snprintf(p, sizeof p, "%s/replay/u000000", top);
    CHECK(replay_store_open(p, NULL, &st) == ARL_ERR_NOT_FOUND);
    CHECK_MSG(strstr(arl_error_msg(), "give the store in it: ") &&
                  strstr(arl_error_msg(), "/replay/u000000/r0"),
              "%s", arl_error_msg());
    snprintf(p, sizeof p, "%s/replay/empty", top);
    CHECK(mkdir(p, 0755) == 0);
    CHECK(replay_store_open(p, NULL, &st) == ARL_ERR_NOT_FOUND);
    CHECK_MSG(strstr(arl_error_msg(), "neither catalog.sqlite nor shard files"), "%s",
              arl_error_msg());
    FX_CLEANUP(root);
}

/* Several writer processes at once, each on its own shard, all registering in one catalog. */
static void test_concurrent_writers(void) {
    char root[512];
    fx_ids ids;
    /* one group of 20: slot = 5 * writer + k */
    if (!make_store("conc", root, sizeof root, 20, &ids)) return;
    replay_store *st;
    pid_t pids[4];
    for (int c = 0; c < 4; c++) {
        pids[c] = fork();
        if (pids[c] == 0) {
            replay_store *cs;
            replay_writer *w = child_writer(root, &cs);
            for (int k = 0; k < 5; k++) {
                char uid[32];
                int64_t t;
                snprintf(uid, sizeof uid, "p%d/%d", c, k);
                if (fx_write_traj(w, &ids, uid, (uint64_t)(c * 10 + k), 5 * c + k, 2, 40, 2, 2, 1.0,
                                  &t))
                    _exit(4);
            }
            replay_writer_close(w);
            replay_store_close(cs);
            _exit(0);
        }
    }
    for (int c = 0; c < 4; c++) {
        int stat = 0;
        waitpid(pids[c], &stat, 0);
        CHECK_MSG(WIFEXITED(stat) && WEXITSTATUS(stat) == 0, "writer %d: status %d", c, stat);
    }
    CHECK(replay_store_open(root, NULL, &st) == ARL_OK);
    replay_seg_iter *it;
    replay_seg_ref ref;
    int done = 0, n = 0;
    int32_t shards_seen = 0, last_shard = -1;
    CHECK(replay_seg_iter_open(st, NULL, &it) == ARL_OK);
    while (replay_seg_iter_next(it, &ref, &done) == ARL_OK && !done) {
        n++;
        if (ref.shard_id != last_shard) shards_seen++;
        last_shard = ref.shard_id;
    }
    replay_seg_iter_close(it);
    CHECK_EQ_INT(n, 4 * 5 * 2);
    CHECK_EQ_INT(shards_seen, 4);
    int64_t errors = -1;
    FILE *devnull = fopen("/dev/null", "w");
    CHECK(replay_verify(st, NULL, devnull, &errors, NULL) == ARL_OK);
    fclose(devnull);
    CHECK_EQ_INT(errors, 0);
    /* the catalog mirror, damaged, is rebuilt from the shards */
    char p[600];
    snprintf(p, sizeof p, "%s/catalog.sqlite", root);
    sqlite3 *db;
    sqlite3_open(p, &db);
    sqlite3_exec(
        db, "UPDATE group_members SET status = 'running'; UPDATE task_groups SET status = 'open'",
        NULL, NULL, NULL);
    sqlite3_close(db);
    CHECK(replay_catalog_reconcile(st) == ARL_OK);
    sqlite3_stmt *q = query_row(root, "catalog.sqlite",
                                "SELECT (SELECT count(*) FROM group_members WHERE status = "
                                "'complete'), (SELECT status FROM task_groups)",
                                &db);
    CHECK_EQ_INT(sqlite3_column_int(q, 0), 20);
    CHECK_STR_EQ((const char *)sqlite3_column_text(q, 1), "final");
    query_done(db, q);
    replay_store_close(st);
    FX_CLEANUP(root);
}

/* The learner's iterator pages through more segments than one batch (256), in order. */
static void test_iterator_batches(void) {
    char root[512];
    fx_ids ids;
    replay_writer *w;
    replay_store *st = open_writer("iter", root, sizeof root, 1, &ids, &w);
    if (!st) return;
    replay_traj_desc td;
    int64_t t = begin_traj(w, &ids, "long", &td);
    const int N = 300;
    for (int s = 0; s < N; s++) {
        fx_seg f;
        fx_seg_make(&f, 9, s, 8, 1, 0, 4, 8 * s, 8 * s, 1 + s, (uint32_t)(s / 100), 0);
        CHECK(fx_seg_commit(w, t, &f, s == N - 1, N + 1, 1.0) == ARL_OK);
        fx_seg_free(&f);
    }
    replay_writer_close(w);
    replay_seg_iter *it;
    replay_seg_ref ref;
    int done = 0, n = 0, ordered = 1;
    CHECK(replay_seg_iter_open(st, NULL, &it) == ARL_OK);
    while (replay_seg_iter_next(it, &ref, &done) == ARL_OK && !done) {
        if (ref.seg_index != n) ordered = 0;
        n++;
    }
    replay_seg_iter_close(it);
    CHECK_EQ_INT(n, N);
    CHECK(ordered);
    /* version range over min_version: segments 100..199 have version 1 */
    replay_seg_filter f = {.version_lo = 1, .version_hi = 1};
    CHECK_EQ_INT(count_segs(st, &f), 100);
    replay_store_close(st);
    FX_CLEANUP(root);
}

/* replay_group_ensure gives a group's id back for the same run, task, kind and size, and refuses
 * any other (ARL_ERR_STATE, naming the stored task): a group's members are samples of one task,
 * so trajectories of another task must not join it (a second run with the same run uid and other
 * tasks did, silently); replay_group_get reads the group's task back. */
static void test_group_identity(void) {
    char root[512];
    fx_ids ids;
    replay_store *st = open_new("group_identity", root, sizeof root, 4, &ids);
    if (!st) return;
    replay_task_desc td = {.task_uid = "t2", .env_name = "calc", .seed = 8, .data_json = "{}"};
    int64_t other_task = 0;
    CHECK(replay_task_ensure(st, &td, &other_task) == ARL_OK && other_task != ids.task_id);
    const replay_group_desc gd = {.group_uid = "run1/g000001",
                                  .run_id = ids.run_id,
                                  .task_id = ids.task_id,
                                  .env_id = ids.env_id,
                                  .kind = "train",
                                  .size = 4,
                                  .parent_seg_index = -1};
    int64_t gid = -1;
    CHECK(replay_group_ensure(st, &gd, &gid) == ARL_OK && gid == ids.group_id);
    replay_group_desc bad[4] = {gd, gd, gd, gd};
    bad[0].task_id = other_task;
    bad[1].kind = "eval";
    bad[2].size = 5;
    bad[3].run_id = ids.run_id + 1;
    for (int i = 0; i < 4; i++) {
        gid = -1;
        const arl_status s = replay_group_ensure(st, &bad[i], &gid);
        CHECK_MSG(s == ARL_ERR_STATE && gid == 0 && strstr(arl_error_msg(), "task t1 (seed 7"),
                  "case %d: %d %s", i, (int)s, arl_error_msg());
        arl_error_clear();
    }
    replay_group_row r;
    CHECK(replay_group_get(st, "run1/g000001", &r) == ARL_OK);
    CHECK(r.task_id == ids.task_id && !strcmp(r.task_uid, "t1") && r.task_seed == 7 &&
          !strcmp(r.task_env, "calc") && strlen(r.task_data_sha256) == 64 && r.size == 4 &&
          !strcmp(r.kind, "train"));
    replay_store_close(st);
}

/* Two writers (shards) of one run beginning the same group member: the first claims it in the
 * catalog, the second gets ARL_ERR_BUSY with nothing written (two workers of one run uid over the
 * same tasks wrote every trajectory twice, once in each shard, the catalog mirroring the later);
 * a writer reopening its own shard claims its members again. */
static void test_member_claim(void) {
    char root[512];
    fx_ids ids;
    replay_writer *w1 = NULL, *w2 = NULL;
    replay_store *st = open_writer("member_claim", root, sizeof root, 2, &ids, &w1);
    if (!st || !w1) return;
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w2) == ARL_OK);
    const replay_traj_desc r0 = fx_traj_desc(&ids, "run1/g1/r0", 0),
                           r1 = fx_traj_desc(&ids, "run1/g1/r1", 1);
    int64_t a = -1, b = -1;
    CHECK(replay_traj_begin(w1, &r0, &a) == ARL_OK);
    const arl_status s = replay_traj_begin(w2, &r0, &b);
    CHECK_MSG(s == ARL_ERR_BUSY && b == -1 &&
                  strstr(arl_error_msg(), "trajectory run1/g1/r0 is shard 1's"),
              "%d %s", (int)s, arl_error_msg());
    arl_error_clear();
    CHECK(replay_traj_begin(w2, &r1, &b) == ARL_OK && b >> REPLAY_TRAJ_ID_SHIFT == 2);
    replay_writer_close(w2);
    sqlite3 *db;
    sqlite3_stmt *q = query_row(root, "shards/w2.sqlite",
                                "SELECT count(*), min(traj_uid) FROM trajectories", &db);
    CHECK_EQ_INT(sqlite3_column_int(q, 0), 1);
    CHECK_STR_EQ((const char *)sqlite3_column_text(q, 1), "run1/g1/r1");
    query_done(db, q);
    q = query_row(root, "catalog.sqlite",
                  "SELECT group_concat(traj_uid || '@' || shard_id, ' ') FROM (SELECT * FROM "
                  "group_members ORDER BY slot)",
                  &db);
    CHECK_STR_EQ((const char *)sqlite3_column_text(q, 0), "run1/g1/r0@1 run1/g1/r1@2");
    query_done(db, q);
    /* shard 2's writer again (a restart): its member is its own to claim */
    CHECK(replay_writer_open(st, REPLAY_FILE_WORKER, 2, "run1", &w2) == ARL_OK);
    CHECK(rcat_member_claim(st, ids.group_id, 1, 0, "run1/g1/r1", 2, b) == ARL_OK);
    CHECK(rcat_member_claim(st, ids.group_id, 0, 0, "run1/g1/r0", 2, b) == ARL_ERR_BUSY);
    arl_error_clear();
    replay_writer_close(w2);
    replay_writer_close(w1);
    replay_store_close(st);
}

int main(void) {
    TEST_RUN(test_roundtrip);
    TEST_RUN(test_group_identity);
    TEST_RUN(test_member_claim);
    TEST_RUN(test_concurrent_writers);
    TEST_RUN(test_iterator_batches);
    TEST_RUN(test_protocol_checks);
    TEST_RUN(test_states_and_fork);
    TEST_RUN(test_show_learner);
    TEST_RUN(test_takeover_and_recover);
    TEST_RUN(test_schema_versions);
    TEST_RUN(test_damaged_files);
    TEST_RUN(test_not_a_store);
    return test_finish();
}
