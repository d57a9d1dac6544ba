"""The learning tier's thresholds keep their margins (fast tier): each is at most half the smallest gain its test
measured over seeds and CPU kinds (tests/algorithms/test_learning.py MEASURED_GAINS), and none lies within 0.02 of
a measured value, so a test does not pass or fail by the CPU it lands on."""

import pytest

from tests.algorithms.test_learning import MEASURED_GAINS, THRESHOLD


@pytest.mark.parametrize("test", sorted(THRESHOLD))
def test_threshold_is_at_most_half_the_smallest_measured_gain(test):
    gains = MEASURED_GAINS[test]
    assert len(gains) >= 4 and any(k.startswith("xeon-avx2") for k in gains), (
        f"{test}: measure more seeds and kinds"
    )
    smallest = min(gains.values())
    assert THRESHOLD[test] <= smallest / 2, (
        f"{test}: threshold {THRESHOLD[test]} > half of {smallest} ({gains})"
    )
    assert all(abs(g - THRESHOLD[test]) > 0.02 for g in gains.values()), (
        f"{test}: a gain within 0.02 of the threshold"
    )


def test_every_measured_test_has_a_threshold():
    assert MEASURED_GAINS.keys() == THRESHOLD.keys()
