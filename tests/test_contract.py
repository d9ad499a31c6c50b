"""One contract for every environment: each registered id, and each way a user builds one
(``tests/matrix_envs.py``), keeps the same promises. A new family meets the bar by being registered.

Every id runs here through each make_vec mode, the CLI, mcp-serve, eval and each trainer adapter;
``tests/test_matrix.py`` runs the custom builds (register_tool_env, BaseEnv, MCP configs) through the runners.
"""

import asyncio
import functools
import io
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import gymnasium as gym
import psutil
import pytest

import benchmax_gym  # noqa: F401  (registers the benchmax/* ids)
from benchmax_gym.core.sandbox import remove_tree
from benchmax_gym.registry import ENVS, env_ids
from benchmax_gym.testing import aplay, play

sys.path.insert(0, str(Path(__file__).parent))
from matrix_envs import CASES, final_reply  # noqa: E402  (registers the matrix/* ids)

BUILTIN = sorted(i for i in env_ids() if i.startswith("benchmax/") and not ENVS[i].client)  # clients: test_openenv.py
DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"
# The ids whose source needs data (a hub download by default) run on the shared samples here.
OFFLINE = {
    "benchmax/Math-GSM8K-v0": {"dataset": str(DATA / "gsm8k" / "train_sample500.jsonl")},
    "benchmax/Math-MATH500-v0": {"dataset": str(DATA / "math500" / "test_first100.jsonl"), "numeric_only": True},
    "benchmax/Excel-SpreadsheetBench-v0": {"dataset": str(DATA / "spreadsheetbench")},
    "benchmax/Wikipedia-HotpotQA-v0": {"dataset": str(DATA / "hotpotqa" / "dev_distractor_100.json")},
}
CUSTOM = [i for i in CASES if i.startswith("matrix/")]
# one tool set for all episodes (an MCP server's, a TRL class's methods): a mixture whose members'
# tools differ refuses those, naming why (tests/test_mix.py)
ONE_TOOLSET = [i for i in BUILTIN if i != "benchmax/Mix-v0"]
FORMATS = ["hermes", "json", "openai", "xml"]


def make(env_id, **kwargs):
    """``gym.make`` with the offline data an id needs (a named dataset id), if any."""
    if env_id in OFFLINE:
        kwargs["task_args"] = OFFLINE[env_id]
    return gym.make(env_id, **kwargs)


def test_every_registered_id_makes_offline_with_no_argument_or_its_sample():
    for env_id in BUILTIN:
        if env_id not in OFFLINE:
            gym.make(env_id).close()  # the default source is offline
        else:
            with pytest.raises((ConnectionError, ValueError)):  # a hub id (offline here) or a required dataset
                gym.make(env_id)
    assert set(OFFLINE) <= set(BUILTIN)


@pytest.fixture(scope="module")
def _recalc_claim():
    """This module's claim on the process's Excel recalculation worker (``hold_worker``), taken
    by :func:`_keep_recalc_worker`: ``{"release": callable or None}``."""
    claim = {"release": None}
    yield claim
    if claim["release"] is not None:
        claim["release"]()


@pytest.fixture(autouse=True)
def _keep_recalc_worker(_recalc_claim):
    """Every case here keeps the Excel recalculation worker running between its envs, as a trainer
    holding envs does: its start (an interpreter, ~1 CPU-s) is paid once per test process, not per
    Excel env made and closed. Each recalculation still runs in a fresh process forked from it.
    (Its start and stop with an env's make and close are checked with the claim let go: see
    :func:`no_kept_recalc_worker`.)"""
    from benchmax_gym.envs.excel.recalc import hold_worker

    if _recalc_claim["release"] is None:
        _recalc_claim["release"] = hold_worker()


@pytest.fixture
def no_kept_recalc_worker(_recalc_claim, _keep_recalc_worker):
    """The module's claim let go (the worker stopped, if it ran): an env's close must stop the worker
    its episodes started."""
    release, _recalc_claim["release"] = _recalc_claim["release"], None
    if release is not None:
        release()


