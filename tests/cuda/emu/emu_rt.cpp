/* tests/cuda/emu/emu_rt.cpp: the thread/barrier machinery behind emu_cuda.h.
 *
 * Two ways to run a block's threads:
 * - fibers (the default): every CUDA thread is a fiber on the calling thread, with its own
 *   stack (kept from block to block), switched in user space (emu_ctx below); a barrier parks
 *   the fibers that reached it and a round-robin scheduler resumes them once all have
 *   arrived.  No thread is created per block and a barrier costs a few context switches per
 *   thread instead of waking hundreds of OS threads (about 50 times faster); fibers run in
 *   index order (EMU_SCHED=reverse: the opposite order, so that a kernel whose result depends
 *   on the order its threads run in shows it), and a block whose live threads all wait at
 *   barriers none of the others can reach (a __syncthreads inside a branch some threads skip)
 *   stops the run with a message instead of hanging.  AddressSanitizer and ThreadSanitizer
 *   are told of every switch (the switches' comment).
 * - one pthread per CUDA thread (built with -DEMU_PTHREADS: run_emu.sh EMU_PTHREADS=1), the
 *   emulator's first form, kept to cross-check the fibers. */
#include "emu_cuda.h"

#include <algorithm>
#ifndef EMU_PTHREADS
#include <sys/mman.h>
#include <ucontext.h>
#endif
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

/* what a CUDA thread keeps for itself between its own calls (EMU_CP_ASYNC=defer's queued
 * copies, EMU_WGMMA=defer's queued products), one per thread of the running block */
struct emu_cp {
    void *dst;
    const void *src;
    int bytes;
    bool ok;
    long group; /* the number of commits before it */
};
struct emu_wg {
    std::function<void()> product;
    long group;
};
struct emu_thr {
    std::vector<emu_cp> cp_queue;
    long cp_groups = 0; /* commits so far */
    std::vector<emu_wg> wg_queue;
    long wg_groups = 0;
    void reset() { /* a fiber's, for its next block */
        cp_queue.clear();
        wg_queue.clear();
        cp_groups = wg_groups = 0;
    }
};
static thread_local emu_thr *emu_me;

#ifdef EMU_PTHREADS
typedef pthread_barrier_t emu_bar;
static void emu_bar_init(emu_bar *b, unsigned n) {
    pthread_barrier_init(b, NULL, n);
}
static void emu_bar_wait(emu_bar *b) {
    pthread_barrier_wait(b);
}
static void emu_bar_destroy(emu_bar *b) {
    pthread_barrier_destroy(b);
}
#else
struct emu_bar {
    unsigned count, arrived;
    unsigned long gen; /* completed rounds */
    char sync[2];      /* ThreadSanitizer's release/acquire addresses: rounds even and odd */
};
static void emu_bar_init(emu_bar *b, unsigned n) {
    *b = {n, 0, 0, {0, 0}};
}
static void emu_bar_wait(emu_bar *b);
static void emu_bar_destroy(emu_bar *) {}
#endif

