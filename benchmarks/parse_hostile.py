"""Parsing hostile actions: each tool-call format on the shapes that made a lazy regex quadratic
(repeated opening tags that never close), at 32k and 256k characters. Prints one JSON object;
linear parsing shows the 256k figure about 8x the 32k one, quadratic about 64x.

    python benchmarks/parse_hostile.py
"""

from __future__ import annotations

import json
import time

from benchmax_gym.core.formats import get_format

SHAPES = [("hermes", "<tool_call>"), ("hermes", "<tool_call>{"), ("xml", "<function="), ("xml", "<function=a>"),
          ("xml", "<function=a><parameter=b>"), ("xml", "<function=a\n>"), ("json", "{\"name\": "),
          ("openai", "{\"tool_calls\": [")]


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    result = {"benchmark": "parse_hostile", "ms": {}}
    for name, junk in SHAPES:
        fmt = get_format(name)
        for size in (32_000, 256_000):
            action = junk * (size // len(junk))
            result["ms"][f"{name} {junk!r} x{size}"] = round(1000 * best_of(lambda: fmt.parse(action, 1)), 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
