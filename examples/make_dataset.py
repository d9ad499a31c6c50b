"""Write a trainer's prompt dataset for a benchmax-gym env: one row per task, in that trainer's format.

    python examples/make_dataset.py skyrl    benchmax/Math-v0 data/math   # train/validation.parquet
    python examples/make_dataset.py verl     benchmax/Math-v0 data/math   # train/validation.parquet
    python examples/make_dataset.py openrlhf benchmax/Math-v0 data/math   # train.jsonl

The env owns its prompts and answers: a row only says which task to play (TRL needs no file:
``TRLRollout.dataset()`` builds one in memory).
"""

from __future__ import annotations

import argparse
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

    import datasets

    env_kwargs = json.loads(args.env_kwargs)
    if args.trainer == "skyrl":
        from benchmax_gym.adapters.skyrl import task_rows
    elif args.trainer == "verl":
        from benchmax_gym.adapters.verl import task_rows
    else:
        from benchmax_gym.adapters.openrlhf import task_rows
    rows = task_rows(args.env_id, args.train + args.validation, **env_kwargs)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    splits = {"train": rows[: args.train], "validation": rows[args.train:]}
    for split, part in splits.items():
        if args.trainer == "openrlhf":
            with open(out / f"{split}.jsonl", "w") as f:
                f.writelines(json.dumps(row) + "\n" for row in part)
        else:
            datasets.Dataset.from_list(part).to_parquet(str(out / f"{split}.parquet"))
    print(json.dumps({split: len(part) for split, part in splits.items()}))


if __name__ == "__main__":
    main()
