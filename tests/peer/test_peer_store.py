"""PageStore in process (no sockets, no NIXL), time from a ManualClock.

Guards: a page size the pool cannot take is refused and formatting builds nothing in proportion to the
slot count; every policy's structures stay bounded by the pool's capacity however many pages pass
through it, whether or not anyone looks pages up; a lookup counts each key once (a probe, then a read,
is one hit and one recency bump) and feeds the policy the miss traffic that ages its estimates.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tiers.clock import ManualClock
from tiers.peer.protocol import READ_LEASE_S, WRITE_LEASE_S, PeerError
from tiers.peer.store import MAX_SLOTS, MIN_PAGE_BYTES, PageStore
from tiers.policy import policy_names

PAGE = 64


def store_of(slots: int, policy: str = "lru", page: int = PAGE) -> PageStore:
    s = PageStore(np.zeros(slots * page, dtype=np.uint8), policy, clock=ManualClock())
    s.format(page)
    return s


@pytest.mark.parametrize("page", [0, 1, MIN_PAGE_BYTES - 1, -4096, True, 2.5])
def test_a_page_size_below_the_floor_or_not_an_integer_is_refused(page):
    s = PageStore(np.zeros(1 << 20, dtype=np.uint8), "lru")
    with pytest.raises(PeerError, match="page size"):
        s.format(page)
    assert s.stats().capacity_pages == 0  # still unformatted: a good size is taken next
    s.format(4096)
    assert s.stats().capacity_pages == 256


def test_a_page_size_that_makes_too_many_slots_is_refused_and_formatting_is_cheap():
    pool = np.zeros((MAX_SLOTS + 1) * MIN_PAGE_BYTES, dtype=np.uint8)  # calloc: never touched here
    s = PageStore(pool, "lru")
    with pytest.raises(PeerError, match=f"more than {MAX_SLOTS} slots"):
        s.format(MIN_PAGE_BYTES)
    tracemalloc.start()
    try:
        s.format(MIN_PAGE_BYTES + 1)  # just under the cap: the most slots a pool can have
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert s.stats().free_pages == s.stats().capacity_pages > MAX_SLOTS // 2
    assert peak < 1 << 20  # no free list of millions of entries: slots are handed out from a counter


def _containers(obj, path="policy", depth=0, seen=None):
    """(path, len) of every list, dict and set reachable from a policy's attributes (its gate, its index)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 3:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, dict, set)):
        yield path, len(obj)
        return
    if type(obj).__module__.startswith("tiers.policies") or path == "policy":
        for name, value in vars(obj).items():
            yield from _containers(value, f"{path}.{name}", depth + 1, seen)


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_structure_stays_bounded_by_capacity(policy):
    """20,000 pages through a 10-slot store, written and never looked up (so nothing calls `observe`):
    today tinylfu's gate kept one open event per page."""
    s = store_of(10, policy)
    clock = s.clock
    fixed = dict(_containers(s._policy))  # tables laid out at construction (per class, per count)
    for i in range(20_000):
        s.alloc("ns", [f"k{i}"])  # abandoned writes: each one's lease runs out, so the next can evict it
        clock.advance(WRITE_LEASE_S + 1)
    sizes = dict(_containers(s._policy))
    assert sizes, "found no structures to check"
    bound = 10 * s.capacity_pages + 256  # a few multiples of capacity, plus small per-class tables
    assert {p: n for p, n in sizes.items() if n > max(bound, fixed.get(p, 0))} == {}, sizes
    if hasattr(s._policy, "gate"):
        assert len(s._policy.gate) <= s._policy.gate.horizon_units


def test_a_probe_then_a_read_counts_one_hit_and_bumps_recency_once():
    s = store_of(3, "lru")
    for k in ("a", "b", "c"):
        assert s.alloc("ns", [k])[0]["state"] == "alloc"
        slot = s._index[("ns", k)]
        slot.writing, slot.lease_until = False, 0.0  # as commit leaves it (the bytes do not matter here)
    probe = s.lookup("ns", ["a", "b", "x"], pin=False)
    assert [o is not None for o in probe.offsets] == [True, True, False]
    assert (s.stats().hits, s.stats().misses) == (0, 1)  # the probe counts only its miss
    read = s.lookup("ns", ["a"], pin=True)
    assert (read.offsets, read.checksums) == (probe.offsets[:1], probe.checksums[:1])
    assert (s.stats().hits, s.stats().misses) == (1, 1)
    # recency: `a` was read, `b` only probed; so `b` is the least recent and goes first
    s.clock.advance(READ_LEASE_S + 1)  # past a's read lease
    assert s.alloc("ns", ["d"])[0]["state"] == "alloc"
    assert [o is not None for o in s.lookup("ns", ["a", "b", "c"], pin=False).offsets] == [True, False, True]


def test_lookups_feed_the_policy_its_miss_traffic():
    """The reuse gate ages events by miss traffic (`observe`): after 5 x capacity missed pages, the events
    of pages nobody asked for again are closed as not reused."""
    s = store_of(10, "reuse-gate")
    for i in range(5):
        s.alloc("ns", [f"k{i}"])
    gate = s._policy.gate
    assert len(gate) == 5
    for i in range(6):
        s.lookup("ns", [f"miss{i}-{j}" for j in range(10)], pin=False)
    assert len(gate) == 0
    assert sum(gate.events.values()) == 5 and sum(gate.hits.values()) == 0