struct emu_block {
    emu_bar bar;
    emu_bar wbar[32];
    uint64_t xbuf[32][32];
    uint64_t post[32][32][EMU_POST_MAX]; /* emu_warp_post: [warp][lane][word] */
    int orbuf;
    float *sm;
};
thread_local emu_block *emu_cur;
float *emu_sm() {
    return emu_cur->sm;
}
void __syncthreads() {
    emu_bar_wait(&emu_cur->bar);
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
    emu_bar_wait(&emu_cur->wbar[threadIdx.x >> 5]);
}
uint64_t emu_shfl_bits(uint64_t v, int src) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_cur->xbuf[w][l] = v;
    emu_bar_wait(&emu_cur->wbar[w]);
    uint64_t r = emu_cur->xbuf[w][src & 31];
    emu_bar_wait(&emu_cur->wbar[w]);
    return r;
}
const uint64_t (*emu_warp_post(const uint64_t *words, int n))[EMU_POST_MAX] {
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (n < 0 || n > EMU_POST_MAX) {
        fprintf(stderr, "emu: emu_warp_post of %d words (at most %d)\n", n, EMU_POST_MAX);
        abort();
    }
    memcpy(emu_cur->post[w][l], words, sizeof(uint64_t) * (size_t)n);
    emu_bar_wait(&emu_cur->wbar[w]);
    return emu_cur->post[w];
}
void emu_warp_release() {
    emu_bar_wait(&emu_cur->wbar[threadIdx.x >> 5]);
}
unsigned __ballot_sync(unsigned, int p) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    emu_cur->xbuf[w][l] = p ? 1 : 0;
    emu_bar_wait(&emu_cur->wbar[w]);
    unsigned r = 0;
    for (int i = 0, n = emu_warp_width(); i < n; i++)
        if (emu_cur->xbuf[w][i]) r |= 1u << i;
    emu_bar_wait(&emu_cur->wbar[w]);
    return r;
}
static bool emu_env_is(const char *name, const char *value) {
    const char *e = getenv(name);
    return e && strcmp(e, value) == 0;
}
static bool emu_cp_deferred() {
    static const bool d = emu_env_is("EMU_CP_ASYNC", "defer");
    return d;
}
static void emu_cp_land(const emu_cp &c) {
    if (c.ok)
        memcpy(c.dst, c.src, (size_t)c.bytes);
    else
        memset(c.dst, 0, (size_t)c.bytes);
}
void emu_cp_async(void *dst, const void *src, int bytes, bool ok) {
    const emu_cp c = {dst, src, bytes, ok, emu_me->cp_groups};
    if (emu_cp_deferred())
        emu_me->cp_queue.push_back(c);
    else
        emu_cp_land(c);
}
void emu_cp_commit() {
    emu_me->cp_groups++;
}
void emu_cp_wait(int pending) { /* the groups before the newest `pending` committed ones */
    std::vector<emu_cp> keep;
    for (const emu_cp &c : emu_me->cp_queue)
        if (c.group < emu_me->cp_groups - pending)
            emu_cp_land(c);
        else
            keep.push_back(c);
    emu_me->cp_queue.swap(keep);
}

/* EMU_WGMMA=defer: this thread's queued warpgroup products, each with its group */
static bool emu_wg_deferred() {
    static const bool d = emu_env_is("EMU_WGMMA", "defer");
    return d;
}
void emu_wgmma_issue(std::function<void()> product) {
    if (emu_wg_deferred())
        emu_me->wg_queue.push_back({std::move(product), emu_me->wg_groups});
    else
        product();
}
void emu_wgmma_commit() {
    emu_me->wg_groups++;
}
void emu_wgmma_wait(int pending) {
    std::vector<emu_wg> keep;
    for (emu_wg &w : emu_me->wg_queue)
        if (w.group < emu_me->wg_groups - pending)
            w.product();
        else
            keep.push_back(std::move(w));
    emu_me->wg_queue.swap(keep);
}

#ifdef EMU_PTHREADS
struct targ {
    unsigned t;
    dim3 b;
    std::function<void()> *f;
    emu_block *blk;
};
static void *tmain(void *p) {
    targ *a = (targ *)p;
    emu_thr me;
    threadIdx = dim3(a->t, 0, 0);
    blockIdx = a->b;
    emu_cur = a->blk;
    emu_me = &me;
    (*a->f)();
    return NULL;
}
/* one block: a thread per CUDA thread, joined */
static void emu_block_run(emu_block *blk, unsigned nt, dim3 b, std::function<void()> *fn) {
    std::vector<pthread_t> th(nt);
    std::vector<targ> args(nt);
    for (unsigned t = 0; t < nt; t++) {
        args[t] = {t, b, fn, blk};
        pthread_create(&th[t], NULL, tmain, &args[t]);
    }
    for (unsigned t = 0; t < nt; t++)
        pthread_join(th[t], NULL);
}
#else
/* A fiber's saved context and the switch between two.  x86-64: the callee-saved registers
 * pushed on the stack being left, the stack pointer saved, the other's popped (a switch is a
 * call: the kernel is not entered).  MXCSR and the x87 control word are not switched: nothing
 * here changes them, so every fiber runs in the scheduler's floating-point environment.
 * Elsewhere (or with -DEMU_SWAPCONTEXT): ucontext's swapcontext, which also saves the signal
 * mask (a system call per switch). */
