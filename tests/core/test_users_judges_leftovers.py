"""Loose ends of simulated users and judges: a seeded LLM user sends its endpoint a seed (a
deterministic server replays the same user), a scripted user's turn is capped like every other
text that enters the transcript, a grader's value is read one way by rubrics and judges (never
quoting it), and a group judge over a vector env reads the task it judges."""

import asyncio
import decimal
import math

import gymnasium as gym
import numpy as np
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym import register_tool_env
from benchmax_gym.core.env import ToolEnv
from benchmax_gym.core.group import GroupRubric, score_vector_group
from benchmax_gym.core.judge import JudgeRubric
from benchmax_gym.core.rubric import Rubric
from benchmax_gym.core.tasks import ListTasks, Task
from benchmax_gym.core.tools import Toolset
from benchmax_gym.core.users import STOP, LLMUser, UserSimulator, UserUsage
from benchmax_gym.testing.openai_server import FakeChatServer, judge_model


# -- 1. a seeded LLM user sends a seed ----------------------------------------------------------


def customer(body):
    return {"content": "My order is 1234."}


def requests_of(user, server, seed, turns=2):
    """The bodies ``user`` sends over ``turns`` turns of one episode whose seed is ``seed``."""
    usage = UserUsage(seed=seed)
    before = len(server.requests)

    async def talk():
        conversation = []
        for turn in range(turns):
            conversation.append({"role": "assistant", "content": f"What is your order number? ({turn})"})
            conversation.append({"role": "user", "content": await user.areply(conversation, None, usage)})
        await user.aclose()

    asyncio.run(talk())
    return server.requests[before:]


def test_a_seeded_episodes_llm_user_sends_a_seed_per_request_the_same_on_replay():
    """vLLM honours ``seed``: without one a seeded episode's user says something else each run."""
    with FakeChatServer(customer) as server:
        user = LLMUser(model="test-model", base_url=server.url, api_key="k", temperature=1.0)
        first, again = requests_of(user, server, 7), requests_of(user, server, 7)
        other = requests_of(user, server, 8)
        unseeded = requests_of(user, server, None)
        pinned = requests_of(LLMUser(model="test-model", base_url=server.url, api_key="k",
                                     extra_body={"seed": 5}), server, 7)
    seeds = [body.get("seed") for body in first]
    assert all(type(s) is int and 0 <= s < 2**31 for s in seeds) and seeds[0] != seeds[1]  # (a turn its own)
    assert [body["seed"] for body in again] == seeds  # the same episode seed: the same requests
    assert [body["seed"] for body in other] != seeds
    assert all("seed" not in body for body in unseeded)  # an unseeded episode stays unseeded
    assert [body["seed"] for body in pinned] == [5, 5]  # the user's own seed wins


# -- 2. a scripted user's turn is capped ---------------------------------------------------------


def lookup(city: str) -> str:
    """Look up a city's country.

    Args:
        city: the city's English name
    """
    return "Peru"


def answered(messages) -> float:
    return float(any(m["role"] == "assistant" and "Peru" in str(m.get("content")) for m in messages))


HUGE = "x" * 50_000_000  # 50 MB of text from a scripted user


def chatty(conversation, task):
    return None if "Peru" in conversation[-1]["content"] else HUGE


def chatty_then_done(conversation, task):
    return HUGE + STOP


class ChattySimulator(UserSimulator):
    def reply(self, conversation, task, usage):
        usage.calls += 1
        return HUGE


def env_with(env_id, user):
    if env_id not in gym.registry:
        register_tool_env(env_id, tools=[lookup], tasks=[{"prompt": "Where am I?", "answer": "Peru"}],
                          rubric=[answered], user=user)
    return gym.make(env_id)


@pytest.mark.parametrize("user", [chatty, ChattySimulator()], ids=["scripted", "subclass"])
@pytest.mark.parametrize("runner", ["step", "astep"])
def test_a_scripted_users_huge_turn_is_cut_with_a_marker_and_the_episode_goes_on(user, runner):
    env = env_with(f"leftovers/Chatty-{type(user).__name__}-v0", user)
    env.reset(seed=0)
    step = env.step if runner == "step" else (lambda a: asyncio.run(env.unwrapped.astep(a)))
    obs, reward, terminated, truncated, info = step("Which city are you in?")
    said = info["messages"][-1]["content"]
    assert (reward, terminated, truncated) == (0.0, False, False) and "outcome" not in info
    assert len(said) == 8_000 and said.startswith("xxx") and "truncated: 49992" in said
    assert obs == said and env.unwrapped.messages[-1]["content"] == said
    if user is chatty:
        _, reward, terminated, _, info = step("You are in Peru.")
        assert terminated and reward == 1.0 and info["outcome"] == "scored"
    env.close()


def test_a_stop_token_after_a_huge_scripted_turn_still_ends_the_conversation():
    env = env_with("leftovers/ChattyDone-v0", chatty_then_done)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("You are in Peru.")
    assert terminated and reward == 1.0 and info["outcome"] == "scored"
    assert len(env.unwrapped.messages[-1]["content"]) == 8_000
    env.close()


def lone_surrogate(conversation, task):
    return None if "Peru" in conversation[-1]["content"] else "I am in Lima \ud800."


def escaped_surrogate(body):
    """An endpoint whose JSON holds the escape ``\\ud800``: it decodes to a lone surrogate."""
    return {"content": "I am in Lima \ud800."}


