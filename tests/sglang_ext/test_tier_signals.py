"""The operator signals fed by a served tree cache (in process, SGLang's own tree and event recorder)."""

import math
from array import array

import torch

from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang_ext.serving_cache import ServingTieredCache
from sglang_ext.tier_signals import GHOST_BLOCKS, SignalingRecorder, ghost_keys, pool_fragmentation
from tiers.clock import ManualClock
from tiers.signals import free_runs


def prompt(seed, n=40, salt=None):
    return RadixKey(array("q", [seed * 1000 + i for i in range(n)]), cache_salt=salt)


def insert(cache, key):
    cache.insert(InsertParams(key=key, value=torch.arange(len(key), dtype=torch.int64)))


def lookup(cache, key):
    return len(cache.match_prefix(MatchPrefixParams(key=key)).device_indices)


def device(cache):
    return cache.tier_stats_dict()["tiers"]["device"]


def test_repeat_after_eviction_is_a_capacity_miss_and_a_new_prefix_a_cold_miss():
    clock = ManualClock()
    cache = ServingTieredCache.create_simulated(policy="lru", capacity_tokens=100, clock=clock)
    for seed in (1, 2, 3):  # 120 tokens in a 100-token tier: prompt 1 is evicted
        insert(cache, prompt(seed))
        clock.advance(1)
    assert lookup(cache, prompt(1)) == 0
    before = device(cache)
    assert (before["cold_miss_tokens"], before["capacity_miss_tokens"]) == (120, 0)
    assert before["evicted_entries"] == 1 and before["eviction_tokens_per_s"] > 0
    insert(cache, prompt(1))
    mid = device(cache)
    assert mid["capacity_miss_tokens"] == 40 and mid["cold_miss_tokens"] == 120
    insert(cache, prompt(4))
    after = device(cache)
    assert after["cold_miss_tokens"] == 160 and after["capacity_miss_tokens"] == 40


def test_another_tenants_evicted_prompt_is_no_capacity_miss_of_this_one():
    """The miss breakdown is per namespace: tenant B's store of tokens tenant A had evicted is B's cold miss (its
    counters must not tell B what A sent), and it leaves A's ghost for A."""
    clock = ManualClock()
    cache = ServingTieredCache.create_simulated(policy="lru", capacity_tokens=100, clock=clock)
    for seed in (1, 2, 3):  # tenant a's prompt 1 is evicted
        insert(cache, prompt(seed, salt="a"))
        clock.advance(1)
    insert(cache, prompt(1, salt="b"))
    assert (device(cache)["cold_miss_tokens"], device(cache)["capacity_miss_tokens"]) == (160, 0)
    insert(cache, prompt(1, salt="a"))
    assert device(cache)["capacity_miss_tokens"] == 40


def test_a_flood_thrashes_and_evicted_entries_were_never_hit():
    clock = ManualClock()
    cache = ServingTieredCache.create_simulated(policy="lru", capacity_tokens=200, clock=clock)
    for seed in range(100):  # 4000 distinct tokens through a 200-token tier, one prompt per 0.5 s
        insert(cache, prompt(seed))
        clock.advance(0.5)
    stats = device(cache)
    assert stats["thrashing"] is True
    assert stats["eviction_tokens_per_s"] > 0.9 * stats["store_tokens_per_s"] > 0
    assert stats["evicted_never_hit_share"] == 1.0
    assert stats["evicted_lifetime_tokens"] == 200  # LRU, no hits: an entry lives one capacity of traffic


def test_a_scheduling_hit_marks_the_entry_and_the_cache_stays_quiet_when_it_fits():
    clock = ManualClock()
    cache = ServingTieredCache.create_simulated(policy="lru", capacity_tokens=200, clock=clock)
    for _ in range(10):
        for seed in (1, 2):
            if lookup(cache, prompt(seed)) == 0:
                insert(cache, prompt(seed))
            clock.advance(0.5)
    stats = device(cache)
    assert stats["thrashing"] is False and stats["eviction_tokens_per_s"] == 0
    for seed in range(3, 8):  # 280 tokens in 200: evicts 1, then 2, both hit before
        insert(cache, prompt(seed))
    stats = device(cache)
    assert stats["evicted_entries"] == 2 and stats["evicted_never_hit"] == 0


def test_pool_fragmentation_counts_runs_of_free_pages():
    class Allocator:
        page_size = 4

        def __init__(self, pages):
            self.pages = torch.tensor(pages, dtype=torch.int64)

        def get_all_free_pages(self):
            return self.pages

    pages = [9, 1, 2, 3, 7, 8, 12]
    f = pool_fragmentation(Allocator(pages))
    assert (f.free_pages, f.free_runs, f.largest_free_run_pages, f.page_size) == (7, 3, 3, 4)
    assert (f.free_runs, f.largest_free_run_pages) == free_runs(sorted(pages))
    assert pool_fragmentation(Allocator([])).free_runs == 0


