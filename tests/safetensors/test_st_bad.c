/* tests/safetensors/test_st_bad.c: malformed safetensors files and checkpoint directories.
 *
 * Each corrupted input is generated here, in a temp dir, and must give the expected status
 * with a message naming the file (and the tensor where there is one) -- never a crash.
 * Every case runs through both arl_st_file_open (mmap path) and arl_st_file_open_mem.
 * Then every truncation of a valid file and a few thousand random byte mutations must
 * return a status without crashing (run this under -DAGENTRL_SANITIZE=ON too). */
#include <sys/stat.h>
#include <unistd.h>

#include "core/rng.h"
#include "policy/safetensors.h"
#include "tests/test.h"

static char tmpdir[512];

static const char *tmp_path(const char *name) {
    static char buf[8][1024];
    static int k;
    char *b = buf[k++ % 8];
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

/* 8-byte length (of the header text unless hl_override != UINT64_MAX), header, ndata bytes. */
static size_t make_st(unsigned char *out, const char *hdr, uint64_t hl_override, size_t ndata) {
    uint64_t hl = strlen(hdr);
    uint64_t put = hl_override != UINT64_MAX ? hl_override : hl;
    memcpy(out, &put, 8);
    memcpy(out + 8, hdr, hl);
    for (size_t i = 0; i < ndata; i++)
        out[8 + hl + i] = (unsigned char)i;
    return 8 + hl + ndata;
}

static void expect_bad_buf(const unsigned char *buf, size_t n, arl_status want, const char *needle1,
                           const char *needle2) {
    const char *path = tmp_path("bad.safetensors");
    write_bytes(path, buf, n);
    for (int mode = 0; mode < 2; mode++) {
        arl_st_file *f = (arl_st_file *)1;
        arl_status s = mode == 0 ? arl_st_file_open(path, &f)
                                 : arl_st_file_open_mem(buf, n, "mem:bad.safetensors", &f);
        const char *m = arl_error_msg();
        CHECK_MSG(s == want, "%s: got %s (%s), want %s", mode ? "mem" : "file", arl_status_str(s),
                  m, arl_status_str(want));
        CHECK(f == NULL);
        CHECK_MSG(strstr(m, "bad.safetensors") != NULL, "message lacks the file: %s", m);
        CHECK_MSG(!needle1 || strstr(m, needle1), "message lacks '%s': %s", needle1, m);
        CHECK_MSG(!needle2 || strstr(m, needle2), "message lacks '%s': %s", needle2, m);
        if (s == ARL_OK) arl_st_file_close(f);
    }
}

static void expect_bad(const char *hdr, size_t ndata, arl_status want, const char *n1,
                       const char *n2) {
    static unsigned char buf[1 << 16];
    size_t n = make_st(buf, hdr, UINT64_MAX, ndata);
    expect_bad_buf(buf, n, want, n1, n2);
}

#define ENT(name, dt, shape, b, e)                                                                 \
    "\"" name "\":{\"dtype\":\"" dt "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void test_bad_files(void) {
    unsigned char buf[4096];
    size_t n;
    /* sanity: the generator makes a valid file */
    n = make_st(buf, "{" ENT("w", "F32", "[2]", 0, 8) "}", UINT64_MAX, 8);
    arl_st_file *f;
    CHECK(arl_st_file_open_mem(buf, n, "ok", &f) == ARL_OK);
    arl_st_file_close(f);

    /* truncated files and header lengths */
    expect_bad_buf(buf, 0, ARL_ERR_FORMAT, "truncated", NULL);
    expect_bad_buf(buf, 5, ARL_ERR_FORMAT, "truncated", NULL);
    expect_bad_buf(buf, n - 1, ARL_ERR_FORMAT, "'w'", "past the end");
    expect_bad_buf(buf, 20, ARL_ERR_FORMAT, "larger than the file", NULL);
    n = make_st(buf, "{}", 1000, 0);
    expect_bad_buf(buf, n, ARL_ERR_FORMAT, "larger than the file", NULL);
    n = make_st(buf, "{}", (uint64_t)1 << 40, 0);
    expect_bad_buf(buf, n, ARL_ERR_FORMAT, "above the limit", NULL);
    n = make_st(buf, "{}", UINT64_MAX - 1, 0);
    expect_bad_buf(buf, n, ARL_ERR_FORMAT, "above the limit", NULL);
    n = make_st(buf, "{}", 0, 0);
    expect_bad_buf(buf, n, ARL_ERR_FORMAT, "too small", NULL);

    /* header JSON */
    expect_bad("hello", 0, ARL_ERR_FORMAT, "not valid JSON", NULL);
    expect_bad("{\"a\":", 0, ARL_ERR_FORMAT, "not valid JSON", NULL);
    expect_bad("[1, 2]", 0, ARL_ERR_FORMAT, "not an object", NULL);
    expect_bad("\"str\"", 0, ARL_ERR_FORMAT, "not", NULL);
    expect_bad("{}  x", 0, ARL_ERR_FORMAT, "not valid JSON", NULL);
    expect_bad("{\"a\\u0000b\":{}}", 0, ARL_ERR_FORMAT, "not valid JSON", NULL);
    n = make_st(buf, "{}", UINT64_MAX, 0);
    buf[9] = 0; /* NUL byte inside the header */
    expect_bad_buf(buf, n, ARL_ERR_FORMAT, "not valid JSON", NULL);
    expect_bad("{" ENT("w", "F32", "[2]", 0, 8) "," ENT("w", "F32", "[2]", 8, 16) "}", 16,
               ARL_ERR_FORMAT, "duplicate", NULL);

    /* entries */
    expect_bad("{\"w\": 5}", 0, ARL_ERR_FORMAT, "'w'", "not a JSON object");
    expect_bad("{\"w\": {\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ARL_ERR_FORMAT, "'w'",
               "lacks field 'dtype'");
    expect_bad("{\"w\": {\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, ARL_ERR_FORMAT, "'w'",
               "lacks field 'shape'");
    expect_bad("{\"w\": {\"dtype\":\"F32\",\"shape\":[1]}}", 4, ARL_ERR_FORMAT, "'w'",
               "lacks field 'data_offsets'");
    expect_bad("{\"w\": {\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, ARL_ERR_FORMAT,
               "'w'", "'dtype' is not a string");
    expect_bad("{" ENT("w", "F33", "[1]", 0, 4) "}", 4, ARL_ERR_FORMAT, "'w'",
               "unknown dtype 'F33'");
    expect_bad("{" ENT("w", "f32", "[1]", 0, 4) "}", 4, ARL_ERR_FORMAT, "'w'", "unknown dtype");
    expect_bad("{" ENT("w", "F32", "3", 0, 12) "}", 12, ARL_ERR_FORMAT, "'w'", "not an array");
    expect_bad("{" ENT("w", "F32", "[-1]", 0, 0) "}", 0, ARL_ERR_FORMAT, "'w'",
               "shape[0] is not a non-negative integer");
    expect_bad("{" ENT("w", "F32", "[2.5]", 0, 10) "}", 10, ARL_ERR_FORMAT, "'w'",
               "non-negative integer");
    expect_bad("{" ENT("w", "F32", "[1, \"2\"]", 0, 8) "}", 8, ARL_ERR_FORMAT, "'w'", "shape[1]");
    expect_bad("{" ENT("w", "F32", "[4611686018427387904, 4611686018427387904]", 0, 0) "}", 0,
               ARL_ERR_FORMAT, "'w'", "too large");
    expect_bad("{" ENT("w", "F64", "[2305843009213693952]", 0, 0) "}", 0, ARL_ERR_FORMAT, "'w'",
               "too large");
    expect_bad("{" ENT("w", "F32", "[99999999999999999999999]", 0, 0) "}", 0, ARL_ERR_FORMAT,
               "not valid JSON", NULL); /* jansson: integer too big */
    expect_bad("{" ENT("w", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, ARL_ERR_UNSUPPORTED, "'w'",
               "rank 9");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, ARL_ERR_FORMAT,
               "'w'", "two integers");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8,
               ARL_ERR_FORMAT, "'w'", "two integers");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4.0]}}", 4,
               ARL_ERR_FORMAT, "'w'", "two integers");
    expect_bad("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{}}}", 4, ARL_ERR_FORMAT,
               "'w'", "two integers");
    expect_bad("{" ENT("w", "F32", "[1]", -4, 0) "}", 4, ARL_ERR_FORMAT, "'w'", "negative");
    expect_bad("{" ENT("w", "F32", "[1]", 8, 4) "}", 8, ARL_ERR_FORMAT, "'w'", "begin > end");
    expect_bad("{" ENT("w", "F32", "[1]", 4, 8) "}", 7, ARL_ERR_FORMAT, "'w'", "past the end");
    expect_bad("{" ENT("w", "F32", "[1]", 9223372036854775800, 9223372036854775804) "}", 8,
               ARL_ERR_FORMAT, "'w'", "past the end");
    expect_bad("{" ENT("w", "F32", "[2, 3]", 0, 20) "}", 24, ARL_ERR_FORMAT, "'w'",
               "shape [2, 3] of F32 needs 24");
    expect_bad("{" ENT("w", "BF16", "[]", 0, 4) "}", 4, ARL_ERR_FORMAT, "'w'", "needs 2");
    expect_bad("{" ENT("a", "F32", "[2]", 0, 8) "," ENT("b", "F32", "[2]", 4, 12) "}", 12,
               ARL_ERR_FORMAT, "overlapping", "'b'");
    expect_bad("{" ENT("a", "U8", "[16]", 0, 16) "," ENT("b", "U8", "[4]", 4,
                                                         8) "," ENT("c", "U8", "[4]", 8, 12) "}",
               16, ARL_ERR_FORMAT, "overlapping", "'a'");
    expect_bad("{" ENT("a", "U8", "[4]", 0, 4) "," ENT("b", "U8", "[4]", 0, 4) "}", 4,
               ARL_ERR_FORMAT, "overlapping", NULL);
    expect_bad("{" ENT("", "U8", "[4]", 0, 4) "}", 4, ARL_ERR_FORMAT, "empty name", NULL);
    expect_bad("{\"__metadata__\": [1]}", 0, ARL_ERR_FORMAT, "__metadata__", NULL);
    expect_bad("{\"__metadata__\": {\"k\": 1}}", 0, ARL_ERR_FORMAT, "__metadata__", "'k'");
    expect_bad("{\"__metadata__\": {\"k\": \"v\"}, \"__metadata__\": {}}", 0, ARL_ERR_FORMAT,
               "duplicate", NULL);

    /* valid corner cases: empty tensors may share an offset with anything; adjacency is fine */
    n = make_st(buf,
                "{" ENT("a", "U8", "[4]", 0, 4) "," ENT("e", "F32", "[0, 7]", 2, 2) "," ENT(
                    "b", "U8", "[4]", 4, 8) "," ENT("s", "BOOL", "[]", 8, 9) "}",
                UINT64_MAX, 9);
    arl_status s = arl_st_file_open_mem(buf, n, "ok", &f);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK(f && arl_st_file_count(f) == 4);
    arl_st_file_close(f);
    /* a directory or missing path */
    CHECK(arl_st_file_open(tmpdir, &f) == ARL_ERR_IO && !f);
    CHECK(arl_st_file_open(tmp_path("missing.safetensors"), &f) == ARL_ERR_NOT_FOUND && !f);
    CHECK(strstr(arl_error_msg(), "missing.safetensors") != NULL);
}

