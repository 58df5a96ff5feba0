#!/usr/bin/env python3
"""wordcount_server.py: an AEP/1 environment server in plain Python (standard library only).

The environment: "How many words does this text contain?"  Tools: count_words(text) counts the
words of any text; submit_answer(answer) ends the episode.  The outcome reward is 1 for the
right count.  Run it and check it:

    python3 envs/examples/wordcount_server.py --port 8000
    agentrl env check http://127.0.0.1:8000 --script envs/examples/wordcount_script.json

Everything a conformant server needs is here (spec/aep.md): the headers and order of checks,
strict JSON (no duplicate keys, depth <= 32, valid UTF-8), idempotent creation and steps (the
stored bytes are replayed), the session lifecycle, capacity, 413 for large bodies, idle reaping
and draining on SIGTERM.  Optional features (fork, segment scores, images, context
resets) are declared absent and answered 501 where the spec says so.  See README.md.
"""
import argparse
import hashlib
import json
import random
import re
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENV_NAME, ENV_VERSION = "wordcount", "1.0.0"
LIMITS = {"max_sessions": 64, "max_steps": 50, "default_step_timeout_ms": 60000,
          "max_deadline_ms": 3600000, "session_idle_timeout_ms": 900000,
          "max_request_bytes": 1048576, "max_observation_bytes": 1048576}
TOOLS = [
    {"type": "function", "function": {
        "name": "count_words", "description": "Count the words (whitespace-separated) of a text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                       "required": ["text"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "submit_answer", "description": "Submit the number of words. Ends the episode.",
        "parameters": {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0}},
                       "required": ["answer"], "additionalProperties": False}}},
]
INFO = {
    "protocol": "aep/1", "protocol_revision": 0,
    "env": {"name": ENV_NAME, "version": ENV_VERSION, "description": "Count the words of a text."},
    "tools": TOOLS,
    "reward_levels": {"process": {"range": [-1, 1]}, "outcome": {"range": [0, 1]}},
    "reward_components": [
        {"name": "tool_error", "level": "process", "range": [-1, 0]},
        {"name": "correct", "level": "outcome", "range": [0, 1]}],
    "capabilities": {"fork": False, "segment_score": False, "deterministic_replay": True,
                     "parallel_tool_calls": True, "multimodal": False, "context_reset": False},
    "limits": LIMITS,
}
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()

# ---- errors (spec §8.3) ----
ERRORS = {  # code: (HTTP status, retryable, attribution)
    "INVALID_REQUEST": (400, False, "client"), "UNSUPPORTED_VERSION": (400, False, "client"),
    "VALIDATION_ERROR": (422, False, "client"), "PAYLOAD_TOO_LARGE": (413, False, "client"),
    "UNKNOWN_SESSION": (404, False, "env"), "TRAJECTORY_CONFLICT": (409, False, "client"),
    "STEP_CONFLICT": (409, False, "client"), "STEP_IN_PROGRESS": (409, True, "none"),
    "EPISODE_ENDED": (409, False, "client"), "SCORE_CONFLICT": (409, False, "client"),
    "SESSION_CLOSED": (410, False, "env"), "CAPACITY_REACHED": (503, True, "env"),
    "DRAINING": (503, True, "env"), "DEADLINE_EXCEEDED": (504, True, "env"),
    "ENV_INTERNAL": (500, False, "env"), "NOT_IMPLEMENTED": (501, False, "none"),
    "X_UNKNOWN_ROUTE": (404, False, "client"),
}


class AepError(Exception):
    def __init__(self, code, message, retry_after_ms=None):
        super().__init__(message)
        self.code, self.message, self.retry_after_ms = code, message, retry_after_ms

    def body(self):
        status, retryable, attribution = ERRORS[self.code]
        err = {"code": self.code, "message": self.message, "retryable": retryable,
               "attribution": attribution, "details": {}}
        if self.retry_after_ms is not None:
            err["retry_after_ms"] = self.retry_after_ms
        return status, dumps({"error": err})


