"""Batching the workers' results as Gymnasium returns them: observations stacked, infos as dicts of
arrays with ``_key`` masks (the parent's serial cost of a step)."""

from __future__ import annotations

import gc
import itertools
import marshal
import operator
import pickle
from collections.abc import Iterable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv
from gymnasium.vector.utils import concatenate, create_empty_array


class _InfoBatch:
    """Gymnasium's own info batching (``VectorEnv._add_info``) for a batch of any size."""

    _add_info = VectorEnv._add_info

    def __init__(self, num_envs: int):
        self.num_envs = num_envs


class InfoBatchError(ValueError):
    """An info key whose values no one array holds: an int in one env and a str, None or dict
    in another, arrays of different shapes, an int too large for the first env's dtype.
    Gymnasium's ``SyncVectorEnv`` fails on them too, with numpy's bare error naming nothing;
    this names the key (``path``) and the kinds each env gave."""

    def __init__(self, path: str, kinds: str, cause: str):
        self.path, self.kinds, self.cause = path, kinds, cause
        super().__init__(f"info{path} cannot be batched into one array: the envs gave {kinds} ({cause}). "
                         "Give the key one kind of value in every env (leave it out where it has none).")


def _unbatchable(key: str, values: list, where: list[int], exc: Exception) -> InfoBatchError:
    """The error for ``key``'s values (``exc``: why numpy or Gymnasium refused them); a nested
    dict's key keeps its own kinds, under this key's path."""
    if isinstance(exc, InfoBatchError):
        return InfoBatchError(f"[{key!r}]{exc.path}", exc.kinds, exc.cause)
    envs: dict[str, list[str]] = {}
    for j, value in zip(where, values):
        kind = f"{value.dtype} array of shape {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
        envs.setdefault(kind, []).append(str(j))
    kinds = "; ".join(f"{kind} (env{'s' * (len(js) > 1)} {', '.join(js[:8])}{' ...' * (len(js) > 8)})"
                      for kind, js in envs.items())  # (a few envs each: 4,096 would bury the message)
    return InfoBatchError(f"[{key!r}]", kinds, f"{type(exc).__name__}: {exc}")


def _stack(space: gym.Space, items: list[Any]) -> Any:
    """Gymnasium's ``concatenate`` of a batch of observations; for text, the tuple it returns,
    without first building the empty batch it would ignore."""
    if isinstance(space, gym.spaces.Text):
        return tuple(items)
    return concatenate(space, items, create_empty_array(space, len(items)))


def batch_infos(infos: Sequence[dict], num_envs: int, index: Sequence[int] | None = None) -> dict[str, Any]:
    """The dict of arrays Gymnasium's ``_add_info`` builds from ``infos`` for the envs at
    ``index`` (default: 0, 1, ...), in that order, key by key instead of env by env (the parent's
    serial cost of a batch). Same arrays, dtypes (the first env's value decides), masks and
    nesting; a key whose values mix dicts and non-dicts goes through ``_add_info`` itself."""
    index = list(range(len(infos))) if index is None else list(index)
    return batch_columns(_columns(infos, index), num_envs, index)


