/* cli/interrupt.c: what a run says when it is interrupted or stopped by a failure it can be
 * continued after (cli.h cli_note_on_interrupt, cli_note_on_failure), how an interrupt leaves
 * no partial output file or directory (cli_remove_on_interrupt, cli_remove_dir_on_interrupt,
 * cli_interrupt_defer, cli_out_open), and how a command stops at a point of its choosing to say
 * what it did first (cli_interrupt_soft). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cli/cli.h"

static char g_note[8192]; /* the interrupt note, g_cmd at its end */
static size_t g_note_len;
static const char *g_command; /* "train", "sft", "rollout": set when armed */
static const char *g_cmd; /* "  PROGRAM COMMAND ARGS --resume\n" in g_note, or NULL (too long) */
static char g_flag[64];   /* what the continuing command adds: "--resume", "--shard 3" */
static char g_launcher[32]; /* cli_note_launcher's "mpirun", "" for none */

static char g_prog[1024] = "agentrl"; /* cli_note_program's program, as a shell word */

static char g_remove[4096];     /* cli_remove_on_interrupt's file, "" for none */
static char g_remove_dir[4096]; /* cli_remove_dir_on_interrupt's directory, "" for none */
static void (*volatile g_call)(void); /* cli_call_on_interrupt's function, or NULL */

/* Remove the plain files in dir, then dir: async-signal-safe (open, getdents64, unlinkat, rmdir,
 * close; no allocation).  A few passes, in case entries moved while they were being removed. */
static void remove_dir_now(const char *dir) {
    static char buf[8192] __attribute__((aligned(8)));
    for (int pass = 0; pass < 4; pass++) {
        const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) return;
        int removed = 0;
        long n;
        while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
            for (long at = 0; at < n;) {
                /* struct linux_dirent64: ino 8, off 8, reclen 2, type 1, then the name */
                unsigned short reclen;
                memcpy(&reclen, buf + at + 16, sizeof reclen);
                const char *name = buf + at + 19;
                if (strcmp(name, ".") && strcmp(name, "..")) removed += unlinkat(fd, name, 0) == 0;
                at += reclen;
            }
        close(fd);
        if (rmdir(dir) == 0 || !removed) return;
    }
}

static void on_interrupt(int sig) {
    /* async-signal-safe: unlink(2), remove_dir_now, cli_call_on_interrupt's function, write(2),
     * then the signal again with its default action (SA_RESETHAND restored it; it is blocked
     * until this handler returns) */
    if (g_remove[0]) unlink(g_remove);
    if (g_remove_dir[0]) remove_dir_now(g_remove_dir);
    void (*call)(void) = g_call;
    if (call) call();
    ssize_t w = write(STDERR_FILENO, g_note, g_note_len);
    (void)w;
    raise(sig);
}

static void arm(void);

static int g_soft;                       /* cli_interrupt_soft was called */
static volatile sig_atomic_t g_soft_sig; /* the signal on_soft noted, or 0 */

static void install(void (*handler)(int), int flags, struct sigaction old[2], int replaced[2]);

static void on_soft(int sig) {
    /* async-signal-safe: the signal noted, a line said, the next signal handled at once */
    static const char msg[] = "\nagentrl: interrupted: stopping after the current step "
                              "(interrupt again to stop at once)\n";
    g_soft_sig = sig;
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    struct sigaction old[2];
    int replaced[2];
    install(on_interrupt, SA_RESETHAND, old, replaced);
}

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

void cli_note_program(const char *argv0) {
    /* a path ("build/agentrl", "/opt/x/agentrl") as given, quoted where a shell needs it; a bare
     * name was found on PATH, where "agentrl" is found again (and so is one too long to keep) */
    char q[sizeof g_prog + 1];
    const size_t n = argv0 && strchr(argv0, '/') ? quote_arg(q, sizeof q, argv0) : 0;
    snprintf(g_prog, sizeof g_prog, "%s", n && n < sizeof q ? q + 1 : "agentrl");
}

