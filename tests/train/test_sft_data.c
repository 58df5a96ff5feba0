/* SFT data: index statistics (malformed lines with line numbers, skip vs fail, truncation
 * and drop counting, conversations without loss tokens), packing within the budget with
 * correct labels, epoch coverage, shuffle determinism, exact cursor resume (also through
 * train_state.json), and refusal of a changed file. */
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/rng.h"
#include "experiments/sft_data.h"
#include "policy/chat.h"
#include "policy/train_state.h"
#include "tests/test.h"

static arl_chat_template g_t;

static const char *path_in(const char *dir, const char *name) {
    static char buf[4][1024];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", dir, name);
    return b;
}

static void put_conv(FILE *f, const char *user, const char *assistant) {
    fprintf(f,
            "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
            "\"user\", \"content\": \"%s\"}, {\"role\": \"assistant\", \"content\": \"%s\"}]}\n",
            user, assistant);
}

static void repeat(char *buf, char c, int n) {
    memset(buf, c, (size_t)n);
    buf[n] = 0;
}

/* The mixed file of test_index_stats (10 lines). */
static const char *write_mixed(const char *dir) {
    const char *p = path_in(dir, "data.jsonl");
    FILE *f = fopen(p, "w");
    char big[500];
    put_conv(f, "hi", "hello");                                                  /* 1 ok */
    fprintf(f, "   \n");                                                         /* 2 blank */
    fprintf(f, "{\"messages\": [\n");                                            /* 3 bad JSON */
    put_conv(f, "2+2?", "4");                                                    /* 4 ok */
    fprintf(f, "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}\n"); /* 5 bad role */
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"no answer\"}]}\n"); /* 6 */
    repeat(big, 'z', 400);
    put_conv(f, "long", big); /* 7: > 300 tokens, assistant survives a cut at 300 */
    fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", "
               "\"image_url\": {\"url\": \"data:\", \"width\": 28, \"height\": 28}}]}, "
               "{\"role\": \"assistant\", \"content\": \"a shape\"}]}\n"); /* 8 image */
    /* 9: the teachers' format with tools, a call and its result, and "meta" */
    fprintf(f,
            "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 7 + 5?\"}, {\"role\": "
            "\"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"call_1_0\", \"type\": "
            "\"function\", \"function\": {\"name\": \"calc\", \"arguments\": "
            "\"{\\\"expression\\\":\\\"7 + 5\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": "
            "\"call_1_0\", \"content\": \"12\"}, {\"role\": \"assistant\", \"content\": "
            "\"12\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"calc\", "
            "\"parameters\": {\"type\": \"object\", \"properties\": {\"expression\": {\"type\": "
            "\"string\"}}}}}], \"meta\": {\"env\": \"calculator\", \"outcome\": 1}}\n");
    repeat(big, 'y', 400);
    put_conv(f, big, "cut off"); /* 10: truncation at 300 removes the assistant: no loss */
    fclose(f);
    return p;
}

static void test_index_stats(void) {
    const char *dir = test_tmpdir("sft-data");
    const char *p = write_mixed(dir);
    arl_sft_data_config dc = {300, ARL_SFT_MALFORMED_SKIP, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *d;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_OK);
    const arl_sft_stats *s = arl_sft_data_stats(d);
    CHECK_EQ_INT(s->lines, 10);
    CHECK_EQ_INT(s->blank, 1);
    CHECK_EQ_INT(s->malformed, 3);
    CHECK(s->malformed_line[0] == 3 && s->malformed_line[1] == 5 && s->malformed_line[2] == 8);
    CHECK(strstr(s->first_error, "data.jsonl:3") != NULL);
    CHECK_EQ_INT(s->no_loss, 2); /* lines 6 and 10 */
    CHECK_EQ_INT(s->truncated, 1);
    CHECK_EQ_INT(s->dropped_long, 0);
    CHECK_EQ_INT(s->conversations, 4);
    CHECK_EQ_INT(arl_sft_data_count(d), 4);
    CHECK(arl_sft_data_item_line(d, 0) == 1 && arl_sft_data_item_line(d, 1) == 4 &&
          arl_sft_data_item_line(d, 2) == 7 && arl_sft_data_item_line(d, 3) == 9);
    CHECK_EQ_INT(arl_sft_data_item_tokens(d, 2), 300);
    CHECK_EQ_INT(s->max_tokens, 300);
    int64_t sum = 0;
    for (int64_t i = 0; i < 4; i++)
        sum += arl_sft_data_item_tokens(d, i);
    CHECK_EQ_INT(s->tokens, sum);
    CHECK_EQ_INT(strlen(arl_sft_data_sha256(d)), 64);
    arl_sft_data_close(d);

    /* drop instead of truncate */
    dc.on_long = ARL_SFT_LONG_DROP;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_OK);
    s = arl_sft_data_stats(d);
    CHECK_EQ_INT(s->dropped_long, 2); /* lines 7 and 10 */
    CHECK_EQ_INT(s->truncated, 0);
    CHECK_EQ_INT(s->no_loss, 1);
    CHECK_EQ_INT(s->conversations, 3);
    arl_sft_data_close(d);

    /* fatal: the first malformed line is an error naming file:line */
    dc.on_malformed = ARL_SFT_MALFORMED_FAIL;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_ERR_FORMAT);
    CHECK(d == NULL);
    CHECK(strstr(arl_error_msg(), "data.jsonl:3") != NULL);
    CHECK(strstr(arl_error_msg(), "on-malformed") != NULL);

    CHECK(arl_sft_data_open(path_in(dir, "absent.jsonl"), &dc, &g_t, &d) == ARL_ERR_NOT_FOUND);
    dc.max_seq_tokens = 1;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_ERR_ARG);
}

