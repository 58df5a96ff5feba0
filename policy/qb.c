/* policy/qb.c: Quantile Balancing of spec 9 (see policy/qb.h). */
#include "policy/qb.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"

int64_t arl_qb_ws_floats(int64_t m, int64_t E) {
    return m * E + 2 * m + E;
}

/* The value of rank `rank` (0 = largest) of buf (n), reordering buf (quickselect). */
static float select_desc(float *buf, int64_t n, int64_t rank) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = buf[lo + (hi - lo) / 2];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (buf[i] > pivot)
                i++;
            while (buf[j] < pivot)
                j--;
            if (i <= j) {
                float t = buf[i];
                buf[i] = buf[j];
                buf[j] = t;
                i++;
                j--;
            }
        }
        if (rank <= j)
            hi = j;
        else if (rank >= i)
            lo = i;
        else
            return buf[rank];
    }
    return buf[rank];
}

void arl_qb_cutoffs(float *alpha, const float *s, const float *b_old, int64_t m, int64_t E,
                    int64_t k, float *ws) {
    ARL_ASSERT(k >= 1 && k < E);
    float *row = ws;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < E; j++)
            row[j] = s[i * E + j] + b_old[j];
        alpha[i] = select_desc(row, E, k); /* the (k+1)-th largest */
    }
}

/* The linear quantile at `level` >= 0 of the m values in buf (spec 9.2 step 3: with r sorted
 * ascending, pi = (m - 1) level and phi = floor(pi), r[phi] + (pi - phi) (r[phi + 1] - r[phi]);
 * r[m - 1] where phi + 1 >= m), reordering buf.  The two order statistics come from a selection
 * instead of a sort, in O(m) instead of O(m log m), with the same value: r[phi] is the q-th
 * largest (q = m - 1 - phi, from 0), and after select_desc the q values before it are the
 * largest, so r[phi + 1] is the smallest of those. */
static float quantile_select(float *buf, int64_t m, double level) {
    double pi = (double)(m - 1) * level;
    int64_t phi = (int64_t)floor(pi);
    if (phi < 0) phi = 0;
    if (phi + 1 >= m) return select_desc(buf, m, 0); /* the largest */
    const int64_t q = m - 1 - phi;                   /* r[phi] is the q-th largest (0-based) */
    const float lo = select_desc(buf, m, q);
    float hi = buf[0]; /* r[phi + 1]: the smallest of the q values larger than or equal to lo */
    for (int64_t i = 1; i < q; i++)
        hi = buf[i] < hi ? buf[i] : hi;
    double lam = pi - (double)phi;
    return (float)((double)lo + lam * ((double)hi - (double)lo));
}

static void center(float *b_new, const float *bhat, int64_t E) {
    double mean = 0.0;
    for (int64_t j = 0; j < E; j++)
        mean += bhat[j];
    mean /= (double)E;
    for (int64_t j = 0; j < E; j++)
        b_new[j] = (float)((double)bhat[j] - mean);
}

static arl_status check_args(const char *fn, int64_t m, int64_t E, int64_t k) {
    if (m <= 0) return arl_errorf(ARL_ERR_ARG, "%s: no tokens in the step (keep the old bias)", fn);
    if (k < 1 || k >= E)
        return arl_errorf(ARL_ERR_ARG, "%s: k = %lld must be in [1, E = %lld)", fn, (long long)k,
                          (long long)E);
    return ARL_OK;
}

/* r_:,j into col (m), given the cutoffs alpha (m). */
static void column(float *col, const float *alpha, const float *s, int64_t m, int64_t E,
                   int64_t j) {
    for (int64_t i = 0; i < m; i++)
        col[i] = alpha[i] - s[i * E + j];
}

arl_status arl_qb_exact(float *b_new, float *bhat, const float *s, const float *b_old, int64_t m,
                        int64_t E, int64_t k, float *ws) {
    ARL_TRY(check_args("qb exact", m, E, k));
    float *alpha = ws, *col = ws + m, *rowbuf = ws + 2 * m, *bh = bhat ? bhat : b_new;
    arl_qb_cutoffs(alpha, s, b_old, m, E, k, rowbuf);
    for (int64_t j = 0; j < E; j++) {
        column(col, alpha, s, m, E, j);
        bh[j] = quantile_select(col, m, (double)k / (double)E);
    }
    center(b_new, bh, E);
    return ARL_OK;
}

