"""Replay: the JSON contract, determinism, the published stock reference figures, lower tiers, session TTLs."""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import main
from benchmarks.engines import tiered_policy_names
from benchmarks.replay import ReplayConfig, replay
from benchmarks.trace import load_trace, parse_rows
from benchmarks.workloads import GenConfig, generate_rows

REQUIRED = {
    "policy": str,
    "capacity_tokens": int,
    "requests": int,
    "token_hit_rate": float,
    "hit_rate_by_tier": dict,
    "prefill_tokens_saved": int,
    "bytes_moved_by_tier": dict,
    "evictions": int,
    "admissions_rejected": int,
    "policy_ns_per_request": float,
    "shadow_ns_per_request": float,
    "replay_seconds": float,
    "block_hits": int,
}
TIMING_FIELDS = ("replay_seconds", "policy_ns_per_request", "shadow_ns_per_request")


def run_json(capsys, *argv) -> dict:
    assert main(["replay", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _untimed(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in TIMING_FIELDS}


@pytest.mark.parametrize("policy", ["lru", "opt", "infinite"] + (["tinylfu"] if "tinylfu" in tiered_policy_names() else []))
def test_json_fields_present_and_typed(capsys, policy):
    out = run_json(capsys, "--trace", "conversation", "--limit", "200", "--capacity-tokens", "2e5",
                   "--policy", policy, "--host-tokens", "2e5", "--peer-tokens", "1e5")
    for field, typ in REQUIRED.items():
        assert isinstance(out[field], typ), (field, out[field])
    assert out["policy"] == policy and out["requests"] == 200 and out["capacity_tokens"] == 200000
    assert set(out["hit_rate_by_tier"]) == {"device", "host", "peer"}
    # with the host tier on, the project's policy self-tunes on both tiers as the server does; stock ones do not
    assert (out["tuning"] is not None) == (policy == "tinylfu")
    assert all(set(v) == {"load", "store"} and all(isinstance(x, int) for x in v.values())
               for v in out["bytes_moved_by_tier"].values())
    assert out["token_hit_rate"] == pytest.approx(sum(out["hit_rate_by_tier"].values()))
    assert 0.0 <= out["token_hit_rate"] <= 1.0


def test_stock_replay_is_identical_between_runs(capsys):
    args = ("--trace", "conversation", "--limit", "1500", "--capacity-tokens", "1e5")
    for policy in ("lru", "lfu"):
        first = run_json(capsys, *args, "--policy", policy)
        second = run_json(capsys, *args, "--policy", policy)
        assert _untimed(first) == _untimed(second)
        assert first["evictions"] > 0  # the slice really exercises eviction


def test_reproduces_the_published_synthetic_figures():
    """trace README: stock RadixCache lru/lfu .142/.109 at 1e6 tokens; OPT .383; infinite .651."""
    trace = load_trace("synthetic")
    rate = {p: replay(trace, ReplayConfig(policy=p, capacity_tokens=10**6)).token_hit_rate
            for p in ("lru", "lfu", "opt", "infinite")}
    assert {p: round(v, 3) for p, v in rate.items()} == {"lru": 0.142, "lfu": 0.109, "opt": 0.383, "infinite": 0.651}


def test_a_host_tier_larger_than_the_trace_recovers_every_evicted_block():
    trace = load_trace("conversation", limit=400)
    cap = 2 * 10**5
    assert max(len(r.blocks) for r in trace.requests) * 512 <= cap  # every prompt enters the device once
    infinite = replay(trace, ReplayConfig(policy="infinite", capacity_tokens=cap))
    device_only = replay(trace, ReplayConfig(policy="lru", capacity_tokens=cap))
    tiered = replay(trace, ReplayConfig(policy="lru", capacity_tokens=cap, host_tokens=10**9))
    assert device_only.token_hit_rate < infinite.token_hit_rate
    assert tiered.hit_rate_by_tier["device"] == device_only.token_hit_rate
    assert tiered.token_hit_rate == pytest.approx(infinite.token_hit_rate)
    host = tiered.bytes_moved_by_tier["host"]
    assert host["load"] == tiered.hit_tokens_by_tier["host"] * tiered.kv_bytes_per_token
    block_bytes = 512 * tiered.kv_bytes_per_token
    # each evicted block is stored once; a re-eviction finds the host copy (write-through model)
    assert 0 < host["store"] <= device_only.evicted_blocks * block_bytes and host["store"] % block_bytes == 0


@pytest.mark.skipif("tinylfu" not in tiered_policy_names(), reason="tinylfu not registered")
def test_a_suffix_the_device_declines_still_reaches_the_host_tier():
    """Guards: a replay that drops what the device's admission declined (it was computed: a tiered cache
    writes it below instead of losing it), which made a gated policy look far worse with lower tiers."""
    trace = load_trace("conversation", limit=400)
    cap = 2 * 10**5
    shut = {"gate_threshold": 1.0}  # the device declines every new suffix once it is full
    # (no self-tuner: it would steer the gate's bar)
    device_only = replay(trace, ReplayConfig(policy="tinylfu", capacity_tokens=cap, policy_config=shut, shadow_rate=0))
    tiered = replay(trace, ReplayConfig(policy="tinylfu", capacity_tokens=cap, host_tokens=10**9, policy_config=shut))
    lru_tiered = replay(trace, ReplayConfig(policy="lru", capacity_tokens=cap, host_tokens=10**9))
    assert device_only.admissions_rejected > 0
    # with the host tier on, the replay runs TieredHiRadixCache (benchmarks.host_engine), whose device tier
    # declines nothing (its admission is the host tier's); a host tier that holds everything loses nothing overall
    assert tiered.token_hit_rate == pytest.approx(lru_tiered.token_hit_rate)


def test_host_evictions_spill_to_the_peer_tier():
    trace = load_trace("conversation", limit=400)
    r = replay(trace, ReplayConfig(policy="lru", capacity_tokens=10**5, host_tokens=10**5, peer_tokens=10**9))
    assert r.bytes_moved_by_tier["peer"]["store"] > 0 and r.hit_rate_by_tier["peer"] > 0


def test_generated_workload_replay_is_deterministic():
    rows = generate_rows("chat", GenConfig(seed=3, sessions=40, think_s=20.0))
    trace = parse_rows(rows)
    policies = ["lru", "opt"] + (["tinylfu"] if "tinylfu" in tiered_policy_names() else [])
    for p in policies:
        a = replay(trace, ReplayConfig(policy=p, capacity_tokens=20000, session_ttl_s=60.0)).to_dict()
        b = replay(trace, ReplayConfig(policy=p, capacity_tokens=20000, session_ttl_s=60.0)).to_dict()
        assert _untimed(a) == _untimed(b)


def test_cost_profile_turns_hits_into_seconds(capsys):
    out = run_json(capsys, "--trace", "conversation", "--limit", "200", "--capacity-tokens", "1e5",
                   "--policy", "lru", "--host-tokens", "1e6", "--profile", "llama3-8b-h200")
    assert out["profile"] == "llama3-8b-h200" and out["kv_bytes_per_token"] == 131072
    assert out["prefill_seconds_saved"] == pytest.approx(sum(out["prefill_seconds_saved_by_tier"].values()))
    assert out["prefill_seconds_saved_by_tier"]["device"] > 0


def test_session_ttl_applies_only_to_session_rows_without_their_own(monkeypatch):
    """--session-ttl fills in cache_control for session rows; a row's own ttl_s wins; no session, no TTL."""
    import benchmarks.replay as replay_mod
    from benchmarks.engines import Access, EngineStats

    seen = []

    class Recorder:
        def access(self, req):
            seen.append(req.ttl_s)
            return Access(hit_blocks=0, evicted=())

        def stats(self):
            return EngineStats(0, 0, 0, 0)

    monkeypatch.setattr(replay_mod, "make_engine", lambda *a, **k: Recorder())
    rows = [
        {"timestamp": 0, "input_length": 10, "hash_ids": [1], "session": "a"},
        {"timestamp": 1, "input_length": 10, "hash_ids": [1], "session": "a", "ttl_s": 5},
        {"timestamp": 2, "input_length": 10, "hash_ids": [2]},
    ]
    replay(parse_rows(rows), ReplayConfig(policy="tinylfu", capacity_tokens=1024, session_ttl_s=60.0))
    assert seen == [60.0, 5.0, None]


@pytest.mark.parametrize("policy", ["lru", "tinylfu"])
def test_the_live_twin_caches_one_output_token_per_prompt_and_counts_a_repeat_as_a_full_hit(policy):
    """Guards the replay's model of a live server (output_tokens=1, as live-replay's offline twin): a repeat of a
    prompt is a full hit although SGLang matches all but its last token, and its greedy output is found cached,
    so the tree holds each distinct prompt plus one token; a continuation parts from the prompt's output leaf."""
    from benchmarks.engines import logical_radix_time, make_engine
    from tiers.clock import ManualClock

    rows = [{"timestamp": t, "input_length": 512 * len(ids), "hash_ids": ids, "output_length": 1}
            for t, ids in ((0, [1, 2]), (1, [1, 2]), (2, [1, 2, 3]))]
    trace = parse_rows(rows)
    with logical_radix_time():
        engine = make_engine(policy, 100, trace.requests, ManualClock(0), radix_tokens_per_block=4, output_tokens=1)
        hits = [engine.access(r).hit_blocks for r in trace.requests]
        size = engine.cache.evictable_size() + engine.cache.protected_size()
    assert hits == [0, 2, 2]
    assert size == 3 * 4 + 2  # blocks 1-3, and one output token after [1, 2] and after [1, 2, 3]
    no_output = replay(trace, ReplayConfig(policy=policy, capacity_tokens=100 * 512, radix_tokens_per_block=4))
    assert no_output.block_hits == 4  # the same hits without the live rules
