/* experiments/svg_plot.h: line plots as standalone SVG 1.1 files -- axes with "nice" ticks and
 * labels, a title, a legend, several series, gaps at NaN/inf, an optional log y axis, and
 * decimation so that 10^5 points draw as a few thousand.
 *
 * Not here: reading metrics or choosing what to plot (experiments/report.h), raster output
 * (convert the SVG with any viewer), secondary axes, interactive features.
 *
 * Drawing rules:
 *   - A point is drawable when x and y are finite (and y > 0 on a log axis).  Each maximal run
 *     of consecutive drawable points of a series is one <polyline>; a run of one point is a
 *     <circle>.  Undrawable points are gaps and are counted in arl_svg_plot_info.
 *   - Every run is decimated by arl_svg_decimate() with B buckets over the x range of the
 *     axis, B = the plot area's width in pixels (one bucket per pixel column): of each group of
 *     consecutive points in one bucket it keeps the first, the minimum, the maximum and the
 *     last.  Points in distinct columns are all drawn, spikes survive, and a run with
 *     increasing x draws at most 4 * B vertices however long it is.
 *   - Series with at most 40 drawable points also get a small marker at every point.
 *   - Colours cycle through 10 hues; after 10 series the dash pattern changes.  The legend lists
 *     at most max_legend series (and as many as fit the height), then "... and K more".
 *   - Text (title, labels, names) is XML-escaped; control characters become '?'.
 */
#ifndef ARL_EXPERIMENTS_SVG_PLOT_H
#define ARL_EXPERIMENTS_SVG_PLOT_H

#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

typedef enum arl_svg_scale {
    ARL_SVG_SCALE_LINEAR = 0,
    ARL_SVG_SCALE_LOG = 1,  /* log10 y axis; y <= 0 are gaps */
    ARL_SVG_SCALE_AUTO = 2, /* log if every drawable y > 0 and max/min >= 100, else linear */
} arl_svg_scale;

typedef struct arl_svg_series {
    const char *name; /* legend text; borrowed for the call */
    const double *x;  /* (n) borrowed for the call */
    const double *y;  /* (n) borrowed for the call */
    int64_t n;
} arl_svg_series;

typedef struct arl_svg_plot {
    const char *title;  /* borrowed; NULL: none */
    const char *xlabel; /* borrowed; NULL: none */
    const char *ylabel; /* borrowed; NULL: none */
    int32_t width;      /* whole image in px; 0: 960 (at least 320) */
    int32_t height;     /* 0: 540 (at least 200) */
    arl_svg_scale yscale;
    int32_t max_legend; /* 0: 30 */
} arl_svg_plot;

/* What a call drew (for tests and for the report's notes). */
typedef struct arl_svg_plot_info {
    int32_t log_y;               /* 1 if the y axis was drawn on a log scale */
    int32_t plot_width_px;       /* B: the plot area's width, = decimation buckets */
    int32_t series_empty;        /* series without a drawable point */
    int64_t points_in;           /* sum of n over series */
    int64_t vertices;            /* polyline vertices + single-point circles written */
    int64_t skipped_nonfinite;   /* points with NaN or inf x or y */
    int64_t skipped_nonpositive; /* finite points with y <= 0 on a log axis */
} arl_svg_plot_info;

/* Write one plot to f.  info may be NULL.  Returns ARL_ERR_IO if writing fails; any data (no
 * series, empty or all-NaN series, one point, equal values, +-1e308) gives a valid image. */
arl_status arl_svg_plot_fwrite(FILE *f, const arl_svg_plot *p, const arl_svg_series *s,
                               int32_t n_series, arl_svg_plot_info *info);

/* The same into a file: written to "<path>.tmp" then renamed over path. */
arl_status arl_svg_plot_write(const char *path, const arl_svg_plot *p, const arl_svg_series *s,
                              int32_t n_series, arl_svg_plot_info *info);

/* Decimation of one run of n finite points (x, y) with B buckets over [x0, x1] (bucket of x:
 * floor((x - x0) / (x1 - x0) * B), clamped to [0, B-1]).  Consecutive points in the same
 * bucket form a group; of each group the indices of the first, the minimum y, the maximum y and
 * the last point are kept (each once, in input order; ties: the earliest).  Writes the kept
 * indices into keep (capacity n) and returns their count (<= n, and <= 4 * groups).
 * Requires B >= 1 and x1 > x0. */
int64_t arl_svg_decimate(const double *x, const double *y, int64_t n, double x0, double x1,
                         int32_t buckets, int64_t *keep);

#endif
