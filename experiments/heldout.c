/* experiments/heldout.c: the prompt-level held-out split (experiments/heldout.h). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json_dump.h"
#include "core/sha256.h"
#include "envs/builtin/teacher.h"
#include "experiments/heldout.h"

static const char *side_name(arl_heldout_side side) {
    switch (side) {
    case ARL_HELDOUT_SIDE_TEST: return "test";
    case ARL_HELDOUT_SIDE_VALIDATION: return "validation";
    default: return "training";
    }
}

static arl_status split_check(const arl_heldout_split *sp) {
    if (!(sp->test >= 0 && sp->validation >= 0 && sp->test + sp->validation < 1))
        return arl_errorf(ARL_ERR_ARG,
                          "held-out split: fractions test %g and validation %g: each must be >= 0 "
                          "and their sum < 1",
                          sp->test, sp->validation);
    return ARL_OK;
}

arl_status arl_heldout_task_side(const char *env, uint64_t seed, const char *options_json,
                                 const arl_heldout_split *sp, arl_heldout_side *side) {
    *side = ARL_HELDOUT_SIDE_TRAIN;
    ARL_TRY(split_check(sp));
    if (!(sp->test + sp->validation > 0)) return ARL_OK;
    json_t *options = NULL;
    if (options_json && *options_json) {
        json_error_t je;
        options = arl_json_loads(options_json, 0, &je);
        if (!options && arl_json_error_nomem(&je))
            return arl_errorf(ARL_ERR_NOMEM, "held-out split: options: out of memory");
        if (!json_is_object(options)) {
            json_decref(options);
            return arl_errorf(ARL_ERR_ARG, "held-out split: options: expected a JSON object (%s)",
                              je.text);
        }
    }
    json_t *empty = json_object();
    char id[96];
    snprintf(id, sizeof id, "%s-%llu", env, (unsigned long long)seed);
    arl_env_task task = {id, seed & (uint64_t)ARL_AEP_MAX_SAFE_INT, empty};
    json_t *conv = NULL;
    double outcome = 0;
    arl_status s = arl_env_demo_episode(env, &task, options, &conv, &outcome);
    json_t *prompt = s ? NULL : json_array();
    json_t *msgs = json_object_get(conv, "messages");
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && !strcmp(role, "assistant")) break;
        if (prompt && json_array_append(prompt, m)) { /* a message left out: another hash */
            json_decref(prompt);
            prompt = NULL;
            s = arl_errorf(ARL_ERR_NOMEM, "held-out split: out of memory");
        }
    }
    char *text = prompt ? arl_json_dumps(prompt, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    if (!s && !text) s = arl_errorf(ARL_ERR_NOMEM, "held-out split: out of memory");
    if (!s) {
        uint8_t h[ARL_SHA256_BYTES];
        arl_sha256(text, strlen(text), h);
        uint64_t v = 0;
        for (int k = 0; k < 8; k++)
            v = v << 8 | h[k];
        const double u = (double)(v >> 11) / 9007199254740992.0; /* 53 bits: exact in double */
        *side = u < sp->test                   ? ARL_HELDOUT_SIDE_TEST
                : u < sp->test + sp->validation ? ARL_HELDOUT_SIDE_VALIDATION
                                                : ARL_HELDOUT_SIDE_TRAIN;
    }
    free(text);
    json_decref(prompt);
    json_decref(conv);
    json_decref(empty);
    json_decref(options);
    return s ? arl_error_prefix(s, "held-out split: task seed %llu of %s", (unsigned long long)seed,
                                env)
             : ARL_OK;
}

arl_status arl_heldout_side_seeds(const char *env, uint64_t seed0, const char *options_json,
                                  const arl_heldout_split *sp, arl_heldout_side side, int64_t n,
                                  int64_t max_scan, int64_t *seeds) {
    ARL_TRY(split_check(sp));
    int64_t got = 0;
    for (int64_t k = 0; got < n; k++) {
        if (k >= max_scan)
            return arl_errorf(ARL_ERR_RANGE,
                              "held-out split: only %lld of %lld %s tasks among %lld seeds from "
                              "%llu at fractions test %g, validation %g%s",
                              (long long)got, (long long)n, side_name(side), (long long)max_scan,
                              (unsigned long long)seed0, sp->test, sp->validation,
                              got ? ""
                                  : " (the split hashes each task's first prompt: an environment "
                                    "whose tasks all share one prompt, such as needle with its "
                                    "question in the document, puts them all on one side; set "
                                    "eval-split 0)");
        arl_heldout_side h;
        ARL_TRY(arl_heldout_task_side(env, seed0 + (uint64_t)k, options_json, sp, &h));
        if (h == side) seeds[got++] = (int64_t)(seed0 + (uint64_t)k);
    }
    return ARL_OK;
}

arl_status arl_heldout_task(const char *env, uint64_t seed, const char *options_json, double frac,
                            int *heldout) {
    arl_heldout_split sp = {frac, 0};
    arl_heldout_side side;
    *heldout = 0;
    ARL_TRY(arl_heldout_task_side(env, seed, options_json, &sp, &side));
    *heldout = side == ARL_HELDOUT_SIDE_TEST;
    return ARL_OK;
}

arl_status arl_heldout_seeds(const char *env, uint64_t seed0, const char *options_json,
                             double frac, int want_heldout, int64_t n, int64_t max_scan,
                             int64_t *seeds) {
    arl_heldout_split sp = {frac, 0};
    return arl_heldout_side_seeds(env, seed0, options_json, &sp,
                                  want_heldout ? ARL_HELDOUT_SIDE_TEST : ARL_HELDOUT_SIDE_TRAIN, n,
                                  max_scan, seeds);
}
