"""What the adapter tests share: a real tokenizer per template style, trained here (no Hub)."""

import os

import pytest

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="session", params=["qwen", "llama3", "plain"])
def tokenizer(request):
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    return tiny_tokenizer(request.param)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    return tiny_tokenizer("qwen")
