/* bench/gpu/gpu_common.h: what the whole-model GPU benchmarks share (bench_model.c: the
 * forward's MFU, bench_train.c: the training step's): the clock, the in-run cuBLAS rate that
 * is their denominator, the weights and batch they time, and the model FLOPs of a forward, so
 * that the two MFUs count the same work. */
#ifndef ARL_BENCH_GPU_COMMON_H
#define ARL_BENCH_GPU_COMMON_H

#include <stdint.h>

#include "core/rng.h"
#include "kernels/cuda/cuda.h"
#include "policy/config.h"
#include "policy/params.h"

/* monotonic seconds */
double bench_gpu_now_s(void);

/* qsort comparator of doubles, ascending */
int bench_gpu_cmp_double(const void *a, const void *b);

/* The cuBLAS bf16 GEMM rate at M = N = K = n (operands zero: the time does not depend on the
 * values), the median of 10 timed calls after one warm-up, in TFLOP/s; the operands come from
 * ctx's arena and are released.  Returns -1 when the arena has no room or a call fails. */
double bench_gpu_cublas_bf16_tflops(arl_cuda_ctx *ctx, int64_t n);

/* The weights a timing runs on: deterministic small uniform values in [-0.02, 0.02) (a
 * xorshift stream per tensor seeded from rng: filling the mini config takes well under a
 * second), norms (init ones) 1, zero-initialised tensors 0. */
void bench_gpu_params_fill(arl_model_params *w, arl_rng *rng);

/* A batch of N documents of len tokens each: tok (N len) uniform below V from rng, cu (N + 1)
 * the documents' bounds. */
void bench_gpu_batch_fill(int32_t *tok, int32_t *cu, int32_t N, int64_t len, int64_t V,
                          arl_rng *rng);

/* The model FLOPs of one forward over that batch (the usual MFU convention): 2 x active
 * parameters (lm_head included, the embedding gather excluded) x tokens, plus the attention
 * cores: MLA 2 (n + r + vm) Hm per causal (query, key) pair, KDA chunkwise (chunk C) per head
 * 6 T dk^2 + 3 T C dk + T C^2 (spec 3.5). */
double bench_gpu_forward_flops(const arl_model_config *cfg, int32_t N, int64_t len, int64_t C);

#endif
