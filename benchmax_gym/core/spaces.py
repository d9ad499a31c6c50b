"""A Gymnasium text space for natural language.

``gymnasium.spaces.Text`` only contains strings over a fixed charset (alphanumerics by default),
so it rejects ordinary prose, JSON and tool calls. :class:`UnicodeText` contains any ``str``
within its length bounds, and its ``sample()`` yields the kinds of text an agent writes - random
Unicode, prose, well-formed tool calls and malformed ones - which makes it a useful fuzzer.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Box, Text
from gymnasium.spaces.utils import flatten, flatten_space, unflatten
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory, write_to_shared_memory

# Characters that ``sample(mask=...)`` indexes; contains() does not depend on them.
_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n\téßüñøπλ漢字😀"

_NAMES = ("calculator", "python", "search", "unknown_tool", "", "calc ulator")
_VALUES = ("1+1", "2**10", 3, -7.5, None, True, [], {}, "x" * 40, "\u0000\u202e", "</tool_call>")


class UnicodeText(Text):
    """Any ``str`` of ``min_length``..``max_length`` characters.

    Example::

        >>> space = UnicodeText(max_length=1000)
        >>> space.contains("Héllo, 世界! <tool_call>{}</tool_call>")
        True
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length, min_length=min_length, charset=_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """A random action-like string: Unicode noise, prose, or a (possibly broken) tool call."""
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        rng = self.np_random
        kind = int(rng.integers(6))
        if kind == 0:
            text = self._random_unicode(rng, int(rng.integers(0, 200)))
        elif kind == 1:
            words = ["the", "answer", "is", r"\boxed{42}", "<answer>7</answer>", "so", "we", "compute", "3*4"]
            text = " ".join(words[int(i)] for i in rng.integers(len(words), size=int(rng.integers(1, 30))))
        else:
            text = self._tool_call_like(rng, broken=kind >= 4)
        if len(text) < self.min_length:
            text += "x" * (self.min_length - len(text))
        return text[: self.max_length]

    @staticmethod
    def _random_unicode(rng: np.random.Generator, n: int) -> str:
        # Any code point except surrogates (which are not valid in a UTF-8 str round trip).
        points = rng.integers(0, 0x10FFFF - 0x800, size=n)
        return "".join(chr(int(p) + 0x800 if p >= 0xD800 else int(p)) for p in points)

    @staticmethod
    def _tool_call_like(rng: np.random.Generator, broken: bool) -> str:
        name = _NAMES[int(rng.integers(len(_NAMES)))]
        value = _VALUES[int(rng.integers(len(_VALUES)))]
        key = ("expression", "code", "query", "")[int(rng.integers(4))]
        body = json.dumps({"name": name, "arguments": {key: value}})
        if broken:
            cut = int(rng.integers(1, len(body)))
            body = (body[:cut], body[cut:] + "}}{", body.replace('"', "'"), "{" + body)[int(rng.integers(4))]
        wrappers = (
            "<tool_call>{}</tool_call>",
            "<tool_call>{}",
            "{}",
            "<tool_call><tool_call>{}</tool_call></tool_call>",
            '{{"role": "assistant", "tool_calls": [{{"function": {}}}]}}',
        )
        return wrappers[int(rng.integers(len(wrappers)))].format(body)

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )


# Gymnasium's AsyncVectorEnv passes observations through shared memory. For ``Text`` it stores
# indices into the space's charset (prose outside it came back as garbage) and reads the batch
# once, at construction, as a tuple of str: every later step returned that first batch. A
# UnicodeText row is its length followed by its code points, so any str round-trips, and the
# batch read is a live view whose copy (what AsyncVectorEnv hands out each step) is a tuple of
# the current strings.


class SharedTextBatch(Sequence):
    """A live view of a batch of strings in shared memory; ``copy.deepcopy`` gives a tuple."""

    def __init__(self, rows: np.ndarray):
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        row = self._rows[index]
        return row[1:1 + row[0]].tobytes().decode("utf-32-le", "surrogatepass")

    def __deepcopy__(self, memo) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: Any) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    def __repr__(self) -> str:
        return f"SharedTextBatch({tuple(self)!r})"


@create_shared_memory.register(UnicodeText)
def _create_unicode_shared_memory(space: UnicodeText, n: int = 1, ctx: Any = None):
    import multiprocessing

    return (ctx or multiprocessing).Array("i", n * (space.max_length + 1), lock=True)


@read_from_shared_memory.register(UnicodeText)
def _read_unicode_from_shared_memory(space: UnicodeText, shared_memory: Any, n: int = 1) -> SharedTextBatch:
    return SharedTextBatch(np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape((n, space.max_length + 1)))


@write_to_shared_memory.register(UnicodeText)
def _write_unicode_to_shared_memory(space: UnicodeText, index: int, value: str, shared_memory: Any) -> None:
    codes = np.frombuffer(value.encode("utf-32-le", "surrogatepass"), dtype=np.int32)
    if len(codes) > space.max_length:  # (its row ends there: it would run into the next env's)
        raise ValueError(f"a string of {len(codes)} characters does not fit {space!r}, at most {space.max_length}")
    row = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[index * (space.max_length + 1):]
    row[0] = len(codes)
    row[1:1 + len(codes)] = codes


# ``gymnasium.spaces.utils.flatten`` (FlattenObservation, flattened vector batches) stores a Text
# string as indices into its charset: any character outside UnicodeText's sampling charset (most
# of Unicode, which ``contains`` admits) raised KeyError. A UnicodeText flattens to its code
# points, padded with 0x110000 (no code point), in a Box of ``max_length``.
_PAD = 0x110000


@flatten_space.register(UnicodeText)
def _flatten_unicode_space(space: UnicodeText) -> Box:
    return Box(low=0, high=_PAD, shape=(space.max_length,), dtype=np.int32)


@flatten.register(UnicodeText)
def _flatten_unicode(space: UnicodeText, x: str) -> np.ndarray:
    codes = np.frombuffer(x.encode("utf-32-le", "surrogatepass"), dtype=np.int32)
    if len(codes) > space.max_length:
        raise ValueError(f"a string of {len(codes)} characters does not fit {space!r}, at most {space.max_length}")
    out = np.full(space.max_length, _PAD, dtype=np.int32)
    out[:len(codes)] = codes
    return out


@unflatten.register(UnicodeText)
def _unflatten_unicode(space: UnicodeText, x: np.ndarray) -> str:
    codes = np.asarray(x, dtype=np.int32)
    return codes[codes < _PAD].tobytes().decode("utf-32-le", "surrogatepass")
