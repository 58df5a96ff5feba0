/* tests/fuzz/fuzz_aep_response.c: libFuzzer target for the AEP/1 response parser
 * (envs/aep_parse.c, aep_response_parse) and the /info parser (arl_env_info_parse).
 *
 * Input: byte 0 selects the endpoint and the HTTP status, byte 1 the Content-Type; the rest is
 * the response body.  The expectations are those of a real step (two calls, one parse error)
 * against an environment declaring every capability, so image, reset and reward paths are
 * reachable.  Any crash, leak or sanitizer report is a bug.  Built by
 * tests/envs_aep/CMakeLists.txt with Clang and -DAGENTRL_FUZZ=ON; run e.g.
 *   build-fuzz/tests/envs_aep/fuzz_aep_response -max_total_time=60 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "envs/aep_json.h"
#include "envs/env.h"

static const char *INFO =
    "{\"protocol\":\"aep/1\",\"protocol_revision\":0,\"env\":{\"name\":\"fz\",\"version\":\"1.0.0\"},"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"t\",\"parameters\":{\"type\":\"object\"}}}],"
    "\"reward_levels\":{\"process\":{\"range\":[-1,1]},\"segment\":{\"range\":[0,1]},\"outcome\":{\"range\":[0,1]}},"
    "\"reward_components\":[{\"name\":\"a\",\"level\":\"process\",\"range\":[-1,1]},"
    "{\"name\":\"b\",\"level\":\"outcome\",\"range\":[0,1]}],"
    "\"capabilities\":{\"fork\":true,\"segment_score\":true,\"multimodal\":true,\"context_reset\":true},"
    "\"limits\":{\"max_observation_bytes\":65536}}";

static arl_env_info info;
static int have_info;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!have_info) {
        if (arl_env_info_parse(INFO, strlen(INFO), &info) != ARL_OK) __builtin_trap();
        have_info = 1;
    }
    if (size < 2) return 0;
    static const int statuses[] = {200, 201, 204, 400, 404, 409, 410, 413, 422, 500, 501, 502, 503, 504, 302, 299};
    static const char *const ctypes[] = {"application/json", "application/json; charset=utf-8", "text/html", NULL};
    arl_env_endpoint ep = (arl_env_endpoint)(data[0] % 8);
    int status = statuses[(data[0] >> 3) % 16];
    const char *ct = ctypes[data[1] % 4];
    const char *body = (const char *)data + 2;
    size_t len = size - 2;
    static const char *const calls[] = {"call_1_0", "call_1_1"};
    static const char *const perrs[] = {"call_1_2"};
    aep_expect x = {.endpoint = ep, .info = &info, .step_index = 1, .trajectory_id = (data[1] & 4) ? "r/1" : NULL,
                    .call_ids = calls, .n_call_ids = 2, .perr_ids = perrs, .n_perr_ids = 1,
                    .scope = (arl_env_scope)((data[1] >> 3) & 1), .segment_index = 0};
    arl_env_error err;
    memset(&err, 0, sizeof err);
    arl_env_result r;
    arl_env_score_result sr;
    memset(&r, 0, sizeof r);
    memset(&sr, 0, sizeof sr);
    json_t *snap = NULL;
    int64_t ha = 0, hm = 0;
    aep_response_parse(&x, status, ct, body, len, &err, &r, &sr, &snap, &ha, &hm);
    if (err.code == ARL_ENV_E_NONE && ep == ARL_ENV_EP_STEP && r.obs.n_messages < 2) __builtin_trap(); /* 2 calls */
    arl_env_error_clear(&err);
    arl_env_result_clear(&r);
    arl_env_score_result_clear(&sr);
    if (snap) json_decref(snap);
    arl_env_info fi;
    if (arl_env_info_parse(body, len, &fi) == ARL_OK) arl_env_info_clear(&fi);
    return 0;
}