@pytest.mark.parametrize("kind", ["scripted", "llm"])
def test_a_users_lone_surrogate_never_reaches_the_observation(kind):
    """No UTF-8 encoder takes a lone surrogate (a Hugging Face tokenizer raises): the env shows
    U+FFFD instead, as it does for a tool's output."""
    # (a chunked reply is written by json.dumps, which escapes it: the bytes are valid JSON)
    with FakeChatServer(escaped_surrogate, fault_for=lambda body: {"chunked": 1 << 16}) as server:
        user = lone_surrogate if kind == "scripted" else LLMUser(model="test-model", base_url=server.url, api_key="k")
        env = env_with(f"leftovers/Surrogate-{kind}-v0", user)
        env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step("Which city are you in?")
        env.close()
    shown = [text.encode("utf-8", "backslashreplace") for text in (obs, info["messages"][-1]["content"])]
    assert shown == ["I am in Lima \ufffd.".encode()] * 2  # (bytes: a failure's report must be encodable too)


# -- 3. rubrics and judges read a grader's value alike ------------------------------------------


SECRET_ANSWER = "Canberra-7f3a"
CAPITAL = Task(id="capital", prompt="What is the capital of Australia?", answer=SECRET_ANSWER)


def judged(judge, completion="Canberra-7f3a."):
    env = ToolEnv(tasks=ListTasks([CAPITAL]), toolset=Toolset([]), rubric=Rubric([judge.reward]))
    env.reset(options={"task_index": 0})
    _, reward, terminated, truncated, info = env.step(completion)
    env.close()
    return reward, info


def test_a_judge_parse_that_returns_text_fails_without_quoting_it(tmp_path):
    """The judge's reply may quote the reference answer: what ``parse`` made of it never reaches
    ``info["outcome_detail"]`` (nor eval's records), as a rubric leaf's text never does."""
    with FakeChatServer(judge_model, models=["judge"]) as server:
        judge = JudgeRubric("judge", server.url, parse=lambda text: SECRET_ANSWER, cache_dir=tmp_path)
        reward, info = judged(judge)
    assert math.isnan(reward) and info["outcome"] == "model_error"
    assert "parse returned str, not a number" in info["outcome_detail"]
    assert SECRET_ANSWER not in info["outcome_detail"]


@pytest.mark.parametrize("value", [np.float32(0.5), decimal.Decimal("0.25"), True, 1, None, "0.5", b"1",
                                   float("nan"), -math.inf, 10**400, [0.5]],
                         ids=lambda v: type(v).__name__ + ("-nan" if v != v else ""))
def test_a_rubric_leaf_and_a_judge_parse_take_and_refuse_the_same_values(value, tmp_path):
    env = ToolEnv(tasks=ListTasks([CAPITAL]), toolset=Toolset([]), rubric=Rubric([("leaf", lambda: value, 1.0)]))
    env.reset(options={"task_index": 0})
    _, leaf_reward, _, _, leaf_info = env.step("Canberra.")
    env.close()
    with FakeChatServer(judge_model, models=["judge"]) as server:
        judge_reward, judge_info = judged(JudgeRubric("judge", server.url, parse=lambda text: value,
                                                      cache_dir=tmp_path))
    refused = "leaf" in leaf_info.get("reward_errors", {})
    assert refused == (judge_info["outcome"] == "model_error")
    if refused:  # (a leaf scores 0 and says why; the judge fails the episode, saying the same)
        why = leaf_info["reward_errors"]["leaf"].split(": ", 1)[1]
        assert leaf_reward == 0.0 and why in judge_info["outcome_detail"]
    else:
        assert leaf_reward == judge_reward == float(value)


# -- 4. a group judge over a vector env reads the task ------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "workers"])
def test_a_group_judge_over_a_vector_env_sees_the_question_and_answer(mode, tmp_path):
    """The default group prompt holds the reference answer; without the task the judge sees none
    and scores every reply 0."""
    answer = gym.make("benchmax/Math-v0", python_tool=False).unwrapped.tasks[3].answer
    seen = []

    def plain(task, answer, prompt, completions):
        seen.append((task.id, answer, prompt))
        return [0.0] * len(completions)

    with FakeChatServer(judge_model, models=["judge"]) as server:
        judge = JudgeRubric("judge", server.url, cache_dir=tmp_path)
        group = GroupRubric([("judge", judge.group, 1.0), ("plain", plain, 1.0)], combine="replace")
        kwargs = {"vectorization_mode": "sync"} if mode == "sync" else {"num_workers": 2}
        envs = gym.make_vec("benchmax/Math-v0", num_envs=2, python_tool=False, **kwargs)
        try:
            envs.reset(seed=0, options={"task_index": 3})
            envs.step([f"\\boxed{{{answer}}}", "\\boxed{1}"])
            out = score_vector_group(envs, group)
        finally:
            envs.close()
        question = server.requests[-1]["messages"][-1]["content"]
    assert [r["reward"] for r in out] == [1.0, 0.0] and all("group_errors" not in r for r in out)
    assert f"Reference answer (may be empty):\n{answer}\n" in question
    task = gym.make("benchmax/Math-v0", python_tool=False).unwrapped.tasks[3]
    assert seen == [(task.id, answer, task.prompt)]
