"""The docs beside the README, as a user meets them: each family's README (and CRM's SERVICE.md),
benchmarks/README.md and the docstrings of what ``benchmax_gym`` exports. Every name, default and
number checked here is read from the doc's text, never copied into the test, so a doc that drifts
from the code (or code that drifts from its doc) fails here."""

import ast
import asyncio
import contextlib
import dataclasses
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest

import benchmax_gym
from benchmax_gym import registry
from benchmax_gym.core.env import ToolEnv
from benchmax_gym.testing import play

ROOT = Path(__file__).resolve().parents[1]
ENVS = ROOT / "benchmax_gym" / "envs"
FAMILIES = {  # doc -> the id it documents (its first line says which)
    "math": ENVS / "math" / "README.md", "wikipedia": ENVS / "wikipedia" / "README.md",
    "excel": ENVS / "excel" / "README.md", "crm": ENVS / "crm" / "README.md", "mcp": ENVS / "mcp" / "README.md",
    "crm-service": ENVS / "crm" / "SERVICE.md",
}
WORDS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def _env_id(doc: Path) -> str:
    return re.match(r"# (benchmax/[\w-]+-v\d+)\n", doc.read_text()).group(1)


def _section(doc: Path, heading: str) -> str:
    """The text under the first `## heading...` (the heading line's rest included)."""
    return doc.read_text().split(f"\n## {heading}", 1)[1].split("\n## ", 1)[0]


def _rows(text: str) -> list[list[str]]:
    """A section's markdown table rows (header and rule lines left out), as cells."""
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")]
            for line in text.splitlines() if line.startswith("| ") and not line.startswith("|---")]
    return [row for row in rows if row[0] not in ("tool", "component", "`tasks=`", "type", "object",
                                                  "argument", "option", "backend")]


@contextlib.contextmanager
def _made(env_id: str, **kwargs):
    env = gym.make(env_id, **kwargs)
    try:
        yield env
    finally:
        env.close()


def _tool_params(env) -> dict[str, dict]:
    return {s["function"]["name"]: s["function"]["parameters"] for s in env.unwrapped.tool_schemas}


def _leaves(env) -> dict[str, float]:
    return {leaf.name: leaf.weight for leaf in env.unwrapped.rubric.children}


def _python_default(text: str):
    return {"None": None, "false": False, "true": True}.get(text, ast.literal_eval(text) if text[0].isdigit() else text)


# --- tools, components and task sources: each family doc's tables against the environment


@pytest.mark.parametrize("family", ["math", "wikipedia", "excel", "crm"])
def test_a_familys_tools_table_is_its_tools_with_their_arguments_and_defaults(family):
    """What the model is shown is what the doc says: each tool's name, its arguments, which are
    optional and their defaults (`limit=5`, `section=None`, `create_sheet=false`, `status?`)."""
    doc = FAMILIES[family]
    shown = {}
    for row in _rows(_section(doc, "Tools")):
        name, args = re.fullmatch(r"`(\w+)\((.*)\)`", row[0]).groups()
        shown[name] = [a.strip() for a in args.split(",") if a.strip()]
    with _made(_env_id(doc)) as env:
        tools = _tool_params(env)
    assert set(shown) == set(tools), (sorted(shown), sorted(tools))
    for name, args in shown.items():
        params, required = tools[name], set(tools[name].get("required") or ())
        names = [re.match(r"\w+", a).group(0) for a in args]
        assert names == list(params["properties"]), (name, names, list(params["properties"]))
        for arg, spec in zip(args, names):
            optional = "=" in arg or arg.endswith("?")
            assert (spec not in required) == optional, (name, arg)
            if "=" in arg:
                assert params["properties"][spec].get("default") == _python_default(arg.split("=", 1)[1]), (name, arg)


def test_the_service_env_has_crms_tools_plus_the_refund_tool_its_doc_names():
    tools_text = _section(FAMILIES["crm-service"], "Tools")
    count, name, args = re.search(r"CRM-v0's (\w+) .*?`(\w+)\(([\w, ]+)\)`", tools_text, re.DOTALL).groups()
    with _made("benchmax/CRM-v0") as crm, _made("benchmax/CRM-Service-v0") as service:
        crm_tools, service_tools = _tool_params(crm), _tool_params(service)
    assert len(crm_tools) == WORDS[count]
    assert list(service_tools) == [*crm_tools, name]
    assert list(service_tools[name]["properties"]) == [a.strip() for a in args.split(",")]
    assert set(service_tools[name]["required"]) == set(service_tools[name]["properties"])


@pytest.mark.parametrize("family", ["math", "wikipedia", "excel", "crm", "mcp"])
def test_a_familys_reward_components_are_the_rubrics_names_and_weights(family):
    """The component table (or, for MCP-v0, the sentence naming them) is what `info["reward_components"]`
    holds and how each is weighted: `reward_weights={...}` in the doc names them."""
    doc = FAMILIES[family]
    with _made(_env_id(doc)) as env:
        leaves = _leaves(env)
        if family == "mcp":  # "`answer` and `note`, half the reward each"
            names = re.search(r"`(\w+)` and `(\w+)`, half the reward each", doc.read_text()).groups()
            assert leaves == dict.fromkeys(names, 0.5)
            return
        table = {re.fullmatch(r"`(\w+)`", row[0]).group(1): float(row[1])
                 for row in _rows(_section(doc, "Reward")) if re.fullmatch(r"[\d.]+", row[1])}
        assert leaves == table
        for weights in re.findall(r"`reward_weights=(\{.*?\})`", doc.read_text()):
            assert set(ast.literal_eval(weights)) <= set(leaves), weights
        with _made(_env_id(doc), dense_rewards=True) as dense:  # "A per-turn component named `dense`"
            assert "named `dense`" in doc.read_text() and _leaves(dense)["dense"] == 0.2


