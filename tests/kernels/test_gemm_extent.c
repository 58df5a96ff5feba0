/* tests/kernels/test_gemm_extent.c (sanitized builds only): the GEMM kernels run uninstrumented
 * under the sanitizers (kernels/cpu/internal.h), so arl_k_gemm checks each product's operands as
 * whole extents.  Here B (K, N) is one float short: AddressSanitizer must report a heap buffer
 * overflow from that check (ctest matches the report).  The same product on a B of the right
 * size runs first and prints "extent ok". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm.h"

int main(void) {
    enum { M = 20, N = 24, K = 40 };
    float *A = calloc(M * K, sizeof(float)), *C = calloc(M * N, sizeof(float));
    float *B = calloc(K * N, sizeof(float));
    if (!A || !B || !C) return 1;
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    fprintf(stderr, "extent ok\n");
    float *short_b = malloc(sizeof(float) * (K * N - 1)); /* one float short of (K, N) */
    if (!short_b) return 1;
    memset(short_b, 0, sizeof(float) * (K * N - 1));
    arl_k_gemm(ARL_K_NOTRANS, ARL_K_NOTRANS, M, N, K, 1.0f, A, K, short_b, N, 0.0f, C, N);
    fprintf(stderr, "no report: the short operand was not caught\n");
    free(A), free(B), free(C), free(short_b);
    return 1;
}
