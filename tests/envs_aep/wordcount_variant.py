#!/usr/bin/env python3
"""tests/envs_aep/wordcount_variant.py: the example server (envs/examples/wordcount_server.py) with
one behaviour changed, for the conformance checker's tests (python_derived.sh):

  --mode repeat  submit_answer ends the episode only from step 3 on, so the script `env check`
                 derives from /info needs its answer action repeated (spec/aep.md 15.1);
  --mode never   submit_answer never ends the episode (no derived script can pass check 7);
  --mode reject  every request is answered 400 UNSUPPORTED_VERSION ("AEP-Version must be 1.0").
"""
import os
import sys

sys.path.insert(0, os.path.join(os.environ.get("ARL_SOURCE_DIR", "."), "envs", "examples"))
import wordcount_server as w  # noqa: E402

MODE = sys.argv[sys.argv.index("--mode") + 1]
del sys.argv[sys.argv.index("--mode"):sys.argv.index("--mode") + 2]
run_tools0, dispatch0 = w.run_tools, w.Handler.dispatch


def run_tools(session, step_index, calls, errors):
    messages, reward, terminated = run_tools0(session, step_index, calls, errors)
    if MODE == "never" or (MODE == "repeat" and step_index < 3):
        terminated = False
    return messages, reward, terminated


def dispatch(self, method):
    if MODE != "reject":
        return dispatch0(self, method)
    self.rfile.read(int(self.headers.get("Content-Length") or 0))
    return self.send(*w.AepError("UNSUPPORTED_VERSION", "AEP-Version must be 1.0").body())


w.run_tools, w.Handler.dispatch = run_tools, dispatch
sys.exit(w.main())