def test_the_service_reward_is_resolved_of_state_and_statements_reported_at_weight_0():
    text = _section(FAMILIES["crm-service"], "Reward")
    final, weight, a, b = re.search(r"`(\w+)` \(weight (\d)\) = `min\((\w+), (\w+)\)`.*reported \(weight 0\)", text).groups()
    with _made("benchmax/CRM-Service-v0") as env:
        assert _leaves(env) == {final: float(weight), a: 0.0, b: 0.0}


def _sources(env_cls) -> dict[str, type]:
    return {source.name: source for source in env_cls.choices["task_args"]}


@pytest.mark.parametrize("family", ["math", "wikipedia", "excel", "crm"])
def test_a_familys_task_sources_are_the_ones_its_tasks_table_names_with_the_arguments_it_names(family):
    """Each `tasks=` row is a source `gym.make` takes, the one marked default is the default, each
    `key=` a row names is one of that source's `task_args` keys (as the section's first sentence
    says; a `name={...}` may instead be a `gym.make` argument, as `backend_args=`), and the
    `difficulty={...}` shown is the knobs with their defaults."""
    doc = FAMILIES[family]
    section = _section(doc, "Tasks")
    with _made(_env_id(doc)) as env:
        env_cls = type(env.unwrapped)
    sources = _sources(env_cls)
    make_args = set(inspect.signature(env_cls.__init__).parameters) | set(inspect.signature(ToolEnv.__init__).parameters)
    rows = {re.match(r'`"(\w+)"`', row[0]).group(1): row for row in _rows(section) if row[0].startswith('`"')}
    assert set(rows) == set(sources), (sorted(rows), sorted(sources))
    (default,) = [name for name, row in rows.items() if "(default)" in row[0]]
    assert inspect.signature(env_cls.__init__).parameters["tasks"].default == default
    for name, row in rows.items():
        fields = {f.name: f for f in dataclasses.fields(sources[name])}
        for key, brace in re.findall(r"`(\w+)=(\{?)", row[1]):
            assert key in fields or (brace and key in make_args), (name, key, sorted(fields))
        shown = re.search(r"`difficulty=(\{.*?\})`", row[1])
        if shown:
            knobs = ast.literal_eval(shown.group(1).replace("[...]", "None"))
            config = type(sources[name]().difficulty)
            defaults = {f.name: f.default for f in dataclasses.fields(config)}
            assert set(knobs) == set(defaults), (sorted(knobs), sorted(defaults))
            assert {k: v for k, v in knobs.items() if v is not None} == {k: defaults[k] for k in knobs if knobs[k] is not None}
    # "given as its config (`A`, `B` in `benchmax_gym.envs.x.mod` / `.other`)": those are the sources
    classes, modules = re.search(r"given as its config \(([^)]*?) in (`[\w.]+`(?: / `[\w.]+`)*)\)", section).groups()
    modules = re.findall(r"`([\w.]+)`", modules)
    modules = [modules[0], *(modules[0].rsplit(".", 1)[0] + m for m in modules[1:])]
    found = {}
    for cls in re.findall(r"`(\w+)`", classes):
        found[cls] = next(getattr(__import__(m, fromlist=[cls]), cls) for m in modules
                          if hasattr(__import__(m, fromlist=[cls]), cls))
    assert set(found.values()) <= set(sources.values()) and len(found) >= len(sources) - 1, found  # (Wikipedia's "file" unnamed)


def test_the_generated_task_types_listed_are_the_generators():
    """CRM's type table (CRMArena's nine plus two updates), Excel's seven types and the service
    env's types are the ones `task_types=[...]` accepts."""
    from benchmax_gym.envs.crm import service, tasks as crm_tasks
    from benchmax_gym.envs.excel import generator

    crm = _section(FAMILIES["crm"], "Tasks")
    listed = [re.match(r"`(\w+)`", row[0]).group(1) for row in _rows(crm.split("Generated types", 1)[1])]
    assert listed == list(crm_tasks.TASK_TYPES)
    qa, updates = re.search(r"CRMArena's (\w+), plus (\w+) updates", crm).groups()
    assert (WORDS[qa], WORDS[updates]) == (len(crm_tasks.QA_TYPES), len(crm_tasks.UPDATE_TYPES))
    excel_row = next(r for r in _rows(_section(FAMILIES["excel"], "Tasks")) if r[0].startswith('`"generated"`'))[1]
    count, types = re.search(r"(\w+) task types: (.*?)\. Knobs", excel_row).groups()
    types = re.findall(r"`(\w+)`", types)
    assert types == list(generator.TASK_TYPES) and WORDS[count] == len(types)
    rows = _rows(_section(FAMILIES["crm-service"], "Tasks"))
    assert {re.match(r"`(\w+)`", row[0]).group(1) for row in rows} == set(service.SERVICE_TYPES)