def scripted(env_id):
    """A policy for envs without a reference solver: the matrix's tool call, then the right answer."""
    kwargs, call, _, _, _ = CASES[env_id]
    replies = [call, final_reply(env_id, kwargs)]
    return lambda obs, info: replies[min(info["turn"], 1)]


def policy_for(env):
    if env.spec.id in CASES and env.spec.id.startswith("matrix/"):
        return scripted(env.spec.id)
    return env.unwrapped.reference_solver()


@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_same_seed_and_actions_give_the_same_transcript_sync_and_async(env_id):
    """Twice sync on one env (a second episode repeats the first), then async on another env (a
    second instance repeats the first's)."""
    transcripts = []
    for runners in (("sync", "sync"), ("async",)):
        env = make(env_id)
        for runner in runners:
            if runner == "sync":
                played = play(env, policy_for(env), seed=3)
            else:
                played = asyncio.run(aplay(env, policy_for(env), seed=3))
            transcripts.append((played.observations, json.dumps(env.unwrapped.messages, default=str), played.reward))
        env.close()
    assert transcripts[0] == transcripts[1] == transcripts[2]


@pytest.mark.parametrize("tool_format", FORMATS)
@pytest.mark.parametrize("env_id", BUILTIN)
def test_the_reference_solver_reaches_full_reward_in_every_format(env_id, tool_format):
    env = make(env_id, tool_format=tool_format)
    for index in (0, 1):
        played = play(env, policy_for(env), options={"task_index": index})
        terminated, info = played.terminated, played.info
        assert terminated and set(info["reward_components"].values()) == {1.0}, (index, info["reward_components"])
    env.close()


def _answer_texts(answer):
    """The distinctive strings of a scalar ground truth (short ones, like '7', occur by chance)."""
    values = list(answer) if isinstance(answer, (list, tuple)) else [answer]
    return [str(v) for v in values if isinstance(v, (str, int, float)) and len(str(v)) >= 5]


def _excel_secrets(task):
    """What the answer workbook holds at the answer cells that neither the input workbook nor the
    request states (a sum to compute, not the labels a request names): the model must work it out."""
    import openpyxl

    from benchmax_gym.envs.excel.grading import expected_values

    source = task.files["workbook.xlsx"]
    book = openpyxl.load_workbook(io.BytesIO(source) if isinstance(source, bytes) else source, read_only=True)
    shown = {str(v) for ws in book.worksheets for row in ws.iter_rows(values_only=True) for v in row if v is not None}
    book.close()
    expected = expected_values(task.answer["workbook"], task.answer["position"])
    return [str(v) for _, _, v in expected
            if v is not None and len(str(v)) >= 5 and str(v) not in shown and str(v) not in task.prompt]


def secrets(env_id, task):
    """The ground truth's distinctive strings. Structured answers (Excel's workbook, MCP's expected
    note) hold parts the prompt states on purpose (the answer range, the note to save); their
    secrets are what the model has to produce."""
    answer = task.answer
    if env_id.startswith("benchmax/Excel"):
        return _excel_secrets(task)
    if isinstance(answer, dict) and "value" in answer:  # MCP-v0's example: the computed number
        return [str(answer["value"])]
    if isinstance(answer, dict):  # a benchmax row: the user's own structure
        return []
    return _answer_texts(answer)


@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_the_ground_truth_never_reaches_obs_or_info_at_reset(env_id):
    env = make(env_id)
    checked = 0
    for index in range(3):
        obs, info = env.reset(options={"task_index": index % len(env.unwrapped.tasks)})
        task = env.unwrapped.episode.task
        hidden = secrets(env_id, task)
        checked += len(hidden)
        shown = obs + json.dumps(info, default=str)
        assert not [s for s in hidden if s in shown], (index, hidden)
        assert json.dumps(info["task_metadata"], default=str) == json.dumps(dict(task.metadata), default=str)
    env.close()
    if env_id in ("benchmax/Excel-v0", "benchmax/MCP-v0"):
        assert checked, "no secret was checked"  # the structured answers are really looked at


