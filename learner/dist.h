/* learner/dist.h: the distribution layer of agentrl - MPI processes, their roles, and the
 * collectives the learner needs (deterministic gradient all-reduce, weight broadcast, integer
 * and scalar reductions, the all-to-all of expert parallelism).
 *
 * What this is: a thin layer over MPI (OpenMPI, a required dependency) that every build has.
 * Call sites never test for MPI: with one process (no mpirun, or mpirun -np 1) every function
 * does the single-process thing without communicating (an all-reduce returns its input, a
 * broadcast does nothing, an all-to-all copies).  What this is not: the learner loop, the
 * model's forward/backward, NCCL/GPU collectives, checkpoint shipping (weights reach rollout
 * workers either as checkpoints or through arl_dist_bcast_f32 here), the MoE token
 * dispatch/combine (learner/ep.h, built on arl_dist_alltoallv_f32).
 *
 * ---- Processes and roles (spec DESIGN.md section 5) ----
 * `mpirun -np N agentrl train x.json`: every rank calls arl_dist_init, reads the experiment,
 * then arl_dist_assign_roles with the experiment's dist-* options (arl_dist_options):
 *   dist-learners L     ranks 0..L-1 are learners, ranks L..N-1 rollout workers.
 *                       L = 0 (default) or L = N: every rank learns AND rolls out (colocated,
 *                       the one-process mode of DESIGN 5 replicated N times).
 *   dist-expert-parallel P  learners form groups of P consecutive learner ranks that shard the
 *                       experts (learner/ep.h); L must be a multiple of P.  P = 1: no sharding.
 * A learner with learner index l (= its world rank) is member ep_index = l % P of expert group
 * dp_index = l / P.  Communicators (arl_dist fields):
 *   world    all N ranks (weight broadcast from rank 0 = learner 0, barriers, shutdown);
 *   learners the L learners: all-reduce of dense-parameter gradients and of loss statistics;
 *   rollout  the rollout workers (every rank when colocated);
 *   ep       the P learners of this rank's expert group: the token all-to-all;
 *   dp       the L/P learners with the same ep_index (they hold the same expert shard): the
 *            all-reduce of expert-parameter gradients.  With P = 1, dp = learners.
 * A field is NULL on ranks without that role (e.g. learners/ep/dp on a rollout-only rank).
 *
 * ---- What is deterministic (the promise) ----
 * arl_dist_allreduce_f32 (SUM): on EVERY rank, element i of the result is
 *     (float)( ((double)x_0[i] + (double)x_1[i]) + ... + (double)x_{R-1}[i] )
 * - the left-to-right sum over the communicator's ranks 0..R-1 in double, rounded once to
 * float - where x_r is rank r's input.  It does not depend on MPI's reduction algorithm, on
 * the message sizes, on dist-reduce-block, on timing or on the element's position, and it is
 * bit-identical on all ranks and from run to run.  For R = 1 it is the input, unchanged.
 * Implementation: the buffer is reduced in rounds of at most dist-reduce-block floats; each
 * round is cut into R chunks, chunk c is sent to rank c (an all-to-all), rank c sums its
 * chunk in the order above, and the summed chunks are gathered by all (a reduce-scatter plus
 * an all-gather, the data volume of a ring all-reduce).  Small buffers (n*R <= 4096) use
 * one all-gather and every rank sums all inputs in the same order: the same function.
 * arl_dist_allreduce_f64 (SUM): the same left-to-right order over ranks, in double.
 * MAX/MIN and every int64 reduction are exact, hence order-free (int64 SUM overflow beyond
 * 2^63 is not detected; QB histogram counts are far below it).
 * Consequences: data-parallel training with a fixed number of learners is bit-reproducible;
 * with a different number of learners (or one process with the same global batch) the
 * parameters agree only to float rounding of the partial sums (tests/dist/test_dist.c,
 * case dp, states the bound).  Broadcast and all-to-all move bits unchanged.
 *
 * ---- Expert parallelism ----
 * E experts are split over the P ranks of `ep` in contiguous blocks (learner/ep.h).  The
 * all-to-all carries d_z-wide latent rows (spec/policy.md 7.2): forward, z = W_down x per
 * (token, slot) to the expert's rank and E_i(z) back; backward, the weighted latent gradient
 * p_i du to the expert and dz back.  Full-width rows never cross ranks.
 *
 * Errors: functions return ARL_OK or a status with a message (arl_error_msg).  A failed MPI
 * call gives ARL_ERR_NET naming the call and the communicator.  A collective that fails on one
 * rank may leave the others waiting: treat any error from a collective as fatal and call
 * arl_dist_abort (main decides).  Threads: call from one thread at a time (MPI is initialised
 * with MPI_THREAD_FUNNELED; call from the thread that called arl_dist_init).
 *
 * Symbols: N world size, R ranks of a communicator, n elements, m elements per rank.
 */
