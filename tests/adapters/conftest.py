"""What the adapter tests share: a real tokenizer per template style, trained here (no Hub)."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # launch.py, customer.py: helpers the tests import

from customer import SERVICE  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="session", params=["qwen", "llama3", "plain"])
def tokenizer(request):
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    return tiny_tokenizer(request.param)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    from benchmax_gym.testing.tokenizers import tiny_tokenizer

    return tiny_tokenizer("qwen")


@pytest.fixture(scope="session")
def customer_words():
    """What the simulated customer says in task ``i`` of CRM-Service-v0 when the reference
    solver plays it (the customer is scripted: the same words every time), the opening excluded."""
    import gymnasium as gym

    import benchmax_gym  # noqa: F401
    from benchmax_gym.testing import play

    def words(index):
        env = gym.make(SERVICE)
        play(env, options={"task_index": index})
        said = [m["content"] for m in env.unwrapped.messages[2:] if m["role"] == "user"]
        env.close()
        assert said and "order number is" in said[0]
        return said

    return words
