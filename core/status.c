/* core/status.c: status names and the thread-local error message. */
#include "core/status.h"

#include <stdio.h>
#include <string.h>

#define ARL_ERRMSG_CAP 2048

static _Thread_local char arl_errmsg[ARL_ERRMSG_CAP];

static const char *const arl_status_names[ARL_STATUS_COUNT_] = {
    [ARL_OK] = "ok",
    [ARL_ERR_NOMEM] = "out of memory",
    [ARL_ERR_IO] = "I/O error",
    [ARL_ERR_ARG] = "bad argument",
    [ARL_ERR_CONFIG] = "bad configuration",
    [ARL_ERR_FORMAT] = "malformed input",
    [ARL_ERR_SHAPE] = "shape mismatch",
    [ARL_ERR_VERSION] = "unsupported version",
    [ARL_ERR_NOT_FOUND] = "not found",
    [ARL_ERR_UNSUPPORTED] = "unsupported",
    [ARL_ERR_CORRUPT] = "corrupt data",
    [ARL_ERR_DB] = "database error",
    [ARL_ERR_NET] = "network error",
    [ARL_ERR_TIMEOUT] = "timeout",
    [ARL_ERR_PROTOCOL] = "protocol error",
    [ARL_ERR_BUSY] = "busy",
    [ARL_ERR_FULL] = "disk full",
    [ARL_ERR_RANGE] = "out of range",
    [ARL_ERR_STATE] = "invalid state",
    [ARL_ERR_ENV] = "environment error",
    [ARL_ERR_CANCELLED] = "cancelled",
    [ARL_ERR_INTERNAL] = "internal error",
    [ARL_ERR_DEVICE] = "device error",
};

const char *arl_status_str(arl_status s) {
    if ((int)s < 0 || s >= ARL_STATUS_COUNT_ || !arl_status_names[s]) return "unknown status";
    return arl_status_names[s];
}

arl_status arl_verrorf(arl_status s, const char *fmt, va_list ap) {
    vsnprintf(arl_errmsg, sizeof arl_errmsg, fmt, ap);
    return s;
}

arl_status arl_errorf(arl_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    arl_verrorf(s, fmt, ap);
    va_end(ap);
    return s;
}

arl_status arl_error_prefix(arl_status s, const char *fmt, ...) {
    char prefix[512];
    char old[ARL_ERRMSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, arl_errmsg, sizeof old);
    if (old[0])
        snprintf(arl_errmsg, sizeof arl_errmsg, "%s: %s", prefix, old);
    else
        snprintf(arl_errmsg, sizeof arl_errmsg, "%s: %s", prefix, arl_status_str(s));
    return s;
}

const char *arl_error_msg(void) {
    return arl_errmsg;
}

void arl_error_clear(void) {
    arl_errmsg[0] = 0;
}
