/* learner/dist.c: processes, roles and collectives over MPI (see learner/dist.h for the
 * contract, in particular what is deterministic).  Every function short-circuits when its
 * communicator has one rank. */
#include "learner/dist.h"

#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"

/* ---- options ---- */

#define OFF(f) offsetof(arl_dist_opts, f)
const arl_option arl_dist_options[] = {
    {"dist-learners", ARL_OPT_INT, OFF(learners), "0",
     "learner ranks 0..L-1 (the other ranks roll out); 0 = every rank learns and rolls out", 0, 1e6,
     NULL, 0, "L"},
    {"dist-expert-parallel", ARL_OPT_INT, OFF(expert_parallel), "1",
     "learner ranks per expert-parallel group (experts sharded over them; divides the learners)", 1,
     1e6, NULL, 0, "P"},
    {"dist-reduce-block", ARL_OPT_INT, OFF(reduce_block), "4194304",
     "floats per gradient all-reduce round (bounds the reduction scratch memory)", 1024,
     1073741824.0, NULL, 0, "N"},
};
#undef OFF
const size_t arl_dist_options_count = ARL_OPTIONS_COUNT(arl_dist_options);

void arl_dist_opts_default(arl_dist_opts *o) {
    memset(o, 0, sizeof *o);
    arl_status s = arl_options_defaults(arl_dist_options, arl_dist_options_count, o);
    ARL_ASSERT(s == ARL_OK);
}

/* ---- layout ---- */

arl_status arl_dist_layout_make(arl_dist_layout *L, const arl_dist_opts *o, int32_t world_size,
                                int32_t world_rank) {
    ARL_ASSERT(L && o && world_size >= 1 && world_rank >= 0 && world_rank < world_size);
    memset(L, 0, sizeof *L);
    int64_t nl = o->learners == 0 ? world_size : o->learners;
    if (o->learners < 0 || nl > world_size)
        return arl_errorf(ARL_ERR_CONFIG,
                          "dist-learners: %lld learner ranks requested but the job has %d rank%s "
                          "(start more ranks with mpirun -np, or lower dist-learners; 0 = all)",
                          (long long)o->learners, world_size, world_size == 1 ? "" : "s");
    if (o->expert_parallel < 1 || nl % o->expert_parallel != 0)
        return arl_errorf(ARL_ERR_CONFIG,
                          "dist-expert-parallel: %lld does not divide the %lld learner ranks "
                          "(choose a divisor of the learner count)",
                          (long long)o->expert_parallel, (long long)nl);
    L->world_size = world_size;
    L->world_rank = world_rank;
    L->n_learners = (int32_t)nl;
    L->colocated = nl == world_size;
    L->n_rollout = L->colocated ? world_size : world_size - (int32_t)nl;
    L->ep_size = (int32_t)o->expert_parallel;
    L->learner_index = L->ep_index = L->dp_index = L->rollout_index = -1;
    if (world_rank < nl) {
        L->roles |= ARL_DIST_ROLE_LEARNER;
        L->learner_index = world_rank;
        L->ep_index = world_rank % L->ep_size;
        L->dp_index = world_rank / L->ep_size;
    }
    if (L->colocated || world_rank >= nl) {
        L->roles |= ARL_DIST_ROLE_ROLLOUT;
        L->rollout_index = L->colocated ? world_rank : world_rank - (int32_t)nl;
    }
    return ARL_OK;
}

/* ---- communicators ---- */

struct arl_dist_comm {
    MPI_Comm comm;
    int32_t rank, size;
    const char *name;
    int64_t reduce_block; /* floats per all-reduce round */
    int *cnt_a, *dsp_a;   /* (R) counts/displacements scratch */
    int *cnt_b, *dsp_b;   /* (R) */
    void *scratch;        /* reduction scratch, grown to the high-water mark */
    size_t scratch_bytes;
    MPI_Datatype row_type; /* contiguous row of row_width floats (alltoallv) */
    int64_t row_width;     /* 0: row_type not created */
};

static arl_status mpi_fail(int rc, const char *call, const arl_dist_comm *c) {
    char msg[MPI_MAX_ERROR_STRING + 1];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) len = 0;
    msg[len] = '\0';
    if (c)
        return arl_errorf(ARL_ERR_NET, "dist: %s on communicator '%s' (rank %d of %d) failed: %s",
                          call, c->name, c->rank, c->size, len ? msg : "unknown MPI error");
    return arl_errorf(ARL_ERR_NET, "dist: %s failed: %s", call, len ? msg : "unknown MPI error");
}

