/* rollout/internal.h: what the files of rollout/ share - the open segment of a trajectory
 * (tokens, behaviour log-probabilities, versions, loss mask, routes, and the rows committed with
 * it), the trajectory record, the worker, and the helpers between them.  Not a public
 * interface: users include rollout/rollout.h.
 *
 * Symbols: T tokens of a segment, n_moe MoE layers, k experts per token, RK = n_moe * k.
 */
#ifndef ARL_ROLLOUT_INTERNAL_H
#define ARL_ROLLOUT_INTERNAL_H

#include <jansson.h>
#include <stdint.h>

#include "envs/env.h"
#include "policy/chat.h"
#include "policy/image.h"
#include "replay/replay.h"
#include "rollout/engine.h"
#include "rollout/rollout.h"

/* ---- owned strings of rows (freed together when the segment is committed) ---- */
enum { RO_WIN = ARL_ROLLOUT_ALERT_WINDOW }; /* spec/aep.md 8.6: finished trajectories */

typedef struct ro_strs {
    char **v;
    size_t n, cap;
} ro_strs;
/* Copy of s (len bytes, NUL added); NULL on OOM (or s NULL). */
char *ro_strs_dup(ro_strs *p, const char *s, size_t len);
char *ro_strs_cstr(ro_strs *p, const char *s); /* s NULL: NULL */
char *ro_strs_take(ro_strs *p, char *s);       /* adopt a malloc'ed string */
void ro_strs_free(ro_strs *p);

/* ---- the open segment ---- */
typedef struct ro_seg {
    int32_t seg_index;
    const char *start_kind; /* "fresh", "continue", "fork" (static) */
    int32_t first_step;     /* first step whose turn is in this segment */
    int32_t last_step;      /* last such step (first_step - 1: none yet) */
    int64_t tok_start, ctx_start;
    int64_t n, cap;       /* tokens */
    uint32_t *tokens;     /* (cap) */
    float *logprobs;      /* (cap) */
    uint8_t *mask;        /* (cap) */
    uint32_t *versions;   /* (cap) */
    uint8_t *routes;      /* (cap, RK) of route_bytes each; sentinel all-ones = absent */
    int route_bytes;
    int64_t rk;           /* n_moe * k */
    int64_t n_action;
    int64_t vmin, vmax;   /* over action tokens (-1: none) */
    /* rows committed with the segment */
    replay_turn *turns;
    size_t n_turns, cap_turns;
    replay_env_call *calls;
    size_t n_calls, cap_calls;
    replay_tool_call *tools;
    size_t n_tools, cap_tools;
    replay_reward *rewards;
    size_t n_rewards, cap_rewards;
    ro_strs strs;
} ro_seg;

void ro_seg_free(ro_seg *s);
/* Start an empty segment (buffers kept). */
void ro_seg_reset(ro_seg *s, int32_t seg_index, const char *start_kind, int32_t first_step,
                  int64_t tok_start, int64_t ctx_start);
/* Append n context (mask 0) or action tokens; routes start absent.  Returns the index of the
 * first appended token. */
arl_status ro_seg_append(ro_seg *s, const int32_t *ids, int64_t n, int action, int64_t *at);
/* Routes (n_moe, T, k) int32 of forward rows [row0, row0 + n) for segment tokens [at, at+n). */
void ro_seg_set_routes(ro_seg *s, int64_t at, int64_t n, const int32_t *routes, int64_t T,
                       int64_t row0, int64_t n_moe, int64_t k);
arl_status ro_seg_add_turn(ro_seg *s, const replay_turn *t, replay_turn **out);
arl_status ro_seg_add_call(ro_seg *s, const replay_env_call *c);
arl_status ro_seg_add_tool(ro_seg *s, const replay_tool_call *t);
arl_status ro_seg_add_reward(ro_seg *s, const replay_reward *r);
replay_turn *ro_seg_find_turn(ro_seg *s, int32_t step);

/* ---- boundary rules (spec/objective.md 3.2) ---- */
typedef struct ro_limits {
    int64_t L_seg, L_turn, L_obs, L_ctx, L_traj, K_max;
} ro_limits;

typedef struct ro_step_facts {
    int terminated, truncated;
    int64_t k;          /* the step just answered */
    int wall_expired;   /* the episode wall clock ran out (checked after rule 2) */
    int reset;          /* observation.context == reset */
    int template_break; /* rule 5 found the extension property broken */
    int64_t obs_tokens; /* append: rendered observation messages; reset: ignored */
    int64_t e_len;      /* tokens the stream grows by if the trajectory goes on: append /
                           token_budget: e; reset / template break: the fresh rendering +
                           generation prompt */
    int64_t n_seg, n_ctx, n_total;
} ro_step_facts;

