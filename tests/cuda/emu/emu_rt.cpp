/* tests/cuda/emu/emu_rt.cpp: the thread/barrier machinery behind emu_cuda.h. */
#include "emu_cuda.h"
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
struct emu_block {
    pthread_barrier_t bar;
    pthread_barrier_t wbar[32];
    uint64_t xbuf[32][32];
    int orbuf;
    float *sm;
};
thread_local emu_block *emu_cur;
static emu_block *g_block;
float *emu_sm() {
    return emu_cur->sm;
}
void __syncthreads() {
    pthread_barrier_wait(&emu_cur->bar);
}
int __syncthreads_or(int p) {
    __syncthreads();
    if (threadIdx.x == 0) emu_cur->orbuf = 0;
    __syncthreads();
    if (p) __atomic_store_n(&emu_cur->orbuf, 1, __ATOMIC_SEQ_CST);
    __syncthreads();
    int r = emu_cur->orbuf;
    __syncthreads();
    return r;
}
void __syncwarp(unsigned) {
    pthread_barrier_wait(&emu_cur->wbar[threadIdx.x >> 5]);
}
uint64_t emu_shfl_bits(uint64_t v, int src) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_cur->xbuf[w][l] = v;
    pthread_barrier_wait(&emu_cur->wbar[w]);
    uint64_t r = emu_cur->xbuf[w][src & 31];
    pthread_barrier_wait(&emu_cur->wbar[w]);
    return r;
}
unsigned __ballot_sync(unsigned, int p) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_cur->xbuf[w][l] = p ? 1 : 0;
    pthread_barrier_wait(&emu_cur->wbar[w]);
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        if (emu_cur->xbuf[w][i]) r |= 1u << i;
    pthread_barrier_wait(&emu_cur->wbar[w]);
    return r;
}
struct targ {
    unsigned t;
    dim3 b;
    std::function<void()> *f;
    emu_block *blk;
};
static void *tmain(void *p) {
    targ *a = (targ *)p;
    threadIdx = dim3(a->t, 0, 0);
    blockIdx = a->b;
    emu_cur = a->blk;
    (*a->f)();
    return NULL;
}
/* EMU_CP_ASYNC=defer: this thread's queued copies, each with its group (the number of
 * commits before it); emu_cp_groups: commits so far.  A thread lives for one block. */
struct emu_cp {
    void *dst;
    const void *src;
    int bytes;
    bool ok;
    long group;
};
static thread_local std::vector<emu_cp> emu_cp_queue;
static thread_local long emu_cp_groups;
static bool emu_env_defer(const char *name) { /* the variable says "defer" */
    const char *e = getenv(name);
    return e && strcmp(e, "defer") == 0;
}
static bool emu_cp_deferred() {
    static const bool d = emu_env_defer("EMU_CP_ASYNC");
    return d;
}
static void emu_cp_land(const emu_cp &c) {
    if (c.ok)
        memcpy(c.dst, c.src, (size_t)c.bytes);
    else
        memset(c.dst, 0, (size_t)c.bytes);
}
void emu_cp_async(void *dst, const void *src, int bytes, bool ok) {
    const emu_cp c = {dst, src, bytes, ok, emu_cp_groups};
    if (emu_cp_deferred())
        emu_cp_queue.push_back(c);
    else
        emu_cp_land(c);
}
void emu_cp_commit() {
    emu_cp_groups++;
}
void emu_cp_wait(int pending) { /* the groups before the newest `pending` committed ones */
    std::vector<emu_cp> keep;
    for (const emu_cp &c : emu_cp_queue)
        if (c.group < emu_cp_groups - pending)
            emu_cp_land(c);
        else
            keep.push_back(c);
    emu_cp_queue.swap(keep);
}

/* EMU_WGMMA=defer: this thread's queued warpgroup products, each with its group */
static bool emu_wg_deferred() {
    static const bool d = emu_env_defer("EMU_WGMMA");
    return d;
}
struct emu_wg {
    std::function<void()> product;
    long group;
};
static thread_local std::vector<emu_wg> emu_wg_queue;
static thread_local long emu_wg_groups;
void emu_wgmma_issue(std::function<void()> product) {
    if (emu_wg_deferred())
        emu_wg_queue.push_back({std::move(product), emu_wg_groups});
    else
        product();
}
void emu_wgmma_commit() {
    emu_wg_groups++;
}
void emu_wgmma_wait(int pending) {
    std::vector<emu_wg> keep;
    for (emu_wg &w : emu_wg_queue)
        if (w.group < emu_wg_groups - pending)
            w.product();
        else
            keep.push_back(std::move(w));
    emu_wg_queue.swap(keep);
}

std::vector<emu_launch_rec> *emu_capture = NULL;
static void emu_run(dim3 g, dim3 b, size_t smem, std::function<void()> fn);
void emu_launch(dim3 g, dim3 b, size_t smem, std::function<void()> fn) {
    if (emu_capture) {
        emu_capture->push_back({g, b, smem, fn});
        return;
    }
    emu_run(g, b, smem, fn);
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t) {
    for (auto &r : *(std::vector<emu_launch_rec> *)e)
        emu_run(r.g, r.b, r.smem, r.fn);
    return 0;
}
static void emu_run(dim3 g, dim3 b, size_t smem, std::function<void()> fn) {
    gridDim = g;
    blockDim = b;
    unsigned nt = b.x;
    static std::vector<float> sm;
    sm.assign(smem / 4, NAN);
    emu_block *blk = new emu_block;
    blk->sm = sm.data();
    std::vector<pthread_t> th(nt);
    std::vector<targ> args(nt);
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) {
                pthread_barrier_init(&blk->bar, NULL, nt);
                for (unsigned w = 0; w < (nt + 31) / 32; w++)
                    pthread_barrier_init(&blk->wbar[w], NULL, 32);
                for (unsigned t = 0; t < nt; t++) {
                    args[t] = {t, dim3(x, y, z), &fn, blk};
                    pthread_create(&th[t], NULL, tmain, &args[t]);
                }
                for (unsigned t = 0; t < nt; t++)
                    pthread_join(th[t], NULL);
                pthread_barrier_destroy(&blk->bar);
                for (unsigned w = 0; w < (nt + 31) / 32; w++)
                    pthread_barrier_destroy(&blk->wbar[w]);
            }
    delete blk;
}
