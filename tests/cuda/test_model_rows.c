/* tests/cuda/test_model_rows.c: shared slot rows of the device model (arl_model_dev_opts
 * slot_rows > 0; policy/model_device_rows.c arl_model_dev_slot_fit), on the tiny model's shapes
 * with the "cpu" ops (the allocator and its moves are the same code for every device; the
 * copies are the backend's).
 *
 *   - a scripted sequence that takes each way a range grows: in place, into a free gap
 *     elsewhere, after sliding every slot down (the growing slot last), after parking the
 *     growing slot's rows at the end while the slots behind it slide over them, and, when the
 *     free rows at the end are fewer than its rows, after rotating it behind them through those
 *     free rows (each way of rotate_rows: its rows parked, the others' parked, block swaps with
 *     the longer part first on either side); then an exhausted pool (ARL_ERR_RANGE with the counts)
 * and a range past max_context;
 *   - 3000 random operations on four slots over a tight pool (grow by fits, uploads of new rows,
 *     resets): after every one, every slot's latent rows, KDA states and position downloaded
 *     equal the host's mirror bit for bit, the ranges lie inside the pool without overlapping and
 *     hold the slots' positions (a failed fit loses nothing either), and a fit is refused only
 *     when the other slots hold more than the pool less the rows it needs;
 *   - the settings' errors (slot_rows < 0; shared rows with CUDA graphs).
 * The training step over shared rows (the state gradients moved with them) is
 * tests/cuda/test_model_train_state.c's shared-rows case.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "policy/model_device.h"
#include "policy/state.h"
#include "tests/policy_model/tiny.h"
#include "tests/test.h"

#define NS 4
#define MAXCTX 128

static tiny_model TM;

typedef struct rig {
    arl_model_dev md;
    arl_decode_state host; /* the mirror: what each device slot must hold */
    arl_decode_state back; /* downloads */
    arl_rng rng;
} rig;

static void rig_open(rig *g, int64_t slot_rows) {
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_tokens = 64;
    o.max_docs = NS;
    o.max_context = MAXCTX;
    arl_model_dev_opts d = {.n_slots = NS, .slot_rows = slot_rows};
    CHECK_MSG(arl_model_dev_init(&g->md, arl_dev_ops_cpu(), &TM.cfg, &TM.w, &o, &d) == ARL_OK, "%s",
              arl_error_msg());
    CHECK(arl_decode_state_init(&g->host, &TM.cfg, NS, MAXCTX) == ARL_OK);
    CHECK(arl_decode_state_init(&g->back, &TM.cfg, NS, MAXCTX) == ARL_OK);
    for (int32_t i = 0; i < NS; i++) {
        int32_t s;
        CHECK(arl_decode_state_join(&g->host, &s) == ARL_OK && s == i);
        CHECK(arl_decode_state_join(&g->back, &s) == ARL_OK && s == i);
    }
    arl_rng_seed(&g->rng, 0x5107);
}

static void rig_close(rig *g) {
    arl_decode_state_free(&g->back);
    arl_decode_state_free(&g->host);
    arl_model_dev_free(&g->md);
}

/* The host slot i extended to pos rows (new rows and the KDA state random), uploaded; when the
 * rows cannot be had, the status (the device slot and the mirror unchanged). */
static arl_status put(rig *g, int32_t i, int64_t pos) {
    arl_status fs = arl_model_dev_slot_fit(&g->md, i, pos);
    if (fs) return fs;
    const arl_model_dims *dm = &TM.cfg.dims;
    const int64_t R = dm->rkv + dm->r, sn = dm->H * dm->dk * dm->dv;
    const int64_t tn = 3 * dm->P * (dm->W - 1);
    arl_decode_slot *h = &g->host.slots[i];
    CHECK(arl_decode_state_reserve(&g->host, i, pos) == ARL_OK);
    for (int64_t j = 0; j < dm->n_mla; j++)
        for (int64_t e = h->pos * R; e < pos * R; e++)
            h->latent[j][e] = (float)arl_rng_normal(&g->rng);
    for (int64_t e = 0; e < dm->n_kda * sn; e++)
        h->kda_S[e] = (float)arl_rng_normal(&g->rng);
    for (int64_t e = 0; e < dm->n_kda * tn; e++)
        h->kda_conv[e] = (float)arl_rng_normal(&g->rng);
    h->pos = pos;
    CHECK_MSG(arl_model_dev_slot_upload(&g->md, i, &g->host, i) == ARL_OK, "%s", arl_error_msg());
    return ARL_OK;
}

