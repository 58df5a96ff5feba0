/* envs/env.h: the environment interface of agentrl (spec/aep.md, AEP/1).
 *
 * One header, three audiences:
 *
 *  A. Authors of built-in environments (envs/builtin/) implement `arl_env_ops` (a small table of
 *     typed callbacks: reset, step, score, fork, free) and describe the environment in an
 *     `arl_env_def`.  They never see HTTP, JSON request bodies, session ids, idempotency keys,
 *     stored responses or error envelopes: the *host* (envs/env_host.c) wraps an arl_env_def
 *     into a complete AEP/1 server state machine (§6, §7, §8.7, §10) and exposes it through the
 *     byte-level C ABI of spec §14 (`arl_env_vtable`).  The same vtable is what
 *     `agentrl env serve` puts behind HTTP, so a built-in environment and a remote one are
 *     interchangeable byte for byte.
 *
 *  B. The registry: built-in environments are found by name (`arl_env_builtin_find`).  The list
 *     lives in envs/builtin/registry.c (owned by the built-in environments' author):
 *
 *         const arl_env_def *const arl_env_builtins[] = {&arl_env_calculator, ..., NULL};
 *
 *  C. Users of environments (rollout, `agentrl env check`, tests) drive sessions through
 *     `arl_env_session_*`, backed either by an AEP/1 HTTP client (libcurl, keep-alive, multi
 *     interface, deadlines, retries of spec §10.3, limits of §12) or by a built-in environment
 *     in-process (the vtable).  Both transports produce the same parsed results, the same error
 *     codes (§8.3, §8.4) and the same raw response bytes for the replay store.
 *
 * What this header is not: the HTTP server (envs/aep_server.h), the conformance checker
 * (envs/aep_check.h), JSON plumbing (envs/aep_json.h).  Tokenisation, chat templates and the
 * replay store are elsewhere; this module knows nothing about the model.
 *
 * Conventions: strings are NUL-terminated UTF-8.  A struct that "owns" pointers is released by
 * its *_clear function, which leaves it zeroed and reusable; *_clear(NULL) is a no-op.  json_t
 * values (jansson) held by a struct are owned references (the struct holds one reference and
 * releases it in *_clear).  Numbers named *_ms are milliseconds.  Step indices follow §1.5:
 * step 0 is creation, the k-th action is step k.
 */
#ifndef ARL_ENVS_ENV_H
#define ARL_ENVS_ENV_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* ------------------------------------------------------------------------------------------ */
/* Constants of the specification                                                              */
/* ------------------------------------------------------------------------------------------ */

#define ARL_ENV_ABI_VERSION 1u            /* §14.2: agentrl_aep_env_v1 */
#define ARL_AEP_PROTOCOL "aep/1"
#define ARL_AEP_PROTOCOL_REVISION 0
#define ARL_AEP_MAX_DEPTH 32              /* §2.3 rule 2, §12.1: JSON nesting, both directions */
#define ARL_AEP_TOOL_ARGS_MAX_DEPTH 24    /* §4.6 malformed_structure: argument nesting */
#define ARL_AEP_MAX_INFO_BYTES 65536      /* §4.10, §12.1: info / details / state */
#define ARL_AEP_MAX_IMAGES 16             /* §4.2 rule 2: images per observation */
#define ARL_AEP_MAX_COMPONENTS 64         /* §12.1: reward components per response */
#define ARL_AEP_MAX_TOOLS 256             /* §4.4 rule 4 */
#define ARL_AEP_MAX_TOOLS_BYTES 262144    /* §4.4 rule 4 */
#define ARL_AEP_MAX_ID_BYTES 256          /* §3: trajectory_id, group_id */
#define ARL_AEP_MAX_SID_BYTES 128         /* §3: session_id */
#define ARL_AEP_MAX_NAME_BYTES 64         /* §3: tool and component names */
#define ARL_AEP_MAX_SAFE_INT 9007199254740991LL /* 2^53 - 1, §1.5 */

/* ------------------------------------------------------------------------------------------ */
/* Closed value sets (Appendix B).  Every enum has *_str (never NULL) and *_parse (returns -1  */
/* for a string outside the closed set).                                                       */
/* ------------------------------------------------------------------------------------------ */

typedef enum arl_env_role {
    ARL_ENV_ROLE_SYSTEM = 0,
    ARL_ENV_ROLE_USER = 1,
    ARL_ENV_ROLE_ASSISTANT = 2,
    ARL_ENV_ROLE_TOOL = 3,
} arl_env_role;

typedef enum arl_env_context {
    ARL_ENV_CONTEXT_APPEND = 0, /* messages follow the existing context (§4.3) */
    ARL_ENV_CONTEXT_RESET = 1,  /* messages are the complete new context */
} arl_env_context;

/* §4.6: per call block and per turn. */
typedef enum arl_env_parse_status {
    ARL_ENV_PARSE_OK = 0,
    ARL_ENV_PARSE_NO_TOOL_CALL = 1, /* turn level only: plain text turn */
    ARL_ENV_PARSE_INVALID_JSON = 2,
    ARL_ENV_PARSE_ARGUMENTS_NOT_OBJECT = 3,
    ARL_ENV_PARSE_MISSING_NAME = 4,
    ARL_ENV_PARSE_UNCLOSED_BLOCK = 5,
    ARL_ENV_PARSE_MALFORMED_STRUCTURE = 6,
} arl_env_parse_status;

typedef enum arl_env_finish_reason {
    ARL_ENV_FINISH_STOP = 0,
    ARL_ENV_FINISH_TOOL_CALLS = 1,
    ARL_ENV_FINISH_LENGTH = 2,
} arl_env_finish_reason;

/* §4.8 reward levels. */
typedef enum arl_env_level {
    ARL_ENV_LEVEL_PROCESS = 0, /* step responses */
    ARL_ENV_LEVEL_SEGMENT = 1, /* score(segment) */
    ARL_ENV_LEVEL_OUTCOME = 2, /* score(episode) */
} arl_env_level;
#define ARL_ENV_NLEVELS 3

