/* tests/core/test_dirlock.c: the run-directory lock (core/dirlock.h): a second take is refused
 * with ARL_ERR_BUSY and the holder's pid, in this process and in another; a release or the
 * holder's death (SIGKILL, nothing cleaned up) frees it; a directory that does not exist is a
 * clear I/O error. */
#include <signal.h>
#include <sys/wait.h>

#include "core/dirlock.h"
#include "tests/test.h"

static const char *g_dir;

static void test_take_release(void) {
    arl_dirlock a, b;
    CHECK(arl_dirlock_take(&a, g_dir, "test") == ARL_OK);
    CHECK(a.fd >= 0);
    char want[64];
    snprintf(want, sizeof want, "(pid %ld)", (long)getpid());
    CHECK(arl_dirlock_take(&b, g_dir, "test") == ARL_ERR_BUSY); /* this process again */
    CHECK(b.fd == -1);
    CHECK_MSG(strstr(arl_error_msg(), want) && strstr(arl_error_msg(), "in use"), "message: %s",
              arl_error_msg());
    arl_error_clear();
    arl_dirlock_release(&a);
    CHECK(a.fd == -1);
    arl_dirlock_release(&a); /* not held: nothing */
    CHECK(arl_dirlock_take(&b, g_dir, "test") == ARL_OK);
    arl_dirlock_release(&b);
}

/* Another process: refused while this one holds the lock; after a holder is killed, free. */
static void test_other_process(void) {
    arl_dirlock a;
    CHECK(arl_dirlock_take(&a, g_dir, "test") == ARL_OK);
    pid_t pid = fork();
    if (pid == 0) {
        arl_dirlock b;
        _exit(arl_dirlock_take(&b, g_dir, "test") == ARL_ERR_BUSY ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    arl_dirlock_release(&a);
    /* a holder killed while holding it */
    int ready[2];
    CHECK(pipe(ready) == 0);
    pid = fork();
    if (pid == 0) {
        arl_dirlock b;
        char c = arl_dirlock_take(&b, g_dir, "test") == ARL_OK ? 'y' : 'n';
        if (write(ready[1], &c, 1) != 1) _exit(1);
        for (;;)
            pause();
    }
    char c = 0;
    CHECK(read(ready[0], &c, 1) == 1 && c == 'y');
    char want[64];
    snprintf(want, sizeof want, "(pid %ld)", (long)pid);
    CHECK(arl_dirlock_take(&a, g_dir, "test") == ARL_ERR_BUSY);
    CHECK_MSG(strstr(arl_error_msg(), want) != NULL, "message: %s", arl_error_msg());
    arl_error_clear();
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    CHECK(arl_dirlock_take(&a, g_dir, "test") == ARL_OK);
    arl_dirlock_release(&a);
    close(ready[0]);
    close(ready[1]);
}

static void test_missing_dir(void) {
    char p[700];
    snprintf(p, sizeof p, "%s/no/such/dir", g_dir);
    arl_dirlock a;
    CHECK(arl_dirlock_take(&a, p, "train") == ARL_ERR_IO);
    CHECK(a.fd == -1);
    CHECK_MSG(strstr(arl_error_msg(), "train: cannot open the lock file") != NULL, "message: %s",
              arl_error_msg());
    arl_error_clear();
}

int main(void) {
    g_dir = test_tmpdir("dirlock");
    TEST_RUN(test_take_release);
    TEST_RUN(test_other_process);
    TEST_RUN(test_missing_dir);
    return test_finish();
}
