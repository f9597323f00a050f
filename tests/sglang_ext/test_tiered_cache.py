"""TieredRadixCache keeps every RadixCache invariant while a tiers policy chooses victims and admission."""

from array import array

import pytest
import torch
from hypothesis import given, settings, strategies as st

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang_ext.tiered_cache import TieredRadixCache, TierStats
from tiers.clock import ManualClock
from tiers.policy import policy_names

ALL = policy_names()


class CountingAlloc:
    """Mock KV allocator: records what the tree frees."""

    device = "cpu"

    def __init__(self, size):
        self.size = size
        self.freed = 0

    def free_segment(self, values, start_pos=0):
        self.freed += len(values)


def key(toks):
    return RadixKey(array("q", toks))


def ins(c, toks, **kw):
    return c.insert(InsertParams(key=key(toks), value=torch.arange(len(toks), dtype=torch.int64)), **kw)


def hit(c, toks):
    return len(c.match_prefix(MatchPrefixParams(key=key(toks))).device_indices)


def check_invariants(c):
    """Recount evictable/protected sizes and evictable leaves from the tree itself."""
    evictable = protected = 0
    leaves = set()
    stack = [c.root_node]
    tracked = 0
    while stack:
        n = stack.pop()
        for ch in n.children.values():
            assert ch.parent is n
            stack.append(ch)
        if n is c.root_node:
            continue
        tracked += 1
        if n.lock_ref > 0:
            protected += len(n.key)
            # a locked node's ancestors are locked too
            assert n.parent is c.root_node or n.parent.lock_ref > 0
        else:
            evictable += len(n.key)
            if not n.children:
                leaves.add(n)
    assert c.evictable_size_ == evictable
    assert c.protected_size_ == protected
    assert c.evictable_leaves == leaves
    assert len(c.policy.inner) == tracked  # the policy tracks exactly the tree's nodes
    assert evictable + protected <= c.capacity_tokens or protected > c.capacity_tokens


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=25, deadline=None)
@given(st.data())
def test_random_operations_keep_invariants(name, data):
    """Guards: evictable_size_/protected_size_/evictable_leaves/lock_ref drifting under the policy."""
    c = TieredRadixCache.create_simulated(policy=name, capacity_tokens=40, clock=ManualClock())
    locks = []
    seqs = st.lists(st.integers(0, 3), min_size=1, max_size=14)
    for _ in range(data.draw(st.integers(1, 40))):
        op = data.draw(st.integers(0, 4))
        if op <= 1:
            ins(c, data.draw(seqs))
        elif op == 2:
            m = c.match_prefix(MatchPrefixParams(key=key(data.draw(seqs))))
            if data.draw(st.booleans()) and m.last_device_node is not c.root_node:
                c.inc_lock_ref(m.last_device_node)
                locks.append(m.last_device_node)
        elif op == 3 and locks:
            c.dec_lock_ref(locks.pop(data.draw(st.integers(0, len(locks) - 1))))
        else:
            c.evict(EvictParams(num_tokens=data.draw(st.integers(1, 20))))
        check_invariants(c)
    for n in locks:
        c.dec_lock_ref(n)
    c.evict(EvictParams(num_tokens=10**6))
    check_invariants(c)
    assert c.evictable_size_ == 0


@pytest.mark.parametrize("name", ALL)
def test_capacity_is_kept_and_locked_nodes_survive(name):
    c = TieredRadixCache.create_simulated(policy=name, capacity_tokens=10, clock=ManualClock())
    ins(c, [1, 2, 3, 4])
    m = c.match_prefix(MatchPrefixParams(key=key([1, 2, 3, 4])))
    c.inc_lock_ref(m.last_device_node)
    for i in range(20):
        ins(c, [100 + i, 7, 7])
        assert c.evictable_size_ + c.protected_size_ <= 10
    assert hit(c, [1, 2, 3, 4]) == 4
    check_invariants(c)


