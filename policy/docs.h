/* policy/docs.h: packed documents, as every core of policy/ takes them: T tokens of N documents
 * laid end to end, document i the tokens [cu[i], cu[i+1]) of cu (N + 1 ascending offsets from
 * 0 to T), or cu NULL for one document of all T tokens. */
#ifndef ARL_POLICY_DOCS_H
#define ARL_POLICY_DOCS_H

#include <stdint.h>

#include "core/assert.h"

/* The first token of document i. */
static inline int64_t arl_doc_lo(const int32_t *cu, int32_t i) {
    return cu ? cu[i] : 0;
}

/* One past the last token of document i. */
static inline int64_t arl_doc_hi(const int32_t *cu, int32_t i, int64_t T) {
    return cu ? cu[i + 1] : T;
}

/* Asserts that cu describes N documents of T tokens in all (a caller's programming error
 * otherwise): cu[0] = 0, cu[N] = T, ascending (empty documents allowed); N = 1 without cu. */
static inline void arl_docs_check(const int32_t *cu, int32_t N, int64_t T) {
    ARL_ASSERT(N >= 1 && T >= 0);
    if (!cu) {
        ARL_ASSERT(N == 1);
        return;
    }
    ARL_ASSERT(cu[0] == 0 && cu[N] == T);
    for (int32_t i = 0; i < N; i++)
        ARL_ASSERT(cu[i] <= cu[i + 1]);
}

#endif
