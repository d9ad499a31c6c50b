"""Batching the workers' results as Gymnasium returns them: observations stacked, infos as dicts of
arrays with ``_key`` masks (the parent's serial cost of a step)."""

from __future__ import annotations

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
    to (``where``; ``where is index`` when every env of ``index`` has the key). A lock-step
    batch arrives from the workers in columns already (:func:`pack_infos`): the parent then
    builds each array with a few C-level calls, not a Python loop per env."""
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


def pack_infos(infos: Sequence[dict]) -> list[tuple[str, list, list[int] | None]]:
    """A worker's infos as columns for the parent: ``(key, values, positions)`` with positions
    in ``infos`` (None: every one has the key), each key in the order :func:`_columns` finds it."""
    index = list(range(len(infos)))
    return [(key, values, None if where is index else where) for key, (values, where) in _columns(infos, index).items()]


def unpack_infos(packed: list[tuple[str, list, list[int] | None]], count: int) -> list[dict]:
    """The per-env info dicts of :func:`pack_infos`'s columns (the parent's rare paths: faults,
    mixtures, results out of order)."""
    if all(where is None for _, _, where in packed):
        keys = [key for key, _, _ in packed]
        return [dict(zip(keys, row)) for row in zip(*(values for _, values, _ in packed))] if keys else [
            {} for _ in range(count)]
    infos: list[dict] = [{} for _ in range(count)]
    for key, values, where in packed:
        for j, value in zip(range(count) if where is None else where, values):
            infos[j][key] = value
    return infos


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
