"""The README's examples, run as written."""

import contextlib
import itertools
import json
import queue
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import pytest

from benchmax_gym import registry
from benchmax_gym.core.tools import ArgumentError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_in_process import run_in_process  # noqa: E402  (the README's commands: their words and status)

README = Path(__file__).resolve().parents[1] / "README.md"


def _code_block(heading: str, contains: str) -> str:
    section = README.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return next(block for block in re.findall(r"```python\n(.*?)```", section, re.DOTALL) if contains in block)


def test_add_an_environment_example_rewards_the_answer_not_a_guess_list():
    namespace: dict = {}
    exec(compile(_code_block("Add an environment", "register_tool_env("), str(README), "exec"), namespace)  # noqa: S102
    env = namespace["env"]
    try:
        def final_reward(reply: str) -> float:
            env.reset(seed=0)
            _, reward, terminated, _, _ = env.step(reply)
            assert terminated
            return reward

        assert final_reward("<answer>Peru</answer>") == 1.0
        assert final_reward("Lima is in <answer> peru </answer>.") == 1.0
        for gaming in ("Peru? France? Chile?", "<answer>Peru? France? Chile?</answer>",
                       "<answer>Peru or France</answer>", "Peru"):
            assert final_reward(gaming) == 0.0, gaming
        # and its tool works through the environment
        env.reset(seed=0)
        obs, *_ = env.step('<tool_call>{"name": "lookup", "arguments": {"city": "Lima"}}</tool_call>')
        assert "Peru" in obs
    finally:
        env.close()
        gym.registry.pop("me/Geo-v0", None)
        registry.ENVS.pop("me/Geo-v0", None)


def test_add_an_environment_state_and_terminal_tool_example_grades_the_final_state():
    namespace: dict = {}
    exec(compile(_code_block("Add an environment", "setup=open_bank"), str(README), "exec"), namespace)  # noqa: S102
    env = namespace["env"]
    call = '<tool_call>{{"name": "{}", "arguments": {}}}</tool_call>'.format
    try:
        env.reset(seed=0)
        db = env.unwrapped.episode.setup_state
        obs, _, _, _, info = env.step(call("transfer", '{"source": "alice", "target": "bob", "amount": 500}'))
        assert info["error"] == "tool_error" and "cannot move 500" in obs  # refused; the episode goes on
        env.step(call("transfer", '{"source": "alice", "target": "bob", "amount": 30}'))
        obs, reward, terminated, _, _ = env.step(call("done", '{"summary": "moved 30"}'))
        assert terminated and reward == 1.0 and "session closed" in obs
        env.reset(seed=0)  # the last episode's database is closed; this one starts afresh
        with pytest.raises(sqlite3.ProgrammingError):
            db.execute("SELECT 1")
        _, reward, terminated, _, _ = env.step(call("done", '{"summary": "nothing"}'))
        assert terminated and reward == 0.0
    finally:
        env.close()
        gym.registry.pop("me/Bank-v0", None)
        registry.ENVS.pop("me/Bank-v0", None)


def test_add_an_environment_from_schema_example_validates_calls():
    namespace: dict = {}
    exec(compile(_code_block("Add an environment", "Tool.from_schema("), str(README), "exec"), namespace)  # noqa: S102
    weather = namespace["weather"]
    assert weather.fn(**weather.validate({"city": "Lima", "units": "F"})) == "18 degrees F in Lima"
    with pytest.raises(ArgumentError, match="'K' is not one of"):
        weather.validate({"city": "Lima", "units": "K"})


def test_mixtures_example_runs_three_members_through_make_vec():
    namespace: dict = {}
    exec(compile(_code_block("Mixtures and curricula", "make_vec"), str(README), "exec"), namespace)  # noqa: S102
    info, state = namespace["info"], namespace["state"]
    assert set(info["member"]) <= {"Math-v0", "Wikipedia-v0", "CRM-v0"}
    assert namespace["terminated"].all()
    assert all(k.split("/")[0] in ("Math-v0", "Wikipedia-v0", "CRM-v0")
               for k in info["reward_components"] if not k.startswith("_"))
    assert len(state["envs"]) == 4  # every Math episode was counted by the parent's controller:
    assert state["curriculum"]["members"]["Math-v0"]["episodes"] == list(info["member"]).count("Math-v0")