#if defined(__x86_64__) && !defined(EMU_SWAPCONTEXT)
struct emu_ctx {
    void *sp;
};
extern "C" void emu_ctx_switch(void **save_sp, void *to_sp);
asm(".text\n"
    ".p2align 4\n"
    ".globl emu_ctx_switch\n"
    ".type emu_ctx_switch, @function\n"
    "emu_ctx_switch:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size emu_ctx_switch, .-emu_ctx_switch\n");
/* a context that starts `entry` at the top of the stack as if called there (it never returns) */
static void emu_ctx_make(emu_ctx *c, char *stack, size_t size, void (*entry)()) {
    uint64_t *top = (uint64_t *)(((uintptr_t)(stack + size)) & ~(uintptr_t)15);
    uint64_t *sp = top - 8;
    memset(sp, 0, 8 * sizeof *sp);      /* top[-1]: entry's (absent) return address */
    sp[6] = (uint64_t)(uintptr_t)entry; /* above the six registers: the return address */
    c->sp = sp;
}
static void emu_ctx_swap(emu_ctx *from, emu_ctx *to) {
    emu_ctx_switch(&from->sp, to->sp);
}
#else
struct emu_ctx {
    ucontext_t uc;
};
static void emu_ctx_make(emu_ctx *c, char *stack, size_t size, void (*entry)()) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, entry, 0);
}
static void emu_ctx_swap(emu_ctx *from, emu_ctx *to) {
    swapcontext(&from->uc, &to->uc);
}
#endif

/* A fiber per CUDA thread of the running block: its context, stack (allocated once, kept for
 * later blocks) and state; `bar` the barrier it waits at (round `gen`), NULL when runnable. */
struct emu_fiber {
    emu_ctx ctx;
    char *stack;
    emu_thr thr;
    emu_bar *bar; /* bar, gen and done: atomic (the scheduler reads what the fiber wrote) */
    unsigned long gen;
    bool done;
    void *tsan; /* ThreadSanitizer's fiber */
};
enum { EMU_FIBER_STACK = 1 << 20 }; /* bytes (address space: touched pages only) */
static std::vector<emu_fiber *> emu_fibers;
static emu_fiber *emu_fiber_cur;
static emu_ctx emu_sched_ctx;
static std::function<void()> *emu_fiber_fn;

/* The three switches: scheduler -> fiber (resume), fiber -> scheduler (yield at a barrier, or
 * exit).  Under AddressSanitizer each tells it whose stack runs next (the scheduler's bounds
 * learnt when a fiber first starts), so that it never takes a fiber's frames for the
 * scheduler's.  Under ThreadSanitizer every fiber is a thread of its own to it, and only
 * these order one fiber's accesses before another's: a resume orders the scheduler's (the
 * host's, before the launch) before the fiber's; a yield orders nothing; a barrier orders
 * every access before it, of all the block's fibers, before any after it (release on
 * arrival, acquire on leaving, an address per round's parity); an exit releases to the end
 * of the block, which the scheduler acquires before the next block or the host goes on.  Two
 * fibers of a block touching the same bytes without a barrier between them are reported,
 * as two threads would be.  The scheduler's own stores that fibers read (threadIdx, the
 * current fiber) are hidden from it: they are the emulator's, not the kernel's. */
