/* kernels/cuda/context.cu: device context, arena, error mapping, transfers, timing and the
 * bf16 conversions of the CUDA backend (kernels/cuda/cuda.h).  No kernels of the model here. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/internal.cuh"

#define ALIGN 256

static thread_local arl_cuda_ctx *g_current = NULL;
static arl_cuda_ctx *g_default = NULL;
static pthread_mutex_t g_default_mu = PTHREAD_MUTEX_INITIALIZER;

extern "C" void arl_cuda_config_defaults(arl_cuda_config *c) {
    c->device = 0;
    c->arena_bytes = ARL_CUDA_DEFAULT_ARENA;
    c->math = ARL_CUDA_MATH_FP32;
}

extern "C" int32_t arl_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the error: no driver or no device */
        return 0;
    }
    return n;
}

arl_status arl_cuda_status(const char *op, cudaError_t e) {
    if (e == cudaSuccess) return ARL_OK;
    if (e == cudaErrorMemoryAllocation)
        return arl_errorf(ARL_ERR_NOMEM, "cuda: %s: out of device memory (%s)", op,
                          cudaGetErrorString(e));
    return arl_errorf(ARL_ERR_DEVICE, "cuda: %s: %s (%s)", op, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

static const char *blas_str(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
        return "invalid value (unsupported shape or leading dimension)";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "architecture mismatch";
    case CUBLAS_STATUS_MAPPING_ERROR:
        return "mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR:
        return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "not supported";
    default:
        return "unknown cuBLAS status";
    }
}

arl_status arl_cuda_blas_status(const char *op, cublasStatus_t s) {
    if (s == CUBLAS_STATUS_SUCCESS) return ARL_OK;
    return arl_errorf(ARL_ERR_DEVICE, "cublas: %s: %s (status %d)", op, blas_str(s), (int)s);
}

struct arl_cuda_prof {
    int32_t on, n, created;
    cudaEvent_t ev[ARL_CUDA_PROFILE_MAX];
    const char *name[ARL_CUDA_PROFILE_MAX];
};

static void prof_mark(arl_cuda_ctx *ctx, const char *op) {
    arl_cuda_prof *p = ctx->prof;
    if (!p || !p->on || p->n >= ARL_CUDA_PROFILE_MAX) return;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone)
        return;
    if (cudaEventRecord(p->ev[p->n], ctx->stream) == cudaSuccess) p->name[p->n++] = op;
}

extern "C" arl_status arl_cuda_profile_begin(arl_cuda_ctx *ctx) {
    if (!ctx->prof) {
        ctx->prof = (arl_cuda_prof *)calloc(1, sizeof *ctx->prof);
        if (!ctx->prof) return arl_errorf(ARL_ERR_NOMEM, "cuda: out of host memory (profile)");
    }
    arl_cuda_prof *p = ctx->prof;
    for (; p->created < ARL_CUDA_PROFILE_MAX; p->created++)
        ARL_TRY(arl_cuda_status("cudaEventCreate (profile)", cudaEventCreate(&p->ev[p->created])));
    p->on = 1;
    p->n = 0;
    prof_mark(ctx, "(begin)");
    return ARL_OK;
}

