"""The replay's host tier is the class the server runs with HiCache: SGLang's HiRadixCache (stock policies) or
our TieredHiRadixCache, on simulated pools (benchmarks.host_engine, sglang_ext.simulated_host)."""

from __future__ import annotations

import pytest

from benchmarks.host_engine import HostTierEngine, logical_tree_time
from benchmarks.lower_tiers import LowerTiers, TierSpec
from benchmarks.replay import ReplayConfig, replay
from benchmarks.trace import parse_rows
from tests.benchmarks.helpers import random_chain_trace
from tiers.clock import ManualClock
from tiers.policies.stock import LRUPolicy

BT = 16  # trace tokens per block: one block is over SGLang's load-back threshold (10 tokens)
HERE = __name__


def trace_of(*prompts, block_tokens=BT):
    """One row per prompt (a list of block ids), full blocks."""
    return parse_rows([{"timestamp": i, "input_length": block_tokens * len(p), "output_length": 1,
                        "hash_ids": list(p)} for i, p in enumerate(prompts)], block_tokens)


def serve(policy, trace, device_blocks, host_blocks):
    """Serve every request through a HostTierEngine: (engine, per request (device, host) hit blocks and the
    prompts held in host memory afterwards)."""
    with logical_tree_time():
        engine = HostTierEngine(policy, device_blocks, host_blocks, ManualClock(), trace.block_tokens)
        hits, on_host = [], []
        for req in trace.requests:
            access = engine.access(req)
            hits.append((access.hit_blocks, engine.last_host_blocks))
            on_host.append(backed_up(engine.cache))
    return engine, hits, on_host


def backed_up(cache):
    """The keys (block ids, one radix token per block) of the tree's nodes with a host copy."""
    return {tuple(n.key.token_ids) for n in all_nodes(cache) if n.backuped}


class ScriptedAdmission(LRUPolicy):
    """LRU whose host admission takes only candidates of odd size (LRU's admits every one), and remembers what
    it was asked."""

    asked = []

    def admit(self, candidate, victims) -> bool:
        ScriptedAdmission.asked.append(candidate.size)
        return candidate.size % 2 == 1


# [1,2] and [3] fill the 3-block host; then the host policy decides: [5,6] and [8,9] are even, [7] odd
PROMPTS = ([1, 2], [3], [5, 6], [7], [8, 9], [5, 6], [7])


# ---- the host tier is the server's class ----
def test_host_admission_in_the_replay_is_the_policys_decision_in_tiered_hiradix_cache():
    """Each prompt the full host tier is offered goes where the policy says: [5,6] is refused (so it is
    recomputed when it comes back), [7] admitted (so it is loaded back from host memory). The counters are
    TieredHiRadixCache's."""
    ScriptedAdmission.asked = []
    trace = trace_of(*PROMPTS)
    block = {p: tuple(r.blocks) for p, r in zip(("12", "3", "56", "7", "89", "56b", "7b"), trace.requests)}
    engine, hits, on_host = serve(f"{HERE}:ScriptedAdmission", trace, device_blocks=3, host_blocks=3)
    assert engine.name == "TieredHiRadixCache"
    assert ScriptedAdmission.asked == [2, 1, 2, 2]  # [5,6], [7], [8,9], [5,6]: every offer to a full host
    assert block["56"] not in on_host[2] and block["7"] in on_host[3] and block["89"] not in on_host[4]
    assert hits[5] == (0, 0) and hits[6] == (0, 1)
    host = engine.cache.tier_counters()["host"]
    assert (host["admitted"], host["rejected"], host["hit_tokens"]) == (3, 3, 1)


def test_under_lru_admission_the_same_prompts_enter_host_memory():
    """The control: under the registry's LRU, whose admission takes every candidate, [5,6] and [8,9] are backed
    up, so what the test above refused was the scripted policy's decision, not the engine's."""
    trace = trace_of(*PROMPTS)
    engine, hits, on_host = serve("tiered-lru", trace, device_blocks=3, host_blocks=3)
    assert engine.name == "TieredHiRadixCache"
    assert tuple(trace.requests[2].blocks) in on_host[2] and tuple(trace.requests[4].blocks) in on_host[4]
    assert engine.cache.tier_counters()["host"]["rejected"] == 0


def test_the_host_tier_is_inclusive_write_through_not_a_victim_cache():
    """Where the old model differs: HiCache backs a prompt up when it is inserted, so host memory holds what the
    device holds too, and four one-block prompts through a 2-block device and a 2-block host leave only the last
    two anywhere. The victim-cache model (lower_tiers.py: the host gets only device evictions) would hold all
    four, and find the first again."""
    trace = trace_of([1], [2], [3], [4], [1])
    for policy in ("lru", "tinylfu"):
        _, hits, _ = serve(policy, trace, device_blocks=2, host_blocks=2)
        assert hits[-1] == (0, 0), policy
        r = replay(trace, ReplayConfig(policy=policy, capacity_tokens=2 * BT, host_tokens=2 * BT))
        assert r.hit_tokens_by_tier == {"device": 0, "host": 0}, policy
    victim = LowerTiers([TierSpec("host", 2)], block_tokens=BT)
    victim.demote([trace.requests[0].blocks[0], trace.requests[1].blocks[0]])  # what a 2-block device evicted
    assert victim.lookup(trace.requests[4].blocks, 0, [BT]) == {"host": 1}