static char emu_block_done; /* its address: where every fiber's exit releases */
#ifdef __SANITIZE_THREAD__
#include <sanitizer/tsan_interface.h>
extern "C" void AnnotateIgnoreWritesBegin(const char *file, int line);
extern "C" void AnnotateIgnoreWritesEnd(const char *file, int line);
static void *emu_sched_tsan;
#define EMU_TSAN_SWITCH(fiber, flags) __tsan_switch_to_fiber(fiber, flags)
#define EMU_TSAN_RELEASE(addr) __tsan_release(addr)
#define EMU_TSAN_ACQUIRE(addr) __tsan_acquire(addr)
#define EMU_TSAN_HIDE_BEGIN() AnnotateIgnoreWritesBegin(__FILE__, __LINE__)
#define EMU_TSAN_HIDE_END() AnnotateIgnoreWritesEnd(__FILE__, __LINE__)
#define EMU_TSAN_NO_SYNC __tsan_switch_to_fiber_no_sync
#else
#define EMU_TSAN_SWITCH(fiber, flags) ((void)0)
#define EMU_TSAN_RELEASE(addr) ((void)(addr))
#define EMU_TSAN_ACQUIRE(addr) ((void)(addr))
#define EMU_TSAN_HIDE_BEGIN() ((void)0)
#define EMU_TSAN_HIDE_END() ((void)0)
#endif
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/common_interface_defs.h>
static const void *emu_sched_stack;
static size_t emu_sched_stack_size;
#define EMU_ASAN_START(save, bottom, size) __sanitizer_start_switch_fiber(save, bottom, size)
#define EMU_ASAN_FINISH(save, bottom, size) __sanitizer_finish_switch_fiber(save, bottom, size)
#else
#define EMU_ASAN_START(save, bottom, size) ((void)(save))
#define EMU_ASAN_FINISH(save, bottom, size) ((void)(save))
#endif
static void emu_fiber_resume(emu_fiber *f) {
    void *fake = NULL;
    EMU_ASAN_START(&fake, f->stack, EMU_FIBER_STACK);
    EMU_TSAN_SWITCH(f->tsan, 0);
    emu_ctx_swap(&emu_sched_ctx, &f->ctx);
    EMU_ASAN_FINISH(fake, NULL, NULL);
}
static void emu_fiber_yield(emu_fiber *f) {
    void *fake = NULL;
    EMU_ASAN_START(&fake, emu_sched_stack, emu_sched_stack_size);
    EMU_TSAN_SWITCH(emu_sched_tsan, EMU_TSAN_NO_SYNC);
    emu_ctx_swap(&f->ctx, &emu_sched_ctx);
    EMU_ASAN_FINISH(fake, &emu_sched_stack, &emu_sched_stack_size);
}
static void emu_fiber_main() {
    EMU_ASAN_FINISH(NULL, &emu_sched_stack, &emu_sched_stack_size);
    (*emu_fiber_fn)();
    emu_fiber *f = emu_fiber_cur;
    __atomic_store_n(&f->done, true, __ATOMIC_RELAXED);
    EMU_TSAN_RELEASE(&emu_block_done);
    EMU_ASAN_START(NULL, emu_sched_stack, emu_sched_stack_size); /* this stack's frames end */
    EMU_TSAN_SWITCH(emu_sched_tsan, EMU_TSAN_NO_SYNC);
    emu_ctx_swap(&f->ctx, &emu_sched_ctx); /* never resumed */
}

