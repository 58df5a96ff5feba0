/* tests/reward/test_sources_nomem.c: arl_reward_sources_from_info out of memory is
 * ARL_ERR_NOMEM, never "no model sources" (spec/objective.md 13: a group whose environment
 * declares a process component with source "model" takes the min form; flags all 0 would train
 * it under the sum form, silently).  jansson's allocator is replaced, before core/json_dump.c's
 * watch wraps it, by one that fails its Nth call; every N up to the parse's count must end in
 * ARL_OK with the right flags or ARL_ERR_NOMEM (a failure of the lexer's token buffer leaves a
 * document that jansson calls good: "sourc" for "source"). */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "reward/reward.h"
#include "tests/test.h"

static long fail_at; /* the Nth call of jansson's malloc fails; 0: none */
static long calls;

static void *failing_malloc(size_t n) {
    if (fail_at && ++calls == fail_at) return NULL;
    return malloc(n);
}

static void test_sources_nomem(void) {
    json_set_alloc_funcs(failing_malloc, free);
    arl_json_watch(); /* the watch wraps failing_malloc */
    arl_reward_opts o;
    arl_reward_config cfg;
    CHECK(arl_options_defaults(arl_reward_options, arl_reward_options_count, &o) == ARL_OK);
    CHECK(arl_options_parse_json_text(arl_reward_options, arl_reward_options_count,
                                      "{\"process-components\": [\"acc=1\", \"prm=0.5\"]}", "t",
                                      &o) == ARL_OK);
    CHECK(arl_reward_config_from_opts(&o, &cfg) == ARL_OK);
    arl_options_free(arl_reward_options, arl_reward_options_count, &o);
    /* long strings: the lexer's buffer grows inside them */
    const char *info =
        "{\"reward_components\": ["
        "{\"name\": \"acc\", \"level\": \"process\", \"range\": [0, 1], "
        "\"description\": \"the fraction of the tool calls so far whose arguments were valid and "
        "whose results the environment accepted\"},"
        "{\"name\": \"prm\", \"level\": \"process\", \"range\": [0, 1], \"source\": \"model\", "
        "\"description\": \"a process reward model's score of the turn, between zero and one, "
        "given by the environment's own judge\"}]}";
    uint8_t flags[ARL_REWARD_MAX_COMPONENTS];
    fail_at = 0;
    calls = 0;
    CHECK(arl_reward_sources_from_info(&cfg, info, flags) == ARL_OK);
    CHECK(flags[0] == 0 && flags[1] == 1);
    fail_at = -1; /* count only */
    calls = 0;
    CHECK(arl_reward_sources_from_info(&cfg, info, flags) == ARL_OK);
    const long total = calls;
    CHECK(total > 5);
    int nomem = 0, wrong = 0;
    for (long n = 1; n <= total; n++) {
        fail_at = n;
        calls = 0;
        memset(flags, 7, sizeof flags);
        arl_status s = arl_reward_sources_from_info(&cfg, info, flags);
        if (s == ARL_ERR_NOMEM)
            nomem++;
        else if (s != ARL_OK || flags[0] != 0 || flags[1] != 1) {
            fprintf(stderr, "allocation %ld of %ld: status %d, flags %d %d\n", n, total, (int)s,
                    flags[0], flags[1]);
            wrong++;
        }
    }
    fail_at = 0;
    CHECK_EQ_INT(wrong, 0);
    CHECK(nomem > 0);
}

int main(void) {
    TEST_RUN(test_sources_nomem);
    return test_finish();
}