void arl_qb_hist_range(float *lo, float *w, const float *b_old, int64_t E, int64_t Nb) {
    float mn = b_old[0], mx = b_old[0];
    for (int64_t j = 1; j < E; j++) {
        mn = b_old[j] < mn ? b_old[j] : mn;
        mx = b_old[j] > mx ? b_old[j] : mx;
    }
    *lo = mn - 1.0f;
    *w = (mx + 1.0f - *lo) / (float)Nb;
}

void arl_qb_hist_count(int64_t *cnt, const float *s, const float *b_old, int64_t m, int64_t E,
                       int64_t k, float lo, float w, int64_t Nb, float *ws) {
    float *alpha = ws, *rowbuf = ws + m;
    arl_qb_cutoffs(alpha, s, b_old, m, E, k, rowbuf);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < E; j++) {
            float r = alpha[i] - s[i * E + j];
            float f = floorf((r - lo) / w);
            int64_t bin =
                !(f > 0.0f) ? 0 : (f > (float)(Nb - 1) ? Nb - 1 : (int64_t)f); /* NaN: 0 */
            cnt[j * Nb + bin] += 1;
        }
}

arl_status arl_qb_hist_solve(float *b_new, float *bhat, const int64_t *cnt, int64_t m, int64_t E,
                             int64_t k, float lo, float w, int64_t Nb) {
    ARL_TRY(check_args("qb histogram", m, E, k));
    if (Nb < 1) return arl_errorf(ARL_ERR_ARG, "qb histogram: %lld bins", (long long)Nb);
    float *bh = bhat ? bhat : b_new;
    double q = (double)m * (double)k / (double)E;
    for (int64_t j = 0; j < E; j++) {
        const int64_t *c = cnt + j * Nb;
        int64_t cum = 0, prev = 0, t = Nb - 1;
        for (int64_t u = 0; u < Nb; u++) {
            prev = cum;
            cum += c[u];
            if ((double)cum >= q) {
                t = u;
                break;
            }
        }
        double lam = (q - (double)prev) / (double)(c[t] > 1 ? c[t] : 1);
        lam = lam < 0.0 ? 0.0 : (lam > 1.0 ? 1.0 : lam);
        bh[j] = (float)((double)lo + ((double)t + lam) * (double)w);
    }
    center(b_new, bh, E);
    return ARL_OK;
}

arl_status arl_qb_band(float *b_new, float *bhat, const int64_t *loads, const float *s,
                       const float *b_old, int64_t m, int64_t E, int64_t k, float lam_lo,
                       float lam_hi, float *ws) {
    ARL_TRY(check_args("qb band", m, E, k));
    if (lam_lo < 0.0f || lam_hi < 0.0f)
        return arl_errorf(ARL_ERR_ARG, "qb band: band widths %g, %g must be >= 0", (double)lam_lo,
                          (double)lam_hi);
    float *alpha = ws, *col = ws + m, *rowbuf = ws + 2 * m, *bh = bhat ? bhat : b_new;
    arl_qb_cutoffs(alpha, s, b_old, m, E, k, rowbuf);
    double q = (double)m * (double)k / (double)E;
    double qmin = (1.0 - lam_lo) * q, qmax = (1.0 + lam_hi) * q;
    for (int64_t j = 0; j < E; j++) {
        double load = (double)loads[j];
        if (load >= qmin && load <= qmax && !(lam_lo == 0.0f && lam_hi == 0.0f)) {
            bh[j] = b_old[j]; /* inside the band: untouched */
            continue;
        }
        double qj = load < qmin ? qmin : (load > qmax ? qmax : load);
        column(col, alpha, s, m, E, j);
        bh[j] = quantile_select(col, m, qj / (double)m);
    }
    center(b_new, bh, E);
    return ARL_OK;
}

void arl_qb_count_loads(int64_t *loads, const int32_t *sel, int64_t m, int64_t k, int64_t E) {
    memset(loads, 0, sizeof(int64_t) * (size_t)E);
    for (int64_t i = 0; i < m * k; i++) {
        ARL_ASSERT(sel[i] >= 0 && sel[i] < E);
        loads[sel[i]]++;
    }
}
