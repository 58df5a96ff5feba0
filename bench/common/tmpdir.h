/* bench/common/tmpdir.h: the temporary directory of one benchmark run (checkpoints, cross-check
 * files), removed at exit and on SIGINT/SIGTERM.  One per process. */
#ifndef ARL_BENCH_TMPDIR_H
#define ARL_BENCH_TMPDIR_H

/* Create /tmp/<name>_XXXXXX and register its removal (plain files, up to depth levels of
 * subdirectories).  Returns the path (static storage, valid until exit), or NULL with a message
 * on stderr. */
const char *bench_tmpdir_create(const char *name, int depth);

#endif
