/* tests/safetensors/st_interop_tool.c: the C side of st_interop.py (test_safetensors_interop).
 *
 *   st_interop_tool verify PATH EXPECT_DIR COUNT [KEY=VALUE ...]
 *       Open PATH (a .safetensors file or a checkpoint directory) with arl_st_dir_open; check
 *       it holds COUNT tensors and the given __metadata__ pairs (first shard); for each tensor
 *       NAME compare with EXPECT_DIR/NAME.npy: shape equal, and values equal exactly --
 *       float tensors against '<f8' expectations (read with arl_st_tensor_read_f32, NaN
 *       matches NaN), integer/bool tensors against '<i8' (raw bytes decoded exactly).
 *   st_interop_tool write FILE NPY
 *       Write FILE with agentrl's writer and NPY (a <f4 [3, 5] array) with arl_npy_write;
 *       the values follow formulas that st_interop.py recomputes.
 *   st_interop_tool write-dir DIR MAX_SHARD_BYTES
 *       Write the same tensors as a checkpoint directory.
 * Exit status 0 when everything matched, 1 otherwise, 2 on usage errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/npy.h"
#include "policy/safetensors.h"

static int fail(const char *what) {
    fprintf(stderr, "st_interop_tool: %s: %s\n", what, arl_error_msg());
    return 1;
}

static int64_t raw_int(const arl_st_tensor *t, int64_t i) {
    const unsigned char *p =
        (const unsigned char *)arl_st_tensor_data(t) + i * (int64_t)arl_dtype_size(t->dtype);
    switch (t->dtype) {
    case ARL_DTYPE_U8:
        return p[0];
    case ARL_DTYPE_BOOL:
        return p[0];
    case ARL_DTYPE_I8:
        return (int8_t)p[0];
#define C(DT, T)                                                                                   \
    case DT: {                                                                                     \
        T v;                                                                                       \
        memcpy(&v, p, sizeof v);                                                                   \
        return (int64_t)v;                                                                         \
    }
        C(ARL_DTYPE_I16, int16_t)
        C(ARL_DTYPE_U16, uint16_t)
        C(ARL_DTYPE_I32, int32_t)
        C(ARL_DTYPE_U32, uint32_t)
        C(ARL_DTYPE_I64, int64_t)
        C(ARL_DTYPE_U64, uint64_t)
#undef C
    default:
        return INT64_MIN;
    }
}

static int cmd_verify(int argc, char **argv) {
    if (argc < 5) return 2;
    arl_st_dir *d;
    if (arl_st_dir_open(argv[2], &d) != ARL_OK) return fail("open");
    int bad = 0;
    long want_count = strtol(argv[4], NULL, 10);
    if (arl_st_dir_count(d) != want_count) {
        fprintf(stderr, "tensor count %lld, expected %ld\n", (long long)arl_st_dir_count(d),
                want_count);
        bad++;
    }
    for (int a = 5; a < argc; a++) {
        char kv[512];
        snprintf(kv, sizeof kv, "%s", argv[a]);
        char *eq = strchr(kv, '=');
        if (!eq) return 2;
        *eq = 0;
        const char *v = arl_st_file_metadata(arl_st_dir_shard(d, 0), kv);
        if (!v || strcmp(v, eq + 1)) {
            fprintf(stderr, "metadata '%s' = '%s', expected '%s'\n", kv, v ? v : "(absent)",
                    eq + 1);
            bad++;
        }
    }
    for (int64_t i = 0; i < arl_st_dir_count(d); i++) {
        const arl_st_tensor *t = arl_st_dir_tensor(d, i);
        char p[4096];
        snprintf(p, sizeof p, "%s/%s.npy", argv[3], t->name);
        arl_npy e;
        if (arl_npy_read(p, &e) != ARL_OK) {
            fail(p);
            bad++;
            continue;
        }
        int tb = 0;
        if (e.rank != t->rank) tb++;
        for (int r = 0; !tb && r < t->rank; r++)
            tb += e.shape[r] != t->shape[r];
        if (tb) fprintf(stderr, "%s: shape differs from the expectation\n", t->name);
        if (!tb && arl_dtype_is_float(t->dtype)) {
            float *v = malloc((size_t)t->numel * sizeof *v + 1);
            if (e.dtype != ARL_DTYPE_F64 || arl_st_tensor_read_f32(t, v, t->numel) != ARL_OK) tb++;
            for (int64_t k = 0; !tb && k < t->numel; k++) {
                double x = ((double *)e.data)[k];
                int same =
                    isnan(x) ? isnan(v[k]) : ((double)v[k] == x && !signbit(v[k]) == !signbit(x));
                if (!same) {
                    fprintf(stderr, "%s[%lld]: %.9g, expected %.17g\n", t->name, (long long)k,
                            (double)v[k], x);
                    tb++;
                }
            }
            free(v);
        } else if (!tb) {
            if (e.dtype != ARL_DTYPE_I64) tb++;
            for (int64_t k = 0; !tb && k < t->numel; k++) {
                int64_t x = ((int64_t *)e.data)[k], y = raw_int(t, k);
                if (x != y) {
                    fprintf(stderr, "%s[%lld]: %lld, expected %lld\n", t->name, (long long)k,
                            (long long)y, (long long)x);
                    tb++;
                }
            }
        }
        printf("%s %s %s\n", tb ? "FAIL" : "ok", arl_dtype_name(t->dtype), t->name);
        bad += tb;
        arl_npy_free(&e);
    }
    arl_st_dir_close(d);
    return bad ? 1 : 0;
}

/* Values shared with st_interop.py: v(i) = f32(((i * 7919) % 2001 - 1000) / 64.0 + (i % 3) * 1e-3)
 */
