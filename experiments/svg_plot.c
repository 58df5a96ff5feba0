/* experiments/svg_plot.c: line plots as SVG (see svg_plot.h for the drawing rules).
 * Layout, in px: title band on top, y tick labels and the rotated y label on the left, x tick
 * labels and the x label below, the legend to the right of the plot area. */
#include "experiments/svg_plot.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"

#define SVG_CHAR_W 7.0    /* estimated width of one character at font-size 12 */
#define SVG_MARKER_MAX 40 /* series with at most this many drawable points get markers */
#define SVG_NAME_MAX 40   /* legend names longer than this (characters) are cut on the left */
#define SVG_MAX_TICKS 60

static const char *const svg_colors[10] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
static const char *const svg_dashes[4] = {NULL, "7,3", "2,2", "9,3,2,3"};

/* ---- text ---- */

static void xml_text(FILE *f, const char *s) {
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        switch (c) {
        case '&':
            fputs("&amp;", f);
            break;
        case '<':
            fputs("&lt;", f);
            break;
        case '>':
            fputs("&gt;", f);
            break;
        case '"':
            fputs("&quot;", f);
            break;
        case '\'':
            fputs("&apos;", f);
            break;
        default:
            fputc(c < 0x20 ? '?' : c, f);
        }
    }
}

/* Number of UTF-8 characters of s (continuation bytes not counted). */
static size_t utf8_len(const char *s) {
    size_t n = 0;
    for (; *s; s++)
        if (((unsigned char)*s & 0xC0) != 0x80) n++;
    return n;
}

/* The last `keep` characters of s (a pointer into s, on a character boundary). */
static const char *utf8_tail(const char *s, size_t keep) {
    size_t n = utf8_len(s);
    if (n <= keep) return s;
    size_t skip = n - keep;
    for (; *s; s++) {
        if (((unsigned char)*s & 0xC0) != 0x80) {
            if (skip == 0) break;
            skip--;
        }
    }
    return s;
}

/* ---- axes ---- */

typedef struct axis {
    int log;       /* log10 axis: lo, hi are exponents */
    double lo, hi; /* axis range (data units, or log10 of them) */
    double step;   /* tick step (linear), decades per label (log) */
    int decimals;  /* fixed decimals of labels; -1: %g form with sig digits */
    int sig;       /* significant digits of the %g form */
} axis;

/* 1, 2 or 5 times a power of ten, near raw. */
static double nice_step(double raw) {
    if (!(raw > 0) || !isfinite(raw)) return 1;
    double mag = pow(10, floor(log10(raw)));
    double f = raw / mag;
    double m = f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10;
    double s = m * mag;
    return isfinite(s) && s > 0 ? s : raw;
}

/* A linear axis over data [lo, hi] (finite, lo <= hi) with about 5 ticks. */
static void axis_linear(axis *a, double lo, double hi, int integer_data) {
    a->log = 0;
    double m = fmax(fabs(lo), fabs(hi));
    if (hi - lo <= 1e-9 * m || hi == lo) { /* constant (to 9 digits): widen around it */
        double mid = lo / 2 + hi / 2;
        double d = mid != 0 ? fabs(mid) * 0.1 : 0.5;
        if (integer_data && d < 1) d = 1;
        lo = mid - d;
        hi = mid + d;
    }
    double range = hi / 2 - lo / 2; /* half the range: never overflows */
    if (!integer_data) { /* 3% headroom so lines do not run along the frame; not across 0 */
        double pad = range * 0.06;
        double plo = lo - pad, phi = hi + pad;
        lo = lo >= 0 && plo < 0 ? 0 : isfinite(plo) ? plo : lo;
        hi = hi <= 0 && phi > 0 ? 0 : isfinite(phi) ? phi : hi;
        range = hi / 2 - lo / 2;
    }
    double step = nice_step(range * 0.4); /* about 5 ticks over 2 * range */
    if (integer_data && step < 1) step = 1;
    double nlo = floor(lo / step) * step, nhi = ceil(hi / step) * step;
    a->lo = isfinite(nlo) ? nlo : lo;
    a->hi = isfinite(nhi) ? nhi : hi;
    a->step = step;
    m = fmax(fabs(a->lo), fabs(a->hi));
    double sig = ceil(log10(m / step) + 1e-9) + 1;
    a->sig = !(sig >= 2) ? 2 : sig > 17 ? 17 : (int)sig;
    if (m >= 1e7 || step < 1e-5)
        a->decimals = -1;
    else
        a->decimals = step >= 1 ? 0 : (int)-floor(log10(step) + 1e-9);
}

