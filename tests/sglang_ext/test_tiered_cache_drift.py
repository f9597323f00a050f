"""TieredRadixCache when the policy's view of the tree is wrong: counters count what happened, and eviction
still frees what was asked through the tree's own order."""

from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang_ext.tiered_cache import TieredRadixCache
from tests.sglang_ext.test_tiered_cache import CountingAlloc, check_invariants, ins
from tiers.clock import ManualClock


def lenient(policy="lru", capacity=100):
    """A cache as the server runs it: a bad victim is logged and worked around, not raised."""
    alloc = CountingAlloc(capacity)
    c = TieredRadixCache.create_simulated(policy=policy, capacity_tokens=capacity, clock=ManualClock(),
                                          mock_allocator=alloc)
    c._strict = False
    return c, alloc


def test_eviction_counts_only_the_victims_it_evicted_when_it_stops_early():
    c, alloc = lenient()
    ins(c, [1, 2, 3])
    ins(c, [1, 2, 4])  # [1,2] -> {[3], [4]}
    front = c.root_node.children[1]
    leaf3 = front.children[3]
    evicted = c._evict_nodes([leaf3, front])  # [1,2] still has [4]: not an evictable leaf, the round stops
    stats = c.tier_stats()
    assert evicted == 1 == alloc.freed
    assert (stats.evictions, stats.evicted_tokens) == (1, 1)


def test_eviction_frees_what_was_asked_when_split_notifications_stop(monkeypatch):
    """SGLang no longer calling our `_split_node` leaves the policy a stale tree: its victims run out (or are
    not leaves) while the tree still has evictable leaves; the tree's own LRU order frees the rest."""
    monkeypatch.setattr(TieredRadixCache, "_split_node", RadixCache._split_node)
    c, alloc = lenient()
    ins(c, [1, 2, 3, 4, 5, 6])
    ins(c, [1, 2, 3, 7, 8])  # a split the policy never hears of
    assert c.evictable_size_ == 8
    result = c.evict(EvictParams(num_tokens=8))
    assert result.num_tokens_evicted == 8 == alloc.freed
    assert c.evictable_size_ == 0 and not c.root_node.children
    assert c.tier_stats().evicted_tokens == 8


def test_the_fallback_leaves_protected_nodes_alone(monkeypatch):
    monkeypatch.setattr(TieredRadixCache, "_split_node", RadixCache._split_node)
    c, alloc = lenient()
    ins(c, [1, 2, 3, 4, 5, 6])
    ins(c, [1, 2, 3, 7, 8])
    front = c.root_node.children[1]
    c.inc_lock_ref(front.children[7])  # a running request holds [1,2,3] -> [7,8]
    result = c.evict(EvictParams(num_tokens=8))
    assert result.num_tokens_evicted == 3  # only [4,5,6] may go
    assert front.children.keys() == {7}


def test_a_policy_in_step_with_the_tree_never_reaches_the_fallback():
    """Strict mode raises if the fallback would free anything: a run of ordinary inserts and evictions,
    whose splits the policy hears of, passes."""
    c = TieredRadixCache.create_simulated(policy="tinylfu", capacity_tokens=12, clock=ManualClock())
    for toks in ([1, 2, 3, 4], [1, 2, 5, 6], [7, 8, 9], [1, 2, 3, 10], [7, 8, 11, 12], [13, 14, 15, 16, 17]):
        ins(c, toks)
        check_invariants(c)
    c.evict(EvictParams(num_tokens=100))
    check_invariants(c)
