/* policy/kda.c: Kimi Delta Attention stages and core on the CPU, fp32 (see policy/kda.h).
 *
 * Written to be read next to spec/policy.md section 3: each function follows the numbered
 * steps of its section.  Heads are independent in every stage of the core, so the core runs
 * one head per pool task (when a head has enough work to be worth a thread); each task has its
 * own slice of the caller's work buffer, and every value is computed in a fixed order, so
 * results do not depend on the thread count.
 *
 * Speed: exponentials, sigmoids and SiLU of the stages run on arrays through kernels/vmath.h;
 * the chunk form computes A_kk and A_qk as GEMMs over 16-token sub-chunks (chunk_pairs, spec
 * 3.5 "Factored form"), and the chunkwise backward its pair terms the same way
 * (chunk_pairs_bwd); the recurrent step walks the state row by row.  The short convolutions, the
 * K3 gate backward and the output-norm backward run over channels (or rows) in parallel, each
 * sum over tokens in ascending order, so no result depends on the thread count.  The recurrent
 * backward (the second reference) and the softplus gate keep libm.
 */
#include "policy/kda.h"

#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/gemm.h"
#include "kernels/threadpool.h"
#include "kernels/vmath.h"
#include "policy/docs.h"

static inline float sigm(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

static inline float softplusf_(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

/* ---------------------------------------------------------------------------------------
 * short convolution
 * --------------------------------------------------------------------------------------- */

typedef struct conv_fwd_args {
    float *z, *y;
    const float *x, *w, *tails;
    const int32_t *cu;
    int32_t N;
    int64_t T, C, W;
} conv_fwd_args;

/* Channels [c_lo, c_hi) of every token (channels are independent: any split, the same bits). */
static void conv_fwd_range(void *vctx, int64_t c_lo, int64_t c_hi) {
    const conv_fwd_args *A = vctx;
    const int64_t C = A->C, W = A->W;
    const float *x = A->x, *w = A->w;
    for (int32_t di = 0; di < A->N; di++) {
        int64_t a = arl_doc_lo(A->cu, di), b = arl_doc_hi(A->cu, di, A->T);
        const float *tail = A->tails ? A->tails + (int64_t)di * C * (W - 1) : NULL;
        for (int64_t t = a; t < b; t++) {
            int64_t pos = t - a;
            float *zt = A->z + t * C;
            if (pos >= W - 1) { /* all taps inside the document */
                const float *x0 = x + (t - (W - 1)) * C;
                for (int64_t c = c_lo; c < c_hi; c++) {
                    float acc = 0.0f;
                    for (int64_t j = 0; j < W; j++)
                        acc += w[c * W + j] * x0[j * C + c];
                    zt[c] = acc;
                }
            } else { /* early taps from the tail (or 0): tap by tap, each c in ascending j */
                for (int64_t c = c_lo; c < c_hi; c++)
                    zt[c] = 0.0f;
                for (int64_t j = 0; j < W; j++) {
                    int64_t src = pos - (W - 1) + j;
                    if (src >= 0) {
                        const float *xr = x + (a + src) * C;
                        for (int64_t c = c_lo; c < c_hi; c++)
                            zt[c] += w[c * W + j] * xr[c];
                    } else if (tail) {
                        const float *tc = tail + (W - 1 + src);
                        for (int64_t c = c_lo; c < c_hi; c++)
                            zt[c] += w[c * W + j] * tc[c * (W - 1)];
                    } else {
                        for (int64_t c = c_lo; c < c_hi; c++)
                            zt[c] += w[c * W + j] * 0.0f;
                    }
                }
            }
            if (A->y) memcpy(A->y + t * C + c_lo, zt + c_lo, sizeof(float) * (size_t)(c_hi - c_lo));
            arl_k_vsilu(zt + c_lo, zt + c_lo, c_hi - c_lo);
        }
    }
}

void arl_kda_conv_fwd(float *z, float *y, const float *x, const float *w, const float *tails,
                      const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W) {
    arl_docs_check(cu, N, T);
    ARL_ASSERT(W >= 1 && C >= 1);
    conv_fwd_args A = {z, y, x, w, tails, cu, N, T, C, W};
    arl_k_parallel_for(C, arl_k_work_grain(T * (2 * W + 8)), conv_fwd_range, &A);
}

/* Channels per block of the conv backward (stack rows of pre-activations and gradients), and
 * the floats of its stack copies of a block's taps (w and dw transposed to (W, block)). */
#define CONV_BLK 64
#define CONV_WBUF 1024

typedef struct conv_bwd_args {
    float *dx, *dw;
    const float *dz, *x, *w, *tails;
    const int32_t *cu;
    int32_t N;
    int64_t T, C, W;
} conv_bwd_args;

/* Channels [c0, c0 + nb) (nb <= CONV_BLK, nb * W <= CONV_WBUF), all tokens.  Inlined twice: with
 * nb = CONV_BLK a constant (full blocks: the compiler vectorises the channel loops) and with
 * nb variable; the same arithmetic per element either way. */
static inline __attribute__((always_inline)) void conv_bwd_block(const conv_bwd_args *A,
                                                                 int64_t c0, int64_t nb) {
    const int64_t C = A->C, W = A->W;
    const float *x = A->x;
    float wT[CONV_WBUF], dwT[CONV_WBUF]; /* (W, nb) */
    float y[CONV_BLK], s[CONV_BLK], dy[CONV_BLK];
    for (int64_t j = 0; j < W; j++)
        for (int64_t i = 0; i < nb; i++) {
            wT[j * nb + i] = A->w[(c0 + i) * W + j];
            dwT[j * nb + i] = A->dw ? A->dw[(c0 + i) * W + j] : 0.0f;
        }
    for (int32_t di = 0; di < A->N; di++) {
        int64_t a = arl_doc_lo(A->cu, di), b = arl_doc_hi(A->cu, di, A->T);
        const float *tail = A->tails ? A->tails + (int64_t)di * C * (W - 1) + c0 * (W - 1) : NULL;
        for (int64_t t = a; t < b; t++) {
            int64_t pos = t - a;
            /* y = the pre-activation, each channel in ascending taps as the forward */
            for (int64_t i = 0; i < nb; i++)
                y[i] = 0.0f;
            for (int64_t j = 0; j < W; j++) {
                int64_t src = pos - (W - 1) + j;
                const float *wj = wT + j * nb;
                if (src >= 0) {
                    const float *xr = x + (a + src) * C + c0;
                    for (int64_t i = 0; i < nb; i++)
                        y[i] += wj[i] * xr[i];
                } else if (tail) {
                    const float *tl = tail + (W - 1 + src);
                    for (int64_t i = 0; i < nb; i++)
                        y[i] += wj[i] * tl[i * (W - 1)];
                } else {
                    for (int64_t i = 0; i < nb; i++)
                        y[i] += wj[i] * 0.0f;
                }
            }
            /* dy = dz SiLU'(y) */
            arl_k_vsigmoid(s, y, nb);
            const float *dzt = A->dz + t * C + c0;
            for (int64_t i = 0; i < nb; i++)
                dy[i] = dzt[i] * s[i] * (1.0f + y[i] * (1.0f - s[i]));
            for (int64_t j = 0; j < W; j++) {
                int64_t src = pos - (W - 1) + j;
                const float *wj = wT + j * nb;
                float *dwj = dwT + j * nb;
                if (src >= 0) {
                    const float *xr = x + (a + src) * C + c0;
                    float *dxr = A->dx + (a + src) * C + c0;
                    for (int64_t i = 0; i < nb; i++) {
                        dxr[i] += wj[i] * dy[i];
                        dwj[i] += dy[i] * xr[i];
                    }
                } else if (tail) {
                    const float *tl = tail + (W - 1 + src);
                    for (int64_t i = 0; i < nb; i++)
                        dwj[i] += dy[i] * tl[i * (W - 1)];
                } else {
                    for (int64_t i = 0; i < nb; i++)
                        dwj[i] += dy[i] * 0.0f;
                }
            }
        }
    }
    if (A->dw)
        for (int64_t j = 0; j < W; j++)
            for (int64_t i = 0; i < nb; i++)
                A->dw[(c0 + i) * W + j] = dwT[j * nb + i];
}

/* Channels [c_lo, c_hi): everything of a channel lives in its own columns of dx and its own row
 * of dw, summed over the tokens in ascending order, so the split never changes a result. */
static void conv_bwd_range(void *vctx, int64_t c_lo, int64_t c_hi) {
    const conv_bwd_args *A = vctx;
    const int64_t blk = A->W * CONV_BLK <= CONV_WBUF ? CONV_BLK : CONV_WBUF / A->W;
    for (int64_t c0 = c_lo; c0 < c_hi; c0 += blk) {
        const int64_t nb = c_hi - c0 < blk ? c_hi - c0 : blk;
        if (nb == CONV_BLK)
            conv_bwd_block(A, c0, CONV_BLK);
        else
            conv_bwd_block(A, c0, nb);
    }
}

void arl_kda_conv_bwd(float *dx, float *dw, const float *dz, const float *x, const float *w,
                      const float *tails, const int32_t *cu, int32_t N, int64_t T, int64_t C,
                      int64_t W) {
    arl_docs_check(cu, N, T);
    ARL_ASSERT(W >= 1 && W <= CONV_WBUF && C >= 1);
    conv_bwd_args A = {dx, dw, dz, x, w, tails, cu, N, T, C, W};
    arl_k_parallel_for(C, arl_k_work_grain(T * (3 * W + 8)), conv_bwd_range, &A);
}

void arl_kda_conv_tail(float *tail_out, const float *x, int64_t n, const float *tail_in, int64_t C,
                       int64_t W) {
    /* element m of [tail_in; x] (length W-1+n); out[i] = element n+i.  Ascending i reads
     * index n+i >= i, so tail_out == tail_in is safe. */
    for (int64_t i = 0; i < W - 1; i++) {
        int64_t m = n + i;
        if (m >= W - 1) {
            const float *xr = x + (m - (W - 1)) * C;
            for (int64_t c = 0; c < C; c++)
                tail_out[c * (W - 1) + i] = xr[c];
        } else {
            for (int64_t c = 0; c < C; c++)
                tail_out[c * (W - 1) + i] = tail_in ? tail_in[c * (W - 1) + m] : 0.0f;
        }
    }
}

void arl_kda_conv_step(float *z, float *tail, const float *x, const float *w, int64_t C,
                       int64_t W) {
    for (int64_t c = 0; c < C; c++) {
        float *tl = tail + c * (W - 1);
        float acc = w[c * W + (W - 1)] * x[c];
        for (int64_t j = 0; j < W - 1; j++)
            acc += w[c * W + j] * tl[j];
        z[c] = acc;
        for (int64_t j = 0; j + 1 < W - 1; j++)
            tl[j] = tl[j + 1];
        if (W > 1) tl[W - 2] = x[c];
    }
    arl_k_vsilu(z, z, C);
}

/* ---------------------------------------------------------------------------------------
 * gates
 * --------------------------------------------------------------------------------------- */

void arl_kda_gate_k3_fwd(float *g, const float *f, const float *A_log, const float *dt_bias,
                         int64_t T, int64_t H, int64_t dk, float g_min) {
    int64_t P = H * dk;
    for (int64_t t = 0; t < T; t++) {
        float *gt = g + t * P;
        for (int64_t h = 0; h < H; h++) {
            float a = expf(A_log[h]);
            for (int64_t c = h * dk; c < (h + 1) * dk; c++)
                gt[c] = a * (f[t * P + c] + dt_bias[c]);
        }
        arl_k_vsigmoid(gt, gt, P);
        for (int64_t c = 0; c < P; c++)
            gt[c] = g_min * gt[c];
    }
}

/* Channels per parallel group of the K3 gate backward (per-channel double sums on the stack),
 * and per vector block inside a part. */
#define GATE_GRP 512
#define GATE_BLK 64

typedef struct gate_bwd_args {
    float *df;
    double *db, *dA; /* (GATE_GRP) per-channel sums over the tokens, indexed c - c_base */
    const float *dg, *f, *A_log, *dt_bias;
    int64_t T, P, dk, c_base;
    float g_min;
} gate_bwd_args;

/* Channels [c_base + lo, c_base + hi): each channel's sums run over the tokens in ascending
 * order, so the split never changes a result. */
static void gate_k3_bwd_range(void *vctx, int64_t lo, int64_t hi) {
    const gate_bwd_args *A = vctx;
    const int64_t P = A->P;
    float z[GATE_BLK], sg[GATE_BLK], a[GATE_BLK];
    for (int64_t b0 = lo; b0 < hi; b0 += GATE_BLK) {
        const int64_t nb = hi - b0 < GATE_BLK ? hi - b0 : GATE_BLK, c0 = A->c_base + b0;
        for (int64_t i = 0; i < nb; i++) {
            a[i] = expf(A->A_log[(c0 + i) / A->dk]);
            A->db[b0 + i] = 0.0, A->dA[b0 + i] = 0.0;
        }
        for (int64_t t = 0; t < A->T; t++) {
            const float *ft = A->f + t * P + c0, *dgt = A->dg + t * P + c0;
            for (int64_t i = 0; i < nb; i++)
                z[i] = a[i] * (ft[i] + A->dt_bias[c0 + i]);
            arl_k_vsigmoid(sg, z, nb);
            for (int64_t i = 0; i < nb; i++) {
                float dz = dgt[i] * A->g_min * sg[i] * (1.0f - sg[i]);
                float du = a[i] * dz;
                if (A->df) A->df[t * P + c0 + i] += du;
                A->db[b0 + i] += du;
                A->dA[b0 + i] += (double)dz * z[i];
            }
        }
    }
}

void arl_kda_gate_k3_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg, const float *f,
                         const float *A_log, const float *dt_bias, int64_t T, int64_t H, int64_t dk,
                         float g_min) {
    const int64_t P = H * dk;
    double db[GATE_GRP], dA[GATE_GRP];
    gate_bwd_args A = {df, db, dA, dg, f, A_log, dt_bias, T, P, dk, 0, g_min};
    double dA_head = 0.0; /* of the head of channel c, summed over its channels in order */
    for (int64_t c_base = 0; c_base < P; c_base += GATE_GRP) {
        const int64_t n = P - c_base < GATE_GRP ? P - c_base : GATE_GRP;
        A.c_base = c_base;
        arl_k_parallel_for(n, arl_k_work_grain(T * 16), gate_k3_bwd_range, &A);
        for (int64_t i = 0; i < n; i++) {
            int64_t c = c_base + i;
            if (ddt_bias) ddt_bias[c] += (float)db[i];
            dA_head += dA[i];
            if ((c + 1) % dk == 0) {
                if (dA_log) dA_log[c / dk] += (float)dA_head;
                dA_head = 0.0;
            }
        }
    }
}

void arl_kda_gate_softplus_fwd(float *g, const float *f, const float *A_log, const float *dt_bias,
                               int64_t T, int64_t H, int64_t dk) {
    int64_t P = H * dk;
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < H; h++) {
            float a = expf(A_log[h]);
            for (int64_t c = h * dk; c < (h + 1) * dk; c++)
                g[t * P + c] = -a * softplusf_(f[t * P + c] + dt_bias[c]);
        }
}

