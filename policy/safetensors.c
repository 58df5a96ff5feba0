/* policy/safetensors.c: safetensors reader/writer and sharded checkpoint directories
 * (contracts in policy/safetensors.h). */
#include "policy/safetensors.h"

#include "core/crc32.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/assert.h"
#include "core/file.h"
#include "core/json_dump.h"

#define ST_CHUNK (4u << 20) /* staging buffer of the writer */

/* ======================================================================================
 * Reading one file
 * ====================================================================================== */

struct arl_st_file {
    char *path;
    const unsigned char *buf; /* whole file (len bytes) */
    size_t len;
    void *map; /* mmap base (NULL for open_mem or an empty mapping) */
    size_t map_len;
    const unsigned char *data; /* data section: buf + 8 + header length */
    uint64_t data_len;
    arl_st_tensor *tensors;        /* (n) in offset order */
    const arl_st_tensor **by_name; /* (n) sorted by name */
    int64_t n;
    char **meta; /* (2 * n_meta) key, value, ... */
    int64_t n_meta;
};

static int cmp_offset(const void *a, const void *b) {
    const arl_st_tensor *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    uint64_t ex = x->offset + x->nbytes, ey = y->offset + y->nbytes;
    if (ex != ey) return ex < ey ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_name_ptr(const void *a, const void *b) {
    const arl_st_tensor *x = *(const arl_st_tensor *const *)a;
    const arl_st_tensor *y = *(const arl_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

char *arl_st_shape_str(int32_t rank, const int64_t *shape, char *buf, size_t size) {
    if (!size) return buf;
    size_t k = 0;
    buf[0] = 0;
    k += (size_t)snprintf(buf + k, size - k, "[");
    for (int32_t i = 0; i < rank && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < size) snprintf(buf + k, size - k, "]");
    return buf;
}

/* Parse one tensor entry of the header into *t (name already set). */
static arl_status parse_entry(const char *label, const char *name, json_t *v, uint64_t data_len,
                              arl_st_tensor *t) {
    if (!json_is_object(v))
        return arl_errorf(ARL_ERR_FORMAT, "%s: tensor '%s': header entry is not a JSON object",
                          label, name);
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!jd || !js || !jo)
        return arl_errorf(ARL_ERR_FORMAT, "%s: tensor '%s': header entry lacks field '%s'", label,
                          name,
                          !jd   ? "dtype"
                          : !js ? "shape"
                                : "data_offsets");
    if (!json_is_string(jd))
        return arl_errorf(ARL_ERR_FORMAT, "%s: tensor '%s': field 'dtype' is not a string", label,
                          name);
    t->dtype = arl_dtype_from_name(json_string_value(jd));
    if (t->dtype == ARL_DTYPE_INVALID)
        return arl_errorf(ARL_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", label, name,
                          json_string_value(jd));
    if (!json_is_array(js))
        return arl_errorf(ARL_ERR_FORMAT, "%s: tensor '%s': field 'shape' is not an array", label,
                          name);
    size_t rank = json_array_size(js);
    if (rank > ARL_ST_MAX_RANK)
        return arl_errorf(ARL_ERR_UNSUPPORTED,
                          "%s: tensor '%s': rank %zu is above the supported maximum %d", label,
                          name, rank, ARL_ST_MAX_RANK);
    t->rank = (int32_t)rank;
    int has_zero = 0;
    for (size_t i = 0; i < rank; i++) {
        json_t *e = json_array_get(js, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return arl_errorf(ARL_ERR_FORMAT,
                              "%s: tensor '%s': shape[%zu] is not a non-negative integer", label,
                              name, i);
        t->shape[i] = (int64_t)json_integer_value(e);
        has_zero |= t->shape[i] == 0;
    }
    uint64_t numel = 1, nbytes = 0;
    int overflow = 0;
    if (has_zero) {
        numel = 0;
    } else {
        for (size_t i = 0; i < rank; i++)
            overflow |= __builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel);
        overflow |= numel > (uint64_t)INT64_MAX;
    }
    overflow |= __builtin_mul_overflow(numel, (uint64_t)arl_dtype_size(t->dtype), &nbytes);
    if (overflow) {
        char sb[160];
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: tensor '%s': shape %s is too large (byte size overflows)", label,
                          name, arl_st_shape_str(t->rank, t->shape, sb, sizeof sb));
    }
    t->numel = (int64_t)numel;
    t->nbytes = nbytes;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || !json_is_integer(json_array_get(jo, 0)) ||
        !json_is_integer(json_array_get(jo, 1)))
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: tensor '%s': field 'data_offsets' is not an array of two integers",
                          label, name);
    json_int_t b = json_integer_value(json_array_get(jo, 0));
    json_int_t e = json_integer_value(json_array_get(jo, 1));
    if (b < 0 || e < 0)
        return arl_errorf(ARL_ERR_FORMAT, "%s: tensor '%s': negative data_offsets [%lld, %lld]",
                          label, name, (long long)b, (long long)e);
    if (b > e)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%lld, %lld] have begin > end", label,
                          name, (long long)b, (long long)e);
    if ((uint64_t)e > data_len)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%lld, %lld] reach past the end of the "
                          "data section (%llu bytes; file truncated?)",
                          label, name, (long long)b, (long long)e, (unsigned long long)data_len);
    if ((uint64_t)(e - b) != t->nbytes) {
        char sb[160];
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: tensor '%s': data_offsets [%lld, %lld] span %llu bytes, but shape "
                          "%s of %s needs %llu",
                          label, name, (long long)b, (long long)e, (unsigned long long)(e - b),
                          arl_st_shape_str(t->rank, t->shape, sb, 160), arl_dtype_name(t->dtype),
                          (unsigned long long)t->nbytes);
    }
    t->offset = (uint64_t)b;
    return ARL_OK;
}

static arl_status parse_metadata(arl_st_file *f, json_t *v) {
    if (!json_is_object(v))
        return arl_errorf(ARL_ERR_FORMAT, "%s: '__metadata__' is not a JSON object", f->path);
    size_t n = json_object_size(v);
    f->meta = calloc(2 * n + 1, sizeof *f->meta);
    if (!f->meta) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", f->path);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (!json_is_string(x))
            return arl_errorf(ARL_ERR_FORMAT, "%s: '__metadata__' value of '%s' is not a string",
                              f->path, k);
        char *kk = strdup(k), *vv = strdup(json_string_value(x));
        f->meta[2 * f->n_meta] = kk;
        f->meta[2 * f->n_meta + 1] = vv;
        f->n_meta++;
        if (!kk || !vv) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", f->path);
    }
    return ARL_OK;
}

