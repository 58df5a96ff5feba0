/* tests/envs_builtin/test_needle_large.c: the needle environment at a million tokens: reset
 * is instant (the document is never materialised), reads at far offsets return the right
 * bytes without memory proportional to the document, a search over the whole document is
 * fast, and both teachers succeed (the scan teacher reads all of it: a million-token
 * trajectory); read's defaults (the cursor) on a small document.  Time limits are generous bounds for a loaded 2-core CI machine, stated
 * where they are checked. */
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "tests/envs_builtin/drive.h"
#include "tests/test.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static long maxrss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

#define TOKENS "1000000"
#define LINES 62500        /* ceil(1e6 / 16) */
#define BYTES (64 * LINES) /* 4,000,000 */

static char read_buf[65536 + 1];

/* read(off, len) as one step; copies the text into read_buf; returns its length. */
static size_t do_read(drv *d, int64_t off, int64_t len) {
    char act[256];
    snprintf(act, sizeof act,
             "{\"tool_calls\": [{\"id\": \"r\", \"name\": \"read\", "
             "\"arguments\": {\"offset\": %lld, \"length\": %lld}}]}",
             (long long)off, (long long)len);
    if (drv_step_json(d, act) != ARL_OK) return 0;
    snprintf(read_buf, sizeof read_buf, "%s", drv_text(d, 0));
    return strlen(read_buf);
}

static void test_large_reads(void) {
    drv d;
    double t0 = now_s();
    CHECK_EQ_INT(
        drv_open(&d, "needle", 77, NULL, "{\"doc_tokens\": " TOKENS ", \"max_read\": 65536}"),
        ARL_OK);
    double t_reset = now_s() - t0;
    CHECK_MSG(t_reset < 0.05, "reset took %.3f s", t_reset); /* no document is built */
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"o\", \"name\": \"open\", "
                                   "\"arguments\": {}}]}"),
                 ARL_OK);
    CHECK(strstr(drv_text(&d, 0), "4000000 bytes in 62500 lines") != NULL);
    long rss0 = maxrss_kib();
    /* far reads: the last line is the question; reads agree with each other at any split */
    CHECK_EQ_INT(do_read(&d, BYTES - 64, 64), 64);
    CHECK(!strncmp(read_buf, "QUESTION: What is the code of vault ", 36));
    t0 = now_s();
    static char big[65537];
    for (int i = 0; i < 40; i++) {
        int64_t off = (int64_t)((uint64_t)i * 2654435761u % (BYTES - 70000));
        size_t n = do_read(&d, off, 65536);
        CHECK_EQ_INT(n, 65536);
        memcpy(big, read_buf, n);
        /* the same bytes in two pieces split at an odd place */
        size_t a = do_read(&d, off, 12345);
        CHECK(a == 12345 && !memcmp(big, read_buf, a));
        size_t b = do_read(&d, off + 12345, 65536 - 12345);
        CHECK(b == 65536 - 12345 && !memcmp(big + 12345, read_buf, b));
        /* lines are 64 bytes wide: every '\n' sits at offset 63 mod 64 */
        for (size_t k = 0; k < n; k++)
            if (big[k] == '\n' && (off + (int64_t)k) % 64 != 63) {
                CHECK_MSG(0, "newline at offset %lld", (long long)(off + (int64_t)k));
                break;
            }
    }
    double t_reads = now_s() - t0;
    /* 120 reads, 4 MiB of generated text: ~0.1 s here; 3 s allows a slow, shared machine */
    CHECK_MSG(t_reads < 3.0, "120 reads took %.2f s", t_reads);
    /* the document is 4 MB: memory for reading it must not grow by anything close.  Under
     * AddressSanitizer freed buffers stay in quarantine (about 15 MB here), so the bound only
     * holds in plain builds. */
    long grow = maxrss_kib() - rss0;
#ifndef ARL_SANITIZE
    CHECK_MSG(grow < 1024, "max RSS grew by %ld KiB while reading", grow);
