"""TieredHiRadixCache on SGLang's real HiRadixCache tree code (insert, split, eviction, load_back, host eviction).

The edge faked here is what HiRadixCache.__init__ builds around the tree: the host KV pool and the controller
that copies pages between the pools (they need a model's KV pool and a process group). The stand-in controller
accepts a copy at once while the destination has room; `finish_copies` then does what the scheduler's
writing_check / loading_check do when the copies are acknowledged (release the locks SGLang took).
"""

from array import array

import pytest
import torch
from hypothesis import given, settings, strategies as st

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang_ext.tiered_hicache import TieredHiRadixCache
from tiers.clock import ManualClock
from tiers.policies.stock import LRUPolicy
from tiers.policy import Candidate

HERE = __name__


class HostPool:
    def __init__(self, size):
        self.size = size
        self.free = list(range(size))

    def available_size(self):
        return len(self.free)

    def clear(self):
        self.free = list(range(self.size))


class DeviceAlloc:
    device = "cpu"

    def __init__(self, size):
        self.size = size

    def free(self, indices):
        pass


class Controller:
    write_policy = "write_through"

    def __init__(self, host_tokens):
        self.mem_pool_host = HostPool(host_tokens)
        self.mem_pool_device_allocator = DeviceAlloc(0)

    def reset(self):
        self.mem_pool_host.clear()

    def write(self, device_indices, node_id, **_):
        pool, n = self.mem_pool_host, len(device_indices)
        if pool.available_size() < n:
            return None
        slots, pool.free = pool.free[:n], pool.free[n:]
        return torch.tensor(slots, dtype=torch.int64)

    def evict_host(self, host_indices):
        self.mem_pool_host.free.extend(int(i) for i in host_indices)
        return len(host_indices)

    def evict_device(self, device_indices):
        pass

    def load(self, host_indices, node_id, **_):
        return torch.arange(len(host_indices), dtype=torch.int64)


def host_cache(monkeypatch, host_tokens=256, policy="tinylfu", clock=None, strict=True) -> TieredHiRadixCache:
    def stand_in_init(self, params, server_args):
        self.cache_controller = Controller(host_tokens)
        self.token_to_kv_pool_host = self.cache_controller.mem_pool_host
        self.prefetch_loaded_tokens_by_reqid = {}
        self.evictable_host_leaves = set()
        self.ongoing_write_through = {}
        self.ongoing_load_back = {}
        self.load_back_threshold = 1
        self.enable_storage = False
        RadixCache.__init__(self, params)

    monkeypatch.setattr(HiRadixCache, "__init__", stand_in_init)
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=DeviceAlloc(256),
                             page_size=1)
    return TieredHiRadixCache(params, None, policy=policy, clock=clock or ManualClock(), strict=strict)


def ins(cache, toks, chunked=False):
    key = RadixKey(array("q", toks))
    return cache.insert(InsertParams(key=key, value=torch.arange(len(toks), dtype=torch.int64), chunked=chunked))


def finish_copies(cache):
    """The controller acknowledged every copy: SGLang releases the locks its writes and loads took."""
    for ack_id in list(cache.ongoing_write_through):
        cache._finish_write_through_ack(ack_id, release_lock=True)
    for node in cache.ongoing_load_back.values():
        cache.dec_lock_ref(node)
    cache.ongoing_load_back.clear()


def tree_nodes(cache):
    stack, out = list(cache.root_node.children.values()), []
    while stack:
        n = stack.pop()
        out.append(n)
        stack.extend(n.children.values())
    return out


class ScriptedAdmission(LRUPolicy):
    """LRU that admits only candidates of odd size, and remembers what it was asked."""

    asked = []

    def admit(self, candidate: Candidate, victims) -> bool:
        ScriptedAdmission.asked.append((candidate, list(victims)))
        return candidate.size % 2 == 1


# ---- keys, retention, SGLang's own insert ----
def test_a_split_gives_the_back_part_its_own_tier_key_and_the_front_keeps_the_old_one(monkeypatch):
    cache = host_cache(monkeypatch)
    ins(cache, [1, 2, 3, 4])
    leaf = cache.root_node.children[1]
    before = cache._tier_key(leaf)
    ins(cache, [1, 2, 5])  # splits [1,2,3,4] into [1,2] -> [3,4]
    front = cache.root_node.children[1]
    assert front is not leaf and leaf.parent is front
    assert cache._tier_key(front) == before
    assert cache._tier_key(leaf) == hash((before, 3))
    # both tiers' policies track the split as the tree has it
    for view in (cache.device_view, cache.host_view):
        assert view.inner.index.nodes[leaf].parent is front and view.inner.index.nodes[leaf].size == 2


