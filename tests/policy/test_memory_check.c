/* tests/policy/test_memory_check.c: the large arenas are refused up front where they do not fit
 * the memory available now (policy/params.h arl_params_memory_check), not only where they
 * exceed the machine's physical memory.  Linux overcommits: a second 10 GiB arena on a 23 GiB
 * machine already holding one is granted, and the process is killed when the first optimizer
 * step writes the moments.  `agentrl sft` with the mini config (2.77B parameters: weights,
 * gradients and two AdamW moments of 10.33 GiB each) was such a run.
 *
 * The available memory is set by arl_params_memory_override, so no case allocates more than the
 * tiny model's 12 MB:
 *   - parameters, AdamW moments, the model workspace and the training activation arena are
 *     refused with ARL_ERR_NOMEM naming what, the GiB needed and the GiB available;
 *   - each is granted with just enough available memory (the check is not off by a factor);
 *   - beyond physical memory the message says so (kimi-k3's 11 TB is covered by
 *     tests/policy_config/test_params.c test_too_large);
 *   - with the real MemAvailable the tiny model allocates as before;
 *   - max_context and max_tokens above 2^40 are refused (test_context_bound). */
#include <stdlib.h>
#include <string.h>

#include "policy/config.h"
#include "policy/model.h"
#include "policy/model_backward.h"
#include "policy/model_device.h"
#include "policy/optimizer.h"
#include "policy/params.h"
#include "policy/state.h"
#include "tests/test.h"

static arl_model_config cfg_;

static int64_t arena_bytes(void) {
    arl_param_inventory inv;
    if (arl_param_inventory_build(&cfg_, &inv)) return -1;
    int64_t b = inv.arena_floats * (int64_t)sizeof(float);
    arl_param_inventory_free(&inv);
    return b;
}

static void test_params_refused(void) {
    const int64_t need = arena_bytes();
    CHECK(need > 1 << 20);
    arl_params_memory_override(need - 1);
    arl_model_params p;
    arl_status s = arl_model_params_alloc(&p, &cfg_);
    CHECK_EQ_INT(s, ARL_ERR_NOMEM);
    CHECK_MSG(strstr(arl_error_msg(), "fp32 parameters of this config") &&
                  strstr(arl_error_msg(), "GiB of memory available now"),
              "message: %s", arl_error_msg());
    CHECK(p.arena == NULL && p.layers == NULL && p.inv.t == NULL);
    arl_params_memory_override(need);
    s = arl_model_params_alloc(&p, &cfg_);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    arl_model_params_free(&p);
    arl_params_memory_override(-1);
}

/* a run's check of all its arenas at once (sft: 4, a CPU learner: 5) */
static void test_copies_refused(void) {
    const int64_t need = 5 * arena_bytes();
    arl_params_memory_override(need - 1);
    CHECK_EQ_INT(arl_params_memory_check_copies(&cfg_, 5, "five"), ARL_ERR_NOMEM);
    CHECK_MSG(strstr(arl_error_msg(), "five (5 x ") && strstr(arl_error_msg(), "available now"),
              "message: %s", arl_error_msg());
    arl_params_memory_override(need);
    CHECK_EQ_INT(arl_params_memory_check_copies(&cfg_, 5, "five"), ARL_OK);
    arl_params_memory_override(-1);
}

static void test_adamw_refused(void) {
    const int64_t need = 2 * arena_bytes();
    arl_optim_config oc;
    CHECK(arl_optim_config_defaults(&oc) == ARL_OK);
    arl_adamw opt;
    arl_params_memory_override(need - 1);
    arl_status s = arl_adamw_init(&opt, &cfg_, &oc);
    CHECK_EQ_INT(s, ARL_ERR_NOMEM);
    CHECK_MSG(strstr(arl_error_msg(), "AdamW moment arenas") &&
                  strstr(arl_error_msg(), "available now"),
              "message: %s", arl_error_msg());
    CHECK(opt.m_arena == NULL && opt.v_arena == NULL);
    arl_params_memory_override(need);
    s = arl_adamw_init(&opt, &cfg_, &oc);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    arl_adamw_free(&opt);
    arl_optim_config_free(&oc);
    arl_params_memory_override(-1);
}

static void test_workspaces_refused(void) {
    arl_model_params w;
    CHECK(arl_model_params_alloc(&w, &cfg_) == ARL_OK);
    arl_model_opts mo;
    arl_model_opts_default(&mo);
    const int64_t ws = arl_model_workspace_bytes(&cfg_, &mo);
    CHECK(ws > 0);
    arl_model m;
    arl_params_memory_override(ws / 2);
    arl_status s = arl_model_init(&m, &cfg_, &w, &mo);
    CHECK_EQ_INT(s, ARL_ERR_NOMEM);
    CHECK_MSG(strstr(arl_error_msg(), "workspace"), "message: %s", arl_error_msg());
    arl_params_memory_override(-1);
    s = arl_model_init(&m, &cfg_, &w, &mo);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    if (s == ARL_OK) {
        arl_train_opts to;
        arl_train_opts_default(&to);
        const int64_t tb = arl_model_train_arena_floats(&m, &to) * (int64_t)sizeof(float);
        arl_model_train tr;
        arl_params_memory_override(tb - 1);
        s = arl_model_train_init(&tr, &m, &to, NULL);
        CHECK_EQ_INT(s, ARL_ERR_NOMEM);
        CHECK_MSG(strstr(arl_error_msg(), "activation arena"), "message: %s", arl_error_msg());
        arl_params_memory_override(tb);
        s = arl_model_train_init(&tr, &m, &to, NULL);
        CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
        arl_model_train_free(&tr);
        arl_params_memory_override(-1);
        arl_model_free(&m);
    }
    arl_model_params_free(&w);
}

