/* core/npy.c: NumPy .npy reader and writer (contracts in core/npy.h). */
#include "core/npy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/assert.h"
#include "core/file.h"

static const unsigned char NPY_MAGIC[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* ---- header dict parser: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } ---- */

typedef struct hp {
    const char *s, *end, *label;
} hp;

static void skip_ws(hp *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r'))
        p->s++;
}

static int accept(hp *p, char c) {
    skip_ws(p);
    if (p->s < p->end && *p->s == c) {
        p->s++;
        return 1;
    }
    return 0;
}

/* Python string literal '...' or "..." without escapes, into out (size cap). */
static arl_status parse_str(hp *p, char *out, size_t cap, const char *what) {
    skip_ws(p);
    if (p->s >= p->end || (*p->s != '\'' && *p->s != '"'))
        return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: expected a quoted string for %s",
                          p->label, what);
    char q = *p->s++;
    size_t n = 0;
    while (p->s < p->end && *p->s != q) {
        if (*p->s == '\\' || n + 1 >= cap)
            return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: unsupported or overlong %s",
                              p->label, what);
        out[n++] = *p->s++;
    }
    if (p->s >= p->end)
        return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: unterminated string in %s", p->label,
                          what);
    p->s++;
    out[n] = 0;
    return ARL_OK;
}

static int accept_word(hp *p, const char *w) {
    skip_ws(p);
    size_t n = strlen(w);
    if ((size_t)(p->end - p->s) >= n && !memcmp(p->s, w, n)) {
        p->s += n;
        return 1;
    }
    return 0;
}

static arl_status parse_shape(hp *p, arl_npy *a) {
    if (!accept(p, '('))
        return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: 'shape' is not a tuple", p->label);
    a->rank = 0;
    for (;;) {
        if (accept(p, ')')) return ARL_OK;
        skip_ws(p);
        if (p->s >= p->end || *p->s < '0' || *p->s > '9')
            return arl_errorf(ARL_ERR_FORMAT,
                              "%s: .npy header: 'shape' holds something other than non-negative "
                              "integers",
                              p->label);
        uint64_t v = 0;
        while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
            v = v * 10 + (uint64_t)(*p->s++ - '0');
            if (v > (uint64_t)INT64_MAX)
                return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: shape size too large",
                                  p->label);
        }
        if (p->s < p->end && *p->s == 'L') p->s++; /* Python 2 long literal */
        if (a->rank >= ARL_NPY_MAX_RANK)
            return arl_errorf(ARL_ERR_UNSUPPORTED, "%s: .npy header: rank above %d", p->label,
                              ARL_NPY_MAX_RANK);
        a->shape[a->rank++] = (int64_t)v;
        if (accept(p, ')')) return ARL_OK;
        if (!accept(p, ','))
            return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: malformed 'shape' tuple", p->label);
    }
}

