/* learner/device.c: the learner's model facade - every forward, training forward, backward and
 * decode-slot change of the passes (learner/passes.c) goes through here, to the CPU reference
 * (policy/model.h, policy/model_backward.h) or to a device model (policy/model_device.h,
 * policy/model_device_backward.h) chosen by learner.device.
 *
 * On a device: one device model serves the pi_old, reference and gradient passes; the weights
 * of the pass (the policy's or the reference's) are uploaded when they are not the ones on the
 * device (another set, or an optimizer step since).  The host decode states of the passes
 * (l->st, and l->pst for the shared prefixes) stay the bookkeeping: which slot a segment holds,
 * positions, the boundary states exported to the state cache and the prefix states imported
 * from it.  Device slot i mirrors host slot i of l->st or of l->pst (whichever used it last: the
 * prefixes' forwards and the passes' do not overlap, and the device holds N slots of
 * max_context latent rows, not 2N); a mirror is uploaded before a forward when its slot was
 * joined, reset or imported since, or used by the other state, and every forward's new state is
 * downloaded back (the KDA states and only the new latent rows), so that the host state is
 * always current and a mirror is only a cache.  Gradients accumulate on the device over a
 * gradient pass.  Several learner ranks on device cuda sum them over NCCL on the GPUs (the
 * communicator bootstrapped over MPI; learner.device-allreduce) or over MPI on the host
 * (learner/dist.h: the device's gradient added to the host arena at the end of the pass, summed
 * there in rank order and uploaded again), and AdamW runs on the device (lr_optim_step: the
 * moments there for the update, the weights copied to the host after each step for Quantile
 * Balancing, the image encoder and checkpoints); with a test's grad hook the gradients are
 * added to the host arena at the end of the pass and AdamW runs on the host.
 * learner.device-math sets the GEMMs' arithmetic on the GPU for every pass (fp32 by default);
 * cached states are tagged with it.  bf16 also keeps bf16 weight copies (refreshed by AdamW):
 * every forward's weight GEMMs read them - the passes' and the training step's alike
 * (policy/model_device.h bf16_weights), so pi_old and the first minibatch's pi_theta round
 * alike - the routed experts' on bf16 operands throughout; the backward reads the masters.
 *
 * Images: the rows of a forward are encoded on the host (learner/media.c, the vision tower on the
 * CPU) and placed by the device; their gradient comes back per backward.
 * Block-sparse MLA (the run's mla-sparse-topk) runs in every pass on the device as on the CPU:
 * the forwards over kept chunk summaries, the training step over each pair's selected chunks.
 *
 * Shared slot rows (learner.device-slot-rows > 0): a device slot's latent rows are freed when
 * the host slot it mirrors is left, reset or imported over; before each forward dev_room fits
 * the forward's slots to their new lengths, evicting the other device slots (states synced to
 * the host first, then their rows freed: the host state is the authority, a mirror a cache)
 * when the rows run short, and refuses before anything runs (l->rows_short) when the forward's
 * own documents need more rows than there are: the passes then split the call. */
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/nccl.h"
#include "learner/update_internal.h"

/* The learner ranks (1 without a learners' communicator). */
static int32_t learner_ranks(const arl_learner *l) {
    return l->in.dist && l->in.dist->learners ? arl_dist_comm_size(l->in.dist->learners) : 1;
}

/* The learner's own CUDA context on its GPU (the local MPI rank modulo the GPU count), with an
 * arena of `need` bytes plus the context's own part.  Not made current. */
static arl_status open_gpu(size_t need, arl_cuda_ctx **out) {
    const int32_t dev = arl_cuda_local_device();
    if (dev < 0)
        return arl_errorf(ARL_ERR_DEVICE, "learner: device cuda: no CUDA device is visible");
    arl_cuda_config c;
    arl_cuda_config_defaults(&c);
    c.device = dev;
    c.arena_bytes = need + ((size_t)64 << 20);
    arl_status s = arl_cuda_open(&c, out);
    if (s) return arl_error_prefix(s, "learner: device cuda (GPU %d)", (int)c.device);
    return ARL_OK;
}

