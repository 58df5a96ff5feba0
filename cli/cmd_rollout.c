/* cli/cmd_rollout.c: `agentrl rollout [EXPERIMENT.json] --ckpt DIR --out DB --env ENV ...`:
 * run a rollout worker (rollout/rollout.h) for evaluation and data generation.
 *
 * The rollout keys come from the experiment file (its "rollout" object, or the top level) and
 * are overridden by the same keys on the command line (--group-size 4, --env-options '{...}');
 * they are declared once, in rollout/config.c.  The resolved configuration is printed first, a
 * progress line every --progress-s seconds, and a closing summary (success rate, reward per
 * level, mean length, ends) last.  Re-running with the same --out and --shard continues an
 * interrupted run: finished groups are skipped, interrupted trajectories resumed or masked.
 * An interrupt (SIGINT, SIGTERM) stops the worker after its current step: the summary of what it
 * finished, marked interrupted, then the command that continues it; a second one stops at once.
 * One before the worker wrote anything leaves no new store (one that existed stays as it was).
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "core/file.h"
#include "core/log.h"
#include "replay/replay.h"
#include "rollout/rollout.h"

typedef struct rollout_cli {
    arl_rollout_config rc; /* first: the rollout table's offsets apply to this struct */
    char *experiment;
    char *ckpt;
    char *out;
    int64_t shard;
} rollout_cli;

static const arl_option own_tab[] = {
    {"experiment", ARL_OPT_STRING, offsetof(rollout_cli, experiment), NULL,
     "experiment JSON (its \"rollout\" object or top-level rollout keys)", 0, 0, NULL,
     ARL_OPT_POSITIONAL | ARL_OPT_CLI_ONLY, "EXPERIMENT.json"},
    {"ckpt", ARL_OPT_STRING, offsetof(rollout_cli, ckpt), NULL,
     "checkpoint directory of the policy (config.json + safetensors)", 0, 0, NULL,
     ARL_OPT_REQUIRED | ARL_OPT_CLI_ONLY, "DIR"},
    {"out", ARL_OPT_STRING, offsetof(rollout_cli, out), NULL,
     "replay store root (created if missing)", 0, 0, NULL, ARL_OPT_REQUIRED | ARL_OPT_CLI_ONLY,
     "DB"},
    {"shard", ARL_OPT_INT, offsetof(rollout_cli, shard), "0",
     "worker shard to write (0: a new one; the same id continues an interrupted run)", 0,
     8388607, NULL, ARL_OPT_CLI_ONLY, "N"},
};

/* (--env is required, as --ckpt and --out, unless EXPERIMENT.json gives "env") */
static const char *usage = "agentrl rollout [EXPERIMENT.json] --ckpt DIR --out DB [--env ENV] "
                           "[--tasks N] [--shard N] [rollout keys]";
static const char *summary =
    "Run a rollout worker: sample multi-turn tool-calling trajectories of the policy against an "
    "environment and store them (segments, behaviour log-probs, versions, routes, states) in a "
    "replay store.  The rollout keys below come from EXPERIMENT.json, then the command line; "
    "--env is required unless EXPERIMENT.json gives env.";

static arl_option *make_table(size_t *n) {
    size_t n_own = sizeof own_tab / sizeof own_tab[0];
    *n = n_own + arl_rollout_n_options;
    arl_option *t = malloc(*n * sizeof *t);
    if (!t) return NULL;
    memcpy(t, own_tab, sizeof own_tab);
    memcpy(t + n_own, arl_rollout_options, arl_rollout_n_options * sizeof *t);
    return t;
}

static int stop_on_interrupt(void *user) {
    (void)user;
    return cli_interrupted() != 0;
}