@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_a_mistyped_argument_fails_at_make_naming_it(env_id):
    with pytest.raises(TypeError, match=r"'max_turnz' \(did you mean 'max_turns'"):
        make(env_id, max_turnz=3)


# (MCP's system_prompt is its own argument: the others set it themselves)
SETS_ITSELF = [(env_id, name) for env_id in BUILTIN + CUSTOM for name in ("rubric", "toolset", "system_prompt")
               if not (name == "system_prompt" and env_id in ("benchmax/MCP-v0", "matrix/MCPConfig-v0"))]


@pytest.mark.parametrize("env_id, name", SETS_ITSELF)
def test_an_argument_the_env_sets_itself_fails_at_make_naming_it(env_id, name):
    """(Python's "ToolEnv.__init__() got multiple values for keyword argument 'system_prompt'".)"""
    with pytest.raises(TypeError, match=rf"(sets {name} itself|was registered with its own {name}), so gym.make "
                                        r"does not take it") as raised:
        make(env_id, **{name: object()})
    assert "multiple values" not in str(raised.value)


@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_check_env_and_close_leave_no_process_or_temporary_directory(env_id, monkeypatch, no_kept_recalc_worker):
    from gymnasium.utils.env_checker import check_env

    # A temp root of this test's own: other processes on the machine may use /tmp meanwhile.
    temp = Path(tempfile.mkdtemp(prefix="contract-"))
    temp.chmod(0o711)  # a sandbox's unprivileged uid must reach its workspace inside
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setenv("TMPDIR", str(temp))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    try:
        env = make(env_id)
        # gym.make adds no OrderEnforcing (nor the passive checker): the engine refuses a step first
        with pytest.raises(gym.error.ResetNeeded):
            env.step("hello")
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the checker's warnings are failures too
            check_env(env.unwrapped, skip_render_check=True)
            checked = make(env_id, disable_env_checker=False)  # the passive checker still passes, when asked for
            obs, info = checked.reset(seed=0, options={"task_index": 0})
            checked.step(policy_for(checked)(obs, info))
            checked.close()
        play(env, policy_for(env), options={"task_index": 0})
        env.close()
        left = {p for p in psutil.Process().children(recursive=True) if p.pid not in before}
        assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE], [p.cmdline() for p in left]
        # only the (empty) parent of sandbox workspaces may stay
        leftover = [p for p in temp.rglob("*") if not (p.name.startswith("benchmax-gym-") and not any(p.iterdir()))]
        assert leftover == [], leftover
    finally:
        remove_tree(temp)


# -- every registered id through every runner --------------------------------------------------

CLI = [sys.executable, "-m", "benchmax_gym"]


def _env_args(env_id):
    return ["--env-arg", f"task_args={json.dumps(OFFLINE[env_id])}"] if env_id in OFFLINE else []


@pytest.mark.parametrize("mode", ["sync", "async", "subprocess"])
@pytest.mark.parametrize("env_id", BUILTIN)
def test_every_id_runs_in_every_make_vec_mode(env_id, mode):
    how = {} if mode == "subprocess" else {"vectorization_mode": mode}
    kwargs = {"task_args": OFFLINE[env_id]} if env_id in OFFLINE else {}
    envs = gym.make_vec(env_id, num_envs=2, **how, **kwargs)
    try:
        obs, info = envs.reset(seed=0)
        assert len(obs) == 2 and all(isinstance(o, str) and o for o in obs)
        obs, reward, terminated, truncated, info = envs.step(["I am done.", "I am done."])  # a final reply, graded
        assert terminated.all() and len(reward) == 2
        if mode == "subprocess":  # ready-first (send / recv): each env goes on as soon as it is back
            envs.send(["", ""], [0, 1])  # (NEXT_STEP: this step resets the two finished episodes)
            obs, _, terminated, _, _, ids = envs.recv(min_ready=2)
            assert sorted(ids) == [0, 1] and not terminated.any() and all(isinstance(o, str) and o for o in obs)
            for i in (1, 0):
                envs.send(["I am done."], [i])
            back = []
            while len(back) < 2:
                _, reward, terminated, _, info, ids = envs.recv(min_ready=1)
                assert terminated.all() and len(reward) == len(ids) and info["scored"].all(), info
                back += [int(i) for i in ids]
            assert sorted(back) == [0, 1]
    finally:
        envs.close()


