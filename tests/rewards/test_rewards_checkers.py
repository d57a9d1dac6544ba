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


# --- issue #14: labelled golds, inequalities vs intervals, solution tuples, matrix arithmetic, boxes


@pytest.mark.parametrize(
    "response,gold,expected",
    [
        # 1. a labelled gold (or response) against bare values
        ("\\boxed{(3,2)}", "(p,q)=(3,2)", True),
        ("\\boxed{(p,q)=(3,2)}", "(3,2)", True),
        ("\\boxed{(2,3)}", "(p,q)=(3,2)", False),
        ("\\boxed{4, 5}", "AB=4,CD=5", True),
        ("\\boxed{5, 4}", "AB=4,CD=5", False),  # distinct names fix the order
        ("\\boxed{CD=5, AB=4}", "AB=4,CD=5", True),
        ("\\boxed{1}", "f(x)=1", True),
        ("\\boxed{|AB| = 1}", "1", True),
        ("\\boxed{7:32}", "S_1:S_2=7:32", True),
        ("\\boxed{\\frac{7}{32}}", "S_1:S_2=7:32", True),
        ("\\boxed{32:7}", "S_1:S_2=7:32", False),
        ("\\boxed{1:00}", "12:00", False),
        ("\\boxed{(5,2),(7,2)}", "p=5,q=2;p=7,q=2", True),
        ("\\boxed{x=1,y=4;x=3,y=2}", "x=1,y=2;x=3,y=4", False),  # the pairs matter
        ("\\boxed{1}", "a+3z=1", False),  # an equation, not a label
        # 2. inequalities against intervals and unions, both ways
        ("\\boxed{(2,\\infty)}", "x>2", True),
        ("\\boxed{x>2}", "(2,\\infty)", True),
        ("\\boxed{[2,\\infty)}", "x>2", False),
        ("\\boxed{(-\\infty,-1]\\cup(3,\\infty)}", "x\\le -1 \\text{ or } x>3", True),
        ("\\boxed{x\\le -1 \\text{ or } x>3}", "(-\\infty,-1]\\cup(3,\\infty)", True),
        ("\\boxed{(-\\infty,-1)\\cup(3,\\infty)}", "x\\le -1 \\text{ or } x>3", False),
        ("\\boxed{(-\\infty,3)\\cup(3,\\infty)}", "x \\ne 3", True),
        ("\\boxed{(-\\infty,3)\\cup(-1,\\infty)}", "x > -1 \\text{ and } x < 3", False),  # not a union
        # 3. solution tuples: the list is unordered, each tuple ordered
        ("\\boxed{(3,4),(1,2)}", "(1,2),(3,4)", True),
        ("\\boxed{(3,4),(1,2),(1,2)}", "(1,2),(3,4)", True),  # a repeated solution is one solution
        ("\\boxed{(2,1),(4,3)}", "(1,2),(3,4)", False),
        ("\\boxed{(1,2),(3,4),(5,6)}", "(1,2),(3,4)", False),
        ("\\boxed{(2,1)}", "(1,2)", False),
        ("\\boxed{(x, y) = (5, 8) \\text{ and } (8, 5)}", "(5,8),(8,5)", True),
        # 4. matrix arithmetic in the response
        ("\\boxed{2\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}}", "\\begin{pmatrix}2&0\\\\0&2\\end{pmatrix}", True),
        ("\\boxed{3\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}}", "\\begin{pmatrix}2&0\\\\0&2\\end{pmatrix}", False),
        ("\\boxed{\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}^2}", "\\begin{pmatrix}7&10\\\\15&22\\end{pmatrix}", True),
        ("\\boxed{\\begin{pmatrix}0&1\\\\1&0\\end{pmatrix}\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}}",
         "\\begin{pmatrix}2&1\\\\4&3\\end{pmatrix}", False),  # A B is not B A
        ("\\boxed{\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}+2}", "\\begin{pmatrix}3&0\\\\0&3\\end{pmatrix}", False),
        ("\\boxed{a\\begin{pmatrix}1\\\\2\\end{pmatrix}-\\begin{pmatrix}0\\\\a\\end{pmatrix}}",
         "\\begin{pmatrix}a\\\\a\\end{pmatrix}", True),
        # 5. boxes that together state the gold; many candidates stay wrong
        ("We get \\boxed{3} and later we get \\boxed{5}.", "3, 5", True),
        ("So $x = \\boxed{3}$, and $y = \\boxed{5}$.", "3, 5", True),
        ("We get \\boxed{3} and later we get \\boxed{5}.", "3", False),
        ("\\boxed{3}, \\boxed{5}", "3", False),
        ("\\boxed{1}, or \\boxed{3}, or \\boxed{5}", "3, 5", False),
        ("\\boxed{3} no no no no \\boxed{5}", "3, 5", False),
    ],
)
def test_math_issue14_cases(math_checker, response, gold, expected):
    v = math_checker.score(response, gold)
    assert v.correct is expected, v


