"""Safety and time bounds: adversarial inputs, no code execution, killable workers."""

from __future__ import annotations

import os
import time

import pytest

import rewards
from rewards import _pool
from rewards._latex import ParseError, parse_answer

LIMIT = 1.0  # the default per-check limit

ADVERSARIAL = {
    "power_tower": "\\boxed{9^{9^{9^{9}}}}",
    "factorial_of_tower": "\\boxed{(9^{9^{9}})!}",
    "huge_float": "\\boxed{10^{10^{10}}}",
    "huge_difference": "\\boxed{2^{100000000}-2^{100000000}}",
    "nested_braces": "\\boxed{" + "{" * 10_000 + "1" + "}" * 10_000 + "}",
    "unclosed_braces": "\\boxed{" + "{" * 10_000,
    "nested_fracs": "\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}",
    "one_megabyte": "x" * 1_000_000 + " \\boxed{3}",
    "megabyte_of_dollars": "$" * 1_000_000,
    "megabyte_of_digits": "7" * 1_000_000,
    "many_boxes": "\\boxed{1}" * 100_000,
    "nul_bytes": "\\boxed{3\x00}\x00\x00",
    "lone_surrogates": "\\boxed{3}\ud800\udfff\udbff",
    "marker_spam": "the answer is " * 50_000,
    "span_spam": "$a$ " * 100_000,
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
@pytest.mark.parametrize("checker_name", ["math", "gsm8k", "math_strict", "gsm8k_strict"])
def test_adversarial_inputs_are_bounded(name, checker_name):
    checker = rewards.get(checker_name)
    start = time.perf_counter()
    verdict = checker.score(ADVERSARIAL[name], "3")
    assert time.perf_counter() - start < LIMIT
    assert verdict.score in (0.0, 1.0)
    assert isinstance(verdict.reason, str) and verdict.reason


@pytest.mark.parametrize(
    "payload",
    [
        "\\boxed{__import__('os').system('touch {marker}')}",
        "\\boxed{eval(\"open('{marker}','w')\")}",
        "The answer is $exec('open(\"{marker}\", \"w\")')$",
        "\\boxed{().__class__.__bases__[0].__subclasses__()}",
        "#### __import__('pathlib').Path('{marker}').touch()",
    ],
)
def test_model_text_is_never_executed(tmp_path, payload):
    marker = tmp_path / "pwned"
    text = payload.replace("{marker}", str(marker))
    # the ground truth is a number no temporary path holds (pytest-7/... once matched a ground truth of 7)
    for name in ("math", "gsm8k"):
        verdict = rewards.get(name).score(text, "31415926")
        assert not verdict.correct
        verdict = rewards.get(name).score("\\boxed{31415926}", text)  # hostile ground truth too
    assert not marker.exists()


def test_parser_refuses_deep_nesting():
    with pytest.raises(ParseError):
        parse_answer("(" * 500 + "1" + ")" * 500)


def test_pool_kills_and_replaces_a_stuck_worker():
    pool = _pool.WorkerPool(2)
    try:
        out = pool.map(time.sleep, [(0,), (30,), (0,), (0,)], timeout=0.5, chunk=1)
        assert [s for s, _ in out] == ["ok", "timeout", "ok", "ok"]
        assert pool.killed == 1
        # the replacement works
        assert pool.call(abs, (-3,), timeout=5) == ("ok", 3)
    finally:
        pool.close()


def test_stuck_item_in_a_chunk_does_not_lose_the_rest():
    pool = _pool.WorkerPool(1)
    try:
        start = time.perf_counter()
        out = pool.map(time.sleep, [(0,), (30,), (0,), (0,)], timeout=0.5, chunk=4)
        assert [s for s, _ in out] == ["ok", "timeout", "ok", "ok"]
        assert time.perf_counter() - start < 10
    finally:
        pool.close()


def test_pool_close_leaves_no_processes():
    pool = _pool.WorkerPool(2)
    pool.map(abs, [(-1,), (-2,)], timeout=5, chunk=1)
    procs = [w.proc for w in pool._idle]
    assert procs
    pool.close()
    assert all(not p.is_alive() for p in procs)


def test_parallel_batch_equals_sequential():
    checker = rewards.get("math")
    parallel = type(checker)(parallel_min=1)
    responses = [f"\\boxed{{{i % 7}}}" for i in range(80)] + [ADVERSARIAL["power_tower"]]
    golds = [str(i % 5) for i in range(80)] + ["3"]
    assert parallel.score_batch(responses, golds) == [checker.score(r, g) for r, g in zip(responses, golds)]


def test_symbolic_layer_runs_in_a_bounded_worker():
    checker = rewards.get("math")
    start = time.perf_counter()
    assert checker.bounded(time.sleep, 30) is None  # abandoned at the limit
    assert time.perf_counter() - start < LIMIT + 5  # (+ worker start-up on first use)
    from rewards._sympy_bridge import symbolic_equal

    x = ("sym", "x")
    assert checker.bounded(symbolic_equal, ("mul", (x, x)), ("pow", x, ("num", "2"))) is True
    assert os.getpid() != checker.bounded(os.getpid)