@pytest.mark.parametrize("env_id", BUILTIN)
def test_every_id_runs_from_the_cli_with_its_solver(env_id, capsys):
    """In this process (``main`` is the command's whole work): the command itself, a new
    interpreter, runs in tests/test_cli.py (``run benchmax/Math-v0``, ``benchmax/MCP-v0``,
    ``--env-arg task_args...``) and in test_every_id_serves_its_tools_over_mcp below."""
    from benchmax_gym.cli import main

    status = main(["run", env_id, "--policy", "solver", "--episodes", "1", "--json", "--quiet", *_env_args(env_id)])
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    assert json.loads(out.strip().splitlines()[-1])["mean_reward"] == pytest.approx(1.0)


@pytest.mark.parametrize("env_id", ONE_TOOLSET)
def test_every_id_serves_its_tools_over_mcp(env_id):
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    async def tools():
        server = StdioServerParameters(command=CLI[0], args=[*CLI[1:], "mcp-serve", env_id, *_env_args(env_id)])
        async with Client(server) as client:
            return [t.name for t in (await client.list_tools()).tools]

    assert asyncio.run(tools())


@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_every_id_evaluates_with_its_own_policy(env_id):
    from benchmax_gym.eval import evaluate

    policy = scripted(env_id) if env_id in CUSTOM else "solver"
    kwargs = {"task_args": OFFLINE[env_id]} if env_id in OFFLINE else {}
    result = evaluate(env_id, policy, env_kwargs=kwargs, tasks=1, k=2, concurrency=2)
    assert [r["error"] for r in result.records] == [None, None]
    assert [r["success"] for r in result.records] == [True, True]  # full marks, by its own rubric's weights


# -- every id through the trainer adapters, token-exact ----------------------------------------


def _kwargs(env_id):
    return {"task_args": OFFLINE[env_id]} if env_id in OFFLINE else {}


@functools.cache
def _reference(env_id):
    """Task 0 of ``env_id`` solved (envs are deterministic), once per id and process, on one env (an
    MCP server started once): the replies that solve it, a scripted model's, which four adapter
    tests replay; then those replies played through a TokenSession (checked token-exact above),
    the episode the adapters' must equal."""
    from benchmax_gym.adapters import ChatTemplate, TokenSession
    from benchmax_gym.testing.tokenizers import model_ids, tiny_tokenizer

    env = make(env_id)
    played = play(env, policy_for(env), options={"task_index": 0})
    replies = tuple(env.unwrapped.episode_record()["actions"])
    assert set(played.info["reward_components"].values()) == {1.0}
    chat = ChatTemplate(tiny_tokenizer("qwen"))
    session = TokenSession(env, chat)
    session.reset(options={"task_index": 0})
    for reply in replies:
        session.step(model_ids(chat, reply))
    session.close()
    return replies, session.episode


def _replies(env_id):
    return _reference(env_id)[0]