extern "C" arl_status arl_cuda_profile_end(arl_cuda_ctx *ctx, FILE *out) {
    arl_cuda_prof *p = ctx->prof;
    if (!p || !p->on) return arl_errorf(ARL_ERR_STATE, "cuda: profile_end without profile_begin");
    p->on = 0;
    ARL_TRY(arl_cuda_status("cudaStreamSynchronize (profile)", cudaStreamSynchronize(ctx->stream)));
    enum { MAXN = 256 };
    const char *names[MAXN];
    double ms[MAXN];
    int32_t cnt[MAXN], nn = 0;
    double total = 0.0;
    for (int32_t i = 1; i < p->n; i++) {
        float dt = 0.0f;
        ARL_TRY(arl_cuda_status("cudaEventElapsedTime (profile)",
                                cudaEventElapsedTime(&dt, p->ev[i - 1], p->ev[i])));
        int32_t j = 0;
        while (j < nn && strcmp(names[j], p->name[i]) != 0)
            j++;
        if (j == nn) {
            if (nn == MAXN) continue;
            names[nn] = p->name[i], ms[nn] = 0.0, cnt[nn] = 0, nn++;
        }
        ms[j] += dt, cnt[j]++, total += dt;
    }
    for (int32_t a = 0; a < nn; a++) /* largest first (insertion sort, few names) */
        for (int32_t b = a; b > 0 && ms[b] > ms[b - 1]; b--) {
            double tm = ms[b]; ms[b] = ms[b - 1], ms[b - 1] = tm;
            int32_t tc = cnt[b]; cnt[b] = cnt[b - 1], cnt[b - 1] = tc;
            const char *tn = names[b]; names[b] = names[b - 1], names[b - 1] = tn;
        }
    fprintf(out, "per-op GPU time (%d events%s): total %.3f ms\n", (int)p->n,
            p->n >= ARL_CUDA_PROFILE_MAX ? ", truncated" : "", total);
    for (int32_t j = 0; j < nn; j++)
        fprintf(out, "  %-44s %9.3f ms %5.1f%% %6d calls\n", names[j], ms[j],
                total > 0 ? 100.0 * ms[j] / total : 0.0, (int)cnt[j]);
    return ARL_OK;
}

void arl_cuda_record(arl_cuda_ctx *ctx, const char *op, cudaError_t e) {
    prof_mark(ctx, op);
    if (e == cudaSuccess || ctx->sticky != ARL_OK) return;
    ctx->sticky = ARL_ERR_DEVICE;
    snprintf(ctx->sticky_msg, sizeof ctx->sticky_msg, "cuda: %s: %s", op, cudaGetErrorString(e));
}

void arl_cuda_record_blas(arl_cuda_ctx *ctx, const char *op, cublasStatus_t s) {
    prof_mark(ctx, op);
    if (s == CUBLAS_STATUS_SUCCESS || ctx->sticky != ARL_OK) return;
    ctx->sticky = ARL_ERR_DEVICE;
    snprintf(ctx->sticky_msg, sizeof ctx->sticky_msg, "cublas: %s: %s", op, blas_str(s));
}

arl_cuda_ctx *arl_cuda_need(void) {
    arl_cuda_ctx *c = g_current;
    ARL_ASSERT(c != NULL && "no current CUDA context: call arl_cuda_make_current or "
                            "arl_k_backend_get(\"cuda\")");
    return c;
}

extern "C" arl_cuda_ctx *arl_cuda_current(void) {
    return g_current;
}

extern "C" void arl_cuda_make_current(arl_cuda_ctx *ctx) {
    g_current = ctx;
    if (ctx) (void)cudaSetDevice(ctx->device);
}

extern "C" void *arl_cuda_stream(arl_cuda_ctx *ctx) {
    return (void *)ctx->stream;
}

extern "C" void arl_cuda_set_math(arl_cuda_ctx *ctx, arl_cuda_math math) {
    ctx->math = math;
}

extern "C" arl_cuda_math arl_cuda_get_math(const arl_cuda_ctx *ctx) {
    return ctx->math;
}

static size_t round_up(size_t x) {
    return (x + ALIGN - 1) / ALIGN * ALIGN;
}