void cli_note_launcher(const char *launcher) {
    snprintf(g_launcher, sizeof g_launcher, "%s", launcher ? launcher : "");
}

/* How the notes go on after "Continue with" (or "continue with"): ":" or " the same mpirun
 * command (its own options as before) running:", before the command shown. */
static const char *continue_with(char *buf, size_t cap) {
    if (!g_launcher[0]) return ":";
    snprintf(buf, cap, " the same %s command (its own options as before) running:", g_launcher);
    return buf;
}

void cli_note_on_interrupt(const char *command, int argc, char **argv, const char *flag,
                           const char *value) {
    char cw[128];
    size_t n = (size_t)snprintf(g_note, sizeof g_note,
                                "\nagentrl: interrupted: %s stops here; what it saved stays. "
                                "Continue with%s\n",
                                command, continue_with(cw, sizeof cw));
    const size_t cmd_at = n;
    n += (size_t)snprintf(g_note + n, sizeof g_note - n, "  %s %s", g_prog, command);
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
                             "Continue with the same %s%scommand and %s%s%s.\n",
                             command, g_launcher, g_launcher[0] ? " " : "", flag, value ? " " : "",
                             value ? value : "");
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
        (size_t)snprintf(g_note, sizeof g_note, "\nagentrl: interrupted: %s stops here; %s:\n  %s",
                         command, then, g_prog);
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

static int g_deferring; /* cli_interrupt_defer calls not yet resumed (they nest) */
static int g_arm_later; /* arm() came while deferring: cli_interrupt_resume arms */

static void arm(void) {
    if (g_deferring) { /* (installing now would end the deferral) */
        g_arm_later = 1;
        return;
    }
    struct sigaction old[2];
    int replaced[2];
    if (g_soft && !g_soft_sig) /* (SA_RESTART: the command's system calls go on) */
        install(on_soft, SA_RESTART, old, replaced);
    else
        install(on_interrupt, SA_RESETHAND, old, replaced);
}

void cli_interrupt_soft(void) {
    g_soft = 1;
    arm();
}

int cli_interrupted(void) {
    return g_soft_sig;
}

void cli_interrupt_finish(void) {
    const int sig = g_soft_sig;
    if (!sig) return;
    fflush(stdout); /* what the command said goes before the note */
    fflush(stderr);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    on_interrupt(sig); /* the note, then the signal with its default action */
    _exit(128 + sig);  /* (not reached) */
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
    char cw[128];
    if (g_cmd)
        fprintf(stderr, "%s\n%s", continue_with(cw, sizeof cw), g_cmd);
    else
        fprintf(stderr, " the same %s%scommand and %s.\n", g_launcher, g_launcher[0] ? " " : "",
                g_flag);
}

void cli_note_on_interrupt_text(const char *text) {
    size_t n = strlen(text);
    if (n >= sizeof g_note) n = sizeof g_note - 1;
    memcpy(g_note, text, n);
    g_note[n] = 0;
    g_note_len = n;
    g_command = NULL; /* (no failure note: this command is not continued) */
    arm();
}

/* Set dst (a handler's path) to path or "" (NULL, or too long), with the signals held so that
 * the handler never sees half a name. */
static void set_remove_path(char *dst, size_t cap, const char *path) {
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    if (path && strlen(path) < cap)
        memcpy(dst, path, strlen(path) + 1);
    else
        dst[0] = 0;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (path) arm();
}

void cli_remove_on_interrupt(const char *path) {
    set_remove_path(g_remove, sizeof g_remove, path);
}

void cli_remove_dir_on_interrupt(const char *dir) {
    set_remove_path(g_remove_dir, sizeof g_remove_dir, dir);
}

void cli_call_on_interrupt(void (*fn)(void)) {
    g_call = fn;
    if (fn) arm();
}

static volatile sig_atomic_t g_deferred; /* the signal that came while deferred, or 0 */
static struct sigaction g_before[2];     /* the actions cli_interrupt_defer replaced */
static int g_replaced[2];

static void on_deferred(int sig) {
    g_deferred = sig;
}

