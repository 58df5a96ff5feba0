/* tests/fuzz/fuzz_sft_data.c: libFuzzer target for the SFT data pipeline (experiments/sft_data.c):
 * a user's JSONL file of conversations indexed, re-read by offset and packed into batches.
 *
 * An input is three bytes of settings and the file's bytes:
 *   byte 0: bit 0 shared prefix (arl_sft_data_open_prefix), bit 1 on-malformed fail (else
 *           skip), bit 2 on-long drop (else truncate), bits 3-7 the shuffle seed;
 *   byte 1: max_seq_tokens = 2 + 2 * b (small, so truncation and dropping happen);
 *   byte 2: batch budget = 2 + 4 * b; a budget below the longest conversation (its suffix
 *           with a shared prefix) is refused with ARL_ERR_ARG and leaves the cursor as it was,
 *           and the epochs then run with the longest + (b & 15), so packing limits are hit.
 * Every line is also classified here with the chat template directly (blank, malformed: an
 * image or a tool call of a tool the line does not declare included, dropped, no loss token,
 * usable), and what sft_data.h promises is checked against that:
 * open fails (ARL_ERR_FORMAT naming the file) exactly when a line is malformed under
 * on-malformed fail; the statistics count each line once, list the malformed line numbers,
 * and sum the items' tokens; items are the usable lines in file order with min(tokens,
 * max_seq_tokens) tokens; the shared prefix has no target, is shared and is the longest such.
 * One epoch with and without shuffling visits every item once (file order unshuffled) in
 * batches of at most the budget tokens, each a greedy packing (the next item did not fit),
 * cu_seqlens increasing from 0 to T, each sequence the item's tokens after the prefix as
 * rendered, each label the next token of the same sequence where its mask is 1 or
 * ARL_SFT_IGNORE; n_targets and the loss tokens agree; the cursor names the next item's line
 * and offset, passes arl_sft_data_cursor_check, and a saved one resumes to the same batch.
 * The file is one memfd per process, rewritten for every input.  Built by
 * tests/train/CMakeLists.txt with clang and -DAGENTRL_FUZZ=ON:
 *   build-fuzz/tests/train/fuzz_sft_data -max_total_time=60 CORPUS_DIR
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/assert.h"
#include "core/log.h"
#include "experiments/sft_data.h"
#include "policy/chat.h"

enum { LINE_BLANK, LINE_MALFORMED, LINE_DROPPED, LINE_NO_LOSS, LINE_ITEM };

typedef struct ref_line {
    size_t off, len;     /* bytes of the line in the file, without its newline */
    int kind;            /* LINE_* */
    int64_t n_full;      /* tokens before truncation */
    arl_chat_tokens tok; /* the rendering after truncation (LINE_ITEM) */
    int64_t first_loss;  /* index of its first loss token (LINE_ITEM) */
    int64_t line_no;     /* 1-based */
} ref_line;

static int g_fd = -1;
static char g_path[64];

static void file_write(const uint8_t *d, size_t n) {
    if (g_fd < 0) {
        g_fd = memfd_create("fuzz_sft_data", 0);
        ARL_ASSERT(g_fd >= 0);
        snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
    }
    ARL_ASSERT(ftruncate(g_fd, 0) == 0);
    size_t done = 0;
    while (done < n) {
        ssize_t w = pwrite(g_fd, d + done, n - done, (off_t)done);
        ARL_ASSERT(w > 0);
        done += (size_t)w;
    }
}

