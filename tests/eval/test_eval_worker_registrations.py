"""An id a script registers in Python under ``if __name__ == "__main__"`` (``register_tool_env``
then ``evaluate(..., workers=N)``) is known to eval's worker processes, which start fresh (from a
fork server or spawned) and import the script as ``__mp_main__``, where that block does not run:
the driver's registrations go with them (its tool and rubric ran in the workers)."""

import json
import os
import subprocess
import sys

import benchmax_gym

SCRIPT = '''
import json, os
import multiprocess
import benchmax_gym
from benchmax_gym.eval import evaluate, runner


def shout(text: str) -> str:
    """Shout.

    Args:
        text: what to shout
    """
    return text.upper()


def exact(completion, answer):
    return float(completion.strip() == answer)


def answer(obs, info):  # a call to the script's tool first, then its answer (what the tool said)
    if "HI" in str(obs):
        return "HI" if os.getpid() != int(os.environ["BMX_DRIVER"]) else "played in the driver"
    return '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>'


if __name__ == "__main__":
    os.environ["BMX_DRIVER"] = str(os.getpid())
    benchmax_gym.register_tool_env("script/EvalShout-v0", tools=[shout],
                                   tasks=[{"prompt": f"say hi {i}", "answer": "HI"} for i in range(4)],
                                   rubric=exact, max_turns=3)
    out = {}
    for method in ("forkserver", "spawn"):
        if method == "spawn":
            runner._worker_context = lambda: multiprocess.get_context("spawn")
        result = evaluate("script/EvalShout-v0", answer, tasks=4, concurrency=2, workers=2)
        out[method] = [[r["task_index"], r["reward"], r["error"]] for r in result.records]
    print(json.dumps(out))
'''


def test_an_id_registered_in_a_scripts_main_reaches_eval_workers(tmp_path):
    script = tmp_path / "my_eval.py"
    script.write_text(SCRIPT)
    root = os.path.dirname(os.path.dirname(benchmax_gym.__file__))  # (the script imports the benchmax_gym under test)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for method in ("forkserver", "spawn"):
        assert out[method] == [[i, 1.0, None] for i in range(4)], method


LOCKED_SCRIPT = '''
import json, threading
import benchmax_gym
from benchmax_gym.eval import evaluate

LOCK = threading.Lock()


def exact(completion, answer, lock=LOCK):  # holds a lock: its registration cannot be pickled
    with lock:
        return float(completion.strip() == answer)


def echo(text: str) -> str:
    """Echo.

    Args:
        text: what to echo
    """
    return text


benchmax_gym.register_tool_env("script/EvalLocked-v0", tools=[echo],
                               tasks=[{"prompt": f"say hi {i}", "answer": "HI"} for i in range(4)], rubric=exact)

if __name__ == "__main__":
    result = evaluate("script/EvalLocked-v0", lambda obs, info: "HI", tasks=4, concurrency=2, workers=2)
    print(json.dumps([[r["task_index"], r["reward"], r["error"]] for r in result.records]))
'''


def test_an_id_registered_at_import_that_cannot_be_pickled_still_reaches_eval_workers(tmp_path):
    """A registration that cannot travel (a rubric holding a lock), made when the script is
    imported: the workers' own import of the script registers it, as before; it is no error."""
    script = tmp_path / "locked_eval.py"
    script.write_text(LOCKED_SCRIPT)
    root = os.path.dirname(os.path.dirname(benchmax_gym.__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [[i, 1.0, None] for i in range(4)]
