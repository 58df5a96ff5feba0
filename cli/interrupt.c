/* cli/interrupt.c: what a run says when it is interrupted or stopped by a failure it can be
 * continued after (cli.h cli_note_on_interrupt, cli_note_on_failure), and how an interrupt leaves
 * no partial output file (cli_remove_on_interrupt, cli_interrupt_defer). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static char g_note[8192]; /* the interrupt note, g_cmd at its end */
static size_t g_note_len;
static const char *g_command; /* "train", "sft", "rollout": set when armed */
static const char *g_cmd; /* "  agentrl COMMAND ARGS --resume\n" in g_note, or NULL (too long) */
static char g_flag[64];   /* what the continuing command adds: "--resume", "--shard 3" */

static char g_remove[4096]; /* cli_remove_on_interrupt's file, "" for none */

static void on_interrupt(int sig) {
    /* async-signal-safe: unlink(2), write(2), then the signal again with its default action
     * (SA_RESETHAND restored it; it is blocked until this handler returns) */
    if (g_remove[0]) unlink(g_remove);
    ssize_t w = write(STDERR_FILENO, g_note, g_note_len);
    (void)w;
    raise(sig);
}

static void arm(void);

/* A shell word for arg: as it is when it holds only harmless characters, else single-quoted. */
static size_t quote_arg(char *out, size_t cap, const char *arg) {
    const int plain = *arg && strspn(arg, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                          "0123456789_./=:,+-@%") == strlen(arg);
    size_t n = 0;
    if (plain) return (size_t)snprintf(out, cap, " %s", arg);
    n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, " '");
    for (const char *p = arg; *p; p++)
        n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, *p == '\'' ? "'\\''" : "%c", *p);
    n += (size_t)snprintf(out + n, n < cap ? cap - n : 0, "'");
    return n;
}

void cli_note_on_interrupt(const char *command, int argc, char **argv, const char *flag,
                           const char *value) {
    size_t n = (size_t)snprintf(g_note, sizeof g_note,
                                "\nagentrl: interrupted: %s stops here; what it saved stays. "
                                "Continue with:\n",
                                command);
    const size_t cmd_at = n;
    n += (size_t)snprintf(g_note + n, sizeof g_note - n, "  agentrl %s", command);
    /* this command's arguments without flag (and its value: "--shard 0" asked for a new shard,
     * the continuing command names the one written), then flag [value] */
    const size_t flag_len = strlen(flag);
    for (int i = 0; i < argc && n < sizeof g_note; i++) {
        if (!strncmp(argv[i], flag, flag_len) && (!argv[i][flag_len] || argv[i][flag_len] == '=')) {
            if (value && !argv[i][flag_len]) i++; /* its value is the next argument */
            continue;
        }
        n += quote_arg(g_note + n, sizeof g_note - n, argv[i]);
    }
    if (n < sizeof g_note) n += quote_arg(g_note + n, sizeof g_note - n, flag);
    if (value && n < sizeof g_note) n += quote_arg(g_note + n, sizeof g_note - n, value);
    if (n < sizeof g_note) n += (size_t)snprintf(g_note + n, sizeof g_note - n, "\n");
    g_cmd = g_note + cmd_at;
    if (n >= sizeof g_note) { /* too long to repeat: the short form */
        n = (size_t)snprintf(g_note, sizeof g_note,
                             "\nagentrl: interrupted: %s stops here; what it saved stays. "
                             "Continue with the same command and %s%s%s.\n",
                             command, flag, value ? " " : "", value ? value : "");
        g_cmd = NULL;
    }
    g_command = command;
    snprintf(g_flag, sizeof g_flag, "%s%s%s", flag, value ? " " : "", value ? value : "");
    g_note_len = n;
    arm();
}

void cli_note_on_interrupt_then(const char *command, const char *then, int n,
                                const char *const *words) {
    size_t k =
        (size_t)snprintf(g_note, sizeof g_note,
                         "\nagentrl: interrupted: %s stops here; %s:\n  agentrl", command, then);
    for (int i = 0; i < n && k < sizeof g_note; i++)
        k += quote_arg(g_note + k, sizeof g_note - k, words[i]);
    if (k < sizeof g_note) k += (size_t)snprintf(g_note + k, sizeof g_note - k, "\n");
    g_note_len = k < sizeof g_note ? k : sizeof g_note - 1;
    g_command = NULL; /* (no failure note: this command is not continued) */
    arm();
}

/* handler for SIGINT and SIGTERM (flags), except where they are ignored (a background job);
 * what each had before in old[i], replaced[i] 1 where it was replaced */
static void install(void (*handler)(int), int flags, struct sigaction old[2], int replaced[2]) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    const int sigs[2] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++)
        replaced[i] = sigaction(sigs[i], NULL, &old[i]) == 0 && old[i].sa_handler != SIG_IGN &&
                      sigaction(sigs[i], &sa, NULL) == 0;
}

static void arm(void) {
    struct sigaction old[2];
    int replaced[2];
    install(on_interrupt, SA_RESETHAND, old, replaced);
}

void cli_note_on_failure(arl_status s) {
    if (!g_command) return;
    const char *then;
    switch (s) {
    case ARL_ERR_FULL:
        then = "Free space, then continue";
        break;
    case ARL_ERR_IO:
    case ARL_ERR_NOMEM:
    case ARL_ERR_DB:
    case ARL_ERR_NET:
    case ARL_ERR_TIMEOUT:
    case ARL_ERR_PROTOCOL:
    case ARL_ERR_ENV:
    case ARL_ERR_DEVICE:
        then = "Once the cause above is dealt with, continue";
        break;
    default:
        return; /* a setting, an input or a bug: continuing as it is would fail again */
    }
    fprintf(stderr, "agentrl: %s stopped; what it saved stays. %s with", g_command, then);
    if (g_cmd)
        fprintf(stderr, ":\n%s", g_cmd);
    else
        fprintf(stderr, " the same command and %s.\n", g_flag);
}

void cli_remove_on_interrupt(const char *path) {
    /* the signals held while g_remove changes, so that the handler never sees half a name */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    if (path && strlen(path) < sizeof g_remove)
        memcpy(g_remove, path, strlen(path) + 1);
    else
        g_remove[0] = 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (path) arm();
}

static volatile sig_atomic_t g_deferred; /* the signal that came while deferred, or 0 */
static struct sigaction g_before[2];     /* the actions cli_interrupt_defer replaced */
static int g_replaced[2];

static void on_deferred(int sig) {
    g_deferred = sig;
}

void cli_interrupt_defer(void) {
    g_deferred = 0;
    install(on_deferred, SA_RESTART, g_before, g_replaced);
}

void cli_interrupt_resume(void) {
    const int sigs[2] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++)
        if (g_replaced[i]) sigaction(sigs[i], &g_before[i], NULL);
    g_replaced[0] = g_replaced[1] = 0;
    if (g_deferred) raise(g_deferred);
}
