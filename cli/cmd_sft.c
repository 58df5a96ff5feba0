/* cli/cmd_sft.c: `agentrl sft EXPERIMENT.json [--resume] [--set key=value ...]`: supervised
 * fine-tuning on JSONL conversations (experiments/sft.h). */
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "experiments/sft.h"

typedef struct sft_cli_opts {
    char *experiment;
    int resume;
    arl_strlist set;
    int list_keys;
} sft_cli_opts;

static const arl_option sft_cli_tab[] = {
    {"experiment", ARL_OPT_STRING, offsetof(sft_cli_opts, experiment), NULL,
     "experiment JSON (keys: agentrl sft --keys); may be left out when --set gives the "
     "keys it needs (model or init, data, out)",
     0, 0, NULL, ARL_OPT_POSITIONAL, "EXPERIMENT.json"},
    {"resume", ARL_OPT_BOOL, offsetof(sft_cli_opts, resume), "false",
     "continue from the newest checkpoint in the output directory (start fresh if none)", 0, 0,
     NULL, 0, NULL},
    {"set", ARL_OPT_LIST, offsetof(sft_cli_opts, set), NULL,
     "override an experiment key, e.g. --set lr=1e-4 --set steps=500", 0, 0, NULL, 0, "KEY=VALUE"},
    {"keys", ARL_OPT_BOOL, offsetof(sft_cli_opts, list_keys), "false",
     "list the experiment keys with their defaults and exit", 0, 0, NULL, 0, NULL},
};
#define SFT_CLI_N ARL_OPTIONS_COUNT(sft_cli_tab)

int cmd_sft(int argc, char **argv) {
    sft_cli_opts o;
    int r = cli_parse(sft_cli_tab, SFT_CLI_N, argc, argv, &o,
                      "agentrl sft [EXPERIMENT.json] [--resume] [--set KEY=VALUE ...]",
                      "Supervised fine-tuning on JSONL conversations (chat template, loss on "
                      "assistant tokens), with AdamW, evaluation, checkpoints and exact resume.");
    if (r) return r < 0 ? ARL_EXIT_OK : r;
    size_t n;
    const arl_option *tab = arl_sft_options(&n);
    if (o.list_keys) {
        arl_options_print_help(stdout, "EXPERIMENT.json keys (also --set KEY=VALUE)", NULL, tab, n);
        arl_options_free(sft_cli_tab, SFT_CLI_N, &o);
        return ARL_EXIT_OK;
    }
    if (!o.experiment && o.set.n == 0) {
        fprintf(stderr, "agentrl: error: missing argument EXPERIMENT.json (see --help)\n");
        arl_options_free(sft_cli_tab, SFT_CLI_N, &o);
        return ARL_EXIT_USAGE;
    }
    arl_sft_config cfg;
    arl_status s = arl_sft_config_load(o.experiment, &o.set, &cfg);
    int rc = ARL_EXIT_OK;
    if (s) {
        rc = cli_fail(s == ARL_ERR_CONFIG ? ARL_ERR_ARG : s);
    } else {
        arl_sft_result res;
        cli_note_on_interrupt("sft", argc, argv, "--resume", NULL);
        s = arl_sft_run(&cfg, arl_sft_model_ops_default(), o.resume, NULL, cli_progress(), &res);
        if (s) {
            rc = cli_fail(s);
            /* (a run refused before it made its output directory saved nothing to continue:
             * no note, as train; nor does one whose 'out' is not a directory) */
            struct stat st;
            if (stat(cfg.out, &st) == 0 && S_ISDIR(st.st_mode)) cli_note_on_failure(s);
        }
    }
    arl_sft_config_free(&cfg);
    arl_options_free(sft_cli_tab, SFT_CLI_N, &o);
    return rc;
}
