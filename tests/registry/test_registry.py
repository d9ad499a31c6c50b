"""Registration with Gymnasium: ids, make, make_vec, check_env, user-registered environments."""

import contextlib
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import benchmax_gym
from benchmax_gym import registry


def test_every_builtin_id_is_registered_on_import():
    assert "benchmax/Math-v0" in registry.env_ids()
    for env_id in registry.ENVS:
        assert env_id in gym.registry


def test_module_prefixed_make_works_without_prior_import():
    code = (
        "import sys, gymnasium as gym\n"
        "assert 'benchmax_gym' not in sys.modules\n"
        "env = gym.make('benchmax_gym:benchmax/Math-v0')\n"
        "obs, info = env.reset(seed=0)\n"
        "print(type(env.unwrapped).__name__, info['task_id'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("MathEnv ")


def test_pprint_registry_lists_the_namespace(capsys):
    gym.pprint_registry()
    assert "benchmax" in capsys.readouterr().out
    assert "Math-v0" in gym.pprint_registry(disable_print=True)


def test_make_vec_sync():
    envs = gym.make_vec("benchmax/Math-v0", num_envs=4, vectorization_mode="sync")
    obs, info = envs.reset(seed=0)
    assert len(obs) == 4 and len(set(obs)) == 4  # distinct seeds, distinct tasks
    action = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    obs, reward, terminated, truncated, info = envs.step(np.array([action] * 4, dtype=object))
    assert all("42" in o for o in obs)
    assert not terminated.any() and not truncated.any() and (reward == 0).all()
    envs.close()


def test_bad_make_argument_is_named():
    with pytest.raises(ValueError, match="max_turns"):
        gym.make("benchmax/Math-v0", max_turns=-1)
    with pytest.raises(ValueError, match="tool_format"):
        gym.make("benchmax/Math-v0", tool_format="yaml")
    with pytest.raises(TypeError, match="not_an_option"):
        gym.make("benchmax/Math-v0", not_an_option=1)
    for option in ("info_timings", "tools_in_prompt"):  # (a string "false" is true)
        with pytest.raises(ValueError, match=f"{option} must be True or False"):
            gym.make("benchmax/Math-v0", **{option: "false"})


@pytest.mark.parametrize("kwargs, error, names", [
    ({"tools": None}, TypeError, "tools must be a list"),
    ({"tools": "lookup"}, TypeError, "tools must be a list"),
    ({"tools": [5]}, TypeError, "a tool must be a Tool or a typed, documented function, got 5"),
    ({"tasks": None}, ValueError, "tasks must be a TaskSource"),
    ({"tasks": 3}, ValueError, "tasks must be a TaskSource"),
    # a path was iterated as tasks: "tasks[0] must be a Task or a dict ... got 't'"
    ({"tasks": "tasks.jsonl"}, ValueError, r"got the path 'tasks.jsonl': read a JSON Lines file with "
                                           r"tasks=benchmax_gym.data.load_tasks\(path\)"),
    ({"tasks": Path("tasks.jsonl")}, ValueError, "tasks must be a TaskSource .* got the path PosixPath"),
])
def test_register_tool_env_names_the_bad_argument(kwargs, error, names):
    def lookup(city: str) -> str:
        """Look a city up.

        Args:
            city: its name
        """
        return city

    given = {"tools": [lookup], "tasks": [{"prompt": "p", "answer": "a"}], "rubric": lambda completion: 0.0, **kwargs}
    with pytest.raises(error, match=names):
        benchmax_gym.register_tool_env("test/BadArgs-v0", **given)


def test_register_tool_env_in_one_call():
    def lookup(city: str) -> str:
        """Look up a city's country.

        Args:
            city: the city's English name
        """
        return {"Paris": "France", "Lima": "Peru"}.get(city, "unknown")

    def correct(completion: str, answer: str) -> float:
        return float(answer.lower() in completion.lower())

    env_id = benchmax_gym.register_tool_env(
        "testing/Geo-v0",
        tools=[lookup],
        tasks=[{"prompt": "Which country is Lima in?", "answer": "Peru"}],
        rubric=[correct],
        system_prompt="Answer geography questions.",
        max_turns=3,
    )
    assert env_id in registry.env_ids()
    env = gym.make(env_id)
    obs, info = env.reset(seed=0)
    assert "Lima" in obs and "the city's English name" in obs
    assert env.unwrapped.max_turns == 3
    obs, *_ = env.step('<tool_call>{"name": "lookup", "arguments": {"city": "Lima"}}</tool_call>')
    assert "Peru" in obs
    _, reward, terminated, _, _ = env.step("It is in Peru.")
    assert terminated and reward == 1.0
    assert gym.make(env_id, max_turns=7).unwrapped.max_turns == 7  # defaults stay overridable


def test_a_tasks_file_is_read_by_load_tasks_as_the_refusal_says(tmp_path):
    from benchmax_gym.data import load_tasks

    path = tmp_path / "tasks.jsonl"
    path.write_text('{"prompt": "Say hi.", "answer": "hi"}\n')
    env_id = benchmax_gym.register_tool_env("testing/FromFile-v0", tools=[], tasks=load_tasks(path),
                                            rubric=lambda completion: 0.0)
    try:
        env = gym.make(env_id)
        assert "Say hi." in env.reset(seed=0)[0]
        env.close()
    finally:
        gym.registry.pop(env_id, None)
        registry.ENVS.pop(env_id, None)


@pytest.mark.parametrize("register", ["register_tool_env", "register_mix"])
@pytest.mark.parametrize("env_id", ["benchmax/Math-v0", "benchmax/Mix-v0", "benchmax/Math-GSM8K-v0"])
def test_a_builtin_id_is_not_replaced_by_a_registration(env_id, register):
    """(register_tool_env("benchmax/Math-v0", ...) only had Gymnasium warn, and every gym.make of
    it was then a plain ToolEnv.)"""
    from benchmax_gym.mix import register_mix

    entry_point = gym.spec(env_id).entry_point
    with pytest.raises(ValueError, match=f"env_id '{env_id}' is a benchmax-gym built-in id.*choose another id"):
        if register == "register_tool_env":
            benchmax_gym.register_tool_env(env_id, tools=[], tasks=[{"prompt": "p", "answer": "a"}],
                                           rubric=lambda completion: 0.0)
        else:
            register_mix(env_id, {"benchmax/Math-v0": 1.0})
    assert gym.spec(env_id).entry_point == entry_point == registry.ENVS[env_id].entry_point
    assert entry_point.startswith("benchmax_gym.")


def test_a_users_own_id_may_be_registered_again():
    """(A notebook cell run twice.)"""
    try:
        for answer in ("a", "b"):
            with pytest.warns(UserWarning, match="Overriding") if answer == "b" else contextlib.nullcontext():
                benchmax_gym.register_tool_env("testing/Again-v0", tools=[], tasks=[{"prompt": "p", "answer": answer}],
                                               rubric=lambda completion: 0.0)
        env = gym.make("testing/Again-v0")
        env.reset(seed=0)
        assert env.unwrapped.episode.task.answer == "b"
        env.close()
    finally:
        gym.registry.pop("testing/Again-v0", None)
        registry.ENVS.pop("testing/Again-v0", None)


def test_register_tool_env_rejects_bad_tasks():
    with pytest.raises(ValueError, match="tasks\\[0\\]"):
        benchmax_gym.register_tool_env("testing/Bad-v0", tools=[], tasks=[{"question": "?"}], rubric=[lambda completion: 0.0])


def country(city: str) -> str:
    """Look up a city's country.

    Args:
        city: the city's English name
    """
    return {"Paris": "France", "Lima": "Perú 🇵🇪"}.get(city, "unknown")


def stated(completion: str, answer: str) -> float:
    return float((benchmax_gym.final_answer(completion) or "").casefold() == answer.casefold())


@pytest.mark.parametrize("mode", ["sync", "async", None])
def test_make_vec_runs_envs_registered_in_python(mode):
    """Specs of register_tool_env ids are deep-copied by make_vec and pickled to workers: they
    once held the toolset itself (locks, queues) and failed in every mode."""
    import copy
    import pickle

    env_id = registry.register_tool_env(
        f"test/GeoVec{mode or ''}-v0", tools=[country], tasks=[{"prompt": "Which country is Lima in?", "answer": "Peru"}],
        rubric=[stated], system_prompt="Answer in <answer> tags.", max_turns=3)
    gym.make(env_id).reset(seed=0)  # a made env must not leave unpicklable state behind in the spec
    spec = gym.spec(env_id)
    assert pickle.loads(pickle.dumps(spec)).entry_point == copy.deepcopy(spec).entry_point
    single_obs, _ = gym.make(env_id).reset(seed=0)
    envs = gym.make_vec(env_id, num_envs=2, **({} if mode is None else {"vectorization_mode": mode}))
    try:
        obs, _ = envs.reset(seed=0)
        assert tuple(obs) == (single_obs, single_obs)  # async once returned charset garbage, then ''
        action = '<tool_call>{"name": "country", "arguments": {"city": "Lima"}}</tool_call>'
        obs, rewards, terminated, _, _ = envs.step([action, action])
        assert "Perú 🇵🇪" in obs[0] and "Perú 🇵🇪" in obs[1] and not terminated.any()
        _, rewards, terminated, _, _ = envs.step(["<answer>Peru</answer>", "<answer>France</answer>"])
        assert terminated.all() and list(rewards) == [1.0, 0.0]
    finally:
        envs.close()


def test_a_custom_tasks_grader_data_never_reaches_the_model():
    """Only ``metadata`` is shown; other keys of a task dict are the grader's (task.private)."""
    import json

    def state_matches(task) -> float:
        return float(task.private["expected_state"] == {"saved": "SECRET-STATE-7731"})

    env_id = registry.register_tool_env(
        "test/Private-v0", tools=[country], rubric=[state_matches], system_prompt="Answer.",
        tasks=[{"prompt": "Save it.", "answer": "SECRET-ANSWER-4410", "metadata": {"difficulty": "easy"},
                "expected_state": {"saved": "SECRET-STATE-7731"}}])
    env = gym.make(env_id)
    obs, info = env.reset(seed=0)
    assert info["task_metadata"] == {"difficulty": "easy"}
    seen = [obs, json.dumps(info, default=str)]
    obs, reward, _, _, info = env.step("<answer>done</answer>")
    seen += [obs, json.dumps(info, default=str)]
    assert reward == 1.0
    assert not any("SECRET" in text for text in seen)
    with pytest.raises(ValueError, match=r"tasks\[0\]\['metadata'\] must be a dict"):
        registry.register_tool_env("test/BadMeta-v0", tools=[country], rubric=[state_matches],
                                   tasks=[{"prompt": "x", "metadata": "the answer is 4"}])


def _geo(env_id, **extra):
    def lookup(city: str) -> str:
        """Look up a city's country.

        Args:
            city: the city's English name
        """
        return {"Lima": "Peru"}.get(city, "unknown")

    def correct(completion: str, answer: str) -> float:
        return float(completion.strip() == f"<answer>{answer}</answer>")

    return benchmax_gym.register_tool_env(env_id, tools=[lookup], rubric=[correct], max_turns=3,
                                          tasks=[{"prompt": "Which country is Lima in?", "answer": "Peru"}], **extra)


def test_register_tool_env_takes_a_reference_solver_that_play_uses():
    from benchmax_gym.testing import play

    class Solver:  # solver(env) -> policy, as the built-in families' solvers are
        def __init__(self, env):
            self.env = env

        def __call__(self, obs, info):
            if info["turn"] == 0:
                return '<tool_call>{"name": "lookup", "arguments": {"city": "Lima"}}</tool_call>'
            return f"<answer>{self.env.episode.task.answer}</answer>"

    env = gym.make(_geo("testing/GeoSolved-v0", solver=Solver))
    played = play(env, seed=0)
    assert played.reward == 1.0 and played.terminated and "Peru" in played.observations[1]


def test_play_without_a_solver_says_what_to_pass():
    from benchmax_gym.testing import play

    env = gym.make(_geo("testing/GeoUnsolved-v0"))
    with pytest.raises(NotImplementedError, match="solver="):
        play(env, seed=0)
    assert play(env, lambda obs, info: "<answer>Peru</answer>", seed=0).reward == 1.0


def test_register_tool_env_refuses_a_solver_that_is_not_callable():
    with pytest.raises(TypeError, match="solver"):
        _geo("testing/GeoBadSolver-v0", solver="yes")
