/* cli/cmd_env_demos.c: `agentrl env demos NAME --episodes N --seed S --out FILE.jsonl`: write
 * teacher demonstrations of a built-in environment as JSONL conversations (OpenAI chat format
 * with the tool list; envs/builtin/teacher.h) for SFT warm-starts.  Episode i uses task seed
 * S + i; only successful episodes are written.  --out FILE is written under a temporary name and
 * renamed when complete: a failure or an interrupt leaves an existing FILE as it was. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "envs/builtin/teacher.h"

typedef struct env_demos_opts {
    char *name;
    int64_t episodes;
    int64_t seed;
    char *out;
    char *options;
} env_demos_opts;

static const arl_option env_demos_tab[] = {
    {"name", ARL_OPT_STRING, offsetof(env_demos_opts, name), NULL,
     "built-in environment: calculator, needle, kvstore or shapes", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_REQUIRED, "NAME"},
    {"episodes", ARL_OPT_INT, offsetof(env_demos_opts, episodes), "100",
     "number of teacher episodes", 1, 1e9, NULL, 0, "N"},
    {"seed", ARL_OPT_INT, offsetof(env_demos_opts, seed), "0",
     "task seed of the first episode (episode i uses seed + i)", 0, 9007199254740991.0, NULL, 0,
     "S"},
    {"out", ARL_OPT_STRING, offsetof(env_demos_opts, out), "-",
     "output JSONL file ('-': standard output)", 0, 0, NULL, 0, "FILE"},
    {"options", ARL_OPT_STRING, offsetof(env_demos_opts, options), "{}",
     "the environment's options as a JSON object, e.g. '{\"level\": 2}' (calculator), "
     "'{\"doc_tokens\": 100000}' (needle), '{\"failure_rate\": 0.3}' (kvstore), "
     "'{\"size\": 56}' (shapes); \"max_steps\" caps an episode",
     0, 0, NULL, 0, "JSON"},
};
#define ENV_DEMOS_N ARL_OPTIONS_COUNT(env_demos_tab)

/* A temporary file beside path (*tmp: "PATH.tmp-XXXXXX", caller frees) opened for writing,
 * removed if the command is interrupted; renamed onto path by out_commit. */
static arl_status out_open(const char *path, char **tmp, FILE **f) {
    *f = NULL;
    *tmp = NULL;
    struct stat st;
    if (!*path) return arl_errorf(ARL_ERR_ARG, "--out: empty file name");
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return arl_errorf(ARL_ERR_ARG,
                          "--out %s: is a directory; give the name of the file to write", path);
    size_t n = strlen(path) + 16;
    char *t = malloc(n);
    if (!t) return arl_errorf(ARL_ERR_NOMEM, "out of memory");
    snprintf(t, n, "%s.tmp-XXXXXX", path);
    int fd = mkstemp(t);
    if (fd < 0) {
        arl_status s = arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO,
                                  "--out %s: cannot create a file beside it: %s (does its "
                                  "directory exist and is it writable?)",
                                  path, strerror(errno));
        free(t);
        return s;
    }
    cli_remove_on_interrupt(t);
    if (fchmod(fd, 0644) != 0 || !(*f = fdopen(fd, "w"))) {
        arl_status s = arl_errorf(ARL_ERR_IO, "--out %s: %s: %s", path, t, strerror(errno));
        close(fd);
        unlink(t);
        cli_remove_on_interrupt(NULL);
        free(t);
        return s;
    }
    *tmp = t;
    return ARL_OK;
}

/* Close f; when s is ARL_OK (and the data reached the disk) rename tmp onto path, else remove
 * tmp: path is the whole output or left as it was. */
static arl_status out_commit(arl_status s, FILE *f, char *tmp, const char *path) {
    if (fflush(f) != 0 && !s)
        s = arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO, "--out %s: write failed: %s",
                       path, strerror(errno));
    if (!s && fsync(fileno(f)) != 0)
        s = arl_errorf(ARL_ERR_IO, "--out %s: fsync failed: %s", path, strerror(errno));
    if (fclose(f) != 0 && !s)
        s = arl_errorf(ARL_ERR_IO, "--out %s: write failed: %s", path, strerror(errno));
    if (!s && rename(tmp, path) != 0)
        s = arl_errorf(ARL_ERR_IO, "--out %s: cannot rename %s onto it: %s", path, tmp,
                       strerror(errno));
    if (s) unlink(tmp);
    cli_remove_on_interrupt(NULL);
    free(tmp);
    return s;
}

int cmd_env_demos(int argc, char **argv) {
    env_demos_opts o;
    int r = cli_parse(env_demos_tab, ENV_DEMOS_N, argc, argv, &o,
                      "agentrl env demos NAME [--episodes N] [--seed S] [--out FILE.jsonl] "
                      "[--options JSON]",
                      "Write teacher demonstrations of a built-in environment as JSONL "
                      "conversations (OpenAI chat format with tools) for SFT.");
    if (r) return r < 0 ? ARL_EXIT_OK : r;
    const int to_file = strcmp(o.out, "-") != 0;
    FILE *f = stdout;
    char *tmp = NULL;
    arl_env_demos_stats st;
    memset(&st, 0, sizeof st);
    /* a file is written under a temporary name and renamed when complete: an error or an
     * interrupt leaves an existing --out file as it was */
    arl_status s = to_file ? out_open(o.out, &tmp, &f) : ARL_OK;
    if (!s) {
        s = arl_env_demos_write(o.name, o.episodes, (uint64_t)o.seed, o.options, f, &st);
        if (to_file) s = out_commit(s, f, tmp, o.out);
    }
    int rc = ARL_EXIT_OK;
    if (s != ARL_OK) {
        rc = cli_fail(s);
    } else {
        fprintf(stderr,
                "env demos: %s: %lld episodes, %lld conversations written (%lld bytes, "
                "%.2f steps per episode) to %s%s\n",
                o.name, (long long)st.episodes, (long long)st.written, (long long)st.bytes,
                st.episodes ? (double)st.steps / (double)st.episodes : 0.0,
                to_file ? o.out : "standard output",
                st.failed ? "; some episodes did not succeed (raise max_steps?)" : "");
        if (st.failed) {
            fprintf(stderr, "env demos: %lld episodes failed and were not written\n",
                    (long long)st.failed);
            rc = ARL_EXIT_FAIL;
        }
    }
    arl_options_free(env_demos_tab, ENV_DEMOS_N, &o);
    return rc;
}