#define MPI_TRY(call, c)                                                                           \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != MPI_SUCCESS) return mpi_fail(rc_, #call, (c));                                  \
    } while (0)

static void comm_free(arl_dist_comm *c) {
    if (!c) return;
    if (c->row_width) MPI_Type_free(&c->row_type);
    if (c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
    free(c->cnt_a);
    free(c->dsp_a);
    free(c->cnt_b);
    free(c->dsp_b);
    free(c->scratch);
    free(c);
}

/* Wrap mc (owned: freed with the wrapper). */
static arl_status comm_wrap(arl_dist_comm **out, MPI_Comm mc, const char *name,
                            int64_t reduce_block) {
    *out = NULL;
    arl_dist_comm *c = calloc(1, sizeof *c);
    if (!c) {
        MPI_Comm_free(&mc);
        return arl_errorf(ARL_ERR_NOMEM, "dist: out of memory for communicator '%s'", name);
    }
    c->comm = mc;
    c->name = name;
    c->reduce_block = reduce_block;
    int r = 0, s = 1;
    MPI_Comm_set_errhandler(mc, MPI_ERRORS_RETURN);
    MPI_Comm_rank(mc, &r);
    MPI_Comm_size(mc, &s);
    c->rank = r;
    c->size = s;
    c->cnt_a = malloc(sizeof(int) * (size_t)s);
    c->dsp_a = malloc(sizeof(int) * (size_t)s);
    c->cnt_b = malloc(sizeof(int) * (size_t)s);
    c->dsp_b = malloc(sizeof(int) * (size_t)s);
    if (!c->cnt_a || !c->dsp_a || !c->cnt_b || !c->dsp_b) {
        comm_free(c);
        return arl_errorf(ARL_ERR_NOMEM, "dist: out of memory for communicator '%s' (%d ranks)",
                          name, s);
    }
    *out = c;
    return ARL_OK;
}

int32_t arl_dist_comm_rank(const arl_dist_comm *c) {
    return c->rank;
}
int32_t arl_dist_comm_size(const arl_dist_comm *c) {
    return c->size;
}
const char *arl_dist_comm_name(const arl_dist_comm *c) {
    return c ? c->name : "(none)";
}

static arl_status scratch_reserve(arl_dist_comm *c, size_t bytes) {
    if (bytes <= c->scratch_bytes) return ARL_OK;
    void *p = realloc(c->scratch, bytes);
    if (!p)
        return arl_errorf(ARL_ERR_NOMEM,
                          "dist: out of memory for %zu bytes of reduction scratch "
                          "on '%s' (lower dist-reduce-block)",
                          bytes, c->name);
    c->scratch = p;
    c->scratch_bytes = bytes;
    return ARL_OK;
}

/* ---- init / roles / finalize ---- */

arl_status arl_dist_init(arl_dist **out, int *argc, char ***argv) {
    ARL_ASSERT(out);
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return arl_errorf(ARL_ERR_STATE, "dist: MPI was already finalized in this process");
    MPI_Initialized(&inited);
    arl_dist *d = calloc(1, sizeof *d);
    if (!d) return arl_errorf(ARL_ERR_NOMEM, "dist: out of memory");
    if (!inited) {
        int provided = 0;
        int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) {
            free(d);
            return mpi_fail(rc, "MPI_Init_thread", NULL);
        }
        d->owns_mpi = 1;
    }
    arl_dist_opts o;
    arl_dist_opts_default(&o);
    d->reduce_block = o.reduce_block;
    MPI_Comm w;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &w);
    if (rc != MPI_SUCCESS) {
        arl_status s = mpi_fail(rc, "MPI_Comm_dup(MPI_COMM_WORLD)", NULL);
        arl_dist_finalize(d);
        return s;
    }
    arl_status s = comm_wrap(&d->world, w, "world", d->reduce_block);
    if (s == ARL_OK) s = arl_dist_layout_make(&d->layout, &o, d->world->size, d->world->rank);
    if (s != ARL_OK) {
        arl_dist_finalize(d);
        return s;
    }
    *out = d;
    return ARL_OK;
}

/* Collective over the world: the sub-communicator of the ranks with `member`, ordered by key;
 * NULL on the others. */
static arl_status split(arl_dist *d, arl_dist_comm **out, int member, int color, int key,
                        const char *name) {
    MPI_Comm mc = MPI_COMM_NULL;
    MPI_TRY(MPI_Comm_split(d->world->comm, member ? color : MPI_UNDEFINED, key, &mc), d->world);
    if (!member) {
        *out = NULL;
        return ARL_OK;
    }
    return comm_wrap(out, mc, name, d->reduce_block);
}