extern "C" arl_status arl_cuda_open(const arl_cuda_config *c, arl_cuda_ctx **out) {
    *out = NULL;
    int n = arl_cuda_device_count();
    if (n == 0)
        return arl_errorf(ARL_ERR_DEVICE,
                          "cuda: no CUDA device is visible (cudaGetDeviceCount found none); use "
                          "--device cpu or check the driver and CUDA_VISIBLE_DEVICES");
    if (c->device < 0 || c->device >= n)
        return arl_errorf(ARL_ERR_DEVICE, "cuda: device %d does not exist (this machine has %d)",
                          (int)c->device, n);
    size_t internal = round_up(sizeof(double) * ARL_CUDA_PARTIALS) +
                      round_up(sizeof(int32_t) * ARL_CUDA_INDEX_INTS) +
                      round_up(sizeof(arl_cuda_errword)) + ARL_CUDA_CUBLAS_WS;
    if (c->arena_bytes < internal + ALIGN)
        return arl_errorf(ARL_ERR_CONFIG,
                          "cuda: arena of %zu bytes is too small (the backend itself needs %zu)",
                          c->arena_bytes, internal + ALIGN);
    arl_cuda_ctx *ctx = (arl_cuda_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) return arl_errorf(ARL_ERR_NOMEM, "cuda: out of host memory for the context");
    ctx->device = c->device;
    ctx->math = c->math;
    arl_status s = arl_cuda_status("cudaSetDevice", cudaSetDevice(c->device));
    if (s == ARL_OK)
        s = arl_cuda_status("cudaStreamCreate",
                            cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    if (s == ARL_OK) {
        cudaError_t e = cudaMalloc((void **)&ctx->arena, c->arena_bytes);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            s = arl_errorf(ARL_ERR_DEVICE,
                           "cuda: cannot allocate the device arena of %.1f MiB on device %d (%s); "
                           "lower the arena size",
                           (double)c->arena_bytes / 1048576.0, (int)c->device,
                           cudaGetErrorString(e));
        }
    }
    if (s == ARL_OK) s = arl_cuda_blas_status("cublasCreate", cublasCreate(&ctx->blas));
    if (s == ARL_OK) s = arl_cuda_status("cudaEventCreate", cudaEventCreate(&ctx->ev0));
    if (s == ARL_OK) s = arl_cuda_status("cudaEventCreate", cudaEventCreate(&ctx->ev1));
    if (s != ARL_OK) {
        arl_cuda_close(ctx);
        return s;
    }
    ctx->arena_bytes = c->arena_bytes;
    size_t off = 0;
    ctx->partials = (double *)(ctx->arena + off);
    off += round_up(sizeof(double) * ARL_CUDA_PARTIALS);
    ctx->index = (int32_t *)(ctx->arena + off);
    off += round_up(sizeof(int32_t) * ARL_CUDA_INDEX_INTS);
    ctx->err = (arl_cuda_errword *)(ctx->arena + off);
    off += round_up(sizeof(arl_cuda_errword));
    ctx->blas_ws = ctx->arena + off;
    off += ARL_CUDA_CUBLAS_WS;
    ctx->user_base = ctx->top = off;
    s = arl_cuda_blas_status("cublasSetStream", cublasSetStream(ctx->blas, ctx->stream));
    if (s == ARL_OK)
        s = arl_cuda_blas_status("cublasSetWorkspace",
                                 cublasSetWorkspace(ctx->blas, ctx->blas_ws, ARL_CUDA_CUBLAS_WS));
    if (s == ARL_OK)
        s = arl_cuda_status("cudaMemsetAsync",
                            cudaMemsetAsync(ctx->err, 0, sizeof(arl_cuda_errword), ctx->stream));
    if (s == ARL_OK)
        s = arl_cuda_status("cudaStreamSynchronize", cudaStreamSynchronize(ctx->stream));
    if (s != ARL_OK) {
        arl_cuda_close(ctx);
        return s;
    }
    *out = ctx;
    return ARL_OK;
}

extern "C" void arl_cuda_close(arl_cuda_ctx *ctx) {
    if (!ctx) return;
    if (g_current == ctx) g_current = NULL;
    if (ctx->stream) (void)cudaStreamSynchronize(ctx->stream);
    if (ctx->blas) cublasDestroy(ctx->blas);
    if (ctx->ev0) cudaEventDestroy(ctx->ev0);
    if (ctx->ev1) cudaEventDestroy(ctx->ev1);
    if (ctx->prof) {
        for (int32_t i = 0; i < ctx->prof->created; i++)
            cudaEventDestroy(ctx->prof->ev[i]);
        free(ctx->prof);
    }
    if (ctx->arena) cudaFree(ctx->arena);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    (void)cudaGetLastError();
    free(ctx);
}

extern "C" arl_status arl_cuda_default(arl_cuda_ctx **out) {
    pthread_mutex_lock(&g_default_mu);
    arl_status s = ARL_OK;
    if (!g_default) {
        arl_cuda_config c;
        arl_cuda_config_defaults(&c);
        s = arl_cuda_open(&c, &g_default);
    }
    pthread_mutex_unlock(&g_default_mu);
    if (s != ARL_OK) return s;
    if (!g_current) arl_cuda_make_current(g_default);
    *out = g_default;
    return ARL_OK;
}

