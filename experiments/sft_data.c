/* experiments/sft_data.c: JSONL conversations -> packed, masked token batches (see
 * sft_data.h). */
#include "experiments/sft_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/assert.h"
#include "core/log.h"
#include "core/rng.h"

typedef struct sft_item {
    int64_t offset;   /* byte offset of the line */
    int64_t line;     /* 1-based line number */
    int32_t len;      /* bytes of the line without its newline */
    int32_t n_tokens; /* tokens after truncation */
    uint64_t hash;    /* tokens_hash of its tokens after truncation */
} sft_item;

struct arl_sft_data {
    char *path;
    FILE *f;
    arl_sft_data_config cfg;
    int shared_prefix;
    arl_chat_template tmpl;
    sft_item *items; /* (n) */
    int64_t n;
    arl_sft_stats stats;
    char sha256[ARL_SHA256_HEX_CHARS];
    /* the permutation of one epoch, cached */
    int64_t *perm; /* (n) */
    int64_t perm_epoch;
    uint64_t perm_seed;
    int perm_valid;
    /* shared prefix (cfg.shared_prefix): tokens of the first usable conversation, of which the
     * first prefix_len are shared by all */
    int32_t *prefix; /* (prefix_cap) */
    int64_t prefix_cap, prefix_len;
    /* reused while batching */
    char *line;
    size_t line_cap;
    arl_chat_tokens tok;
};

/* The first 8 bytes of the SHA-256 of ids and mask (n tokens): an item's identity, for
 * the overlap of two files and for a line that changed since it was indexed. */
static uint64_t tokens_hash(const arl_chat_tokens *t) {
    arl_sha256_ctx h;
    arl_sha256_init(&h);
    arl_sha256_update(&h, t->ids, t->n * sizeof *t->ids);
    arl_sha256_update(&h, t->mask, t->n);
    uint8_t dig[ARL_SHA256_BYTES];
    arl_sha256_final(&h, dig);
    uint64_t x = 0;
    for (int i = 0; i < 8; i++)
        x = x << 8 | dig[i];
    return x;
}

/* Render one line to tokens (into d->tok, truncated to max_seq_tokens when truncating).
 * *n_full: tokens before truncation.  Any error but NOMEM means "malformed". */
static arl_status render_line(arl_sft_data *d, const char *text, size_t len, int64_t line_no,
                              size_t *n_full) {
    char where[4200];
    snprintf(where, sizeof where, "%s:%lld", d->path, (long long)line_no);
    arl_chat_conv conv;
    arl_chat_conv_init(&conv);
    arl_status s = arl_chat_conv_from_json(&conv, &d->tmpl, text, len, where);
    if (s) return s;
    for (size_t m = 0; m < conv.n_msgs && !s; m++)
        for (size_t p = 0; p < conv.msgs[m].n_parts; p++)
            if (conv.msgs[m].parts[p].is_image) {
                s = arl_errorf(ARL_ERR_UNSUPPORTED,
                               "%s: message %zu (%s): images are not supported by SFT yet", where,
                               m, arl_chat_role_str(conv.msgs[m].role));
                break;
            }
    /* a target call of a tool the prompt does not declare would teach the model to call tools
     * it was never shown: a data error (the template itself renders any name) */
    for (size_t m = 0; m < conv.n_msgs && !s; m++)
        for (size_t k = 0; k < conv.msgs[m].n_calls; k++) {
            const arl_chat_call *call = &conv.msgs[m].calls[k];
            if (!call->name || arl_chat_conv_has_tool(&conv, call->name, call->name_len)) continue;
            const int nl = (int)(call->name_len < 200 ? call->name_len : 200);
            s = arl_errorf(ARL_ERR_FORMAT,
                           conv.n_tools
                               ? "%s: message %zu (assistant): tool call %zu names '%.*s', "
                                 "which the conversation's \"tools\" do not declare"
                               : "%s: message %zu (assistant): tool call %zu names '%.*s', "
                                 "but the conversation declares no \"tools\"",
                           where, m, k, nl, call->name);
            break;
        }
    arl_chat_tokens_clear(&d->tok);
    if (!s) s = arl_chat_render(&d->tmpl, &conv, 0, &d->tok);
    arl_chat_conv_free(&conv);
    if (s) return s;
    *n_full = d->tok.n;
    if (d->cfg.on_long == ARL_SFT_LONG_TRUNCATE && (int64_t)d->tok.n > d->cfg.max_seq_tokens)
        d->tok.n = (size_t)d->cfg.max_seq_tokens;
    return ARL_OK;
}

