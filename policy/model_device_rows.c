/* policy/model_device_rows.c: where each decode slot's MLA latent rows live in the device
 * model's st_lat (policy/model_device.h arl_model_dev_slot_rows / arl_model_dev_slot_fit).
 *
 * st_lat holds lat_rows rows per MLA layer; slot i's rows are slot_row0[i] .. + slot_cap[i]
 * in every layer (the same range in each).  With dopts.slot_rows = 0 each slot owns the fixed
 * range i * max_context .. + max_context (the layout every caller had before ranges existed).
 * With slot_rows > 0 the rows are shared: a slot has no range until it holds rows, gets one
 * when a forward or an upload needs it, grows it with headroom (1.5x, up to max_context, in
 * grains of ROW_GRAIN rows) and loses it at arl_model_dev_slot_reset.  Growing tries, in order:
 * the rows right after the range; the first free gap elsewhere (the rows copied there); the
 * slots slid down in row order to close the gaps, this one then extended in place, copied
 * after the others, or (when the free rows at the end cannot hold it) rotated behind them
 * through those free rows (rotate_rows).  A fit is refused only when the other slots hold more
 * than slot_rows minus the rows it needs.  Every move copies
 * the whole range of every MLA layer of st_lat and of lat_twin (the training step's state
 * gradients, same layout), in pieces no longer than the distance moved, so that overlapping
 * source and destination copy correctly.  Moves happen only when a slot outgrows its range:
 * O(log(max_context)) times per sequence with the headroom, never per decode step.
 */
#include "core/assert.h"
#include "policy/model_device.h"

#define ROW_GRAIN 16 /* rows: ranges are multiples of this (fewer, larger gaps) */

static int64_t grain(int64_t x) {
    return (x + ROW_GRAIN - 1) / ROW_GRAIN * ROW_GRAIN;
}

float *arl_model_dev_slot_rows(const arl_model_dev *m, float *base, int64_t j, int32_t slot) {
    ARL_ASSERT(slot >= 0 && slot < m->n_slots);
    return base + (j * m->lat_rows + m->slot_row0[slot]) * (m->dm.rkv + m->dm.r);
}

/* n rows of every MLA layer of st_lat and lat_twin from row `from` to row `to`. */
static void move_rows(arl_model_dev *m, int64_t from, int64_t to, int64_t n) {
    if (n <= 0 || from == to) return;
    const int64_t R = m->dm.rkv + m->dm.r, dist = from > to ? from - to : to - from;
    float *arrays[2] = {m->st_lat, m->lat_twin};
    for (int a = 0; a < 2; a++) {
        if (!arrays[a]) continue;
        for (int64_t j = 0; j < m->dm.n_mla; j++) {
            float *b = arrays[a] + j * m->lat_rows * R;
            /* pieces of at most dist rows: a piece's source is never a later piece's target */
            for (int64_t done = 0; done < n;) {
                const int64_t c = n - done < dist ? n - done : dist;
                const int64_t off = to < from ? done : n - done - c;
                m->kb->copy(b + (to + off) * R, b + (from + off) * R, c * R);
                done += c;
            }
        }
    }
}

/* Blocks [a, a + n) and [b, b + n) (disjoint) swapped through the free rows [buf, buf + nb). */
static void swap_rows(arl_model_dev *m, int64_t a, int64_t b, int64_t n, int64_t buf, int64_t nb) {
    for (int64_t done = 0; done < n; done += nb) {
        const int64_t c = n - done < nb ? n - done : nb;
        move_rows(m, a + done, buf, c);
        move_rows(m, b + done, a + done, c);
        move_rows(m, buf, b + done, c);
    }
}

/* Rows [a, a + x + y) holding X (x rows) then Y (y rows) made Y then X, with nb >= 1 free rows
 * at buf outside them: a part that fits the free rows is parked there while the other slides;
 * otherwise the shorter part is swapped with the far end of the longer (Gries-Mills block
 * swaps), which puts it in its final place and leaves a smaller rotation of the same kind. */
static void rotate_rows(arl_model_dev *m, int64_t a, int64_t x, int64_t y, int64_t buf,
                        int64_t nb) {
    ARL_ASSERT(nb >= 1);
    while (x > 0 && y > 0) {
        if (x <= nb) { /* X parked, Y slid down over it, X placed after Y */
            move_rows(m, a, buf, x);
            move_rows(m, a + x, a, y);
            move_rows(m, buf, a + y, x);
            return;
        }
        if (y <= nb) { /* Y parked, X slid up, Y placed first */
            move_rows(m, a + x, buf, y);
            move_rows(m, a, a + y, x);
            move_rows(m, buf, a, y);
            return;
        }
        if (x <= y) { /* X Y1 Y2 (|Y2| = x) -> Y2 Y1 X: X in place, Y2 Y1 left to rotate */
            swap_rows(m, a, a + y, x, buf, nb);
            y -= x;
        } else { /* X1 X2 Y (|X1| = y) -> Y X2 X1: Y in place, X2 X1 left to rotate */
            swap_rows(m, a, a + x, y, buf, nb);
            a += y;
            x -= y;
        }
    }
}