def test_a_chunked_prefills_own_chunks_are_neither_a_use_nor_a_hit_on_either_tier(monkeypatch):
    """Guards: the request's recorded insert counting the nodes its own chunks inserted as used, and as its hit,
    in both tiers' policies (the device-only tree's guard, on the host-tier class)."""
    prompt = list(range(1, 10))
    whole, chunked = host_cache(monkeypatch), host_cache(monkeypatch)
    ins(whole, prompt)
    ins(chunked, prompt[:3], chunked=True)
    ins(chunked, prompt[:6], chunked=True)
    ins(chunked, prompt)
    for view in ("device_view", "host_view"):
        learned = [getattr(c, view).inner for c in (whole, chunked)]
        assert [sum(p.hits) for p in learned] == [0, 0]
        assert [p.gate.traffic for p in learned] == [len(prompt)] * 2
    ins(chunked, prompt)  # the next request uses every chunk
    assert sum(chunked.device_view.inner.hits) == 3


def test_a_ttl_insert_retains_each_node_of_its_path_once_and_refreshes_nothing(monkeypatch):
    cache = host_cache(monkeypatch)
    r = cache.retention
    cache._request_ttl_s = 60.0
    ins(cache, [1, 2, 3])
    assert (r.retains, r.refreshes, r.retained_size) == (1, 0, 3)
    ins(cache, [1, 2, 3, 4])  # the old node and the new one: two retentions, no hit refresh
    assert (r.retains, r.refreshes, r.retained_size) == (3, 0, 4)
    ins(cache, [1, 2, 3, 4], chunked=True)  # a topology-only re-insert: every node is retained already
    assert (r.retains, r.refreshes) == (3, 0)


def test_retentions_belong_to_the_tenant_of_their_keys(monkeypatch):
    """The retention budget is shared fairly between tenants (tiers.retention): each retained node counts for
    its key's namespace, so a flood from one salt gives up its own retentions first."""
    cache = host_cache(monkeypatch)
    cache._request_ttl_s = 60.0
    for salt, toks in (("a", [1, 2, 3]), ("b", [4, 5]), (None, [6])):
        cache.insert(InsertParams(key=RadixKey(array("q", toks), cache_salt=salt), value=torch.arange(len(toks))))
    assert cache.retention._tenant_size == {"a": 3, "b": 2, None: 1}


def test_retention_work_counts_as_policy_cost(monkeypatch):
    """Session TTL bookkeeping is policy work, as the device-only tree counts it: each retention an insert
    starts is a device policy call, and so is each node a hit refreshes."""
    plain, ttl = host_cache(monkeypatch), host_cache(monkeypatch)
    ttl._request_ttl_s = 60.0
    for cache in (plain, ttl):
        ins(cache, [1, 2, 3])
        ins(cache, [1, 2, 3, 4])  # two nodes on its path, both retained again
    assert ttl.retention.retains == 3
    assert ttl.device_view.calls == plain.device_view.calls + 3
    before = ttl.device_view.calls
    ttl.match_prefix(MatchPrefixParams(key=RadixKey(array("q", [1, 2, 3, 4]))))  # refreshes both nodes
    assert ttl.retention.refreshes == 2 and ttl.device_view.calls == before + 2


def test_a_split_of_a_retained_node_keeps_the_retained_size_true(monkeypatch):
    cache = host_cache(monkeypatch)
    cache._request_ttl_s = 60.0
    ins(cache, [1, 2, 3])
    cache._request_ttl_s = None
    ins(cache, [1, 5])  # splits the retained [1,2,3]: [1] and [2,3], both retained (the front was not, before an
    # audit on 2026-12-07: the budget then counted the 2-token tail of a 3-token retained prefix)
    front = cache.root_node.children[1]
    back = front.children[2]
    assert cache.retention.is_retained(front) and cache.retention.is_retained(back)
    assert cache.retention.retained_size == len(front.key) + len(back.key) == 3


