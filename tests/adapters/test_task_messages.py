"""Tasks that start from a conversation: the prefix reaches the transcript, chat_messages() and the
token episode exactly (the template renders the prefix once, in the prompt, never re-encoded)."""

import gymnasium as gym
import pytest

import benchmax_gym  # noqa: F401
from benchmax_gym import registry, register_tool_env
from benchmax_gym.adapters import ChatTemplate, TokenSession
from benchmax_gym.testing.tokenizers import assert_token_exact, play_tokens

PREFIX = [
    {"role": "system", "content": "The user is in a hurry."},
    {"role": "user", "content": "What is 17 + 25? Then double it."},
    {"role": "assistant", "content": "Adding first.", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": '{"a": 17, "b": 25}'}}]},
    {"role": "tool", "tool_call_id": "call_a", "content": "42"},
    {"role": "assistant", "content": "17 + 25 = 42."},
    {"role": "user", "content": "Now double it."},
]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first.
        b: the second.
    """
    return a + b


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def solver(env):
    def policy(obs, info):
        if info.get("turn", 0) == 0:
            return '<tool_call>{"name": "add", "arguments": {"a": 42, "b": 42}}</tool_call>'
        return "84"
    return policy


@pytest.fixture
def env_id():
    env_id = register_tool_env("test/Continue-v0", tools=[add], rubric=exact, solver=solver,
                               system_prompt="You are a calculator assistant.",
                               tasks=[{"id": "t1", "messages": PREFIX, "answer": "84"}])
    yield env_id
    gym.registry.pop(env_id, None)
    registry.ENVS.pop(env_id, None)


def test_the_prefix_opens_the_transcript_and_the_system_prompts_merge(env_id):
    env = gym.make(env_id)
    obs, info = env.reset(seed=0)
    messages = info["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert messages[0]["content"].startswith("You are a calculator assistant.")
    assert messages[0]["content"].endswith("The user is in a hurry.")
    assert messages[2]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 17, "b": 25}'}
    # the text observation shows the earlier call as the env's format writes it, and its result
    assert '"name": "add"' in obs and "<tool_response>\n42\n</tool_response>" in obs and obs.endswith("Now double it.")
    env.step('<tool_call>{"name": "add", "arguments": {"a": 42, "b": 42}}</tool_call>')
    _, reward, terminated, _, _ = env.step("84")
    assert reward == 1.0 and terminated
    chat = env.unwrapped.chat_messages()
    assert chat[:6] == [messages[0], *[{**m, "content": m["content"]} for m in PREFIX[1:]]]
    hf = env.unwrapped.chat_messages("hf")
    assert hf[2]["tool_calls"][0]["function"]["arguments"] == {"a": 17, "b": 25}
    env.close()


def test_token_episode_includes_the_prefix_token_exactly(env_id, tokenizer):
    chat = ChatTemplate(tokenizer)
    session = TokenSession(env_id, chat)
    last = play_tokens(session, seed=0)
    assert session.episode.reward == 1.0
    assert_token_exact(session, last)
    # the prefix is in the prompt ids (environment tokens, never in the loss)
    prompt = chat.decode(session.episode.prompt_ids)
    assert "17 + 25 = 42." in prompt and "Now double it." in prompt
    assert len(session.episode.loss_mask) == len(session.episode.completion_ids)
    session.close()


@pytest.mark.parametrize("style", ["qwen2.5", "llama3.1"])  # (Qwen3's rewrites history: see adapters/tokens.py)
def test_token_exact_with_the_real_templates(env_id, style):
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    session = TokenSession(env_id, ChatTemplate(tiny_tokenizer(style)))
    last = play_tokens(session, seed=0)
    assert session.episode.reward == 1.0
    assert_token_exact(session, last)
    session.close()


@pytest.mark.parametrize("env_id", ["benchmax/Math-v0", "benchmax/Wikipedia-v0", "benchmax/CRM-v0"])
def test_every_family_starts_a_task_from_a_conversation(env_id):
    prefix = [{"role": "user", "content": "Earlier question."}, {"role": "assistant", "content": "Earlier answer."},
              {"role": "user", "content": "Follow-up question?"}]
    env = gym.make(env_id, tasks=[{"messages": prefix, "answer": "7"}])
    obs, info = env.reset(seed=0)
    assert [m["content"] for m in info["messages"][1:]] == [m["content"] for m in prefix]
    assert obs.endswith("Follow-up question?")
    env.close()


def test_a_familys_own_part_of_the_prompt_follows_the_conversation():
    """Excel describes the workbook in its prompt: a conversation-only task keeps that description."""
    from benchmax_gym.envs.excel.env import ExcelEnv

    from benchmax_gym import Task

    generated = ExcelEnv()
    source = generated.tasks[0]
    generated.close()
    env = ExcelEnv(tasks=[Task(id="c", prompt="", answer=source.answer, files=source.files,
                               messages=({"role": "user", "content": "Please fix my sheet."},))])
    obs, info = env.reset(seed=0)
    roles = [m["role"] for m in info["messages"]]
    assert roles == ["system", "user", "user"] and info["messages"][1]["content"] == "Please fix my sheet."
    assert "sheet" in info["messages"][2]["content"].lower() and info["messages"][2]["content"].strip()
    env.close()


@pytest.mark.parametrize("messages, says", [
    ([], "non-empty list"),
    ([{"role": "robot", "content": "hi"}], "role in"),
    ([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}], "ends with an assistant turn"),
    ([{"role": "tool", "content": "42"}], "tool_call_id"),
    ([{"role": "user", "content": ["a", "list"]}], "must be text"),
])
def test_a_bad_conversation_fails_at_make_naming_the_task(messages, says):
    with pytest.raises(ValueError, match=says) as caught:
        gym.make("benchmax/Math-v0", tasks=[{"prompt": "ok", "answer": "1"}, {"messages": messages, "answer": "1"}])
    assert "tasks[1]" in str(caught.value)
