"""Grading math answers: find the final answer in a completion, compare it with the gold answer.

:func:`is_equivalent` uses math-verify, which understands LaTeX (``\\frac{14}{3}`` equals
``14/3``, ``\\left( 3, \\frac{\\pi}{2} \\right)`` equals ``(3, \\pi/2)``). In the main thread the
whole check runs under one ``SIGALRM`` timer; signals only reach the main thread, while reward
functions also run in worker threads (vectorised and async environments), so there the check runs
in a daemon thread that is abandoned after the timeout.

Before the check both sides go through :func:`normalize_answer`, which removes what math-verify
reads as part of the mathematics though a reader would not: a leading "The answer is", a
sentence's full stop, a trailing unit or word (``18 dollars``), the degree sign, currency
signs, and the space of an implicit product (``4 i``). It removes nothing that can turn a wrong
answer into a right one: a trailing phrase that hedges or negates (``18 is wrong``, ``18 or
more``) stays, and the whole answer then fails to parse as mathematics.

math-verify reads an equation as its right side (``x = 5`` as 5), also when its sides are
constants that differ (``6 = 5``, ``x = 6 = 5``), and reads ``6 \\vee 5``, ``6 \\to 5`` or ``6 := 5`` as 5:
such an answer is refused (:func:`_false_equation`, :func:`_constant_dropped`); ``x = 5``, ``x \\to 5`` stand.
An answer it cannot read as LaTeX at all (``6 | 5``, ``6 \\stackrel{?}{=} 5``, ``(6=5)+0``, ``7 ** 5``,
``7 // 5``) it reads as one number of its text, and one with two ``=`` it cannot parse (``7 === 5``) as its
last side: a constant or number elsewhere in it that differs is refused too (:func:`_read_in_part`).
A trailing modulus (``5 \\pmod{7}``, ``x \\equiv 5 \\ (\\text{mod } 7)``) is set aside before the check
(:func:`_split_modulus`): the rest is graded, and the sides of a congruence agree modulo it
(``12 \\equiv 5 \\pmod{7}`` stands, ``6 \\equiv 5 \\pmod{7}`` and ``6 \\text{ (mod } 5)`` do not).
It drops ``\\text{...}`` and reads ``\\neq 18`` or ``\\ge 18`` as the number 18, so
:func:`hedges` refuses an answer that relates or qualifies its value (``\\neq``, ``\\ge``, ``\\approx``,
``\\pm``, or a word such as "not", "or", "than", "least", "wrong", in ``\\text{}`` or bare) where the
gold does not.

A percent sign is read both ways, since a question asking "what percent" has the gold 20 while one
asking for the share may have 0.2: ``20\\%`` (or ``20%``, ``20 percent``) matches a gold of 20 and
of 0.2 (or ``\\frac{1}{5}``), and a gold of ``20\\%`` accepts 20 and 0.2. Without the sign nothing is
scaled: 0.2 does not match 20. (math-verify alone reads ``9\\%`` as 9 only for integers, and fails
to parse a boxed ``20\\%`` at all.)
"""

from __future__ import annotations

import functools
import logging
import math
import re
import signal
import threading
import time
from decimal import Decimal
from fractions import Fraction

from benchmax_gym.core.rubric import RewardFn, Rubric, answer_tags, final_answer, in_import

# -- extracting the final answer -------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOXED_OR_BRACE = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")


def _boxed_contents(text: str) -> list[str]:
    """Contents of every complete ``\\boxed{...}`` / ``\\fbox{...}``, matching nested braces,
    in order of their opening. One pass with a stack: linear in the text, however hostile
    (thousands of unclosed ``\\boxed{`` must not cost seconds at grading)."""
    found, stack = [], []  # stack: where each open group's content starts, or -1 for a plain brace
    for match in _BOXED_OR_BRACE.finditer(text):
        token = match.group()
        if token == "}":
            if stack and (start := stack.pop()) >= 0:
                found.append((start, text[start:match.start()]))
        else:
            stack.append(match.end() if len(token) > 1 else -1)
    return [content for _, content in sorted(found)]


def _clean(answer: str) -> str:
    return answer.strip().strip("$").strip()


def extract_answer(text: str) -> str | None:
    """The final answer: the last ``\\boxed{...}``, else the shared rule of
    :func:`~benchmax_gym.core.rubric.final_answer` (the last ``<answer>...</answer>``).

    A boxed answer inside answer tags counts as boxed. Surrounding white space and ``$`` are
    stripped. None when the text has neither (the reply scores 0).
    """
    global _last_extracted
    if not isinstance(text, str):
        return None
    last = _last_extracted  # (one tuple, read and written whole: safe across threads)
    if last[0] == text:
        return last[1]
    boxed = _boxed_contents(text)
    if boxed:
        answer = _clean(boxed[-1])
    else:
        tagged = final_answer(text)
        answer = None if tagged is None else _clean(tagged)
    _last_extracted = (text, answer)
    return answer


_last_extracted: tuple[str | None, str | None] = (None, None)  # the rubric's two leaves read the same reply


def well_formed(text: str) -> bool:
    """True when the text gives exactly one final answer, and it is not empty.

    ``<answer>\\boxed{5}</answer>`` is one answer; two boxes (an unclosed one included), or a
    box plus answer tags without a box, are two.
    """
    if not isinstance(text, str):
        return False
    answers = len(_BOXED.findall(text))
    answers += sum(1 for tag in answer_tags(text) if not _BOXED.search(tag))
    return answers == 1 and bool(extract_answer(text))


# -- comparing with the gold answer ----------------------------------------------------------

# A final answer longer than this is junk, and parsing it takes seconds (a few milliseconds a character,
# more with brackets and bars): not equivalent. MATH-500's longest answer here has 48 characters.
MAX_ANSWER_CHARS = 300
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")
_BARE_PI = re.compile(r"(?<![\\A-Za-z])pi(?![A-Za-z])")
_PLAIN_INT = re.compile(r"-?[0-9]{1,100}")  # both sides such: equal as ints, nothing to normalise


# -- normalising an answer before the comparison (see the module docstring) -----------------