def batch_columns(columns: dict[str, tuple[list, list[int]]], num_envs: int, index: list[int]) -> dict[str, Any]:
    """:func:`batch_infos` from the infos' columns: each key's values and the envs they belong
    to (``where``; ``where is index`` when every env of ``index`` has the key): each array with
    a few C-level calls, not a Python loop per env. (A lock-step batch's columns come built from
    the workers: :func:`join_columns`.)"""
    whole = len(index) == num_envs and index == list(range(num_envs))  # every env, in order
    shared = None  # the mask of keys every info has (the common case), made once
    out: dict[str, Any] = {}
    for key, (values, where) in columns.items():
        try:  # (free in the common case: numpy's error for a key is re-raised naming it)
            kinds = set(map(type, values))
            first = values[0]
            if key == "final_obs":
                array = _objects(values, num_envs, where, whole and where is index)
            elif any(issubclass(k, dict) for k in kinds):
                if not all(issubclass(k, dict) for k in kinds):  # Gymnasium's own (odd) result for a mix
                    batcher, partial = _InfoBatch(num_envs), {}
                    for j, value in zip(where, values):
                        partial = batcher._add_info(partial, {key: value}, j)
                    out.update(partial)
                    continue
                array = batch_infos(values, num_envs, where)
            else:
                kind = type(first)
                if kind in (int, float, bool) or issubclass(kind, np.number):
                    array = np.zeros(num_envs, dtype=kind)
                    if all(k in (int, float, bool) or issubclass(k, np.number) for k in kinds):
                        array[where] = values
                    else:  # element by element, as Gymnasium assigns (numpy treats some sequences apart)
                        for j, value in zip(where, values):
                            array[j] = value
                elif isinstance(first, np.ndarray):
                    array = np.zeros((num_envs, *first.shape), dtype=first.dtype)
                    for j, value in zip(where, values):
                        array[j] = value
                else:
                    array = _objects(values, num_envs, where, whole and where is index)
        except Exception as exc:  # noqa: BLE001  (numpy's and Gymnasium's errors vary with the kinds)
            cause = exc.__cause__ if isinstance(exc, InfoBatchError) else exc  # (numpy's own, once)
            raise _unbatchable(key, values, where, exc) from cause
        if where is index:
            if shared is None:
                shared = np.zeros(num_envs, dtype=np.bool_)
                shared[index] = True
            mask = shared.copy()
        else:
            mask = np.zeros(num_envs, dtype=np.bool_)
            mask[where] = True
        out[key], out[f"_{key}"] = array, mask
    return out


def pack_columns(infos: Sequence[dict]) -> list[tuple]:
    """A worker's slice of a lock-step batch's infos, as the parent joins them: ``(key, tag,
    data, mask)`` per key (in the order Gymnasium meets them), ``mask`` None when every info of
    the slice has the key, else the bytes of the slice's bool mask. Tags: ``"n"``, numbers (or
    numeric arrays of one shape) of one type: ``data`` is ``(builtin, dtype, shape, bytes)`` of
    the array Gymnasium builds for the slice (zeros where absent); ``"o"``, objects kept whole:
    the values present; ``"d"``, dicts: the columns of the slice's dicts (``{}`` where absent);
    ``"x"``, a mix of kinds: the values present (joined by Gymnasium's rules in the parent). The
    per-env work is the worker's (one of many), so the parent's is a few calls per key."""
    m = len(infos)
    index = list(range(m))
    out = []
    for key, (values, where) in _columns(infos, index).items():
        tag, data = _pack_column(key, values, where, index)
        out.append((key, tag, data, None if where is index else _mask(where, m).tobytes()))
    return out


def _pack_column(key: str, values: list, where: list[int], index: list[int]) -> tuple[str, Any]:
    kinds = set(map(type, values))
    if key == "final_obs":
        return "o", values
    if all(issubclass(k, dict) for k in kinds):
        sub: list[dict] = [{}] * len(index)
        for j, value in zip(where, values):
            sub[j] = value
        return "d", pack_columns(sub)
    kind = type(values[0])
    numeric = kind in _NUMBERS or issubclass(kind, np.number)
    if len(kinds) == 1 and (numeric or kind is np.ndarray):
        first = values[0]
        shape = first.shape if kind is np.ndarray else ()
        dtype = first.dtype if kind is np.ndarray else np.dtype(kind)
        if dtype.kind in "biufc" and (not shape or all(v.shape == shape and v.dtype == dtype for v in values)):
            array = np.zeros((len(index), *shape), dtype=dtype)
            try:
                array[slice(None) if where is index else where] = values
            except (OverflowError, ValueError, TypeError):  # (Gymnasium's own error, raised in the parent)
                return "x", values
            return "n", (kind in _NUMBERS, dtype.str, shape, array.tobytes())
    if numeric or issubclass(kind, np.ndarray) or any(issubclass(k, dict) for k in kinds):
        return "x", values
    return "o", values


_NUMBERS = (int, float, bool)


