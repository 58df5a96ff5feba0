/* learner/update_internal.h: what learner/update.c, learner/batch.c and learner/passes.c
 * share - the learner struct and the functions between them.  Not a public interface: include
 * learner/update.h. */
#ifndef ARL_LEARNER_UPDATE_INTERNAL_H
#define ARL_LEARNER_UPDATE_INTERNAL_H

#include "learner/ledger.h"
#include "learner/update.h"
#include "policy/model_device_backward.h"
#include "rollout/media.h"

/* A run of tokens of one segment fed in one forward: positions [a, b) of the segment. */
typedef struct lr_piece {
    int32_t seg;
    int64_t a, b;
    int first, last; /* first / last piece of its segment */
    int replay;      /* forced routes */
} lr_piece;

/* Per-update counters of the passes (section 12 state/, moe/). */
typedef struct lr_counters {
    int64_t starts, hits, recompute_tokens, piece_splits;
    int64_t dev_splits;    /* forwards made again with fewer documents (shared slot rows) */
    int64_t dev_evictions; /* device slots evicted to make room (their states on the host) */
    double drift_sum;
    int64_t drift_n;
    /* router agreement (pi_old pass): sums over tokens with routes */
    double *agree_layer;  /* (n_moe) sum of |N n R| / k */
    double *exact_layer;  /* (n_moe) count of N = R */
    double agree_tokens;  /* tokens with routes */
    double exact_tokens;  /* tokens with N = R in every layer */
    double *load_rollout; /* (n_moe, E) */
    double *load_trainer; /* (n_moe, E) */
    double *load_tokens;  /* (n_moe) tokens counted per layer */
} lr_counters;