int cmd_rollout(int argc, char **argv) {
    size_t n;
    arl_option *tab = make_table(&n);
    if (!tab) return cli_fail(arl_errorf(ARL_ERR_NOMEM, "out of memory"));
    rollout_cli o;
    int want_help = 0, rc;
    /* pass 1: find the experiment file (and --help) */
    arl_status s = arl_options_defaults(tab, n, &o);
    if (s != ARL_OK) {
        free(tab);
        return cli_fail(s);
    }
    s = arl_options_parse_argv(tab, n, argc, argv, &o, &want_help);
    if (s == ARL_OK && want_help) {
        arl_options_print_help(stdout, usage, summary, tab, n);
        arl_options_free(tab, n, &o);
        free(tab);
        return ARL_EXIT_OK;
    }
    if (s != ARL_OK) { /* (out of memory: the process's, exit 1 without the usage line) */
        rc = s == ARL_ERR_NOMEM ? cli_fail(s) : ARL_EXIT_USAGE;
        if (s != ARL_ERR_NOMEM)
            fprintf(stderr, "agentrl: error: %s\nusage: %s\n", arl_error_msg(), usage);
        arl_options_free(tab, n, &o);
        free(tab);
        return rc;
    }
    char *experiment = o.experiment ? strdup(o.experiment) : NULL;
    if (o.experiment && !experiment) s = arl_errorf(ARL_ERR_NOMEM, "out of memory");
    arl_options_free(tab, n, &o);
    /* pass 2: defaults, the experiment's keys, then the command line over them */
    if (s == ARL_OK) s = arl_options_defaults(tab, n, &o);
    if (s == ARL_OK && experiment) {
        char *text;
        s = arl_file_read(experiment, 0, &text, NULL);
        if (s == ARL_OK) s = arl_rollout_config_load_json(&o.rc, text, experiment);
        free(text);
    }
    if (s == ARL_OK) s = arl_options_parse_argv(tab, n, argc, argv, &o, &want_help);
    if (s == ARL_OK) s = arl_options_check_required(tab, n, &o);
    if (s == ARL_OK) s = arl_rollout_config_validate(&o.rc);
    if (s == ARL_OK) s = cli_check_ckpt_dir("--ckpt", o.ckpt);
    free(experiment);
    if (s != ARL_OK) {
        rc = cli_fail(s);
        if (s == ARL_ERR_ARG || s == ARL_ERR_CONFIG) fprintf(stderr, "usage: %s\n", usage);
        arl_options_free(tab, n, &o);
        free(tab);
        return s == ARL_ERR_CONFIG ? ARL_EXIT_USAGE : rc;
    }
    cli_print_resolved("rollout", tab, n, &o);
    /* an interrupt from here on is acted on between steps (the store is not created, or a new
     * one removed, when it comes before the worker writes) and ends with the summary */
    cli_note_on_interrupt_text("\nagentrl: interrupted: rollout stops here, before it started "
                               "(run the same command to start it)\n");
    cli_interrupt_soft();
    replay_open_opts so = {.flags = REPLAY_OPEN_CREATE};
    replay_store *st = NULL;
    arl_rollout_worker *w = NULL;
    const arl_rollout_hooks hooks = {.stop = stop_on_interrupt};
    cli_new_store_begin(o.out); /* (a second signal before the worker has its shard removes a
                                   new store too) */
    s = cli_interrupted() ? arl_errorf(ARL_ERR_CANCELLED, "rollout: interrupted")
                          : replay_store_open(o.out, &so, &st);
    if (s == ARL_OK) s = arl_rollout_worker_open(&o.rc, o.ckpt, st, (int32_t)o.shard, &hooks, &w);
    if (s != ARL_OK) { /* nothing could start: no new store left behind */
        arl_rollout_worker_close(w);
        w = NULL;
        replay_store_close(st);
        st = NULL;
    }
    cli_new_store_end(s != ARL_OK); /* (else the worker has its shard file: the store stays) */
    const int started = s == ARL_OK;
    if (started) {
        arl_log_info("rollout: writing shard %d of %s", (int)arl_rollout_worker_shard(w), o.out);
        char shard[16]; /* run again with its shard, it continues the shard's trajectories */
        snprintf(shard, sizeof shard, "%d", (int)arl_rollout_worker_shard(w));
        cli_note_on_interrupt("rollout", argc, argv, "--shard", shard);
        s = arl_rollout_worker_run(w);
    }
    /* an interrupt came (cli_interrupt_finish below prints its note and ends the process);
     * stopped: the command stopped for it (before the store, in the worker's open or run) */
    const int signalled = cli_interrupted() != 0, stopped = signalled && s == ARL_ERR_CANCELLED;
    if (started) { /* after a failure only when something was done */
        const arl_rollout_stats *rs = arl_rollout_worker_stats(w);
        if (s == ARL_OK || stopped || rs->trajectories > 0 || rs->tokens > 0 || rs->resumed > 0)
            arl_rollout_stats_print_titled(rs,
                                           stopped ? "rollout summary (interrupted: what it "
                                                     "finished before the interrupt)"
                                                   : "rollout summary",
                                           stdout);
    }
    if (stopped) arl_error_clear();
    rc = s && !stopped ? cli_fail(s) : ARL_EXIT_OK;
    if (s && started && !signalled) {
        const arl_rollout_stats *rs = arl_rollout_worker_stats(w);
        if (s == ARL_ERR_ENV && rs->trajectories > 0 && rs->masked == rs->trajectories &&
            !rs->not_admitted) /* every task was sampled and masked: --shard would sample none */
            fprintf(stderr,
                    "agentrl: rollout stopped; what it saved stays. Masked trajectories stay "
                    "masked: once the cause above is dealt with, sample their tasks again under "
                    "a new run uid (--run-uid NAME).\n");
        else
            cli_note_on_failure(s);
    }
    if (started && (s == ARL_OK || stopped))
        printf("stored in %s (shard %d)\n", o.out, (int)arl_rollout_worker_shard(w));
    arl_rollout_worker_close(w);
    replay_store_close(st);
    arl_options_free(tab, n, &o);
    free(tab);
    cli_interrupt_finish(); /* an interrupt ends the process by its signal, after the above */
    return rc;
}
