/* core/log.h: diagnostics to stderr.  One line per message, prefixed by the level.
 * The level is set once by main (--quiet / --verbose); library code only logs
 * warnings it cannot return (e.g. "ignored unknown config fields: ..."). */
#ifndef ARL_CORE_LOG_H
#define ARL_CORE_LOG_H

typedef enum arl_log_level {
    ARL_LOG_ERROR = 0,
    ARL_LOG_WARN = 1,
    ARL_LOG_INFO = 2,
    ARL_LOG_DEBUG = 3,
} arl_log_level;

void arl_log_set_level(arl_log_level level);
arl_log_level arl_log_get_level(void);
void arl_log(arl_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define arl_log_warn(...) arl_log(ARL_LOG_WARN, __VA_ARGS__)
#define arl_log_info(...) arl_log(ARL_LOG_INFO, __VA_ARGS__)
#define arl_log_debug(...) arl_log(ARL_LOG_DEBUG, __VA_ARGS__)
#define arl_log_error(...) arl_log(ARL_LOG_ERROR, __VA_ARGS__)

#endif