/* The learners' NCCL communicator on the learner's context (current): rank 0 makes the id and
 * broadcasts it over the learners' MPI communicator (a one-rank communicator without one),
 * with a flag so that a failure on rank 0 fails every rank instead of leaving them waiting. */
static arl_status open_nccl(arl_learner *l) {
    arl_dist_comm *c = l->in.dist ? l->in.dist->learners : NULL;
    const int32_t rank = c ? arl_dist_comm_rank(c) : 0, R = c ? arl_dist_comm_size(c) : 1;
    uint8_t msg[1 + ARL_CUDA_NCCL_ID_BYTES];
    memset(msg, 0, sizeof msg);
    arl_status s = ARL_OK;
    if (rank == 0) {
        s = arl_cuda_nccl_unique_id(msg + 1);
        msg[0] = s == ARL_OK;
    }
    if (c) ARL_TRY(arl_dist_bcast_bytes(c, msg, (int64_t)sizeof msg, 0));
    if (s) return arl_error_prefix(s, "learner: NCCL id");
    if (!msg[0])
        return arl_errorf(ARL_ERR_DEVICE, "learner: learner rank 0 could not make the NCCL id");
    s = arl_cuda_nccl_open(l->ctx, msg + 1, rank, R, &l->nccl);
    if (s)
        return arl_error_prefix(s,
                                "learner: NCCL communicator of %d learner ranks (rank %d; "
                                "set learner.device-allreduce=mpi to sum on the host)",
                                (int)R, (int)rank);
    return ARL_OK;
}