static void test_beyond_physical(void) {
    arl_status s = arl_params_memory_check((uint64_t)1 << 62, "a test arena");
    CHECK_EQ_INT(s, ARL_ERR_NOMEM);
    CHECK_MSG(strstr(arl_error_msg(), "a test arena need") &&
                  strstr(arl_error_msg(), "more than this machine's"),
              "message: %s", arl_error_msg());
    CHECK(arl_params_memory_check(4096, "a page") == ARL_OK); /* real MemAvailable */
}

/* max_context and max_tokens above ARL_MAX_CONTEXT_ROWS (2^40) are refused: the model
 * workspace holds one (max_context + rkv + r)-float lane per thread, so --context-tokens
 * 9007199254740991 (the option's largest value) with --threads 1024 took the size past 2^63; it
 * wrapped to a small allocation that the first forward overran (`agentrl rollout` ended in a
 * segmentation fault).  A decode state's latent cache of max_context rows took rows x 48 x 4
 * bytes (tiny), which wraps size_t at 96076792050570582 rows to 128 bytes. */
static void test_context_bound(void) {
    arl_model_opts mo;
    arl_model_opts_default(&mo);
    mo.max_context = ARL_MAX_CONTEXT_ROWS;
    CHECK(arl_model_workspace_bytes(&cfg_, &mo) > 0); /* sizes only: nothing allocated */
    mo.max_context = ARL_MAX_CONTEXT_ROWS + 1;
    mo.max_context_key = "context-tokens";
    CHECK(arl_model_workspace_bytes(&cfg_, &mo) < 0);
    arl_model_params w;
    CHECK(arl_model_params_alloc(&w, &cfg_) == ARL_OK);
    arl_model m;
    mo.max_context = 9007199254740991LL;
    arl_status s = arl_model_init(&m, &cfg_, &w, &mo);
    CHECK_EQ_INT(s, ARL_ERR_RANGE);
    CHECK_MSG(strstr(arl_error_msg(), "max_context (9007199254740991, from context-tokens)") &&
                  strstr(arl_error_msg(), "at most 1099511627776 (2^40)"),
              "message: %s", arl_error_msg());
    if (s == ARL_OK) arl_model_free(&m);
    arl_model_opts_default(&mo);
    mo.max_tokens = ARL_MAX_CONTEXT_ROWS + 1;
    CHECK(arl_model_workspace_bytes(&cfg_, &mo) < 0);
    /* the device model (cpu-device ops) sizes the same lanes */
    arl_model_opts_default(&mo);
    mo.max_context = ARL_MAX_CONTEXT_ROWS;
    CHECK(arl_model_dev_bytes(&cfg_, &mo, arl_dev_ops_cpu(), NULL) > 0);
    mo.max_context = 9007199254740991LL;
    CHECK(arl_model_dev_bytes(&cfg_, &mo, arl_dev_ops_cpu(), NULL) < 0);
    CHECK_MSG(strstr(arl_error_msg(), "at most 1099511627776 (2^40)"), "message: %s",
              arl_error_msg());
    arl_model_params_free(&w);

    arl_decode_state st;
    s = arl_decode_state_init(&st, &cfg_, 1, 96076792050570582LL);
    CHECK_EQ_INT(s, ARL_ERR_RANGE);
    CHECK_MSG(strstr(arl_error_msg(), "max_context 96076792050570582 is above"), "message: %s",
              arl_error_msg());
    if (s == ARL_OK) arl_decode_state_free(&st);
    s = arl_decode_state_init(&st, &cfg_, 1, ARL_MAX_CONTEXT_ROWS);
    CHECK_MSG(s == ARL_OK, "%s", arl_error_msg());
    if (s == ARL_OK) arl_decode_state_free(&st);
}

int main(void) {
    if (arl_model_config_read(test_src_path("configs/tiny/config.json"), &cfg_)) {
        fprintf(stderr, "tiny config: %s\n", arl_error_msg());
        return 1;
    }
    TEST_RUN(test_params_refused);
    TEST_RUN(test_copies_refused);
    TEST_RUN(test_adamw_refused);
    TEST_RUN(test_workspaces_refused);
    TEST_RUN(test_beyond_physical);
    TEST_RUN(test_context_bound);
    arl_model_config_free(&cfg_);
    return test_finish();
}