arl_status arl_dist_assign_roles(arl_dist *d, const arl_dist_opts *o) {
    ARL_ASSERT(d && o);
    if (d->learners || d->rollout)
        return arl_errorf(ARL_ERR_STATE, "dist: roles were already assigned");
    /* every rank must have read the same dist-* options */
    int64_t v[3] = {o->learners, o->expert_parallel, o->reduce_block}, lo[3], hi[3];
    memcpy(lo, v, sizeof v);
    memcpy(hi, v, sizeof v);
    ARL_TRY(arl_dist_allreduce_i64(d->world, lo, 3, ARL_DIST_MIN));
    ARL_TRY(arl_dist_allreduce_i64(d->world, hi, 3, ARL_DIST_MAX));
    static const char *const names[3] = {"dist-learners", "dist-expert-parallel",
                                         "dist-reduce-block"};
    for (int i = 0; i < 3; i++)
        if (lo[i] != hi[i])
            return arl_errorf(ARL_ERR_CONFIG,
                              "%s: the ranks disagree (values from %lld to %lld; every rank must "
                              "read the same experiment)",
                              names[i], (long long)lo[i], (long long)hi[i]);
    arl_dist_layout L;
    ARL_TRY(arl_dist_layout_make(&L, o, d->world->size, d->world->rank));
    d->layout = L;
    d->reduce_block = o->reduce_block;
    d->world->reduce_block = o->reduce_block;
    const int learner = (L.roles & ARL_DIST_ROLE_LEARNER) != 0;
    const int rollout = (L.roles & ARL_DIST_ROLE_ROLLOUT) != 0;
    const int wr = L.world_rank;
    ARL_TRY(split(d, &d->learners, learner, 0, wr, "learners"));
    ARL_TRY(split(d, &d->rollout, rollout, 1, wr, "rollout"));
    ARL_TRY(split(d, &d->ep, learner, L.dp_index, L.ep_index, "ep"));
    ARL_TRY(split(d, &d->dp, learner, L.ep_index, L.dp_index, "dp"));
    return ARL_OK;
}

void arl_dist_finalize(arl_dist *d) {
    if (!d) return;
    comm_free(d->dp);
    comm_free(d->ep);
    comm_free(d->rollout);
    comm_free(d->learners);
    comm_free(d->world);
    if (d->owns_mpi) MPI_Finalize();
    free(d);
}

void arl_dist_abort(arl_dist *d, int code) {
    if (d && d->world && d->world->size > 1) MPI_Abort(MPI_COMM_WORLD, code);
}

/* ---- collectives ---- */

/* Large counts go in pieces that fit MPI's int. */
#define PIECE ((int64_t)1 << 30)

arl_status arl_dist_barrier(arl_dist_comm *c) {
    if (c->size == 1) return ARL_OK;
    MPI_TRY(MPI_Barrier(c->comm), c);
    return ARL_OK;
}

static arl_status bcast_typed(arl_dist_comm *c, void *buf, int64_t n, size_t esz, MPI_Datatype t,
                              int32_t root) {
    ARL_ASSERT(n >= 0 && root >= 0 && root < c->size);
    if (c->size == 1) return ARL_OK;
    for (int64_t o = 0; o < n; o += PIECE) {
        int cnt = (int)(n - o < PIECE ? n - o : PIECE);
        MPI_TRY(MPI_Bcast((char *)buf + (size_t)o * esz, cnt, t, root, c->comm), c);
    }
    return ARL_OK;
}

arl_status arl_dist_bcast_f32(arl_dist_comm *c, float *buf, int64_t n, int32_t root) {
    return bcast_typed(c, buf, n, sizeof(float), MPI_FLOAT, root);
}

arl_status arl_dist_bcast_bytes(arl_dist_comm *c, void *buf, int64_t n, int32_t root) {
    return bcast_typed(c, buf, n, 1, MPI_BYTE, root);
}

arl_status arl_dist_bcast_msg(arl_dist_comm *c, void **buf, int64_t *n, int32_t root) {
    ARL_ASSERT(buf && n && root >= 0 && root < c->size);
    if (c->size == 1) return ARL_OK;
    int64_t len = c->rank == root ? *n : 0;
    MPI_TRY(MPI_Bcast(&len, 1, MPI_INT64_T, root, c->comm), c);
    if (c->rank != root) {
        void *p = malloc(len > 0 ? (size_t)len : 1);
        if (!p)
            return arl_errorf(ARL_ERR_NOMEM, "dist: out of memory for a %lld-byte message on '%s'",
                              (long long)len, c->name);
        *buf = p;
        *n = len;
    }
    arl_status s = arl_dist_bcast_bytes(c, *buf, len, root);
    if (s != ARL_OK && c->rank != root) {
        free(*buf);
        *buf = NULL;
    }
    return s;
}

