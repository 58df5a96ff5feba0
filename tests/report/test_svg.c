/* tests/report/test_svg.c: SVG plots are well-formed XML (balanced tags, quoted attributes,
 * escaped text) for the inputs callers produce: 10^5 points (decimated to the expected count),
 * one point, all-NaN series, NaN/inf gaps, log axes with non-positive values, +-1e308, names
 * with markup characters, more series than the legend holds. */
#include <ctype.h>

#include "experiments/svg_plot.h"
#include "tests/test.h"

/* ---- a small XML checker: enough to catch unbalanced or unquoted output ---- */

typedef struct xml_counts {
    int ok;
    int svg;       /* <svg> elements */
    int polylines; /* <polyline> elements */
    int circles;
    int64_t polyline_points[64]; /* vertices of the first 64 polylines */
    char err[200];
} xml_counts;

static int64_t count_points(const char *s, const char *end) {
    int64_t n = 0;
    int in = 0;
    for (; s < end; s++) {
        int sp = *s == ' ';
        if (!sp && !in) n++;
        in = !sp;
    }
    return n;
}

static void xml_check(const char *t, xml_counts *c) {
    memset(c, 0, sizeof *c);
    char stack[64][32];
    int depth = 0, top_closed = 0;
    const char *p = t;
    while (*p) {
        if (*p != '<') {
            if (*p == '&') { /* entity: &name; */
                const char *q = p + 1;
                while (*q && (isalnum((unsigned char)*q) || *q == '#'))
                    q++;
                if (*q != ';' || q == p + 1) {
                    snprintf(c->err, sizeof c->err, "bare '&' at offset %ld", (long)(p - t));
                    return;
                }
            }
            if (depth == 0 && top_closed && !isspace((unsigned char)*p)) {
                snprintf(c->err, sizeof c->err, "text after the root element");
                return;
            }
            p++;
            continue;
        }
        if (!strncmp(p, "<?", 2)) {
            const char *q = strstr(p, "?>");
            if (!q || p != t) {
                snprintf(c->err, sizeof c->err, "bad <? ... ?>");
                return;
            }
            p = q + 2;
            continue;
        }
        if (!strncmp(p, "<!--", 4)) {
            const char *q = strstr(p, "-->");
            if (!q) return;
            p = q + 3;
            continue;
        }
        int closing = p[1] == '/';
        const char *n0 = p + 1 + closing, *n1 = n0;
        while (isalnum((unsigned char)*n1) || *n1 == ':' || *n1 == '-')
            n1++;
        if (n1 == n0 || n1 - n0 >= 32) {
            snprintf(c->err, sizeof c->err, "bad tag name at offset %ld", (long)(p - t));
            return;
        }
        char name[32];
        memcpy(name, n0, (size_t)(n1 - n0));
        name[n1 - n0] = 0;
        /* attributes: name="value" pairs until > or /> */
        const char *q = n1;
        int self = 0;
        for (;;) {
            while (*q == ' ' || *q == '\n')
                q++;
            if (*q == '>') break;
            if (q[0] == '/' && q[1] == '>') {
                self = 1;
                q++;
                break;
            }
            if (closing || !(isalpha((unsigned char)*q))) {
                snprintf(c->err, sizeof c->err, "bad attribute in <%s> at offset %ld", name,
                         (long)(q - t));
                return;
            }
            while (isalnum((unsigned char)*q) || *q == '-' || *q == ':')
                q++;
            if (q[0] != '=' || q[1] != '"') {
                snprintf(c->err, sizeof c->err, "unquoted attribute in <%s>", name);
                return;
            }
            const char *v0 = q + 2, *v1 = strchr(v0, '"');
            if (!v1 || memchr(v0, '<', (size_t)(v1 - v0))) {
                snprintf(c->err, sizeof c->err, "unterminated attribute in <%s>", name);
                return;
            }
            if (!strcmp(name, "polyline") && !strncmp(q - 6, "points", 6) && c->polylines < 64)
                c->polyline_points[c->polylines] = count_points(v0, v1);
            q = v1 + 1;
        }
        if (closing) {
            if (depth == 0 || strcmp(stack[depth - 1], name)) {
                snprintf(c->err, sizeof c->err, "</%s> does not close <%s>", name,
                         depth ? stack[depth - 1] : "(nothing)");
                return;
            }
            depth--;
            if (depth == 0) top_closed = 1;
        } else {
            if (!strcmp(name, "svg")) c->svg++;
            if (!strcmp(name, "polyline")) c->polylines++;
            if (!strcmp(name, "circle")) c->circles++;
            if (depth == 0 && top_closed) {
                snprintf(c->err, sizeof c->err, "second root element <%s>", name);
                return;
            }
            if (!self) {
                if (depth == 64) return;
                snprintf(stack[depth++], sizeof stack[0], "%s", name);
            }
        }
        p = q + 1;
    }
    if (depth != 0) {
        snprintf(c->err, sizeof c->err, "%d elements left open (<%s>)", depth, stack[depth - 1]);
        return;
    }
    c->ok = c->svg == 1 && top_closed;
    if (!c->ok) snprintf(c->err, sizeof c->err, "no single <svg> root");
}

