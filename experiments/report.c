/* experiments/report.c: metrics.jsonl -> table -> metrics.csv, SVG plots, summary.md; eval.json;
 * Wilson and Newcombe intervals (see report.h for the formats). */
#include "experiments/report.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/assert.h"
#include "core/file.h"
#include "core/json_dump.h"
#include "core/log.h"

#define METRICS_MAX_DEPTH 8 /* nesting levels flattened; deeper values are skipped */

/* ------------------------------------------------------------------------------------------ */
/* Table                                                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef struct mcol {
    char *name;
    int64_t n, cap;
    int64_t *row; /* (n) row index of each point, increasing */
    double *x;    /* (n) step of each point; filled when reading ends */
    double *y;    /* (n) value */
} mcol;

struct arl_metrics {
    mcol *cols; /* (n_cols) in first-appearance order */
    int32_t n_cols, cap_cols;
    int32_t *order; /* (n_cols) column index of rank k (stable order) */
    int32_t *rank;  /* (n_cols) rank of column index i */
    int32_t *hash;  /* (hash_cap) column index or -1; open addressing */
    int64_t hash_cap;
    int64_t n_rows, cap_rows;
    int64_t *row_line; /* (n_rows) source line of each row */
    double *row_x;     /* (n_rows) x of each row */
    int has_step;      /* some line had a numeric "step" */
    char where[256];   /* file name for messages */
    arl_metrics_stats st;
};

static uint64_t str_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static arl_status hash_grow(arl_metrics *m) {
    int64_t cap = m->hash_cap ? m->hash_cap * 2 : 64;
    int32_t *h = malloc(sizeof(int32_t) * (size_t)cap);
    if (!h) return arl_errorf(ARL_ERR_NOMEM, "metrics: out of memory");
    for (int64_t i = 0; i < cap; i++)
        h[i] = -1;
    for (int32_t c = 0; c < m->n_cols; c++) {
        uint64_t i = str_hash(m->cols[c].name) & (uint64_t)(cap - 1);
        while (h[i] >= 0)
            i = (i + 1) & (uint64_t)(cap - 1);
        h[i] = c;
    }
    free(m->hash);
    m->hash = h;
    m->hash_cap = cap;
    return ARL_OK;
}

/* Column of a name (created when absent); *col = its index. */
static arl_status col_intern(arl_metrics *m, const char *name, int32_t *col) {
    if ((int64_t)(m->n_cols + 1) * 2 > m->hash_cap) ARL_TRY(hash_grow(m));
    uint64_t i = str_hash(name) & (uint64_t)(m->hash_cap - 1);
    while (m->hash[i] >= 0) {
        if (!strcmp(m->cols[m->hash[i]].name, name)) {
            *col = m->hash[i];
            return ARL_OK;
        }
        i = (i + 1) & (uint64_t)(m->hash_cap - 1);
    }
    if (m->n_cols == INT32_MAX / 2) return arl_errorf(ARL_ERR_RANGE, "metrics: too many names");
    if (m->n_cols == m->cap_cols) {
        int32_t cap = m->cap_cols ? m->cap_cols * 2 : 32;
        mcol *c = realloc(m->cols, sizeof(mcol) * (size_t)cap);
        if (!c) return arl_errorf(ARL_ERR_NOMEM, "metrics: out of memory");
        m->cols = c;
        m->cap_cols = cap;
    }
    mcol *c = &m->cols[m->n_cols];
    memset(c, 0, sizeof *c);
    c->name = strdup(name);
    if (!c->name) return arl_errorf(ARL_ERR_NOMEM, "metrics: out of memory");
    m->hash[i] = m->n_cols;
    *col = m->n_cols++;
    return ARL_OK;
}

static arl_status col_push(arl_metrics *m, const char *name, int64_t row, double v) {
    int32_t k = -1;
    ARL_TRY(col_intern(m, name, &k));
    mcol *c = &m->cols[k];
    if (c->n > 0 && c->row[c->n - 1] == row) { /* repeated within the line: last wins */
        c->y[c->n - 1] = v;
        return ARL_OK;
    }
    if (c->n == c->cap) {
        int64_t cap = c->cap ? c->cap * 2 : 16;
        int64_t *r = realloc(c->row, sizeof(int64_t) * (size_t)cap);
        if (r) c->row = r;
        double *y = r ? realloc(c->y, sizeof(double) * (size_t)cap) : NULL;
        if (y) c->y = y;
        if (!r || !y) return arl_errorf(ARL_ERR_NOMEM, "metrics: out of memory");
        c->cap = cap;
    }
    c->row[c->n] = row;
    c->y[c->n] = v;
    c->n++;
    m->st.values++;
    if (!isfinite(v)) m->st.nonfinite++;
    return ARL_OK;
}

/* Non-finite spellings accepted as strings (and as bare words, see fix_bare_words). */
static int nonfinite_word(const char *s, double *v) {
    const char *t = s;
    int neg = 0;
    if (*t == '-' || *t == '+') neg = *t++ == '-';
    if (!strcasecmp(t, "nan")) {
        *v = NAN;
        return 1;
    }
    if (!strcasecmp(t, "inf") || !strcasecmp(t, "infinity")) {
        *v = neg ? -INFINITY : INFINITY;
        return 1;
    }
    return 0;
}

typedef struct namebuf {
    char *s;
    size_t len, cap;
} namebuf;

static arl_status nb_set(namebuf *b, size_t at, const char *sep, const char *add) {
    size_t need = at + strlen(sep) + strlen(add) + 1;
    if (need > b->cap) {
        size_t cap = need * 2;
        char *s = realloc(b->s, cap);
        if (!s) return arl_errorf(ARL_ERR_NOMEM, "metrics: out of memory");
        b->s = s;
        b->cap = cap;
    }
    b->len = at;
    b->len += (size_t)sprintf(b->s + b->len, "%s%s", sep, add);
    return ARL_OK;
}

/* snprintf "%s" into buf, cut on a UTF-8 character boundary if it does not fit. */
static void copy_utf8(char *buf, size_t cap, const char *s) {
    size_t n = strlen(s);
    if (n < cap) {
        memcpy(buf, s, n + 1);
        return;
    }
    n = cap - 1;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) /* s[n] continues a character */
        n--;
    memcpy(buf, s, n);
    buf[n] = 0;
}

static void note_non_numeric(arl_metrics *m, const char *name, int64_t lineno) {
    if (m->st.non_numeric++ == 0) {
        m->st.non_numeric_line = lineno;
        copy_utf8(m->st.non_numeric_key, sizeof m->st.non_numeric_key, name);
    }
}

/* Store the value v under the name in b (flattening objects and arrays). */
static arl_status flatten(arl_metrics *m, namebuf *b, json_t *v, int depth, int64_t row,
                          int64_t lineno) {
    size_t at = b->len;
    if (json_is_object(v) || json_is_array(v)) {
        if (depth >= METRICS_MAX_DEPTH) {
            note_non_numeric(m, b->s, lineno);
            return ARL_OK;
        }
        if (json_is_object(v)) {
            const char *key;
            json_t *val;
            json_object_foreach(v, key, val) {
                ARL_TRY(nb_set(b, at, at ? "/" : "", key));
                ARL_TRY(flatten(m, b, val, depth + 1, row, lineno));
            }
        } else {
            size_t i;
            json_t *val;
            json_array_foreach(v, i, val) {
                char idx[32];
                snprintf(idx, sizeof idx, "[%zu]", i);
                ARL_TRY(nb_set(b, at, "", idx));
                ARL_TRY(flatten(m, b, val, depth + 1, row, lineno));
            }
        }
        b->len = at;
        b->s[at] = 0;
        return ARL_OK;
    }
    double x;
    if (json_is_integer(v))
        x = (double)json_integer_value(v);
    else if (json_is_real(v))
        x = json_real_value(v);
    else if (json_is_true(v))
        x = 1;
    else if (json_is_false(v))
        x = 0;
    else if (json_is_null(v))
        x = NAN;
    else if (!(json_is_string(v) && nonfinite_word(json_string_value(v), &x))) {
        note_non_numeric(m, b->s, lineno);
        return ARL_OK;
    }
    return col_push(m, b->s, row, x);
}

/* A copy of line with bare NaN / Infinity / inf words (outside strings, as Python's json and
 * C's printf write them) quoted, so that jansson reads them as strings; NULL if there are none
 * or on OOM (*nomem set). */