typedef enum arl_env_scope {
    ARL_ENV_SCOPE_SEGMENT = 0,
    ARL_ENV_SCOPE_EPISODE = 1,
} arl_env_scope;

/* §6.5 episode score reasons. */
typedef enum arl_env_score_reason {
    ARL_ENV_REASON_TERMINATED = 0,
    ARL_ENV_REASON_TRUNCATED = 1,
    ARL_ENV_REASON_CONTEXT_BUDGET = 2,
    ARL_ENV_REASON_TURN_BUDGET = 3,
    ARL_ENV_REASON_ACTION_TOO_LARGE = 4,
    ARL_ENV_REASON_WALL_CLOCK = 5,
} arl_env_score_reason;

/* §6.8 session status. */
typedef enum arl_env_session_status {
    ARL_ENV_STATUS_ACTIVE = 0,
    ARL_ENV_STATUS_TERMINATED = 1,
    ARL_ENV_STATUS_TRUNCATED = 2,
    ARL_ENV_STATUS_SCORED = 3, /* ended by score(episode) */
    ARL_ENV_STATUS_FAILED = 4, /* after ENV_INTERNAL or SANDBOX_LOST */
} arl_env_session_status;

typedef enum arl_env_attribution {
    ARL_ENV_ATTR_CLIENT = 0,
    ARL_ENV_ATTR_ENV = 1,
    ARL_ENV_ATTR_INFRA = 2,
    ARL_ENV_ATTR_NONE = 3,
} arl_env_attribution;

/* Error codes: §8.3 (server), §8.4 (client-synthesised), X_UNKNOWN_ROUTE (§8.3) and OTHER for
 * any other server-defined `X_...` or unknown code (its text is in arl_env_error.code_str; the
 * client acts on the `retryable` and `attribution` sent, §8.5).  Append-only. */
typedef enum arl_env_errcode {
    ARL_ENV_E_NONE = 0,
    /* §8.3 */
    ARL_ENV_E_INVALID_REQUEST,     /* 400 */
    ARL_ENV_E_UNSUPPORTED_VERSION, /* 400 */
    ARL_ENV_E_VALIDATION_ERROR,    /* 422 */
    ARL_ENV_E_PAYLOAD_TOO_LARGE,   /* 413 */
    ARL_ENV_E_UNKNOWN_SESSION,     /* 404 */
    ARL_ENV_E_TRAJECTORY_CONFLICT, /* 409 */
    ARL_ENV_E_STEP_CONFLICT,       /* 409 */
    ARL_ENV_E_STEP_IN_PROGRESS,    /* 409, retryable */
    ARL_ENV_E_EPISODE_ENDED,       /* 409 */
    ARL_ENV_E_SCORE_CONFLICT,      /* 409 */
    ARL_ENV_E_SESSION_CLOSED,      /* 410 */
    ARL_ENV_E_CAPACITY_REACHED,    /* 503, retryable */
    ARL_ENV_E_DRAINING,            /* 503, retryable */
    ARL_ENV_E_DEADLINE_EXCEEDED,   /* 504, retryable once */
    ARL_ENV_E_ENV_INTERNAL,        /* 500 */
    ARL_ENV_E_SANDBOX_LOST,        /* 502 */
    ARL_ENV_E_NOT_IMPLEMENTED,     /* 501 */
    /* §8.4 */
    ARL_ENV_E_TRANSPORT_ERROR,
    ARL_ENV_E_CLIENT_TIMEOUT,
    ARL_ENV_E_RESPONSE_TOO_LARGE,
    ARL_ENV_E_MALFORMED_RESPONSE,
    ARL_ENV_E_REWARD_OUT_OF_RANGE,
    ARL_ENV_E_OBSERVATION_TOO_LONG,
    ARL_ENV_E_EPISODE_WALL_CLOCK,
    /* server-defined codes */
    ARL_ENV_E_X_UNKNOWN_ROUTE, /* 404, not retryable, client */
    ARL_ENV_E_OTHER,           /* any other code; see code_str */
    ARL_ENV_E_COUNT_
} arl_env_errcode;

const char *arl_env_role_str(arl_env_role r);
int arl_env_role_parse(const char *s);
const char *arl_env_context_str(arl_env_context c);
int arl_env_context_parse(const char *s);
const char *arl_env_parse_status_str(arl_env_parse_status s);
int arl_env_parse_status_parse(const char *s);
const char *arl_env_finish_reason_str(arl_env_finish_reason f);
int arl_env_finish_reason_parse(const char *s);
const char *arl_env_level_str(arl_env_level l);
int arl_env_level_parse(const char *s);
const char *arl_env_scope_str(arl_env_scope s);
int arl_env_scope_parse(const char *s);
const char *arl_env_score_reason_str(arl_env_score_reason r);
int arl_env_score_reason_parse(const char *s);
const char *arl_env_session_status_str(arl_env_session_status s);
int arl_env_session_status_parse(const char *s);
const char *arl_env_attribution_str(arl_env_attribution a);
int arl_env_attribution_parse(const char *s);

/* The code's wire name ("CAPACITY_REACHED"); "OTHER" for ARL_ENV_E_OTHER. */
const char *arl_env_errcode_str(arl_env_errcode c);
/* Wire name to code; unknown names give ARL_ENV_E_OTHER (never -1). */
arl_env_errcode arl_env_errcode_parse(const char *s);
/* The fixed properties of §8.3 / §8.4: HTTP status (0 for client-synthesised codes),
 * retryable (1: retryable, 0: not; DEADLINE_EXCEEDED is 1 and limited to 2 attempts by §10.3)
 * and attribution.  Not meaningful for ARL_ENV_E_NONE and ARL_ENV_E_OTHER (returns 0 / 0 /
 * ARL_ENV_ATTR_ENV). */
