/* bench/common/tmpdir.h: the temporary directory of one benchmark run (checkpoints, stores,
 * cross-check files), removed at exit and on SIGINT, SIGTERM, SIGHUP and SIGPIPE.  One per process.
 */
#ifndef ARL_BENCH_TMPDIR_H
#define ARL_BENCH_TMPDIR_H

/* Create $TMPDIR/<name>_XXXXXX ($TMPDIR unset or empty: /tmp) and register its removal at exit
 * and on those signals (plain files, up to depth levels of subdirectories; a signal the
 * process was started with ignored stays ignored).  With ARL_BENCH_KEEP set (not "0")
 * the directory is kept and its path printed on stderr at exit.  Returns the path (static
 * storage, at most 511 bytes, valid until exit), or NULL with a message on stderr naming the
 * directory and what to do.  name: the program's, also the prefix of its messages. */
const char *bench_tmpdir_create(const char *name, int depth);

#endif