/* Every slot as the mirror says, the ranges disjoint, inside the pool, holding the positions. */
static void check_all(rig *g, const char *what) {
    const arl_model_dims *dm = &TM.cfg.dims;
    const arl_model_dev *m = &g->md;
    const int64_t R = dm->rkv + dm->r;
    for (int32_t i = 0; i < NS; i++) {
        const arl_decode_slot *h = &g->host.slots[i];
        CHECK_MSG(arl_model_dev_slot_pos(m, i) == h->pos, "%s: slot %d position", what, i);
        CHECK_MSG(m->slot_cap[i] >= h->pos, "%s: slot %d range %lld < position %lld", what, i,
                  (long long)m->slot_cap[i], (long long)h->pos);
        CHECK_MSG(m->slot_cap[i] == 0 ||
                      (m->slot_row0[i] >= 0 && m->slot_row0[i] + m->slot_cap[i] <= m->lat_rows),
                  "%s: slot %d range outside the pool", what, i);
        for (int32_t k = 0; k < i; k++) {
            const int disjoint = m->slot_cap[i] == 0 || m->slot_cap[k] == 0 ||
                                 m->slot_row0[i] + m->slot_cap[i] <= m->slot_row0[k] ||
                                 m->slot_row0[k] + m->slot_cap[k] <= m->slot_row0[i];
            CHECK_MSG(disjoint, "%s: slots %d and %d overlap", what, i, k);
        }
        if (h->pos == 0) continue;
        CHECK(arl_model_dev_slot_download(&g->md, i, &g->back, i, 0) == ARL_OK);
        const arl_decode_slot *b = &g->back.slots[i];
        for (int64_t j = 0; j < dm->n_mla; j++)
            CHECK_MSG(!memcmp(b->latent[j], h->latent[j], sizeof(float) * (size_t)(h->pos * R)),
                      "%s: slot %d latent rows of MLA layer %lld", what, i, (long long)j);
        CHECK_MSG(!memcmp(b->kda_S, h->kda_S,
                          sizeof(float) * (size_t)(dm->n_kda * dm->H * dm->dk * dm->dv)),
                  "%s: slot %d KDA state", what, i);
    }
}

static void reset(rig *g, int32_t i) {
    CHECK(arl_model_dev_slot_reset(&g->md, i) == ARL_OK);
    arl_decode_slot *h = &g->host.slots[i];
    h->pos = 0;
    memset(h->kda_S, 0,
           sizeof(float) *
               (size_t)(TM.cfg.dims.n_kda * TM.cfg.dims.H * TM.cfg.dims.dk * TM.cfg.dims.dv));
}