/* The slots holding a range, ordered by first row (insertion sort: n_slots is small). */
static int32_t live_sorted(const arl_model_dev *m, int32_t *ids) {
    int32_t n = 0;
    for (int32_t i = 0; i < m->n_slots; i++) {
        if (m->slot_cap[i] <= 0) continue;
        int32_t at = n++;
        while (at > 0 && m->slot_row0[ids[at - 1]] > m->slot_row0[i]) {
            ids[at] = ids[at - 1];
            at--;
        }
        ids[at] = i;
    }
    return n;
}

/* The first free row of a gap of at least `need` rows between the ranges of ids (ordered by
 * first row); -1 if none. */
static int64_t find_gap(const arl_model_dev *m, const int32_t *ids, int32_t n, int64_t need) {
    int64_t at = 0;
    for (int32_t k = 0; k <= n; k++) {
        const int64_t next = k < n ? m->slot_row0[ids[k]] : m->lat_rows;
        if (next - at >= need) return at;
        if (k < n) at = m->slot_row0[ids[k]] + m->slot_cap[ids[k]];
    }
    return -1;
}

static arl_status grow(arl_model_dev *m, int32_t slot, int64_t need, int64_t want) {
    int32_t *ids = m->slot_order;
    const int64_t row0 = m->slot_row0[slot], cap = m->slot_cap[slot];
    int32_t n = live_sorted(m, ids);
    /* 1. the rows right after the range */
    int64_t next = m->lat_rows;
    for (int32_t k = 0; k < n; k++)
        if (ids[k] != slot && m->slot_row0[ids[k]] >= row0 + cap && m->slot_row0[ids[k]] < next)
            next = m->slot_row0[ids[k]];
    if (cap > 0 && next - row0 >= need) {
        m->slot_cap[slot] = next - row0 < want ? next - row0 : want;
        return ARL_OK;
    }
    /* 2. a free gap elsewhere */
    for (int pass = 0; pass < 2; pass++) {
        const int64_t at = find_gap(m, ids, n, pass == 0 ? want : need);
        if (at < 0) continue;
        move_rows(m, row0, at, cap);
        m->slot_row0[slot] = at;
        m->slot_cap[slot] = pass == 0 ? want : need;
        return ARL_OK;
    }
    /* 3. close the gaps: every slot slid down in row order */
    int64_t used = 0, others = 0;
    int32_t self_k = -1;
    for (int32_t k = 0; k < n; k++) {
        const int32_t i = ids[k];
        move_rows(m, m->slot_row0[i], used, m->slot_cap[i]);
        m->slot_row0[i] = used;
        used += m->slot_cap[i];
        if (i == slot)
            self_k = k;
        else
            others += m->slot_cap[i];
    }
    if (m->lat_rows - others < need)
        return arl_errorf(ARL_ERR_RANGE,
                          "model (%s device): slot %d needs %lld latent rows, and %lld of the "
                          "%lld shared rows (slot_rows) are held by the other slots; raise "
                          "slot_rows or hold fewer documents at once",
                          m->ops->name, slot, (long long)need, (long long)others,
                          (long long)m->lat_rows);
    if (self_k < 0 || self_k == n - 1) { /* new, or already last: start or extend at the end */
        const int64_t at = self_k < 0 ? used : m->slot_row0[slot];
        m->slot_row0[slot] = at;
        m->slot_cap[slot] = m->lat_rows - at < want ? m->lat_rows - at : want;
        return ARL_OK;
    }
    if (m->lat_rows - used >= need) { /* copied after the others */
        move_rows(m, m->slot_row0[slot], used, cap);
        m->slot_row0[slot] = used;
        m->slot_cap[slot] = m->lat_rows - used < want ? m->lat_rows - used : want;
        return ARL_OK;
    }
    { /* rotated: the slots after it slid down over its rows, its rows placed last */
        const int64_t at = m->slot_row0[slot];
        rotate_rows(m, at, cap, used - at - cap, used, m->lat_rows - used);
        for (int32_t k = self_k + 1; k < n; k++)
            m->slot_row0[ids[k]] -= cap;
        m->slot_row0[slot] = used - cap;
        m->slot_cap[slot] = m->lat_rows - (used - cap) < want ? m->lat_rows - (used - cap) : want;
    }
    return ARL_OK;
}

arl_status arl_model_dev_slot_fit(arl_model_dev *m, int32_t slot, int64_t rows) {
    if (slot < 0 || slot >= m->n_slots)
        return arl_errorf(ARL_ERR_RANGE, "model (%s device): slot %d outside [0, %d)", m->ops->name,
                          slot, m->n_slots);
    if (m->dm.n_mla == 0 || rows <= m->slot_cap[slot]) return ARL_OK;
    if (rows > m->max_context)
        return arl_errorf(ARL_ERR_RANGE,
                          "model (%s device): the sequence of slot %d would reach %lld "
                          "positions, the model was set up for %lld (max_context)",
                          m->ops->name, slot, (long long)rows, (long long)m->max_context);
    ARL_ASSERT(m->dopts.slot_rows > 0); /* otherwise every range is max_context rows */
    const int64_t cap = m->slot_cap[slot];
    int64_t top = grain(m->max_context);
    if (top > m->lat_rows) top = m->lat_rows > rows ? m->lat_rows : rows;
    const int64_t need = grain(rows) < top ? grain(rows) : top;
    int64_t want = grain(cap + cap / 2);
    want = want < need ? need : want > top ? top : want;
    return grow(m, slot, need, want);
}