/* n conversations of pseudo-random lengths; returns the path. */
static const char *write_random(const char *dir, const char *name, int n, uint64_t seed) {
    const char *p = path_in(dir, name);
    FILE *f = fopen(p, "w");
    arl_rng r;
    arl_rng_seed(&r, seed);
    char u[128], a[128];
    for (int i = 0; i < n; i++) {
        int lu = 1 + (int)arl_rng_below(&r, 40), la = 1 + (int)arl_rng_below(&r, 60);
        for (int k = 0; k < lu; k++)
            u[k] = (char)('a' + arl_rng_below(&r, 26));
        u[lu] = 0;
        for (int k = 0; k < la; k++)
            a[k] = (char)('A' + arl_rng_below(&r, 26));
        a[la] = 0;
        put_conv(f, u, a);
    }
    fclose(f);
    return p;
}

/* The i-th line of the file rendered directly (the reference of a packed sequence). */
static void render_line_ref(const char *path, int64_t line, arl_chat_tokens *out) {
    FILE *f = fopen(path, "r");
    char *buf = NULL;
    size_t cap = 0;
    ssize_t got = 0;
    for (int64_t i = 0; i < line; i++)
        got = getline(&buf, &cap, f);
    fclose(f);
    arl_chat_conv c;
    arl_chat_conv_init(&c);
    CHECK(arl_chat_conv_from_json(&c, &g_t, buf, (size_t)got, "ref") == ARL_OK);
    arl_chat_tokens_clear(out);
    CHECK(arl_chat_render(&g_t, &c, 0, out) == ARL_OK);
    arl_chat_conv_free(&c);
    free(buf);
}

