/* kernels/cuda/cuda.h: the CUDA backend of agentrl - device context, device arena, errors,
 * transfers, and the backend table (kernels/backend.h) over device memory.
 *
 * It is: one context per device (selection, one stream, one cuBLAS handle, one device arena
 * allocated up front with a bump/stack allocator), the mapping of CUDA/cuBLAS failures to
 * arl_status with a message, CUDA-graph capture and replay (decode steps), and
 * arl_cuda_backend(): the kernels/backend.h table whose entries take DEVICE pointers and run on
 * the current context's stream.  It is not: the model-level device ops (KDA, MLA, MoE,
 * router, QB histogram, AttnRes, AdamW: kernels/cuda/ops.h), NCCL (kernels/cuda/nccl.h), or a
 * tensor library.  In a build without nvcc the same functions exist and return
 * ARL_ERR_UNSUPPORTED (kernels/cuda/stub/cuda_stub.c), so call sites carry no #ifdef.
 *
 * ---- dtype policy (spec/policy.md 1.4) ----
 *   - Table entries (kernels/backend.h) keep the CPU contracts exactly: fp32 storage, row
 *     reductions (norm statistics, softmax sums, log-sum-exp) accumulated in double like the
 *     CPU, so they can be tested against the CPU elementwise.
 *   - GEMMs of the table (gemm, gemm_batched, linear_*) run through cuBLAS on fp32 storage with
 *     the context's math mode: ARL_CUDA_MATH_FP32 (fp32 multiply-adds, the parity default),
 *     ARL_CUDA_MATH_TF32, or ARL_CUDA_MATH_BF16 (inputs rounded to bf16 inside cuBLAS, fp32
 *     accumulation and output: "GPU matmuls may use bf16 inputs with fp32 accumulation").
 *   - bf16 STORAGE is used only where it pays, by explicit entry points with `_bf16` in their
 *     names (kernels/cuda/ops.h): the weight/activation GEMM and the MoE grouped GEMM (bf16
 *     operands, fp32 accumulation, fp32 output), with arl_cuda_f32_to_bf16 / _bf16_to_f32.
 *   - Everything 1.4 lists as fp32 always is fp32 here, in storage and arithmetic: norm
 *     statistics, L2 norm, AttnRes, router logits/sigmoid/top-k/weights, KDA gate, beta and
 *     state, attention softmax, SiTU, QB statistics, and the AdamW update and moments.
 *
 * ---- memory ----
 * arl_cuda_open allocates the whole device arena once (cudaMalloc of config.arena_bytes).  A
 * small internal part (reduction partials, index tables, the error word, the cuBLAS
 * workspace) is carved off first; the rest is handed out by arl_cuda_alloc (256-byte aligned
 * bump pointer) and given back in stack order by arl_cuda_release(ctx, mark).  Nothing in this
 * backend calls cudaMalloc after arl_cuda_open; cuBLAS is given its workspace from the arena.
 *
 * ---- errors ----
 * Functions returning arl_status report CUDA/cuBLAS failures as ARL_ERR_DEVICE (ARL_ERR_NOMEM
 * for an exhausted arena) with a message naming the call, the op and the CUDA error string.
 * The table entries return void (the CPU contract): a failed launch is recorded in the context
 * as a sticky first error, and kernels that detect bad input (a forced route outside [0, E))
 * set a device error word; arl_cuda_sync() waits for the stream and returns the first of
 * them.  Library code never exits or prints.
 *
 * ---- current context ----
 * The table entries have no context argument: they use the calling thread's current context
 * (arl_cuda_make_current).  arl_k_backend_get("cuda", ...) opens a process-wide default
 * context on device 0 (ARL_CUDA_DEFAULT_ARENA bytes) when the thread has none.
 *
 * Pointer lifetimes: an arl_cuda_ctx is owned by the caller of arl_cuda_open and valid until
 * arl_cuda_close (the default context lives until process exit).  Arena pointers are valid
 * until the arena is released below them or the context closes.
 */
