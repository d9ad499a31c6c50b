"""The data commands of ``benchmax-gym``::

    benchmax-gym tasks from-corpus DOCS --out tasks.jsonl [--model M --base-url URL]
    benchmax-gym tasks from-traces LOGS --env ENV_ID --out tasks.jsonl [--keep reward>=1]
    benchmax-gym export-sft RUN --out sft.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

# What an eval run directory holds and export-sft may read (its --out must be none of them)
RUN_FILES = ("run.json", "rollouts.jsonl", "summary.json", "group_rewards.jsonl")


def _refuse_existing(out: str, overwrite: bool, flag: str = "--out") -> None:
    from benchmax_gym.cli import usage_error

    if os.path.isdir(out):
        usage_error(f"{flag} {out}: is a directory")
    if os.path.exists(out) and not overwrite:
        usage_error(f"{flag} {out} exists: pass --overwrite to replace it")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        usage_error(f"{flag} {out}: no such directory: {folder}")
    if not os.access(folder, os.W_OK):  # before the work, which a model's calls may have paid for
        usage_error(f"{flag} {out}: cannot create a file in {folder}")


def _refuse_reading_what_it_writes(flag: str, out: str, inputs: list[tuple[str, Any]]) -> None:
    """Refuse an output that is one of the command's inputs ``(what, path)``: it replaced what it
    read (export-sft's --out RUN/rollouts.jsonl, from-corpus's --out DOCS/a.txt), before any work."""
    from benchmax_gym.cli import same_file, usage_error

    for what, path in inputs:
        if same_file(out, path):
            usage_error(f"{flag} {out} is {what} ({path}), which this reads: write it elsewhere")


def _nothing_written(said: str) -> int:
    """A data command that ran and has nothing to write: one line on stderr (after its summary on
    stdout, the JSON one with --json) and exit status 1, as eval when it scored no episode."""
    print(f"benchmax-gym: error: {said}", file=sys.stderr)
    return 1


def cmd_from_traces(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import benchmax_gym  # noqa: F401  (registers the ids)
    from benchmax_gym.cli import (_parse_env_args, cannot_make, counted, env_id_error, os_error_text, runtime_error,
                                  usage_error)
    from benchmax_gym.data import write_jsonl
    from benchmax_gym.data.traces import tasks_from_traces, trace_files

    try:
        logs = trace_files(args.logs)
    except (ValueError, OSError):  # (said as it is below, where the traces are read)
        logs = []
    _refuse_reading_what_it_writes("--out", args.out, [("the traces file", f) for f in logs])
    _refuse_existing(args.out, args.overwrite)
    try:
        env = gym.make(args.env, **_parse_env_args(args.env_arg))
    except gym.error.Error as exc:
        env_id_error(exc, args.env, "--env: ", "tasks from-traces")
    except (TypeError, ValueError, OSError, ImportError) as exc:  # (without Gymnasium's suffix: it repeats secrets)
        usage_error(cannot_make(args.env, exc))
    try:
        base = env.unwrapped
        if not len(base.toolset):  # an MCP env learns its tools at its first reset
            try:
                env.reset(seed=0)
            except RuntimeError as exc:  # it cannot start (an MCP server that fails to), as run and mcp-serve say
                runtime_error(f"cannot start {args.env}: {exc}")
        tasks, report = tasks_from_traces(args.logs, base, keep=args.keep, turn=args.turn,
                                          answer_field=args.answer_field, allow_invalid_calls=args.allow_invalid_calls)
    except (ValueError, OSError) as exc:  # OSError: a trace file that cannot be read
        usage_error(os_error_text(exc) if isinstance(exc, OSError) else exc)
    finally:
        env.close()
    summary = report.as_dict()
    if tasks:
        try:
            write_jsonl(args.out, tasks)
        except OSError as exc:
            usage_error(f"--out {args.out}: {os_error_text(exc)}")
    if args.json:
        print(json.dumps({**summary, "out": args.out if tasks else None}))
    else:
        kept_old = not tasks and os.path.exists(args.out)  # --overwrite with nothing to write replaces nothing
        same = (f" ({counted(report.duplicates, 'duplicate')} left out: the same messages and answer as an "
                "earlier trace's)" if report.duplicates else "")
        print(f"{counted(report.traces, 'trace')} read, {counted(report.kept, 'task')} written"
              + (f" to {args.out}" if tasks else f" ({args.out} left as it was)" if kept_old else "") + same)
        for reason, count in summary["skipped"].items():
            print(f"  skipped {count}: {reason}")
        print(f"  tool calls checked: {report.calls_checked}; unknown tools: "
              f"{dict(report.unknown_tools) or 'none'}; invalid arguments: {dict(report.invalid_arguments) or 'none'}")
        for line in report.examples:
            print(f"  {line}")
    return 0 if tasks else _nothing_written(f"no task kept of {counted(report.traces, 'trace')}; "
                                            f"--out {args.out} not written")


def cmd_export_sft(args: argparse.Namespace) -> int:
    import gymnasium as gym

    from benchmax_gym.cli import _parse_env_args, cannot_make, env_id_error, os_error_text, runtime_error, usage_error
    from benchmax_gym.data import write_jsonl
    from benchmax_gym.data.sft import export_sft
    from benchmax_gym.eval import EvalError

    out = args.out or (os.path.join(args.run, "sft.jsonl") if os.path.isdir(args.run) else None)
    if not out:
        usage_error("--out is needed when RUN is a file")
    if args.no_tools and (args.env or args.env_arg):  # (they name the env whose tool schemas are written)
        usage_error(f"{'--env' if args.env else '--env-arg'}: for the tools' schemas only (--no-tools writes none)")
    run_files = [os.path.join(args.run, name) for name in RUN_FILES] if os.path.isdir(args.run) else [args.run]
    _refuse_reading_what_it_writes("--out", out, [("RUN's " + os.path.basename(f) if f != args.run else "RUN", f)
                                                  for f in run_files])
    _refuse_existing(out, args.overwrite)
    try:
        rows, summary = export_sft(args.run, min_reward=args.min_reward, env_id=args.env,
                                   env_kwargs=_parse_env_args(args.env_arg) if args.env_arg else None,
                                   tools=not args.no_tools)
    except gym.error.Error as exc:  # --env, or the run's env id, unknown here
        env_id_error(exc, args.env or "", "--env: " if args.env else "", "export-sft")
    except TypeError as exc:  # a mistyped --env-arg (without Gymnasium's suffix: it repeats secrets)
        usage_error(cannot_make(args.env, exc))
    except (EvalError, ValueError, ImportError) as exc:  # ImportError: the env's extra is missing
        usage_error(exc)
    except OSError as exc:  # RUN cannot be read
        usage_error(os_error_text(exc))
    except RuntimeError as exc:  # the tools' env cannot start (an MCP server that fails to), as run says
        from benchmax_gym.data.sft import read_run

        runtime_error(f"cannot start {args.env or read_run(args.run)[0].get('env_id')} for its tool schemas "
                      f"(--no-tools exports without them): {exc}")
    if rows:  # nothing to export writes nothing (an empty file would train on nothing) and fails, as tasks' commands do
        try:
            write_jsonl(out, rows)
        except OSError as exc:
            usage_error(f"--out {out}: {os_error_text(exc)}")
    summary["out"] = out if rows else None
    if args.json:
        print(json.dumps(summary))
    else:
        left = ", ".join(f"{n} {why}" for why, n in summary["left_out"].items()) or "none"
        where = f"written to {out}" if rows else "written: nothing to export, no file made"
        print(f"{summary['exported']} of {summary['episodes']} episodes {where} (left out: {left})")
    return 0 if rows else _nothing_written(f"no episode to export of {summary['episodes']}; --out {out} not written")


def cmd_from_corpus(args: argparse.Namespace) -> int:
    from benchmax_gym.cli import os_error_text, same_file, usage_error
    from benchmax_gym.data.corpus import document_files
    from benchmax_gym.data.questions import generate_from_corpus, print_summary
    from benchmax_gym.eval.policies import PolicyError

    try:
        documents = document_files(args.docs)
    except (ValueError, OSError):  # (said as it is below, where the documents are read)
        documents = []
    inputs = [("a document of DOCS", d) for d in documents]
    if args.corpus_out:
        if same_file(args.out, args.corpus_out):
            usage_error(f"--out {args.out} and --corpus-out {args.corpus_out} are one file: give each its own")
        _refuse_reading_what_it_writes("--corpus-out", args.corpus_out, inputs)
        _refuse_existing(args.corpus_out, args.overwrite, "--corpus-out")
    _refuse_reading_what_it_writes("--out", args.out, inputs)
    _refuse_existing(args.out, args.overwrite)
    if not args.model:  # (they were accepted and did nothing: the templates call no model)
        given = [flag for flag, value in (("--base-url", args.base_url), ("--api-key-env", args.api_key_env),
                                          ("--temperature", args.temperature), ("--timeout", args.timeout),
                                          ("--max-retries", args.max_retries), ("--concurrency", args.concurrency))
                 if value is not None]
        if given:
            usage_error(f"{', '.join(given)}: for --model only (the offline templates call no model)")
    args.concurrency = 16 if args.concurrency is None else args.concurrency
    args.timeout = 120.0 if args.timeout is None else args.timeout
    args.max_retries = 4 if args.max_retries is None else args.max_retries
    if args.concurrency < 1:
        usage_error(f"--concurrency must be a positive number, got {args.concurrency}")
    if args.chunk_chars < 200:  # (chunk_document's least, said naming the flag, not its argument)
        usage_error(f"--chunk-chars must be at least 200, got {args.chunk_chars}")
    if args.max_retries < 0:
        usage_error(f"--max-retries must be 0 or more, got {args.max_retries}")
    if args.verify_model and not args.model:
        usage_error("--verify-model checks a model's questions: give --model too")
    model = None
    if args.model:
        from benchmax_gym.cli import _check_base_url
        from benchmax_gym.data.questions import ModelGenerator

        if args.base_url is not None:  # (as eval checks it: named with its flag, before any work)
            _check_base_url(args.base_url, "--base-url")
        elif os.environ.get("OPENAI_BASE_URL"):  # (the SDK's default then)
            _check_base_url(os.environ["OPENAI_BASE_URL"], "$OPENAI_BASE_URL")
        key = os.environ.get(args.api_key_env or "OPENAI_API_KEY") or None
        if args.api_key_env and not key:
            usage_error(f"--api-key-env {args.api_key_env}: the variable is not set")
        model = ModelGenerator(args.model, base_url=args.base_url, api_key=key, concurrency=args.concurrency,
                               timeout=args.timeout, max_retries=args.max_retries, verify_model=args.verify_model,
                               temperature=args.temperature)
    try:
        summary = generate_from_corpus(
            args.docs, args.out, model=model, max_questions=args.max_questions, chunk_chars=args.chunk_chars,
            multi_hop=not args.single_hop_only, corpus_out=args.corpus_out, seed=args.seed, progress=not args.quiet)
    except (ValueError, PolicyError) as exc:  # PolicyError: the endpoint failed its preflight
        usage_error(exc)
    except OSError as exc:  # a document that cannot be read, an --out or --corpus-out that cannot be written
        usage_error(os_error_text(exc))
    if args.json:
        print(json.dumps(summary))
    else:
        print_summary(summary, sys.stdout)
    return 0 if summary["kept"] else _nothing_written(f"no question kept; --out {args.out} not written")


def add_commands(sub: Any) -> None:
    """Add ``tasks from-corpus``, ``tasks from-traces`` and ``export-sft`` to the CLI's subparsers."""
    from benchmax_gym.cli import COUNT_MAX, RETRIES_MAX, given, real_number, whole_number
    from benchmax_gym.core import checks

    tasks = sub.add_parser("tasks", help="make tasks from your documents or your agents' traces")
    which = tasks.add_subparsers(dest="tasks_command", required=True)

    fc = which.add_parser("from-corpus", help="question/answer tasks over your documents, for benchmax/Wikipedia-v0's "
                          "local backend (offline templates, or a model endpoint with model-free filters)")
    fc.add_argument("docs", type=given("DOCS", "a file or folder of documents"),
                    help="a file or folder of documents: .txt, .md, .html, .jsonl of {title, text}")
    fc.add_argument("--out", required=True, type=given("--out", "the tasks file to write"),
                    help="the tasks file to write (JSON Lines)")
    fc.add_argument("--corpus-out", type=given("--corpus-out", "a file for the corpus (or leave it out)"),
                    help="also write the chunked corpus here as {title, text} JSON Lines "
                    "(default: none; the local backend reads DOCS itself)")
    fc.add_argument("--model", type=given("--model", "the model's name (or leave it out for the templates)"),
                    help="generate with this model (with --base-url) instead of the offline templates")
    fc.add_argument("--base-url", help="an OpenAI-compatible endpoint with its /v1 (default: $OPENAI_BASE_URL)")
    fc.add_argument("--api-key-env", metavar="VAR", type=given("--api-key-env", "a variable's name"),
                    help="the variable holding the API key (default: OPENAI_API_KEY); "
                    "the key is never written")
    fc.add_argument("--verify-model", type=given("--verify-model", "the second model's name (or leave it out)"),
                    help="a second model that answers each candidate from its chunks; kept only "
                    "if it agrees (same endpoint)")
    fc.add_argument("--max-questions", type=whole_number("--max-questions", COUNT_MAX),
                    help="stop after this many kept questions")
    fc.add_argument("--chunk-chars", type=whole_number("--chunk-chars", COUNT_MAX),
                    default=1200, help="characters per chunk (default: 1200)")
    fc.add_argument("--single-hop-only", action="store_true", help="no multi-hop (bridge, comparison) questions")
    fc.add_argument("--concurrency", type=whole_number("--concurrency", COUNT_MAX),
                    help="model requests in flight (default: 16)")
    fc.add_argument("--timeout", type=real_number("--timeout", checks.seconds),
                    help="seconds per model request (default: 120)")
    fc.add_argument("--max-retries", type=whole_number("--max-retries", RETRIES_MAX),
                    help="retries per request (default: 4)")
    fc.add_argument("--temperature", type=real_number("--temperature", checks.at_least(0)),
                    help="sampling temperature (default: the server's)")
    fc.add_argument("--seed", type=whole_number("--seed"),
                    default=0, help="which facts the templates pick (default: 0)")
    fc.add_argument("--overwrite", action="store_true", help="replace an existing --out (and --corpus-out)")
    fc.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    fc.add_argument("--quiet", action="store_true", help="no progress bar")
    fc.set_defaults(func=cmd_from_corpus)

    ft = which.add_parser("from-traces", help="tasks for an env from agent traces in the OpenAI chat format "
                          "(eval's rollouts.jsonl, gateway logs)")
    ft.add_argument("logs", type=given("LOGS", "a traces file or folder"),
                    help="a JSON Lines file of traces, or a folder of them")
    ft.add_argument("--env", required=True, metavar="ENV_ID", help="the env the tasks are for (its tools check the calls)")
    ft.add_argument("--out", required=True, type=given("--out", "the tasks file to write"),
                    help="the tasks file to write (JSON Lines)")
    ft.add_argument("--keep", default="all", help="which traces' final answers are trusted as references: all, "
                    "reward>=X (>, <=, <, =) or FIELD=VALUE, e.g. success=true (default: all)")
    ft.add_argument("--turn", default="last-user", help="where the task's conversation ends: last-user (default), "
                    "first-user, final (all but the final reply) or N (before the N-th assistant message)")
    ft.add_argument("--answer-field", metavar="FIELD", help="take the reference from this field of the record "
                    "(dotted path) instead of the final reply")
    ft.add_argument("--allow-invalid-calls", action="store_true",
                    help="keep traces whose conversation prefix calls unknown tools or passes invalid arguments "
                    "(reported either way)")
    ft.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE", help="gym.make argument, as for run")
    ft.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    ft.add_argument("--json", action="store_true", help="print the report as one JSON object")
    ft.set_defaults(func=cmd_from_traces)

    sft = sub.add_parser("export-sft", help="write a run's successful scored episodes as chat JSON Lines for TRL's "
                         "SFTTrainer, with the env's tool schemas")
    sft.add_argument("run", type=given("RUN", "an eval run directory or a run --jsonl file"),
                     help="an eval run directory, or a `run --jsonl` file")
    sft.add_argument("--out", type=given("--out", "the file to write (or leave it out for RUN/sft.jsonl)"),
                     help="the file to write (default: RUN/sft.jsonl for a run directory)")
    sft.add_argument("--min-reward", type=real_number("--min-reward"),
                     help="keep scored episodes with at least this reward (default: "
                     "those that succeeded: full reward)")
    sft.add_argument("--env", metavar="ENV_ID", help="the env whose tools to write, for a run that does not name "
                     "its env (default: the run's)")
    sft.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="gym.make argument for the tools' env (default: the run's env_kwargs)")
    sft.add_argument("--no-tools", action="store_true", help="no tools column (the system prompt already describes "
                     "the tools in text; a template given tools would render them again)")
    sft.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    sft.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    sft.set_defaults(func=cmd_export_sft)
