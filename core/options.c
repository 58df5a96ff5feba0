/* core/options.c: option tables (see options.h). */
#include "core/options.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/json_dump.h"

static int name_eq(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char x = *a == '_' ? '-' : *a, y = *b == '_' ? '-' : *b;
        if (x != y) return 0;
    }
    return *a == 0 && *b == 0;
}

static const arl_option *find_opt(const arl_option *tab, size_t n, const char *name, size_t len) {
    char buf[128];
    if (len >= sizeof buf) return NULL;
    memcpy(buf, name, len);
    buf[len] = 0;
    for (size_t i = 0; i < n; i++)
        if (!(tab[i].flags & ARL_OPT_POSITIONAL) && name_eq(tab[i].name, buf)) return &tab[i];
    return NULL;
}

static void *field(const arl_option *o, void *cfg) {
    return (char *)cfg + o->offset;
}

static const char *metavar(const arl_option *o) {
    if (o->metavar) return o->metavar;
    switch (o->type) {
    case ARL_OPT_INT: return "N";
    case ARL_OPT_FLOAT: return "X";
    case ARL_OPT_CHOICE: return o->choices;
    case ARL_OPT_BOOL: return "";
    default: return "VALUE";
    }
}

static int choice_ok(const char *choices, const char *v) {
    size_t lv = strlen(v);
    const char *p = choices;
    while (*p) {
        const char *bar = strchr(p, '|');
        size_t l = bar ? (size_t)(bar - p) : strlen(p);
        if (l == lv && strncmp(p, v, l) == 0) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

static int bounded(const arl_option *o) {
    return !(o->min == 0 && o->max == 0);
}

static arl_status set_value(const arl_option *o, const char *v, void *cfg) {
    void *f = field(o, cfg);
    char *end;
    switch (o->type) {
    case ARL_OPT_BOOL:
        if (!strcmp(v, "true") || !strcmp(v, "1") || !strcmp(v, "yes") || !strcmp(v, "on"))
            *(int *)f = 1;
        else if (!strcmp(v, "false") || !strcmp(v, "0") || !strcmp(v, "no") || !strcmp(v, "off"))
            *(int *)f = 0;
        else
            return arl_errorf(ARL_ERR_ARG, "option '%s': expected true or false, got '%s'",
                              o->name, v);
        return ARL_OK;
    case ARL_OPT_INT: {
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end)
            return arl_errorf(ARL_ERR_ARG, "option '%s': expected an integer, got '%s'", o->name,
                              v);
        if (bounded(o) && (x < o->min || x > o->max))
            return arl_errorf(ARL_ERR_ARG, "option '%s': %lld is outside [%.17g, %.17g]", o->name,
                              x, o->min, o->max);
        *(int64_t *)f = x;
        return ARL_OK;
    }
    case ARL_OPT_FLOAT: {
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !isfinite(x))
            return arl_errorf(ARL_ERR_ARG, "option '%s': expected a finite number, got '%s'",
                              o->name, v);
        if (bounded(o) && (x < o->min || x > o->max))
            return arl_errorf(ARL_ERR_ARG, "option '%s': %g is outside [%g, %g]", o->name, x,
                              o->min, o->max);
        *(double *)f = x;
        return ARL_OK;
    }
    case ARL_OPT_CHOICE:
        if (!choice_ok(o->choices, v))
            return arl_errorf(ARL_ERR_ARG, "option '%s': expected one of %s, got '%s'", o->name,
                              o->choices, v);
        /* fall through */
    case ARL_OPT_STRING: {
        char *s = strdup(v);
        if (!s) return arl_errorf(ARL_ERR_NOMEM, "option '%s': out of memory", o->name);
        free(*(char **)f);
        *(char **)f = s;
        return ARL_OK;
    }
    case ARL_OPT_LIST: {
        arl_strlist *l = f;
        char **nv = realloc(l->v, (size_t)(l->n + 1) * sizeof *nv);
        if (!nv) return arl_errorf(ARL_ERR_NOMEM, "option '%s': out of memory", o->name);
        l->v = nv;
        if (!(l->v[l->n] = strdup(v)))
            return arl_errorf(ARL_ERR_NOMEM, "option '%s': out of memory", o->name);
        l->n++;
        return ARL_OK;
    }
    }
    return arl_errorf(ARL_ERR_INTERNAL, "option '%s': unknown type", o->name);
}

