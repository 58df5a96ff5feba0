/* tests/cuda/emu/emu_cuda.h: a CPU stand-in for the parts of CUDA that kernels/cuda/ uses, so
 * the kernels' index and synchronisation logic can be tested on machines without a GPU.
 *
 * It is: every CUDA thread a fiber (emu_rt.cpp; a pthread each under ThreadSanitizer), run
 * block by block; a barrier per block for __syncthreads and one per warp for shuffles, ballots
 * and __syncwarp; `__shared__` variables as function statics (one block runs at a time);
 * device memory = host memory; cuBLAS GEMMs as a column-major double-accumulating loop; WMMA
 * fragments as whole 16x16 tiles held by every lane; CUDA graphs as a recorded list of
 * launches.  It is not: a model of GPU numerics (no FMA contraction, glibc's expf), timing, or
 * of races between blocks (one block runs at a time); within a block every shared-memory
 * access is sequentially consistent, so a missing barrier shows only under ThreadSanitizer
 * (run_emu.sh EMU_TSAN=1), where the barriers above are pthread barriers it understands.
 * C++17, compiled by run_emu.sh; never part of the product build. */
#pragma once
#include <functional>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tuple>
#include <type_traits>
#include <vector>

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct emu_block;
extern thread_local dim3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
extern thread_local emu_block *emu_cur;
float *emu_sm();
void __syncthreads();
int __syncthreads_or(int p);
void __syncwarp(unsigned m = 0xffffffffu);
uint64_t emu_shfl_bits(uint64_t v, int src);
template <class T> static inline T emu_shfl(T v, int src) {
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    b = emu_shfl_bits(b, src);
    T r;
    memcpy(&r, &b, sizeof(T));
    return r;
}
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
    return emu_shfl(v, (int)((threadIdx.x & 31) ^ o));
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src) {
    return emu_shfl(v, src);
}
/* lane - d's value; lanes below d keep their own (PTX shfl.up) */
template <class T> static inline T __shfl_up_sync(unsigned, T v, unsigned d) {
    const int l = (int)(threadIdx.x & 31);
    return emu_shfl(v, l >= (int)d ? l - (int)d : l);
}
unsigned __ballot_sync(unsigned, int p);
/* A warp-wide exchange in one step, for what would take many shuffles of the same values (the
 * emulated mma.sync and ldmatrix of kernels/cuda/internal.cuh, kda.cu's 3xTF32 product): every
 * lane of the warp posts n <= EMU_POST_MAX words; the table returned (row l: lane l's words)
 * may be read until the lane calls emu_warp_release().  Two warp barriers in all, where a
 * shuffle costs two each. */
enum { EMU_POST_MAX = 12 };
const uint64_t (*emu_warp_post(const uint64_t *words, int n))[EMU_POST_MAX];
void emu_warp_release();
/* the lanes of this thread's warp: 32, or fewer in a last partial warp */
static inline int emu_warp_width() {
    const unsigned first = threadIdx.x & ~31u;
    return blockDim.x - first < 32 ? (int)(blockDim.x - first) : 32;
}
/* the lanes whose v equals this lane's (every lane of the warp takes part) */
template <class T> static inline unsigned __match_any_sync(unsigned, T v) {
    uint64_t b = 0;
    memcpy(&b, &v, sizeof(T));
    const uint64_t(*all)[EMU_POST_MAX] = emu_warp_post(&b, 1);
    unsigned m = 0;
    for (int j = 0, n = emu_warp_width(); j < n; j++) {
        T x;
        memcpy(&x, &all[j][0], sizeof(T));
        m |= (unsigned)(x == v) << j;
    }
    emu_warp_release();
    return m;
}
static inline int __popc(unsigned x) {
    return __builtin_popcount(x);
}
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline int atomicCAS(int32_t *a, int32_t cmp, int32_t v) {
    __atomic_compare_exchange_n(a, &cmp, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return cmp;
}
static inline unsigned long long atomicAdd(unsigned long long *a, unsigned long long v) {
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);
}
struct __nv_bfloat16 {
    uint16_t x;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.x = (uint16_t)((u >> 16) | 0x40);
        return b;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    b.x = (uint16_t)(u >> 16);
    return b;
}
static inline __nv_bfloat16 __float2bfloat16(float f) {
    return __float2bfloat16_rn(f);
}

#define __global__
#define __device__
#define __host__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

void emu_launch(dim3 g, dim3 b, size_t smem, std::function<void()> fn);

