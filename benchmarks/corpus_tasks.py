"""How many tasks does ``benchmax-gym tasks from-corpus`` make, and how fast? Prints one JSON object.

* the shipped sample corpus (tests/data/corpus: text, Markdown, HTML, JSON Lines): candidates
  per kind from the offline template generator, what each filter kept, seconds;
* a larger corpus: ``--documents N`` articles of the Wikipedia family's generated encyclopedia
  (fictional entities, written as JSON Lines into a temporary folder), to give the time per
  1,000 documents (reading, chunking, the FTS5 index build, generation, filters; cold cache).

    python benchmarks/corpus_tasks.py [--documents 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

from benchmax_gym.data.questions import generate_from_corpus
from benchmax_gym.envs.wikipedia.tasks import encyclopedia

SAMPLE = Path(__file__).resolve().parents[1] / "tests" / "data" / "corpus"


def run(docs: Path, folder: Path, name: str) -> dict:
    summary = generate_from_corpus(docs, folder / f"{name}.jsonl", cache_dir=str(folder / f"cache-{name}"))
    summary.pop("out")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=1000, help="articles in the larger corpus (default: 1000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sample = run(SAMPLE, folder, "sample")
        records = encyclopedia(0, max(30, args.documents)).records[: args.documents]
        big = folder / "encyclopedia.jsonl"
        with open(big, "w", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps({"title": record["title"], "text": record["text"]}) + "\n")
        large = run(big, folder, "large")
    print(json.dumps({"sample_corpus": sample, "encyclopedia_corpus": large, "cpu": platform.processor() or
                      platform.machine(), "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