void cli_interrupt_defer(void) {
    if (g_deferring++ > 0) return; /* (inside one already: the outermost resume acts) */
    g_deferred = 0;
    install(on_deferred, SA_RESTART, g_before, g_replaced);
}

void cli_interrupt_resume(void) {
    if (g_deferring == 0 || --g_deferring > 0) return;
    const int sigs[2] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++)
        if (g_replaced[i]) sigaction(sigs[i], &g_before[i], NULL);
    g_replaced[0] = g_replaced[1] = 0;
    if (g_arm_later) arm();
    g_arm_later = 0;
    if (g_deferred) raise(g_deferred);
}

arl_status cli_out_open(const char *opt, const char *path, char **tmp, FILE **f) {
    *f = NULL;
    *tmp = NULL;
    struct stat st;
    if (!*path) return arl_errorf(ARL_ERR_ARG, "%s: empty file name", opt);
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return arl_errorf(ARL_ERR_ARG, "%s %s: is a directory; give the name of the file to write",
                          opt, path);
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        /* a device, FIFO or socket (/dev/null, /dev/stdout, a pipe): written as it is; a file
         * renamed onto it would replace the node itself (as root, /dev/null) */
        if (!(*f = fopen(path, "w")))
            return arl_errorf(ARL_ERR_IO, "%s %s: cannot open for writing: %s", opt, path,
                              strerror(errno));
        return ARL_OK;
    }
    /* a symbolic link to a file: the file it names is replaced, not the link */
    char *real = NULL;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) real = realpath(path, NULL);
    const char *target = real ? real : path;
    size_t n = strlen(target) + 16;
    char *t = malloc(n);
    if (!t) {
        free(real);
        return arl_errorf(ARL_ERR_NOMEM, "out of memory");
    }
    snprintf(t, n, "%s.tmp-XXXXXX", target);
    free(real);
    int fd = mkstemp(t);
    if (fd < 0) {
        arl_status s = arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO,
                                  "%s %s: cannot create a file beside it: %s (does its "
                                  "directory exist and is it writable?)",
                                  opt, path, strerror(errno));
        free(t);
        return s;
    }
    cli_remove_on_interrupt(t);
    if (fchmod(fd, 0644) != 0 || !(*f = fdopen(fd, "w"))) {
        arl_status s = arl_errorf(ARL_ERR_IO, "%s %s: %s: %s", opt, path, t, strerror(errno));
        close(fd);
        unlink(t);
        cli_remove_on_interrupt(NULL);
        free(t);
        return s;
    }
    *tmp = t;
    return ARL_OK;
}

arl_status cli_out_commit(arl_status s, FILE *f, char *tmp, const char *opt, const char *path) {
    if (fflush(f) != 0 && !s)
        s = arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO, "%s %s: write failed: %s", opt,
                       path, strerror(errno));
    if (!tmp) { /* written in place (not a regular file) */
        if (fclose(f) != 0 && !s)
            s = arl_errorf(ARL_ERR_IO, "%s %s: write failed: %s", opt, path, strerror(errno));
        return s;
    }
    if (!s && fsync(fileno(f)) != 0)
        s = arl_errorf(ARL_ERR_IO, "%s %s: fsync failed: %s", opt, path, strerror(errno));
    if (fclose(f) != 0 && !s)
        s = arl_errorf(ARL_ERR_IO, "%s %s: write failed: %s", opt, path, strerror(errno));
    /* onto the file that tmp was made beside: path, or the file its symbolic link names */
    const size_t tl = strlen(tmp) - strlen(".tmp-XXXXXX");
    char *target = strndup(tmp, tl);
    if (!s && !target) s = arl_errorf(ARL_ERR_NOMEM, "out of memory");
    if (!s && rename(tmp, target) != 0)
        s = arl_errorf(ARL_ERR_IO, "%s %s: cannot rename %s onto it: %s", opt, path, tmp,
                       strerror(errno));
    free(target);
    if (s) unlink(tmp);
    cli_remove_on_interrupt(NULL);
    free(tmp);
    return s;
}