#ifndef ARL_KERNELS_CUDA_CUDA_H
#define ARL_KERNELS_CUDA_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/status.h"
#include "kernels/backend.h"

typedef struct arl_cuda_ctx arl_cuda_ctx;

typedef enum arl_cuda_math {
    ARL_CUDA_MATH_FP32 = 0, /* fp32 multiply-adds in cuBLAS (CUBLAS_COMPUTE_32F_PEDANTIC) */
    ARL_CUDA_MATH_TF32 = 1, /* tf32 tensor cores, fp32 accumulation */
    ARL_CUDA_MATH_BF16 = 2, /* bf16-rounded inputs, fp32 accumulation (COMPUTE_32F_FAST_16BF) */
} arl_cuda_math;

/* Bytes of the default context's arena (internal part included). */
#define ARL_CUDA_DEFAULT_ARENA ((size_t)256 << 20)

typedef struct arl_cuda_config {
    int32_t device;     /* CUDA device ordinal */
    size_t arena_bytes; /* the whole device arena, allocated once by arl_cuda_open */
    arl_cuda_math math; /* math mode of the table's GEMMs */
} arl_cuda_config;

/* device 0, ARL_CUDA_DEFAULT_ARENA, ARL_CUDA_MATH_FP32 */
void arl_cuda_config_defaults(arl_cuda_config *c);

/* Number of usable CUDA devices (0 when the driver or the device is missing, and always 0 in
 * a build without CUDA).  Never fails. */
int32_t arl_cuda_device_count(void);

/* This process's GPU among the visible ones: the local MPI rank (OMPI_COMM_WORLD_LOCAL_RANK)
 * modulo arl_cuda_device_count(), 0 outside mpirun; -1 without a device.  Never fails
 * (kernels/cuda/select.c; the rollout engine and the learner open their context on it). */
int32_t arl_cuda_local_device(void);

/* Opens a context on c->device: stream, cuBLAS handle, arena.  *out is owned by the caller
 * (arl_cuda_close).  ARL_ERR_UNSUPPORTED without CUDA; ARL_ERR_DEVICE when the device does not
 * exist or the arena cannot be allocated (the message says how much was asked). */
arl_status arl_cuda_open(const arl_cuda_config *c, arl_cuda_ctx **out);
void arl_cuda_close(arl_cuda_ctx *ctx); /* NULL-safe; frees the arena */

/* The calling thread's current context (NULL if none) and its setter (ctx may be NULL). */
arl_cuda_ctx *arl_cuda_current(void);
void arl_cuda_make_current(arl_cuda_ctx *ctx);

/* The process default context (device 0), opened on first use; made current for the calling
 * thread if the thread has none. */
arl_status arl_cuda_default(arl_cuda_ctx **out);

void arl_cuda_set_math(arl_cuda_ctx *ctx, arl_cuda_math math);
arl_cuda_math arl_cuda_get_math(const arl_cuda_ctx *ctx);

/* The context's stream as a cudaStream_t (void * so C callers need no CUDA headers). */
void *arl_cuda_stream(arl_cuda_ctx *ctx);

/* ---- arena ---- */

/* A 256-byte aligned block of `bytes` device bytes from the arena, for `what` (named in the
 * error).  ARL_ERR_NOMEM when the arena is full (the message gives its size and use). */
arl_status arl_cuda_alloc(arl_cuda_ctx *ctx, size_t bytes, const char *what, void **out);
/* Current top of the arena; arl_cuda_release(ctx, mark) frees everything allocated after it. */
size_t arl_cuda_mark(const arl_cuda_ctx *ctx);
void arl_cuda_release(arl_cuda_ctx *ctx, size_t mark);
size_t arl_cuda_arena_free(const arl_cuda_ctx *ctx); /* bytes still available */

/* ---- transfers and synchronisation (on the context's stream) ---- */