static void emu_bar_wait(emu_bar *b) {
    const unsigned long gen = __atomic_load_n(&b->gen, __ATOMIC_RELAXED);
    EMU_TSAN_RELEASE(&b->sync[gen & 1]);
    if (__atomic_add_fetch(&b->arrived, 1, __ATOMIC_RELAXED) == b->count) {
        __atomic_store_n(&b->arrived, 0, __ATOMIC_RELAXED);   /* the last one releases the */
        __atomic_store_n(&b->gen, gen + 1, __ATOMIC_RELAXED); /* others and goes on */
    } else {
        emu_fiber *f = emu_fiber_cur;
        __atomic_store_n(&f->gen, gen, __ATOMIC_RELAXED);
        __atomic_store_n(&f->bar, b, __ATOMIC_RELAXED);
        emu_fiber_yield(f);
    }
    EMU_TSAN_ACQUIRE(&b->sync[gen & 1]);
}
static emu_fiber *emu_fiber_get(unsigned t) {
    while (emu_fibers.size() <= t) {
        emu_fiber *f = new emu_fiber;
        void *st = mmap(NULL, EMU_FIBER_STACK, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (st == MAP_FAILED) {
            fprintf(stderr, "emu: no memory for a fiber stack\n");
            abort();
        }
        mprotect(st, 4096, PROT_NONE); /* a guard page below the stack */
        f->stack = (char *)st;
#ifdef __SANITIZE_THREAD__
        f->tsan = __tsan_create_fiber(0);
#endif
        emu_fibers.push_back(f);
    }
    return emu_fibers[t];
}
/* one block: the fibers resumed in turn (those waiting at a barrier whose round has not
 * completed are skipped) until all have returned */
static void emu_block_run(emu_block *blk, unsigned nt, dim3 b, std::function<void()> *fn) {
    static const bool reverse = emu_env_is("EMU_SCHED", "reverse");
    EMU_TSAN_HIDE_BEGIN();
#ifdef __SANITIZE_THREAD__
    emu_sched_tsan = __tsan_get_current_fiber();
#endif
    emu_fiber_fn = fn;
    emu_cur = blk;
    blockIdx = b;
    EMU_TSAN_HIDE_END();
    for (unsigned t = 0; t < nt; t++) {
        emu_fiber *f = emu_fiber_get(t);
        emu_ctx_make(&f->ctx, f->stack, EMU_FIBER_STACK, emu_fiber_main);
        f->thr.reset();
        __atomic_store_n(&f->bar, (emu_bar *)NULL, __ATOMIC_RELAXED);
        __atomic_store_n(&f->done, false, __ATOMIC_RELAXED);
    }
    for (unsigned live = nt; live;) {
        bool ran = false;
        for (unsigned i = 0; i < nt; i++) {
            const unsigned t = reverse ? nt - 1 - i : i;
            emu_fiber *f = emu_fibers[t];
            emu_bar *wait = __atomic_load_n(&f->bar, __ATOMIC_RELAXED);
            if (__atomic_load_n(&f->done, __ATOMIC_RELAXED) ||
                (wait && __atomic_load_n(&wait->gen, __ATOMIC_RELAXED) ==
                             __atomic_load_n(&f->gen, __ATOMIC_RELAXED)))
                continue;
            __atomic_store_n(&f->bar, (emu_bar *)NULL, __ATOMIC_RELAXED);
            EMU_TSAN_HIDE_BEGIN();
            threadIdx = dim3(t, 0, 0);
            emu_me = &f->thr;
            emu_fiber_cur = f;
            EMU_TSAN_HIDE_END();
            emu_fiber_resume(f);
            ran = true;
            live -= __atomic_load_n(&f->done, __ATOMIC_RELAXED);
        }
        if (!ran) {
            fprintf(stderr,
                    "emu: block (%u, %u, %u) of a %u x %u x %u grid is stuck: %u of its %u "
                    "threads wait at barriers the others never reach\n",
                    b.x, b.y, b.z, gridDim.x, gridDim.y, gridDim.z, live, nt);
            abort();
        }
    }
    EMU_TSAN_ACQUIRE(&emu_block_done); /* the block's accesses before what follows it */
}
#endif

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
    sm.resize(smem / 4);
    emu_block *blk = new emu_block;
    blk->sm = sm.data();
    for (unsigned z = 0; z < g.z; z++)
        for (unsigned y = 0; y < g.y; y++)
            for (unsigned x = 0; x < g.x; x++) {
                /* every block's dynamic shared memory starts as NaN: a read before the
                 * block's own write shows, not the previous block's values */
                std::fill(sm.begin(), sm.end(), NAN);
                emu_bar_init(&blk->bar, nt);
                for (unsigned w = 0; w < (nt + 31) / 32; w++) /* a last partial warp too */
                    emu_bar_init(&blk->wbar[w], nt - 32 * w < 32 ? nt - 32 * w : 32);
                emu_block_run(blk, nt, dim3(x, y, z), &fn);
                emu_bar_destroy(&blk->bar);
                for (unsigned w = 0; w < (nt + 31) / 32; w++)
                    emu_bar_destroy(&blk->wbar[w]);
            }
    delete blk;
}