@pytest.mark.parametrize("style", ["qwen", "llama3", "plain", "qwen2.5", "llama3.1"])
@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_every_id_gives_token_exact_episodes_in_each_template_style(env_id, style):
    """Three template styles written here and two real templates (Qwen2.5's, Llama 3.1's)."""
    from benchmax_gym.adapters import ChatTemplate, TokenSession
    from benchmax_gym.testing.tokenizers import assert_token_exact, play_tokens, tiny_tokenizer

    session = TokenSession(make(env_id), ChatTemplate(tiny_tokenizer(style)))
    last = play_tokens(session, policy_for(session.env), seed=0)
    assert set(session.episode.reward_components.values()) == {1.0}
    assert_token_exact(session, last)
    session.close()


@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_every_id_trains_through_skyrl_as_its_generator_drives_it(env_id):
    import skyrl_gym

    import benchmax_gym.adapters.skyrl  # noqa: F401  (registers "benchmax")

    replies = iter(_replies(env_id))
    env = skyrl_gym.make("benchmax", env_config={"env_id": env_id, "env_kwargs": _kwargs(env_id)},
                         extras={"task_index": 0, "max_turns": 10})
    chat_history, metadata = env.init([{"role": "user", "content": "(the dataset's prompt)"}])
    assert chat_history[-1]["role"] == "user" and "(the dataset's prompt)" not in str(chat_history)
    done = False
    while not done:
        action = next(replies)
        out = env.step(action)
        chat_history += [{"role": "assistant", "content": action}, *out["observations"]]
        done = out["done"]
    assert out["reward"] > 0 and set(out["metadata"]["reward_components"].values()) == {1.0}
    metrics = env.get_metrics()
    assert all(metrics[f"reward/{k}"] == 1.0 for k in out["metadata"]["reward_components"])
    env.close()


@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_every_id_trains_through_openrlhfs_own_multi_turn_executor(env_id):
    from benchmax_gym.adapters.openrlhf import make_executor
    from benchmax_gym.testing.tokenizers import ScriptedEngine, tiny_tokenizer

    replies = _replies(env_id)
    tokenizer = tiny_tokenizer("qwen")
    executor = make_executor(env_id, **_kwargs(env_id))()
    engine = ScriptedEngine(tokenizer, lambda prompt_ids, turn: replies[turn])
    out = asyncio.run(executor.execute("(the dataset's prompt)", "0", _SamplingParams(), 8192, tokenizer, engine))
    reference = _reference(env_id)[1]
    assert out["observation_tokens"] == reference.prompt_ids + reference.completion_ids
    offset = len(reference.prompt_ids)
    assert out["action_ranges"] == [(offset + a, offset + b) for a, b in reference.turns]
    assert out["reward"] == reference.reward and out["scores"] == reference.reward
    assert out["extra_logs"] == {"reward": reference.reward, "turns": float(len(reference.turns)), "tool_errors": 0.0,
                                 "truncated": 0.0, "turn_reward": 0.0, **reference.outcome_metrics()}  # (keys every env has: OpenRLHF
    # merges by the first sample's)


class _SamplingParams:
    """What OpenRLHF's executor reads of vLLM's SamplingParams."""

    max_tokens = None
    logprobs = None


@pytest.fixture(scope="module")
def grpo_trainer(tmp_path_factory):
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl import GRPOConfig, GRPOTrainer

    from benchmax_gym.adapters.trl import TRLRollout
    from benchmax_gym.testing.tokenizers import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer("qwen")
    rollout = TRLRollout("benchmax/Math-v0", tokenizer)
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("grpo")), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4096, max_steps=1, report_to=[], use_cpu=True, save_strategy="no")
    trainer = GRPOTrainer(model=tiny_model(tokenizer), reward_funcs=rollout.reward, args=args,
                          train_dataset=rollout.dataset(4), rollout_func=rollout, processing_class=tokenizer)
    yield trainer
    rollout.close()
    remove_tree(args.output_dir)


