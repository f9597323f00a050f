"""The self-tuner through the classes the server runs (TieredRadixCache, and TieredHiRadixCache with the host tier,
with their shadow caches), on traces."""

import dataclasses
import random
from array import array

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st

from benchmarks.engines import TieredEngine
from benchmarks.host_engine import HostTierEngine, logical_tree_time
from benchmarks.replay import ReplayConfig, replay
from benchmarks.trace import load_trace, parse_rows
from benchmarks.workloads import KIND_DEFAULTS, GenConfig, generate_rows
from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang_ext.simulated_host import simulated_hicache
from sglang_ext.tiered_cache import TieredRadixCache, _TreeShadow
from sglang_ext.tree_walk import peek_path
from sglang_ext.tiered_hicache import TieredHiRadixCache, _HostTierShadow
from tiers.clock import ManualClock
from tiers.shadow import DEFAULT_SETTINGS, GATED, GATED_NO_TTL, HOST_TIER_SETTINGS, LRU, RETAINING_LRU, TuningConfig


@pytest.fixture(scope="module")
def conversation_slice():
    return load_trace("conversation", limit=1500)


@pytest.mark.parametrize("policy", ["tinylfu", "recency"])
@pytest.mark.parametrize("workload", ["conversation", "tenants-with-ttls", "tenant-chat"])
def test_the_recency_setting_is_sglangs_lru_to_the_token(workload, policy, conversation_slice):
    """Guards the setting the device-only tuner starts on: `tinylfu` steered to recency must be stock SGLang's
    LRU, or the tuner's "never below LRU" would rest on another algorithm; also where every row carries a client
    TTL, which SGLang has no notion of (honouring them there cost API-like traffic hits against SGLang's LRU
    until the first switch), and on multi-turn sessions whose turns split nodes (a split's back part is as old
    as the request before it in ticks: ranked by class, not placement, recency evicted another leaf of that age
    first, and served these 253 rows 0.7575 against SGLang's 0.7538). The same for the policy the recency
    setting's miniature runs (`recency`, steered as the tuner builds it), or the shadows would compare the learned
    setting with another algorithm than the one the live tree falls back to."""
    if workload == "conversation":
        trace, capacity = conversation_slice, 4_000_000
    elif workload == "tenant-chat":
        config = GenConfig(seed=2, sessions=60, **KIND_DEFAULTS["tenant-chat"])
        trace, capacity = parse_rows(generate_rows("tenant-chat", config)), 50_000
    else:
        trace, capacity = parse_rows(generate_rows("tenants", GenConfig(seed=1, requests=600))), 250_000
        assert all(req.ttl_s for req in trace.requests)
    assert TuningConfig().settings[0] == LRU
    clock = ManualClock(0.0)
    ours = TieredEngine(policy, capacity // 512, clock, tuning=TuningConfig(settings=(LRU,)))
    if policy == "recency":
        assert ours.cache.tuner is None and LRU.miniature_policy("tinylfu", {}) == ("recency", {})
        ours.cache._steer(LRU)  # as TieredRadixCache._make_shadow builds the miniature
    stock = replay(trace, ReplayConfig("lru", capacity))
    hit = 0
    for req in trace.requests:
        clock.set(max(clock.now(), req.time_s))
        hit += req.hit_tokens(ours.access(req).hit_blocks, trace.block_tokens)
    assert stock.evictions > 0
    assert hit / trace.total_input_tokens == pytest.approx(stock.token_hit_rate, abs=1e-12)
    assert ours.cache.retention.retains == 0


def test_where_the_learned_order_loses_to_lru_the_default_stays_within_0_002_of_it(conversation_slice):
    """The first 1,500 conversation rows at 4e6 tokens: the learned order starts cold and loses to LRU (RESULTS.md,
    "Where the known losses come from"); the default (self-tuning) ends within 0.002 of LRU or above."""
    lru = replay(conversation_slice, ReplayConfig("lru", 4_000_000)).token_hit_rate
    pinned = replay(conversation_slice, ReplayConfig("tinylfu", 4_000_000, shadow_rate=0)).token_hit_rate
    default = replay(conversation_slice, ReplayConfig("tinylfu", 4_000_000))
    assert pinned < lru - 0.01  # the loss is real on this slice
    assert default.token_hit_rate >= lru - 0.002
    # no row carries a TTL: the learned setting that ignores TTLs would be its twin, so it has no shadow
    assert default.tuning["sampled_requests"] > 0 and set(default.tuning["shadow_hit_rates"]) == {LRU.name, GATED.name}


def test_the_operators_candidates_reach_the_tuner_in_the_replay_and_the_server(conversation_slice, monkeypatch):
    """`--shadow-settings`, the server's `--tier-shadow-settings`, picks what the tuner compares: recency alone
    never leaves SGLang's LRU; a learned candidate at a bar of its own is measured, and followed, under its name."""
    from benchmarks.__main__ import build_parser, replay_config_from_args
    from sglang_ext.launch_server import split_tier_args
    from sglang_ext.tier_config import ENV_VAR, TierConfig
    from tiers.shadow import parse_settings

    spec = "lru-no-ttl,gated@0.5"
    args = build_parser().parse_args(["replay", "--trace", "conversation", "--policy", "tinylfu", "--capacity-tokens",
                                      "4e6", "--shadow-settings", spec])
    two = replay(conversation_slice, replay_config_from_args(args, "tinylfu", 4_000_000))
    alone = replay(conversation_slice, ReplayConfig("tinylfu", 4_000_000, shadow_settings="lru-no-ttl"))
    stock = replay(conversation_slice, ReplayConfig("lru", 4_000_000))
    assert set(two.tuning["shadow_hit_rates"]) == {"lru-no-ttl", "gated@0.5"} and two.config["shadow_settings"] == spec
    assert two.tuning["live"] == "gated@0.5" and two.token_hit_rate != stock.token_hit_rate
    assert alone.tuning["switches"] == 0 and set(alone.tuning["shadow_hit_rates"]) == {"lru-no-ttl"}
    assert alone.token_hit_rate == pytest.approx(stock.token_hit_rate, abs=1e-12)
    # the server: the flag, through the environment its scheduler reads, to the tuner the cache builds
    config, _ = split_tier_args(["--tier-shadow-settings", spec, "--model-path", "m"])
    monkeypatch.setenv(ENV_VAR, config.to_env())
    assert TierConfig.from_env().tuning().settings == TierConfig.from_env().tuning(host_tier=True).settings
    assert TierConfig.from_env().tuning().settings == parse_settings(spec)


def test_the_replay_flag_sets_the_servers_rate_and_zero_turns_the_tuner_off():
    from benchmarks.__main__ import build_parser, replay_config_from_args
    from sglang_ext.tier_config import TierConfig

    parser = build_parser()
    base = ["replay", "--trace", "conversation", "--policy", "tinylfu", "--capacity-tokens", "1e6"]
    assert replay_config_from_args(parser.parse_args(base), "tinylfu", 10**6).shadow_rate == TierConfig().shadow_rate
    for rate in ("0", "0.5"):
        args = parser.parse_args(base + ["--shadow-rate", rate])
        assert replay_config_from_args(args, "tinylfu", 10**6).shadow_rate == float(rate)
    assert TierConfig(shadow_rate=0).tuning() is None and TierConfig().tuning() == TuningConfig()


def _chat_hit_rates(seed: int, rate: float):
    """(full cache's hit rate, its shadow's) in blocks, on a generated chat trace where the shadow holds
    dozens of requests (the regime spatial sampling is made for) and turns come back after two minutes on
    average, so a reused context has often been pushed out of the full cache (it holds 0.59-0.73 of the blocks
    where an infinite one holds 0.74-0.78): a miniature's capacity decides what it reads."""
    trace = parse_rows(generate_rows("chat", GenConfig(seed=seed, sessions=800, think_s=120.0, ttl_s=None)))
    clock = ManualClock(0.0)
    # one shadow (recency) and one window over the whole run: its rate is the sampled traffic's whole hit rate
    tuning = TuningConfig(settings=(LRU,), sample_rate=rate, max_rate=rate, window_capacities=1e9)
    engine = TieredEngine("tinylfu", 800, clock, tuning=tuning)
    hit = total = 0
    for i, req in enumerate(trace.requests):
        clock.set(max(clock.now(), req.time_s))
        hit_blocks = engine.access(req).hit_blocks
        if i >= tuning.warmup_requests:  # the shadow starts after the warm-up
            hit += hit_blocks
            total += len(req.blocks)
    assert engine.stats().evictions > 0
    return hit / total, engine.cache.tuner.stats().shadow_hit_rates[LRU.name]


# The miniature's error (shadow - full) at a quarter of the traffic, over 56 seeds (2026-12-07): mean -0.02, from
# -0.067 (seed 118, kept as an example) to +0.026 (seed 13): a miniature of LRU reads a little low. Left at the full
# capacity (unscaled) it reads +0.068 to +0.157 high on the same seeds; fed all the traffic, far low. Hence a
# tolerance that is not symmetric: it is the upper bar that guards the capacity scaling.
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6))
@example(seed=118)
@example(seed=13)
def test_a_sampled_miniature_tracks_the_full_cache_from_0_08_below_to_0_05_above(seed):
    full, shadow = _chat_hit_rates(seed, 0.25)
    assert -0.08 <= shadow - full <= 0.05, (full, shadow)


