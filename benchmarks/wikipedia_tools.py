"""How fast are benchmax/Wikipedia-v0's tools on each backend? Prints one JSON object.

* the FTS5 index build for the HotpotQA sample's context paragraphs (cold, into a fresh cache
  folder, and warm, when the cached file is found),
* ``search`` and ``get_article`` latency (p50/p90/p99, milliseconds) on the ``generated``,
  ``local`` (HotpotQA paragraphs) and ``live`` backends, the last against the local MediaWiki
  server (:class:`MediaWikiStub`) with the response cache cold (every request sent) and warm,
* ``reset`` of the generated environment (the encyclopedia is shared, so only the first is slow).

Backend calls are timed directly (no engine): the engine's own overhead is step_overhead.py's job.
Target: local search p50 <= 2 ms.

    python benchmarks/wikipedia_tools.py [--data ../shared/data] [--calls 500]
"""

from __future__ import annotations

import argparse
import json
import platform
import sqlite3
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

import benchmax_gym  # noqa: F401  (registers the ids)
from benchmax_gym.envs.wikipedia.backends import CorpusBackend, CorpusIndex, LiveBackend
from benchmax_gym.envs.wikipedia.corpora import generated_index
from benchmax_gym.testing.mediawiki import MediaWikiStub
from benchmax_gym.envs.wikipedia.tasks import encyclopedia, load_corpus

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ms = np.array(samples_s) * 1000
    return {f"p{q}_ms": round(float(np.percentile(ms, q)), 4) for q in (50, 90, 99)}


def timed(fn, args_list) -> list[float]:
    out = []
    for args in args_list:
        t = time.perf_counter()
        fn(*args)
        out.append(time.perf_counter() - t)
    return out


def queries_and_titles(records: list[dict[str, str]], rng: np.random.Generator, n: int):
    """Search queries (a title's words, or three words of a text) and titles to read."""
    picks = [records[int(i)] for i in rng.integers(len(records), size=n)]
    queries = []
    for r in picks:
        words = r["text"].split()
        start = int(rng.integers(max(1, len(words) - 3)))
        queries.append(r["title"] if rng.random() < 0.5 else " ".join(words[start:start + 3]))
    return [(q, 5) for q in queries], [(r["title"],) for r in picks]


def bench_backend(backend, records, rng, n) -> dict:
    searches, reads = queries_and_titles(records, rng, n)
    return {"search": percentiles(timed(backend.search, searches)), "get_article": percentiles(timed(backend.article, reads))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--calls", type=int, default=500)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    result: dict = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version, "calls": args.calls}

    hotpot = args.data / "hotpotqa" / "dev_distractor_100.json"
    records, key = load_corpus(hotpot)
    with tempfile.TemporaryDirectory() as cache:
        t = time.perf_counter()
        CorpusIndex.on_disk(records, key, cache)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        index = CorpusIndex.on_disk(records, key, cache)
        warm = time.perf_counter() - t
        result["local_index"] = {"paragraphs": len(records), "build_s": round(cold, 4), "cached_open_s": round(warm, 6),
                                 "size_kb": sum(p.stat().st_size for p in Path(cache).glob("*.sqlite")) // 1024}
        t = time.perf_counter()
        local = CorpusBackend(index)
        result["local_index"]["episode_open_ms"] = round((time.perf_counter() - t) * 1000, 4)
        result["local"] = bench_backend(local, records, rng, args.calls)
        local.close()

    t = time.perf_counter()
    world = encyclopedia(0, 300)
    gen_index = generated_index(0, 300)
    result["generated_build_s"] = round(time.perf_counter() - t, 4)
    result["generated"] = bench_backend(CorpusBackend(gen_index), world.records, rng, args.calls)

    with MediaWikiStub(world.records) as server:
        live = LiveBackend(api_url=server.api_url)
        searches, reads = queries_and_titles(world.records, rng, min(args.calls, 200))
        result["live_local_mediawiki"] = {
            "cold": {"search": percentiles(timed(live.search, searches)), "get_article": percentiles(timed(live.article, reads))},
            "warm_cache": {"search": percentiles(timed(live.search, searches)), "get_article": percentiles(timed(live.article, reads))},
            "http_requests": len(server.requests),
        }
        live.shutdown()

    t = time.perf_counter()
    env = gym.make("benchmax/Wikipedia-v0", task_args={"task_seed": 7})  # a world not built yet: make pays for it
    made = time.perf_counter() - t
    resets = timed(lambda s: env.reset(seed=s), [(s,) for s in range(500)])
    result["generated_env"] = {"make_s": round(made, 4), "reset": percentiles(resets)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