arl_status lr_dev_open(arl_learner *l) {
    const char *dev = l->lc.device;
    snprintf(l->numerics, sizeof l->numerics, "%s", ARL_LEARNER_NUMERICS);
    if (!dev[0] || !strcmp(dev, "cpu")) return ARL_OK;
    if (strcmp(dev, "cuda") && strcmp(dev, "cpu-device"))
        return arl_errorf(ARL_ERR_ARG, "learner: device '%s' (cpu, cuda or cpu-device)", dev);
    const int cuda = !strcmp(dev, "cuda");
    const char *ar = l->lc.device_allreduce[0] ? l->lc.device_allreduce : "auto";
    if (strcmp(ar, "auto") && strcmp(ar, "nccl") && strcmp(ar, "mpi"))
        return arl_errorf(ARL_ERR_ARG, "learner: device-allreduce '%s' (auto, nccl or mpi)", ar);
    if (!strcmp(ar, "nccl") && !cuda)
        return arl_errorf(ARL_ERR_ARG,
                          "learner: device-allreduce nccl needs learner.device cuda "
                          "(the device is %s)",
                          dev);
    const char *mt = l->lc.device_math[0] ? l->lc.device_math : "fp32";
    const arl_cuda_math math = !strcmp(mt, "bf16")   ? ARL_CUDA_MATH_BF16
                               : !strcmp(mt, "tf32") ? ARL_CUDA_MATH_TF32
                                                     : ARL_CUDA_MATH_FP32;
    if (math == ARL_CUDA_MATH_FP32 && strcmp(mt, "fp32"))
        return arl_errorf(ARL_ERR_ARG, "learner: device-math '%s' (fp32, tf32 or bf16)", mt);
    if (math != ARL_CUDA_MATH_FP32 && !cuda)
        return arl_errorf(ARL_ERR_ARG,
                          "learner: device-math %s needs learner.device cuda (the device is %s)",
                          mt, dev);
    if (!strcmp(ar, "nccl") && !arl_cuda_nccl_available())
        return arl_errorf(ARL_ERR_UNSUPPORTED, "learner: device-allreduce nccl: this build has no "
                                               "NCCL (use mpi)");
    const int32_t R = learner_ranks(l);
    const int nccl = cuda && (!strcmp(ar, "nccl") ||
                              (!strcmp(ar, "auto") && R > 1 && arl_cuda_nccl_available()));
    arl_model_opts mo = l->m.opts; /* the CPU policy model's settings (block-sparse MLA too) */
    arl_model_dev_opts dopts = {.n_slots = l->N,
                                .bf16_weights = math == ARL_CUDA_MATH_BF16,
                                .train_checkpoint = l->lc.act_checkpoint,
                                .slot_rows = l->lc.device_slot_rows};
    if (cuda) {
        arl_model_dev plan;
        ARL_TRY(arl_model_dev_plan(&plan, arl_dev_ops_cuda(), l->cfg, &mo, &dopts));
        const int64_t need = arl_model_dev_bytes(l->cfg, &mo, arl_dev_ops_cuda(), &dopts) +
                             arl_model_dev_train_bytes(&plan) +
                             (int64_t)sizeof(float) * plan.weight_floats + 4096;
        arl_status so = open_gpu((size_t)need, &l->ctx);
        if (so && arl_cuda_device_count() > 0) { /* where the bytes go: the slots' rows, mostly */
            const arl_model_dims *dm = &l->cfg->dims;
            const double slots = (double)sizeof(float) * (double)dm->n_mla * (double)plan.lat_rows *
                                 (double)(dm->rkv + dm->r);
            return arl_error_prefix(
                so,
                "learner: device cuda needs %.2f GiB, of which %.2f GiB are the %lld latent rows "
                "per MLA layer of the document slots (learner.device-slot-rows, or when 0 "
                "learner.max-docs %d x the context %lld); lower them",
                (double)need / 1073741824.0, slots / 1073741824.0, (long long)plan.lat_rows,
                (int)l->N, (long long)plan.max_context);
        }
        if (so) return so;
    }
    lr_dev_enter(l);
    arl_status s = arl_dev_ops_get(cuda ? "cuda" : "cpu", 0, &l->ops);
    if (s) s = arl_error_prefix(s, "learner: device %s", dev);
    if (!s && cuda) arl_cuda_set_math(l->ctx, math); /* every pass's GEMMs, on this context */
    if (!s) {
        s = arl_model_dev_init(&l->md, l->ops, l->cfg, l->in.params, &mo, &dopts);
        if (s) s = arl_error_prefix(s, "learner: the model on device %s", dev);
        l->have_md = s == ARL_OK;
    }
    if (!s) {
        s = arl_model_dev_train_init(&l->mdt, &l->md, &l->in.opt->cfg);
        if (s) s = arl_error_prefix(s, "learner: the training step on device %s", dev);
        l->have_mdt = s == ARL_OK;
    }
    if (!s) {
        s = l->ops->mem_alloc(sizeof(float) * (size_t)l->md.weight_floats,
                              "the learner's gradient staging", &l->dstage, &l->dstage_token);
        if (s) s = arl_error_prefix(s, "learner: device %s", dev);
        if (s) l->dstage = NULL;
    }
    if (!s && nccl) s = open_nccl(l);
    lr_dev_exit(l);
    if (s) return s;
    l->dev_w = l->in.params;
    l->dev_w_step = l->in.opt->step;
    l->dev_cur = calloc((size_t)l->N, 1);
    l->dev_ahead = calloc((size_t)l->N, 1);
    if (!l->dev_ahead || !l->dev_cur)
        return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (device slots)");
    if (cuda) /* the tag of cached states: made under this arithmetic */
        snprintf(l->numerics, sizeof l->numerics, "cuda-%s",
                 math == ARL_CUDA_MATH_FP32 ? "f32" : mt);
    return ARL_OK;
}

void lr_dev_close(arl_learner *l) {
    if (l->have_mdt || l->have_md) {
        lr_dev_enter(l);
        if (l->dstage) l->ops->mem_free(l->dstage, l->dstage_token); /* stack order */
        l->dstage = NULL;
        if (l->have_mdt) arl_model_dev_train_free(&l->mdt);
        if (l->have_md) arl_model_dev_free(&l->md);
        lr_dev_exit(l);
    }
    l->have_mdt = l->have_md = 0;
    arl_cuda_nccl_close(l->nccl);
    l->nccl = NULL;
    arl_cuda_close(l->ctx);
    l->ctx = NULL;
    free(l->dev_ahead);
    free(l->dev_cur);
    free(l->gstage);
    l->gstage = NULL;
    l->dev_ahead = NULL;
    l->dev_cur = NULL;
}