def test_the_stock_path_is_sglangs_hiradix_cache_and_finds_host_hits():
    from sglang.srt.mem_cache.hiradix_cache import HiRadixCache

    from sglang_ext.tiered_hicache import TieredHiRadixCache

    trace = trace_of([1], [2], [3], [4], [1])
    engine, hits, _ = serve("lru", trace, device_blocks=2, host_blocks=4)
    assert isinstance(engine.cache, HiRadixCache) and not isinstance(engine.cache, TieredHiRadixCache)
    assert engine.cache.eviction_policy == "lru"
    assert hits == [(0, 0)] * 4 + [(0, 1)]  # [1] left the device for host memory and was loaded back
    assert engine.device_pool.used <= 2 and engine.controller.mem_pool_host.used <= 4


@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_the_pools_hold_what_the_tree_holds_and_every_lock_is_released(policy):
    """After each request (its copies acknowledged): the device pool's tokens are the tree's device tokens, the
    host pool's its host copies, within capacity, and no lock is left (SGLang's acks released them)."""
    trace = random_chain_trace(7, 120, block_tokens=BT)
    with logical_tree_time():
        engine = HostTierEngine(policy, 12, 20, ManualClock(), BT)
        for req in trace.requests:
            engine.access(req)
            cache, nodes = engine.cache, all_nodes(engine.cache)
            assert engine.device_pool.used == sum(len(n.value) for n in nodes if not n.evicted) <= 12
            assert engine.controller.mem_pool_host.used == sum(len(n.host_value) for n in nodes if n.backuped) <= 20
            assert cache.protected_size_ == 0 and not cache.ongoing_write_through and not cache.ongoing_load_back


def all_nodes(cache):
    stack, out = list(cache.root_node.children.values()), []
    while stack:
        out.append(stack.pop())
        stack.extend(out[-1].children.values())
    return out


# ---- through the replay ----
def working_set_blocks(trace):
    return len({b for r in trace.requests for b in r.blocks})


