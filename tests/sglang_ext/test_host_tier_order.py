"""SGLang's own order that TieredHiRadixCache falls back to (a round whose policy drifted), and the host-tier
policy names the launcher accepts, without a server."""

import pytest

from sglang.srt.mem_cache.utils import get_eviction_strategy
from sglang_ext.tier_config import TierConfig, TierConfigError
from sglang_ext.tiered_hicache import RetainedLast
from tiers.clock import ManualClock
from tiers.retention import Retention


class Node:  # hashable by identity, as SGLang's TreeNode
    def __init__(self, name, last_access):
        self.name, self.last_access_time = name, last_access


def order(nodes, strategy):
    return [n.name for n in sorted(nodes, key=strategy.get_priority)]


def test_retained_nodes_go_last_in_sglangs_order():
    clock = ManualClock()
    retention = Retention(1000, clock, budget_fraction=0.5)
    nodes = [Node("recent", 3.0), Node("session", 0.0), Node("old", 1.0)]
    retention.retain(nodes[1], 10, ttl_s=60)
    strategy = RetainedLast(get_eviction_strategy("lru"), retention)
    assert order(nodes, strategy) == ["old", "recent", "session"]
    clock.advance(61)  # the TTL ran out: the session prefix is an ordinary old node again
    assert order(nodes, strategy)[0] == "session"


@pytest.mark.parametrize("policy", ["tinylfu", "lru", "reuse-gate", "tiers.policies.stock:LRUPolicy"])
def test_every_registered_or_importable_policy_is_accepted(policy):
    TierConfig(policy=policy).validate()


@pytest.mark.parametrize("policy", ["mypkg.policies:Custom", "tiers.policy:Candidate", "tiers.policy:Nope", "nope"])
def test_a_policy_that_cannot_be_loaded_is_refused_naming_the_flag(policy):
    with pytest.raises(TierConfigError, match="--tier-policy"):
        TierConfig(policy=policy).validate()