static char *fix_bare_words(const char *line, size_t len, int *nomem) {
    char *out = malloc(len * 3 + 1);
    if (!out) {
        *nomem = 1;
        return NULL;
    }
    size_t o = 0;
    int in_str = 0, changed = 0;
    for (size_t i = 0; i < len;) {
        char c = line[i];
        if (in_str) {
            out[o++] = c;
            if (c == '\\' && i + 1 < len)
                out[o++] = line[++i];
            else if (c == '"')
                in_str = 0;
            i++;
            continue;
        }
        if (c == '"') {
            in_str = 1;
            out[o++] = c;
            i++;
            continue;
        }
        size_t j = i + (c == '-' || c == '+');
        size_t k = j;
        while (k < len && isalpha((unsigned char)line[k]))
            k++;
        char word[16];
        if (k > j && k - i < sizeof word) {
            memcpy(word, line + i, k - i);
            word[k - i] = 0;
            double dummy;
            if (nonfinite_word(word, &dummy)) {
                o += (size_t)sprintf(out + o, "\"%s\"", word);
                i = k;
                changed = 1;
                continue;
            }
        }
        if (k > i) { /* any other word (true, false, null, junk): copy as is */
            memcpy(out + o, line + i, k - i);
            o += k - i;
            i = k;
            continue;
        }
        out[o++] = c;
        i++;
    }
    out[o] = 0;
    if (!changed) {
        free(out);
        return NULL;
    }
    return out;
}

static void note_malformed(arl_metrics *m, int64_t lineno, const char *fmt, const char *a) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, a);
    if (m->st.malformed < ARL_METRICS_MAX_LISTED) {
        m->st.malformed_line[m->st.malformed] = lineno;
        arl_log_warn("%s:%lld: %s; line skipped", m->where, (long long)lineno, msg);
    }
    if (m->st.malformed == 0) {
        char full[600];
        snprintf(full, sizeof full, "%s:%lld: %s", m->where, (long long)lineno, msg);
        copy_utf8(m->st.malformed_msg, sizeof m->st.malformed_msg, full);
    }
    m->st.malformed++;
}

/* One line (without its '\n'); has_nl: the line ended with a newline. */
static arl_status metrics_line(arl_metrics *m, namebuf *nb, const char *line, size_t len,
                               int64_t lineno, int has_nl) {
    m->st.lines++;
    while (len > 0 && isspace((unsigned char)line[len - 1]))
        len--;
    size_t s0 = 0;
    while (s0 < len && isspace((unsigned char)line[s0]))
        s0++;
    if (s0 == len) return ARL_OK; /* blank */
    json_error_t e;
    json_t *j = arl_json_loadb(line, len, JSON_DECODE_INT_AS_REAL, &e);
    /* out of memory (jansson leaves the message empty where an allocation fails): an error, not
     * a malformed line skipped (the report would lack the row without a word) */
    int nomem = !j && arl_json_error_nomem(&e);
    if (!j && !nomem) {
        char *fixed = fix_bare_words(line, len, &nomem);
        if (fixed) {
            j = arl_json_loads(fixed, JSON_DECODE_INT_AS_REAL, &e);
            if (!j && arl_json_error_nomem(&e)) nomem = 1;
        }
        free(fixed);
    }
    if (nomem)
        return arl_errorf(ARL_ERR_NOMEM, "%s:%lld: out of memory reading the line", m->where,
                          (long long)lineno);
    if (!j) {
        if (!has_nl)
            note_malformed(m, lineno, "%s",
                           "last line cut short (no newline at its end: a run "
                           "still writing, or stopped mid-line)");
        else
            note_malformed(m, lineno, "not valid JSON (%s)", e.text);
        return ARL_OK;
    }
    if (!json_is_object(j)) {
        note_malformed(m, lineno, "%s", "expected a JSON object {\"name\": number, ...}");
        json_decref(j);
        return ARL_OK;
    }
    m->st.objects++;
    int64_t row = m->n_rows, before = m->st.values;
    ARL_TRY(nb_set(nb, 0, "", ""));
    arl_status s = flatten(m, nb, j, 0, row, lineno);
    json_decref(j);
    ARL_TRY(s);
    if (m->st.values == before) return ARL_OK; /* no numeric value: no row */
    if (m->n_rows == m->cap_rows) {
        int64_t cap = m->cap_rows ? m->cap_rows * 2 : 256;
        int64_t *rl = realloc(m->row_line, sizeof(int64_t) * (size_t)cap);
        if (!rl) return arl_errorf(ARL_ERR_NOMEM, "metrics: out of memory");
        m->row_line = rl;
        m->cap_rows = cap;
    }
    m->row_line[m->n_rows++] = lineno;
    return ARL_OK;
}

/* Natural order: digit runs compare by value, then plain bytes; ties by strcmp. */
static int natural_cmp(const char *a0, const char *b0) {
    const char *a = a0, *b = b0;
    while (*a && *b) {
        if (isdigit((unsigned char)*a) && isdigit((unsigned char)*b)) {
            while (*a == '0' && isdigit((unsigned char)a[1]))
                a++;
            while (*b == '0' && isdigit((unsigned char)b[1]))
                b++;
            size_t la = 0, lb = 0;
            while (isdigit((unsigned char)a[la]))
                la++;
            while (isdigit((unsigned char)b[lb]))
                lb++;
            if (la != lb) return la < lb ? -1 : 1;
            int c = memcmp(a, b, la);
            if (c) return c < 0 ? -1 : 1;
            a += la;
            b += lb;
            continue;
        }
        if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
        a++, b++;
    }
    if (*a || *b) return *a ? 1 : -1;
    return strcmp(a0, b0);
}

static int col_order_cmp(const void *pa, const void *pb) {
    const mcol *a = *(const mcol *const *)pa, *b = *(const mcol *const *)pb;
    int sa = !strcmp(a->name, "step"), sb = !strcmp(b->name, "step");
    if (sa != sb) return sa ? -1 : 1;
    return natural_cmp(a->name, b->name);
}

/* After the last line: stable order, x of every row and point, warnings. */
static arl_status metrics_finish(arl_metrics *m) {
    int32_t n = m->n_cols;
    m->order = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    m->rank = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    mcol **tmp = malloc(sizeof(mcol *) * (size_t)(n ? n : 1));
    m->row_x = malloc(sizeof(double) * (size_t)(m->n_rows ? m->n_rows : 1));
    if (!m->order || !m->rank || !tmp || !m->row_x) {
        free(tmp);
        return arl_errorf(ARL_ERR_NOMEM, "metrics: out of memory");
    }
    for (int32_t i = 0; i < n; i++)
        tmp[i] = &m->cols[i];
    qsort(tmp, (size_t)n, sizeof *tmp, col_order_cmp);
    for (int32_t k = 0; k < n; k++) {
        m->order[k] = (int32_t)(tmp[k] - m->cols);
        m->rank[m->order[k]] = k;
    }
    free(tmp);

    /* x of rows: the step, carried forward (and back before the first one) */
    for (int64_t r = 0; r < m->n_rows; r++)
        m->row_x[r] = NAN;
    int32_t sc = -1;
    for (int32_t i = 0; i < n; i++)
        if (!strcmp(m->cols[i].name, "step")) sc = i;
    if (sc >= 0)
        for (int64_t i = 0; i < m->cols[sc].n; i++)
            if (isfinite(m->cols[sc].y[i])) m->row_x[m->cols[sc].row[i]] = m->cols[sc].y[i];
    double first = NAN, last = NAN;
    for (int64_t r = 0; r < m->n_rows; r++)
        if (isfinite(m->row_x[r])) {
            first = m->row_x[r];
            break;
        }
    m->has_step = isfinite(first);
    for (int64_t r = 0; r < m->n_rows; r++) {
        if (!m->has_step)
            m->row_x[r] = (double)(r + 1);
        else if (isfinite(m->row_x[r]))
            last = m->row_x[r];
        else
            m->row_x[r] = isfinite(last) ? last : first;
    }
    for (int32_t i = 0; i < n; i++) {
        mcol *c = &m->cols[i];
        c->x = malloc(sizeof(double) * (size_t)(c->n ? c->n : 1));
        if (!c->x) return arl_errorf(ARL_ERR_NOMEM, "metrics: out of memory");
        for (int64_t k = 0; k < c->n; k++)
            c->x[k] = m->row_x[c->row[k]];
    }
    if (m->st.malformed > ARL_METRICS_MAX_LISTED)
        arl_log_warn("%s: %lld malformed lines skipped in all (the first %d listed above)",
                     m->where, (long long)m->st.malformed, ARL_METRICS_MAX_LISTED);
    if (m->st.non_numeric)
        arl_log_warn("%s: %lld non-numeric values skipped (the first: line %lld, key \"%s\")",
                     m->where, (long long)m->st.non_numeric, (long long)m->st.non_numeric_line,
                     m->st.non_numeric_key);
    return ARL_OK;
}

