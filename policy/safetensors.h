/* policy/safetensors.h: the safetensors file layer and sharded checkpoint directories
 * (spec/policy.md section 14.1).
 *
 * What this is: reading and writing the container format -- an 8-byte little-endian header
 * length N, an N-byte JSON header {"name": {"dtype", "shape", "data_offsets": [b, e]}, ...,
 * "__metadata__": {string: string}}, then the data section (offsets are relative to its
 * start, byte 8 + N of the file) -- and directories holding either one model.safetensors or
 * model-0000i-of-0000N.safetensors shards plus model.safetensors.index.json.
 * What this is not: it knows nothing of tensor names of the model, expected shapes or configs
 * (policy/checkpoint.c does), and nothing of devices.
 *
 * Reading validates the whole header at open, so that every later access is in bounds:
 *   header length <= ARL_ST_HEADER_MAX and <= file size - 8; the header is a JSON object;
 *   every entry except "__metadata__" is an object with "dtype" (a known name, see
 *   core/dtype.h), "shape" (array of at most ARL_ST_MAX_RANK non-negative integers) and
 *   "data_offsets" ([begin, end] integers, 0 <= begin <= end <= data section size);
 *   end - begin == numel * dtype size (computed with overflow checks); the byte ranges of
 *   tensors do not overlap (empty tensors overlap nothing); names are unique and non-empty;
 *   "__metadata__", if present, is an object of strings.  Gaps between tensors and trailing
 *   bytes after the last tensor are allowed (other writers align data).
 * Every failure returns ARL_ERR_FORMAT (ARL_ERR_IO for system errors, ARL_ERR_UNSUPPORTED
 * for a rank above ARL_ST_MAX_RANK) with a message naming the file and, where there is
 * one, the tensor.
 *
 * Data of a file opened from disk is mmap'ed read-only: a multi-GB checkpoint costs no
 * heap.  The file must not be truncated or rewritten in place while it is open (reads of
 * the mapping would fault); agentrl's writers replace files by rename, which is safe.  Raw tensor
 * data is only byte-aligned in general (the header length decides the data start; agentrl's writer
 * pads it to 8, so its files give 8-byte aligned data when the mapping is page-aligned).
 *
 * Writing is atomic (temp file in the same directory, fsync, rename, fsync of the
 * directory) and streaming: tensors are declared first and their data is pulled from the
 * caller's pointers (or a fill callback) at close, in declaration order, through a fixed
 * 4 MiB buffer, so a checkpoint is never held twice in memory.  The header is padded with
 * spaces to a multiple of 8 bytes, "__metadata__" first, then tensors in declaration order,
 * data packed in declaration order with no gaps.
 *
 * Thread safety: an opened file/dir is immutable after open; concurrent reads from several
 * threads are fine.  A writer is used by one thread.
 */
#ifndef ARL_POLICY_SAFETENSORS_H
#define ARL_POLICY_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"

#define ARL_ST_MAX_RANK 8
#define ARL_ST_HEADER_MAX (100u * 1024u * 1024u) /* bytes of JSON header accepted */
#define ARL_ST_INDEX_NAME "model.safetensors.index.json"
#define ARL_ST_SINGLE_NAME "model.safetensors"

typedef struct arl_st_file arl_st_file;

/* One tensor entry of an opened file.  Owned by its arl_st_file; every pointer in it is
 * valid until arl_st_file_close (or arl_st_dir_close for tensors reached via a dir). */
typedef struct arl_st_tensor {
    const char *name; /* NUL-terminated key */
    arl_dtype dtype;
    int32_t rank;                   /* 0 = scalar (numel 1) */
    int64_t shape[ARL_ST_MAX_RANK]; /* (rank) sizes, outermost first; unused entries 0 */
    int64_t numel;                  /* product of shape (1 for a scalar, 0 if any size is 0) */
    uint64_t nbytes;                /* numel * arl_dtype_size(dtype) */
    uint64_t offset;                /* begin of data_offsets (relative to the data section) */
    const arl_st_file *file;        /* the file that holds it */
} arl_st_tensor;

/* ---- reading one file ---- */

/* Open and validate the file at path (see the rules above).  On success *out owns the
 * mapping; close with arl_st_file_close.  On failure *out = NULL. */
