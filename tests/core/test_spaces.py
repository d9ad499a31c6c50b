"""UnicodeText: a Gymnasium text space that contains any natural-language string."""

import copy
import pickle

import gymnasium
import numpy as np
import pytest
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

from benchmax_gym.core.spaces import UnicodeText


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 42.",
        'Héllo, 世界! <tool_call>{"name": "calculator", "arguments": {}}</tool_call>',
        "😀🎉 emoji 👩‍👩‍👧",
        "漢字かなカナ한국어",
        "tabs\tnewlines\n\r nulls\x00 bells\x07 rtl\u202e",
        "\U0010fffe",
        "",
        "x" * 100,
    ],
)
def test_contains_any_string_within_bounds(text):
    space = UnicodeText(100)
    assert space.contains(text)
    assert text in space


@pytest.mark.parametrize("value", [b"bytes", None, 42, 4.2, ["a"], ("a",), np.array(["a"]), {"a": 1}])
def test_rejects_non_strings(value):
    assert not UnicodeText(100).contains(value)


def test_length_bounds():
    space = UnicodeText(5, min_length=2)
    assert not space.contains("")
    assert not space.contains("a")
    assert space.contains("ab")
    assert space.contains("漢字😀ab")  # length is counted in characters, not bytes
    assert not space.contains("abcdef")
    assert UnicodeText(3).contains("")  # min_length defaults to 0
    assert UnicodeText(3).min_length == 0


def test_is_a_gymnasium_text_space():
    space = UnicodeText(10)
    assert isinstance(space, gymnasium.spaces.Text)
    assert isinstance(space, gymnasium.spaces.Space)
    assert space.max_length == 10


def test_invalid_bounds_are_rejected():
    with pytest.raises(ValueError):
        UnicodeText(5, min_length=10)


@pytest.mark.parametrize("max_length, min_length", [(1000, 0), (20, 0), (5, 5), (1, 0), (300, 250)])
def test_samples_are_contained(max_length, min_length):
    space = UnicodeText(max_length, min_length=min_length, seed=123)
    for _ in range(300):
        s = space.sample()
        assert isinstance(s, str)
        assert space.contains(s), (len(s), s[:50])


def test_samples_are_valid_unicode():
    space = UnicodeText(1000, seed=7)
    for _ in range(300):
        s = space.sample()
        s.encode("utf-8")  # no lone surrogates


def test_sample_is_deterministic_after_seed():
    space = UnicodeText(500)
    space.seed(42)
    first = [space.sample() for _ in range(50)]
    space.seed(42)
    again = [space.sample() for _ in range(50)]
    assert first == again
    other = UnicodeText(500, seed=42)
    assert [other.sample() for _ in range(50)] == first
    space.seed(43)
    assert [space.sample() for _ in range(50)] != first


def test_samples_are_varied():
    space = UnicodeText(1000, seed=0)
    samples = [space.sample() for _ in range(300)]
    tool_call_like = [s for s in samples if "<tool_call>" in s or '"name"' in s]
    non_ascii = [s for s in samples if any(ord(c) > 127 for c in s)]
    prose = [s for s in samples if s and s.isascii() and "<tool_call>" not in s and '"name"' not in s]
    assert tool_call_like and non_ascii and prose
    assert len(set(samples)) > 100


def test_sample_with_mask_works_like_text():
    space = UnicodeText(50, seed=1)
    chars = space.character_list
    mask = np.zeros(len(chars), dtype=np.int8)
    allowed = {"漢", "😀", "a"}
    for c in allowed:
        mask[chars.index(c)] = 1
    for _ in range(20):
        s = space.sample(mask=(6, mask))
        assert len(s) == 6
        assert set(s) <= allowed
        assert space.contains(s)
    s = space.sample(mask=(4, None))
    assert len(s) == 4 and set(s) <= set(chars)
    s = space.sample(mask=(None, mask))
    assert set(s) <= allowed and space.contains(s)


def test_sample_with_mask_is_deterministic():
    space = UnicodeText(50)
    space.seed(5)
    a = [space.sample(mask=(None, None)) for _ in range(10)]
    space.seed(5)
    assert [space.sample(mask=(None, None)) for _ in range(10)] == a


def test_equality_and_repr():
    assert UnicodeText(10) == UnicodeText(10)
    assert UnicodeText(10, min_length=2) == UnicodeText(10, min_length=2)
    assert UnicodeText(10) == UnicodeText(10, seed=3)  # the generator is not part of the space
    assert UnicodeText(10) != UnicodeText(11)
    assert UnicodeText(10) != UnicodeText(10, min_length=1)
    assert UnicodeText(10) != gymnasium.spaces.Text(10)
    assert gymnasium.spaces.Text(10) != UnicodeText(10)
    assert UnicodeText(10) != "UnicodeText(0, 10)"
    r = repr(UnicodeText(10, min_length=2))
    assert r.startswith("UnicodeText(")
    assert "2" in r and "10" in r
    assert repr(UnicodeText(10)) != repr(UnicodeText(11))


def test_copy_and_pickle_keep_the_space():
    space = UnicodeText(64, min_length=1, seed=9)
    for clone in (copy.deepcopy(space), pickle.loads(pickle.dumps(space))):
        assert clone == space
        assert clone.contains("ünï")
        assert not clone.contains("")
        # The generator state travels too: the clone samples what the original would.
    clone = copy.deepcopy(space)
    assert [clone.sample() for _ in range(5)] == [space.sample() for _ in range(5)]


def test_jsonable_round_trip():
    space = UnicodeText(64)
    batch = ["a", "漢字😀", ""]
    assert space.from_jsonable(space.to_jsonable(batch)) == batch


def test_a_string_too_long_for_shared_memory_is_refused_and_its_neighbour_kept():
    """AsyncVectorEnv's shared memory holds ``max_length`` characters a row: a longer string (an
    observation wrapper's) overwrote the next environment's observation without a word."""
    space = UnicodeText(5)
    memory = create_shared_memory(space, n=2)
    write_to_shared_memory(space, 1, "bbb", memory)
    with pytest.raises(ValueError, match="9 characters.*5"):
        write_to_shared_memory(space, 0, "a" * 9, memory)
    write_to_shared_memory(space, 0, "ü" * 5, memory)
    assert tuple(read_from_shared_memory(space, memory, n=2)) == ("ü" * 5, "bbb")