def _nodes(cache):
    stack, out = [cache.root_node], []
    while stack:
        node = stack.pop()
        out.extend(node.children.values())
        stack.extend(node.children.values())
    return out


@pytest.mark.parametrize("host_tier", [False, True], ids=["device", "host-tier"])
def test_the_tuner_is_told_the_live_trees_own_hit(conversation_slice, host_tier):
    """Guards the fidelity check's input: with every chain sampled and one window over the run, the tuner's live
    tree rate must be the tree's own hit rate after the warm-up (with the host tier: device and host hits)."""
    tuning = TuningConfig(sample_rate=1.0, max_rate=1.0, window_capacities=1e9)
    trace = dataclasses.replace(conversation_slice, requests=conversation_slice.requests[:600])
    if host_tier:
        engine, hits = _host_hits("tinylfu", trace, 600, 1200, tuning)
    else:
        clock = ManualClock(0.0)
        engine, hits = TieredEngine("tinylfu", 600, clock, tuning=tuning), []
        for req in trace.requests:
            clock.set(max(clock.now(), req.time_s))
            hits.append((engine.access(req).hit_blocks, 0))
    after = range(tuning.warmup_requests, len(trace.requests))  # the shadows start after the warm-up
    hit, host_hit = sum(sum(hits[i]) for i in after), sum(hits[i][1] for i in after)
    total = sum(len(trace.requests[i].blocks) for i in after)
    stats = engine.cache.tuner.stats()
    assert stats.sampled_requests == len(after) and hit > 0 and (host_hit > 0) == host_tier
    assert stats.live_tree_hit_rate == pytest.approx(hit / total, abs=1e-6)