static arl_metrics *metrics_new(const char *where) {
    arl_metrics *m = calloc(1, sizeof *m);
    if (m) snprintf(m->where, sizeof m->where, "%s", where ? where : "metrics");
    return m;
}

arl_status arl_metrics_read_text(const char *text, size_t len, const char *where,
                                 arl_metrics **out) {
    *out = NULL;
    arl_metrics *m = metrics_new(where);
    if (!m) return arl_errorf(ARL_ERR_NOMEM, "metrics: out of memory");
    namebuf nb = {0};
    arl_status s = ARL_OK;
    int64_t lineno = 0;
    for (size_t i = 0; i < len && s == ARL_OK;) {
        const char *nl = memchr(text + i, '\n', len - i);
        size_t e = nl ? (size_t)(nl - text) : len;
        s = metrics_line(m, &nb, text + i, e - i, ++lineno, nl != NULL);
        i = nl ? e + 1 : len;
    }
    free(nb.s);
    if (s == ARL_OK) s = metrics_finish(m);
    if (s != ARL_OK) {
        arl_metrics_free(m);
        return s;
    }
    *out = m;
    return ARL_OK;
}

arl_status arl_metrics_read(const char *path, arl_metrics **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return arl_errorf(errno == ENOENT ? ARL_ERR_NOT_FOUND : ARL_ERR_IO,
                          "%s: cannot open for reading: %s", path, strerror(errno));
    arl_metrics *m = metrics_new(path);
    if (!m) {
        fclose(f);
        return arl_errorf(ARL_ERR_NOMEM, "metrics: out of memory");
    }
    namebuf nb = {0};
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int64_t lineno = 0;
    arl_status s = ARL_OK;
    while (s == ARL_OK && (got = getline(&line, &cap, f)) > 0) {
        int has_nl = line[got - 1] == '\n';
        s = metrics_line(m, &nb, line, (size_t)got - (size_t)has_nl, ++lineno, has_nl);
    }
    if (s == ARL_OK && ferror(f))
        s = arl_errorf(ARL_ERR_IO, "%s: read error after line %lld", path, (long long)lineno);
    free(line);
    free(nb.s);
    fclose(f);
    if (s == ARL_OK) s = metrics_finish(m);
    if (s != ARL_OK) {
        arl_metrics_free(m);
        return s;
    }
    *out = m;
    return ARL_OK;
}

void arl_metrics_free(arl_metrics *m) {
    if (!m) return;
    for (int32_t i = 0; i < m->n_cols; i++) {
        free(m->cols[i].name);
        free(m->cols[i].row);
        free(m->cols[i].x);
        free(m->cols[i].y);
    }
    free(m->cols);
    free(m->order);
    free(m->rank);
    free(m->hash);
    free(m->row_line);
    free(m->row_x);
    free(m);
}

const arl_metrics_stats *arl_metrics_get_stats(const arl_metrics *m) {
    return &m->st;
}

int32_t arl_metrics_count(const arl_metrics *m) {
    return m->n_cols;
}

int64_t arl_metrics_rows(const arl_metrics *m) {
    return m->n_rows;
}

arl_status arl_metrics_check_rows(const arl_metrics *m) {
    const arl_metrics_stats *st = &m->st;
    if (m->n_rows > 0) return ARL_OK;
    const char *why = "(a run writes one line per update: has this one run an update yet?)";
    if (st->objects == 0 && st->malformed == 0)
        return arl_errorf(ARL_ERR_FORMAT,
                          st->lines ? "%s: only blank lines: no metrics to report %s"
                                    : "%s: the file is empty: no metrics to report %s",
                          m->where, why);
    if (st->objects == 0)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: none of its %lld line%s is a metrics line (a JSON object); %lld "
                          "malformed, the first: %s",
                          m->where, (long long)st->lines, st->lines == 1 ? "" : "s",
                          (long long)st->malformed, st->malformed_msg);
    char objects[64];
    if (st->objects == 1)
        snprintf(objects, sizeof objects, "its one JSON object");
    else
        snprintf(objects, sizeof objects, "any of its %lld JSON objects", (long long)st->objects);
    if (st->non_numeric)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: no numeric metric in %s (%lld non-numeric value%s skipped, the "
                          "first: line %lld, key \"%s\"); expected {\"name\": number, ...}",
                          m->where, objects, (long long)st->non_numeric,
                          st->non_numeric == 1 ? "" : "s", (long long)st->non_numeric_line,
                          st->non_numeric_key);
    return arl_errorf(ARL_ERR_FORMAT,
                      "%s: no numeric metric in %s (%s); expected {\"name\": number, ...}",
                      m->where, objects, st->objects == 1 ? "empty" : "all empty");
}

const char *arl_metrics_name(const arl_metrics *m, int32_t k) {
    ARL_ASSERT(k >= 0 && k < m->n_cols);
    return m->cols[m->order[k]].name;
}

int32_t arl_metrics_find(const arl_metrics *m, const char *name) {
    if (!m->hash_cap) return -1;
    uint64_t i = str_hash(name) & (uint64_t)(m->hash_cap - 1);
    while (m->hash[i] >= 0) {
        if (!strcmp(m->cols[m->hash[i]].name, name)) return m->rank[m->hash[i]];
        i = (i + 1) & (uint64_t)(m->hash_cap - 1);
    }
    return -1;
}

int64_t arl_metrics_series(const arl_metrics *m, int32_t k, const double **x, const double **y) {
    ARL_ASSERT(k >= 0 && k < m->n_cols);
    const mcol *c = &m->cols[m->order[k]];
    *x = c->x;
    *y = c->y;
    return c->n;
}

/* ------------------------------------------------------------------------------------------ */
/* Files                                                                                       */
/* ------------------------------------------------------------------------------------------ */

/* Shortest text that reads back to the same double; nan, inf, -inf. */
static void fmt_double(char *buf, size_t cap, double v) {
    if (isnan(v)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, v > 0 ? "inf" : "-inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, cap, "%.0f", v);
        return;
    }
    for (int p = 15; p <= 17; p++) {
        snprintf(buf, cap, "%.*g", p, v);
        if (strtod(buf, NULL) == v) return;
    }
}

static void csv_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, f);
        return;
    }
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"') fputc('"', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

arl_status arl_metrics_fwrite_csv(const arl_metrics *m, FILE *f) {
    int32_t n = m->n_cols;
    int64_t *cur = calloc((size_t)(n ? n : 1), sizeof(int64_t));
    if (!cur) return arl_errorf(ARL_ERR_NOMEM, "metrics csv: out of memory");
    for (int32_t k = 0; k < n; k++) {
        if (k) fputc(',', f);
        csv_field(f, m->cols[m->order[k]].name);
    }
    fputc('\n', f);
    char num[40];
    for (int64_t r = 0; r < m->n_rows; r++) {
        for (int32_t k = 0; k < n; k++) {
            const mcol *c = &m->cols[m->order[k]];
            if (k) fputc(',', f);
            if (cur[k] < c->n && c->row[cur[k]] == r) {
                fmt_double(num, sizeof num, c->y[cur[k]++]);
                fputs(num, f);
            }
        }
        fputc('\n', f);
    }
    free(cur);
    if (ferror(f)) return arl_errorf(ARL_ERR_IO, "metrics csv: write error");
    return ARL_OK;
}

/* Write a file through fn(ctx, f) into "<path>.tmp", then rename it to path.  A write that fails
 * (fn's stream in error, or its last buffer) is reported by arl_file_write_failed with the
 * errno of the failed write (stdio goes on failing on a full disk, so the last errno is its). */
typedef arl_status (*write_fn)(const void *ctx, FILE *f);