static void test_packing(void) {
    const char *dir = test_tmpdir("sft-pack");
    const int N = 60;
    const char *p = write_random(dir, "train.jsonl", N, 1);
    arl_sft_data_config dc = {300, ARL_SFT_MALFORMED_FAIL, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *d;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_OK);
    CHECK_EQ_INT(arl_sft_data_count(d), N);
    arl_sft_batch b;
    CHECK(arl_sft_batch_init(&b, 300) == ARL_OK);
    CHECK(arl_sft_data_next_batch(d, &(arl_data_cursor){0}, 1, 300, &b) == ARL_ERR_CONFIG);
    arl_data_cursor c;
    arl_sft_data_cursor_start(d, 5, &c);
    arl_chat_tokens ref;
    arl_chat_tokens_init(&ref);
    for (int64_t epoch = 0; epoch < 2; epoch++) {
        int seen[60] = {0};
        int batches = 0;
        while (c.epoch == epoch) {
            int64_t idx_before = c.index;
            CHECK(arl_sft_data_next_batch(d, &c, 1, 250, &b) == ARL_OK);
            batches++;
            CHECK_EQ_INT(b.epoch, epoch);
            CHECK(b.T <= 250 && b.n_seqs >= 1);
            CHECK_EQ_INT(b.cu_seqlens[0], 0);
            CHECK_EQ_INT(b.cu_seqlens[b.n_seqs], b.T);
            int64_t targets = 0;
            for (int64_t s = 0; s < b.n_seqs; s++) {
                int64_t it = b.item[s];
                CHECK(it >= 0 && it < N);
                seen[it]++;
                render_line_ref(p, arl_sft_data_item_line(d, it), &ref);
                int64_t a = b.cu_seqlens[s], e = b.cu_seqlens[s + 1];
                CHECK_EQ_INT(e - a, (int64_t)ref.n);
                for (int64_t t = a; t < e && (size_t)(t - a) < ref.n; t++) {
                    size_t k = (size_t)(t - a);
                    CHECK(b.ids[t] == ref.ids[k] && b.mask[t] == ref.mask[k]);
                    int32_t want =
                        k + 1 < ref.n && ref.mask[k + 1] ? ref.ids[k + 1] : ARL_SFT_IGNORE;
                    CHECK(b.labels[t] == want);
                    targets += b.labels[t] != ARL_SFT_IGNORE;
                }
            }
            CHECK_EQ_INT(b.n_targets, targets);
            /* greedy: the next conversation of the epoch would not have fit */
            if (c.epoch == epoch) {
                arl_data_cursor peek = c;
                arl_sft_batch nb;
                CHECK(arl_sft_batch_init(&nb, 300) == ARL_OK);
                CHECK(arl_sft_data_next_batch(d, &peek, 1, 250, &nb) == ARL_OK);
                CHECK(b.T + (nb.cu_seqlens[1] - nb.cu_seqlens[0]) > 250);
                arl_sft_batch_free(&nb);
            }
            CHECK(c.epoch > epoch || c.index == idx_before + b.n_seqs);
        }
        for (int i = 0; i < N; i++)
            CHECK_MSG(seen[i] == 1, "epoch %lld: item %d seen %d times", (long long)epoch, i,
                      seen[i]);
        CHECK(batches >= 2);
    }
    /* a budget below the longest conversation is an error that says what to do */
    CHECK(arl_sft_data_next_batch(d, &c, 1, 20, &b) == ARL_ERR_ARG);
    CHECK(strstr(arl_error_msg(), "batch-tokens") != NULL);
    arl_chat_tokens_free(&ref);
    arl_sft_batch_free(&b);
    arl_sft_data_close(d);
}

/* The items of the next nb batches. */
static void order_of(arl_sft_data *d, arl_data_cursor *c, int shuffle, int nb, int64_t *items,
                     int *n) {
    arl_sft_batch b;
    CHECK(arl_sft_batch_init(&b, 400) == ARL_OK);
    *n = 0;
    for (int i = 0; i < nb; i++) {
        CHECK(arl_sft_data_next_batch(d, c, shuffle, 400, &b) == ARL_OK);
        for (int64_t s = 0; s < b.n_seqs; s++)
            items[(*n)++] = b.item[s];
    }
    arl_sft_batch_free(&b);
}

static void test_shuffle_determinism(void) {
    const char *dir = test_tmpdir("sft-shuffle");
    const char *p = write_random(dir, "train.jsonl", 40, 2);
    arl_sft_data_config dc = {400, ARL_SFT_MALFORMED_FAIL, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *d1, *d2;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d1) == ARL_OK);
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d2) == ARL_OK);
    static int64_t a[4000], b[4000];
    int na, nb;
    arl_data_cursor c1, c2;
    arl_sft_data_cursor_start(d1, 7, &c1);
    arl_sft_data_cursor_start(d2, 7, &c2);
    order_of(d1, &c1, 1, 40, a, &na);
    order_of(d2, &c2, 1, 40, b, &nb);
    CHECK(c1.epoch >= 3); /* several epochs */
    CHECK(na == nb && memcmp(a, b, (size_t)na * sizeof *a) == 0);
    /* epochs differ from each other and from file order */
    CHECK(memcmp(a, a + 40, 40 * sizeof *a) != 0);
    int in_order = 1;
    for (int i = 0; i < 40; i++)
        in_order &= a[i] == i;
    CHECK(!in_order);
    /* another seed gives another order */
    arl_sft_data_cursor_start(d2, 8, &c2);
    order_of(d2, &c2, 1, 5, b, &nb);
    CHECK(memcmp(a, b, 20 * sizeof *a) != 0);
    /* no shuffle: file order, every epoch */
    arl_sft_data_cursor_start(d2, 7, &c2);
    order_of(d2, &c2, 0, 20, b, &nb);
    for (int i = 0; i < nb; i++)
        CHECK(b[i] == i % 40);
    arl_sft_data_close(d1);
    arl_sft_data_close(d2);
}

