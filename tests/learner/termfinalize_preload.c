/* tests/learner/termfinalize_preload.c: an LD_PRELOAD shim for test_train_end_note.sh, the
 * SIGTERM that mpirun sends the job's last processes once one rank has exited non-zero: with
 * $ARL_TEST_TERM_AT_FINALIZE set, MPI_Finalize raises SIGTERM first (the process then ends
 * as the signal's handler has it), as that SIGTERM reaching rank 0 after its failure was said
 * does; every other call is the library's.  Not for the library: a test fixture only. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>

int MPI_Finalize(void);

int MPI_Finalize(void) {
    static int (*real)(void);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "MPI_Finalize");
    const char *on = getenv("ARL_TEST_TERM_AT_FINALIZE");
    if (on && *on) raise(SIGTERM);
    return real ? real() : 0;
}
