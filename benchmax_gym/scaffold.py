"""``benchmax-gym new NAME``: a new environment package, ready to install and publish.

The package has a family's layout (``tasks.py``, ``tools.py``, ``rubric.py``, ``solver.py``,
``env.py``, a README) around a small working example (count a letter in a word, with a tool that
counts), a contract test, and the ``benchmax_gym.envs`` entry point that registers its id when
``benchmax_gym`` is imported. It passes its own tests as generated: replace the example with your
tasks, tools and reward, and the tests say whether the env still keeps the contract.
"""

from __future__ import annotations

import keyword
import re
import sys
from pathlib import Path

# (fullmatch, not match with "$": "$" also matches before a final newline, which would name a
# folder "foo\n" and break the generated pyproject.toml)
# (and it ends with a letter or digit, as a project name must: `x-` would not install)
_NAME = re.compile(r"[A-Za-z](?:[A-Za-z0-9_-]*[A-Za-z0-9])?")
_ENV_ID = re.compile(r"[\w.\-]+/[\w.\-]+-v\d+")
# import names the generated package must not take: it would shadow them (the standard library,
# what its own code imports, its tests folder) or replace the library itself on install
_TAKEN = {"benchmax_gym", "gymnasium", "numpy", "pytest", "setuptools", "pip", "tests", "test"}


def names(name: str, env_id: str | None = None) -> dict[str, str]:
    """The package's names: distribution ``name``, import package, env class and id."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError("NAME must start with a letter, end with a letter or digit and hold only letters, digits, "
                         f"'-' and '_', got {name!r}")
    package = re.sub(r"[-]+", "_", name).lower()
    if keyword.iskeyword(package):
        raise ValueError(f"NAME {name!r} makes the package name {package!r}, a Python keyword")
    owner = _installed(name, package)
    if package in _TAKEN or package in sys.stdlib_module_names or _project(name) == "benchmax-gym" or owner:
        why = f"by the installed {owner}" if owner else "the standard library, benchmax-gym or what the package imports"
        raise ValueError(f"NAME {name!r} makes the package name {package!r} (project {_project(name)!r}), which is "
                         f"taken ({why}): choose another, e.g. 'my-{name}'")
    camel = "".join(part[:1].upper() + part[1:] for part in re.split(r"[-_]+", name) if part)
    given, env_id = env_id, env_id or f"{package}/{camel}-v0"
    if not isinstance(env_id, str) or not _ENV_ID.fullmatch(env_id):
        raise ValueError(f"--id must look like 'namespace/Name-v0', got {env_id!r}")
    import gymnasium as gym

    if env_id in gym.registry:  # its contract test would check that env, and its entry point would be refused
        raise ValueError(f"{'--id' if given else 'the id'} {env_id!r} is registered already: choose another "
                         f"{'--id' if given else 'NAME or --id'}")
    return {"name": name, "package": package, "camel": camel, "env_id": env_id}


def _project(name: str) -> str:
    """A project name as pip compares them (PEP 503): `Acme__Weather` is `acme-weather`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed(name: str, package: str) -> str | None:
    """The installed distribution that installing ``name`` would replace (the same project name)
    or whose import package ``package`` would shadow, if any."""
    from importlib.metadata import distributions, packages_distributions

    for dist in distributions():
        if _project(dist.metadata["Name"] or "") == _project(name):
            return dist.metadata["Name"]
    owners = packages_distributions().get(package)
    return owners[0] if owners else None


def scaffold(name: str, where: str | Path = ".", env_id: str | None = None) -> Path:
    """Write the package ``name`` into ``where/name`` (which must not exist); returns its folder."""
    n = names(name, env_id)
    root = Path(where) / name
    if root.exists():
        raise FileExistsError(f"{root} exists: choose another NAME or folder")
    files = {path.format(**n): text.replace("{{", "\0").replace("}}", "\1").format(**n)
             .replace("\0", "{").replace("\1", "}") for path, text in FILES.items()}
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text.lstrip("\n"))
    return root


