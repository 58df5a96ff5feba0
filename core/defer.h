/* core/defer.h: a stretch of library work that an interrupt should not cut in two - the files of
 * a run's report, written under temporary names and renamed - without the library knowing how
 * the program handles signals.  The program's main installs the two hooks (the CLI holds
 * SIGINT and SIGTERM back until the stretch ends, then acts on one that came); without hooks
 * the calls do nothing.  Stretches nest: the hooks run at the outermost begin and end.  For the
 * main thread.
 */
#ifndef ARL_CORE_DEFER_H
#define ARL_CORE_DEFER_H

/* Install begin/end (either may be NULL).  Not while inside a stretch. */
void arl_defer_hooks_set(void (*begin)(void), void (*end)(void));

void arl_defer_begin(void);
void arl_defer_end(void);

#endif
