"""Every family's dense signal (``dense_rewards=True``, issue 30): off by default, earned by the
reference solver, and impossible to farm: the same action again earns nothing, and all the dense
rewards of an episode stay below what solving it pays."""

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym.core.env import DENSE_WEIGHT

FAMILIES = [  # id, gym.make arguments
    ("benchmax/Math-v0", {"python_tool": False}),
    ("benchmax/Excel-v0", {"python_tool": False}),
    ("benchmax/CRM-v0", {}),
    ("benchmax/Wikipedia-v0", {}),
    ("benchmax/MCP-v0", {}),
]


def _play_twice(env, seed):
    """The reference solver's episode with each tool-calling action sent twice in a row; the
    rewards of first sends, of repeats, and the final step."""
    solver = env.unwrapped.reference_solver()
    obs, info = env.reset(seed=seed)
    first, again = [], []
    while True:
        action = solver(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            return first, again, reward, info
        first.append(reward)
        _, reward, terminated, truncated, info_again = env.step(action)
        assert not (terminated or truncated)
        again.append(reward)
        assert info_again["reward_components"]["dense"] == 0.0


@pytest.mark.parametrize("env_id, kwargs", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_dense_signal_pays_once_and_stays_below_the_final_reward(env_id, kwargs):
    env = gym.make(env_id, dense_rewards=True, max_turns=60, **kwargs)
    try:
        assert "dense" in env.unwrapped.rubric.names and "per-turn" in repr(env.unwrapped.rubric)
        earned = 0.0
        for seed in range(3):
            first, again, final_step, info = _play_twice(env, seed)
            assert info["outcome"] == "scored" and info["reward_components"]["dense"] <= 1.0
            assert all(r == 0.0 for r in again), again  # the same action twice: nothing the second time
            dense = sum(first)
            assert 0.0 <= dense <= DENSE_WEIGHT + 1e-9 < env.unwrapped.rubric.max_reward
            # the final step pays the final reward (solved: the maximum) plus its own dense value
            assert final_step >= env.unwrapped.rubric.max_reward - 1e-9
            earned += dense
        assert earned > 0  # the solver's path reaches milestones: the signal is there
    finally:
        env.close()


@pytest.mark.parametrize("env_id, kwargs", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_dense_rewards_are_off_by_default(env_id, kwargs):
    env = gym.make(env_id, **kwargs)
    try:
        assert not env.unwrapped.rubric.per_turn and "dense" not in env.unwrapped.rubric.names
        solver = env.unwrapped.reference_solver()
        obs, info = env.reset(seed=0)
        rewards = []
        while True:
            obs, reward, terminated, truncated, info = env.step(solver(obs, info))
            rewards.append(reward)
            if terminated or truncated:
                break
        assert rewards[:-1] == [0.0] * (len(rewards) - 1) and "reward_components" in info
    finally:
        env.close()


def test_spamming_one_action_earns_at_most_the_cap():
    """A policy repeating the one call that reaches a milestone, turn after turn, earns it once."""
    env = gym.make("benchmax/Math-v0", python_tool=False, dense_rewards=0.3, max_turns=30)
    obs, info = env.reset(seed=1)
    step = env.unwrapped.episode.task.solution[0]
    action = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{step}"}}}}</tool_call>'
    total, truncated = 0.0, False
    while not truncated:
        _, reward, terminated, truncated, info = env.step(action)
        total += reward if not truncated else 0.0
    assert 0 < total <= 0.3 / len(env.unwrapped.episode.task.solution) + 1e-9
    env.close()


@pytest.mark.parametrize("value", [1.0, 5, -0.1, "yes"])
def test_dense_rewards_must_stay_below_the_final_reward(value):
    with pytest.raises(ValueError, match="dense_rewards"):
        gym.make("benchmax/Math-v0", python_tool=False, dense_rewards=value)


@pytest.mark.parametrize("weights", [{"correct": 0.1, "format": 0.0}, {"dense": 5.0}])
def test_dense_rewards_stay_below_the_final_reward_as_reward_weights_weigh_them(weights):
    with pytest.raises(ValueError, match="dense_rewards must be below the final reward's maximum"):
        gym.make("benchmax/Math-v0", python_tool=False, dense_rewards=0.2, reward_weights=weights)
    env = gym.make("benchmax/Math-v0", python_tool=False, dense_rewards=0.2, reward_weights={"dense": 0.5})
    assert [f.weight for f in env.unwrapped.rubric.turn_funcs] == [0.5]  # (below the final maximum: allowed)
    env.close()


def test_a_user_server_has_no_dense_signal_of_its_own():
    from benchmax_gym.envs.mcp.env import EXAMPLE_SERVER

    with pytest.raises(ValueError, match="dense_rewards.*per-turn component"):
        gym.make("benchmax/MCP-v0", server=EXAMPLE_SERVER, tasks=[{"prompt": "p", "answer": "a"}],
                 reward=lambda completion: 1.0, dense_rewards=True)


def test_per_turn_rewards_come_back_from_vector_workers():
    """Workers step the same engine: each step's per-turn reward is in the batch's rewards."""
    twin = gym.make("benchmax/Math-v0", python_tool=False)
    twin.reset(options={"task_index": 3})
    steps = twin.unwrapped.episode.task.solution
    twin.close()
    envs = gym.make_vec("benchmax/Math-v0", num_envs=2, python_tool=False, dense_rewards=True)
    try:
        envs.reset(seed=0, options={"task_index": 3})
        action = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{steps[0]}"}}}}</tool_call>'
        first = envs.step([action, "<tool_call>not json</tool_call>"])
        again = envs.step([action, action])
        share = DENSE_WEIGHT / len(steps)
        assert list(first[1]) == pytest.approx([share, 0.0]) and list(again[1]) == pytest.approx([0.0, share])
    finally:
        envs.close()


def test_math_reads_python_output_and_refuses_a_list_of_guesses():
    from benchmax_gym.core.tasks import Task
    from benchmax_gym.envs.math.rubric import intermediate_values

    task = Task("t", "q", "0.5", solution=["1 / 3", "1 / 3 + 1 / 6"])
    from types import SimpleNamespace

    episode = SimpleNamespace(state={})

    def reached(name, text):
        return intermediate_values(task, episode, [{"name": name, "arguments": {}}], [text])

    assert reached("calculator", "0.333333333333") == ([0], 2)  # as the calculator prints it
    assert reached("python", "0.3333333333333333\n") == ([0], 2)  # python's repr, within rounding
    assert reached("python", "0.5") == ([1], 2)
    assert reached("python", "0.5 0.333333333333")[0] == []  # many candidates in one output: nothing
    assert reached("calculator", "0.5000001")[0] == [] and reached("read_file", "0.5")[0] == []