typedef enum ro_outcome_kind {
    RO_APPEND = 0,   /* rule 7 */
    RO_BOUNDARY = 1, /* rules 4-6 */
    RO_END = 2,      /* rules 1, 2, 8, wall clock */
    RO_MASK = 3,     /* rule 3 */
} ro_outcome_kind;

typedef struct ro_step_outcome {
    ro_outcome_kind kind;
    const char *boundary_cause; /* "env_reset", "template_break", "token_budget" */
    int next_fresh;             /* the next segment starts fresh */
    const char *end_cause;      /* "terminated", "env_truncated", "turn_budget", "wall_clock",
                                   "context_budget" */
    const char *mask_code;      /* "OBSERVATION_TOO_LONG" */
} ro_step_outcome;

/* Apply rules 1-8 once for one step response (static strings in *out). */
void ro_step_rules(const ro_limits *L, const ro_step_facts *f, ro_step_outcome *out);

/* ---- turns and observations (rollout/turn.c) ---- */

/* The AEP action of a parsed turn (spec/aep.md 4.5): content with invalid UTF-8 replaced,
 * parsed calls, parse errors with raw text cut to 4096 bytes.  *a must be zeroed. */
arl_status ro_action_from_turn(const arl_chat_template *t, const arl_chat_turn *turn,
                               int64_t n_tokens, arl_env_action *a);

/* An observation's messages appended to conv (images become parts; their decoded pixels are
 * appended to imgs, in order).  Assistant messages (reset observations) keep their calls. */
typedef struct ro_images {
    arl_image *v;
    int32_t n, cap;
} ro_images;
void ro_images_clear(ro_images *im);
arl_status ro_conv_add_obs(arl_chat_conv *conv, const arl_chat_template *t,
                           const arl_env_observation *obs, ro_images *imgs);

/* ---- the trajectory ---- */
typedef enum ro_tstate {
    RO_T_CREATING = 0, /* create call in flight */
    RO_T_PREFILL,      /* tokens seg.tokens[pf_at, pf_end) to feed */
    RO_T_GENERATE,     /* sampling a turn */
    RO_T_STEPPING,     /* step call in flight */
    RO_T_SCORE_SEG,    /* segment score in flight */
    RO_T_SCORE_EP,     /* episode score in flight */
    RO_T_DELETING,     /* DELETE in flight after the final commit */
    RO_T_DONE,
} ro_tstate;

/* What to do once the segment score answers. */
typedef enum ro_after {
    RO_AFTER_BOUNDARY = 0, /* commit the segment, open the next one with e */
    RO_AFTER_END = 1,      /* score the episode, then commit the end */
} ro_after;

typedef struct ro_traj {
    struct ro_traj *next_all;
    char uid[REPLAY_UID_MAX + 1];
    char group_uid[REPLAY_UID_MAX + 1];
    int64_t task_index;
    int32_t gslot, attempt;
    int64_t traj_id;
    arl_env_session *sess;
    int32_t slot; /* decode-state slot, -1 none */
    ro_tstate state;
    arl_rng rng;
    char pass_uid[REPLAY_UID_MAX + 32];
    /* counters */
    int64_t step;    /* last applied step */
    int64_t n_total; /* tokens in the trajectory stream */
    /* of step and n_total, what a fork's stored row does not count: its parent's prefix (0 for
     * every other trajectory; a resumed one's row counts its earlier segments) */
    int64_t base_step, base_tokens;
    int64_t n_ctx;   /* tokens since the last fresh start */
    int64_t call_seq;
    int64_t ctx_vmin, ctx_vmax; /* versions of the tokens since the last fresh start */
    ro_seg seg;
    /* prefill */
    int64_t pf_at, pf_end; /* segment token range still to feed */
    float *media;          /* (n_media, d) image rows of the tokens to feed, owned */
    int64_t n_media, media_at;
    /* the turn being sampled */
    int64_t turn_at;  /* segment index of its first sampled token */
    int64_t turn_n;   /* tokens sampled */
    int32_t pending;  /* sampled token not yet fed */
    int turn_over;    /* the turn ended: feed `pending` and stop */
    int finish_length;
    int64_t turn_started_ms;
    int64_t turn_version;
    /* conversation since the last fresh start */
    arl_chat_conv conv;
    int conv_partial; /* rebuilt after a resume: only the last turn is known */
    /* the step in flight and its outcome */
    arl_env_action action;
    arl_chat_turn parsed;
    int have_parsed;
    int32_t *e_tok; /* tokens e waiting for the boundary decision, owned */
    float *e_media; /* (e_n_media, d) image rows of e, owned */
    int64_t e_n_media;
    int64_t e_n, e_cap;
    int e_fresh;    /* e is a fresh rendering */
    int64_t e_obs_start, e_obs_end; /* observation span inside e */
    ro_after after;
    ro_step_outcome out;
    /* finishing */
    replay_env_call *fin_calls; /* episode score / failing call rows (owned strings in seg.strs) */
    size_t n_fin_calls, cap_fin_calls;
    replay_reward fin_rewards[2 + ARL_AEP_MAX_COMPONENTS];
    size_t n_fin_rewards;
    double outcome;
    /* time */
    int64_t t0_ms;     /* start (for the wall clock) */
    int64_t paused_ms; /* time not charged to the wall clock */
    int resumed;       /* this run resumed it (recompute note in the next segment) */
    char *resume_note; /* detail JSON of the 'resumed' event to write with the next segment */
} ro_traj;