static arl_status write_atomic(const char *path, write_fn fn, const void *ctx) {
    size_t len = strlen(path);
    char *tmp = malloc(len + 5);
    if (!tmp) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
    memcpy(tmp, path, len);
    memcpy(tmp + len, ".tmp", 5);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        arl_status st = arl_file_write_failed(tmp, "cannot open for writing", errno);
        free(tmp);
        return st;
    }
    errno = 0;
    arl_status s = fn(ctx, f);
    int e = errno;
    int io = 0;      /* s says where and why */
    if (ferror(f)) { /* (fn's own message says neither) */
        s = arl_file_write_failed(tmp, "write failed", e);
        io = 1;
    } else if (s == ARL_OK && fflush(f) != 0) {
        s = arl_file_write_failed(tmp, "write failed", errno);
        io = 1;
    }
    if (fclose(f) != 0 && s == ARL_OK) {
        s = arl_file_write_failed(tmp, "write failed", errno);
        io = 1;
    }
    if (s == ARL_OK && rename(tmp, path) != 0) {
        s = arl_errorf(ARL_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        io = 1;
    }
    if (s != ARL_OK) {
        remove(tmp);
        if (!io) arl_error_prefix(s, "%s", path);
    }
    free(tmp);
    return s;
}

static arl_status csv_cb(const void *ctx, FILE *f) {
    return arl_metrics_fwrite_csv(ctx, f);
}

arl_status arl_metrics_write_csv(const arl_metrics *m, const char *path) {
    return write_atomic(path, csv_cb, m);
}

static arl_status path_join(char *buf, size_t cap, const char *dir, const char *name) {
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap)
        return arl_errorf(ARL_ERR_ARG, "%s/%s: path too long", dir, name);
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* Plot groups                                                                                 */
/* ------------------------------------------------------------------------------------------ */

static const arl_report_group default_groups[] = {
    {"reward", "Reward per level", "mean reward", "reward/*/mean reward/mean reward",
     ARL_SVG_SCALE_LINEAR, ARL_REPORT_BETTER_HIGHER},
    {"success", "Success rate", "success rate", "**success**", ARL_SVG_SCALE_LINEAR,
     ARL_REPORT_BETTER_HIGHER},
    {"kl", "KL and \xCE\xB2 (KL coefficient)", "KL / \xCE\xB2",
     "kl/k1 kl/k3 kl/target kl/coef kl/beta beta", ARL_SVG_SCALE_AUTO, ARL_REPORT_BETTER_NONE},
    {"entropy", "Policy entropy", "nats per token", "entropy **/entropy", ARL_SVG_SCALE_LINEAR,
     ARL_REPORT_BETTER_NONE},
    {"moe_load", "Expert load max/min per layer", "expert load",
     "moe/load_max/** moe/load_min/** moe/load_violation/** moe/load/**", ARL_SVG_SCALE_LINEAR,
     ARL_REPORT_BETTER_NONE},
    {"router", "Router agreement (rollout vs learner)", "agreement",
     "moe/router_agreement/** router/agreement router/agreement/** router_agreement",
     ARL_SVG_SCALE_LINEAR, ARL_REPORT_BETTER_HIGHER},
    {"env_errors", "Environment errors", "errors",
     "env/errors env/errors/** env/*/errors env/*/masked_frac env/*/retries rollout/masked/* "
     "rollout/tool_error/* rollout/trajectories/masked",
     ARL_SVG_SCALE_LINEAR, ARL_REPORT_BETTER_LOWER},
    {"throughput", "Throughput", "tokens/s", "**tokens_per_s throughput/**", ARL_SVG_SCALE_LINEAR,
     ARL_REPORT_BETTER_HIGHER},
    {"loss", "Loss", "loss", "loss loss/** eval_loss", ARL_SVG_SCALE_LINEAR,
     ARL_REPORT_BETTER_LOWER},
};

const arl_report_group *arl_report_default_groups(int32_t *n) {
    *n = (int32_t)(sizeof default_groups / sizeof default_groups[0]);
    return default_groups;
}

static int glob_at(const char *p, const char *s) {
    while (*p) {
        if (p[0] == '*' && p[1] == '*') {
            while (*p == '*')
                p++;
            for (const char *t = s;; t++) {
                if (glob_at(p, t)) return 1;
                if (!*t) return 0;
            }
        }
        if (*p == '*') {
            p++;
            for (const char *t = s;; t++) {
                if (glob_at(p, t)) return 1;
                if (!*t || *t == '/') return 0;
            }
        }
        if (!*s) return 0;
        if (*p == '?') {
            if (*s == '/') return 0;
        } else if (*p != *s) {
            return 0;
        }
        p++, s++;
    }
    return !*s;
}

int arl_report_glob_match(const char *pattern, const char *name) {
    return glob_at(pattern, name);
}

/* 1 if name matches any of the whitespace-separated patterns. */
static int group_match(const arl_report_group *g, const char *name) {
    const char *p = g->patterns;
    char pat[256];
    while (p && *p) {
        while (isspace((unsigned char)*p))
            p++;
        size_t l = 0;
        while (p[l] && !isspace((unsigned char)p[l]))
            l++;
        if (l && l < sizeof pat) {
            memcpy(pat, p, l);
            pat[l] = 0;
            if (glob_at(pat, name)) return 1;
        }
        p += l;
    }
    return 0;
}

static int group_name_ok(const char *s) {
    if (!s || !*s) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-') return 0;
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Evaluation                                                                                  */
/* ------------------------------------------------------------------------------------------ */

void arl_report_eval_init(arl_report_eval *e) {
    e->before.episodes = e->after.episodes = -1;
    e->before.successes = e->after.successes = 0;
    memset(&e->paired, 0, sizeof e->paired);
    e->paired.tasks = -1;
    e->kl_target = e->kl_mean = NAN;
    e->set[0] = 0;
}

double arl_report_wilson(int64_t k, int64_t n, double z, double *lo, double *hi) {
    if (n <= 0) {
        *lo = *hi = NAN;
        return NAN;
    }
    double nn = (double)n, p = (double)k / nn, z2 = z * z;
    double den = 1 + z2 / nn;
    double centre = (p + z2 / (2 * nn)) / den;
    double half = z / den * sqrt(p * (1 - p) / nn + z2 / (4 * nn * nn));
    *lo = fmax(0, centre - half);
    *hi = fmin(1, centre + half);
    return p;
}

double arl_report_newcombe(int64_t k1, int64_t n1, int64_t k0, int64_t n0, double z, double *lo,
                           double *hi) {
    if (n1 <= 0 || n0 <= 0) {
        *lo = *hi = NAN;
        return NAN;
    }
    double l1, u1, l0, u0;
    double p1 = arl_report_wilson(k1, n1, z, &l1, &u1);
    double p0 = arl_report_wilson(k0, n0, z, &l0, &u0);
    double d = p1 - p0;
    *lo = d - sqrt((p1 - l1) * (p1 - l1) + (u0 - p0) * (u0 - p0));
    *hi = d + sqrt((u1 - p1) * (u1 - p1) + (p0 - l0) * (p0 - l0));
    return d;
}

double arl_report_newcombe_paired(const arl_report_eval_paired *p, double z, double *lo,
                                  double *hi) {
    if (p->tasks <= 0) {
        *lo = *hi = NAN;
        return NAN;
    }
    const double a = (double)p->both, b = (double)p->after_only, c = (double)p->before_only,
                 d = (double)p->neither;
    double l1, u1, l0, u0;
    double p1 = arl_report_wilson(p->both + p->after_only, p->tasks, z, &l1, &u1);
    double p0 = arl_report_wilson(p->both + p->before_only, p->tasks, z, &l0, &u0);
    double den = (a + b) * (c + d) * (a + c) * (b + d);
    double phi = den > 0 ? (a * d - b * c) / sqrt(den) : 0.0;
    double diff = p1 - p0;
    double dl = (p1 - l1) * (p1 - l1) - 2 * phi * (p1 - l1) * (u0 - p0) + (u0 - p0) * (u0 - p0);
    double du = (u1 - p1) * (u1 - p1) - 2 * phi * (u1 - p1) * (p0 - l0) + (p0 - l0) * (p0 - l0);
    *lo = diff - sqrt(fmax(0, dl));
    *hi = diff + sqrt(fmax(0, du));
    return diff;
}

double arl_report_mcnemar_exact(int64_t before_only, int64_t after_only) {
    const int64_t n = before_only + after_only;
    const int64_t k = before_only < after_only ? before_only : after_only;
    if (n <= 0 || k < 0) return 1.0;
    /* P(X <= k), X ~ Binomial(n, 1/2), summed in log space (n can be in the thousands) */
    double sum = 0;
    const double ln2n = (double)n * log(2.0), lgn = lgamma((double)n + 1);
    for (int64_t i = 0; i <= k; i++)
        sum += exp(lgn - lgamma((double)i + 1) - lgamma((double)(n - i) + 1) - ln2n);
    return fmin(1.0, 2 * sum);
}

static arl_status eval_paired(const char *path, json_t *v, arl_report_eval_paired *p) {
    static const char *const keys[4] = {"both", "before_only", "after_only", "neither"};
    int64_t *dst[4] = {&p->both, &p->before_only, &p->after_only, &p->neither};
    if (!json_is_object(v))
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: field 'paired': expected an object {\"both\", \"before_only\", "
                          "\"after_only\", \"neither\"}",
                          path);
    p->tasks = 0;
    for (int i = 0; i < 4; i++) {
        json_t *x = json_object_get(v, keys[i]);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return arl_errorf(ARL_ERR_FORMAT,
                              "%s: field 'paired.%s': expected a non-negative integer", path,
                              keys[i]);
        *dst[i] = (int64_t)json_integer_value(x);
        p->tasks += *dst[i];
    }
    if (json_object_size(v) != 4)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: field 'paired': unknown key (expected both, before_only, "
                          "after_only, neither)",
                          path);
    return ARL_OK;
}

static arl_status eval_arm(const char *path, const char *key, json_t *v, arl_report_eval_arm *a) {
    if (!json_is_object(v))
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: field '%s': expected an object {\"episodes\": N, \"successes\": K}",
                          path, key);
    a->episodes = -1;
    a->successes = -1;
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        int64_t *dst = !strcmp(k, "episodes")    ? &a->episodes
                       : !strcmp(k, "successes") ? &a->successes
                                                 : NULL;
        if (!dst)
            return arl_errorf(ARL_ERR_FORMAT,
                              "%s: field '%s.%s': unknown key (expected episodes, successes)", path,
                              key, k);
        if (!json_is_integer(x) || json_integer_value(x) < 0)
            return arl_errorf(ARL_ERR_FORMAT, "%s: field '%s.%s': expected a non-negative integer",
                              path, key, k);
        *dst = (int64_t)json_integer_value(x);
    }
    if (a->episodes < 0 || a->successes < 0)
        return arl_errorf(ARL_ERR_FORMAT, "%s: field '%s': needs both episodes and successes", path,
                          key);
    if (a->successes > a->episodes)
        return arl_errorf(ARL_ERR_FORMAT, "%s: field '%s': successes %lld > episodes %lld", path,
                          key, (long long)a->successes, (long long)a->episodes);
    return ARL_OK;
}