# --- every `name=` a family doc writes is an argument somewhere a user can pass it

# names the docs write with `=` that belong to other systems: a URL's query (`token=`, `api_key=`),
# MediaWiki's API (`prop=`, `list=`), the MCP SDK's Client (`mode=`), and the placeholder `key=`
FOREIGN = {"token", "api_key", "prop", "list", "mode", "key"}


def test_every_argument_a_family_doc_names_with_equals_exists():
    from benchmax_gym.core.users import LLMUser

    known = set(inspect.signature(ToolEnv.__init__).parameters) | {f.name for f in dataclasses.fields(LLMUser)}
    known |= {f.name for f in dataclasses.fields(benchmax_gym.Task)}  # (your own tasks: Task(files=..., answer=...))
    for doc in FAMILIES.values():
        with _made(_env_id(doc)) as env:
            env.reset(seed=0)
            env_cls = type(env.unwrapped)
            known |= set(inspect.signature(env_cls.__init__).parameters)
            known |= {p for params in _tool_params(env).values() for p in params["properties"]}
        for configs in getattr(env_cls, "choices", {}).values():
            for config in (configs.values() if isinstance(configs, dict) else configs):
                known |= {f.name for f in dataclasses.fields(config)}
    for doc in FAMILIES.values():
        named = set(re.findall(r"`(\w+)=", doc.read_text())) | set(re.findall(r"`gym\.make\([^`]*?(\w+)=", doc.read_text()))
        assert named - FOREIGN <= known, (doc.name, sorted(named - FOREIGN - known))


# --- the concrete numbers and names each doc states


def _query(env, sql: str) -> list:
    obs, *_ = env.step('<tool_call>' + json.dumps({"name": "query", "arguments": {"sql": sql}}) + '</tool_call>')
    return json.loads(obs.split("\n", 1)[1].rsplit("\n", 2)[0])


def test_the_crm_org_is_as_its_doc_describes_it():
    text = FAMILIES["crm"].read_text()
    cases, agents = (int(n.replace(",", "")) for n in re.search(r"default size is ([\d,]+) cases and (\d+) agents", text).groups())
    per_agent = int(re.search(r"one agent per (\d+) cases", text).group(1))
    states = re.search(r"customers in (\d+) states", text).group(1)
    categories, products = re.search(r"(\d+) categories, (\d+) products", text).groups()
    issues = re.search(r"(\d+) issue types", text).group(1)
    least, most = re.search(r"orders that peak around the holidays, (\d)-(\d) items each", text).groups()
    statuses = re.search(r"`Status` ([\w/]+),", text).group(1).split("/")
    case_prefix, user_prefix = re.search(r"\(`(\d+)` Case, `(\d+)` User", text).groups()
    id_length = re.search(r"Ids are (\d+)-character", text).group(1)
    rows, timeout = re.search(r"`query_max_rows` \((\d+)\).*?`query_timeout` \((\d+) s", text, re.DOTALL).groups()
    with _made("benchmax/CRM-v0") as env:
        params = inspect.signature(type(env.unwrapped).__init__).parameters
        assert (params["org_size"].default, params["query_max_rows"].default, params["query_timeout"].default) == \
            (cases, int(rows), float(timeout))
        env.reset(seed=0)
        count = lambda sql: _query(env, sql)["rows"][0][0]  # noqa: E731
        assert count('SELECT COUNT(*) FROM "Case"') == cases and count("SELECT COUNT(*) FROM User") == agents == cases // per_agent
        assert count("SELECT COUNT(DISTINCT BillingState) FROM Account") == int(states)
        assert (count("SELECT COUNT(*) FROM ProductCategory"), count("SELECT COUNT(*) FROM Product2")) == (int(categories), int(products))
        assert count("SELECT COUNT(*) FROM Issue__c") == int(issues)
        assert _query(env, "SELECT MIN(n), MAX(n) FROM (SELECT COUNT(*) n FROM OrderItem GROUP BY OrderId)")["rows"] == [[int(least), int(most)]]
        assert {r[0] for r in _query(env, 'SELECT DISTINCT Status FROM "Case"')["rows"]} == set(statuses)
        assert _query(env, 'SELECT DISTINCT substr(Id, 1, 3), length(Id) FROM "Case"')["rows"] == [[case_prefix, int(id_length)]]
        assert _query(env, "SELECT DISTINCT substr(Id, 1, 3) FROM User")["rows"] == [[user_prefix]]
        over = _query(env, 'SELECT Id FROM "Case"')
        assert len(over["rows"]) == int(rows) and over["truncated"] is True  # "with "truncated": true beyond"