def test_the_stand_in_runs_sglangs_own_insert(monkeypatch):
    """The harness drives HiRadixCache.insert itself: its sizes add up as SGLang keeps them."""
    cache = host_cache(monkeypatch)
    ins(cache, [1, 2, 3, 4, 5, 6])
    ins(cache, [1, 2, 3, 9])
    assert cache.evictable_size_ + cache.protected_size_ == 7


# ---- the policy decides on each tier ----
def fill_host_with_demoted(cache, *prompts):
    """Insert `prompts` (backed up while the host has room), then push them off the device: host-only."""
    for p in prompts:
        ins(cache, p)
    finish_copies(cache)
    cache.evict(EvictParams(num_tokens=sum(len(p) for p in prompts)))
    assert all(n.evicted and n.backuped for n in tree_nodes(cache))


def test_host_admission_is_the_host_policys_decision(monkeypatch):
    """Neither the second-hit rule (SGLang's write_through_selective) nor a frequency sketch: a prompt seen once
    goes to the full host tier because the policy admits it, a prompt seen twice stays out because it does not."""
    ScriptedAdmission.asked = []
    cache = host_cache(monkeypatch, host_tokens=8, policy=f"{HERE}:ScriptedAdmission")
    fill_host_with_demoted(cache, [1, 2, 3, 4], [10, 11, 12, 13])
    oldest = cache.root_node.children[1]
    assert cache.cache_controller.mem_pool_host.available_size() == 0

    ins(cache, [20, 21, 22])  # seen once, odd size: admitted, at the cost of the host policy's first victim
    once = cache.root_node.children[20]
    assert once.backuped and once in cache.host_view
    candidate, victims = ScriptedAdmission.asked[-1]
    assert (candidate.size, victims) == (3, [oldest])
    assert oldest not in cache.host_view and 1 not in cache.root_node.children  # evicted from host memory

    finish_copies(cache)
    asked = len(ScriptedAdmission.asked)
    ins(cache, [30, 31, 32, 33])
    ins(cache, [30, 31, 32, 33])  # seen twice, even size: the policy refuses it both times
    twice = cache.root_node.children[30]
    assert not twice.backuped and twice not in cache.host_view
    assert len(ScriptedAdmission.asked) == asked + 2
    assert cache.tier_counters()["host"]["rejected"] == 2
    assert cache.tier_counters()["host"]["admitted"] == 3


def test_a_request_with_a_ttl_is_backed_up_whatever_the_policy_says(monkeypatch):
    ScriptedAdmission.asked = []
    cache = host_cache(monkeypatch, host_tokens=8, policy=f"{HERE}:ScriptedAdmission")
    fill_host_with_demoted(cache, [1, 2, 3, 4], [10, 11, 12, 13])
    cache._request_ttl_s = 60.0
    ins(cache, [30, 31, 32, 33])  # even size: the policy would refuse, the TTL backs it up
    assert cache.root_node.children[30].backuped
    assert ScriptedAdmission.asked == []


def test_device_eviction_follows_the_device_policys_victims(monkeypatch):
    """`lfu` from the tiers registry: the least used leaf goes first, though it is the most recent (SGLang's LRU
    heap would take the other)."""
    cache = host_cache(monkeypatch, policy="lfu")
    for _ in range(3):
        ins(cache, [1, 2, 3])
    ins(cache, [7, 8, 9])
    finish_copies(cache)
    assert cache.evict(EvictParams(num_tokens=3)).num_tokens_evicted == 3
    assert cache.root_node.children[7].evicted and not cache.root_node.children[1].evicted
    assert cache.root_node.children[7] not in cache.device_view and cache.root_node.children[7] in cache.host_view
    assert cache.tier_counters()["device"]["demotions"] == 1


def test_host_eviction_follows_the_host_policys_victims(monkeypatch):
    cache = host_cache(monkeypatch, host_tokens=6, policy="lfu")
    for _ in range(3):
        ins(cache, [1, 2, 3])
    ins(cache, [7, 8, 9])
    finish_copies(cache)
    cache.evict(EvictParams(num_tokens=6))  # both host-only now; [1,2,3] was used three times, [7,8,9] once
    cache.evict_host(3)
    assert 7 not in cache.root_node.children and 1 in cache.root_node.children
    assert cache.tier_counters()["host"]["evicted_tokens"] == 3