struct arl_learner {
    arl_learner_init in;
    arl_learner_config lc;
    const arl_model_config *cfg;
    arl_model_dims dm;
    int64_t n_moe, k, E, V;
    arl_model m;    /* policy forward (pi_old pass, recomputation, drift) */
    arl_model mref; /* reference forward */
    int have_m, have_mref, have_tr;
    arl_model_train tr;
    arl_model_params grads; /* gradient arena (view of the parameter layout), owned */
    arl_decode_state st;    /* slots of the passes */
    arl_router_scores rs;
    int64_t rs_cap;
    int qb_on;
    arl_state_cache cache;
    arl_update_batch b;
    /* forward scratch (Tm = max_tokens, N = max_docs) */
    int64_t Tm;
    int32_t N;
    int32_t *tok, *tgt, *cu, *slots, *forced, *routes_out; /* (Tm) (Tm) (N+1) (N) (n_moe,Tm,k) x2 */
    float *lp, *ent, *rscores;                             /* (Tm) (Tm) (n_moe, Tm, E) */
    float *agree_ws;                                       /* (E) router-agreement scratch */
    float *dlogp;                                          /* (Tm) */
    double *dtmp, *gtmp;                                   /* (Tm) */
    int32_t *seg_slot;  /* (n_segs of the batch) slot of a segment during the grad pass */
    int32_t *traj_slot; /* (n_trajs) slot of a trajectory during a score pass */
    lr_piece *pieces;
    int64_t n_pieces, cap_pieces;
    lr_counters cnt;
    arl_learner_hook_fn hook;
    void *hook_ctx;
    arl_learner_grad_hook_fn grad_hook;
    void *grad_hook_ctx;
    arl_loss_params lpar; /* the loss parameters of the running update */
    int have_lpar;
    int64_t update_n;
    /* images (learner/media.c); allocated with a vision tower only */
    float *media;        /* (Tm, d) image rows of one forward */
    float *dmedia;       /* (Tm, d) their gradient */
    int32_t *media_traj; /* (Tm) trajectory of each row of a forward */
    int64_t *media_row;  /* (Tm) its row in the trajectory's rows, -1: the placeholder's own
                            embedding row */
    int64_t media_max;   /* image rows one forward may hold (Tm) */
    float *vws;          /* (vws_n) vision work buffer, forward and backward */
    int64_t vws_n;
    /* the shared prompt prefixes of the update's groups (learner/update.h "Shared prompt
     * prefix") */
    struct lr_px *px;     /* (px_n) one per group of the batch, owned */
    int32_t px_n, px_cap;
    arl_decode_state pst; /* the prefixes' forwards (N slots), allocated on first use */
    int have_pst;
    /* the model on a device (learner/device.c; ops NULL: the CPU reference m, mref, tr) */
    const arl_dev_ops *ops;
    arl_model_dev md;          /* policy and reference passes: the pass's weights uploaded */
    arl_model_dev_train mdt;   /* gradient passes over md */
    int have_md, have_mdt;
    struct arl_cuda_ctx *ctx;      /* the learner's own context (device cuda), owned */
    struct arl_cuda_nccl *nccl;    /* the learners' NCCL communicator, or NULL (MPI), owned */
    struct arl_cuda_ctx *ctx_prev; /* the thread's context before lr_dev_enter */
    int32_t ctx_depth;             /* lr_dev_enter calls not yet exited */
    const arl_model_params *dev_w; /* the host weights md holds (NULL: unknown) */
    int64_t dev_w_step;            /* at this optimizer step */
    uint8_t *dev_cur;  /* (N) what device slot i mirrors: host slot i of st, of pst, or
                          nothing (learner/device.c) */
    uint8_t *dev_ahead; /* (N) 1: device slot i is ahead of the host slot it mirrors (the host's
                           comes up to date at lr_slot_sync) */
    float *gstage;      /* (weight floats) the device's gradients on their way to grads (made
                           by the first pass that adds them to the host arena) */
    void *dstage;      /* (weight floats) DEVICE: the host's gradient on its way to the device's */
    size_t dstage_token;
    int dev_opt;       /* this update runs AdamW on the device (lr_optim_begin) */
    int host_grads;    /* the host arena received a gradient in this pass (learner/media.c) */
    int rows_short;    /* the last forward was refused before it ran: its documents need more
                          shared slot rows than the device has (learner/device.c dev_room) */
    char numerics[16]; /* the tag of the learner's cached states (ARL_LEARNER_NUMERICS on cpu
                          and cpu-device, which are bit-identical; cuda-f32) */
    /* the states the pi_old pass writes into the store (learner/states.c) */
    const arl_update_source *states_src; /* (states_nsrc) the running update's sources */
    int32_t states_nsrc;
    int64_t states_saved;     /* segment-end states written in this update */
    char states_pass[96];     /* their pass_uid */
    char states_cfg_hash[65]; /* the model configuration's hash, hex */
};

/* The image inputs of one trajectory and its rows under the weights of the last encoding. */
typedef struct lr_media {
    ro_media_input in; /* every observation's patches and grids */
    ro_media cur;      /* row bookkeeping (rows NULL) */
    float *rows;       /* (n_rows, d) */
    float *drows;      /* (n_rows, d) gradient of the rows during a gradient pass */
    int64_t n_rows;
    const arl_model_params *key_w; /* the weights rows were encoded under (NULL: none) */
    int64_t key_step;              /* and the optimizer step they were at */
    int dirty;                     /* drows holds a gradient */
} lr_media;

/* The shared prefix of one group: positions [0, len) of its members' first segments. */
typedef struct lr_px {
    int32_t seg;   /* the member segment whose tokens and routes are fed (-1: none) */
    int64_t len;   /* P */
    int32_t users; /* members starting from it */
    uint8_t *buf;  /* (cap) export of the prefix's decode state, owned */
    size_t cap, bytes;
    int kind;     /* what buf holds: LR_PX_NONE, LR_PASS_OLD, LR_PASS_REF or LR_PX_STEP */
    int64_t step; /* LR_PX_STEP: the optimizer step of the weights */
    int need;     /* scratch of lr_grad_pass */
} lr_px;