def test_the_constants_the_docs_cite_are_the_codes():
    from benchmax_gym.core.sqlite_heap import QUERY_MEMORY_BYTES
    from benchmax_gym.envs.excel import recalc

    crm, excel, mcp = (FAMILIES[f].read_text() for f in ("crm", "excel", "mcp"))
    assert QUERY_MEMORY_BYTES == int(re.search(r"at most (\d+) MB\n?\s*\(`QUERY_MEMORY_BYTES`", crm).group(1)) * 2**20
    gib = re.search(r"within (\d+) GiB of\s+address space \(`recalc.LIBREOFFICE_MEMORY_BYTES`", excel).group(1)
    assert recalc.LIBREOFFICE_MEMORY_BYTES == int(gib) * 2**30
    assert recalc.LIBREOFFICE_TIMEOUT_S == int(re.search(r"killed after (\d+) s\s+\(`recalc.LIBREOFFICE_TIMEOUT_S`\)", excel).group(1))
    from benchmax_gym.envs.mcp.env import MCPEnv
    params = inspect.signature(MCPEnv.__init__).parameters
    assert params["max_message_mb"].default == float(re.search(r"\((\d+) by default\)", mcp).group(1))
    assert params["isolation"].default == re.search(r'`"(\w+)"` \(default\)', mcp).group(1)
    service = FAMILIES["crm-service"].read_text()
    with _made("benchmax/CRM-Service-v0") as env:
        assert env.unwrapped.max_turns == int(re.search(r"at `max_turns` \((\d+);", service).group(1))


def _dotted(name: str, family: str):
    """`benchmax_gym.core.users.LLM_USER_PROMPT`, `recalc.LIBREOFFICE_TIMEOUT_S` (in the family's
    package), `benchmax_gym.core.files`: the module or attribute it names."""
    import importlib

    parts = name.split(".")
    if parts[0] != "benchmax_gym":
        parts = ["benchmax_gym", "envs", family.split("-")[0], *parts]
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_file_module_and_attribute_a_family_doc_names_exists(family):
    doc = FAMILIES[family]
    text = doc.read_text()
    for path in set(re.findall(r"`([\w/.]+\.py)`", text)) | set(re.findall(r"\((\w+\.md)\)", text)):
        assert (ROOT / path).exists() or (doc.parent / path).exists(), path
    for name in set(re.findall(r"`((?:benchmax_gym|recalc)(?:\.\w+)+)`", text)):
        _dotted(name, family)


# --- the blocks, run as written


def test_the_service_docs_three_makes_run_as_written():
    """The scripted customer, an LLM customer (nothing is sent until the agent writes to it) and
    a bigger org of refund tasks."""
    code = re.search(r"```python\n(.*?)```", FAMILIES["crm-service"].read_text(), re.DOTALL).group(1)
    namespace: dict = {"gym": gym}
    made = []
    for statement in code.split("env = ")[1:]:
        exec(compile("env = " + statement, str(FAMILIES["crm-service"]), "exec"), namespace)  # noqa: S102
        made.append(namespace["env"])
    try:
        assert [type(env.unwrapped.user).__name__ for env in made] == ["ScriptedUser", "LLMUser", "ScriptedUser"]
        assert made[1].unwrapped.user.price == (0.15, 0.6)
        made[2].reset(seed=0)
        assert made[2].unwrapped.episode.task.metadata["type"] == "refund_request"
    finally:
        for env in made:
            env.close()


def test_the_service_docs_example_episode_is_what_the_reference_solver_plays():
    doc = FAMILIES["crm-service"]
    example = _section(doc, "Example episode")
    index = int(re.match(r" \(task (\d+),", example).group(1))
    transcript = re.search(r"```\n(.*?)```", example, re.DOTALL).group(1)
    with _made(_env_id(doc)) as env:
        played = play(env, options={"task_index": index})
        messages = env.unwrapped.messages[1:]
    said = [(m["role"], m["content"]) for m in messages if m["role"] in ("user", "assistant") and not m.get("tool_calls")]
    shown = [(line[:10].strip(), line[10:].split("  ->")[0].strip()) for line in transcript.splitlines()
             if line[:10].strip() in ("user", "assistant") and not line[10:].strip().startswith("->")]
    assert said == shown
    tool_results = [m["content"] for m in messages if m["role"] == "tool"]
    for line in transcript.splitlines():
        if line.startswith("tool") and '"rows": [[' in line:  # the rows each query returned
            assert any(line[10:].split('"rows": ', 1)[1].split("]]", 1)[0] in result for result in tool_results), line
        elif line.startswith("tool"):
            assert line[10:].strip() in tool_results, line
    reward = re.search(r"-> (\w+) ([\d.]+) \((\w+) ([\d.]+), (\w+) ([\d.]+)\)", transcript).groups()
    assert played.infos[-1]["reward_components"] == {reward[i]: float(reward[i + 1]) for i in (0, 2, 4)}


def test_the_mcp_consume_block_runs_as_written_with_the_venv_activated(monkeypatch):
    """`python -m mcp_server_time` is the activated venv's (the doc says so): its tool answers."""
    pytest.importorskip("mcp_server_time")
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    code = re.findall(r"```python\n(.*?)```", _section(FAMILIES["mcp"], "Consume"), re.DOTALL)[0]
    namespace: dict = {"gym": gym, "my_reward": lambda completion: 0.0}
    exec(compile(code, str(FAMILIES["mcp"]), "exec"), namespace)  # noqa: S102
    env = namespace["env"]
    try:
        obs, _ = env.reset(seed=0)
        assert obs.endswith("What time is it in Tokyo?")
        obs, _, _, _, info = env.step('<tool_call>{"name": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}</tool_call>')
        assert info.get("error") is None and '"timezone": "Asia/Tokyo"' in obs
    finally:
        env.close()


