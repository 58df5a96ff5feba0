/* envs/registry.c: finding built-in environments by name (envs/env.h, part B).
 * Search order: arl_env_builtins (envs/builtin/registry.c), the environments compiled into
 * envs/ itself (arl_env_core_defs, envs/test_env.c), then run-time registrations. */
#include <pthread.h>
#include <string.h>

#include "envs/env.h"

extern const arl_env_def *const arl_env_core_defs[];

#define REG_MAX 64
static const arl_env_def *reg_defs[REG_MAX];
static size_t reg_n;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;

const arl_env_def *arl_env_builtin_at(size_t i) {
    size_t n1 = 0, n2 = 0;
    while (arl_env_builtins[n1]) n1++;
    if (i < n1) return arl_env_builtins[i];
    i -= n1;
    while (arl_env_core_defs[n2]) n2++;
    if (i < n2) return arl_env_core_defs[i];
    i -= n2;
    pthread_mutex_lock(&reg_lock);
    const arl_env_def *d = i < reg_n ? reg_defs[i] : NULL;
    pthread_mutex_unlock(&reg_lock);
    return d;
}

const arl_env_def *arl_env_builtin_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0;; i++) {
        const arl_env_def *d = arl_env_builtin_at(i);
        if (!d) return NULL;
        if (d->name && !strcmp(d->name, name)) return d;
    }
}

arl_status arl_env_builtin_register(const arl_env_def *def) {
    if (!def || !def->name || !def->ops)
        return arl_errorf(ARL_ERR_ARG, "env registry: definition without name or ops");
    if (arl_env_builtin_find(def->name))
        return arl_errorf(ARL_ERR_STATE, "env registry: an environment named '%s' exists already",
                          def->name);
    pthread_mutex_lock(&reg_lock);
    arl_status s = ARL_OK;
    if (reg_n >= REG_MAX)
        s = arl_errorf(ARL_ERR_FULL, "env registry: more than %d registrations", REG_MAX);
    else
        reg_defs[reg_n++] = def;
    pthread_mutex_unlock(&reg_lock);
    return s;
}