static void test_cursor_resume(void) {
    const char *dir = test_tmpdir("sft-cursor");
    const char *p = write_random(dir, "train.jsonl", 25, 3);
    arl_sft_data_config dc = {300, ARL_SFT_MALFORMED_FAIL, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *d;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_OK);
    arl_data_cursor c;
    arl_sft_data_cursor_start(d, 11, &c);
    enum { NB = 20, K = 5 };
    arl_sft_batch want[NB];
    arl_data_cursor saved = c;
    for (int i = 0; i < NB; i++) {
        CHECK(arl_sft_batch_init(&want[i], 300) == ARL_OK);
        CHECK(arl_sft_data_next_batch(d, &c, 1, 200, &want[i]) == ARL_OK);
        if (i == K - 1) saved = c;
    }
    CHECK(want[NB - 1].epoch >= 1); /* the run crosses an epoch boundary after the save */
    CHECK(saved.epoch == 0);
    arl_sft_data_close(d);

    /* resume from the saved cursor through train_state.json, with a fresh handle */
    arl_train_state st, st2;
    arl_train_state_init(&st);
    st.data = saved;
    CHECK(arl_train_state_write(path_in(dir, "train_state.json"), &st) == ARL_OK);
    CHECK(arl_train_state_read(path_in(dir, "train_state.json"), &st2) == ARL_OK);
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_OK);
    CHECK(arl_sft_data_cursor_check(d, 11, &st2.data) == ARL_OK);
    CHECK(arl_sft_data_cursor_check(d, 12, &st2.data) == ARL_ERR_CONFIG);
    arl_data_cursor r = st2.data;
    arl_sft_batch b;
    CHECK(arl_sft_batch_init(&b, 300) == ARL_OK);
    for (int i = K; i < NB; i++) {
        CHECK(arl_sft_data_next_batch(d, &r, 1, 200, &b) == ARL_OK);
        CHECK_EQ_INT(b.T, want[i].T);
        CHECK_EQ_INT(b.n_seqs, want[i].n_seqs);
        CHECK(memcmp(b.ids, want[i].ids, (size_t)b.T * 4) == 0);
        CHECK(memcmp(b.labels, want[i].labels, (size_t)b.T * 4) == 0);
        CHECK(memcmp(b.cu_seqlens, want[i].cu_seqlens, (size_t)(b.n_seqs + 1) * 4) == 0);
    }
    CHECK(memcmp(&r, &c, sizeof r) == 0); /* both at the same place now */
    arl_sft_batch_free(&b);
    for (int i = 0; i < NB; i++)
        arl_sft_batch_free(&want[i]);
    arl_sft_data_close(d);

    /* a changed file: the cursor is refused, naming both data hashes */
    FILE *f = fopen(p, "a");
    put_conv(f, "new", "line");
    fclose(f);
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_OK);
    CHECK(arl_sft_data_cursor_check(d, 11, &st2.data) == ARL_ERR_CONFIG);
    CHECK(strstr(arl_error_msg(), st2.data.sha256) &&
          strstr(arl_error_msg(), arl_sft_data_sha256(d)));
    arl_sft_data_close(d);
    arl_train_state_free(&st);
    arl_train_state_free(&st2);
}

/* The first batch of d (a file changed since it was opened) fails ARL_ERR_CORRUPT naming where;
 * closes d. */
static void expect_changed(arl_sft_data *d, const char *where) {
    arl_data_cursor c;
    arl_sft_data_cursor_start(d, 0, &c);
    arl_sft_batch b;
    CHECK(arl_sft_batch_init(&b, 300) == ARL_OK);
    CHECK(arl_sft_data_next_batch(d, &c, 0, 300, &b) == ARL_ERR_CORRUPT);
    CHECK_MSG(strstr(arl_error_msg(), where) != NULL, "%s", arl_error_msg());
    arl_sft_batch_free(&b);
    arl_sft_data_close(d);
}