#endif
    /* a search over the whole document */
    json_t *dbg = d.b->def->ops->debug_state(d.inst, d.state);
    char act[256];
    snprintf(act, sizeof act,
             "{\"tool_calls\": [{\"id\": \"s\", \"name\": \"search\", "
             "\"arguments\": {\"pattern\": \"%s\"}}]}",
             json_string_value(json_object_get(dbg, "key")));
    t0 = now_s();
    CHECK_EQ_INT(drv_step_json(&d, act), ARL_OK);
    double t_search = now_s() - t0;
    /* 62500 lines generated and scanned: ~30 ms here; 2 s for a slow machine */
    CHECK_MSG(t_search < 2.0, "search took %.2f s", t_search);
    CHECK(strstr(drv_text(&d, 0), "2 matching lines") != NULL); /* the fact and the question */
    int64_t tl = json_integer_value(json_object_get(dbg, "target_line"));
    CHECK(tl >= 1 && tl <= 1 + (LINES - 2) / 10);
    char off[64];
    snprintf(off, sizeof off, "offset %lld: The code of vault", (long long)(tl * 64));
    CHECK(strstr(drv_text(&d, 0), off) != NULL);
    fprintf(stderr,
            "  1M tokens: reset %.4f s, 120 reads of <= 64 KiB %.3f s, search %.3f s, "
            "RSS growth %ld KiB\n",
            t_reset, t_reads, t_search, grow);
    json_decref(dbg);
    drv_close(&d);
}

static void test_large_teachers(void) {
    int64_t steps = 0;
    double t0 = now_s();
    double o = drv_teacher_episode("needle", 5, NULL, "{\"doc_tokens\": " TOKENS "}", NULL, &steps);
    CHECK_CLOSE(o, 1, 0, 0);
    CHECK_EQ_INT(steps, 4);
    o = drv_teacher_episode("needle", 6, NULL, "{\"doc_tokens\": " TOKENS ", \"hops\": 2}", NULL,
                            &steps);
    CHECK_CLOSE(o, 1, 0, 0);
    CHECK_EQ_INT(steps, 5);
    double t_search = now_s() - t0;
    /* the scan teacher reads every byte: 62 reads of 64 KiB, then the answer */
    t0 = now_s();
    o = drv_teacher_episode("needle", 7, NULL,
                            "{\"doc_tokens\": " TOKENS ", \"teacher\": \"scan\", "
                            "\"max_read\": 65536}",
                            NULL, &steps);
    double t_scan = now_s() - t0;
    CHECK_CLOSE(o, 1, 0, 0);
    CHECK_EQ_INT(steps, 1 + (BYTES + 65535) / 65536 + 1);
    CHECK_MSG(t_scan < 5.0, "scan episode took %.2f s", t_scan); /* ~0.1 s here */
    fprintf(stderr, "  1M tokens: search teachers %.3f s, scan teacher %lld steps %.3f s\n",
            t_search, (long long)steps, t_scan);
}

/* read's optional arguments (the cursor): read({}) continues where the previous read ended
 * with max_read bytes, so a scan needs no offsets; an explicit offset moves the cursor; read({})
 * at the end is a runtime error; the scan teacher reads by cursor and still succeeds. */
