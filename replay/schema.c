/* replay/schema.c: the DDL of spec/replay.md section 4 (normative: table and column names,
 * types and constraints are copied from the spec), the connection settings of section 3, and
 * schema versioning and migrations (section 12).  Indexes beyond the spec's are marked.
 *
 * Storage choices the spec leaves open (names, types and constraints unchanged):
 *   - rewards, image_refs and trajectory_events are WITHOUT ROWID tables: small rows keyed by
 *     their composite primary key, so the key is the table and no separate key index is
 *     written (one b-tree page less per table per transaction; every segment commit adds an
 *     event).  Tables with large BLOB or TEXT columns keep rowids: a WITHOUT ROWID b-tree
 *     copies keys into interior pages and reads a whole overflowing record to compare keys. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "replay/inspect.h"
#include "replay/internal.h"

#define DDL_META                                                                                   \
    "CREATE TABLE meta ("                                                                          \
    " key TEXT PRIMARY KEY,"                                                                       \
    " value TEXT NOT NULL"                                                                         \
    ") STRICT;"

#define DDL_RUNS                                                                                   \
    "CREATE TABLE runs ("                                                                          \
    " run_id INTEGER PRIMARY KEY,"                                                                 \
    " run_uid TEXT NOT NULL UNIQUE,"                                                               \
    " status TEXT NOT NULL CHECK (status IN ('active','finished','aborted')),"                     \
    " created_at_ms INTEGER NOT NULL,"                                                             \
    " config_json TEXT NOT NULL CHECK (json_valid(config_json)),"                                  \
    " config_sha256 TEXT NOT NULL,"                                                                \
    " model_config_json TEXT NOT NULL CHECK (json_valid(model_config_json)),"                      \
    " model_config_sha256 TEXT NOT NULL,"                                                          \
    " tokenizer_sha256 TEXT NOT NULL,"                                                             \
    " chat_template_sha256 TEXT NOT NULL,"                                                         \
    " code_version TEXT NOT NULL,"                                                                 \
    " notes TEXT"                                                                                  \
    ") STRICT;"

#define DDL_POLICY_VERSIONS                                                                        \
    "CREATE TABLE policy_versions ("                                                               \
    " run_id INTEGER NOT NULL REFERENCES runs(run_id),"                                            \
    " version INTEGER NOT NULL,"                                                                   \
    " created_at_ms INTEGER NOT NULL,"                                                             \
    " update_n INTEGER,"                                                                           \
    " checkpoint_uri TEXT,"                                                                        \
    " weights_sha256 TEXT,"                                                                        \
    " kl_coef REAL,"                                                                               \
    " metrics_json TEXT CHECK (metrics_json IS NULL OR json_valid(metrics_json)),"                 \
    " PRIMARY KEY (run_id, version)"                                                               \
    ") STRICT;"

#define DDL_ENVS                                                                                   \
    "CREATE TABLE envs ("                                                                          \
    " env_id INTEGER PRIMARY KEY,"                                                                 \
    " name TEXT NOT NULL,"                                                                         \
    " version TEXT NOT NULL,"                                                                      \
    " info_sha256 TEXT NOT NULL,"                                                                  \
    " info_json TEXT NOT NULL CHECK (json_valid(info_json)),"                                      \
    " transport TEXT NOT NULL CHECK (transport IN ('http','c_abi')),"                              \
    " base_url TEXT,"                                                                              \
    " first_seen_ms INTEGER NOT NULL,"                                                             \
    " conformance_json TEXT CHECK (conformance_json IS NULL OR json_valid(conformance_json)),"     \
    " UNIQUE (name, info_sha256)"                                                                  \
    ") STRICT;"

#define DDL_TASKS                                                                                  \
    "CREATE TABLE tasks ("                                                                         \
    " task_id INTEGER PRIMARY KEY,"                                                                \
    " task_uid TEXT NOT NULL,"                                                                     \
    " env_name TEXT NOT NULL,"                                                                     \
    " seed INTEGER NOT NULL,"                                                                      \
    " data_json TEXT NOT NULL CHECK (json_valid(data_json)),"                                      \
    " data_sha256 TEXT NOT NULL,"                                                                  \
    " dataset TEXT,"                                                                               \
    " split TEXT,"                                                                                 \
    " UNIQUE (env_name, task_uid, seed, data_sha256)"                                              \
    ") STRICT;"

#define DDL_TASK_GROUPS                                                                            \
    "CREATE TABLE task_groups ("                                                                   \
    " group_id INTEGER PRIMARY KEY,"                                                               \
    " group_uid TEXT NOT NULL UNIQUE,"                                                             \
    " run_id INTEGER NOT NULL REFERENCES runs(run_id),"                                            \
    " task_id INTEGER NOT NULL REFERENCES tasks(task_id),"                                         \
    " env_id INTEGER NOT NULL REFERENCES envs(env_id),"                                            \
    " kind TEXT NOT NULL CHECK (kind IN ('train','eval','fork')),"                                 \
    " size INTEGER NOT NULL,"                                                                      \
    " status TEXT NOT NULL CHECK (status IN ('open','final','consumed','abandoned')),"             \
    " admitted_at_ms INTEGER NOT NULL,"                                                            \
    " admitted_version INTEGER NOT NULL,"                                                          \
    " consumed_update INTEGER,"                                                                    \
    " parent_traj_uid TEXT,"                                                                       \
    " parent_seg_index INTEGER,"                                                                   \
    " CHECK ((status = 'consumed') = (consumed_update IS NOT NULL))"                               \
    ") STRICT;"

#define DDL_GROUP_MEMBERS                                                                          \
    "CREATE TABLE group_members ("                                                                 \
    " group_id INTEGER NOT NULL REFERENCES task_groups(group_id),"                                 \
    " slot INTEGER NOT NULL,"                                                                      \
    " attempt INTEGER NOT NULL DEFAULT 0,"                                                         \
    " traj_uid TEXT NOT NULL UNIQUE,"                                                              \
    " shard_id INTEGER NOT NULL,"                                                                  \
    " traj_id INTEGER NOT NULL,"                                                                   \
    " status TEXT NOT NULL CHECK (status IN ('running','complete','truncated','masked')),"         \
    " PRIMARY KEY (group_id, slot, attempt)"                                                       \
    ") STRICT;"

#define DDL_SHARDS                                                                                 \
    "CREATE TABLE shards ("                                                                        \
    " shard_id INTEGER PRIMARY KEY CHECK (shard_id BETWEEN 1 AND 8388607),"                        \
    " kind TEXT NOT NULL CHECK (kind IN ('worker','learner','tool')),"                             \
    " file_name TEXT NOT NULL UNIQUE,"                                                             \
    " host TEXT NOT NULL,"                                                                         \
    " created_at_ms INTEGER NOT NULL,"                                                             \
    " sealed_at_ms INTEGER"                                                                        \
    ") STRICT;"

#define DDL_UPDATES                                                                                \
    "CREATE TABLE updates ("                                                                       \
    " run_id INTEGER NOT NULL REFERENCES runs(run_id),"                                            \
    " update_n INTEGER NOT NULL,"                                                                  \
    " status TEXT NOT NULL CHECK (status IN ('planned','committed','aborted')),"                   \
    " planned_at_ms INTEGER NOT NULL,"                                                             \
    " committed_at_ms INTEGER,"                                                                    \
    " n_groups INTEGER NOT NULL,"                                                                  \
    " n_action_tokens INTEGER,"                                                                    \
    " PRIMARY KEY (run_id, update_n)"                                                              \
    ") STRICT;"

#define DDL_UPDATE_GROUPS                                                                          \
    "CREATE TABLE update_groups ("                                                                 \
    " run_id INTEGER NOT NULL,"                                                                    \
    " update_n INTEGER NOT NULL,"                                                                  \
    " group_id INTEGER NOT NULL REFERENCES task_groups(group_id),"                                 \
    " PRIMARY KEY (run_id, update_n, group_id),"                                                   \
    " FOREIGN KEY (run_id, update_n) REFERENCES updates(run_id, update_n)"                         \
    ") STRICT;"

#define DDL_PINS                                                                                   \
    "CREATE TABLE pins ("                                                                          \
    " traj_uid TEXT PRIMARY KEY,"                                                                  \
    " reason TEXT NOT NULL,"                                                                       \
    " created_at_ms INTEGER NOT NULL"                                                              \
    ") STRICT;"

#define DDL_TRAJECTORIES                                                                           \
    "CREATE TABLE trajectories ("                                                                  \
    " traj_id INTEGER PRIMARY KEY,"                                                                \
    " traj_uid TEXT NOT NULL UNIQUE,"                                                              \
    " run_id INTEGER NOT NULL,"                                                                    \
    " group_id INTEGER NOT NULL,"                                                                  \
    " slot INTEGER NOT NULL,"                                                                      \
    " attempt INTEGER NOT NULL DEFAULT 0,"                                                         \
    " task_id INTEGER NOT NULL,"                                                                   \
    " env_id INTEGER NOT NULL,"                                                                    \
    " session_id TEXT,"                                                                            \
    " status TEXT NOT NULL CHECK (status IN ('running','complete','truncated','masked')),"         \
    " end_cause TEXT CHECK (end_cause IN "                                                         \
    "('terminated','env_truncated','context_budget','turn_budget',"                                \
    " 'action_too_large','wall_clock','error','interrupted')),"                                    \
    " error_code TEXT,"                                                                            \
    " error_attribution TEXT CHECK (error_attribution IN ('client','env','infra','none')),"        \
    " error_detail_json TEXT CHECK (error_detail_json IS NULL OR json_valid(error_detail_json)),"  \
    " parent_traj_uid TEXT,"                                                                       \
    " fork_seg_index INTEGER,"                                                                     \
    " resume_count INTEGER NOT NULL DEFAULT 0,"                                                    \
    " n_segments INTEGER NOT NULL DEFAULT 0,"                                                      \
    " n_turns INTEGER NOT NULL DEFAULT 0,"                                                         \
    " n_tokens INTEGER NOT NULL DEFAULT 0,"                                                        \
    " n_action_tokens INTEGER NOT NULL DEFAULT 0,"                                                 \
    " min_version INTEGER,"                                                                        \
    " max_version INTEGER,"                                                                        \
    " outcome_reward REAL,"                                                                        \
    " created_at_ms INTEGER NOT NULL,"                                                             \
    " updated_at_ms INTEGER NOT NULL,"                                                             \
    " finished_at_ms INTEGER,"                                                                     \
    " CHECK ((status = 'masked') = (error_code IS NOT NULL)),"                                     \
    " CHECK ((status = 'running') = (end_cause IS NULL)),"                                         \
    " CHECK ((status = 'running') = (finished_at_ms IS NULL))"                                     \
    ") STRICT;"

#define DDL_SEGMENTS                                                                               \
    "CREATE TABLE segments ("                                                                      \
    " traj_id INTEGER NOT NULL REFERENCES trajectories(traj_id),"                                  \
    " seg_index INTEGER NOT NULL,"                                                                 \
    " start_kind TEXT NOT NULL CHECK (start_kind IN ('fresh','continue','fork')),"                 \
    " end_cause TEXT NOT NULL CHECK (end_cause IN ('token_budget','env_reset','template_break',"   \
    " 'end','partial')),"                                                                          \
    " first_step INTEGER NOT NULL,"                                                                \
    " last_step INTEGER NOT NULL,"                                                                 \
    " tok_start INTEGER NOT NULL,"                                                                 \
    " n_tokens INTEGER NOT NULL CHECK (n_tokens > 0),"                                             \
    " n_action_tokens INTEGER NOT NULL,"                                                           \
    " ctx_start INTEGER NOT NULL,"                                                                 \
    " min_version INTEGER NOT NULL,"                                                               \
    " max_version INTEGER NOT NULL,"                                                               \
    " routes_layout TEXT,"                                                                         \
    " end_state_id INTEGER,"                                                                       \
    " latent_state_id INTEGER,"                                                                    \
    " committed_at_ms INTEGER NOT NULL,"                                                           \
    " tokens BLOB NOT NULL,"                                                                       \
    " logprobs BLOB NOT NULL,"                                                                     \
    " loss_mask BLOB NOT NULL,"                                                                    \
    " versions BLOB NOT NULL,"                                                                     \
    " PRIMARY KEY (traj_id, seg_index)"                                                            \
    ") STRICT;"

#define DDL_SEGMENT_ROUTES                                                                         \
    "CREATE TABLE segment_routes ("                                                                \
    " traj_id INTEGER NOT NULL,"                                                                   \
    " seg_index INTEGER NOT NULL,"                                                                 \
    " moe_layer INTEGER NOT NULL,"                                                                 \
    " data BLOB NOT NULL,"                                                                         \
    " PRIMARY KEY (traj_id, seg_index, moe_layer),"                                                \
    " FOREIGN KEY (traj_id, seg_index) REFERENCES segments(traj_id, seg_index)"                    \
    ") STRICT;"

#define DDL_TURNS                                                                                  \
    "CREATE TABLE turns ("                                                                         \
    " traj_id INTEGER NOT NULL REFERENCES trajectories(traj_id),"                                  \
    " step_index INTEGER NOT NULL,"                                                                \
    " seg_index INTEGER NOT NULL,"                                                                 \
    " act_tok_start INTEGER,"                                                                      \
    " act_tok_end INTEGER,"                                                                        \
    " obs_seg_index INTEGER,"                                                                      \
    " obs_tok_start INTEGER,"                                                                      \
    " obs_tok_end INTEGER,"                                                                        \
    " policy_version INTEGER,"                                                                     \
    " finish_reason TEXT CHECK (finish_reason IN ('stop','tool_calls','length')),"                 \
    " parse_status TEXT CHECK (parse_status IN "                                                   \
    "('ok','no_tool_call','invalid_json','arguments_not_object',"                                  \
    " 'missing_name','unclosed_block','malformed_structure')),"                                    \
    " n_tool_calls INTEGER NOT NULL DEFAULT 0,"                                                    \
    " context TEXT CHECK (context IN ('append','reset')),"                                         \
    " reward REAL,"                                                                                \
    " terminated INTEGER NOT NULL DEFAULT 0 CHECK (terminated IN (0,1)),"                          \
    " truncated INTEGER NOT NULL DEFAULT 0 CHECK (truncated IN (0,1)),"                            \
    " anchor TEXT,"                                                                                \
    " call_seq INTEGER NOT NULL,"                                                                  \
    " started_at_ms INTEGER NOT NULL,"                                                             \
    " finished_at_ms INTEGER NOT NULL,"                                                            \
    " action_json TEXT CHECK (action_json IS NULL OR json_valid(action_json)),"                    \
    " PRIMARY KEY (traj_id, step_index)"                                                           \
    ") STRICT;"

#define DDL_ENV_CALLS                                                                              \
    "CREATE TABLE env_calls ("                                                                     \
    " traj_id INTEGER NOT NULL REFERENCES trajectories(traj_id),"                                  \
    " call_seq INTEGER NOT NULL,"                                                                  \
    " endpoint TEXT NOT NULL CHECK (endpoint IN ('create','step','score_segment','score_episode'," \
    " 'fork','delete','get')),"                                                                    \
    " session_id TEXT,"                                                                            \
    " step_index INTEGER,"                                                                         \
    " segment_index INTEGER,"                                                                      \
    " http_status INTEGER,"                                                                        \
    " error_code TEXT,"                                                                            \
    " attempts INTEGER NOT NULL,"                                                                  \
    " attempt_log_json TEXT CHECK (attempt_log_json IS NULL OR json_valid(attempt_log_json)),"     \
    " started_at_ms INTEGER NOT NULL,"                                                             \
    " latency_ms INTEGER NOT NULL,"                                                                \
    " response_len INTEGER,"                                                                       \
    " response_complete INTEGER NOT NULL CHECK (response_complete IN (0,1)),"                      \
    " response_sha256 BLOB,"                                                                       \
    " request_body BLOB,"                                                                          \
    " response_body BLOB,"                                                                         \
    " PRIMARY KEY (traj_id, call_seq)"                                                             \
    ") STRICT;"

#define DDL_TOOL_CALLS                                                                             \
    "CREATE TABLE tool_calls ("                                                                    \
    " traj_id INTEGER NOT NULL,"                                                                   \
    " step_index INTEGER NOT NULL,"                                                                \
    " call_index INTEGER NOT NULL,"                                                                \
    " call_id TEXT NOT NULL,"                                                                      \
    " name TEXT,"                                                                                  \
    " parse_status TEXT NOT NULL,"                                                                 \
    " result_is_error INTEGER,"                                                                    \
    " result_error_code TEXT,"                                                                     \
    " result_bytes INTEGER,"                                                                       \
    " result_truncated INTEGER,"                                                                   \
    " arguments_json TEXT,"                                                                        \
    " PRIMARY KEY (traj_id, step_index, call_index),"                                              \
    " FOREIGN KEY (traj_id, step_index) REFERENCES turns(traj_id, step_index)"                     \
    ") STRICT;"

#define DDL_REWARDS                                                                                \
    "CREATE TABLE rewards ("                                                                       \
    " traj_id INTEGER NOT NULL REFERENCES trajectories(traj_id),"                                  \
    " level TEXT NOT NULL CHECK (level IN ('process','segment','outcome')),"                       \
    " scope_index INTEGER NOT NULL,"                                                               \
    " component TEXT NOT NULL,"                                                                    \
    " source TEXT NOT NULL DEFAULT 'env',"                                                         \
    " value REAL,"                                                                                 \
    " call_seq INTEGER,"                                                                           \
    " PRIMARY KEY (traj_id, level, scope_index, component, source)"                                \
    ") STRICT, WITHOUT ROWID;"

#define DDL_IMAGES                                                                                 \
    "CREATE TABLE images ("                                                                        \
    " image_id INTEGER PRIMARY KEY,"                                                               \
    " sha256 BLOB NOT NULL UNIQUE,"                                                                \
    " width INTEGER NOT NULL,"                                                                     \
    " height INTEGER NOT NULL,"                                                                    \
    " n_bytes INTEGER NOT NULL,"                                                                   \
    " png BLOB NOT NULL"                                                                           \
    ") STRICT;"

#define DDL_IMAGE_REFS                                                                             \
    "CREATE TABLE image_refs ("                                                                    \
    " traj_id INTEGER NOT NULL,"                                                                   \
    " call_seq INTEGER NOT NULL,"                                                                  \
    " body_offset INTEGER NOT NULL,"                                                               \
    " image_id INTEGER NOT NULL REFERENCES images(image_id),"                                      \
    " PRIMARY KEY (traj_id, call_seq, body_offset),"                                               \
    " FOREIGN KEY (traj_id, call_seq) REFERENCES env_calls(traj_id, call_seq)"                     \
    ") STRICT, WITHOUT ROWID;"

#define DDL_TRAJECTORY_EVENTS                                                                      \
    "CREATE TABLE trajectory_events ("                                                             \
    " traj_id INTEGER NOT NULL REFERENCES trajectories(traj_id),"                                  \
    " seq INTEGER NOT NULL,"                                                                       \
    " at_ms INTEGER NOT NULL,"                                                                     \
    " kind TEXT NOT NULL,"                                                                         \
    " detail_json TEXT CHECK (detail_json IS NULL OR json_valid(detail_json)),"                    \
    " PRIMARY KEY (traj_id, seq)"                                                                  \
    ") STRICT, WITHOUT ROWID;"

#define DDL_STATES                                                                                 \
    "CREATE TABLE states ("                                                                        \
    " state_id INTEGER PRIMARY KEY,"                                                               \
    " traj_uid TEXT NOT NULL,"                                                                     \
    " seg_index INTEGER NOT NULL,"                                                                 \
    " kind TEXT NOT NULL CHECK (kind IN ('kda_boundary','mla_segment')),"                          \
    " producer TEXT NOT NULL CHECK (producer IN ('rollout','learner','tool')),"                    \
    " pass_uid TEXT NOT NULL,"                                                                     \
    " version_min INTEGER NOT NULL,"                                                               \
    " version_max INTEGER NOT NULL,"                                                               \
    " numerics TEXT NOT NULL,"                                                                     \
    " routing TEXT NOT NULL CHECK (routing IN ('replay','natural')),"                              \
    " model_config_sha256 TEXT NOT NULL,"                                                          \
    " ctx_start INTEGER NOT NULL,"                                                                 \
    " n_tokens INTEGER NOT NULL,"                                                                  \
    " n_bytes INTEGER NOT NULL,"                                                                   \
    " status TEXT NOT NULL CHECK (status IN ('writing','complete','evicted')),"                    \
    " created_at_ms INTEGER NOT NULL,"                                                             \
    " last_used_at_ms INTEGER NOT NULL,"                                                           \
    " UNIQUE (traj_uid, seg_index, kind, producer, pass_uid)"                                      \
    ") STRICT;"

#define DDL_STATE_CHUNKS                                                                           \
    "CREATE TABLE state_chunks ("                                                                  \
    " state_id INTEGER NOT NULL REFERENCES states(state_id),"                                      \
    " layer INTEGER NOT NULL,"                                                                     \
    " tensor TEXT NOT NULL CHECK (tensor IN ('S','conv','latent')),"                               \
    " row_start INTEGER NOT NULL DEFAULT 0,"                                                       \
    " data BLOB NOT NULL,"                                                                         \
    " PRIMARY KEY (state_id, layer, tensor, row_start)"                                            \
    ") STRICT;"

#define DDL_LEARNER_RECORDS                                                                        \
    "CREATE TABLE learner_records ("                                                               \
    " run_id INTEGER NOT NULL,"                                                                    \
    " update_n INTEGER NOT NULL,"                                                                  \
    " traj_uid TEXT NOT NULL,"                                                                     \
    " seg_index INTEGER NOT NULL,"                                                                 \
    " version INTEGER NOT NULL,"                                                                   \
    " staleness INTEGER NOT NULL,"                                                                 \
    " seg_mean_logratio REAL NOT NULL,"                                                            \
    " mask_reason TEXT CHECK (mask_reason IN ('geo','stale','routes')),"                           \
    " levels_json TEXT NOT NULL CHECK (json_valid(levels_json)),"                                  \
    " metrics_json TEXT CHECK (metrics_json IS NULL OR json_valid(metrics_json)),"                 \
    " old_logprobs BLOB NOT NULL,"                                                                 \
    " ref_logprobs BLOB NOT NULL,"                                                                 \
    " is_weights BLOB NOT NULL,"                                                                   \
    " token_flags BLOB NOT NULL,"                                                                  \
    " advantages BLOB NOT NULL,"                                                                   \
    " PRIMARY KEY (run_id, update_n, traj_uid, seg_index)"                                         \
    ") STRICT;"

#define DDL_RESCORES                                                                               \
    "CREATE TABLE rescores ("                                                                      \
    " rescore_id INTEGER PRIMARY KEY,"                                                             \
    " label TEXT NOT NULL,"                                                                        \
    " traj_uid TEXT NOT NULL,"                                                                     \
    " seg_index INTEGER NOT NULL,"                                                                 \
    " run_uid TEXT,"                                                                               \
    " version INTEGER,"                                                                            \
    " checkpoint_uri TEXT,"                                                                        \
    " routing TEXT NOT NULL CHECK (routing IN ('replay','natural')),"                              \
    " created_at_ms INTEGER NOT NULL,"                                                             \
    " stats_json TEXT NOT NULL CHECK (json_valid(stats_json)),"                                    \
    " logprobs BLOB NOT NULL,"                                                                     \
    " UNIQUE (label, traj_uid, seg_index, routing)"                                                \
    ") STRICT;"

#define DDL_TRAJECTORIES_BY_STATUS                                                                 \
    "CREATE INDEX trajectories_by_status   ON trajectories(run_id, status, finished_at_ms);"

#define DDL_TRAJECTORIES_BY_GROUP                                                                  \
    "CREATE INDEX trajectories_by_group    ON trajectories(group_id, slot);"

#define DDL_TRAJECTORIES_BY_TASK "CREATE INDEX trajectories_by_task     ON trajectories(task_id);"

#define DDL_TRAJECTORIES_BY_ENV                                                                    \
    "CREATE INDEX trajectories_by_env      ON trajectories(env_id, status);"

#define DDL_TRAJECTORIES_BY_ERROR                                                                  \
    "CREATE INDEX trajectories_by_error    ON trajectories(error_code) WHERE error_code IS NOT "   \
    "NULL;"

#define DDL_TRAJECTORIES_BY_OUTCOME                                                                \
    "CREATE INDEX trajectories_by_outcome  ON trajectories(run_id, outcome_reward) WHERE "         \
    "outcome_reward IS NOT NULL;"

#define DDL_TRAJECTORIES_BY_LENGTH                                                                 \
    "CREATE INDEX trajectories_by_length   ON trajectories(run_id, n_tokens);"

#define DDL_TRAJECTORIES_BY_PARENT                                                                 \
    "CREATE INDEX trajectories_by_parent   ON trajectories(parent_traj_uid) WHERE "                \
    "parent_traj_uid IS NOT NULL;"

#define DDL_SEGMENTS_BY_VERSION "CREATE INDEX segments_by_version      ON segments(min_version);"

#define DDL_TURNS_BY_PARSE_FAILURE                                                                 \
    "CREATE INDEX turns_by_parse_failure   ON turns(parse_status) WHERE parse_status NOT IN "      \
    "('ok','no_tool_call');"

#define DDL_TURNS_BY_ANCHOR                                                                        \
    "CREATE INDEX turns_by_anchor          ON turns(anchor) WHERE anchor IS NOT NULL;"

#define DDL_ENV_CALLS_BY_ERROR                                                                     \
    "CREATE INDEX env_calls_by_error       ON env_calls(error_code) WHERE error_code IS NOT NULL;"

#define DDL_TOOL_CALLS_BY_NAME                                                                     \
    "CREATE INDEX tool_calls_by_name       ON tool_calls(name, result_error_code);"

#define DDL_REWARDS_BY_COMPONENT                                                                   \
    "CREATE INDEX rewards_by_component     ON rewards(level, component, value);"

#define DDL_STATES_BY_LRU                                                                          \
    "CREATE INDEX states_by_lru            ON states(status, last_used_at_ms);"

#define DDL_STATES_BY_VERSION                                                                      \
    "CREATE INDEX states_by_version        ON states(producer, version_min);"

#define DDL_LEARNER_RECORDS_BY_TRAJ                                                                \
    "CREATE INDEX learner_records_by_traj  ON learner_records(traj_uid, seg_index);"

#define DDL_GROUPS_BY_STATUS                                                                       \
    "CREATE INDEX groups_by_status         ON task_groups(run_id, status, admitted_at_ms);"

#define DDL_MEMBERS_BY_TRAJ                                                                        \
    "CREATE INDEX members_by_traj          ON group_members(shard_id, traj_id);"

/* Indexes added by this implementation (section 4 allows extra indexes). */
/* recover and takeover find running trajectories without a run filter */
#define DDL_TRAJECTORIES_RUNNING                                                                   \
    "CREATE INDEX trajectories_running ON trajectories(status) WHERE status = 'running';"
