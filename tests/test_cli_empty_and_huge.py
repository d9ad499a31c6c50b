"""What a user scripting ``benchmax-gym`` with variables relies on: an empty path, token or name
(what an unset ``"$OUT"`` gives) is refused in one line naming its option, before anything is
made, where it read as the current folder, as the option left out (a server without its token),
or failed later saying something else; and every integer option takes a whole number within a
sane bound (``benchmax_gym.core.checks.COUNT_MAX``), ``3.0``, ``1e20``, ``nan``, 0 or -1 where
they make no sense, and ``10**20`` written out, refused in one line naming it (it built a plan
until memory ran out, served with no limit, or failed every model request)."""

import pytest

from benchmax_gym.cli import main

COUNT_MAX = 1_000_000  # (benchmax_gym.core.checks.COUNT_MAX, as the messages say it)

MATH = "benchmax/Math-v0"
HUGE = str(10**20)


@pytest.fixture
def here(tmp_path, monkeypatch):
    """An empty working folder (an empty path read as it), with a document and a run-like file elsewhere."""
    work = tmp_path / "work"
    work.mkdir()
    (tmp_path / "doc.md").write_text("# Paris\n\nParis is the capital of France. It lies on the Seine.\n")
    monkeypatch.chdir(work)
    return tmp_path