static arl_status parse_dict(hp *p, arl_npy *a) {
    int have_descr = 0, have_fortran = 0, have_shape = 0, fortran = 0;
    char descr[64] = {0};
    if (!accept(p, '{'))
        return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header is not a dict literal", p->label);
    for (;;) {
        if (accept(p, '}')) break;
        char key[32];
        ARL_TRY(parse_str(p, key, sizeof key, "a key"));
        if (!accept(p, ':'))
            return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: expected ':' after '%s'", p->label,
                              key);
        int *have = NULL;
        if (!strcmp(key, "descr")) {
            have = &have_descr;
            skip_ws(p);
            if (p->s < p->end && *p->s == '[')
                return arl_errorf(ARL_ERR_UNSUPPORTED,
                                  "%s: .npy file holds a structured dtype (not supported)",
                                  p->label);
            ARL_TRY(parse_str(p, descr, sizeof descr, "'descr'"));
        } else if (!strcmp(key, "fortran_order")) {
            have = &have_fortran;
            if (accept_word(p, "True"))
                fortran = 1;
            else if (accept_word(p, "False"))
                fortran = 0;
            else
                return arl_errorf(ARL_ERR_FORMAT,
                                  "%s: .npy header: 'fortran_order' is not True or False",
                                  p->label);
        } else if (!strcmp(key, "shape")) {
            have = &have_shape;
            ARL_TRY(parse_shape(p, a));
        } else {
            return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: unexpected key '%s'", p->label,
                              key);
        }
        if (*have)
            return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: key '%s' appears twice", p->label,
                              key);
        *have = 1;
        if (accept(p, '}')) break;
        if (!accept(p, ','))
            return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: expected ',' or '}' after '%s'",
                              p->label, key);
    }
    skip_ws(p);
    if (p->s != p->end)
        return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header: unexpected text after the dict",
                          p->label);
    if (!have_descr || !have_fortran || !have_shape)
        return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header lacks key '%s'", p->label,
                          !have_descr     ? "descr"
                          : !have_fortran ? "fortran_order"
                                          : "shape");
    if (fortran)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "%s: .npy array is in Fortran order; save it in C order "
                          "(numpy.ascontiguousarray)",
                          p->label);
    a->dtype = arl_dtype_from_npy_descr(descr);
    if (a->dtype == ARL_DTYPE_INVALID)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "%s: .npy dtype '%s' is not supported (use one of <f4 <f8 <f2 <i8 <i4 "
                          "<i2 <u8 <u4 <u2 |u1 |i1 |b1, little-endian)",
                          p->label, descr);
    return ARL_OK;
}

/* Parse the header from the first `avail` bytes of a file of `total` bytes. */
static arl_status parse_header(const unsigned char *b, size_t avail, uint64_t total,
                               const char *label, arl_npy *a, size_t *data_offset) {
    memset(a, 0, sizeof *a);
    if (total < 10 || avail < 10)
        return arl_errorf(ARL_ERR_FORMAT, "%s: truncated .npy file (%llu bytes)", label,
                          (unsigned long long)total);
    if (memcmp(b, NPY_MAGIC, 6))
        return arl_errorf(ARL_ERR_FORMAT, "%s: not a .npy file (bad magic)", label);
    unsigned major = b[6], minor = b[7];
    size_t hstart;
    uint64_t hlen;
    if (major == 1) {
        hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8;
        hstart = 10;
    } else if (major == 2 || major == 3) {
        if (avail < 12)
            return arl_errorf(ARL_ERR_FORMAT, "%s: truncated .npy file (%llu bytes)", label,
                              (unsigned long long)total);
        hlen = (uint64_t)b[8] | (uint64_t)b[9] << 8 | (uint64_t)b[10] << 16 | (uint64_t)b[11] << 24;
        hstart = 12;
    } else {
        return arl_errorf(ARL_ERR_VERSION,
                          "%s: .npy format version %u.%u is not supported "
                          "(1.0, 2.0 and 3.0 are)",
                          label, major, minor);
    }
    if (hlen > ARL_NPY_HEADER_MAX)
        return arl_errorf(ARL_ERR_FORMAT, "%s: .npy header length %llu is above the limit %u",
                          label, (unsigned long long)hlen, (unsigned)ARL_NPY_HEADER_MAX);
    if (hstart + hlen > total || hstart + hlen > avail)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: truncated .npy file: header of %llu bytes, file "
                          "of %llu",
                          label, (unsigned long long)hlen, (unsigned long long)total);
    hp p = {(const char *)b + hstart, (const char *)b + hstart + hlen, label};
    arl_status s = parse_dict(&p, a);
    if (s != ARL_OK) {
        memset(a, 0, sizeof *a);
        return s;
    }
    uint64_t numel = 1, nbytes;
    int has_zero = 0, overflow = 0;
    for (int32_t i = 0; i < a->rank; i++)
        has_zero |= a->shape[i] == 0;
    if (has_zero)
        numel = 0;
    else
        for (int32_t i = 0; i < a->rank; i++)
            overflow |= __builtin_mul_overflow(numel, (uint64_t)a->shape[i], &numel);
    overflow |= numel > (uint64_t)INT64_MAX;
    overflow |= __builtin_mul_overflow(numel, (uint64_t)arl_dtype_size(a->dtype), &nbytes);
    uint64_t have = total - hstart - hlen;
    if (overflow || nbytes != have) {
        arl_dtype dt = a->dtype;
        memset(a, 0, sizeof *a);
        if (overflow) return arl_errorf(ARL_ERR_FORMAT, "%s: .npy shape is too large", label);
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: .npy data is %llu bytes, but the header's shape and dtype %s "
                          "need %llu (file truncated or header wrong)",
                          label, (unsigned long long)have, arl_dtype_npy_descr(dt),
                          (unsigned long long)nbytes);
    }
    a->numel = (int64_t)numel;
    a->nbytes = nbytes;
    *data_offset = hstart + (size_t)hlen;
    return ARL_OK;
}

