/* core/log.c */
#include "core/log.h"

#include <stdarg.h>
#include <stdio.h>

static arl_log_level arl_log_level_now = ARL_LOG_INFO;

void arl_log_set_level(arl_log_level level) {
    arl_log_level_now = level;
}

arl_log_level arl_log_get_level(void) {
    return arl_log_level_now;
}

void arl_log(arl_log_level level, const char *fmt, ...) {
    static const char *const prefix[] = {"error: ", "warning: ", "", "debug: "};
    if (level > arl_log_level_now) return;
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "agentrl: %s%s\n", prefix[level], line);
}