static int is_blank(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

/* Classify one line as the header describes. */
static void classify(const arl_chat_template *t, const arl_sft_data_config *dc, const uint8_t *d,
                     ref_line *r) {
    arl_chat_tokens_init(&r->tok);
    if (is_blank(d + r->off, r->len)) {
        r->kind = LINE_BLANK;
        return;
    }
    char *text = malloc(r->len + 1);
    ARL_ASSERT(text);
    memcpy(text, d + r->off, r->len);
    text[r->len] = 0;
    arl_chat_conv c;
    arl_chat_conv_init(&c);
    arl_status s = arl_chat_conv_from_json(&c, t, text, r->len, "fuzz");
    for (size_t m = 0; m < c.n_msgs && !s; m++)
        for (size_t p = 0; p < c.msgs[m].n_parts; p++)
            if (c.msgs[m].parts[p].is_image) s = ARL_ERR_UNSUPPORTED;
    /* a tool call naming a tool the line does not declare */
    for (size_t m = 0; m < c.n_msgs && !s; m++)
        for (size_t k = 0; k < c.msgs[m].n_calls && !s; k++) {
            const arl_chat_call *call = &c.msgs[m].calls[k];
            if (call->name && !arl_chat_conv_has_tool(&c, call->name, call->name_len))
                s = ARL_ERR_FORMAT;
        }
    if (!s) s = arl_chat_render(t, &c, 0, &r->tok);
    arl_chat_conv_free(&c);
    free(text);
    if (s) {
        r->kind = LINE_MALFORMED;
        return;
    }
    r->n_full = (int64_t)r->tok.n;
    if (r->n_full > dc->max_seq_tokens) {
        if (dc->on_long == ARL_SFT_LONG_DROP) {
            r->kind = LINE_DROPPED;
            return;
        }
        r->tok.n = (size_t)dc->max_seq_tokens;
    }
    r->first_loss = -1;
    for (size_t i = 0; i < r->tok.n && r->first_loss < 0; i++)
        if (r->tok.mask[i]) r->first_loss = (int64_t)i;
    r->kind = r->first_loss < 0 ? LINE_NO_LOSS : LINE_ITEM;
}

typedef struct run {
    arl_sft_data *d;
    const ref_line *items; /* (n) the usable lines in file order */
    int64_t n, P, budget;
    uint64_t seed;
} run;

/* Check one batch against the reference; *prev_T is the previous batch's T in this epoch
 * (-1: none), expect_line the cursor's line before the batch (0: not checked). */
static void batch_check(const run *r, const arl_sft_batch *b, int shuffle, int64_t pos,
                        int64_t *prev_T, int64_t expect_line, int64_t *loss) {
    ARL_ASSERT(b->n_seqs >= 1 && b->T >= 1 && b->T <= r->budget);
    ARL_ASSERT(b->cu_seqlens[0] == 0 && b->cu_seqlens[b->n_seqs] == b->T);
    ARL_ASSERT(b->prefix_len == r->P && (b->prefix_ids != NULL) == (r->P > 0));
    for (int64_t i = 0; i < r->P; i++)
        ARL_ASSERT(b->prefix_ids[i] == r->items[0].tok.ids[i]);
    if (expect_line) ARL_ASSERT(arl_sft_data_item_line(r->d, b->item[0]) == expect_line);
    /* greedy: the first conversation of this batch did not fit into the previous one */
    if (*prev_T >= 0) ARL_ASSERT(*prev_T + (int64_t)r->items[b->item[0]].tok.n - r->P > r->budget);
    int64_t targets = 0;
    for (int64_t k = 0; k < b->n_seqs; k++) {
        const int64_t it = b->item[k], s0 = b->cu_seqlens[k], s1 = b->cu_seqlens[k + 1];
        ARL_ASSERT(it >= 0 && it < r->n && s1 > s0);
        if (!shuffle) ARL_ASSERT(it == pos + k);
        const arl_chat_tokens *ref = &r->items[it].tok;
        ARL_ASSERT(s1 - s0 == (int64_t)ref->n - r->P);
        ARL_ASSERT(arl_sft_data_item_tokens(r->d, it) == (int64_t)ref->n);
        for (int64_t t = s0; t < s1; t++) {
            ARL_ASSERT(b->ids[t] == ref->ids[r->P + t - s0] &&
                       b->mask[t] == ref->mask[r->P + t - s0]);
            *loss += b->mask[t];
            int has = t + 1 < s1 && b->mask[t + 1];
            ARL_ASSERT(b->labels[t] == (has ? ref->ids[r->P + t + 1 - s0] : ARL_SFT_IGNORE));
            targets += has;
        }
    }
    ARL_ASSERT(b->n_targets == targets);
    *prev_T = b->T;
}

/* One epoch from the start: every item once, then the cursor is at (1, 0), and one batch of
 * epoch 1.  order gets the items in visiting order, *after_first the cursor after the first
 * batch and *first_T that batch's tokens. */
static void epoch_check(const run *r, int shuffle, int64_t *order, arl_data_cursor *after_first,
                        int64_t *first_T, arl_sft_batch *b) {
    arl_data_cursor c;
    arl_sft_data_cursor_start(r->d, r->seed, &c);
    ARL_ASSERT(c.items == r->n && c.epoch == 0 && c.index == 0);
    char *seen = calloc((size_t)r->n, 1);
    ARL_ASSERT(seen);
    int64_t pos = 0, prev_T = -1, loss = 0, targets = 0, tokens = 0, batches = 0;
    while (c.epoch == 0) {
        /* the cursor names the next item (file order until the first batch is drawn) */
        int64_t expect_line = (!shuffle || batches > 0) ? c.line : 0;
        ARL_ASSERT(arl_sft_data_next_batch(r->d, &c, shuffle, r->budget, b) == ARL_OK);
        ARL_ASSERT(b->epoch == 0);
        batch_check(r, b, shuffle, pos, &prev_T, expect_line, &loss);
        if (batches == 0) {
            *after_first = c;
            *first_T = b->T;
        }
        for (int64_t k = 0; k < b->n_seqs; k++) {
            ARL_ASSERT(pos < r->n && !seen[b->item[k]]);
            seen[b->item[k]] = 1;
            order[pos++] = b->item[k];
        }
        targets += b->n_targets;
        tokens += b->T + b->n_seqs * r->P;
        batches++;
        ARL_ASSERT(arl_sft_data_cursor_check(r->d, r->seed, &c) == ARL_OK);
        if (c.epoch == 0) {
            ARL_ASSERT(c.index == pos);
            if (!shuffle)
                ARL_ASSERT(c.line == arl_sft_data_item_line(r->d, pos) &&
                           c.offset == (int64_t)r->items[pos].off);
        }
    }
    ARL_ASSERT(pos == r->n && c.epoch == 1 && c.index == 0);
    const arl_sft_stats *st = arl_sft_data_stats(r->d);
    /* no target in the prefix: every loss token is a target */
    ARL_ASSERT(loss == st->loss_tokens && targets == st->loss_tokens && tokens == st->tokens);
    /* the next batch is epoch 1's */
    ARL_ASSERT(arl_sft_data_next_batch(r->d, &c, shuffle, r->budget, b) == ARL_OK);
    ARL_ASSERT(b->epoch == 1 && b->n_seqs >= 1 && b->T <= r->budget);
    free(seen);
}

static void batches_check(const run *r0, uint8_t b2) {
    run r = *r0;
    arl_sft_batch b;
    arl_data_cursor c;
    const int64_t need = arl_sft_data_stats(r.d)->max_tokens - r.P;
    ARL_ASSERT(need >= 2);
    if (r.budget < need) { /* refused, the cursor unchanged */
        ARL_ASSERT(arl_sft_batch_init(&b, r.budget) == ARL_OK);
        arl_sft_data_cursor_start(r.d, r.seed, &c);
        arl_data_cursor c0 = c;
        ARL_ASSERT(arl_sft_data_next_batch(r.d, &c, 1, r.budget, &b) == ARL_ERR_ARG);
        ARL_ASSERT(!memcmp(&c, &c0, sizeof c));
        arl_sft_batch_free(&b);
        r.budget = need + (b2 & 15);
    }
    /* capacity exactly the budget: a write past it is an AddressSanitizer report */
    ARL_ASSERT(arl_sft_batch_init(&b, r.budget) == ARL_OK);
    int64_t *order = malloc((size_t)r.n * sizeof *order);
    int64_t *again = malloc((size_t)r.n * sizeof *again);
    ARL_ASSERT(order && again);
    arl_data_cursor saved;
    int64_t first_T = 0;
    epoch_check(&r, 0, order, &saved, &first_T, &b);
    epoch_check(&r, 1, order, &saved, &first_T, &b);
    /* the order is a function of (seed, epoch): the same again */
    arl_data_cursor saved2;
    epoch_check(&r, 1, again, &saved2, &first_T, &b);
    ARL_ASSERT(!memcmp(order, again, (size_t)r.n * sizeof *order));
    ARL_ASSERT(!memcmp(&saved, &saved2, sizeof saved));
    /* a saved cursor resumes exactly (after the cached order moved on to epoch 1) */
    if (saved.epoch == 0) {
        int64_t pos = saved.index, prev_T = first_T, loss = 0;
        ARL_ASSERT(arl_sft_data_next_batch(r.d, &saved, 1, r.budget, &b) == ARL_OK);
        batch_check(&r, &b, 1, pos, &prev_T, 0, &loss);
        for (int64_t k = 0; k < b.n_seqs; k++)
            ARL_ASSERT(b.item[k] == order[pos + k]);
    }
    free(order);
    free(again);
    arl_sft_batch_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    arl_log_set_level(ARL_LOG_ERROR);
    const uint8_t *f = data + 3;
    const size_t n = size - 3;
    file_write(f, n);
    const int prefix = data[0] & 1;
    arl_sft_data_config dc = {2 + 2 * (int64_t)data[1],
                              (data[0] & 2) ? ARL_SFT_MALFORMED_FAIL : ARL_SFT_MALFORMED_SKIP,
                              (data[0] & 4) ? ARL_SFT_LONG_DROP : ARL_SFT_LONG_TRUNCATE};
    arl_chat_template t;
    arl_chat_template_default(&t);
    t.image_max_patches = 64; /* small images: the fuzzer's time goes to the pipeline */

    /* the reference: lines as getline reads them */
    ref_line *lines = calloc(n + 1, sizeof *lines);
    ARL_ASSERT(lines);
    int64_t n_lines = 0, count[LINE_ITEM + 1] = {0}, truncated = 0;
    for (size_t at = 0; at < n;) {
        const uint8_t *nl = memchr(f + at, '\n', n - at);
        size_t len = nl ? (size_t)(nl - (f + at)) : n - at;
        ref_line *r = &lines[n_lines++];
        r->off = at;
        r->len = len;
        r->line_no = n_lines;
        classify(&t, &dc, f, r);
        count[r->kind]++;
        if (r->kind == LINE_ITEM && r->n_full > dc.max_seq_tokens) truncated++;
        at += len + (nl != NULL);
    }
    ref_line *items = calloc(n_lines + 1, sizeof *items);
    ARL_ASSERT(items);
    int64_t n_items = 0;
    for (int64_t i = 0; i < n_lines; i++)
        if (lines[i].kind == LINE_ITEM) items[n_items++] = lines[i];

    arl_sft_data *d = NULL;
    arl_status s = prefix ? arl_sft_data_open_prefix(g_path, &dc, 1, &t, &d)
                          : arl_sft_data_open(g_path, &dc, &t, &d);
    const int must_fail = dc.on_malformed == ARL_SFT_MALFORMED_FAIL && count[LINE_MALFORMED] > 0;
    if (s != ARL_OK) {
        ARL_ASSERT(must_fail && s == ARL_ERR_FORMAT && d == NULL);
        ARL_ASSERT(strstr(arl_error_msg(), g_path) != NULL);
        goto out;
    }
    ARL_ASSERT(!must_fail && d != NULL);
    ARL_ASSERT(!strcmp(arl_sft_data_path(d), g_path) && strlen(arl_sft_data_sha256(d)) == 64);

    /* the statistics count every line once */
    const arl_sft_stats *st = arl_sft_data_stats(d);
    ARL_ASSERT(st->lines == n_lines && st->blank == count[LINE_BLANK]);
    ARL_ASSERT(st->malformed == count[LINE_MALFORMED] && st->dropped_long == count[LINE_DROPPED]);
    ARL_ASSERT(st->no_loss == count[LINE_NO_LOSS] && st->conversations == n_items);
    ARL_ASSERT(st->truncated == truncated && arl_sft_data_count(d) == n_items);
    ARL_ASSERT((st->first_error[0] != 0) == (st->malformed > 0));
    for (int64_t i = 0, k = 0; i < n_lines && k < ARL_SFT_MAX_LISTED; i++)
        if (lines[i].kind == LINE_MALFORMED) ARL_ASSERT(st->malformed_line[k++] == i + 1);
    int64_t tokens = 0, loss = 0, mx = 0, mn = 0, lim_min = INT64_MAX;
    for (int64_t i = 0; i < n_items; i++) {
        const ref_line *r = &items[i];
        ARL_ASSERT(arl_sft_data_item_line(d, i) == r->line_no);
        int64_t nt = arl_sft_data_item_tokens(d, i);
        ARL_ASSERT(nt == (int64_t)r->tok.n && nt >= 2 && nt <= dc.max_seq_tokens);
        tokens += nt;
        for (int64_t k = 0; k < nt; k++)
            loss += r->tok.mask[k];
        mx = nt > mx ? nt : mx;
        mn = mn == 0 || nt < mn ? nt : mn;
        int64_t lim = r->first_loss - 1 > 0 ? r->first_loss - 1 : 0;
        lim_min = lim < lim_min ? lim : lim_min;
    }
    ARL_ASSERT(st->tokens == tokens && st->loss_tokens == loss);
    ARL_ASSERT(st->max_tokens == mx && st->min_tokens == mn);

    /* the shared prefix: no target in it, shared by all, the longest such */
    const int64_t P = st->prefix_tokens;
    if (!prefix || n_items == 0) {
        ARL_ASSERT(P == 0);
    } else {
        ARL_ASSERT(P >= 0 && P <= lim_min);
        int differs = 0;
        for (int64_t i = 1; i < n_items; i++) {
            ARL_ASSERT(!memcmp(items[i].tok.ids, items[0].tok.ids, (size_t)P * sizeof(int32_t)));
            if (P < lim_min) differs |= items[i].tok.ids[P] != items[0].tok.ids[P];
        }
        ARL_ASSERT(P == lim_min || differs);
    }

    run r = {d, items, n_items, P, 2 + 4 * (int64_t)data[2], (uint64_t)(data[0] >> 3)};
    if (n_items == 0) {
        arl_sft_batch b;
        arl_data_cursor c;
        ARL_ASSERT(arl_sft_batch_init(&b, r.budget) == ARL_OK);
        arl_sft_data_cursor_start(d, r.seed, &c);
        ARL_ASSERT(arl_sft_data_next_batch(d, &c, 1, r.budget, &b) == ARL_ERR_STATE);
        arl_sft_batch_free(&b);
    } else {
        batches_check(&r, data[2]);
    }
    arl_sft_data_close(d);
out:
    for (int64_t i = 0; i < n_lines; i++)
        arl_chat_tokens_free(&lines[i].tok);
    free(lines);
    free(items);
    return 0;
}