arl_status arl_options_defaults(const arl_option *tab, size_t n, void *cfg) {
    /* every field cleared first: out of memory, what was copied is freed and the whole config
     * is left cleared (NULL strings), so arl_options_free is safe on it either way */
    for (size_t i = 0; i < n; i++) {
        const arl_option *o = &tab[i];
        void *f = field(o, cfg);
        switch (o->type) {
        case ARL_OPT_BOOL: *(int *)f = 0; break;
        case ARL_OPT_INT: *(int64_t *)f = 0; break;
        case ARL_OPT_FLOAT: *(double *)f = 0; break;
        case ARL_OPT_STRING:
        case ARL_OPT_CHOICE: *(char **)f = NULL; break;
        case ARL_OPT_LIST: memset(f, 0, sizeof(arl_strlist)); break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const arl_option *o = &tab[i];
        if (o->def) {
            arl_status s = set_value(o, o->def, cfg);
            if (s == ARL_ERR_NOMEM) { /* a string default not copied */
                arl_options_free(tab, n, cfg);
                return s;
            }
            ARL_ASSERT(s == ARL_OK); /* a default that does not parse is a bug in the table */
        }
    }
    return ARL_OK;
}

arl_status arl_options_set(const arl_option *tab, size_t n, const char *name, const char *value,
                           void *cfg) {
    const arl_option *o = find_opt(tab, n, name, strlen(name));
    if (!o) return arl_errorf(ARL_ERR_ARG, "unknown option '%s'", name);
    return set_value(o, value, cfg);
}

arl_status arl_options_parse_argv(const arl_option *tab, size_t n, int argc, char **argv,
                                  void *cfg, int *want_help) {
    *want_help = 0;
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--")) break;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            *want_help = 1;
            return ARL_OK;
        }
    size_t next_pos = 0;
    int only_pos = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!only_pos && !strcmp(a, "--")) {
            only_pos = 1;
            continue;
        }
        if (!only_pos && a[0] == '-' && a[1] == '-' && a[2]) {
            const char *name = a + 2;
            const char *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            const arl_option *o = find_opt(tab, n, name, len);
            if (!o && !eq && len > 3 && !strncmp(name, "no-", 3)) {
                o = find_opt(tab, n, name + 3, len - 3);
                if (o && o->type == ARL_OPT_BOOL) {
                    *(int *)field(o, cfg) = 0;
                    continue;
                }
                o = NULL;
            }
            if (!o) return arl_errorf(ARL_ERR_ARG, "unknown option '--%.*s' (see --help)", (int)len, name);
            if (o->type == ARL_OPT_BOOL && !eq) {
                *(int *)field(o, cfg) = 1;
                continue;
            }
            const char *v = eq ? eq + 1 : NULL;
            if (!v) {
                if (i + 1 >= argc)
                    return arl_errorf(ARL_ERR_ARG, "option '--%s' needs a value (%s)", o->name,
                                      metavar(o));
                v = argv[++i];
            }
            ARL_TRY(set_value(o, v, cfg));
            continue;
        }
        if (!only_pos && a[0] == '-' && a[1] && a[1] != '.' && !(a[1] >= '0' && a[1] <= '9'))
            return arl_errorf(ARL_ERR_ARG, "unknown option '%s' (see --help)", a);
        /* positional */
        const arl_option *p = NULL;
        size_t seen = 0;
        for (size_t k = 0; k < n; k++)
            if (tab[k].flags & ARL_OPT_POSITIONAL) {
                if (seen == next_pos) {
                    p = &tab[k];
                    break;
                }
                seen++;
            }
        if (!p) return arl_errorf(ARL_ERR_ARG, "unexpected argument '%s' (see --help)", a);
        if (p->type != ARL_OPT_LIST) next_pos++;
        ARL_TRY(set_value(p, a, cfg));
    }
    return ARL_OK;
}

arl_status arl_options_check_required(const arl_option *tab, size_t n, const void *cfg) {
    for (size_t i = 0; i < n; i++) {
        const arl_option *o = &tab[i];
        if (!(o->flags & ARL_OPT_REQUIRED)) continue;
        const void *f = (const char *)cfg + o->offset;
        int given;
        switch (o->type) {
        case ARL_OPT_STRING:
        case ARL_OPT_CHOICE: given = *(char *const *)f != NULL; break;
        case ARL_OPT_LIST: given = ((const arl_strlist *)f)->n > 0; break;
        default: given = 1; ARL_ASSERT(!"required is only for string, choice and list options");
        }
        if (!given) {
            if (o->flags & ARL_OPT_POSITIONAL)
                return arl_errorf(ARL_ERR_ARG, "missing argument %s (see --help)", metavar(o));
            return arl_errorf(ARL_ERR_ARG, "missing required option '--%s %s' (see --help)",
                              o->name, metavar(o));
        }
    }
    return ARL_OK;
}