arl_status arl_st_file_open(const char *path, arl_st_file **out);

/* Same, over a buffer of len bytes already in memory (tests, fuzzing, received blobs).
 * buf is not copied and must stay valid and unchanged until arl_st_file_close.
 * `label` (may be NULL: "<memory>") names the buffer in error messages; it is copied. */
arl_status arl_st_file_open_mem(const void *buf, size_t len, const char *label, arl_st_file **out);

/* Unmap and free.  NULL is a no-op. */
void arl_st_file_close(arl_st_file *f);

/* Path given to open (or the label). Valid until arl_st_file_close. */
const char *arl_st_file_path(const arl_st_file *f);

/* Number of tensors (excluding "__metadata__"). */
int64_t arl_st_file_count(const arl_st_file *f);

/* The i-th tensor, 0 <= i < count, in order of data offset (ties by name).  Asserts on a
 * bad index. */
const arl_st_tensor *arl_st_file_tensor(const arl_st_file *f, int64_t i);

/* Tensor by exact name, or NULL if absent (O(log n)). */
const arl_st_tensor *arl_st_file_find(const arl_st_file *f, const char *name);

/* Like find, but a missing tensor is ARL_ERR_NOT_FOUND with a message naming file and
 * tensor. */
arl_status arl_st_file_get(const arl_st_file *f, const char *name, const arl_st_tensor **out);

/* "__metadata__" value for key, or NULL if absent.  Valid until arl_st_file_close. */
const char *arl_st_file_metadata(const arl_st_file *f, const char *key);

/* The data checksum (ARL_ST_DATA_CRC_KEY, written by a writer given arl_st_*writer_data_crc):
 * the CRC-32 of every byte after the header, checked against the stored one.  A mismatch (a
 * byte changed or lost in the data since the file was written) is ARL_ERR_CORRUPT naming the
 * file; a file without the key (another writer's, or an older build's) is ARL_OK unchecked.
 * Reads the whole data section: for loads that read it anyway, not for header inspection. */
#define ARL_ST_DATA_CRC_KEY "agentrl_data_crc32"
arl_status arl_st_file_check_data(const arl_st_file *f);

/* Number of "__metadata__" entries and the i-th (key, value) pair (header order).  Strings
 * valid until arl_st_file_close. */
int64_t arl_st_file_metadata_count(const arl_st_file *f);
void arl_st_file_metadata_at(const arl_st_file *f, int64_t i, const char **key, const char **value);

/* ---- reading tensor data ---- */

/* Pointer to the tensor's raw bytes (nbytes of them, little-endian, byte-aligned only),
 * inside the file's mapping; valid until the file is closed.  Never NULL (for an empty
 * tensor it points at the data section). */
const void *arl_st_tensor_data(const arl_st_tensor *t);

/* Copy the raw bytes into dst, which has room for nbytes bytes; nbytes must equal
 * t->nbytes (else ARL_ERR_SHAPE naming file and tensor). */
arl_status arl_st_tensor_read_raw(const arl_st_tensor *t, void *dst, uint64_t nbytes);

/* Convert the tensor into n floats at dst; n must equal t->numel (else ARL_ERR_SHAPE).
 * Any dtype is accepted (conversions of core/dtype.h: exact for F32/BF16/F16/U8/I8/BOOL). */
arl_status arl_st_tensor_read_f32(const arl_st_tensor *t, float *dst, int64_t n);

/* Convert the tensor into n elements of dst_dtype at dst (memcpy when the dtypes match,
 * else through fp32 with arl_dtype_convert's rules: BF16/F16 targets round to nearest
 * even, integer targets ARL_ERR_UNSUPPORTED).  n must equal t->numel. */
arl_status arl_st_tensor_read_as(const arl_st_tensor *t, arl_dtype dst_dtype, void *dst, int64_t n);

/* ARL_OK if t has exactly this rank and shape, else ARL_ERR_SHAPE with
 * "<file>: tensor '<name>': expected shape [a, b], got [c]". shape: (rank). */
arl_status arl_st_tensor_check_shape(const arl_st_tensor *t, int32_t rank, const int64_t *shape);