static float formula(int64_t i) {
    return (float)((double)((i * 7919) % 2001 - 1000) / 64.0 + (double)(i % 3) * 1e-3);
}

typedef struct tensors {
    float f[2 * 3 * 4];
    float big[3000];
    int32_t i32[6];
    int64_t i64[3];
    uint8_t u8[5], b[4];
    float scalar;
} tensors;

static void make(tensors *t) {
    for (int i = 0; i < 24; i++)
        t->f[i] = formula(i);
    for (int i = 0; i < 3000; i++)
        t->big[i] = formula(i + 100);
    for (int i = 0; i < 6; i++)
        t->i32[i] = (i - 3) * 1000003;
    t->i64[0] = -1;
    t->i64[1] = (int64_t)1 << 40;
    t->i64[2] = INT64_MIN;
    for (int i = 0; i < 5; i++)
        t->u8[i] = (uint8_t)(i * 60);
    for (int i = 0; i < 4; i++)
        t->b[i] = (uint8_t)(i & 1);
    t->scalar = -0.0f;
}

#define ADD_ALL(ADD, ADD_F32, w, t)                                                                \
    do {                                                                                           \
        int64_t s234[3] = {2, 3, 4}, s3000[2] = {30, 100}, s6[2] = {2, 3}, s3[1] = {3},            \
                s5[1] = {5}, s4[1] = {4}, s0[2] = {0, 4};                                          \
        if (ADD_F32(w, "w.f32", ARL_DTYPE_F32, 3, s234, (t)->f) ||                                 \
            ADD_F32(w, "w.bf16", ARL_DTYPE_BF16, 2, s3000, (t)->big) ||                            \
            ADD_F32(w, "w.f16", ARL_DTYPE_F16, 2, s3000, (t)->big) ||                              \
            ADD_F32(w, "w.f64", ARL_DTYPE_F64, 3, s234, (t)->f) ||                                 \
            ADD(w, "i.i32", ARL_DTYPE_I32, 2, s6, (t)->i32) ||                                     \
            ADD(w, "i.i64", ARL_DTYPE_I64, 1, s3, (t)->i64) ||                                     \
            ADD(w, "i.u8", ARL_DTYPE_U8, 1, s5, (t)->u8) ||                                        \
            ADD(w, "i.bool", ARL_DTYPE_BOOL, 1, s4, (t)->b) ||                                     \
            ADD(w, "s.scalar", ARL_DTYPE_F32, 0, NULL, &(t)->scalar) ||                            \
            ADD(w, "s.empty", ARL_DTYPE_F32, 2, s0, NULL))                                         \
            return fail("add");                                                                    \
    } while (0)

static int cmd_write(int argc, char **argv) {
    if (argc != 4) return 2;
    static tensors t;
    make(&t);
    arl_st_writer *w;
    if (arl_st_writer_open(argv[2], &w) != ARL_OK) return fail("open");
    if (arl_st_writer_set_metadata(w, "format", "pt") != ARL_OK ||
        arl_st_writer_set_metadata(w, "writer", "agentrl") != ARL_OK)
        return fail("metadata");
    ADD_ALL(arl_st_writer_add, arl_st_writer_add_f32, w, &t);
    if (arl_st_writer_close(w) != ARL_OK) return fail("close");
    int64_t s35[2] = {3, 5};
    if (arl_npy_write(argv[3], ARL_DTYPE_F32, 2, s35, t.f) != ARL_OK) return fail("npy");
    return 0;
}

static int cmd_write_dir(int argc, char **argv) {
    if (argc != 4) return 2;
    static tensors t;
    make(&t);
    arl_st_dir_writer *w;
    if (arl_st_dir_writer_open(argv[2], strtoull(argv[3], NULL, 10), &w) != ARL_OK)
        return fail("open");
    if (arl_st_dir_writer_set_metadata(w, "format", "pt") != ARL_OK) return fail("metadata");
    ADD_ALL(arl_st_dir_writer_add, arl_st_dir_writer_add_f32, w, &t);
    if (arl_st_dir_writer_close(w) != ARL_OK) return fail("close");
    return 0;
}

int main(int argc, char **argv) {
    int rc = 2;
    if (argc >= 2 && !strcmp(argv[1], "verify")) rc = cmd_verify(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "write")) rc = cmd_write(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "write-dir")) rc = cmd_write_dir(argc, argv);
    if (rc == 2) fprintf(stderr, "usage: see tests/safetensors/st_interop_tool.c\n");
    return rc;
}