/* The file changes under an open handle: caught when the batch re-reads it. */
static void test_changed_under_handle(void) {
    const char *dir = test_tmpdir("sft-changed");
    const char *p = write_random(dir, "train.jsonl", 5, 4);
    arl_sft_data_config dc = {300, ARL_SFT_MALFORMED_FAIL, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *d;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_OK);
    FILE *f = fopen(p, "r+");
    fputs("{\"messages\": [{\"role\": \"user\", \"content\": \"\"}]}", f); /* overwrite line 1 */
    fclose(f);
    expect_changed(d, "train.jsonl:1");
}

/* The file changes under an open handle to a conversation of the same token count ("Say 3" ->
 * "Say 9"): caught too (the tokens' hash, not only their count). */
static void test_changed_same_length(void) {
    const char *dir = test_tmpdir("sft-changed-len");
    const char *p = path_in(dir, "train.jsonl");
    FILE *f = fopen(p, "w");
    put_conv(f, "Say 3", "3 3 3");
    put_conv(f, "Say 4", "4 4 4");
    fclose(f);
    arl_sft_data_config dc = {300, ARL_SFT_MALFORMED_FAIL, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *d;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_OK);
    f = fopen(p, "w");
    put_conv(f, "Say 3", "3 3 3");
    put_conv(f, "Say 9", "9 9 9"); /* the same bytes count, the same tokens count */
    fclose(f);
    expect_changed(d, "train.jsonl:2");
}

/* Paths that are not a regular file are refused at open, naming the path, without waiting on
 * a FIFO (whose open would block for a writer) or reading a directory; a NUL byte outside a
 * JSON string is a malformed line that says so; CRLF line ends and a last line without a
 * newline give the same conversations as LF. */