/* list sorted by finish time without a run filter (newest first) */
#define DDL_TRAJECTORIES_BY_FINISHED                                                               \
    "CREATE INDEX trajectories_by_finished ON trajectories(finished_at_ms);"

#define WORKER_TABLES                                                                              \
    DDL_TRAJECTORIES DDL_SEGMENTS DDL_SEGMENT_ROUTES DDL_TURNS DDL_ENV_CALLS DDL_TOOL_CALLS        \
        DDL_REWARDS DDL_IMAGES DDL_IMAGE_REFS DDL_TRAJECTORY_EVENTS
#define WORKER_INDEXES                                                                             \
    DDL_TRAJECTORIES_BY_STATUS DDL_TRAJECTORIES_BY_GROUP DDL_TRAJECTORIES_BY_TASK                  \
        DDL_TRAJECTORIES_BY_ENV DDL_TRAJECTORIES_BY_ERROR DDL_TRAJECTORIES_BY_OUTCOME              \
            DDL_TRAJECTORIES_BY_LENGTH DDL_TRAJECTORIES_BY_PARENT DDL_SEGMENTS_BY_VERSION          \
                DDL_TURNS_BY_PARSE_FAILURE DDL_TURNS_BY_ANCHOR DDL_ENV_CALLS_BY_ERROR              \
                    DDL_TOOL_CALLS_BY_NAME DDL_REWARDS_BY_COMPONENT DDL_TRAJECTORIES_RUNNING       \
                        DDL_TRAJECTORIES_BY_FINISHED