class Node:
    def __init__(self, tokens, parent=None):
        self.key, self.parent = RadixKey(array("q", tokens)), parent


def test_a_prefix_stored_again_from_a_later_split_point_is_recognised():
    """HiRadixCache keeps an evicted prefix's node in the tree while it waits in the host tier, and a later
    prompt can split it: the prefix comes back as a node that starts one token later."""
    root = Node([])
    evicted = ghost_keys(Node(list(range(400)), root), GHOST_BLOCKS)
    bos = Node([0], root)
    assert ghost_keys(Node(list(range(1, 400)), bos), 1)[0] in evicted
    assert ghost_keys(Node(list(range(400)), root), 1)[0] in evicted  # the same node again
    assert ghost_keys(Node([0] + list(range(1000, 1399)), root), 1)[0] not in evicted  # same first token only
    assert ghost_keys(Node(list(range(1, 400)), root), 1)[0] not in evicted  # same tokens at another depth
    short = ghost_keys(Node([7, 8, 9], bos), GHOST_BLOCKS)
    assert ghost_keys(Node([7, 8, 9], bos), 1)[0] in short  # no aligned block: keyed by its start


def test_a_failing_signal_hook_never_reaches_sglangs_tree_code():
    class Inner:
        enabled = False

        def __init__(self):
            self.calls = []

        def record_store(self, node, medium=None, **kwargs):
            self.calls.append(("store", node))

        def record_remove(self, node, medium=None):
            self.calls.append(("remove", node))

    class Broken:
        def stored(self, node, medium):
            raise RuntimeError("a bug in the signals")

        removed = stored

    inner = Inner()
    recorder = SignalingRecorder(inner, Broken())
    recorder.record_store("n1")
    recorder.record_remove("n2")
    assert inner.calls == [("store", "n1"), ("remove", "n2")]  # SGLang's own recorder still got both
    assert recorder.enabled is False  # everything else is SGLang's recorder's


def _series(name: str) -> dict:
    """label set -> value of one gauge family in this process's Prometheus registry."""
    from prometheus_client import REGISTRY

    return {tuple(sorted(s.labels.items())): s.value for m in REGISTRY.collect() for s in m.samples if s.name == name}


def test_the_self_tuners_state_is_exported_and_a_dropped_setting_keeps_no_stale_value():
    from types import SimpleNamespace

    from sglang_ext.tier_signals import ServingSignals
    from tiers.shadow import TuningStats

    signals = ServingSignals(["device"], clock=ManualClock(0.0))
    three = TuningStats(live="gated", sample_rate=0.25, sampled_requests=90, switches=2,
                        shadow_hit_rates={"lru-no-ttl": 0.31, "gated": 0.36, "gated-no-ttl": 0.34},
                        live_tree_hit_rate=0.41)
    signals.export_gauges(0, SimpleNamespace(stats=lambda: three), force=True)
    assert _series("sglang_ext_tuner_live") == {
        (("setting", "lru-no-ttl"),): 0.0, (("setting", "gated"),): 1.0, (("setting", "gated-no-ttl"),): 0.0}
    assert _series("sglang_ext_tuner_shadow_hit_rate")[(("setting", "gated"),)] == 0.36
    assert (_series("sglang_ext_tuner_switches"), _series("sglang_ext_tuner_live_tree_hit_rate"),
            _series("sglang_ext_tuner_sample_rate")) == ({(): 2.0}, {(): 0.41}, {(): 0.25})
    two = TuningStats(live="lru", sample_rate=0.25, sampled_requests=95, switches=3,
                      shadow_hit_rates={"lru": 0.32, "gated": 0.35}, live_tree_hit_rate=0.40)
    signals.export_gauges(0, SimpleNamespace(stats=lambda: two), force=True)
    live = _series("sglang_ext_tuner_live")
    assert live[(("setting", "lru"),)] == 1.0 and sum(live.values()) == 1.0  # the dropped ones read 0, not stale
    rates = _series("sglang_ext_tuner_shadow_hit_rate")
    assert rates[(("setting", "lru"),)] == 0.32 and rates[(("setting", "gated"),)] == 0.35
    assert math.isnan(rates[(("setting", "lru-no-ttl"),)]) and math.isnan(rates[(("setting", "gated-no-ttl"),)])


def test_the_tuners_stats_are_read_only_when_the_gauges_are_due():
    """export_gauges runs after every request; the tuner's stats (a dict of rates) are built once a second."""
    from sglang_ext.tier_signals import IDLE_REFRESH_S, ServingSignals
    from tiers.shadow import TuningStats

    calls = []

    class Tuner:
        def stats(self):
            calls.append(1)
            return TuningStats("lru", 0.25, 1, 0, {"lru": 0.5}, 0.5)

    clock = ManualClock(0.0)
    signals = ServingSignals(["device"], clock=clock)
    for _ in range(3):
        signals.export_gauges(0, Tuner())
    clock.advance(IDLE_REFRESH_S)
    signals.export_gauges(0, Tuner())
    assert len(calls) == 2