int arl_env_errcode_http(arl_env_errcode c);
int arl_env_errcode_retryable(arl_env_errcode c);
arl_env_attribution arl_env_errcode_attribution(arl_env_errcode c);

/* Tool error codes of §4.7 (strings in arl_env_message.error_code; servers may add X_ codes). */
#define ARL_ENV_TOOL_NOT_FOUND "TOOL_NOT_FOUND"
#define ARL_ENV_TOOL_ARGS_INVALID "TOOL_ARGS_INVALID"
#define ARL_ENV_TOOL_RUNTIME_ERROR "TOOL_RUNTIME_ERROR"
#define ARL_ENV_TOOL_TIMEOUT "TOOL_TIMEOUT"
#define ARL_ENV_TOOL_CALL_LIMIT "TOOL_CALL_LIMIT"
#define ARL_ENV_TOOL_PARSE_ERROR "TOOL_PARSE_ERROR"

/* ------------------------------------------------------------------------------------------ */
/* Errors (§8.1 envelope, plus what the client learned about the failure, §12.2)               */
/* ------------------------------------------------------------------------------------------ */

typedef struct arl_env_error {
    arl_env_errcode code;     /* ARL_ENV_E_NONE: no error */
    char code_str[64];        /* wire name as received or synthesised ("X_FOO" for OTHER) */
    int http_status;          /* HTTP status received (0: none, e.g. transport error) */
    int retryable;            /* as sent by the server (§8.5), else from the code's table */
    int64_t retry_after_ms;   /* hint: envelope retry_after_ms or Retry-After x 1000; -1 absent */
    arl_env_attribution attribution;
    char message[512];        /* server message or the client's description, cut to fit */
    char violation[512];      /* MALFORMED_RESPONSE / RESPONSE_TOO_LARGE / REWARD_OUT_OF_RANGE:
                                 first violation as "JSON pointer: reason" (§12.2 item 2) */
    json_t *details;          /* envelope details (owned), NULL if absent */
} arl_env_error;

void arl_env_error_clear(arl_env_error *e);
/* Set e to a code with the table's properties and a formatted message (details cleared). */
void arl_env_error_set(arl_env_error *e, arl_env_errcode code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------------------------------------ */
/* Observations (§4.1-§4.3)                                                                    */
/* ------------------------------------------------------------------------------------------ */

/* A PNG image (§4.2).  On the wire it is canonical base64; here the decoded file bytes. */
typedef struct arl_env_image {
    uint8_t *png;   /* (png_len) PNG file bytes, owned */
    size_t png_len;
    int64_t width;  /* equals the PNG IHDR width */
    int64_t height; /* equals the PNG IHDR height */
} arl_env_image;

typedef enum arl_env_part_type {
    ARL_ENV_PART_TEXT = 0,
    ARL_ENV_PART_IMAGE = 1,
} arl_env_part_type;

typedef struct arl_env_part {
    arl_env_part_type type;
    char *text;          /* TEXT: owned */
    arl_env_image image; /* IMAGE: owned */
} arl_env_part;

/* A parsed tool call (§4.5): a call block that parsed into a name and an object argument. */
typedef struct arl_env_tool_call {
    char *id;           /* "call_<step>_<n>" (§3), owned */
    char *name;         /* owned */
    json_t *arguments;  /* JSON object, owned reference */
} arl_env_tool_call;

/* A message (§4.1).  `content` is either a string (parts == NULL) or an array of parts
 * (content_is_parts = 1, even when n_parts == 0). */
typedef struct arl_env_message {
    arl_env_role role;
    char *content;             /* string content, owned; "" when empty; NULL when parts */
    int content_is_parts;      /* 1: content is the array `parts` */
    arl_env_part *parts;       /* (n_parts), owned */
    int32_t n_parts;
    arl_env_tool_call *tool_calls; /* (n_tool_calls) assistant messages of a reset observation */
    int32_t n_tool_calls;
    char *reasoning;           /* assistant, reset only; NULL: absent */
    char *tool_call_id;        /* tool: the call this message answers; owned */
    int is_error;              /* tool: 1 when the call failed because of the call (§4.7) */
    char *error_code;          /* tool, with is_error: one of ARL_ENV_TOOL_* or "X_..."; owned */
    int output_truncated;      /* tool: 1 when the environment cut the output */
    int64_t original_bytes;    /* tool, with output_truncated: size before truncation */
} arl_env_message;

typedef struct arl_env_observation {
    arl_env_context context;
    arl_env_message *messages; /* (n_messages), owned */
    int32_t n_messages;
    int32_t cap_messages;      /* allocated capacity (internal) */
    json_t *tools;             /* reset only: NULL keeps the tool set (null on the wire);
                                  else the complete new tool set, an array of OpenAI function
                                  tools (§4.4), owned reference */
} arl_env_observation;

void arl_env_observation_clear(arl_env_observation *o);

/* Builders (for environments).  Each returns ARL_OK or ARL_ERR_NOMEM; strings are copied.
 * Order of an `append` observation (§4.3): one tool message per parsed call of the action in
 * call order, then answers to parse_errors in order, then user messages. */
arl_status arl_env_obs_add_text(arl_env_observation *o, arl_env_role role, const char *text);
/* A tool message answering call_id.  error_code NULL: success; else is_error = 1 with the
 * code (ARL_ENV_TOOL_*). */
arl_status arl_env_obs_add_tool(arl_env_observation *o, const char *call_id, const char *text,
                                const char *error_code);
/* Appends an image part to the last message (converting a string content into a text part
 * first).  png: (len) bytes of a PNG file, copied; width/height are read from its IHDR chunk.
 * ARL_ERR_FORMAT if the bytes are not a PNG.  Only user and tool messages may carry images,
 * and only when the environment declares capabilities.multimodal. */
arl_status arl_env_obs_add_image(arl_env_observation *o, const uint8_t *png, size_t len);
/* Appends an assistant message with tool calls (reset observations only): `calls` are copied
 * (arguments: a new reference is taken). */
arl_status arl_env_obs_add_assistant(arl_env_observation *o, const char *text,
                                     const arl_env_tool_call *calls, int32_t n_calls);
/* For each parse error of the action, a tool message with TOOL_PARSE_ERROR and a short text
 * ("Could not parse the tool call: <status>: <message>"). */
struct arl_env_action;
arl_status arl_env_obs_answer_parse_errors(arl_env_observation *o,
                                           const struct arl_env_action *a);
/* Marks the last message's output as truncated from original_bytes. */
void arl_env_obs_mark_truncated(arl_env_observation *o, int64_t original_bytes);

/* ------------------------------------------------------------------------------------------ */
/* Actions (§4.5, §4.6)                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct arl_env_parse_error {
    char *id;                    /* owned */
    arl_env_parse_status status; /* a block status: not OK, not NO_TOOL_CALL */
    char *message;               /* <= 512 bytes, owned; "" allowed */
    char *raw;                   /* block text <= 4096 bytes, owned; "" allowed */
} arl_env_parse_error;