/* ---- the worker ---- */
typedef struct ro_task {
    char *id;
    uint64_t seed;
    json_t *data; /* owned */
} ro_task;

typedef struct ro_job {
    int64_t task;
    int32_t gslot, attempt;
} ro_job;

struct arl_rollout_worker {
    arl_rollout_config cfg;
    arl_rollout_hooks hooks;
    ro_limits L;
    char ckpt_dir[4096];
    ro_engine eng;
    arl_sample_params sp;
    int32_t stop_ids[4];
    size_t n_stop;
    int64_t gp_len; /* tokens of the generation prompt */
    int32_t gp[32];
    /* environment */
    arl_env_client *client;
    arl_env *env;
    const arl_env_info *info;
    json_t *env_options; /* owned or NULL */
    int segment_scores;
    /* store */
    replay_store *st;
    replay_writer *w;
    int64_t run_id, env_id;
    int64_t *group_ids; /* (n_tasks) 0 = not yet ensured */
    int64_t *task_ids;  /* (n_tasks) */
    /* tasks and jobs */
    ro_task *tasks;
    int64_t n_tasks;
    ro_job *jobs;
    size_t n_jobs, cap_jobs, next_job;
    int64_t left_to_others; /* jobs whose group member another shard claimed (start_job) */
    /* interrupted trajectories of this shard waiting for a slot to be resumed */
    int64_t *resume;
    size_t n_resume, cap_resume, next_resume;
    /* the next periodic GC of the states file is due at this ro_mono_s() (0: none yet) */
    double gc_next_s;
    /* a fork worker's trajectories and the group uid of each (arl_rollout_fork_many) */
    int64_t *fork_ids;                       /* (n_forks) */
    char (*fork_groups)[REPLAY_UID_MAX + 1]; /* (n_forks) */
    size_t n_forks;
    int fork_any_state; /* arl_rollout_fork_opts use_rollout_state */
    /* client-fault alerting (spec/aep.md 8.6): the window (the hooks' or win_own), and this
     * worker's own finished trajectories and masked ones among them */
    arl_rollout_alert_window *win, win_own;
    int32_t win_run_n, win_run_m;
    char fork_wsha[65]; /* SHA-256 of the engine's weights ("" until a fork needs it) */
    char env_tag[16];   /* "@" and the first 12 hex digits of the store's uid ("" without one):
                           what makes this store's AEP ids its own (ro_env_id) */
    char undeclared[32][ARL_AEP_MAX_NAME_BYTES + 1]; /* reward components warned about */
    size_t n_undeclared;
    /* the prefix state the last fork recomputed by prefill, exported for its siblings (the
     * other forks of its point, restored next) so that a point's prefix is prefilled once */
    struct {
        int64_t parent_id; /* the parent's traj_id */
        size_t n_prefix;   /* segments in the prefix */
        int32_t left;      /* siblings yet to import it; the buffer is freed at 0 */
        uint8_t *buf;      /* arl_decode_state_export of the slot */
        size_t len;
    } fork_prefix;
    /* trajectories */
    ro_traj *all;   /* every live trajectory (linked by next_all) */
    int32_t n_live;
    ro_traj **by_slot; /* (batch) */
    /* decode-pass buffers */
    ro_traj **gen;  /* (batch) */
    int32_t *gen_tok;
    float *row;     /* (V) logits row scratch */
    int *want;      /* (batch) */
    ro_traj **pf_docs; /* (batch) */
    /* states export scratch */
    uint8_t *route_scratch;
    size_t route_scratch_cap;
    /* weights */
    int swap_pending;
    int64_t swap_since_ms;
    int64_t last_poll_ms;
    /* stats and progress */
    arl_rollout_stats stats;
    int64_t t_start_ms, last_progress_ms;
    int stop; /* a hook asked to stop */
};