/* Parse f->buf/f->len (set by the caller) and fill the tables. */
static arl_status st_parse(arl_st_file *f) {
    const char *label = f->path;
    if (f->len < 8)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: truncated: %zu bytes, a safetensors file has at least 8", label,
                          f->len);
    uint64_t hlen;
    memcpy(&hlen, f->buf, 8);
    if (hlen > ARL_ST_HEADER_MAX)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: header length %llu is above the limit of %u bytes (not a "
                          "safetensors file?)",
                          label, (unsigned long long)hlen, (unsigned)ARL_ST_HEADER_MAX);
    if (hlen > f->len - 8)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: header length %llu is larger than the file (%zu bytes; "
                          "truncated?)",
                          label, (unsigned long long)hlen, f->len);
    if (hlen < 2)
        return arl_errorf(ARL_ERR_FORMAT, "%s: header length %llu is too small for a JSON object",
                          label, (unsigned long long)hlen);
    f->data = f->buf + 8 + hlen;
    f->data_len = f->len - 8 - hlen;

    json_error_t jerr;
    json_t *root =
        arl_json_loadb((const char *)f->buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) /* jansson leaves the message empty where an allocation fails */
        return arl_json_error_nomem(&jerr)
                   ? arl_errorf(ARL_ERR_NOMEM, "%s: out of memory reading the header", label)
                   : arl_errorf(ARL_ERR_FORMAT, "%s: header is not valid JSON: %s (header byte %d)",
                                label, jerr.text, jerr.position);
    arl_status s = ARL_OK;
    if (!json_is_object(root)) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: header is JSON but not an object", label);
        goto done;
    }
    size_t n = json_object_size(root);
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->by_name = calloc(n ? n : 1, sizeof *f->by_name);
    if (!f->tensors || !f->by_name) {
        s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory for %zu header entries", label, n);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if ((s = parse_metadata(f, v)) != ARL_OK) goto done;
            continue;
        }
        if (!*key) {
            s = arl_errorf(ARL_ERR_FORMAT, "%s: header has a tensor with an empty name", label);
            goto done;
        }
        arl_st_tensor *t = &f->tensors[f->n];
        memset(t, 0, sizeof *t);
        t->file = f;
        if ((s = parse_entry(label, key, v, f->data_len, t)) != ARL_OK) goto done;
        if (!(t->name = strdup(key))) {
            s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", label);
            goto done;
        }
        f->n++;
    }
    /* overlaps: in offset order, each non-empty range starts at or after the furthest end */
    qsort(f->tensors, (size_t)f->n, sizeof *f->tensors, cmp_offset);
    uint64_t reach = 0;
    const arl_st_tensor *reacher = NULL;
    for (int64_t i = 0; i < f->n; i++) {
        const arl_st_tensor *t = &f->tensors[i];
        if (!t->nbytes) continue;
        if (reacher && t->offset < reach) {
            s = arl_errorf(ARL_ERR_FORMAT,
                           "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] have overlapping "
                           "data_offsets",
                           label, reacher->name, (unsigned long long)reacher->offset,
                           (unsigned long long)(reacher->offset + reacher->nbytes), t->name,
                           (unsigned long long)t->offset,
                           (unsigned long long)(t->offset + t->nbytes));
            goto done;
        }
        if (t->offset + t->nbytes > reach) {
            reach = t->offset + t->nbytes;
            reacher = t;
        }
    }
    for (int64_t i = 0; i < f->n; i++)
        f->by_name[i] = &f->tensors[i];
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name_ptr);
done:
    json_decref(root);
    return s;
}

void arl_st_file_close(arl_st_file *f) {
    if (!f) return;
    if (f->tensors)
        for (int64_t i = 0; i < f->n; i++)
            free((char *)f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    if (f->meta)
        for (int64_t i = 0; i < 2 * f->n_meta; i++)
            free(f->meta[i]);
    free(f->meta);
    if (f->map) munmap(f->map, f->map_len);
    free(f->path);
    free(f);
}

static arl_st_file *file_new(const char *label) {
    arl_st_file *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->path = strdup(label);
    if (!f->path) {
        free(f);
        return NULL;
    }
    return f;
}

arl_status arl_st_file_open_mem(const void *buf, size_t len, const char *label, arl_st_file **out) {
    ARL_ASSERT(out);
    *out = NULL;
    arl_st_file *f = file_new(label ? label : "<memory>");
    if (!f) return arl_errorf(ARL_ERR_NOMEM, "safetensors: out of memory");
    static const unsigned char empty[1];
    f->buf = buf ? buf : empty;
    f->len = buf ? len : 0;
    arl_status s = st_parse(f);
    if (s != ARL_OK) {
        arl_st_file_close(f);
        return s;
    }
    *out = f;
    return ARL_OK;
}

arl_status arl_st_file_open(const char *path, arl_st_file **out) {
    ARL_ASSERT(path && out);
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return arl_errorf(errno == ENOENT ? ARL_ERR_NOT_FOUND : ARL_ERR_IO, "%s: cannot open: %s",
                          path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return arl_errorf(ARL_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return arl_errorf(ARL_ERR_IO, "%s: not a regular file", path);
    }
    arl_st_file *f = file_new(path);
    if (!f) {
        close(fd);
        return arl_errorf(ARL_ERR_NOMEM, "safetensors: out of memory");
    }
    static const unsigned char empty[1];
    f->len = (size_t)st.st_size;
    f->buf = empty;
    if (f->len > 0) {
        void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            arl_st_file_close(f);
            return arl_errorf(ARL_ERR_IO, "%s: cannot mmap %zu bytes: %s", path, (size_t)st.st_size,
                              strerror(e));
        }
        f->map = m;
        f->map_len = f->len;
        f->buf = m;
    }
    close(fd);
    arl_status s = st_parse(f);
    if (s != ARL_OK) {
        arl_st_file_close(f);
        return s;
    }
    *out = f;
    return ARL_OK;
}

const char *arl_st_file_path(const arl_st_file *f) {
    return f->path;
}
int64_t arl_st_file_count(const arl_st_file *f) {
    return f->n;
}

const arl_st_tensor *arl_st_file_tensor(const arl_st_file *f, int64_t i) {
    ARL_ASSERT(i >= 0 && i < f->n);
    return &f->tensors[i];
}

const arl_st_tensor *arl_st_file_find(const arl_st_file *f, const char *name) {
    int64_t lo = 0, hi = f->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->by_name[mid]->name, name);
        if (c == 0) return f->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

arl_status arl_st_file_get(const arl_st_file *f, const char *name, const arl_st_tensor **out) {
    *out = arl_st_file_find(f, name);
    if (!*out)
        return arl_errorf(ARL_ERR_NOT_FOUND, "%s: no tensor '%s' (the file has %lld tensors)",
                          f->path, name, (long long)f->n);
    return ARL_OK;
}

arl_status arl_st_file_check_data(const arl_st_file *f) {
    const char *want = arl_st_file_metadata(f, ARL_ST_DATA_CRC_KEY);
    if (!want) return ARL_OK;
    char *end = NULL;
    const unsigned long v = strlen(want) == 8 ? strtoul(want, &end, 16) : 0;
    if (!end || *end)
        return arl_errorf(ARL_ERR_FORMAT,
                          "%s: metadata '%s' is \"%.16s\", not 8 hexadecimal digits (the file "
                          "is damaged)",
                          f->path, ARL_ST_DATA_CRC_KEY, want);
    const uint32_t got = arl_crc32(f->data, (size_t)f->data_len);
    if (got != (uint32_t)v)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "%s: the tensor data does not match the checksum written with it "
                          "(CRC-32 %08x, recorded %s): the file was changed or damaged after it "
                          "was written",
                          f->path, (unsigned)got, want);
    return ARL_OK;
}