def test_group_rewards_example_scores_a_vector_envs_group():
    namespace: dict = {}
    exec(compile(_code_block("Rewards", "score_vector_group("), str(README), "exec"), namespace)  # noqa: S102
    records = namespace["records"]
    assert len(records) == 4 and all(r["group_size"] == 4 and r["task_index"] == 3 for r in records)
    assert [r["group_components"]["diverse"] for r in records] == [-1 / 3, -1 / 3, 0.0, 0.0]
    assert records[0]["reward"] == records[0]["group_components"]["rank"] + 0.1 * (-1 / 3)


def test_judged_rewards_example_builds_a_judge_that_scores_through_an_endpoint(tmp_path, monkeypatch):
    import asyncio

    from benchmax_gym.core.tasks import Task
    from benchmax_gym.testing.openai_server import FakeChatServer

    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(tmp_path))
    with FakeChatServer(lambda body: {"content": "<score>0.25</score>"}, models=["Qwen/Qwen3-32B"]) as server:
        code = _code_block("Rewards", "JudgeRubric(").replace("http://localhost:8000/v1", server.url)
        namespace: dict = {"exact": lambda completion: 0.0}
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102
        judge = namespace["judge"]
        assert namespace["rubric"].names == ["correct", "judge"]
        assert asyncio.run(judge.score("Lima", task=Task(id="q", prompt="Capital of Peru?", answer="Lima"))) == 0.25
        sent = server.requests[-1]["messages"][0]["content"]
        assert sent.startswith("Task: Capital of Peru?\nReference: Lima\nReply:\nLima\n")
        judge.close()


def test_the_simulated_user_example_asks_the_customer_and_grades_when_they_are_done():
    namespace: dict = {"gym": gym}
    exec(compile(_code_block("Add an environment", "user=customer"), str(README), "exec"), namespace)  # noqa: S102
    env = namespace["env"]
    try:
        env.reset(seed=0)
        obs, *_ = env.step("What is your order number?")
        assert obs == "It is A-17."
        obs, *_ = env.step('<tool_call>{"name": "find_order", "arguments": {"order_number": "A-17"}}</tool_call>')
        assert "shipped" in obs
        _, reward, terminated, _, info = env.step("Your order has <answer>shipped</answer>.")
        assert terminated and reward == 1.0 and info["user"]["calls"] == 2
    finally:
        env.close()
        gym.registry.pop("me/Support-v0", None)
        registry.ENVS.pop("me/Support-v0", None)


def test_rewards_examples_compose_gate_and_pay_a_milestone_once():
    section = README.read_text().split("## Rewards\n", 1)[1].split("\n## ", 1)[0]
    namespace: dict = {}
    try:
        exec(compile(_code_block("Rewards", "gate("), str(README), "exec"), namespace)  # noqa: S102
        env = namespace["env"]
        env.reset(seed=0)
        _, reward, *_, info = env.step("<answer>Peru</answer> <answer>Chile</answer>")
        assert reward == 0.0 and info["reward_components"]["one_answer"] == 0.0  # the gate holds the body at 0
        assert "└─ 1 × single_answer: gate" in repr(env.unwrapped.rubric)
        exec(compile(_code_block("Rewards", "milestones("), str(README), "exec"), namespace)  # noqa: S102
        env = namespace["env"]
        env.reset(seed=0)
        lookup = namespace["lookup"]
        rewards = [env.step(a)[1] for a in (lookup, lookup, lookup)]
        _, final, terminated, _, info = env.step("<answer>Peru</answer>")
        assert rewards == [0.2, 0.0, 0.0] and final == 1.0 and terminated
        assert info["reward_components"] == {"correct": 1.0, "found": 1.0}
        assert "dense_rewards=True" in section
    finally:
        for env_id in ("me/Capitals-v0", "me/Geo-v1"):
            gym.registry.pop(env_id, None)
            registry.ENVS.pop(env_id, None)


# --- what a new user meets first: the id list, the eval example, the figures' sources, the family examples

