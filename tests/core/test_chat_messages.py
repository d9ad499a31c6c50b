"""The conversation handed to a model: valid for a chat API (checked with the `openai` SDK's own
types and client) and rendered once-encoded by a chat template (jinja2, offline)."""

import json
import typing

import gymnasium as gym
import httpx
import jinja2
import openai
import pytest
from openai.types.chat import (
    ChatCompletionAssistantMessageParam,
    ChatCompletionSystemMessageParam,
    ChatCompletionToolMessageParam,
    ChatCompletionUserMessageParam,
)

import benchmax_gym  # noqa: F401

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
ALLOWED = {"system": ChatCompletionSystemMessageParam, "user": ChatCompletionUserMessageParam,
           "assistant": ChatCompletionAssistantMessageParam, "tool": ChatCompletionToolMessageParam}


def played(turns):
    env = gym.make("benchmax/Math-v0", python_tool=False)
    env.reset(seed=0)
    for action in turns:
        env.step(action)
    return env


def check_openai_schema(messages):
    """Every key is one the SDK's message type for that role declares, and every tool result
    answers a call of the assistant message before it (what chat servers check)."""
    open_calls: set[str] = set()
    for message in messages:
        keys = set(typing.get_type_hints(ALLOWED[message["role"]]))
        assert set(message) <= keys, (message["role"], set(message) - keys)
        if message["role"] == "assistant":
            open_calls = {c["id"] for c in message.get("tool_calls") or ()}
            for call in message.get("tool_calls") or ():
                assert call["type"] == "function" and isinstance(call["function"]["arguments"], str)
                json.loads(call["function"]["arguments"])
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_calls


def test_the_conversation_after_tool_turns_is_what_a_chat_api_accepts():
    env = played([CALC, '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'])
    messages = env.unwrapped.chat_messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    check_openai_schema(messages)
    messages.append({"role": "user", "content": "mutating the copy"})
    assert len(env.unwrapped.chat_messages()) == 6  # a fresh copy each time


def test_the_readme_loop_with_the_openai_client():
    """The README's loop against the real SDK; the server side checks what a chat server checks."""
    seen = []

    def server(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        check_openai_schema(body["messages"])
        seen.append([m["role"] for m in body["messages"]])
        reply = CALC if len(seen) == 1 else "6*7 = \\boxed{42}"
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}]})

    client = openai.OpenAI(api_key="k", base_url="http://127.0.0.1:9/v1",
                           http_client=httpx.Client(transport=httpx.MockTransport(server)))
    env = gym.make("benchmax/Math-v0", python_tool=False)
    env.reset(seed=0)
    done = False
    while not done:
        reply = client.chat.completions.create(model="m", messages=env.unwrapped.chat_messages())
        _, _, terminated, truncated, _ = env.step(reply.choices[0].message.content)
        done = terminated or truncated
    assert seen == [["system", "user"], ["system", "user", "assistant", "tool"]]


# The lines of a Qwen2.5-style template that render an assistant's tool calls: it applies
# `tojson` to `arguments`, so a JSON string comes out encoded twice.
TEMPLATE = """{%- for message in messages %}
{%- if message.role == "assistant" %}<|im_start|>assistant
{%- if message.content %}{{ message.content }}{% endif %}
{%- for tool_call in message.tool_calls or [] %}
<tool_call>
{"name": "{{ tool_call.function.name }}", "arguments": {{ tool_call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}"""


def test_hf_style_renders_tool_calls_once_encoded():
    env = played([CALC])
    template = jinja2.Environment().from_string(TEMPLATE)
    hf = template.render(messages=env.unwrapped.chat_messages("hf"))
    assert '{"name": "calculator", "arguments": {"expression": "6*7"}}' in hf
    call = hf.split("<|im_start|>assistant")[1].split("<tool_call>\n")[1].split("\n</tool_call>")[0]
    assert json.loads(call) == {"name": "calculator", "arguments": {"expression": "6*7"}}
    doubled = template.render(messages=env.unwrapped.chat_messages("openai"))
    assert '"arguments": "{\\"expression' in doubled  # why the openai style is not for templates
    with pytest.raises(ValueError, match="style"):
        env.unwrapped.chat_messages("chatml")