#ifndef ARL_LEARNER_DIST_H
#define ARL_LEARNER_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "core/options.h"
#include "core/status.h"

/* ---- options (part of the experiment's table) ---- */

typedef struct arl_dist_opts {
    int64_t learners;        /* dist-learners: learner ranks; 0 = all (colocated) */
    int64_t expert_parallel; /* dist-expert-parallel: learners per expert group */
    int64_t reduce_block;    /* dist-reduce-block: floats per all-reduce round */
} arl_dist_opts;

extern const arl_option arl_dist_options[];
extern const size_t arl_dist_options_count;

/* Defaults of the table: learners 0, expert_parallel 1, reduce_block 4194304. */
void arl_dist_opts_default(arl_dist_opts *o);

/* ---- role layout (pure: no MPI; computed identically on every rank) ---- */

enum {
    ARL_DIST_ROLE_LEARNER = 1u << 0,
    ARL_DIST_ROLE_ROLLOUT = 1u << 1,
};

typedef struct arl_dist_layout {
    int32_t world_size, world_rank;
    int32_t n_learners, n_rollout; /* n_rollout = world_size when colocated */
    int32_t colocated;             /* 1: every rank has both roles */
    uint32_t roles;                /* ARL_DIST_ROLE_* of this rank */
    int32_t ep_size;               /* P */
    int32_t learner_index;         /* 0..L-1, or -1 */
    int32_t ep_index;              /* learner_index % P, or -1 */
    int32_t dp_index;              /* learner_index / P (expert group), or -1 */
    int32_t rollout_index;         /* 0..n_rollout-1, or -1 */
} arl_dist_layout;

/* Roles of world_rank among world_size ranks.  ARL_ERR_CONFIG naming the option when
 * dist-learners > world_size or the learner count is not a multiple of
 * dist-expert-parallel, with what to change. */
arl_status arl_dist_layout_make(arl_dist_layout *L, const arl_dist_opts *o, int32_t world_size,
                                int32_t world_rank);

/* ---- communicators ---- */

/* A group of ranks (an MPI communicator plus scratch).  Opaque; owned by its arl_dist. */
typedef struct arl_dist_comm arl_dist_comm;

/* The process's view of the job.  The communicators are owned by the arl_dist and valid until
 * arl_dist_finalize; read the fields, do not change them. */
typedef struct arl_dist {
    arl_dist_layout layout; /* after arl_dist_assign_roles; before: the defaults (colocated) */
    arl_dist_comm *world;   /* always set */
    arl_dist_comm *learners, *rollout, *ep, *dp; /* NULL without the role; see the header */
    int32_t owns_mpi;     /* 1: arl_dist_init called MPI_Init, finalize calls MPI_Finalize */
    int64_t reduce_block; /* dist-reduce-block in effect (floats) */
} arl_dist;

/* Initialise MPI (unless the program already did) and the world communicator (a duplicate
 * of MPI_COMM_WORLD, so that our messages never match the program's own).  argc/argv may be
 * NULL.  Works without mpirun (OpenMPI singleton: one rank).  Collective over the world.
 * *out is owned by the caller, freed with arl_dist_finalize.  Several arl_dist may coexist
 * (only the first one initialises and later finalizes MPI).  Before arl_dist_assign_roles
 * the layout is the default (every rank learns and rolls out) and learners = rollout = ep =
 * dp = NULL.  Errors: ARL_ERR_NET (MPI_Init failed), ARL_ERR_STATE (MPI already finalized),
 * ARL_ERR_NOMEM. */
arl_status arl_dist_init(arl_dist **out, int *argc, char ***argv);