void arl_kda_gate_softplus_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg,
                               const float *f, const float *A_log, const float *dt_bias, int64_t T,
                               int64_t H, int64_t dk) {
    int64_t P = H * dk;
    for (int64_t h = 0; h < H; h++) {
        float a = expf(A_log[h]);
        double dA = 0.0;
        for (int64_t c = h * dk; c < (h + 1) * dk; c++) {
            double db = 0.0;
            for (int64_t t = 0; t < T; t++) {
                float u = f[t * P + c] + dt_bias[c];
                float d = dg[t * P + c];
                float du = -a * sigm(u) * d;
                if (df) df[t * P + c] += du;
                db += du;
                dA += (double)(-a * softplusf_(u)) * d; /* g * dg */
            }
            if (ddt_bias) ddt_bias[c] += (float)db;
        }
        if (dA_log) dA_log[h] += (float)dA;
    }
}

/* ---------------------------------------------------------------------------------------
 * gated output RMSNorm
 * --------------------------------------------------------------------------------------- */

typedef struct onorm_fwd_args {
    float *ob, *rstd;
    const float *o, *gam, *w;
    int64_t dv;
    float eps;
} onorm_fwd_args;

/* Rows [r0, r1) (each row on its own: any split, the same bits). */
static void onorm_fwd_rows(void *vctx, int64_t r0, int64_t r1) {
    const onorm_fwd_args *A = vctx;
    const int64_t dv = A->dv;
    for (int64_t t = r0; t < r1; t++) {
        const float *x = A->o + t * dv;
        double ss = 0.0;
        for (int64_t i = 0; i < dv; i++)
            ss += (double)x[i] * x[i];
        float r = (float)(1.0 / sqrt(ss / (double)dv + (double)A->eps));
        if (A->rstd) A->rstd[t] = r;
        float *obt = A->ob + t * dv;
        arl_k_vsigmoid(obt, A->gam + t * dv, dv);
        for (int64_t i = 0; i < dv; i++)
            obt[i] = A->w[i] * (x[i] * r) * obt[i];
    }
}

