"""What does grading a Math answer cost, with math-verify's LaTeX parser in ANTLR's default LL
prediction and with the rubric's SLL-first parsing (``rubric._parse_sll_first``)? Prints one JSON object.

Times :func:`~benchmax_gym.envs.math.rubric.is_equivalent` (CPU ms per call) on MATH-500's sample
records: each gold against itself restated (``The answer is <gold>``: parsed, not matched as text)
and against a wrong variant (its first digit changed, else ``+1`` appended), and, with
``--formulas``, each ``$...$`` / ``\\[...\\]`` formula of the solutions the same two ways. The two
parsers alternate call by call after one warm-up pass (ANTLR builds its prediction caches on the
first parses of a process); math-verify's and the rubric's parse caches are cleared before each
call, so every call parses. ``check`` parses every gold and formula both ways (latex2sympy2_extended
as math-verify calls it, its normalised form, and math-verify's ``parse``) and counts the results
(``sympy.srepr``, or the exception's type and message) that differ: SLL-first must change nothing.

    python benchmarks/math_grading.py [--data ../shared/data/math500/test_first100.jsonl] [--limit 100] [--formulas]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from pathlib import Path

from benchmax_gym.envs.math import rubric

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "math500" / "test_first100.jsonl"
_FORMULA = re.compile(r"(?<!\\)\$\$?(.+?)(?<!\\)\$\$?|\\\[(.+?)\\\]", re.DOTALL)


def wrong(answer: str) -> str:
    """The answer with its first digit changed, else with ``+1`` after it: the same shape, wrong."""
    digit = re.search(r"\d", answer)
    if digit is None:
        return answer + "+1"
    return answer[:digit.start()] + str((int(digit[0]) + 1) % 10) + answer[digit.end():]


def parsers():
    """latex2sympy2_extended's parser factory: the rubric's SLL-first one and the original (LL)."""
    from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy

    rubric._parse_sll_first()
    sll_first = _Latex2Sympy.create_parser
    return _Latex2Sympy, {"ll": sll_first.__wrapped__, "sll_first": sll_first}


def clear_caches() -> None:
    from math_verify.parser import parse_latex_cached

    parse_latex_cached.cache_clear()
    rubric._too_big.cache_clear()


def summary(ms: list[float]) -> dict:
    return {"median_ms": round(statistics.median(ms), 3), "p90_ms": round(statistics.quantiles(ms, n=10)[8], 3),
            "max_ms": round(max(ms), 1), "total_ms": round(sum(ms), 1), "calls": len(ms)}


def time_pairs(pairs: list[tuple[str, str]]) -> dict:
    """CPU ms per :func:`is_equivalent` call, each parser in turn: over all pairs, and over those whose
    gold is no plain number (``18`` against ``The answer is 18`` is compared without a parse)."""
    owner, factories = parsers()
    ms: dict[str, list[float]] = {mode: [] for mode in factories}
    verdicts: dict[str, list[bool]] = {mode: [] for mode in factories}
    try:
        for measured in (False, True):
            for i, (gold, predicted) in enumerate(pairs):
                for mode in list(factories)[::1 if i % 2 else -1]:  # which goes first alternates
                    owner.create_parser = factories[mode]
                    clear_caches()
                    started = time.process_time()
                    verdict = rubric.is_equivalent(gold, predicted)
                    if measured:
                        ms[mode].append(1000 * (time.process_time() - started))
                        verdicts[mode].append(verdict)
    finally:
        owner.create_parser = factories["sll_first"]
    latex = [rubric._plain_number(gold) is None for gold, _ in pairs]
    result = {}
    for subset, keep in (("all", [True] * len(pairs)), ("latex_gold", latex)):
        times = {mode: [t for t, k in zip(values, keep) if k] for mode, values in ms.items()}
        result[subset] = {mode: summary(values) for mode, values in times.items()}
        result[subset]["total_ratio"] = round(sum(times["ll"]) / sum(times["sll_first"]), 2)
        result[subset]["median_ratio"] = round(statistics.median(a / b for a, b in zip(times["ll"], times["sll_first"])), 2)
    result["verdicts_differ"] = sum(a != b for a, b in zip(verdicts["ll"], verdicts["sll_first"]))
    result["equivalent"] = sum(verdicts["ll"])
    return result


def check(strings: list[str]) -> dict:
    """Every string parsed both ways, three ways each; the outcomes that differ (should be none)."""
    import sympy
    from latex2sympy2_extended.latex2sympy2 import latex2sympy
    from math_verify import parse

    owner, factories = parsers()
    readers = {"latex2sympy": lambda s: latex2sympy(s, normalization_config=None),
               "latex2sympy_normalised": latex2sympy,
               "math_verify_parse": lambda s: parse(f"\\boxed{{{s}}}", parsing_timeout=None)}

    def outcome(read, text):
        clear_caches()
        try:
            value = read(text)
        except Exception as error:  # noqa: BLE001 - the failure itself is compared
            return ("error", type(error).__name__, str(error))
        return ("ok", [sympy.srepr(v) if isinstance(v, sympy.Basic) else repr(v) for v in value]
                if isinstance(value, list) else sympy.srepr(value))

    differences, errors, compared = [], 0, 0
    try:
        for text in strings:
            for name, read in readers.items():
                seen = {}
                for mode in factories:
                    owner.create_parser = factories[mode]
                    seen[mode] = outcome(read, text)
                compared += 1
                errors += seen["ll"][0] == "error"
                if seen["ll"] != seen["sll_first"]:
                    differences.append({"text": text, "reader": name, **{m: repr(o)[:200] for m, o in seen.items()}})
    finally:
        owner.create_parser = factories["sll_first"]
    return {"strings": len(strings), "parses_compared": compared, "ll_parse_errors": errors,
            "differences": len(differences), "first_differences": differences[:10]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA, help="MATH-500 JSON Lines (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=100, help="records read (default: %(default)s)")
    parser.add_argument("--formulas", action="store_true", help="also time the solutions' formulas as answers")
    parser.add_argument("--no-check", action="store_true", help="skip the parse-by-parse comparison")
    args = parser.parse_args()
    if not args.data.is_file():
        print(f"math_grading.py: no MATH-500 sample at {args.data}: pass --data", file=sys.stderr)
        raise SystemExit(2)
    records = [json.loads(line) for line in args.data.read_text().splitlines()[:args.limit] if line.strip()]
    golds = [r["answer"] for r in records]
    formulas = list(dict.fromkeys(
        (a or b).strip() for r in records for a, b in _FORMULA.findall(r["solution"]) if (a or b).strip()))

    def pairs(answers):
        return [(a, f"The answer is {a}") for a in answers] + [(a, wrong(a)) for a in answers]

    result = {"benchmark": "math_grading", "python": platform.python_version(), "records": len(records),
              "golds": time_pairs(pairs(golds))}
    if args.formulas:
        result["formulas"] = time_pairs(pairs(formulas))
    if not args.no_check:
        result["check"] = check(list(dict.fromkeys(golds + formulas)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
