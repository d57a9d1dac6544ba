"""Fast tests of the gsm8k / math checkers: extraction, normalisation, equivalence, contract."""

from __future__ import annotations

import json
import os

import pytest

import rewards
from rewards.evaluate import pass_at_k
from rewards.registry import Verdict

DATA = "/work/shared/data"


@pytest.fixture(scope="module")
def math_checker():
    return rewards.get("math")


@pytest.fixture(scope="module")
def gsm():
    return rewards.get("gsm8k")


def test_registered_with_versions():
    names = rewards.available()
    for name in ("gsm8k", "gsm8k_strict", "math", "math_strict"):
        assert name in names
        checker = rewards.get(name)
        assert checker.tag == f"{name}@{checker.version}" and checker.version


@pytest.mark.parametrize(
    "response,gold,expected,reason_prefix",
    [
        ("Janet makes 9*2 = $18.\n#### 18", "Janet ... #### 18", True, "match:strict:hashes"),
        ("The answer is $1,234.00", "1234", True, "match:strict:answer_is"),
        ("So the total is \\boxed{18}.", "18", True, "match:strict:boxed"),
        ("Final Answer: 42", "42", True, "match:strict:final_answer"),
        ("18\nBecause 9 eggs sell for $2 each.", "18", True, "match:strict:answer_first"),
        ("She pays 25%.  The answer is 25%", "25", True, "match:strict:answer_is"),
        ("The answer is -7.", "-7", True, "match:strict:answer_is"),
        ("The answer is 3/4.", "0.75", True, "match:strict:answer_is"),
        ("The answer is 0.50", "1/2", True, "match:strict:answer_is"),
        ("He runs 60 miles a week in total, so 60", "60", True, "match:flexible:last_number"),
        ("The answer is 18 or 20.", "18", False, "hedged"),
        ("First, 16 - 3 = 13. Then 13 - 4 =", "9", False, "no_answer:truncated"),
        ("The answer is 17.", "18", False, "mismatch:strict:answer_is"),
        ("The answer is 1,800", "1800", True, "match"),
        ("The answer is 5.", "#### 5,000", False, "mismatch"),
    ],
)
def test_gsm8k_cases(gsm, response, gold, expected, reason_prefix):
    v = gsm.score(response, gold)
    assert v.correct is expected, v
    assert v.reason.startswith(reason_prefix), v
    assert v.score == float(expected)


def test_gsm8k_strict_needs_a_marked_answer():
    strict = rewards.get("gsm8k_strict")
    assert not strict.score("so she has 18 left", "18").correct
    assert strict.score("so she has 18 left", "18").reason == "no_answer:strict"
    assert rewards.get("gsm8k").score("so she has 18 left", "18").correct


@pytest.mark.parametrize(
    "response,gold,expected",
    [
        ("$\\boxed{\\dfrac{1}{2}}$", "0.5", True),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3,\\frac{\\pi}{2})", True),
        ("\\boxed{\\{2,1\\}}", "\\{1,2\\}", True),
        ("\\boxed{(2,1)}", "(1,2)", False),
        ("\\boxed{x=3}", "3", True),
        ("\\boxed{3}", "x=3", True),
        ("\\boxed{90^\\circ}", "90", True),
        ("\\boxed{10\\text{ cm}^2}", "10", True),
        ("\\boxed{1.5\\times 10^{3}}", "1500", True),
        ("\\boxed{1.5e3}", "1500", True),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
        ("\\boxed{\\pi/2}", "\\frac{\\pi}{2}", True),
        ("\\boxed{1.5708}", "\\frac{\\pi}{2}", False),
        ("\\boxed{[2,5)}", "[2,5)", True),
        ("\\boxed{(2,5]}", "[2,5)", False),
        ("\\boxed{(-\\infty, 3) \\cup (4, \\infty)}", "(4,\\infty)\\cup(-\\infty,3)", True),
        ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", True),
        ("\\boxed{\\frac{1}{2004!}}", "\\frac{1}{2006!}", False),
        ("\\boxed{x^2+2x+1}", "(x+1)^2", True),
        ("\\boxed{x^2+2x}", "(x+1)^2", False),
        ("\\boxed{3+4i}", "4i+3", True),
        ("\\boxed{\\text{(B)}}", "B", True),
        ("The final answer is $\\frac{3}{4}$. I hope it is correct.", "0.75", True),
        ("no answer here at all", "3", False),
    ],
)
def test_math_cases(math_checker, response, gold, expected):
    v = math_checker.score(response, gold)
    assert v.correct is expected, v


def test_math_gold_may_be_a_solution(math_checker):
    sol = "Thus the value is $\\boxed{\\frac{3}{56}}$."
    assert math_checker.score("so we get \\boxed{3/56}", sol).correct


def test_math_strict_has_no_fallback():
    assert not rewards.get("math_strict").score("so the value we want is 5", "5").correct
    assert rewards.get("math").score("so the value we want is 5", "5").correct


@pytest.mark.parametrize("bad", [None, 12, "", "\x00\x00", "\ud800", "{" * 5000, "\\boxed{" * 3000])
def test_never_raises(math_checker, gsm, bad):
    for checker in (math_checker, gsm):
        v = checker.score(bad, "3")
        assert isinstance(v, Verdict) and v.score == 0.0
        v = checker.score("\\boxed{3}", bad)
        assert isinstance(v, Verdict)


def test_batch_matches_single(math_checker):
    responses = ["\\boxed{1}", "\\boxed{2}", "nothing"]
    golds = ["1", "3", "2"]
    assert [v.correct for v in math_checker.score_batch(responses, golds)] == [True, False, False]
    with pytest.raises(ValueError):
        math_checker.score_batch(responses, golds[:2])


@pytest.mark.parametrize(
    "n,c,k,expected",
    [(10, 0, 1, 0.0), (10, 10, 5, 1.0), (10, 5, 1, 0.5), (4, 1, 2, 0.5), (5, 2, 5, 1.0), (3, 1, 1, 1 / 3)],
)
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_validates():
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


@pytest.mark.skipif(not os.path.exists(f"{DATA}/math/math500_test.jsonl"), reason="shared data missing")
def test_math500_gold_solutions_match_their_answers(math_checker):
    rows = [json.loads(line) for line in open(f"{DATA}/math/math500_test.jsonl")]
    ok = sum(math_checker.score(r["solution"], r["answer"]).correct for r in rows)
    assert ok == len(rows)


@pytest.mark.skipif(not os.path.exists(f"{DATA}/gsm8k/test.jsonl"), reason="shared data missing")
def test_gsm8k_gold_solutions_match(gsm):
    rows = [json.loads(line) for line in open(f"{DATA}/gsm8k/test.jsonl")]
    ok = sum(gsm.score(r["answer"], r["answer"]).correct for r in rows)
    assert ok == len(rows)
