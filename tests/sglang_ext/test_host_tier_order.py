"""The eviction order TieredHiRadixCache gives SGLang's HiRadixCache (device and host), without a server."""

import pytest

from sglang_ext.tier_config import TierConfig, TierConfigError
from sglang_ext.tiered_hicache import RetainedLast, TinyLFUOrder
from tiers.clock import ManualClock
from tiers.retention import Retention
from tiers.sketch import FrequencySketch


class Node:  # hashable by identity, as SGLang's TreeNode
    def __init__(self, key, last_access):
        self.sketch_key, self.last_access_time = key, last_access


def node(key, last_access):
    return Node(key, last_access)


def order(nodes, strategy):
    return [n.sketch_key for n in sorted(nodes, key=strategy.get_priority)]


def test_tinylfu_order_evicts_the_least_frequent_first_then_the_least_recent():
    sketch = FrequencySketch(1024, seed=0)
    for _ in range(5):
        sketch.increment("hot")
    sketch.increment("warm")
    sketch.increment("warm2")
    nodes = [node("hot", 1.0), node("warm", 3.0), node("warm2", 2.0), node("cold", 9.0)]
    strategy = TinyLFUOrder(sketch, lambda n: n.sketch_key)
    assert order(nodes, strategy) == ["cold", "warm2", "warm", "hot"]


def test_retained_nodes_go_last_whatever_the_inner_order():
    sketch = FrequencySketch(1024, seed=0)
    for _ in range(5):
        sketch.increment("hot")
    clock = ManualClock()
    retention = Retention(1000, clock, budget_fraction=0.5)
    nodes = [node("hot", 1.0), node("session", 0.0), node("cold", 2.0)]
    retention.retain(nodes[1], 10, ttl_s=60)
    strategy = RetainedLast(TinyLFUOrder(sketch, lambda n: n.sketch_key), retention)
    assert order(nodes, strategy) == ["cold", "hot", "session"]
    clock.advance(61)  # the TTL ran out: the session prefix is an ordinary cold node again
    assert order(nodes, strategy)[0] == "session"


@pytest.mark.parametrize("policy", ["tinylfu", "lru", "lfu", "slru"])
def test_host_tier_policies_are_accepted(policy):
    TierConfig(policy=policy).validate().check_host_tier()


def test_a_policy_hiradixcache_cannot_order_by_is_refused_naming_the_flag():
    with pytest.raises(TierConfigError, match="--tier-policy"):
        TierConfig(policy="mypkg.policies:Custom").validate().check_host_tier()