/* Render to memory; returns the text (caller frees). */
static char *render(const arl_svg_plot *p, const arl_svg_series *s, int32_t n,
                    arl_svg_plot_info *info) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    if (!f) return NULL;
    CHECK_EQ_INT(arl_svg_plot_fwrite(f, p, s, n, info), ARL_OK);
    fclose(f);
    return buf;
}

static char *render_checked(const arl_svg_plot *p, const arl_svg_series *s, int32_t n,
                            arl_svg_plot_info *info, xml_counts *c) {
    char *t = render(p, s, n, info);
    if (!t) return NULL;
    xml_check(t, c);
    CHECK_MSG(c->ok, "not well-formed: %s", c->err);
    CHECK_MSG(!strstr(t, "nan") && !strstr(t, "inf"), "NaN or inf in the output");
    return t;
}

/* 10^5 points of a monotone series: every one of the B buckets (one per pixel column) keeps
 * its first (= minimum) and last (= maximum) point, so the polyline has exactly 2B vertices. */
static void test_large_decimated(void) {
    enum { N = 100000 };
    double *x = malloc(sizeof(double) * N), *y = malloc(sizeof(double) * N);
    for (int i = 0; i < N; i++)
        x[i] = i, y[i] = 0.5 * i;
    arl_svg_series s = {"reward/outcome/mean", x, y, N};
    arl_svg_plot p = {.title = "Reward", .xlabel = "step", .ylabel = "reward"};
    arl_svg_plot_info info;
    xml_counts c;
    char *t = render_checked(&p, &s, 1, &info, &c);
    CHECK_EQ_INT(c.polylines, 1);
    CHECK(info.plot_width_px > 100);
    CHECK_EQ_INT(c.polyline_points[0], 2 * info.plot_width_px);
    CHECK_EQ_INT(info.vertices, 2 * info.plot_width_px);
    CHECK(t && strlen(t) < 200000); /* small file */
    free(t);
    free(x);
    free(y);
}

/* The decimation rule on a small case worked by hand: x = 0..11, B = 3 over [0, 12] gives
 * buckets {0..3}, {4..7}, {8..11}. */
static void test_decimate_rule(void) {
    double x[12], y[12] = {5, 9, 1, 4, /**/ 2, 2, 2, 2, /**/ 3, 0, 8, 1};
    for (int i = 0; i < 12; i++)
        x[i] = i;
    int64_t keep[12];
    int64_t n = arl_svg_decimate(x, y, 12, 0, 12, 3, keep);
    /* bucket 0: first 0, max 1, min 2, last 3; bucket 1: first 4 (= min = max by the earliest
     * tie rule), last 7; bucket 2: first 8, min 9, max 10, last 11 */
    int64_t want[] = {0, 1, 2, 3, 4, 7, 8, 9, 10, 11};
    CHECK_EQ_INT(n, 10);
    for (int i = 0; i < 10 && i < n; i++)
        CHECK_EQ_INT(keep[i], want[i]);
    /* a spike inside a bucket survives */
    double ys[12] = {0, 0, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0};
    n = arl_svg_decimate(x, ys, 12, 0, 12, 3, keep);
    int found = 0;
    for (int64_t i = 0; i < n; i++)
        found |= keep[i] == 5;
    CHECK(found);
}