/* Below this many elements in all ranks together, one all-gather + a local sum. */
#define SMALL_ELEMS 4096

/* Deterministic SUM of float (f64 = 0) or double (f64 = 1) elements: the left-to-right sum
 * over ranks 0..R-1 in double (dist.h).  Both paths compute exactly that function. */
static arl_status allreduce_sum(arl_dist_comm *c, void *buf, int64_t n, int f64) {
    const int R = c->size;
    const size_t esz = f64 ? sizeof(double) : sizeof(float);
    const MPI_Datatype t = f64 ? MPI_DOUBLE : MPI_FLOAT;
    if (n * R <= SMALL_ELEMS) {
        ARL_TRY(scratch_reserve(c, (size_t)(n * R) * esz));
        MPI_TRY(MPI_Allgather(buf, (int)n, t, c->scratch, (int)n, t, c->comm), c);
        for (int64_t i = 0; i < n; i++) {
            double acc;
            if (f64) {
                const double *s = c->scratch;
                acc = s[i];
                for (int r = 1; r < R; r++)
                    acc += s[(int64_t)r * n + i];
                ((double *)buf)[i] = acc;
            } else {
                const float *s = c->scratch;
                acc = (double)s[i];
                for (int r = 1; r < R; r++)
                    acc += (double)s[(int64_t)r * n + i];
                ((float *)buf)[i] = (float)acc;
            }
        }
        return ARL_OK;
    }
    int64_t block = c->reduce_block < R ? R : c->reduce_block;
    if (block > PIECE) block = PIECE;
    ARL_TRY(scratch_reserve(c, (size_t)((n < block ? n : block) + R) * esz));
    int *cnt = c->cnt_a, *dsp = c->dsp_a, *rcnt = c->cnt_b, *rdsp = c->dsp_b;
    for (int64_t o = 0; o < n; o += block) {
        const int64_t m = n - o < block ? n - o : block;
        /* chunk r of this round: cnt[r] elements at dsp[r], reduced by rank r */
        for (int r = 0, at = 0; r < R; r++) {
            cnt[r] = (int)(m / R + (r < m % R));
            dsp[r] = at;
            at += cnt[r];
        }
        const int mine = cnt[c->rank];
        for (int r = 0; r < R; r++) {
            rcnt[r] = mine;
            rdsp[r] = r * mine;
        }
        char *seg = (char *)buf + (size_t)o * esz;
        MPI_TRY(MPI_Alltoallv(seg, cnt, dsp, t, c->scratch, rcnt, rdsp, t, c->comm), c);
        if (f64) {
            const double *s = c->scratch;
            double *dst = (double *)seg + dsp[c->rank];
            for (int i = 0; i < mine; i++) {
                double acc = s[i];
                for (int r = 1; r < R; r++)
                    acc += s[(int64_t)r * mine + i];
                dst[i] = acc;
            }
        } else {
            const float *s = c->scratch;
            float *dst = (float *)seg + dsp[c->rank];
            for (int i = 0; i < mine; i++) {
                double acc = (double)s[i];
                for (int r = 1; r < R; r++)
                    acc += (double)s[(int64_t)r * mine + i];
                dst[i] = (float)acc;
            }
        }
        MPI_TRY(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, seg, cnt, dsp, t, c->comm), c);
    }
    return ARL_OK;
}

arl_status arl_dist_allreduce_f32(arl_dist_comm *c, float *buf, int64_t n) {
    ARL_ASSERT(c && n >= 0 && (buf || n == 0));
    if (c->size == 1 || n == 0) return ARL_OK;
    return allreduce_sum(c, buf, n, 0);
}

static arl_status allreduce_exact(arl_dist_comm *c, void *buf, int64_t n, size_t esz,
                                  MPI_Datatype t, arl_dist_op op) {
    MPI_Op mop = op == ARL_DIST_SUM ? MPI_SUM : op == ARL_DIST_MAX ? MPI_MAX : MPI_MIN;
    for (int64_t o = 0; o < n; o += PIECE) {
        int cnt = (int)(n - o < PIECE ? n - o : PIECE);
        MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, (char *)buf + (size_t)o * esz, cnt, t, mop, c->comm),
                c);
    }
    return ARL_OK;
}

