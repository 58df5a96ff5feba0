/* policy/kda.c: Kimi Delta Attention stages and core on the CPU, fp32 (see policy/kda.h).
 *
 * Written to be read next to spec/policy.md section 3: each function follows the numbered
 * steps of its section.  Heads are independent in every stage of the core, so the core runs
 * one head per pool task; each task has its own slice of the caller's work buffer, and every
 * value is computed in a fixed order, so results do not depend on the thread count.
 */
#include "policy/kda.h"

#include <math.h>
#include <string.h>

#include "core/assert.h"
#include "kernels/gemm.h"
#include "kernels/threadpool.h"

static inline float sigm(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

static inline float softplusf_(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

static inline int64_t doc_lo(const int32_t *cu, int32_t i) {
    return cu ? cu[i] : 0;
}

static inline int64_t doc_hi(const int32_t *cu, int32_t i, int64_t T) {
    return cu ? cu[i + 1] : T;
}

static void check_docs(const int32_t *cu, int32_t N, int64_t T) {
    ARL_ASSERT(N >= 1 && T >= 0);
    if (!cu) {
        ARL_ASSERT(N == 1);
        return;
    }
    ARL_ASSERT(cu[0] == 0 && cu[N] == T);
    for (int32_t i = 0; i < N; i++)
        ARL_ASSERT(cu[i] <= cu[i + 1]);
}

/* ---------------------------------------------------------------------------------------
 * short convolution
 * --------------------------------------------------------------------------------------- */

/* Input of channel c at document position src (< 0: from the tail or 0). */
static inline float conv_in(const float *x, const float *tail, int64_t a, int64_t src, int64_t c,
                            int64_t C, int64_t W) {
    if (src >= 0) return x[(a + src) * C + c];
    return tail ? tail[c * (W - 1) + (W - 1 + src)] : 0.0f;
}

void arl_kda_conv_fwd(float *z, float *y, const float *x, const float *w, const float *tails,
                      const int32_t *cu, int32_t N, int64_t T, int64_t C, int64_t W) {
    check_docs(cu, N, T);
    ARL_ASSERT(W >= 1 && C >= 1);
    for (int32_t di = 0; di < N; di++) {
        int64_t a = doc_lo(cu, di), b = doc_hi(cu, di, T);
        const float *tail = tails ? tails + (int64_t)di * C * (W - 1) : NULL;
        for (int64_t t = a; t < b; t++) {
            int64_t pos = t - a;
            for (int64_t c = 0; c < C; c++) {
                float acc = 0.0f;
                for (int64_t j = 0; j < W; j++)
                    acc += w[c * W + j] * conv_in(x, tail, a, pos - (W - 1) + j, c, C, W);
                if (y) y[t * C + c] = acc;
                z[t * C + c] = acc * sigm(acc);
            }
        }
    }
}

void arl_kda_conv_bwd(float *dx, float *dw, const float *dz, const float *x, const float *w,
                      const float *tails, const int32_t *cu, int32_t N, int64_t T, int64_t C,
                      int64_t W) {
    check_docs(cu, N, T);
    for (int32_t di = 0; di < N; di++) {
        int64_t a = doc_lo(cu, di), b = doc_hi(cu, di, T);
        const float *tail = tails ? tails + (int64_t)di * C * (W - 1) : NULL;
        for (int64_t t = a; t < b; t++) {
            int64_t pos = t - a;
            for (int64_t c = 0; c < C; c++) {
                float y = 0.0f;
                for (int64_t j = 0; j < W; j++)
                    y += w[c * W + j] * conv_in(x, tail, a, pos - (W - 1) + j, c, C, W);
                float s = sigm(y);
                float dy = dz[t * C + c] * s * (1.0f + y * (1.0f - s));
                for (int64_t j = 0; j < W; j++) {
                    int64_t src = pos - (W - 1) + j;
                    if (src >= 0) dx[(a + src) * C + c] += w[c * W + j] * dy;
                    if (dw) dw[c * W + j] += dy * conv_in(x, tail, a, src, c, C, W);
                }
            }
        }
    }
}

void arl_kda_conv_tail(float *tail_out, const float *x, int64_t n, const float *tail_in, int64_t C,
                       int64_t W) {
    /* element m of [tail_in; x] (length W-1+n); out[i] = element n+i.  Ascending i reads
     * index n+i >= i, so tail_out == tail_in is safe. */
    for (int64_t c = 0; c < C; c++)
        for (int64_t i = 0; i < W - 1; i++) {
            int64_t m = n + i;
            float v =
                m < W - 1 ? (tail_in ? tail_in[c * (W - 1) + m] : 0.0f) : x[(m - (W - 1)) * C + c];
            tail_out[c * (W - 1) + i] = v;
        }
}

void arl_kda_conv_step(float *z, float *tail, const float *x, const float *w, int64_t C,
                       int64_t W) {
    for (int64_t c = 0; c < C; c++) {
        float *tl = tail + c * (W - 1);
        float acc = w[c * W + (W - 1)] * x[c];
        for (int64_t j = 0; j < W - 1; j++)
            acc += w[c * W + j] * tl[j];
        z[c] = acc * sigm(acc);
        for (int64_t j = 0; j + 1 < W - 1; j++)
            tl[j] = tl[j + 1];
        if (W > 1) tl[W - 2] = x[c];
    }
}

/* ---------------------------------------------------------------------------------------
 * gates
 * --------------------------------------------------------------------------------------- */

void arl_kda_gate_k3_fwd(float *g, const float *f, const float *A_log, const float *dt_bias,
                         int64_t T, int64_t H, int64_t dk, float g_min) {
    int64_t P = H * dk;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < P; c++) {
            float a = expf(A_log[c / dk]);
            g[t * P + c] = g_min * sigm(a * (f[t * P + c] + dt_bias[c]));
        }
}

void arl_kda_gate_k3_bwd(float *df, float *dA_log, float *ddt_bias, const float *dg, const float *f,
                         const float *A_log, const float *dt_bias, int64_t T, int64_t H, int64_t dk,
                         float g_min) {
    int64_t P = H * dk;
    for (int64_t h = 0; h < H; h++) {
        float a = expf(A_log[h]);
        double dA = 0.0;
        for (int64_t c = h * dk; c < (h + 1) * dk; c++) {
            double db = 0.0;
            for (int64_t t = 0; t < T; t++) {
                float z = a * (f[t * P + c] + dt_bias[c]);
                float s = sigm(z);
                float dz = dg[t * P + c] * g_min * s * (1.0f - s);
                float du = a * dz;
                if (df) df[t * P + c] += du;
                db += du;
                dA += (double)dz * z;
            }
            if (ddt_bias) ddt_bias[c] += (float)db;
        }
        if (dA_log) dA_log[h] += (float)dA;
    }
}

void arl_kda_gate_softplus_fwd(float *g, const float *f, const float *A_log, const float *dt_bias,
                               int64_t T, int64_t H, int64_t dk) {
    int64_t P = H * dk;
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < P; c++)
            g[t * P + c] = -expf(A_log[c / dk]) * softplusf_(f[t * P + c] + dt_bias[c]);
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

void arl_kda_onorm_fwd(float *ob, float *rstd, const float *o, const float *gam, const float *w,
                       int64_t n, int64_t dv, float eps) {
    for (int64_t t = 0; t < n; t++) {
        const float *x = o + t * dv;
        double ss = 0.0;
        for (int64_t i = 0; i < dv; i++)
            ss += (double)x[i] * x[i];
        float r = (float)(1.0 / sqrt(ss / (double)dv + (double)eps));
        if (rstd) rstd[t] = r;
        for (int64_t i = 0; i < dv; i++)
            ob[t * dv + i] = w[i] * (x[i] * r) * sigm(gam[t * dv + i]);
    }
}

void arl_kda_onorm_bwd(float *d_o, float *dgam, float *dw, const float *dob, const float *o,
                       const float *gam, const float *w, const float *rstd, int64_t n, int64_t dv) {
    for (int64_t t = 0; t < n; t++) {
        const float *x = o + t * dv, *dy = dob + t * dv, *gm = gam + t * dv;
        float r = rstd[t];
        double m = 0.0; /* mean(dxh * xh), dxh = dob * w * sigmoid(gam) */
        for (int64_t i = 0; i < dv; i++)
            m += (double)dy[i] * w[i] * sigm(gm[i]) * (x[i] * r);
        m /= (double)dv;
        for (int64_t i = 0; i < dv; i++) {
            float xh = x[i] * r, sg = sigm(gm[i]);
            float dxh = dy[i] * w[i] * sg;
            d_o[t * dv + i] += r * (dxh - xh * (float)m);
            dgam[t * dv + i] += dy[i] * w[i] * xh * sg * (1.0f - sg);
            if (dw) dw[i] += dy[i] * xh * sg;
        }
    }
}

/* ---------------------------------------------------------------------------------------
 * core: common pieces
 * --------------------------------------------------------------------------------------- */

int64_t arl_kda_num_chunks(const int32_t *cu, int32_t N, int64_t T, int64_t C) {
    ARL_ASSERT(C >= 1);
    int64_t n = 0;
    for (int32_t i = 0; i < N; i++) {
        int64_t len = doc_hi(cu, i, T) - doc_lo(cu, i);
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

/* One recurrence step (spec 3.3) of one head on state St (dk, dv); o_out (dv) or NULL.
 * Column j of the state only depends on column j, so the five steps run column by column. */
static void recurrent_step(float *St, float *o_out, const float *q, const float *k, const float *v,
                           const float *g, float beta, int64_t dk, int64_t dv, float scale) {
    for (int64_t c = 0; c < dk; c++) {
        float a = expf(g[c]);
        for (int64_t j = 0; j < dv; j++)
            St[c * dv + j] *= a; /* 1. decay rows */
    }
    for (int64_t j = 0; j < dv; j++) {
        float r = 0.0f;
        for (int64_t c = 0; c < dk; c++)
            r += St[c * dv + j] * k[c];  /* 2. prediction */
        float delta = beta * (v[j] - r); /* 3. error */
        float oj = 0.0f;
        for (int64_t c = 0; c < dk; c++) {
            St[c * dv + j] += k[c] * delta; /* 4. write */
            oj += St[c * dv + j] * q[c];    /* 5. read after */
        }
        if (o_out) o_out[j] = scale * oj;
    }
}

static void recurrent_fwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const core_args *A = vctx;
    int64_t H = A->H, dk = A->dk_, dv = A->dv_, C = A->C;
    for (int64_t h = h0; h < h1; h++) {
        int64_t chunk = 0;
        for (int32_t di = 0; di < A->N; di++) {
            int64_t a = doc_lo(A->cu, di), b = doc_hi(A->cu, di, A->T);
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
    check_docs(cu, N, T);
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
    arl_k_parallel_for(H, 1, recurrent_fwd_heads, &A);
}

/* ---------------------------------------------------------------------------------------
 * core: chunkwise form (spec 3.5) - per-head buffers
 * --------------------------------------------------------------------------------------- */

typedef struct chunk_buf {
    /* forward: n <= C rows */
    float *Q, *K, *V, *G, *Gam, *eGnG, *Kbar, *GQ, *Xw, *Xu, *Wm, *Vt; /* (C, dk) or (C, dv) */
    float *Akk0, *Akk, *Tm, *Aqk;                                      /* (C, C) */
    float *beta;                                                       /* (C) */
    float *Snew;                                                       /* (dk, dv) */
    /* backward */
    float *dO, *dVt, *dXu, *dV;                 /* (C, dv) */
    float *M, *dW, *dKbar, *dXw, *dQ, *dK, *dG; /* (C, dk) */
    float *dAqk, *dT, *dAkk, *tmp;              /* (C, C) */
    float *dB, *dGn;                            /* (C), (dk) */
    float *dS, *dSn;                            /* (dk, dv) */
} chunk_buf;

static int64_t chunk_fwd_floats(int64_t dk, int64_t dv, int64_t C) {
    return 9 * C * dk + 3 * C * dv + 4 * C * C + C + dk * dv;
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
        for (int64_t c = 0; c < dk; c++) {
            B->Q[r * dk + c] = A->scale * A->q[(t * H + h) * dk + c];
            B->K[r * dk + c] = A->k[(t * H + h) * dk + c];
            B->G[r * dk + c] = A->g[(t * H + h) * dk + c];
        }
        for (int64_t j = 0; j < dv; j++)
            B->V[r * dv + j] = A->v[(t * H + h) * dv + j];
        B->beta[r] = A->beta[t * H + h];
    }
}

/* Spec 3.5 steps (1)-(5) and the pieces of (6)-(8) for a loaded chunk with incoming state
 * S (dk, dv); (1) turns G from g into its inclusive cumsum. */
static void chunk_prepare(chunk_buf *B, const float *S, int64_t n, int64_t dk, int64_t dv,
                          int64_t C) {
    (void)C;
    /* (1) G = cumsum(g), Gam = exp(G), exp(G_n - G), Kbar, Gam * Q */
    for (int64_t r = 1; r < n; r++)
        for (int64_t c = 0; c < dk; c++)
            B->G[r * dk + c] += B->G[(r - 1) * dk + c];
    const float *Gn = B->G + (n - 1) * dk;
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < dk; c++) {
            int64_t rc = r * dk + c;
            B->Gam[rc] = expf(B->G[rc]);
            B->eGnG[rc] = expf(Gn[c] - B->G[rc]);
            B->Kbar[rc] = B->eGnG[rc] * B->K[rc];
            B->GQ[rc] = B->Gam[rc] * B->Q[rc];
        }
    /* (2), (6): A_kk / beta_r (Akk0) for i < r and A_qk for i <= r, difference form */
    for (int64_t r = 0; r < n; r++) {
        const float *Gr = B->G + r * dk, *Kr = B->K + r * dk, *Qr = B->Q + r * dk;
        for (int64_t i = 0; i < n; i++) {
            float akk = 0.0f, aqk = 0.0f;
            if (i <= r) {
                const float *Gi = B->G + i * dk, *Ki = B->K + i * dk;
                for (int64_t c = 0; c < dk; c++) {
                    float e = expf(Gr[c] - Gi[c]);
                    akk += Kr[c] * Ki[c] * e;
                    aqk += Qr[c] * Ki[c] * e;
                }
            }
            B->Akk0[r * n + i] = i < r ? akk : 0.0f;
            B->Akk[r * n + i] = i < r ? B->beta[r] * akk : 0.0f;
            B->Aqk[r * n + i] = i <= r ? aqk : 0.0f;
        }
    }
    /* (3) T = (I + A_kk)^-1 by forward substitution: row i, ascending j, in place */
    float *Tm = B->Tm;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++)
            Tm[i * n + j] = -B->Akk[i * n + j];
    for (int64_t i = 1; i < n; i++)
        for (int64_t j = 0; j < i; j++) {
            float acc = Tm[i * n + j];
            for (int64_t m = j + 1; m < i; m++)
                acc += Tm[i * n + m] * Tm[m * n + j];
            Tm[i * n + j] = acc;
        }
    for (int64_t i = 0; i < n; i++)
        Tm[i * n + i] = 1.0f;
    /* (4) W = T diag(beta)(Gam K), U = T diag(beta) V */
    for (int64_t r = 0; r < n; r++) {
        for (int64_t c = 0; c < dk; c++)
            B->Xw[r * dk + c] = B->beta[r] * B->Gam[r * dk + c] * B->K[r * dk + c];
        for (int64_t j = 0; j < dv; j++)
            B->Xu[r * dv + j] = B->beta[r] * B->V[r * dv + j];
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
    for (int64_t c = 0; c < dk; c++) {
        float e = expf(Gn[c]);
        for (int64_t j = 0; j < dv; j++)
            Sout[c * dv + j] += e * S[c * dv + j];
    }
}

static void chunk_fwd_heads(void *vctx, int64_t h0, int64_t h1) {
    const core_args *A = vctx;
    int64_t H = A->H, dk = A->dk_, dv = A->dv_, C = A->C;
    for (int64_t h = h0; h < h1; h++) {
        chunk_buf B;
        chunk_buf_bind(&B, A->ws + h * A->ws_head, dk, dv, C, 0);
        int64_t chunk = 0;
        for (int32_t di = 0; di < A->N; di++) {
            int64_t a = doc_lo(A->cu, di), b = doc_hi(A->cu, di, A->T);
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
    check_docs(cu, N, T);
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
    arl_k_parallel_for(H, 1, chunk_fwd_heads, &A);
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
            int64_t a = doc_lo(A->cu, di), b = doc_hi(A->cu, di, A->T);
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

void arl_kda_recurrent_bwd(float *dq, float *dk_, float *dv_, float *dg, float *dbeta, float *dS0,
                           const float *d_o, const float *dS_T, const float *q, const float *k,
                           const float *v, const float *g, const float *beta,
                           const float *chunk_states, const int32_t *cu, int32_t N, int64_t T,
                           int64_t H, int64_t dk, int64_t dv, float scale, int64_t C, float *ws) {
    check_docs(cu, N, T);
    ARL_ASSERT(C >= 1 && ws && chunk_states);
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
    arl_k_parallel_for(H, 1, recurrent_bwd_heads, &A);
}

/* ---------------------------------------------------------------------------------------
 * core: backward, chunkwise rule (spec 3.8)
 * --------------------------------------------------------------------------------------- */

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
    /* pair terms of A_qk (tq, tk) and A_kk (ti, tj), sharing e = exp(G[r,c] - G[i,c]) */
    for (int64_t r = 0; r < n; r++) {
        const float *Gr = B->G + r * dk, *Kr = B->K + r * dk, *Qr = B->Q + r * dk;
        float *dQr = B->dQ + r * dk, *dKr = B->dK + r * dk, *dGr = B->dG + r * dk;
        for (int64_t i = 0; i <= r; i++) {
            float aq = B->dAqk[r * n + i], dd = i < r ? B->dAkk[r * n + i] : 0.0f;
            if (aq == 0.0f && dd == 0.0f) continue;
            const float *Gi = B->G + i * dk, *Ki = B->K + i * dk;
            float *dKi = B->dK + i * dk, *dGi = B->dG + i * dk;
            for (int64_t c = 0; c < dk; c++) {
                float e = expf(Gr[c] - Gi[c]);
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
            int64_t a = doc_lo(A->cu, di), b = doc_hi(A->cu, di, A->T);
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
    check_docs(cu, N, T);
    ARL_ASSERT(C >= 1 && C <= 256 && ws && chunk_states);
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
    arl_k_parallel_for(H, 1, chunk_bwd_heads, &A);
}
