"""tiers.signals: velocities, thrash, churn, lifetimes, cold vs capacity misses, fragmentation (ManualClock)."""

import pytest

from tiers.clock import ManualClock
from tiers.signals import Every, Ghost, SignalsConfig, TierSignals, Window, free_runs


class LruTier:
    """An LRU tier of equal entries, reporting to `signals` as a cache does."""

    def __init__(self, signals, clock, capacity_entries, tokens=10):
        self.signals, self.clock, self.capacity, self.tokens = signals, clock, capacity_entries, tokens
        self.resident = {}  # key -> [birth, hit], least recently used first

    def run(self, keys, step_s=0.5):
        for key in keys:
            self.clock.advance(step_s)
            if key in self.resident:
                entry = self.resident.pop(key)
                entry[1] = True
                self.resident[key] = entry
                self.signals.hit(self.tokens)
                continue
            if len(self.resident) == self.capacity:
                victim = next(iter(self.resident))
                birth, hit = self.resident.pop(victim)
                self.signals.evicted([victim], self.tokens, birth, hit)
            self.resident[key] = [self.signals.stored(key, self.tokens), False]
        return self


def lru_run(signals, clock, capacity_entries, keys, tokens=10, step_s=0.5):
    return LruTier(signals, clock, capacity_entries, tokens).run(keys, step_s)


def test_window_sums_only_the_last_window_seconds():
    clock = ManualClock(100.0)
    w = Window(3, fields=1)
    w.add(clock.now(), 0, 5)
    clock.advance(1)
    w.add(clock.now(), 0, 7)
    assert w.sums(clock.now()) == [12]
    clock.advance(2)  # second 100 leaves the 3 s window [101, 103]
    assert w.sums(clock.now()) == [7]
    clock.advance(3)  # the ring wraps: an old bucket is reset before reuse
    w.add(clock.now(), 0, 1)
    assert w.sums(clock.now()) == [1]


def test_ghost_is_bounded_and_forgets_the_oldest():
    g = Ghost(2)
    for key in "abc":
        g.add(key)
    assert len(g) == 2
    assert not g.take("a")
    assert g.take("b") and not g.take("b")


def test_working_set_over_capacity_thrashes_and_fitting_one_does_not():
    clock = ManualClock()
    fits = TierSignals(clock)
    lru_run(fits, clock, capacity_entries=10, keys=[i % 8 for i in range(200)])
    snap = fits.snapshot()
    assert not snap.thrashing
    assert snap.eviction_tokens_per_s == 0 and snap.hit_tokens_per_s > 0

    clock = ManualClock()
    thrash = TierSignals(clock)
    lru_run(thrash, clock, capacity_entries=10, keys=[i % 30 for i in range(200)])  # 3x the tier
    snap = thrash.snapshot()
    assert snap.thrashing
    assert snap.eviction_tokens_per_s == pytest.approx(snap.store_tokens_per_s)
    # one 10-token store each 0.5 s (the window's current second is only partly elapsed)
    assert snap.store_tokens_per_s == pytest.approx(10 * 2, rel=0.05)
    assert snap.evicted_never_hit_share == 1.0
    # an entry never hit under LRU lives exactly one capacity of traffic
    assert snap.evicted_lifetime_tokens == pytest.approx(10 * 10)
    assert snap.evicted_lifetime_s == pytest.approx(10 * 0.5)


def test_thrash_turns_off_when_the_working_set_fits_again_for_a_window():
    clock = ManualClock()
    s = TierSignals(clock, SignalsConfig(window_s=10))
    tier = lru_run(s, clock, 10, [i % 30 for i in range(100)])
    assert s.snapshot().thrashing
    tier.run([i % 5 for i in range(6)])  # 3 s of fitting traffic: the window still holds the thrash
    assert s.snapshot().thrashing
    tier.run([i % 5 for i in range(40)])
    snap = s.snapshot()
    assert not snap.thrashing and snap.eviction_tokens_per_s == 0


def test_a_full_healthy_cache_with_few_misses_is_not_thrashing():
    """Every store in a full tier costs an eviction, thrashing or not; mostly hits means not thrashing."""
    clock = ManualClock()
    s = TierSignals(clock)
    keys = [i % 9 if i % 10 else 100 + i for i in range(300)]  # 9 hot keys, one new key in ten
    lru_run(s, clock, 10, keys)
    snap = s.snapshot()
    assert snap.eviction_tokens_per_s > 0.9 * snap.store_tokens_per_s
    assert not snap.thrashing


def test_an_idle_tier_is_not_thrashing_and_rates_decay():
    clock = ManualClock()
    s = TierSignals(clock, SignalsConfig(window_s=5))
    lru_run(s, clock, 2, [0, 1, 2, 3, 4, 5])
    assert s.snapshot().eviction_tokens_per_s > 0
    clock.advance(5)
    snap = s.snapshot()
    assert snap.eviction_tokens_per_s == snap.store_tokens_per_s == 0 and not snap.thrashing
    assert snap.stored_entries == 6 and snap.evicted_entries == 4  # counts do not decay


def test_repeat_after_eviction_is_a_capacity_miss_and_a_new_key_a_cold_miss():
    clock = ManualClock()
    s = TierSignals(clock)
    tier = lru_run(s, clock, 2, ["a", "b", "c"], tokens=10)  # "a" evicted
    assert (s.cold_miss_tokens, s.capacity_miss_tokens) == (30, 0)
    tier.run(["a"])
    assert (s.cold_miss_tokens, s.capacity_miss_tokens) == (30, 10)
    tier.run(["d"])
    assert (s.cold_miss_tokens, s.capacity_miss_tokens) == (40, 10)


def test_a_key_the_bounded_ghost_forgot_counts_as_cold():
    clock = ManualClock()
    s = TierSignals(clock, SignalsConfig(ghost_entries=3))
    tier = lru_run(s, clock, 1, list(range(6)), tokens=1)  # evicts 0..4: the ghost keeps 2, 3, 4
    before = s.cold_miss_tokens
    tier.run([0])
    assert s.cold_miss_tokens == before + 1 and s.capacity_miss_tokens == 0
    assert s.snapshot().ghost_entries <= 3


def test_eviction_without_a_birth_counts_but_has_no_lifetime():
    clock = ManualClock()
    s = TierSignals(clock)
    s.evicted(["x"], 4, None, False)
    snap = s.snapshot()
    assert snap.evicted_entries == 1 and snap.eviction_tokens_per_s > 0
    assert snap.evicted_lifetime_s is None and snap.evicted_never_hit_share is None


@pytest.mark.parametrize("pages, expected", [
    ([], (0, 0)), ([5], (1, 1)), ([1, 2, 3], (1, 3)), ([1, 2, 4, 5, 6, 9], (3, 3)), ([1, 3, 5], (3, 1)),
])
def test_free_runs(pages, expected):
    assert free_runs(pages) == expected


def test_every_limits_the_sample_rate():
    clock = ManualClock()
    every = Every(clock, 5.0)
    assert every.due() and not every.due()
    clock.advance(4.9)
    assert not every.due()
    clock.advance(0.1)
    assert every.due()
