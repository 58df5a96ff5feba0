/* tests/envs_aep/test_envelope.c: an error response whose envelope (spec/aep.md §8.1) is
 * invalid is classified by the HTTP status (§8.5), and the violation names the first member that
 * is wrong as a JSON pointer and a reason (§12.2 item 2), not only "without a valid envelope". */
#include <string.h>

#include "envs/aep_json.h"
#include "envs/env.h"
#include "tests/test.h"

/* Parse an error response of a step; returns the code and copies the violation. */
static arl_env_errcode parse(int status, const char *ctype, const char *body, char *violation,
                             size_t cap) {
    aep_expect x;
    memset(&x, 0, sizeof x);
    x.endpoint = ARL_ENV_EP_STEP;
    x.step_index = 1;
    arl_env_error e;
    memset(&e, 0, sizeof e);
    arl_env_result r;
    memset(&r, 0, sizeof r);
    arl_env_score_result sr;
    memset(&sr, 0, sizeof sr);
    aep_response_parse(&x, status, ctype, body, strlen(body), &e, &r, &sr, NULL, NULL, NULL);
    arl_env_errcode c = e.code;
    snprintf(violation, cap, "%s", e.violation);
    arl_env_error_clear(&e);
    arl_env_result_clear(&r);
    arl_env_score_result_clear(&sr);
    return c;
}

static void expect_violation(int status, const char *ctype, const char *body, arl_env_errcode code,
                             const char *want) {
    char v[600];
    CHECK_EQ_INT(parse(status, ctype, body, v, sizeof v), code);
    CHECK_MSG(strstr(v, want) != NULL, "HTTP %d %s: violation '%s' does not name '%s'", status,
              body, v, want);
}

static void test_envelope_violations(void) {
    const char *J = "application/json; charset=utf-8";
    /* a 503 whose retryable envelope lacks retry_after_ms: ENV_INTERNAL (5xx), naming the member */
    expect_violation(
        503, J,
        "{\"error\":{\"code\":\"CAPACITY_REACHED\",\"message\":\"busy\",\"retryable\":true,"
        "\"attribution\":\"env\",\"details\":{}}}",
        ARL_ENV_E_ENV_INTERNAL, "/error/retry_after_ms: required");
    expect_violation(
        409, J,
        "{\"error\":{\"code\":\"STEP_IN_PROGRESS\",\"message\":\"busy\",\"retryable\":true,"
        "\"attribution\":\"none\"}}",
        ARL_ENV_E_MALFORMED_RESPONSE, "/error/retry_after_ms: required");
    expect_violation(
        500, J,
        "{\"error\":{\"code\":\"ENV_INTERNAL\",\"retryable\":false,\"attribution\":\"env\"}}",
        ARL_ENV_E_ENV_INTERNAL, "/error/message: expected a string");
    expect_violation(
        422, J,
        "{\"error\":{\"code\":\"VALIDATION_ERROR\",\"message\":\"m\",\"retryable\":\"no\","
        "\"attribution\":\"client\"}}",
        ARL_ENV_E_MALFORMED_RESPONSE, "/error/retryable: expected a boolean");
    expect_violation(
        404, J,
        "{\"error\":{\"code\":\"UNKNOWN_SESSION\",\"message\":\"m\",\"retryable\":false,"
        "\"attribution\":\"model\"}}",
        ARL_ENV_E_MALFORMED_RESPONSE, "/error/attribution: expected one of");
    expect_violation(500, J, "{\"error\":\"boom\"}", ARL_ENV_E_ENV_INTERNAL,
                     "/error: expected an object");
    expect_violation(500, J, "{\"error\":{\"message\":\"m\"}}", ARL_ENV_E_ENV_INTERNAL,
                     "/error/code: expected");
    expect_violation(500, "text/html", "<html>Internal Server Error</html>", ARL_ENV_E_ENV_INTERNAL,
                     "Content-Type 'text/html' is not application/json");
    expect_violation(502, J, "{\"error\": {", ARL_ENV_E_ENV_INTERNAL, "invalid JSON");
    expect_violation(
        400, J,
        "{\"error\":{\"code\":\"INVALID_REQUEST\",\"message\":\"m\",\"retryable\":false,"
        "\"attribution\":\"client\",\"details\":[1]}}",
        ARL_ENV_E_MALFORMED_RESPONSE, "/error/details: expected an object");
    /* a valid envelope still gives the server's code */
    char v[600];
    CHECK_EQ_INT(
        parse(503, J,
              "{\"error\":{\"code\":\"CAPACITY_REACHED\",\"message\":\"busy\",\"retryable\":true,"
              "\"retry_after_ms\":100,\"attribution\":\"env\"}}",
              v, sizeof v),
        ARL_ENV_E_CAPACITY_REACHED);
}

int main(void) {
    TEST_RUN(test_envelope_violations);
    return test_finish();
}