typedef struct arl_env_action {
    char *content;                    /* visible text, owned; NULL means "" */
    char *reasoning;                  /* NULL: null */
    arl_env_tool_call *tool_calls;    /* (n_tool_calls), owned */
    int32_t n_tool_calls;
    arl_env_parse_status parse_status;
    arl_env_parse_error *parse_errors; /* (n_parse_errors), owned */
    int32_t n_parse_errors;
    arl_env_finish_reason finish_reason;
    int64_t num_tokens;
} arl_env_action;

void arl_env_action_clear(arl_env_action *a);
/* Append a parsed call; `arguments` (an object) is STOLEN (the action owns it afterwards, also
 * on failure).  Strings are copied. */
arl_status arl_env_action_add_call(arl_env_action *a, const char *id, const char *name,
                                   json_t *arguments);
arl_status arl_env_action_add_parse_error(arl_env_action *a, const char *id,
                                          arl_env_parse_status status, const char *message,
                                          const char *raw);
/* Sets parse_status from tool_calls and parse_errors by the rule of §4.6. */
void arl_env_action_set_parse_status(arl_env_action *a);
/* Checks §4.5 consistency (parse_status agrees with the lists, unique ids, block statuses).
 * Returns ARL_OK or ARL_ERR_FORMAT with the reason in the thread error message. */
arl_status arl_env_action_check(const arl_env_action *a);
/* Serialise as the wire object (every member of the table of §4.5); caller frees with free(). */
char *arl_env_action_to_json(const arl_env_action *a);

/* The tool-call argument parser (§4.6), for the rollout's tool-call grammar: parses the
 * argument text of one call block.  Returns OK with *args a new JSON object (caller decrefs),
 * INVALID_JSON (not JSON, not UTF-8, duplicate member names, NaN/Infinity), ARGUMENTS_NOT_OBJECT
 * (valid JSON, not an object) or MALFORMED_STRUCTURE (nesting deeper than 24 levels).  On
 * failure *args is NULL and msg (if msg_cap > 0) holds a reason <= 511 bytes ("expected ','
 * or '}' at offset 31").  Never reads past text[len - 1]; text need not be NUL-terminated.
 * Out of memory reads as INVALID_JSON ("out of memory"): a caller tells it from the model's
 * fault by arl_nomem_count() (core/json_dump.h), which it moves. */
arl_env_parse_status arl_env_tool_args_parse(const char *text, size_t len, json_t **args,
                                             char *msg, size_t msg_cap);

/* Validates tool-call arguments against a tool's `parameters` schema, for the keywords of §4.4
 * rule 2 (type, properties, required, enum, items, additionalProperties, anyOf, minimum,
 * maximum, minLength, maxLength; others are ignored).  Returns 1 if valid; 0 with a reason in
 * msg ("/count: expected integer, got string"). */
int arl_env_args_validate(const json_t *schema, const json_t *args, char *msg, size_t msg_cap);

/* The `parameters` schema of tool `name` in an array of OpenAI function tools; NULL if absent.
 * Borrowed from tools. */
const json_t *arl_env_tools_find(const json_t *tools, const char *name);

/* ------------------------------------------------------------------------------------------ */
/* Rewards and results (§4.8, §4.9, §4.10, §6.3-§6.6)                                          */
/* ------------------------------------------------------------------------------------------ */

typedef struct arl_env_component {
    char name[ARL_AEP_MAX_NAME_BYTES + 1]; /* ^[a-z][a-z0-9_]{0,63}$ */
    double value;                          /* finite */
} arl_env_component;

/* Result of create (step 0), step and fork.  For an environment author (reset, step): fill
 * obs, reward, components, terminated, truncated and optionally info; the host fills
 * session_id and step_index.  For a user of sessions: the parsed response. */
typedef struct arl_env_result {
    char session_id[ARL_AEP_MAX_SID_BYTES + 1]; /* create, fork */
    char trajectory_id[ARL_AEP_MAX_ID_BYTES + 1]; /* create, fork */
    int64_t step_index;
    arl_env_observation obs;    /* create, step (fork responses carry none) */
    double reward;              /* step: process reward; 0 when the level is undeclared */
    int32_t n_components;
    arl_env_component components[ARL_AEP_MAX_COMPONENTS]; /* process level only */
    int terminated;             /* step (§4.9) */
    int truncated;              /* step (§4.9) */
    json_t *info;               /* owned; NULL: absent */
} arl_env_result;

void arl_env_result_clear(arl_env_result *r);
/* Add (or overwrite) a component; ARL_ERR_RANGE past 64 components, ARL_ERR_ARG for a bad
 * name. */
arl_status arl_env_result_component(arl_env_result *r, const char *name, double value);

typedef struct arl_env_score_result {
    arl_env_scope scope;
    int64_t segment_index;  /* segment scope */
    int scorable;           /* 0: the server cannot score this scope in this state */
    double reward;          /* valid when scorable */
    int32_t n_components;
    arl_env_component components[ARL_AEP_MAX_COMPONENTS]; /* of the scope's level */
    json_t *info;           /* owned; NULL: absent */
} arl_env_score_result;

