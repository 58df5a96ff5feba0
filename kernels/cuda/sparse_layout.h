/* kernels/cuda/sparse_layout.h: the work-buffer layout of block-sparse MLA training on the
 * device (kernels/cuda/sparse.cu arl_cuda_mla_sparse_fwd_save / _bwd), plain C so that the
 * build without CUDA answers arl_cuda_mla_sparse_train_ws_floats with the same arithmetic
 * (kernels/cuda/stub/sparse_stub.c: the learner sizes its GPU arena before it looks for a GPU).
 * Offsets in floats from the buffer's start, each 16-float aligned. */
#ifndef ARL_KERNELS_CUDA_SPARSE_LAYOUT_H
#define ARL_KERNELS_CUDA_SPARSE_LAYOUT_H

#include <stdint.h>

#define ARL_SPT_FWD_PAIRS (1 << 14)  /* forward: (query, head) pairs per launch */
#define ARL_SPT_BWD_FLOATS (1 << 24) /* backward: floats of P (and of dZ) per query block */
#define ARL_SPT_QB_MAX 64            /* backward: queries per block at most */
#define ARL_SPT_WINDOW 4096          /* backward: chunks a window of the entries' sort at most */

/* The counting sort's segment table (kernels/cuda/sort.cu arl_csort_seg_ints) for n entries and
 * E keys at most: its segments hold 256 entries at least. */
static inline int64_t arl_spt_seg_ints(int64_t n, int64_t E) {
    return E * ((n + 255) / 256);
}

/* Queries per forward launch. */
static inline int64_t arl_spt_fwd_queries(int64_t Hm) {
    return ARL_SPT_FWD_PAIRS / Hm > 0 ? ARL_SPT_FWD_PAIRS / Hm : 1;
}

/* Queries per backward block: P and dZ of every (query, head) pair over its (k_c + 1) n_c
 * entries (the k_c listed chunks, then the own chunk) fit ARL_SPT_BWD_FLOATS each. */
static inline int64_t arl_spt_bwd_queries(int64_t Hm, int64_t n_c, int64_t k_c) {
    int64_t q = ARL_SPT_BWD_FLOATS / (Hm * (k_c + 1) * n_c);
    return q < 1 ? 1 : q > ARL_SPT_QB_MAX ? ARL_SPT_QB_MAX : q;
}

typedef struct arl_spt_layout {
    int64_t means;                 /* (S / n_c + 1, R) the chunk summaries */
    int64_t sig;                   /* forward: (forward queries Hm, S / n_c + 1) */
    int64_t P, dZ;                 /* backward: (backward queries Hm, (k_c + 1) n_c) each */
    int64_t cnt, off, used, nused; /* int32: (W + 1), (W + 1), (W), (1); W the window's chunks */
    int64_t key, ent;              /* int32 (backward queries Hm (k_c + 1)) each */
    int64_t seg;                   /* int32: the sort's segment table */
    int64_t floats;                /* the whole buffer */
} arl_spt_layout;

static inline int64_t arl_spt_take(int64_t *at, int64_t n) {
    const int64_t p = *at;
    *at += (n + 15) & ~(int64_t)15;
    return p;
}

/* The layout for at most Tq_max queries over at most S rows of width R. */
static inline void arl_spt_layout_make(arl_spt_layout *b, int64_t Tq_max, int64_t S, int64_t Hm,
                                       int64_t R, int64_t n_c, int64_t k_c) {
    const int64_t J = S / n_c + 1;
    const int64_t fq = arl_spt_fwd_queries(Hm) < Tq_max ? arl_spt_fwd_queries(Hm) : Tq_max;
    const int64_t bq =
        arl_spt_bwd_queries(Hm, n_c, k_c) < Tq_max ? arl_spt_bwd_queries(Hm, n_c, k_c) : Tq_max;
    int64_t at = 0;
    b->means = arl_spt_take(&at, J * R);
    const int64_t after = at;
    b->sig = arl_spt_take(&at, fq * Hm * J);
    const int64_t fwd_end = at;
    at = after;
    b->P = arl_spt_take(&at, bq * Hm * (k_c + 1) * n_c);
    b->dZ = arl_spt_take(&at, bq * Hm * (k_c + 1) * n_c);
    const int64_t W = J < ARL_SPT_WINDOW ? J : ARL_SPT_WINDOW, n = bq * Hm * (k_c + 1);
    b->cnt = arl_spt_take(&at, W + 1);
    b->off = arl_spt_take(&at, W + 1);
    b->used = arl_spt_take(&at, W);
    b->nused = arl_spt_take(&at, 1);
    b->key = arl_spt_take(&at, n);
    b->ent = arl_spt_take(&at, n);
    b->seg = arl_spt_take(&at, arl_spt_seg_ints(n, W));
    b->floats = fwd_end > at ? fwd_end : at;
}

#endif