static const char *const ddl_catalog =
    DDL_META DDL_RUNS DDL_POLICY_VERSIONS DDL_ENVS DDL_TASKS DDL_TASK_GROUPS DDL_GROUP_MEMBERS
        DDL_SHARDS DDL_UPDATES DDL_UPDATE_GROUPS DDL_PINS DDL_GROUPS_BY_STATUS DDL_MEMBERS_BY_TRAJ;
static const char *const ddl_worker = DDL_META WORKER_TABLES WORKER_INDEXES;
static const char *const ddl_states =
    DDL_META DDL_STATES DDL_STATE_CHUNKS DDL_STATES_BY_LRU DDL_STATES_BY_VERSION;
static const char *const ddl_learner = DDL_META DDL_LEARNER_RECORDS DDL_LEARNER_RECORDS_BY_TRAJ;
/* Tool files: meta, rescores, and (forks, imports) the worker tables and learner_records. */
static const char *const ddl_tool = DDL_META WORKER_TABLES DDL_RESCORES DDL_LEARNER_RECORDS
    WORKER_INDEXES DDL_LEARNER_RECORDS_BY_TRAJ;

const char *rschema_ddl(int kind) {
    switch (kind) {
    case REPLAY_FILE_CATALOG:
        return ddl_catalog;
    case REPLAY_FILE_WORKER:
        return ddl_worker;
    case REPLAY_FILE_STATES:
        return ddl_states;
    case REPLAY_FILE_LEARNER:
        return ddl_learner;
    case REPLAY_FILE_TOOL:
        return ddl_tool;
    default:
        return NULL;
    }
}