def test_declined_insert_adds_nothing():
    """Guards: a declined remainder must not enter the tree, and prefix_len=len(key) lets SGLang free it."""
    c = TieredRadixCache.create_simulated(policy="tinylfu", capacity_tokens=10, clock=ManualClock())
    hot = [1, 2, 3]
    for _ in range(6):
        hit(c, hot)
        ins(c, hot)
    # one-shot suffixes of one class: evicted, never back, so the class learns it is not worth a hot victim
    declined = None
    for i in range(30):
        toks = [100 + i, 7, 7, 7]
        before, evicted_before = c.total_size(), c.tier_stats().evicted_tokens
        r = ins(c, toks)
        if c.tier_stats().admissions_rejected:
            # the request's own KV made room first (the server's allocator does so before the request runs)
            declined = (toks, r, before - (c.tier_stats().evicted_tokens - evicted_before))
            break
        hit(c, hot)
        ins(c, hot)
    assert declined is not None, "the one-shot class never lost the admission contest"
    toks, r, before = declined
    s = c.tier_stats()
    assert isinstance(s, TierStats)
    assert s.admissions_rejected == 1
    assert r.prefix_len == 4
    assert c.total_size() == before
    assert hit(c, toks) == 0
    assert hit(c, hot) == 3  # the hot prefix was never displaced by the one-shot
    check_invariants(c)


def test_a_may_admit_decline_skips_the_victim_query_and_adds_nothing():
    """Guards: a tier that asks for victims before the policy's victim-free verdict (the reuse gate), which
    made a declined insert cost a full victim query, and one that inserts what may_admit declined."""
    c = TieredRadixCache.create_simulated(policy="reuse-gate", capacity_tokens=8, clock=ManualClock())
    gate = c.policy.inner
    queries = []
    real_victims = gate.victims
    gate.victims = lambda *a, **k: queries.append(1) or real_victims(*a, **k)
    for toks in ([1, 1], [2, 2], [3]):  # 5 of 8 tokens: the next 3-token remainder fits, leaving nothing free
        ins(c, toks)
    gate.gate.threshold = 1.0  # no class reaches it: every remainder is declined before any victim query
    before = c.total_size()
    r = ins(c, [9, 9, 9])
    assert not queries
    assert c.tier_stats().admissions_rejected == 1
    assert r.prefix_len == 3 and c.total_size() == before and hit(c, [9, 9, 9]) == 0
    gate.gate.threshold = 0.0  # every class passes: the tier asks for victims and admits
    ins(c, [9, 9, 9])
    assert queries and hit(c, [9, 9, 9]) == 3
    check_invariants(c)


def test_a_chunk_of_a_chunked_prefill_enters_undecided_and_the_rest_is_decided():
    """Guards: the simulated tree deciding each chunk of a chunked prefill, which the server never does
    (`cache_unfinished_req(chunked=True)` inserts it without a decision): a long prompt's live and offline
    trees then differed by whole chunks (the live replay's twin disagreed with the server by 0.047)."""
    c = TieredRadixCache.create_simulated(policy="reuse-gate", capacity_tokens=8, clock=ManualClock())
    for toks in ([1, 1], [2, 2], [3]):  # 5 of 8 tokens: any remainder of 3 or more is under pressure
        ins(c, toks)
    c.policy.inner.gate.threshold = 1.0  # every decided remainder is declined
    prompt = [9, 8, 7, 6, 5]
    c.insert(InsertParams(key=key(prompt[:3]), value=torch.arange(3, dtype=torch.int64), chunked=True))
    assert c.tier_stats().admissions_rejected == 0 and hit(c, prompt) == 3  # the chunk is in, undecided
    ins(c, prompt)  # the request's own insert: its remainder beyond the chunk is decided
    assert c.tier_stats().admissions_rejected == 1 and hit(c, prompt) == 3
    check_invariants(c)


def learned_state(c):
    """What tinylfu learned from the requests so far: reuse per class, events per class, traffic (misses)."""
    inner = c.policy.inner
    return list(inner.hits), list(inner.events), inner.gate.traffic