def join_columns(parts: Sequence[tuple[int, int, list]], num_envs: int) -> dict[str, Any]:
    """Gymnasium's dict of arrays for a whole lock-step batch from the workers' slices
    (``(start, count, pack_columns(...))``, in env order): numbers and masks joined with
    ``np.concatenate``, objects with one ``np.fromiter``, no Python step per env. A key whose
    slices disagree (kinds, dtypes) gets Gymnasium's own rules from its values."""
    by_key: dict[str, list] = {}  # key -> [tag (or "x": slices disagree), every env has it, slices]
    covered = sum(part[1] for part in parts) == num_envs  # (a nested dict's parts may not be)
    for start, count, columns in parts:
        for key, tag, data, mask in columns:
            column = by_key.get(key)
            if column is None:
                by_key[key] = [tag, covered and mask is None, [(start, count, tag, data, mask)]]
                continue
            first = column[2][0]
            if tag != column[0] or (tag == "n" and data[:3] != first[3][:3]):
                column[0] = "x"
            if mask is not None:
                column[1] = False
            column[2].append((start, count, tag, data, mask))
    out: dict[str, Any] = {}
    every = None  # the mask of a key every env has (the common case), made once
    lazy, decoded = False, {}  # (the deferred columns' blobs, decoded when the first is read)
    for key, (tag, whole, slices) in by_key.items():
        whole = whole and len(slices) == len(parts)
        if tag == "n":
            _, dtype, shape, _ = slices[0][3]
            if whole:  # (every slice, in env order: their bytes make the batch's array)
                raw = slices[0][3][3] if len(slices) == 1 else b"".join([data[3] for _, _, _, data, _ in slices])
                array = np.frombuffer(raw, dtype=dtype).reshape(num_envs, *shape).copy()
            else:
                arrays, at = [], 0
                for start, count, _, data, _ in slices:
                    if start > at:
                        arrays.append(np.zeros((start - at, *shape), dtype=dtype))
                    arrays.append(np.frombuffer(data[3], dtype=dtype).reshape(count, *shape))
                    at = start + count
                if at < num_envs:
                    arrays.append(np.zeros((num_envs - at, *shape), dtype=dtype))
                array = np.concatenate(arrays)
        elif tag == "o":
            array = _object_column(slices, num_envs, whole)
        elif tag == "z":  # decoded when first read (LazyInfos)
            array, lazy = _Undecoded(slices, num_envs, whole, decoded), True
        elif tag == "d":
            try:
                array = join_columns([(start, count, data) for start, count, _, data, _ in slices], num_envs)
            except InfoBatchError as exc:  # (a nested key's: named under this one)
                raise _unbatchable(key, [], [], exc) from exc.__cause__
        else:  # a mix of kinds: Gymnasium's rules, from the values
            values, where = [], []
            for start, count, tag, data, mask in slices:
                values += _column_values(tag, data, mask, count)
                where += _positions(start, count, mask)
            out.update(batch_columns({key: (values, where)}, num_envs, list(range(num_envs))))
            continue
        if whole:
            if every is None:
                every = np.ones(num_envs, dtype=np.bool_)
            mask = every.copy()
        else:
            mask = np.zeros(num_envs, dtype=np.bool_)
            for start, count, _, _, part in slices:
                mask[start:start + count] = True if part is None else np.frombuffer(part, dtype=np.bool_)
        out[key], out[f"_{key}"] = array, mask
    return LazyInfos(out) if lazy else out


def _object_column(slices: list[tuple], num_envs: int, whole: bool, decoded: dict | None = None) -> np.ndarray:
    """The object array of a column's slices (``(start, count, tag, data, mask)``, as
    :func:`join_columns` gathers them), None where absent; a deferred slice's values come from
    its blob (``decoded``: the batch's blobs decoded so far)."""
    parts = [_deferred_values(data, decoded) if tag == "z" else data for _, _, tag, data, _ in slices]
    if whole:
        return _objects(parts[0] if len(parts) == 1 else itertools.chain.from_iterable(parts), num_envs, [], True)
    where = [j for start, count, _, _, mask in slices for j in _positions(start, count, mask)]
    return _objects(list(itertools.chain.from_iterable(parts)), num_envs, where, False)


