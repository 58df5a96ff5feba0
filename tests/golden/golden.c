/* tests/golden/golden.c: golden-vector loading for C tests (see golden.h). */
#include "tests/golden/golden.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/status.h"
#include "policy/safetensors.h"

struct golden_case {
    char name[128];
    arl_st_file *file;
    void **allocs;
    int64_t n_allocs, cap_allocs;
};

static void golden_die(const golden_case *gc, const char *what) {
    fprintf(stderr, "golden %s: %s\n", gc ? gc->name : "?", what);
    exit(1);
}

static void *golden_keep(golden_case *gc, void *p) {
    if (!p) golden_die(gc, "out of memory");
    if (gc->n_allocs == gc->cap_allocs) {
        int64_t cap = gc->cap_allocs ? 2 * gc->cap_allocs : 64;
        void **a = realloc(gc->allocs, (size_t)cap * sizeof *a);
        if (!a) golden_die(gc, "out of memory");
        gc->allocs = a;
        gc->cap_allocs = cap;
    }
    gc->allocs[gc->n_allocs++] = p;
    return p;
}

golden_case *golden_open(const char *name) {
    golden_case *gc = calloc(1, sizeof *gc);
    if (!gc) golden_die(NULL, "out of memory");
    snprintf(gc->name, sizeof gc->name, "%s", name);
    const char *root = getenv("ARL_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/golden/data/%s.safetensors", root && *root ? root : ".",
             name);
    arl_status st = arl_st_file_open(path, &gc->file);
    if (st != ARL_OK) {
        char msg[1400];
        snprintf(msg, sizeof msg,
                 "cannot open %s: %s (run /usr/bin/python3 "
                 "tests/golden/gen_golden.py to regenerate)",
                 path, arl_error_msg());
        golden_die(gc, msg);
    }
    return gc;
}

void golden_close(golden_case *gc) {
    if (!gc) return;
    for (int64_t i = 0; i < gc->n_allocs; i++)
        free(gc->allocs[i]);
    free(gc->allocs);
    arl_st_file_close(gc->file);
    free(gc);
}

const struct arl_st_file *golden_file(const golden_case *gc) {
    return gc->file;
}

const char *golden_name(const golden_case *gc) {
    return gc->name;
}

static const arl_st_tensor *find_form(golden_case *gc, const char *name, const char *suffix) {
    char key[512];
    snprintf(key, sizeof key, "%s%s", name, suffix);
    return arl_st_file_find(gc->file, key);
}

static const arl_st_tensor *golden_tensor(golden_case *gc, const char *name) {
    const arl_st_tensor *t = arl_st_file_find(gc->file, name);
    if (!t) t = find_form(gc, name, ".f32");
    if (!t) {
        char msg[600];
        snprintf(msg, sizeof msg, "tensor '%s' not found", name);
        golden_die(gc, msg);
    }
    return t;
}

int golden_has(golden_case *gc, const char *name) {
    return arl_st_file_find(gc->file, name) || find_form(gc, name, ".f32");
}

int64_t golden_numel(golden_case *gc, const char *name, int64_t *shape, int32_t *rank) {
    const arl_st_tensor *t = golden_tensor(gc, name);
    if (shape)
        for (int32_t i = 0; i < t->rank; i++)
            shape[i] = t->shape[i];
    if (rank) *rank = t->rank;
    return t->numel;
}

static void check_numel(golden_case *gc, const arl_st_tensor *t, int64_t expect) {
    if (expect >= 0 && t->numel != expect) {
        char msg[600];
        snprintf(msg, sizeof msg, "tensor '%s' has %lld elements, the test expects %lld", t->name,
                 (long long)t->numel, (long long)expect);
        golden_die(gc, msg);
    }
}

float *golden_f32(golden_case *gc, const char *name, int64_t expect_numel) {
    const arl_st_tensor *t = find_form(gc, name, ".f32");
    if (!t) t = golden_tensor(gc, name);
    check_numel(gc, t, expect_numel);
    float *out = golden_keep(gc, malloc(sizeof(float) * (size_t)(t->numel ? t->numel : 1)));
    if (t->dtype == ARL_DTYPE_I64) {
        const int64_t *src = arl_st_tensor_data(t);
        for (int64_t i = 0; i < t->numel; i++) {
            int64_t v;
            memcpy(&v, src + i, sizeof v);
            out[i] = (float)v;
        }
    } else if (arl_st_tensor_read_f32(t, out, t->numel) != ARL_OK) {
        golden_die(gc, arl_error_msg());
    }
    return out;
}

double *golden_f64(golden_case *gc, const char *name, int64_t expect_numel) {
    const arl_st_tensor *t = golden_tensor(gc, name);
    check_numel(gc, t, expect_numel);
    double *out = golden_keep(gc, malloc(sizeof(double) * (size_t)(t->numel ? t->numel : 1)));
    const unsigned char *raw = arl_st_tensor_data(t);
    for (int64_t i = 0; i < t->numel; i++) {
        if (t->dtype == ARL_DTYPE_F64) {
            memcpy(&out[i], raw + 8 * i, 8);
        } else if (t->dtype == ARL_DTYPE_F32) {
            float f;
            memcpy(&f, raw + 4 * i, 4);
            out[i] = f;
        } else {
            golden_die(gc, "golden_f64: tensor is neither F64 nor F32");
        }
    }
    return out;
}

int64_t *golden_i64(golden_case *gc, const char *name, int64_t expect_numel) {
    const arl_st_tensor *t = golden_tensor(gc, name);
    check_numel(gc, t, expect_numel);
    if (t->dtype != ARL_DTYPE_I64) golden_die(gc, "golden_i64: tensor is not I64");
    int64_t *out = golden_keep(gc, malloc(sizeof(int64_t) * (size_t)(t->numel ? t->numel : 1)));
    memcpy(out, arl_st_tensor_data(t), sizeof(int64_t) * (size_t)t->numel);
    return out;
}

int32_t *golden_i32(golden_case *gc, const char *name, int64_t expect_numel) {
    int64_t *v = golden_i64(gc, name, expect_numel);
    int64_t n = golden_numel(gc, name, NULL, NULL);
    int32_t *out = golden_keep(gc, malloc(sizeof(int32_t) * (size_t)(n ? n : 1)));
    for (int64_t i = 0; i < n; i++)
        out[i] = (int32_t)v[i];
    return out;
}

float *golden_zeros(golden_case *gc, int64_t n) {
    return golden_keep(gc, calloc((size_t)(n ? n : 1), sizeof(float)));
}