arl_status arl_npy_parse_header(const void *buf, size_t len, const char *label, arl_npy *out,
                                size_t *data_offset) {
    ARL_ASSERT(out && data_offset);
    return parse_header(buf, buf ? len : 0, len, label ? label : "<memory>", out, data_offset);
}

void arl_npy_free(arl_npy *a) {
    if (!a) return;
    free(a->data);
    memset(a, 0, sizeof *a);
}

arl_status arl_npy_read_mem(const void *buf, size_t len, const char *label, arl_npy *out) {
    ARL_ASSERT(out);
    size_t off = 0;
    ARL_TRY(arl_npy_parse_header(buf, len, label, out, &off));
    out->data = malloc(out->nbytes ? (size_t)out->nbytes : 1);
    if (!out->data) {
        memset(out, 0, sizeof *out);
        return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory for %llu bytes",
                          label ? label : "<memory>", (unsigned long long)out->nbytes);
    }
    if (out->nbytes) memcpy(out->data, (const unsigned char *)buf + off, (size_t)out->nbytes);
    return ARL_OK;
}

static arl_status read_full(int fd, void *dst, size_t n, uint64_t at, const char *path) {
    unsigned char *c = dst;
    while (n) {
        ssize_t r = pread(fd, c, n > (1u << 30) ? (1u << 30) : n, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return arl_errorf(ARL_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (r == 0) return arl_errorf(ARL_ERR_FORMAT, "%s: file shrank while reading", path);
        c += r;
        n -= (size_t)r;
        at += (uint64_t)r;
    }
    return ARL_OK;
}

arl_status arl_npy_read(const char *path, arl_npy *out) {
    ARL_ASSERT(path && out);
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return arl_errorf(errno == ENOENT ? ARL_ERR_NOT_FOUND : ARL_ERR_IO, "%s: cannot open: %s",
                          path, strerror(errno));
    struct stat st;
    arl_status s = ARL_OK;
    unsigned char *hdr = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = arl_errorf(ARL_ERR_IO, "%s: not a readable regular file", path);
        goto done;
    }
    uint64_t total = (uint64_t)st.st_size;
    size_t avail = total < 12 + ARL_NPY_HEADER_MAX ? (size_t)total : 12 + ARL_NPY_HEADER_MAX;
    /* read the fixed prefix, then exactly the header */
    unsigned char pre[12];
    size_t np = avail < 12 ? avail : 12;
    if ((s = read_full(fd, pre, np, 0, path)) != ARL_OK) goto done;
    size_t hsize = np;
    if (np >= 10 && !memcmp(pre, NPY_MAGIC, 6)) {
        uint64_t hl = pre[6] == 1 ? ((uint64_t)pre[8] | (uint64_t)pre[9] << 8)
                      : np >= 12  ? ((uint64_t)pre[8] | (uint64_t)pre[9] << 8 |
                                    (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24)
                                  : 0;
        uint64_t want = (pre[6] == 1 ? 10 : 12) + (hl < ARL_NPY_HEADER_MAX ? hl : 0);
        hsize = want < avail ? (size_t)want : avail;
    }
    hdr = malloc(hsize > 12 ? hsize : 12);
    if (!hdr) {
        s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    if ((s = read_full(fd, hdr, hsize, 0, path)) != ARL_OK) goto done;
    size_t off = 0;
    if ((s = parse_header(hdr, hsize, total, path, out, &off)) != ARL_OK) goto done;
    out->data = malloc(out->nbytes ? (size_t)out->nbytes : 1);
    if (!out->data) {
        s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory for %llu bytes", path,
                       (unsigned long long)out->nbytes);
        goto done;
    }
    s = read_full(fd, out->data, (size_t)out->nbytes, off, path);
done:
    free(hdr);
    close(fd);
    if (s != ARL_OK) arl_npy_free(out);
    return s;
}

/* ---- writing ---- */

static arl_status write_all(int fd, const void *p, size_t n, const char *path) {
    const unsigned char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return arl_file_write_failed(path, "write failed", errno);
        c += w;
        n -= (size_t)w;
    }
    return ARL_OK;
}

arl_status arl_npy_write(const char *path, arl_dtype dtype, int32_t rank, const int64_t *shape,
                         const void *data) {
    ARL_ASSERT(path);
    const char *descr = arl_dtype_npy_descr(dtype);
    if (!descr)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "%s: dtype %s cannot be stored in a .npy file "
                          "(convert to F32 first)",
                          path, arl_dtype_name(dtype));
    if (rank < 0 || rank > ARL_NPY_MAX_RANK || (rank && !shape))
        return arl_errorf(ARL_ERR_ARG, "%s: invalid rank %d for a .npy array", path, (int)rank);
    uint64_t numel = 1, nbytes;
    for (int32_t i = 0; i < rank; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
            return arl_errorf(ARL_ERR_ARG, "%s: invalid shape for a .npy array", path);
    if (__builtin_mul_overflow(numel, arl_dtype_size(dtype), &nbytes) || (nbytes && !data))
        return arl_errorf(ARL_ERR_ARG, "%s: invalid size or NULL data", path);

    /* dict, padded with spaces and '\n' so that the data starts at a multiple of 64 */
    char dict[128 + ARL_NPY_MAX_RANK * 24];
    int k =
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", descr);
    for (int32_t i = 0; i < rank; i++)
        k += snprintf(dict + k, sizeof dict - (size_t)k, "%s%lld", i ? ", " : "",
                      (long long)shape[i]);
    k += snprintf(dict + k, sizeof dict - (size_t)k, "%s), }", rank == 1 ? "," : "");
    size_t total = 10 + (size_t)k + 1;
    size_t padded = (total + 63) & ~(size_t)63;
    size_t hlen = padded - 10;
    unsigned char head[10 + sizeof dict + 64];
    memcpy(head, NPY_MAGIC, 6);
    head[6] = 1;
    head[7] = 0;
    head[8] = (unsigned char)(hlen & 0xff);
    head[9] = (unsigned char)(hlen >> 8);
    memcpy(head + 10, dict, (size_t)k);
    memset(head + 10 + k, ' ', padded - 10 - (size_t)k - 1);
    head[padded - 1] = '\n';

    size_t pl = strlen(path);
    char *tmp = malloc(pl + 16);
    if (!tmp) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, pl + 16, "%s.tmp-XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        arl_status s =
            arl_file_write_failed(path, "cannot create a temporary file beside it", errno);
        free(tmp);
        return s;
    }
    arl_status s = ARL_OK;
    if (fchmod(fd, 0644) != 0) s = arl_file_write_failed(tmp, "fchmod", errno);
    if (s == ARL_OK) s = write_all(fd, head, padded, tmp);
    if (s == ARL_OK && nbytes) s = write_all(fd, data, (size_t)nbytes, tmp);
    if (s == ARL_OK && fsync(fd) != 0) s = arl_file_write_failed(tmp, "fsync failed", errno);
    if (close(fd) != 0 && s == ARL_OK) s = arl_file_write_failed(tmp, "close failed", errno);
    if (s == ARL_OK && rename(tmp, path) != 0)
        s = arl_file_write_failed(path, "cannot rename onto it", errno);
    if (s != ARL_OK) unlink(tmp);
    free(tmp);
    return s;
}