ROOT = README.parent


def _section(heading: str, path: Path = README) -> str:
    return path.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_environments_section_lists_every_registered_benchmax_id_and_only_those():
    import benchmax_gym  # noqa: F401  (registers the ids)

    registered = {env_id for env_id in gym.registry if env_id.startswith("benchmax/")}
    listed = set(re.findall(r"`(benchmax/[\w-]+-v\d+)`", _section("Environments")))
    assert listed == registered, (sorted(registered - listed), sorted(listed - registered))


def test_the_eval_example_output_is_what_the_solver_command_prints(tmp_path):
    import shlex
    import subprocess
    import sys

    section = _section("Evaluate a model")
    command = next(line for line in section.splitlines() if line.startswith("benchmax-gym eval") and "--policy solver" in line)
    argv = shlex.split(command.split("#")[0])[1:]
    argv[argv.index("--out") + 1] = str(tmp_path / "solver-math")
    shown = re.search(r"prints[^\n]*:\n\n```\n(.*?)```", section, re.DOTALL).group(1).splitlines()
    done = subprocess.run([sys.executable, "-m", "benchmax_gym", *argv, "--no-plots", "--quiet"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    assert [line for line in printed if not line.startswith("run directory")] == \
        [line for line in shown if not line.startswith("run directory")]


def test_every_benchmark_script_the_docs_name_exists_and_the_layout_lists_them_all():
    docs = [README, ROOT / "benchmarks" / "README.md", *ROOT.glob("benchmax_gym/envs/*/README.md")]
    named = {name for doc in docs for name in re.findall(r"benchmarks/(\w+)\.py", doc.read_text())}
    scripts = {path.stem for path in (ROOT / "benchmarks").glob("*.py") if not path.name.startswith("_")}
    assert named <= scripts, sorted(named - scripts)
    assert scripts <= set(re.findall(r"\w+", _section("Layout"))), sorted(scripts - set(re.findall(r"\w+", _section("Layout"))))


FAMILY_EXAMPLES = [  # README, gym.make arguments and reset arguments its example episode's heading names
    ("math", "benchmax/Math-v0", {}, {"seed": 2}),
    ("wikipedia", "benchmax/Wikipedia-v0", {}, {"seed": 0}),
    ("excel", "benchmax/Excel-v0", {"task_args": {"difficulty": {"rows": 6}}}, {"seed": 1}),
    ("crm", "benchmax/CRM-v0", {"task_args": {"task_types": ["route_case"]}}, {"seed": 1}),
    ("mcp", "benchmax/MCP-v0", {}, {"options": {"task_index": 0}}),
]


@pytest.mark.parametrize(("family", "env_id", "make_kwargs", "reset_kwargs"), FAMILY_EXAMPLES, ids=[f[0] for f in FAMILY_EXAMPLES])
def test_a_family_readmes_example_episode_is_the_task_its_heading_names(family, env_id, make_kwargs, reset_kwargs):
    import json

    from benchmax_gym.testing import play

    example = (ROOT / "benchmax_gym" / "envs" / family / "README.md").read_text().split("## Example episode", 1)[1]
    heading, transcript = example.split("\n", 1)
    named = "seed=" + str(reset_kwargs["seed"]) if "seed" in reset_kwargs else 'options={"task_index": 0}'
    assert f"reset({named})" in heading
    user = " ".join(transcript.split("user:", 1)[1].split("assistant:", 1)[0].split())
    final = transcript.split("assistant:")[-1].split("->")[0].strip()
    shown_components = json.loads(re.search(r"reward_components (\{.*?\})", transcript).group(1))
    env = gym.make(env_id, **make_kwargs)
    try:
        played = play(env, **reset_kwargs)  # the reference solver
        prompt = " ".join(env.unwrapped.messages[1]["content"].split())
        assert prompt.startswith(user.removesuffix(" ...").split(" ... ")[0]), (user, prompt)
        assert env.unwrapped.messages[-1]["content"] == final
        assert played.reward == 1.0 and played.infos[-1]["reward_components"] == shown_components
    finally:
        env.close()


def test_the_milestones_example_needs_only_correct_from_the_example_before_it():
    namespace: dict = {"correct": lambda completion, answer: float(completion.endswith(f"<answer>{answer}</answer>"))}
    try:
        exec(compile(_code_block("Rewards", "milestones("), str(README), "exec"), namespace)  # noqa: S102
    finally:
        gym.registry.pop("me/Geo-v1", None)
        registry.ENVS.pop("me/Geo-v1", None)


def test_the_openrlhf_launch_script_turns_on_the_filtering_the_readme_asks_for():
    row = next(line for line in _section("Train with a trainer").splitlines() if line.startswith("| OpenRLHF |") and "NaN" in line)
    assert "--algo.dynamic_filtering_enable" in row and "turn it on" in row
    script = (ROOT / "examples" / "openrlhf_math.sh").read_text()
    assert "--algo.dynamic_filtering_enable \\" in script.split('"$@"')[0]


# --- every other block a user can run here offline, as written (helper 11's audit)

BENCHMAX_GYM = [sys.executable, "-m", "benchmax_gym"]  # `python -m benchmax_gym` is the same command (Command line)


def _commands(heading: str, contains: str = "") -> list[list[str]]:
    """The `benchmax-gym ...` commands of a section's bash blocks (continuations joined, comments
    dropped), as argv lists that run this checkout's command."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", _section(heading), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv and argv[0].endswith("benchmax-gym") and contains in line:
                commands.append([*BENCHMAX_GYM, *argv[1:]])
    return commands


def _cli(argv: list[str], cwd: Path, timeout: int = 120, process: bool = False) -> subprocess.CompletedProcess:
    """The command's output, run through the CLI's ``main`` in this process (each start of the
    console script costs ~0.5 CPU-s before it reads its arguments); ``process``: as a fresh
    interpreter, as the user types it (the first command, and the eval example's, stay so)."""
    assert argv[:len(BENCHMAX_GYM)] == BENCHMAX_GYM, argv
    if process:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    else:
        done = run_in_process(*argv[len(BENCHMAX_GYM):], cwd=cwd)
    assert done.returncode == 0, (argv, done.stderr[-2000:])
    return done


@contextlib.contextmanager
def _serving(argv: list[str], cwd: Path):
    """Start a server command; yield the URL it says it listens on (stderr), and kill it after."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    try:
        while True:
            line = lines.get(timeout=120)
            if "listening on" in line:
                yield re.search(r"http://\S+", line).group(0)
                break
    finally:
        proc.kill()
        proc.wait()


def _shown_output(code: str) -> list[str]:
    """What a block's comments say its prints print: `print(...)  # shown`, and for a print with
    no comment of its own the `# ...` lines right after it."""
    shown, lines = [], code.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("print("):
            continue
        if "  # " in line:
            shown.append(line.split("  # ", 1)[1].strip().removeprefix("e.g. "))
        else:
            shown += [after[2:] for after in itertools.takewhile(lambda x: x.startswith("# "), lines[i + 1:])]
    return shown


def _prints_what_it_shows(printed: str, code: str) -> None:
    """Each printed line is its comment, or the comment's start before a ': why'."""
    printed_lines, shown = printed.splitlines(), _shown_output(code)
    assert len(printed_lines) == len(shown), (printed_lines, shown)
    for out, says in zip(printed_lines, shown):
        assert says == out or says.startswith(out + ": "), (out, says)


def test_the_classic_loop_prints_what_its_comment_shows(capsys):
    """The first example a user runs: the whole conversation goes to the model, and the line it
    prints at the end is the one shown."""
    code = _code_block("A classic RL loop", "my_llm(")
    namespace: dict = {}
    sent = []

    def my_llm(messages):  # the reference solver stands in for the model
        sent.append([m["role"] for m in messages])
        namespace.setdefault("solver", namespace["env"].unwrapped.reference_solver())
        return namespace["solver"](namespace["obs"], namespace["info"])

    namespace["my_llm"] = my_llm
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102
    namespace["env"].close()
    assert sent[0] == ["system", "user"] and sent[1][:3] == ["system", "user", "assistant"]
    _prints_what_it_shows(capsys.readouterr().out, code)


def test_the_batched_rollouts_example_steps_lock_step_then_ready_first():
    """make_vec's arguments, per-env options, and send/recv(min_ready=16) as the example uses them."""
    import numpy as np

    rounds = []
    namespace: dict = {"gym": gym, "np": np, "actions": ["\\boxed{0}"] * 64, "training": True}

    def policy(obs):
        rounds.append(len(obs))
        namespace["training"] = len(rounds) < 3
        return ["\\boxed{0}"] * len(obs)

    namespace["policy"] = policy
    try:
        exec(compile(_code_block("Batched rollouts", "recv("), str(README), "exec"), namespace)  # noqa: S102
        envs = namespace["envs"]
        assert envs.num_envs == 64 and len(rounds) == 3 and all(n >= 16 for n in rounds)
        assert set(namespace["ids"]) <= set(range(64)) and len(namespace["obs"]) == len(namespace["ids"])
    finally:
        if "envs" in namespace:
            namespace["envs"].close()


def test_the_environments_example_block_is_python():
    """A user pastes the whole block: a `...` placeholder after keyword arguments is a SyntaxError."""
    compile(_code_block("Environments", 'gym.make("benchmax/Math-v0"'), "README.md, Environments", "exec")


LOCAL_FILES = {"path/to/train.jsonl": "gsm8k/train_sample500.jsonl", "test.jsonl": "math500/test_first100.jsonl",
               "path/to/spreadsheetbench": "spreadsheetbench", "dev_distractor.json": "hotpotqa/dev_distractor_100.json"}
OFFLINE_MAKES = [line.split("  #")[0].strip() for line in _code_block("Environments", 'gym.make("benchmax/Math-v0"').splitlines()
                 if "..." not in line and 'backend="live"' not in line  # placeholders; a MediaWiki server
                 and "my/dataset" not in line and not line.startswith('gym.make("benchmax/Math-GSM8K-v0")')]  # the hub


@pytest.mark.parametrize("make", OFFLINE_MAKES, ids=range(len(OFFLINE_MAKES)))
def test_each_offline_environments_example_makes_an_env_its_solver_plays(make, shared_data):
    """Every line of the id examples that needs neither the hub nor a server, with the sample files
    for its paths: the task source and its arguments exist, and the tasks are solvable."""
    from benchmax_gym.testing import play

    for path, sample in LOCAL_FILES.items():
        make = make.replace(f'"{path}"', repr(str(shared_data / sample)))
    env = eval(make, {"gym": gym})  # noqa: S307
    try:
        assert play(env, seed=0).reward == 1.0
    finally:
        env.close()


def test_the_rewards_examples_print_what_their_comments_show(capsys):
    """The composed rubric's reward, components and tree, and the milestone paying once, as shown."""
    namespace: dict = {}
    try:
        for contains in ("gate(", "milestones("):
            code = _code_block("Rewards", contains)
            exec(compile(code, str(README), "exec"), namespace)  # noqa: S102
            _prints_what_it_shows(capsys.readouterr().out, code)
    finally:
        for env_id in ("me/Capitals-v0", "me/Geo-v1"):
            gym.registry.pop(env_id, None)
            registry.ENVS.pop(env_id, None)


def test_tasks_from_your_documents_offline_then_a_search_env_over_them(tmp_path, monkeypatch):
    """`tasks from-corpus` on the shipped sample makes the counts the section states, and the
    Wikipedia env the section builds from them plays to full reward over docs/."""
    from benchmax_gym.testing import play

    shutil.copytree(ROOT / "tests" / "data" / "corpus", tmp_path / "docs")
    section = _section("Tasks from your documents")
    (offline,) = [argv for argv in _commands("Tasks from your documents") if "--model" not in argv]
    out = _cli(offline, tmp_path).stdout
    total, single, bridge, comparison = re.search(
        r"the templates make (\d+)\s+candidates \((\d+) single-hop, (\d+) bridge, (\d+) comparison\)", section).groups()
    assert f"{total} candidates (single {single}, bridge {bridge}, comparison {comparison})" in out
    assert out.count(f"kept {total} of {total}") == 3 and "every filter keeps them all" in section
    namespace: dict = {"gym": gym}
    monkeypatch.chdir(tmp_path)  # the example names tasks.jsonl and docs/ relative to where it runs
    exec(compile(_code_block("Tasks from your documents", "tasks.jsonl"), str(README), "exec"), namespace)  # noqa: S102
    env = namespace["env"]
    try:
        assert [play(env, seed=seed).reward for seed in range(3)] == [1.0, 1.0, 1.0]
    finally:
        env.close()


def test_tasks_from_traces_load_tasks_and_export_sft_as_the_section_runs_them(tmp_path, monkeypatch):
    """Both from-traces commands (logs of `run --jsonl`, and an eval run's rollouts.jsonl), the
    load_tasks example on what they wrote, and export-sft of that run."""
    from benchmax_gym.testing import play

    (logs := tmp_path / "logs").mkdir()
    (jsonl_run,) = [argv for argv in _commands("Command line", "--jsonl")]
    _cli(jsonl_run, logs)  # 20 solved episodes as traces
    (tmp_path / "runs").mkdir()
    _cli([*BENCHMAX_GYM, "eval", "benchmax/Math-v0", "--policy", "solver", "--tasks", "5", "-k", "2",
          "--out", "runs/qwen3", "--no-plots", "--quiet"], tmp_path)
    # (the eval's -k 2 holds each of its 5 tasks twice: each written once)
    for argv, traces, written in zip(_commands("Tasks from traces", "from-traces"), (20, 10), (20, 5)):
        (tasks := tmp_path / "tasks.jsonl").unlink(missing_ok=True)  # both write it; --out never overwrites
        assert f"{traces} traces read, {written} tasks written to tasks.jsonl" in _cli(argv, tmp_path).stdout
    namespace: dict = {"gym": gym}
    monkeypatch.chdir(tmp_path)
    exec(compile(_code_block("Tasks from traces", "load_tasks("), str(README), "exec"), namespace)  # noqa: S102
    env = namespace["env"]
    played = play(env, seed=0)
    env.close()
    assert played.reward == 1.0
    assert len(tasks.read_text().splitlines()) == 5
    (export,) = _commands("Tasks from traces", "export-sft")
    assert "10 of 10 episodes written to sft.jsonl" in _cli(export, tmp_path).stdout
    row = json.loads((tmp_path / "sft.jsonl").read_text().splitlines()[0])
    assert set(row) == {"messages", "tools", "task_id", "reward"} and isinstance(row["tools"], str)


def test_publish_the_scaffold_makes_the_id_its_comment_names_and_the_entry_point_shown(tmp_path):
    """`benchmax-gym new acme-weather` names the id in the comment; with the comment's `--id` its
    pyproject declares the entry point exactly as the TOML example shows it."""
    section = _section("Publish an environment")
    (new,) = _commands("Publish an environment", " new ")
    default_id, other_id = re.search(r"# id (\S+) \(or --id (\S+)\)", section).groups()
    assert f": {default_id} " in _cli(new, tmp_path).stdout
    _cli([*new, "--id", other_id, "--dir", str(tmp_path / "other")], tmp_path)
    toml = re.search(r"```toml\n(.*?)```", section, re.DOTALL).group(1)
    assert toml in (tmp_path / "other" / "acme-weather" / "pyproject.toml").read_text()


def test_evaluate_a_model_with_the_scripted_model_then_compare(tmp_path):
    """The section's model eval, against the scripted model it names for trying eval without a GPU
    (`--model test-model`, its URL as `--base-url`), then the solver's run and compare on the two."""
    section = _section("Evaluate a model")
    assert "python -m benchmax_gym.testing.openai_server" in section
    model_eval, solver_eval = _commands("Evaluate a model", " eval ")
    (compare,) = _commands("Evaluate a model", " compare ")
    with subprocess.Popen([sys.executable, "-m", "benchmax_gym.testing.openai_server"], cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as server:
        try:
            url = server.stdout.readline().strip()
            model_eval[model_eval.index("--model") + 1] = "test-model"
            model_eval[model_eval.index("--base-url") + 1] = url
            out = _cli([*model_eval, "--no-plots", "--quiet"], tmp_path).stdout
        finally:
            server.kill()
    assert "episodes               400 over 100 tasks (0 failed)" in out and "tokens per episode" in out
    _cli([*solver_eval, "--no-plots", "--quiet"], tmp_path)
    out = _cli(compare, tmp_path).stdout
    assert "baseline solver-math" in out and re.search(r"^qwen3-8b-math\s+\d", out, re.M), out


COMMAND_LINE = [  # each finite command of the Command line block ("$": where its command ends), and what its output shows
    ("list$", "benchmax/Math-v0 "),
    ("list --json$", '"id": "benchmax/Math-v0"'),
    ("doctor$", "sandbox "),
    ("doctor --json$", '"sandbox": {'),
    ("--jsonl episodes.jsonl", "episodes      20 (sampled"),
    ("--policy random --episodes 5", "episodes      5 (sampled"),
    ("train.jsonl$", "episodes      500 (each task once;"),  # "each task once"
    ("-k 8", "episodes      4000 (each task 8 times;"),  # "8 rollouts per task"
]


@pytest.mark.parametrize(("line", "says"), COMMAND_LINE, ids=[c[0].strip("$ ") for c in COMMAND_LINE])
def test_each_finite_command_line_example_does_what_its_comment_says(line, says, tmp_path, shared_data):
    """`list`, `doctor` and the `run` lines, as written, in a folder holding the `train.jsonl` they name."""
    shutil.copy(shared_data / "gsm8k" / "train_sample500.jsonl", tmp_path / "train.jsonl")
    block = re.search(r"```bash\n(.*?)```", _section("Command line"), re.DOTALL).group(1)
    (text,) = [x for x in block.splitlines() if line in x.split("#")[0].rstrip() + "$"]
    out = _cli([*BENCHMAX_GYM, *shlex.split(text, comments=True)[1:]], tmp_path, timeout=300).stdout
    assert says in out, out
    if "--json" in text.split():
        json.loads(out)
    if "--jsonl" in text:
        assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 20


def test_the_readmes_first_command_plays_20_solved_episodes(tmp_path):
    """The install line's last command: 20 episodes with the reference solver, then a summary."""
    first = shlex.split(README.read_text().split("```bash\n", 1)[1].splitlines()[0].split(" && ")[-1])
    assert first[0] == ".venv/bin/benchmax-gym"
    out = _cli([*BENCHMAX_GYM, *first[1:]], tmp_path, process=True).stdout
    assert "episodes      20 (sampled" in out and "mean reward   1.000" in out


def test_the_command_line_servers_serve(tmp_path):
    """mcp-serve over stdio answers a tool call; over HTTP, and openenv-serve (on a free port
    instead of 8000), each says where it listens."""
    import asyncio

    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    stdio, http, openenv = _commands("Command line", "serve ")
    assert stdio[-2:] == ["--transport", "stdio"]

    async def calculator():
        async with Client(StdioServerParameters(command=stdio[0], args=stdio[1:], cwd=str(tmp_path))) as client:
            return (await client.call_tool("calculator", {"expression": "6*7"})).content[0].text

    assert asyncio.run(calculator()) == "42"
    with _serving(http, tmp_path) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
    openenv[openenv.index("--port") + 1] = "0"
    with _serving(openenv, tmp_path) as url:
        assert url.startswith("http://127.0.0.1:")


def test_openenv_serve_then_the_clients_the_section_shows(tmp_path):
    """The section's serve command (on a free port) and its Python block against it: OpenEnv's own
    client resets and steps, and benchmax/OpenEnv-v0 makes one env and a vector env of 64."""
    serve = _commands("OpenEnv: serve and consume", "--max-sessions")[0]
    serve[serve.index("--port") + 1] = "0"
    with _serving(serve, tmp_path) as url:
        code = _code_block("OpenEnv: serve and consume", "GenericEnvClient").replace("http://127.0.0.1:8000", url)
        namespace: dict = {"gym": gym}
        try:
            exec(compile(code, str(README), "exec"), namespace)  # noqa: S102
            assert {"text", "messages", "tools", "info"} <= set(namespace["first"].observation)
            step = namespace["result"]
            assert step.observation["messages"][0]["name"] == "list_sheets" and not step.done
            assert namespace["envs"].num_envs == 64
            obs, info = namespace["env"].reset(seed=0)
            assert "list_sheets" in obs and info["task_id"]
        finally:
            for name in ("env", "envs"):
                if name in namespace:
                    namespace[name].close()


# --- what a new user meets past the blocks above (helper 171's read in a fresh venv)

def test_the_layout_names_only_files_that_are_where_it_says():
    """Each row's path exists, and each file a row's text names lies in it (a folder row) or beside
    it (a file row): a reader looking for `benchmax-gym new`'s code opens the file the Layout names."""
    block = re.search(r"```\n(.*?)```", _section("Layout"), re.DOTALL).group(1)
    rows: list[list[str]] = []
    for line in block.splitlines():
        if line.startswith(" "):
            rows[-1][1] += line
        else:
            rows.append(list(line.partition(" ")[::2]))
    missing = []
    for path, text in rows:
        where = ROOT / path
        folder = where if path.endswith("/") else where.parent
        missing += [path] if not where.exists() else []
        missing += [f"{path}: {name}" for name in re.findall(r"\b(\w+\.py)\b", text) if not (folder / name).exists()]
    assert len(rows) > 10 and not missing, missing


def test_the_math_family_has_the_length_the_readme_gives_it():
    """'see benchmax_gym/envs/math/ (env.py, N lines)': the size a reader expects of a family."""
    (shown,) = re.findall(r"\(`env\.py`,\s+(\d+) lines\)", README.read_text())
    assert int(shown) == len((ROOT / "benchmax_gym" / "envs" / "math" / "env.py").read_text().splitlines())


TRAINERS = re.search(r"make_dataset\.py \{([\w|]+)\}", _section("Train with a trainer")).group(1).split("|")


@pytest.mark.parametrize("trainer", TRAINERS)
def test_make_dataset_in_a_base_install_names_the_trainers_extra(trainer, tmp_path):
    """`python examples/make_dataset.py TRAINER ENV_ID DIR` where neither the trainers nor torch
    import (the base install): one line naming the extra, not a module the user never asked for
    (verl's rows said only "No module named 'torch'")."""
    from tests.test_examples_audit import without

    out = without(["torch", "transformers", "trl", "skyrl_gym", "openrlhf", "verl", "ray"], "make_dataset.py",
                  trainer, "benchmax/Math-v0", str(tmp_path / "out"), cwd=tmp_path)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert lines[0].startswith(f"make_dataset.py {trainer}: ") and f"pip install 'benchmax-gym[{trainer}]'" in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_live_wikipedia_example_plays_against_a_mediawiki_api(tmp_path, monkeypatch):
    """The Environments line for the live backend with Bamboogle-style questions, as written, with
    a loopback MediaWiki API at the address it names and a questions.jsonl in its layout."""
    from benchmax_gym.testing.mediawiki import MediaWikiStub

    (line,) = [x for x in _code_block("Environments", 'gym.make("benchmax/Math-v0"').splitlines() if 'backend="live"' in x]
    shown_url = re.search(r'"api_url": "([^"]+)"', line).group(1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BENCHMAX_GYM_CACHE", str(tmp_path / "cache"))
    (tmp_path / "questions.jsonl").write_text(json.dumps({"Question": "Who founded Lima?", "Answer": "Francisco Pizarro"}) + "\n")
    with MediaWikiStub([{"title": "Lima", "text": "Lima was founded by Francisco Pizarro in 1535."}]) as server:
        env = eval(line.split("  #")[0].replace(shown_url, server.api_url), {"gym": gym})  # noqa: S307
        try:
            obs, _ = env.reset(seed=0)
            assert obs.rstrip().endswith("Who founded Lima?")
            obs, *_ = env.step('<tool_call>{"name": "search", "arguments": {"query": "Lima"}}</tool_call>')
            assert "Francisco Pizarro" in obs and server.requests
            _, reward, terminated, *_ = env.step("<answer>Francisco Pizarro</answer>")
            assert terminated and reward == 1.0
        finally:
            env.close()
