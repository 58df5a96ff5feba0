/* policy/state.c: decode-state slots and the ARLS export/import of spec/policy.md 4.4 (see
 * policy/state.h). */
#include "policy/state.h"

#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/blob.h"
#include "core/crc32.h"
#include "core/dtype.h"

static int64_t kda_S_floats(const arl_model_dims *dm) {
    return dm->H * dm->dk * dm->dv;
}

static int64_t kda_conv_floats(const arl_model_dims *dm) {
    return 3 * dm->P * (dm->W - 1);
}

static int64_t row_width(const arl_model_dims *dm) {
    return dm->rkv + dm->r;
}

arl_status arl_decode_state_init(arl_decode_state *st, const arl_model_config *cfg, int32_t n_slots,
                                 int64_t max_context) {
    memset(st, 0, sizeof *st);
    if (n_slots < 1 || max_context < 1)
        return arl_errorf(ARL_ERR_ARG,
                          "decode state: need at least 1 slot and 1 position, got %d slots, "
                          "max_context %lld",
                          n_slots, (long long)max_context);
    if (max_context > ARL_MAX_CONTEXT_ROWS)
        return arl_errorf(ARL_ERR_RANGE,
                          "decode state: max_context %lld is above the largest this build "
                          "supports, %lld positions (2^40)",
                          (long long)max_context, (long long)ARL_MAX_CONTEXT_ROWS);
    st->dm = cfg->dims;
    ARL_TRY(arl_model_config_hash(cfg, st->config_sha256));
    st->n_slots = n_slots;
    st->max_context = max_context;
    const arl_model_dims *dm = &st->dm;
    st->kda_index = malloc(sizeof(int32_t) * (size_t)dm->L);
    st->mla_index = malloc(sizeof(int32_t) * (size_t)dm->L);
    st->slots = calloc((size_t)n_slots, sizeof *st->slots);
    int64_t per_slot = dm->n_kda * (kda_S_floats(dm) + kda_conv_floats(dm));
    size_t bytes = sizeof(float) * (size_t)(per_slot * n_slots);
    st->arena = bytes ? calloc(1, bytes) : NULL;
    if (!st->kda_index || !st->mla_index || !st->slots || (bytes && !st->arena)) {
        arl_decode_state_free(st);
        return arl_errorf(ARL_ERR_NOMEM,
                          "decode state: out of memory allocating %zu bytes for %d "
                          "slots",
                          bytes, n_slots);
    }
    int32_t nk = 0, nm = 0;
    for (int64_t l = 0; l < dm->L; l++) {
        int kda = arl_model_config_layer_kind(cfg, l) == ARL_LAYER_KDA;
        st->kda_index[l] = kda ? nk++ : -1;
        st->mla_index[l] = kda ? -1 : nm++;
    }
    for (int32_t i = 0; i < n_slots; i++) {
        arl_decode_slot *s = &st->slots[i];
        s->kda_S = st->arena + i * per_slot;
        s->kda_conv = s->kda_S + dm->n_kda * kda_S_floats(dm);
        if (dm->n_mla > 0) {
            s->latent = calloc((size_t)dm->n_mla, sizeof(float *));
            if (!s->latent) {
                arl_decode_state_free(st);
                return arl_errorf(ARL_ERR_NOMEM, "decode state: out of memory");
            }
        }
    }
    return ARL_OK;
}

void arl_decode_state_free(arl_decode_state *st) {
    if (!st) return;
    if (st->slots)
        for (int32_t i = 0; i < st->n_slots; i++) {
            arl_decode_slot *s = &st->slots[i];
            if (s->latent)
                for (int64_t j = 0; j < st->dm.n_mla; j++)
                    free(s->latent[j]);
            free(s->latent);
            if (s->means)
                for (int64_t j = 0; j < st->dm.n_mla; j++)
                    free(s->means[j]);
            free(s->means);
            free(s->means_rows);
        }
    free(st->slots);
    free(st->arena);
    free(st->kda_index);
    free(st->mla_index);
    memset(st, 0, sizeof *st);
}

