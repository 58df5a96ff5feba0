/* tests/safetensors/test_npy.c: core/npy.h round trips, files written by NumPy (committed
 * fixtures from gen_npy_fixtures.py), and malformed headers.  All comparisons are exact:
 * .npy stores raw bytes, nothing is converted. */
#include <sys/stat.h>
#include <unistd.h>

#include "core/npy.h"
#include "tests/test.h"

static char tmpdir[512];

static const char *tmp_path(const char *name) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
    return b;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    if (n) fwrite(p, 1, n, f);
    fclose(f);
}

static const char *fixture(const char *name) {
    static char rel[256];
    snprintf(rel, sizeof rel, "tests/safetensors/fixtures/%s.npy", name);
    return test_src_path(rel);
}

static void test_numpy_fixtures(void) {
    arl_npy a;
    CHECK(arl_npy_read(fixture("f32_2x3"), &a) == ARL_OK);
    CHECK_EQ_INT(a.dtype, ARL_DTYPE_F32);
    CHECK_EQ_INT(a.rank, 2);
    CHECK(a.shape[0] == 2 && a.shape[1] == 3 && a.numel == 6 && a.nbytes == 24);
    for (int i = 0; i < 6; i++)
        CHECK(((float *)a.data)[i] == i * 0.5f - 1.0f);
    arl_npy_free(&a);
    CHECK(a.data == NULL);
    arl_npy_free(&a); /* second free is a no-op */

    CHECK(arl_npy_read(fixture("v2_f32"), &a) == ARL_OK);
    CHECK(a.rank == 2 && a.shape[0] == 2 && a.shape[1] == 3 && a.dtype == ARL_DTYPE_F32);
    for (int i = 0; i < 6; i++)
        CHECK(((float *)a.data)[i] == i * 0.5f - 1.0f);
    arl_npy_free(&a);

    CHECK(arl_npy_read(fixture("f64_3"), &a) == ARL_OK);
    CHECK(a.dtype == ARL_DTYPE_F64 && a.rank == 1 && a.shape[0] == 3);
    double *d = a.data;
    CHECK(d[0] == 1.0 / 3 && d[1] == -2.5e300 && d[2] == 5e-324);
    arl_npy_free(&a);

    CHECK(arl_npy_read(fixture("i4_2x2x2"), &a) == ARL_OK);
    CHECK(a.dtype == ARL_DTYPE_I32 && a.rank == 3 && a.numel == 8);
    for (int i = 0; i < 8; i++)
        CHECK(((int32_t *)a.data)[i] == i * -3 + 7);
    arl_npy_free(&a);

    CHECK(arl_npy_read(fixture("i8_5"), &a) == ARL_OK);
    CHECK(a.dtype == ARL_DTYPE_I64 && a.numel == 5);
    int64_t *q = a.data;
    CHECK(q[0] == 0 && q[1] == -1 && q[2] == (1LL << 40) && q[3] == -(1LL << 62) &&
          q[4] == INT64_MAX);
    arl_npy_free(&a);

    CHECK(arl_npy_read(fixture("u1_4"), &a) == ARL_OK);
    CHECK(a.dtype == ARL_DTYPE_U8 && a.numel == 4);
    CHECK(!memcmp(a.data, "\x00\x01\xc8\xff", 4));
    arl_npy_free(&a);

    CHECK(arl_npy_read(fixture("b1_3"), &a) == ARL_OK);
    CHECK(a.dtype == ARL_DTYPE_BOOL && a.numel == 3);
    CHECK(!memcmp(a.data, "\x01\x00\x01", 3));
    arl_npy_free(&a);

    CHECK(arl_npy_read(fixture("f32_scalar"), &a) == ARL_OK);
    CHECK(a.rank == 0 && a.numel == 1 && *(float *)a.data == 3.25f);
    arl_npy_free(&a);

    CHECK(arl_npy_read(fixture("i8_empty"), &a) == ARL_OK);
    CHECK(a.rank == 2 && a.shape[0] == 0 && a.shape[1] == 3 && a.numel == 0 && a.nbytes == 0);
    CHECK(a.data != NULL);
    arl_npy_free(&a);

    CHECK(arl_npy_read(fixture("fortran"), &a) == ARL_ERR_UNSUPPORTED);
    CHECK(strstr(arl_error_msg(), "Fortran") != NULL);
    CHECK(a.data == NULL && a.rank == 0);
    CHECK(arl_npy_read(fixture("be_f4"), &a) == ARL_ERR_UNSUPPORTED);
    CHECK(strstr(arl_error_msg(), ">f4") != NULL);
}

