"""``benchmax/Wikipedia-v0``: multi-hop question answering with ``search`` and ``get_article``.

The tools are the same over three interchangeable backends (``gym.make(..., backend=...)``): the
seeded fictional encyclopedia (``generated``, default, deterministic and contamination-free), an
SQLite FTS5 index of any local corpus (``local``), or live Wikipedia (``live``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmax_gym.core.env import Episode, ToolEnv
from benchmax_gym.core.sources import SourceConfig, choose, task_source
from benchmax_gym.core.tasks import Task, TaskSource
from benchmax_gym.core.tools import Toolset
from benchmax_gym.envs.wikipedia.backends import CorpusBackend, LiveBackend, LiveWikipedia
from benchmax_gym.envs.wikipedia.corpora import GeneratedCorpus, LocalCorpus
from benchmax_gym.envs.wikipedia.rubric import supporting_opened, wikipedia_rubric
from benchmax_gym.envs.wikipedia.solver import WikipediaSolver
from benchmax_gym.envs.wikipedia.tasks import Bamboogle, GeneratedQuestions, HotpotQA, TaskFile
from benchmax_gym.envs.wikipedia.tools import wikipedia_tools

SYSTEM_PROMPT = (
    "You answer questions by researching an encyclopedia with tools: `search` finds articles, "
    "`get_article` reads one (a chunk or a section at a time). Questions may need several articles: "
    "find the first entity, read its article, follow the fact that leads to the next one. When you "
    "know the answer, reply without a tool call and put only the answer in <answer>...</answer>, "
    "for example <answer>1875</answer>; answer yes/no questions with yes or no."
)

TASK_SOURCES = (GeneratedQuestions, HotpotQA, Bamboogle, TaskFile)
BACKENDS = (GeneratedCorpus, LocalCorpus, LiveWikipedia)
DEFAULT_BACKEND = {"generated": "generated", "hotpotqa": "local", "bamboogle": "live", "file": "local"}


class WikipediaEnv(ToolEnv):
    """Multi-hop questions answered with ``search`` and ``get_article``; graded by EM/F1.

    Args:
        tasks: a source by name with its ``task_args``: ``"generated"`` (default;
            :class:`GeneratedQuestions`: ``difficulty`` - ``entities``, ``min_hops``, ``max_hops``,
            ``comparison`` - ``num_tasks``, ``task_seed``, which also picks the encyclopedia),
            ``"hotpotqa"`` or ``"bamboogle"`` (``dataset`` a local file in the original layout,
            ``limit``), ``"file"`` (``dataset`` a tasks JSON Lines file, as ``benchmax-gym tasks
            from-corpus`` writes it; played with ``backend="local"`` over the documents); or one of
            those instances, a TaskSource or a list of Tasks.
        task_args: the named source's arguments.
        backend: ``"generated"``, ``"local"`` (:class:`LocalCorpus`: ``corpus``, ``cache_dir``) or
            ``"live"`` (:class:`LiveWikipedia`: ``api_url``, ``language``, ``user_agent``,
            ``http_timeout``, ``max_retries``, ``retry_wait``), or one of those instances; by
            default the one that fits ``tasks`` (generated -> generated, hotpotqa -> local over
            its own context paragraphs, bamboogle -> live).
        backend_args: the named backend's arguments.
        **engine_kwargs: the engine's options (``max_turns``, ``tool_format``, ``reward_weights``...).
    """

    choices = {"task_args": TASK_SOURCES, "backend_args": BACKENDS}

    def __init__(
        self,
        tasks: str | SourceConfig | TaskSource | Sequence[Task] = "generated",
        *,
        task_args: Mapping[str, Any] | None = None,
        backend: str | SourceConfig | None = None,
        backend_args: Mapping[str, Any] | None = None,
        max_turns: int = 12,
        **engine_kwargs: Any,
    ):
        config = choose(tasks, task_args, TASK_SOURCES, engine_kwargs)
        if backend is None:
            backend = DEFAULT_BACKEND[config.name] if config is not None else "generated"
        given, backend = backend, choose(backend, backend_args, BACKENDS, engine_kwargs, what="backend")
        if backend is None:  # (what was given, not choose's None: "got None" for backend=5)
            raise ValueError(f"backend must be one of {tuple(b.name for b in BACKENDS)} or a backend config, "
                             f"got {given!r:.80}")
        if config is not None and (config.name == "generated") != (backend.name == "generated"):
            raise ValueError(
                f"backend={backend.name!r} does not fit tasks={config.name!r}: generated questions are about "
                "the generated encyclopedia (backend='generated'), and only they are"
            )
        source = task_source(self, config if config is not None else tasks, None, TASK_SOURCES, {})
        self.backend_name = backend.name
        if isinstance(backend, LiveWikipedia):
            engine_kwargs.setdefault("tool_timeout", backend.tool_timeout)
        self.backend = backend.build(self)  # a CorpusIndex, or the LiveBackend every episode shares
        super().__init__(
            tasks=source, toolset=Toolset(wikipedia_tools(inline=backend.name != "live")), rubric=wikipedia_rubric(),
            system_prompt=SYSTEM_PROMPT, max_turns=max_turns, **engine_kwargs,
        )

    def open_episode(self, episode: Episode, options: dict[str, Any]) -> None:
        backend = self.backend if isinstance(self.backend, LiveBackend) else CorpusBackend(self.backend)
        episode.state["backend"] = backend
        episode.resources.callback(backend.close)

    def task_prompt(self, task: Task) -> str:
        return f"Question: {task.prompt}" if task.prompt else ""  # a task that is a conversation only

    def dense_signal(self):
        """``dense_rewards=True``: a supporting article opened with ``get_article``
        (:func:`~benchmax_gym.envs.wikipedia.rubric.supporting_opened`)."""
        return supporting_opened

    def reference_solver(self) -> WikipediaSolver:
        return WikipediaSolver(self)

    def close(self):
        super().close()
        if isinstance(self.backend, LiveBackend):
            self.backend.shutdown()
