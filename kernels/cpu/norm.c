/* kernels/cpu/norm.c: RMSNorm and L2Norm of kernels/norm.h, row-parallel, double statistics. */
#include "kernels/norm.h"

#include <math.h>
#include <stddef.h>

#include "core/assert.h"
#include "kernels/cpu/internal.h"
#include "kernels/threadpool.h"

/* Columns of dw summed together by one task: a stack block of double accumulators. */
#define DW_BLOCK 256

typedef struct norm_args {
    float *y, *stat, *dx, *dw;
    const float *x, *w, *dy, *rstat;
    int64_t n, d;
    float eps;
} norm_args;

static double sum_squares(const float *x, int64_t d) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; i++)
        ss += (double)x[i] * x[i];
    return ss;
}

/* ---- RMSNorm ---- */

static void rmsnorm_fwd_rows(void *vctx, int64_t begin, int64_t end) {
    const norm_args *a = vctx;
    int64_t d = a->d;
    for (int64_t t = begin; t < end; t++) {
        const float *x = a->x + t * d;
        float *y = a->y + t * d;
        float r = (float)(1.0 / sqrt(sum_squares(x, d) / (double)d + (double)a->eps));
        for (int64_t i = 0; i < d; i++)
            y[i] = a->w[i] * (x[i] * r);
        if (a->stat) a->stat[t] = r;
    }
}

void arl_k_rmsnorm_fwd(float *y, float *rstd, const float *x, const float *w, int64_t n, int64_t d,
                       float eps) {
    ARL_ASSERT(n >= 0 && d >= 1);
    norm_args a = {.y = y, .stat = rstd, .x = x, .w = w, .n = n, .d = d, .eps = eps};
    arl_k_parallel_for(n, arl_k_row_grain(d), rmsnorm_fwd_rows, &a);
}

static void rmsnorm_bwd_rows(void *vctx, int64_t begin, int64_t end) {
    const norm_args *a = vctx;
    int64_t d = a->d;
    for (int64_t t = begin; t < end; t++) {
        const float *x = a->x + t * d, *dy = a->dy + t * d;
        float *dx = a->dx + t * d;
        double r = a->rstat[t];
        double s = 0.0;
        for (int64_t i = 0; i < d; i++)
            s += (double)a->w[i] * dy[i] * x[i];
        double c = r * r * r * s / (double)d;
        for (int64_t i = 0; i < d; i++)
            dx[i] += (float)(r * a->w[i] * dy[i] - c * x[i]);
    }
}

/* dw[j] += sum_t dy[t,j] x[t,j] r_t for the columns of blocks [begin, end), rows in order. */
static void rmsnorm_bwd_dw_blocks(void *vctx, int64_t begin, int64_t end) {
    const norm_args *a = vctx;
    int64_t d = a->d;
    double acc[DW_BLOCK];
    for (int64_t blk = begin; blk < end; blk++) {
        int64_t j0 = blk * DW_BLOCK, j1 = j0 + DW_BLOCK < d ? j0 + DW_BLOCK : d;
        for (int64_t j = j0; j < j1; j++)
            acc[j - j0] = 0.0;
        for (int64_t t = 0; t < a->n; t++) {
            const float *x = a->x + t * d, *dy = a->dy + t * d;
            double r = a->rstat[t];
            for (int64_t j = j0; j < j1; j++)
                acc[j - j0] += (double)dy[j] * x[j] * r;
        }
        for (int64_t j = j0; j < j1; j++)
            a->dw[j] += (float)acc[j - j0];
    }
}

/* Narrow rows (d <= DW_SPLIT_D, one or two column blocks, as the small models' d): the rows
 * are cut into DW_CHUNKS fixed chunks (chunk c: rows [c*n/DW_CHUNKS, (c+1)*n/DW_CHUNKS), a split
 * that depends on n only, never on the thread count); each chunk sums its rows in order into
 * its own double partial, and the partials are added in chunk order on the caller.  So dw is
 * bit-identical for any thread count, and the rows no longer run on one thread. */
#define DW_SPLIT_D 512
#define DW_CHUNKS 8

typedef struct dw_split_args {
    const norm_args *a;
    double (*part)[DW_SPLIT_D]; /* (DW_CHUNKS, d) */
} dw_split_args;

