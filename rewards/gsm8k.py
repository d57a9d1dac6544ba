"""Checker for GSM8K (Cobbe et al. 2021, arXiv:2110.14168): one number per answer.

Extraction (``rewards._extract``): ``\\boxed{N}``, "Final Answer: N", ``<answer>``,
"The answer is N", ``#### N`` and answer-first responses ("18" on the first line)
are *strict*: the model marked its answer.  The *flexible* mode adds the last
number of the response as a fallback, as lm-evaluation-harness's
``flexible-extract`` filter does.  The verdict reason records which rule fired,
e.g. ``match:strict:boxed`` or ``match:flexible:last_number``.

Numbers are normalised before an exact comparison: thousands separators,
currency, units, ``%``, trailing ``.00``, signs, and simple fractions vs
decimals (``3/4`` = ``0.75``).  A hedged answer ("18 or 20") or a response cut
off mid-computation has no final answer and scores 0.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

from rewards._base import BoundedChecker
from rewards._equiv import Undefined, evaluate, free_symbols
from rewards._extract import MAX_TAIL, extract
from rewards._latex import ParseError, parse_answer
from rewards._normalize import sanitize
from rewards.registry import Verdict, register_checker

VERSION = "1"

_NUMBER = re.compile(r"(?<![\w.])-?\s?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s?/\s?\d+)?(?![\w])|-?\.\d+")
_HEDGE = re.compile(r"\d\s*(?:\\text\{\s*)?(?:or|and/or)\b|\beither\b|\bbetween\b.*\band\b", re.I)
_PLAIN = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_FIRST_LINE = re.compile(r"^[\s*#$\\(\[{]*(?:boxed\{)?(-?\$?\d[\d,]*(?:\.\d+)?)[\s*$%.)\]}]*$")
_CURRENCY = ("\\$", "$", "€", "£", "¥", "\\%", "%", "\\!", "{,}", "dollars", "dollar")


def number_value(snippet: str, single: bool = False) -> Fraction | None:
    """The number an answer snippet states ("$1,234.00" -> 1234, "3/4" -> 0.75).

    ``single``: a snippet that is not one expression must hold exactly one number
    (a box of junk digits is no answer).
    """
    s = snippet.strip()
    if "=" in s:  # "9 * 2 = 18": the value after the last '='
        right = s.rsplit("=", 1)[1]
        if _NUMBER.search(right):
            s = right
    for junk in _CURRENCY:
        s = s.replace(junk, " ")
    s = s.strip().rstrip(".").strip()
    if not s:
        return None
    if _PLAIN.fullmatch(s):  # fast path: "18", "-1,234.50"
        return Fraction(s.replace(",", ""))
    exact = _exact_value(s)
    if exact is not None:
        return exact
    m = _NUMBER.search(s)
    if m is None or (single and len(_NUMBER.findall(s)) > 1):
        return None
    token = m.group(0).replace("$", "").replace(",", "").replace(" ", "")
    try:
        if "/" in token:
            num, den = token.split("/")
            return Fraction(int(num), int(den)) if int(den) else None
        return Fraction(token)
    except (ValueError, ZeroDivisionError):
        return None


def _exact_value(s: str) -> Fraction | None:
    if len(s) > 200:
        return None
    try:
        tree = parse_answer(s)
    except (ParseError, RecursionError, ValueError):
        return None
    if tree[0] in ("list", "set", "tuple", "rel", "text", "interval") or free_symbols(tree):
        return None
    try:
        value = evaluate(tree, {})
    except (Undefined, ArithmeticError, ValueError, OverflowError):
        return None
    return value if isinstance(value, Fraction) else None


def _answer_first(text: str) -> str | None:
    first = text.lstrip().split("\n", 1)[0][:80]
    m = _FIRST_LINE.match(first)
    return m.group(1) if m else None


def _looks_truncated(text: str) -> bool:
    """Generation stopped mid-step: the last character continues an expression."""
    tail = text.rstrip()
    return not tail or tail[-1] in "=+-*/(^,:\\{[<" or tail.endswith(("\\times", "\\cdot", "\\frac"))


@lru_cache(maxsize=4096)
def gold_number(ground_truth: str) -> Fraction | None:
    text = ground_truth
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return number_value(text)


@register_checker("gsm8k", version=VERSION, summary="GSM8K numeric answer, flexible (last-number fallback)")
class GSM8KChecker(BoundedChecker):
    """GSM8K numeric answers: marked answer first, the last number as fallback (flexible mode)."""

    strict = False

    def _score(self, response: str, ground_truth: str) -> Verdict:
        gold = gold_number(sanitize(ground_truth, limit=20_000))
        if gold is None:
            return Verdict(0.0, False, None, "bad_ground_truth")
        text = sanitize(response)
        found = extract(text, allow_fallback=False)
        mode = "strict"
        if found is None:
            first = _answer_first(text)
            if first is not None:
                found = _Found(first, "answer_first")
        if found is None:
            if self.strict:
                return Verdict(0.0, False, None, "no_answer:strict")
            if _looks_truncated(text):
                return Verdict(0.0, False, None, "no_answer:truncated")
            found = self._fallback(text)
            mode = "flexible"
            if found is None:
                return Verdict(0.0, False, None, "no_answer:flexible")
        snippet = found.text.strip()
        if _HEDGE.search(snippet):
            return Verdict(0.0, False, snippet[:200], f"hedged:{mode}:{found.rule}")
        value = number_value(snippet, single=found.rule in ("boxed", "answer_tag", "hashes"))
        if value is None:
            return Verdict(0.0, False, snippet[:200], f"no_number:{mode}:{found.rule}")
        ok = value == gold
        return Verdict(float(ok), ok, _show(value), f"{'match' if ok else 'mismatch'}:{mode}:{found.rule}")

    @staticmethod
    def _fallback(text: str):
        tail = text[-MAX_TAIL:]
        last_sentence = re.split(r"(?<=[.!?])\s+|\n", tail.rstrip())[-1]
        if _HEDGE.search(last_sentence):
            return _Found(last_sentence, "last_number")
        matches = list(_NUMBER.finditer(tail))
        return _Found(matches[-1].group(0), "last_number") if matches else None


class _Found:
    __slots__ = ("text", "rule")

    def __init__(self, text: str, rule: str):
        self.text, self.rule = text, rule


def _show(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(value)


@register_checker("gsm8k_strict", version=VERSION, summary="GSM8K numeric answer, explicitly marked answers only")
class GSM8KStrictChecker(GSM8KChecker):
    """GSM8K numeric answers, strict mode: only an explicitly marked final answer counts."""

    strict = True