/* Format "[a, b, c]" ("[]" for a scalar) into buf (always NUL-terminated, cut if too
 * small); returns buf. */
char *arl_st_shape_str(int32_t rank, const int64_t *shape, char *buf, size_t size);

/* ---- writing one file ---- */

typedef struct arl_st_writer arl_st_writer;

/* Fill callback for arl_st_writer_add_fn: write the nbytes bytes of the tensor starting
 * at byte `offset` (of its nbytes total) into buf.  Called in increasing offset order,
 * chunks of at most 4 MiB.  Return ARL_OK or an error (which aborts the write). */
typedef arl_status (*arl_st_fill_fn)(void *ctx, void *buf, uint64_t offset, uint64_t nbytes);

/* Start a file at path.  Creates the temp file "<path>.tmp-XXXXXX" in the same directory
 * now (so that an unwritable directory fails here); path itself is replaced only by a
 * successful arl_st_writer_close.  On failure *out = NULL. */
arl_status arl_st_writer_open(const char *path, arl_st_writer **out);

/* Add a "__metadata__" string pair (both copied).  A repeated key replaces the value. */
arl_status arl_st_writer_set_metadata(arl_st_writer *w, const char *key, const char *value);

/* Write the data checksum into the metadata (ARL_ST_DATA_CRC_KEY: 8 hex digits, the CRC-32 of
 * the bytes after the header, filled in once they are written; arl_st_file_check_data). */
void arl_st_writer_data_crc(arl_st_writer *w);

/* Declare a tensor whose raw bytes (numel * dtype size, little-endian) are at data.
 * name and shape are copied; data is NOT copied: it must stay valid and unchanged until
 * arl_st_writer_close returns.  data may be NULL only if numel == 0.  rank 0..ARL_ST_MAX_RANK,
 * sizes >= 0.  ARL_ERR_ARG for a duplicate or empty name, "__metadata__", a bad dtype,
 * rank or size; the writer stays usable after an error of add. */
arl_status arl_st_writer_add(arl_st_writer *w, const char *name, arl_dtype dtype, int32_t rank,
                             const int64_t *shape, const void *data);

/* Declare a tensor stored as dtype (F32, F64, BF16 or F16) whose values are the fp32 array
 * src (numel floats, not copied, valid until close returns); converted chunk by chunk at
 * close (BF16/F16 round to nearest even). */
arl_status arl_st_writer_add_f32(arl_st_writer *w, const char *name, arl_dtype dtype, int32_t rank,
                                 const int64_t *shape, const float *src);

/* Declare a tensor whose bytes come from fill(ctx, ...) at close (e.g. copied from a
 * device in chunks).  ctx must stay valid until close returns. */
arl_status arl_st_writer_add_fn(arl_st_writer *w, const char *name, arl_dtype dtype, int32_t rank,
                                const int64_t *shape, arl_st_fill_fn fill, void *ctx);

/* Bytes of data declared so far (sum of nbytes). */
uint64_t arl_st_writer_data_bytes(const arl_st_writer *w);

/* Write header and data, fsync, rename the temp file to path, fsync the directory, and
 * free w.  On any failure the temp file is removed, path is left as it was, and w is freed
 * too.  NULL: ARL_ERR_ARG. */
arl_status arl_st_writer_close(arl_st_writer *w);

/* Discard: remove the temp file and free w.  NULL is a no-op. */
void arl_st_writer_abort(arl_st_writer *w);

/* ---- sharded checkpoint directories ---- */

typedef struct arl_st_dir arl_st_dir;

/* Open a checkpoint: `path` is either a directory or a single .safetensors file.
 * A directory with ARL_ST_INDEX_NAME uses the index (it wins over a model.safetensors
 * beside it); otherwise it must hold ARL_ST_SINGLE_NAME.  The index must be a JSON object
 * with a "weight_map" object of tensor name -> shard file name (a plain file name in the
 * same directory: no '/', not "." or ".."); "metadata" is optional.  Errors (ARL_ERR_FORMAT
 * unless noted), each naming the file and tensor: neither file present (ARL_ERR_NOT_FOUND),
 * a shard file missing (ARL_ERR_NOT_FOUND), a shard invalid, a tensor of the weight_map
 * absent from its shard, a tensor present in two shards, a tensor in a shard but not in
 * the weight_map.  On failure *out = NULL. */
