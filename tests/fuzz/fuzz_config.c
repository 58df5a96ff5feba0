/* tests/fuzz/fuzz_config.c: libFuzzer target for the configuration readers a user's files reach:
 * the model's config.json (policy/config.c) with what is computed from a valid one (the
 * parameter inventory, the closed-form counts, the memory sizes, the hash: policy/params.c),
 * and an experiment's rollout keys (rollout/config.c over core/options.c).
 *
 * The first byte of an input picks the reader (even: model config, odd: rollout keys); the
 * rest is the file's text.  A reader accepts or gives a clear error; what it accepts must be
 * usable: the sums over a valid config's tensors agree with the closed forms and never
 * overflow (UndefinedBehaviorSanitizer reports a signed overflow), every tensor has a name
 * and a positive size.  Built by tests/policy_config/CMakeLists.txt with clang and
 * -DAGENTRL_FUZZ=ON:
 *   build-fuzz/tests/policy_config/fuzz_config -max_total_time=60 CORPUS_DIR
 * scripts/test.sh seeds the corpus with configs/ * /config.json and experiments/ *.json.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/assert.h"
#include "core/log.h"
#include "policy/config.h"
#include "policy/params.h"
#include "rollout/rollout.h"

static void model_config(const char *text) {
    arl_model_config cfg;
    if (arl_model_config_parse(text, "fuzz", 1, &cfg) != ARL_OK) return;
    char hex[ARL_SHA256_HEX_CHARS];
    arl_model_config_hash_hex(&cfg, hex);
    arl_param_counts pc;
    arl_param_counts_compute(&cfg, &pc);
    ARL_ASSERT(pc.total_params > 0 && pc.active_params > 0 && pc.active_params <= pc.total_params);
    arl_model_memory mem;
    arl_model_memory_compute(&cfg, &mem);
    /* the inventory of a small model (its time and memory grow with the tensors: a config of
     * kimi-k3's size lists about 170k of them) */
    arl_param_inventory inv;
    if (pc.total_params <= (1 << 22) && arl_param_inventory_build(&cfg, &inv) == ARL_OK) {
        int64_t sum = 0;
        for (int64_t i = 0; i < inv.n; i++) {
            ARL_ASSERT(inv.t[i].name[0] && inv.t[i].numel > 0);
            ARL_ASSERT(!__builtin_add_overflow(sum, inv.t[i].numel, &sum));
        }
        ARL_ASSERT(sum == pc.total_params);
        arl_param_inventory_free(&inv);
    }
    arl_model_config_free(&cfg);
}

static void rollout_config(const char *text) {
    arl_rollout_config c;
    ARL_ASSERT(arl_rollout_config_defaults(&c) == ARL_OK);
    if (arl_rollout_config_load_json(&c, text, "fuzz") == ARL_OK) (void)arl_rollout_config_validate(&c);
    arl_rollout_config_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    arl_log_set_level(ARL_LOG_ERROR);
    char *text = malloc(size);
    ARL_ASSERT(text);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = 0;
    if (data[0] & 1)
        rollout_config(text);
    else
        model_config(text);
    free(text);
    return 0;
}