@pytest.mark.parametrize("setting", DEFAULT_SETTINGS, ids=lambda s: s.name)
def test_a_shadow_serves_each_request_as_the_simulated_tree_does(setting):
    """A shadow's insert carries lengths, not token tensors, and reports the hit its own walk matched: request by
    request it must serve what the simulated tree does with SGLang's tensor values and a read-only walk, and
    every node's value must keep its key's length through splits and evictions."""
    rng = random.Random(3)
    heads = [[rng.randrange(100, 30000) for _ in range(rng.randrange(20, 200))] for _ in range(12)]
    clock = ManualClock(0.0)
    live = TieredRadixCache.create_simulated("tinylfu", 4_000, clock=clock)
    shadow = live._make_shadow(setting, 1_000)
    config = {"class_capacity": 4_000, "prior_weight": 1_000 / 4_000}
    reference = TieredRadixCache.create_simulated("tinylfu", 1_000, clock=clock, policy_config=config)
    reference._steer(setting)
    for i in range(600):
        clock.set(float(i))
        head = rng.choice(heads)
        prompt = head[: rng.randrange(1, len(head) + 1)] + [rng.randrange(100, 30000) for _ in range(rng.randrange(0, 60))]
        key, ttl_s = RadixKey(array("q", prompt)), (30.0 if i % 7 == 0 else None)
        expected = peek_path(reference.root_node, key, 1)[1]  # match_prefix would split a node: a change
        reference.insert(InsertParams(key=key, value=torch.arange(len(prompt))), ttl_s=ttl_s)
        assert shadow.request((key, 0, ttl_s)) == (expected, len(prompt)), i
    cache = shadow.cache
    assert cache.tier_stats().evictions == reference.tier_stats().evictions > 0
    assert cache.tier_stats().size_tokens == reference.tier_stats().size_tokens
    assert all(len(n.value) == len(n.key) for n in _nodes(cache))


