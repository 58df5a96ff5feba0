/* learner/ep.c: expert-parallel dispatch and combine (see learner/ep.h).
 *
 * Send side: slot s = t*k + j (token t, slot j) goes to expert routes[s]; the packed send
 * buffer orders rows by expert, then token (a counting sort), so the rows for rank r (experts
 * [lo_r, lo_{r+1})) are one contiguous run.  pos[s] is the packed row of slot s.
 * Receive side: rows arrive ordered by source rank, then expert, then token; recv_to_grp maps
 * each to its row in the grouped layout (expert, then source rank, then token). */
#include "learner/ep.h"

#include <stdlib.h>
#include <string.h>

#include "core/assert.h"

struct arl_ep_plan {
    arl_dist_comm *comm;
    int32_t R, rank;
    int64_t E, k, width;
    int64_t El_max;     /* ceil(E / R): experts per rank, padded, in the count exchange */
    int64_t e_lo, e_hi; /* this rank's experts */
    /* last build */
    int64_t T;
    int64_t n_recv;
    int64_t *load;        /* (E) rows this rank sends to each expert */
    int64_t *fill;        /* (E) counting-sort cursors */
    int64_t *send_rows;   /* (R) */
    int64_t *recv_rows;   /* (R) */
    int64_t *cnt_send;    /* (R * El_max) per destination rank, per expert of that rank */
    int64_t *cnt_recv;    /* (R * El_max) per source rank, per local expert */
    int64_t *grp_start;   /* (El_max + 1) grouped row of each local expert */
    int64_t *pos;         /* (cap_slots) packed row of slot s */
    int64_t *recv_to_grp; /* (cap_recv) grouped row of received row i */
    float *pack;          /* (cap_slots, width) */
    float *recv;          /* (cap_recv, width) */
    float *gin, *gout;    /* (cap_recv, width) arl_ep_apply's grouped buffers */
    float *slot_tmp;      /* (cap_slots, width) arl_ep_apply's slots when the caller has none */
    int64_t cap_slots, cap_recv;
};

int64_t arl_ep_expert_lo(int64_t E, int32_t R, int32_t r) {
    ARL_ASSERT(R >= 1 && r >= 0 && r <= R);
    int64_t q = E / R, rem = E % R;
    return (int64_t)r * q + (r < rem ? r : rem);
}

int32_t arl_ep_expert_owner(int64_t E, int32_t R, int64_t e) {
    ARL_ASSERT(e >= 0 && e < E);
    int64_t q = E / R, rem = E % R;
    /* the first rem ranks own q + 1 experts each */
    if (e < rem * (q + 1)) return (int32_t)(e / (q + 1));
    return (int32_t)(rem + (e - rem * (q + 1)) / q);
}

arl_status arl_ep_plan_init(arl_ep_plan **out, arl_dist_comm *comm, int64_t E, int64_t k,
                            int64_t width) {
    ARL_ASSERT(out && comm);
    *out = NULL;
    if (E < 1 || k < 1 || k > E || width < 1)
        return arl_errorf(ARL_ERR_ARG,
                          "ep: plan needs E >= 1, 1 <= k <= E and width >= 1 (got E %lld, k %lld, "
                          "width %lld)",
                          (long long)E, (long long)k, (long long)width);
    arl_ep_plan *p = calloc(1, sizeof *p);
    if (!p) return arl_errorf(ARL_ERR_NOMEM, "ep: out of memory");
    p->comm = comm;
    p->R = arl_dist_comm_size(comm);
    p->rank = arl_dist_comm_rank(comm);
    p->E = E;
    p->k = k;
    p->width = width;
    p->El_max = (E + p->R - 1) / p->R;
    p->e_lo = arl_ep_expert_lo(E, p->R, p->rank);
    p->e_hi = arl_ep_expert_lo(E, p->R, p->rank + 1);
    const size_t R = (size_t)p->R, Em = (size_t)p->El_max;
    p->load = calloc((size_t)E, sizeof(int64_t));
    p->fill = calloc((size_t)E, sizeof(int64_t));
    p->send_rows = calloc(R, sizeof(int64_t));
    p->recv_rows = calloc(R, sizeof(int64_t));
    p->cnt_send = calloc(R * Em, sizeof(int64_t));
    p->cnt_recv = calloc(R * Em, sizeof(int64_t));
    p->grp_start = calloc(Em + 1, sizeof(int64_t));
    if (!p->load || !p->fill || !p->send_rows || !p->recv_rows || !p->cnt_send || !p->cnt_recv ||
        !p->grp_start) {
        arl_ep_plan_free(p);
        return arl_errorf(ARL_ERR_NOMEM,
                          "ep: out of memory for a plan of %lld experts over %d "
                          "ranks",
                          (long long)E, p->R);
    }
    *out = p;
    return ARL_OK;
}