def refused(capsys, argv):
    """The one stderr line of a usage error (status 2), no traceback."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("benchmax-gym: error: "), err
    return lines[0]


EMPTY = [  # (argv with "" where the flag's value goes, the flag named)
    (["eval", MATH, "--policy", "solver", "--tasks", "2", "--out", ""], "--out"),
    (["eval", MATH, "--model", "", "--out", "o"], "--model"),
    (["eval", MATH, "--model", "m", "--api-key-env", "", "--out", "o"], "--api-key-env"),
    (["compare", ""], "RUN"),
    (["compare", "a", "--baseline", ""], "--baseline"),
    (["compare", "a", "--plots-dir", ""], "--plots-dir"),
    (["new", "acme-weather", "--dir", ""], "--dir"),
    (["new", "acme-weather", "--id", ""], "--id"),
    (["mcp-serve", MATH, "--transport", "http", "--port", "0", "--auth-token", ""], "--auth-token"),
    (["openenv-serve", MATH, "--port", "0", "--auth-token", ""], "--auth-token"),
    (["launch", "--print-yaml", "--sky-python", ""], "--sky-python"),
    (["tasks", "from-corpus", "", "--out", "t.jsonl"], "DOCS"),
    (["tasks", "from-corpus", "{doc}", "--out", ""], "--out"),
    (["tasks", "from-corpus", "{doc}", "--out", "t.jsonl", "--corpus-out", ""], "--corpus-out"),
    (["tasks", "from-corpus", "{doc}", "--out", "t.jsonl", "--model", ""], "--model"),
    (["tasks", "from-traces", "", "--env", MATH, "--out", "t.jsonl"], "LOGS"),
    (["tasks", "from-traces", "{doc}", "--env", MATH, "--out", ""], "--out"),
    (["export-sft", ""], "RUN"),
    (["export-sft", "{doc}", "--out", ""], "--out"),
]


@pytest.mark.parametrize("argv, flag", EMPTY, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_an_empty_path_token_or_name_is_refused_naming_its_option(argv, flag, here, capsys):
    """`new NAME --dir ""` scaffolded into the current folder, `tasks from-corpus ""` read it,
    `--auth-token ""` served with no token, `export-sft RUN --out ""` wrote RUN/sft.jsonl, and
    `eval --out ""` said `--out : cannot make the run directory (: No such file or directory)`."""
    line = refused(capsys, [a.format(doc=here / "doc.md") for a in argv])
    assert line.startswith(f"benchmax-gym: error: {flag} is empty"), line
    assert not any(here.joinpath("work").iterdir())


INTS = [  # (argv before the flag, the flag, argv after, the values that are refused)
    (["run", MATH], "--episodes", [], "0 -1"),
    (["run", MATH, "--first-tasks", "1"], "-k", [], "0 -1"),
    (["run", MATH], "--first-tasks", [], "0 -1"),
    (["run", MATH, "--episodes", "1"], "--seed", [], "-1"),
    (["eval", MATH, "--policy", "solver", "--out", "o"], "-k", [], "0 -1"),
    (["eval", MATH, "--policy", "solver", "--out", "o"], "--concurrency", [], "0 -1"),
    (["eval", MATH, "--policy", "solver", "--out", "o"], "--workers", [], "0 -1"),
    (["eval", MATH, "--policy", "solver", "--out", "o"], "--seed", [], "-1"),
    (["eval", MATH, "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--out", "o"], "--max-tokens", [], "0 -1"),
    (["eval", MATH, "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--out", "o"], "--max-retries", [], "-1"),
    (["compare", "a"], "--seed", [], "-1"),
    (["mcp-serve", MATH, "--transport", "http"], "--max-sessions", [], "0 -1"),
    (["mcp-serve", MATH, "--transport", "http"], "--port", [], "-1"),
    (["mcp-serve", MATH], "--seed", [], "-1"),
    (["openenv-serve", MATH], "--max-sessions", [], "0 -1"),
    (["openenv-serve", MATH], "--port", [], "-1"),
    (["launch", "--print-yaml"], "--nodes", [], "0 -1"),
    (["launch", "--print-yaml"], "--env-host-slots", [], "0 -1"),
    (["launch", "--print-yaml"], "--port", [], "0 -1"),
    (["tasks", "from-corpus", "{doc}", "--out", "t.jsonl"], "--max-questions", [], "0 -1"),
    (["tasks", "from-corpus", "{doc}", "--out", "t.jsonl", "--model", "m"], "--concurrency", [], "0 -1"),
    (["tasks", "from-corpus", "{doc}", "--out", "t.jsonl", "--model", "m"], "--max-retries", [], "-1"),
    (["tasks", "from-corpus", "{doc}", "--out", "t.jsonl"], "--seed", [], "-1"),
    (["tasks", "from-corpus", "{doc}", "--out", "t.jsonl"], "--chunk-chars", [], "0 -1"),
]


# each option with each value it must refuse (0 and -1 where they are below its bound; a seed has no upper one)
BAD_INTS = [pytest.param(before, flag, after, value, id=f"{' '.join(before[:2])} {flag} {value}")
            for before, flag, after, low in INTS
            for value in ["1e20", HUGE, "3.0", "nan", "", "0", "-1"]
            if not (value in ("0", "-1") and value not in low.split() or flag == "--seed" and value == HUGE)]


@pytest.mark.parametrize("before, flag, after, value", BAD_INTS)
def test_every_integer_option_takes_a_whole_number_within_its_bounds(before, flag, after, value, here, capsys):
    """argparse took `--max-sessions 100000000000000000000` (a server with no limit), `run --episodes`
    and `eval -k` that many (a plan built until memory ran out), and said `1e20`, `3.0` or `nan`
    under a screenful of usage; now each is one line naming the option."""
    line = refused(capsys, [a.format(doc=here / "doc.md") for a in before] + [flag, value] + after)
    assert f"error: {flag} " in line or f"error: -k/--rollouts-per-task " in line and flag == "-k" \
        or f"error: argument {flag}: " in line and flag == "--port", line  # (a server's --port: argparse's words)
    if value == HUGE:
        assert f"at most {COUNT_MAX:,}" in line or "at most 100," in line or "0 (any free port) to 65535" in line \
            or "must be a port number" in line, line
    assert not any(here.joinpath("work").iterdir())


@pytest.mark.parametrize("tasks", [HUGE, f"0:{HUGE}", f"5:{COUNT_MAX + 6}"])
def test_eval_tasks_past_the_bound_is_one_line(tasks, here, capsys):
    """`eval --tasks 100000000000000000000` ended in an OverflowError traceback; a few billion on
    an unbounded task list built the run's plan until memory ran out."""
    line = refused(capsys, ["eval", MATH, "--policy", "solver", "--tasks", tasks, "--out", "o"])
    assert f"--tasks {tasks}: at most {COUNT_MAX:,} tasks" in line, line
    assert not any(here.joinpath("work").iterdir())