void arl_kda_onorm_fwd(float *ob, float *rstd, const float *o, const float *gam, const float *w,
                       int64_t n, int64_t dv, float eps) {
    onorm_fwd_args A = {ob, rstd, o, gam, w, dv, eps};
    arl_k_parallel_for(n, arl_k_work_grain(dv * 16), onorm_fwd_rows, &A);
}

/* Columns per block of the output-norm backward (a stack row of sigmoid(gam)). */
#define ONORM_BLK 128

typedef struct onorm_bwd_args {
    float *d_o, *dgam, *dw;
    const float *dob, *o, *gam, *w, *rstd;
    int64_t dv, n_rows;
} onorm_bwd_args;

/* Rows [r0, r1): d_o and dgam (each row on its own). */
static void onorm_bwd_rows(void *vctx, int64_t r0, int64_t r1) {
    const onorm_bwd_args *A = vctx;
    const int64_t dv = A->dv;
    const float *w = A->w;
    float sg[ONORM_BLK];
    for (int64_t t = r0; t < r1; t++) {
        const float *x = A->o + t * dv, *dy = A->dob + t * dv, *gm = A->gam + t * dv;
        float r = A->rstd[t];
        double m = 0.0; /* mean(dxh * xh), dxh = dob * w * sigmoid(gam) */
        for (int64_t i0 = 0; i0 < dv; i0 += ONORM_BLK) {
            const int64_t nb = dv - i0 < ONORM_BLK ? dv - i0 : ONORM_BLK;
            arl_k_vsigmoid(sg, gm + i0, nb);
            for (int64_t k = 0; k < nb; k++) {
                int64_t i = i0 + k;
                m += (double)dy[i] * w[i] * sg[k] * (x[i] * r);
            }
        }
        m /= (double)dv;
        for (int64_t i0 = 0; i0 < dv; i0 += ONORM_BLK) {
            const int64_t nb = dv - i0 < ONORM_BLK ? dv - i0 : ONORM_BLK;
            arl_k_vsigmoid(sg, gm + i0, nb);
            for (int64_t k = 0; k < nb; k++) {
                int64_t i = i0 + k;
                float xh = x[i] * r, dxh = dy[i] * w[i] * sg[k];
                A->d_o[t * dv + i] += r * (dxh - xh * (float)m);
                A->dgam[t * dv + i] += dy[i] * w[i] * xh * sg[k] * (1.0f - sg[k]);
            }
        }
    }
}

/* Columns [i_lo, i_hi) of dw, each summed over the rows in ascending order. */
static void onorm_bwd_dw_cols(void *vctx, int64_t i_lo, int64_t i_hi) {
    const onorm_bwd_args *A = vctx;
    const int64_t dv = A->dv;
    float sg[ONORM_BLK];
    for (int64_t i0 = i_lo; i0 < i_hi; i0 += ONORM_BLK) {
        const int64_t nb = i_hi - i0 < ONORM_BLK ? i_hi - i0 : ONORM_BLK;
        for (int64_t t = 0; t < A->n_rows; t++) {
            const float *x = A->o + t * dv, *dy = A->dob + t * dv;
            float r = A->rstd[t];
            arl_k_vsigmoid(sg, A->gam + t * dv + i0, nb);
            for (int64_t k = 0; k < nb; k++) {
                int64_t i = i0 + k;
                A->dw[i] += dy[i] * (x[i] * r) * sg[k];
            }
        }
    }
}

void arl_kda_onorm_bwd(float *d_o, float *dgam, float *dw, const float *dob, const float *o,
                       const float *gam, const float *w, const float *rstd, int64_t n, int64_t dv) {
    onorm_bwd_args A = {d_o, dgam, dw, dob, o, gam, w, rstd, dv, n};
    arl_k_parallel_for(n, arl_k_work_grain(dv * 24), onorm_bwd_rows, &A);
    if (dw) arl_k_parallel_for(dv, arl_k_work_grain(n * 12), onorm_bwd_dw_cols, &A);
}

/* ---------------------------------------------------------------------------------------
 * core: common pieces
 * --------------------------------------------------------------------------------------- */

int64_t arl_kda_num_chunks(const int32_t *cu, int32_t N, int64_t T, int64_t C) {
    ARL_ASSERT(C >= 1);
    int64_t n = 0;
    for (int32_t i = 0; i < N; i++) {
        int64_t len = arl_doc_hi(cu, i, T) - arl_doc_lo(cu, i);
        n += (len + C - 1) / C;
    }
    return n;
}

typedef struct core_args {
    float *o, *S, *chunk_states, *ws;
    float *dq, *dk, *dv, *dg, *dbeta, *dS0;
    const float *q, *k, *v, *g, *beta, *d_o, *dS_T, *cstates;
    const int32_t *cu;
    int32_t N;
    int64_t T, H, dk_, dv_, C, ws_head;
    float scale;
} core_args;

/* Stack buffers of recurrent_step: decay factors per block of channels, columns per block. */
#define REC_ROWS 64
#define REC_COLS 256

/* One recurrence step (spec 3.3) of one head on state St (dk, dv); o_out (dv) or NULL.
 * Columns of the state are independent, so it runs on blocks of up to REC_COLS columns, and
 * row-wise inside a block: pass 1 decays row c and adds its share to r = S^T k, pass 2 writes
 * row c and adds its share to o = S^T q.  Every r[j] and o[j] sums its rows in ascending c,
 * starting from 0, exactly as a column-by-column walk would. */
static void recurrent_step(float *St, float *o_out, const float *q, const float *k, const float *v,
                           const float *g, float beta, int64_t dk, int64_t dv, float scale) {
    float r[REC_COLS], a[REC_ROWS];
    for (int64_t j0 = 0; j0 < dv; j0 += REC_COLS) {
        const int64_t nj = dv - j0 < REC_COLS ? dv - j0 : REC_COLS;
        float *o = o_out ? o_out + j0 : NULL;
        for (int64_t j = 0; j < nj; j++)
            r[j] = 0.0f;
        for (int64_t c0 = 0; c0 < dk; c0 += REC_ROWS) {
            const int64_t nc = dk - c0 < REC_ROWS ? dk - c0 : REC_ROWS;
            arl_k_vexp(a, g + c0, nc);
            for (int64_t c = c0; c < c0 + nc; c++) {
                float *row = St + c * dv + j0;
                arl_k_vscale(row, a[c - c0], nj); /* 1. decay rows */
                arl_k_vaxpy(r, k[c], row, nj);    /* 2. prediction */
            }
        }
        for (int64_t j = 0; j < nj; j++)
            r[j] = beta * (v[j0 + j] - r[j]); /* 3. error delta */
        if (o)
            for (int64_t j = 0; j < nj; j++)
                o[j] = 0.0f;
        for (int64_t c = 0; c < dk; c++) {
            float *row = St + c * dv + j0;
            arl_k_vaxpy(row, k[c], r, nj);        /* 4. write */
            if (o) arl_k_vaxpy(o, q[c], row, nj); /* 5. read after the write */
        }
        if (o)
            for (int64_t j = 0; j < nj; j++)
                o[j] = scale * o[j];
    }
}

static void recurrent_fwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const core_args *A = vctx;
    int64_t H = A->H, dk = A->dk_, dv = A->dv_, C = A->C;
    for (int64_t h = h0; h < h1; h++) {
        int64_t chunk = 0;
        for (int32_t di = 0; di < A->N; di++) {
            int64_t a = arl_doc_lo(A->cu, di), b = arl_doc_hi(A->cu, di, A->T);
            float *St = A->S + ((int64_t)di * H + h) * dk * dv;
            for (int64_t t = a; t < b; t++) {
                if (A->chunk_states && (t - a) % C == 0)
                    memcpy(A->chunk_states + (chunk++ * H + h) * dk * dv, St,
                           sizeof(float) * dk * dv);
                recurrent_step(St, A->o + (t * H + h) * dv, A->q + (t * H + h) * dk,
                               A->k + (t * H + h) * dk, A->v + (t * H + h) * dv,
                               A->g + (t * H + h) * dk, A->beta[t * H + h], dk, dv, A->scale);
            }
        }
    }
}

