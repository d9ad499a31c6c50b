"""What the adapter tests share: a real tokenizer per template style, trained here (no Hub)."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # launch.py: the launch-script helpers

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="session", params=["qwen", "llama3", "plain"])
def tokenizer(request):
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    return tiny_tokenizer(request.param)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    return tiny_tokenizer("qwen")
