/* tests/envs_builtin/test_needle_large.c: the needle environment at a million tokens: reset
 * is instant (the document is never materialised), reads at far offsets return the right
 * bytes without memory proportional to the document, a search over the whole document is
 * fast, and both teachers succeed (the scan teacher reads all of it: a million-token
 * trajectory).  Time limits are generous bounds for a loaded 2-core CI machine, stated
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

int main(void) {
    TEST_RUN(test_large_reads);
    TEST_RUN(test_large_teachers);
    return test_finish();
}
