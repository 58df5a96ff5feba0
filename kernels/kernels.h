/* kernels/kernels.h: every kernel contract of agentrl in one include.
 *
 * Conventions shared by all kernels (each header states its own details):
 *   - fp32, row-major, contiguous unless a leading dimension / row stride is an argument;
 *     shapes are given as (rows, cols) in the comment of each argument; sizes are int64_t.
 *   - argument order: outputs, inputs, sizes, scalar parameters (GEMM keeps the BLAS order).
 *   - forward kernels overwrite their outputs; backward kernels ACCUMULATE (+=) into gradients.
 *   - kernels allocate nothing, cannot fail on valid arguments, and ARL_ASSERT programmer errors
 *     (negative sizes, k > d, ...); 0 rows is always a valid no-op.
 *   - results are bit-identical run to run; all but the GEMMs also for any thread count
 *     (kernels/threadpool.h).
 *   - names: arl_k_<op>[_fwd|_bwd]; the CUDA mirror keeps the stem and argument order.
 * The CPU implementation is kernels/cpu/; backends are selected through kernels/backend.h.
 */
#ifndef ARL_KERNELS_KERNELS_H
#define ARL_KERNELS_KERNELS_H

#include "kernels/activation.h"
#include "kernels/backend.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/norm.h"
#include "kernels/reduce.h"
#include "kernels/softmax.h"
#include "kernels/threadpool.h"
#include "kernels/topk.h"

#endif
