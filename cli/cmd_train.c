/* cli/cmd_train.c: `agentrl train [EXPERIMENT.json] [--set key=value ...] [--resume]`: RL
 * post-training (experiments/train.h), on one process or under mpirun with the roles of the
 * experiment's learner.dist-* keys. */
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "experiments/train.h"
#include "learner/dist.h"

typedef struct train_cli_opts {
    char *experiment;
    int resume;
    arl_strlist set;
    int list_keys;
} train_cli_opts;

static const arl_option train_cli_tab[] = {
    {"experiment", ARL_OPT_STRING, offsetof(train_cli_opts, experiment), NULL,
     "experiment JSON (keys: agentrl train --keys); may be left out when --set gives the keys "
     "it needs (model or init, rollout.env, out)",
     0, 0, NULL, ARL_OPT_POSITIONAL, "EXPERIMENT.json"},
    {"resume", ARL_OPT_BOOL, offsetof(train_cli_opts, resume), "false",
     "continue from the newest checkpoint in the output directory (start fresh if none)", 0, 0,
     NULL, 0, NULL},
    {"set", ARL_OPT_LIST, offsetof(train_cli_opts, set), NULL,
     "override a key: --set steps=20 (top level), --set rollout.temperature=0.7, --set "
     "learner.kl-target=0.01, --set sft.steps=100",
     0, 0, NULL, 0, "KEY=VALUE"},
    {"keys", ARL_OPT_BOOL, offsetof(train_cli_opts, list_keys), "false",
     "list the experiment keys of every section with their defaults and exit", 0, 0, NULL, 0, NULL},
};
#define TRAIN_CLI_N ARL_OPTIONS_COUNT(train_cli_tab)

int cmd_train(int argc, char **argv) {
    train_cli_opts o;
    int r = cli_parse(train_cli_tab, TRAIN_CLI_N, argc, argv, &o,
                      "agentrl train [EXPERIMENT.json] [--resume] [--set KEY=VALUE ...]",
                      "RL post-training: optional SFT warm start on the environment teacher's "
                      "demonstrations, then rollout -> KL-constrained update -> new policy "
                      "version, with held-out evaluation, checkpoints, exact resume and a "
                      "report.  Under mpirun the ranks take the roles of learner.dist-*.");
    if (r) return r < 0 ? ARL_EXIT_OK : r;
    if (o.list_keys) {
        size_t n;
        const arl_option *t = arl_train_options(&n);
        arl_options_print_help(stdout, "EXPERIMENT.json top-level keys (--set KEY=VALUE)", NULL, t,
                               n);
        arl_options_print_help(stdout, "section \"rollout\" (--set rollout.KEY=VALUE)", NULL,
                               arl_rollout_options, arl_rollout_n_options);
        t = arl_learner_options(&n);
        arl_options_print_help(stdout, "section \"learner\" (--set learner.KEY=VALUE)", NULL, t, n);
        t = arl_sft_options(&n);
        arl_options_print_help(stdout,
                               "section \"sft\" (--set sft.KEY=VALUE; model, init, init-seed, "
                               "data, eval-data, out, threads and progress are set by the driver)",
                               NULL, t, n);
        arl_options_free(train_cli_tab, TRAIN_CLI_N, &o);
        return ARL_EXIT_OK;
    }
    if (!o.experiment && o.set.n == 0) {
        fprintf(stderr, "agentrl: error: missing argument EXPERIMENT.json (see --help)\n");
        arl_options_free(train_cli_tab, TRAIN_CLI_N, &o);
        return ARL_EXIT_USAGE;
    }
    arl_train_config cfg;
    arl_status s = arl_train_config_load(o.experiment, &o.set, &cfg);
    if (s) {
        int rc = cli_fail(s == ARL_ERR_CONFIG ? ARL_ERR_ARG : s);
        arl_train_config_free(&cfg);
        arl_options_free(train_cli_tab, TRAIN_CLI_N, &o);
        return rc;
    }
    arl_dist *d = NULL;
    s = arl_dist_init(&d, NULL, NULL);
    if (!s) s = arl_dist_assign_roles(d, &cfg.learner.dist);
    /* a layout the job cannot have (more learner ranks than ranks): the launch's usage error */
    if (s == ARL_ERR_CONFIG) s = arl_error_prefix(ARL_ERR_ARG, "learner");
    int rc = ARL_EXIT_OK;
    arl_train_result res = {0};
    if (!s) {
        const int rank0 = d->layout.world_rank == 0;
        cli_fail_rank(d->layout.world_rank, d->layout.world_size);
        if (rank0 && d->layout.world_size > 1) cli_note_launcher("mpirun");
        if (rank0) cli_note_on_interrupt("train", argc, argv, "--resume", NULL);
        s = arl_train_run(&cfg, o.resume, d, rank0 ? cli_progress() : NULL, &res);
    }
    if (s) {
        rc = cli_fail(s);
        /* the note says to continue with --resume, keeping what the run saved: a run refused
         * before it made its output directory (a model too large for this machine's memory)
         * saved nothing, and is started again as it was */
        struct stat st;
        if (stat(cfg.out, &st) == 0) cli_note_on_failure(s);
        /* every rank stops here with its own message when the run told them all; otherwise
         * another rank may wait for this one in a collective: end the job */
        fflush(stderr);
        if (!res.failure_shared) arl_dist_abort(d, rc);
    }
    /* the run is over, its failure and the note to continue said: under mpirun the launcher
     * ends the job's last processes with SIGTERM once one rank has exited non-zero, which
     * would add "interrupted ... Continue with ... --resume" after them (the only note shown,
     * and a wrong one, after a refused setting); the signal now ends the process silently */
    cli_note_on_interrupt_text("");
    arl_dist_finalize(d);
    arl_train_config_free(&cfg);
    arl_options_free(train_cli_tab, TRAIN_CLI_N, &o);
    return rc;
}
