"""The README's examples, run as written."""

import re
import sqlite3
from pathlib import Path

import gymnasium as gym
import pytest

from benchmax_gym import registry
from benchmax_gym.core.tools import ArgumentError

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