/* cp.async (kernels/cuda/internal.cuh): by default a copy lands at once.  EMU_CP_ASYNC=defer
 * queues each thread's copies and lands a group only when a wait_group retires it (the
 * latest moment the hardware may): a tile read before its wait (and barrier) then holds the
 * stale bytes of an earlier tile, or the NaN that fills fresh shared memory. */
void emu_cp_async(void *dst, const void *src, int bytes, bool ok);
void emu_cp_commit();
void emu_cp_wait(int pending); /* wait_group pending */
/* wgmma (kernels/cuda/internal.cuh): by default a warpgroup product is computed (from the
 * shared memory its descriptors name) when issued.  With EMU_WGMMA=defer it is queued and
 * computed at the wgmma wait that retires its group, as late as the hardware may read its
 * operands and write its accumulators: a stage refilled before that wait (copies landing at
 * once, the default), or accumulators read before it, then give wrong results. */
void emu_wgmma_issue(std::function<void()> product);
void emu_wgmma_commit();
void emu_wgmma_wait(int pending);

// ---- runtime API ----
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaErrorMemoryAllocation = 2, cudaErrorNotSupported = 801 };
typedef void *cudaStream_t;
typedef void *cudaEvent_t;
typedef void *cudaGraph_t;
typedef void *cudaGraphExec_t;
enum { cudaStreamNonBlocking = 1, cudaStreamCaptureModeThreadLocal = 1 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice };
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
static inline cudaError_t cudaGetLastError() {
    return cudaSuccess;
}
static inline const char *cudaGetErrorString(cudaError_t) {
    return "emulated error";
}
static inline const char *cudaGetErrorName(cudaError_t) {
    return "cudaErrorEmu";
}
static inline cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return 0;
}
static inline cudaError_t cudaSetDevice(int) {
    return 0;
}
static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, int) {
    *s = (void *)1;
    return 0;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t) {
    return 0;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t) {
    return 0;
}
static inline cudaError_t cudaMalloc(void **p, size_t n) {
    *p = aligned_alloc(256, (n + 255) / 256 * 256);
    if (*p) memset(*p, 0xff, n);
    return *p ? 0 : 2;
}
static inline cudaError_t cudaFree(void *p) {
    free(p);
    return 0;
}
static inline cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind,
                                          cudaStream_t) {
    memmove(d, s, n);
    return 0;
}
static inline cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t) {
    memset(d, v, n);
    return 0;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = (void *)1;
    return 0;
}
static inline cudaError_t cudaEventDestroy(cudaEvent_t) {
    return 0;
}
static inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
    return 0;
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t) {
    return 0;
}
static inline cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t, cudaEvent_t) {
    *ms = 0;
    return 0;
}
typedef int cudaStreamCaptureStatus;
enum { cudaStreamCaptureStatusNone = 0 };
static inline cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus *s) {
    *s = cudaStreamCaptureStatusNone; /* launches are recorded, never captured, here */
    return 0;
}
template <class F> static inline cudaError_t cudaFuncSetAttribute(F, int, int) {
    return 0;
}
struct cudaFuncAttributes {
    int maxThreadsPerBlock;
};
/* every kernel has an "image" here: the wgmma kernels run on the emulated warpgroup products */
template <class F> static inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, F) {
    a->maxThreadsPerBlock = 1024;
    return 0;
}
struct emu_launch_rec {
    dim3 g, b;
    size_t smem;
    std::function<void()> fn;
};
extern std::vector<emu_launch_rec> *emu_capture;
static inline cudaError_t cudaStreamBeginCapture(cudaStream_t, int) {
    emu_capture = new std::vector<emu_launch_rec>;
    return 0;
}
static inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *g) {
    *g = emu_capture;
    emu_capture = NULL;
    return 0;
}
static inline cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    delete (std::vector<emu_launch_rec> *)g;
    return 0;
}
static inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t) {
    return 0;
}
static inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, int) {
    *e = g;
    return 0;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t, cudaStream_t);
