import random
from collections import Counter

from hypothesis import given, settings, strategies as st

from tiers.sketch import FrequencySketch


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=300), max_size=400))
def test_never_undercounts_before_aging(keys):
    """Count-min must never report less than the true count (counters saturate at 15)."""
    s = FrequencySketch(256, seed=1)
    s.sample_size = 10**9  # no aging in this test
    for k in keys:
        s.increment(k)
    for k, c in Counter(keys).items():
        assert s.estimate(k) >= min(c, 15)


def test_error_stays_small_for_cold_keys():
    """Collisions overcount only a little: keys never seen read near zero on a lightly loaded sketch."""
    s = FrequencySketch(1024, seed=2)
    for k in range(512):
        s.increment(("hot", k))
    unseen = [s.estimate(("cold", k)) for k in range(2000)]
    assert sum(unseen) / len(unseen) < 0.5
    assert max(unseen) <= 3


def test_aging_halves_counts():
    s = FrequencySketch(64, seed=3)
    s.sample_size = 10**9
    for _ in range(12):
        s.increment("k")
    assert s.estimate("k") == 12
    s.reset()
    assert s.estimate("k") == 6
    s.reset()
    assert s.estimate("k") == 3


def test_aging_triggers_after_sample_size():
    s = FrequencySketch(64, sample_factor=10, seed=4)
    assert s.sample_size == 640
    rng = random.Random(0)
    for _ in range(700):
        s.increment(rng.randrange(10**6))
    assert s.resets >= 1


def test_doorkeeper_first_occurrence_counts_once():
    s = FrequencySketch(256, doorkeeper=True, seed=5)
    assert s.estimate("x") == 0
    s.increment("x")
    assert s.estimate("x") == 1
    s.increment("x")
    s.increment("x")
    assert s.estimate("x") == 3


def test_jitter_admits_warm_candidates_sometimes_but_not_cold_ones():
    """Flooding defence: a warm candidate that ties a saturated victim still gets in occasionally."""
    s = FrequencySketch(64, seed=6)
    warm = sum(s.admit_with_jitter(15, 15) for _ in range(5000))
    cold = sum(s.admit_with_jitter(1, 15) for _ in range(5000))
    assert 0 < warm < 500
    assert cold == 0
    assert s.admit_with_jitter(3, 2)


def test_rejects_bad_sizes():
    import pytest

    with pytest.raises(ValueError):
        FrequencySketch(0)