/* ---- versions and migrations (section 12) ---- */

typedef struct rmigration {
    int to; /* migrates to -> ... from to - 1 */
    const char *sql;
    int raises_min_reader; /* 1: readers older than `to` can no longer read the file */
} rmigration;

/* Version 1 is the first version: no migrations yet.  A future change appends
 * {2, "ALTER TABLE ...;", 0} here and raises REPLAY_SCHEMA_VERSION. */
static const rmigration builtin_migrations[] = {{0, NULL, 0}};
static int test_version = 0;
static rmigration test_migration;

int rschema_version(void) {
    return test_version ? test_version : REPLAY_SCHEMA_VERSION;
}

void rschema_test_override(int version, const char *migration_sql, int raises_min_reader) {
    test_version = version;
    test_migration.to = version;
    test_migration.sql = migration_sql;
    test_migration.raises_min_reader = raises_min_reader;
}

static const rmigration *find_migration(int to) {
    if (test_version && test_migration.to == to && test_migration.sql) return &test_migration;
    for (size_t i = 0; i < sizeof builtin_migrations / sizeof *builtin_migrations; i++)
        if (builtin_migrations[i].to == to && builtin_migrations[i].sql)
            return &builtin_migrations[i];
    return NULL;
}

arl_status rschema_configure(rdb *d, int is_new) {
    int states = d->kind == REPLAY_FILE_STATES;
    char sql[512];
    if (d->readonly) return ARL_OK; /* readers only read (section 3) */
    if (is_new) {
        snprintf(sql, sizeof sql, "PRAGMA page_size = %d; PRAGMA auto_vacuum = %s;",
                 states ? RDB_PAGE_SIZE_STATES : RDB_PAGE_SIZE, states ? "INCREMENTAL" : "NONE");
        ARL_TRY(rdb_exec(d, sql));
    }
    sqlite3_stmt *s;
    ARL_TRY(rdb_prepare(d, "PRAGMA journal_mode = WAL", &s));
    int rc = sqlite3_step(s);
    char mode[16] = "";
    if (rc == SQLITE_ROW) rdb_col_text(s, 0, mode, sizeof mode);
    sqlite3_finalize(s);
    if (rc != SQLITE_ROW) return rdb_fail(d, rc, "setting journal_mode=WAL");
    if (strcmp(mode, "wal"))
        return arl_errorf(ARL_ERR_IO,
                          "replay: %s: journal_mode is '%s', not 'wal' (the file system may not "
                          "support shared memory; use a local disk)",
                          d->name, mode);
    snprintf(sql, sizeof sql,
             "PRAGMA synchronous = %s; PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 10000; "
             "PRAGMA wal_autocheckpoint = 1000; PRAGMA journal_size_limit = 67108864;",
             states ? "NORMAL" : "FULL");
    return rdb_exec(d, sql);
}

