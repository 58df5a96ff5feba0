/* cli/cli.h: the agentrl command table and helpers shared by subcommands.
 *
 * Each subcommand is a function `int cmd_xxx(int argc, char **argv)` in cli/cmd_*.c,
 * where argv[0..argc-1] are the arguments after the command words ("model info" takes
 * argv = {CONFIG, "--json"}).  It returns the process exit status:
 *   0 success, 1 failure (the error was printed), 2 usage error (bad option or value).
 * Commands are listed once in cli/commands.def.
 */
#ifndef ARL_CLI_H
#define ARL_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "core/options.h"

#define ARL_EXIT_OK 0
#define ARL_EXIT_FAIL 1
#define ARL_EXIT_USAGE 2

#define ARL_COMMAND(words, fn, summary) int fn(int argc, char **argv);
#include "cli/commands.def"
#undef ARL_COMMAND

/* Parse a subcommand's arguments with its option table: defaults, argv, required check.
 * Prints --help (returns -1 meaning "exit 0 now") or the error (returns ARL_EXIT_USAGE).
 * Returns 0 when the command should run. `usage` is e.g. "agentrl model info CONFIG [--json]". */
int cli_parse(const arl_option *tab, size_t n, int argc, char **argv, void *cfg,
              const char *usage, const char *summary);

/* Where a command's progress lines go: standard error, or NULL under --quiet (warnings and
 * errors, which go through core/log.h or cli_fail, still print). */
FILE *cli_progress(void);

/* A progress or summary line on standard error (printf format, no newline added), left out
 * under --quiet. */
void cli_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The resolved configuration of a command on standard error, left out under --quiet. */
void cli_print_resolved(const char *title, const arl_option *tab, size_t n, const void *cfg);

/* Print "agentrl: error: <message of the current thread error>" for status s and return
 * ARL_EXIT_USAGE for ARL_ERR_ARG, else ARL_EXIT_FAIL. */
int cli_fail(arl_status s);

/* A process of an MPI job of world ranks (world > 1): cli_fail's line names its rank,
 * "agentrl: error: rank R: ...", so that its own error stands out among the job's lines. */
void cli_fail_rank(int rank, int world);

/* ARL_OK when dir (the value of option opt, "--ckpt") is a directory, else an error that names
 * the option and says what a checkpoint is: before a config path is taken for a checkpoint.
 * Missing and not a directory are both ARL_ERR_NOT_FOUND (exit 1), as every command treats an
 * input path that is not there (ARL_ERR_IO when it cannot be looked at). */
arl_status cli_check_ckpt_dir(const char *opt, const char *dir);

/* The program that the commands the notes below give run (main's argv[0]): the notes show it
 * as it was started when it holds a '/' ("build/agentrl", quoted where a shell needs it), else
 * `agentrl` (found on PATH; also the default, and for a path too long to repeat). */
void cli_note_program(const char *argv0);

/* From here on SIGINT and SIGTERM first print, on standard error, that `agentrl COMMAND` was
 * interrupted and the command that continues it (cli_note_program's program with this one's
 * arguments, `flag` [`value`] at the end in place of any flag of theirs), then end the process
 * by that signal as before (exit status 128 + the signal): the run's checkpoints and stores are
 * written atomically, so nothing saved is lost.  train and sft continue with --resume, rollout
 * with --shard N (the shard it writes); a signal the process ignores (a background job's
 * SIGINT) stays ignored. */
void cli_note_on_interrupt(const char *command, int argc, char **argv, const char *flag,
                           const char *value);

/* Before cli_note_on_interrupt, for a process that a launcher started ("mpirun": one rank of a
 * job; NULL: none, the default): the notes of cli_note_on_interrupt and cli_note_on_failure say
 * to run the same LAUNCHER command again (its arguments are not known here) with the agentrl
 * command that they show, instead of that command alone. */
void cli_note_launcher(const char *launcher);

/* The same for a command that is not continued but leaves something to tidy: SIGINT and SIGTERM
 * print "agentrl: interrupted: COMMAND stops here; THEN:" and `PROGRAM WORDS...` (n words,
 * quoted where a shell needs it), then end the process by that signal. */
void cli_note_on_interrupt_then(const char *command, const char *then, int n,
                                const char *const *words);

/* While path is set (NULL: none), SIGINT and SIGTERM first remove the file path: a temporary
 * file that the command renames into place once it is complete, so that an interrupted command
 * leaves no partial output.  Set it after creating the file; clear it after the rename. */
