/* core/options.h: one table declares each option; parsing (command line and JSON),
 * validation, --help and the printed resolved configuration all come from it.
 *
 * A table is an array of arl_option describing fields of a caller's struct (by offset).
 * Field types by option type:
 *   ARL_OPT_BOOL    int      (flag on the command line: --x sets 1; --no-x sets 0;
 *                             also --x=true|false; JSON true/false)
 *   ARL_OPT_INT     int64_t  (checked against [min, max])
 *   ARL_OPT_FLOAT   double   (checked against [min, max], must be finite)
 *   ARL_OPT_STRING  char *   (owned by the struct; freed by arl_options_free)
 *   ARL_OPT_CHOICE  char *   (one of the '|'-separated words in `choices`)
 *   ARL_OPT_LIST    arl_strlist (repeatable option, e.g. --set k=v --set k2=v2; JSON array
 *                             of strings)
 * Positional arguments are options with ARL_OPT_POSITIONAL, filled in table order.
 * Names are written without dashes ("max-tokens"); in JSON files the same name is the key,
 * with '-' and '_' treated alike ("max_tokens" matches "max-tokens").
 */
#ifndef ARL_CORE_OPTIONS_H
#define ARL_CORE_OPTIONS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"

typedef enum arl_opt_type {
    ARL_OPT_BOOL,
    ARL_OPT_INT,
    ARL_OPT_FLOAT,
    ARL_OPT_STRING,
    ARL_OPT_CHOICE,
    ARL_OPT_LIST,
} arl_opt_type;

enum {
    ARL_OPT_REQUIRED = 1u << 0,   /* must be given (no default) */
    ARL_OPT_POSITIONAL = 1u << 1, /* positional argument, filled in table order */
    ARL_OPT_CLI_ONLY = 1u << 2,   /* not accepted as a JSON key */
    ARL_OPT_HIDDEN = 1u << 3,     /* not printed in the resolved configuration */
};

typedef struct arl_strlist {
    char **v; /* (n) strings, owned; freed by arl_options_free */
    int n;
} arl_strlist;

typedef struct arl_option {
    const char *name;    /* "max-tokens" (no dashes) */
    arl_opt_type type;
    size_t offset;       /* offsetof(struct, field) */
    const char *def;     /* default as text (parsed like a command-line value); NULL: none */
    const char *help;    /* one line */
    double min, max;     /* inclusive bounds for INT/FLOAT; both 0 = unbounded */
    const char *choices; /* "cpu|cuda" for CHOICE */
    unsigned flags;      /* ARL_OPT_* flags */
    const char *metavar; /* "N", "FILE"; NULL: derived from the type */
} arl_option;

#define ARL_OPTIONS_COUNT(tab) (sizeof(tab) / sizeof((tab)[0]))

/* Set every field to its default (NULL/0 where there is none). Call first. */
arl_status arl_options_defaults(const arl_option *tab, size_t n, void *cfg);

/* Parse argv[0..argc-1] (argv[0] is the first argument, not the program name).
 * "--help"/"-h" anywhere: returns ARL_OK and sets *want_help = 1 without validating.
 * "--" ends options. Errors name the option and the expected value (ARL_ERR_ARG). */
arl_status arl_options_parse_argv(const arl_option *tab, size_t n, int argc, char **argv,
                                  void *cfg, int *want_help);

/* Parse one JSON object's text (already read from `where`, used in messages).
 * Unknown keys and type mismatches are errors naming the key.  null unsets a string or choice
 * option that has no default (arl_options_to_json writes an unset one so). Keys given here are
 * overridden later by the command line when both are parsed (JSON first, argv second). */
arl_status arl_options_parse_json_text(const arl_option *tab, size_t n, const char *text,
                                       const char *where, void *cfg);

/* Set one option from text "value" (also used for --set key=value style overrides). */
arl_status arl_options_set(const arl_option *tab, size_t n, const char *name, const char *value,
                           void *cfg);

/* After parsing: check that every ARL_OPT_REQUIRED option was given. */
arl_status arl_options_check_required(const arl_option *tab, size_t n, const void *cfg);

/* --help text: usage line, summary, then one line per option with metavar, default and
 * valid range or choices. */
void arl_options_print_help(FILE *f, const char *usage, const char *summary,
                            const arl_option *tab, size_t n);

/* The resolved configuration, one "name = value" line per option (ARL_OPT_HIDDEN left out). */
void arl_options_print_resolved(FILE *f, const char *title, const arl_option *tab, size_t n,
                                const void *cfg);

/* The resolved configuration as a compact JSON object; caller frees with free(). NULL on OOM. */
char *arl_options_to_json(const arl_option *tab, size_t n, const void *cfg);

/* Free owned strings and lists of cfg; the struct itself belongs to the caller. */
void arl_options_free(const arl_option *tab, size_t n, void *cfg);

#endif
