/* tests/fuzz/fuzz_tool_args.c: libFuzzer target for the tool-call argument parser
 * (arl_env_tool_args_parse, spec §4.6) and, on success, the argument validator
 * (arl_env_args_validate) and the server-side action parser (aep_action_from_json).
 *
 * Input: the argument text of one call block, as the model produced it.  Invariants: the
 * status is one of ok, invalid_json, arguments_not_object, malformed_structure; ok comes with
 * an object, every other status without one and with a message.  Differential check of our
 * strict JSON parser (envs/aep_json.c) against jansson's: same verdict and same value for every
 * input within the depth limit without \u0000 (jansson treats NUL in member names differently).  Built by
 * tests/envs_aep/CMakeLists.txt with Clang and -DAGENTRL_FUZZ=ON. */
#include <stddef.h>
#include <stdint.h>
#define _GNU_SOURCE 1
#include <stdlib.h>
#include <string.h>

#include "envs/aep_json.h"
#include "envs/env.h"

static json_t *schema;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!schema)
        schema = json_loads("{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\",\"maxLength\":8},"
                            "\"n\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9},\"l\":{\"type\":\"array\","
                            "\"items\":{\"anyOf\":[{\"type\":\"number\"},{\"enum\":[\"a\",null]}]}},"
                            "\"o\":{\"type\":\"object\",\"additionalProperties\":false,\"properties\":"
                            "{\"x\":{\"type\":\"boolean\"}}}},\"required\":[\"q\"]}",
                            0, NULL);
    json_t *args = NULL;
    char msg[512];
    if (aep_json_depth((const char *)data, size, 24) <= 24 && !memmem(data, size, "\\u0000", 6) &&
        !memchr(data, 0, size)) { /* jansson stops at a NUL byte */
        json_t *ours = aep_json_loads((const char *)data, size, 24, msg, sizeof msg);
        json_t *theirs = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, NULL);
        if (!ours != !theirs) __builtin_trap();
        if (ours && !json_equal(ours, theirs)) __builtin_trap();
        if (ours) json_decref(ours);
        if (theirs) json_decref(theirs);
    }
    arl_env_parse_status st = arl_env_tool_args_parse((const char *)data, size, &args, msg, sizeof msg);
    switch (st) {
    case ARL_ENV_PARSE_OK:
        if (!json_is_object(args)) __builtin_trap();
        break;
    case ARL_ENV_PARSE_INVALID_JSON:
    case ARL_ENV_PARSE_ARGUMENTS_NOT_OBJECT:
    case ARL_ENV_PARSE_MALFORMED_STRUCTURE:
        if (args || !msg[0]) __builtin_trap();
        break;
    default:
        __builtin_trap();
    }
    if (args) {
        arl_env_args_validate(schema, args, msg, sizeof msg);
        /* the parsed arguments inside an action, as the server parses it */
        arl_env_action a;
        json_t *act = json_pack("{s:s,s:[{s:s,s:s,s:O}]}", "parse_status", "ok", "tool_calls", "id", "call_1_0",
                                "name", "t", "arguments", args);
        if (aep_action_from_json(act, &a, msg, sizeof msg) != 0) __builtin_trap();
        char *wire = arl_env_action_to_json(&a);
        if (!wire) __builtin_trap();
        json_t *back = aep_json_loads(wire, strlen(wire), 64, msg, sizeof msg);
        if (!back || !aep_json_ident_equal(json_object_get(json_array_get(json_object_get(back, "tool_calls"), 0),
                                                          "arguments"),
                                           args))
            __builtin_trap(); /* serialisation round trip */
        json_decref(back);
        free(wire);
        arl_env_action_clear(&a);
        json_decref(act);
        json_decref(args);
    }
    return 0;
}
