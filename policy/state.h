/* policy/state.h: the decode state of a batch of sequences (spec/policy.md sections 3.6, 4.2,
 * 4.4) - slots that sequences join and leave between steps (continuous batching), and the
 * export/import of one sequence's state as the versioned ARLS byte string of section 4.4.
 *
 * What this is: storage and bookkeeping.  Per slot: the position (tokens since the last fresh
 * start), per KDA layer the recurrent state S (H, dk, dv) and the three conv tails
 * (3, P, W-1), per MLA layer the latent cache rows [c; k_pe] (position, R) in fp32.  The KDA
 * parts of every slot live in one arena allocated at init (their size does not depend on the
 * position); each slot's MLA caches are one buffer per MLA layer that grows in blocks
 * (rows rounded up to ARL_STATE_ROWS_BLOCK, at least doubling), never per token, and is kept
 * when the slot is left so that the next sequence reuses it.  For block-sparse MLA (spec 4.5)
 * a slot also keeps per MLA layer the chunk summaries of its latent rows (one row of R per
 * chunk, growing with the cache), which the forward brings up to date as rows arrive.
 * What this is not: the computation that advances a state (policy/model.h:
 * arl_model_forward_state, arl_model_prefill, arl_model_decode_step).
 *
 * Export format (section 4.4): a 64-byte header - "ARLS", format_version 1, header_size 64,
 * config_sha256 (raw 32 bytes), position (u64), n_blobs (u32), latent_dtype (u8: 0x12 f32
 * here; 0x11 bf16 is accepted on import), 7 reserved zero bytes, header_crc32 of bytes
 * 0..59 - then the blobs of spec/replay.md section 5 back to back, in layer order: a KDA
 * layer gives KDA_STATE [H, dk, dv] then CONV_TAIL [3, P, W-1] (f32); an MLA layer gives its
 * `position` rows in MLA_LATENT blobs [rows, R] of at most floor(64 MiB / (R * 4)) rows each,
 * in row order (none when position = 0).  All integers little-endian.
 *
 * Symbols: H KDA heads, dk = dv head dims, P = H*dk, W conv taps, R = kv_lora_rank +
 * qk_rope_head_dim, L layers.
 */
#ifndef ARL_POLICY_STATE_H
#define ARL_POLICY_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "core/sha256.h"
#include "core/status.h"
#include "policy/config.h"

#define ARL_STATE_MAGIC "ARLS"
#define ARL_STATE_FORMAT_VERSION 1
#define ARL_STATE_HEADER_SIZE 64
/* MLA cache rows are allocated in multiples of this many rows. */
#define ARL_STATE_ROWS_BLOCK 256
/* The most positions of one sequence (decode states' and models' max_context) and tokens of one
 * forward (max_tokens) this build accepts: 2^40, about a million times K3's 1,048,576-token
 * context.  Above it the workspace sizes (max_context times the lanes and the latent width)
 * and a latent cache's bytes (rows x (rkv + r) x 4) can pass 2^63 and wrap: an allocation of
 * the wrapped size would succeed and be overrun. */
#define ARL_MAX_CONTEXT_ROWS ((int64_t)1 << 40)

typedef struct arl_decode_slot {
    int32_t active;  /* 1 while a sequence occupies the slot */
    int64_t pos;     /* tokens since the sequence's last fresh start */
    float *kda_S;    /* (n_kda, H, dk, dv) in the state's arena */
    float *kda_conv; /* (n_kda, 3, P, W-1) in the state's arena */
    float **latent;  /* (n_mla) per MLA layer a (cap, R) row buffer or NULL; owned */
    int64_t cap;     /* rows allocated in each latent buffer */
    /* block-sparse MLA (spec 4.5), when the state keeps chunk summaries (means_chunk > 0):
     * per MLA layer (cap / means_chunk + 1, R) summaries of the latent rows as
     * policy/mla.h arl_mla_chunk_means_update leaves them, and the rows they cover.  The
     * forward keeps them current; every function here that changes the rows otherwise (join,
     * reset, import) sets the covered count to 0. */
    float **means;       /* (n_mla) or NULL; owned */
    int64_t *means_rows; /* (n_mla) or NULL; owned */
} arl_decode_slot;