/* A log10 axis over positive data [lo, hi]. */
static void axis_log(axis *a, double lo, double hi) {
    a->log = 1;
    a->lo = floor(log10(lo));
    a->hi = ceil(log10(hi));
    if (a->hi <= a->lo) a->hi = a->lo + 1;
    a->step = ceil((a->hi - a->lo) / 8);
    a->decimals = 0;
    a->sig = 1;
}

/* Position in [0, 1] of data value v along the axis. */
static double axis_t(const axis *a, double v) {
    if (a->log) return (log10(v) - a->lo) / (a->hi - a->lo);
    return (v / 2 - a->lo / 2) / (a->hi / 2 - a->lo / 2);
}

static void fmt_num(char *buf, size_t cap, double v, int decimals, int sig) {
    if (decimals >= 0)
        snprintf(buf, cap, "%.*f", decimals, v);
    else
        snprintf(buf, cap, "%.*g", sig, v);
    if (!strcmp(buf, "-0") || strspn(buf, "-0.") == strlen(buf)) { /* "-0.00" -> "0" form */
        if (buf[0] == '-') memmove(buf, buf + 1, strlen(buf));
    }
}

/* Tick values of an axis (data units for linear, exponents for log); returns the count. */
static int axis_ticks(const axis *a, double *t, int cap) {
    int n = 0;
    if (a->log) {
        for (double e = a->lo; e <= a->hi + 1e-9 && n < cap; e += a->step)
            t[n++] = e;
        return n;
    }
    double k0 = ceil(a->lo / a->step - 1e-9);
    for (double k = k0; n < cap; k++) {
        double v = k * a->step;
        if (!isfinite(v) || v > a->hi + a->step * 1e-9) break;
        t[n++] = fabs(v) < a->step * 1e-9 ? 0 : v;
    }
    return n;
}

static void tick_label(const axis *a, double v, char *buf, size_t cap) {
    if (a->log) {
        int e = (int)lround(v);
        if (e >= -4 && e <= 5)
            fmt_num(buf, cap, pow(10, e), e < 0 ? -e : 0, 0);
        else
            snprintf(buf, cap, "1e%d", e);
        return;
    }
    fmt_num(buf, cap, v, a->decimals, a->sig);
}

/* ---- decimation ---- */

int64_t arl_svg_decimate(const double *x, const double *y, int64_t n, double x0, double x1,
                         int32_t buckets, int64_t *keep) {
    ARL_ASSERT(buckets >= 1 && x1 > x0);
    int64_t out = 0, i = 0;
    double scale = (double)buckets / (x1 / 2 - x0 / 2) / 2;
    while (i < n) {
        double bf = floor((x[i] / 2 - x0 / 2) * scale * 2);
        int64_t b = bf < 0 ? 0 : bf >= buckets ? buckets - 1 : (int64_t)bf;
        int64_t j = i + 1, imin = i, imax = i;
        for (; j < n; j++) {
            double cf = floor((x[j] / 2 - x0 / 2) * scale * 2);
            int64_t c = cf < 0 ? 0 : cf >= buckets ? buckets - 1 : (int64_t)cf;
            if (c != b) break;
            if (y[j] < y[imin]) imin = j;
            if (y[j] > y[imax]) imax = j;
        }
        int64_t last = j - 1;
        int64_t cand[4] = {i, imin < imax ? imin : imax, imin < imax ? imax : imin, last};
        for (int k = 0; k < 4; k++)
            if (out == 0 || cand[k] > keep[out - 1]) keep[out++] = cand[k];
        i = j;
    }
    return out;
}

/* ---- the plot ---- */

typedef struct frame {
    double left, top, right, bottom; /* plot area in px */
    axis ax, ay;
} frame;

static double px_x(const frame *fr, double x) {
    return fr->left + axis_t(&fr->ax, x) * (fr->right - fr->left);
}
static double px_y(const frame *fr, double y) {
    return fr->bottom - axis_t(&fr->ay, y) * (fr->bottom - fr->top);
}

static int drawable(double x, double y, int log_y) {
    return isfinite(x) && isfinite(y) && (!log_y || y > 0);
}