/* ---- device.c: the model facade (see there) ----
 * lr_dev_open after the CPU models exist (nothing on device cpu); lr_dev_close frees what it
 * made (also after a failed open).  lr_dev_enter / lr_dev_exit bracket every public entry that
 * runs the model (the learner's CUDA context current, the caller's restored).  The slot calls
 * are arl_decode_state_join / _leave / _reset / _import / _position on host state hs (l->st or
 * l->pst) that also keep the device mirror's bookkeeping: on a device the host state of a slot
 * is behind after a forward until lr_slot_sync (before an export) brings it up to date.
 * lr_forward_state: arl_model_forward_state with model m (l->m or l->mref: its weights on a
 * device); lr_train_forward / lr_backward: the training forward from l->st's slots and its backward
 * into l->grads (on a device: into the device gradients, added to l->grads by lr_grads_end;
 * lr_grads_begin zeroes them; image-row gradients into dmedia either way).  lr_dev_weights_stale:
 * the caller may have changed the weights in place (upload before the next forward). With shared
 * slot rows (learner.device-slot-rows) a forward first makes room for its documents, evicting other
 * device slots (their states synced to the host) when it must; when its own documents need more
 * rows than there are it fails before anything runs, nothing lost, with ARL_ERR_RANGE and
 * l->rows_short set, and the passes make the call again with fewer documents (learner/passes.c
 * call_split). */
arl_status lr_dev_open(arl_learner *l);
void lr_dev_close(arl_learner *l);
void lr_dev_enter(arl_learner *l);
void lr_dev_exit(arl_learner *l);
void lr_dev_weights_stale(arl_learner *l);
arl_status lr_slot_join(arl_learner *l, arl_decode_state *hs, int32_t *slot);
void lr_slot_reset(arl_learner *l, arl_decode_state *hs, int32_t slot);
arl_status lr_slot_import(arl_learner *l, arl_decode_state *hs, int32_t slot, const void *buf,
                          size_t len);
void lr_slot_leave(arl_learner *l, arl_decode_state *hs, int32_t slot);
int64_t lr_slot_pos(const arl_learner *l, const arl_decode_state *hs, int32_t slot);
arl_status lr_slot_sync(arl_learner *l, arl_decode_state *hs, int32_t slot);
arl_status lr_forward_state(arl_learner *l, arl_model *m, arl_decode_state *hs,
                            const int32_t *slots, const arl_batch *b, const arl_forward_out *fo);
arl_status lr_train_forward(arl_learner *l, const int32_t *slots, const arl_batch *b,
                            const arl_forward_out *fo);
arl_status lr_backward(arl_learner *l, const arl_batch *b, const float *dlogp, float *dmedia);
/* grads = their sum over the learner ranks: over NCCL on the GPUs (l->nccl), else
 * arl_dist_allreduce_f32. */
arl_status lr_grads_allreduce(arl_learner *l);
/* The optimizer step of a minibatch after its gradient pass: the all-reduce and AdamW.  On a
 * device, between lr_optim_begin and lr_optim_end of an update, AdamW runs there unless a grad
 * hook reads the host's gradient: with one learner rank or NCCL the host's part of the gradient
 * (images) is added on the device; with several ranks summing over MPI the whole gradient is in
 * the host arena (lr_grads_end), summed there and uploaded; the moments stay on the device for
 * the update (uploaded by lr_optim_begin, downloaded by lr_optim_end), the new weights are
 * downloaded to the host parameters after each step.  Else arl_adamw_step on the host over
 * l->grads. */
arl_status lr_optim_begin(arl_learner *l);
arl_status lr_optim_step(arl_learner *l, arl_optim_report *rep);
arl_status lr_optim_end(arl_learner *l);
arl_status lr_grads_begin(arl_learner *l);
arl_status lr_grads_end(arl_learner *l);

/* ---- batch.c ---- */
arl_status lr_batch_load(arl_learner *l, const arl_update_source *src, int32_t n_src,
                         arl_shard_stats *sstats);