def defer_columns(columns: list[tuple], exact: bool) -> list[tuple]:
    """A worker's columns with its object columns (tag ``"o"``: messages, tool calls...) as the
    bytes of their values, all in one blob (tag ``"z"``: ``((codec, bytes), position)``, the
    codec marshal's when ``exact``, else pickle's), for the parent to decode only when the caller
    reads one: decoding thousands of Python objects a step (and collecting them) was most of the
    parent's serial work with full infos. One blob, not one per column: reading them all then
    costs what it did. Columns of strings and numbers stay as they are (as cheap to decode as to
    defer), and ``final_obs`` (episode ends only)."""
    deferred = [j for j, (key, tag, data, _) in enumerate(columns)
                if tag == "o" and key != "final_obs" and not set(map(type, data)) <= _ATOMS]
    if not deferred:
        return columns
    values = [columns[j][2] for j in deferred]
    blob = ("m", marshal.dumps(values, 4)) if exact else ("p", pickle.dumps(values, pickle.HIGHEST_PROTOCOL))
    out = list(columns)
    for at, j in enumerate(deferred):  # (the blob travels once: marshal and pickle send a repeat as a reference)
        key, _, _, mask = columns[j]
        out[j] = (key, "z", (blob, at), mask)
    return out


_ATOMS = frozenset((str, int, float, bool, bytes, type(None)))


def _deferred_values(data: tuple, decoded: dict | None = None) -> list:
    """A deferred column's values (``decoded``: the blobs decoded so far, by id, shared by the
    columns of one batch)."""
    blob, at = data
    if decoded is None:
        return _decoded(blob)[at]
    entry = decoded.get(id(blob))
    if entry is None:
        entry = decoded[id(blob)] = (blob, _decoded(blob))  # (the blob kept: its id stays its own)
    return entry[1][at]


def _decoded(blob: tuple[str, bytes]) -> list:
    codec, raw = blob
    return marshal.loads(raw) if codec == "m" else pickle.loads(raw)


class _Undecoded:
    """A :class:`LazyInfos` column still in its workers' bytes."""

    __slots__ = ("slices", "num_envs", "whole", "decoded")

    def __init__(self, slices: list[tuple], num_envs: int, whole: bool, decoded: dict):
        self.slices, self.num_envs, self.whole, self.decoded = slices, num_envs, whole, decoded

    def decode(self) -> np.ndarray:
        return _object_column(self.slices, self.num_envs, self.whole, self.decoded)

    def __repr__(self) -> str:
        return "<an info column not decoded yet: read it through the dict (infos[key])>"


class LazyInfos(dict):
    """Gymnasium's info batch (a ``dict``) whose object columns (each env's messages, tool calls,
    task id...) are decoded from the workers' bytes the first time they are read: a caller that
    reads only ``error`` or the rewards' components never pays for building (and collecting)
    thousands of Python objects a step. Every way Python reads a dict sees the decoded arrays
    (``infos[k]``, ``get``, ``items``, ``values``, ``dict(infos)``, ``{**infos}``, ``|``, ``==``,
    ``repr``, copy, pickle: a plain ``dict``); only code that reads a dict's storage in C, or
    calls ``dict.__getitem__(infos, k)``, would see a placeholder: hand it ``dict(infos)``."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        value = dict.__getitem__(self, key)
        if type(value) is _Undecoded:
            with _collections_paused():
                value = value.decode()
            dict.__setitem__(self, key, value)
        return value

    def _decode_all(self) -> None:
        undecoded = [(key, value) for key, value in dict.items(self) if type(value) is _Undecoded]
        if undecoded:
            with _collections_paused():  # (one collection after them all)
                for key, value in undecoded:
                    dict.__setitem__(self, key, value.decode())

    def __iter__(self):  # (not dict's own: so dict(infos), {**infos} and merges read through __getitem__)
        return dict.__iter__(self)

    def get(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else default

    def items(self):
        self._decode_all()
        return dict.items(self)

    def values(self):
        self._decode_all()
        return dict.values(self)

    def pop(self, key: Any, *default: Any) -> Any:
        if key in self:
            self[key]  # noqa: B018  (decoded first)
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple:
        self._decode_all()
        return dict.popitem(self)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return self[key] if key in self else dict.setdefault(self, key, default)

    def copy(self) -> dict:
        self._decode_all()
        return dict.copy(self)

    __copy__ = copy

    def __deepcopy__(self, memo: dict) -> dict:
        import copy

        return copy.deepcopy(self.copy(), memo)

    def __reduce__(self) -> tuple:
        return dict, (self.copy(),)

    def __or__(self, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        new = self.copy()
        new.update(other)
        return new

    def __ror__(self, other: Any) -> Any:
        if not isinstance(other, dict):
            return NotImplemented
        new = dict(other)
        new.update(self.copy())
        return new

    def __eq__(self, other: Any) -> Any:
        self._decode_all()
        if isinstance(other, LazyInfos):
            other._decode_all()
        return dict.__eq__(self, other)

    def __ne__(self, other: Any) -> Any:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __repr__(self) -> str:
        self._decode_all()
        return dict.__repr__(self)


def unpack_columns(columns: list[tuple], count: int) -> list[dict]:
    """The per-env info dicts of :func:`pack_columns`'s columns (the parent's rare paths: faults,
    results out of order)."""
    infos: list[dict] = [{} for _ in range(count)]
    for key, tag, data, mask in columns:
        for j, value in zip(_positions(0, count, mask), _column_values(tag, data, mask, count)):
            infos[j][key] = value
    return infos


def _column_values(tag: str, data: Any, mask: bytes | None, count: int) -> list:
    """A packed column's values, where present, as the envs gave them."""
    if tag == "n":
        builtin, dtype, shape, raw = data
        array = np.frombuffer(raw, dtype=dtype).reshape(count, *shape)
        if mask is not None:
            array = array[np.frombuffer(mask, dtype=np.bool_)]
        return array.tolist() if builtin else [a.copy() for a in array] if shape else list(array)
    if tag == "d":
        rows = unpack_columns(data, count)
        return rows if mask is None else [rows[j] for j in _positions(0, count, mask)]
    return _deferred_values(data) if tag == "z" else data


def _positions(start: int, count: int, mask: bytes | None) -> list[int]:
    if mask is None:
        return list(range(start, start + count))
    return (np.flatnonzero(np.frombuffer(mask, dtype=np.bool_)) + start).tolist()


def _mask(where: list[int], count: int) -> np.ndarray:
    mask = np.zeros(count, dtype=np.bool_)
    mask[where] = True
    return mask


def _columns(infos: Sequence[dict], index: list[int]) -> dict[str, tuple[list, list[int]]]:
    """Each key's values and the envs they belong to. When every info has the same keys (a step
    mid-episode), the values come out by one C-level pass per info, all with ``index``."""
    if infos:
        keys = list(infos[0])
        # (plain dicts only: a defaultdict or Counter would make up the keys it lacks)
        if keys and len(set(map(len, infos))) == 1 and set(map(type, infos)) == {dict}:
            try:
                rows = list(map(operator.itemgetter(*keys), infos))
            except KeyError:
                pass
            else:
                if len(keys) == 1:
                    return {keys[0]: (rows, index)}
                return {key: (list(column), index) for key, column in zip(keys, zip(*rows))}
    columns: dict[str, tuple[list, list[int]]] = {}
    for j, info in zip(index, infos):
        for key, value in info.items():
            column = columns.get(key)
            if column is None:
                columns[key] = ([value], [j])
            else:
                column[0].append(value)
                column[1].append(j)
    return columns


def _objects(values: Iterable[Any], num_envs: int, where: list[int], whole: bool) -> np.ndarray:
    """An object array of ``values`` at ``where`` (None elsewhere), each value kept whole (a
    list stays one element, as Gymnasium assigns it). ``whole``: every env's, in order (then
    ``values`` may be any iterable)."""
    if whole:
        return np.fromiter(values, dtype=object, count=num_envs)
    array = np.full(num_envs, fill_value=None, dtype=object)
    array[where] = np.fromiter(values, dtype=object, count=len(values))  # (a list of lists would spread)
    return array


class _collections_paused:
    """No cyclic garbage collection while a batch is decoded: the thousands of acyclic
    containers it makes (infos' messages and tool calls) would trigger collections that walk
    them over and over (a third of the parent's CPU with full infos); the one collection that
    is due runs after."""

    __slots__ = ("enabled",)

    def __enter__(self) -> None:
        self.enabled = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            gc.enable()