def test_a_victim_that_is_not_an_evictable_leaf_is_drift(monkeypatch):
    """A policy out of step with the tree is caught: strict mode raises (serving logs and uses SGLang's order)."""
    cache = host_cache(monkeypatch, policy="lru")
    ins(cache, [1, 2, 3])
    finish_copies(cache)
    stray = cache.root_node.children[1]
    cache.inc_lock_ref(stray)  # locked in the tree, but the policy is asked with an always-false predicate
    monkeypatch.setattr(cache.device_view, "victims", lambda size, protected: [stray])
    with pytest.raises(RuntimeError, match="not an evictable device leaf"):
        cache.evict(EvictParams(num_tokens=3))


def test_a_drifted_policy_in_serving_is_logged_and_sglangs_order_frees_the_rest(monkeypatch, caplog):
    cache = host_cache(monkeypatch, host_tokens=3, policy="lru", strict=False)
    ins(cache, [1, 2, 3])
    ins(cache, [7, 8, 9])  # the host is full: not backed up
    finish_copies(cache)
    monkeypatch.setattr(cache.device_view, "victims", lambda size, protected: [])  # a policy that forgot its nodes
    monkeypatch.setattr(cache.host_view, "victims", lambda size, protected: [])
    assert cache.evict(EvictParams(num_tokens=6)).num_tokens_evicted == 6
    cache.evict_host(3)
    assert cache.root_node.children == {} and cache.counters()["fallback_rounds"] == 2
    assert "SGLang's order frees the rest" in caplog.text


def test_a_flush_starts_both_policies_afresh_and_leaves_sglangs_attributes_alone(monkeypatch):
    cache = host_cache(monkeypatch)
    device = cache.device
    ins(cache, [1, 2, 3])
    cache.reset()
    assert cache.device is device  # SGLang's own `device` (the KV pools' torch device) is not ours to reuse
    assert cache.device_view.members == cache.host_view.members == set()
    ins(cache, [1, 2, 3])
    check_views(cache)


def test_the_stats_name_the_policy_on_each_tier(monkeypatch):
    cache = host_cache(monkeypatch, policy="lfu")
    assert cache.policy_label() == "lfu (device: lfu, host admission and eviction: lfu)"


# ---- invariants under random traffic ----
OPS = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.lists(st.integers(0, 3), min_size=1, max_size=6), st.booleans()),
    st.tuples(st.just("evict"), st.integers(1, 12), st.booleans()),
    st.tuples(st.just("evict_host"), st.integers(1, 12), st.booleans()),
    st.tuples(st.just("load_back"), st.integers(0, 50), st.booleans()),
    st.tuples(st.just("finish"), st.just(0), st.booleans()),
), max_size=40)


def check_views(cache):
    nodes = tree_nodes(cache)
    on_device = {n for n in nodes if not n.evicted}
    on_host = {n for n in nodes if n.backuped}
    assert cache.device_view.members == on_device == set(cache.device_view.inner.index.nodes)
    assert cache.host_view.members == on_host == set(cache.host_view.inner.index.nodes)
    for view, resident in ((cache.device_view, on_device), (cache.host_view, on_host)):
        for n in resident:  # the policy's tree is the tier's tree
            parent = view.inner.index.nodes[n].parent
            assert parent is (None if n.parent is cache.root_node else n.parent)
            assert view.inner.index.nodes[n].size == len(n.key)


@pytest.mark.parametrize("policy", ["tinylfu", "lfu"])
@settings(max_examples=40, deadline=None)
@given(ops=OPS)
def test_each_policys_view_is_the_set_of_nodes_resident_on_its_tier(policy, ops):
    with pytest.MonkeyPatch.context() as mp:
        cache = host_cache(mp, host_tokens=16, policy=policy)
        run_ops(cache, ops)


def run_ops(cache, ops):
    for op, arg, flag in ops:
        if op == "insert":
            cache._request_ttl_s = 60.0 if flag and len(arg) > 4 else None
            ins(cache, [10 + t for t in arg[:1]] + arg[1:])
            cache._request_ttl_s = None
        elif op == "evict":
            cache.evict(EvictParams(num_tokens=arg))
        elif op == "evict_host":
            cache.evict_host(arg)
        elif op == "load_back":
            evicted = [n for n in tree_nodes(cache) if n.evicted]
            if evicted:
                cache.load_back(evicted[arg % len(evicted)])
        if flag or op == "finish":
            finish_copies(cache)
        check_views(cache)