// ---- cuBLAS: not emulated ----
typedef void *cublasHandle_t;
typedef int cublasStatus_t;
enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15
};
typedef int cublasOperation_t;
enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
typedef int cublasComputeType_t;
enum {
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75
};
enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum { CUBLAS_GEMM_DEFAULT = -1 };
static inline cublasStatus_t cublasCreate(cublasHandle_t *h) {
    *h = (void *)1;
    return 0;
}
static inline cublasStatus_t cublasDestroy(cublasHandle_t) {
    return 0;
}
static inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) {
    return 0;
}
static inline cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *, size_t) {
    return 0;
}
static inline float emu_ld(const void *p, int type, long long i) {
    if (type == CUDA_R_32F) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* column-major reference GEMM: C = alpha op(A) op(B) + beta C */
static inline cublasStatus_t emu_gemm(int ta, int tb, int m, int n, int k, const float *alpha,
                                      const void *A, int at, int lda, const void *B, int bt,
                                      int ldb, const float *beta, float *C, int ldc) {
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double acc = 0;
            for (int p = 0; p < k; p++) {
                float a = ta ? emu_ld(A, at, (long long)i * lda + p)
                             : emu_ld(A, at, (long long)p * lda + i);
                float b = tb ? emu_ld(B, bt, (long long)p * ldb + j)
                             : emu_ld(B, bt, (long long)j * ldb + p);
                acc += (double)a * b;
            }
            float *c = C + (long long)j * ldc + i;
            *c = (float)(*alpha * acc + (*beta != 0.0f ? (double)*beta * *c : 0.0));
        }
    return CUBLAS_STATUS_SUCCESS;
}
/* During a stream capture the GEMM is recorded (scalars by value) and runs at the replay,
 * like a kernel launch; otherwise it runs now. */
static inline cublasStatus_t cublasGemmEx(cublasHandle_t, int ta, int tb, int m, int n, int k,
                                          const float *alpha, const void *A, int at, int lda,
                                          const void *B, int bt, int ldb, const float *beta,
                                          void *C, int ct, int ldc, int, int) {
    if (emu_capture) {
        float al = *alpha, be = *beta;
        emu_launch(dim3(1), dim3(1), 0, [=] {
            emu_gemm(ta, tb, m, n, k, &al, A, at, lda, B, bt, ldb, &be, (float *)C, ldc);
        });
        return CUBLAS_STATUS_SUCCESS;
    }
    return emu_gemm(ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, (float *)C, ldc);
}
static inline cublasStatus_t
cublasGemmStridedBatchedEx(cublasHandle_t, int ta, int tb, int m, int n, int k, const float *alpha,
                           const void *A, int at, int lda, long long sA, const void *B, int bt,
                           int ldb, long long sB, const float *beta, void *C, int ct, int ldc,
                           long long sC, int batch, int, int) {
    if (emu_capture) {
        float al = *alpha, be = *beta;
        emu_launch(dim3(1), dim3(1), 0, [=] {
            for (int b = 0; b < batch; b++)
                emu_gemm(ta, tb, m, n, k, &al, (const float *)A + b * sA, at, lda,
                         (const float *)B + b * sB, bt, ldb, &be, (float *)C + b * sC, ldc);
        });
        return CUBLAS_STATUS_SUCCESS;
    }
    for (int b = 0; b < batch; b++)
        emu_gemm(ta, tb, m, n, k, alpha, (const float *)A + b * sA, at, lda,
                 (const float *)B + b * sB, bt, ldb, beta, (float *)C + b * sC, ldc);
    return CUBLAS_STATUS_SUCCESS;
}
struct float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y) {
    return float2{x, y};
}
struct float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) {
    return float4{x, y, z, w};
}
struct uint4 {
    uint32_t x, y, z, w;
};
struct uint2 {
    uint32_t x, y;
};
struct __nv_bfloat162 { /* .x in the low half, as on the GPU (little-endian) */
    __nv_bfloat16 x, y;
};
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
static inline float emu_bf2f(__nv_bfloat16 b) {
    uint32_t u = (uint32_t)b.x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
namespace nvcuda {
namespace wmma {
struct row_major {};
struct col_major {};
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class L = void> struct fragment {
    float v[16][16];
};
template <class F> static inline void fill_fragment(F &f, float x) {
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            f.v[i][j] = x;
}
template <class Use, int M, int N, int K, class L>
static inline void load_matrix_sync(fragment<Use, M, N, K, __nv_bfloat16, L> &f,
                                    const __nv_bfloat16 *p, unsigned ldm) {
    __syncwarp();
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++)
            f.v[i][j] = std::is_same<L, row_major>::value ? emu_bf2f(p[i * ldm + j])
                                                          : emu_bf2f(p[j * ldm + i]);
    __syncwarp();
}
template <class A, class B, class C>
static inline void mma_sync(C &d, const A &a, const B &b, const C &c) {
    C r;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float acc = c.v[i][j];
            for (int k = 0; k < 16; k++)
                acc += a.v[i][k] * b.v[k][j];
            r.v[i][j] = acc;
        }
    d = r;
}
template <class F>
static inline void store_matrix_sync(float *p, const F &f, unsigned ldm, layout_t) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0)
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 16; j++)
                p[i * ldm + j] = f.v[i][j];
    __syncwarp();
}
} // namespace wmma
} // namespace nvcuda