void lr_dev_enter(arl_learner *l) {
    if (!l->ctx || l->ctx_depth++ > 0) return; /* nested: a test's grad hook computing a loss */
    l->ctx_prev = arl_cuda_current();
    arl_cuda_make_current(l->ctx);
}

void lr_dev_exit(arl_learner *l) {
    if (!l->ctx || --l->ctx_depth > 0) return;
    arl_cuda_make_current(l->ctx_prev);
    l->ctx_prev = NULL;
}

void lr_dev_weights_stale(arl_learner *l) {
    l->dev_w = NULL;
}

/* What device slot i holds (l->dev_cur[i]): nothing known, or host slot i of l->st / l->pst. */
enum { DEV_STALE = 0, DEV_ST = 1, DEV_PST = 2 };

static uint8_t dev_owner(const arl_learner *l, const arl_decode_state *hs) {
    return hs == &l->pst ? DEV_PST : DEV_ST;
}

/* Device slot `slot` no longer mirrors anything (the host's state changed, or was dropped). */
static void dev_forget(arl_learner *l, int32_t slot) {
    if (!l->ops) return;
    l->dev_cur[slot] = DEV_STALE;
    l->dev_ahead[slot] = 0;
}

/* Shared slot rows: the rows of device slot `slot` freed (what they held is not wanted). */
static void dev_release(arl_learner *l, int32_t slot) {
    if (l->ops && l->md.dopts.slot_rows > 0 && l->md.slot_cap[slot] > 0)
        (void)arl_model_dev_slot_reset(&l->md, slot); /* fails only for a slot out of range */
}

/* Host slot `slot` of hs changed or was dropped: the device's mirror of it forgotten (and its
 * rows freed); a device slot mirroring the other host state is not touched. */
static void dev_drop(arl_learner *l, arl_decode_state *hs, int32_t slot) {
    if (!l->ops || l->dev_cur[slot] != dev_owner(l, hs)) return;
    dev_forget(l, slot);
    dev_release(l, slot);
}

arl_status lr_slot_join(arl_learner *l, arl_decode_state *hs, int32_t *slot) {
    ARL_TRY(arl_decode_state_join(hs, slot));
    dev_forget(l, *slot);
    return ARL_OK;
}

void lr_slot_leave(arl_learner *l, arl_decode_state *hs, int32_t slot) {
    dev_drop(l, hs, slot);
    arl_decode_state_leave(hs, slot);
}

void lr_slot_reset(arl_learner *l, arl_decode_state *hs, int32_t slot) {
    arl_decode_state_reset(hs, slot);
    dev_drop(l, hs, slot);
    dev_forget(l, slot);
}

arl_status lr_slot_import(arl_learner *l, arl_decode_state *hs, int32_t slot, const void *buf,
                          size_t len) {
    dev_drop(l, hs, slot);
    dev_forget(l, slot);
    return arl_decode_state_import(hs, slot, buf, len);
}

int64_t lr_slot_pos(const arl_learner *l, const arl_decode_state *hs, int32_t slot) {
    if (l->ops && l->dev_cur[slot] == dev_owner(l, hs) && l->dev_ahead[slot])
        return arl_model_dev_slot_pos(&l->md, slot);
    return arl_decode_state_position(hs, slot);
}

arl_status lr_slot_sync(arl_learner *l, arl_decode_state *hs, int32_t slot) {
    if (!l->ops || l->dev_cur[slot] != dev_owner(l, hs) || !l->dev_ahead[slot]) return ARL_OK;
    arl_status s =
        arl_model_dev_slot_download(&l->md, slot, hs, slot, arl_decode_state_position(hs, slot));
    if (s) return arl_error_prefix(s, "learner: a decode state from device %s", l->lc.device);
    l->dev_ahead[slot] = 0;
    return ARL_OK;
}

/* Device slot ds evicted: its state brought to the host it mirrors when the device is ahead,
 * then forgotten and its rows freed. */