const char *arl_st_file_metadata(const arl_st_file *f, const char *key) {
    for (int64_t i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

int64_t arl_st_file_metadata_count(const arl_st_file *f) {
    return f->n_meta;
}

void arl_st_file_metadata_at(const arl_st_file *f, int64_t i, const char **key,
                             const char **value) {
    ARL_ASSERT(i >= 0 && i < f->n_meta);
    if (key) *key = f->meta[2 * i];
    if (value) *value = f->meta[2 * i + 1];
}

/* ---- tensor data ---- */

const void *arl_st_tensor_data(const arl_st_tensor *t) {
    return t->file->data + t->offset;
}

arl_status arl_st_tensor_read_raw(const arl_st_tensor *t, void *dst, uint64_t nbytes) {
    if (nbytes != t->nbytes)
        return arl_errorf(
            ARL_ERR_SHAPE, "%s: tensor '%s': has %llu bytes of data, the caller expects %llu",
            t->file->path, t->name, (unsigned long long)t->nbytes, (unsigned long long)nbytes);
    if (nbytes) memcpy(dst, arl_st_tensor_data(t), nbytes);
    return ARL_OK;
}

arl_status arl_st_tensor_read_as(const arl_st_tensor *t, arl_dtype dst_dtype, void *dst,
                                 int64_t n) {
    if (n != t->numel) {
        char sb[160];
        return arl_errorf(ARL_ERR_SHAPE,
                          "%s: tensor '%s': has %lld elements (shape %s), the caller expects %lld",
                          t->file->path, t->name, (long long)t->numel,
                          arl_st_shape_str(t->rank, t->shape, sb, sizeof sb), (long long)n);
    }
    arl_status s = arl_dtype_convert(t->dtype, arl_st_tensor_data(t), dst_dtype, dst, (size_t)n);
    if (s != ARL_OK) return arl_error_prefix(s, "%s: tensor '%s'", t->file->path, t->name);
    return ARL_OK;
}

arl_status arl_st_tensor_read_f32(const arl_st_tensor *t, float *dst, int64_t n) {
    return arl_st_tensor_read_as(t, ARL_DTYPE_F32, dst, n);
}

arl_status arl_st_tensor_check_shape(const arl_st_tensor *t, int32_t rank, const int64_t *shape) {
    int ok = t->rank == rank;
    for (int32_t i = 0; ok && i < rank; i++)
        ok = t->shape[i] == shape[i];
    if (ok) return ARL_OK;
    char a[160], b[160];
    return arl_errorf(ARL_ERR_SHAPE, "%s: tensor '%s': expected shape %s, got %s", t->file->path,
                      t->name, arl_st_shape_str(rank, shape, a, sizeof a),
                      arl_st_shape_str(t->rank, t->shape, b, sizeof b));
}

/* ======================================================================================
 * Writing
 * ====================================================================================== */

typedef enum { SRC_RAW, SRC_F32, SRC_FN } src_kind;

typedef struct st_entry {
    char *name;
    arl_dtype dtype;
    int32_t rank;
    int64_t shape[ARL_ST_MAX_RANK];
    uint64_t numel, nbytes;
    src_kind kind;
    const void *data; /* SRC_RAW: bytes; SRC_F32: floats */
    arl_st_fill_fn fill;
    void *ctx;
} st_entry;

/* Declared tensors and metadata, shared by the file and the directory writers. */
typedef struct st_decl {
    st_entry *e;
    int64_t n, cap;
    json_t *names; /* set of names (object name -> null) for O(1) duplicate checks */
    json_t *meta;  /* object of strings, insertion order */
    uint64_t total;
    const char *label;
    int data_crc; /* write ARL_ST_DATA_CRC_KEY (arl_st_writer_data_crc) */
} st_decl;

static arl_status decl_init(st_decl *d, const char *label) {
    memset(d, 0, sizeof *d);
    d->label = label;
    d->names = json_object();
    d->meta = json_object();
    if (!d->names || !d->meta) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", label);
    return ARL_OK;
}

static void decl_free(st_decl *d) {
    for (int64_t i = 0; i < d->n; i++)
        free(d->e[i].name);
    free(d->e);
    json_decref(d->names);
    json_decref(d->meta);
    memset(d, 0, sizeof *d);
}

static arl_status decl_meta(st_decl *d, const char *key, const char *value) {
    if (!key || !value)
        return arl_errorf(ARL_ERR_ARG, "%s: metadata key and value must not be NULL", d->label);
    /* (jansson refuses invalid UTF-8 and fails out of memory alike: its count tells them
     * apart, core/json_dump.h) */
    const unsigned long n0 = arl_json_alloc_failures();
    json_t *s = json_string(value);
    if (!s || json_object_set_new(d->meta, key, s) != 0)
        return arl_json_alloc_failures() != n0
                   ? arl_errorf(ARL_ERR_NOMEM, "%s: metadata '%s': out of memory", d->label, key)
                   : arl_errorf(ARL_ERR_ARG, "%s: metadata '%s': not valid UTF-8", d->label, key);
    return ARL_OK;
}

static arl_status decl_add(st_decl *d, const char *name, arl_dtype dtype, int32_t rank,
                           const int64_t *shape, src_kind kind, const void *data,
                           arl_st_fill_fn fill, void *ctx) {
    if (!name || !*name || !strcmp(name, "__metadata__"))
        return arl_errorf(ARL_ERR_ARG, "%s: invalid tensor name '%s'", d->label,
                          name ? name : "(null)");
    if (arl_dtype_size(dtype) == 0)
        return arl_errorf(ARL_ERR_ARG, "%s: tensor '%s': invalid dtype %d", d->label, name,
                          (int)dtype);
    if (kind == SRC_F32 && dtype != ARL_DTYPE_F32 && dtype != ARL_DTYPE_F64 &&
        dtype != ARL_DTYPE_BF16 && dtype != ARL_DTYPE_F16)
        return arl_errorf(ARL_ERR_ARG,
                          "%s: tensor '%s': cannot store fp32 values as %s (use F32, F64, BF16 "
                          "or F16)",
                          d->label, name, arl_dtype_name(dtype));
    if (rank < 0 || rank > ARL_ST_MAX_RANK || (rank > 0 && !shape))
        return arl_errorf(ARL_ERR_ARG, "%s: tensor '%s': invalid rank %d", d->label, name,
                          (int)rank);
    uint64_t numel = 1;
    for (int32_t i = 0; i < rank; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(numel, (uint64_t)shape[i], &numel))
            return arl_errorf(ARL_ERR_ARG, "%s: tensor '%s': invalid shape", d->label, name);
    }
    uint64_t nbytes;
    if (numel > INT64_MAX || __builtin_mul_overflow(numel, arl_dtype_size(dtype), &nbytes) ||
        __builtin_add_overflow(d->total, nbytes, &(uint64_t){0}))
        return arl_errorf(ARL_ERR_ARG, "%s: tensor '%s': too large", d->label, name);
    if (numel > 0 && kind != SRC_FN && !data)
        return arl_errorf(ARL_ERR_ARG, "%s: tensor '%s': NULL data for %llu elements", d->label,
                          name, (unsigned long long)numel);
    if (kind == SRC_FN && !fill)
        return arl_errorf(ARL_ERR_ARG, "%s: tensor '%s': NULL fill function", d->label, name);
    if (json_object_get(d->names, name))
        return arl_errorf(ARL_ERR_ARG, "%s: tensor '%s' added twice", d->label, name);
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 64;
        st_entry *e = realloc(d->e, (size_t)cap * sizeof *e);
        if (!e) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", d->label);
        d->e = e;
        d->cap = cap;
    }
    st_entry *e = &d->e[d->n];
    memset(e, 0, sizeof *e);
    const unsigned long n0 = arl_json_alloc_failures();
    if (!(e->name = strdup(name)) || json_object_set_new(d->names, name, json_null()) != 0) {
        const int nomem = !e->name || arl_json_alloc_failures() != n0;
        free(e->name);
        e->name = NULL;
        return nomem ? arl_errorf(ARL_ERR_NOMEM, "%s: tensor '%s': out of memory", d->label, name)
                     : arl_errorf(ARL_ERR_ARG, "%s: tensor '%s': name not valid UTF-8", d->label,
                                  name);
    }
    e->dtype = dtype;
    e->rank = rank;
    for (int32_t i = 0; i < rank; i++)
        e->shape[i] = shape[i];
    e->numel = numel;
    e->nbytes = nbytes;
    e->kind = kind;
    e->data = data;
    e->fill = fill;
    e->ctx = ctx;
    d->total += nbytes;
    d->n++;
    return ARL_OK;
}