void arl_kda_recurrent_fwd(float *o, float *S, float *chunk_states, const float *q, const float *k,
                           const float *v, const float *g, const float *beta, const int32_t *cu,
                           int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale,
                           int64_t C) {
    arl_docs_check(cu, N, T);
    ARL_ASSERT(!chunk_states || C >= 1);
    core_args A = {.o = o,
                   .S = S,
                   .chunk_states = chunk_states,
                   .q = q,
                   .k = k,
                   .v = v,
                   .g = g,
                   .beta = beta,
                   .cu = cu,
                   .N = N,
                   .T = T,
                   .H = H,
                   .dk_ = dk,
                   .dv_ = dv,
                   .C = C > 0 ? C : 1,
                   .scale = scale};
    arl_k_parallel_for(H, arl_k_work_grain(T * 4 * dk * dv), recurrent_fwd_heads, &A);
}

/* ---------------------------------------------------------------------------------------
 * core: chunkwise form (spec 3.5) - per-head buffers
 * --------------------------------------------------------------------------------------- */

/* Rows of a sub-chunk of the factored A_kk / A_qk products (spec 3.5 "Factored form"). */
#define KDA_SUB 16

/* Largest exponent a factor of the factored form may have: e^80 = 5.5e34 and e^-80 = 1.8e-35
 * are normal fp32 numbers, so no factor overflows or loses precision (spec 3.5, 15). */
#define KDA_FACTOR_SPAN 80.0f

typedef struct chunk_buf {
    /* forward: n <= C rows */
    float *Q, *K, *V, *G, *Gam, *eGnG, *Kbar, *GQ, *Xw, *Xu, *Wm, *Vt; /* (C, dk) or (C, dv) */
    float *Akk0, *Akk, *Tm, *Aqk;                                      /* (C, C) */
    float *beta;                                                       /* (C) */
    float *Snew;                                                       /* (dk, dv) */
    float *Lk, *Lq; /* (KDA_SUB, dk) left factors of a sub-chunk */
    float *Rt;      /* (C, dk) right factors */
    float *E;       /* (dk) decays of one pair (difference form) */
    /* backward */
    float *dO, *dVt, *dXu, *dV;                 /* (C, dv) */
    float *M, *dW, *dKbar, *dXw, *dQ, *dK, *dG; /* (C, dk) */
    float *dAqk, *dT, *dAkk, *tmp;              /* (C, C) */
    float *dB, *dGn;                            /* (C), (dk) */
    float *dS, *dSn;                            /* (dk, dv) */
} chunk_buf;

static int64_t chunk_fwd_floats(int64_t dk, int64_t dv, int64_t C) {
    return 9 * C * dk + 3 * C * dv + 4 * C * C + C + dk * dv + 2 * KDA_SUB * dk + C * dk + dk;
}

static int64_t chunk_bwd_floats(int64_t dk, int64_t dv, int64_t C) {
    return chunk_fwd_floats(dk, dv, C) + 7 * C * dk + 4 * C * dv + 4 * C * C + C + dk + 2 * dk * dv;
}

static int64_t recurrent_bwd_floats(int64_t dk, int64_t dv, int64_t C) {
    return (C + 1) * dk * dv + dk * dv + 4 * dv;
}

int64_t arl_kda_chunk_ws_floats(int64_t H, int64_t dk, int64_t dv, int64_t C) {
    return H * chunk_fwd_floats(dk, dv, C);
}

int64_t arl_kda_bwd_ws_floats(int64_t H, int64_t dk, int64_t dv, int64_t C) {
    int64_t a = chunk_bwd_floats(dk, dv, C), b = recurrent_bwd_floats(dk, dv, C);
    return H * (a > b ? a : b);
}

static void chunk_buf_bind(chunk_buf *B, float *p, int64_t dk, int64_t dv, int64_t C,
                           int with_bwd) {
    memset(B, 0, sizeof *B);
#define TAKE(field, count) (B->field = p, p += (count))
    TAKE(Q, C * dk);
    TAKE(K, C * dk);
    TAKE(G, C * dk);
    TAKE(Gam, C * dk);
    TAKE(eGnG, C * dk);
    TAKE(Kbar, C * dk);
    TAKE(GQ, C * dk);
    TAKE(Xw, C * dk);
    TAKE(Wm, C * dk);
    TAKE(V, C * dv);
    TAKE(Xu, C * dv);
    TAKE(Vt, C * dv);
    TAKE(Akk0, C * C);
    TAKE(Akk, C * C);
    TAKE(Tm, C * C);
    TAKE(Aqk, C * C);
    TAKE(beta, C);
    TAKE(Snew, dk * dv);
    TAKE(Lk, KDA_SUB * dk);
    TAKE(Lq, KDA_SUB * dk);
    TAKE(Rt, C * dk);
    TAKE(E, dk);
    if (with_bwd) {
        TAKE(M, C * dk);
        TAKE(dW, C * dk);
        TAKE(dKbar, C * dk);
        TAKE(dXw, C * dk);
        TAKE(dQ, C * dk);
        TAKE(dK, C * dk);
        TAKE(dG, C * dk);
        TAKE(dO, C * dv);
        TAKE(dVt, C * dv);
        TAKE(dXu, C * dv);
        TAKE(dV, C * dv);
        TAKE(dAqk, C * C);
        TAKE(dT, C * C);
        TAKE(dAkk, C * C);
        TAKE(tmp, C * C);
        TAKE(dB, C);
        TAKE(dGn, dk);
        TAKE(dS, dk * dv);
        TAKE(dSn, dk * dv);
    }
#undef TAKE
}

static inline void mm(arl_k_trans ta, arl_k_trans tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                      float *Cm, int64_t ldc) {
    arl_k_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Cm, ldc);
}

/* Load rows [c0, c0+n) of head h into the chunk buffers (Q scaled by s). */
static void chunk_load(chunk_buf *B, const core_args *A, int64_t h, int64_t c0, int64_t n) {
    int64_t H = A->H, dk = A->dk_, dv = A->dv_;
    for (int64_t r = 0; r < n; r++) {
        int64_t t = c0 + r;
        memcpy(B->Q + r * dk, A->q + (t * H + h) * dk, sizeof(float) * (size_t)dk);
        arl_k_vscale(B->Q + r * dk, A->scale, dk);
        memcpy(B->K + r * dk, A->k + (t * H + h) * dk, sizeof(float) * (size_t)dk);
        memcpy(B->G + r * dk, A->g + (t * H + h) * dk, sizeof(float) * (size_t)dk);
        memcpy(B->V + r * dv, A->v + (t * H + h) * dv, sizeof(float) * (size_t)dv);
        B->beta[r] = A->beta[t * H + h];
    }
}

/* Rows [r0, r1) of A_kk / beta_r (Akk0) and A_qk (spec 3.5 (2), (6)), all columns, in the
 * difference form: exp(G_r - G_i) <= 1 for each pair.  Used where the factored form's factors
 * would leave the fp32 range (the softplus gate, whose per-token decay is unbounded). */
static void pairs_difference(chunk_buf *B, int64_t r0, int64_t r1, int64_t n, int64_t dk) {
    for (int64_t r = r0; r < r1; r++) {
        const float *Gr = B->G + r * dk, *Kr = B->K + r * dk, *Qr = B->Q + r * dk;
        for (int64_t i = 0; i < n; i++) {
            float akk = 0.0f, aqk = 0.0f;
            if (i <= r) {
                const float *Gi = B->G + i * dk, *Ki = B->K + i * dk;
                for (int64_t c = 0; c < dk; c++)
                    B->E[c] = Gr[c] - Gi[c];
                arl_k_vexp(B->E, B->E, dk);
                for (int64_t c = 0; c < dk; c++) {
                    akk += Kr[c] * Ki[c] * B->E[c];
                    aqk += Qr[c] * Ki[c] * B->E[c];
                }
            }
            B->Akk0[r * n + i] = i < r ? akk : 0.0f;
            B->Aqk[r * n + i] = i <= r ? aqk : 0.0f;
        }
    }
}

/* The factors of the sub-chunk R = [r0, r1) with boundary b = r0 (chunk_pairs and
 * chunk_pairs_bwd): Lk (m, dk) = exp(G_R - G_b), Rt (r1, dk) = exp(G_b - G_{<r1}).  The
 * exponents of Rt's rows in R are minus those of Lk, so the two maxima bound every |exponent|;
 * returns 0 (Lk, Rt hold the exponents, not their exp) when one leaves KDA_FACTOR_SPAN and the
 * caller must use the difference form. */
