/* bench/common/pychild.h: the baseline child process of the CPU benchmarks.  A benchmark that
 * compares itself against PyTorch starts a Python script (bench/policy/torch_model.py,
 * bench/train_step/torch_train.py) with pipes on its stdin and stdout; the script first prints
 * one JSON line with its self-checks, then answers each request line with one JSON line.  This
 * is that protocol's C side, shared by bench_policy and bench_train_step.  It is not a general
 * subprocess library and does no timing itself. */
#ifndef ARL_BENCH_PYCHILD_H
#define ARL_BENCH_PYCHILD_H

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

typedef struct bench_child {
    pid_t pid;  /* 0 when not running */
    FILE *to;   /* requests, one line each; owned */
    FILE *from; /* replies, one JSON object per line; owned */
    char *line; /* getline buffer; owned */
    size_t cap;
} bench_child;

typedef enum bench_child_state {
    BENCH_CHILD_OK = 0,
    BENCH_CHILD_UNAVAILABLE = 1, /* no interpreter, no script, or no torch: C numbers only */
    BENCH_CHILD_FAILED = 2,      /* a correctness check failed or the child broke: fatal */
} bench_child_state;

/* Start argv[0] (the interpreter) with argv (NULL-terminated; argv[1] is the script, read
 * access checked) and env[i][0]=env[i][1] set in the child for i < n_env (entries with a NULL
 * value are skipped), then read the verification line.  On BENCH_CHILD_OK *info receives that
 * line's object (caller decrefs); otherwise why (cap bytes) explains and the child is gone.  A
 * reply carrying "error" is a failure, or unavailability when it also carries
 * "unavailable": true. */
bench_child_state bench_child_start(bench_child *b, char *const argv[], const char *const env[][2],
                                    int n_env, json_t **info, char *why, size_t cap);

/* The next reply as a JSON object (caller decrefs), or NULL when the child closed its output.
 * Lines not starting with '{' (stray prints of the child) are passed to stderr. */
json_t *bench_child_read(bench_child *b);

/* Send one request line and return its reply, or NULL when the child is gone or answered with
 * "error" (printed to stderr after the prefix who). */
json_t *bench_child_request(bench_child *b, const char *req, const char *who);

/* Ask the child to quit, close the pipes and reap it.  No-op when not running. */
void bench_child_stop(bench_child *b);

#endif