void cli_remove_on_interrupt(const char *path);

/* The same for a temporary directory of plain files (a checkpoint being written beside the one
 * it replaces): while dir is set, SIGINT and SIGTERM first remove the files in it and then it. */
void cli_remove_dir_on_interrupt(const char *dir);

/* While fn is set (NULL: none), SIGINT and SIGTERM call fn first, when they end the process (a
 * first signal of cli_interrupt_soft only notes itself): fn must be async-signal-safe (rmdir,
 * unlink on paths made beforehand), for what a command would remove had it stopped itself. */
void cli_call_on_interrupt(void (*fn)(void));

/* Before a command opens or creates the replay store at root: when root holds no store yet, an
 * interrupt that ends the process removes the new store while nothing is written to it (its
 * shards folder empty), and so does cli_new_store_end(1) (a command that failed or stopped
 * before writing; the store closed first).  cli_new_store_end(0) keeps it (written, or to be).
 * One store at a time. */
void cli_new_store_begin(const char *root);
void cli_new_store_end(int remove);

/* For a command that is not continued: SIGINT and SIGTERM print text (copied; at most 8191
 * bytes) on standard error, then end the process by that signal.  "" after a command's end
 * (train under mpirun): the signal ends it without a note. */
void cli_note_on_interrupt_text(const char *text);

/* An output file written whole or not at all.  cli_out_open makes a temporary file beside path
 * ("PATH.tmp-XXXXXX"; *tmp, owned by cli_out_commit) open for writing in *f, removed if the
 * command is interrupted; errors name the option opt ("--out") and path: ARL_ERR_ARG for an
 * empty name or a directory, ARL_ERR_IO or ARL_ERR_FULL when it cannot be made (nothing to
 * commit then).  cli_out_commit closes f and, when s is ARL_OK and the data reached the disk,
 * renames tmp onto path, else removes tmp: path is the whole output or left as it was.  It
 * returns s, or the error that writing, closing or renaming met, and frees tmp.  A path that
 * is a device, FIFO or socket (/dev/null, /dev/stdout) is written in place (*tmp NULL); one that
 * is a symbolic link gets the temporary file beside the file it names, which is replaced. */
arl_status cli_out_open(const char *opt, const char *path, char **tmp, FILE **f);
arl_status cli_out_commit(arl_status s, FILE *f, char *tmp, const char *opt, const char *path);

/* Between cli_interrupt_defer and cli_interrupt_resume (a short step that must not be cut in
 * two: writing an output file), SIGINT and SIGTERM are only noted, in any thread; resume puts
 * back what they did before and, when one came, raises it then.  A note or a path to remove set
 * in between takes effect at resume (before the signal is raised).  They nest: the outermost
 * resume acts.  main installs them as core/defer.h's hooks, so library code marks such steps
 * too (train's report). */
void cli_interrupt_defer(void);
void cli_interrupt_resume(void);

/* For a command that stops at a point of its choosing, to say what it did before the note (a
 * rollout's summary of what it finished): from here on the first SIGINT or SIGTERM is only
 * noted, with a line on standard error that the command is stopping, and a second one does at
 * once what the note set by cli_note_on_* says (that note, then the end of the process).  The
 * command polls cli_interrupted() (async-signal-safe, any thread: the signal noted, or 0), stops,
 * reports, and calls cli_interrupt_finish: when a signal was noted, it flushes standard output,
 * prints the note and ends the process by that signal (exit status 128 + the signal); else it
 * returns.  A note set later keeps this mode. */
void cli_interrupt_soft(void);
int cli_interrupted(void);
void cli_interrupt_finish(void);

/* After cli_note_on_interrupt: for a failure that continuing can get past once its cause is
 * dealt with (the disk full, an I/O, database, network, environment or device error), print
 * that COMMAND stopped, what to do, and the command that continues it; for any other status
 * (a setting, an input, a version, a bug: continuing as it is would fail again) nothing. */
void cli_note_on_failure(arl_status s);

/* `replay show --tokens`'s text column (replay_show_opts.token_text): the byte-level tokenizer's
 * text of id, quoted ('a', ' ', '\n', '\xe2') or a special's name (<|tool_call|>). */
void cli_replay_token_text(uint32_t id, char *buf, size_t cap);

#endif