arl_status arl_report_eval_read(const char *path, arl_report_eval *e) {
    arl_report_eval_init(e);
    FILE *f = fopen(path, "rb");
    if (!f)
        return arl_errorf(errno == ENOENT ? ARL_ERR_NOT_FOUND : ARL_ERR_IO,
                          "%s: cannot open for reading: %s", path, strerror(errno));
    json_error_t je;
    json_t *j = arl_json_loadf(f, JSON_REJECT_DUPLICATES, &je); /* (a key twice: which is meant?) */
    fclose(f);
    if (!j)
        return arl_json_error_nomem(&je)
                   ? arl_errorf(ARL_ERR_NOMEM, "%s: out of memory reading the JSON", path)
                   : arl_errorf(ARL_ERR_FORMAT, "%s:%d: not valid JSON: %s", path, je.line,
                                je.text);
    arl_status s = ARL_OK;
    if (!json_is_object(j)) s = arl_errorf(ARL_ERR_FORMAT, "%s: expected a JSON object", path);
    const char *k;
    json_t *v;
    if (s == ARL_OK) json_object_foreach(j, k, v) {
            if (!strcmp(k, "version")) {
                if (!json_is_integer(v) || json_integer_value(v) != 1)
                    s = arl_errorf(ARL_ERR_VERSION,
                                   "%s: field 'version': this build reads version 1 only", path);
            } else if (!strcmp(k, "before")) {
                s = eval_arm(path, k, v, &e->before);
            } else if (!strcmp(k, "after")) {
                s = eval_arm(path, k, v, &e->after);
            } else if (!strcmp(k, "paired")) {
                s = eval_paired(path, v, &e->paired);
            } else if (!strcmp(k, "kl_target") || !strcmp(k, "kl_mean")) {
                if (!json_is_number(v) || !isfinite(json_number_value(v)))
                    s = arl_errorf(ARL_ERR_FORMAT, "%s: field '%s': expected a finite number", path,
                                   k);
                else
                    *(!strcmp(k, "kl_target") ? &e->kl_target : &e->kl_mean) = json_number_value(v);
            } else if (!strcmp(k, "set")) {
                const char *t = json_string_value(v);
                if (!t || !*t || strlen(t) >= sizeof e->set)
                    s = arl_errorf(ARL_ERR_FORMAT,
                                   "%s: field 'set': expected a name of 1 to %zu characters", path,
                                   sizeof e->set - 1);
                else
                    snprintf(e->set, sizeof e->set, "%s", t);
            } else {
                s = arl_errorf(ARL_ERR_FORMAT,
                               "%s: field '%s': unknown key (expected version, before, after, "
                               "paired, kl_target, kl_mean, set)",
                               path, k);
            }
            if (s != ARL_OK) break;
        }
    json_decref(j);
    if (s != ARL_OK) arl_report_eval_init(e);
    return s;
}

static arl_status eval_cb(const void *ctx, FILE *f) {
    const arl_report_eval *e = ctx;
    fprintf(f, "{\"version\": 1");
    const arl_report_eval_arm *arms[2] = {&e->before, &e->after};
    const char *names[2] = {"before", "after"};
    for (int i = 0; i < 2; i++)
        if (arms[i]->episodes >= 0)
            fprintf(f, ", \"%s\": {\"episodes\": %lld, \"successes\": %lld}", names[i],
                    (long long)arms[i]->episodes, (long long)arms[i]->successes);
    if (e->paired.tasks >= 0)
        fprintf(f,
                ", \"paired\": {\"both\": %lld, \"before_only\": %lld, \"after_only\": %lld, "
                "\"neither\": %lld}",
                (long long)e->paired.both, (long long)e->paired.before_only,
                (long long)e->paired.after_only, (long long)e->paired.neither);
    char num[40];
    if (isfinite(e->kl_target)) {
        fmt_double(num, sizeof num, e->kl_target);
        fprintf(f, ", \"kl_target\": %s%s", num, strpbrk(num, ".e") ? "" : ".0");
    }
    if (isfinite(e->kl_mean)) {
        fmt_double(num, sizeof num, e->kl_mean);
        fprintf(f, ", \"kl_mean\": %s%s", num, strpbrk(num, ".e") ? "" : ".0");
    }
    if (e->set[0]) {
        fputs(", \"set\": ", f);
        json_t *str = json_string(e->set); /* escaped as JSON */
        char *t = str ? arl_json_dumps(str, JSON_ENCODE_ANY) : NULL;
        json_decref(str);
        if (!t) return arl_errorf(ARL_ERR_NOMEM, "out of memory"); /* (not "set": "") */
        fputs(t, f);
        free(t);
    }
    fprintf(f, "}\n");
    return ferror(f) ? arl_errorf(ARL_ERR_IO, "write error") : ARL_OK;
}

arl_status arl_report_eval_write(const char *path, const arl_report_eval *e) {
    const arl_report_eval_arm *arms[2] = {&e->before, &e->after};
    for (int i = 0; i < 2; i++)
        if (arms[i]->episodes >= 0 &&
            (arms[i]->successes < 0 || arms[i]->successes > arms[i]->episodes))
            return arl_errorf(ARL_ERR_ARG, "%s: %s: successes %lld not in [0, episodes %lld]", path,
                              i ? "after" : "before", (long long)arms[i]->successes,
                              (long long)arms[i]->episodes);
    const arl_report_eval_paired *p = &e->paired;
    if (p->tasks >= 0 && (p->both < 0 || p->before_only < 0 || p->after_only < 0 ||
                          p->neither < 0 ||
                          p->both + p->before_only + p->after_only + p->neither != p->tasks))
        return arl_errorf(ARL_ERR_ARG, "%s: paired counts do not sum to %lld tasks", path,
                          (long long)p->tasks);
    return write_atomic(path, eval_cb, e);
}

/* ------------------------------------------------------------------------------------------ */
/* summary.md                                                                                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct summary_ctx {
    const arl_metrics *m;
    const arl_report_opts *o;
    const arl_report_group *groups;
    int32_t n_groups;
    const int32_t *col_group; /* (count) first group of each rank, -1: none */
    const char *group_has;    /* (n_groups) 1 if the plot was written */
} summary_ctx;

