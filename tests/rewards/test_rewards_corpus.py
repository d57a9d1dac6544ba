"""Our `math` checker vs Math-Verify on the peer-suite corpus (tests/rewards/reward_peer_cases.py).

Done-criterion of issue 4: at least as accurate as math-verify, with no more
false positives, on every source family and overall.
"""

from __future__ import annotations

import pytest
from reward_corpus_report import math_verify_judge, ours_judge, tally


@pytest.fixture(scope="module")
def scores():
    pytest.importorskip("math_verify")
    ours, _ = tally(ours_judge())
    theirs, _ = tally(math_verify_judge())
    return ours, theirs


def test_overall_at_least_as_accurate_as_math_verify(scores):
    ours, theirs = scores
    assert ours["ALL"]["right"] >= theirs["ALL"]["right"]
    assert ours["ALL"]["fp"] <= theirs["ALL"]["fp"]


def test_per_source_no_worse_than_math_verify(scores):
    ours, theirs = scores
    for source in ours:
        assert ours[source]["right"] >= theirs[source]["right"], source
        assert ours[source]["fp"] <= theirs[source]["fp"], source


def test_corpus_accuracy_floor(scores):
    ours, _ = scores
    assert ours["ALL"]["right"] / ours["ALL"]["n"] >= 0.95
