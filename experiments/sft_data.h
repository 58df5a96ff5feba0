/* experiments/sft_data.h: the SFT data pipeline -- JSONL conversations rendered with the chat
 * template to token ids and a loss mask, packed into batches of at most a token budget, in a
 * deterministic shuffled order with an exact resumable cursor.
 *
 * Input: one conversation per line, the format the built-in environments' teachers write
 * (envs/builtin/teacher.h; docs/chat_template.md section 8):
 *   {"messages": [...OpenAI-style messages...], "tools": [...] | null, ...other members ignored}
 * (a bare array of messages is accepted too).  Blank lines are skipped.  Images are not
 * supported yet (the batch carries no pixels): a conversation with an image part is malformed.
 *
 * Opening a file reads it once, streaming: every line is parsed and rendered to count its
 * tokens, and an index of (byte offset, line number, length, tokens, a 64-bit hash of the
 * tokens) per usable conversation is kept (32 bytes each) together with the SHA-256 of the
 * file's bytes (the data identity a resume checks).  The path must name a regular file
 * (ARL_ERR_ARG for a directory or a pipe).  Conversations are read again from the file, by
 * offset, when a batch needs them; the file must not change while it is open (a conversation
 * that renders differently than when indexed is ARL_ERR_CORRUPT).
 *
 * Counting, never silent:
 *   - malformed lines (invalid JSON, a NUL byte, a message the template rejects, an image,
 *     a tool call naming a tool the line's "tools" do not declare)
 *     are fatal (ARL_ERR_FORMAT naming file:line and the problem) with
 *     ARL_SFT_MALFORMED_FAIL, or skipped and counted with ARL_SFT_MALFORMED_SKIP (the first
 *     ARL_SFT_MAX_LISTED line numbers and the first message are kept in the stats);
 *   - conversations longer than max_seq_tokens are cut to their first max_seq_tokens tokens
 *     (ARL_SFT_LONG_TRUNCATE, counted in `truncated`) or dropped (ARL_SFT_LONG_DROP, counted
 *     in `dropped_long`);
 *   - conversations without any loss token (no assistant message, or none left after
 *     truncation) are skipped and counted in `no_loss` (and not in `truncated`).
 *
 * Batches.  Epoch e visits the usable conversations in the order of a Fisher-Yates
 * permutation drawn from arl_rng_seed_stream(seed, e) (file order without shuffling).  A
 * batch takes conversations in that order while their total tokens stay <= batch_tokens; a
 * conversation is never split across batches and a batch never spans two epochs (the last
 * batch of an epoch may be short).  The cursor (epoch, index) says which conversation comes
 * next; the order is a pure function of (seed, epoch), so a saved cursor resumes exactly.
 *
 * Targets.  Within each packed sequence [cu_seqlens[i], cu_seqlens[i+1]) position t predicts
 * token t + 1: labels[t] = ids[t+1] when t + 1 is in the same sequence and the template's loss
 * mask of token t + 1 is 1 (an assistant token), else ARL_SFT_IGNORE.  The model never looks
 * across a sequence boundary.
 *
 * Shared prefix (arl_sft_data_open_prefix with shared_prefix = 1).  Conversations of one
 * environment begin with the same tokens (tool declarations, system prompt: ~580 of the ~690
 * tokens of a calculator demonstration).  The index pass then finds the longest prefix P that
 * every usable conversation shares and in which no position has a target (P <= first loss
 * token - 1 in each conversation).  Batches hold only the suffixes (tokens P..n-1 of each
 * conversation, labels as above within the full conversation) and the budget counts suffix
 * tokens; the batch points to the prefix, and the model computes the prefix once per batch and
 * starts every sequence from its state (experiments/sft_model.c).  The loss is the same as
 * without the split (no prefix position has a target); the gradient lacks only the terms that
 * flow through the prefix's activations, which the suffixes see as fixed context.
 *
 * Not here: the model, the loss (the model's train step computes it from labels), images.
 */
#ifndef ARL_EXPERIMENTS_SFT_DATA_H
#define ARL_EXPERIMENTS_SFT_DATA_H

#include <stdint.h>

#include "core/sha256.h"
#include "core/status.h"
#include "policy/chat.h"
#include "policy/train_state.h"

#define ARL_SFT_IGNORE (-100) /* label of positions without a target (HF ignore_index) */
#define ARL_SFT_MAX_LISTED 10 /* malformed line numbers kept in the stats */

typedef enum arl_sft_malformed {
    ARL_SFT_MALFORMED_SKIP = 0, /* skip and count */
    ARL_SFT_MALFORMED_FAIL = 1, /* the first one is an error */
} arl_sft_malformed;

typedef enum arl_sft_long {
    ARL_SFT_LONG_TRUNCATE = 0, /* keep the first max_seq_tokens tokens, count */
    ARL_SFT_LONG_DROP = 1,     /* drop the conversation, count */
} arl_sft_long;

typedef struct arl_sft_data_config {
    int64_t max_seq_tokens; /* budget of one conversation (>= 2) */
    arl_sft_malformed on_malformed;
    arl_sft_long on_long;
} arl_sft_data_config;