def test_a_chunked_prefills_own_chunks_are_neither_a_use_nor_a_hit():
    """Guards: the request's recorded insert counting the nodes its own chunks inserted moments before as used
    and as its hit: every long prompt looked reused at once, and the learned order kept one-shot prompts (the
    conversation trace at 1e6 with 2,048-token chunks: 0.078 against 0.086 unchunked)."""
    prompt = list(range(1, 10))
    whole, chunked = (TieredRadixCache.create_simulated(policy="tinylfu", capacity_tokens=100, clock=ManualClock())
                      for _ in range(2))
    ins(whole, prompt)
    for end in (3, 6):
        chunked.insert(InsertParams(key=key(prompt[:end]), value=torch.arange(end, dtype=torch.int64), chunked=True))
    ins(chunked, prompt)
    hits, events, traffic = learned_state(chunked)
    assert sum(hits) == sum(learned_state(whole)[0]) == 0
    assert traffic == learned_state(whole)[2] == len(prompt)
    ins(chunked, prompt)  # the next request is a hit on every chunk: the marks went with the first request
    assert sum(learned_state(chunked)[0]) == 3
    check_invariants(chunked)


@pytest.mark.parametrize("name", ["tinylfu", "reuse-gate"])
def test_a_session_ttl_request_passes_the_learned_bar(name):
    """Guards: a gate that declines what a client asked to retain (cache_control TTL): the session's next
    turn would then find nothing, whatever its class's estimate says."""
    c = TieredRadixCache.create_simulated(policy=name, capacity_tokens=8, clock=ManualClock())
    for toks in ([1, 1], [2, 2], [3, 3], [4, 4]):
        ins(c, toks)
    c.policy.inner.gate.threshold = 1.0  # no class reaches it
    ins(c, [9, 9, 9])
    assert c.tier_stats().admissions_rejected == 1 and hit(c, [9, 9, 9]) == 0
    ins(c, [10, 10, 10], ttl_s=60)
    assert c.tier_stats().admissions_rejected == 1
    assert hit(c, [10, 10, 10]) == 3
    check_invariants(c)


def test_evict_frees_values_through_allocator():
    alloc = CountingAlloc(100)
    c = TieredRadixCache.create_simulated(policy="lru", capacity_tokens=100, mock_allocator=alloc)
    ins(c, [1, 2, 3])
    ins(c, [1, 2, 4, 5])
    r = c.evict(EvictParams(num_tokens=100))
    assert r.num_tokens_evicted == 5 == alloc.freed
    assert c.total_size() == 0
    assert c.tier_stats().evictions == 3  # [1,2] split from [3] and [4,5]


def test_server_constructor_takes_allocator_size():
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=CountingAlloc(77), page_size=1)
    c = TieredRadixCache(params, policy="lru")
    assert c.capacity_tokens == 77
    with pytest.raises(ValueError, match="unknown policy"):
        TieredRadixCache(params, policy="nope")


def test_retained_prefix_outlives_unretained_until_ttl():
    """Guards: session TTL retention must be soft but effective, and end exactly at expiry."""
    clock = ManualClock()
    c = TieredRadixCache.create_simulated(policy="lru", capacity_tokens=8, clock=clock)
    ins(c, [1, 2, 3, 4], ttl_s=60)
    ins(c, [5, 6, 7, 8])
    ins(c, [9, 9, 9, 9])  # needs room: the unretained [5..8] goes although [1..4] is older
    assert hit(c, [1, 2, 3, 4]) == 4 and hit(c, [5, 6, 7, 8]) == 0
    clock.set(60)
    ins(c, [7, 7, 7, 7])
    assert hit(c, [1, 2, 3, 4]) == 0