_CURRENCY = re.compile(r"\\?\$|[€£¥₹]")
_DEGREE = re.compile(r"\s*(?:°|\\degree\b|\\textdegree\b)\s*(?:[CF](?![A-Za-z]))?")
_ANSWER_IS = re.compile(
    r"^(?:(?:so|thus|therefore|hence)\s*,?\s*)?(?:the\s+)?(?:final\s+)?answer\s*(?:is\s*:?|:|=)\s*", re.IGNORECASE
)
_FULL_STOP = re.compile(r"(?<=[\w})])\.\s*$")
# a value (ending in a digit, brace, bracket, percent sign or command), a space, and up to four
# words: the first a word of three letters or more, or a short unit ("4 ab" is a product, kept)
_UNIT_TAIL = re.compile(
    r"^(?P<value>.*?(?:\d|\}|\)|%|\\[A-Za-z]+))\s+"
    r"(?P<unit>(?:[A-Za-z]{3,}|cm|mm|km|kg|mg|ml|ft|lb|oz|hr|yd|mi)\.?"
    r"(?:(?:\s+|\s*/\s*)[A-Za-z]+\.?(?:\^\{?[23]\}?|[²³])?){0,3})$"
)
# words that make a trailing phrase part of the answer (a hedge, a negation, an operation, a
# multiplier or a fraction: "18 is wrong", "5 squared", "18 thousand", "3 quarters"): kept
_NOT_UNITS = frozenset(
    "is are was were be not no nor or and but than wrong incorrect false true maybe perhaps probably "
    "approximately approx about around roughly nearly almost least most more less fewer over under "
    "above below plus minus times divided pi sqrt sin cos tan cot csc log ln exp inf infty infinity "
    "mod choose squared cubed factorial power tens hundred hundreds thousand thousands million millions "
    "billion billions trillion trillions dozen dozens half halves third thirds fourth fourths quarter "
    "quarters fifths sixths sevenths eighths ninths tenths hundredths thousandths".split()
)
# an implicit product written with a space: "4 i", "b i", "\\frac{1}{2} x" (not after a command or word)
_PRODUCT_SPACE = re.compile(r"(\\[A-Za-z]+|[A-Za-z]+|[0-9})])\s+(?=[A-Za-z](?![A-Za-z]))")


_PERCENT_WORD = re.compile(
    r"(?<=[\d}])\s*(?:\\(?:text|mbox|mathrm|textrm)\s*\{\s*(?:\\?%|per\s*cent)\s*\}|per\s*cent\b)", re.IGNORECASE
)


def normalize_answer(answer: str) -> str:
    """What is left of an answer once reading conventions are gone; both sides are normalised.

    ``"The answer is 18."`` -> ``"18"``, ``"18 dollars"`` -> ``"18"``, ``"$18$"`` -> ``"18"``,
    ``"30°"`` -> ``"30^\\circ"``, ``"3 + 4 i"`` -> ``"3 + 4i"``. ``"18 is wrong"`` stays as it is.
    """
    text = _CURRENCY.sub("", str(answer)).strip()
    text = _PERCENT_WORD.sub(r"\\%", text)
    text = _DEGREE.sub(r"^\\circ ", text).strip()
    text = _ANSWER_IS.sub("", text)
    text = _FULL_STOP.sub("", text).strip()
    tail = _UNIT_TAIL.match(text)
    if tail and not {w.strip(".").lower() for w in re.findall(r"[A-Za-z]+\.?", tail["unit"])} & _NOT_UNITS:
        text = tail["value"].strip()
    return _PRODUCT_SPACE.sub(lambda m: m[1] if len(m[1]) == 1 else m[0], text)


# -- hedges, negations and relations (see the module docstring) -------------------------------

_RELATIONS = {
    "not equal": re.compile(r"\\(?:neq?|not|nless|ngtr|neg|lnot)(?![A-Za-z])|≠|!="),
    "at least": re.compile(r"\\(?:geq?|geqq|geqslant|gt|gg|succ|succeq)(?![A-Za-z])|[≥>]"),
    "at most": re.compile(r"\\(?:leq?|leqq|leqslant|lt|ll|prec|preceq)(?![A-Za-z])|[≤<]"),
    "about": re.compile(r"\\(?:approx|sim|simeq|cong|propto)(?![A-Za-z])|[≈∼]"),
    "plus or minus": re.compile(r"\\(?:pm|mp)(?![A-Za-z])|±|∓"),
    # connectives math-verify cannot read, so it reads the answer as its last number: ``x \\vee 5`` as 5
    "or / and": re.compile(r"\\(?:vee|lor|wedge|land|bigvee|bigwedge|veebar|barwedge|curlyvee|curlywedge|&)"
                           r"(?![A-Za-z])|[∨∧]|(?<!\\)&(?!.*\\end)", re.DOTALL),
    "set operation": re.compile(r"\\(?:cup|cap|setminus|smallsetminus|backslash|sqcup|sqcap|uplus|bigcup|bigcap|"
                                r"amalg)(?![A-Za-z])|[∪∩∖]"),
    "circled operation": re.compile(r"\\(?:oplus|ominus|otimes|oslash|odot|bigoplus|bigotimes|bigodot)(?![A-Za-z])|[⊕⊖⊗⊘⊙]"),
}
# "more", "less", "larger" alone state a difference ("5 more" answers "how many more"): their hedges
# come with "or" or "than", which are listed
_HEDGE_WORDS = frozenset(
    "not no nor neither either or but than except unless wrong incorrect false true maybe perhaps probably "
    "possibly approximately approx about around roughly nearly almost least most over under above below "
    "between exceeds".split()
)
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")


def hedges(answer: str) -> set[str]:
    """The relations (``\\neq``, ``\\ge``, ``\\approx``, ``\\pm``...) and hedging words ("not", "or
    more", "at least", "wrong") in an answer. :func:`is_equivalent` refuses a prediction with one
    the gold lacks: math-verify would read ``\\neq 18`` and ``18 \\text{ or more}`` as plain 18."""
    found = {name for name, pattern in _RELATIONS.items() if pattern.search(answer)}
    return found | {word for word in map(str.lower, _WORD.findall(answer)) if word in _HEDGE_WORDS}


_TRAILING_PERCENT = re.compile(r"^(?P<value>.*?)\s*\\?%$")