static void slot_clear(arl_decode_state *st, arl_decode_slot *s) {
    const arl_model_dims *dm = &st->dm;
    memset(s->kda_S, 0, sizeof(float) * (size_t)(dm->n_kda * kda_S_floats(dm)));
    memset(s->kda_conv, 0, sizeof(float) * (size_t)(dm->n_kda * kda_conv_floats(dm)));
    s->pos = 0;
    if (s->means_rows) memset(s->means_rows, 0, sizeof(int64_t) * (size_t)dm->n_mla);
}

/* Summary rows for `cap` cache rows with chunks of n_c. */
static int64_t means_cap(int64_t cap, int64_t n_c) {
    return cap / n_c + 1;
}

arl_status arl_decode_state_keep_means(arl_decode_state *st, int64_t n_c) {
    ARL_ASSERT(n_c >= 1);
    const int64_t n_mla = st->dm.n_mla, R = row_width(&st->dm);
    if (n_mla == 0 || st->means_chunk == n_c) return ARL_OK;
    st->means_chunk = 0;
    for (int32_t i = 0; i < st->n_slots; i++) {
        arl_decode_slot *s = &st->slots[i];
        if (!s->means) s->means = calloc((size_t)n_mla, sizeof(float *));
        if (!s->means_rows) s->means_rows = calloc((size_t)n_mla, sizeof(int64_t));
        if (!s->means || !s->means_rows)
            return arl_errorf(ARL_ERR_NOMEM, "decode state: out of memory");
        size_t bytes = sizeof(float) * (size_t)(means_cap(s->cap, n_c) * R);
        for (int64_t j = 0; j < n_mla; j++) {
            float *p = realloc(s->means[j], bytes);
            if (!p)
                return arl_errorf(ARL_ERR_NOMEM,
                                  "decode state: out of memory allocating %zu bytes of "
                                  "block-sparse chunk summaries",
                                  bytes);
            s->means[j] = p;
            s->means_rows[j] = 0;
        }
    }
    st->means_chunk = n_c;
    return ARL_OK;
}

float *arl_decode_state_means(const arl_decode_state *st, int32_t slot, int64_t l, int64_t **rows) {
    ARL_ASSERT(slot >= 0 && slot < st->n_slots && l >= 0 && l < st->dm.L);
    ARL_ASSERT(st->mla_index[l] >= 0);
    const arl_decode_slot *s = &st->slots[slot];
    if (st->means_chunk == 0 || !s->means) {
        *rows = NULL;
        return NULL;
    }
    *rows = &s->means_rows[st->mla_index[l]];
    return s->means[st->mla_index[l]];
}

arl_status arl_decode_state_join(arl_decode_state *st, int32_t *slot) {
    for (int32_t i = 0; i < st->n_slots; i++)
        if (!st->slots[i].active) {
            st->slots[i].active = 1;
            slot_clear(st, &st->slots[i]);
            *slot = i;
            return ARL_OK;
        }
    return arl_errorf(ARL_ERR_FULL,
                      "decode state: all %d slots are in use (leave one first, or "
                      "create the state with more slots)",
                      st->n_slots);
}

void arl_decode_state_leave(arl_decode_state *st, int32_t slot) {
    ARL_ASSERT(slot >= 0 && slot < st->n_slots && st->slots[slot].active);
    st->slots[slot].active = 0;
    st->slots[slot].pos = 0;
}

void arl_decode_state_reset(arl_decode_state *st, int32_t slot) {
    ARL_ASSERT(slot >= 0 && slot < st->n_slots && st->slots[slot].active);
    slot_clear(st, &st->slots[slot]);
}

int64_t arl_decode_state_position(const arl_decode_state *st, int32_t slot) {
    ARL_ASSERT(slot >= 0 && slot < st->n_slots && st->slots[slot].active);
    return st->slots[slot].pos;
}