static arl_status grow_items(arl_sft_data *d, int64_t *cap) {
    if (d->n < *cap) return ARL_OK;
    int64_t nc = *cap ? 2 * *cap : 1024;
    sft_item *ni = realloc(d->items, (size_t)nc * sizeof *ni);
    if (!ni) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory indexing the file", d->path);
    d->items = ni;
    *cap = nc;
    return ARL_OK;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

static arl_status index_file(arl_sft_data *d) {
    arl_sha256_ctx h;
    arl_sha256_init(&h);
    int64_t cap = 0, offset = 0, line_no = 0;
    arl_sft_stats *st = &d->stats;
    for (;;) {
        errno = 0;
        ssize_t got = getline(&d->line, &d->line_cap, d->f);
        if (got < 0) {
            if (ferror(d->f))
                return arl_errorf(ARL_ERR_IO, "%s: read failed at byte %lld: %s", d->path,
                                  (long long)offset, strerror(errno));
            break;
        }
        arl_sha256_update(&h, d->line, (size_t)got);
        line_no++;
        st->lines++;
        size_t len = (size_t)got;
        if (len && d->line[len - 1] == '\n') len--;
        int64_t this_off = offset;
        offset += got;
        if (is_blank(d->line, len)) {
            st->blank++;
            continue;
        }
        const char *nul = memchr(d->line, 0, len);
        if (nul) {
            arl_errorf(ARL_ERR_FORMAT,
                       "%s:%lld: NUL byte at column %lld (binary data? a NUL in a string is "
                       "written \\u0000)",
                       d->path, (long long)line_no, (long long)(nul - d->line) + 1);
            goto malformed;
        }
        if (len > INT32_MAX) {
            arl_errorf(ARL_ERR_FORMAT, "%s:%lld: line of %zu bytes is longer than 2 GiB", d->path,
                       (long long)line_no, len);
            goto malformed;
        }
        size_t n_full = 0;
        arl_status s = render_line(d, d->line, len, line_no, &n_full);
        if (s == ARL_ERR_NOMEM) return s;
        if (s) goto malformed;
        if ((int64_t)n_full > d->cfg.max_seq_tokens && d->cfg.on_long == ARL_SFT_LONG_DROP) {
            st->dropped_long++;
            continue;
        }
        int64_t loss = 0;
        for (size_t i = 0; i < d->tok.n; i++)
            loss += d->tok.mask[i];
        if (loss == 0) { /* also a conversation whose assistant part was cut off */
            st->no_loss++;
            continue;
        }
        if ((int64_t)n_full > d->cfg.max_seq_tokens) st->truncated++;
        if (d->shared_prefix) {
            /* P <= first loss token - 1, and the common part with the earlier ones */
            int64_t first = 0;
            while (!d->tok.mask[first])
                first++;
            int64_t lim = first - 1 > 0 ? first - 1 : 0;
            if (!d->prefix) {
                d->prefix = malloc(sizeof(int32_t) * (size_t)(lim > 0 ? lim : 1));
                if (!d->prefix) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", d->path);
                for (int64_t i = 0; i < lim; i++)
                    d->prefix[i] = d->tok.ids[i];
                d->prefix_cap = d->prefix_len = lim;
            } else {
                int64_t p = 0;
                while (p < d->prefix_len && p < lim && d->prefix[p] == d->tok.ids[p])
                    p++;
                d->prefix_len = p;
            }
        }
        ARL_TRY(grow_items(d, &cap));
        sft_item *it = &d->items[d->n++];
        it->offset = this_off;
        it->line = line_no;
        it->len = (int32_t)len;
        it->n_tokens = (int32_t)d->tok.n;
        it->hash = tokens_hash(&d->tok);
        st->conversations++;
        st->tokens += (int64_t)d->tok.n;
        st->loss_tokens += loss;
        if ((int64_t)d->tok.n > st->max_tokens) st->max_tokens = (int64_t)d->tok.n;
        if (st->min_tokens == 0 || (int64_t)d->tok.n < st->min_tokens)
            st->min_tokens = (int64_t)d->tok.n;
        continue;
    malformed:
        if (d->cfg.on_malformed == ARL_SFT_MALFORMED_FAIL)
            return arl_error_prefix(ARL_ERR_FORMAT,
                                    "malformed conversation (set on-malformed to 'skip' to skip "
                                    "and count such lines)");
        if (st->malformed < ARL_SFT_MAX_LISTED) st->malformed_line[st->malformed] = line_no;
        if (st->malformed == 0)
            snprintf(st->first_error, sizeof st->first_error, "%s", arl_error_msg());
        if (st->malformed < 3)
            arl_log_warn("sft data: skipping malformed line: %s", arl_error_msg());
        st->malformed++;
    }
    st->prefix_tokens = d->prefix_len;
    uint8_t dig[ARL_SHA256_BYTES];
    arl_sha256_final(&h, dig);
    arl_sha256_hex(dig, d->sha256);
    return ARL_OK;
}

arl_status arl_sft_data_open(const char *path, const arl_sft_data_config *cfg,
                             const arl_chat_template *t, arl_sft_data **out) {
    return arl_sft_data_open_prefix(path, cfg, 0, t, out);
}

arl_status arl_sft_data_open_prefix(const char *path, const arl_sft_data_config *cfg,
                                    int shared_prefix, const arl_chat_template *t,
                                    arl_sft_data **out) {
    *out = NULL;
    if (cfg->max_seq_tokens < 2)
        return arl_errorf(ARL_ERR_ARG, "sft data: max_seq_tokens must be >= 2, got %lld",
                          (long long)cfg->max_seq_tokens);
    if (cfg->max_seq_tokens > INT32_MAX)
        return arl_errorf(ARL_ERR_ARG, "sft data: max_seq_tokens %lld is above 2^31 - 1",
                          (long long)cfg->max_seq_tokens);
    arl_sft_data *d = calloc(1, sizeof *d);
    if (!d) return arl_errorf(ARL_ERR_NOMEM, "sft data: out of memory");
    d->cfg = *cfg;
    d->shared_prefix = shared_prefix != 0;
    d->tmpl = *t;
    arl_chat_tokens_init(&d->tok);
    d->path = strdup(path);
    if (!d->path) {
        arl_sft_data_close(d);
        return arl_errorf(ARL_ERR_NOMEM, "sft data: out of memory");
    }
    /* before opening: a FIFO's open would wait for a writer */
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        arl_status s = arl_errorf(
            ARL_ERR_ARG,
            "%s is %s; SFT data must be a regular JSONL file (it is read twice: to index it, "
            "then each line again by its offset)",
            path, S_ISDIR(sb.st_mode) ? "a directory" : "not a regular file (a pipe, a device?)");
        arl_sft_data_close(d);
        return s;
    }
    d->f = fopen(path, "rb");
    if (!d->f) {
        arl_status s = arl_errorf(errno == ENOENT ? ARL_ERR_NOT_FOUND : ARL_ERR_IO,
                                  "%s: cannot open the SFT data file: %s", path, strerror(errno));
        arl_sft_data_close(d);
        return s;
    }
    arl_status s = index_file(d);
    if (!s && d->n > 0) {
        d->perm = malloc((size_t)d->n * sizeof *d->perm);
        if (!d->perm) s = arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", path);
    }
    if (s) {
        arl_sft_data_close(d);
        return s;
    }
    *out = d;
    return ARL_OK;
}

