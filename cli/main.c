/* cli/main.c: `agentrl COMMAND [options]`: finds the command in cli/commands.def and runs it.
 * The only place in the toolkit that decides the process exit status. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "core/defer.h"
#include "core/json_dump.h"
#include "core/log.h"

#ifndef AGENTRL_VERSION
#define AGENTRL_VERSION "0.0.0"
#endif

typedef struct cli_command {
    const char *words; /* "model info" */
    int (*fn)(int argc, char **argv);
    const char *summary;
} cli_command;

static const cli_command cli_commands[] = {
#define ARL_COMMAND(words, fn, summary) {words, fn, summary},
#include "cli/commands.def"
#undef ARL_COMMAND
};
#define CLI_NCOMMANDS (sizeof cli_commands / sizeof cli_commands[0])

/* Number of argv words that the command's words match (0 if they do not). */
static int match_words(const char *words, int argc, char **argv) {
    int used = 0;
    const char *p = words;
    while (*p) {
        const char *sp = strchr(p, ' ');
        size_t len = sp ? (size_t)(sp - p) : strlen(p);
        if (used >= argc || strlen(argv[used]) != len || strncmp(argv[used], p, len)) return 0;
        used++;
        p = sp ? sp + 1 : p + len;
    }
    return used;
}

static void print_commands(FILE *f, const char *prefix) {
    size_t plen = prefix ? strlen(prefix) : 0;
    for (size_t i = 0; i < CLI_NCOMMANDS; i++) {
        if (plen && (strncmp(cli_commands[i].words, prefix, plen) ||
                     cli_commands[i].words[plen] != ' '))
            continue;
        fprintf(f, "  %-22s %s\n", cli_commands[i].words, cli_commands[i].summary);
    }
}

static void print_usage(FILE *f) {
    fprintf(f,
            "usage: agentrl COMMAND [options]\n"
            "\n"
            "agentrl %s: agentic RL post-training of sparse Mixture-of-Experts policies.\n"
            "\n"
            "commands:\n",
            AGENTRL_VERSION);
    print_commands(f, NULL);
    fprintf(f, "\n'agentrl COMMAND --help' describes a command's arguments and options.\n"
               "global options: --help, --version, --quiet, --verbose (before COMMAND)\n");
}

int cli_parse(const arl_option *tab, size_t n, int argc, char **argv, void *cfg,
              const char *usage, const char *summary) {
    int want_help = 0;
    arl_status s = arl_options_defaults(tab, n, cfg);
    if (s == ARL_OK) s = arl_options_parse_argv(tab, n, argc, argv, cfg, &want_help);
    if (s == ARL_OK && want_help) {
        arl_options_print_help(stdout, usage, summary, tab, n);
        arl_options_free(tab, n, cfg);
        return -1;
    }
    if (s == ARL_OK) s = arl_options_check_required(tab, n, cfg);
    if (s == ARL_ERR_NOMEM) { /* not a usage error: no usage line, exit 1 */
        arl_options_free(tab, n, cfg);
        return cli_fail(s);
    }
    if (s != ARL_OK) {
        fprintf(stderr, "agentrl: error: %s\nusage: %s\n", arl_error_msg(), usage);
        arl_options_free(tab, n, cfg);
        return ARL_EXIT_USAGE;
    }
    return 0;
}

FILE *cli_progress(void) {
    return arl_log_get_level() >= ARL_LOG_INFO ? stderr : NULL;
}

void cli_print_resolved(const char *title, const arl_option *tab, size_t n, const void *cfg) {
    if (cli_progress()) arl_options_print_resolved(stderr, title, tab, n, cfg);
}

void cli_say(const char *fmt, ...) {
    if (!cli_progress()) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

static int g_fail_rank = -1; /* cli_fail_rank's rank; -1: a process on its own */

void cli_fail_rank(int rank, int world) {
    g_fail_rank = world > 1 ? rank : -1;
}

int cli_fail(arl_status s) {
    const char *m = arl_error_msg();
    char who[32] = "";
    if (g_fail_rank >= 0) snprintf(who, sizeof who, "rank %d: ", g_fail_rank);
    fprintf(stderr, "agentrl: error: %s%s\n", who, m && *m ? m : arl_status_str(s));
    return s == ARL_ERR_ARG ? ARL_EXIT_USAGE : ARL_EXIT_FAIL;
}

arl_status cli_check_ckpt_dir(const char *opt, const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0)
        return arl_errorf(errno == ENOENT ? ARL_ERR_NOT_FOUND : ARL_ERR_IO,
                          "%s %s: %s (give a checkpoint directory: config.json and "
                          "model.safetensors, as agentrl model init or train writes)",
                          opt, dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) /* an input that is not there, as a missing one: exit 1 */
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "%s %s: not a directory (give the checkpoint directory that holds "
                          "config.json and model.safetensors)",
                          opt, dir);
    return ARL_OK;
}

int main(int argc, char **argv) {
    arl_defer_hooks_set(cli_interrupt_defer, cli_interrupt_resume);
    arl_json_watch(); /* before any thread: arl_json_loads' watch of jansson's allocations */
    cli_note_program(argc > 0 ? argv[0] : NULL); /* the notes' commands run it as it was run */
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--version")) {
            printf("agentrl %s\n", AGENTRL_VERSION);
            return 0;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--quiet")) {
            arl_log_set_level(ARL_LOG_WARN);
        } else if (!strcmp(argv[i], "--verbose")) {
            arl_log_set_level(ARL_LOG_DEBUG);
        } else {
            fprintf(stderr, "agentrl: error: unknown option '%s' (see agentrl --help)\n", argv[i]);
            return ARL_EXIT_USAGE;
        }
    }
    if (i >= argc) {
        print_usage(stderr);
        return ARL_EXIT_USAGE;
    }
    int best = -1, best_used = 0;
    for (size_t c = 0; c < CLI_NCOMMANDS; c++) {
        int used = match_words(cli_commands[c].words, argc - i, argv + i);
        if (used > best_used) {
            best = (int)c;
            best_used = used;
        }
    }
    if (best < 0) {
        /* "agentrl model" or "agentrl model --help": list the subcommands of a group */
        size_t len = strlen(argv[i]);
        int group = 0;
        for (size_t c = 0; c < CLI_NCOMMANDS; c++)
            if (!strncmp(cli_commands[c].words, argv[i], len) && cli_commands[c].words[len] == ' ')
                group = 1;
        if (group) {
            int help = i + 1 < argc && (!strcmp(argv[i + 1], "--help") || !strcmp(argv[i + 1], "-h"));
            FILE *f = help ? stdout : stderr;
            if (!help && i + 1 < argc)
                fprintf(f, "agentrl: error: unknown command '%s %s'\n", argv[i], argv[i + 1]);
            fprintf(f, "usage: agentrl %s SUBCOMMAND [options]\n\nsubcommands:\n", argv[i]);
            print_commands(f, argv[i]);
            return help ? 0 : ARL_EXIT_USAGE;
        }
        fprintf(stderr, "agentrl: error: unknown command '%s' (see agentrl --help)\n", argv[i]);
        return ARL_EXIT_USAGE;
    }
    int rc = cli_commands[best].fn(argc - i - best_used, argv + i + best_used);
    /* the results went to standard output: a write that failed there (a full disk under '>
     * FILE') is a failure, not exit 0 with the output cut short */
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "agentrl: error: standard output: write failed: %s\n", strerror(errno));
        if (rc == ARL_EXIT_OK) rc = ARL_EXIT_FAIL;
    }
    return rc;
}