def _split_percent(answer: str) -> tuple[str, bool]:
    """``"20\\%"`` -> ``("20", True)``; an answer without a trailing percent sign is returned as is."""
    match = _TRAILING_PERCENT.match(answer)
    if match and match["value"].strip():
        return match["value"].strip(), True
    return answer, False


def _hundredth(value: str) -> str:
    """``value / 100`` written so the comparison can read it: a plain decimal stays one (exact)."""
    text = value.replace(",", "") if _THOUSANDS.fullmatch(value) else value
    if _PLAIN_NUMBER.fullmatch(text):
        return format(Decimal(text).scaleb(-2), "f")
    return f"\\frac{{{value}}}{{100}}"


def _plain_number(text: str) -> Fraction | None:
    """``"1,600"`` -> 1600, ``"18.0"`` -> 18; None for anything that is not a plain number."""
    text = _clean(text)
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    if not _PLAIN_NUMBER.fullmatch(text):
        return None
    return Fraction(text)


class _ExpectedWarning(logging.Filter):
    """Drops math-verify's "Timeout is disabled" warning: without signals we time out ourselves."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


_FILTER = _ExpectedWarning()
for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_FILTER)


_sll_first_installed = False
_sll_first_lock = threading.Lock()


def _parse_sll_first() -> None:
    """Makes math-verify's LaTeX parser (latex2sympy2_extended's ANTLR grammar, on the pure-Python
    runtime) parse with ANTLR's SLL prediction first and with its default, full LL, only where SLL
    fails: ANTLR's two-stage parsing. Results are LL's; grading a MATH-500 LaTeX answer costs about
    half the CPU (a tuple such as ``\\left( 3, \\frac{\\pi}{2} \\right)``: 218 -> 5 ms; see
    ``benchmarks/math_grading.py``, whose check finds no parse of MATH-500's golds and solution
    formulas that differs).

    Why the result is the same: ANTLR's ``PredictionMode.SLL`` documentation (``antlr4/atn/
    PredictionMode.py`` in the runtime; https://www.antlr.org/api/Java/org/antlr/v4/runtime/atn/
    PredictionMode.html) says "the parser will either return a correct parse tree (i.e. the same
    parse tree that would be returned with the LL prediction mode), or it will report a syntax
    error", and ``ParserATNSimulator``'s "Two-Stage Parsing" note gives the recipe followed here:
    SLL with ``BailErrorStrategy`` (no error listeners: it reports nothing, it stops), and only on
    an error a parse with LL and the default error strategy. The grammar's start rule ends at EOF
    and its only predicates are precedence ones. The second stage uses a parser built anew rather
    than a reset one: latex2sympy2_extended's lexer raises at a bad character, in either stage,
    and would be left part-way; so whatever SLL cannot parse (a syntax error, or ``x^2``, which
    needs LL) meets exactly the parse this hook replaces, its errors and their messages included.
    An alarm's :class:`_OutOfTime` (a BaseException) is not caught. Installed once, when the rubric
    first grades; where latex2sympy2_extended has no ``_Latex2Sympy.create_parser`` (another
    version) nothing changes."""
    global _sll_first_installed
    if _sll_first_installed:
        return
    with _sll_first_lock:
        try:
            from antlr4.atn.PredictionMode import PredictionMode
            from antlr4.error.ErrorStrategy import BailErrorStrategy
            from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy
        except ImportError:
            _sll_first_installed = True
            return
        create_parser = getattr(_Latex2Sympy, "create_parser", None)
        if create_parser is not None and not getattr(create_parser, "sll_first", False):

            @functools.wraps(create_parser)
            def create_sll_first_parser(self, latex_str):
                parser = create_parser(self, latex_str)
                rule = type(parser).math  # the grammar's start rule, which latex2sympy2_extended's parse calls

                def math():
                    parser.removeErrorListeners()  # (ANTLR's recipe: stage 1 reports nothing; it bails)
                    parser._errHandler = BailErrorStrategy()
                    parser._interp.predictionMode = PredictionMode.SLL
                    try:
                        return rule(parser)
                    except Exception:  # a syntax error, or input only LL resolves: LL decides, from the start
                        return create_parser(self, latex_str).math()

                parser.math = math
                return parser

            create_sll_first_parser.sll_first = True
            _Latex2Sympy.create_parser = create_sll_first_parser
        _sll_first_installed = True


_values_first_installed = False


def _simplify_values_first() -> None:
    """Makes math-verify's last resort, ``simplify(gold - predicted)`` (``sympy_symbolic_eq``), first
    compare the two sides' values at a point (:func:`_differ_at_a_point`) and answer "not equal" at
    once where they differ. simplify takes time that grows fast with the terms of an answer
    (``\\tan^5(8w) + \\sec^3(4p) + ...`` or 50 names added: 5 to 20 s, a 300-character answer), and
    can only find a difference of two expressions that differ at a point to be zero where it errs:
    every answer it finds equal is still checked by it. Installed once, like :func:`_parse_sll_first`."""
    global _values_first_installed
    if _values_first_installed:
        return
    with _sll_first_lock:
        from math_verify import grader

        symbolic_eq = grader.sympy_symbolic_eq
        if not getattr(symbolic_eq, "values_first", False):

            @functools.wraps(symbolic_eq)
            def values_first(a, b):
                return False if _differ_at_a_point(a, b) else symbolic_eq(a, b)

            values_first.values_first = True
            grader.sympy_symbolic_eq = values_first
        _values_first_installed = True


#: where :func:`_differ_at_a_point` reads both sides: each name gets its own value, none a simple number
_POINTS = ((0.5377, 0.0731), (0.8183, 0.2239))


def _differ_at_a_point(a, b) -> bool:
    """Whether expressions ``a`` and ``b`` surely take different values: at one of two points (each
    name a value of its own) both evaluate, to 30 digits, to numbers that differ by more than a
    millionth of their size, or one to a finite number and the other not (``\\ln(e - e)`` added to
    junk). Anything else (a side that stays symbolic there, both infinite, an integral, sum or limit,
    whose evaluation is numerical analysis, not arithmetic) says nothing: False."""
    import sympy

    if not (isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr)):
        return False
    if any(e.has(sympy.Integral, sympy.Sum, sympy.Product, sympy.Limit, sympy.Derivative) for e in (a, b)):
        return False
    names = sorted(a.free_symbols | b.free_symbols, key=str)
    for start, step in _POINTS:
        point = {name: sympy.Float(start + step * i, 30) for i, name in enumerate(names)}
        try:
            x, y = (complex(e.evalf(30, subs=point)) for e in (a, b))
        except (TypeError, ValueError, ArithmeticError):
            continue
        finite = [math.isfinite(v.real) and math.isfinite(v.imag) for v in (x, y)]
        if finite[0] != finite[1] or all(finite) and abs(x - y) > 1e-6 * max(1.0, abs(x), abs(y)):
            return True
    return False


def _verify(gold: str, predicted: str) -> bool:
    """math-verify's check, without its own timeouts (the caller bounds the whole of it)."""
    from math_verify import parse, verify  # imported here: sympy costs ~0.5 s to import

    _parse_sll_first()
    _simplify_values_first()
    # Wrapping in \boxed{} makes math-verify read the whole string as one LaTeX answer; a bare
    # "pi" would otherwise be read as the product p*i.
    gold_text, pred_text = _clean(gold), _BARE_PI.sub(r"\\pi", _clean(predicted))
    (gold_text, gold_modulus), (pred_text, modulus) = _split_modulus(gold_text), _split_modulus(pred_text)
    if not gold_text or not pred_text or (gold_modulus and modulus and gold_modulus != modulus):
        return False
    if _too_big(gold_text) or _too_big(pred_text):
        return False
    gold_parsed = parse(f"\\boxed{{{gold_text}}}", parsing_timeout=None)
    pred_parsed = parse(f"\\boxed{{{pred_text}}}", parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    if any(_digits(e) > MAX_DIGITS for e in (*gold_parsed[:1], *pred_parsed[:1])):
        return False
    if any(_false_equation(e, modulus) for e in pred_parsed[:1]) or _constant_dropped(pred_text):
        return False
    if pred_text != gold_text and _read_in_part(pred_text, pred_parsed[0], gold_text, gold_parsed[0], modulus):
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


#: connectives math-verify reads as their right side alone (``6 \vee 5``, ``6 \to 5``, ``6 := 5``: 5)
_RIGHT_SIDE_READ = re.compile(
    r"\\(?:to|rightarrow|Rightarrow|longrightarrow|Longrightarrow|implies|mapsto|iff|Leftrightarrow|therefore|"
    r"because|colon|coloneqq|vee|wedge|lor|land|in|ni|subset|subseteq|cap|setminus|backslash|mid|bmod)(?![A-Za-z])|:="
)


def _constant_dropped(latex: str) -> bool:
    """Whether a connective math-verify reads as its right side follows a constant that differs
    from that side (``6 \\vee 5``, ``6 \\to 5``: one candidate listed before another); a name
    before it (``x \\in [3, 5]``, ``x \\to 5``) stands, and so does a part that does not parse."""
    from math_verify import parse, verify

    parts = _RIGHT_SIDE_READ.split(latex)
    if len(parts) < 2:
        return False
    last = parse(f"\\boxed{{{parts[-1]}}}", parsing_timeout=None)
    for part in parts[:-1]:
        parsed = parse(f"\\boxed{{{part}}}", parsing_timeout=None) if part.strip() else []
        if parsed and last and _is_constant(parsed[0]) and not verify(parsed, last, timeout_seconds=None):
            return True
    return False


def _is_constant(expr) -> bool:
    import sympy
    from sympy.core.function import AppliedUndef

    return isinstance(expr, sympy.Expr) and not expr.free_symbols and not expr.atoms(AppliedUndef)


def _false_equation(expr, modulus: int | None = None) -> bool:
    """Whether a parsed answer equates constants that differ: math-verify reads an equation as its
    right side, ``x = 5`` as 5 (as it should) but ``6 = 5`` as 5 too. The sides one chain of ``=``
    joins (``6 = x = 5``: 6, x and 5) are one value, so its constant sides must agree as the grader
    compares answers (``2 + 3 = 5`` stands), or as integers modulo the answer's ``modulus``
    (``12 \\equiv 5``, mod 7); a side with a variable (``x``, ``f(2)``) can be anything."""
    import sympy
    from math_verify import verify

    if not isinstance(expr, sympy.Basic):
        return False
    chains = [node for node in sympy.preorder_traversal(expr) if isinstance(node, sympy.And)]
    chained = {eq for chain in chains for eq in chain.args}
    for equations in [chain.args for chain in chains] + [(eq,) for eq in expr.atoms(sympy.Eq) if eq not in chained]:
        values: list[set] = []  # the sides joined by "="
        for eq in equations:
            if isinstance(eq, sympy.Eq):
                joined = [v for v in values if eq.lhs in v or eq.rhs in v]
                values = [v for v in values if v not in joined] + [set().union({eq.lhs, eq.rhs}, *joined)]
        for sides in values:
            constants = [side for side in sides if _is_constant(side)]  # (f(2) is a name)
            if any(not _congruent(constants[0], other, modulus) for other in constants[1:]):
                return True
    return False


def _congruent(a, b, modulus: int | None) -> bool:
    from math_verify import verify

    if modulus and getattr(a, "is_integer", False) and getattr(b, "is_integer", False):  # (within MAX_DIGITS)
        return (int(a) - int(b)) % modulus == 0
    return verify(a, b, timeout_seconds=None)


# -- an answer math-verify reads as one number of its text ------------------------------------

#: where one candidate may end and another begin, in an answer that is not LaTeX math-verify reads:
#: equals, ``\\stackrel{?}{=}`` and the connectives read as their right side; then, in a part that
#: is still not LaTeX, a bar (``6 | 5``; ``|-5|`` alone is an absolute value)
_CANDIDATE_SPLIT = re.compile(
    r"=|≡|\\equiv(?![A-Za-z])|\\(?:stackrel|overset|underset)(?![A-Za-z])|" + _RIGHT_SIDE_READ.pattern
)
_BAR = re.compile(r"\\?\||\\[lr]?vert(?![A-Za-z])")
#: a number written in a part no reader understands (``7 ** 5``, ``7 // 5``, ``7 @ 5``, ``6 \\\\ 5``)
_WRITTEN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
#: what a candidate's edges may carry that is no part of it: space, brackets, \\left / \\right
_EDGES = ("\\left", "\\right", "\\{", "\\}", "(", ")", "[", "]", "{", "}", "\\,", "\\;", "\\:", "\\!", "\\ ", "\\quad")
#: the ``=`` math-verify splits a text at to read its last side (``math_verify.parser.get_last_eq``)
_EQUALS = re.compile(r"(?<![\\<!>])=")


def _read_latex(part: str):
    """``part`` as math-verify's LaTeX reader alone reads it; None where it cannot."""
    from math_verify import parse
    from math_verify.parser import LatexExtractionConfig

    parsed = parse(f"\\boxed{{{part}}}", extraction_config=[LatexExtractionConfig()], parsing_timeout=None)
    return parsed[0] if parsed and not isinstance(parsed[0], str) else None


def _last_side_read(latex: str, value) -> bool:
    """Whether math-verify read ``latex`` as the side after its last ``=``: its parser could not
    read the whole (``7 === 5``, ``7 =/= 5``, ``x^2 = 4 \\Rightarrow x = 2``), and what it read
    holds no equation (``math_verify.parser.get_last_eq``, which leaves a text with a comma or
    a semicolon as it is; from a text with a box inside, it reads that box)."""
    import sympy

    if len(_EQUALS.findall(latex)) < 2 or "," in latex or ";" in latex or _BOXED.search(latex):
        return False
    return isinstance(value, sympy.Basic) and not value.has(sympy.Eq)


def _read_in_part(latex: str, value, gold: str, gold_value, modulus: int | None = None) -> bool:
    """Whether math-verify read ``latex`` as one part of its text, and another part holds a constant
    that differs from the ``value`` it read: it read no LaTeX there (``6 | 5``, ``7 ** 5``: one
    number of the text), another reading than its LaTeX one (``\\frac{6}{1} | 5``: 5, not 6), or the
    last side (``7 === 5``). Where the gold is itself read in part, its text has the same kind of
    junk, and only what the gold does not have counts: a constant (not every number) outside
    ``latex``'s unread LaTeX (:func:`_other_candidate`)."""
    whole = _read_latex(latex)
    other_reading = whole is None or whole != value
    last_side = _last_side_read(latex, value)
    if not (other_reading or last_side):
        return False  # read as LaTeX: the equation checks judged it
    gold_whole = _read_latex(gold)
    strict = gold_whole is not None and gold_whole == gold_value and not _last_side_read(gold, gold_value)
    if (whole is None or strict and other_reading) and _other_candidate(latex, value, modulus, numbers=strict):
        return True
    return strict and last_side and _dropped_sides(latex, modulus)


def _other_candidate(latex: str, value, modulus: int | None = None, numbers: bool = True) -> bool:
    """Whether ``latex``, which math-verify did not read as LaTeX (``6 | 5``, ``(6=5)+0``,
    ``6 \\stackrel{?}{=} 5``, ``7 ** 5``, ``7 // 5``, ``7 @ 5``), holds a constant that differs
    from the ``value`` it read instead (one number of the text: 5), or is not congruent to it
    modulo ``modulus``. Each part between relations and connectives, its brackets trimmed, is
    compared, and with ``numbers``, in a part no reader understands, each number written in it: an
    operator math-verify cannot read scores only where every number around it agrees. A part with
    a name (``n | 5``) stands. Each character is parsed at most three times: linear in the answer."""
    import sympy

    for segment in {_strip_edges(part, _EDGES, both=True) for part in _CANDIDATE_SPLIT.split(latex)}:
        parts = [segment] if not segment or _read_latex(segment) is not None else _BAR.split(segment)
        for part in {_strip_edges(part, _EDGES, both=True) for part in parts}:
            expr = _read_latex(part) if part else None
            if expr is not None:
                candidates = [expr]
            else:
                candidates = map(sympy.Rational, set(_WRITTEN_NUMBER.findall(part))) if numbers else []
            if any(_is_constant(c) and not _congruent(c, value, modulus) for c in candidates):
                return True
    return False


def _dropped_sides(latex: str, modulus: int | None = None) -> bool:
    """Whether the sides one ``=`` joins in ``latex``, which math-verify read as its last side
    (:func:`_last_side_read`), hold constants that differ (as :func:`_false_equation` would find,
    had it parsed: ``7 === 5``, ``7 =/= 5``), clause by clause between the connectives math-verify
    reads as their right side (``x^2 = 4 \\Rightarrow x = 2`` stands)."""
    for clause in _RIGHT_SIDE_READ.split(latex):
        sides = [_read_latex(side) for side in {side.strip() for side in _EQUALS.split(clause)} if side]
        constants = [side for side in sides if side is not None and _is_constant(side)]
        if any(not _congruent(constants[0], other, modulus) for other in constants[1:]):
            return True
    return False


def _strip_edges(text: str, tokens: tuple[str, ...], both: bool = False) -> str:
    """``text`` without any run of ``tokens`` (or white space) at its end, and at its start if
    ``both``. Each step removes a token: linear in the text."""
    end, start = len(text), 0
    while True:
        while end > start and text[end - 1].isspace():
            end -= 1
        token = next((t for t in tokens if text.endswith(t, start, end)), None)
        if token is None:
            break
        end -= len(token)
    while both:
        while start < end and text[start].isspace():
            start += 1
        token = next((t for t in tokens if text.startswith(t, start, end)), None)
        if token is None:
            break
        start += len(token)
    return text[start:end]


# -- a modulus after the answer ---------------------------------------------------------------

#: ``mod`` as a command (``\\pmod``, ``\\bmod``, ``\\mod``) or a word (``\\text{(mod}``, ``(\\mathrm{mod}``)
_MOD_WORD = re.compile(r"(?<![A-Za-z])(?:\\(?P<command>[bp]?mod)|mod)(?![A-Za-z])")
#: what may surround a modulus: space, spacing commands, the groups of \\text{...}, brackets
_MOD_FILLER = re.compile(
    r"\s|\\[,;:! ]|\\q?quad(?![A-Za-z])|~|\\(?:text|textrm|mathrm|operatorname|mbox)\s*\{|"
    r"\\(?:left|right)(?![A-Za-z])|[{}()]"
)
_MODULUS = re.compile(r"[0-9]{1,18}")
_BEFORE_MOD = ("(", "{", "\\text", "\\textrm", "\\mathrm", "\\operatorname", "\\mbox", "\\left",
               "\\,", "\\;", "\\:", "\\!", "\\", "\\quad", "\\qquad", "~")


def _split_modulus(latex: str) -> tuple[str, int | None]:
    """``"5 \\pmod{7}"`` -> ``("5", 7)``: an answer and the integer modulus written after it, as
    ``\\pmod{7}``, ``(\\bmod 7)``, ``\\text{ (mod } 7)`` or, after a congruence, ``\\mod 7``
    (``x \\equiv 5 \\mod 7``; alone, ``12 \\mod 7`` is the operation: 5). math-verify reads
    ``\\pmod{7}`` as letters and ``6 \\text{ (mod } 5)`` as 5; ``\\text{(mod} 5)`` leaves no answer
    (``""``). Anything else is returned as it is, with None."""
    mod = None
    for mod in _MOD_WORD.finditer(latex):
        pass
    if mod is None or not _MODULUS.fullmatch(_MOD_FILLER.sub("", latex[mod.end():])):
        return latex, None
    before = latex[:mod.start()]
    value = _strip_edges(before, _BEFORE_MOD)
    opened = before[len(value):].count("(")  # one bracket opens "(mod 7)"
    if opened > 1 or not (opened or mod["command"] == "pmod" or "\\equiv" in value or "≡" in value):
        return latex, None
    return value, int(_MODULUS.search(latex, mod.end())[0])


# -- answers no real one looks like -------------------------------------------------------------

#: math-verify's LaTeX parser (antlr, pure Python) takes time exponential in some structures: each
#: more level of brackets, bar (``|``, ``\\vert``, ``\\|``) or script on one base about doubles it
#: (``"{" * 16 + "1" + "}" * 16``, ``"1|2|" * 12 + "5"``, ``"x^2_" * 8 + "1"``: seconds to minutes,
#: each ended only by the timeout), and tens of milliseconds per bracket in a list (``"(1),"`` or
#: ``"x_{1}+"`` repeated reach the timeout in 1,000 characters). Real answers need little: MATH-500's
#: sample answers hold up to 3 brackets, 2 deep, its solutions' formulas up to 4 bars
#: (``|a| \\cdot |b|``), and TeX gives a base one sub- and one superscript. The bounds allow more.
MAX_NESTING = 6
MAX_BRACKETS = 24
MAX_BARS = 4
#: integrals cost the parser time exponential in their count too (each about 4x: 3 take 0.2 s, 5 over
#: 1 s, 8 over 10 s), and two with terms after them already seconds; no answer needs one (an unevaluated
#: integral is no final value) but one, which costs about as much as the rest of the answer, is let be
MAX_INTEGRALS = 1
_OPEN, _CLOSE = frozenset("([{"), frozenset(")]}")
_BARS = re.compile(r"\||\\[lr]?[vV]ert(?![A-Za-z])")
_INTEGRALS = re.compile(r"\\(?:i{1,3}nt|oint|intop|smallint)(?![A-Za-z])|[∫∬∭∮]")
#: three scripts in a row (``x^2_x^2``, ``x_1^x``, ``x^x^x``): TeX's "double superscript" error
_SCRIPT_RUN = re.compile(r"(?:(?<!\\)[\^_]\s*(?:\\[A-Za-z]+(?:\s*\{[^{}]*\})*|\{[^{}]*\}|[^\s{}\\^_])\s*){3}")


def _tangled(latex: str) -> bool:
    """Whether an answer nests brackets deeper than :data:`MAX_NESTING`, holds more than
    :data:`MAX_BRACKETS` brackets, :data:`MAX_BARS` bars or :data:`MAX_INTEGRALS` integrals, or chains three scripts: structure no
    answer needs, on which the parser would spend up to the whole timeout. A linear scan, done
    before math-verify sees the answer."""
    if len(_BARS.findall(latex)) > MAX_BARS or _SCRIPT_RUN.search(latex):
        return True
    if len(_INTEGRALS.findall(latex)) > MAX_INTEGRALS:
        return True
    depth = opened = 0
    for ch in latex:
        if ch in _OPEN:
            depth, opened = depth + 1, opened + 1
            if depth > MAX_NESTING or opened > MAX_BRACKETS:
                return True
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
    return False


#: an answer whose numbers may reach more digits than this is refused before sympy evaluates it
MAX_DIGITS = 10_000
#: what can make a number longer than the text that writes it (a power, a factorial)...
_GROWS = re.compile(r"[\^!]")
_COMMAND = re.compile(r"\\([A-Za-z]+)")
#: ...and the commands that cannot (no binomial, exponential, sum, product, or one unknown here)
_FLAT_COMMANDS = frozenset(
    "frac dfrac tfrac sqrt left right cdot times div pi infty text quad qquad sin cos tan cot sec csc "
    "arcsin arccos arctan sinh cosh tanh log ln alpha beta gamma delta epsilon varepsilon theta vartheta lambda mu "
    "nu rho sigma tau phi varphi omega".split()
)


@functools.lru_cache(maxsize=1024)  # a task's gold and common answers recur across samples
def _too_big(latex: str) -> bool:
    """Whether ``latex``'s numbers may pass :data:`MAX_DIGITS`, from a parse that evaluates
    nothing: the parser itself evaluates some functions (``\\binom{3^{10^{10}}}{2}`` computes
    ``3^{10^{10}}``, holding the GIL) before the parsed answer can be checked."""
    from math_verify.parser import parse_latex_cached
    from sympy import evaluate

    if not _GROWS.search(latex) and set(_COMMAND.findall(latex)) <= _FLAT_COMMANDS:
        return False  # (its numbers are written out: the parse, half the cost of grading, is not needed)
    try:
        with evaluate(False):  # (sympy's global parameters are per thread)
            # uncached: math-verify's own parse must never read this unevaluated result
            expr = parse_latex_cached.__wrapped__(latex)
    except Exception:  # not LaTeX it reads: the parse below decides
        return False
    return _digits(expr) > MAX_DIGITS
_FACTORIAL_LIKE = frozenset({"factorial", "factorial2", "subfactorial", "gamma", "binomial", "RisingFactorial",
                             "FallingFactorial", "fibonacci", "lucas", "primorial", "catalan"})


def _digits(expr, depth: int = 0, sizes: dict | None = None) -> float:
    """An upper bound on the decimal digits of the numbers in a parsed answer.

    sympy computes ``3^{10^{10}}`` exactly in one C call that holds the GIL: no timeout can stop
    it (a thread's ``join(timeout)`` never returns, ``signal.alarm`` only reaches the main
    thread), so such an answer is refused before it is evaluated."""
    import sympy

    if depth > 200:
        return math.inf
    if sizes and expr in sizes:  # a Sum's or Product's index: as big as its bounds
        return sizes[expr]
    if isinstance(expr, sympy.MatrixBase):
        return max((_digits(e, depth + 1, sizes) for e in expr), default=0.0)
    if isinstance(expr, (sympy.Sum, sympy.Product)):
        return _iterated_digits(expr, depth, sizes)
    if isinstance(expr, sympy.Integer):
        return max(1.0, abs(int(expr)).bit_length() * 0.30103)
    if isinstance(expr, sympy.Rational):
        return max(_digits(sympy.Integer(expr.p)), _digits(sympy.Integer(expr.q)))
    if isinstance(expr, sympy.Float):
        _, man, exp, bc = expr._mpf_ if expr._mpf_[1] else (0, 0, 0, 1)
        return max(1.0, abs(exp + bc) * 0.30103)
    args = getattr(expr, "args", ())
    if not isinstance(expr, sympy.Basic) or not args:
        return 1.0
    parts = [_digits(a, depth + 1, sizes) for a in args]
    name = type(expr).__name__
    if isinstance(expr, sympy.Pow) or name == "exp":
        if expr.args[-1].free_symbols:  # a power of a name (``e^{-x^2}``, ``2^{n}``) is never computed
            return max(parts)
        base, power = (parts[0], parts[1]) if len(parts) == 2 else (1.0, parts[0])
        if power > 300:
            return math.inf
        if isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Rational):
            # a written exponent: b^e has at most |e| times b's digits, a root (|e| <= 1) no more
            # than b (``\\sqrt{\\sqrt{65536}}``), where the bound for an unknown exponent grows 10x a level
            return max(base, 1.0) * max(1.0, float(abs(expr.exp)))
        return max(base, 1.0) * 10.0 ** power
    if name in _FACTORIAL_LIKE:
        top = max(parts)
        return math.inf if top > 300 else top * 10.0 ** top
    if isinstance(expr, sympy.Mul):
        return sum(parts)
    return max(parts) + (1.0 if isinstance(expr, sympy.Add) else 0.0)