/* Every prefix of a valid file, and random mutations, must fail cleanly or parse. */
static void test_truncations_and_mutations(void) {
    static unsigned char buf[4096], mut[4096];
    size_t n =
        make_st(buf,
                "{\"__metadata__\":{\"format\":\"pt\"}," ENT("a", "F32", "[2, 2]", 0, 16) "," ENT(
                    "b", "BF16", "[3]", 16, 22) "," ENT("c", "I64", "[]", 24, 32) "}",
                UINT64_MAX, 32);
    arl_st_file *f;
    CHECK(arl_st_file_open_mem(buf, n, "ok", &f) == ARL_OK);
    arl_st_file_close(f);
    for (size_t len = 0; len < n; len++) {
        /* heap copy of exactly len bytes so that ASan sees any over-read */
        unsigned char *p = malloc(len ? len : 1);
        memcpy(p, buf, len);
        arl_status s = arl_st_file_open_mem(p, len, "trunc", &f);
        CHECK_MSG(s != ARL_OK || len >= n - 0, "prefix of %zu bytes accepted", len);
        arl_st_file_close(f);
        free(p);
    }
    arl_rng r;
    arl_rng_seed(&r, 1234);
    int accepted = 0;
    for (int it = 0; it < 4000; it++) {
        memcpy(mut, buf, n);
        int k = 1 + (int)arl_rng_below(&r, 4);
        for (int j = 0; j < k; j++) {
            size_t at = (size_t)arl_rng_below(&r, n);
            static const char pool[] = "0123456789[]{}\",:-. eE\x00\xff\x80";
            mut[at] = arl_rng_below(&r, 2)
                          ? (unsigned char)arl_rng_next(&r)
                          : (unsigned char)pool[arl_rng_below(&r, sizeof pool - 1)];
        }
        size_t len = n - (size_t)arl_rng_below(&r, 3);
        unsigned char *p = malloc(len);
        memcpy(p, mut, len);
        if (arl_st_file_open_mem(p, len, "mut", &f) == ARL_OK) {
            accepted++;
            /* whatever was accepted must be readable in bounds */
            for (int64_t i = 0; i < arl_st_file_count(f); i++) {
                const arl_st_tensor *t = arl_st_file_tensor(f, i);
                float *tmp = malloc((size_t)t->numel * sizeof(float) + 1);
                CHECK(t->offset + t->nbytes <= len);
                CHECK(arl_st_tensor_read_f32(t, tmp, t->numel) == ARL_OK);
                free(tmp);
            }
        }
        arl_st_file_close(f);
        free(p);
    }
    fprintf(stderr, "  mutations: %d of 4000 still valid files\n", accepted);
}