arl_status arl_decode_state_reserve(arl_decode_state *st, int32_t slot, int64_t rows) {
    ARL_ASSERT(slot >= 0 && slot < st->n_slots);
    arl_decode_slot *s = &st->slots[slot];
    if (rows > st->max_context)
        return arl_errorf(ARL_ERR_RANGE,
                          "decode state: sequence of slot %d would reach %lld "
                          "positions, more than max_context %lld",
                          slot, (long long)rows, (long long)st->max_context);
    if (rows <= s->cap || st->dm.n_mla == 0) return ARL_OK;
    int64_t cap = s->cap * 2 > rows ? s->cap * 2 : rows;
    cap = (cap + ARL_STATE_ROWS_BLOCK - 1) / ARL_STATE_ROWS_BLOCK * ARL_STATE_ROWS_BLOCK;
    if (cap > st->max_context) cap = st->max_context;
    const int64_t R = row_width(&st->dm);
    for (int64_t j = 0; j < st->dm.n_mla; j++) {
        float *p = realloc(s->latent[j], sizeof(float) * (size_t)(cap * R));
        if (!p) {
            /* buffers already grown keep their (larger) size; cap stays the old minimum */
            return arl_errorf(ARL_ERR_NOMEM,
                              "decode state: out of memory growing the latent "
                              "cache of slot %d to %lld rows",
                              slot, (long long)cap);
        }
        s->latent[j] = p;
        if (st->means_chunk > 0) {
            float *q =
                realloc(s->means[j], sizeof(float) * (size_t)(means_cap(cap, st->means_chunk) * R));
            if (!q)
                return arl_errorf(ARL_ERR_NOMEM,
                                  "decode state: out of memory growing the chunk "
                                  "summaries of slot %d",
                                  slot);
            s->means[j] = q;
        }
    }
    s->cap = cap;
    return ARL_OK;
}

float *arl_decode_state_kda_S(const arl_decode_state *st, int32_t slot, int64_t l) {
    ARL_ASSERT(slot >= 0 && slot < st->n_slots && l >= 0 && l < st->dm.L);
    ARL_ASSERT(st->kda_index[l] >= 0);
    return st->slots[slot].kda_S + st->kda_index[l] * kda_S_floats(&st->dm);
}

float *arl_decode_state_kda_conv(const arl_decode_state *st, int32_t slot, int64_t l) {
    ARL_ASSERT(slot >= 0 && slot < st->n_slots && l >= 0 && l < st->dm.L);
    ARL_ASSERT(st->kda_index[l] >= 0);
    return st->slots[slot].kda_conv + st->kda_index[l] * kda_conv_floats(&st->dm);
}

float *arl_decode_state_latent(const arl_decode_state *st, int32_t slot, int64_t l) {
    ARL_ASSERT(slot >= 0 && slot < st->n_slots && l >= 0 && l < st->dm.L);
    ARL_ASSERT(st->mla_index[l] >= 0);
    return st->slots[slot].latent[st->mla_index[l]];
}

/* ---- export / import ---- */

/* Rows per MLA_LATENT blob: floor(64 MiB / (R * 4)) (spec/replay.md 5.4). */
static int64_t rows_per_blob(const arl_model_dims *dm, size_t elem) {
    int64_t r = (int64_t)(ARL_BLOB_MAX_BYTES / ((uint64_t)row_width(dm) * elem));
    return r > 0 ? r : 1;
}

size_t arl_decode_state_export_size(const arl_decode_state *st, int32_t slot) {
    const arl_model_dims *dm = &st->dm;
    int64_t pos = st->slots[slot].pos, rpb = rows_per_blob(dm, 4);
    size_t n = ARL_STATE_HEADER_SIZE;
    n += (size_t)dm->n_kda * (2 * ARL_BLOB_HEADER_SIZE +
                              sizeof(float) * (size_t)(kda_S_floats(dm) + kda_conv_floats(dm)));
    int64_t chunks = (pos + rpb - 1) / rpb;
    n += (size_t)dm->n_mla *
         ((size_t)chunks * ARL_BLOB_HEADER_SIZE + sizeof(float) * (size_t)(pos * row_width(dm)));
    return n;
}