static const char *json_type_name(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

static arl_status set_json(const arl_option *o, json_t *v, const char *where, void *cfg) {
    char buf[64];
    switch (o->type) {
    case ARL_OPT_BOOL:
        if (!json_is_boolean(v)) goto mismatch;
        *(int *)field(o, cfg) = json_is_true(v);
        return ARL_OK;
    case ARL_OPT_INT:
        if (!json_is_integer(v)) goto mismatch;
        snprintf(buf, sizeof buf, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        break;
    case ARL_OPT_FLOAT:
        if (!json_is_number(v)) goto mismatch;
        snprintf(buf, sizeof buf, "%.17g", json_number_value(v));
        break;
    case ARL_OPT_STRING:
    case ARL_OPT_CHOICE: {
        if (json_is_null(v) && !o->def) { /* unset, as arl_options_to_json writes it */
            free(*(char **)field(o, cfg));
            *(char **)field(o, cfg) = NULL;
            return ARL_OK;
        }
        if (!json_is_string(v)) goto mismatch;
        arl_status s = set_value(o, json_string_value(v), cfg);
        if (s != ARL_OK)
            return arl_error_prefix(s == ARL_ERR_NOMEM ? s : ARL_ERR_CONFIG, "%s", where);
        return ARL_OK;
    }
    case ARL_OPT_LIST: {
        if (!json_is_array(v)) goto mismatch;
        size_t k;
        json_t *e;
        json_array_foreach(v, k, e) {
            if (!json_is_string(e))
                return arl_errorf(ARL_ERR_CONFIG, "%s: key '%s'[%zu]: expected a string, got %s",
                                  where, o->name, k, json_type_name(e));
            ARL_TRY(set_value(o, json_string_value(e), cfg));
        }
        return ARL_OK;
    }
    }
    {
        arl_status s = set_value(o, buf, cfg);
        if (s != ARL_OK)
            return arl_error_prefix(s == ARL_ERR_NOMEM ? s : ARL_ERR_CONFIG, "%s", where);
        return ARL_OK;
    }
mismatch:
    return arl_errorf(ARL_ERR_CONFIG, "%s: key '%s': expected %s, got %s", where, o->name,
                      o->type == ARL_OPT_BOOL    ? "true or false"
                      : o->type == ARL_OPT_INT   ? "an integer"
                      : o->type == ARL_OPT_FLOAT ? "a number"
                      : o->type == ARL_OPT_LIST  ? "an array of strings"
                                                 : "a string",
                      json_type_name(v));
}

arl_status arl_options_parse_json_text(const arl_option *tab, size_t n, const char *text,
                                       const char *where, void *cfg) {
    json_error_t jerr;
    json_t *root = arl_json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && arl_json_error_nomem(&jerr)) /* this process's, not the configuration's */
        return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", where);
    if (!root)
        return arl_errorf(ARL_ERR_CONFIG, "%s:%d:%d: invalid JSON: %s", where, jerr.line,
                          jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return arl_errorf(ARL_ERR_CONFIG, "%s: expected a JSON object at the top level", where);
    }
    const char *key;
    json_t *v;
    arl_status s = ARL_OK;
    json_object_foreach(root, key, v) {
        const arl_option *o = find_opt(tab, n, key, strlen(key));
        if (!o || (o->flags & ARL_OPT_CLI_ONLY)) {
            s = arl_errorf(ARL_ERR_CONFIG, "%s: unknown key '%s'", where, key);
            break;
        }
        if ((s = set_json(o, v, where, cfg)) != ARL_OK) break;
    }
    json_decref(root);
    return s;
}

static void format_value(const arl_option *o, const void *cfg, char *buf, size_t cap) {
    const void *f = (const char *)cfg + o->offset;
    switch (o->type) {
    case ARL_OPT_BOOL: snprintf(buf, cap, "%s", *(const int *)f ? "true" : "false"); break;
    case ARL_OPT_INT: snprintf(buf, cap, "%lld", (long long)*(const int64_t *)f); break;
    case ARL_OPT_FLOAT: snprintf(buf, cap, "%.10g", *(const double *)f); break;
    case ARL_OPT_STRING:
    case ARL_OPT_CHOICE: {
        const char *s = *(char *const *)f;
        snprintf(buf, cap, "%s", s ? s : "(unset)");
        break;
    }
    case ARL_OPT_LIST: {
        const arl_strlist *l = f;
        size_t used = 0;
        buf[0] = 0;
        snprintf(buf, cap, "[");
        used = strlen(buf);
        for (int i = 0; i < l->n && used + 4 < cap; i++) {
            snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", l->v[i]);
            used = strlen(buf);
        }
        if (used + 2 <= cap) strcat(buf, "]");
        break;
    }
    }
}

void arl_options_print_help(FILE *f, const char *usage, const char *summary,
                            const arl_option *tab, size_t n) {
    fprintf(f, "usage: %s\n", usage);
    if (summary && *summary) fprintf(f, "\n%s\n", summary);
    int any_pos = 0, any_opt = 0;
    for (size_t i = 0; i < n; i++) {
        if (tab[i].flags & ARL_OPT_POSITIONAL) any_pos = 1;
        else any_opt = 1;
    }
    char head[160];
    if (any_pos) {
        fprintf(f, "\narguments:\n");
        for (size_t i = 0; i < n; i++) {
            const arl_option *o = &tab[i];
            if (!(o->flags & ARL_OPT_POSITIONAL)) continue;
            snprintf(head, sizeof head, "  %s", metavar(o));
            fprintf(f, "%-30s %s\n", head, o->help);
        }
    }
    if (any_opt) {
        fprintf(f, "\noptions:\n");
        for (size_t i = 0; i < n; i++) {
            const arl_option *o = &tab[i];
            if (o->flags & ARL_OPT_POSITIONAL) continue;
            if (o->type == ARL_OPT_BOOL) snprintf(head, sizeof head, "  --%s", o->name);
            else snprintf(head, sizeof head, "  --%s %s", o->name, metavar(o));
            fprintf(f, "%-30s %s", head, o->help);
            if (strlen(head) > 30) fprintf(f, "\n%-30s", "");
            if (o->flags & ARL_OPT_REQUIRED) fprintf(f, " (required)");
            else if (o->def && *o->def)
                fprintf(f, " (default %s)", o->def);
            if ((o->type == ARL_OPT_INT || o->type == ARL_OPT_FLOAT) && bounded(o))
                fprintf(f, " [%g, %g]", o->min, o->max);
            if (o->type == ARL_OPT_LIST) fprintf(f, " (repeatable)");
            fprintf(f, "\n");
        }
        fprintf(f, "%-30s %s\n", "  --help", "print this help and exit");
    }
}

void arl_options_print_resolved(FILE *f, const char *title, const arl_option *tab, size_t n,
                                const void *cfg) {
    char buf[1024];
    fprintf(f, "%s\n", title ? title : "resolved configuration:");
    for (size_t i = 0; i < n; i++) {
        if (tab[i].flags & ARL_OPT_HIDDEN) continue;
        format_value(&tab[i], cfg, buf, sizeof buf);
        fprintf(f, "  %-24s = %s\n", tab[i].name, buf);
    }
}

char *arl_options_to_json(const arl_option *tab, size_t n, const void *cfg) {
    json_t *o = json_object();
    if (!o) return NULL;
    for (size_t i = 0; i < n; i++) {
        const arl_option *op = &tab[i];
        const void *f = (const char *)cfg + op->offset;
        json_t *v = NULL;
        switch (op->type) {
        case ARL_OPT_BOOL: v = json_boolean(*(const int *)f); break;
        case ARL_OPT_INT: v = json_integer(*(const int64_t *)f); break;
        case ARL_OPT_FLOAT: v = json_real(*(const double *)f); break;
        case ARL_OPT_STRING:
        case ARL_OPT_CHOICE: {
            const char *s = *(char *const *)f;
            v = s ? json_string(s) : json_null();
            break;
        }
        case ARL_OPT_LIST: {
            const arl_strlist *l = f;
            v = json_array();
            for (int k = 0; v && k < l->n; k++) json_array_append_new(v, json_string(l->v[k]));
            break;
        }
        }
        if (!v || json_object_set_new(o, op->name, v)) {
            json_decref(o);
            return NULL;
        }
    }
    char *s = arl_json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    return s;
}

void arl_options_free(const arl_option *tab, size_t n, void *cfg) {
    if (!cfg) return;
    for (size_t i = 0; i < n; i++) {
        void *f = field(&tab[i], cfg);
        if (tab[i].type == ARL_OPT_STRING || tab[i].type == ARL_OPT_CHOICE) {
            free(*(char **)f);
            *(char **)f = NULL;
        } else if (tab[i].type == ARL_OPT_LIST) {
            arl_strlist *l = f;
            for (int k = 0; k < l->n; k++) free(l->v[k]);
            free(l->v);
            l->v = NULL;
            l->n = 0;
        }
    }
}