/* ---- atomic output file with a staging buffer ---- */

typedef struct st_out {
    char *path, *tmp;
    int fd;
    unsigned char *buf; /* ST_CHUNK bytes */
    size_t used;
    uint64_t pos;      /* bytes written to fd */
    uint64_t crc_from; /* > 0: the CRC-32 of the bytes from this offset on (the data) */
    uint64_t crc_at;   /* > 0: where its 8 hex digits go in the header (out_commit) */
    uint32_t crc;
} st_out;

static arl_status out_open(st_out *o, const char *path) {
    memset(o, 0, sizeof *o);
    o->fd = -1;
    size_t n = strlen(path);
    o->path = strdup(path);
    o->tmp = malloc(n + 16);
    o->buf = malloc(ST_CHUNK);
    if (!o->path || !o->tmp || !o->buf) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
    snprintf(o->tmp, n + 16, "%s.tmp-XXXXXX", path);
    o->fd = mkstemp(o->tmp);
    if (o->fd < 0) {
        int e = errno;
        o->tmp[0] = 0;
        return arl_file_write_failed(path, "cannot create a temporary file beside it", e);
    }
    if (fchmod(o->fd, 0644) != 0) return arl_file_write_failed(o->tmp, "fchmod", errno);
    return ARL_OK;
}

static void out_discard(st_out *o) {
    if (o->fd >= 0) close(o->fd);
    if (o->tmp && o->tmp[0]) unlink(o->tmp);
    free(o->path);
    free(o->tmp);
    free(o->buf);
    memset(o, 0, sizeof *o);
    o->fd = -1;
}

static arl_status write_all(st_out *o, const void *p, size_t n) {
    const unsigned char *c = p;
    while (n) {
        size_t k = n > (1u << 30) ? (1u << 30) : n;
        ssize_t w = write(o->fd, c, k);
        if (w < 0) {
            if (errno == EINTR) continue;
            return arl_file_write_failed(o->tmp, "write failed", errno);
        }
        if (o->crc_from && o->pos + (uint64_t)w > o->crc_from) { /* (the data's part of it) */
            const uint64_t skip = o->pos < o->crc_from ? o->crc_from - o->pos : 0;
            o->crc = arl_crc32_update(o->crc, c + skip, (size_t)((uint64_t)w - skip));
        }
        o->pos += (uint64_t)w;
        c += w;
        n -= (size_t)w;
    }
    return ARL_OK;
}