/* Each way a range grows, in a scripted order (grain 16 rows, 1.5x headroom; pool 160). */
static void test_scripted(void) {
    rig g;
    rig_open(&g, 160);
    const arl_model_dev *m = &g.md;
    for (int32_t i = 0; i < 3; i++) /* [0,32) [32,64) [64,96) */
        CHECK(put(&g, i, 20) == ARL_OK);
    check_all(&g, "three slots");
    CHECK(m->slot_row0[2] == 64 && m->slot_cap[2] == 32);
    /* in place: slot 2 has free rows after it */
    CHECK(arl_model_dev_slot_fit(&g.md, 2, 40) == ARL_OK);
    CHECK(m->slot_row0[2] == 64 && m->slot_cap[2] == 48);
    check_all(&g, "grown in place");
    /* into the gap at the end: slot 0 is boxed in by slot 1 */
    CHECK(arl_model_dev_slot_fit(&g.md, 0, 40) == ARL_OK);
    CHECK(m->slot_row0[0] == 112 && m->slot_cap[0] == 48);
    check_all(&g, "moved to a gap");
    /* slot 1 (first after sliding, 32 rows free at the end): parked, the others slid over it,
     * placed last */
    CHECK(arl_model_dev_slot_fit(&g.md, 1, 40) == ARL_OK);
    CHECK(m->slot_row0[2] == 0 && m->slot_row0[0] == 48 && m->slot_row0[1] == 96);
    check_all(&g, "parked and placed last");
    /* a new slot in the rows slot 0's reset freed */
    reset(&g, 0);
    CHECK(put(&g, 3, 30) == ARL_OK);
    CHECK(m->slot_row0[3] == 48 && m->slot_cap[3] == 32);
    check_all(&g, "a new slot in the freed rows");
    /* exhausted: nothing lost, the message names the counts */
    CHECK(arl_model_dev_slot_fit(&g.md, 3, 100) == ARL_ERR_RANGE);
    CHECK_MSG(strstr(arl_error_msg(), "slot_rows") != NULL, "%s", arl_error_msg());
    arl_error_clear();
    check_all(&g, "after a refused fit");
    CHECK(arl_model_dev_slot_fit(&g.md, 3, MAXCTX + 1) == ARL_ERR_RANGE);
    CHECK(strstr(arl_error_msg(), "max_context") != NULL);
    arl_error_clear();
    check_all(&g, "after a fit past max_context");
    rig_close(&g);

    /* pool 96: four slots of 16 rows, slot 1 reset (a 16-row gap), 32 free at the end: slot 2
     * outgrows its range, no gap holds 48, so the slots slide down and slot 2 (not last) is
     * copied after them */
    rig_open(&g, 96);
    for (int32_t i = 0; i < 4; i++)
        CHECK(put(&g, i, 16) == ARL_OK);
    reset(&g, 1);
    CHECK(arl_model_dev_slot_fit(&g.md, 2, 40) == ARL_OK);
    CHECK(g.md.slot_row0[0] == 0 && g.md.slot_row0[3] == 32 && g.md.slot_row0[2] == 48 &&
          g.md.slot_cap[2] == 48);
    check_all(&g, "copied after the slid slots");
    rig_close(&g);

    /* pool 96: slot 0 [0,48), slot 1 [48,64), slot 2 [64,80), 16 rows free: slot 0 grows to 64
     * rows (the others hold 32, so the rows suffice) but the 16 free rows cannot park its 48:
     * rotated behind slots 1 and 2 (a block swap of 32 rows, then 16 parked) */
    rig_open(&g, 96);
    CHECK(put(&g, 0, 48) == ARL_OK);
    CHECK(put(&g, 1, 16) == ARL_OK);
    CHECK(put(&g, 2, 16) == ARL_OK);
    CHECK(g.md.slot_row0[0] == 0 && g.md.slot_cap[0] == 48 && g.md.slot_row0[2] == 64);
    CHECK_MSG(arl_model_dev_slot_fit(&g.md, 0, 64) == ARL_OK, "%s", arl_error_msg());
    CHECK(g.md.slot_row0[1] == 0 && g.md.slot_row0[2] == 16 && g.md.slot_row0[0] == 32 &&
          g.md.slot_cap[0] == 64);
    check_all(&g, "rotated behind the others");
    CHECK(put(&g, 0, 64) == ARL_OK);
    check_all(&g, "rotated slot filled");
    rig_close(&g);

    /* the same with the growing slot's rows shorter than the others': 16 rows of slot 0, 48 of
     * slots 1 and 2 between it and 16 free rows at the end (its rows parked at once) */
    rig_open(&g, 96);
    CHECK(put(&g, 0, 16) == ARL_OK);
    CHECK(put(&g, 1, 32) == ARL_OK);
    CHECK(put(&g, 2, 32) == ARL_OK);
    CHECK(arl_model_dev_slot_fit(&g.md, 0, 20) == ARL_OK);
    CHECK(g.md.slot_row0[1] == 0 && g.md.slot_row0[2] == 32 && g.md.slot_row0[0] == 64 &&
          g.md.slot_cap[0] == 32);
    check_all(&g, "parked behind longer slots");
    rig_close(&g);

    /* pool 80: slot 0 [0,48), slot 1 [48,64), 16 free: slot 0 grows to 64; the other slot's
     * 16 rows fit the free rows: they are parked and slot 0 slides up behind them */
    rig_open(&g, 80);
    CHECK(put(&g, 0, 48) == ARL_OK);
    CHECK(put(&g, 1, 16) == ARL_OK);
    CHECK_MSG(arl_model_dev_slot_fit(&g.md, 0, 64) == ARL_OK, "%s", arl_error_msg());
    CHECK(g.md.slot_row0[1] == 0 && g.md.slot_row0[0] == 16 && g.md.slot_cap[0] == 64);
    check_all(&g, "the others parked");
    rig_close(&g);

    /* pool 112: slot 0 [0,32), slots 1 and 2 [32,96), 16 free: slot 0 grows to 48; neither
     * part fits the free rows and slot 0's is the shorter: swapped with the last 32 rows of the
     * others, then the rest rotated */
    rig_open(&g, 112);
    CHECK(put(&g, 0, 32) == ARL_OK);
    CHECK(put(&g, 1, 32) == ARL_OK);
    CHECK(put(&g, 2, 32) == ARL_OK);
    CHECK_MSG(arl_model_dev_slot_fit(&g.md, 0, 48) == ARL_OK, "%s", arl_error_msg());
    CHECK(g.md.slot_row0[1] == 0 && g.md.slot_row0[2] == 32 && g.md.slot_row0[0] == 64 &&
          g.md.slot_cap[0] == 48);
    check_all(&g, "swapped with a longer part");
    rig_close(&g);
}

