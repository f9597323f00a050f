"""Host and peer victim tiers: where demoted blocks go, what a lookup finds, what is counted."""

from __future__ import annotations

import pytest

from benchmarks.lower_tiers import LowerTiers, TierSpec, lower_policy_names
from tiers.clock import ManualClock


def chain(host=2, peer=2, policy="lru"):
    return LowerTiers([TierSpec("host", host), TierSpec("peer", peer)], policy=policy, clock=ManualClock(),
                      block_tokens=4)


def test_host_overflow_moves_to_peer_and_peer_overflow_is_dropped():
    t = chain()
    t.demote([1, 2, 3, 4, 5])  # host keeps 4, 5; peer got 1, 2, 3 and dropped 1
    found = t.lookup([2, 3, 4, 5, 1], 0, [4] * 5)
    assert found == {"host": 2, "peer": 2}  # the prefix stops at block 1, which is gone
    assert t.counters["host"].stored_tokens == 5 * 4 and t.counters["peer"].stored_tokens == 3 * 4
    assert t.counters["host"].evicted_blocks == 3 and t.counters["peer"].evicted_blocks == 1


def test_lookup_continues_the_device_prefix_and_stops_at_the_first_miss():
    t = chain(host=10)
    t.demote([7, 8])
    assert t.lookup([1, 7, 9, 8], 1, [4, 4, 4, 3]) == {"host": 1, "peer": 0}
    assert t.counters["host"].hit_tokens == 4 and t.counters["host"].loaded_tokens == 4


def test_a_block_already_held_is_not_stored_again():
    t = chain(host=10)
    t.demote([1])
    t.lookup([1], 0, [4])
    t.demote([1])  # the device dropped it again after loading it back: the host copy is still there
    assert t.counters["host"].stored_tokens == 4


@pytest.mark.parametrize("policy", [p for p in lower_policy_names() if p != "lru"])
def test_registry_policies_keep_the_tier_within_capacity(policy):
    t = chain(host=3, peer=3, policy=policy)
    for b in range(40):
        t.demote([b % 9])
        t.lookup([b % 5], 0, [4])
    assert all(len(tier) <= 3 for tier in t._tiers)
