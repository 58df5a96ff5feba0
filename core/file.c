/* core/file.c: a whole file read into memory (file.h). */
#include "core/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

arl_status arl_file_read(const char *path, size_t max, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return arl_errorf(errno == ENOENT ? ARL_ERR_NOT_FOUND : ARL_ERR_IO, "%s: cannot open: %s",
                          path, strerror(errno));
    size_t cap = 0, n = 0;
    char *buf = NULL;
    arl_status s = ARL_OK;
    for (;;) {
        if (cap - n < 2) { /* room for at least one byte and the NUL */
            size_t nc = cap ? 2 * cap : 65536;
            char *nb = nc > cap ? realloc(buf, nc) : NULL;
            if (!nb) {
                s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory after %zu bytes", path, n);
                break;
            }
            buf = nb;
            cap = nc;
        }
        size_t r = fread(buf + n, 1, cap - 1 - n, f);
        n += r;
        if (max && n > max) {
            s = arl_errorf(ARL_ERR_RANGE, "%s: larger than %zu bytes", path, max);
            break;
        }
        if (r == 0) {
            if (ferror(f)) s = arl_errorf(ARL_ERR_IO, "%s: read error: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (s != ARL_OK) {
        free(buf);
        return s;
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return ARL_OK;
}

arl_status arl_mkdir_p(const char *path) {
    char buf[4096];
    const size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return arl_errorf(ARL_ERR_ARG, "bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != 0) continue;
        const char c = buf[i];
        buf[i] = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return arl_errorf(errno == ENOSPC ? ARL_ERR_FULL : ARL_ERR_IO,
                              "%s: cannot create directory: %s", buf, strerror(errno));
        buf[i] = c;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return arl_errorf(ARL_ERR_IO, "%s: not a directory", path);
    return ARL_OK;
}

arl_status arl_file_write_failed(const char *path, const char *what, int e) {
    if (!e) e = EIO;
    return arl_errorf(e == ENOSPC || e == EDQUOT ? ARL_ERR_FULL : ARL_ERR_IO, "%s: %s: %s", path,
                      what, strerror(e));
}
