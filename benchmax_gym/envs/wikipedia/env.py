"""``benchmax/Wikipedia-v0``: multi-hop question answering with ``search`` and ``get_article``.

The tools are the same over three interchangeable backends (``gym.make(..., backend=...)``): the
seeded fictional encyclopedia (``generated``, default, deterministic and contamination-free), an
SQLite FTS5 index of any local corpus (``local``), or live Wikipedia (``live``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from benchmax_gym.core.env import Episode, ToolEnv
from benchmax_gym.core.tasks import Task, TaskSource, generator_config, given_tasks, source_name
from benchmax_gym.core.tools import Toolset
from benchmax_gym.envs.wikipedia.backends import USER_AGENT, CorpusBackend, CorpusIndex, LiveBackend
from benchmax_gym.envs.wikipedia.rubric import wikipedia_rubric
from benchmax_gym.envs.wikipedia.solver import WikipediaSolver
from benchmax_gym.envs.wikipedia.tasks import (
    WikiTaskConfig, bamboogle_tasks, encyclopedia, generated_tasks, hotpotqa_tasks, load_corpus,
)
from benchmax_gym.envs.wikipedia.tools import wikipedia_tools

SYSTEM_PROMPT = (
    "You answer questions by researching an encyclopedia with tools: `search` finds articles, "
    "`get_article` reads one (a chunk or a section at a time). Questions may need several articles: "
    "find the first entity, read its article, follow the fact that leads to the next one. When you "
    "know the answer, reply without a tool call and put only the answer in <answer>...</answer>, "
    "for example <answer>1875</answer>; answer yes/no questions with yes or no."
)

TASK_SOURCES = ("generated", "hotpotqa", "bamboogle")
BACKENDS = ("generated", "local", "live")
DEFAULT_BACKEND = {"generated": "generated", "hotpotqa": "local", "bamboogle": "live"}


@functools.lru_cache(maxsize=8)
def generated_index(seed: int, entities: int) -> CorpusIndex:
    """The encyclopedia of ``seed`` indexed in a shared in-memory database (once per process)."""
    world = encyclopedia(seed, entities)
    return CorpusIndex.in_memory(world.records, f"generated-{seed}-{entities}")


class WikipediaEnv(ToolEnv):
    """Multi-hop questions answered with ``search`` and ``get_article``; graded by EM/F1.

    Args:
        tasks: ``"generated"`` (default), ``"hotpotqa"`` or ``"bamboogle"`` (with ``dataset=``),
            a TaskSource or a list of Tasks.
        backend: ``"generated"``, ``"local"`` or ``"live"``; by default the one that fits ``tasks``
            (generated -> generated, hotpotqa -> local over its own context paragraphs,
            bamboogle -> live).
        dataset, limit: the question file, and at most how many questions.
        corpus: for ``local``: JSON Lines / JSON array of ``{title, text}``, or a HotpotQA file
            (its context paragraphs); defaults to ``dataset`` for HotpotQA.
        cache_dir: where ``local`` indexes are cached (default ``$BENCHMAX_GYM_CACHE`` or
            ``~/.cache/benchmax-gym``).
        difficulty, num_tasks, task_seed: generated only: :class:`WikiTaskConfig` fields
            (``entities``, ``min_hops``, ``max_hops``, ``comparison``); a finite task set; which
            encyclopedia and question set.
        api_url, language, user_agent, http_timeout, max_retries, retry_wait: live only: the
            MediaWiki endpoint (default ``https://{language}.wikipedia.org/w/api.php``) and the
            HTTP policy (see :class:`LiveBackend`).
        **engine_kwargs: the engine's options (``max_turns``, ``tool_format``, ``reward_weights``...).
    """

    def __init__(
        self,
        tasks: str | TaskSource | Sequence[Task] = "generated",
        *,
        backend: str | None = None,
        dataset: str | os.PathLike | None = None,
        limit: int | None = None,
        corpus: str | os.PathLike | None = None,
        cache_dir: str | os.PathLike | None = None,
        difficulty: Mapping[str, Any] | WikiTaskConfig | None = None,
        num_tasks: int | None = None,
        task_seed: int = 0,
        api_url: str | None = None,
        language: str = "en",
        user_agent: str = USER_AGENT,
        http_timeout: float = 10.0,
        max_retries: int = 3,
        retry_wait: float = 0.5,
        max_turns: int = 12,
        **engine_kwargs: Any,
    ):
        kind = tasks if isinstance(tasks, str) else None
        if kind is not None:
            source_name(kind, TASK_SOURCES)
        backend = backend if backend is not None else DEFAULT_BACKEND.get(kind, "generated")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if (kind == "generated") != (backend == "generated") and kind is not None:
            raise ValueError(
                f"backend={backend!r} does not fit tasks={kind!r}: generated questions are about the "
                "generated encyclopedia (backend='generated'), and only they are"
            )
        if kind != "generated" and (difficulty is not None or num_tasks is not None or task_seed != 0):
            raise ValueError("difficulty, num_tasks and task_seed apply only to tasks='generated'")
        if backend != "live" and api_url is not None:
            raise ValueError("api_url applies only to backend='live'")
        if backend != "local" and corpus is not None:
            raise ValueError("corpus applies only to backend='local'")
        config = _config(difficulty)
        source = _task_source(tasks, kind, dataset, limit, config, num_tasks, task_seed)

        self.backend_name = backend
        self.index: CorpusIndex | None = None
        self.live: LiveBackend | None = None
        if backend == "generated":
            self.index = generated_index(task_seed, config.entities)
        elif backend == "local":
            corpus = corpus if corpus is not None else (dataset if kind == "hotpotqa" else None)
            if corpus is None:
                raise ValueError("backend='local' needs corpus= (JSON Lines or a JSON array of {title, text}, "
                                 "or a HotpotQA file)")
            if not os.path.isfile(corpus):
                raise ValueError(f"corpus: no such file {str(corpus)!r}")
            records, key = load_corpus(corpus)
            self.index = CorpusIndex.on_disk(records, key, cache_dir)
        else:
            _check_http(http_timeout, max_retries, retry_wait)
            engine_kwargs.setdefault("tool_timeout", http_timeout * (max_retries + 1) + retry_wait * 2 ** max_retries)
            self.live = LiveBackend(api_url=api_url, language=language, user_agent=user_agent, timeout=http_timeout,
                                    max_retries=max_retries, retry_wait=retry_wait)
        super().__init__(
            tasks=source, toolset=Toolset(wikipedia_tools(inline=backend != "live")), rubric=wikipedia_rubric(),
            system_prompt=SYSTEM_PROMPT, max_turns=max_turns, **engine_kwargs,
        )

    def open_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        episode.state["backend"] = self.live if self.live is not None else CorpusBackend(self.index)

    def close_episode(self, episode: Episode) -> None:
        backend = episode.state.pop("backend", None)
        if backend is not None:
            backend.close()

    def task_prompt(self, task: Task) -> str:
        return f"Question: {task.prompt}"

    def reference_solver(self) -> WikipediaSolver:
        return WikipediaSolver(self)

    def close(self):
        super().close()
        if self.live is not None:
            self.live.shutdown()


def _config(difficulty) -> WikiTaskConfig:
    return generator_config(WikiTaskConfig, difficulty)


def _task_source(tasks, kind, dataset, limit, config, num_tasks, task_seed) -> TaskSource:
    given = given_tasks(tasks)
    if given is not None:
        return given
    source_name(tasks, TASK_SOURCES)
    if kind == "generated":
        if dataset is not None or limit is not None:
            raise ValueError("dataset and limit apply only to tasks='hotpotqa' or 'bamboogle'")
        return generated_tasks(config, seed=task_seed, size=num_tasks)
    if dataset is None:
        raise ValueError(f"tasks={kind!r} needs dataset= (a local file in the original layout)")
    if not os.path.isfile(dataset):
        raise ValueError(f"dataset: no such file {str(dataset)!r}")
    return hotpotqa_tasks(dataset, limit=limit) if kind == "hotpotqa" else bamboogle_tasks(dataset, limit=limit)


def _check_http(http_timeout, max_retries, retry_wait) -> None:
    if isinstance(http_timeout, bool) or not isinstance(http_timeout, (int, float)) or not http_timeout > 0:
        raise ValueError(f"http_timeout must be a positive number of seconds, got {http_timeout!r}")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or not 0 <= max_retries <= 10:
        raise ValueError(f"max_retries must be an int from 0 to 10, got {max_retries!r}")
    if isinstance(retry_wait, bool) or not isinstance(retry_wait, (int, float)) or not 0 <= retry_wait <= 60:
        raise ValueError(f"retry_wait must be a number of seconds from 0 to 60, got {retry_wait!r}")