static arl_status out_flush(st_out *o) {
    arl_status s = write_all(o, o->buf, o->used);
    o->used = 0;
    return s;
}

static arl_status out_put(st_out *o, const void *p, size_t n) {
    if (o->used + n <= ST_CHUNK) {
        if (n) memcpy(o->buf + o->used, p, n);
        o->used += n;
        return ARL_OK;
    }
    ARL_TRY(out_flush(o));
    if (n >= ST_CHUNK) return write_all(o, p, n);
    memcpy(o->buf, p, n);
    o->used = n;
    return ARL_OK;
}

static arl_status fsync_dir_of(const char *path) {
    char *dir = strdup(path);
    if (!dir) return arl_errorf(ARL_ERR_NOMEM, "out of memory");
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = 0;
    else if (slash)
        *slash = 0;
    else
        strcpy(dir, ".");
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    arl_status s = ARL_OK;
    if (fd < 0 || fsync(fd) != 0)
        s = arl_file_write_failed(dir, "cannot fsync the directory", errno);
    if (fd >= 0) close(fd);
    free(dir);
    return s;
}

/* Flush, fill in the data checksum, fsync, close, rename onto the final path, fsync the
 * directory; always frees o. */
static arl_status out_commit(st_out *o) {
    arl_status s = out_flush(o);
    if (s == ARL_OK && o->crc_at) {
        char hex[9];
        snprintf(hex, sizeof hex, "%08x", (unsigned)o->crc);
        if (pwrite(o->fd, hex, 8, (off_t)o->crc_at) != 8)
            s = arl_file_write_failed(o->tmp, "cannot write the data checksum", errno);
    }
    if (s == ARL_OK && fsync(o->fd) != 0) s = arl_file_write_failed(o->tmp, "fsync failed", errno);
    if (s == ARL_OK) {
        int r = close(o->fd);
        o->fd = -1;
        if (r != 0) s = arl_file_write_failed(o->tmp, "close failed", errno);
    }
    if (s == ARL_OK && rename(o->tmp, o->path) != 0)
        s = arl_file_write_failed(o->path, "cannot rename the temporary file onto it", errno);
    if (s == ARL_OK) {
        o->tmp[0] = 0; /* renamed: nothing to remove */
        s = fsync_dir_of(o->path);
    }
    out_discard(o);
    return s;
}

/* Write header + data of entries [lo, hi) of d (with d's metadata) to o. */
static arl_status write_shard(st_out *o, const st_decl *d, int64_t lo, int64_t hi) {
    json_t *root = json_object();
    if (!root) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", o->path);
    arl_status s = ARL_OK;
    /* the data checksum's place: 8 zeros, filled in by out_commit */
    json_t *meta = d->data_crc ? json_deep_copy(d->meta) : json_incref(d->meta);
    if (!meta || (d->data_crc &&
                  json_object_set_new(meta, ARL_ST_DATA_CRC_KEY, json_string("00000000")) != 0))
        s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", o->path);
    if (s == ARL_OK && json_object_size(meta) > 0 &&
        json_object_set(root, "__metadata__", meta) != 0)
        s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", o->path);
    json_decref(meta);
    uint64_t off = 0;
    for (int64_t i = lo; i < hi && s == ARL_OK; i++) {
        const st_entry *e = &d->e[i];
        json_t *shape = json_array();
        for (int32_t k = 0; shape && k < e->rank; k++)
            if (json_array_append_new(shape, json_integer((json_int_t)e->shape[k]))) {
                json_decref(shape); /* out of memory: not a shorter shape */
                shape = NULL;
            }
        json_t *ent =
            json_pack("{s:s, s:o, s:[I,I]}", "dtype", arl_dtype_name(e->dtype), "shape", shape,
                      "data_offsets", (json_int_t)off, (json_int_t)(off + e->nbytes));
        if (!ent || json_object_set_new(root, e->name, ent) != 0)
            s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory building the header", o->path);
        off += e->nbytes;
    }
    char *hdr = s == ARL_OK ? arl_json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (s != ARL_OK) return s;
    if (!hdr) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory writing the header", o->path);
    size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
    if (padded > ARL_ST_HEADER_MAX) {
        free(hdr);
        return arl_errorf(ARL_ERR_RANGE,
                          "%s: header of %zu bytes is above the %u that readers accept (too many "
                          "tensors for one file: write a sharded directory)",
                          o->path, padded, (unsigned)ARL_ST_HEADER_MAX);
    }
    if (d->data_crc) {
        static const char slot[] = "\"" ARL_ST_DATA_CRC_KEY "\":\"00000000\"";
        const char *at = strstr(hdr, slot);
        if (!at) {
            free(hdr);
            return arl_errorf(ARL_ERR_INTERNAL, "%s: the header lacks its checksum slot", o->path);
        }
        o->crc_at = o->pos + o->used + 8 + (uint64_t)(at - hdr) + sizeof slot - 10;
        o->crc_from = o->pos + o->used + 8 + padded;
        o->crc = 0;
    }
    uint64_t hl64 = padded;
    s = out_put(o, &hl64, 8);
    if (s == ARL_OK) s = out_put(o, hdr, hl);
    for (size_t i = hl; i < padded && s == ARL_OK; i++)
        s = out_put(o, " ", 1);
    free(hdr);

    for (int64_t i = lo; i < hi && s == ARL_OK; i++) {
        const st_entry *e = &d->e[i];
        if (e->kind == SRC_RAW) {
            s = out_put(o, e->data, e->nbytes);
        } else if (e->kind == SRC_F32) {
            size_t es = arl_dtype_size(e->dtype), per = ST_CHUNK / es;
            for (uint64_t k = 0; k < e->numel && s == ARL_OK; k += per) {
                size_t m = e->numel - k < per ? (size_t)(e->numel - k) : per;
                if (o->used + m * es > ST_CHUNK && (s = out_flush(o)) != ARL_OK) break;
                s = arl_dtype_from_f32(e->dtype, (const float *)e->data + k, o->buf + o->used, m);
                o->used += m * es;
            }
        } else {
            for (uint64_t k = 0; k < e->nbytes && s == ARL_OK; k += ST_CHUNK) {
                size_t m = e->nbytes - k < ST_CHUNK ? (size_t)(e->nbytes - k) : ST_CHUNK;
                if (o->used + m > ST_CHUNK && (s = out_flush(o)) != ARL_OK) break;
                s = e->fill(e->ctx, o->buf + o->used, k, m);
                if (s != ARL_OK)
                    s = arl_error_prefix(s, "%s: tensor '%s': fill callback failed", o->path,
                                         e->name);
                o->used += m;
            }
        }
    }
    return s;
}