static void test_cursor_reads(void) {
    /* 8000 doc tokens: 500 lines, 32,000 bytes; max_read 3000: 11 reads, the last of 2000 */
    drv d;
    CHECK_EQ_INT(drv_open(&d, "needle", 11, NULL, "{\"doc_tokens\": 8000, \"max_read\": 3000}"),
                 ARL_OK);
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"o\", \"name\": \"open\", "
                                   "\"arguments\": {}}]}"),
                 ARL_OK);
    static char whole[32000 + 1], scan[32000 + 1];
    CHECK_EQ_INT(do_read(&d, 0, 32000), 3000); /* capped at max_read */
    memcpy(whole, read_buf, 3000);
    for (int64_t off = 3000; off < 32000; off += 3000)
        memcpy(whole + off, read_buf, do_read(&d, off, 3000));
    const char *next = "{\"tool_calls\": [{\"id\": \"r\", \"name\": \"read\", \"arguments\": {}}]}";
    /* the cursor is at the end now: read({}) has nothing left */
    CHECK_EQ_INT(drv_step_json(&d, next), ARL_OK);
    CHECK_STR_EQ(drv_code(&d, 0), "TOOL_RUNTIME_ERROR");
    CHECK(strstr(drv_text(&d, 0), "nothing left to read") != NULL);
    /* back to 0 by an explicit offset (length defaults to max_read), then read on */
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"r\", \"name\": \"read\", "
                                   "\"arguments\": {\"offset\": 0}}]}"),
                 ARL_OK);
    size_t n = strlen(drv_text(&d, 0)), total = n;
    CHECK_EQ_INT(n, 3000);
    memcpy(scan, drv_text(&d, 0), n);
    int reads = 1;
    while (total < 32000 && reads < 20) {
        CHECK_EQ_INT(drv_step_json(&d, next), ARL_OK);
        CHECK_STR_EQ(drv_code(&d, 0), "");
        n = strlen(drv_text(&d, 0));
        CHECK(n == (32000 - total < 3000 ? 32000 - total : 3000));
        memcpy(scan + total, drv_text(&d, 0), n);
        total += n, reads++;
    }
    CHECK_EQ_INT(reads, 11);
    CHECK(total == 32000 && !memcmp(whole, scan, 32000));
    /* a length alone reads from the cursor: after a read of [64, 128) comes [128, 138) */
    CHECK_EQ_INT(do_read(&d, 64, 64), 64);
    CHECK_EQ_INT(drv_step_json(&d, "{\"tool_calls\": [{\"id\": \"r\", \"name\": \"read\", "
                                   "\"arguments\": {\"length\": 10}}]}"),
                 ARL_OK);
    CHECK(strlen(drv_text(&d, 0)) == 10 && !memcmp(drv_text(&d, 0), whole + 128, 10));
    drv_close(&d);
    /* the scan teacher reads by cursor: open, 11 reads, answer; the demo's read calls carry no
     * arguments */
    int64_t steps = 0;
    double o = drv_teacher_episode("needle", 12, NULL,
                                   "{\"doc_tokens\": 8000, \"max_read\": 3000, \"teacher\": "
                                   "\"scan\"}",
                                   NULL, &steps);
    CHECK_CLOSE(o, 1, 0, 0);
    CHECK_EQ_INT(steps, 1 + 11 + 1);
    CHECK_EQ_INT(drv_open(&d, "needle", 12, NULL,
                          "{\"doc_tokens\": 8000, \"max_read\": 3000, \"teacher\": \"scan\"}"),
                 ARL_OK);
    CHECK_EQ_INT(drv_teacher_step(&d), ARL_OK); /* open */
    arl_env_action a;
    memset(&a, 0, sizeof a);
    CHECK_EQ_INT(d.b->teacher(d.inst, d.state, d.steps + 1, &a), ARL_OK);
    CHECK(a.n_tool_calls == 1 && !strcmp(a.tool_calls[0].name, "read") &&
          json_object_size(a.tool_calls[0].arguments) == 0);
    arl_env_action_clear(&a);
    drv_close(&d);
}

/* doc_tokens_min: each task's document size is drawn from [doc_tokens_min, doc_tokens] by its
 * seed (the same seed, the same size); sizes spread over the range; min > max is an error. */
static void test_size_range(void) {
    int64_t lo = 1 << 30, hi = 0;
    for (uint64_t seed = 1; seed <= 40; seed++) {
        int64_t b[2];
        for (int k = 0; k < 2; k++) {
            drv d;
            CHECK_EQ_INT(drv_open(&d, "needle", seed, NULL,
                                  "{\"doc_tokens\": 4096, \"doc_tokens_min\": 1024}"),
                         ARL_OK);
            json_t *dbg = d.b->def->ops->debug_state(d.inst, d.state);
            b[k] = json_integer_value(json_object_get(dbg, "bytes"));
            json_decref(dbg);
            drv_close(&d);
        }
        CHECK_EQ_INT(b[0], b[1]);
        /* 1024..4096 tokens: 64..256 lines of 64 bytes */
        CHECK_MSG(b[0] >= 64 * 64 && b[0] <= 256 * 64, "seed %llu: %lld bytes",
                  (unsigned long long)seed, (long long)b[0]);
        if (b[0] < lo) lo = b[0];
        if (b[0] > hi) hi = b[0];
    }
    CHECK_MSG(lo < 128 * 64 && hi > 192 * 64, "40 sizes within [%lld, %lld] bytes", (long long)lo,
              (long long)hi);
    drv d;
    CHECK(drv_open(&d, "needle", 1, NULL, "{\"doc_tokens\": 1024, \"doc_tokens_min\": 2048}") ==
          ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "doc_tokens_min") != NULL);
    drv_close(&d);
}

int main(void) {
    TEST_RUN(test_size_range);
    TEST_RUN(test_cursor_reads);
    TEST_RUN(test_large_reads);
    TEST_RUN(test_large_teachers);
    return test_finish();
}