/* Collective over the world: validate o (arl_dist_layout_make), split the world into the
 * communicators above.  Call once.  ARL_ERR_CONFIG (bad options; every rank gets the same
 * verdict, nothing is split), ARL_ERR_STATE (called twice), ARL_ERR_NET. */
arl_status arl_dist_assign_roles(arl_dist *d, const arl_dist_opts *o);

/* Free the communicators; MPI_Finalize if arl_dist_init initialised MPI.  Collective over the
 * world when N > 1.  NULL is a no-op. */
void arl_dist_finalize(arl_dist *d);

/* Stop every rank (MPI_Abort on the world) with exit status code when N > 1; returns (does
 * nothing) when N == 1, so that main exits by itself.  For main only, after an error. */
void arl_dist_abort(arl_dist *d, int code);

int32_t arl_dist_comm_rank(const arl_dist_comm *c);
int32_t arl_dist_comm_size(const arl_dist_comm *c);
/* "world", "learners", "rollout", "ep", "dp" (for messages).  Never NULL. */
const char *arl_dist_comm_name(const arl_dist_comm *c);

/* ---- collectives: every rank of c calls them with matching arguments ---- */

arl_status arl_dist_barrier(arl_dist_comm *c);

/* buf (n) from rank root to all ranks of c (e.g. a parameter arena to the rollout workers:
 * arl_dist_bcast_f32(d->world, params.arena, inv.arena_floats, 0)).  Any n >= 0. */
arl_status arl_dist_bcast_f32(arl_dist_comm *c, float *buf, int64_t n, int32_t root);
/* buf (n bytes) from root; n must be the same on all ranks. */
arl_status arl_dist_bcast_bytes(arl_dist_comm *c, void *buf, int64_t n, int32_t root);
/* A message whose length only root knows: root passes *buf (*n bytes; both unchanged).  On
 * the other ranks *n becomes the length and *buf a malloc'd copy (never NULL on success, even
 * for 0 bytes; the caller frees it with free; the old *buf is not freed). */
arl_status arl_dist_bcast_msg(arl_dist_comm *c, void **buf, int64_t *n, int32_t root);

typedef enum arl_dist_op {
    ARL_DIST_SUM = 0,
    ARL_DIST_MAX = 1,
    ARL_DIST_MIN = 2,
} arl_dist_op;

/* In place: buf (n) becomes the deterministic SUM over the ranks of c (header: "What is
 * deterministic").  Scratch: up to (dist-reduce-block + R) doubles per communicator,
 * allocated at the first call and kept (no allocation in later calls of no larger size). */
arl_status arl_dist_allreduce_f32(arl_dist_comm *c, float *buf, int64_t n);
/* In place, double: SUM in rank order (deterministic as above), MAX or MIN (exact). */
arl_status arl_dist_allreduce_f64(arl_dist_comm *c, double *buf, int64_t n, arl_dist_op op);
/* In place, int64: SUM/MAX/MIN (exact).  For the QB histogram (spec/policy.md 9.3). */
arl_status arl_dist_allreduce_i64(arl_dist_comm *c, int64_t *buf, int64_t n, arl_dist_op op);

/* all (R*m) = the m values of every rank, rank order.  mine (m) may not alias all. */
arl_status arl_dist_allgather_i64(arl_dist_comm *c, const int64_t *mine, int64_t *all, int64_t m);
/* Personalised exchange of m int64 per pair: send (R*m), block r to rank r; recv (R*m), block
 * s from rank s. */
arl_status arl_dist_alltoall_i64(arl_dist_comm *c, const int64_t *send, int64_t *recv, int64_t m);
/* Personalised exchange of float rows of `width` floats: send holds send_rows[0] rows for rank
 * 0, then send_rows[1] rows for rank 1, ...; recv receives recv_rows[s] rows from rank s in
 * rank order.  send_rows, recv_rows (R); the counts must match pairwise (rank a's
 * send_rows[b] == rank b's recv_rows[a]; learner/ep.c exchanges them first).  Rows arrive
 * bit-unchanged.  send and recv must not overlap.  Counts are in rows (an MPI row type), so
 * only the row count per pair must fit an int. */
arl_status arl_dist_alltoallv_f32(arl_dist_comm *c, const float *send, const int64_t *send_rows,
                                  float *recv, const int64_t *recv_rows, int64_t width);

#endif