def _iterated_digits(expr, depth: int, sizes: dict | None) -> float:
    """A finite ``\\sum`` or ``\\prod``: up to 10**(its bounds' digits) terms, each as big as its
    index's bounds allow. sympy computes ``\\prod_{k=1}^{10^{6}} k`` (10^6!) or the harmonic
    ``\\sum_{i=1}^{10^{7}} \\frac{1}{i}`` in C calls holding the GIL for seconds; an infinite or
    symbolic bound is summed symbolically, in Python, which the timeout stops."""
    import sympy

    sizes, terms = dict(sizes or {}), 1.0
    for index, *bounds in expr.limits:
        ends = [_digits(b, depth + 1, sizes) for b in bounds]
        sizes[index] = max(ends, default=1.0)
        if len(bounds) == 2 and not any(b.free_symbols or b.has(sympy.oo, -sympy.oo, sympy.zoo) for b in bounds):
            if sizes[index] > 300:
                return math.inf
            terms *= 10.0 ** sizes[index]
    return terms * _digits(expr.function, depth + 1, sizes)


def is_equivalent(gold: str, predicted: str, timeout: float = 5.0) -> bool:
    """Whether ``predicted`` is mathematically the same answer as ``gold``; never raises.

    A prediction that hedges where the gold does not (:func:`hedges`) is not equivalent. Both
    sides are normalised (:func:`normalize_answer`), and a trailing percent sign on one side
    also tries the value divided by 100 (see the module docstring). Plain numbers (``"18"`` /
    ``"18.0"`` / ``"1,600"``) are then compared exactly without sympy.
    Everything else goes through math-verify, bounded by ``timeout`` seconds in any thread;
    a timeout, any error, or an answer longer than :data:`MAX_ANSWER_CHARS` or too tangled for
    the parser (:func:`_tangled`, checked before math-verify sees it) counts as not equivalent,
    unless it is the gold's own text (white space aside), which is always equivalent.
    """
    try:
        gold, predicted = str(gold), str(predicted)
        if _PLAIN_INT.fullmatch(gold) and _PLAIN_INT.fullmatch(predicted):  # (the usual case; tested to agree)
            return int(gold) == int(predicted)
        if not _clean(gold) or not _clean(predicted):
            return False
        if " ".join(_clean(gold).split()) == " ".join(_clean(predicted).split()):
            return True  # (the gold's own text: right however long or tangled, with no parse)
        if max(len(gold), len(predicted)) > MAX_ANSWER_CHARS or _tangled(gold) or _tangled(predicted):
            return False
        if hedges(predicted) - hedges(gold):
            return False
        gold, predicted = normalize_answer(gold), normalize_answer(predicted)
        if not gold or not predicted:
            return False
        (gold, gold_percent), (predicted, predicted_percent) = _split_percent(gold), _split_percent(predicted)
        pairs = [(gold, predicted)]
        if predicted_percent and not gold_percent:
            pairs.append((gold, _hundredth(predicted)))
        elif gold_percent and not predicted_percent:
            pairs.append((_hundredth(gold), predicted))
        return any(_same(g, p, timeout) for g, p in pairs)
    except Exception:
        return False


