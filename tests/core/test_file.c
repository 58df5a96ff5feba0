/* arl_file_read: whole files of every size around its buffer steps, a pipe (no known size), an
 * empty file, the size bound, and the errors (absent, a directory) with nothing returned. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/file.h"
#include "tests/test.h"

/* Byte i of the test files: every value 0..255 (NULs inside included). */
static char byte_at(size_t i) {
    return (char)(i * 131u + (i >> 8));
}

static void write_file(const char *path, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    for (size_t i = 0; i < n; i++)
        fputc(byte_at(i), f);
    CHECK(fclose(f) == 0);
}

static int same_bytes(const char *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != byte_at(i)) return 0;
    return 1;
}

static void test_sizes(void) {
    const char *dir = test_tmpdir("file");
    char path[600];
    snprintf(path, sizeof path, "%s/f", dir);
    const size_t sizes[] = {0, 1, 65534, 65535, 65536, 65537, 131071, 131072, 300001};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        write_file(path, sizes[k]);
        char *b = NULL;
        size_t n = 7;
        CHECK(arl_file_read(path, 0, &b, &n) == ARL_OK);
        CHECK_MSG(n == sizes[k], "size %zu: read %zu", sizes[k], n);
        CHECK(b && same_bytes(b, n) && b[n] == 0);
        free(b);
        /* the bound: exactly max passes, one byte over fails with nothing returned */
        CHECK(arl_file_read(path, sizes[k] ? sizes[k] : 1, &b, NULL) == ARL_OK);
        free(b);
        if (sizes[k]) {
            b = (char *)1;
            n = 7;
            CHECK(arl_file_read(path, sizes[k] - 1 ? sizes[k] - 1 : 0, &b, &n) ==
                  (sizes[k] - 1 ? ARL_ERR_RANGE : ARL_OK));
            if (sizes[k] - 1) CHECK(b == NULL && n == 0);
            free(b);
        }
    }
}

static void test_pipe(void) {
    int fd[2];
    CHECK(pipe(fd) == 0);
    const size_t total = 200000; /* more than a pipe buffer: the writer blocks until read */
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        char chunk[4096];
        for (size_t i = 0; i < total; i += sizeof chunk) {
            size_t m = total - i < sizeof chunk ? total - i : sizeof chunk;
            for (size_t j = 0; j < m; j++)
                chunk[j] = byte_at(i + j);
            if (write(fd[1], chunk, m) != (ssize_t)m) _exit(1);
        }
        _exit(0);
    }
    close(fd[1]);
    char path[64];
    snprintf(path, sizeof path, "/dev/fd/%d", fd[0]);
    char *b = NULL;
    size_t n = 0;
    CHECK(arl_file_read(path, 0, &b, &n) == ARL_OK);
    CHECK(n == total && b && same_bytes(b, n));
    free(b);
    close(fd[0]);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_errors(void) {
    const char *dir = test_tmpdir("file-err");
    char path[600];
    snprintf(path, sizeof path, "%s/absent", dir);
    char *b = (char *)1;
    size_t n = 7;
    CHECK(arl_file_read(path, 0, &b, &n) == ARL_ERR_NOT_FOUND);
    CHECK(b == NULL && n == 0);
    CHECK(strstr(arl_error_msg(), path) != NULL);
    /* a directory opens but does not read */
    b = (char *)1;
    CHECK(arl_file_read(dir, 0, &b, NULL) == ARL_ERR_IO);
    CHECK(b == NULL);
    CHECK_MSG(strstr(arl_error_msg(), "read error") != NULL, "%s", arl_error_msg());
}

/* arl_mkdir_p: parents made, an existing directory fine, a file in the way or under the path a
 * clear error naming it, an empty path refused. */
static void test_mkdir_p(void) {
    const char *dir = test_tmpdir("mkdir");
    char p[700], f[700];
    snprintf(p, sizeof p, "%s/a/b/c", dir);
    CHECK(arl_mkdir_p(p) == ARL_OK);
    struct stat sb;
    CHECK(stat(p, &sb) == 0 && S_ISDIR(sb.st_mode));
    CHECK(arl_mkdir_p(p) == ARL_OK); /* exists */
    snprintf(f, sizeof f, "%s/file", dir);
    FILE *fp = fopen(f, "w");
    CHECK(fp != NULL);
    if (fp) fclose(fp);
    CHECK(arl_mkdir_p(f) == ARL_ERR_IO);
    CHECK_MSG(strstr(arl_error_msg(), "file: not a directory") != NULL, "%s", arl_error_msg());
    snprintf(p, sizeof p, "%s/file/sub", dir);
    CHECK(arl_mkdir_p(p) == ARL_ERR_IO);
    CHECK_MSG(strstr(arl_error_msg(), "cannot create directory") != NULL, "%s", arl_error_msg());
    CHECK(arl_mkdir_p("") == ARL_ERR_ARG);
    arl_error_clear();
}

int main(void) {
    TEST_RUN(test_sizes);
    TEST_RUN(test_pipe);
    TEST_RUN(test_errors);
    TEST_RUN(test_mkdir_p);
    return test_finish();
}