static void write_text(const char *path, const char *text) {
    write_bytes(path, text, strlen(text));
}

static void make_shard(const char *path, const char *hdr, size_t ndata) {
    static unsigned char buf[4096];
    size_t n = make_st(buf, hdr, UINT64_MAX, ndata);
    write_bytes(path, buf, n);
}

static void expect_dir_bad(const char *dir, arl_status want, const char *n1, const char *n2) {
    arl_st_dir *d = (arl_st_dir *)1;
    arl_status s = arl_st_dir_open(dir, &d);
    const char *m = arl_error_msg();
    CHECK_MSG(s == want, "got %s (%s), want %s", arl_status_str(s), m, arl_status_str(want));
    CHECK(d == NULL);
    CHECK_MSG(!n1 || strstr(m, n1), "message lacks '%s': %s", n1, m);
    CHECK_MSG(!n2 || strstr(m, n2), "message lacks '%s': %s", n2, m);
    if (s == ARL_OK) arl_st_dir_close(d);
}

static void test_bad_dirs(void) {
    char dir[1024], p[1100], idx[1100];
    snprintf(dir, sizeof dir, "%s/d", tmpdir);
    mkdir(dir, 0755);
    snprintf(idx, sizeof idx, "%s/" ARL_ST_INDEX_NAME, dir);
    expect_dir_bad(dir, ARL_ERR_NOT_FOUND, "neither", NULL);
    expect_dir_bad(tmp_path("no-such-dir"), ARL_ERR_NOT_FOUND, "no-such-dir", NULL);

    snprintf(p, sizeof p, "%s/s1.safetensors", dir);
    make_shard(p, "{" ENT("a", "U8", "[4]", 0, 4) "," ENT("b", "U8", "[4]", 4, 8) "}", 8);
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    make_shard(p, "{" ENT("c", "U8", "[4]", 0, 4) "}", 4);

    /* valid first */
    write_text(idx, "{\"metadata\":{\"total_size\":12},\"weight_map\":{\"a\":\"s1.safetensors\","
                    "\"b\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}");
    arl_st_dir *d;
    arl_status s = arl_st_dir_open(dir, &d);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    CHECK(d && arl_st_dir_count(d) == 3 && arl_st_dir_shard_count(d) == 2);
    arl_st_dir_close(d);

    write_text(idx, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                    "\"c\":\"s3.safetensors\"}}");
    expect_dir_bad(dir, ARL_ERR_NOT_FOUND, "s3.safetensors", "does not exist");
    write_text(idx, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                    "\"c\":\"s2.safetensors\",\"x\":\"s2.safetensors\"}}");
    expect_dir_bad(dir, ARL_ERR_FORMAT, "'x'", "does not hold it");
    write_text(idx, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"c\":\"s2.safetensors\"}}");
    expect_dir_bad(dir, ARL_ERR_FORMAT, "'b'", "not listed");
    write_text(idx, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                    "\"c\":\"../s2.safetensors\"}}");
    expect_dir_bad(dir, ARL_ERR_FORMAT, "'c'", "file name");
    write_text(idx, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                    "\"c\":5}}");
    expect_dir_bad(dir, ARL_ERR_FORMAT, "'c'", NULL);
    write_text(idx, "{\"weight_map\":[]}");
    expect_dir_bad(dir, ARL_ERR_FORMAT, "weight_map", NULL);
    write_text(idx, "{\"metadata\":5,\"weight_map\":{}}");
    expect_dir_bad(dir, ARL_ERR_FORMAT, "metadata", NULL);
    write_text(idx, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"a\":\"s1.safetensors\"}}");
    expect_dir_bad(dir, ARL_ERR_FORMAT, "not valid JSON", NULL);
    write_text(idx, "not json");
    expect_dir_bad(dir, ARL_ERR_FORMAT, "model.safetensors.index.json", "not valid JSON");

    /* a tensor present in two shards */
    snprintf(p, sizeof p, "%s/s2.safetensors", dir);
    make_shard(p, "{" ENT("c", "U8", "[4]", 0, 4) "," ENT("a", "U8", "[4]", 4, 8) "}", 8);
    write_text(idx, "{\"weight_map\":{\"a\":\"s1.safetensors\",\"b\":\"s1.safetensors\","
                    "\"c\":\"s2.safetensors\"}}");
    expect_dir_bad(dir, ARL_ERR_FORMAT, "'a'", "two shards");
    /* an invalid shard: the message names the shard */
    make_shard(p, "{" ENT("c", "U8", "[4]", 0, 9) "}", 9);
    expect_dir_bad(dir, ARL_ERR_FORMAT, "s2.safetensors", "'c'");
    /* a single model.safetensors that is corrupt */
    unlink(idx);
    snprintf(p, sizeof p, "%s/" ARL_ST_SINGLE_NAME, dir);
    write_text(p, "garbage!garbage!");
    expect_dir_bad(dir, ARL_ERR_FORMAT, ARL_ST_SINGLE_NAME, NULL);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "%s", test_tmpdir("stbad"));
    TEST_RUN(test_bad_files);
    TEST_RUN(test_truncations_and_mutations);
    TEST_RUN(test_bad_dirs);
    int rc = test_finish();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (!rc && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
