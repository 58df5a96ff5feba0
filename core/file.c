/* core/file.c: a whole file read into memory (file.h). */
#include "core/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