void arl_env_score_result_clear(arl_env_score_result *r);
arl_status arl_env_score_component(arl_env_score_result *r, const char *name, double value);

/* ------------------------------------------------------------------------------------------ */
/* /info (§6.1), parsed                                                                        */
/* ------------------------------------------------------------------------------------------ */

typedef struct arl_env_capabilities {
    int fork, fork_past, segment_score, deterministic_replay, parallel_tool_calls, multimodal,
        context_reset;
} arl_env_capabilities;

typedef struct arl_env_limits { /* defaults of §6.1 when absent */
    int64_t max_sessions;            /* 64 */
    int64_t max_steps;               /* 1000 */
    int64_t default_step_timeout_ms; /* 60000 */
    int64_t max_deadline_ms;         /* 3600000 */
    int64_t session_idle_timeout_ms; /* 900000 */
    int64_t max_request_bytes;       /* 4194304 */
    int64_t max_observation_bytes;   /* 1048576 */
    int64_t max_image_bytes;         /* 4194304 */
    int64_t max_image_pixels;        /* 16777216 */
} arl_env_limits;

typedef struct arl_env_component_decl {
    char name[ARL_AEP_MAX_NAME_BYTES + 1];
    arl_env_level level;
    double lo, hi;
    double default_weight; /* 1.0 when absent */
    int source_model;      /* 0: rule (default), 1: model */
} arl_env_component_decl;

typedef struct arl_env_info {
    int64_t protocol_revision;
    char name[65];
    char version[65];
    char *description;                  /* owned; "" when absent */
    json_t *tools;                      /* array (owned reference) */
    int level_declared[ARL_ENV_NLEVELS];
    double level_lo[ARL_ENV_NLEVELS], level_hi[ARL_ENV_NLEVELS];
    arl_env_component_decl *components; /* (n_components), owned */
    int32_t n_components;
    arl_env_capabilities caps;          /* fork_past implies fork (already applied) */
    arl_env_limits limits;
} arl_env_info;

void arl_env_info_clear(arl_env_info *info);
/* Parse and validate an /info body (check 1 of §15.2).  On failure returns ARL_ERR_PROTOCOL
 * with the first violation ("/limits/max_request_bytes: 1000 < 1048576") in the thread error
 * message. */
arl_status arl_env_info_parse(const char *body, size_t len, arl_env_info *out);
void arl_env_limits_default(arl_env_limits *l);

/* ------------------------------------------------------------------------------------------ */
/* A. Built-in environments: the typed interface                                               */
/* ------------------------------------------------------------------------------------------ */

/* A task (§6.3): valid during the call only. */
typedef struct arl_env_task {
    const char *id;     /* 1-256 bytes */
    uint64_t seed;      /* [0, 2^53 - 1] */
    const json_t *data; /* object, environment-defined; borrowed */
} arl_env_task;

typedef struct arl_env_reset_req {
    const char *trajectory_id;
    const char *group_id;
    arl_env_task task;
    const json_t *options; /* the request's options object (borrowed) or NULL when absent */
    int64_t max_steps;     /* options.max_steps, else limits.max_steps */
    int64_t deadline_ms;   /* already clamped to limits.max_deadline_ms */
} arl_env_reset_req;

typedef struct arl_env_step_req {
    int64_t step_index;           /* k >= 1 */
    const arl_env_action *action; /* validated per §4.5; borrowed */
    int64_t max_steps;
    int64_t deadline_ms;
} arl_env_step_req;

typedef struct arl_env_score_req {
    arl_env_scope scope;
    int64_t segment_index;       /* segment */
    int64_t first, last;         /* segment: inclusive step range, already range-checked */
    arl_env_score_reason reason; /* episode */
    int64_t last_step;           /* last applied step of the session */
    arl_env_session_status status; /* before this call (episode scoring then ends it) */
    int64_t deadline_ms;
} arl_env_score_req;

/* The callbacks of a built-in environment.  The host guarantees:
 *  - calls on one session are serialised; calls on different sessions run concurrently only
 *    when thread_safety == 1 (else the host serialises every call of the instance);
 *  - every request was validated (§8.7 checks 3-5) and every state rule of §6/§7 applied
 *    (sequence, idempotent repeats, ended and failed sessions, score keys, capacity): the
 *    callbacks only compute;
 *  - `out` is zeroed on entry; the host serialises it, validates it as the client would (§12.3,
 *    reward ranges of §4.8) and stores the bytes.  A response that fails this validation is
 *    answered ENV_INTERNAL with the violation in the message (a bug of the environment);
 *  - when a step reaches max_steps without terminated or truncated, the host sets truncated;
 *  - without capabilities.parallel_tool_calls, step sees only the first entry of tool_calls;
 *    the host answers the others with TOOL_CALL_LIMIT tool messages (§4.6);
 *  - a step observation over limits.max_observation_bytes (or 4096 messages) is shortened by
 *    the host (error tool messages lose their text, last first; then long tool outputs are cut
 *    and flagged output_truncated), see envs/env_host.c; only when that cannot fit is the step
 *    answered 500 X_OBSERVATION_TOO_LARGE.
 * Return values: ARL_OK; ARL_ERR_ARG for task data or options the environment cannot use
 * (answered 422 VALIDATION_ERROR; reset only); ARL_ERR_TIMEOUT when the deadline could not be
 * met and the call had NO effect (504 DEADLINE_EXCEEDED); anything else is an environment fault
 * (500 ENV_INTERNAL; a step or score then marks the session failed).  Record the reason with
 * arl_errorf (it becomes the envelope's message).
 * Model faults (unknown tool, bad arguments, parse errors, failing tool calls) are NOT errors:
 * answer them with error tool messages (arl_env_obs_add_tool with an ARL_ENV_TOOL_* code). */