static arl_status dev_evict(arl_learner *l, int32_t ds) {
    if (l->dev_cur[ds] != DEV_STALE && l->dev_ahead[ds])
        ARL_TRY(lr_slot_sync(l, l->dev_cur[ds] == DEV_PST ? &l->pst : &l->st, ds));
    dev_forget(l, ds);
    dev_release(l, ds);
    return ARL_OK;
}

/* Shared slot rows: room for a forward over slots[0..b->N) of hs adding the batch's tokens,
 * made before anything is uploaded or run (see the file comment).  Device slots of the forward
 * that mirror something else are evicted first (they are uploaded afresh), then each slot's
 * range is fitted to its position plus its new tokens; when that fails the other device slots
 * holding rows are evicted and the fits tried again.  A forward whose own documents need more
 * rows than there are: ARL_ERR_RANGE, l->rows_short set, nothing lost. */
static arl_status dev_room(arl_learner *l, arl_decode_state *hs, const int32_t *slots,
                           const arl_batch *b) {
    l->rows_short = 0;
    if (!l->ops || l->md.dopts.slot_rows <= 0 || l->md.dm.n_mla == 0) return ARL_OK;
    const uint8_t own = dev_owner(l, hs);
    for (int32_t i = 0; i < b->N; i++)
        if (l->dev_cur[slots[i]] != own) ARL_TRY(dev_evict(l, slots[i]));
    arl_status s = ARL_OK;
    for (int attempt = 0; attempt < 2; attempt++) {
        s = ARL_OK;
        for (int32_t i = 0; s == ARL_OK && i < b->N; i++) {
            const int64_t rows =
                lr_slot_pos(l, hs, slots[i]) + (b->cu ? b->cu[i + 1] - b->cu[i] : b->T);
            if (rows <= l->md.max_context) /* past it: the forward's own error */
                s = arl_model_dev_slot_fit(&l->md, slots[i], rows);
        }
        if (s != ARL_ERR_RANGE || attempt > 0) break;
        int64_t evicted = 0;
        for (int32_t ds = 0; ds < l->N; ds++) {
            int in_call = 0;
            for (int32_t i = 0; i < b->N && !in_call; i++)
                in_call = slots[i] == ds;
            if (in_call || l->md.slot_cap[ds] <= 0) continue;
            ARL_TRY(dev_evict(l, ds));
            evicted++;
        }
        if (evicted == 0) break;
        l->cnt.dev_evictions += evicted;
        arl_error_clear();
    }
    if (s != ARL_ERR_RANGE) return s;
    l->rows_short = 1;
    if (b->N == 1)
        return arl_error_prefix(s,
                                "learner: device %s: one document needs more latent rows than "
                                "learner.device-slot-rows (%lld) holds; raise it",
                                l->lc.device, (long long)l->md.lat_rows);
    return arl_error_prefix(s,
                            "learner: device %s: the %d documents of one forward do not fit "
                            "learner.device-slot-rows (%lld latent rows) at once",
                            l->lc.device, (int)b->N, (long long)l->md.lat_rows);
}

/* Device weights = w (host), uploaded unless they are there at this optimizer step. */
static arl_status dev_weights(arl_learner *l, const arl_model_params *w) {
    if (l->dev_w == w && l->dev_w_step == l->in.opt->step) return ARL_OK;
    l->dev_w = NULL;
    arl_status s = arl_model_dev_set_params(&l->md, w);
    if (s) return arl_error_prefix(s, "learner: weights to device %s", l->lc.device);
    l->dev_w = w;
    l->dev_w_step = l->in.opt->step;
    return ARL_OK;
}

/* Before a device forward over host slots slots[0..n) of hs (the same device slots): the
 * mirrors that do not hold them uploaded (a state of the other host state that the device is
 * ahead of is downloaded to it first; the passes never leave one behind, this is a guard). */