/* Our writer's output is byte-identical to numpy.save's for the same array. */
static void test_matches_numpy_bytes(void) {
    float v[6];
    for (int i = 0; i < 6; i++)
        v[i] = i * 0.5f - 1.0f;
    int64_t shape[2] = {2, 3};
    CHECK(arl_npy_write(tmp_path("w.npy"), ARL_DTYPE_F32, 2, shape, v) == ARL_OK);
    const char *files[2] = {tmp_path("w.npy"), fixture("f32_2x3")};
    unsigned char buf[2][512];
    size_t n[2];
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(files[k], "rb");
        CHECK(f != NULL);
        n[k] = f ? fread(buf[k], 1, sizeof buf[k], f) : 0;
        if (f) fclose(f);
    }
    CHECK(n[0] == n[1] && !memcmp(buf[0], buf[1], n[0]));

    uint8_t b[3] = {1, 0, 1};
    int64_t s1 = 3;
    CHECK(arl_npy_write(tmp_path("b.npy"), ARL_DTYPE_BOOL, 1, &s1, b) == ARL_OK);
    FILE *f = fopen(tmp_path("b.npy"), "rb"), *g = fopen(fixture("b1_3"), "rb");
    CHECK(f && g);
    if (f && g) {
        n[0] = fread(buf[0], 1, 512, f);
        n[1] = fread(buf[1], 1, 512, g);
        CHECK(n[0] == n[1] && !memcmp(buf[0], buf[1], n[0]));
    }
    if (f) fclose(f);
    if (g) fclose(g);
}