typedef struct arl_env_ops {
    uint32_t thread_safety; /* 0 or 1, see above */

    /* Optional (NULL: *inst = NULL).  config: the run configuration's object for this
     * environment (borrowed; an empty object when none). */
    arl_status (*instance_create)(const json_t *config, void **inst);
    void (*instance_destroy)(void *inst); /* optional */

    /* Required.  Create the state of a new session for req->task and fill out->obs with the
     * initial observation (context MUST be RESET; tools NULL means the /info tool set) and
     * optionally out->info.  Equal tasks MUST give byte-identical observations (§6.3 rule 3):
     * derive every random choice from task.seed. */
    arl_status (*reset)(void *inst, const arl_env_reset_req *req, void **state,
                        arl_env_result *out);

    /* Required.  Apply one action; fill obs (context APPEND, or RESET when the environment
     * declares context_reset), reward (process level; leave 0 when undeclared), components
     * (process level only), terminated / truncated and info.  Must not keep pointers into req. */
    arl_status (*step)(void *inst, void *state, const arl_env_step_req *req,
                       arl_env_result *out);

    /* Required.  Score a segment (only when capabilities.segment_score) or the episode.  Set
     * scorable and, when scorable, reward and components of the scope's level (segment or
     * outcome).  Must not change what later steps observe, except that episode scoring ends
     * the episode (the host records that). */
    arl_status (*score)(void *inst, void *state, const arl_env_score_req *req,
                        arl_env_score_result *out);

    /* Optional (NULL: no fork; then capabilities.fork must be false).  Deep copy of a session
     * state; the copy must behave exactly like the original from here on.  With fork_past the
     * host snapshots the state after every applied step through this function. */
    arl_status (*fork)(void *inst, const void *state, void **child);

    /* Required.  Free a session state (NULL allowed). */
    void (*free_state)(void *inst, void *state);

    /* Optional.  Debugging object for GET /sessions/{sid} `state` (<= 64 KiB serialised); the
     * host takes the returned reference.  NULL: no `state` member. */
    json_t *(*debug_state)(void *inst, const void *state);
} arl_env_ops;

/* An environment definition: static data, lives for the whole process. */
typedef struct arl_env_def {
    const char *name;        /* env.name: ^[a-z0-9][a-z0-9_.-]{0,63}$ */
    const char *version;     /* env.version, semantic versioning ("1.0.0") */
    const char *description; /* one sentence */
    /* JSON text of an object with the remaining /info members: "tools", "reward_levels",
     * "reward_components", "capabilities", "limits" (§6.1).  The host adds "protocol",
     * "protocol_revision" and "env", and may lower limits.max_sessions and raise nothing.
     * Validated by arl_env_host_open (same rules as check 1 of §15.2). */
    const char *info_json;
    const arl_env_ops *ops;
} arl_env_def;

/* ------------------------------------------------------------------------------------------ */
/* B. Registry of built-in environments                                                        */
/* ------------------------------------------------------------------------------------------ */

/* Defined in envs/builtin/registry.c (owned by the built-in environments): a NULL-terminated
 * list of the statically linked environments. */
extern const arl_env_def *const arl_env_builtins[];

/* Find a built-in environment by env.name: first arl_env_builtins, then the environments
 * compiled into envs/ itself (the "echo" test environment of envs/test_env.c), then those added
 * with arl_env_builtin_register.  NULL if none.  Thread-safe. */
const arl_env_def *arl_env_builtin_find(const char *name);
/* The i-th environment of the same search order; NULL past the end. */
const arl_env_def *arl_env_builtin_at(size_t i);
/* Add an environment at run time (tests, plugins).  def must live for the whole process.
 * ARL_ERR_STATE if the name is taken, ARL_ERR_FULL past 64 registrations. */
arl_status arl_env_builtin_register(const arl_env_def *def);

/* ------------------------------------------------------------------------------------------ */
/* The byte-level C ABI of spec §14 and the host that implements it for an arl_env_def          */
/* ------------------------------------------------------------------------------------------ */

/* §14.3.  Request and response bodies are the JSON documents of §6; the returned int is the
 * HTTP status (200, 201, 204, 4xx, 5xx) and non-2xx responses carry the §8.1 envelope.
 * Request buffers are owned by the caller and valid during the call only.  Response buffers
 * (*resp, *resp_len) are allocated by the environment and released with free_buffer. */
typedef struct arl_env_vtable {
    uint32_t abi_version;   /* ARL_ENV_ABI_VERSION */
    uint32_t struct_size;   /* sizeof the table as built by the environment */
    uint32_t thread_safety; /* 0: serialise all calls; 1: different sessions concurrently */
    /* Returns an instance or NULL with *errmsg (malloc'd, caller frees) describing why.
     * May be NULL in tables whose instances are made otherwise (arl_env_host_open). */
    void *(*create_instance)(const char *config, size_t config_len, char **errmsg);
    void (*destroy_instance)(void *inst);
    int (*info)(void *inst, char **resp, size_t *resp_len);
    int (*health)(void *inst, char **resp, size_t *resp_len);
    int (*reset)(void *inst, const char *req, size_t req_len, char **resp, size_t *resp_len);
    int (*step)(void *inst, const char *sid, const char *req, size_t req_len, char **resp,
                size_t *resp_len);
    int (*score)(void *inst, const char *sid, const char *req, size_t req_len, char **resp,
                 size_t *resp_len);
    int (*fork)(void *inst, const char *sid, const char *req, size_t req_len, char **resp,
                size_t *resp_len); /* NULL: 501 NOT_IMPLEMENTED */
    int (*get)(void *inst, const char *sid, char **resp, size_t *resp_len);
    void (*close)(void *inst, const char *sid, const char *reason); /* idempotent, never fails */
    void (*free_buffer)(void *inst, char *buf);
    /* ---- appended members (revision 0 of agentrl; read only when within struct_size) ---- */
    /* Start draining (§6.2): new trajectories get 503 DRAINING, health answers 503, existing
     * sessions continue. */
    void (*drain)(void *inst);
    /* Reap sessions idle longer than session_idle_timeout_ms (§11.6); returns how many. */
    int (*reap_idle)(void *inst);
} arl_env_vtable;