def test_the_mcp_dense_rewards_block_pays_its_milestone_once():
    """The doc's `saved` milestone over the bundled server (its `server=...`, `tasks=...` filled
    in): the first save pays 0.2, the same save again nothing."""
    from benchmax_gym.envs.mcp.env import EXAMPLE_SERVER

    code = _section(FAMILIES["mcp"], "Dense rewards")
    code = re.search(r"```python\n(.*?)```", code, re.DOTALL).group(1)
    code = code.replace("server=...", "server=SERVER").replace("tasks=...", "tasks=TASKS").replace("\ngym.make(", "\nenv = gym.make(")
    namespace: dict = {"gym": gym, "my_reward": lambda completion: float("<answer>ok</answer>" in completion),
                       "SERVER": EXAMPLE_SERVER, "TASKS": [{"prompt": "Save a note titled x with text y."}]}
    exec(compile(code, str(FAMILIES["mcp"]), "exec"), namespace)  # noqa: S102
    env = namespace["env"]
    save = '<tool_call>{"name": "add_note", "arguments": {"title": "x", "text": "y"}}</tool_call>'
    try:
        env.reset(seed=0)
        assert [env.step(save)[1] for _ in range(2)] == [0.2, 0.0]
        _, reward, terminated, _, info = env.step("<answer>ok</answer>")
        assert terminated and info["reward_components"]["saved"] == 1.0
    finally:
        env.close()


def _spaced(arguments: dict) -> dict:
    """Arguments with their white space collapsed (the doc wraps a long SQL string)."""
    return {k: " ".join(v.split()) if isinstance(v, str) else v for k, v in arguments.items()}


@pytest.mark.parametrize("family", ["math", "wikipedia", "excel", "crm", "mcp"])
def test_a_familys_example_episode_shows_the_solvers_calls_and_results(family):
    """Beyond its prompt and last reply (tests/test_readme.py): each call shown is one the reference
    solver makes, and each tool result shown begins as the solver's did (`...` cuts it)."""
    doc = FAMILIES[family]
    heading, transcript = _section(doc, "Example episode").split("\n", 1)
    make = re.search(r"`task_args=(\{.*?\})`", heading)
    reset = re.search(r"reset\((\w+)=(.*?)\)`", heading)
    with _made(_env_id(doc), **({"task_args": json.loads(make.group(1))} if make else {})) as env:
        play(env, **{reset.group(1): ast.literal_eval(reset.group(2))})
        messages = env.unwrapped.messages
    calls = [(c["function"]["name"], _spaced(json.loads(c["function"]["arguments"])))
             for m in messages for c in m.get("tool_calls") or ()]
    results = [m["content"] for m in messages if m["role"] == "tool"]
    for shown in re.findall(r"<tool_call>(.*?)</tool_call>", transcript, re.DOTALL):
        shown = " ".join(shown.split())
        if "..." in shown:  # cut: its name and the arguments before the cut
            name = json.loads(shown.split(', "arguments"')[0] + "}")["name"]
            assert any(n == name and json.dumps(a).startswith(shown.split('"arguments": ')[1].split("...")[0].rstrip(", ")[:30])
                       for n, a in calls), shown
        else:
            call = json.loads(shown)
            assert (call["name"], _spaced(call["arguments"])) in calls, shown
    for block in re.findall(r"^tool:\s+(.*?)(?=^\w+:|\Z)", transcript, re.DOTALL | re.MULTILINE):
        first = block.splitlines()[0].split(" ...")[0].strip()
        assert any(result.strip().startswith(first) for result in results), (first, results)


def _serve(argv: list[str], env: dict):
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stderr.readline()
    return proc, line


def test_the_mcp_serve_block_serves_over_stdio_and_http_with_the_token_the_doc_shows(tmp_path):
    """Each command of the Serve block (a free port for 8000): over stdio the Excel tools the Excel
    doc lists; over HTTP the stderr line shown; with the token, 401 without it and the doc's client
    line with it."""
    import httpx
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    serve = _section(FAMILIES["mcp"], "Serve")
    block = re.search(r"```bash\n(.*?)```", serve, re.DOTALL).group(1)
    lines = [line.split("  #")[0].split() for line in block.splitlines() if "mcp-serve" in line and not line.startswith("#")]
    stdio, http, token_line = lines
    shown = re.search(r"# stderr: (.*)", block).group(1)
    base = [sys.executable, "-m", "benchmax_gym"]

    async def listed():
        params = StdioServerParameters(command=base[0], args=[*base[1:], *stdio[1:]], cwd=str(tmp_path))
        async with Client(params) as client:
            return {t.name for t in (await client.list_tools()).tools}

    excel_tools = {re.match(r"`(\w+)", row[0]).group(1) for row in _rows(_section(FAMILIES["excel"], "Tools"))}
    assert asyncio.run(listed()) == excel_tools
    http[http.index("--port") + 1] = "0"
    proc, line = _serve([*base, *http[1:]], dict(os.environ))
    try:
        assert re.fullmatch(re.sub(r"\d{4,5}", r"\\d+", re.escape(shown)), line.strip()), (line, shown)
    finally:
        proc.kill()
        proc.wait()
    variable, token = token_line[0].split("=", 1)
    proc, line = _serve([*base, *token_line[2:]], {**os.environ, variable: token})
    try:
        url = re.search(r"http://\S+", line).group(0)
        assert httpx.post(url, json={}).status_code == 401
        client_line = re.search(r"`(Client\(streamable_http_client\(.*?\)\))`", serve).group(1)
        namespace: dict = {"url": url, "token": token, "Client": Client}
        for name, module in re.findall(r"`(\w+)` (?:is\s+)?in\s+(?:the SDK's\s+)?`([\w.]+)`", serve):  # where the doc says they are
            namespace[name] = getattr(__import__(module, fromlist=[name]), name)

        async def calculate():
            async with eval(client_line, namespace) as client:  # noqa: S307
                return (await client.call_tool("calculator", {"expression": "6*7"})).content[0].text

        assert asyncio.run(calculate()) == "42"
    finally:
        proc.kill()
        proc.wait()