void arl_ep_plan_free(arl_ep_plan *p) {
    if (!p) return;
    free(p->load);
    free(p->fill);
    free(p->send_rows);
    free(p->recv_rows);
    free(p->cnt_send);
    free(p->cnt_recv);
    free(p->grp_start);
    free(p->pos);
    free(p->recv_to_grp);
    free(p->pack);
    free(p->recv);
    free(p->gin);
    free(p->gout);
    free(p->slot_tmp);
    free(p);
}

/* Grow *buf to n elements of esz bytes (contents not kept). */
static int grow(void **buf, int64_t n, size_t esz) {
    void *q = realloc(*buf, (size_t)(n > 0 ? n : 1) * esz);
    if (!q) return 0;
    *buf = q;
    return 1;
}

static arl_status reserve(arl_ep_plan *p, int64_t slots, int64_t recv) {
    const size_t rowb = sizeof(float) * (size_t)p->width;
    if (slots > p->cap_slots) {
        if (!grow((void **)&p->pos, slots, sizeof(int64_t)) ||
            !grow((void **)&p->pack, slots, rowb) || !grow((void **)&p->slot_tmp, slots, rowb))
            return arl_errorf(ARL_ERR_NOMEM, "ep: out of memory for %lld token slots of width %lld",
                              (long long)slots, (long long)p->width);
        p->cap_slots = slots;
    }
    if (recv > p->cap_recv) {
        if (!grow((void **)&p->recv_to_grp, recv, sizeof(int64_t)) ||
            !grow((void **)&p->recv, recv, rowb) || !grow((void **)&p->gin, recv, rowb) ||
            !grow((void **)&p->gout, recv, rowb))
            return arl_errorf(ARL_ERR_NOMEM,
                              "ep: out of memory for %lld received rows of width "
                              "%lld",
                              (long long)recv, (long long)p->width);
        p->cap_recv = recv;
    }
    return ARL_OK;
}

arl_status arl_ep_plan_build(arl_ep_plan *p, const int32_t *routes, int64_t T) {
    ARL_ASSERT(p && T >= 0 && (routes || T == 0));
    const int64_t E = p->E, k = p->k, Em = p->El_max, Tk = T * k;
    const int32_t R = p->R;
    p->T = 0;
    p->n_recv = 0;

    /* validate (a bad route is reported to every rank through a -1 count, below) */
    int64_t bad = -1;
    for (int64_t s = 0; s < Tk && bad < 0; s++)
        if (routes[s] < 0 || routes[s] >= E) bad = s;
    arl_status st = bad < 0 ? reserve(p, Tk, 0) : ARL_OK;
    const int invalid = bad >= 0 || st != ARL_OK;

    /* count rows per expert, then per destination rank and expert of that rank */
    memset(p->load, 0, sizeof(int64_t) * (size_t)E);
    memset(p->cnt_send, 0, sizeof(int64_t) * (size_t)(R * Em));
    if (!invalid) {
        for (int64_t s = 0; s < Tk; s++)
            p->load[routes[s]]++;
        for (int32_t r = 0; r < R; r++) {
            int64_t lo = arl_ep_expert_lo(E, R, r), hi = arl_ep_expert_lo(E, R, r + 1);
            p->send_rows[r] = 0;
            for (int64_t e = lo; e < hi; e++) {
                p->cnt_send[r * Em + (e - lo)] = p->load[e];
                p->send_rows[r] += p->load[e];
            }
        }
    } else {
        for (int64_t i = 0; i < R * Em; i++)
            p->cnt_send[i] = -1;
    }
    ARL_TRY(arl_dist_alltoall_i64(p->comm, p->cnt_send, p->cnt_recv, Em));
    if (bad >= 0)
        return arl_errorf(ARL_ERR_RANGE,
                          "ep: token %lld slot %lld routes to expert %d, outside "
                          "[0, %lld)",
                          (long long)(bad / k), (long long)(bad % k), routes[bad], (long long)E);
    if (st != ARL_OK) return st;
    for (int32_t s = 0; s < R; s++)
        if (p->cnt_recv[s * Em] < 0)
            return arl_errorf(ARL_ERR_PROTOCOL,
                              "ep: rank %d of '%s' failed to build its routes "
                              "(see its error); this layer's exchange is cancelled",
                              s, arl_dist_comm_name(p->comm));

    /* packed send order: by expert, then token (slots of one token go to distinct experts) */
    int64_t at = 0;
    for (int64_t e = 0; e < E; e++) {
        p->fill[e] = at;
        at += p->load[e];
    }
    for (int64_t s = 0; s < Tk; s++)
        p->pos[s] = p->fill[routes[s]]++;

    /* receive side: rows per source, grouped layout starts per local expert */
    const int64_t El = p->e_hi - p->e_lo;
    int64_t n = 0;
    for (int32_t s = 0; s < R; s++) {
        p->recv_rows[s] = 0;
        for (int64_t l = 0; l < El; l++)
            p->recv_rows[s] += p->cnt_recv[s * Em + l];
        n += p->recv_rows[s];
    }
    ARL_TRY(reserve(p, Tk, n));
    p->grp_start[0] = 0;
    for (int64_t l = 0; l < El; l++) {
        int64_t c = 0;
        for (int32_t s = 0; s < R; s++)
            c += p->cnt_recv[s * Em + l];
        p->grp_start[l + 1] = p->grp_start[l] + c;
    }
    /* fill[l] walks expert l's grouped rows in source order */
    for (int64_t l = 0; l < El; l++)
        p->fill[l] = p->grp_start[l];
    int64_t ri = 0;
    for (int32_t s = 0; s < R; s++)
        for (int64_t l = 0; l < El; l++)
            for (int64_t i = 0; i < p->cnt_recv[s * Em + l]; i++)
                p->recv_to_grp[ri++] = p->fill[l]++;
    ARL_ASSERT(ri == n);
    p->T = T;
    p->n_recv = n;
    return ARL_OK;
}

