/* tests/cuda/emu/emu_selftest.cpp: the emulator's own primitives (emu_rt.cpp), checked before
 * run_emu.sh trusts it with the kernels: a barrier holds every thread of a block until all
 * arrive (a shared-memory tree sum over several blocks and block sizes), warp shuffles, ballots
 * and matches see the values of the same step (a partial last warp included), __syncthreads_or,
 * (fibers only) a block whose threads cannot all reach a barrier stops the run with a message
 * instead of hanging, and (under ThreadSanitizer) a read of what another thread of the block
 * wrote is a race without a barrier between them and none with one (tests/test.h). */
#include "emu_cuda.h"
#include "tests/test.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* out[block] = sum of (block * 1000 + t) over the block's threads, by a shared-memory tree:
 * a barrier that let a thread through early would read a partner's slot before it is written
 * (the slots start at NaN) */
__global__ void k_tree(double *out) {
    double *s = (double *)emu_sm();
    const unsigned t = threadIdx.x, n = blockDim.x;
    s[t] = blockIdx.x * 1000.0 + t;
    __syncthreads();
    for (unsigned h = 1; h < n; h *= 2) {
        const double v = (t % (2 * h) == 0 && t + h < n) ? s[t + h] : 0;
        __syncthreads();
        s[t] += v;
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = s[0];
}

/* per thread: the butterfly sum of its warp's lane ids, the inclusive prefix sum of lane ids
 * (shfl.up), the ballot of odd lanes, the lanes with the same value of lane / 3, and the
 * block-wide OR of (t == chosen) */
__global__ void k_warp(int *out, int chosen) {
    const int t = (int)threadIdx.x, l = t & 31;
    int sum = l, pre = l;
    const int width = (int)blockDim.x - (t & ~31) < 32 ? (int)blockDim.x - (t & ~31) : 32;
    for (int o = 1; o < 32; o *= 2) {
        const int v = __shfl_xor_sync(0xffffffffu, sum, o);
        sum += (l ^ o) < width ? v : 0;
    }
    for (int d = 1; d < 32; d *= 2) {
        const int v = __shfl_up_sync(0xffffffffu, pre, (unsigned)d);
        if (l >= d) pre += v;
    }
    const unsigned odd = __ballot_sync(0xffffffffu, l & 1);
    const unsigned same = __match_any_sync(0xffffffffu, l / 3);
    const int any = __syncthreads_or(t == chosen);
    int *o = out + 5 * t;
    o[0] = sum;
    o[1] = pre;
    o[2] = (int)odd;
    o[3] = (int)same;
    o[4] = any;
}

/* thread 1 reads what thread 0 wrote, with a barrier between them or none */
__global__ void k_race(int *out, int barrier) {
    __shared__ int x;
    if (threadIdx.x == 0) x = 7;
    if (barrier) __syncthreads();
    if (threadIdx.x == 1) out[0] = x;
}

/* threads 0..15 wait at a barrier the others never reach */
__global__ void k_stuck() {
    if (threadIdx.x < 16) __syncthreads();
}

static void check_tree() {
    const unsigned sizes[] = {1, 32, 48, 256, 1024};
    for (unsigned n : sizes) {
        double out[3];
        emu_launch(dim3(3), dim3(n), sizeof(double) * n, [&] { k_tree(out); });
        for (unsigned b = 0; b < 3; b++) {
            const double want = b * 1000.0 * n + n * (n - 1) / 2.0;
            CHECK_MSG(out[b] == want, "tree sum of block %u of %u threads: %g, want %g", b, n,
                      out[b], want);
        }
    }
}

static void check_warp() {
    const int n = 80; /* two warps and a partial one of 16 lanes */
    for (int chosen : {-1, 0, 79}) {
        std::vector<int> out(5 * n, -7);
        emu_launch(dim3(1), dim3(n), 0, [&] { k_warp(out.data(), chosen); });
        for (int t = 0; t < n; t++) {
            const int l = t & 31, width = n - (t & ~31) < 32 ? n - (t & ~31) : 32;
            unsigned odd = 0, same = 0;
            for (int j = 0; j < width; j++) {
                odd |= (unsigned)(j & 1) << j;
                same |= (unsigned)(j / 3 == l / 3) << j;
            }
            const int *o = &out[5 * t];
            CHECK_MSG(o[0] == width * (width - 1) / 2, "thread %d: warp sum %d", t, o[0]);
            CHECK_MSG(o[1] == l * (l + 1) / 2, "thread %d: prefix sum %d", t, o[1]);
            CHECK_MSG((unsigned)o[2] == odd, "thread %d: ballot %#x, want %#x", t, o[2], odd);
            CHECK_MSG((unsigned)o[3] == same, "thread %d: match %#x, want %#x", t, o[3], same);
            CHECK_MSG(o[4] == (chosen >= 0), "thread %d: __syncthreads_or %d (chosen %d)", t, o[4],
                      chosen);
        }
    }
}

/* run `body` in a child with its stderr caught in msg; its wait status */
template <class F> static int in_child(F body, char *msg, size_t cap) {
    int fd[2];
    CHECK_MSG(pipe(fd) == 0, "pipe failed");
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        alarm(20);
        body();
    }
    close(fd[1]);
    size_t got = 0;
    memset(msg, 0, cap);
    for (ssize_t r; got < cap - 1 && (r = read(fd[0], msg + got, cap - 1 - got)) > 0;)
        got += (size_t)r;
    close(fd[0]);
    int st = 0;
    CHECK_MSG(pid > 0 && waitpid(pid, &st, 0) == pid, "fork/wait failed");
    return st;
}

#ifndef EMU_PTHREADS
/* the run must stop (abort) with the emulator's message, not hang */
static void check_stuck() {
    char msg[512];
    const int st = in_child(
        [] {
            emu_launch(dim3(2), dim3(64), 0, [] { k_stuck(); });
            _exit(0);
        },
        msg, sizeof msg);
    CHECK_MSG(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
              "a block stuck at a barrier: child status %#x, want SIGABRT", st);
    CHECK_MSG(strstr(msg, "16 of its 64 threads wait at barriers") != NULL,
              "a block stuck at a barrier: message \"%s\"", msg);
}
#endif

#ifdef __SANITIZE_THREAD__
/* without the barrier a fresh process (this program run with the argument "race": a forked
 * child inherits the parent's ThreadSanitizer state) reports a race, ThreadSanitizer's exit
 * status 66; with it, this process reports none (which would make its own status 66) */
static void check_race() {
    char msg[4096];
    int out = 0;
    const int st = in_child(
        [] {
            execl("/proc/self/exe", "emu_selftest", "race", (char *)NULL);
            _exit(127);
        },
        msg, sizeof msg);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 66 && strstr(msg, "data race"),
              "a read of another thread's write without a barrier: status %#x, not reported as "
              "a race",
              st);
    emu_launch(dim3(1), dim3(64), 0, [&] { k_race(&out, 1); });
    CHECK_MSG(out == 7, "k_race with a barrier: read %d", out);
}
#endif

int main(int argc, char **argv) {
#ifdef __SANITIZE_THREAD__
    if (argc > 1 && !strcmp(argv[1], "race")) {
        int out = 0;
        emu_launch(dim3(1), dim3(64), 0, [&] { k_race(&out, 0); });
        return 0;
    }
#endif
    (void)argc, (void)argv;
    TEST_RUN(check_tree);
    TEST_RUN(check_warp);
#ifndef EMU_PTHREADS
    TEST_RUN(check_stuck);
#endif
#ifdef __SANITIZE_THREAD__
    TEST_RUN(check_race);
#endif
    return test_finish();
}
