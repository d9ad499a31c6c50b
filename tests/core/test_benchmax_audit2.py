"""A user's benchmax environment (a subclass of the real package's ``BaseEnv``, async as it
declares them) run unchanged through every runner: ``gym.make``, ``make_vec`` (fork and spawn
workers), the CLI's ``run``/``eval`` with ``--import``, a trainer adapter's ``make_env``. Its rows
reach ``compute_reward`` however it is written, its failures name its class and method, and each
rollout it opens is closed once."""

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import cloudpickle
import gymnasium as gym
import pytest
from benchmax.envs.base_env import BaseEnv as PackageBaseEnv
from benchmax.envs.types import StandardizedExample, ToolDefinition
from datasets import load_dataset

from benchmax_gym import BenchmaxEnv, register_benchmax_env

REPO = Path(__file__).resolve().parents[2]
GSM8K = REPO.parent / "shared" / "data" / "gsm8k" / "train_sample500.jsonl"
CALC = {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}


def call(name, **arguments):
    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


def read_log(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


class Plain(PackageBaseEnv):
    """The package's abstract methods, nothing more: no tools, an exact-match grader."""

    async def list_tools(self):
        return []

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        raise ValueError("no tools")

    async def init_rollout(self, rollout_id, **rollout_args):
        pass

    async def copy_to_workspace(self, rollout_id, src_path, dst_filename=None):
        pass

    async def copy_from_workspace(self, rollout_id, src_filename, dst_path):
        pass

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        return {"match": float(completion.strip() == ground_truth)}


class NoKwargs(Plain):
    """As users write it when their rows carry nothing else: no ``**kwargs``."""

    async def compute_reward(self, rollout_id, completion, ground_truth):
        return {"match": float(completion.strip() == ground_truth)}


class Kwargs(Plain):
    seen: list = []

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        Kwargs.seen.append(kwargs)
        return {"match": float(completion.strip() == ground_truth)}


class Keyword(Plain):
    async def compute_reward(self, rollout_id, completion, ground_truth, *, level):
        return {"match": float(completion.strip() == ground_truth and level == 2)}


def play(env, *actions, options=None):
    env.reset(options=options or {"task_index": 0})
    for action in actions:
        out = env.step(action)
    return out


def test_compute_reward_gets_the_row_fields_it_takes_and_none_that_clash():
    """A row's ``id`` reached a ``compute_reward`` without ``**kwargs`` as an unexpected keyword,
    and a field named ``completion`` or ``rollout_id`` as a second value: a TypeError each
    episode, so every right answer scored 0."""
    env = BenchmaxEnv(NoKwargs, [{"prompt": "Say 4.", "ground_truth": "4", "id": "q1"}])
    _, reward, _, _, info = play(env, "4")
    env.close()
    assert (reward, info.get("reward_errors")) == (1.0, None)

    Kwargs.seen.clear()
    env = BenchmaxEnv(Kwargs, [{"prompt": "Say 4.", "ground_truth": "4", "completion": "4, the reference",
                                "rollout_id": "r-7", "level": 2}])
    _, reward, _, _, info = play(env, "4")
    env.close()
    assert (reward, info.get("reward_errors")) == (1.0, None)
    assert Kwargs.seen == [{"level": 2}]

    env = BenchmaxEnv(Keyword, [{"prompt": "Say 4.", "ground_truth": "4", "level": 2, "id": "q1"}])
    assert play(env, "4")[1] == 1.0
    env.close()
    # a field it requires that a row lacks would score every episode 0: it fails at make instead
    with pytest.raises(TypeError, match=r"Keyword\.compute_reward asks for 'level'.*rows\[1\]"):
        BenchmaxEnv(Keyword, [{"prompt": "Say 4.", "ground_truth": "4", "level": 2},
                              {"prompt": "Say 5.", "ground_truth": "5"}])


def test_messages_rows_reach_the_model_through_the_packages_default_dataset_preprocess():
    """The package's default ``dataset_preprocess`` gives a row without ``prompt`` the prompt
    ``""``, which was taken as the prompt: a ``messages`` row opened with an empty observation."""
    row = {"messages": [{"role": "system", "content": "Reply with digits only."},
                        {"role": "user", "content": "What is two plus two?"}], "ground_truth": "4"}
    env = gym.make(register_benchmax_env("audit2/PlainMessages-v0", Plain, [row]))
    obs, info = env.reset(options={"task_index": 0})
    assert "What is two plus two?" in obs and "Reply with digits only." in obs
    assert [m["role"] for m in info["messages"]] == ["system", "user"]
    assert env.step("4")[1] == 1.0
    env.close()


def test_a_dataset_row_the_default_preprocess_cannot_read_fails_at_make_naming_the_hook():
    """GSM8K's rows (``question``/``answer``) under the package's default ``dataset_preprocess``
    became tasks with an empty prompt and an empty ground truth, played and scored as if fine."""
    rows = load_dataset("json", data_files=str(GSM8K), split="train").select(range(3))
    with pytest.raises(ValueError, match=r"rows\[0\] needs a 'prompt' \(a non-empty string.*'question'.*"
                                         r"Plain\.dataset_preprocess"):
        gym.make(register_benchmax_env("audit2/PlainGSM8K-v0", Plain, rows))


class Broken(Plain):
    """Fails where the row says: in ``list_tools``, ``init_rollout`` or ``compute_reward``."""

    how = ""
    log = ""

    def __init__(self, how="", log="", **kwargs):
        self.how, self.log = how, log

    def note(self, *what):
        if self.log:
            with open(self.log, "a") as f:
                f.write(json.dumps(what) + "\n")

    async def list_tools(self):
        if self.how == "list_raises":
            raise ConnectionError("tool server down")
        return None if self.how == "list_none" else []

    async def init_rollout(self, rollout_id, **rollout_args):
        self.note("init", rollout_id)
        if rollout_args.get("fail"):
            raise RuntimeError("no workspace left")

    async def cleanup_rollout(self, rollout_id):
        self.note("cleanup", rollout_id)

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        if completion == "raise":
            raise KeyError("score")
        return None if completion == "none" else {"match": float(completion == ground_truth)}


def test_errors_name_the_users_class_and_method(tmp_path):
    """An env's own failure said only ``ConnectionError: ...``, ``RuntimeError: ...``,
    ``TypeError: float() argument must be ... 'NoneType'`` or ``'NoneType' object is not
    iterable``: nothing said which method of which class to look at."""
    rows = [{"prompt": "Say ok.", "ground_truth": "ok"}, {"prompt": "Say ok.", "ground_truth": "ok",
                                                          "init_rollout_args": {"fail": True}}]
    with pytest.raises(Exception, match=r"Broken\.list_tools raised ConnectionError: tool server down"):
        BenchmaxEnv(Broken, rows, env_kwargs={"how": "list_raises"})
    with pytest.raises(Exception, match=r"Broken\.list_tools returned NoneType"):
        BenchmaxEnv(Broken, rows, env_kwargs={"how": "list_none"})

    log = tmp_path / "log.jsonl"
    env_id = register_benchmax_env("audit2/Broken-v0", Broken, rows, env_kwargs={"log": str(log)})
    env = gym.make(env_id)
    with pytest.raises(Exception, match=r"Broken\.init_rollout raised RuntimeError: no workspace left"):
        env.reset(options={"task_index": 1})
    assert [what for what, _ in read_log(log)] == ["init", "cleanup"]  # its rollout is still closed
    info = play(env, "raise")[-1]
    assert "Broken.compute_reward raised KeyError" in info["reward_errors"]["benchmax"]
    info = play(env, "none")[-1]
    assert "Broken.compute_reward returned NoneType" in info["reward_errors"]["benchmax"]
    env.close()

    envs = gym.make_vec(env_id, num_envs=2)
    try:
        _, info = envs.reset(options=[{"task_index": 1}, {"task_index": 0}])
        assert list(info["outcome"]) == ["env_error", None]
        assert "Broken.init_rollout raised RuntimeError: no workspace left" in info["outcome_detail"][0]
    finally:
        envs.close()


def test_tools_listed_as_mcp_tools_or_dicts_are_tools_the_model_calls():
    """An env that lists an MCP server's tools may return them as ``mcp.types.Tool`` or as the
    dicts their JSON is; a dict failed ``gym.make`` with ``'dict' object has no attribute 'name'``."""
    from mcp.types import Tool as McpTool

    class Listed(Plain):
        async def list_tools(self):
            return [McpTool(name="add", description="Add two numbers.",
                            inputSchema={"type": "object", "properties": {"a": {"type": "number"},
                                                                          "b": {"type": "number"}},
                                         "required": ["a", "b"]}),
                    {"name": "echo", "description": "Echo.", "input_schema": {"type": "object"}}]

        async def run_tool(self, rollout_id, tool_name, **tool_args):
            return str(tool_args["a"] + tool_args["b"]) if tool_name == "add" else json.dumps(tool_args)

    env = BenchmaxEnv(Listed, [{"prompt": "Add 2 and 3.", "ground_truth": "5"}])
    obs, _, _, _, info = play(env, call("add", a=2, b=3) + call("echo", x=1))
    env.close()
    assert info["error"] is None and "5" in obs and '{"x": 1}' in obs
    env = BenchmaxEnv(Listed, [{"prompt": "Add 2 and 3.", "ground_truth": "5"}])
    obs, _, _, _, info = play(env, call("add", a="two", b=3))  # its schema holds the model to numbers
    env.close()
    assert info["error"] == "bad_arguments" and "is not of type 'number'" in obs


class Workspaces(PackageBaseEnv):
    """A workspace directory per rollout (as the package's envs keep them, by rollout id, on the
    class), tools that read and write it, every hook logged with the process's pid."""

    system_prompt = "Use the tools, then give the final number in <answer></answer>."
    spaces: dict = {}

    def __init__(self, log, **kwargs):
        self.log = log

    def note(self, *what):
        with open(self.log, "a") as f:
            f.write(json.dumps([os.getpid(), *what]) + "\n")

    def dataset_preprocess(self, example):
        return StandardizedExample(prompt=example["question"], ground_truth=example["answer"].split("####")[-1].strip(),
                                   init_rollout_args={"seed_text": example["question"][:20]})

    async def list_tools(self):
        return [ToolDefinition("calc", "Evaluate arithmetic.", CALC),
                ToolDefinition("write", "Write the scratch file.", {"type": "object", "properties": {
                    "text": {"type": "string"}}, "required": ["text"]}),
                ToolDefinition("read", "Read the scratch file.", {"type": "object", "properties": {}})]

    async def init_rollout(self, rollout_id, **rollout_args):
        space = Path(tempfile.mkdtemp(prefix="audit2-"))
        (space / "scratch.txt").write_text(rollout_args["seed_text"])
        Workspaces.spaces[rollout_id] = space
        self.note("init", rollout_id, str(space))

    async def cleanup_rollout(self, rollout_id):
        self.note("cleanup", rollout_id)
        space = Workspaces.spaces.pop(rollout_id)
        for f in space.iterdir():
            f.unlink()
        space.rmdir()

    async def run_tool(self, rollout_id, tool_name, **tool_args):
        space = Workspaces.spaces[rollout_id]
        if tool_name == "calc":
            return str(eval(tool_args["expr"], {"__builtins__": {}}))  # (a test's own expressions)
        if tool_name == "write":
            (space / "scratch.txt").write_text(tool_args["text"])
            return f"{os.getpid()} {space}"
        return (space / "scratch.txt").read_text()

    async def copy_to_workspace(self, rollout_id, src_path, dst_filename=None):
        pass

    async def copy_from_workspace(self, rollout_id, src_filename, dst_path):
        pass

    async def compute_reward(self, rollout_id, completion, ground_truth, **kwargs):
        found = re.findall(r"<answer>(.*?)</answer>", completion, re.S)
        return {"correct": float(bool(found) and found[-1].strip() == ground_truth)}


GSM8K_ROWS = [json.loads(line) for line in GSM8K.read_text().splitlines()[:2]]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_real_gsm8k_rows_play_in_worker_processes_each_rollout_closed_once(context, tmp_path, request):
    """Rows loaded with ``datasets`` from the shared GSM8K sample, through ``dataset_preprocess``;
    two envs in one worker keep their episodes' workspaces apart, a closed vector env closes
    its episodes' rollouts, and a killed worker's workspaces go with its temp dir."""
    if context == "spawn":  # (this module is not importable there: site-packages has a `tests` package)
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
        request.addfinalizer(lambda: cloudpickle.unregister_pickle_by_value(sys.modules[__name__]))
    rows = load_dataset("json", data_files=str(GSM8K), split="train").select(range(2))
    log = tmp_path / "log.jsonl"
    env_id = register_benchmax_env(f"audit2/GSM8K-{context}-v0", Workspaces, rows, env_kwargs={"log": str(log)})
    answers = [r["answer"].split("####")[-1].strip() for r in GSM8K_ROWS]
    envs = gym.make_vec(env_id, num_envs=2, num_workers=1, context=context)
    try:
        obs, _ = envs.reset(options=[{"task_index": 0}, {"task_index": 1}])
        assert GSM8K_ROWS[0]["question"] in obs[0] and GSM8K_ROWS[1]["question"] in obs[1]
        envs.step([call("write", text="first"), call("write", text="second")])
        obs, *_ = envs.step([call("read"), call("read")])
        assert "first" in obs[0] and "second" in obs[1]  # each episode its own workspace
        obs, *_ = envs.step([call("calc", expr="48 + 48 / 2"), call("calc", expr="12 * 50 / 60")])
        assert "72" in obs[0] and "10" in obs[1]
        _, rewards, terminated, _, _ = envs.step([f"<answer>{answers[0]}</answer>", "<answer>11</answer>"])
        assert terminated.all() and list(rewards) == [1.0, 0.0]
        envs.reset(options=[{"task_index": 1}, {"task_index": 0}])  # then closed mid-episode
    finally:
        envs.close()
    entries = read_log(log)
    opened = [e[2] for e in entries if e[1] == "init"]
    closed = [e[2] for e in entries if e[1] == "cleanup"]
    assert len(opened) == 4 and len(set(opened)) == 4 and sorted(closed) == sorted(opened)

    envs = gym.make_vec(env_id, num_envs=2, num_workers=2, context=context)
    try:
        envs.reset(options=[{"task_index": 0}, {"task_index": 1}])
        obs, *_ = envs.step([call("write", text="x"), call("write", text="y")])
        (pid, space), other = obs[0].split("<tool_response>\n")[1].split()[:2], obs[1]
        assert pid not in other  # one per worker
        os.kill(int(pid), signal.SIGKILL)
        _, rewards, _, _, info = envs.step(["<answer>0</answer>", "<answer>0</answer>"])
        assert info["outcome"][0] == "env_error" and rewards[1] == 0.0
        assert not Path(space).exists()  # what the dead worker's rollout left went with it
    finally:
        envs.close()


MODULE = '''
    import json, os, re
    from benchmax.envs.base_env import BaseEnv
    from benchmax.envs.types import StandardizedExample
    from datasets import load_dataset
    from benchmax_gym import register_benchmax_env

    class LoggedGSM8K(BaseEnv):
        def dataset_preprocess(self, example):
            return StandardizedExample(prompt=example["question"], init_rollout_args={},
                                       ground_truth=example["answer"].split("####")[-1].strip())

        def note(self, *what):
            with open(os.environ["AUDIT2_LOG"], "a") as f:
                f.write(json.dumps([os.getpid(), *what]) + "\\n")

        async def list_tools(self):
            return []

        async def run_tool(self, rollout_id, tool_name, **tool_args):
            raise ValueError("no tools")

        async def init_rollout(self, rollout_id, **rollout_args):
            self.note("init", rollout_id)

        async def cleanup_rollout(self, rollout_id):
            self.note("cleanup", rollout_id)

        async def copy_to_workspace(self, *args, **kwargs):
            pass

        async def copy_from_workspace(self, *args, **kwargs):
            pass

        async def compute_reward(self, rollout_id, completion, ground_truth):
            found = re.findall(r"<answer>(.*?)</answer>", completion)
            return {"correct": float(bool(found) and found[-1] == ground_truth)}

    rows = load_dataset("json", data_files=os.environ["AUDIT2_DATA"], split="train").select(range(3))
    register_benchmax_env("audit2/CliGSM8K-v0", LoggedGSM8K, rows)
'''


def test_the_cli_runs_and_evaluates_it_with_import_closing_every_rollout_once(tmp_path):
    """``--import`` a module that registers the env: ``run`` and ``eval`` (two worker processes,
    k=2) play every task; each rollout id is opened once and closed once, across processes."""
    (tmp_path / "audit2_module.py").write_text(textwrap.dedent(MODULE))
    log = tmp_path / "log.jsonl"
    environ = {**os.environ, "AUDIT2_LOG": str(log), "AUDIT2_DATA": str(GSM8K),
               "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])}
    cli = [sys.executable, "-m", "benchmax_gym", "--import", "audit2_module"]
    run = subprocess.run([*cli, "run", "audit2/CliGSM8K-v0", "--policy", "random", "--json", "--quiet"],
                         capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=240)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    assert summary["episodes"] == 3
    out = tmp_path / "eval"
    ev = subprocess.run([*cli, "eval", "audit2/CliGSM8K-v0", "--policy", "empty", "-k", "2", "--workers", "2",
                         "--out", str(out), "--json", "--quiet", "--no-plots"],
                        capture_output=True, text=True, env=environ, cwd=tmp_path, timeout=240)
    assert ev.returncode == 0, ev.stderr
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(r["outcome"] == "scored" for r in records), records
    entries = read_log(log)
    opened = [e[2] for e in entries if e[1] == "init"]
    closed = [e[2] for e in entries if e[1] == "cleanup"]
    assert len(opened) == 9 and len(set(opened)) == 9 and sorted(closed) == sorted(opened)
    assert len({e[0] for e in entries}) >= 3  # run's process and eval's two workers


def test_a_trainer_adapter_plays_it_token_exact_and_closes_its_rollouts(tmp_path):
    """The adapters' ``make_env`` path (``TokenSession`` over an id, as TRL's rollout and verl's
    agent loop build theirs): the reward is the env's and the rollout closes with the session."""
    from benchmax_gym.adapters import ChatTemplate, TokenSession
    from benchmax_gym.testing.tokenizers import assert_token_exact, model_ids, tiny_tokenizer

    log = tmp_path / "log.jsonl"
    env_id = register_benchmax_env("audit2/TokenGSM8K-v0", Workspaces, GSM8K_ROWS, env_kwargs={"log": str(log)})
    chat = ChatTemplate(tiny_tokenizer())
    session = TokenSession(env_id, chat)
    session.reset(options={"task_index": 0})
    session.step(model_ids(chat, call("calc", expr="48 + 24")))
    last = model_ids(chat, "<answer>72</answer>")
    session.step(last)
    assert session.done and session.episode.reward == 1.0
    assert_token_exact(session, last)
    session.close()
    assert [e[1] for e in read_log(log)] == ["init", "cleanup"]
