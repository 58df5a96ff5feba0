/* core/npy.h: NumPy .npy files, the CLI's interchange format for arrays (token ids in,
 * logits out).
 *
 * Reads format versions 1.0, 2.0 and 3.0 (3.0 = 2.0 with a UTF-8 header); writes 1.0
 * (every header of rank <= ARL_NPY_MAX_RANK fits its 16-bit length).  Layout: magic
 * "\x93NUMPY", major, minor, header length (uint16 LE for 1.0, uint32 LE for 2.0/3.0),
 * then a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 * padded with spaces and a final '\n' so that the data starts at a multiple of 64 bytes,
 * then the raw C-order little-endian data.
 *
 * Accepted dtypes: those with an arl_dtype_npy_descr (see core/dtype.h): <f4 <f8 <f2 <i4
 * <i8 <i2 <u2 <u4 <u8 |u1 |i1 |b1.  Big-endian, structured and object dtypes are
 * ARL_ERR_UNSUPPORTED, fortran_order True is ARL_ERR_UNSUPPORTED.  Any rank up to
 * ARL_NPY_MAX_RANK (0 = scalar).  Malformed input (bad magic, truncated, bad dict, data
 * size not matching shape x dtype) is ARL_ERR_FORMAT with a message naming the file.
 * Trailing bytes after the data are an error too (a sign of a wrong shape).
 *
 * Not here: .npz archives, memory mapping, pickled objects.
 */
#ifndef ARL_CORE_NPY_H
#define ARL_CORE_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#define ARL_NPY_MAX_RANK 32
#define ARL_NPY_HEADER_MAX (1u << 20) /* longest header accepted (bytes) */

/* An array read from a .npy file. */
typedef struct arl_npy {
    arl_dtype dtype;
    int32_t rank;                    /* 0 = scalar (numel 1) */
    int64_t shape[ARL_NPY_MAX_RANK]; /* (rank) sizes, outermost first */
    int64_t numel;                   /* product of shape */
    uint64_t nbytes;                 /* numel * arl_dtype_size(dtype) */
    void *data; /* (numel) elements, C order, little-endian; owned, freed by arl_npy_free;
                   malloc'ed with at least 1 byte, aligned for any scalar type */
} arl_npy;

/* Read the whole file at path into *out (zeroed first; zero again on failure). */
arl_status arl_npy_read(const char *path, arl_npy *out);

/* Same from a buffer of len bytes (copied; buf may be freed after return).  label (may be
 * NULL: "<memory>") names the buffer in error messages. */
arl_status arl_npy_read_mem(const void *buf, size_t len, const char *label, arl_npy *out);

/* Parse only the header of buf: fills dtype, rank, shape, numel, nbytes of *out (data =
 * NULL) and *data_offset (where the data starts).  Checks that len == *data_offset + nbytes.
 * Used by arl_npy_read_mem; exposed for fuzzing and zero-copy readers. */
arl_status arl_npy_parse_header(const void *buf, size_t len, const char *label, arl_npy *out,
                                size_t *data_offset);

/* Free the data and zero *a.  NULL, or an already freed/zeroed array, is a no-op. */
void arl_npy_free(arl_npy *a);

/* Write an array atomically (temp file in the same directory, fsync, rename).
 * shape: (rank) sizes >= 0, rank 0..ARL_NPY_MAX_RANK; data: numel elements of dtype (raw,
 * little-endian), read during the call only (may be NULL if numel == 0).
 * ARL_ERR_ARG for a bad rank/shape, ARL_ERR_UNSUPPORTED for a dtype without an npy descr
 * (BF16, F8_*: convert to F32 first). */
arl_status arl_npy_write(const char *path, arl_dtype dtype, int32_t rank, const int64_t *shape,
                         const void *data);

#endif