def _same(gold: str, predicted: str, timeout: float) -> bool:
    a, b = _plain_number(gold), _plain_number(predicted)
    if a is not None and b is not None:
        return a == b
    if threading.current_thread() is threading.main_thread():
        return _verify_with_alarm(gold, predicted, timeout)
    return _verify_in_thread(gold, predicted, timeout)


class _OutOfTime(BaseException):
    """The alarm's exception: a BaseException, so no ``except Exception`` in math-verify or sympy
    swallows it (math-verify's own alarm, one per stage, let a parse that caught it go on, and
    ran before the parse's ``_too_big`` check unbounded: 8-10 s at a 2 s timeout)."""


def _verify_with_alarm(gold: str, predicted: str, timeout: float) -> bool:
    """In the main thread: the whole check under one ``SIGALRM`` deadline (a real timer: fractions
    of a second work), which stops Python code between bytecodes. Never inside an import: sympy
    half imported stays broken for the process (every later answer scored 0), so the first
    import is done first and an alarm during a lazy one waits for it. A timer the caller had
    armed (the rubric's bound on this leaf) is armed again for the time it had left, which a
    check cannot overrun by more than ``timeout``: taken and left off, the rest of the caller's
    pass ran unbounded (a backtracking regex in a later leaf hung the step)."""
    import math_verify  # noqa: F401 - sympy and the parser, imported before the timer starts

    def out_of_time(signum, frame):
        if in_import(frame):
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            return
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, out_of_time)
    outer: tuple[float, float] = (0.0, 0.0)
    start = time.monotonic()
    try:
        try:
            outer = signal.setitimer(signal.ITIMER_REAL, timeout)
            return _verify(gold, predicted)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except _OutOfTime:
        return False
    finally:
        signal.signal(signal.SIGALRM, previous)
        if outer[0]:  # the caller's timer (a rubric's per-leaf bound): armed again for what it had left
            signal.setitimer(signal.ITIMER_REAL, max(outer[0] - (time.monotonic() - start), 1e-6), outer[1])


