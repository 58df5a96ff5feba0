/* envs/aep_json.h: JSON plumbing shared by the AEP/1 client, host, server and checker.
 *
 * Strict decoding (§2.3: UTF-8, no duplicate member names, depth <= 32, finite numbers),
 * byte spans of top-level members (sizes "measured as sent", §12.1), identity comparison of
 * §10.1 (null equals absent at every depth), canonical base64 and PNG IHDR checks (§4.2),
 * SHA-256 (§6.8), and the wire forms of observations, results and actions.
 * Not a public interface: users of environments include envs/env.h.
 */
#ifndef ARL_ENVS_AEP_JSON_H
#define ARL_ENVS_AEP_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/sha256.h"
#include "envs/env.h"

/* Maximum nesting depth of buf (each array or object opens one level; strings are skipped with
 * their escapes).  Stops counting once the depth exceeds `stop` and returns stop + 1. */
int aep_json_depth(const char *buf, size_t len, int stop);

/* Strict decode of a whole body: valid UTF-8 JSON text (any top-level value), no duplicate
 * member names, depth <= max_depth.  Returns the value (new reference) or NULL with a reason in
 * err (cap bytes). */
json_t *aep_json_loads(const char *buf, size_t len, int max_depth, char *err, size_t cap);

/* Compact serialisation, member order preserved, UTF-8 kept, reals in their shortest exact form;
 * caller frees with free().  NULL on OOM, and for v NULL (a builder that failed). */
char *aep_json_dumps(const json_t *v, size_t *len);

/* The body of a step request: {"step_index":k,"action":{...every member of §4.5...},
 * "deadline_ms":d}, written directly (no intermediate JSON values); caller frees. */
char *aep_step_request(int64_t step_index, const arl_env_action *a, int64_t deadline_ms, size_t *len);

/* Span of the value of top-level member `key` of the JSON object text buf (assumed valid JSON):
 * 1 and *off, *vlen when found, else 0. */
int aep_json_member_span(const char *buf, size_t len, const char *key, size_t *off,
                         size_t *vlen);

/* §10.1 identity: equal JSON values where member order is ignored, numbers compare by value and
 * a member whose value is null equals an absent member, at every depth.  NULL equals json null. */
int aep_json_ident_equal(const json_t *a, const json_t *b);

/* Feed the §10.1 identity of v (NULL: null) into c: values equal under aep_json_ident_equal
 * hash alike (member order, null members and 2 vs 2.0 do not matter), so a digest can stand in
 * for a value that is no longer kept.  Only integers beyond 2^53 compared with reals can differ
 * from aep_json_ident_equal.  0, or -1 on OOM (c is then unusable). */
int aep_json_ident_hash(arl_sha256_ctx *c, const json_t *v);

/* Integer member in [0, 2^53 - 1] written without fraction or exponent: 1 and *out, else 0. */
int aep_json_get_index(const json_t *obj, const char *key, int64_t *out);
/* The text of a JSON string that holds no U+0000 ("\u0000"), i.e. all of which a C string
 * holds; NULL for a string with one or for any other value.  Identifiers and closed-set values
 * are read through it: jansson keeps the embedded NUL, and the text before it would otherwise
 * pass for the whole ("ok\u0000x" for "ok"). */
const char *aep_json_cstr(const json_t *v);

/* base64 (RFC 4648 §4, with padding).  encode: caller frees; NULL on OOM. */
char *aep_b64_encode(const uint8_t *data, size_t len, size_t *out_len);
/* Decode canonical base64 only (no whitespace, correct padding, zero pad bits).  Returns 0 and a
 * malloc'd buffer, or -1 (not canonical / invalid), -2 (OOM). */
int aep_b64_decode_canonical(const char *s, size_t len, uint8_t **out, size_t *out_len);

/* PNG signature and IHDR: 0 with width/height, -1 if not a PNG with a valid IHDR. */
int aep_png_dims(const uint8_t *png, size_t len, int64_t *width, int64_t *height);