struct arl_st_writer {
    st_decl d;
    st_out o;
};

arl_status arl_st_writer_open(const char *path, arl_st_writer **out) {
    ARL_ASSERT(path && out);
    *out = NULL;
    arl_st_writer *w = calloc(1, sizeof *w);
    if (!w) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
    w->o.fd = -1;
    arl_status s = out_open(&w->o, path);
    if (s == ARL_OK) s = decl_init(&w->d, w->o.path);
    if (s != ARL_OK) {
        arl_st_writer_abort(w);
        return s;
    }
    *out = w;
    return ARL_OK;
}

arl_status arl_st_writer_set_metadata(arl_st_writer *w, const char *key, const char *value) {
    return decl_meta(&w->d, key, value);
}

void arl_st_writer_data_crc(arl_st_writer *w) {
    w->d.data_crc = 1;
}

arl_status arl_st_writer_add(arl_st_writer *w, const char *name, arl_dtype dtype, int32_t rank,
                             const int64_t *shape, const void *data) {
    return decl_add(&w->d, name, dtype, rank, shape, SRC_RAW, data, NULL, NULL);
}

arl_status arl_st_writer_add_f32(arl_st_writer *w, const char *name, arl_dtype dtype, int32_t rank,
                                 const int64_t *shape, const float *src) {
    return decl_add(&w->d, name, dtype, rank, shape, SRC_F32, src, NULL, NULL);
}

arl_status arl_st_writer_add_fn(arl_st_writer *w, const char *name, arl_dtype dtype, int32_t rank,
                                const int64_t *shape, arl_st_fill_fn fill, void *ctx) {
    return decl_add(&w->d, name, dtype, rank, shape, SRC_FN, NULL, fill, ctx);
}

uint64_t arl_st_writer_data_bytes(const arl_st_writer *w) {
    return w->d.total;
}

arl_status arl_st_writer_close(arl_st_writer *w) {
    if (!w) return arl_errorf(ARL_ERR_ARG, "safetensors: arl_st_writer_close(NULL)");
    arl_status s = write_shard(&w->o, &w->d, 0, w->d.n);
    if (s == ARL_OK)
        s = out_commit(&w->o);
    else
        out_discard(&w->o);
    decl_free(&w->d);
    free(w);
    return s;
}

void arl_st_writer_abort(arl_st_writer *w) {
    if (!w) return;
    out_discard(&w->o);
    decl_free(&w->d);
    free(w);
}

/* ======================================================================================
 * Checkpoint directories
 * ====================================================================================== */

struct arl_st_dir {
    char *path;
    arl_st_file **shards; /* (n_shards) in file-name order */
    int32_t n_shards;
    const arl_st_tensor **by_name; /* (n) */
    int64_t n;
    uint64_t total;
};

void arl_st_dir_close(arl_st_dir *d) {
    if (!d) return;
    for (int32_t i = 0; i < d->n_shards; i++)
        arl_st_file_close(d->shards[i]);
    free(d->shards);
    free(d->by_name);
    free(d->path);
    free(d);
}

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Fill d->by_name from the shards and sort it. */
static arl_status dir_collect(arl_st_dir *d) {
    int64_t n = 0;
    for (int32_t i = 0; i < d->n_shards; i++)
        n += arl_st_file_count(d->shards[i]);
    d->by_name = calloc(n ? (size_t)n : 1, sizeof *d->by_name);
    if (!d->by_name) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", d->path);
    for (int32_t i = 0; i < d->n_shards; i++)
        for (int64_t k = 0; k < arl_st_file_count(d->shards[i]); k++) {
            const arl_st_tensor *t = arl_st_file_tensor(d->shards[i], k);
            d->by_name[d->n++] = t;
            d->total += t->nbytes;
        }
    qsort(d->by_name, (size_t)d->n, sizeof *d->by_name, cmp_name_ptr);
    for (int64_t i = 1; i < d->n; i++)
        if (!strcmp(d->by_name[i - 1]->name, d->by_name[i]->name))
            return arl_errorf(ARL_ERR_FORMAT, "%s: tensor '%s' is present in both %s and %s",
                              d->path, d->by_name[i]->name, d->by_name[i - 1]->file->path,
                              d->by_name[i]->file->path);
    return ARL_OK;
}