def dumps(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


# ---- strict JSON (§2.3) ----
def _no_duplicates(pairs):
    obj = {}
    for k, v in pairs:
        if k in obj:
            raise ValueError("duplicate member name %r" % k)
        obj[k] = v
    return obj


def _reject_constant(name):
    raise ValueError("%s is not JSON" % name)


def _depth(text):
    depth = best = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def _check_strings(v):
    """Unpaired surrogates (also from \\u escapes) are not UTF-8."""
    if isinstance(v, str):
        v.encode("utf-8")
    elif isinstance(v, list):
        for x in v:
            _check_strings(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            _check_strings(k)
            _check_strings(x)


def strict_loads(raw):
    try:
        text = raw.decode("utf-8")
        if text.startswith("\ufeff"):
            raise ValueError("byte-order mark")
        if _depth(text) > 32:
            raise ValueError("nesting deeper than 32 levels")
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
        _check_strings(value)
        return value
    except (ValueError, UnicodeError) as e:
        raise AepError("INVALID_REQUEST", "request body: %s" % e)


def norm(v):
    """Identity comparison (§10.1): null equals absent at every depth; numbers by value."""
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", v)
    if isinstance(v, dict):
        return {k: norm(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [norm(x) for x in v]
    return v


def is_index(v):
    return type(v) is int and 0 <= v <= 2**53 - 1


ID_RE = re.compile(r"^[A-Za-z0-9._:/@#+-]{1,256}$")
BLOCK_STATUSES = {"invalid_json", "arguments_not_object", "missing_name", "unclosed_block",
                  "malformed_structure"}


def check_action(a):
    """Schema of §4.5; returns the action with defaults applied."""
    def bad(msg):
        raise AepError("VALIDATION_ERROR", "/action" + msg)
    if not isinstance(a, dict):
        bad(": expected an object")
    if a.get("parse_status") not in BLOCK_STATUSES | {"ok", "no_tool_call"}:
        bad("/parse_status: missing or not a parse status")
    for key in ("content", "reasoning"):
        if a.get(key) is not None and not isinstance(a[key], str):
            bad("/%s: expected a string" % key)
    if a.get("finish_reason") not in (None, "stop", "tool_calls", "length"):
        bad("/finish_reason: expected stop, tool_calls or length")
    calls, errors = a.get("tool_calls") or [], a.get("parse_errors") or []
    if not isinstance(calls, list) or not isinstance(errors, list):
        bad(": tool_calls and parse_errors must be arrays")
    for i, c in enumerate(calls):
        if not (isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(c.get("name"), str)
                and isinstance(c.get("arguments"), dict)):
            bad("/tool_calls/%d: expected {id, name, arguments: object}" % i)
    for i, e in enumerate(errors):
        if not (isinstance(e, dict) and isinstance(e.get("id"), str) and e.get("status") in BLOCK_STATUSES):
            bad("/parse_errors/%d: expected {id, status}" % i)
    want = errors[0]["status"] if errors else ("ok" if calls else "no_tool_call")
    if a["parse_status"] != want:
        bad("/parse_status: %r disagrees with tool_calls and parse_errors (expected %r)"
            % (a["parse_status"], want))
    ids = [c["id"] for c in calls] + [e["id"] for e in errors]
    if len(set(ids)) != len(ids):
        bad(": two calls share an id")
    return calls, errors


# ---- the environment itself ----
def make_text(task):
    text = task["data"].get("text")
    if isinstance(text, str):
        return text
    if text is not None:
        raise AepError("VALIDATION_ERROR", "/task/data/text: expected a string")
    rng = random.Random(task["seed"])
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15)))


def run_tools(session, step_index, calls, errors):
    """Apply one action; returns (messages, process reward, terminated)."""
    messages, penalty, terminated = [], 0.0, False
    for c in calls:
        name, args = c["name"], c["arguments"]
        msg = {"role": "tool", "tool_call_id": c["id"]}
        if name == "count_words" and set(args) == {"text"} and isinstance(args["text"], str):
            msg["content"] = str(len(args["text"].split()))
        elif name == "submit_answer" and set(args) == {"answer"} and type(args["answer"]) is int \
                and args["answer"] >= 0:
            session.answer = args["answer"]
            terminated = True
            msg["content"] = "Answer recorded."
        elif name in ("count_words", "submit_answer"):
            msg.update(content="Invalid arguments for %s." % name, is_error=True,
                       error_code="TOOL_ARGS_INVALID")
        else:
            msg.update(content="Unknown tool %r." % name, is_error=True, error_code="TOOL_NOT_FOUND")
        penalty += 0.1 if msg.get("is_error") else 0.0
        messages.append(msg)
    for e in errors:
        messages.append({"role": "tool", "tool_call_id": e["id"], "is_error": True,
                         "error_code": "TOOL_PARSE_ERROR",
                         "content": "Could not parse the tool call (%s)." % e["status"]})
        penalty += 0.1
    if not calls and not errors and not terminated:
        messages.append({"role": "user", "content": "Use count_words or submit_answer."})
    return messages, -min(1.0, round(penalty, 1)), terminated


# ---- sessions (§6, §7) ----
class Session:
    def __init__(self, sid, traj, group, task, options, max_steps):
        self.sid, self.traj, self.group = sid, traj, group
        self.task, self.options, self.max_steps = task, options, max_steps
        self.text = make_text(task)
        self.answer = None
        self.last = 0                    # last applied step
        self.last_action = None          # normalised action of step `last`
        self.last_body = b""             # stored response of step `last` (step 0: the 201 body)
        self.create_body = b""
        self.status = "active"
        self.episode_score = None        # (reason, body)
        self.closed = False
        self.touched = time.monotonic()


# Every request holds LOCK while it runs, so two requests for one session never overlap and
# §2.4 (STEP_IN_PROGRESS, waiting retries) cannot arise.  A server with slow tools would
# release the lock while a tool runs and track a busy flag per session instead.
LOCK = threading.Lock()
SESSIONS, TRAJECTORIES = {}, {}
STATE = {"counter": 0, "active": 0, "draining": False}


def lookup(sid):
    s = SESSIONS.get(sid)
    if s is None:
        raise AepError("UNKNOWN_SESSION", "no session %r" % sid)
    if s.closed:
        raise AepError("SESSION_CLOSED", "session %r was deleted or reaped" % sid)
    s.touched = time.monotonic()
    return s


def create(body):
    if not isinstance(body, dict):
        raise AepError("VALIDATION_ERROR", "request body: expected an object")
    traj, group, task, options = (body.get(k) for k in ("trajectory_id", "group_id", "task", "options"))
    for key, v in (("trajectory_id", traj), ("group_id", group)):
        if not isinstance(v, str) or not ID_RE.match(v):
            raise AepError("VALIDATION_ERROR", "/%s: expected 1-256 of [A-Za-z0-9._:/@#+-]" % key)
    if not (isinstance(task, dict) and isinstance(task.get("id"), str)
            and 1 <= len(task["id"].encode()) <= 256 and is_index(task.get("seed"))
            and isinstance(task.get("data"), dict)):
        raise AepError("VALIDATION_ERROR", "/task: expected {id: string, seed: integer >= 0, data: object}")
    if options is not None and not isinstance(options, dict):
        raise AepError("VALIDATION_ERROR", "/options: expected an object")
    max_steps = (options or {}).get("max_steps", LIMITS["max_steps"])
    if not (type(max_steps) is int and 1 <= max_steps <= LIMITS["max_steps"]):
        raise AepError("VALIDATION_ERROR", "/options/max_steps: expected 1..%d" % LIMITS["max_steps"])
    if not is_index(body.get("deadline_ms")):
        raise AepError("VALIDATION_ERROR", "/deadline_ms: required integer")
    ident = norm({"group_id": group, "task": task, "options": options})
    with LOCK:
        old = TRAJECTORIES.get(traj)
        if old is not None:   # repeats first (§6.3 rule 2), before draining and capacity
            if old[0] != ident:
                raise AepError("TRAJECTORY_CONFLICT", "trajectory_id reused with other members")
            if old[1].closed:
                raise AepError("SESSION_CLOSED", "this trajectory's session was deleted")
            return 200, old[1].create_body
        if STATE["draining"]:
            raise AepError("DRAINING", "server is shutting down", retry_after_ms=1000)
        if STATE["active"] >= LIMITS["max_sessions"]:
            raise AepError("CAPACITY_REACHED", "%d/%d sessions" % (STATE["active"], LIMITS["max_sessions"]),
                           retry_after_ms=1000)
        STATE["counter"] += 1
        sid = "wc-%d-%s" % (STATE["counter"], hashlib.sha256(traj.encode()).hexdigest()[:8])
        s = Session(sid, traj, group, task, options, max_steps)   # may raise VALIDATION_ERROR
        question = "How many words does this text contain?\n\n" + s.text
        obs = {"context": "reset", "tools": None, "messages": [
            {"role": "system", "content": "Count words. Use the tools; finish with submit_answer."},
            {"role": "user", "content": question}]}
        s.create_body = s.last_body = dumps({"session_id": sid, "trajectory_id": traj, "step_index": 0,
                                             "observation": obs, "info": {}})
        SESSIONS[sid], TRAJECTORIES[traj] = s, (ident, s)
        STATE["active"] += 1
        return 201, s.create_body


def step(sid, body):
    with LOCK:
        s = lookup(sid)
        if not isinstance(body, dict) or not is_index(body.get("step_index")) \
                or not is_index(body.get("deadline_ms")) or "action" not in body:
            raise AepError("VALIDATION_ERROR", "expected {step_index, action, deadline_ms}")
        calls, errors = check_action(body["action"])
        k, action = body["step_index"], norm(body["action"])
        if k == s.last and k >= 1:                       # §6.4 rule 1
            if action == s.last_action:
                return 200, s.last_body                  # a retry: the stored bytes
            raise AepError("STEP_CONFLICT", "step %d was applied with another action" % k)
        if k != s.last + 1:
            raise AepError("STEP_CONFLICT", "step_index %d, last applied %d" % (k, s.last))
        if s.status == "failed":
            raise AepError("SESSION_CLOSED", "the session has failed")
        if s.status != "active":
            raise AepError("EPISODE_ENDED", "the episode has ended")
        messages, reward, terminated = run_tools(s, k, calls, errors)
        truncated = not terminated and k >= s.max_steps
        out = dumps({"step_index": k, "observation": {"context": "append", "messages": messages},
                     "reward": reward, "reward_components": {"tool_error": reward},
                     "terminated": terminated, "truncated": truncated, "info": {}})
        s.last, s.last_action, s.last_body = k, action, out
        if terminated or truncated:
            s.status = "terminated" if terminated else "truncated"
        return 200, out


def score(sid, body):
    with LOCK:
        s = lookup(sid)
        if not isinstance(body, dict) or body.get("scope") not in ("segment", "episode") \
                or not is_index(body.get("deadline_ms")):
            raise AepError("VALIDATION_ERROR", "expected {scope, ..., deadline_ms}")
        if body["scope"] == "segment":
            raise AepError("NOT_IMPLEMENTED", "segment scores are not supported")
        reason = body.get("reason")
        if reason not in ("terminated", "truncated", "context_budget", "turn_budget", "action_too_large",
                          "wall_clock"):
            raise AepError("VALIDATION_ERROR", "/reason: not a score reason")
        if s.status == "failed":
            raise AepError("SESSION_CLOSED", "the session has failed")
        if s.episode_score is not None:
            if s.episode_score[0] != reason:
                raise AepError("SCORE_CONFLICT", "scored before with reason %r" % s.episode_score[0])
            return 200, s.episode_score[1]
        if s.answer is None:
            out = {"scope": "episode", "scorable": False, "reward": None, "info": {}}
        else:
            r = 1.0 if s.answer == len(s.text.split()) else 0.0
            out = {"scope": "episode", "scorable": True, "reward": r, "reward_components": {"correct": r},
                   "info": {"expected": len(s.text.split())}}
        s.episode_score = (reason, dumps(out))
        if s.status == "active":
            s.status = "scored"
        return 200, s.episode_score[1]


def get(sid):
    with LOCK:
        s = lookup(sid)
        return 200, dumps({"session_id": s.sid, "trajectory_id": s.traj, "group_id": s.group,
                           "step_index": s.last, "status": s.status, "idle_ms": 0,
                           "last_step_response_sha256": hashlib.sha256(s.last_body).hexdigest()})


def close(sid):
    with LOCK:
        s = SESSIONS.get(sid)
        if s is not None and not s.closed:
            s.closed = True
            STATE["active"] -= 1


def reap_idle():
    while True:
        time.sleep(5)
        limit = LIMITS["session_idle_timeout_ms"] / 1000.0
        with LOCK:
            for s in SESSIONS.values():
                if not s.closed and time.monotonic() - s.touched > limit:
                    s.closed = True
                    STATE["active"] -= 1


# ---- HTTP (§2, §8.7) ----
ROUTE_RE = re.compile(r"^/aep/v1/sessions/([A-Za-z0-9._~-]+)(?:/(step|score|fork))?$")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"   # persistent connections (§2.1)
    disable_nagle_algorithm = True  # headers and body are written separately: avoid 40 ms stalls
    server_version = "wordcount-aep/1.0"

    def log_message(self, fmt, *args):   # quiet; AEP-Request-Id would be logged here
        pass

    def send(self, status, body=b"", close=False):
        self.send_response(status)
        self.send_header("AEP-Version", "1")
        if status != 204:
            self.send_header("Content-Type", "application/json; charset=utf-8")
        if status == 503:
            ms = json.loads(body)["error"].get("retry_after_ms", 1000)
            self.send_header("Retry-After", str((ms + 999) // 1000))
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def handle_expect_100(self):
        """§12.1: refuse an oversized body before it is sent."""
        if int(self.headers.get("Content-Length") or 0) > LIMITS["max_request_bytes"]:
            self.send(*AepError("PAYLOAD_TOO_LARGE", "body over max_request_bytes").body(), close=True)
            return False
        return super().handle_expect_100()

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n > LIMITS["max_request_bytes"]:
            if n <= 64 << 20:   # read and discard, so that the client reads our answer
                while n > 0:
                    chunk = self.rfile.read(min(n, 1 << 20))
                    if not chunk:
                        break
                    n -= len(chunk)
            else:
                self.close_connection = True
            raise AepError("PAYLOAD_TOO_LARGE", "body over max_request_bytes")
        return self.rfile.read(n) if n else b""

    def dispatch(self, method):
        try:
            raw = self.read_body() if method == "POST" else b""
            # check 1: version (no token configured in this example)
            if self.headers.get("AEP-Version") != "1":
                raise AepError("UNSUPPORTED_VERSION", "AEP-Version must be 1")
            # check 2: route
            path = self.path.split("?", 1)[0]
            m = ROUTE_RE.match(path)
            route = {("GET", "/aep/v1/info"): "info", ("GET", "/aep/v1/health"): "health",
                     ("POST", "/aep/v1/sessions"): "create"}.get((method, path))
            if route is None and m:
                route = {("GET", None): "get", ("DELETE", None): "delete", ("POST", "step"): "step",
                         ("POST", "score"): "score", ("POST", "fork"): "fork"}.get((method, m.group(2)))
            if route is None:
                raise AepError("X_UNKNOWN_ROUTE", "no route for %s %s" % (method, path))
            sid = m.group(1) if m else None
            if route == "delete":
                close(sid)
                return self.send(204)
            # check 3: session
            if sid is not None:
                with LOCK:
                    lookup(sid)
            # check 4: headers (then the body's syntax)
            accept = self.headers.get("Accept")
            if accept is not None and not any(
                    p.split(";")[0].strip().lower() in ("application/json", "application/*", "*/*")
                    for p in accept.split(",")):
                raise AepError("INVALID_REQUEST", "Accept admits no JSON")
            if route == "info":
                return self.send(200, dumps(INFO))
            if route == "health":
                if STATE["draining"]:
                    raise AepError("DRAINING", "server is shutting down", retry_after_ms=1000)
                return self.send(200, dumps({"status": "ok", "active_sessions": STATE["active"],
                                             "max_sessions": LIMITS["max_sessions"]}))
            if route == "get":
                return self.send(*get(sid))
            if route == "fork":
                raise AepError("NOT_IMPLEMENTED", "fork is not supported")
            ctype = (self.headers.get("Content-Type") or "").lower().replace(" ", "")
            if not (ctype == "application/json" or ctype.startswith("application/json;")) or \
                    ("charset=" in ctype and "charset=utf-8" not in ctype):
                raise AepError("INVALID_REQUEST", "Content-Type must be application/json; charset=utf-8")
            body = strict_loads(raw)
            status, out = {"create": lambda: create(body), "step": lambda: step(sid, body),
                           "score": lambda: score(sid, body)}[route]()
            self.send(status, out)
        except AepError as e:
            self.send(*e.body())
        except Exception as e:   # a bug: answer ENV_INTERNAL rather than a stack trace
            self.send(*AepError("ENV_INTERNAL", "internal error: %s" % type(e).__name__).body())

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_DELETE(self):
        self.dispatch("DELETE")

    def do_PUT(self):
        self.dispatch("PUT")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    args = ap.parse_args()
    ThreadingHTTPServer.request_queue_size = 128   # the default backlog of 5 drops bursts
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    threading.Thread(target=reap_idle, daemon=True).start()

    def drain(signum, frame):   # §6.2: refuse new sessions, let existing ones finish
        STATE["draining"] = True
        def wait_and_stop():
            end = time.monotonic() + 30
            while STATE["active"] > 0 and time.monotonic() < end:
                time.sleep(0.1)
            server.shutdown()
        threading.Thread(target=wait_and_stop, daemon=True).start()
    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    print("listening on http://%s:%d" % (args.host, server.server_address[1]), flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
