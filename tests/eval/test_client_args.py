"""An endpoint's client arguments are checked where they are given: ChatPolicy, LLMUser and
JudgeRubric (which make one) refuse a bad one in their constructor, naming it. Each used to be
taken and to fail every episode or judged reward later (a TypeError, the SDK's ValueError,
httpx's "Invalid type for url"; a NaN temperature read as a reply that is not JSON)."""

import math

import pytest

from benchmax_gym.core.judge import JudgeRubric
from benchmax_gym.core.users import LLMUser
from benchmax_gym.eval.policies import ChatPolicy

URL = "http://127.0.0.1:9/v1"
BAD = [
    ("base_url", 5, r"base_url 5: expected http\(s\)://HOST\[:PORT\]/v1, e\.g\. http://localhost:8000/v1"),
    ("base_url", "not a url", r"base_url 'not a url': expected http\(s\)://HOST\[:PORT\]/v1"),
    ("base_url", "http://127.0.0.1:abc/v1", r"base_url .*: not a valid URL \(its port is not a number\)"),
    ("base_url", "http://127.0.0.1:99999/v1", r"base_url .*: not a valid URL \(Port out of range"),
    ("timeout", "x", "timeout must be a positive number up to .* seconds, got 'x'"),
    ("timeout", -1, "timeout must be a positive number up to .* seconds, got -1"),
    ("timeout", math.inf, "timeout must be a positive number up to .* seconds, got inf"),
    ("max_retries", -3, "max_retries must be an int from 0 to 100, got -3"),
    ("max_retries", 2.0, "max_retries must be an int from 0 to 100, got 2.0"),
    ("max_retries", True, "max_retries must be an int from 0 to 100, got True"),
    ("temperature", math.nan, "temperature must be a finite number, 0 or more, got nan"),
    ("temperature", -0.5, "temperature must be a finite number, 0 or more, got -0.5"),
    ("temperature", "hot", "temperature must be a finite number, 0 or more, got 'hot'"),
    ("max_tokens", 0, "max_tokens must be an int from 1 to 1000000, got 0"),
    ("extra_body", 5, "extra_body must be a dict, got 5"),
    ("extra_body", [("top_k", 5)], r"extra_body must be a dict, got \[\('top_k', 5\)\]"),
    ("api_key", 12345678, r"api_key must be a string \(None: \$OPENAI_API_KEY\), got int$"),
]


@pytest.mark.parametrize("key, value, says", BAD)
def test_chat_policy_refuses_a_bad_argument_naming_it(key, value, says):
    with pytest.raises(ValueError, match=f"^{says}"):
        ChatPolicy("m", **{"base_url": URL, key: value})


@pytest.mark.parametrize("key, value, says", [
    ("model", "", "model must be a non-empty string, got ''"),
    ("model", None, "model must be a non-empty string, got None"),
    ("top_p", 0, "top_p must be a positive number up to 1, got 0"),
    ("native_tools", "no", "native_tools must be True or False, got 'no'"),
    ("max_reply_bytes", 0, "max_reply_bytes must be a positive int, got 0"),
])
def test_chat_policy_refuses_its_own_bad_arguments(key, value, says):
    with pytest.raises(ValueError, match=f"^{says}"):
        ChatPolicy(**{"model": "m", "base_url": URL, key: value})


@pytest.mark.parametrize("key, value, says", [*BAD, ("instructions", 5, "instructions must be text")])
def test_llm_user_refuses_a_bad_argument_naming_it(key, value, says):
    with pytest.raises(ValueError, match=f"^LLMUser: {says}"):
        LLMUser(**{"model": "m", "base_url": URL, key: value})


@pytest.mark.parametrize("key, value, says", BAD)
def test_a_judge_refuses_a_bad_argument_naming_it(key, value, says, tmp_path):
    """(Its client is made at the first request: each failed every judged episode instead.)"""
    with pytest.raises(ValueError, match=f"^{says}"):
        JudgeRubric("judge", **{"base_url": URL, "cache_dir": tmp_path, key: value})


def test_good_arguments_are_kept_as_given(tmp_path):
    policy = ChatPolicy("m", base_url="https://api.example.com:8443/v1", temperature=0, top_p=1, max_tokens=64,
                        timeout=5, max_retries=0, extra_body={"top_k": 5}, api_key="")
    assert (policy.temperature, policy.timeout, policy.max_retries) == (0, 5, 0)
    user = LLMUser(model="m", base_url=None, temperature=1.5, instructions="", extra_body=None)
    assert user.temperature == 1.5 and user.instructions == ""
    judge = JudgeRubric("judge", URL, temperature=0, cache_dir=tmp_path)
    assert judge.sampling == {"temperature": 0}  # (part of the cache key: not made 0.0)