/* SHA-256 of data as 64 lower-case hex digits + NUL. */
void aep_sha256_hex(const void *data, size_t len, char hex[65]);

/* UTF-8 validity of a byte string (no surrogates, no overlongs). */
int aep_utf8_valid(const char *s, size_t len);

/* Name checks of §3. */
int aep_valid_traj_id(const char *s);   /* 1-256 of [A-Za-z0-9._:/@#+-] */
int aep_valid_session_id(const char *s); /* 1-128 of [A-Za-z0-9._~-] */
int aep_valid_tool_name(const char *s);  /* ^[A-Za-z0-9_-]{1,64}$ */
int aep_valid_component_name(const char *s); /* ^[a-z][a-z0-9_]{0,63}$ */
int aep_valid_env_name(const char *s);   /* ^[a-z0-9][a-z0-9_.-]{0,63}$ */

/* ---- wire forms ---- */

/* Observation -> JSON object (images as canonical base64).  NULL on OOM. */
json_t *aep_obs_to_json(const arl_env_observation *o);
/* Action <-> JSON.  aep_action_from_json validates types, closed sets and §4.5 consistency and
 * applies the defaults of §4.5 "Presence"; on failure returns -1 with the reason in err. */
json_t *aep_action_to_json_value(const arl_env_action *a);
int aep_action_from_json(const json_t *v, arl_env_action *a, char *err, size_t cap);
/* Components object from an array. */
json_t *aep_components_to_json(const arl_env_component *c, int32_t n);
/* Error envelope body (§8.1); caller frees.  retry_after_ms < 0: absent. */
char *aep_envelope(arl_env_errcode code, const char *code_str, const char *message,
                   int64_t retry_after_ms, size_t *len);

/* ---- response validation (the client's parser, §12.3) ---- */

/* What the client knows when a response arrives. */
typedef struct aep_expect {
    arl_env_endpoint endpoint;
    const arl_env_info *info;        /* capabilities, limits, reward ranges; NULL: defaults */
    const arl_env_client_config *cc; /* client caps; NULL: defaults */
    int64_t step_index;              /* STEP: the request's; FORK: at_step_index */
    int terminal_ok;                 /* unused by callers; internal */
    const char *trajectory_id;       /* CREATE/FORK: expected echo (NULL: not checked) */
    /* STEP: ids of the action's tool_calls and parse_errors, in order */
    const char *const *call_ids;
    int32_t n_call_ids;
    const char *const *perr_ids;
    int32_t n_perr_ids;
    arl_env_scope scope;             /* SCORE */
    int64_t segment_index;           /* SCORE, segment */
} aep_expect;

/* Classify one complete response (within the cap).  ctype: the Content-Type header value or
 * NULL.  Fills *err (code NONE on success) and, on success, the parsed results: r (CREATE, STEP,
 * FORK), sr (SCORE), *snapshot (GET: new reference), health values (HEALTH; may be NULL).
 * Never crashes on any input; allocates only what it returns. */
void aep_response_parse(const aep_expect *x, int http_status, const char *ctype,
                        const char *body, size_t len, arl_env_error *err, arl_env_result *r,
                        arl_env_score_result *sr, json_t **snapshot, int64_t *health_active,
                        int64_t *health_max);

/* The members of a parsed §8.1 error envelope (root: the response's JSON) for an error response
 * of HTTP status: 0 when valid, else -1 with the first violation in why (a JSON pointer and a
 * reason, spec/aep.md 12.2 item 2).  The client (aep_response_parse) and the conformance check
 * (aep_check.c, check 17) apply the same rules. */
int aep_envelope_check(const json_t *root, int status, char *why, size_t cap);

/* Is ctype a JSON media type (application/json, optionally with charset=utf-8)? */
int aep_ctype_is_json(const char *ctype);

/* Monotonic milliseconds and microseconds. */
int64_t aep_now_ms(void);
int64_t aep_now_us(void);

#endif