static int pairs_factors(chunk_buf *B, int64_t r0, int64_t r1, int64_t dk) {
    const int64_t m = r1 - r0;
    const float *Gb = B->G + r0 * dk;
    for (int64_t r = r0; r < r1; r++) {
        float *e = B->Lk + (r - r0) * dk;
        memcpy(e, B->G + r * dk, sizeof(float) * (size_t)dk);
        arl_k_vaxpy(e, -1.0f, Gb, dk);
    }
    for (int64_t i = 0; i < r1; i++) {
        float *e = B->Rt + i * dk;
        memcpy(e, Gb, sizeof(float) * (size_t)dk);
        arl_k_vaxpy(e, -1.0f, B->G + i * dk, dk);
    }
    if (!(arl_k_vmax(B->Lk, m * dk) <= KDA_FACTOR_SPAN &&
          arl_k_vmax(B->Rt, r1 * dk) <= KDA_FACTOR_SPAN))
        return 0;
    arl_k_vexp(B->Lk, B->Lk, m * dk);
    arl_k_vexp(B->Rt, B->Rt, r1 * dk);
    return 1;
}

/* A_kk / beta_r (Akk0, strictly lower) and A_qk (lower, diagonal kept), spec 3.5 (2) and (6),
 * as GEMMs.  Rows come in sub-chunks R = [r0, r1) of at most KDA_SUB tokens with boundary
 * b = r0; for r in R and i < r1,
 *   exp(G_r - G_i) = exp(G_r - G_b) * exp(G_b - G_i)
 * so that the block is (K_R ⊙ exp(G_R - G_b)) (K_{<r1} ⊙ exp(G_b - G_{<r1}))^T (and Q_R for
 * A_qk).  For i < b (pairs in different sub-chunks) both factors are <= 1 (g <= 0): the
 * difference form split at a boundary between r and i.  For i in R (inside the sub-chunk) it is
 * the spec's factored form with G relative to the sub-chunk's first token, whose factors stay
 * inside e^{+-KDA_FACTOR_SPAN}: guaranteed for the K3 gate (g >= g_min >= -5, at most 15 steps
 * from b), checked here for any input, and a sub-chunk whose factors would leave that range
 * falls back to the difference form.  Exact in exact arithmetic; only rounding differs. */
static void chunk_pairs(chunk_buf *B, int64_t n, int64_t dk) {
    for (int64_t r0 = 0; r0 < n; r0 += KDA_SUB) {
        const int64_t r1 = n - r0 < KDA_SUB ? n : r0 + KDA_SUB, m = r1 - r0;
        if (!pairs_factors(B, r0, r1, dk)) {
            pairs_difference(B, r0, r1, n, dk);
            continue;
        }
        arl_k_vmul(B->Lq, B->Q + r0 * dk, B->Lk, m * dk);
        arl_k_vmul(B->Lk, B->K + r0 * dk, B->Lk, m * dk);
        arl_k_vmul(B->Rt, B->K, B->Rt, r1 * dk);
        mm(ARL_K_NOTRANS, ARL_K_TRANS, m, r1, dk, 1.0f, B->Lk, dk, B->Rt, dk, 0.0f,
           B->Akk0 + r0 * n, n);
        mm(ARL_K_NOTRANS, ARL_K_TRANS, m, r1, dk, 1.0f, B->Lq, dk, B->Rt, dk, 0.0f, B->Aqk + r0 * n,
           n);
        /* keep i < r (A_kk) and i <= r (A_qk) */
        for (int64_t r = r0; r < r1; r++) {
            memset(B->Akk0 + r * n + r, 0, sizeof(float) * (size_t)(n - r));
            memset(B->Aqk + r * n + r + 1, 0, sizeof(float) * (size_t)(n - r - 1));
        }
    }
}

/* Spec 3.5 steps (1)-(5) and the pieces of (6)-(8) for a loaded chunk with incoming state
 * S (dk, dv); (1) turns G from g into its inclusive cumsum. */
static void chunk_prepare(chunk_buf *B, const float *S, int64_t n, int64_t dk, int64_t dv,
                          int64_t C) {
    (void)C;
    /* (1) G = cumsum(g), Gam = exp(G), exp(G_n - G), Kbar, Gam * Q */
    for (int64_t r = 1; r < n; r++)
        arl_k_vaxpy(B->G + r * dk, 1.0f, B->G + (r - 1) * dk, dk);
    const float *Gn = B->G + (n - 1) * dk;
    arl_k_vexp(B->Gam, B->G, n * dk);
    for (int64_t r = 0; r < n; r++) {
        memcpy(B->eGnG + r * dk, Gn, sizeof(float) * (size_t)dk);
        arl_k_vaxpy(B->eGnG + r * dk, -1.0f, B->G + r * dk, dk);
    }
    arl_k_vexp(B->eGnG, B->eGnG, n * dk);
    arl_k_vmul(B->Kbar, B->eGnG, B->K, n * dk);
    arl_k_vmul(B->GQ, B->Gam, B->Q, n * dk);
    /* (2), (6): A_kk / beta_r (Akk0) for i < r and A_qk for i <= r; A_kk = diag(beta) Akk0 */
    chunk_pairs(B, n, dk);
    for (int64_t r = 0; r < n; r++) {
        float *Ar = B->Akk + r * n;
        memcpy(Ar, B->Akk0 + r * n, sizeof(float) * (size_t)r);
        arl_k_vscale(Ar, B->beta[r], r);
        memset(Ar + r, 0, sizeof(float) * (size_t)(n - r));
    }
    /* (3) T = (I + A_kk)^-1 by forward substitution, row by row:
     *   T[i, 0:i] = -A[i, 0:i] - sum_{m<i} A[i, m] T[m, 0:i]
     * with the sum over m ascending (each T[i, j] adds its terms m = j+1 .. i-1 in order) */
    float *Tm = B->Tm;
    for (int64_t i = 0; i < n; i++) {
        float *restrict Ti = Tm + i * n;
        for (int64_t j = 0; j < n; j++)
            Ti[j] = -B->Akk[i * n + j];
        for (int64_t m = 1; m < i; m++) { /* T[m, 0:m] (row m, left of its diagonal) */
            const float *restrict Tr = Tm + m * n;
            const float c = Ti[m];
            for (int64_t j = 0; j < m; j++) /* one product and one sum, as arl_k_vaxpy */
                Ti[j] += c * Tr[j];
        }
        Ti[i] = 1.0f;
    }
    /* (4) W = T diag(beta)(Gam K), U = T diag(beta) V */
    for (int64_t r = 0; r < n; r++) {
        float *xw = B->Xw + r * dk, *xu = B->Xu + r * dv;
        memcpy(xw, B->Gam + r * dk, sizeof(float) * (size_t)dk);
        arl_k_vscale(xw, B->beta[r], dk);
        arl_k_vmul(xw, xw, B->K + r * dk, dk);
        memcpy(xu, B->V + r * dv, sizeof(float) * (size_t)dv);
        arl_k_vscale(xu, B->beta[r], dv);
    }
    mm(ARL_K_NOTRANS, ARL_K_NOTRANS, n, dk, n, 1.0f, Tm, n, B->Xw, dk, 0.0f, B->Wm, dk);
    mm(ARL_K_NOTRANS, ARL_K_NOTRANS, n, dv, n, 1.0f, Tm, n, B->Xu, dv, 0.0f, B->Vt, dv);
    /* (5) V~ = U - W S */
    mm(ARL_K_NOTRANS, ARL_K_NOTRANS, n, dv, dk, -1.0f, B->Wm, dk, S, dv, 1.0f, B->Vt, dv);
}

/* (8) S_out (dk, dv) = diag(exp(G_n)) S + Kbar^T V~ */
static void chunk_state_out(chunk_buf *B, const float *S, float *Sout, int64_t n, int64_t dk,
                            int64_t dv) {
    mm(ARL_K_TRANS, ARL_K_NOTRANS, dk, dv, n, 1.0f, B->Kbar, dk, B->Vt, dv, 0.0f, Sout, dv);
    const float *Gn = B->G + (n - 1) * dk;
    arl_k_vexp(B->E, Gn, dk);
    for (int64_t c = 0; c < dk; c++)
        arl_k_vaxpy(Sout + c * dv, B->E[c], S + c * dv, dv);
}