arl_status arl_dist_allreduce_f64(arl_dist_comm *c, double *buf, int64_t n, arl_dist_op op) {
    ARL_ASSERT(c && n >= 0 && (buf || n == 0));
    ARL_ASSERT(op == ARL_DIST_SUM || op == ARL_DIST_MAX || op == ARL_DIST_MIN);
    if (c->size == 1 || n == 0) return ARL_OK;
    if (op == ARL_DIST_SUM) return allreduce_sum(c, buf, n, 1);
    return allreduce_exact(c, buf, n, sizeof(double), MPI_DOUBLE, op);
}

arl_status arl_dist_allreduce_i64(arl_dist_comm *c, int64_t *buf, int64_t n, arl_dist_op op) {
    ARL_ASSERT(c && n >= 0 && (buf || n == 0));
    ARL_ASSERT(op == ARL_DIST_SUM || op == ARL_DIST_MAX || op == ARL_DIST_MIN);
    if (c->size == 1 || n == 0) return ARL_OK;
    return allreduce_exact(c, buf, n, sizeof(int64_t), MPI_INT64_T, op);
}

arl_status arl_dist_allgather_i64(arl_dist_comm *c, const int64_t *mine, int64_t *all, int64_t m) {
    ARL_ASSERT(c && m >= 0 && m * c->size <= INT_MAX);
    if (m == 0) return ARL_OK;
    if (c->size == 1) {
        memcpy(all, mine, sizeof(int64_t) * (size_t)m);
        return ARL_OK;
    }
    MPI_TRY(MPI_Allgather(mine, (int)m, MPI_INT64_T, all, (int)m, MPI_INT64_T, c->comm), c);
    return ARL_OK;
}

arl_status arl_dist_alltoall_i64(arl_dist_comm *c, const int64_t *send, int64_t *recv, int64_t m) {
    ARL_ASSERT(c && m >= 0 && m * c->size <= INT_MAX);
    if (m == 0) return ARL_OK;
    if (c->size == 1) {
        memcpy(recv, send, sizeof(int64_t) * (size_t)m);
        return ARL_OK;
    }
    MPI_TRY(MPI_Alltoall(send, (int)m, MPI_INT64_T, recv, (int)m, MPI_INT64_T, c->comm), c);
    return ARL_OK;
}

/* counts (R) in rows -> int counts and displacements; ARL_ERR_RANGE when they overflow int. */
static arl_status row_counts(const arl_dist_comm *c, const int64_t *rows, int *cnt, int *dsp,
                             const char *what) {
    int64_t at = 0;
    for (int r = 0; r < c->size; r++) {
        if (rows[r] < 0)
            return arl_errorf(ARL_ERR_RANGE,
                              "dist: alltoallv on '%s': negative %s row count %lld "
                              "for rank %d",
                              c->name, what, (long long)rows[r], r);
        if (rows[r] > INT_MAX || at > INT_MAX)
            return arl_errorf(ARL_ERR_RANGE,
                              "dist: alltoallv on '%s': %s rows exceed %d per "
                              "call (exchange fewer tokens per call)",
                              c->name, what, INT_MAX);
        cnt[r] = (int)rows[r];
        dsp[r] = (int)at;
        at += rows[r];
    }
    return ARL_OK;
}

arl_status arl_dist_alltoallv_f32(arl_dist_comm *c, const float *send, const int64_t *send_rows,
                                  float *recv, const int64_t *recv_rows, int64_t width) {
    ARL_ASSERT(c && send_rows && recv_rows && width >= 0 && width <= INT_MAX);
    if (c->size == 1) {
        if (send_rows[0] != recv_rows[0])
            return arl_errorf(ARL_ERR_PROTOCOL,
                              "dist: alltoallv on '%s': sending %lld rows to "
                              "itself but expecting %lld",
                              c->name, (long long)send_rows[0], (long long)recv_rows[0]);
        if (send_rows[0] > 0 && width > 0)
            memcpy(recv, send, sizeof(float) * (size_t)(send_rows[0] * width));
        return ARL_OK;
    }
    if (width == 0) return ARL_OK;
    ARL_TRY(row_counts(c, send_rows, c->cnt_a, c->dsp_a, "send"));
    ARL_TRY(row_counts(c, recv_rows, c->cnt_b, c->dsp_b, "receive"));
    if (c->row_width != width) {
        if (c->row_width) MPI_Type_free(&c->row_type);
        c->row_width = 0;
        MPI_TRY(MPI_Type_contiguous((int)width, MPI_FLOAT, &c->row_type), c);
        MPI_TRY(MPI_Type_commit(&c->row_type), c);
        c->row_width = width;
    }
    MPI_TRY(MPI_Alltoallv(send, c->cnt_a, c->dsp_a, c->row_type, recv, c->cnt_b, c->dsp_b,
                          c->row_type, c->comm),
            c);
    return ARL_OK;
}
