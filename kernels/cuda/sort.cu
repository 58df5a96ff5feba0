/* kernels/cuda/sort.cu: the stable counting sort of internal.cuh (arl_csort_pass), in O(n) work.
 * The entries split into segments of consecutive entries, one warp each.  Pass 1
 * (k_csort_walk<false>) counts each key's entries per segment; a scan per key over the
 * segments (k_csort_seg_scan) turns the counts into the key's rows before each segment and
 * gives counts[e]; k_csort_scan the keys' offsets (and tiles, and the keys with entries);
 * pass 2 (k_csort_walk<true>) walks each segment again in order and places every entry after
 * the earlier ones of its key - within a step of 32 entries, the lanes holding the same key
 * (__match_any_sync) rank by lane.  The rows of a key thus follow the entry order.  The
 * per-segment counts (E, segments) are the caller's seg. */
#include "kernels/cuda/internal.cuh"

/* segments at most (the counts table: E x 2048 ints), and entries a segment at least: 8 steps
 * of a warp (a warp walks its segment step after step, so short segments keep more in flight) */
#define CSORT_SEGS_MAX 2048
#define CSORT_SEG_MIN 256

static int64_t seg_len(int64_t n) {
    int64_t L = (n + CSORT_SEGS_MAX - 1) / CSORT_SEGS_MAX;
    L = (L + 31) / 32 * 32;
    return L < CSORT_SEG_MIN ? CSORT_SEG_MIN : L;
}

static int64_t segs(int64_t n) {
    return n > 0 ? (n + seg_len(n) - 1) / seg_len(n) : 0;
}

int64_t arl_csort_seg_ints(int64_t n, int64_t E) {
    return E * segs(n);
}

/* Segment blockIdx.x (entries [b L, b L + L) of n) by one warp, a counter per key in shared
 * memory (E ints).  PLACE false: seg (E, nseg) gets the segment's count of each key, and an
 * entry whose key is not below E is reported and skipped.  PLACE true: the counters start at
 * offsets[e] + seg[e, b] (the key's rows before the segment), and each entry goes to its row. */
template <bool PLACE>
__global__ void __launch_bounds__(32)
    k_csort_walk(arl_csort_pass p, int32_t *seg, const int32_t *offsets, int64_t n, int64_t E,
                 int64_t L, int64_t nseg, arl_cuda_errword *err) {
    extern __shared__ float sm[];
    int32_t *run = reinterpret_cast<int32_t *>(sm); /* (E) */
    const int64_t b = blockIdx.x;
    const int lane = (int)threadIdx.x;
    for (int64_t e = lane; e < E; e += 32)
        run[e] = PLACE ? offsets[e] + seg[e * nseg + b] : 0;
    __syncwarp();
    const int64_t a = b * L, z = a + L < n ? a + L : n;
    const unsigned below = (1u << lane) - 1u; /* the lanes before this one */
    for (int64_t i0 = a; i0 < z; i0 += 32) {
        const int64_t i = i0 + lane;
        int32_t from = 0, v = 0;
        int64_t key = -1;
        if (i < z) {
            from = p.idx ? p.idx[i] : (int32_t)i;
            v = p.src[from];
            uint32_t u = (uint32_t)v >> p.shift;
            key = p.mask ? (int64_t)(u & p.mask) : (int64_t)u;
        }
        const bool ok = i < z && key < E;
        if (!PLACE && i < z && !ok && p.err_code) arl_dev_error(err, p.err_code, from);
        const int32_t s = ok ? (int32_t)key : -1;
        const unsigned m = __match_any_sync(0xffffffffu, s); /* lanes of s */
        if (PLACE && ok) {
            const int32_t row = run[s] + __popc(m & below);
            p.out[row] = p.idx ? from : (int32_t)(i / p.div);
            if (p.rank) p.rank[i] = row;
            if (p.out_value) p.out_value[row] = v;
        }
        __syncwarp();                                     /* every lane read its key's counter */
        if (ok && (m >> lane) == 1u) run[s] += __popc(m); /* the last lane of each key */
        __syncwarp();
    }
    if (!PLACE)
        for (int64_t e = lane; e < E; e += 32)
            seg[e * nseg + b] = run[e];
}