def _scan_then_hot(cache, n: int, seed: int = 0) -> float:
    """Three hot 150-token prompts, each asked again every third request, between one-shot 280-token prompts
    (a pool of 1,200 tokens holds four of them); the hit rate of the second half."""
    rng = random.Random(seed)
    hot = [[rng.randrange(100, 30000) for _ in range(150)] for _ in range(3)]
    hits = total = 0
    for i in range(n):
        prompt = hot[(i // 3) % 3] + [i] if i % 3 == 0 else [rng.randrange(100, 30000) for _ in range(280)]
        key = RadixKey(array("q", prompt))
        matched = len(cache.match_prefix(MatchPrefixParams(key=key)).device_indices)
        if i >= n // 2:
            hits, total = hits + matched, total + len(prompt)
        cache.insert(InsertParams(key=key, value=torch.arange(len(prompt))))
    return hits / total


def test_the_tuner_moves_the_live_policy_off_recency_when_a_scan_would_flush_the_hot_set():
    """Recency loses every hot prompt to the one-shot scan; the shadows see the learned settings keep them, and
    the live tree follows (full-size shadows: the pool holds only four requests)."""
    lru_only = TieredRadixCache.create_simulated(capacity_tokens=1200, tuning=TuningConfig(settings=(LRU,)))
    tuned = TieredRadixCache.create_simulated(capacity_tokens=1200,
                                              tuning=TuningConfig(sample_rate=1.0, max_rate=1.0))
    lru_rate, tuned_rate = _scan_then_hot(lru_only, 240), _scan_then_hot(tuned, 240)
    stats = tuned.tuner.stats()
    assert stats.live != LRU.name and stats.switches == 1
    assert lru_rate < 0.05 and tuned_rate > 0.15
    assert stats.shadow_hit_rates[stats.live] > stats.shadow_hit_rates[LRU.name] + 0.1


# ---- with the host tier: TieredHiRadixCache, both tiers steered, shadows of the same class ----
def _host_hits(policy: str, trace, device_blocks: int, host_blocks: int, tuning=None):
    """(device, host) hit blocks per request through HostTierEngine (the server's host-tier class)."""
    clock = ManualClock(0.0)
    with logical_tree_time():
        engine = HostTierEngine(policy, device_blocks, host_blocks, clock, trace.block_tokens, tuning=tuning)
        hits = []
        for req in trace.requests:
            clock.set(max(clock.now(), req.time_s))
            hits.append((engine.access(req).hit_blocks, engine.last_host_blocks))
    return engine, hits


@pytest.mark.parametrize("policy", ["tinylfu", "recency"])
def test_the_recency_setting_on_both_tiers_is_stock_hicache_request_by_request(policy):
    """Guards the host tier's starting setting: `tinylfu` steered to recency on device and host must serve every
    request as SGLang's HiRadixCache with LRU does (device eviction, write-through backups, host eviction); so must
    `recency`, which the recency setting's miniature runs on both tiers."""
    trace = load_trace("conversation", limit=800)
    assert HOST_TIER_SETTINGS[0] == RETAINING_LRU
    assert RETAINING_LRU.miniature_policy("tinylfu", {}) == ("recency", {})
    engine, ours = _host_hits(policy, trace, 600, 1200, TuningConfig(settings=(RETAINING_LRU,)))
    _, stock = _host_hits("lru", trace, 600, 1200)
    assert engine.cache.tier_counters()["host"]["evicted_tokens"] > 0  # both tiers were full
    assert sum(h for _, h in stock) > 0
    assert ours == stock


def _serve_scan_then_hot(cache, n: int, seed: int = 0) -> float:
    """_scan_then_hot's requests, each served on both tiers as the scheduler would (simulated_host.serve_request,
    through the host-tier shadow's own request path); the hit rate (device + host) of the second half."""
    rng = random.Random(seed)
    hot = [[rng.randrange(100, 30000) for _ in range(150)] for _ in range(3)]
    served, hits, total = _HostTierShadow(cache), 0, 0
    for i in range(n):
        prompt = hot[(i // 3) % 3] + [i] if i % 3 == 0 else [rng.randrange(100, 30000) for _ in range(280)]
        hit, units = served.request((RadixKey(array("q", prompt)), 0, None))
        if i >= n // 2:
            hits, total = hits + hit, total + units
    return hits / total


def test_the_host_tier_tuner_leaves_recency_when_a_scan_would_flush_both_tiers():
    """With a host tier as small as the device, recency loses the hot prompts on both; the shadows (this class
    on simulated pools) see the learned setting keep them, and both live tiers follow."""
    lru_only = simulated_hicache(TieredHiRadixCache, 1200, 1200, tuning=TuningConfig(settings=(RETAINING_LRU,)),
                                 strict=True)
    tuned = simulated_hicache(TieredHiRadixCache, 1200, 1200, strict=True,
                              tuning=TuningConfig(settings=HOST_TIER_SETTINGS, sample_rate=1.0, max_rate=1.0))
    lru_rate, tuned_rate = _serve_scan_then_hot(lru_only, 240), _serve_scan_then_hot(tuned, 240)
    stats = tuned.tuner.stats()
    assert stats.live == "gated" and stats.switches == 1
    assert tuned.device_view.inner.order == tuned.host_view.inner.order == "learned"
    assert lru_only.device_view.inner.order == lru_only.host_view.inner.order == "recency"
    assert lru_rate < 0.05 and tuned_rate > 0.15
    # the shadows' host pools evicted, and kept no log of it (nobody drains one in the server); they feed no
    # operator signals (their work is charged to the policy), while the live tree does
    assert tuned.tier_stats_dict()["tiers"]["device"]["stored_entries"] > 0
    for _, shadow in tuned.tuner.shadows:
        controller = shadow.cache.cache_controller
        assert controller.mem_pool_host.freed_tokens > 0 and controller.host_evicted == []
        assert shadow.cache._signals is None and "stored_entries" not in shadow.cache.tier_stats_dict()["tiers"]["device"]


def test_the_replay_with_a_host_tier_runs_the_tuner_and_reports_it():
    trace = load_trace("conversation", limit=300)
    r = replay(trace, ReplayConfig("tinylfu", 200_000, host_tokens=400_000))
    assert r.config["host_tier"] == "TieredHiRadixCache"
    honouring = {s.name for s in HOST_TIER_SETTINGS if s.honours_ttls}  # no row carries a TTL
    assert r.tuning["sampled_requests"] > 0 and set(r.tuning["shadow_hit_rates"]) == honouring
    assert replay(trace, ReplayConfig("tinylfu", 200_000, host_tokens=400_000, shadow_rate=0)).tuning is None
    tenants = parse_rows(generate_rows("tenants", GenConfig(seed=1, requests=300)))  # a TTL on every row
    with_ttls = replay(tenants, ReplayConfig("tinylfu", 200_000, host_tokens=400_000))
    assert set(with_ttls.tuning["shadow_hit_rates"]) == {s.name for s in HOST_TIER_SETTINGS}


@pytest.mark.parametrize("host_tier", [False, True], ids=["device", "host-tier"])
def test_the_shadows_time_is_reported_as_its_part_of_the_policys(host_tier):
    """An operator weighing `--tier-shadow-rate` sees what the self-tuner costs: `shadow_ns`, counted inside
    `policy_ns` (an accounting check, not a timing bar)."""
    trace = load_trace("conversation", limit=300)
    host = 400_000 if host_tier else 0
    tuned = replay(trace, ReplayConfig("tinylfu", 200_000, host_tokens=host))
    assert tuned.tuning["sampled_requests"] > 0
    assert 0 < tuned.shadow_ns_per_request < tuned.policy_ns_per_request
    pinned = replay(trace, ReplayConfig("tinylfu", 200_000, host_tokens=host, shadow_rate=0))
    assert pinned.shadow_ns_per_request == 0 < pinned.policy_ns_per_request


IGNORES_TTLS, HONOURS_TTLS = GATED_NO_TTL, GATED  # the learned setting, ignoring client TTLs and honouring them


@pytest.mark.parametrize("host_tier", [False, True], ids=["device", "host-tier"])
def test_a_setting_that_ignores_ttls_retains_nothing_and_lets_go_of_what_was_retained(host_tier):
    clock = ManualClock(0.0)
    if host_tier:
        cache = simulated_hicache(TieredHiRadixCache, 1200, 2400, clock=clock, strict=True)
        serve = _HostTierShadow(cache).request  # the scheduler's path for one request: TTL, insert, finish
    else:
        cache = TieredRadixCache.create_simulated("tinylfu", 1200, clock=clock)
        serve = _TreeShadow(cache).request

    def ask(first: int, ttl_s=300.0):
        serve((RadixKey(array("q", range(first, first + 100))), 0, ttl_s))

    ask(1000)
    assert cache.retention.retained_size == 100
    cache._steer(IGNORES_TTLS)
    assert cache.retention.retained_size == 0  # at the switch, every retention ends
    ask(2000)
    ask(1000)  # a hit on what was retained refreshes nothing either
    assert cache.retention.retained_size == 0 and cache.retention.retains == 1
    cache._steer(HONOURS_TTLS)
    ask(3000)
    assert cache.retention.retained_size == 100


def test_where_client_ttls_cost_hits_the_default_stops_honouring_them():
    """Every row of the tenants workload marks a one-shot question over a shared system prompt ephemeral (300 s):
    retaining the questions pushes out system prompts the tenants ask for again. The shadow that ignores TTLs sees
    it, the live tree follows, and ends above the same tuner without that candidate."""
    trace = parse_rows(generate_rows("tenants", GenConfig(seed=1, **KIND_DEFAULTS["tenants"])))
    honouring_only = TuningConfig(settings=tuple(s for s in DEFAULT_SETTINGS if s != IGNORES_TTLS))
    results = {}
    for name, tuning in (("default", TuningConfig()), ("honouring only", honouring_only)):
        clock = ManualClock(0.0)
        engine, hit = TieredEngine("tinylfu", 250_000 // 512, clock, tuning=tuning), 0
        for req in trace.requests:
            clock.set(max(clock.now(), req.time_s))
            hit += engine.access(req).hit_blocks
        results[name] = (hit, engine)
    (hit, engine), (hit_before, _) = results["default"], results["honouring only"]
    assert engine.cache.tuner.live == IGNORES_TTLS and engine.cache.retention.retained_size == 0
    assert hit > hit_before


def _node_ids(cache) -> list:
    ids, stack = [], [cache.root_node]
    while stack:
        node = stack.pop()
        ids.append(node.id)
        stack.extend(node.children.values())
    return ids


def test_shadows_built_mid_serving_leave_the_live_trees_node_ids_unique():
    """HiRadixCache's constructor restarts SGLang's process-wide node counter, and the tuner builds its host-tier
    shadows after warm-up, while the live tree is serving. Node ids key the tree's copies in flight
    (`ongoing_load_back`, `ongoing_write_through`): two live nodes with one id lose one of the copies' locks, and
    the second acknowledgement raises KeyError in the scheduler (loading_check)."""
    live = simulated_hicache(TieredHiRadixCache, 1200, 2400, strict=True,
                             tuning=TuningConfig(settings=HOST_TIER_SETTINGS, warmup_requests=8))
    served, rng = _HostTierShadow(live), random.Random(0)
    for i in range(24):
        served.request((RadixKey(array("q", [rng.randrange(100, 30000) for _ in range(40)])), 0, None))
        if i == 6:
            assert live.tuner.shadows == ()  # the eighth request builds them
    assert live.tuner.shadows  # built while the live tree held nodes
    ids = _node_ids(live)
    assert len(ids) > 24 and len(set(ids)) == len(ids)