@pytest.mark.parametrize(
    "a,b",
    [
        ("(p,q)=(3,2)", "(3,2)"), ("AB=4,CD=5", "5,4"), ("S_1:S_2=7:32", "\\frac{7}{32}"),
        ("x\\le -1 \\text{ or } x>3", "(-\\infty,-1]\\cup(3,\\infty)"), ("x>2", "[2,\\infty)"),
        ("(1,2),(3,4)", "(3,4),(1,2)"), ("2\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}", "\\begin{pmatrix}2&0\\\\0&2\\end{pmatrix}"),
    ],
)
def test_issue14_equivalence_is_symmetric(math_checker, a, b):
    assert math_checker.compare(a, b) == math_checker.compare(b, a)


def test_boxed_run_follows_math_verify_joining():
    from rewards._extract import boxed_run

    assert boxed_run("so \\boxed{3} and later we get \\boxed{5}.") == ["3", "5"]
    assert boxed_run("\\boxed{1} no no no no no \\boxed{2}") == ["2"]  # no separator between them
    assert boxed_run("\\boxed{1}, " + "x" * 80 + ", \\boxed{2}") == ["2"]  # too far apart
    assert boxed_run("\\boxed{-2} and \\boxed{1}, i.e. \\boxed{-2} and \\boxed{1}") == ["-2", "1"]
    assert boxed_run("\\boxed{3} and \\boxed{5}<|im_start|>user \\boxed{7}") == ["3", "5"]
    assert boxed_run("no box here") == []


def test_inequality_lists_read_as_unions_only_when_disjoint():
    from rewards._equiv import _as_set
    from rewards._latex import parse_answer

    union = _as_set(parse_answer("x < -1 \\text{ or } x \\ge 3"))
    assert union is not None and union[0] == "union" and len(union[1]) == 2
    assert _as_set(parse_answer("x > -1 \\text{ and } x < 3")) is None  # an intersection, left alone
    assert _as_set(parse_answer("x < 1 \\text{ or } y > 2")) is None  # two unknowns
    assert _as_set(parse_answer("x > y")) is None  # not a bound


def test_matrix_arithmetic_is_bounded(math_checker):
    import time

    from rewards._equiv import _matrix_expr
    from rewards._latex import parse_answer

    def mat(n, cell):
        return "\\begin{pmatrix}" + "\\\\".join("&".join(cell(i, j) for j in range(n)) for i in range(n)) + "\\end{pmatrix}"

    assert _matrix_expr(parse_answer(mat(2, lambda i, j: "1") * 4)) is None  # more products than allowed
    assert _matrix_expr(parse_answer(mat(2, lambda i, j: "x") + mat(2, lambda i, j: "1"))) is None  # symbolic product
    assert _matrix_expr(parse_answer(mat(7, lambda i, j: "1") + "^2")) is None  # too large
    start = time.perf_counter()
    v = math_checker.score("\\boxed{" + mat(6, lambda i, j: f"x_{i}{j}") + "^3}", mat(6, lambda i, j: "1"))
    assert not v.correct and time.perf_counter() - start < 0.5


# --- issue #14 review: false positives of the first version, and the readings that must survive