@pytest.mark.parametrize("name", ["lru", "tinylfu"])
def test_one_tenants_ttl_flood_cannot_evict_another_tenants_retained_prefix(name):
    """Issue 14, item 4: tenants are the keys' namespaces (cache_salt). Tenant B retains a prefix well within
    its share of the retention budget; tenant A then floods the tree with distinct TTL'd prompts. B's prefix
    stays retained and cached; with the budget released oldest-first across tenants it went in the flood."""
    clock = ManualClock()
    c = TieredRadixCache.create_simulated(policy=name, capacity_tokens=1000, clock=clock, retention_budget=0.5)

    def salted(toks, salt):
        return RadixKey(array("q", toks), cache_salt=salt)

    b_prefix = list(range(5000, 5150))
    c.insert(InsertParams(key=salted(b_prefix, "b"), value=torch.arange(150)), ttl_s=300)
    for i in range(40):
        clock.advance(1)
        flood = [10_000 + 100 * i + j for j in range(100)]
        c.insert(InsertParams(key=salted(flood, "a"), value=torch.arange(100)), ttl_s=300)
        check_invariants(c)
    assert c.tier_stats().evictions > 0 and c.retention.released_over_budget > 0
    b_node = c.match_prefix(MatchPrefixParams(key=salted(b_prefix, "b"))).last_device_node
    assert c.retention.is_retained(b_node)
    assert len(c.match_prefix(MatchPrefixParams(key=salted(b_prefix, "b"))).device_indices) == 150


def finish(c, prompt, output):
    """What SGLang's cache_finished_req does: insert prompt + output, then re-insert the prompt alone (a
    topology-only insert, `chunked=True`), which splits the new leaf at the prompt boundary."""
    ins(c, prompt + output)
    c.insert(InsertParams(key=key(prompt), value=torch.arange(len(prompt), dtype=torch.int64), chunked=True))


@pytest.mark.parametrize("name", ["tinylfu", "reuse-gate"])
def test_one_shot_prompts_are_declined_when_finished_the_way_sglang_finishes_them(name):
    """Guards: the gate losing a new suffix's event when SGLang splits the leaf at the prompt boundary right
    after inserting it (the split's front kept the key, and its report withdrew the event). The gate then never
    saw a suffix go unreused, its classes kept their prior, and the live server declined nothing."""
    c = TieredRadixCache.create_simulated(policy=name, capacity_tokens=64, clock=ManualClock())
    for i in range(200):  # distinct 8-token prompts, each with one output token, never asked again
        finish(c, [1000 + 10 * i + j for j in range(8)], [5])
    assert c.tier_stats().admissions_rejected > 0
    check_invariants(c)


@pytest.mark.parametrize("matched_between", [False, True])
def test_kv_a_decline_just_freed_is_no_slack_for_the_next_request_to_finish(matched_between):
    """Guards: with requests finishing together (others started beside them), a declined remainder's freed
    KV made every later one look uncontended, so it came in unweighed: the live server and the replay at 16 in
    flight declined 2.4x fewer one-shot suffixes (conversation, 0.0651 against 0.0710 one at a time). Once a
    new request is matched (the scheduler gives it KV next), the freed space is free again."""
    c = TieredRadixCache.create_simulated(policy="reuse-gate", capacity_tokens=12, clock=ManualClock())
    for toks in ([1, 1], [2, 2], [3]):
        ins(c, toks)
    held = [c.reserve(key(toks)) for toks in ([9, 9, 9], [8, 8, 8])]  # two requests start: 11 of 12 used
    assert held == [3, 3]
    c.policy.inner.gate.threshold = 1.0  # no class passes: a remainder weighed under pressure is declined
    c.release(held[0])
    ins(c, [9, 9, 9])  # 1 token free: declined, its 3 freed
    assert c.tier_stats().admissions_rejected == 1
    if matched_between:
        hit(c, [7])
    c.release(held[1])
    ins(c, [8, 8, 8])  # 4 free, 3 of them just freed by the decline
    assert c.tier_stats().admissions_rejected == (1 if matched_between else 2)
    assert hit(c, [8, 8, 8]) == (3 if matched_between else 0)
    check_invariants(c)
