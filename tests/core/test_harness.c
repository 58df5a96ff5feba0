/* tests/core/test_harness.c: the test harness's temporary directories (tests/test.h
 * test_tmpdir / test_finish).  They used to stay under /tmp for ever: a few hundred runs of the
 * suite filled the disk (76 GB, learner tests leave ~300 MB each).  Now:
 *   - a program that passes removes the directories it made, with everything in them;
 *   - a program with a failed check keeps them (to inspect what it wrote);
 *   - a forked child that reaches test_finish removes nothing of its parent's.
 * The verdict is computed by hand after test_finish (which does the removing). */
#include <sys/wait.h>

#include "tests/test.h"

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

int main(void) {
    int bad = 0;
    /* a failing program keeps its directory */
    int fd[2];
    if (pipe(fd)) return 1;
    pid_t a = fork();
    if (a == 0) {
        const char *d = test_tmpdir("harness-fail");
        if (write(fd[1], d, strlen(d) + 1) < 0) _exit(3);
        fprintf(stderr, "(the next check fails on purpose)\n");
        CHECK(0 == 1);
        _exit(test_finish() == 1 ? 0 : 4);
    }
    char kept[512] = "";
    if (read(fd[0], kept, sizeof kept) <= 0) kept[0] = 0;
    int st = -1;
    waitpid(a, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !kept[0] || !exists(kept)) {
        fprintf(stderr, "the failing child's directory '%s' was not kept (status %d)\n", kept, st);
        bad = 1;
    }
    if (kept[0]) rmdir(kept);

    /* a passing program removes its directory and what is in it; a child does not */
    char d[512], sub[600], file[700];
    snprintf(d, sizeof d, "%s", test_tmpdir("harness"));
    snprintf(sub, sizeof sub, "%s/x", d);
    snprintf(file, sizeof file, "%s/x/y.bin", d);
    mkdir(sub, 0700);
    FILE *f = fopen(file, "w");
    if (f) {
        fputs("data", f);
        fclose(f);
    }
    pid_t b = fork();
    if (b == 0) _exit(test_finish());
    waitpid(b, &st, 0);
    if (!exists(file)) {
        fprintf(stderr, "a child's test_finish removed its parent's directory\n");
        bad = 1;
    }
    int rc = test_finish();
    if (exists(d)) {
        fprintf(stderr, "a passing program left %s behind\n", d);
        bad = 1;
    }
    return rc || bad;
}
