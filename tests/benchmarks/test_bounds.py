"""OPT (Belady with bypass, on the tree's semantics) bounds every policy, and the infinite cache bounds OPT.

Guards: an OPT that is not really optimal (e.g. evicting inner nodes, or counting hits a prefix cache cannot
have), and engines that exceed their capacity (they would then "beat" OPT).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.belady import BeladyEngine, InfiniteEngine, ReuseOracleEngine
from benchmarks.engines import STOCK_POLICIES, logical_radix_time, make_engine, tiered_policy_names
from benchmarks.trace import Request
from tests.benchmarks.helpers import random_chain_trace
from tiers.clock import ManualClock

POLICIES = list(STOCK_POLICIES) + [f"tiered-{n}" for n in tiered_policy_names()]


def block_hits(name: str, capacity: int, requests) -> int:
    clock = ManualClock()
    with logical_radix_time():
        engine = make_engine(name, capacity, requests, clock)
        total = 0
        for r in requests:
            clock.set(r.time_s)
            total += engine.access(r).hit_blocks
    return total


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 40), capacity=st.integers(1, 12))
def test_opt_bounds_every_policy_and_infinite_bounds_opt(seed, n, capacity):
    reqs = random_chain_trace(seed, n).requests
    opt = block_hits("opt", capacity, reqs)
    for name in POLICIES:
        assert block_hits(name, capacity, reqs) <= opt, name
    assert opt <= block_hits("infinite", capacity, reqs)


def _parents(reqs):
    """block -> the block before it in its prompt (None at the root)."""
    return {b: (r.blocks[i - 1] if i else None) for r in reqs for i, b in enumerate(r.blocks)}


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 40), capacity=st.integers(1, 10))
def test_opt_keeps_a_prefix_closed_cache_within_capacity(seed, n, capacity):
    """Leaf-only semantics: no cached block ever loses its parent, so hits are real prefix hits."""
    reqs = random_chain_trace(seed, n).requests
    parent = _parents(reqs)
    engine = BeladyEngine(capacity, reqs)
    for r in reqs:
        engine.access(r)
        cached = engine.cached_blocks()
        assert len(cached) <= capacity
        assert all(parent[b] is None or parent[b] in cached for b in cached)


def _req(i, blocks):
    return Request(index=i, time_s=float(i), input_length=8 * len(blocks), output_length=1, blocks=tuple(blocks),
                   last_block_tokens=8)


def test_opt_refuses_a_block_used_later_than_everything_cached():
    """With one slot, A is reused next and B never: OPT must bypass B rather than evict A."""
    reqs = [_req(0, [1]), _req(1, [2]), _req(2, [1])]
    engine = BeladyEngine(1, reqs)
    hits = [engine.access(r).hit_blocks for r in reqs]
    assert hits == [0, 0, 1]
    assert engine.stats().admissions_rejected == 1
    lru_hits = block_hits("lru", 1, reqs)
    assert lru_hits == 0


def test_infinite_hits_every_block_seen_before():
    reqs = [_req(0, [1, 2]), _req(1, [1, 3]), _req(2, [1, 2, 4])]
    engine = InfiniteEngine()
    assert [engine.access(r).hit_blocks for r in reqs] == [0, 1, 2]


@pytest.mark.parametrize("name", POLICIES)
def test_every_policy_stays_within_capacity(name):
    reqs = random_chain_trace(7, 60).requests
    clock = ManualClock()
    with logical_radix_time():
        engine = make_engine(name, 5, reqs, clock)
        for r in reqs:
            clock.set(r.time_s)
            engine.access(r)
            assert engine.cache.evictable_size() + engine.cache.protected_size() <= 5


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), n=st.integers(1, 40), capacity=st.integers(1, 10))
def test_reuse_oracle_stays_prefix_closed_and_between_its_lru_and_opt(seed, n, capacity):
    """Guards: an oracle that caches past capacity or strands blocks (it would overstate what a perfect
    reuse predictor wins), and one that admits blocks never used again."""
    reqs = random_chain_trace(seed, n).requests
    parent = _parents(reqs)
    engine = ReuseOracleEngine(capacity, reqs)
    before = set()
    for k, r in enumerate(reqs):
        engine.access(r)
        cached = engine.cached_blocks()
        assert len(cached) <= capacity
        assert all(parent[b] is None or parent[b] in cached for b in cached)
        assert cached - before <= {b for later in reqs[k + 1:] for b in later.blocks}  # admitted: used again
        before = cached
    assert block_hits("opt", capacity, reqs) >= block_hits("reuse-oracle", capacity, reqs)


def test_reuse_oracle_without_the_oracle_is_the_readmes_leaf_first_lru():
    """trace README, "LRU, leaf-first" at synthetic 1e6: .145 (stock RadixCache gives .142: it evicts nodes,
    not blocks). The oracle must then only add hits."""
    from benchmarks.replay import ReplayConfig, replay
    from benchmarks.trace import load_trace

    trace = load_trace("synthetic")
    rate = {p: replay(trace, ReplayConfig(policy=p, capacity_tokens=10**6)).token_hit_rate
            for p in ("lru-blocks", "reuse-oracle")}
    assert round(rate["lru-blocks"], 3) == 0.145
    assert rate["reuse-oracle"] > rate["lru-blocks"]