typedef struct arl_sft_stats {
    int64_t lines;         /* lines in the file */
    int64_t blank;         /* blank lines (skipped) */
    int64_t conversations; /* usable conversations (the items of an epoch) */
    int64_t malformed;     /* malformed lines skipped */
    int64_t truncated;     /* conversations cut to max_seq_tokens */
    int64_t dropped_long;  /* conversations dropped for length */
    int64_t no_loss;       /* conversations without a loss token (skipped) */
    int64_t tokens;        /* tokens of the usable conversations (after truncation) */
    int64_t loss_tokens;   /* loss-mask tokens among them */
    int64_t max_tokens;    /* longest usable conversation (after truncation) */
    int64_t min_tokens;    /* shortest usable conversation (0: none) */
    int64_t prefix_tokens; /* P of the shared prefix (0: none, or shared_prefix off) */
    int64_t malformed_line[ARL_SFT_MAX_LISTED]; /* first malformed line numbers (1-based) */
    char first_error[512]; /* message of the first malformed line ("" if none) */
} arl_sft_stats;

/* One packed batch.  Arrays hold cap_* entries, the first T / n_seqs are valid. */
typedef struct arl_sft_batch {
    int32_t *ids;        /* (T) token ids, sequences back to back */
    int32_t *labels;     /* (T) next-token target per position, or ARL_SFT_IGNORE */
    uint8_t *mask;       /* (T) the template's loss mask of ids (1 = assistant token) */
    int32_t *cu_seqlens; /* (n_seqs + 1) sequence starts; cu_seqlens[0] = 0, [n_seqs] = T */
    int64_t *item;       /* (n_seqs) index of each conversation in the file's usable order */
    int64_t T, n_seqs;
    int64_t n_targets; /* positions with a label */
    int64_t epoch;     /* epoch the conversations came from */
    int64_t cap_tokens, cap_seqs;
    /* shared prefix: every sequence continues these tokens (the batch holds the suffixes) */
    const int32_t *prefix_ids; /* (prefix_len) borrowed from the data, valid until its close */
    int64_t prefix_len;        /* 0: sequences start fresh */
} arl_sft_batch;

typedef struct arl_sft_data arl_sft_data;

/* Index the file at path (see above) for template t (copied).  On success *out is owned by
 * the caller (arl_sft_data_close).  Errors: ARL_ERR_IO / ARL_ERR_NOT_FOUND for the file,
 * ARL_ERR_FORMAT for a malformed line with ARL_SFT_MALFORMED_FAIL, ARL_ERR_ARG for a bad
 * config, ARL_ERR_NOMEM. */
arl_status arl_sft_data_open(const char *path, const arl_sft_data_config *cfg,
                             const arl_chat_template *t, arl_sft_data **out);
/* The same with shared_prefix = 1: split off the shared prefix (see "Shared prefix" above). */
arl_status arl_sft_data_open_prefix(const char *path, const arl_sft_data_config *cfg,
                                    int shared_prefix, const arl_chat_template *t,
                                    arl_sft_data **out);
void arl_sft_data_close(arl_sft_data *d); /* NULL-safe */

/* Statistics of the index pass; valid until close. */
const arl_sft_stats *arl_sft_data_stats(const arl_sft_data *d);
/* Usable conversations (items per epoch). */
int64_t arl_sft_data_count(const arl_sft_data *d);
/* Tokens of item i (after truncation), 0 <= i < count. */
int64_t arl_sft_data_item_tokens(const arl_sft_data *d, int64_t i);
/* 1-based line number of item i. */
int64_t arl_sft_data_item_line(const arl_sft_data *d, int64_t i);
/* Hex SHA-256 of the file's bytes; valid until close. */
const char *arl_sft_data_sha256(const arl_sft_data *d);
/* The path given to open; valid until close. */
const char *arl_sft_data_path(const arl_sft_data *d);

/* How many usable conversations of b have the same tokens (after truncation; the shared
 * prefix included) as one of a: *n, and the 1-based line numbers in b of the first cap of
 * them in lines (cap entries).  For an evaluation file (b) that is not held out from the
 * training data (a).  ARL_ERR_NOMEM only. */
arl_status arl_sft_data_overlap(const arl_sft_data *a, const arl_sft_data *b, int64_t *n,
                                int64_t *lines, int cap);

/* A cursor at the start of epoch 0 for this file and seed. */
void arl_sft_data_cursor_start(const arl_sft_data *d, uint64_t seed, arl_data_cursor *c);
/* ARL_ERR_CONFIG (naming both values) unless a saved cursor belongs to this file (same
 * item count and SHA-256) and the seed; ARL_ERR_RANGE for a position outside the epoch. */
arl_status arl_sft_data_cursor_check(const arl_sft_data *d, uint64_t seed,
                                     const arl_data_cursor *c);

/* Buffers for batches of at most cap_tokens tokens (and as many sequences). */
arl_status arl_sft_batch_init(arl_sft_batch *b, int64_t cap_tokens);
void arl_sft_batch_free(arl_sft_batch *b); /* NULL-safe */

/* Fill b with the next batch at cursor c (batch_tokens <= b->cap_tokens, and at least the
 * longest conversation, or its suffix with a shared prefix) and advance c past it (into the next epoch after the last batch of
 * an epoch).  shuffle 0 keeps file order.  Never returns an empty batch when count > 0;
 * ARL_ERR_STATE when the file has no usable conversation. */
arl_status arl_sft_data_next_batch(arl_sft_data *d, arl_data_cursor *c, int shuffle,
                                   int64_t batch_tokens, arl_sft_batch *b);

#endif
