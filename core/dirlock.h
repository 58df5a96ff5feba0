/* core/dirlock.h: one process at a time in a run directory.
 *
 * `agentrl train` and `agentrl sft` keep a run's state in their output directory (checkpoints,
 * ledger, replay stores, metrics) and continue it with --resume.  Two processes in one directory
 * - a second `--resume` started while the first still runs, say - would interleave their writes
 * and leave a run that no longer resumes.  The lock is an exclusive flock(2) on DIR/run.lock,
 * held for the life of the run: the kernel drops it when the process ends, however it ends, so a
 * killed run leaves nothing to clean up and resumes at once.  The file holds the holder's pid
 * (for the message a second process gets); it is left in place. */
#ifndef ARL_CORE_DIRLOCK_H
#define ARL_CORE_DIRLOCK_H

#include "core/status.h"

#define ARL_DIRLOCK_FILE "run.lock"

typedef struct arl_dirlock {
    int fd; /* -1: not held */
} arl_dirlock;

/* Takes the lock of the existing directory dir, without waiting.  who names the command for the
 * messages ("train").  ARL_ERR_BUSY when another process holds it (the message names the
 * directory and that process's pid), ARL_ERR_IO when the lock file cannot be made or locked.
 * On error l->fd is -1. */
arl_status arl_dirlock_take(arl_dirlock *l, const char *dir, const char *who);

/* Releases a held lock (l->fd -1 after; a lock not held is left alone). */
void arl_dirlock_release(arl_dirlock *l);

#endif