typedef struct arl_decode_state {
    arl_model_dims dm; /* copied from the config */
    uint8_t config_sha256[ARL_SHA256_BYTES];
    int32_t *kda_index; /* (L) index among KDA layers, or -1; owned */
    int32_t *mla_index; /* (L) index among MLA layers, or -1; owned */
    int32_t n_slots;
    int64_t max_context;    /* most positions of one sequence */
    arl_decode_slot *slots; /* (n_slots), owned */
    float *arena;           /* KDA states and conv tails of every slot, owned */
    int64_t means_chunk;    /* n_c of the kept chunk summaries; 0: none kept */
} arl_decode_state;

/* Allocate the state of n_slots >= 1 sequences for cfg (not referenced after return), each up
 * to max_context positions, 1 <= max_context <= ARL_MAX_CONTEXT_ROWS.  Every slot starts inactive.
 * ARL_ERR_NOMEM names the size. */
arl_status arl_decode_state_init(arl_decode_state *st, const arl_model_config *cfg, int32_t n_slots,
                                 int64_t max_context);

/* Free everything and zero st.  NULL is a no-op. */
void arl_decode_state_free(arl_decode_state *st);

/* Take a free slot for a new sequence starting fresh (position 0, zero state): *slot.
 * ARL_ERR_FULL when every slot is active. */
arl_status arl_decode_state_join(arl_decode_state *st, int32_t *slot);

/* Release a slot (its latent buffers are kept for reuse).  Asserts on a bad slot. */
void arl_decode_state_leave(arl_decode_state *st, int32_t slot);

/* Restart the slot's sequence fresh (position 0, zero state); the slot stays active. */
void arl_decode_state_reset(arl_decode_state *st, int32_t slot);

/* Position of an active slot. */
int64_t arl_decode_state_position(const arl_decode_state *st, int32_t slot);

/* Make room for `rows` latent rows in every MLA layer of the slot (growing in blocks).
 * ARL_ERR_RANGE when rows > max_context, ARL_ERR_NOMEM if the allocation fails (the slot is
 * then unchanged). */
arl_status arl_decode_state_reserve(arl_decode_state *st, int32_t slot, int64_t rows);

/* Keep block-sparse chunk summaries of chunk length n_c >= 1 in every slot from now on
 * (spec 4.5; the model calls this on the first block-sparse forward over the state).  Their
 * buffers are allocated for every slot's capacity and grow with it; all start covering no
 * row.  A different n_c replaces them.  ARL_ERR_NOMEM names the size (nothing is kept then). */
arl_status arl_decode_state_keep_means(arl_decode_state *st, int64_t n_c);

/* Chunk summaries of an MLA layer of a slot ((cap / means_chunk + 1, R)) and, in *rows, the
 * pointer to the count of rows they cover; NULL when none are kept. */
float *arl_decode_state_means(const arl_decode_state *st, int32_t slot, int64_t l, int64_t **rows);

/* Views of one layer's state of a slot (layer l 0-based; asserts on the wrong layer kind). */
float *arl_decode_state_kda_S(const arl_decode_state *st, int32_t slot,
                              int64_t l); /* (H, dk, dv) */
float *arl_decode_state_kda_conv(const arl_decode_state *st, int32_t slot,
                                 int64_t l); /* (3, P, W-1) */
float *arl_decode_state_latent(const arl_decode_state *st, int32_t slot, int64_t l); /* (pos, R) */

/* Bytes of the export of a slot at its current position. */
size_t arl_decode_state_export_size(const arl_decode_state *st, int32_t slot);

/* Write the export of an active slot into buf (cap >= arl_decode_state_export_size); *len
 * receives the bytes written.  ARL_ERR_RANGE if cap is too small. */
arl_status arl_decode_state_export(const arl_decode_state *st, int32_t slot, void *buf, size_t cap,
                                   size_t *len);

/* Same into a new buffer: *buf is malloc'ed (caller frees with free), *len its size. */
arl_status arl_decode_state_export_alloc(const arl_decode_state *st, int32_t slot, uint8_t **buf,
                                         size_t *len);

/* Replace the state of active slot `slot` by an export.  Checks magic, versions, header size,
 * reserved bytes, CRCs, the config hash against this state's config, and every blob's kind,
 * dtype and shape (and that the MLA rows add up to `position` in every MLA layer); the error
 * (ARL_ERR_FORMAT, _VERSION, _CORRUPT, _CONFIG, _SHAPE or _RANGE) names the first mismatch
 * and the blob index.  bf16 latents are widened to fp32.  On failure the slot is reset to a
 * fresh start (position 0). */
arl_status arl_decode_state_import(arl_decode_state *st, int32_t slot, const void *buf, size_t len);

#endif