static void md_value(FILE *f, double v) {
    char b[48];
    if (!isfinite(v))
        fputs(isnan(v) ? "nan" : v > 0 ? "inf" : "-inf", f);
    else {
        snprintf(b, sizeof b, "%.6g", v);
        fputs(b, f);
    }
}

/* A metric name in a table cell: `name` with '|' escaped and backticks replaced. */
static void md_name(FILE *f, const char *s) {
    fputc('`', f);
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", f);
        else if (*s == '`')
            fputc('\'', f);
        else if ((unsigned char)*s < 0x20)
            fputc('?', f);
        else
            fputc(*s, f);
    }
    fputc('`', f);
}

/* Final finite value of a column (NaN if none). */
static double col_final(const arl_metrics *m, const char *name) {
    int32_t k = arl_metrics_find(m, name);
    if (k < 0) return NAN;
    const double *x, *y;
    int64_t n = arl_metrics_series(m, k, &x, &y);
    for (int64_t i = n - 1; i >= 0; i--)
        if (isfinite(y[i])) return y[i];
    return NAN;
}

/* Per update: kl/k3 / kl/target over the last quarter of the updates (the span of eval.json's
 * kl_mean) and its highest value over the run, with its step. */
static void summary_kl_updates(FILE *f, const arl_metrics *m) {
    int32_t kk = arl_metrics_find(m, "kl/k3"), kt = arl_metrics_find(m, "kl/target");
    if (kk < 0 || kt < 0) return;
    const double *xk, *yk, *xt, *yt;
    int64_t nk = arl_metrics_series(m, kk, &xk, &yk), nt = arl_metrics_series(m, kt, &xt, &yt);
    if (nk != nt || nk < 1) return;
    const int64_t from = nk - (nk + 3) / 4;
    double lo = INFINITY, hi = -INFINITY, top = -INFINITY, top_x = NAN;
    for (int64_t i = 0; i < nk; i++) {
        if (!isfinite(yk[i]) || !(yt[i] > 0) || xk[i] != xt[i]) continue;
        const double r = yk[i] / yt[i];
        if (i >= from) lo = fmin(lo, r), hi = fmax(hi, r);
        if (r > top) top = r, top_x = xk[i];
    }
    if (!isfinite(top)) return;
    fprintf(f, " Per update (kl/k3 / kl/target):");
    if (isfinite(lo))
        fprintf(f, " %.2f\xC3\x97 to %.2f\xC3\x97 over the last %lld;", lo, hi,
                (long long)(nk - from));
    fprintf(f, " highest %.2f\xC3\x97 (step %g) over the %lld update%s.", top, top_x, (long long)nk,
            nk == 1 ? "" : "s");
}

static void summary_eval(FILE *f, const summary_ctx *c) {
    const arl_report_eval *e = c->o->eval;
    fputs("## Evaluation\n\n", f);
    int have = e && (e->before.episodes >= 0 || e->after.episodes >= 0);
    if (!have) {
        fputs("No held-out evaluation results (no eval.json in the run folder).\n\n", f);
    } else {
        fputs("Held-out success rate of the policy before and after training. Intervals are 95%: "
              "Wilson score intervals for each rate, Newcombe's hybrid score interval (method 10) "
              "for the difference, unpaired (independent samples) and, when the outcomes are "
              "recorded task by task, paired.",
              f);
        if (!strcmp(e->set, "validation"))
            fputs(" Evaluation set: **validation** (held-out questions for tuning, disjoint from "
                  "the training and the test questions; a result to report comes from a run on "
                  "the test set).",
                  f);
        else if (e->set[0])
            fprintf(f, " Evaluation set: **%s**.", e->set);
        fputs("\n\n", f);
        fputs("| policy | episodes | successes | success rate | 95% CI |\n", f);
        fputs("|---|---:|---:|---:|---|\n", f);
        const arl_report_eval_arm *arms[2] = {&e->before, &e->after};
        const char *names[2] = {"before", "after"};
        for (int i = 0; i < 2; i++) {
            const arl_report_eval_arm *a = arms[i];
            if (a->episodes < 0) {
                fprintf(f, "| %s | \xE2\x80\x94 | \xE2\x80\x94 | \xE2\x80\x94 | not evaluated |\n",
                        names[i]);
                continue;
            }
            double lo, hi,
                p = arl_report_wilson(a->successes, a->episodes, ARL_REPORT_Z95, &lo, &hi);
            if (a->episodes == 0)
                fprintf(f, "| %s | 0 | 0 | \xE2\x80\x94 | \xE2\x80\x94 |\n", names[i]);
            else
                fprintf(f, "| %s | %lld | %lld | %.4f | [%.4f, %.4f] |\n", names[i],
                        (long long)a->episodes, (long long)a->successes, p, lo, hi);
        }
        double lo, hi;
        double d = arl_report_newcombe(e->after.successes, e->after.episodes, e->before.successes,
                                       e->before.episodes, ARL_REPORT_Z95, &lo, &hi);
        const arl_report_eval_paired *pp = &e->paired;
        double plo = NAN, phi = NAN, pd = NAN;
        if (pp->tasks > 0) pd = arl_report_newcombe_paired(pp, ARL_REPORT_Z95, &plo, &phi);
        if (isfinite(d)) {
            fprintf(f, "| after \xE2\x88\x92 before%s | | | %+.4f | [%+.4f, %+.4f] |\n",
                    isfinite(pd) ? " (unpaired)" : "", d, lo, hi);
            if (isfinite(pd))
                fprintf(f, "| after \xE2\x88\x92 before (paired, %lld tasks) | | | %+.4f | "
                           "[%+.4f, %+.4f] |\n",
                        (long long)pp->tasks, pd, plo, phi);
            fputs("\n", f);
        }
        if (isfinite(pd)) {
            double pv = arl_report_mcnemar_exact(pp->before_only, pp->after_only);
            fprintf(f,
                    "Paired analysis. Both policies are evaluated on the same held-out tasks, "
                    "so each task gives a pair of outcomes (before, after):\n\n"
                    "| | after: success | after: failure |\n|---|---:|---:|\n"
                    "| before: success | %lld | %lld |\n| before: failure | %lld | %lld |\n\n"
                    "Only the %lld discordant tasks carry information about the change: %lld "
                    "failed before and succeed after, %lld the reverse. The paired difference "
                    "(%lld \xE2\x88\x92 %lld) / %lld = %+.4f has the 95%% interval [%+.4f, %+.4f] "
                    "(Newcombe's method 10 for paired proportions: Wilson intervals of the two "
                    "rates combined with the correlation of the outcomes); exact McNemar test "
                    "p = %.3g. The unpaired interval above ignores the pairing and is wider when "
                    "the outcomes of a task are correlated.\n\n",
                    (long long)pp->both, (long long)pp->before_only, (long long)pp->after_only,
                    (long long)pp->neither, (long long)(pp->before_only + pp->after_only),
                    (long long)pp->after_only, (long long)pp->before_only,
                    (long long)pp->after_only, (long long)pp->before_only, (long long)pp->tasks,
                    pd, plo, phi, pv);
        }
        if (isfinite(d)) {
            /* the verdict: the paired interval when the pairing is known, else the unpaired */
            const int paired = isfinite(pd);
            const double vlo = paired ? plo : lo, vhi = paired ? phi : hi;
            const char *verdict =
                vlo > 0   ? "Improved: the 95% interval of the difference lies above zero."
                : vhi < 0 ? "Worse: the 95% interval of the difference lies below zero."
                          : "No change distinguishable at 95%: the interval of the difference "
                            "contains zero.";
            fprintf(f,
                    "**Success rate %.1f%% \xE2\x86\x92 %.1f%% (%+.1f percentage points, 95%% CI "
                    "%+.1f to %+.1f",
                    100.0 * (double)e->before.successes / (double)e->before.episodes,
                    100.0 * (double)e->after.successes / (double)e->after.episodes, 100 * d,
                    100 * vlo, 100 * vhi);
            if (paired)
                fprintf(f, " paired (%+.1f to %+.1f unpaired)", 100 * lo, 100 * hi);
            fprintf(f, "; %lld episodes before, %lld after).** %s\n\n",
                    (long long)e->before.episodes, (long long)e->after.episodes, verdict);
        } else {
            fputs("\nThe difference needs episodes both before and after.\n\n", f);
        }
    }
    /* per-token KL against its target */
    double kl = e ? e->kl_mean : NAN, target = e ? e->kl_target : NAN;
    const char *kl_src = "eval.json", *tg_src = "eval.json";
    if (!isfinite(kl)) {
        kl = col_final(c->m, "kl/k3"), kl_src = "final kl/k3 of the metrics";
        if (!isfinite(kl)) kl = col_final(c->m, "kl/k1"), kl_src = "final kl/k1 of the metrics";
    }
    if (!isfinite(target)) target = col_final(c->m, "kl/target"), tg_src = "final kl/target";
    if (isfinite(kl)) {
        fprintf(f, "Per-token KL to the reference policy: %.4g (%s)", kl, kl_src);
        if (isfinite(target) && target > 0) {
            fprintf(f, "; target %.4g (%s): %.2f\xC3\x97 the target.", target, tg_src,
                    kl / target);
            summary_kl_updates(f, c->m);
            fputs("\n\n", f);
        } else {
            fputs("; no KL target given.\n\n", f);
        }
    } else {
        fputs("Per-token KL to the reference policy: not measured.\n\n", f);
    }
}