void arl_sft_data_close(arl_sft_data *d) {
    if (!d) return;
    if (d->f) fclose(d->f);
    free(d->path);
    free(d->items);
    free(d->perm);
    free(d->prefix);
    free(d->line);
    arl_chat_tokens_free(&d->tok);
    free(d);
}

const arl_sft_stats *arl_sft_data_stats(const arl_sft_data *d) {
    return &d->stats;
}
int64_t arl_sft_data_count(const arl_sft_data *d) {
    return d->n;
}
int64_t arl_sft_data_item_tokens(const arl_sft_data *d, int64_t i) {
    ARL_ASSERT(i >= 0 && i < d->n);
    return d->items[i].n_tokens;
}
int64_t arl_sft_data_item_line(const arl_sft_data *d, int64_t i) {
    ARL_ASSERT(i >= 0 && i < d->n);
    return d->items[i].line;
}
const char *arl_sft_data_sha256(const arl_sft_data *d) {
    return d->sha256;
}
const char *arl_sft_data_path(const arl_sft_data *d) {
    return d->path;
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

arl_status arl_sft_data_overlap(const arl_sft_data *a, const arl_sft_data *b, int64_t *n,
                                int64_t *lines, int cap) {
    *n = 0;
    if (a->n == 0 || b->n == 0) return ARL_OK;
    uint64_t *h = malloc((size_t)a->n * sizeof *h);
    if (!h) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", a->path);
    for (int64_t i = 0; i < a->n; i++)
        h[i] = a->items[i].hash;
    qsort(h, (size_t)a->n, sizeof *h, cmp_u64);
    for (int64_t i = 0; i < b->n; i++)
        if (bsearch(&b->items[i].hash, h, (size_t)a->n, sizeof *h, cmp_u64)) {
            if (*n < cap) lines[*n] = b->items[i].line;
            ++*n;
        }
    free(h);
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------ */
/* order and cursor                                                                      */

/* The item at position idx of epoch `epoch`. */
static int64_t order_at(arl_sft_data *d, uint64_t seed, int64_t epoch, int shuffle, int64_t idx) {
    if (!shuffle) return idx;
    if (!d->perm_valid || d->perm_epoch != epoch || d->perm_seed != seed) {
        for (int64_t i = 0; i < d->n; i++)
            d->perm[i] = i;
        arl_rng r;
        arl_rng_seed_stream(&r, seed, (uint64_t)epoch);
        for (int64_t i = d->n - 1; i > 0; i--) {
            int64_t j = (int64_t)arl_rng_below(&r, (uint64_t)i + 1);
            int64_t x = d->perm[i];
            d->perm[i] = d->perm[j];
            d->perm[j] = x;
        }
        d->perm_valid = 1;
        d->perm_epoch = epoch;
        d->perm_seed = seed;
    }
    return d->perm[idx];
}

static void cursor_locate(arl_sft_data *d, arl_data_cursor *c, int shuffle) {
    if (d->n == 0) return;
    int64_t it = order_at(d, c->seed, c->epoch, shuffle, c->index);
    c->offset = d->items[it].offset;
    c->line = d->items[it].line;
}

void arl_sft_data_cursor_start(const arl_sft_data *d, uint64_t seed, arl_data_cursor *c) {
    memset(c, 0, sizeof *c);
    c->items = d->n;
    c->seed = seed;
    memcpy(c->sha256, d->sha256, sizeof c->sha256);
    if (d->n > 0) {
        /* position 0 of epoch 0 (file offset informational: of the first item in file order
           until the first batch is drawn) */
        c->offset = d->items[0].offset;
        c->line = d->items[0].line;
    }
}

arl_status arl_sft_data_cursor_check(const arl_sft_data *d, uint64_t seed,
                                     const arl_data_cursor *c) {
    if (strcmp(c->sha256, d->sha256))
        return arl_errorf(ARL_ERR_CONFIG,
                          "%s: the data file changed since the checkpoint (saved data sha256 %s, "
                          "the file now has %s); resume with the original file",
                          d->path, c->sha256[0] ? c->sha256 : "(none)", d->sha256);
    if (c->items != d->n)
        return arl_errorf(ARL_ERR_CONFIG,
                          "%s: the checkpoint's cursor counts %lld conversations, the file has "
                          "%lld usable ones (were max-seq-tokens, on-long or on-malformed "
                          "changed?)",
                          d->path, (long long)c->items, (long long)d->n);
    if (c->seed != seed)
        return arl_errorf(ARL_ERR_CONFIG,
                          "%s: the checkpoint's shuffle seed is %llu, this run has %llu", d->path,
                          (unsigned long long)c->seed, (unsigned long long)seed);
    if (c->epoch < 0 || c->index < 0 || c->index >= (d->n ? d->n : 1))
        return arl_errorf(ARL_ERR_RANGE, "%s: cursor epoch %lld index %lld is outside the data",
                          d->path, (long long)c->epoch, (long long)c->index);
    return ARL_OK;
}

/* ------------------------------------------------------------------------------------ */
/* batches                                                                               */

arl_status arl_sft_batch_init(arl_sft_batch *b, int64_t cap_tokens) {
    memset(b, 0, sizeof *b);
    if (cap_tokens < 2)
        return arl_errorf(ARL_ERR_ARG, "sft batch: capacity %lld tokens, need >= 2",
                          (long long)cap_tokens);
    size_t n = (size_t)cap_tokens;
    b->ids = malloc(n * sizeof *b->ids);
    b->labels = malloc(n * sizeof *b->labels);
    b->mask = malloc(n);
    b->cu_seqlens = malloc((n + 1) * sizeof *b->cu_seqlens);
    b->item = malloc(n * sizeof *b->item);
    if (!b->ids || !b->labels || !b->mask || !b->cu_seqlens || !b->item) {
        arl_sft_batch_free(b);
        return arl_errorf(ARL_ERR_NOMEM, "sft batch: cannot allocate buffers for %lld tokens",
                          (long long)cap_tokens);
    }
    b->cap_tokens = cap_tokens;
    b->cap_seqs = cap_tokens;
    b->cu_seqlens[0] = 0;
    return ARL_OK;
}

void arl_sft_batch_free(arl_sft_batch *b) {
    if (!b) return;
    free(b->ids);
    free(b->labels);
    free(b->mask);
    free(b->cu_seqlens);
    free(b->item);
    memset(b, 0, sizeof *b);
}

/* Read item it's line and render it into d->tok. */
static arl_status load_item(arl_sft_data *d, int64_t it) {
    const sft_item *x = &d->items[it];
    size_t need = (size_t)x->len + 1;
    if (need > d->line_cap) {
        char *nl = realloc(d->line, need);
        if (!nl) return arl_errorf(ARL_ERR_NOMEM, "%s: out of memory", d->path);
        d->line = nl;
        d->line_cap = need;
    }
    if (fseeko(d->f, (off_t)x->offset, SEEK_SET) != 0 ||
        fread(d->line, 1, (size_t)x->len, d->f) != (size_t)x->len)
        return arl_errorf(ARL_ERR_IO, "%s:%lld: cannot read the line again (file truncated?)",
                          d->path, (long long)x->line);
    d->line[x->len] = 0;
    size_t n_full;
    arl_status s = render_line(d, d->line, (size_t)x->len, x->line, &n_full);
    if (s == ARL_ERR_NOMEM) return s;
    if (s || (int64_t)d->tok.n != x->n_tokens || tokens_hash(&d->tok) != x->hash)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "%s:%lld: the conversation changed since the file was indexed (the data "
                          "file must not change during a run)",
                          d->path, (long long)x->line);
    return ARL_OK;
}

arl_status arl_sft_data_next_batch(arl_sft_data *d, arl_data_cursor *c, int shuffle,
                                   int64_t batch_tokens, arl_sft_batch *b) {
    if (d->n == 0)
        return arl_errorf(ARL_ERR_STATE, "%s: no usable conversation (see the data statistics)",
                          d->path);
    ARL_ASSERT(batch_tokens <= b->cap_tokens);
    const int64_t P = d->prefix_len;
    if (batch_tokens < d->stats.max_tokens - P)
        return arl_errorf(ARL_ERR_ARG,
                          "%s: batch of %lld tokens cannot hold the longest conversation (%lld "
                          "tokens%s); raise batch-tokens or lower max-seq-tokens",
                          d->path, (long long)batch_tokens, (long long)(d->stats.max_tokens - P),
                          P ? " after the shared prefix" : "");
    ARL_TRY(arl_sft_data_cursor_check(d, c->seed, c));
    b->T = 0;
    b->n_seqs = 0;
    b->n_targets = 0;
    b->epoch = c->epoch;
    b->cu_seqlens[0] = 0;
    b->prefix_ids = P ? d->prefix : NULL;
    b->prefix_len = P;
    while (c->index < d->n) {
        int64_t it = order_at(d, c->seed, c->epoch, shuffle, c->index);
        int64_t nt = d->items[it].n_tokens - P; /* the suffix */
        if (b->T + nt > batch_tokens) break;
        ARL_TRY(load_item(d, it));
        const int32_t *ids = d->tok.ids + P;
        const uint8_t *mask = d->tok.mask + P;
        int64_t base = b->T;
        for (int64_t i = 0; i < nt; i++) {
            b->ids[base + i] = ids[i];
            b->mask[base + i] = mask[i];
        }
        for (int64_t i = 0; i < nt; i++) {
            int has = i + 1 < nt && mask[i + 1];
            b->labels[base + i] = has ? ids[i + 1] : ARL_SFT_IGNORE;
            b->n_targets += has;
        }
        b->item[b->n_seqs] = it;
        b->T += nt;
        b->cu_seqlens[++b->n_seqs] = (int32_t)b->T;
        c->index++;
    }
    ARL_ASSERT(b->n_seqs > 0);
    if (c->index >= d->n) {
        c->epoch++;
        c->index = 0;
    }
    cursor_locate(d, c, shuffle);
    return ARL_OK;
}
