"""Checker for MATH-style answers (Hendrycks et al. 2021, arXiv:2103.03874).

Extraction: the last ``\\boxed{}``/``\\fbox{}`` (brace-matched), else Minerva's
"Final Answer: The final answer is X" (Lewkowycz et al. 2022,
arXiv:2206.14858), ``<answer>`` tags, "the answer is X", ``#### X``, and in
flexible mode the last math span or number.  When the boxed answer misses a list
or set gold, the boxes stated together at the end (``\\boxed{3} and later
\\boxed{5}``; joined by a comma or "and", not "or") are tried as one list: all of
them must match.

Equivalence, cheapest first (see ``rewards._equiv``):

1. normalised strings (Hendrycks ``strip_string`` / Minerva
   ``normalize_final_answer`` rules, ``rewards._normalize``);
2. structure + exact/numeric values on trees from our own safe parser
   (``rewards._latex``): fractions, roots, pi, percentages, scientific
   notation, intervals, tuples, sets (order-insensitive), ``x=3`` vs ``3``,
   labelled answers (``(p,q)=(3,2)``, ``S_1:S_2=7:32``), inequalities and the
   intervals they describe, matrices and matrix arithmetic;
3. sympy ``simplify`` on directly-constructed sympy objects, in a worker
   process under the hard time limit (``rewards._sympy_bridge``).

The ground truth may be a bare answer (``\\frac{1}{2}``), a ``$...$`` answer, or
a full solution containing ``\\boxed{}``.
"""

from __future__ import annotations

from functools import lru_cache

from rewards._base import BoundedChecker
from rewards._equiv import equivalent
from rewards._extract import boxed_run, extract, first_math_chunk, has_prose
from rewards._latex import ParseError, parse_answer
from rewards._normalize import MAX_ANSWER_CHARS, canonical_string, sanitize
from rewards._sympy_bridge import convertible, symbolic_equal
from rewards.registry import Verdict, register_checker

VERSION = "2"  # 2: labelled equations, inequalities as intervals, matrix arithmetic, multi-box lists (issue #14)


@lru_cache(maxsize=4096)
def _parse_cached(answer: str):
    try:
        return parse_answer(answer)
    except (ParseError, RecursionError, ValueError, ArithmeticError):
        return None


def gold_answer(ground_truth: str) -> str:
    """The answer inside a gold string: a solution's marked answer, else the string itself."""
    found = extract(ground_truth, allow_fallback=False)
    return (found.text if found is not None else ground_truth).strip()


def _is_collection(answer: str) -> bool:
    """Whether an answer parses to a list or set of values ("3, 5", "\\{1, 2\\}")."""
    tree = _parse_cached(_scientific(answer))
    return tree is not None and tree[0] in ("list", "set")


def _scientific(text: str) -> str:
    """``1.5e3`` / ``1.5 \\times 10^{3}`` read the same; only the plain ``e`` form needs rewriting."""
    t = text.strip()
    if "e" in t and t.replace("e", "", 1).replace("-", "").replace("+", "").replace(".", "").isdigit():
        mant, _, exp = t.partition("e")
        if mant and exp and exp.lstrip("+-").isdigit() and len(exp) <= 4:
            return f"{mant}\\times 10^{{{exp}}}"
    return text


@register_checker("math", version=VERSION, summary="MATH answers: boxed/Final Answer extraction, layered equivalence")
class MathChecker(BoundedChecker):
    """MATH answers: last \\boxed{} / "Final Answer" extraction; string, numeric, then symbolic equivalence."""

    strict = False

    def _score(self, response: str, ground_truth: str) -> Verdict:
        text = sanitize(response)
        gold = gold_answer(sanitize(ground_truth, limit=20_000))
        found = extract(text, allow_fallback=not self.strict)
        if found is None:
            return Verdict(0.0, False, None, "no_answer")
        pred = found.text.strip()
        if not pred:
            return Verdict(0.0, False, pred, "no_answer")
        if found.rule in ("final_answer", "answer_is", "answer_tag") and has_prose(pred):
            pred = first_math_chunk(pred) or pred  # "Final Answer: Jane started 3 hours ago." -> "3"
        outcome = self.compare(gold, pred)
        if found.rule == "boxed" and outcome is not None and not outcome[0] and _is_collection(gold):
            # Boxes spread over a sentence may together state a list or set gold ("\\boxed{3} and
            # later \\boxed{5}" for "3, 5"; never a tuple or an interval, which one box states).
            # All of them must match, so extra candidates stay wrong.
            parts = boxed_run(text)
            if len(parts) > 1 and ", ".join(parts) != pred:
                wide = self.compare(gold, ", ".join(parts))
                if wide is not None and wide[0]:
                    pred, outcome = ", ".join(parts), wide
        if outcome is None:
            return Verdict(0.0, False, pred[:MAX_ANSWER_CHARS], f"timeout:{found.rule}")
        ok, layer = outcome
        tag = "match" if ok else "mismatch"
        return Verdict(float(ok), ok, pred[:MAX_ANSWER_CHARS], f"{tag}:{found.rule}:{layer}")

    def compare(self, gold: str, pred: str) -> tuple[bool, str] | None:
        """(equal?, deciding layer), or None when the symbolic layer timed out."""
        if canonical_string(gold) == canonical_string(pred):
            return True, "string"
        g, p = _parse_cached(_scientific(gold)), _parse_cached(_scientific(pred))
        if g is None or p is None:
            return False, "unparsed"
        timed_out, used = [], []

        def symbolic(a, b) -> bool:
            if not (convertible(a) and convertible(b)):
                return False
            used.append(True)
            out = self.bounded(symbolic_equal, a, b)
            if out is None:
                timed_out.append(True)
            return bool(out)

        try:
            ok = equivalent(g, p, symbolic=symbolic)
        except RecursionError:
            return False, "too_deep"
        if not ok and timed_out:
            return None
        return ok, "symbolic" if used else "value"


@register_checker("math_strict", version=VERSION, summary="MATH answers, explicitly marked answers only")
class MathStrictChecker(MathChecker):
    """MATH answers from \\boxed{} / "Final Answer" / "the answer is" only; no last-number fallback."""

    strict = True