@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_every_id_rolls_out_through_trls_rollout_func(env_id, grpo_trainer):
    from benchmax_gym.adapters.trl import TRLRollout
    from benchmax_gym.testing.tokenizers import model_ids

    replies = _replies(env_id)
    turn = {}

    def scripted(trainer, sessions):
        ids = []
        for s in sessions:
            turn[id(s)] = turn.get(id(s), -1) + 1
            ids.append(model_ids(s.chat, replies[turn[id(s)]]))
        return ids, [[-1.0] * len(i) for i in ids]

    rollout = TRLRollout(env_id, grpo_trainer.processing_class, env_kwargs=_kwargs(env_id), generate=scripted)
    prompts = list(rollout.dataset(1)["prompt"]) * 2  # one task, two generations
    out = rollout(prompts, grpo_trainer)
    rollout.close()
    reference = _reference(env_id)[1]
    assert out["prompt_ids"] == [reference.prompt_ids] * 2
    assert out["completion_ids"] == [reference.completion_ids] * 2
    assert out["env_mask"] == [reference.loss_mask] * 2
    assert out["env_reward"] == [reference.reward] * 2
    assert [sum(lp) for lp in out["logprobs"]] == [-float(sum(reference.loss_mask))] * 2
    logged = grpo_trainer._metrics["train"]
    assert all(logged[f"env/reward/{k}"][-1] == 1.0 for k in reference.reward_components)


@pytest.mark.parametrize("env_id", BUILTIN + CUSTOM)
def test_every_id_runs_as_a_verl_agent_loop(env_id):
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.workers.rollout.replica import TokenOutput

    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    replies = iter(_replies(env_id))
    tokenizer = tiny_tokenizer("qwen")

    class Server:
        async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
            ids = tokenizer.encode(next(replies), add_special_tokens=False) + [tokenizer.eos_token_id]
            return TokenOutput(token_ids=ids, log_probs=[-1.0] * len(ids))

    config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"prompt_length": 8192, "response_length": 8192}},
                               "data": {}})

    async def trajectory():  # as verl's AgentLoopWorker does: built and run inside its event loop
        loop = hydra.utils.instantiate(
            config={"_target_": "benchmax_gym.adapters.verl.BenchmaxAgentLoop", "env_id": env_id,
                    "env_kwargs": _kwargs(env_id)},
            trainer_config=DictConfigWrap(config), server_manager=Server(), tokenizer=tokenizer, processor=None,
            hf_model_type=None, dataset_cls=None, data_config=DictConfigWrap(config.data), tools=ToolListWrap([]))
        return await loop.run({}, extra_info={"task_index": 0})

    out = asyncio.run(trajectory())
    reference = _reference(env_id)[1]
    assert (out.prompt_ids, out.response_ids, out.response_mask) == (
        reference.prompt_ids, reference.completion_ids, reference.loss_mask)
    assert out.reward_score == reference.reward
    assert all(out.extra_fields["reward_components"][k] == 1.0 for k in reference.reward_components)


@pytest.mark.parametrize("env_id", ONE_TOOLSET + CUSTOM)
def test_every_ids_tools_become_typed_documented_methods_for_trls_environment_factory(env_id):
    from transformers.utils import get_json_schema

    from benchmax_gym.adapters.trl import trl_environment

    Env = trl_environment(env_id, **_kwargs(env_id))
    env = make(env_id, tools_in_prompt=False)
    env.reset(seed=0)
    schemas = {s["function"]["name"]: s["function"] for s in env.unwrapped.tool_schemas}
    env.close()
    instance = Env()
    for name, schema in schemas.items():
        made = get_json_schema(getattr(instance, name))["function"]
        params = schema.get("parameters", {})
        assert set(made["parameters"]["properties"]) == set(params.get("properties", {}))
        assert set(made["parameters"].get("required", [])) == set(params.get("required", []))
        for arg, spec in params.get("properties", {}).items():
            if spec.get("type") in ("string", "integer", "number", "boolean", "array", "object"):
                assert made["parameters"]["properties"][arg]["type"] == spec["type"], (name, arg)
    instance.env.close()