def _verify_in_thread(gold: str, predicted: str, timeout: float) -> bool:
    """Run the check without signals in a daemon thread; give up on it after ``timeout``.

    A thread cannot be killed: a comparison that hangs keeps running in the background until
    it finishes, but the caller gets ``False`` on time.
    """
    result: list[bool] = []

    def run() -> None:
        try:
            result.append(_verify(gold, predicted))
        except BaseException:  # noqa: BLE001 - anything inside math-verify means "not verified"
            result.append(False)

    worker = threading.Thread(target=run, name="math-verify", daemon=True)
    worker.start()
    worker.join(timeout)
    return bool(result and result[0])


MAX_STATED_ANSWERS = 3
"""Distinct final answers a reply may state and still be graded (each must be right): past it, 0."""


def stated_answers(text: str) -> list[str]:
    """Every final answer the reply states, cleaned: each complete ``\\boxed{}``, and each
    ``<answer>`` that holds no box (the answers :func:`well_formed` counts)."""
    if not isinstance(text, str):
        return []
    answers = [_clean(b) for b in _boxed_contents(text)]
    return answers + [_clean(t) for t in answer_tags(text) if not _BOXED.search(t)]


def correct(completion: str, answer: str) -> float:
    """1.0 when the final answer is mathematically equivalent to the gold answer, and so is every
    other answer the reply states: a hedge (``\\boxed{7} or \\boxed{12}``, a box and a different
    ``<answer>``) scores 0 whichever comes last, where MATH's last-box rule would pay it. The
    same answer stated twice stands. The equivalence checks share one timeout."""
    predicted = extract_answer(completion or "")
    if predicted is None:
        return 0.0
    key = " ".join(predicted.split())
    others = list(dict.fromkeys(a for a in (" ".join(s.split()) for s in stated_answers(completion)) if a != key))
    if len(others) >= MAX_STATED_ANSWERS:
        return 0.0
    timeout = 5.0 / (1 + len(others))
    return float(all(is_equivalent(str(answer), a, timeout) for a in [predicted, *others]))


