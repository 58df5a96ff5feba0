/* core/file.h: a whole file read into memory - a configuration, an experiment file, a
 * conversation, an image, a text to score - and a directory made with its parents.  Reads until end
 * of file, so pipes, FIFOs and /dev/stdin work as well as regular files (nothing relies on the
 * file's size being known).
 */
#ifndef ARL_CORE_FILE_H
#define ARL_CORE_FILE_H

#include <stddef.h>

#include "core/status.h"

/* Read all of path into *out, followed by a NUL that *len does not count (so a text file is a
 * C string; len may be NULL).  max > 0 bounds the bytes read: a longer file is ARL_ERR_RANGE
 * ("larger than max bytes"); max 0 is no bound.  Errors name path: ARL_ERR_NOT_FOUND when it
 * does not exist, ARL_ERR_IO when it cannot be opened or read (with the system's reason),
 * ARL_ERR_NOMEM.  On error *out is NULL and *len 0; on success the caller frees *out. */
arl_status arl_file_read(const char *path, size_t max, char **out, size_t *len);

/* Make the directory path and its missing parents (mode 0755 before the umask), as mkdir -p:
 * ARL_ERR_IO naming the first one that cannot be made, or path when it exists and is not a
 * directory; ARL_ERR_ARG for an empty or overlong path. */
arl_status arl_mkdir_p(const char *path);

/* The failure to write path (what: "write failed", "cannot open for writing", ...), e its errno:
 * ARL_ERR_FULL for ENOSPC or EDQUOT (a full disk or quota: free space and go on), else
 * ARL_ERR_IO; the message is "PATH: WHAT: strerror(e)" (e 0: EIO). */
arl_status arl_file_write_failed(const char *path, const char *what, int e);

#endif