static arl_status dir_open_index(arl_st_dir *d, const char *dir, const char *index) {
    json_error_t jerr;
    struct stat st;
    if (stat(index, &st) == 0 && st.st_size > (off_t)ARL_ST_HEADER_MAX)
        return arl_errorf(ARL_ERR_FORMAT, "%s: index file of %lld bytes is above the limit of %u",
                          index, (long long)st.st_size, (unsigned)ARL_ST_HEADER_MAX);
    json_t *root = arl_json_load_file(index, JSON_REJECT_DUPLICATES, &jerr);
    if (!root && arl_json_error_nomem(&jerr))
        return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory reading the index", index);
    if (!root)
        return arl_errorf(ARL_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", index, jerr.text,
                          jerr.line);
    arl_status s = ARL_OK;
    const char **names = NULL;
    json_t *wm = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(wm)) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: expected a JSON object with a \"weight_map\" object",
                       index);
        goto done;
    }
    json_t *meta = json_object_get(root, "metadata");
    if (meta && !json_is_object(meta) && !json_is_null(meta)) {
        s = arl_errorf(ARL_ERR_FORMAT, "%s: \"metadata\" is not an object", index);
        goto done;
    }
    /* distinct shard names */
    size_t nw = json_object_size(wm), ns = 0;
    names = calloc(nw ? nw : 1, sizeof *names);
    json_t *seen = json_object();
    if (!names || !seen) {
        json_decref(seen);
        s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", index);
        goto done;
    }
    const char *key;
    json_t *v;
    json_object_foreach(wm, key, v) {
        const char *sh = json_string_value(v);
        if (!sh || !*sh || strchr(sh, '/') || !strcmp(sh, ".") || !strcmp(sh, "..")) {
            s = arl_errorf(ARL_ERR_FORMAT,
                           "%s: weight_map entry '%s': expected the file name of a shard in the "
                           "same directory",
                           index, key);
            break;
        }
        if (!json_object_get(seen, sh)) {
            json_object_set_new(seen, sh, json_null());
            names[ns++] = sh;
        }
    }
    json_decref(seen);
    if (s != ARL_OK) goto done;
    qsort(names, ns, sizeof *names, cmp_str_ptr);
    d->shards = calloc(ns ? ns : 1, sizeof *d->shards);
    if (!d->shards) {
        s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", index);
        goto done;
    }
    for (size_t i = 0; i < ns && s == ARL_OK; i++) {
        char *p = path_join(dir, names[i]);
        if (!p) {
            s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", index);
            break;
        }
        if (!is_file(p)) {
            s = arl_errorf(ARL_ERR_NOT_FOUND,
                           "%s: shard '%s' named in the weight_map does not "
                           "exist (%s; incomplete download or copy?)",
                           index, names[i], p);
        } else {
            s = arl_st_file_open(p, &d->shards[i]);
            if (s == ARL_OK) d->n_shards++;
        }
        free(p);
    }
    if (s != ARL_OK) goto done;
    /* every indexed tensor is in its shard; every shard tensor is indexed, in that shard */
    json_object_foreach(wm, key, v) {
        const arl_st_file *f = NULL;
        for (int32_t i = 0; i < d->n_shards && !f; i++)
            if (!strcmp(names[i], json_string_value(v))) f = d->shards[i];
        if (!f || !arl_st_file_find(f, key)) {
            s = arl_errorf(ARL_ERR_FORMAT,
                           "%s: tensor '%s' is listed in the weight_map in shard "
                           "'%s', but that shard does not hold it",
                           index, key, json_string_value(v));
            goto done;
        }
    }
    for (int32_t i = 0; i < d->n_shards; i++)
        for (int64_t k = 0; k < arl_st_file_count(d->shards[i]); k++) {
            const arl_st_tensor *t = arl_st_file_tensor(d->shards[i], k);
            const char *want = json_string_value(json_object_get(wm, t->name));
            if (!want) {
                s = arl_errorf(ARL_ERR_FORMAT,
                               "%s: tensor '%s' of shard '%s' is not listed in "
                               "the weight_map",
                               index, t->name, names[i]);
                goto done;
            }
            if (strcmp(want, names[i])) {
                s = arl_errorf(ARL_ERR_FORMAT,
                               "%s: tensor '%s' is present in two shards, '%s' "
                               "and '%s' (the weight_map names '%s')",
                               index, t->name, names[i], want, want);
                goto done;
            }
        }
    s = dir_collect(d);
done:
    free(names);
    json_decref(root);
    return s;
}

arl_status arl_st_dir_open(const char *path, arl_st_dir **out) {
    ARL_ASSERT(path && out);
    *out = NULL;
    struct stat st;
    if (stat(path, &st) != 0)
        return arl_errorf(errno == ENOENT ? ARL_ERR_NOT_FOUND : ARL_ERR_IO,
                          "%s: cannot open checkpoint: %s", path, strerror(errno));
    arl_st_dir *d = calloc(1, sizeof *d);
    if (!d || !(d->path = strdup(path))) {
        free(d);
        return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
    }
    arl_status s = ARL_OK;
    if (!S_ISDIR(st.st_mode)) {
        d->shards = calloc(1, sizeof *d->shards);
        if (!d->shards) s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
        if (s == ARL_OK) s = arl_st_file_open(path, &d->shards[0]);
        if (s == ARL_OK) d->n_shards = 1;
        if (s == ARL_OK) s = dir_collect(d);
    } else {
        char *index = path_join(path, ARL_ST_INDEX_NAME);
        char *single = path_join(path, ARL_ST_SINGLE_NAME);
        if (!index || !single) {
            s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
        } else if (is_file(index)) {
            s = dir_open_index(d, path, index);
        } else if (is_file(single)) {
            d->shards = calloc(1, sizeof *d->shards);
            if (!d->shards) s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
            if (s == ARL_OK) s = arl_st_file_open(single, &d->shards[0]);
            if (s == ARL_OK) d->n_shards = 1;
            if (s == ARL_OK) s = dir_collect(d);
        } else {
            s = arl_errorf(ARL_ERR_NOT_FOUND, "%s: no checkpoint here: neither %s nor %s exists",
                           path, ARL_ST_INDEX_NAME, ARL_ST_SINGLE_NAME);
        }
        free(index);
        free(single);
    }
    if (s != ARL_OK) {
        arl_st_dir_close(d);
        return s;
    }
    *out = d;
    return ARL_OK;
}

const char *arl_st_dir_path(const arl_st_dir *d) {
    return d->path;
}
int64_t arl_st_dir_count(const arl_st_dir *d) {
    return d->n;
}

const arl_st_tensor *arl_st_dir_tensor(const arl_st_dir *d, int64_t i) {
    ARL_ASSERT(i >= 0 && i < d->n);
    return d->by_name[i];
}