static arl_status dev_slots_prepare(arl_learner *l, arl_decode_state *hs, const int32_t *slots,
                                    int32_t n) {
    const uint8_t own = dev_owner(l, hs);
    for (int32_t i = 0; i < n; i++) {
        const int32_t ds = slots[i];
        if (l->dev_cur[ds] == own) continue;
        if (l->dev_cur[ds] != DEV_STALE && l->dev_ahead[ds])
            ARL_TRY(lr_slot_sync(l, l->dev_cur[ds] == DEV_PST ? &l->pst : &l->st, ds));
        dev_forget(l, ds);
        arl_status s = arl_model_dev_slot_upload(&l->md, ds, hs, slots[i]);
        if (s) return arl_error_prefix(s, "learner: a decode state to device %s", l->lc.device);
        l->dev_cur[ds] = own;
    }
    return ARL_OK;
}

/* After a device forward (status fs): the device is ahead of the host in these slots (their
 * states come to the host when lr_slot_sync asks); after a failure their states are lost (the
 * update fails). */
static arl_status dev_slots_finish(arl_learner *l, const int32_t *slots, int32_t n, arl_status fs) {
    for (int32_t i = 0; i < n; i++)
        if (fs == ARL_OK)
            l->dev_ahead[slots[i]] = 1;
        else
            dev_forget(l, slots[i]);
    return fs;
}

arl_status lr_forward_state(arl_learner *l, arl_model *m, arl_decode_state *hs,
                            const int32_t *slots, const arl_batch *b, const arl_forward_out *fo) {
    if (!l->ops) return arl_model_forward_state(m, hs, slots, b, fo);
    ARL_TRY(dev_room(l, hs, slots, b));
    ARL_TRY(dev_weights(l, m->w));
    ARL_TRY(dev_slots_prepare(l, hs, slots, b->N));
    arl_status s = arl_model_dev_forward_state(&l->md, slots, b, fo);
    return dev_slots_finish(l, slots, b->N, s);
}

arl_status lr_train_forward(arl_learner *l, const int32_t *slots, const arl_batch *b,
                            const arl_forward_out *fo) {
    if (!l->ops) return arl_model_train_forward(&l->tr, b, &l->st, slots, fo);
    ARL_TRY(dev_room(l, &l->st, slots, b));
    ARL_TRY(dev_weights(l, l->in.params));
    ARL_TRY(dev_slots_prepare(l, &l->st, slots, b->N));
    arl_status s = arl_model_dev_train_forward_state(&l->mdt, b, slots, fo);
    return dev_slots_finish(l, slots, b->N, s);
}

arl_status lr_backward(arl_learner *l, const arl_batch *b, const float *dlogp, float *dmedia) {
    if (!l->ops) return arl_model_backward(&l->tr, b, dlogp, &l->grads, NULL, dmedia);
    return arl_model_dev_backward_media(&l->mdt, b, dlogp, dmedia);
}

arl_status lr_grads_allreduce(arl_learner *l) {
    const int64_t n = l->grads.inv.arena_floats;
    if (!l->nccl) return arl_dist_allreduce_f32(l->in.dist->learners, l->grads.arena, n);
    /* the host's gradient (the device's plus what the host added: image rows, vision tower)
     * through the device's gradient buffer, summed there, and back */
    const size_t bytes = sizeof(float) * (size_t)n;
    arl_status s = l->ops->upload(l->mdt.grads, l->grads.arena, bytes);
    if (!s) s = arl_cuda_nccl_allreduce_sum(l->nccl, l->mdt.grads, n);
    if (!s) s = l->ops->download(l->grads.arena, l->mdt.grads, bytes);
    if (s) return arl_error_prefix(s, "learner: gradient all-reduce over NCCL");
    return ARL_OK;
}

/* Several learner ranks without NCCL: the device's gradient comes to the host at the end of
 * each pass (lr_grads_end) to be summed over MPI, wherever AdamW runs. */
static int host_sum(const arl_learner *l) {
    return learner_ranks(l) > 1 && !l->nccl;
}

arl_status lr_optim_begin(arl_learner *l) {
    l->dev_opt = l->ops && !l->grad_hook;
    if (!l->dev_opt) return ARL_OK;
    const arl_adamw *o = l->in.opt;
    arl_status s = arl_model_dev_moments_upload(&l->mdt, o->m_arena, o->v_arena, o->step);
    if (s) return arl_error_prefix(s, "learner: optimizer state to device %s", l->lc.device);
    return ARL_OK;
}