def test_every_seed_may_be_large(here, capsys):
    """A seed is not a count: any whole number 0 or more seeds numpy's SeedSequence, so a large
    one is played, not refused."""
    assert main(["run", MATH, "--episodes", "1", "--seed", HUGE, "--quiet", "--json"]) == 0
    assert '"episodes": 1' in capsys.readouterr().out


@pytest.mark.parametrize("api", ["serve", "openenv"])
def test_the_servers_python_api_refuses_a_max_sessions_past_the_bound(api):
    """serve(max_sessions=10**20) served with no limit at all, as the CLI did."""
    if api == "serve":
        from benchmax_gym.serve import serve as start
    else:
        from benchmax_gym.openenv import serve as start
    with pytest.raises(ValueError, match=f"max_sessions must be a positive int up to {COUNT_MAX:,}"):
        start(MATH, **({"transport": "http"} if api == "serve" else {}), port=0, max_sessions=10**20)


FLOATS = [  # (argv before the flag, the flag, the values it refuses besides text that is no number, nan and inf)
    (["eval", MATH, "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--out", "o"], "--temperature", "-1"),
    (["eval", MATH, "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--out", "o"], "--top-p", "0 1.5 -1"),
    (["eval", MATH, "--policy", "solver", "--out", "o"], "--timeout", "0 -1 1e300"),
    (["compare", "a"], "--max-failure-gap", "-0.1 1.5"),
    (["mcp-serve", MATH, "--transport", "http"], "--idle-timeout", "0 -1 1e300"),
    (["openenv-serve", MATH], "--idle-timeout", "0 -1 1e300"),
    (["tasks", "from-corpus", "{doc}", "--out", "t.jsonl", "--model", "m"], "--timeout", "0 -1 1e300"),
    (["tasks", "from-corpus", "{doc}", "--out", "t.jsonl", "--model", "m"], "--temperature", "-1"),
    (["export-sft", "{doc}", "--out", "sft.jsonl"], "--min-reward", ""),
]
BAD_FLOATS = [pytest.param(before, flag, value, id=f"{' '.join(before[:2])} {flag} {value}")
              for before, flag, also in FLOATS for value in ["nan", "inf", "-inf", "abc", "", *also.split()]]


@pytest.mark.parametrize("before, flag, value", BAD_FLOATS)
def test_every_float_option_refuses_nan_inf_and_values_out_of_its_range(before, flag, value, here, capsys):
    """argparse took `nan` and `inf` as they came: `export-sft --min-reward nan` kept no episode,
    `compare --max-failure-gap nan` refused every pair of runs, a model request was sent with
    `temperature: NaN` (not JSON), a timeout past threading's bound overflowed where it was waited
    on; and `--timeout abc` was said under a screenful of usage. Now each is one line naming the
    option, before anything is made."""
    line = refused(capsys, [a.format(doc=here / "doc.md") for a in before] + [f"{flag}={value}"])
    assert line.startswith(f"benchmax-gym: error: {flag} must be "), line
    assert not any(here.joinpath("work").iterdir())


def test_a_negative_min_reward_is_a_bar_not_refused(here, capsys):
    """Rewards may be negative (a penalty), so `--min-reward -0.5` is a bar like any finite one:
    the run is read (here: not one) rather than the value refused."""
    line = refused(capsys, ["export-sft", str(here / "nowhere"), "--out", "sft.jsonl", "--min-reward=-0.5"])
    assert "--min-reward" not in line and "nowhere" in line, line