const arl_st_tensor *arl_st_dir_find(const arl_st_dir *d, const char *name) {
    int64_t lo = 0, hi = d->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(d->by_name[mid]->name, name);
        if (c == 0) return d->by_name[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

arl_status arl_st_dir_get(const arl_st_dir *d, const char *name, const arl_st_tensor **out) {
    *out = arl_st_dir_find(d, name);
    if (!*out)
        return arl_errorf(ARL_ERR_NOT_FOUND,
                          "%s: checkpoint has no tensor '%s' (%lld tensors in "
                          "%d shard(s))",
                          d->path, name, (long long)d->n, (int)d->n_shards);
    return ARL_OK;
}

int32_t arl_st_dir_shard_count(const arl_st_dir *d) {
    return d->n_shards;
}

const arl_st_file *arl_st_dir_shard(const arl_st_dir *d, int32_t i) {
    ARL_ASSERT(i >= 0 && i < d->n_shards);
    return d->shards[i];
}

arl_status arl_st_dir_check_data(const arl_st_dir *d) {
    for (int32_t i = 0; i < d->n_shards; i++)
        ARL_TRY(arl_st_file_check_data(d->shards[i]));
    return ARL_OK;
}

uint64_t arl_st_dir_data_bytes(const arl_st_dir *d) {
    return d->total;
}

/* ---- directory writer ---- */

struct arl_st_dir_writer {
    char *dir;
    uint64_t max_shard;
    st_decl d;
};

arl_status arl_st_dir_writer_open(const char *dir, uint64_t max_shard_bytes,
                                  arl_st_dir_writer **out) {
    ARL_ASSERT(dir && out);
    *out = NULL;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return arl_file_write_failed(dir, "cannot create the checkpoint directory", errno);
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return arl_errorf(ARL_ERR_IO, "%s: not a directory", dir);
    arl_st_dir_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->dir = strdup(dir))) {
        free(w);
        return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", dir);
    }
    w->max_shard = max_shard_bytes;
    arl_status s = decl_init(&w->d, w->dir);
    if (s != ARL_OK) {
        arl_st_dir_writer_abort(w);
        return s;
    }
    *out = w;
    return ARL_OK;
}

arl_status arl_st_dir_writer_set_metadata(arl_st_dir_writer *w, const char *key,
                                          const char *value) {
    return decl_meta(&w->d, key, value);
}

void arl_st_dir_writer_data_crc(arl_st_dir_writer *w) {
    w->d.data_crc = 1;
}

arl_status arl_st_dir_writer_add(arl_st_dir_writer *w, const char *name, arl_dtype dtype,
                                 int32_t rank, const int64_t *shape, const void *data) {
    return decl_add(&w->d, name, dtype, rank, shape, SRC_RAW, data, NULL, NULL);
}

arl_status arl_st_dir_writer_add_f32(arl_st_dir_writer *w, const char *name, arl_dtype dtype,
                                     int32_t rank, const int64_t *shape, const float *src) {
    return decl_add(&w->d, name, dtype, rank, shape, SRC_F32, src, NULL, NULL);
}

arl_status arl_st_dir_writer_add_fn(arl_st_dir_writer *w, const char *name, arl_dtype dtype,
                                    int32_t rank, const int64_t *shape, arl_st_fill_fn fill,
                                    void *ctx) {
    return decl_add(&w->d, name, dtype, rank, shape, SRC_FN, NULL, fill, ctx);
}

void arl_st_dir_writer_abort(arl_st_dir_writer *w) {
    if (!w) return;
    decl_free(&w->d);
    free(w->dir);
    free(w);
}

static arl_status write_one(const char *path, const st_decl *d, int64_t lo, int64_t hi) {
    st_out o;
    arl_status s = out_open(&o, path);
    if (s == ARL_OK) s = write_shard(&o, d, lo, hi);
    if (s == ARL_OK) return out_commit(&o);
    out_discard(&o);
    return s;
}

static arl_status remove_stale(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    if (!p) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", dir);
    arl_status s = ARL_OK;
    if (unlink(p) != 0 && errno != ENOENT)
        s = arl_file_write_failed(p, "cannot remove the stale file", errno);
    free(p);
    return s;
}

static arl_status dir_writer_write(arl_st_dir_writer *w) {
    const st_decl *d = &w->d;
    /* shard boundaries: start[i] .. start[i+1] */
    int64_t *start = malloc((size_t)(d->n + 2) * sizeof *start);
    if (!start) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", w->dir);
    int64_t ns = 0;
    uint64_t cur = 0;
    start[ns++] = 0;
    for (int64_t i = 0; i < d->n; i++) {
        uint64_t b = d->e[i].nbytes;
        if (w->max_shard && i > start[ns - 1] && cur + b > w->max_shard) {
            start[ns++] = i;
            cur = 0;
        }
        cur += b;
    }
    start[ns] = d->n;
    arl_status s = ARL_OK;
    if (ns == 1) {
        char *p = path_join(w->dir, ARL_ST_SINGLE_NAME);
        s = p ? write_one(p, d, 0, d->n) : arl_errorf(ARL_ERR_NOMEM, "out of memory");
        free(p);
        if (s == ARL_OK) s = remove_stale(w->dir, ARL_ST_INDEX_NAME);
        free(start);
        return s;
    }
    json_t *wm = json_object();
    if (!wm) s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", w->dir);
    char name[64];
    for (int64_t k = 0; k < ns && s == ARL_OK; k++) {
        snprintf(name, sizeof name, "model-%05lld-of-%05lld.safetensors", (long long)k + 1,
                 (long long)ns);
        char *p = path_join(w->dir, name);
        s = p ? write_one(p, d, start[k], start[k + 1])
              : arl_errorf(ARL_ERR_NOMEM, "out of memory");
        free(p);
        for (int64_t i = start[k]; i < start[k + 1] && s == ARL_OK; i++)
            if (json_object_set_new(wm, d->e[i].name, json_string(name)) != 0)
                s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", w->dir);
    }
    free(start);
    if (s != ARL_OK) {
        json_decref(wm);
        return s;
    }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)d->total,
                             "weight_map", wm);
    char *txt = root ? arl_json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(root);
    if (!txt) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory writing the index", w->dir);
    char *p = path_join(w->dir, ARL_ST_INDEX_NAME);
    st_out o;
    s = p ? out_open(&o, p) : arl_errorf(ARL_ERR_NOMEM, "out of memory");
    if (s == ARL_OK) {
        s = out_put(&o, txt, strlen(txt));
        if (s == ARL_OK) s = out_put(&o, "\n", 1);
        if (s == ARL_OK)
            s = out_commit(&o);
        else
            out_discard(&o);
    }
    free(p);
    free(txt);
    if (s == ARL_OK) s = remove_stale(w->dir, ARL_ST_SINGLE_NAME);
    return s;
}

arl_status arl_st_dir_writer_close(arl_st_dir_writer *w) {
    if (!w) return arl_errorf(ARL_ERR_ARG, "safetensors: arl_st_dir_writer_close(NULL)");
    arl_status s = dir_writer_write(w);
    arl_st_dir_writer_abort(w);
    return s;
}