/* ---- arena ---- */

extern "C" arl_status arl_cuda_alloc(arl_cuda_ctx *ctx, size_t bytes, const char *what,
                                     void **out) {
    size_t need = round_up(bytes ? bytes : 1);
    if (need > ctx->arena_bytes - ctx->top) {
        *out = NULL;
        return arl_errorf(ARL_ERR_NOMEM,
                          "cuda: device arena full: %s needs %zu bytes, %zu of %zu are free "
                          "(raise the arena size given to arl_cuda_open)",
                          what ? what : "a buffer", bytes, ctx->arena_bytes - ctx->top,
                          ctx->arena_bytes);
    }
    *out = ctx->arena + ctx->top;
    ctx->top += need;
    return ARL_OK;
}

extern "C" size_t arl_cuda_mark(const arl_cuda_ctx *ctx) {
    return ctx->top;
}

extern "C" void arl_cuda_release(arl_cuda_ctx *ctx, size_t mark) {
    ARL_ASSERT(mark >= ctx->user_base && mark <= ctx->top);
    ctx->top = mark;
}

extern "C" size_t arl_cuda_arena_free(const arl_cuda_ctx *ctx) {
    return ctx->arena_bytes - ctx->top;
}

/* ---- transfers ---- */

extern "C" arl_status arl_cuda_upload(arl_cuda_ctx *ctx, void *dst, const void *src, size_t n) {
    if (n == 0) return ARL_OK;
    ARL_TRY(arl_cuda_status("upload (cudaMemcpyAsync H2D)",
                            cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, ctx->stream)));
    return arl_cuda_status("upload (cudaStreamSynchronize)", cudaStreamSynchronize(ctx->stream));
}

extern "C" arl_status arl_cuda_download(arl_cuda_ctx *ctx, void *dst, const void *src, size_t n) {
    if (n == 0) return ARL_OK;
    ARL_TRY(arl_cuda_status("download (cudaMemcpyAsync D2H)",
                            cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, ctx->stream)));
    return arl_cuda_status("download (cudaStreamSynchronize)", cudaStreamSynchronize(ctx->stream));
}

extern "C" arl_status arl_cuda_copy_d2d(arl_cuda_ctx *ctx, void *dst, const void *src, size_t n) {
    if (n == 0) return ARL_OK;
    return arl_cuda_status("copy (cudaMemcpyAsync D2D)",
                           cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, ctx->stream));
}

extern "C" arl_status arl_cuda_memset0(arl_cuda_ctx *ctx, void *dst, size_t n) {
    if (n == 0) return ARL_OK;
    return arl_cuda_status("cudaMemsetAsync", cudaMemsetAsync(dst, 0, n, ctx->stream));
}

static const char *errword_what(int32_t code) {
    switch (code) {
    case 1:
        return "router: a forced route is outside [0, E) or repeats an expert (token %d)";
    case 2:
        return "moe: an expert index is outside [0, E) (route entry %d)";
    case 3:
        return "kda: the packed batch has %d chunks, more than the index table holds; "
               "split the batch";
    case 4:
        return "embedding backward: a token id is outside [0, V) (position %d)";
    default:
        return "kernel reported bad input (detail %d)";
    }
}

extern "C" arl_status arl_cuda_sync(arl_cuda_ctx *ctx) {
    arl_status s = arl_cuda_status("cudaStreamSynchronize", cudaStreamSynchronize(ctx->stream));
    if (s != ARL_OK) return s;
    if (ctx->sticky != ARL_OK) {
        arl_status r = ctx->sticky;
        ctx->sticky = ARL_OK;
        return arl_errorf(r, "%s", ctx->sticky_msg);
    }
    arl_cuda_errword w;
    ARL_TRY(arl_cuda_download(ctx, &w, ctx->err, sizeof w));
    if (w.code != 0) {
        ARL_TRY(arl_cuda_memset0(ctx, ctx->err, sizeof w));
        char msg[256];
        snprintf(msg, sizeof msg, errword_what(w.code), (int)w.detail);
        return arl_errorf(ARL_ERR_RANGE, "cuda: %s", msg);
    }
    return ARL_OK;
}