/* ---- media.c ---- */
void lr_media_free(lr_media *m); /* NULL-safe; frees m itself */
/* After the segments of local valid trajectory t are loaded: when its context holds
 * placeholders, its images and each placeholder's row; images that cannot explain them make
 * the trajectory media_bad (logged, not an error).  ARL_ERR_NOMEM only. */
arl_status lr_media_load(arl_learner *l, replay_store *st, arl_upd_traj *t);
/* After the batch is loaded: the vision work buffer for its largest observation. */
arl_status lr_media_prepare(arl_learner *l);
/* The image rows of the placeholders of pieces [p0, p1) (one forward) under weights w at
 * optimizer step `step` (-1: weights that never change) into l->media, *n_media of them (0:
 * none, pass media NULL). */
arl_status lr_media_call(arl_learner *l, int64_t p0, int64_t p1, const arl_model_params *w,
                         int64_t step, int64_t *n_media);
/* The same for positions [a, b) of segment sg alone. */
arl_status lr_media_span(arl_learner *l, int32_t sg, int64_t a, int64_t b,
                         const arl_model_params *w, int64_t step, int64_t *n_media);
/* After a backward of the last lr_media_call with d_media = l->dmedia (n_media rows): the rows'
 * gradients kept per trajectory; a sampled placeholder's goes to its embedding row. */
void lr_media_grad(arl_learner *l, int64_t n_media);
/* The vision tower's backward of the kept row gradients under the policy weights (l->grads +=);
 * clears them. */
arl_status lr_media_backward(arl_learner *l);
/* Forget every encoding (the weights changed outside the optimizer). */
void lr_media_invalidate(arl_learner *l);

/* ---- states.c ---- */
/* Before the pi_old pass of the running update: which local valid trajectories keep their
 * states (lc.keep_states, catalog pins, a writer in their source), the pass_uid from the
 * weights, counters reset.  src stays borrowed until the update returns.  The pin lookup's
 * errors. */
arl_status lr_states_plan(arl_learner *l, const arl_update_source *src, int32_t n_src);
/* In the pi_old pass, slot (of l->st) at the end of segment s, computed with replayed routes
 * (replay 1) or natural ones: its kda_boundary and mla_segment into the learner file when its
 * trajectory keeps states; see the file comment for what is skipped.  The store's errors. */
arl_status lr_states_put(arl_learner *l, const arl_upd_seg *s, int32_t slot, int replay);

/* ---- passes.c ---- */
enum { LR_PASS_OLD = 0, LR_PASS_REF = 1, LR_PX_STEP = 2, LR_PX_NONE = -1 };
/* After the batch is loaded: the update's shared prefix (segments' shared_start, px_*); none
 * when the option is off.  No error but ARL_ERR_NOMEM. */
arl_status lr_prefix_find(arl_learner *l);
/* The pi_old or reference pass over the local valid trajectories. */
arl_status lr_score_pass(arl_learner *l, int which);
/* Forward + backward of the local segments of minibatch mb (gradients added to l->grads),
 * loss statistics into acc.  drift: also measure state/prefix_drift on sampled segments. */
arl_status lr_grad_pass(arl_learner *l, const arl_loss_params *lp, int32_t mb, int drift,
                        arl_loss_acc *acc);
/* The forward of lr_grad_pass alone: *loss = the minibatch's loss; no gradient, no router
 * scores, no drift. */
arl_status lr_loss_pass(arl_learner *l, const arl_loss_params *lp, int32_t mb, double *loss);
/* Put the start state of continue segment seg into slot (reset first): the valid cached state,
 * else the recomputed prefix. */
arl_status lr_start_state(arl_learner *l, int32_t seg, int32_t slot);

/* The segments of minibatch mb in their order (update.c). */
arl_status lr_minibatch_order(arl_learner *l, int32_t mb, const int32_t **order, int32_t *n);

/* Allreduce helpers over the learners (no-ops with one process). */
arl_status lr_allreduce_f64(arl_learner *l, double *v, int64_t n, arl_dist_op op);

#endif