static void chunk_fwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const core_args *A = vctx;
    int64_t H = A->H, dk = A->dk_, dv = A->dv_, C = A->C;
    for (int64_t h = h0; h < h1; h++) {
        chunk_buf B;
        chunk_buf_bind(&B, A->ws + h * A->ws_head, dk, dv, C, 0);
        int64_t chunk = 0;
        for (int32_t di = 0; di < A->N; di++) {
            int64_t a = arl_doc_lo(A->cu, di), b = arl_doc_hi(A->cu, di, A->T);
            float *St = A->S + ((int64_t)di * H + h) * dk * dv;
            for (int64_t c0 = a; c0 < b; c0 += C) {
                int64_t n = b - c0 < C ? b - c0 : C;
                if (A->chunk_states)
                    memcpy(A->chunk_states + (chunk * H + h) * dk * dv, St,
                           sizeof(float) * dk * dv);
                chunk++;
                chunk_load(&B, A, h, c0, n);
                chunk_prepare(&B, St, n, dk, dv, C);
                /* (7) O = (Gam Q) S + A_qk V~, written to the strided output rows */
                float *Or = A->o + (c0 * H + h) * dv;
                mm(ARL_K_NOTRANS, ARL_K_NOTRANS, n, dv, dk, 1.0f, B.GQ, dk, St, dv, 0.0f, Or,
                   H * dv);
                mm(ARL_K_NOTRANS, ARL_K_NOTRANS, n, dv, n, 1.0f, B.Aqk, n, B.Vt, dv, 1.0f, Or,
                   H * dv);
                chunk_state_out(&B, St, B.Snew, n, dk, dv);
                memcpy(St, B.Snew, sizeof(float) * dk * dv);
            }
        }
    }
}

void arl_kda_chunk_fwd(float *o, float *S, float *chunk_states, const float *q, const float *k,
                       const float *v, const float *g, const float *beta, const int32_t *cu,
                       int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv, float scale,
                       int64_t C, float *ws) {
    arl_docs_check(cu, N, T);
    ARL_ASSERT(C >= 1 && C <= 256 && ws);
    core_args A = {.o = o,
                   .S = S,
                   .chunk_states = chunk_states,
                   .ws = ws,
                   .q = q,
                   .k = k,
                   .v = v,
                   .g = g,
                   .beta = beta,
                   .cu = cu,
                   .N = N,
                   .T = T,
                   .H = H,
                   .dk_ = dk,
                   .dv_ = dv,
                   .C = C,
                   .ws_head = chunk_fwd_floats(dk, dv, C),
                   .scale = scale};
    arl_k_parallel_for(H, arl_k_work_grain(T * (3 * dk * dv + 5 * C * dk)), chunk_fwd_heads, &A);
}

/* ---------------------------------------------------------------------------------------
 * core: backward, recurrent rule (spec 3.7)
 * --------------------------------------------------------------------------------------- */

static void recurrent_bwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const core_args *A = vctx;
    int64_t H = A->H, dk = A->dk_, dv = A->dv_, C = A->C, D = dk * dv;
    for (int64_t h = h0; h < h1; h++) {
        float *states = A->ws + h * A->ws_head; /* (C+1, dk, dv): S_{t-1} of the chunk's rows */
        float *dS = states + (C + 1) * D;
        float *r = dS + D, *delta = r + dv, *ddelta = delta + dv, *dr = ddelta + dv;
        int64_t chunk_base = 0;
        for (int32_t di = 0; di < A->N; di++) {
            int64_t a = arl_doc_lo(A->cu, di), b = arl_doc_hi(A->cu, di, A->T);
            int64_t nch = (b - a + C - 1) / C;
            if (A->dS_T)
                memcpy(dS, A->dS_T + ((int64_t)di * H + h) * D, sizeof(float) * D);
            else
                memset(dS, 0, sizeof(float) * D);
            for (int64_t ch = nch - 1; ch >= 0; ch--) {
                int64_t c0 = a + ch * C, c1 = c0 + C < b ? c0 + C : b;
                /* recompute S_{t-1} for the chunk from its stored incoming state */
                memcpy(states, A->cstates + ((chunk_base + ch) * H + h) * D, sizeof(float) * D);
                for (int64_t t = c0; t < c1; t++) {
                    float *Sn = states + (t - c0 + 1) * D;
                    memcpy(Sn, Sn - D, sizeof(float) * D);
                    recurrent_step(Sn, NULL, A->q + (t * H + h) * dk, A->k + (t * H + h) * dk,
                                   A->v + (t * H + h) * dv, A->g + (t * H + h) * dk,
                                   A->beta[t * H + h], dk, dv, A->scale);
                }
                for (int64_t t = c1 - 1; t >= c0; t--) {
                    const float *Sp = states + (t - c0) * D, *Sn = Sp + D;
                    const float *q = A->q + (t * H + h) * dk, *k = A->k + (t * H + h) * dk;
                    const float *v = A->v + (t * H + h) * dv, *g = A->g + (t * H + h) * dk;
                    const float *dO = A->d_o + (t * H + h) * dv;
                    float be = A->beta[t * H + h], s = A->scale;
                    float *dq = A->dq + (t * H + h) * dk, *dkk = A->dk + (t * H + h) * dk;
                    float *dvv = A->dv + (t * H + h) * dv, *dg = A->dg + (t * H + h) * dk;
                    /* r = S~^T k with S~ = diag(alpha) S_{t-1}; delta = beta (v - r) */
                    for (int64_t j = 0; j < dv; j++)
                        r[j] = 0.0f;
                    for (int64_t c = 0; c < dk; c++) {
                        float ak = expf(g[c]) * k[c];
                        for (int64_t j = 0; j < dv; j++)
                            r[j] += Sp[c * dv + j] * ak;
                    }
                    for (int64_t j = 0; j < dv; j++)
                        delta[j] = be * (v[j] - r[j]);
                    /* dS += s q do^T;  dq = s S_t do */
                    for (int64_t c = 0; c < dk; c++) {
                        float acc = 0.0f;
                        for (int64_t j = 0; j < dv; j++) {
                            dS[c * dv + j] += s * q[c] * dO[j];
                            acc += Sn[c * dv + j] * dO[j];
                        }
                        dq[c] += s * acc;
                    }
                    /* ddelta = dS^T k;  dk = dS delta */
                    for (int64_t j = 0; j < dv; j++)
                        ddelta[j] = 0.0f;
                    for (int64_t c = 0; c < dk; c++) {
                        float acc = 0.0f;
                        for (int64_t j = 0; j < dv; j++) {
                            ddelta[j] += dS[c * dv + j] * k[c];
                            acc += dS[c * dv + j] * delta[j];
                        }
                        dkk[c] += acc;
                    }
                    float dbe = 0.0f;
                    for (int64_t j = 0; j < dv; j++) {
                        dbe += ddelta[j] * (v[j] - r[j]);
                        dvv[j] += be * ddelta[j];
                        dr[j] = -be * ddelta[j];
                    }
                    A->dbeta[t * H + h] += dbe;
                    /* dS~ = dS + k dr^T;  dk += S~ dr;  dg = alpha * rowsum(dS~ * S_{t-1});
                     * dS = diag(alpha) dS~ */
                    for (int64_t c = 0; c < dk; c++) {
                        float al = expf(g[c]);
                        float acc_k = 0.0f, acc_g = 0.0f;
                        for (int64_t j = 0; j < dv; j++) {
                            float dst = dS[c * dv + j] + k[c] * dr[j];
                            acc_k += al * Sp[c * dv + j] * dr[j];
                            acc_g += dst * Sp[c * dv + j];
                            dS[c * dv + j] = al * dst;
                        }
                        dkk[c] += acc_k;
                        dg[c] += al * acc_g;
                    }
                }
            }
            if (A->dS0) {
                float *d0 = A->dS0 + ((int64_t)di * H + h) * D;
                for (int64_t i = 0; i < D; i++)
                    d0[i] += dS[i];
            }
            chunk_base += nch;
        }
    }
}

/* The arguments of both backward cores (recurrent and chunkwise rule), one head's workspace
 * each. */