void arl_ep_local_experts(const arl_ep_plan *p, int64_t *e_lo, int64_t *e_hi) {
    *e_lo = p->e_lo;
    *e_hi = p->e_hi;
}

int64_t arl_ep_recv_rows(const arl_ep_plan *p) {
    return p->n_recv;
}

void arl_ep_expert_rows(const arl_ep_plan *p, int64_t e, int64_t *row0, int64_t *n) {
    ARL_ASSERT(e >= p->e_lo && e < p->e_hi);
    int64_t l = e - p->e_lo;
    *row0 = p->grp_start[l];
    *n = p->grp_start[l + 1] - p->grp_start[l];
}

const int64_t *arl_ep_send_load(const arl_ep_plan *p) {
    return p->load;
}

arl_status arl_ep_dispatch(arl_ep_plan *p, const float *src, int32_t per_slot, float *grouped) {
    const int64_t w = p->width, k = p->k, Tk = p->T * p->k;
    const size_t rowb = sizeof(float) * (size_t)w;
    for (int64_t s = 0; s < Tk; s++)
        memcpy(p->pack + p->pos[s] * w, src + (per_slot ? s : s / k) * w, rowb);
    ARL_TRY(arl_dist_alltoallv_f32(p->comm, p->pack, p->send_rows, p->recv, p->recv_rows, w));
    for (int64_t i = 0; i < p->n_recv; i++)
        memcpy(grouped + p->recv_to_grp[i] * w, p->recv + i * w, rowb);
    return ARL_OK;
}

arl_status arl_ep_return(arl_ep_plan *p, const float *grouped, float *slots) {
    const int64_t w = p->width, Tk = p->T * p->k;
    const size_t rowb = sizeof(float) * (size_t)w;
    for (int64_t i = 0; i < p->n_recv; i++)
        memcpy(p->recv + i * w, grouped + p->recv_to_grp[i] * w, rowb);
    ARL_TRY(arl_dist_alltoallv_f32(p->comm, p->recv, p->recv_rows, p->pack, p->send_rows, w));
    for (int64_t s = 0; s < Tk; s++)
        memcpy(slots + s * w, p->pack + p->pos[s] * w, rowb);
    return ARL_OK;
}

void arl_ep_combine(float *u, const float *slots, const float *w, int64_t T, int64_t k,
                    int64_t width) {
    for (int64_t t = 0; t < T; t++) {
        float *ut = u + t * width;
        for (int64_t i = 0; i < width; i++)
            ut[i] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const float *yr = slots + (t * k + j) * width;
            if (w) {
                const float pj = w[t * k + j];
                for (int64_t i = 0; i < width; i++)
                    ut[i] += pj * yr[i];
            } else {
                for (int64_t i = 0; i < width; i++)
                    ut[i] += yr[i];
            }
        }
    }
}

arl_status arl_ep_apply(arl_ep_plan *p, const float *src, const float *w, arl_ep_expert_fn fn,
                        void *user, float *u, float *slots) {
    ARL_ASSERT(p && fn && u && (src || p->T == 0));
    ARL_TRY(arl_ep_dispatch(p, src, 0, p->gin));
    arl_status st = ARL_OK;
    for (int64_t e = p->e_lo; e < p->e_hi && st == ARL_OK; e++) {
        int64_t r0, n;
        arl_ep_expert_rows(p, e, &r0, &n);
        if (n == 0) continue;
        st = fn(user, e, n, p->gin + r0 * p->width, p->gout + r0 * p->width);
    }
    if (st != ARL_OK) /* keep the exchange matched; the results are discarded */
        memset(p->gout, 0, sizeof(float) * (size_t)(p->n_recv * p->width));
    float *sl = slots ? slots : p->slot_tmp;
    ARL_TRY(arl_ep_return(p, p->gout, sl));
    if (st != ARL_OK) return st;
    arl_ep_combine(u, sl, w, p->T, p->k, p->width);
    return ARL_OK;
}