arl_status arl_st_dir_open(const char *path, arl_st_dir **out);

/* Close every shard. NULL is a no-op. */
void arl_st_dir_close(arl_st_dir *d);

/* The path given to open. Valid until arl_st_dir_close. */
const char *arl_st_dir_path(const arl_st_dir *d);

/* Number of tensors over all shards, and the i-th in name order (strcmp).  Tensors are
 * valid until arl_st_dir_close. */
int64_t arl_st_dir_count(const arl_st_dir *d);
const arl_st_tensor *arl_st_dir_tensor(const arl_st_dir *d, int64_t i);

/* Tensor by name across shards, or NULL. */
const arl_st_tensor *arl_st_dir_find(const arl_st_dir *d, const char *name);

/* Like find; absent is ARL_ERR_NOT_FOUND naming the checkpoint and the tensor. */
arl_status arl_st_dir_get(const arl_st_dir *d, const char *name, const arl_st_tensor **out);

/* Shards (1 for a single file), in file-name order; valid until arl_st_dir_close. */
int32_t arl_st_dir_shard_count(const arl_st_dir *d);
const arl_st_file *arl_st_dir_shard(const arl_st_dir *d, int32_t i);

/* arl_st_file_check_data of every shard. */
arl_status arl_st_dir_check_data(const arl_st_dir *d);

/* Sum of nbytes of all tensors. */
uint64_t arl_st_dir_data_bytes(const arl_st_dir *d);

/* ---- writing a checkpoint directory ---- */

typedef struct arl_st_dir_writer arl_st_dir_writer;

/* Start writing a checkpoint into directory `dir` (created, one level, if absent).
 * max_shard_bytes: data bytes per shard; 0 = no limit (always a single file).  Tensors
 * are assigned to shards in declaration order, greedily: a new shard starts when the next
 * tensor would push the current one over the limit (a tensor larger than the limit gets a
 * shard of its own).  Nothing is written before arl_st_dir_writer_close. */
arl_status arl_st_dir_writer_open(const char *dir, uint64_t max_shard_bytes,
                                  arl_st_dir_writer **out);

/* "__metadata__" pair written into every shard (copied). */
arl_status arl_st_dir_writer_set_metadata(arl_st_dir_writer *w, const char *key, const char *value);

/* Each shard with its data checksum (arl_st_writer_data_crc). */
void arl_st_dir_writer_data_crc(arl_st_dir_writer *w);

/* Declare tensors: same contracts as arl_st_writer_add / _add_f32 / _add_fn (data not
 * copied; valid until arl_st_dir_writer_close returns). */
arl_status arl_st_dir_writer_add(arl_st_dir_writer *w, const char *name, arl_dtype dtype,
                                 int32_t rank, const int64_t *shape, const void *data);
arl_status arl_st_dir_writer_add_f32(arl_st_dir_writer *w, const char *name, arl_dtype dtype,
                                     int32_t rank, const int64_t *shape, const float *src);
arl_status arl_st_dir_writer_add_fn(arl_st_dir_writer *w, const char *name, arl_dtype dtype,
                                    int32_t rank, const int64_t *shape, arl_st_fill_fn fill,
                                    void *ctx);

/* Write everything and free w (also on failure).  One shard: dir/model.safetensors, and a
 * stale dir/model.safetensors.index.json is removed.  N > 1 shards:
 * dir/model-00001-of-0000N.safetensors ... (5-digit numbers, as Hugging Face), then
 * dir/model.safetensors.index.json = {"metadata": {"total_size": <sum of nbytes>},
 * "weight_map": {name: shard, ...}} (written last, atomically), then a stale
 * dir/model.safetensors is removed.  Each file is written atomically; for a crash-consistent
 * checkpoint write into a fresh directory and rename it.  Shards of an earlier, larger
 * write into the same directory are left in place (unreferenced). */
arl_status arl_st_dir_writer_close(arl_st_dir_writer *w);

/* Discard without writing anything. NULL is a no-op. */
void arl_st_dir_writer_abort(arl_st_dir_writer *w);

#endif