/* Host -> device and device -> host copies; these wait for completion (host memory may be
 * reused on return).  Device -> device copies are asynchronous. */
arl_status arl_cuda_upload(arl_cuda_ctx *ctx, void *dst_dev, const void *src_host, size_t bytes);
arl_status arl_cuda_download(arl_cuda_ctx *ctx, void *dst_host, const void *src_dev, size_t bytes);
arl_status arl_cuda_copy_d2d(arl_cuda_ctx *ctx, void *dst_dev, const void *src_dev, size_t bytes);
arl_status arl_cuda_memset0(arl_cuda_ctx *ctx, void *dst_dev, size_t bytes);

/* Waits for the stream; returns (and clears) the first recorded error: a failed launch or
 * cuBLAS call of a table entry, or a bad-input flag set by a kernel. */
arl_status arl_cuda_sync(arl_cuda_ctx *ctx);

/* ---- bf16 conversion (round to nearest even; NaN stays NaN) ----
 * bf16 values are uint16_t bit patterns in device memory. */
void arl_cuda_f32_to_bf16(uint16_t *y, const float *x, int64_t n);
void arl_cuda_bf16_to_f32(float *y, const uint16_t *x, int64_t n);

/* ---- timing (benchmarks) ---- */
/* Milliseconds between two points of the stream: arl_cuda_timer_start records, _stop records,
 * waits and returns the elapsed time (< 0 on error). */
void arl_cuda_timer_start(arl_cuda_ctx *ctx);
float arl_cuda_timer_stop(arl_cuda_ctx *ctx);

/* Per-op profile (benchmarks): after arl_cuda_profile_begin, every launch and cuBLAS call of a
 * table entry records an event on the stream with its op name (not while a graph is being
 * captured; at most ARL_CUDA_PROFILE_MAX of them); arl_cuda_profile_end waits for the stream,
 * writes to `out` the GPU time between consecutive events summed per op name (each op is
 * charged the time since the previous event: its own run plus any idle gap before it), largest
 * first, and stops recording.  Events are created once, at the first begin. */
#define ARL_CUDA_PROFILE_MAX 16384
arl_status arl_cuda_profile_begin(arl_cuda_ctx *ctx);
arl_status arl_cuda_profile_end(arl_cuda_ctx *ctx, FILE *out);

/* ---- CUDA graphs (decode steps) ----
 * Capture a fixed sequence of device ops on the context's stream once and replay it with one
 * launch: arl_cuda_graph_begin(ctx); <ops: table entries, kernels/cuda/ops.h>; then
 * arl_cuda_graph_end(ctx, &g) instantiates it; arl_cuda_graph_launch(ctx, g) replays it
 * with the same pointers and scalars (update buffers in place between replays).  Between
 * begin and end only device ops may run: no transfers that wait (upload, download, sync).
 * *g is owned by the caller until arl_cuda_graph_free (NULL-safe). */
typedef struct arl_cuda_graph arl_cuda_graph;
arl_status arl_cuda_graph_begin(arl_cuda_ctx *ctx);
arl_status arl_cuda_graph_end(arl_cuda_ctx *ctx, arl_cuda_graph **g);
arl_status arl_cuda_graph_launch(arl_cuda_ctx *ctx, const arl_cuda_graph *g);
void arl_cuda_graph_free(arl_cuda_graph *g);

/* ---- the backend table ----
 * kernels/backend.h over device memory, on the current context (arl_cuda_current()); every
 * pointer argument is a device pointer, scalars are host values, and results are ready after
 * arl_cuda_sync.  Contracts, shapes and accumulate (+=) semantics are those of the
 * kernels/<concept>.h headers.  Differences from the CPU: results are deterministic run to
 * run but not bit-identical to the CPU (other summation order; cuBLAS GEMMs); topk_rows is one
 * thread per row and takes k <= 64 (fine for router widths, slow for a vocabulary). */
const arl_k_backend *arl_cuda_backend(void);

#ifdef __cplusplus
}
#endif

#endif
