"""TinyLFU's frequency sketch (tiers/policies/_frequency.py): estimates, aging, growth, memory."""

from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from tiers.policies._frequency import MAX_COUNT, MAX_WIDTH, MIN_ENTRIES, WIDTH_PER_ENTRY, FrequencySketch, KeyContest


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), min_size=1, max_size=3000),
       st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=400))
def test_an_estimate_is_never_below_the_true_count(spread, repeated):
    """Many distinct keys in a small sketch collide: an estimate may be too high, never too low."""
    s = FrequencySketch(period=1e9)  # no aging here
    keys = spread + repeated
    for k in keys:
        s.add(k, MIN_ENTRIES)
    for k, n in Counter(keys).items():
        assert s.estimate(k) >= min(n, MAX_COUNT)


def test_rows_wider_than_16_bits_still_never_underestimate():
    s = FrequencySketch(period=1e9)
    keys = [("k", i % 5000) for i in range(20_000)] + [("hot", 0)] * 9
    for k in keys:
        s.add(k, 10_000)  # 160,000 counters a row: the slots come from two hashes
    assert s.width > 1 << 16
    for k, n in Counter(keys).items():
        assert s.estimate(k) >= min(n, MAX_COUNT)
    assert s.estimate(("hot", 0)) == 9  # and a key with no collisions in some row is exact


def test_a_key_counted_alone_is_exact_and_stops_at_the_cap():
    s = FrequencySketch(period=1e9)
    for n in range(1, MAX_COUNT + 5):
        s.add("prompt", MIN_ENTRIES)
        assert s.estimate("prompt") == min(n, MAX_COUNT)
    assert s.estimate("never asked for") == 0


def test_every_count_halves_after_period_times_entries_uses():
    s = FrequencySketch(period=2)
    entries = 100
    for _ in range(8):
        s.add("hot", entries)
    for i in range(2 * entries - 8 - 1):  # one use short of the reset
        s.add(("cold", i), entries)
    assert s.estimate("hot") == 8
    s.add(("cold", -1), entries)
    assert s.estimate("hot") == 4


def test_growing_with_the_entries_keeps_every_estimate():
    s = FrequencySketch(period=1e9)
    keys = [("k", i % 300) for i in range(2000)]
    for k in keys:
        s.add(k, MIN_ENTRIES)
    before = {k: s.estimate(k) for k in set(keys)}
    width = s.width
    s.add("newcomer", 50 * MIN_ENTRIES)  # the cache grew: the sketch widens before counting
    assert s.width >= WIDTH_PER_ENTRY * 50 * MIN_ENTRIES > width
    assert {k: s.estimate(k) for k in before} == before


def test_memory_follows_the_entries_tracked_not_the_keys_clients_send():
    s = FrequencySketch()
    for i in range(100_000):  # a flood of distinct keys into a cache that tracks 100 entries
        s.add(("flood", i), 100)
    assert s.width <= WIDTH_PER_ENTRY * 128


def test_a_tree_split_into_ever_more_entries_cannot_widen_the_sketch_past_its_cap():
    s = FrequencySketch(period=1e9)
    s.add("jump", 1 << 24)  # entries a client could inflate, up to a pool's tokens, at once
    for i in range(25, 40):
        s.add(("split", i), 1 << i)  # and on from there
    assert s.width == MAX_WIDTH
    for _ in range(3):
        s.add("prompt", 1 << 40)
    assert s.estimate("prompt") >= 3


def test_a_period_must_be_positive():
    with pytest.raises(ValueError, match="period"):
        FrequencySketch(period=0)


def _contest(margin=1.0, open_bets=64):
    c = KeyContest(period=1e9, margin=margin, open_bets=open_bets)
    for _ in range(3):
        c.record("popular", MIN_ENTRIES)
    c.record("rare", MIN_ENTRIES)
    return c


def test_a_newcomer_asked_for_less_often_than_a_victim_loses_and_a_tie_does_not():
    c = _contest()
    assert c.declines("rare", ["other", "popular"])
    assert not c.declines("popular", ["rare"])
    c.record("rare", MIN_ENTRIES)
    c.record("rare", MIN_ENTRIES)  # 3 each now
    assert not c.declines("rare", ["popular"])
    assert not _contest(margin=0).declines("rare", ["popular"])


def test_a_verdict_is_right_when_the_defended_key_is_asked_for_first():
    c = _contest()
    c.declines("rare", ["popular"])
    c.record("popular", MIN_ENTRIES)
    c.record("rare", MIN_ENTRIES)  # the bet was settled: a later return scores nothing
    assert (c.right, c.wrong) == (1, 0)


def test_the_contest_stands_down_while_not_right_twice_as_often_as_wrong_and_scores_on_to_come_back():
    c = _contest()
    assert c.declines("rare", ["popular"])
    c.record("rare", MIN_ENTRIES)  # the newcomer came back first
    assert (c.right, c.wrong) == (0, 1) and not c.enforced and not c.orders  # counts that were wrong order nothing
    c.record("rare2", MIN_ENTRIES)
    assert not c.declines("rare2", ["popular"])  # lost the contest, but not held off: still a bet
    c.record("popular", MIN_ENTRIES)
    assert (c.right, c.wrong) == (1, 1) and not c.enforced  # right twice as often as wrong, to be enforced
    assert c.orders  # right as often as wrong: the counts order root-level eviction (tinylfu)
    c.declines("rare2", ["popular"])
    c.record("popular", MIN_ENTRIES)
    assert (c.right, c.wrong) == (2, 1) and c.enforced


def test_scores_halve_with_the_counts():
    c = KeyContest(period=1, margin=1.0)
    c.right, c.wrong = 8.0, 4.0
    for i in range(MIN_ENTRIES):  # one period of uses: the sketch resets once
        c.record(("k", i), MIN_ENTRIES)
    assert (c.right, c.wrong) == (4.0, 2.0)


def test_open_bets_are_bounded_and_the_oldest_lapses_unscored():
    c = KeyContest(period=1e9, open_bets=4)
    for i in range(10):
        c.record(("popular", i), MIN_ENTRIES)
        assert c.declines(("rare", i), [("popular", i)])
    assert len(c._held_off) == len(c._defended) == 4
    c.record(("rare", 0), MIN_ENTRIES)  # its bet lapsed
    assert (c.right, c.wrong) == (0, 0)
    c.record(("rare", 9), MIN_ENTRIES)
    assert (c.right, c.wrong) == (0, 1)