/* One point: a circle, axes widened around it, labels present. */
static void test_single_point(void) {
    double x = 7, y = 0.25;
    arl_svg_series s = {"kl/k1", &x, &y, 1};
    arl_svg_plot p = {.title = "KL", .xlabel = "step", .ylabel = "KL"};
    arl_svg_plot_info info;
    xml_counts c;
    char *t = render_checked(&p, &s, 1, &info, &c);
    CHECK_EQ_INT(c.polylines, 0);
    CHECK_EQ_INT(c.circles, 1);
    CHECK_EQ_INT(info.vertices, 1);
    CHECK(t && strstr(t, ">7<")); /* the x tick at the point's step */
    free(t);
}

/* All-NaN series, an empty series and no series at all: valid images, nothing drawn. */
static void test_all_nan(void) {
    double x[3] = {1, 2, 3}, y[3] = {NAN, NAN, INFINITY};
    arl_svg_series s[2] = {{"a", x, y, 3}, {"empty", NULL, NULL, 0}};
    arl_svg_plot p = {.title = "nothing", .yscale = ARL_SVG_SCALE_AUTO};
    arl_svg_plot_info info;
    xml_counts c;
    char *t = render_checked(&p, s, 2, &info, &c);
    CHECK_EQ_INT(c.polylines, 0);
    CHECK_EQ_INT(info.series_empty, 2);
    CHECK_EQ_INT(info.skipped_nonfinite, 3);
    CHECK(t && strstr(t, "no finite data") && strstr(t, "(no data)"));
    free(t);
    t = render_checked(&p, NULL, 0, &info, &c);
    CHECK_EQ_INT(c.polylines + c.circles, 0);
    free(t);
    p.yscale = ARL_SVG_SCALE_LOG; /* log asked, nothing positive */
    double yn[3] = {-1, 0, -2};
    arl_svg_series sn = {"neg", x, yn, 3};
    t = render_checked(&p, &sn, 1, &info, &c);
    CHECK_EQ_INT(info.log_y, 0);
    free(t);
}

/* NaN and inf split a series into runs; a lone point is a circle; markers for short series. */
static void test_gaps(void) {
    double x[7] = {1, 2, 3, 4, 5, 6, 7}, y[7] = {1, 2, NAN, 4, 5, INFINITY, 7};
    arl_svg_series s = {"g", x, y, 7};
    arl_svg_plot p = {0};
    arl_svg_plot_info info;
    xml_counts c;
    char *t = render_checked(&p, &s, 1, &info, &c);
    CHECK_EQ_INT(c.polylines, 2);
    CHECK_EQ_INT(c.polyline_points[0], 2);
    CHECK_EQ_INT(c.polyline_points[1], 2);
    CHECK_EQ_INT(c.circles, 1 + 5); /* the lone 7, and 5 markers (<= 40 drawable points) */
    CHECK_EQ_INT(info.skipped_nonfinite, 2);
    free(t);
}

/* Log axis: y <= 0 are gaps; AUTO picks log only for positive data spanning >= 100x. */
static void test_log(void) {
    double x[6] = {1, 2, 3, 4, 5, 6}, y[6] = {1e-3, 1e-2, 0, 1, 10, 100};
    arl_svg_series s = {"kl", x, y, 6};
    arl_svg_plot p = {.ylabel = "KL", .yscale = ARL_SVG_SCALE_LOG};
    arl_svg_plot_info info;
    xml_counts c;
    char *t = render_checked(&p, &s, 1, &info, &c);
    CHECK_EQ_INT(info.log_y, 1);
    CHECK_EQ_INT(info.skipped_nonpositive, 1);
    CHECK_EQ_INT(c.polylines, 2);
    CHECK(t && strstr(t, "(log scale)") && strstr(t, ">0.001<") && strstr(t, ">100<"));
    free(t);
    p.yscale = ARL_SVG_SCALE_AUTO;
    double ya[6] = {1e-3, 2e-3, 5e-2, 1e-1, 2e-1, 3e-1};
    s.y = ya;
    t = render_checked(&p, &s, 1, &info, &c);
    CHECK_EQ_INT(info.log_y, 1);
    free(t);
    ya[0] = -1e-3; /* k1 can be negative: stay linear, draw everything */
    t = render_checked(&p, &s, 1, &info, &c);
    CHECK_EQ_INT(info.log_y, 0);
    CHECK_EQ_INT(info.skipped_nonpositive, 0);
    free(t);
}

