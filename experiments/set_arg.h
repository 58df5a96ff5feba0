/* experiments/set_arg.h: the KEY=VALUE of a --set override, as `agentrl sft` and
 * `agentrl train` read it (experiments/sft.c, experiments/train.c). */
#ifndef ARL_EXPERIMENTS_SET_ARG_H
#define ARL_EXPERIMENTS_SET_ARG_H
#include <stddef.h>

#include "core/status.h"

/* Split the argument kv of --set at its first '=': the KEY (not empty, shorter than cap bytes)
 * is copied into key, NUL-terminated; *value points into kv, after the '='.  ARL_ERR_ARG, naming
 * --set and kv, when there is no KEY= or the KEY is too long. */
arl_status arl_set_arg_split(const char *kv, char *key, size_t cap, const char **value);

#endif