/* Entry point of a shared-object environment (§14.2): fills *table for abi_version and returns
 * 0, or a negative value if it cannot provide that version. */
typedef int (*arl_env_entry_fn)(uint32_t abi_version, arl_env_vtable *table);

typedef struct arl_env_host_config {
    int64_t max_sessions;            /* 0: the environment's limits.max_sessions; else lower */
    int64_t session_idle_timeout_ms; /* 0: the environment's limit; else >= 600000 */
    int64_t max_closed_sessions;     /* deleted or reaped sessions remembered (410 answers,
                                        §6.7), oldest forgotten first; 0: 65536 */
} arl_env_host_config;

/* Open an instance of the AEP/1 state machine around def.  config_json: the environment's
 * configuration object as JSON text (NULL: "{}").  *inst is used with the returned *vt (a
 * static table, thread_safety 1: the host locks per session itself); free it with
 * vt->destroy_instance(inst) after every session is closed (open sessions are freed too).
 * Errors: ARL_ERR_CONFIG (def's info_json invalid, config not an object), or the status of
 * ops->instance_create. */
arl_status arl_env_host_open(const arl_env_def *def, const char *config_json,
                             const arl_env_host_config *cfg, void **inst,
                             const arl_env_vtable **vt);

/* ------------------------------------------------------------------------------------------ */
/* C. Sessions: one API for remote (AEP/1 over HTTP) and built-in environments                  */
/* ------------------------------------------------------------------------------------------ */

typedef struct arl_env_client arl_env_client;   /* driver of all transfers; one thread */
typedef struct arl_env arl_env;                 /* one environment (remote or built-in) */
typedef struct arl_env_session arl_env_session; /* one trajectory's session */

typedef struct arl_env_client_config {
    int64_t connect_timeout_ms;    /* 5000 (§11.3) */
    int64_t slack_ms;              /* 5000: total timeout = deadline_ms + slack (§11.3) */
    int64_t get_timeout_ms;        /* 10000: GET and DELETE (§11.2) */
    int64_t max_response_bytes;    /* 16 MiB (§12.1), decoded */
    int64_t max_observation_bytes; /* 8 MiB: cap on the server's max_observation_bytes */
    int64_t max_messages;          /* 4096 per observation */
    int64_t max_image_bytes;       /* 8 MiB cap on the server's value */
    int64_t max_image_pixels;      /* 4096 x 4096 cap on the server's value */
    int64_t queue_budget_ms;       /* 600000: waiting allowed for CAPACITY_REACHED, DRAINING,
                                      STEP_IN_PROGRESS per request (§10.3) */
    int64_t backoff_base_ms;       /* 250 (§10.3 rule 2; tests lower it) */
    int64_t backoff_max_ms;        /* 30000 */
    int64_t create_deadline_ms;    /* 120000 (§11.2) */
    int64_t score_deadline_ms;     /* 300000 */
    int64_t fork_deadline_ms;      /* 120000 */
    int64_t retry_say_ms;          /* 10000: a session call's retries are said in at most one
                                      line per this many ms and client (0: the default) */
    uint64_t seed;                 /* seed of the retry jitter (arl_rng) */
    const char *token;             /* bearer token for remote environments; NULL: none (copied) */
} arl_env_client_config;

void arl_env_client_config_default(arl_env_client_config *cfg);

/* One client per thread: it owns a libcurl multi handle (connections are reused across the
 * sessions of the same host) and every request in flight.  Not thread-safe. */
arl_status arl_env_client_open(const arl_env_client_config *cfg, arl_env_client **out);
/* Frees the client; every environment and session opened with it must be freed before. */
void arl_env_client_close(arl_env_client *c);

/* Open an environment.  `where` is a base URL ("http://127.0.0.1:8000", without /aep/v1; a
 * trailing "/aep/v1" is stripped) or "builtin:NAME" (in-process, through arl_env_host_open
 * with config_json, NULL for "{}").  Reads and validates /info; refuses protocol != aep/1.
 * Errors: ARL_ERR_ARG (bad URL or unknown built-in), ARL_ERR_ENV (the /info request failed:
 * see arl_env_last_error), ARL_ERR_PROTOCOL (invalid /info). */
arl_status arl_env_open(arl_env_client *c, const char *where, const char *config_json,
                        arl_env **out);
/* Frees the environment (NULL ok).  Its sessions must have been freed. */
void arl_env_free(arl_env *e);
const arl_env_info *arl_env_get_info(const arl_env *e); /* valid until arl_env_free */
/* The /info body exactly as received (its SHA-256 identifies the version, §13.3). */
const char *arl_env_info_body(const arl_env *e, size_t *len);
/* GET /health: fills active/max (may be NULL).  ARL_ERR_ENV with arl_env_last_error else. */
arl_status arl_env_health(arl_env *e, int64_t *active_sessions, int64_t *max_sessions);
const arl_env_error *arl_env_last_error(const arl_env *e); /* of open / health */
int arl_env_is_remote(const arl_env *e);

/* Which request a call was. */
typedef enum arl_env_endpoint {
    ARL_ENV_EP_INFO = 0,
    ARL_ENV_EP_HEALTH,
    ARL_ENV_EP_CREATE,
    ARL_ENV_EP_STEP,
    ARL_ENV_EP_SCORE,
    ARL_ENV_EP_FORK,
    ARL_ENV_EP_GET,
    ARL_ENV_EP_DELETE,
} arl_env_endpoint;

/* The record of one finished call on a session, with everything the replay store keeps
 * (spec/replay.md §4.8, spec §12.2 item 4).  Valid until the next call on the session starts
 * or the session is freed. */