static void test_round_trip(void) {
    static const arl_dtype dts[] = {ARL_DTYPE_F32, ARL_DTYPE_F64, ARL_DTYPE_F16, ARL_DTYPE_I32,
                                    ARL_DTYPE_I64, ARL_DTYPE_I16, ARL_DTYPE_U16, ARL_DTYPE_U32,
                                    ARL_DTYPE_U64, ARL_DTYPE_U8,  ARL_DTYPE_I8,  ARL_DTYPE_BOOL};
    static const int64_t shapes[][4] = {{0}, {7}, {2, 3}, {2, 1, 3, 2}, {0, 4}, {1}};
    static const int32_t ranks[] = {0, 1, 2, 4, 2, 1};
    unsigned char data[8 * 64];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 37 + 11);
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++)
        for (size_t si = 0; si < sizeof ranks / sizeof ranks[0]; si++) {
            const char *p = tmp_path("rt.npy");
            CHECK(arl_npy_write(p, dts[di], ranks[si], shapes[si], data) == ARL_OK);
            arl_npy a;
            arl_status s = arl_npy_read(p, &a);
            CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
            if (s != ARL_OK) continue;
            CHECK_EQ_INT(a.dtype, dts[di]);
            CHECK_EQ_INT(a.rank, ranks[si]);
            int64_t numel = 1;
            for (int r = 0; r < ranks[si]; r++) {
                CHECK_EQ_INT(a.shape[r], shapes[si][r]);
                numel *= shapes[si][r];
            }
            CHECK_EQ_INT(a.numel, numel);
            CHECK(!memcmp(a.data, data, (size_t)a.nbytes));
            arl_npy_free(&a);
        }
    /* header is 64-byte aligned */
    struct stat st;
    int64_t s7 = 7;
    CHECK(arl_npy_write(tmp_path("a.npy"), ARL_DTYPE_I64, 1, &s7, data) == ARL_OK);
    CHECK(stat(tmp_path("a.npy"), &st) == 0 && (st.st_size - 56) % 64 == 0);
    /* rank 32 (max) header still fits version 1.0 */
    int64_t big[ARL_NPY_MAX_RANK];
    for (int i = 0; i < ARL_NPY_MAX_RANK; i++)
        big[i] = 1;
    CHECK(arl_npy_write(tmp_path("r32.npy"), ARL_DTYPE_F32, ARL_NPY_MAX_RANK, big, data) == ARL_OK);
    arl_npy a;
    CHECK(arl_npy_read(tmp_path("r32.npy"), &a) == ARL_OK && a.rank == ARL_NPY_MAX_RANK);
    arl_npy_free(&a);
    /* unsupported dtype and bad args */
    CHECK(arl_npy_write(tmp_path("x.npy"), ARL_DTYPE_BF16, 1, &s7, data) == ARL_ERR_UNSUPPORTED);
    int64_t neg = -1;
    CHECK(arl_npy_write(tmp_path("x.npy"), ARL_DTYPE_F32, 1, &neg, data) == ARL_ERR_ARG);
    CHECK(arl_npy_write(tmp_path("x.npy"), ARL_DTYPE_F32, 33, big, data) == ARL_ERR_ARG);
    CHECK(access(tmp_path("x.npy"), F_OK) != 0);
    /* unwritable directory */
    CHECK(arl_npy_write("/nonexistent-dir/x.npy", ARL_DTYPE_F32, 1, &s7, data) == ARL_ERR_IO);
}

/* Build a v1.0 file with the given dict text (padded to 64) and n data bytes. */
static size_t make_npy(unsigned char *out, const char *dict, size_t ndata) {
    size_t k = strlen(dict), total = (10 + k + 1 + 63) & ~(size_t)63, hl = total - 10;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (unsigned char)hl;
    out[9] = (unsigned char)(hl >> 8);
    memcpy(out + 10, dict, k);
    memset(out + 10 + k, ' ', hl - k - 1);
    out[total - 1] = '\n';
    memset(out + total, 0, ndata);
    return total + ndata;
}

static void expect_bad(const void *buf, size_t n, arl_status want, const char *needle) {
    arl_npy a;
    memset(&a, 0x55, sizeof a);
    arl_status s = arl_npy_read_mem(buf, n, "bad.npy", &a);
    CHECK_MSG(s == want, "got %s (%s), want %s; needle '%s'", arl_status_str(s), arl_error_msg(),
              arl_status_str(want), needle);
    CHECK_MSG(strstr(arl_error_msg(), needle) && strstr(arl_error_msg(), "bad.npy"),
              "message '%s' lacks '%s'", arl_error_msg(), needle);
    CHECK(a.data == NULL);
    /* the same through the file reader */
    write_bytes(tmp_path("bad.npy"), buf, n);
    s = arl_npy_read(tmp_path("bad.npy"), &a);
    CHECK_MSG(s == want, "file: got %s (%s)", arl_status_str(s), arl_error_msg());
    CHECK(a.data == NULL);
}

