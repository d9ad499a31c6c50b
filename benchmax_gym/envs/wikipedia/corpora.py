"""The corpora that come with a task source: ``backend="generated"`` (the encyclopedia the generated
questions are about) and ``backend="local"`` (a corpus file, HotpotQA's by default). Apart from
``backends`` because they read the task sources: ``tasks`` needs ``backends`` (for corpus keys),
and this module needs both, so neither imports the other in a circle."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from benchmax_gym.core.checks import optional, path
from benchmax_gym.core.sources import SourceConfig, arg
from benchmax_gym.envs.wikipedia.backends import CorpusIndex
from benchmax_gym.envs.wikipedia.tasks import HotpotQA, WikiTaskConfig, encyclopedia, lazy_corpus


@dataclass(frozen=True)
class GeneratedCorpus(SourceConfig):
    """``backend="generated"``: the encyclopedia the generated questions are about (the task
    source's ``task_seed`` and ``difficulty.entities``; the defaults for tasks handed over)."""

    name = "generated"

    def build(self, env: Any) -> CorpusIndex:
        source = env.task_config
        seed = getattr(source, "task_seed", 0)
        entities = getattr(source, "difficulty", WikiTaskConfig()).entities
        return generated_index(seed, entities)


@functools.lru_cache(maxsize=8)
def generated_index(seed: int, entities: int) -> CorpusIndex:
    """The encyclopedia of ``seed`` indexed in a shared in-memory database (once per process)."""
    return CorpusIndex.in_memory(encyclopedia(seed, entities).records, f"generated-{seed}-{entities}")


def existing_path(name: str, value: Any) -> str:
    """A file or folder that exists now (a folder of documents is a corpus too); not a FIFO or a
    device (reading one blocked, or never ended)."""
    import os

    if not isinstance(value, (str, os.PathLike)) or not os.path.exists(value):
        raise ValueError(f"{name}: no such file or folder {os.fspath(value) if isinstance(value, os.PathLike) else value!r}")
    if not (os.path.isfile(value) or os.path.isdir(value)):
        raise ValueError(f"{name}: {os.fspath(value)!r} is not a regular file or a folder")
    return os.fspath(value)


@dataclass(frozen=True)
class LocalCorpus(SourceConfig):
    """``backend="local"``: an SQLite FTS5 index of ``corpus`` (JSON Lines or a JSON array of
    ``{title, text}``, a HotpotQA file: its context paragraphs, HotpotQA tasks default to their
    own file; or a folder or file of your documents: text, Markdown, HTML), cached under ``cache_dir``."""

    name = "local"
    corpus: str | None = arg(None, optional(existing_path))
    cache_dir: str | None = arg(None, optional(path))

    def build(self, env: Any) -> CorpusIndex:
        corpus = self.corpus
        if corpus is None and isinstance(env.task_config, HotpotQA):
            corpus = env.task_config.dataset
        if corpus is None:
            raise ValueError("backend='local' needs backend_args corpus= (JSON Lines or a JSON array of "
                             "{title, text}, or a HotpotQA file)")
        records, key = lazy_corpus(corpus)  # (parsed only when the index must be built)
        return CorpusIndex.on_disk(records, key, self.cache_dir)
