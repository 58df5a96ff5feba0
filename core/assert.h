/* core/assert.h: always-on assertions for programmer errors (independent of NDEBUG).
 * Use status codes, not asserts, for anything a user or the outside world can cause. */
#ifndef ARL_CORE_ASSERT_H
#define ARL_CORE_ASSERT_H

#include <stdio.h>
#include <stdlib.h>

#define ARL_ASSERT(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: %s: assertion failed: %s\n", __FILE__, __LINE__, __func__,    \
                    #cond);                                                                        \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif
