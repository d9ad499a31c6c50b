"""Batching the workers' results as Gymnasium returns them: observations stacked, infos as dicts of
arrays with ``_key`` masks (the parent's serial cost of a step)."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
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
    for key, (tag, whole, slices) in by_key.items():
        whole = whole and len(slices) == len(parts)
        if tag == "n":
            _, dtype, shape, _ = slices[0][3]
            if whole and len(slices) == 1:
                array = np.frombuffer(slices[0][3][3], dtype=dtype).reshape(num_envs, *shape).copy()
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
            if whole:
                values = slices[0][3] if len(slices) == 1 else itertools.chain.from_iterable(s[3] for s in slices)
                array = np.fromiter(values, dtype=object, count=num_envs)
            else:
                array = np.full(num_envs, fill_value=None, dtype=object)
                for start, count, _, values, mask in slices:
                    array[_positions(start, count, mask)] = np.fromiter(values, dtype=object, count=len(values))
        elif tag == "d":
            array = join_columns([(start, count, data) for start, count, _, data, _ in slices], num_envs)
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
    return out


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
    return data


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
        if keys and len(set(map(len, infos))) == 1:
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


def _objects(values: list[Any], num_envs: int, where: list[int], whole: bool) -> np.ndarray:
    """An object array of ``values`` at ``where`` (None elsewhere), each value kept whole (a
    list stays one element, as Gymnasium assigns it)."""
    if whole:
        return np.fromiter(values, dtype=object, count=num_envs)
    array = np.full(num_envs, fill_value=None, dtype=object)
    array[where] = np.fromiter(values, dtype=object, count=len(values))  # (a list of lists would spread)
    return array
