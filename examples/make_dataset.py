"""Write a trainer's prompt dataset for a benchmax-gym env: one row per task, in that trainer's format.

    python examples/make_dataset.py skyrl    benchmax/Math-v0 data/math   # train/validation.parquet
    python examples/make_dataset.py verl     benchmax/Math-v0 data/math   # train/validation.parquet
    python examples/make_dataset.py openrlhf benchmax/Math-v0 data/math   # train.jsonl

The env owns its prompts and answers: a row only says which task to play (TRL needs no file:
``TRLRollout.dataset()`` builds one in memory).
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trainer", choices=["skyrl", "verl", "openrlhf"])
    parser.add_argument("env_id")
    parser.add_argument("out_dir")
    parser.add_argument("--train", type=int, default=2000, help="rows for training (tasks 0..N-1)")
    parser.add_argument("--validation", type=int, default=100, help="rows for validation (the tasks after them)")
    parser.add_argument("--env-kwargs", default="{}", help="gym.make arguments, as JSON")
    args = parser.parse_args(argv)
    for name in ("train", "validation"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be 0 or more, got {getattr(args, name)}")
    try:
        env_kwargs = json.loads(args.env_kwargs)
    except json.JSONDecodeError as exc:
        parser.error(f"--env-kwargs is not JSON ({exc}): {args.env_kwargs}")
    if not isinstance(env_kwargs, dict):
        parser.error(f"--env-kwargs must be a JSON object of gym.make arguments, got {args.env_kwargs}")

    import gymnasium as gym

    try:  # the trainer's adapter defines its rows
        task_rows = importlib.import_module(f"benchmax_gym.adapters.{args.trainer}").task_rows
    except ImportError as exc:  # one line naming the extra, not a traceback
        raise SystemExit(f"make_dataset.py {args.trainer}: {exc}") from None
    try:
        rows = task_rows(args.env_id, args.train + args.validation, **env_kwargs)
    except (gym.error.Error, TypeError, ValueError, OSError) as exc:  # an unknown id, a refused argument, no data
        raise SystemExit(f"make_dataset.py: {args.env_id} with --env-kwargs {args.env_kwargs}: "
                         f"{' '.join(str(exc).split())}") from None
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    splits = {"train": rows[: args.train], "validation": rows[args.train:]}
    for split, part in splits.items():
        if args.trainer == "openrlhf":
            with open(out / f"{split}.jsonl", "w") as f:
                f.writelines(json.dumps(row) + "\n" for row in part)
        else:
            import datasets

            datasets.Dataset.from_list(part).to_parquet(str(out / f"{split}.parquet"))
    print(json.dumps({split: len(part) for split, part in splits.items()}))


if __name__ == "__main__":
    main()