static void test_malformed(void) {
    unsigned char b[1024];
    size_t n;
    const char *good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    n = make_npy(b, good, 24);
    arl_npy a;
    CHECK(arl_npy_read_mem(b, n, "ok", &a) == ARL_OK && a.numel == 6);
    arl_npy_free(&a);

    expect_bad(b, 5, ARL_ERR_FORMAT, "truncated");
    expect_bad(b, 0, ARL_ERR_FORMAT, "truncated");
    expect_bad(b, 40, ARL_ERR_FORMAT, "truncated");  /* inside the header */
    expect_bad(b, n - 1, ARL_ERR_FORMAT, "need 24"); /* data short by a byte */
    b[n] = 0;
    expect_bad(b, n + 1, ARL_ERR_FORMAT, "need 24"); /* trailing byte */
    unsigned char c[1024];
    memcpy(c, b, n);
    c[1] = 'X';
    expect_bad(c, n, ARL_ERR_FORMAT, "magic");
    memcpy(c, b, n);
    c[6] = 9;
    expect_bad(c, n, ARL_ERR_VERSION, "9.0");
    memcpy(c, b, n);
    c[8] = 0xff;
    c[9] = 0xff; /* header length 65535 > file */
    expect_bad(c, n, ARL_ERR_FORMAT, "truncated");
    /* version 2 with an absurd 32-bit header length */
    memcpy(c, "\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12);
    expect_bad(c, 64, ARL_ERR_FORMAT, "above the limit");

    struct {
        const char *dict;
        size_t ndata;
        arl_status want;
        const char *needle;
    } cases[] = {
        {"['descr', '<f4']", 0, ARL_ERR_FORMAT, "not a dict"},
        {"{'descr': '<f4', 'fortran_order': False}", 0, ARL_ERR_FORMAT, "lacks key 'shape'"},
        {"{'descr': '<f4', 'shape': (2,), }", 8, ARL_ERR_FORMAT, "lacks key 'fortran_order'"},
        {"{'fortran_order': False, 'shape': (2,), }", 8, ARL_ERR_FORMAT, "lacks key 'descr'"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8, ARL_ERR_FORMAT,
         "unexpected key 'x'"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8,
         ARL_ERR_FORMAT, "twice"},
        {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,)}", 8, ARL_ERR_FORMAT,
         "fortran_order"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [2]}", 8, ARL_ERR_FORMAT,
         "not a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", 8, ARL_ERR_FORMAT,
         "non-negative"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", 8, ARL_ERR_FORMAT,
         "malformed"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,", 8, ARL_ERR_FORMAT, "shape"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", 8,
         ARL_ERR_FORMAT, "too large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", 8,
         ARL_ERR_FORMAT, "too large"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} x", 8, ARL_ERR_FORMAT,
         "after the dict"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", 8, ARL_ERR_FORMAT, "header"},
        {"{'descr': '<c8', 'fortran_order': False, 'shape': (2,)}", 16, ARL_ERR_UNSUPPORTED, "<c8"},
        {"{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", 8, ARL_ERR_UNSUPPORTED,
         "structured"},
        {"{'descr': '|O', 'fortran_order': False, 'shape': (2,)}", 16, ARL_ERR_UNSUPPORTED, "|O"},
        {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2)}", 16, ARL_ERR_UNSUPPORTED,
         "Fortran"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
         "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1)}",
         4, ARL_ERR_UNSUPPORTED, "rank"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 4, ARL_ERR_FORMAT, "need 8"},
        {"{'descr': '<i8', 'fortran_order': False, 'shape': (3L, 2L), }", 48, ARL_OK, ""},
        {"{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": ()}", 8, ARL_OK, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        n = make_npy(b, cases[i].dict, cases[i].ndata);
        if (cases[i].want == ARL_OK) {
            arl_status s = arl_npy_read_mem(b, n, "ok.npy", &a);
            CHECK_MSG(s == ARL_OK, "case %zu: %s", i, arl_error_msg());
            arl_npy_free(&a);
        } else {
            expect_bad(b, n, cases[i].want, cases[i].needle);
        }
    }
    /* missing file */
    CHECK(arl_npy_read(tmp_path("missing.npy"), &a) == ARL_ERR_NOT_FOUND);
    CHECK(strstr(arl_error_msg(), "missing.npy") != NULL);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s", test_tmpdir("npy"));
    TEST_RUN(test_numpy_fixtures);
    TEST_RUN(test_matches_numpy_bytes);
    TEST_RUN(test_round_trip);
    TEST_RUN(test_malformed);
    int rc = test_finish();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (!rc && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
