/* envs/builtin/registry.c: the list of statically linked built-in environments (envs/env.h,
 * part B).  Owned by the built-in environments' author (helper envs-builtin): add one
 * declaration (in envs/builtin/builtin.h) and one `&arl_env_xxx,` line per environment.  The
 * list ends with NULL.  arl_env_builtin_find() (envs/registry.c) searches it first.  Their
 * teachers are listed in envs/builtin/teacher.c. */
#include "envs/builtin/builtin.h"
#include "envs/env.h"

const arl_env_def *const arl_env_builtins[] = {
    &arl_env_calculator, &arl_env_needle, &arl_env_kvstore, &arl_env_shapes, NULL,
};