static core_args bwd_args(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, float *dS0,
                          const float *d_o, const float *dS_T, const float *q, const float *k,
                          const float *v, const float *g, const float *beta,
                          const float *chunk_states, const int32_t *cu, int32_t N, int64_t T,
                          int64_t H, int64_t dk, int64_t dv, float scale, int64_t C, float *ws) {
    core_args A = {.ws = ws,
                   .dq = dq,
                   .dk = dk_,
                   .dv = dv_,
                   .dg = dg,
                   .dbeta = dbeta,
                   .dS0 = dS0,
                   .q = q,
                   .k = k,
                   .v = v,
                   .g = g,
                   .beta = beta,
                   .d_o = d_o,
                   .dS_T = dS_T,
                   .cstates = chunk_states,
                   .cu = cu,
                   .N = N,
                   .T = T,
                   .H = H,
                   .dk_ = dk,
                   .dv_ = dv,
                   .C = C,
                   .ws_head = arl_kda_bwd_ws_floats(1, dk, dv, C),
                   .scale = scale};
    return A;
}

void arl_kda_recurrent_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, float *dS0,
                           const float *d_o, const float *dS_T, const float *q, const float *k,
                           const float *v, const float *g, const float *beta,
                           const float *chunk_states, const int32_t *cu, int32_t N, int64_t T,
                           int64_t H, int64_t dk, int64_t dv, float scale, int64_t C, float *ws) {
    arl_docs_check(cu, N, T);
    ARL_ASSERT(C >= 1 && ws && chunk_states);
    core_args A = bwd_args(dq, dk_, dv_, dg, dbeta, dS0, d_o, dS_T, q, k, v, g, beta, chunk_states,
                           cu, N, T, H, dk, dv, scale, C, ws);
    arl_k_parallel_for(H, 1, recurrent_bwd_heads, &A);
}

/* ---------------------------------------------------------------------------------------
 * core: backward, chunkwise rule (spec 3.8)
 * --------------------------------------------------------------------------------------- */

/* The pair terms of the backward of A_qk and A_kk (spec 3.8) for rows [r0, r1), pair by pair
 * in the difference form e = exp(G_r - G_i) (the fallback of chunk_pairs_bwd):
 *   dQ_r += sum_i dAqk[r,i] K_i e,  dK_r += sum_i D[r,i] K_i e,  dG_r += Q_r tq + K_r ti,
 *   dK_i += (dAqk[r,i] Q_r + D[r,i] K_r) e,  dG_i -= K_i (the same)
 * with D = diag(beta) dA_kk (strictly lower) and dAqk lower (diagonal kept). */
static void pairs_bwd_difference(chunk_buf *B, int64_t r0, int64_t r1, int64_t n, int64_t dk) {
    for (int64_t r = r0; r < r1; r++) {
        const float *Gr = B->G + r * dk, *Kr = B->K + r * dk, *Qr = B->Q + r * dk;
        float *dQr = B->dQ + r * dk, *dKr = B->dK + r * dk, *dGr = B->dG + r * dk;
        for (int64_t i = 0; i <= r; i++) {
            float aq = B->dAqk[r * n + i], dd = i < r ? B->dAkk[r * n + i] : 0.0f;
            if (aq == 0.0f && dd == 0.0f) continue;
            const float *Gi = B->G + i * dk, *Ki = B->K + i * dk;
            float *dKi = B->dK + i * dk, *dGi = B->dG + i * dk;
            for (int64_t c = 0; c < dk; c++)
                B->E[c] = Gr[c] - Gi[c];
            arl_k_vexp(B->E, B->E, dk);
            for (int64_t c = 0; c < dk; c++) {
                float e = B->E[c];
                float x1 = aq * Ki[c] * e; /* tq[r,c] */
                float x2 = aq * Qr[c] * e; /* tk[i,c] */
                float x3 = dd * Ki[c] * e; /* ti[r,c] */
                float x4 = dd * Kr[c] * e; /* tj[i,c] */
                dQr[c] += x1;
                dKr[c] += x3;
                dGr[c] += Qr[c] * x1 + Kr[c] * x3;
                dKi[c] += x2 + x4;
                dGi[c] -= Ki[c] * (x2 + x4);
            }
        }
    }
}

/* The pair terms as GEMMs, in the sub-chunks of chunk_pairs: for rows R = [r0, r1) with
 * boundary b = r0 and columns i < r1, e[r,i] = L_r R_i with L = exp(G_R - G_b) (m, dk) and
 * R = exp(G_b - G_{<r1}) (r1, dk), so with P = dAqk[R, :r1] and D = diag(beta) dA_kk[R, :r1]
 * (zero where i > r, resp. i >= r):
 *   X1 = P (K ⊙ R),  X3 = D (K ⊙ R)                      (m, dk)
 *   dQ_R += L ⊙ X1,  dK_R += L ⊙ X3,  dG_R += Q_R ⊙ L ⊙ X1 + K_R ⊙ L ⊙ X3
 *   Y = P^T (Q_R ⊙ L) + D^T (K_R ⊙ L)                    (r1, dk)
 *   dK_{<r1} += R ⊙ Y,  dG_{<r1} -= K ⊙ R ⊙ Y
 * Same factor ranges and fallback (pairs_bwd_difference) as chunk_pairs.  Work buffers: Lk, Lq
 * (left factors), Rt (right factors), and M, dKbar, dXw, dW, which are free at this point. */
static void chunk_pairs_bwd(chunk_buf *B, int64_t n, int64_t dk) {
    float *KR = B->M, *X1 = B->dKbar, *X3 = B->dXw, *Y = B->dW;
    for (int64_t r0 = 0; r0 < n; r0 += KDA_SUB) {
        const int64_t r1 = n - r0 < KDA_SUB ? n : r0 + KDA_SUB, m = r1 - r0;
        if (!pairs_factors(B, r0, r1, dk)) {
            pairs_bwd_difference(B, r0, r1, n, dk);
            continue;
        }
        float *L = B->Lk;
        const float *R = B->Rt;
        arl_k_vmul(KR, B->K, R, r1 * dk);
        const float *P = B->dAqk + r0 * n, *D = B->dAkk + r0 * n;
        mm(ARL_K_NOTRANS, ARL_K_NOTRANS, m, dk, r1, 1.0f, P, n, KR, dk, 0.0f, X1, dk);
        mm(ARL_K_NOTRANS, ARL_K_NOTRANS, m, dk, r1, 1.0f, D, n, KR, dk, 0.0f, X3, dk);
        for (int64_t j = 0; j < m * dk; j++) {
            int64_t rc = r0 * dk + j;
            float x1 = L[j] * X1[j], x3 = L[j] * X3[j];
            B->dQ[rc] += x1;
            B->dK[rc] += x3;
            B->dG[rc] += B->Q[rc] * x1 + B->K[rc] * x3;
        }
        arl_k_vmul(B->Lq, B->Q + r0 * dk, L, m * dk);
        arl_k_vmul(L, B->K + r0 * dk, L, m * dk);
        mm(ARL_K_TRANS, ARL_K_NOTRANS, r1, dk, m, 1.0f, P, n, B->Lq, dk, 0.0f, Y, dk);
        mm(ARL_K_TRANS, ARL_K_NOTRANS, r1, dk, m, 1.0f, D, n, L, dk, 1.0f, Y, dk);
        for (int64_t j = 0; j < r1 * dk; j++) {
            float y = R[j] * Y[j];
            B->dK[j] += y;
            B->dG[j] -= B->K[j] * y;
        }
    }
}

/* Gradients of one loaded and prepared chunk; B->dS holds dS' (gradient of the outgoing
 * state) on entry and dS (gradient of the incoming state S) on return.  The results dQ
 * (w.r.t. the scaled Q), dK, dV, dG (already reverse-cumsummed: = dg), dB are left in B. */