/* The rows the other slots than i hold. */
static int64_t others_rows(const rig *g, int32_t i) {
    int64_t n = 0;
    for (int32_t k = 0; k < NS; k++)
        if (k != i) n += g->md.slot_cap[k];
    return n;
}

/* Random growth, uploads and resets over a tight pool (most fits move something). */
static void test_random(void) {
    rig g;
    rig_open(&g, 2 * MAXCTX + 40);
    int64_t refused = 0, fits = 0;
    char what[64];
    for (int n = 0; n < 3000; n++) {
        const int32_t i = (int32_t)arl_rng_below(&g.rng, NS);
        const int64_t pos = g.host.slots[i].pos;
        const uint64_t op = arl_rng_below(&g.rng, 10);
        arl_status s = ARL_OK;
        int64_t rows = 0;
        if (op == 0) {
            reset(&g, i);
        } else if (op < 6) { /* room for more rows, as a forward asks */
            const int64_t want = pos + 1 + (int64_t)arl_rng_below(&g.rng, 40);
            rows = want < MAXCTX ? want : MAXCTX;
            s = arl_model_dev_slot_fit(&g.md, i, rows);
            fits++;
        } else { /* new rows uploaded */
            const int64_t to = pos + 1 + (int64_t)arl_rng_below(&g.rng, 24);
            rows = to < MAXCTX ? to : MAXCTX;
            s = put(&g, i, rows);
        }
        if (s) {
            CHECK(s == ARL_ERR_RANGE);
            /* refused only when the rows do not suffice (grains of 16 rows) */
            CHECK_MSG(others_rows(&g, i) + (rows + 15) / 16 * 16 > g.md.lat_rows,
                      "operation %d: slot %d refused %lld rows with %lld of %lld held by the "
                      "others: %s",
                      n, i, (long long)rows, (long long)others_rows(&g, i),
                      (long long)g.md.lat_rows, arl_error_msg());
            arl_error_clear();
            refused++;
        }
        snprintf(what, sizeof what, "operation %d", n);
        check_all(&g, what);
    }
    fprintf(stderr, "  %lld fits, %lld refused (pool of %lld rows)\n", (long long)fits,
            (long long)refused, (long long)g.md.lat_rows);
    CHECK(refused > 0 && refused < fits);
    rig_close(&g);
}

static void test_settings(void) {
    arl_model_opts o;
    arl_model_opts_default(&o);
    o.max_context = MAXCTX;
    arl_model_dev md;
    arl_model_dev_opts bad = {.n_slots = NS, .slot_rows = -1};
    CHECK(arl_model_dev_plan(&md, arl_dev_ops_cpu(), &TM.cfg, &o, &bad) == ARL_ERR_ARG);
    arl_model_dev_opts graphs = {.n_slots = NS, .slot_rows = 100, .decode_graphs = 1};
    CHECK(arl_model_dev_plan(&md, arl_dev_ops_cpu(), &TM.cfg, &o, &graphs) != ARL_OK);
    arl_error_clear();
    /* the shared rows are what the arena holds */
    arl_model_dev_opts fixed = {.n_slots = NS}, shared = {.n_slots = NS, .slot_rows = 100};
    const int64_t R = TM.cfg.dims.rkv + TM.cfg.dims.r;
    const int64_t bf = arl_model_dev_bytes(&TM.cfg, &o, arl_dev_ops_cpu(), &fixed);
    const int64_t bs = arl_model_dev_bytes(&TM.cfg, &o, arl_dev_ops_cpu(), &shared);
    CHECK(bf - bs == (int64_t)sizeof(float) * TM.cfg.dims.n_mla * (NS * MAXCTX - 100) * R);
}

int main(void) {
    tiny_load(&TM);
    TEST_RUN(test_scripted);
    TEST_RUN(test_random);
    TEST_RUN(test_settings);
    tiny_free(&TM);
    return test_finish();
}