def test_the_mcp_serve_options_table_is_the_commands_flags_with_their_defaults():
    table = _rows(_section(FAMILIES["mcp"], "Serve").split("HTTP options:", 1)[1])
    done = subprocess.run([sys.executable, "-m", "benchmax_gym", "mcp-serve", "--help"], capture_output=True, text=True, timeout=60)
    helptext = " ".join(done.stdout.split("\nexamples:")[0].split())  # (the options, not the examples after them)
    for row in table:
        flag = re.fullmatch(r"`(--[\w-]+)`", row[0]).group(1)
        assert flag in helptext, flag
        stated = re.search(r"(?:^|\()([\d.]+)\)? by default|^seconds \((\d+)\)|^sessions open at once \((\d+)\)", row[1])
        if stated:
            value = next(v for v in stated.groups() if v)
            default = re.search(r"\(default: ([^;),]+)", helptext[helptext.rfind(flag + " "):]).group(1)
            assert default == value, (flag, default, value)


# --- benchmarks/README.md: every command's flags are the script's, every key it names is printed

BENCH = ROOT / "benchmarks"
BENCH_README = BENCH / "README.md"


def _help(script: str) -> str:
    path = ROOT / "examples" / "learn" / "learn.py" if script == "learn" else BENCH / f"{script}.py"
    done = subprocess.run([sys.executable, str(path), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if done.returncode == 2 and "needs " in done.stderr:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr
    return done.stdout


def _chunks(text: str) -> list[tuple[set[str], str]]:
    """Paragraphs and bullets, each with the scripts it names (else the previous one's)."""
    chunks, scripts = [], set()
    parts = re.split(r"\n\s*\n|\n(?=\* )", text)
    for chunk, after in zip(parts, [*parts[1:], ""]):
        named = {name for name in re.findall(r"(\w+)\.py\b", chunk) if (BENCH / f"{name}.py").exists()}
        scripts = named or scripts
        # a paragraph may name its figures before the command block that runs the script
        shown_next = set(re.findall(r"benchmarks/(\w+)\.py\b", after)) if after.lstrip().startswith("```") else set()
        chunks.append((scripts | shown_next, chunk))
    return chunks


BENCH_COMMANDS = [line.split("#")[0].split() for line in BENCH_README.read_text().splitlines()
                  if line.strip().startswith("python benchmarks/")]


@pytest.mark.parametrize("argv", BENCH_COMMANDS, ids=[f"{i}-{Path(a[1]).stem}" for i, a in enumerate(BENCH_COMMANDS)])
def test_each_benchmark_command_the_readme_shows_is_accepted(argv):
    """The line parses, its flags and values (with `--help` added: argparse checks each value
    before it meets `--help`), and each flag is one the script's help lists (argparse would take
    an unknown one before `--help` silently); after `--`, learning.py's flags are learn.py's."""
    ours, theirs = (argv[2:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv[2:], [])
    done = subprocess.run([sys.executable, str(ROOT / argv[1]), *ours, "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    if done.returncode == 2 and "needs " in done.stderr:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, (argv, done.stderr)
    for flag in [a for a in ours if a.startswith("--")]:
        assert re.search(re.escape(flag) + r"\b", done.stdout), (argv, flag)
    for flag in [a for a in theirs if a.startswith("--")]:
        assert re.search(re.escape(flag) + r"\b", _help("learn")), (argv, flag)


def test_each_flag_the_benchmarks_readme_names_is_its_scripts():
    """`--only`, `--jobs`, `--copies`, `--latency-jitter`...: each in the help of a script its
    paragraph names (a code block, the next paragraph, counts)."""
    text = BENCH_README.read_text()
    helps: dict[str, str] = {}
    for scripts, chunk in _chunks(text):
        for flag in set(re.findall(r"`[^`]*?(--[a-z][\w-]*)", chunk)):
            def lists(script):  # learning.py's help is slow (its imports): asked last, and once
                if script not in helps:
                    helps[script] = _help(script)
                return re.search(re.escape(flag) + r"\b", helps[script])

            assert any(lists(s) for s in sorted(scripts, key=lambda s: s == "learning")), (flag, scripts, chunk[:200])


def test_every_figure_key_the_benchmarks_readme_names_is_one_its_script_prints():
    text = BENCH_README.read_text()
    package = "\n".join(p.read_text() for p in (ROOT / "benchmax_gym").rglob("*.py"))
    for scripts, chunk in _chunks(text):
        source = "\n".join((BENCH / f"{s}.py").read_text() for s in scripts if (BENCH / f"{s}.py").exists())
        for key in set(re.findall(r"`([a-z]+(?:_[a-z0-9]+)+)`", chunk)):
            printed = f'"{key}"' in source or f"'{key}'" in source
            assert printed or re.search(rf"\b{key}\b", package), (key, scripts)


def test_run_all_writes_the_keys_the_readme_says(tmp_path):
    keys = re.search(r"writes one line per script: `\{(.*?)\}`", BENCH_README.read_text()).group(1)
    keys = {k.strip().strip('"') for k in keys.split(",")}
    out = tmp_path / "results.jsonl"
    done = subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--only", "parse_hostile", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    [line] = map(json.loads, out.read_text().splitlines())
    assert set(line) == keys


# --- the package's exported docstrings: their examples run, the arguments they name exist


def _doc_sections(obj) -> dict[str, list[str]]:
    doc, found = inspect.getdoc(obj) or "", {}
    for section in ("Args", "Attributes"):
        body = re.search(section + r":\n((?:    .*\n?|\n)+)", doc)
        if body:
            names = []
            for line in body.group(1).splitlines():
                head = re.match(r"    (\*{0,2}[\w /,]+?):", line)
                if head and not line.startswith("     "):
                    names += [x.strip().lstrip("*") for x in re.split(r"[/,]", head.group(1))]
            found[section] = names
    return found


@pytest.mark.parametrize("name", benchmax_gym.__all__)
def test_an_exported_docstrings_named_arguments_exist(name):
    obj = getattr(benchmax_gym, name)
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = set(inspect.signature(target).parameters)
    sections = _doc_sections(obj)
    assert set(sections.get("Args", ())) <= params, sorted(set(sections["Args"]) - params)
    fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
    assert set(sections.get("Attributes", ())) <= set(dir(obj)) | fields | params
    for keyword in re.findall(r"``(\w+)=", inspect.getdoc(obj) or ""):
        assert keyword in params or keyword in {"episode", "state", "truncated"}, keyword  # tools' keywords; the step's flag


def _example(obj) -> str:
    return textwrap.dedent(inspect.getdoc(obj).split("::\n", 1)[1])


def test_the_exported_docstring_examples_run():
    """ToolEnv's and the package's `gym.make` examples, register_tool_env's (with the `add` tool it
    leaves to the reader) and UnicodeText's doctest."""
    import doctest

    from benchmax_gym import tool

    namespace: dict = {"gym": gym}
    exec(_example(ToolEnv), namespace)  # noqa: S102
    assert "4" in namespace["obs"] and not namespace["terminated"]
    namespace["env"].close()
    exec(_example(benchmax_gym), namespace)  # noqa: S102
    namespace["env"].close()

    @tool(inline=True)
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first.
            b: the second.
        """
        return a + b

    namespace = {"gym": gym, "add": add, "register_tool_env": benchmax_gym.register_tool_env}
    try:
        exec(_example(benchmax_gym.register_tool_env), namespace)  # noqa: S102
        env = namespace["env"]
        env.reset(seed=0)
        assert env.step("5")[1] == 1.0
        env.close()
    finally:
        gym.registry.pop("me/Add-v0", None)
        registry.ENVS.pop("me/Add-v0", None)
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder().find(benchmax_gym.UnicodeText, "UnicodeText", globs={"UnicodeText": benchmax_gym.UnicodeText}):
        runner.run(test)
    assert runner.failures == 0 and runner.tries >= 2


def test_the_crmarena_rows_make_runs_as_written_over_an_org_file(tmp_path, monkeypatch):
    """`org_db` is `gym.make`'s own argument (a task argument was refused: "unknown task_args key
    'org_db'"): the row's call, in a folder holding its two files, plays a CRMArena task."""
    import shutil

    from benchmax_gym.envs.crm.org import cached_org

    row = next(r for r in _rows(_section(FAMILIES["crm"], "Tasks")) if r[0] == '`"crmarena"`')[1]
    call = re.search(r"`(gym\.make\(.*?\))`", row).group(1)
    names = ast.literal_eval(re.search(r"task_args=(\{.*?\})", call).group(1)), re.search(r'org_db="(.*?)"', call).group(1)
    monkeypatch.chdir(tmp_path)
    shutil.copy(cached_org(0, 500, tmp_path / "cache"), names[1])
    record = {"idx": 0, "task": "knowledge_qa", "query": "How long is the warranty on headphones?",
              "answer": "36 months", "reward_metric": "fuzzy_match", "metadata": {}}
    Path(names[0]["dataset"]).write_text(json.dumps(record) + "\n")
    env = eval(call, {"gym": gym})  # noqa: S307
    try:
        assert play(env, seed=0).reward == 1.0 and env.unwrapped.org_db == names[1]
    finally:
        env.close()


BOUNDS = [  # (family, the doc's phrase with the number, the module and constant it states, the unit)
    ("excel", r"at most ([\d,]+) cells per read", "excel.tools.MAX_READ_CELLS", 1),
    ("excel", r"saved at once; at most ([\d,]+) cells", "excel.tools.MAX_WRITE_CELLS", 1),
    ("crm", r"patterns are\s+limited to (\d+) characters", "crm.tools.MAX_PATTERN_CHARS", 1),
    ("crm", r"strings and\s+blobs are capped at (\d+) MB", "crm.tools.MAX_VALUE_BYTES", 10**6),
    ("mcp", r"a description is cut at ([\d,]+)\s+characters", "mcp.tools.MAX_DESCRIPTION_CHARS", 1),
    ("mcp", r"a schema as shown at ([\d,]+)", "mcp.tools.MAX_SCHEMA_CHARS", 1),
    ("mcp", r"the smaller of ([\d,]+) characters", "mcp.tools.MAX_TOOL_LIST_CHARS", 1),
    ("mcp", r"An input schema over ([\d,]+) characters", "mcp.tools.MAX_CHECKED_SCHEMA_CHARS", 1),
    ("mcp", r"is read as (\d+) s at most", "mcp.http_transport.MAX_RETRY_MS", 1000),
    ("wikipedia", r"queries over (\d+) characters", "wikipedia.tools.MAX_QUERY_CHARS", 1),
    ("wikipedia", r"up to `limit` \(1-(\d+)\)", "wikipedia.tools.MAX_RESULTS", 1),
    ("wikipedia", r"([\d,]+) characters at a time", "wikipedia.tools.CHUNK_CHARS", 1),
    ("wikipedia", r"one over (\d+) MiB ends the episode", "wikipedia.backends.MAX_RESPONSE_BYTES", 2**20),
]


@pytest.mark.parametrize(("family", "phrase", "constant", "unit"), BOUNDS, ids=[b[2] for b in BOUNDS])
def test_a_bound_a_family_doc_states_is_the_codes(family, phrase, constant, unit):
    stated = re.search(phrase, FAMILIES[family].read_text())
    assert stated, phrase
    module, name = constant.rsplit(".", 1)
    value = getattr(__import__(f"benchmax_gym.envs.{module}", fromlist=[name]), name)
    assert value == int(stated.group(1).replace(",", "")) * unit


def test_the_calculators_examples_answer_as_the_math_doc_says():
    """"`6/3` is `2`, `7/2` is `3.5`", and its two errors come back as tool errors."""
    row = _rows(_section(FAMILIES["math"], "Tools"))[0][1]
    pairs = re.findall(r"`([\d/*+-]+)` is `([\d.]+)`", row)
    errors = re.search(r"Errors \(`(.*?)`, `(.*?)`\) come back as tool errors", row).groups()
    assert len(pairs) >= 2
    with _made("benchmax/Math-v0") as env:
        env.reset(seed=0)

        def calculate(expression):
            call = {"name": "calculator", "arguments": {"expression": expression}}
            obs, _, _, _, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
            return obs.split("\n")[1], info.get("error")

        for expression, value in pairs:
            assert calculate(expression) == (value, None)
        for expression, error in (("1/0", errors[0]), ("__import__('os')", errors[1])):
            assert calculate(expression) == (f"Error: {error}", "tool_error")


def test_each_wikipedia_backend_is_the_default_for_the_tasks_its_table_says():
    from benchmax_gym.envs.wikipedia.env import DEFAULT_BACKEND

    doc = FAMILIES["wikipedia"]
    shown = {re.search(r'`tasks="(\w+)"`', row[2]).group(1): row[0].strip("`") for row in _rows(_section(doc, "Backends"))}
    shown["file"] = re.search(r"played with the default `(\w+)` backend", _section(doc, "Tasks")).group(1)
    assert shown == DEFAULT_BACKEND


def test_the_server_entry_keys_and_transports_the_mcp_doc_names_are_accepted(tmp_path):
    """`{"command", "args", "env", "cwd"}`, `headers` and `secrets` on an HTTP entry, each
    `type`/`transport` named; SSE refused, as the doc says."""
    from benchmax_gym.envs.mcp.tools import parse_servers

    row = next(r for r in _rows(_section(FAMILIES["mcp"], "Consume")) if r[0] == "`server`")[1]
    stdio_keys = re.findall(r'"(\w+)"', re.search(r"a stdio server `\{(.*?)\}`", row).group(1))
    values = {"command": sys.executable, "args": ["-c", "pass"], "env": {"A": "b"}, "cwd": str(tmp_path)}
    transports = re.findall(r'"([\w-]+)"', re.search(r"may be (.*?); SSE", row).group(1))
    assert "stdio" in transports and len(transports) >= 3
    for transport in transports:
        if transport == "stdio":
            entry = {**{k: values[k] for k in stdio_keys}, "type": transport}
        else:
            entry = {"url": "http://127.0.0.1:9/mcp", "transport": transport, "headers": {"X-Region": "eu"},
                     "secrets": [re.search(r'"secrets":\s*\["(\w+)"\]', FAMILIES["mcp"].read_text()).group(1)]}
        assert parse_servers(entry), entry
    with pytest.raises(ValueError, match="sse|SSE"):
        parse_servers({"url": "http://127.0.0.1:9/sse", "type": "sse"})