def answer_format(completion: str) -> float:
    """1.0 when the reply states exactly one final answer in ``\\boxed{}`` or ``<answer>``."""
    return float(well_formed(completion or ""))


def math_rubric() -> Rubric:
    """``correct`` (weight 1) and ``format`` (weight 0: reported, not rewarded unless reweighted)."""
    return Rubric([RewardFn("correct", correct, 1.0), RewardFn("format", answer_format, 0.0)])


# -- the dense signal (dense_rewards=True) ---------------------------------------------------

_RESULT_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


@functools.lru_cache(maxsize=4096)
def solution_values(solution: tuple[str, ...]) -> tuple[float, ...]:
    """The distinct values of a worked solution's calculator steps (those the calculator can evaluate)."""
    from benchmax_gym.envs.math.calculator import evaluate

    values: list[float] = []
    for expression in solution:
        try:
            value = float(evaluate(str(expression)))
        except Exception:  # noqa: BLE001 - a step the calculator cannot read is no milestone
            continue
        if not any(math.isclose(value, v, rel_tol=1e-9, abs_tol=1e-9) for v in values):
            values.append(value)
    return tuple(values)


def intermediate_values(task, episode, tool_calls: list, tool_results: list) -> tuple[list[int], int]:
    """Math's dense signal: the solution's intermediate values (its calculator steps) that a
    ``calculator`` or ``python`` result of this step equals. A result counts only when it is one
    number (printing many candidates in one call reaches nothing); each value pays once."""
    state = episode.state if episode is not None else None  # (the family's per-episode dict)
    known = state.get("dense_values") if state is not None else None
    if known is None:  # once an episode: the values, and each as the calculator prints it
        known = _values_of(task.solution)
        if state is not None:
            state["dense_values"] = known
    values, printed = known
    reached: list[int] = []
    for call, text in zip(tool_calls, tool_results):
        if call["name"] not in ("calculator", "python") or type(text) is not str:
            continue
        exact = printed.get(text)  # the calculator prints values as they are printed here: a look-up
        if exact is not None:
            reached.append(exact)
            continue
        if call["name"] == "calculator":
            continue
        text = text.strip()
        if len(text) > 40:
            continue
        try:
            got = float(text)  # python's output, other spellings ("inf" and "nan" reach nothing)
        except ValueError:
            continue
        reached += [i for i, v in enumerate(values) if math.isclose(got, v, rel_tol=1e-9, abs_tol=1e-9)]
    return reached, len(values)


def _values_of(solution) -> tuple[tuple[float, ...], dict[str, int]]:
    """:func:`solution_values` of a task's solution, and each value as the calculator prints it."""
    from benchmax_gym.envs.math.calculator import format_number

    values = solution_values(tuple(map(str, solution))) if isinstance(solution, (list, tuple)) and solution else ()
    printed = {format_number(int(v) if v.is_integer() and abs(v) < 2**53 else v): i for i, v in enumerate(values)}
    return values, printed