arl_status lr_optim_step(arl_learner *l, arl_optim_report *rep) {
    if (!l->dev_opt) {
        if (l->nccl || learner_ranks(l) > 1) ARL_TRY(lr_grads_allreduce(l));
        return arl_adamw_step(l->in.opt, l->in.params, l->grads.arena, rep);
    }
    const int64_t n = l->md.weight_floats;
    const size_t bytes = sizeof(float) * (size_t)n;
    arl_status s = ARL_OK;
    if (host_sum(l)) { /* the whole gradient is in the host arena (lr_grads_end): summed over
                        * MPI there, in rank order, and back to the device for AdamW */
        s = arl_dist_allreduce_f32(l->in.dist->learners, l->grads.arena, n);
        if (!s) s = l->ops->upload(l->mdt.grads, l->grads.arena, bytes);
    } else if (l->host_grads) { /* what the host added (image rows, the vision tower): onto the
                                 * device's sums, in the order lr_grads_end adds them */
        s = l->ops->upload(l->dstage, l->grads.arena, bytes);
        if (!s) l->md.kb->add(l->mdt.grads, l->mdt.grads, l->dstage, n);
    }
    if (!s && l->nccl) s = arl_cuda_nccl_allreduce_sum(l->nccl, l->mdt.grads, n);
    if (s) return arl_error_prefix(s, "learner: gradients on device %s", l->lc.device);
    /* the masters are the policy's weights at this step (a minibatch with nothing to train ran
     * no forward since the reference pass) */
    ARL_TRY(dev_weights(l, l->in.params));
    ARL_TRY(arl_model_dev_optim_step(&l->mdt, rep)); /* names a non-finite tensor */
    l->in.opt->step = l->mdt.step;
    /* the new weights to the host (checkpoints, Quantile Balancing, the image encoder); the
     * device's are uploaded again before the next pass (QB changes the host's) */
    l->dev_w = NULL;
    s = arl_model_dev_params_download(&l->mdt, l->in.params->arena);
    if (s) return arl_error_prefix(s, "learner: weights from device %s", l->lc.device);
    return ARL_OK;
}

arl_status lr_optim_end(arl_learner *l) {
    if (!l->dev_opt) return ARL_OK;
    l->dev_opt = 0;
    arl_adamw *o = l->in.opt;
    arl_status s = arl_model_dev_moments_download(&l->mdt, o->m_arena, o->v_arena);
    if (s) return arl_error_prefix(s, "learner: optimizer state from device %s", l->lc.device);
    return ARL_OK;
}

arl_status lr_grads_begin(arl_learner *l) {
    l->host_grads = 0;
    if (!l->ops) return ARL_OK;
    return arl_model_dev_zero_grad(&l->mdt);
}

arl_status lr_grads_end(arl_learner *l) {
    /* AdamW on the device with one rank or NCCL: the sums stay there */
    if (!l->ops || (l->dev_opt && !host_sum(l))) return ARL_OK;
    /* the host arena was zero, and the pass added to it only what the device does not compute
     * (the embedding row of the <|media_pad|> placeholders, learner/media.c): adding the
     * device's sums gives the host's, term for term.  The staging arena is made on the first
     * such pass (a learner whose AdamW always runs on the device never needs it). */
    if (!l->gstage) l->gstage = malloc(sizeof(float) * (size_t)l->md.weight_floats);
    if (!l->gstage)
        return arl_errorf(ARL_ERR_NOMEM, "learner: out of memory (gradient staging, %lld floats)",
                          (long long)l->md.weight_floats);
    arl_status s = arl_model_dev_grads_download(&l->mdt, l->gstage);
    if (s) return arl_error_prefix(s, "learner: gradients from device %s", l->lc.device);
    float *g = l->grads.arena;
    for (int64_t i = 0; i < l->grads.inv.arena_floats; i++)
        g[i] += l->gstage[i];
    return ARL_OK;
}