arl_status rschema_create(rdb *d, const char *meta_init) {
    const char *ddl = rschema_ddl(d->kind);
    if (!ddl)
        return arl_errorf(ARL_ERR_INTERNAL, "replay: %s: no schema for kind %d", d->name, d->kind);
    char sql[256];
    ARL_TRY(rdb_begin(d));
    /* Another process may have created the file between our check and the lock. */
    int64_t nobj = 0;
    arl_status s = rdb_query_int(d, "SELECT count(*) FROM sqlite_schema", &nobj, NULL);
    if (s != ARL_OK) return s;
    if (nobj) {
        rdb_rollback(d);
        return rschema_check(d);
    }
    if ((s = rdb_exec(d, ddl)) != ARL_OK) return s;
    snprintf(sql, sizeof sql, "PRAGMA application_id = %d; PRAGMA user_version = %d;",
             REPLAY_APPLICATION_ID, rschema_version());
    if ((s = rdb_exec(d, sql)) != ARL_OK) return s;
    char v[16];
    snprintf(v, sizeof v, "%d", rschema_version());
    if ((s = rdb_meta_set(d, "file_kind", replay_file_kind_name(d->kind))) != ARL_OK ||
        (s = rdb_meta_set(d, "schema_version", v)) != ARL_OK ||
        (s = rdb_meta_set(d, "min_reader_version", "1")) != ARL_OK ||
        (s = rdb_meta_set(d, "sealed", "0")) != ARL_OK)
        return s;
    for (const char *p = meta_init; p && *p;) {
        const char *val = p + strlen(p) + 1;
        if ((s = rdb_meta_set(d, p, val)) != ARL_OK) return s;
        p = val + strlen(val) + 1;
    }
    if ((s = rdb_commit(d)) != ARL_OK) return s;
    d->schema_version = rschema_version();
    d->min_reader_version = 1;
    return ARL_OK;
}