static void chunk_bwd_one(chunk_buf *B, const float *S, int64_t n, int64_t dk, int64_t dv) {
    const float *Gn = B->G + (n - 1) * dk;
    float *dSp = B->dS;
    /* dV~ = A_qk^T dO + Kbar dS' */
    mm(ARL_K_TRANS, ARL_K_NOTRANS, n, dv, n, 1.0f, B->Aqk, n, B->dO, dv, 0.0f, B->dVt, dv);
    mm(ARL_K_NOTRANS, ARL_K_NOTRANS, n, dv, dk, 1.0f, B->Kbar, dk, dSp, dv, 1.0f, B->dVt, dv);
    /* dA_qk = Tril(dO V~^T), diagonal kept */
    mm(ARL_K_NOTRANS, ARL_K_TRANS, n, n, dv, 1.0f, B->dO, dv, B->Vt, dv, 0.0f, B->dAqk, n);
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = r + 1; i < n; i++)
            B->dAqk[r * n + i] = 0.0f;
    /* dS = diag(exp(G_n)) dS' + (Gam Q)^T dO - W^T dV~ */
    mm(ARL_K_TRANS, ARL_K_NOTRANS, dk, dv, n, 1.0f, B->GQ, dk, B->dO, dv, 0.0f, B->dSn, dv);
    mm(ARL_K_TRANS, ARL_K_NOTRANS, dk, dv, n, -1.0f, B->Wm, dk, B->dVt, dv, 1.0f, B->dSn, dv);
    for (int64_t c = 0; c < dk; c++) {
        float e = expf(Gn[c]);
        for (int64_t j = 0; j < dv; j++)
            B->dSn[c * dv + j] += e * dSp[c * dv + j];
    }
    /* M = dO S^T: dQ = Gam M, dG = Gam Q M */
    mm(ARL_K_NOTRANS, ARL_K_TRANS, n, dk, dv, 1.0f, B->dO, dv, S, dv, 0.0f, B->M, dk);
    for (int64_t i = 0; i < n * dk; i++) {
        B->dQ[i] = B->Gam[i] * B->M[i];
        B->dG[i] = B->Gam[i] * B->Q[i] * B->M[i];
    }
    /* dW = -dV~ S^T, dU = dV~ */
    mm(ARL_K_NOTRANS, ARL_K_TRANS, n, dk, dv, -1.0f, B->dVt, dv, S, dv, 0.0f, B->dW, dk);
    /* dKbar = V~ dS'^T: dK = exp(G_n - G) dKbar, dG -= Kbar dKbar, dG_n */
    mm(ARL_K_NOTRANS, ARL_K_TRANS, n, dk, dv, 1.0f, B->Vt, dv, dSp, dv, 0.0f, B->dKbar, dk);
    for (int64_t c = 0; c < dk; c++)
        B->dGn[c] = 0.0f;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < dk; c++) {
            int64_t rc = r * dk + c;
            B->dK[rc] = B->eGnG[rc] * B->dKbar[rc];
            B->dG[rc] -= B->Kbar[rc] * B->dKbar[rc];
            B->dGn[c] += B->Kbar[rc] * B->dKbar[rc];
        }
    for (int64_t c = 0; c < dk; c++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < dv; j++)
            acc += dSp[c * dv + j] * S[c * dv + j];
        B->dGn[c] += expf(Gn[c]) * acc;
    }
    /* dT = dW X_w^T + dU X_u^T;  dX_w = T^T dW;  dX_u = T^T dU */
    mm(ARL_K_NOTRANS, ARL_K_TRANS, n, n, dk, 1.0f, B->dW, dk, B->Xw, dk, 0.0f, B->dT, n);
    mm(ARL_K_NOTRANS, ARL_K_TRANS, n, n, dv, 1.0f, B->dVt, dv, B->Xu, dv, 1.0f, B->dT, n);
    mm(ARL_K_TRANS, ARL_K_NOTRANS, n, dk, n, 1.0f, B->Tm, n, B->dW, dk, 0.0f, B->dXw, dk);
    mm(ARL_K_TRANS, ARL_K_NOTRANS, n, dv, n, 1.0f, B->Tm, n, B->dVt, dv, 0.0f, B->dXu, dv);
    /* dA_kk = StrictTril(-T^T dT T^T) */
    mm(ARL_K_TRANS, ARL_K_NOTRANS, n, n, n, 1.0f, B->Tm, n, B->dT, n, 0.0f, B->tmp, n);
    mm(ARL_K_NOTRANS, ARL_K_TRANS, n, n, n, -1.0f, B->tmp, n, B->Tm, n, 0.0f, B->dAkk, n);
    for (int64_t r = 0; r < n; r++)
        for (int64_t i = r; i < n; i++)
            B->dAkk[r * n + i] = 0.0f;
    /* from X_w and X_u; dbeta from A_kk (A_kk / beta_r = Akk0, no division) */
    for (int64_t r = 0; r < n; r++) {
        float be = B->beta[r], db = 0.0f;
        for (int64_t c = 0; c < dk; c++) {
            int64_t rc = r * dk + c;
            float gk = B->Gam[rc] * B->dXw[rc];
            B->dK[rc] += be * gk;
            B->dG[rc] += be * gk * B->K[rc];
            db += gk * B->K[rc];
        }
        for (int64_t j = 0; j < dv; j++) {
            B->dV[r * dv + j] = be * B->dXu[r * dv + j];
            db += B->V[r * dv + j] * B->dXu[r * dv + j];
        }
        for (int64_t i = 0; i < r; i++) {
            db += B->dAkk[r * n + i] * B->Akk0[r * n + i];
            B->dAkk[r * n + i] *= be; /* D = diag(beta) dA_kk */
        }
        B->dB[r] = db;
    }
    /* pair terms of A_qk (tq, tk) and A_kk (ti, tj), in the sub-chunk form of chunk_pairs */
    chunk_pairs_bwd(B, n, dk);
    /* dG[n] += dG_n; dg = reverse_cumsum_rows(dG) */
    for (int64_t c = 0; c < dk; c++)
        B->dG[(n - 1) * dk + c] += B->dGn[c];
    for (int64_t r = n - 2; r >= 0; r--)
        for (int64_t c = 0; c < dk; c++)
            B->dG[r * dk + c] += B->dG[(r + 1) * dk + c];
    memcpy(B->dS, B->dSn, sizeof(float) * dk * dv);
}

static void chunk_bwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const core_args *A = vctx;
    int64_t H = A->H, dk = A->dk_, dv = A->dv_, C = A->C, D = dk * dv;
    for (int64_t h = h0; h < h1; h++) {
        chunk_buf B;
        chunk_buf_bind(&B, A->ws + h * A->ws_head, dk, dv, C, 1);
        int64_t chunk_base = 0;
        for (int32_t di = 0; di < A->N; di++) {
            int64_t a = arl_doc_lo(A->cu, di), b = arl_doc_hi(A->cu, di, A->T);
            int64_t nch = (b - a + C - 1) / C;
            if (A->dS_T)
                memcpy(B.dS, A->dS_T + ((int64_t)di * H + h) * D, sizeof(float) * D);
            else
                memset(B.dS, 0, sizeof(float) * D);
            for (int64_t ch = nch - 1; ch >= 0; ch--) {
                int64_t c0 = a + ch * C, n = b - c0 < C ? b - c0 : C;
                const float *S = A->cstates + ((chunk_base + ch) * H + h) * D;
                chunk_load(&B, A, h, c0, n);
                chunk_prepare(&B, S, n, dk, dv, C);
                for (int64_t r = 0; r < n; r++)
                    memcpy(B.dO + r * dv, A->d_o + ((c0 + r) * H + h) * dv, sizeof(float) * dv);
                chunk_bwd_one(&B, S, n, dk, dv);
                for (int64_t r = 0; r < n; r++) {
                    int64_t t = c0 + r;
                    for (int64_t c = 0; c < dk; c++) {
                        A->dq[(t * H + h) * dk + c] += A->scale * B.dQ[r * dk + c];
                        A->dk[(t * H + h) * dk + c] += B.dK[r * dk + c];
                        A->dg[(t * H + h) * dk + c] += B.dG[r * dk + c];
                    }
                    for (int64_t j = 0; j < dv; j++)
                        A->dv[(t * H + h) * dv + j] += B.dV[r * dv + j];
                    A->dbeta[t * H + h] += B.dB[r];
                }
            }
            if (A->dS0) {
                float *d0 = A->dS0 + ((int64_t)di * H + h) * D;
                for (int64_t i = 0; i < D; i++)
                    d0[i] += B.dS[i];
            }
            chunk_base += nch;
        }
    }
}

void arl_kda_chunk_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, float *dS0,
                       const float *d_o, const float *dS_T, const float *q, const float *k,
                       const float *v, const float *g, const float *beta, const float *chunk_states,
                       const int32_t *cu, int32_t N, int64_t T, int64_t H, int64_t dk, int64_t dv,
                       float scale, int64_t C, float *ws) {
    arl_docs_check(cu, N, T);
    ARL_ASSERT(C >= 1 && C <= 256 && ws && chunk_states);
    core_args A = bwd_args(dq, dk_, dv_, dg, dbeta, dS0, d_o, dS_T, q, k, v, g, beta, chunk_states,
                           cu, N, T, H, dk, dv, scale, C, ws);
    arl_k_parallel_for(H, 1, chunk_bwd_heads, &A);
}