/* Key blockIdx.x (one warp): its segment counts seg[e, :] into exclusive prefix sums (the
 * key's rows before each segment), their total into counts[e]. */
__global__ void __launch_bounds__(32)
    k_csort_seg_scan(int32_t *counts, int32_t *seg, int64_t nseg) {
    const int64_t e = blockIdx.x;
    const int lane = (int)threadIdx.x;
    int32_t *r = seg + e * nseg, carry = 0;
    for (int64_t j0 = 0; j0 < nseg; j0 += 32) {
        const int64_t j = j0 + lane;
        const int32_t c = j < nseg ? r[j] : 0;
        int32_t incl = c;
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
        }
        if (j < nseg) r[j] = carry + incl - c;
        carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (lane == 0) counts[e] = carry;
}

/* One block (CSORT_SCAN_THREADS), rounds of that many keys: offsets, tiles (or NULL) and the
 * list of keys with entries (p.used / p.nused, or NULL) from counts.  Was one thread walking
 * every key: E dependent loads (a load after a store, which may alias) each call. */
#define CSORT_SCAN_THREADS 1024
__global__ void __launch_bounds__(CSORT_SCAN_THREADS)
    k_csort_scan(int32_t *offsets, int32_t *tiles, int32_t *used, int32_t *nused,
                 const int32_t *counts, int64_t E, int32_t tile_rows) {
    __shared__ int64_t sh[33];
    int64_t o = 0, t = 0, u = 0; /* the rounds before: rows, tiles, keys with entries */
    for (int64_t base = 0; base < E; base += CSORT_SCAN_THREADS) {
        const int64_t e = base + threadIdx.x;
        const int64_t c = e < E ? counts[e] : 0;
        int64_t sum = 0;
        const int64_t ob = arl_block_scan_excl(c, &sum, sh);
        if (e < E) offsets[e] = (int32_t)(o + ob);
        o += sum;
        if (tiles) {
            const int64_t tb = arl_block_scan_excl((c + tile_rows - 1) / tile_rows, &sum, sh);
            if (e < E) tiles[e] = (int32_t)(t + tb);
            t += sum;
        }
        if (used) {
            const int64_t ub = arl_block_scan_excl(c > 0, &sum, sh);
            if (c > 0) used[u + ub] = (int32_t)e;
            u += sum;
        }
    }
    if (threadIdx.x == 0) {
        offsets[E] = (int32_t)o;
        if (tiles) tiles[E] = (int32_t)t;
        if (nused) *nused = (int32_t)u;
    }
}

void arl_csort_run(arl_cuda_ctx *c, const arl_csort_pass *p, int64_t n, int64_t E, int32_t *counts,
                   int32_t *offsets, int32_t *tiles, int32_t tile_rows, int32_t *seg) {
    ARL_ASSERT(E >= 1 && n >= 0 && n <= INT32_MAX && (p->idx || p->div >= 1));
    ARL_ASSERT((size_t)E * sizeof(int32_t) <= 48 * 1024); /* the walk's counters */
    const int64_t L = seg_len(n), nseg = segs(n);
    const size_t sm = (size_t)E * sizeof(int32_t);
    if (nseg > 0) {
        k_csort_walk<false>
            <<<(unsigned)nseg, 32, sm, c->stream>>>(*p, seg, NULL, n, E, L, nseg, c->err);
        k_csort_seg_scan<<<(unsigned)E, 32, 0, c->stream>>>(counts, seg, nseg);
    } else {
        cudaMemsetAsync(counts, 0, sizeof(int32_t) * (size_t)E, c->stream);
    }
    k_csort_scan<<<1, CSORT_SCAN_THREADS, 0, c->stream>>>(offsets, tiles, p->used, p->nused, counts,
                                                          E, tile_rows);
    if (nseg > 0)
        k_csort_walk<true>
            <<<(unsigned)nseg, 32, sm, c->stream>>>(*p, seg, offsets, n, E, L, nseg, c->err);
}
