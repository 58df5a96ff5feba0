/* experiments/set_arg.c: the KEY=VALUE of a --set override (set_arg.h). */
#include "experiments/set_arg.h"

#include <string.h>

arl_status arl_set_arg_split(const char *kv, char *key, size_t cap, const char **value) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) return arl_errorf(ARL_ERR_ARG, "--set '%s': expected KEY=VALUE", kv);
    if ((size_t)(eq - kv) >= cap) return arl_errorf(ARL_ERR_ARG, "--set '%s': key too long", kv);
    memcpy(key, kv, (size_t)(eq - kv));
    key[eq - kv] = 0;
    *value = eq + 1;
    return ARL_OK;
}
