/* tests/replay/mkstore.c: build a small but complete store for the CLI tests:
 *   replay_mkstore DIR
 * Shard 1: run1/g1/r0 and r1 complete (3 segments, states on r0), run1/g1/r2 masked at step 4
 * (partial segment, failing call with evidence), run1/g2/r0 truncated.  Shard 2: written by a
 * child process that dies with run1/g3/r0 (1 segment) and run1/g3/r1 (none) running.  Shard 3
 * (tool): a fork of run1/g1/r0 after its segment 1.  Catalog: policy versions 0..9.
 *   replay_mkstore --hold DIR SHARD
 * opens the writer of worker shard SHARD of the store DIR (0: a new one), prints "holding
 * shards/w<id>.sqlite" and holds it (its lock: a live writer) until its standard input ends. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/replay/fixture.h"

#define DIE(s)                                                                                     \
    do {                                                                                           \
        if ((s) != ARL_OK) {                                                                       \
            fprintf(stderr, "mkstore: line %d: %s\n", __LINE__, arl_error_msg());                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int64_t put_kda(replay_writer *w, const char *uid, int seg, int64_t ntok) {
    float s[2 * 8 * 8], conv[3 * 16 * 3];
    for (int i = 0; i < 128; i++)
        s[i] = (float)i;
    for (int i = 0; i < 144; i++)
        conv[i] = (float)i;
    replay_state_chunk c[2] = {{.layer = 0,
                                .tensor = "S",
                                .kind = ARL_BLOB_KDA_STATE,
                                .dtype = ARL_BLOB_F32,
                                .ndim = 3,
                                .dims = {2, 8, 8},
                                .data = s},
                               {.layer = 0,
                                .tensor = "conv",
                                .kind = ARL_BLOB_CONV_TAIL,
                                .dtype = ARL_BLOB_F32,
                                .ndim = 3,
                                .dims = {3, 16, 3},
                                .data = conv}};
    replay_state_desc d = {.traj_uid = uid,
                           .seg_index = seg,
                           .kind = "kda_boundary",
                           .pass_uid = "p1",
                           .version_min = 3,
                           .version_max = 3,
                           .numerics = "cpu-f32",
                           .model_config_sha256 = "ab",
                           .ctx_start = 0,
                           .n_tokens = ntok};
    int64_t id;
    DIE(replay_state_put(w, &d, c, 2, &id));
    return id;
}

static int hold(const char *root, int32_t shard) {
    replay_open_opts oo = {.flags = 0};
    replay_store *st;
    replay_writer *w;
    DIE(replay_store_open(root, &oo, &st));
    DIE(replay_writer_open(st, REPLAY_FILE_WORKER, shard, "run1", &w));
    printf("holding %s\n", replay_writer_file(w));
    fflush(stdout);
    while (getchar() != EOF) {
    }
    replay_writer_close(w);
    replay_store_close(st);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--hold")) return hold(argv[2], (int32_t)atoi(argv[3]));
    if (argc != 2) {
        fprintf(stderr, "usage: replay_mkstore DIR | --hold DIR SHARD\n");
        return 2;
    }
    const char *root = argv[1];
    replay_open_opts oo = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st;
    DIE(replay_store_open(root, &oo, &st));
    fx_ids g1, g2, g3;
    DIE(fx_catalog(st, 1, 3, &g1));
    DIE(fx_catalog(st, 2, 1, &g2));
    DIE(fx_catalog(st, 3, 2, &g3));
    for (int v = 0; v < 10; v++) {
        replay_version_desc vd = {
            .run_id = g1.run_id, .version = v, .update_n = v ? v - 1 : -1, .kl_coef = NAN};
        DIE(replay_version_add(st, &vd));
    }
    replay_writer *w;
    DIE(replay_writer_open(st, REPLAY_FILE_WORKER, 0, "run1", &w));
    /* run1/g1/r0 with boundary states */
    replay_traj_desc td = {.traj_uid = "run1/g1/r0",
                           .run_id = g1.run_id,
                           .group_id = g1.group_id,
                           .task_id = g1.task_id,
                           .env_id = g1.env_id,
                           .slot = 0,
                           .policy_version = 3,
                           .fork_seg_index = -1};
    int64_t t;
    DIE(replay_traj_begin(w, &td, &t));
    int64_t tok = 0;
    for (int s = 0; s < 3; s++) {
        fx_seg f;
        fx_seg_make(&f, 100, s, 120, 3, 7, 4, tok, tok, 1 + 3 * s, 3, s == 0);
        if (s < 2) f.d.end_state_id = put_kda(w, "run1/g1/r0", s, tok + 120);
        if (s == 2) {
            f.d.end_cause = "end";
            fx_finish x;
            fx_finish_make(&x, 10, 1.0);
            DIE(replay_traj_finish(w, t, &f.d, &x.f));
        } else {
            DIE(replay_segment_append(w, t, &f.d));
        }
        tok += 120;
        fx_seg_free(&f);
    }
    put_kda(w, "run1/g1/r0", 7, 1); /* an orphan state: a warning, not an error */
    DIE(fx_write_traj(w, &g1, "run1/g1/r1", 101, 1, 3, 100, 2, 7, 0.0, &t));
    /* run1/g1/r2: masked at step 4 with a partial segment and the failing call */
    td.traj_uid = "run1/g1/r2";
    td.slot = 2;
    DIE(replay_traj_begin(w, &td, &t));
    fx_seg f;
    fx_seg_make(&f, 102, 0, 90, 3, 7, 4, 0, 0, 1, 3, 1);
    DIE(replay_segment_append(w, t, &f.d));
    fx_seg_free(&f);
    fx_seg_make(&f, 102, 1, 40, 1, 7, 4, 90, 90, 4, 3, 0);
    f.d.end_cause = "partial";
    f.turns[0].reward = NAN;
    f.turns[0].context = NULL;
    const char *bad = "<html>502 Bad Gateway</html>";
    /* the failing step's call: request sent, a 502 with a non-JSON body as evidence */
    replay_env_call fail = f.calls[0];
    fail.http_status = 502;
    fail.error_code = "SANDBOX_LOST";
    fail.response = (const uint8_t *)bad;
    fail.response_nbytes = strlen(bad);
    fail.response_complete = 0;
    f.d.n_env_calls = 0; /* committed with the final status below */
    f.d.n_rewards = 0;
    replay_finish mf = {.status = REPLAY_MASKED,
                        .end_cause = "error",
                        .error_code = "SANDBOX_LOST",
                        .error_attribution = "infra",
                        .error_detail_json = "{\"violation\":\"backend lost\"}",
                        .outcome_reward = NAN,
                        .env_calls = &fail,
                        .n_env_calls = 1};
    DIE(replay_traj_finish(w, t, &f.d, &mf));
    fx_seg_free(&f);
    /* run1/g2/r0: truncated */
    DIE(fx_write_traj(w, &g2, "run1/g2/r0", 103, 0, 1, 200, 4, 7, 0.25, &t));
    replay_writer_close(w);
    replay_store_close(st);

    /* shard 2: a child dies while writing */
    pid_t pid = fork();
    if (pid == 0) {
        replay_store *cs;
        replay_writer *cw;
        DIE(replay_store_open(root, NULL, &cs));
        DIE(replay_writer_open(cs, REPLAY_FILE_WORKER, 0, "run1", &cw));
        replay_traj_desc cd = {.traj_uid = "run1/g3/r0",
                               .run_id = g3.run_id,
                               .group_id = g3.group_id,
                               .task_id = g3.task_id,
                               .env_id = g3.env_id,
                               .slot = 0,
                               .fork_seg_index = -1};
        int64_t ct;
        DIE(replay_traj_begin(cw, &cd, &ct));
        fx_seg cf;
        fx_seg_make(&cf, 104, 0, 64, 2, 7, 4, 0, 0, 1, 3, 0);
        DIE(replay_segment_append(cw, ct, &cf.d));
        cd.traj_uid = "run1/g3/r1";
        cd.slot = 1;
        DIE(replay_traj_begin(cw, &cd, &ct));
        _exit(0);
    }
    int stat;
    waitpid(pid, &stat, 0);
    if (!WIFEXITED(stat) || WEXITSTATUS(stat)) return 1;

    /* shard 3 (tool): a fork of run1/g1/r0 after segment 1 */
    DIE(replay_store_open(root, NULL, &st));
    replay_group_desc fg = {.group_uid = "run1/g1/r0#forks1",
                            .run_id = g1.run_id,
                            .task_id = g1.task_id,
                            .env_id = g1.env_id,
                            .kind = "fork",
                            .size = 1,
                            .admitted_version = 4,
                            .parent_traj_uid = "run1/g1/r0",
                            .parent_seg_index = 1};
    int64_t fgid;
    DIE(replay_group_ensure(st, &fg, &fgid));
    DIE(replay_writer_open(st, REPLAY_FILE_TOOL, 0, "run1", &w));
    replay_traj_desc fd = {.traj_uid = "run1/g1/r0#fork1",
                           .run_id = g1.run_id,
                           .group_id = fgid,
                           .task_id = g1.task_id,
                           .env_id = g1.env_id,
                           .policy_version = 4};
    replay_seg_ref next;
    DIE(replay_fork_begin(w, "run1/g1/r0", 2, &fd, &t, &next));
    fx_seg_make(&f, 105, next.seg_index, 50, 2, 7, 4, next.tok_start, next.ctx_start,
                next.first_step, 4, 0);
    f.d.start_kind = "fork";
    f.d.end_cause = "end";
    fx_finish x;
    fx_finish_make(&x, 20, 0.5);
    DIE(replay_traj_finish(w, t, &f.d, &x.f));
    fx_seg_free(&f);
    replay_writer_close(w);
    replay_store_close(st);
    printf("%s\n", root);
    return 0;
}