# Templates: {name}, {package}, {camel}, {env_id} are filled in; {{ and }} are literal braces.
FILES = {
    "pyproject.toml": '''
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "{camel}: a benchmax-gym environment (count a letter in a word, with a counting tool)"
readme = "README.md"
requires-python = ">=3.11"
dependencies = ["benchmax-gym"]

[project.optional-dependencies]
test = ["pytest"]

# `import benchmax_gym` registers this id; the module loads only when gym.make asks for it.
[project.entry-points."benchmax_gym.envs"]
"{env_id}" = "{package}.env:{camel}Env"

[tool.setuptools]
packages = ["{package}"]

[tool.setuptools.package-data]
"{package}" = ["README.md"]
''',
    "README.md": '''
# {name}

`{env_id}`: a [benchmax-gym](https://github.com/benchmax-gym) environment.

```python
import gymnasium as gym
import benchmax_gym  # registers {env_id} from this package's entry point

env = gym.make("{env_id}")
obs, info = env.reset(seed=0)
```

- **Tasks** (`tasks.py`): how many times a letter occurs in a word, generated from a seed
  (`task_args={{"num_tasks": 100, "task_seed": 1}}`).
- **Tools** (`tools.py`): `count_letter(word, letter)`.
- **Reward** (`rubric.py`): 1 when `<answer>...</answer>` holds the count.
- **Solver** (`solver.py`): calls the tool, then answers; it proves every task is solvable.

Develop: `pip install -e '.[test]' && pytest`. The contract test (`tests/test_contract.py`) checks
the env with Gymnasium's checker, plays the solver to full reward, and feeds it bad actions.
Publish: `python -m build` and upload the wheel; `benchmax-gym list` shows the id with this
package's name and version wherever it is installed.
''',
    "{package}/__init__.py": '''
"""{camel}: a benchmax-gym environment. Its id, {env_id}, is registered from the package's
entry point when benchmax_gym is imported."""

ENV_ID = "{env_id}"
''',
    "{package}/README.md": '''
# {env_id}

Tools: `count_letter(word, letter)`. Tasks: count a letter in a word (generated, seeded).
Reward: exact match of `<answer>...</answer>` with the count.

Example episode:

```
user       How many times does the letter 'r' occur in 'strawberry'?
assistant  <tool_call>{{"name": "count_letter", "arguments": {{"word": "strawberry", "letter": "r"}}}}</tool_call>
tool       3
assistant  <answer>3</answer>          reward 1.0
```
''',
    "{package}/tasks.py": '''
"""Where tasks come from: a seeded generator (item i of a seed is always the same task)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmax_gym.core.sources import GeneratedSource
from benchmax_gym.core.tasks import Task, pick

WORDS = ("strawberry", "banana", "mississippi", "bookkeeper", "committee", "parallel", "assessment", "balloon")


@dataclass(frozen=True)
class GeneratedCounts(GeneratedSource):
    """``tasks="generated"``: how many times a letter occurs in a word (``num_tasks``, ``task_seed``)."""

    name = "generated"

    def make_task(self, rng, index: int) -> Task:
        word = pick(rng, WORDS)
        letter = pick(rng, sorted(set(word)))
        return Task(
            id=f"count-{{index}}",
            prompt=f"How many times does the letter {{letter!r}} occur in {{word!r}}?",
            answer=str(word.count(letter)),
            solution={{"word": word, "letter": letter}},
            metadata={{"word_length": len(word)}},
        )


TASK_SOURCES = (GeneratedCounts,)
''',
    "{package}/tools.py": '''
"""The tools the model may call: typed, documented functions (the schema comes from them)."""

from benchmax_gym import tool


@tool(inline=True)
def count_letter(word: str, letter: str) -> int:
    """Count how many times a letter occurs in a word.

    Args:
        word: the word to search.
        letter: one letter.
    """
    if len(letter) != 1:
        raise ValueError("letter must be a single character")
    return word.count(letter)


TOOLS = [count_letter]
''',
    "{package}/rubric.py": '''
"""The reward: 1 when the final answer (in <answer>...</answer>) is the count, else 0."""

from benchmax_gym import Rubric, final_answer


def correct(completion: str, answer: str) -> float:
    return float(final_answer(completion) == answer)


def rubric() -> Rubric:
    return Rubric([correct])
''',
    "{package}/solver.py": '''
"""The reference solver: reads the task's solution, calls the tool, answers with its result."""

from __future__ import annotations

import json
import re


class Solver:
    def __init__(self, env):
        self.env = env

    def __call__(self, obs: str, info: dict) -> str:
        if info.get("turn", 0) == 0:
            solution = self.env.episode.task.solution
            return "<tool_call>" + json.dumps({{"name": "count_letter", "arguments": solution}}) + "</tool_call>"
        found = re.search(r"-?\\d+", obs)
        return f"<answer>{{found.group() if found else ''}}</answer>"
''',
    "{package}/env.py": '''
"""{env_id}: the family's parts wired into benchmax-gym's one engine."""

from __future__ import annotations

from typing import Any

from benchmax_gym import ToolEnv, Toolset
from benchmax_gym.core.sources import task_source

from {package}.rubric import rubric
from {package}.solver import Solver
from {package}.tasks import TASK_SOURCES
from {package}.tools import TOOLS

SYSTEM_PROMPT = ("Answer questions about words. Use the tools when they help. Reply with the final answer "
                 "alone in <answer>...</answer>, for example <answer>2</answer>.")


class {camel}Env(ToolEnv):
    """Count a letter in a word with a counting tool.

    Args:
        tasks: ``"generated"`` (default) with ``task_args``, a TaskSource, or a list of tasks.
        task_args: the named source's arguments (``num_tasks``, ``task_seed``).
        **engine_kwargs: the engine's options (``max_turns``, ``tool_format``, ...).
    """

    choices = {{"task_args": TASK_SOURCES}}

    def __init__(self, tasks: Any = "generated", *, task_args: dict | None = None, max_turns: int = 4,
                 **engine_kwargs: Any):
        source = task_source(self, tasks, task_args, TASK_SOURCES, engine_kwargs)
        super().__init__(tasks=source, toolset=Toolset(TOOLS), rubric=rubric(), system_prompt=SYSTEM_PROMPT,
                         max_turns=max_turns, **engine_kwargs)

    def reference_solver(self) -> Solver:
        return Solver(self)
''',
    "tests/test_contract.py": '''
"""The promises every benchmax-gym environment keeps, for {env_id}."""

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import benchmax_gym  # noqa: F401  (registers the id from this package's entry point)
from benchmax_gym.testing import play

ENV_ID = "{env_id}"


@pytest.fixture
def env():
    env = gym.make(ENV_ID)
    yield env
    env.close()


def test_registered_by_the_entry_point():
    from benchmax_gym.registry.plugins import PLUGINS

    assert ENV_ID in gym.registry
    assert PLUGINS[ENV_ID].package == "{name}"


def test_gymnasium_env_checker(env):
    check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("seed", range(5))
def test_the_solver_reaches_full_reward(env, seed):
    played = play(env, seed=seed)
    assert played.terminated and played.reward == 1.0, played.transcript


def test_same_seed_same_task(env):
    first = env.reset(seed=7)[0]
    assert env.reset(seed=7)[0] == first


@pytest.mark.parametrize("action", ["<tool_call>{{not json", '<tool_call>{{"name": "nope", "arguments": {{}}}}</tool_call>',
                                    '<tool_call>{{"name": "count_letter", "arguments": {{"word": 3}}}}</tool_call>'])
def test_a_bad_action_is_an_observation_not_an_exception(env, action):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["error"] and not terminated and reward == 0.0


def test_a_wrong_answer_scores_zero(env):
    env.reset(seed=0)
    _, reward, terminated, _, _ = env.step("<answer>-1</answer>")
    assert terminated and reward == 0.0
''',
}