/* Wall clock in milliseconds (CLOCK_REALTIME for stored times). */
int64_t ro_now_ms(void);
/* Monotonic seconds. */
double ro_mono_s(void);
/* Process CPU seconds (all threads). */
double ro_cpu_s(void);

/* ---- commits (rollout/commit.c) ---- */
/* S_s for segment seg of t (slot state at the boundary): states rows; ids in end_id, lat_id. */
arl_status ro_states_put(arl_rollout_worker *w, ro_traj *t, int64_t *end_id, int64_t *lat_id);
/* Fill a segment desc from t->seg (routes transposed into the worker's scratch). */
arl_status ro_seg_desc(arl_rollout_worker *w, ro_traj *t, const char *end_cause, int64_t end_id,
                       int64_t lat_id, replay_segment_desc *d);
/* Record the finished call of t's session as an env_calls row into dst (the segment's rows or
 * the finish rows); *seq receives its call_seq. */
arl_status ro_record_call(ro_traj *t, const arl_env_call *c, int in_finish, int64_t step_index,
                          int64_t segment_index, int64_t *seq);
/* Reward rows of a reward-bearing response. */
arl_status ro_rewards_rows(ro_traj *t, const char *level, int64_t scope, double reward,
                           int scorable, const arl_env_component *c, int32_t n, int64_t call_seq,
                           int in_finish);

/* ---- resume (rollout/resume.c) ---- */
/* Resolve the shard's interrupted trajectories: mask (resume-interrupted off, or nothing
 * committed) or queue them in w->resume. */
arl_status ro_resume_interrupted(arl_rollout_worker *w);
/* Bring one queued trajectory back (it takes a free slot) or mask it. */
arl_status ro_resume_one(arl_rollout_worker *w, int64_t traj_id);

/* ---- worker internals shared with resume ---- */
arl_status ro_traj_new(arl_rollout_worker *w, int64_t task, int32_t gslot, int32_t attempt,
                       ro_traj **out);
void ro_traj_destroy(arl_rollout_worker *w, ro_traj *t);
arl_status ro_traj_mask(arl_rollout_worker *w, ro_traj *t, const char *code, const char *attr,
                        const char *end_cause, const char *detail, int with_segment);
/* Append ids as context tokens of the open segment and queue them for prefill; media (n_media,
 * d) are the image rows of their placeholders, taken over (freed by the trajectory). */
arl_status ro_prefill_set(arl_rollout_worker *w, ro_traj *t, const int32_t *ids, int64_t n,
                          float *media, int64_t n_media);
/* Image rows of imgs (NULL, 0 when none). */
arl_status ro_encode_images(arl_rollout_worker *w, const ro_images *imgs, float **media,
                            int64_t *n_media);
arl_status ro_task_ensure(arl_rollout_worker *w, int64_t task);
const char *ro_traj_uid_of(char *buf, size_t cap, const char *group_uid, int32_t gslot,
                           int32_t attempt);
/* "<run-uid>/g<task-offset + task>" for task index `task` of this worker's task source. */
void ro_group_uid_of(const arl_rollout_worker *w, int64_t task, char *buf, size_t cap);
/* Queue trajectory id (of the worker's file) to be continued (resumed or forked). */
arl_status ro_push_resume(arl_rollout_worker *w, int64_t id);
/* The group uid of fork trajectory traj_id of a fork worker ("" if it is none of its forks). */
const char *ro_fork_group_of(const arl_rollout_worker *w, int64_t traj_id);
/* The AEP identifier (trajectory_id, group_id; spec/aep.md 3) of the trajectory or group `uid`
 * of this worker's store: "<uid>@<12 hex digits of the store's uid><suffix>" (suffix "" or
 * "#resume<n>").  Globally unique as the spec asks: the store's uid is random, so two runs of
 * one run uid in two stores (two train runs, a rollout run again into a new store) never send
 * the same id to one server, while a resume in the same store finds its own sessions again.
 * Only the environment sees it: traj_uid, the stored names and the sampling streams stay
 * "<uid>".  out: at least ARL_AEP_MAX_ID_BYTES + 1 bytes.  ARL_ERR_ARG when longer than that. */
arl_status ro_env_id(const arl_rollout_worker *w, const char *uid, const char *suffix, char *out,
                     size_t cap);
/* 64-bit FNV-1a of a uid (the stream of a trajectory's sampling generator). */
uint64_t ro_uid_hash(const char *s);

#endif