/* Extreme and degenerate ranges give finite coordinates. */
static void test_extremes(void) {
    double x[3] = {0, 1, 2}, y[3] = {-1e308, 1e308, 0};
    arl_svg_series s = {"huge", x, y, 3};
    arl_svg_plot p = {0};
    arl_svg_plot_info info;
    xml_counts c;
    free(render_checked(&p, &s, 1, &info, &c));
    double yc[3] = {1, 1 + 1e-15, 1}; /* equal to 15 digits */
    s.y = yc;
    free(render_checked(&p, &s, 1, &info, &c));
    double yz[3] = {0, 0, 0}, xs[3] = {5, 5, 5}; /* constant, one x */
    s.x = xs, s.y = yz;
    free(render_checked(&p, &s, 1, &info, &c));
    double yt[3] = {1e-300, 2e-300, 3e-300};
    s.x = x, s.y = yt;
    free(render_checked(&p, &s, 1, &info, &c));
    double yl[3] = {1e7, 1e7 + 2, 1e7 + 4}; /* large offset, small steps */
    s.y = yl;
    char *t = render_checked(&p, &s, 1, &info, &c);
    CHECK(t && strstr(t, ">10000002<"));
    free(t);
}

/* Markup characters in text are escaped; too many series end the legend with a count. */
static void test_text_and_legend(void) {
    enum { S = 100 };
    double x[2] = {0, 1}, y[S][2];
    char names[S][48];
    arl_svg_series s[S];
    for (int i = 0; i < S; i++) {
        y[i][0] = i, y[i][1] = i + 1;
        snprintf(names[i], sizeof names[i], "moe/load_violation/rollout[%d]", i);
        s[i] = (arl_svg_series){names[i], x, y[i], 2};
    }
    s[0].name = "a<b & \"c\" 'd' \x01 very long name with many characters in it, cut in legend";
    arl_svg_plot p = {.title = "T <&>", .xlabel = "x & y", .ylabel = "<y>"};
    arl_svg_plot_info info;
    xml_counts c;
    char *t = render_checked(&p, s, S, &info, &c);
    CHECK_EQ_INT(c.polylines, S);
    CHECK(t && strstr(t, "a&lt;b &amp; &quot;c&quot; &apos;d&apos; ?"));
    CHECK(t && strstr(t, "T &lt;&amp;&gt;"));
    CHECK(t && strstr(t, " more</text>"));
    CHECK(t && strstr(t, "stroke-dasharray")); /* series 11+ are dashed */
    free(t);
}

/* The file variant writes and renames; a bad path is an IO error, not a crash. */
static void test_file(void) {
    const char *tmp = test_tmpdir("report-svg");
    char path[600];
    snprintf(path, sizeof path, "%s/p.svg", tmp);
    double x = 1, y = 1;
    arl_svg_series s = {"a", &x, &y, 1};
    arl_svg_plot p = {0};
    CHECK_EQ_INT(arl_svg_plot_write(path, &p, &s, 1, NULL), ARL_OK);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) fclose(f);
    CHECK_EQ_INT(arl_svg_plot_write("/nonexistent/dir/p.svg", &p, &s, 1, NULL), ARL_ERR_IO);
}

int main(void) {
    TEST_RUN(test_large_decimated);
    TEST_RUN(test_decimate_rule);
    TEST_RUN(test_single_point);
    TEST_RUN(test_all_nan);
    TEST_RUN(test_gaps);
    TEST_RUN(test_log);
    TEST_RUN(test_extremes);
    TEST_RUN(test_text_and_legend);
    TEST_RUN(test_file);
    return test_finish();
}
