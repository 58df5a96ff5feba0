/* envs/builtin/teacher.h: teachers of the built-in environments and the demonstration
 * writer used to warm-start policies with SFT before RL.
 *
 * A teacher is a policy that knows the task: given the state of an episode it returns the
 * action (visible text plus tool calls in the environment's tool format) that a competent
 * agent takes next.  Its episodes succeed: calculator, needle and shapes always; kvstore
 * recovers from every transient failure (the environment guarantees that at most two calls in
 * a row fail).  Teachers act on the in-process state of an environment (envs/builtin/);
 * for a conversation held elsewhere (a rollout's history) arl_env_teacher_act rebuilds that
 * state by replaying the assistant turns, which the environments' deterministic replay makes
 * exact.
 *
 * Demonstration format (JSONL, one conversation per line, OpenAI chat format):
 *   {"messages": [{"role": "system", "content": "..."},
 *                 {"role": "user", "content": "What is 7 + 5?"},
 *                 {"role": "assistant", "content": "",
 *                  "tool_calls": [{"id": "call_1_0", "type": "function",
 *                                  "function": {"name": "calc",
 *                                               "arguments": "{\"expression\":\"7 + 5\"}"}}]},
 *                 {"role": "tool", "tool_call_id": "call_1_0", "content": "12"}, ...],
 *    "tools": [ ...the environment's OpenAI function tools... ],
 *    "meta": {"env": "calculator", "task": {"id": ..., "seed": ..., "data": {}},
 *             "options": {...}, "steps": 2, "outcome": 1}}
 * Tool-call arguments are JSON text (OpenAI convention).  Content with images (shapes) is an
 * array of parts: {"type": "text", "text": ...} and {"type": "image_url", "image_url":
 * {"url": "data:image/png;base64,...", "width": W, "height": H}} (the pixel size lets the chat
 * template count image placeholders without decoding).  Tool messages that report an error
 * (kvstore's transient failures) keep their text ("Error: ...") and add "is_error": true and
 * "error_code" as in spec/aep.md 4.1.
 */
#ifndef ARL_ENVS_BUILTIN_TEACHER_H
#define ARL_ENVS_BUILTIN_TEACHER_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "envs/env.h"

typedef struct arl_env_demos_stats {
    int64_t episodes; /* episodes run */
    int64_t written;  /* successful conversations written (outcome at the top of its range) */
    int64_t failed;   /* episodes whose outcome was not a success (not written) */
    int64_t steps;    /* steps over all episodes */
    int64_t bytes;    /* bytes written */
} arl_env_demos_stats;

/* Run n_episodes teacher episodes of the built-in environment env_name with task seeds
 * seed, seed + 1, ..., task.data {} and the given options (JSON object text, NULL for none;
 * "max_steps" caps the episode, default limits.max_steps), and write each successful episode
 * as one JSONL line to out.  stats may be NULL.  Errors: ARL_ERR_NOT_FOUND (no such built-in
 * with a teacher), ARL_ERR_ARG (bad options: the message names the member), ARL_ERR_IO or
 * ARL_ERR_FULL (a write to out failed: the message gives the system's reason, not the file's
 * name), ARL_ERR_NOMEM. */
arl_status arl_env_demos_write(const char *env_name, int64_t n_episodes, uint64_t seed,
                               const char *options_json, FILE *out, arl_env_demos_stats *stats);

/* One teacher episode as a conversation object (the JSONL line's object, new reference in
 * *conversation) and its outcome reward.  Writes nothing. */
arl_status arl_env_demo_episode(const char *env_name, const arl_env_task *task,
                                const json_t *options, json_t **conversation, double *outcome);

/* The teacher's next action for a conversation: the session of (task, options) is re-created
 * and the assistant turns of history (an array of messages in the OpenAI format above, or
 * AEP/1 messages whose tool calls carry "arguments" as an object) are replayed; then the
 * teacher acts for the next step.  Other roles in history are ignored (the environment
 * regenerates them).  *out must be zeroed; the caller clears it with arl_env_action_clear.
 * Errors: ARL_ERR_NOT_FOUND, ARL_ERR_ARG (bad options or history), ARL_ERR_STATE (the episode
 * has already ended). */
arl_status arl_env_teacher_act(const char *env_name, const arl_env_task *task,
                               const json_t *options, const json_t *history, arl_env_action *out);

/* The OpenAI form of an observation's messages appended to msgs (array), and of an action as
 * an assistant message.  Exposed for tests and for the rollout's SFT export. */
arl_status arl_env_obs_to_openai(const arl_env_observation *obs, json_t *msgs);
json_t *arl_env_action_to_openai(const arl_env_action *a);

#endif
