/* tests/golden/golden.h: loading the committed golden vectors of tests/golden/data/ in C tests.
 *
 * What it is: a thin layer over policy/safetensors.h for the files written by
 * tests/golden/gen_golden.py (one <case>.safetensors per case of spec/policy.md section 16.2).
 * A floating tensor NAME is stored as NAME (F64) and NAME.f32 (F32); golden_f32 returns the
 * F32 copy (or converts when only one form exists), golden_f64 the F64 reference; integer
 * tensors are I64.  What it is not: library code.  It is for tests only: a missing file or
 * tensor, or a size that differs from what the test expects, prints a message naming the case
 * and tensor and exits the test with status 1 (a golden test that cannot load its data must
 * fail, never pass).
 *
 * Ownership: every array returned is owned by the golden_case and freed by golden_close.
 */
#ifndef ARL_TESTS_GOLDEN_H
#define ARL_TESTS_GOLDEN_H

#include <stdint.h>

typedef struct golden_case golden_case;

/* Open tests/golden/data/<name>.safetensors under $ARL_SOURCE_DIR (else the working
 * directory).  Exits the test on failure. */
golden_case *golden_open(const char *name);

/* Free the case and every array it returned.  NULL is a no-op. */
void golden_close(golden_case *gc);

/* 1 if the case holds a tensor NAME (in either form), else 0. */
int golden_has(golden_case *gc, const char *name);

/* Number of elements of NAME; with shape != NULL also its shape (up to 8 sizes) and rank. */
int64_t golden_numel(golden_case *gc, const char *name, int64_t *shape, int32_t *rank);

/* NAME as floats / doubles / integers.  expect_numel >= 0: exit the test unless the tensor
 * has exactly that many elements; < 0: any size. */
float *golden_f32(golden_case *gc, const char *name, int64_t expect_numel);
double *golden_f64(golden_case *gc, const char *name, int64_t expect_numel);
int64_t *golden_i64(golden_case *gc, const char *name, int64_t expect_numel);
int32_t *golden_i32(golden_case *gc, const char *name, int64_t expect_numel);

/* A zero-filled float array of n elements owned by the case (work buffers, outputs). */
float *golden_zeros(golden_case *gc, int64_t n);

/* The opened file (for walking every tensor); valid until golden_close. */
struct arl_st_file;
const struct arl_st_file *golden_file(const golden_case *gc);

/* The case's name. */
const char *golden_name(const golden_case *gc);

#endif