/* Emit one run [a, b) of drawable points of a series. */
static void draw_run(FILE *f, const frame *fr, const arl_svg_series *s, int64_t a, int64_t b,
                     int32_t buckets, int64_t *keep, const char *color, arl_svg_plot_info *info) {
    int64_t len = b - a;
    if (len == 1) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\" stroke=\"none\"/>\n",
                px_x(fr, s->x[a]), px_y(fr, s->y[a]), color);
        info->vertices++;
        return;
    }
    int64_t m = arl_svg_decimate(s->x + a, s->y + a, len, fr->ax.lo, fr->ax.hi, buckets, keep);
    fputs("<polyline points=\"", f);
    for (int64_t k = 0; k < m; k++) {
        int64_t i = a + keep[k];
        fprintf(f, "%s%.1f,%.1f", k ? " " : "", px_x(fr, s->x[i]), px_y(fr, s->y[i]));
    }
    fputs("\"/>\n", f);
    info->vertices += m;
}

arl_status arl_svg_plot_fwrite(FILE *f, const arl_svg_plot *p, const arl_svg_series *s,
                               int32_t n_series, arl_svg_plot_info *info_out) {
    arl_svg_plot_info info = {0};
    double W = p->width > 0 ? p->width : 960, H = p->height > 0 ? p->height : 540;
    if (W < 320) W = 320;
    if (H < 200) H = 200;
    int32_t max_legend = p->max_legend > 0 ? p->max_legend : 30;
    if (n_series < 0) n_series = 0;

    /* data ranges over finite points; positivity for the log decision */
    double xlo = INFINITY, xhi = -INFINITY, ylo = INFINITY, yhi = -INFINITY;
    double yplo = INFINITY, yphi = -INFINITY; /* over y > 0 */
    int all_pos = 1, x_int = 1;
    int64_t max_n = 0;
    for (int32_t i = 0; i < n_series; i++) {
        info.points_in += s[i].n;
        if (s[i].n > max_n) max_n = s[i].n;
        for (int64_t k = 0; k < s[i].n; k++) {
            double x = s[i].x[k], y = s[i].y[k];
            if (!isfinite(x) || !isfinite(y)) continue;
            xlo = fmin(xlo, x), xhi = fmax(xhi, x);
            ylo = fmin(ylo, y), yhi = fmax(yhi, y);
            if (y > 0)
                yplo = fmin(yplo, y), yphi = fmax(yphi, y);
            else
                all_pos = 0;
            if (x != floor(x)) x_int = 0;
        }
    }
    int any = xlo <= xhi;
    int log_y = p->yscale == ARL_SVG_SCALE_LOG ||
                (p->yscale == ARL_SVG_SCALE_AUTO && any && all_pos && yphi / yplo >= 100);
    if (log_y && !(yplo <= yphi)) log_y = 0; /* log asked, but nothing positive to show */
    info.log_y = log_y;

    frame fr;
    if (any)
        axis_linear(&fr.ax, xlo, xhi, x_int);
    else
        axis_linear(&fr.ax, 0, 1, 0);
    if (log_y)
        axis_log(&fr.ay, yplo, yphi);
    else if (any)
        axis_linear(&fr.ay, ylo, yhi, 0);
    else
        axis_linear(&fr.ay, 0, 1, 0);

    double yt[SVG_MAX_TICKS], xt[SVG_MAX_TICKS];
    int nyt = axis_ticks(&fr.ay, yt, SVG_MAX_TICKS), nxt = axis_ticks(&fr.ax, xt, SVG_MAX_TICKS);
    char lab[64];
    size_t ylab_w = 1;
    for (int i = 0; i < nyt; i++) {
        tick_label(&fr.ay, yt[i], lab, sizeof lab);
        if (strlen(lab) > ylab_w) ylab_w = strlen(lab);
    }

    /* series without a drawable point; legend width from the longest (cut) name */
    char *empty = n_series ? calloc((size_t)n_series, 1) : NULL;
    if (n_series && !empty) return arl_errorf(ARL_ERR_NOMEM, "svg plot: out of memory");
    size_t name_w = 0;
    for (int32_t i = 0; i < n_series; i++) {
        empty[i] = 1;
        for (int64_t k = 0; k < s[i].n && empty[i]; k++)
            if (drawable(s[i].x[k], s[i].y[k], log_y)) empty[i] = 0;
        size_t l = s[i].name ? utf8_len(s[i].name) : 0;
        if (l > SVG_NAME_MAX) l = SVG_NAME_MAX;
        if (empty[i]) l += 10; /* " (no data)" */
        if (l > name_w) name_w = l;
    }
    double legend_w = n_series ? 44 + SVG_CHAR_W * (double)name_w : 0;
    if (legend_w > W / 3) legend_w = W / 3;

    fr.top = p->title ? 44 : 16;
    fr.left = (p->ylabel ? 30 : 10) + SVG_CHAR_W * (double)ylab_w + 10;
    fr.right = W - legend_w - 16;
    fr.bottom = H - (p->xlabel ? 50 : 32);
    if (fr.right - fr.left < 40) fr.right = fr.left + 40;
    int32_t buckets = (int32_t)(fr.right - fr.left);
    info.plot_width_px = buckets;

    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"%.0f\" "
            "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" font-family=\"Helvetica, Arial, "
            "sans-serif\" font-size=\"12\">\n",
            W, H, W, H);
    fprintf(f,
            "<defs><clipPath id=\"plotarea\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
            "height=\"%.1f\"/></clipPath></defs>\n",
            fr.left - 3, fr.top - 3, fr.right - fr.left + 6, fr.bottom - fr.top + 6);
    fprintf(f, "<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", W, H);
    if (p->title) {
        fprintf(f,
                "<text x=\"%.1f\" y=\"26\" font-size=\"16\" font-weight=\"bold\" "
                "text-anchor=\"middle\">",
                (fr.left + fr.right) / 2);
        xml_text(f, p->title);
        fputs("</text>\n", f);
    }

    /* grid and tick labels */
    fputs("<g stroke=\"#e0e0e0\" stroke-width=\"1\">\n", f);
    for (int i = 0; i < nyt; i++) {
        double py =
            fr.bottom - axis_t(&fr.ay, fr.ay.log ? pow(10, yt[i]) : yt[i]) * (fr.bottom - fr.top);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", fr.left, py,
                fr.right, py);
    }
    if (fr.ay.log && fr.ay.hi - fr.ay.lo <= 4) { /* minor grid at 2..9 x 10^e */
        for (double e = fr.ay.lo; e < fr.ay.hi; e++)
            for (int m = 2; m <= 9; m++) {
                double py = fr.bottom - axis_t(&fr.ay, m * pow(10, e)) * (fr.bottom - fr.top);
                fprintf(f,
                        "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                        "stroke=\"#f2f2f2\"/>\n",
                        fr.left, py, fr.right, py);
            }
    }
    for (int i = 0; i < nxt; i++) {
        double px = px_x(&fr, xt[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", px, fr.top, px,
                fr.bottom);
    }
    fputs("</g>\n<g fill=\"#333333\">\n", f);
    for (int i = 0; i < nyt; i++) {
        double py =
            fr.bottom - axis_t(&fr.ay, fr.ay.log ? pow(10, yt[i]) : yt[i]) * (fr.bottom - fr.top);
        tick_label(&fr.ay, yt[i], lab, sizeof lab);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", fr.left - 6,
                py + 4, lab);
    }
    for (int i = 0; i < nxt; i++) {
        tick_label(&fr.ax, xt[i], lab, sizeof lab);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                px_x(&fr, xt[i]), fr.bottom + 17, lab);
    }
    fputs("</g>\n", f);
    fprintf(f,
            "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
            "stroke=\"#333333\"/>\n",
            fr.left, fr.top, fr.right - fr.left, fr.bottom - fr.top);
    if (p->xlabel) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (fr.left + fr.right) / 2,
                fr.bottom + 38);
        xml_text(f, p->xlabel);
        fputs("</text>\n", f);
    }
    if (p->ylabel) {
        double cy = (fr.top + fr.bottom) / 2;
        fprintf(f,
                "<text x=\"16\" y=\"%.1f\" text-anchor=\"middle\" "
                "transform=\"rotate(-90 16 %.1f)\">",
                cy, cy);
        xml_text(f, p->ylabel);
        if (log_y) fputs(" (log scale)", f);
        fputs("</text>\n", f);
    }
    if (!any) {
        fprintf(f,
                "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#888888\">no finite "
                "data</text>\n",
                (fr.left + fr.right) / 2, (fr.top + fr.bottom) / 2);
    }

    /* series */
    int64_t *keep = max_n > 0 ? malloc(sizeof(int64_t) * (size_t)max_n) : NULL;
    if (max_n > 0 && !keep) {
        free(empty);
        return arl_errorf(ARL_ERR_NOMEM, "svg plot: out of memory");
    }
    for (int32_t i = 0; i < n_series; i++) {
        const char *color = svg_colors[i % 10];
        const char *dash = svg_dashes[(i / 10) % 4];
        int64_t ndraw = 0;
        for (int64_t k = 0; k < s[i].n; k++) {
            double x = s[i].x[k], y = s[i].y[k];
            if (drawable(x, y, log_y))
                ndraw++;
            else if (!isfinite(x) || !isfinite(y))
                info.skipped_nonfinite++;
            else
                info.skipped_nonpositive++;
        }
        if (ndraw == 0) {
            info.series_empty++;
            continue;
        }
        fprintf(
            f,
            "<g fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" stroke-linejoin=\"round\"%s%s%s "
            "clip-path=\"url(#plotarea)\">\n<title>",
            color, dash ? " stroke-dasharray=\"" : "", dash ? dash : "", dash ? "\"" : "");
        xml_text(f, s[i].name);
        fputs("</title>\n", f);
        for (int64_t k = 0; k < s[i].n;) {
            if (!drawable(s[i].x[k], s[i].y[k], log_y)) {
                k++;
                continue;
            }
            int64_t b = k + 1;
            while (b < s[i].n && drawable(s[i].x[b], s[i].y[b], log_y))
                b++;
            draw_run(f, &fr, &s[i], k, b, buckets, keep, color, &info);
            k = b;
        }
        if (ndraw <= SVG_MARKER_MAX && ndraw > 1) {
            for (int64_t k = 0; k < s[i].n; k++)
                if (drawable(s[i].x[k], s[i].y[k], log_y))
                    fprintf(f,
                            "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2\" fill=\"%s\" "
                            "stroke=\"none\"/>\n",
                            px_x(&fr, s[i].x[k]), px_y(&fr, s[i].y[k]), color);
        }
        fputs("</g>\n", f);
    }
    free(keep);

    /* legend */
    if (n_series > 0) {
        double lx = fr.right + 16, ly = fr.top + 8;
        int32_t rows = (int32_t)((fr.bottom - fr.top) / 16);
        if (rows < 1) rows = 1;
        int32_t shown = n_series;
        if (shown > max_legend) shown = max_legend;
        if (shown > rows) shown = rows;
        if (shown < n_series && shown > 1 && shown == rows) shown--;
        for (int32_t i = 0; i < shown; i++) {
            double y = ly + 16.0 * i;
            const char *dash = svg_dashes[(i / 10) % 4];
            fprintf(f,
                    "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                    "stroke-width=\"2\"%s%s%s/>\n",
                    lx, y, lx + 24, y, svg_colors[i % 10], dash ? " stroke-dasharray=\"" : "",
                    dash ? dash : "", dash ? "\"" : "");
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\"%s>", lx + 30, y + 4,
                    empty[i] ? " fill=\"#999999\"" : "");
            const char *name = s[i].name ? s[i].name : "";
            if (utf8_len(name) > SVG_NAME_MAX) {
                fputs("\xE2\x80\xA6", f); /* ellipsis */
                name = utf8_tail(name, SVG_NAME_MAX - 1);
            }
            xml_text(f, name);
            if (empty[i]) fputs(" (no data)", f);
            fputs("</text>\n", f);
        }
        if (shown < n_series)
            fprintf(
                f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555555\">\xE2\x80\xA6 and %d more</text>\n",
                lx, ly + 16.0 * shown + 4, (int)(n_series - shown));
    }
    free(empty);
    fputs("</svg>\n", f);
    if (info_out) *info_out = info;
    if (ferror(f)) return arl_errorf(ARL_ERR_IO, "svg plot: write error");
    return ARL_OK;
}

arl_status arl_svg_plot_write(const char *path, const arl_svg_plot *p, const arl_svg_series *s,
                              int32_t n_series, arl_svg_plot_info *info) {
    size_t len = strlen(path);
    char *tmp = malloc(len + 5);
    if (!tmp) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp", 5);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        arl_status st =
            arl_errorf(ARL_ERR_IO, "%s: cannot open for writing: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    arl_status s2 = arl_svg_plot_fwrite(f, p, s, n_series, info);
    if (fclose(f) != 0 && s2 == ARL_OK)
        s2 = arl_errorf(ARL_ERR_IO, "%s: write error: %s", tmp, strerror(errno));
    if (s2 == ARL_OK && rename(tmp, path) != 0)
        s2 = arl_errorf(ARL_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
    if (s2 != ARL_OK) {
        remove(tmp);
        if (s2 == ARL_ERR_IO && strstr(arl_error_msg(), "svg plot:"))
            arl_error_prefix(s2, "%s", path);
    }
    free(tmp);
    return s2;
}