static void rmsnorm_bwd_dw_chunks(void *vctx, int64_t c0, int64_t c1) {
    const dw_split_args *s = vctx;
    const norm_args *a = s->a;
    const int64_t d = a->d;
    for (int64_t c = c0; c < c1; c++) {
        double *acc = s->part[c];
        for (int64_t j = 0; j < d; j++)
            acc[j] = 0.0;
        const int64_t t0 = c * a->n / DW_CHUNKS, t1 = (c + 1) * a->n / DW_CHUNKS;
        for (int64_t t = t0; t < t1; t++) {
            const float *x = a->x + t * d, *dy = a->dy + t * d;
            double r = a->rstat[t];
            for (int64_t j = 0; j < d; j++)
                acc[j] += (double)dy[j] * x[j] * r;
        }
    }
}

void arl_k_rmsnorm_bwd(float *dx, float *dw, const float *dy, const float *x, const float *w,
                       const float *rstd, int64_t n, int64_t d) {
    ARL_ASSERT(n >= 0 && d >= 1);
    norm_args a = {.dx = dx, .dw = dw, .x = x, .w = w, .dy = dy, .rstat = rstd, .n = n, .d = d};
    arl_k_parallel_for(n, arl_k_row_grain(d), rmsnorm_bwd_rows, &a);
    if (dw && n > 0 && d <= DW_SPLIT_D) {
        double part[DW_CHUNKS][DW_SPLIT_D];
        dw_split_args s = {&a, part};
        arl_k_parallel_for(DW_CHUNKS, arl_k_grain_items(n * d / DW_CHUNKS + 1, ARL_K_GRAIN),
                           rmsnorm_bwd_dw_chunks, &s);
        for (int64_t j = 0; j < d; j++) {
            double acc = 0.0;
            for (int64_t c = 0; c < DW_CHUNKS; c++)
                acc += part[c][j];
            dw[j] += (float)acc;
        }
    } else if (dw && n > 0) {
        int64_t blocks = (d + DW_BLOCK - 1) / DW_BLOCK;
        arl_k_parallel_for(blocks, arl_k_grain_items(n * DW_BLOCK, ARL_K_GRAIN),
                           rmsnorm_bwd_dw_blocks, &a);
    }
}

/* ---- L2Norm ---- */

static void l2norm_fwd_rows(void *vctx, int64_t begin, int64_t end) {
    const norm_args *a = vctx;
    int64_t d = a->d;
    for (int64_t t = begin; t < end; t++) {
        const float *x = a->x + t * d;
        float *y = a->y + t * d;
        float r = (float)(1.0 / sqrt(sum_squares(x, d) + (double)a->eps));
        for (int64_t i = 0; i < d; i++)
            y[i] = x[i] * r;
        if (a->stat) a->stat[t] = r;
    }
}

void arl_k_l2norm_fwd(float *y, float *rnorm, const float *x, int64_t n, int64_t d, float eps) {
    ARL_ASSERT(n >= 0 && d >= 1);
    norm_args a = {.y = y, .stat = rnorm, .x = x, .n = n, .d = d, .eps = eps};
    arl_k_parallel_for(n, arl_k_row_grain(d), l2norm_fwd_rows, &a);
}

static void l2norm_bwd_rows(void *vctx, int64_t begin, int64_t end) {
    const norm_args *a = vctx;
    int64_t d = a->d;
    for (int64_t t = begin; t < end; t++) {
        const float *x = a->x + t * d, *dy = a->dy + t * d;
        float *dx = a->dx + t * d;
        double r = a->rstat[t];
        double s = 0.0;
        for (int64_t i = 0; i < d; i++)
            s += (double)x[i] * dy[i];
        double c = r * r * r * s;
        for (int64_t i = 0; i < d; i++)
            dx[i] += (float)(r * dy[i] - c * x[i]);
    }
}

void arl_k_l2norm_bwd(float *dx, const float *dy, const float *x, const float *rnorm, int64_t n,
                      int64_t d) {
    ARL_ASSERT(n >= 0 && d >= 1);
    norm_args a = {.dx = dx, .x = x, .dy = dy, .rstat = rnorm, .n = n, .d = d};
    arl_k_parallel_for(n, arl_k_row_grain(d), l2norm_bwd_rows, &a);
}