typedef struct arl_env_call {
    arl_env_endpoint endpoint;
    arl_status status;        /* ARL_OK, or ARL_ERR_ENV when error.code != NONE, or a local
                                 failure (ARL_ERR_NOMEM) */
    arl_env_error error;      /* the last code observed (after retries) */
    const char *request;      /* (request_len) exact bytes sent; NULL for GET/DELETE */
    size_t request_len;
    int http_status;          /* of the last attempt; in-process: the vtable's status */
    const char *response;     /* (response_len) the last response body as received (decoded);
                                 when not complete, its first 64 KiB */
    size_t response_len;
    size_t response_total;    /* bytes received in total (may exceed response_len) */
    int response_complete;    /* 1: the whole body was received within the cap */
    int32_t attempts;         /* including the first */
    int64_t elapsed_ms;       /* first send to completion */
    int64_t queued_ms;        /* waiting on CAPACITY_REACHED/DRAINING/STEP_IN_PROGRESS
                                 (not charged to the episode's wall clock, §11.5) */
    /* Parsed success results (zeroed otherwise): */
    arl_env_result result;           /* CREATE, STEP, FORK */
    arl_env_score_result score;      /* SCORE */
    json_t *snapshot;                /* GET: the whole body, owned */
} arl_env_call;

/* The create request (§6.3); borrowed during the call. */
typedef struct arl_env_create_req {
    const char *trajectory_id; /* <= 128 bytes for roots (§3) */
    const char *group_id;
    arl_env_task task;
    const json_t *options;     /* NULL: absent */
    int64_t deadline_ms;       /* 0: client default */
} arl_env_create_req;

/* Synchronous calls.  Each runs the request to completion (retries included, §10.3) and
 * returns ARL_OK with the parsed result in arl_env_session_call(s), or ARL_ERR_ENV with the AEP
 * error code in call->error (server codes, or TRANSPORT_ERROR, CLIENT_TIMEOUT,
 * RESPONSE_TOO_LARGE, MALFORMED_RESPONSE, REWARD_OUT_OF_RANGE).  ARL_ERR_STATE: another call
 * is in flight on the session.  While a synchronous call runs, the client also progresses
 * other sessions' asynchronous calls.
 * deadline_ms 0 means the default of §11.2 (step: limits.default_step_timeout_ms); values are
 * clamped to [1000, limits.max_deadline_ms]. */
/* create: on ARL_ERR_ENV *out is still set, so that its call record can be read; free it. */
arl_status arl_env_session_create(arl_env *e, const arl_env_create_req *req,
                                  arl_env_session **out);
/* Step with index last + 1 (the session tracks it; a failed step leaves it unchanged). */
arl_status arl_env_session_step(arl_env_session *s, const arl_env_action *a,
                                int64_t deadline_ms);
arl_status arl_env_session_score_segment(arl_env_session *s, int64_t segment_index,
                                         int64_t first, int64_t last, int64_t deadline_ms);
arl_status arl_env_session_score_episode(arl_env_session *s, arl_env_score_reason reason,
                                         int64_t deadline_ms);
/* Fork at at_step_index; *child is a new session of the same environment (free it too). */
arl_status arl_env_session_fork(arl_env_session *s, const char *child_trajectory_id,
                                const char *group_id, int64_t at_step_index,
                                int64_t deadline_ms, arl_env_session **child);
/* GET /sessions/{sid} (keeps the session alive, §11.6); call->snapshot holds the body. */
arl_status arl_env_session_get(arl_env_session *s);
/* DELETE ?reason=... (reason NULL: "completed").  Errors are recorded, never fatal. */
arl_status arl_env_session_delete(arl_env_session *s, const char *reason);
/* Free the local object (NULL ok); it does not send DELETE.  A call in flight is abandoned. */
void arl_env_session_free(arl_env_session *s);

/* Asynchronous forms: queue the request and return at once (ARL_ERR_STATE if busy).  The
 * transfer starts at the next arl_env_client_wait (or synchronous call), which also reports its
 * completion.  In-process sessions complete at once (the call runs inside *_begin) and are
 * reported by the next wait.  A synchronous call on a client with nothing else in flight runs
 * as a blocking transfer on the session's own connection (lower latency). */
arl_status arl_env_session_create_begin(arl_env *e, const arl_env_create_req *req,
                                        arl_env_session **out);
arl_status arl_env_session_step_begin(arl_env_session *s, const arl_env_action *a,
                                      int64_t deadline_ms);
arl_status arl_env_session_score_segment_begin(arl_env_session *s, int64_t segment_index,
                                               int64_t first, int64_t last,
                                               int64_t deadline_ms);
arl_status arl_env_session_score_episode_begin(arl_env_session *s,
                                               arl_env_score_reason reason,
                                               int64_t deadline_ms);
arl_status arl_env_session_delete_begin(arl_env_session *s, const char *reason);
/* Drive all transfers for at most timeout_ms (0: do not block); *done = a session whose call
 * has finished (its record in arl_env_session_call), or NULL when none finished in time.
 * Each finished call is reported exactly once. */
arl_status arl_env_client_wait(arl_env_client *c, int64_t timeout_ms, arl_env_session **done);
/* Number of sessions with a call started and not yet reported by arl_env_client_wait. */
int arl_env_client_pending(const arl_env_client *c);

int arl_env_session_busy(const arl_env_session *s);
const arl_env_call *arl_env_session_call(const arl_env_session *s);
const char *arl_env_session_id(const arl_env_session *s);     /* "" before creation succeeded */
const char *arl_env_session_trajectory(const arl_env_session *s);
int64_t arl_env_session_last_step(const arl_env_session *s);  /* last applied step */
int arl_env_session_ended(const arl_env_session *s);          /* terminated/truncated/scored */
arl_env *arl_env_session_env(const arl_env_session *s);
/* Caller data (e.g. the rollout slot); never touched by the library. */
void arl_env_session_set_user(arl_env_session *s, void *user);
void *arl_env_session_user(const arl_env_session *s);

#endif