static arl_status summary_cb(const void *ctx, FILE *f) {
    const summary_ctx *c = ctx;
    const arl_metrics *m = c->m;
    const arl_metrics_stats *st = &m->st;
    int32_t n = m->n_cols;
    fprintf(f, "# %s\n\n", c->o->title ? c->o->title : "agentrl run report");
    fprintf(f, "Source: `%s`: %lld lines, %lld with metrics, %d metric names",
            c->o->source ? c->o->source : "metrics.jsonl", (long long)st->lines,
            (long long)m->n_rows, (int)(n - (arl_metrics_find(m, "step") >= 0)));
    if (m->has_step && m->n_rows) {
        double lo = INFINITY, hi = -INFINITY;
        for (int64_t r = 0; r < m->n_rows; r++)
            lo = fmin(lo, m->row_x[r]), hi = fmax(hi, m->row_x[r]);
        fprintf(f, ", steps %.17g to %.17g", lo, hi);
    }
    fputs(".\n\n", f);

    summary_eval(f, c);

    fputs("## Plots\n\n", f);
    int none = 1;
    for (int32_t g = 0; g < c->n_groups; g++) {
        if (!c->group_has[g]) continue;
        none = 0;
        fprintf(f, "### %s\n\n![%s](plots/%s.svg)\n\n", c->groups[g].title, c->groups[g].title,
                c->groups[g].name);
    }
    if (none) fputs("No metric matches any plot group.\n\n", f);
    int first = 1;
    for (int32_t g = 0; g < c->n_groups; g++) {
        if (c->group_has[g]) continue;
        fprintf(f, "%s%s (`%s`)", first ? "No data for: " : "; ", c->groups[g].title,
                c->groups[g].patterns);
        first = 0;
    }
    if (!first) fputs(".\n\n", f);

    fputs("## Final values\n\n", f);
    fputs("Over finite values; best = the highest or lowest (at its first step) for metrics whose "
          "plot group says which way is better.\n\n",
          f);
    fputs("| metric | points | first | final | min | max | best (step) |\n", f);
    fputs("|---|---:|---:|---:|---:|---:|---:|\n", f);
    for (int32_t k = 0; k < n; k++) {
        const char *name = arl_metrics_name(m, k);
        if (!strcmp(name, "step")) continue;
        const double *x, *y;
        int64_t cnt = arl_metrics_series(m, k, &x, &y), fin = 0;
        double v0 = NAN, v1 = NAN, mn = INFINITY, mx = -INFINITY, xmn = NAN, xmx = NAN;
        for (int64_t i = 0; i < cnt; i++) {
            if (!isfinite(y[i])) continue;
            if (!fin++) v0 = y[i];
            v1 = y[i];
            if (y[i] < mn) mn = y[i], xmn = x[i];
            if (y[i] > mx) mx = y[i], xmx = x[i];
        }
        fputs("| ", f);
        md_name(f, name);
        fprintf(f, " | %lld | ", (long long)fin);
        if (!fin) {
            fputs("\xE2\x80\x94 | \xE2\x80\x94 | \xE2\x80\x94 | \xE2\x80\x94 | |\n", f);
            continue;
        }
        md_value(f, v0);
        fputs(" | ", f);
        md_value(f, v1);
        fputs(" | ", f);
        md_value(f, mn);
        fputs(" | ", f);
        md_value(f, mx);
        fputs(" | ", f);
        int32_t g = c->col_group[k];
        arl_report_better b = g >= 0 ? c->groups[g].better : ARL_REPORT_BETTER_NONE;
        if (b != ARL_REPORT_BETTER_NONE) {
            md_value(f, b == ARL_REPORT_BETTER_HIGHER ? mx : mn);
            fprintf(f, " (%.17g)", b == ARL_REPORT_BETTER_HIGHER ? xmx : xmn);
        }
        fputs(" |\n", f);
    }
    fputs("\n## Input notes\n\n", f);
    if (st->malformed) {
        fprintf(f, "- %lld malformed line%s skipped (line%s", (long long)st->malformed,
                st->malformed == 1 ? "" : "s", st->malformed == 1 ? "" : "s");
        for (int64_t i = 0; i < st->malformed && i < ARL_METRICS_MAX_LISTED; i++)
            fprintf(f, "%s%lld", i ? ", " : " ", (long long)st->malformed_line[i]);
        fprintf(f, "%s); the first: %s\n", st->malformed > ARL_METRICS_MAX_LISTED ? ", ..." : "",
                st->malformed_msg);
    } else {
        fputs("- no malformed lines\n", f);
    }
    if (st->non_numeric) {
        fprintf(f, "- %lld non-numeric value%s skipped (the first: line %lld, key ",
                (long long)st->non_numeric, st->non_numeric == 1 ? "" : "s",
                (long long)st->non_numeric_line);
        md_name(f, st->non_numeric_key);
        fputs(")\n", f);
    }
    if (st->nonfinite)
        fprintf(f, "- %lld non-finite values (NaN, inf, null): gaps in the plots\n",
                (long long)st->nonfinite);
    int32_t unplotted = 0;
    for (int32_t k = 0; k < n; k++)
        if (c->col_group[k] < 0 && strcmp(arl_metrics_name(m, k), "step")) unplotted++;
    if (unplotted) {
        fprintf(f, "- %d metric%s in no plot group (values in the table above and in metrics.csv):",
                (int)unplotted, unplotted == 1 ? "" : "s");
        int32_t shown = 0;
        for (int32_t k = 0; k < n && shown < 20; k++)
            if (c->col_group[k] < 0 && strcmp(arl_metrics_name(m, k), "step")) {
                fputs(shown++ ? ", " : " ", f);
                md_name(f, arl_metrics_name(m, k));
            }
        if (unplotted > shown) fprintf(f, ", and %d more", (int)(unplotted - shown));
        fputc('\n', f);
    }
    return ferror(f) ? arl_errorf(ARL_ERR_IO, "write error") : ARL_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* The report                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* A plot for write_atomic (arl_svg_plot_write's error says no errno). */
typedef struct svg_ctx {
    const arl_svg_plot *p;
    const arl_svg_series *ser;
    int32_t n;
} svg_ctx;

static arl_status svg_cb(const void *ctx, FILE *f) {
    const svg_ctx *c = ctx;
    return arl_svg_plot_fwrite(f, c->p, c->ser, c->n, NULL);
}

arl_status arl_report_write(const arl_metrics *m, const char *out_dir, const arl_report_opts *opts,
                            arl_report_result *res) {
    arl_report_opts o0 = {0};
    const arl_report_opts *o = opts ? opts : &o0;
    int32_t ng = o->n_groups;
    const arl_report_group *groups = o->groups;
    if (!groups || ng <= 0) groups = arl_report_default_groups(&ng);
    for (int32_t g = 0; g < ng; g++)
        if (!group_name_ok(groups[g].name) || !groups[g].title || !groups[g].patterns)
            return arl_errorf(ARL_ERR_ARG,
                              "report: plot group %d: needs a name of letters, digits, '_' or "
                              "'-', a title and patterns (got name \"%s\")",
                              (int)g, groups[g].name ? groups[g].name : "(null)");
    char path[4096], plots[4096];
    ARL_TRY(arl_mkdir_p(out_dir));
    ARL_TRY(path_join(plots, sizeof plots, out_dir, "plots"));
    ARL_TRY(arl_mkdir_p(plots));
    ARL_TRY(path_join(path, sizeof path, out_dir, "metrics.csv"));
    ARL_TRY(arl_metrics_write_csv(m, path));

    int32_t n = m->n_cols;
    int32_t *col_group = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int32_t *members = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    arl_svg_series *ser = malloc(sizeof(arl_svg_series) * (size_t)(n ? n : 1));
    char *group_has = calloc((size_t)ng, 1);
    arl_status s = ARL_OK;
    if (!col_group || !members || !ser || !group_has)
        s = arl_errorf(ARL_ERR_NOMEM, "report: out of memory");
    arl_report_result r = {0};
    for (int32_t k = 0; s == ARL_OK && k < n; k++) {
        col_group[k] = -1;
        const char *name = arl_metrics_name(m, k);
        if (!strcmp(name, "step")) continue;
        for (int32_t g = 0; g < ng && col_group[k] < 0; g++)
            if (group_match(&groups[g], name)) col_group[k] = g;
        if (col_group[k] < 0) r.metrics_in_none++;
    }
    for (int32_t g = 0; s == ARL_OK && g < ng; g++) {
        int32_t cnt = 0;
        for (int32_t k = 0; k < n; k++) {
            const char *name = arl_metrics_name(m, k);
            if (strcmp(name, "step") && group_match(&groups[g], name)) members[cnt++] = k;
        }
        char file[300];
        snprintf(file, sizeof file, "%s.svg", groups[g].name);
        s = path_join(path, sizeof path, plots, file);
        if (s != ARL_OK) break;
        if (cnt == 0) {
            r.groups_empty++;
            remove(path); /* a stale plot of an earlier report */
            continue;
        }
        for (int32_t i = 0; i < cnt; i++) {
            ser[i].name = arl_metrics_name(m, members[i]);
            ser[i].n = arl_metrics_series(m, members[i], &ser[i].x, &ser[i].y);
        }
        arl_svg_plot p = {.title = groups[g].title,
                          .xlabel = m->has_step ? "step" : "row",
                          .ylabel = groups[g].ylabel,
                          .width = o->width,
                          .height = o->height,
                          .yscale = groups[g].yscale};
        const svg_ctx sc = {&p, ser, cnt};
        s = write_atomic(path, svg_cb, &sc);
        if (s == ARL_OK) {
            group_has[g] = 1;
            r.plots++;
        }
    }
    if (s == ARL_OK) {
        summary_ctx c = {m, o, groups, ng, col_group, group_has};
        s = path_join(path, sizeof path, out_dir, "summary.md");
        if (s == ARL_OK) s = write_atomic(path, summary_cb, &c);
    }
    free(col_group);
    free(members);
    free(ser);
    free(group_has);
    if (s == ARL_OK && res) *res = r;
    return s;
}

/* The copy of metrics.jsonl src onto dst (in the output folder out_dir) replaces no other run's:
 * dst is absent or the start of src (an earlier copy of the same run); else ARL_ERR_STATE, with
 * nothing written. */
static arl_status copy_replaces_no_run(const char *src, const char *dst, const char *run_dir,
                                       const char *out_dir) {
    struct stat sb;
    if (stat(dst, &sb) != 0) return ARL_OK;
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    arl_status s = arl_file_read(src, 0, &a, &na);
    if (!s) s = arl_file_read(dst, 0, &b, &nb);
    if (!s && (nb > na || memcmp(a, b, nb) != 0))
        s = arl_errorf(ARL_ERR_STATE,
                       "--out %s holds the metrics.jsonl of another run, which the report would "
                       "replace with %s's; refusing (give a new or empty folder, or remove %s)",
                       out_dir, run_dir, dst);
    free(a);
    free(b);
    return s;
}

static arl_status copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return arl_errorf(ARL_ERR_IO, "%s: cannot open for reading: %s", src, strerror(errno));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", dst);
    FILE *out = fopen(tmp, "wb");
    if (!out) {
        fclose(in);
        return arl_file_write_failed(tmp, "cannot open for writing", errno);
    }
    char buf[1 << 16];
    size_t got;
    arl_status s = ARL_OK;
    while (!s && (got = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, got, out) != got) s = arl_file_write_failed(tmp, "write failed", errno);
    if (!s && ferror(in)) s = arl_errorf(ARL_ERR_IO, "%s: read error: %s", src, strerror(errno));
    fclose(in);
    if (fclose(out) != 0 && !s) s = arl_file_write_failed(tmp, "write failed", errno);
    if (!s && rename(tmp, dst) != 0)
        s = arl_errorf(ARL_ERR_IO, "%s: cannot rename to %s: %s", tmp, dst, strerror(errno));
    if (s) {
        remove(tmp);
        arl_error_prefix(s, "%s: cannot copy to %s", src, dst);
    }
    return s;
}

/* arl_report_generate, and with need_rows arl_report_generate_strict */
static arl_status report_generate(const char *run_dir, const char *out_dir, const char *title,
                                  int need_rows, arl_report_result *res, arl_metrics_stats *stats) {
    if (!out_dir) out_dir = run_dir;
    char mpath[4096], epath[4096];
    ARL_TRY(path_join(mpath, sizeof mpath, run_dir, "metrics.jsonl"));
    ARL_TRY(path_join(epath, sizeof epath, run_dir, "eval.json"));
    struct stat sb;
    if (stat(run_dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return arl_errorf(ARL_ERR_NOT_FOUND, "%s: not a directory (expected a run folder)",
                          run_dir);
    if (stat(mpath, &sb) != 0) {
        char before[4096];
        struct stat eb;
        if (path_join(before, sizeof before, run_dir, "eval-before.json") == ARL_OK &&
            stat(before, &eb) == 0)
            return arl_errorf(ARL_ERR_NOT_FOUND,
                              "%s: not found: the run has not finished an update yet (%s holds "
                              "its evaluation before RL); report once it has (agentrl train "
                              "--resume continues a run that stopped)",
                              mpath, before);
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "%s: not found (expected the metrics of a run of agentrl train)", mpath);
    }
    if (S_ISDIR(sb.st_mode))
        return arl_errorf(ARL_ERR_FORMAT, "%s: is a directory (expected the metrics file)", mpath);
    arl_report_eval ev;
    int have_eval = stat(epath, &sb) == 0;
    const char *ename = "eval.json";
    if (!have_eval) { /* an unfinished run: its evaluation before RL, when that has run */
        ARL_TRY(path_join(epath, sizeof epath, run_dir, "eval-before.json"));
        have_eval = stat(epath, &sb) == 0;
        ename = "eval-before.json";
    }
    if (have_eval) ARL_TRY(arl_report_eval_read(epath, &ev));
    arl_metrics *m = NULL;
    ARL_TRY(arl_metrics_read(mpath, &m));
    if (stats) *stats = m->st;
    arl_status s = need_rows ? arl_metrics_check_rows(m) : ARL_OK;
    if (s == ARL_OK) s = arl_mkdir_p(out_dir);
    /* a separate output folder gets copies of the inputs */
    char *rin = s == ARL_OK ? realpath(run_dir, NULL) : NULL;
    char *rout = s == ARL_OK ? realpath(out_dir, NULL) : NULL;
    if (s == ARL_OK && (!rin || !rout)) /* the copies are not skipped for it */
        s = arl_errorf(errno == ENOMEM ? ARL_ERR_NOMEM : ARL_ERR_IO,
                       "%s: cannot resolve the path: %s", !rin ? run_dir : out_dir,
                       strerror(errno));
    if (s == ARL_OK && rin && rout && strcmp(rin, rout)) {
        char dst[4096];
        s = path_join(dst, sizeof dst, out_dir, "metrics.jsonl");
        if (s == ARL_OK) s = copy_replaces_no_run(mpath, dst, run_dir, out_dir);
        if (s == ARL_OK) s = copy_file(mpath, dst);
        if (s == ARL_OK && have_eval) s = path_join(dst, sizeof dst, out_dir, ename);
        if (s == ARL_OK && have_eval) s = copy_file(epath, dst);
    }
    free(rin);
    free(rout);
    if (s == ARL_OK) {
        arl_report_opts o = {.title = title, .source = mpath, .eval = have_eval ? &ev : NULL};
        s = arl_report_write(m, out_dir, &o, res);
    }
    arl_metrics_free(m);
    return s;
}

arl_status arl_report_generate(const char *run_dir, const char *out_dir, const char *title,
                               arl_report_result *res, arl_metrics_stats *stats) {
    return report_generate(run_dir, out_dir, title, 0, res, stats);
}

arl_status arl_report_generate_strict(const char *run_dir, const char *out_dir, const char *title,
                                      arl_report_result *res, arl_metrics_stats *stats) {
    return report_generate(run_dir, out_dir, title, 1, res, stats);
}