static void put_u16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t get_u16(const uint8_t *p) {
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Append one f32 blob to out at *at. */
static arl_status put_blob(uint8_t *out, size_t cap, size_t *at, arl_blob_kind kind, int ndim,
                           const uint64_t *dims, const float *data) {
    size_t len;
    ARL_TRY(arl_blob_encode(kind, ARL_BLOB_F32, ndim, dims, data, out + *at, cap - *at, &len));
    *at += len;
    return ARL_OK;
}

arl_status arl_decode_state_export(const arl_decode_state *st, int32_t slot, void *buf, size_t cap,
                                   size_t *len) {
    ARL_ASSERT(slot >= 0 && slot < st->n_slots);
    const arl_decode_slot *s = &st->slots[slot];
    if (!s->active)
        return arl_errorf(ARL_ERR_STATE,
                          "decode state: export of slot %d, which holds no "
                          "sequence",
                          slot);
    size_t need = arl_decode_state_export_size(st, slot);
    if (cap < need)
        return arl_errorf(ARL_ERR_RANGE,
                          "decode state: export of slot %d needs %zu bytes, buffer "
                          "has %zu",
                          slot, need, cap);
    const arl_model_dims *dm = &st->dm;
    const int64_t R = row_width(dm), rpb = rows_per_blob(dm, 4);
    uint8_t *out = buf;
    memset(out, 0, ARL_STATE_HEADER_SIZE);
    size_t at = ARL_STATE_HEADER_SIZE;
    uint32_t n_blobs = 0;
    for (int64_t l = 0; l < dm->L; l++) {
        if (st->kda_index[l] >= 0) {
            uint64_t ds[3] = {(uint64_t)dm->H, (uint64_t)dm->dk, (uint64_t)dm->dv};
            uint64_t dc[3] = {3, (uint64_t)dm->P, (uint64_t)(dm->W - 1)};
            ARL_TRY(put_blob(out, cap, &at, ARL_BLOB_KDA_STATE, 3, ds,
                             arl_decode_state_kda_S(st, slot, l)));
            ARL_TRY(put_blob(out, cap, &at, ARL_BLOB_CONV_TAIL, 3, dc,
                             arl_decode_state_kda_conv(st, slot, l)));
            n_blobs += 2;
        } else {
            const float *lat = s->latent[st->mla_index[l]];
            for (int64_t r0 = 0; r0 < s->pos; r0 += rpb) {
                int64_t rows = s->pos - r0 < rpb ? s->pos - r0 : rpb;
                uint64_t dl[2] = {(uint64_t)rows, (uint64_t)R};
                ARL_TRY(put_blob(out, cap, &at, ARL_BLOB_MLA_LATENT, 2, dl, lat + r0 * R));
                n_blobs++;
            }
        }
    }
    memcpy(out, ARL_STATE_MAGIC, 4);
    put_u16(out + 4, ARL_STATE_FORMAT_VERSION);
    put_u16(out + 6, ARL_STATE_HEADER_SIZE);
    memcpy(out + 8, st->config_sha256, ARL_SHA256_BYTES);
    put_u64(out + 40, (uint64_t)s->pos);
    put_u32(out + 48, n_blobs);
    out[52] = ARL_BLOB_F32;
    put_u32(out + 60, arl_crc32(out, 60));
    ARL_ASSERT(at == need);
    *len = at;
    return ARL_OK;
}

arl_status arl_decode_state_export_alloc(const arl_decode_state *st, int32_t slot, uint8_t **buf,
                                         size_t *len) {
    *buf = NULL;
    *len = 0;
    size_t n = arl_decode_state_export_size(st, slot);
    uint8_t *b = malloc(n);
    if (!b) return arl_errorf(ARL_ERR_NOMEM, "decode state: out of memory (%zu bytes)", n);
    arl_status s = arl_decode_state_export(st, slot, b, n, len);
    if (s) {
        free(b);
        return s;
    }
    *buf = b;
    return ARL_OK;
}

static const char *hex32(const uint8_t *h, char out[ARL_SHA256_HEX_CHARS]) {
    return arl_sha256_hex(h, out);
}

/* The import proper; on failure the caller resets the slot. */
static arl_status import_into(arl_decode_state *st, int32_t slot, const uint8_t *in, size_t len) {
    const arl_model_dims *dm = &st->dm;
    arl_decode_slot *s = &st->slots[slot];
    if (len < ARL_STATE_HEADER_SIZE)
        return arl_errorf(ARL_ERR_FORMAT,
                          "state import: %zu bytes, shorter than the %d-byte "
                          "header",
                          len, ARL_STATE_HEADER_SIZE);
    if (memcmp(in, ARL_STATE_MAGIC, 4))
        return arl_errorf(ARL_ERR_FORMAT, "state import: bad magic (not an ARLS decode state)");
    if (get_u16(in + 4) != ARL_STATE_FORMAT_VERSION)
        return arl_errorf(ARL_ERR_VERSION, "state import: format_version %u, this build reads %d",
                          get_u16(in + 4), ARL_STATE_FORMAT_VERSION);
    if (get_u16(in + 6) != ARL_STATE_HEADER_SIZE)
        return arl_errorf(ARL_ERR_FORMAT, "state import: header_size %u, expected %d",
                          get_u16(in + 6), ARL_STATE_HEADER_SIZE);
    if (get_u32(in + 60) != arl_crc32(in, 60))
        return arl_errorf(ARL_ERR_CORRUPT,
                          "state import: header CRC-32 mismatch (stored %08x, "
                          "computed %08x)",
                          get_u32(in + 60), arl_crc32(in, 60));
    for (int i = 53; i < 60; i++)
        if (in[i])
            return arl_errorf(ARL_ERR_FORMAT,
                              "state import: reserved header byte %d is %u, "
                              "must be 0",
                              i, in[i]);
    if (memcmp(in + 8, st->config_sha256, ARL_SHA256_BYTES)) {
        char a[ARL_SHA256_HEX_CHARS], b[ARL_SHA256_HEX_CHARS];
        return arl_errorf(ARL_ERR_CONFIG,
                          "state import: config hash %s differs from the model's "
                          "%s (the state was produced by another model config)",
                          hex32(in + 8, a), hex32(st->config_sha256, b));
    }
    uint64_t pos = get_u64(in + 40);
    uint32_t n_blobs = get_u32(in + 48);
    uint8_t ldt = in[52];
    if (ldt != ARL_BLOB_F32 && ldt != ARL_BLOB_BF16)
        return arl_errorf(ARL_ERR_FORMAT,
                          "state import: latent_dtype 0x%02x, expected 0x11 "
                          "(bf16) or 0x12 (f32)",
                          ldt);
    if (pos > (uint64_t)st->max_context)
        return arl_errorf(ARL_ERR_RANGE, "state import: position %llu exceeds max_context %lld",
                          (unsigned long long)pos, (long long)st->max_context);
    ARL_TRY(arl_decode_state_reserve(st, slot, (int64_t)pos));

    const int64_t R = row_width(dm);
    size_t at = ARL_STATE_HEADER_SIZE;
    uint32_t bi = 0; /* blob index */
    for (int64_t l = 0; l < dm->L; l++) {
        int is_kda = st->kda_index[l] >= 0;
        int64_t rows_done = 0;
        for (int part = 0;; part++) {
            if (is_kda && part == 2) break;
            if (!is_kda && rows_done == (int64_t)pos) break;
            if (bi >= n_blobs)
                return arl_errorf(ARL_ERR_SHAPE,
                                  "state import: header says %u blobs, layer %lld "
                                  "needs more",
                                  n_blobs, (long long)l);
            if (len - at < ARL_BLOB_HEADER_SIZE)
                return arl_errorf(ARL_ERR_FORMAT, "state import: blob %u (layer %lld) truncated",
                                  bi, (long long)l);
            uint64_t pn = get_u64(in + at + 48);
            if (pn > len - at - ARL_BLOB_HEADER_SIZE)
                return arl_errorf(ARL_ERR_FORMAT,
                                  "state import: blob %u (layer %lld) claims %llu "
                                  "payload bytes, only %zu remain",
                                  bi, (long long)l, (unsigned long long)pn,
                                  len - at - ARL_BLOB_HEADER_SIZE);
            arl_blob_expect want;
            memset(&want, 0, sizeof want);
            if (is_kda && part == 0) {
                want.kind = ARL_BLOB_KDA_STATE;
                want.dims_mask = 7;
                want.dims[0] = (uint64_t)dm->H;
                want.dims[1] = (uint64_t)dm->dk;
                want.dims[2] = (uint64_t)dm->dv;
            } else if (is_kda) {
                want.kind = ARL_BLOB_CONV_TAIL;
                want.dims_mask = 7;
                want.dims[0] = 3;
                want.dims[1] = (uint64_t)dm->P;
                want.dims[2] = (uint64_t)(dm->W - 1);
            } else {
                want.kind = ARL_BLOB_MLA_LATENT;
                want.dtype = ldt;
                want.dims_mask = 2;
                want.dims[1] = (uint64_t)R;
            }
            arl_blob_header h;
            const void *payload;
            arl_status e = arl_blob_check(in + at, ARL_BLOB_HEADER_SIZE + pn, &want, &h, &payload);
            if (e)
                return arl_error_prefix(e, "state import: blob %u (layer %lld, %s)", bi,
                                        (long long)l, is_kda ? "KDA" : "MLA");
            if (is_kda) {
                float *dst = part == 0 ? arl_decode_state_kda_S(st, slot, l)
                                       : arl_decode_state_kda_conv(st, slot, l);
                memcpy(dst, payload, pn);
            } else {
                int64_t rows = (int64_t)h.dims[0];
                if (rows == 0 || rows > (int64_t)pos - rows_done)
                    return arl_errorf(ARL_ERR_SHAPE,
                                      "state import: blob %u (layer %lld) has %lld "
                                      "latent rows; %lld of position %llu remain",
                                      bi, (long long)l, (long long)rows,
                                      (long long)((int64_t)pos - rows_done),
                                      (unsigned long long)pos);
                float *dst = s->latent[st->mla_index[l]] + rows_done * R;
                if (ldt == ARL_BLOB_F32)
                    memcpy(dst, payload, pn);
                else
                    arl_dtype_to_f32(ARL_DTYPE_BF16, payload, dst, (size_t)(rows * R));
                rows_done += rows;
            }
            at += ARL_BLOB_HEADER_SIZE + pn;
            bi++;
        }
    }
    if (bi != n_blobs)
        return arl_errorf(ARL_ERR_SHAPE,
                          "state import: header says %u blobs, the model's layers "
                          "use %u",
                          n_blobs, bi);
    if (at != len)
        return arl_errorf(ARL_ERR_FORMAT, "state import: %zu trailing bytes after the last blob",
                          len - at);
    s->pos = (int64_t)pos;
    if (s->means_rows) /* new rows: the chunk summaries are redone on the next forward */
        memset(s->means_rows, 0, sizeof(int64_t) * (size_t)dm->n_mla);
    return ARL_OK;
}

arl_status arl_decode_state_import(arl_decode_state *st, int32_t slot, const void *buf,
                                   size_t len) {
    ARL_ASSERT(slot >= 0 && slot < st->n_slots);
    if (!st->slots[slot].active)
        return arl_errorf(ARL_ERR_STATE, "state import: slot %d holds no sequence (join first)",
                          slot);
    arl_status s = import_into(st, slot, buf, len);
    if (s) slot_clear(st, &st->slots[slot]);
    return s;
}