/* The backup size limit of section 12 rule 3 (replay_backup_limit_set); one per process. */
static int64_t backup_limit = REPLAY_BACKUP_LIMIT_DEFAULT;

void replay_backup_limit_set(int64_t bytes) {
    backup_limit = bytes;
}

static arl_status migrate(rdb *d, int from) {
    int to = rschema_version();
    char meta_sealed[8];
    ARL_TRY(rdb_meta_get(d, "sealed", meta_sealed, sizeof meta_sealed, NULL));
    int sealed = !strcmp(meta_sealed, "1");
    if (sealed && !d->allow_sealed)
        return arl_errorf(ARL_ERR_VERSION,
                          "replay: %s: sealed file has schema version %d, this build writes %d "
                          "(run 'agentrl replay migrate')",
                          d->name, from, to);
    for (int v = from + 1; v <= to; v++)
        if (!find_migration(v))
            return arl_errorf(ARL_ERR_VERSION,
                              "replay: %s: no migration from schema version %d to %d in this build",
                              d->name, v - 1, v);
    /* Backup before migrating (section 12 rule 3), unless the file exceeds the backup size
     * limit (replay_backup_limit_set; 0: never, < 0: always), which is said */
    struct stat sb;
    const int have = stat(d->path, &sb) == 0;
    const int backup =
        have && backup_limit != 0 && (backup_limit < 0 || sb.st_size <= backup_limit);
    if (have && !backup && backup_limit == 0)
        arl_log_warn("replay: %s: migrating schema %d -> %d without a backup (backups are off: "
                     "--backup-limit-bytes 0)",
                     d->name, from, to);
    else if (have && !backup)
        arl_log_warn(
            "replay: %s: migrating schema %d -> %d without a backup: the file's %lld bytes "
            "exceed the backup size limit of %lld (replay migrate --backup-limit-bytes)",
            d->name, from, to, (long long)sb.st_size, (long long)backup_limit);
    if (backup) {
        char *bak = malloc(strlen(d->path) + 32);
        if (!bak) return arl_errorf(ARL_ERR_NOMEM, "replay: out of memory");
        sprintf(bak, "%s.pre-v%d", d->path, to);
        unlink(bak);
        sqlite3_stmt *st;
        arl_status s = rdb_prepare(d, "VACUUM INTO ?1", &st);
        if (s == ARL_OK) {
            sqlite3_bind_text(st, 1, bak, -1, SQLITE_TRANSIENT);
            int rc = sqlite3_step(st);
            sqlite3_finalize(st);
            if (rc != SQLITE_DONE) s = rdb_fail(d, rc, "backing up before migration (VACUUM INTO)");
        }
        free(bak);
        ARL_TRY(s);
    }
    for (int v = from + 1; v <= to; v++) {
        const rmigration *m = find_migration(v);
        char sql[128], val[16];
        ARL_TRY(rdb_begin(d));
        arl_status s = rdb_exec(d, m->sql);
        snprintf(sql, sizeof sql, "PRAGMA user_version = %d", v);
        snprintf(val, sizeof val, "%d", v);
        if (s == ARL_OK) s = rdb_exec(d, sql);
        if (s == ARL_OK) s = rdb_meta_set(d, "schema_version", val);
        if (s == ARL_OK && m->raises_min_reader) s = rdb_meta_set(d, "min_reader_version", val);
        if (s == ARL_OK) s = rdb_commit(d);
        if (s != ARL_OK)
            return arl_error_prefix(s, "replay: %s: migrating schema %d -> %d", d->name, v - 1, v);
        if (m->raises_min_reader) d->min_reader_version = v;
        d->schema_version = v;
    }
    /* a sealed file (agentrl replay migrate) leaves WAL again: immutable and copyable */
    if (sealed) ARL_TRY(rdb_leave_wal(d));
    return ARL_OK;
}