static void test_odd_files(void) {
    const char *dir = test_tmpdir("sft-odd");
    arl_sft_data_config dc = {300, ARL_SFT_MALFORMED_FAIL, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *d = NULL;
    const char *sub = path_in(dir, "adir.jsonl");
    CHECK(mkdir(sub, 0755) == 0);
    CHECK(arl_sft_data_open(sub, &dc, &g_t, &d) == ARL_ERR_ARG && d == NULL);
    CHECK_MSG(strstr(arl_error_msg(), "adir.jsonl is a directory") != NULL, "%s", arl_error_msg());
    const char *fifo = path_in(dir, "fifo.jsonl");
    CHECK(mkfifo(fifo, 0644) == 0);
    alarm(30); /* a blocking open would hang here */
    CHECK(arl_sft_data_open(fifo, &dc, &g_t, &d) == ARL_ERR_ARG && d == NULL);
    alarm(0);
    CHECK(strstr(arl_error_msg(), "not a regular file") != NULL);

    const char *nul = path_in(dir, "nul.jsonl");
    FILE *f = fopen(nul, "wb");
    put_conv(f, "a", "b");
    fputs("{\"messages\": []}", f);
    fputc(0, f);
    fputs("\n", f);
    fclose(f);
    CHECK(arl_sft_data_open(nul, &dc, &g_t, &d) == ARL_ERR_FORMAT);
    CHECK_MSG(strstr(arl_error_msg(), "nul.jsonl:2: NUL byte at column 17") != NULL, "%s",
              arl_error_msg());

    const char *lf = path_in(dir, "lf.jsonl"), *crlf = path_in(dir, "crlf.jsonl");
    f = fopen(lf, "wb");
    put_conv(f, "a", "b");
    put_conv(f, "cc", "dd");
    fclose(f);
    f = fopen(crlf, "wb");
    fputs("{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
          "\"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}]}\r\n"
          "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
          "\"user\", \"content\": \"cc\"}, {\"role\": \"assistant\", \"content\": \"dd\"}]}",
          f); /* no newline at the end */
    fclose(f);
    arl_sft_data *a, *b;
    CHECK(arl_sft_data_open(lf, &dc, &g_t, &a) == ARL_OK);
    CHECK(arl_sft_data_open(crlf, &dc, &g_t, &b) == ARL_OK);
    CHECK_EQ_INT(arl_sft_data_count(b), 2);
    CHECK_EQ_INT(arl_sft_data_stats(b)->lines, 2);
    CHECK_EQ_INT(arl_sft_data_stats(b)->tokens, arl_sft_data_stats(a)->tokens);
    int64_t n = 0, lines[2];
    CHECK(arl_sft_data_overlap(a, b, &n, lines, 2) == ARL_OK);
    CHECK_EQ_INT(n, 2); /* the same conversations */
    arl_sft_data_close(a);
    arl_sft_data_close(b);
}

/* The overlap of an evaluation file with the training data: by the conversations' tokens,
 * with the evaluation file's line numbers. */
static void test_overlap(void) {
    const char *dir = test_tmpdir("sft-overlap");
    const char *tp = path_in(dir, "train.jsonl"), *ep = path_in(dir, "eval.jsonl");
    FILE *f = fopen(tp, "w");
    put_conv(f, "1", "one");
    put_conv(f, "2", "two");
    put_conv(f, "3", "three");
    fclose(f);
    f = fopen(ep, "w");
    put_conv(f, "4", "four");
    put_conv(f, "2", "two"); /* line 2: in the training data */
    put_conv(f, "2", "TWO");
    fprintf(f, "\n");
    put_conv(f, "3", "three"); /* line 5 */
    fclose(f);
    arl_sft_data_config dc = {300, ARL_SFT_MALFORMED_FAIL, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *t, *e;
    CHECK(arl_sft_data_open(tp, &dc, &g_t, &t) == ARL_OK);
    CHECK(arl_sft_data_open(ep, &dc, &g_t, &e) == ARL_OK);
    int64_t n = -1, lines[1] = {0};
    CHECK(arl_sft_data_overlap(t, e, &n, lines, 1) == ARL_OK);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(lines[0], 2); /* only cap = 1 listed */
    arl_sft_data_close(e);
    CHECK(arl_sft_data_open(tp, &dc, &g_t, &e) == ARL_OK);
    CHECK(arl_sft_data_overlap(t, e, &n, lines, 0) == ARL_OK);
    CHECK_EQ_INT(n, 3);
    arl_sft_data_close(e);
    arl_sft_data_close(t);
}

/* A target tool call must name a tool the line declares: a call of another tool (or of any tool
 * when the line has no "tools") is a malformed line naming file:line, the message and the name;
 * skipped and counted with on-malformed skip. */
static void test_undeclared_tool(void) {
    const char *dir = test_tmpdir("sft-data-tools");
    const char *p = path_in(dir, "tools.jsonl");
    FILE *f = fopen(p, "w");
    const char *call = "{\"role\": \"user\", \"content\": \"7 + 5?\"}, {\"role\": \"assistant\", "
                       "\"content\": \"\", \"tool_calls\": [{\"id\": \"call_1_0\", \"type\": "
                       "\"function\", \"function\": {\"name\": \"%s\", \"arguments\": \"{}\"}}]}";
    const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
                        "\"calc\", \"parameters\": {\"type\": \"object\"}}}]";
    fprintf(f, "{\"messages\": [");
    fprintf(f, call, "calc"); /* 1 ok */
    fprintf(f, "], %s}\n{\"messages\": [", tools);
    fprintf(f, call, "mul"); /* 2 undeclared */
    fprintf(f, "], %s}\n{\"messages\": [", tools);
    fprintf(f, call, "calc"); /* 3 no tools at all */
    fprintf(f, "]}\n");
    fclose(f);
    arl_sft_data_config dc = {300, ARL_SFT_MALFORMED_FAIL, ARL_SFT_LONG_TRUNCATE};
    arl_sft_data *d;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_ERR_FORMAT);
    CHECK(strstr(arl_error_msg(),
                 "tools.jsonl:2: message 1 (assistant): tool call 0 names "
                 "'mul', which the conversation's \"tools\" do not declare") != NULL);
    dc.on_malformed = ARL_SFT_MALFORMED_SKIP;
    CHECK(arl_sft_data_open(p, &dc, &g_t, &d) == ARL_OK);
    const arl_sft_stats *s = arl_sft_data_stats(d);
    CHECK_EQ_INT(s->malformed, 2);
    CHECK(s->malformed_line[0] == 2 && s->malformed_line[1] == 3);
    CHECK_EQ_INT(s->conversations, 1);
    arl_sft_data_close(d);
}

int main(void) {
    arl_chat_template_default(&g_t);
    TEST_RUN(test_index_stats);
    TEST_RUN(test_packing);
    TEST_RUN(test_shuffle_determinism);
    TEST_RUN(test_cursor_resume);
    TEST_RUN(test_changed_under_handle);
    TEST_RUN(test_changed_same_length);
    TEST_RUN(test_odd_files);
    TEST_RUN(test_overlap);
    TEST_RUN(test_undeclared_tool);
    return test_finish();
}
