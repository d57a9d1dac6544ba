"""Property tests (hypothesis): never raises, bounded time, idempotent normalisation, symmetric equivalence."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rewards
from rewards._normalize import canonical_string, clean_latex

FRAGMENTS = [
    "\\frac{", "}{", "}", "{", "\\sqrt", "\\boxed{", "^", "_", "(", ")", "[", "]", "\\{", "\\}", ",", "=", "<",
    "\\le", "\\pi", "\\infty", "\\cup", "x", "y", "i", "e", "1", "2", "0", "3.5", "-", "+", "\\cdot", "/", "!",
    "%", "\\%", "\\text{ cm}", "\\pm", "\\left(", "\\right)", "\\dfrac", "$", " ", "\\begin{pmatrix}", "&",
    "\\\\", "\\end{pmatrix}", "^\\circ", "\\sin", "\\log", "9^{9^{9}}", "\x00", "\ud800", "...", "and",
]
latexish = st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join)
anything = st.one_of(st.text(max_size=300), latexish)

SETTINGS = settings(derandomize=True, max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(response=anything, gold=anything)
def test_never_raises_and_is_bounded(response, gold):
    for name in ("math", "gsm8k"):
        start = time.perf_counter()
        v = rewards.get(name).score(response, gold)
        assert time.perf_counter() - start < 1.0
        assert v.score in (0.0, 1.0) and v.correct == (v.score == 1.0)


@SETTINGS
@given(text=anything)
def test_normalisation_is_idempotent(text):
    once = clean_latex(text)
    assert clean_latex(once) == once
    key = canonical_string(text)
    assert canonical_string(key) == key


ATOMS = ["1", "2", "-3", "0.5", "x", "y", "\\pi", "\\sqrt{2}", "\\frac{1}{2}", "\\frac{x}{3}", "2x", "x^2", "10\\%"]
small_expr = st.recursive(
    st.sampled_from(ATOMS),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "\\cdot ", "/"]), inner).map(lambda t: f"({t[0]}){t[1]}({t[2]})"),
        st.tuples(inner, inner).map(lambda t: f"\\frac{{{t[0]}}}{{{t[1]}}}"),
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + ", ".join(xs) + ")"),
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: "\\{" + ", ".join(xs) + "\\}"),
        inner.map(lambda a: f"x = {a}"),
    ),
    max_leaves=6,
)


@SETTINGS
@given(a=small_expr, b=small_expr)
def test_equivalence_is_symmetric(a, b):
    checker = rewards.get("math")
    assert checker.compare(a, b) == checker.compare(b, a)


@SETTINGS
@given(a=small_expr)
def test_equivalence_is_reflexive(a):
    assert rewards.get("math").score(f"\\boxed{{{a}}}", a).correct
