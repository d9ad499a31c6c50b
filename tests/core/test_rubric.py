"""The one answer rule every family shares (core.rubric.final_answer), held per family."""

import re

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401

FAMILIES = [  # id, gym.make arguments, the component that grades the answer
    ("benchmax/Math-v0", {"python_tool": False}, "correct"),
    ("benchmax/CRM-v0", {"task_types": ["handle_time"]}, "correct"),
    ("benchmax/Wikipedia-v0", {}, "f1"),
    ("benchmax/MCP-v0", {}, "answer"),
]
_GIVEN = re.compile(r"<answer>(.*?)</answer>|\\boxed\{(.*)\}", re.DOTALL)


def _final_score(env_id, kwargs, component, rewrite):
    """Play the reference solver to its final reply, send ``rewrite(answer)`` instead; the score."""
    env = gym.make(env_id, **kwargs)
    try:
        solver = env.unwrapped.reference_solver()
        obs, info = env.reset(seed=0)
        while True:
            action = solver(obs, info)
            given = _GIVEN.search(action)
            if given and "tool_call" not in action:
                break
            obs, _, terminated, truncated, info = env.step(action)
            assert not (terminated or truncated)
        _, _, terminated, _, info = env.step(rewrite((given[1] or given[2]).strip()))
        assert terminated
        return info["reward_components"][component]
    finally:
        env.close()


@pytest.mark.parametrize("env_id, kwargs, component", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_a_reply_without_answer_tags_scores_0_in_every_family(env_id, kwargs, component):
    assert _final_score(env_id, kwargs, component, lambda answer: f"<answer>{answer}</answer>") == 1.0
    assert _final_score(env_id, kwargs, component, lambda answer: answer) == 0.0
    assert _final_score(env_id, kwargs, component, lambda answer: f"The answer is {answer}.") == 0.0
    assert _final_score(env_id, kwargs, component, lambda answer: f"<answer>{answer}") == 0.0  # unclosed


@pytest.mark.timeout(60)  # a hang guard: linear grading takes well under a second
@pytest.mark.parametrize("junk", ["<answer>", "\\boxed{", "<ANSWER>x</answer"])
def test_grading_a_hostile_reply_is_linear(junk):
    """2M characters of unclosed answer tags or boxes grade at once (a lazy regex or a brace
    walk per opening took minutes for 256k, so hours for these) and score 0."""
    env = gym.make("benchmax/Math-v0", max_action_chars=2_100_000, python_tool=False)
    env.reset(seed=0)
    _, reward, terminated, _, _ = env.step(junk * (2_048_000 // len(junk)))
    assert terminated and reward == 0
    env.close()
