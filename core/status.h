/* core/status.h: the status codes every library function returns, and the
 * thread-local error message that goes with a failure.
 *
 * Library code never exits: it returns an arl_status and, on failure, records a
 * message that names what failed and where (the file, the field, the tensor) and
 * what to do.  Only main() decides to stop.  Pattern:
 *
 *     if (n < 0) return arl_errorf(ARL_ERR_CONFIG, "%s: field 'hidden_size': "
 *                                  "expected a positive integer, got %d", path, n);
 *
 * The enum is append-only: codes are stable across versions.
 */
#ifndef ARL_CORE_STATUS_H
#define ARL_CORE_STATUS_H

#include <stdarg.h>

typedef enum arl_status {
    ARL_OK = 0,
    ARL_ERR_NOMEM = 1,       /* allocation failed */
    ARL_ERR_IO = 2,          /* open/read/write/fsync/rename failed */
    ARL_ERR_ARG = 3,         /* bad command-line argument or bad value from a user */
    ARL_ERR_CONFIG = 4,      /* bad or missing field in a configuration file */
    ARL_ERR_FORMAT = 5,      /* malformed file or message (bad header, bad JSON, ...) */
    ARL_ERR_SHAPE = 6,       /* tensor shape or dtype does not match what was expected */
    ARL_ERR_VERSION = 7,     /* format or schema version this build does not handle */
    ARL_ERR_NOT_FOUND = 8,   /* a named thing (file, tensor, trajectory, session) is absent */
    ARL_ERR_UNSUPPORTED = 9, /* valid input asking for something this build does not do */
    ARL_ERR_CORRUPT = 10,    /* checksum or invariant violated in stored data */
    ARL_ERR_DB = 11,         /* SQLite error */
    ARL_ERR_NET = 12,        /* connection-level network failure */
    ARL_ERR_TIMEOUT = 13,    /* a deadline passed */
    ARL_ERR_PROTOCOL = 14,   /* a peer broke a protocol (AEP/1, MPI message layout) */
    ARL_ERR_BUSY = 15,       /* resource locked or at capacity; retry later */
    ARL_ERR_FULL = 16,       /* disk or quota full */
    ARL_ERR_RANGE = 17,      /* value out of its valid range (token id, index, size) */
    ARL_ERR_STATE = 18,      /* operation not valid in the object's current state */
    ARL_ERR_ENV = 19,        /* an environment reported an error */
    ARL_ERR_CANCELLED = 20,  /* interrupted by a signal or a caller's request */
    ARL_ERR_INTERNAL = 21,   /* a bug: an invariant of our own code failed */
    ARL_ERR_DEVICE = 22,     /* accelerator (CUDA, cuBLAS, NCCL) error or no device */
    ARL_STATUS_COUNT_
} arl_status;

/* Short stable name of a status ("ok", "out of memory", ...). Never NULL. */
const char *arl_status_str(arl_status s);

/* Record a formatted message for this thread and return s (for `return arl_errorf(...)`).
 * The message replaces any earlier one. Messages longer than 2047 bytes are cut. */
arl_status arl_errorf(arl_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
arl_status arl_verrorf(arl_status s, const char *fmt, va_list ap);

/* Prefix the current message with "prefix: " (adds context on the way up) and return s. */
arl_status arl_error_prefix(arl_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The last message recorded on this thread ("" if none). Valid until the next
 * arl_errorf/arl_error_prefix/arl_error_clear on this thread. */
const char *arl_error_msg(void);
void arl_error_clear(void);

/* Propagate a failing status: ARL_TRY(f(x)); */
#define ARL_TRY(expr)                                                                              \
    do {                                                                                           \
        arl_status arl_try_s_ = (expr);                                                            \
        if (arl_try_s_ != ARL_OK) return arl_try_s_;                                               \
    } while (0)

#endif