@pytest.mark.parametrize(
    "response,gold,expected",
    [
        # 1. only a plain symbol (or f(x)) is the unknown of an inequality
        ("\\boxed{(-\\infty,2)}", "|x|<2", False),
        ("\\boxed{|x|<2}", "(-\\infty,2)", False),
        ("\\boxed{[1,\\frac32]}", "1\\le|z|\\le\\frac32", False),
        ("\\boxed{(1,\\infty)}", "|x|>1", False),
        ("\\boxed{(2,\\infty)}", "\\frac{x}{y}>2", False),
        ("\\boxed{(0,1)}", "0<f(x)<1", True),
        ("\\boxed{(2,\\infty)}", "2<x", True),
        # 2. arithmetic on unknowns is an equation, not a label
        ("\\boxed{x+y}", "xy = x + y", False),
        ("\\boxed{4}", "xy=4", False),
        ("\\boxed{2}", "\\frac{x}{y}=2", False),
        ("\\boxed{2}", "|x|=2", False),
        ("\\boxed{6}", "pq=6", False),
        ("\\boxed{2x-3}", "x=2x-3", False),
        ("\\boxed{4}", "AB=4", True),  # names still label
        ("\\boxed{2}", "|AB|=2", True),
        ("\\boxed{\\frac{1}{\\sqrt6}}", "\\frac{NO}{BO}=\\frac{1}{\\sqrt{6}}", True),
        ("\\boxed{5}", "f(2)=5", True),
        ("\\boxed{\\frac12}", "P(A)=\\frac12", True),
        ("\\boxed{x^2}", "p(x)=x^2", True),
        # 3. a gold with repeats is a multiset; a response's repeats collapse only against a repeat-free gold
        ("\\boxed{2, 3, 3}", "2, 2, 3", False),
        ("\\boxed{2, 3}", "2, 2, 3", False),
        ("\\boxed{1,2,2}", "1,1,2", False),
        ("\\boxed{2, 2, 3}", "2, 3, 3", False),
        ("\\boxed{3, 2, 2}", "2, 2, 3", True),
        ("\\boxed{2, 2, 3}", "2, 3", True),
        # 4. clock times compare term by term, never as fractions
        ("\\boxed{5:00 AM}", "5:00 PM", False),
        ("\\boxed{5:00 \\text{ AM}}", "5:00 \\text{ PM}", False),
        ("\\boxed{1}", "10:10", False),
        ("\\boxed{0.4}", "12:30", False),
        ("\\boxed{2:5}", "12:30", False),
        ("\\boxed{9}", "9:00", False),
        ("\\boxed{0}", "0:5", False),
        ("\\boxed{10:30 \\text{AM}}", "10:30 a.m.", True),
        ("\\boxed{\\frac{1}{2}}", "2:4", True),
        # 5. several boxes: only joined ones, only for a list or set gold
        ("\\boxed{3}. Wait, that's wrong, it is \\boxed{5}", "3, 5", False),
        ("\\boxed{3} or \\boxed{5}", "(3,5)", False),
        ("\\boxed{3} and \\boxed{5}", "[3,5]", False),
        ("\\boxed{3}, but actually \\boxed{5}", "3, 5", False),
        ("\\boxed{3} and \\boxed{5}", "\\{3, 5\\}", True),
    ],
)
def test_math_issue14_review_cases(math_checker, response, gold, expected):
    v = math_checker.score(response, gold)
    assert v.correct is expected, v


def test_clock_ratio_never_reaches_the_symbolic_layer(math_checker):
    # "9:00" as 9/0 left the numeric layer undecided and went to the sympy worker
    assert math_checker.compare("9:00", "9") == (False, "value")
    assert math_checker.compare("0:5", "0") == (False, "value")


def test_boxed_run_joins_only_joined_boxes():
    from rewards._extract import boxed_run

    assert boxed_run("\\boxed{3}. Wait, that's wrong, it is \\boxed{5}") == ["5"]
    assert boxed_run("\\boxed{3} or \\boxed{5}") == ["5"]
    assert boxed_run("\\boxed{1}, or \\boxed{3}, or \\boxed{5}") == ["5"]
    assert boxed_run("\\boxed{3}, but actually \\boxed{5}") == ["5"]
    assert boxed_run("\\boxed{3} \\boxed{5}") == ["3", "5"]
    assert boxed_run("So $x = \\boxed{3}$, and $y = \\boxed{5}$.") == ["3", "5"]
    assert boxed_run("\\boxed{(3, 3)} \\text{ for part (a) and } \\boxed{(1, 1)}") == ["(3, 3)", "(1, 1)"]


def test_unclosed_boxes_cost_a_bounded_number_of_scans(math_checker, monkeypatch):
    from rewards import _extract

    assert _extract._brace_end("{" + "a" * (_extract.MAX_BOX_CHARS + 10) + "}", 0) == -1  # each scan is bounded
    calls = []
    real = _extract._brace_end

    def counting(text, open_at):
        calls.append(open_at)
        return real(text, open_at)

    monkeypatch.setattr(_extract, "_brace_end", counting)
    text = "\\boxed{1} \\boxed{2} " + "\\boxed{" * 20_000  # took ~100 s: a scan to the end per start
    assert _extract.last_boxed(text) is None
    assert _extract.boxed_run(text) == []
    assert len(calls) <= 2 * (_extract.MAX_UNCLOSED + 1)
    calls.clear()
    v = math_checker.score(text, "1, 2")
    assert v.reason and not v.reason.startswith("timeout") and not v.correct
    assert len(calls) <= 2 * (_extract.MAX_UNCLOSED + 1)
