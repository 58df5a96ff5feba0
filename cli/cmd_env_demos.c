/* cli/cmd_env_demos.c: `agentrl env demos NAME --episodes N --seed S --out FILE.jsonl`: write
 * teacher demonstrations of a built-in environment as JSONL conversations (OpenAI chat format
 * with the tool list; envs/builtin/teacher.h) for SFT warm-starts.  Episode i uses task seed
 * S + i; only successful episodes are written.  --out FILE is written under a temporary name and
 * renamed when complete: a failure or an interrupt leaves an existing FILE as it was. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

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

int cmd_env_demos(int argc, char **argv) {
    env_demos_opts o;
    int r = cli_parse(env_demos_tab, ENV_DEMOS_N, argc, argv, &o,
                      "agentrl env demos NAME [--episodes N] [--seed S] [--out FILE] "
                      "[--options JSON]",
                      "Write teacher demonstrations of a built-in environment as JSONL "
                      "conversations (OpenAI chat format with tools) for SFT.  Only the "
                      "episodes the teacher solves are written; when some are not, the "
                      "command says how many and exits 1.");
    if (r) return r < 0 ? ARL_EXIT_OK : r;
    const int to_file = strcmp(o.out, "-") != 0;
    FILE *f = stdout;
    char *tmp = NULL;
    arl_env_demos_stats st;
    memset(&st, 0, sizeof st);
    /* a file is written under a temporary name and renamed when complete: an error or an
     * interrupt leaves an existing --out file as it was */
    arl_status s = to_file ? cli_out_open("--out", o.out, &tmp, &f) : ARL_OK;
    if (!s) {
        s = arl_env_demos_write(o.name, o.episodes, (uint64_t)o.seed, o.options, f, &st);
        if (s && ferror(f)) { /* a failed write (a full disk): its message names the file */
            static const char head[] = "env demos: ";
            char m[2048];
            snprintf(m, sizeof m, "%s", arl_error_msg());
            const int had = !strncmp(m, head, sizeof head - 1);
            s = arl_errorf(s, "env demos: %s%s: %s", to_file ? "--out " : "",
                           to_file ? o.out : "standard output", m + (had ? sizeof head - 1 : 0));
        }
        if (to_file) s = cli_out_commit(s, f, tmp, "--out", o.out);
    }
    int rc = ARL_EXIT_OK;
    if (s != ARL_OK) { /* (NOT_FOUND: NAME is not a built-in with a teacher, a usage error) */
        rc = cli_fail(s);
        if (s == ARL_ERR_NOT_FOUND) rc = ARL_EXIT_USAGE;
    } else {
        cli_say("env demos: %s: %lld episodes, %lld conversations written (%lld bytes, "
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