@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_a_host_tier_adds_hits_when_the_working_set_overflows_the_device(policy):
    trace = random_chain_trace(5, 200, block_tokens=BT)
    ws = working_set_blocks(trace)
    device = (ws // 4) * BT
    host = ws * BT  # holds the working set (it is inclusive of the device)
    without = replay(trace, ReplayConfig(policy=policy, capacity_tokens=device))
    with_host = replay(trace, ReplayConfig(policy=policy, capacity_tokens=device, host_tokens=host))
    assert with_host.config["host_tier"] == ("HiRadixCache" if policy == "lru" else "TieredHiRadixCache")
    assert with_host.hit_tokens_by_tier["host"] > 0
    assert with_host.token_hit_rate >= without.token_hit_rate
    assert with_host.token_hit_rate == pytest.approx(sum(with_host.hit_rate_by_tier.values()))
    load = with_host.bytes_moved_by_tier["host"]["load"]
    assert load == with_host.hit_tokens_by_tier["host"] * with_host.kv_bytes_per_token


def test_the_replay_reports_the_host_policys_refusals():
    trace = trace_of(*PROMPTS)
    r = replay(trace, ReplayConfig(policy=f"{HERE}:ScriptedAdmission", capacity_tokens=3 * BT, host_tokens=3 * BT))
    assert r.admissions_rejected == 3
    assert r.hit_tokens_by_tier == {"device": 0, "host": BT}  # [7], loaded back


def test_host_evictions_feed_the_peer_tier():
    trace = trace_of([1], [2], [3], [4], [1])
    r = replay(trace, ReplayConfig(policy="lru", capacity_tokens=2 * BT, host_tokens=2 * BT, peer_tokens=10 * BT))
    assert r.hit_tokens_by_tier == {"device": 0, "host": 0, "peer": BT}  # [1] left the host for the peer tier
    assert r.bytes_moved_by_tier["peer"]["store"] > 0


def test_device_lru_order_is_the_order_of_the_requests():
    """[2] was used before [3] was inserted, so [4] pushes [2] off the device and [3] is still there. Guards the
    clock: HiRadixCache stamps accesses from its own module's `time` and RadixCache stamps new nodes from
    another; with two clocks a new node looks older than every node used since the replay started."""
    trace = trace_of([1], [2], [2], [3], [4], [3])
    _, hits, _ = serve("lru", trace, device_blocks=2, host_blocks=8)
    assert hits[2] == (1, 0) and hits[5] == (1, 0)


def test_sglangs_load_back_threshold_counts_trace_tokens():
    """HiRadixCache loads a host prefix back only from 10 tokens on: with 8-token blocks, one block on the host is
    recomputed and two are loaded."""
    one = trace_of([1], [2], [3], [1], block_tokens=8)
    two = trace_of([1, 2], [3, 4], [1, 2], block_tokens=8)
    assert serve("lru", one, device_blocks=2, host_blocks=8)[1][-1] == (0, 0)
    assert serve("lru", two, device_blocks=2, host_blocks=8)[1][-1] == (0, 2)


# ---- the live replay's twin: a server that prefills long prompts in chunks ----
@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_a_chunked_prefill_keeps_the_device_pool_and_the_tree_in_step(policy):
    """Guards the twin's chunks: a long prompt's chunks are the request's own KV, inserted before it finishes; its
    final insert finds them cached and must not free them (SGLang moves `cache_protected_len` past each chunk).
    Freed as if computed twice, the pool would count fewer tokens in use than the tree holds on the device."""
    prompts = (list(range(1, 11)), list(range(1, 6)) + list(range(20, 25)), list(range(30, 42)), list(range(1, 11)))
    with logical_tree_time():
        engine = HostTierEngine(policy, 25, 50, ManualClock(), BT, radix_tokens_per_block=4, output_tokens=1,
                                prefill_chunk=8)  # 100-token device pool, 2-block chunks
        for req in trace_of(*prompts).requests:
            engine.access(req)
            on_device = sum(len(n.key) for n in all_nodes(engine.cache) if not n.evicted)
            assert engine.device_pool.used == on_device
    assert engine.device_pool.freed_tokens > 0  # the pool was full: eviction freed tokens on the way


def test_a_request_allocates_its_prompt_then_its_output_each_evicting_its_own_shortfall():
    """Guards: the twin making room for prompt and output in one round. The scheduler allocates the prompt's KV
    at prefill and the generated token's after it, each evicting only what is still missing, and two rounds do
    not always take the victims one round takes for the sum (the device-only twin's test in test_live_replay)."""
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang_ext.simulated_host import serve_request, simulated_hicache
    from sglang_ext.tiered_hicache import TieredHiRadixCache

    cache = simulated_hicache(TieredHiRadixCache, 44, 88, strict=True)
    asked = []
    evict = cache.evict
    cache.evict = lambda params: (asked.append(params.num_tokens), evict(params))[1]

    def request(first: int, prompt_tokens: int):
        ids = list(range(first, first + prompt_tokens + 1))  # the prompt and the one token generated

        def finish(prefix: int) -> None:
            cache.insert(InsertParams(key=RadixKey(ids), value=torch.arange(len(ids))))

        serve_request(cache, RadixKey(ids[:-1]), len(ids), finish, output_tokens=1)

    for i in range(4):  # four leaves of 11 tokens fill the 44-token pool
        request(1000 * (i + 1), 10)
    assert asked == []
    request(9000, 11)  # 11 for the prompt (one whole leaf), then 1 for the output (another); not 12 at once
    assert asked == [11, 1]


def test_a_chunked_prefill_allocates_and_caches_each_chunk_before_the_next():
    """Guards: the host-tier twin allocating a chunked prompt at once. The server allocates a chunk, prefills it
    and caches it (cache_unfinished_req(chunked=True), its last node locked) before the next chunk's allocation:
    live, the synthetic slice evicted 4,036 tokens (a 4,096-token chunk, 60 free) where the twin evicted 4,164."""
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang_ext.simulated_host import serve_request, simulated_hicache
    from sglang_ext.tiered_hicache import TieredHiRadixCache

    cache = simulated_hicache(TieredHiRadixCache, 44, 88, strict=True)
    asked, chunks = [], []
    evict = cache.evict
    cache.evict = lambda params: (asked.append(params.num_tokens), evict(params))[1]

    def request(ids, chunk_ends=lambda prefix: ()):
        def insert(end, protected):
            chunks.append(end)
            cache.insert(InsertParams(key=RadixKey(ids[:end]), value=torch.arange(end), chunked=True))

        def finish(protected):
            cache.insert(InsertParams(key=RadixKey(ids), value=torch.arange(len(ids))))

        serve_request(cache, RadixKey(ids[:-1]), len(ids), finish, output_tokens=1, chunk_ends=chunk_ends,
                      insert_chunk=insert)

    for i in range(4):  # four leaves of 11 tokens fill the 44-token pool
        request(list(range(1000 * (i + 1), 1000 * (i + 1) + 11)))
    request(list(range(9000, 9023)), chunk_ends=lambda prefix: [prefix + 11])  # 22 prompt tokens, then 1 output
    assert chunks == [11]
    assert asked == [11, 11, 1]  # the chunk, the rest of the prompt, the output: a leaf each (at once: 22, then 1)