arl_status rschema_check(rdb *d) {
    int64_t app = 0, uv = 0;
    /* the file by its path: a store-relative name does not say which store (a run has many) */
    const char *file = d->path ? d->path : d->name;
    ARL_TRY(rdb_query_int(d, "PRAGMA application_id", &app, NULL));
    ARL_TRY(rdb_query_int(d, "PRAGMA user_version", &uv, NULL));
    if (app != REPLAY_APPLICATION_ID)
        return arl_errorf(ARL_ERR_FORMAT,
                          "replay: %s: not an agentrl replay file (application_id 0x%08llx, "
                          "expected 0x41524C31): check the path",
                          file, (unsigned long long)app);
    char kind[16], sv[16], mr[16];
    int found_kind, found_sv, found_mr;
    ARL_TRY(rdb_meta_get(d, "file_kind", kind, sizeof kind, &found_kind));
    ARL_TRY(rdb_meta_get(d, "schema_version", sv, sizeof sv, &found_sv));
    ARL_TRY(rdb_meta_get(d, "min_reader_version", mr, sizeof mr, &found_mr));
    if (!found_kind || !found_sv || !found_mr)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "replay: %s: meta lacks file_kind, schema_version or min_reader_version "
                          "(run 'agentrl replay verify')",
                          file);
    if (d->kind >= 0 && strcmp(kind, replay_file_kind_name(d->kind)))
        return arl_errorf(ARL_ERR_FORMAT, "replay: %s: file kind is '%s', expected '%s'", file,
                          kind, replay_file_kind_name(d->kind));
    if (d->kind < 0) d->kind = rfile_kind_parse(kind); /* opened without knowing its kind */
    if (atoll(sv) != uv)
        return arl_errorf(ARL_ERR_CORRUPT,
                          "replay: %s: meta.schema_version %s != user_version %lld (run 'agentrl "
                          "replay verify')",
                          file, sv, (long long)uv);
    int v = (int)uv, m = atoi(mr), r = rschema_version();
    d->schema_version = v;
    d->min_reader_version = m;
    if (v < 1)
        return arl_errorf(ARL_ERR_VERSION,
                          "replay: %s: schema version %d is older than any this build can read or "
                          "migrate (1..%d): the file was not written by a released agentrl, or "
                          "its header is damaged (run 'agentrl replay verify')",
                          file, v, r);
    if (m > r)
        return arl_errorf(ARL_ERR_VERSION,
                          "replay: %s: schema version %d (readable by version %d and newer) cannot "
                          "be read by this build, which reads version %d: use a newer agentrl",
                          file, v, m, r);
    if (v > r && !d->readonly)
        return arl_errorf(ARL_ERR_VERSION,
                          "replay: %s: schema version %d is newer than this build's %d: writing is "
                          "refused (use a newer agentrl)",
                          file, v, r);
    if (v < r && !d->readonly) return migrate(d, v);
    return ARL_OK;
}