/* ---- timing ---- */

extern "C" void arl_cuda_timer_start(arl_cuda_ctx *ctx) {
    cudaEventRecord(ctx->ev0, ctx->stream);
}

extern "C" float arl_cuda_timer_stop(arl_cuda_ctx *ctx) {
    float ms = -1.0f;
    if (cudaEventRecord(ctx->ev1, ctx->stream) != cudaSuccess) return -1.0f;
    if (cudaEventSynchronize(ctx->ev1) != cudaSuccess) return -1.0f;
    if (cudaEventElapsedTime(&ms, ctx->ev0, ctx->ev1) != cudaSuccess) return -1.0f;
    return ms;
}

/* ---- CUDA graphs ---- */

struct arl_cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
};

extern "C" arl_status arl_cuda_graph_begin(arl_cuda_ctx *ctx) {
    if (ctx->sticky != ARL_OK) return arl_cuda_sync(ctx); /* report an earlier failure first */
    return arl_cuda_status("graph capture (cudaStreamBeginCapture)",
                           cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal));
}

extern "C" arl_status arl_cuda_graph_end(arl_cuda_ctx *ctx, arl_cuda_graph **out) {
    *out = NULL;
    cudaGraph_t graph = NULL;
    arl_status s = arl_cuda_status("graph capture (cudaStreamEndCapture)",
                                   cudaStreamEndCapture(ctx->stream, &graph));
    if (s == ARL_OK && ctx->sticky != ARL_OK) s = arl_cuda_sync(ctx); /* a launch failed */
    if (s != ARL_OK) {
        if (graph) cudaGraphDestroy(graph);
        return arl_error_prefix(s, "cuda graph: an op could not be captured");
    }
    arl_cuda_graph *g = (arl_cuda_graph *)calloc(1, sizeof *g);
    if (!g) {
        cudaGraphDestroy(graph);
        return arl_errorf(ARL_ERR_NOMEM, "cuda graph: out of host memory");
    }
    g->graph = graph;
    s = arl_cuda_status("cudaGraphInstantiate", cudaGraphInstantiate(&g->exec, graph, 0));
    if (s != ARL_OK) {
        arl_cuda_graph_free(g);
        return s;
    }
    *out = g;
    return ARL_OK;
}

extern "C" arl_status arl_cuda_graph_launch(arl_cuda_ctx *ctx, const arl_cuda_graph *g) {
    return arl_cuda_status("cudaGraphLaunch", cudaGraphLaunch(g->exec, ctx->stream));
}

extern "C" void arl_cuda_graph_free(arl_cuda_graph *g) {
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    free(g);
}

/* ---- bf16 conversions ---- */

__global__ void k_f32_to_bf16(uint16_t *y, const float *x, int64_t n) {
    ARL_GRID_STRIDE(i, n) {
        y[i] = (uint16_t)arl_bf16_rn_bits(x[i]);
    }
}

__global__ void k_bf16_to_f32(float *y, const uint16_t *x, int64_t n) {
    ARL_GRID_STRIDE(i, n) {
        uint32_t u = (uint32_t)x[i] << 16;
        y[i] = __uint_as_float(u);
    }
}

extern "C" void arl_cuda_f32_to_bf16(uint16_t *y, const float *x, int64_t n) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (n <= 0) return;
    k_f32_to_bf16<<<arl_blocks(n, 256), 256, 0, c->stream>>>(y, x, n);
    ARL_CUDA_LAUNCHED(c, "f32_to_bf16");
}

extern "C" void arl_cuda_bf16_to_f32(float *y, const uint16_t *x, int64_t n) {
    arl_cuda_ctx *c = arl_cuda_need();
    if (n <= 0) return;
    k_bf16_to_f32<<<arl_blocks(n, 256), 256, 0, c->stream>>>(y, x, n);
    ARL_CUDA_LAUNCHED(c, "bf16_to_f32");
}
