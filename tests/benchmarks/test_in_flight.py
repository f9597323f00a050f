"""`replay --in-flight N`: the device engines run N rows at once, as a server's batch: each started (matched,
its prefix locked, room evicted for the KV it will compute, held outside the tree), then each finished (cached).
One in flight is the one-at-a-time replay; more show what running requests do to a cache (the live replay's
drift under load, issue 13)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.__main__ import build_parser, replay_config_from_args
from benchmarks.engines import make_engine
from benchmarks.replay import ReplayConfig, arrive, replay
from benchmarks.trace import parse_rows
from tests.benchmarks.helpers import random_chain_trace
from tiers.clock import ManualClock

POLICIES = ("lru", "tinylfu")  # SGLang's RadixCache, and the project's tree with admission and TTLs


def _engine(policy, trace, capacity_blocks, clock):
    return make_engine(policy, capacity_blocks, trace.requests, clock, radix_tokens_per_block=4, output_tokens=1)


@pytest.mark.parametrize("policy", POLICIES)
def test_one_request_started_and_finished_is_served_as_one_access(policy):
    """Starting then finishing each row alone evicts, hits and declines exactly as serving it whole."""
    trace = random_chain_trace(seed=5, n_requests=400, max_new=6)
    trace = replace(trace, requests=tuple(r if i % 3 else replace(r, ttl_s=60.0)  # TTLs on a third: retention
                                          for i, r in enumerate(trace.requests)))
    cfg = ReplayConfig(policy, 60 * trace.block_tokens)
    served = []
    for split in (False, True):
        clock = ManualClock(0.0)
        engine = _engine(policy, trace, 60, clock)
        runs = []
        for req in trace.requests:
            req = arrive(req, cfg, clock)
            access = engine.finish(engine.start(req)) if split else engine.access(req)
            runs.append((access.hit_blocks, list(access.evicted), list(access.declined)))
        served.append(runs)
    whole, split = served
    assert sum(len(evicted) for _, evicted, _ in whole) > 0, "not contended"
    assert split == whole


@pytest.mark.parametrize("policy", POLICIES)
def test_a_started_request_holds_its_kv_so_the_next_one_evicts_for_both(policy):
    """Room for a started request's KV is evicted when it starts, and stays taken until it finishes: the next
    request to start finds the pool fuller than the tree alone."""
    rows = [{"timestamp": i, "input_length": 16, "output_length": 1, "hash_ids": [10 * i, 10 * i + 1]}
            for i in range(6)]
    trace = parse_rows(rows, block_tokens=8)
    clock = ManualClock(0.0)
    engine = _engine(policy, trace, 9, clock)  # 36 radix tokens: the first four rows (9 each) fill it exactly
    for req in trace.requests[:4]:
        engine.access(req)
    assert engine.allocator.take() == []
    first = engine.start(trace.requests[4])
    freed_by_first = len(engine.allocator.take())
    second = engine.start(trace.requests[5])
    freed_by_second = len(engine.allocator.take())
    # each needs two blocks (4 radix tokens each) and a generated token: the first its own room, the two together
    # room for both (a policy may free more than it needs at once, in whole entries)
    assert freed_by_first >= 9 and freed_by_first + freed_by_second >= 18
    for s in (first, second):
        assert engine.finish(s).hit_blocks == 0


@pytest.mark.parametrize("policy", POLICIES)
def test_rows_in_one_batch_do_not_hit_the_prefix_a_batch_mate_is_computing(policy):
    """A row sharing a new prefix with a row that started in the same batch misses it (it enters the tree when
    that row finishes), and hits it in the next batch."""
    chains = [[1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6]]
    rows = [{"timestamp": i, "input_length": 8 * len(h), "output_length": 1, "hash_ids": h}
            for i, h in enumerate(chains)]
    trace = parse_rows(rows, block_tokens=8)
    hits = {}
    for n in (1, 2):
        r = replay(trace, ReplayConfig(policy, 64 * 8, in_flight=n, shadow_rate=0))
        hits[n] = r.hit_tokens_by_tier["device"]
        assert r.config["in_flight"] == n
    assert hits[1] == 3 * 3 * 8  # rows 2-4 find the first row's three blocks
    assert hits[2] == 2 * 3 * 8  # row 2 started beside row 1


@pytest.mark.parametrize("policy", POLICIES)
def test_a_batch_takes_at_most_the_servers_chunk_of_new_tokens(policy):
    """With the server's chunked prefill size, a batch stops at the row whose new tokens reach it, as SGLang's
    PrefillAdder fills a prefill batch; the rows after it start in the next batch and find what it computed."""
    chains = [[1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6]]
    rows = [{"timestamp": i, "input_length": 8 * len(h), "output_length": 1, "hash_ids": h}
            for i, h in enumerate(chains)]
    trace = parse_rows(rows, block_tokens=8)
    hits = {}
    for chunk in (0, 3):  # radix tokens: one per block here; the first row's three new blocks fill a chunk of 3
        r = replay(trace, ReplayConfig(policy, 64 * 8, in_flight=4, prefill_chunk_tokens=chunk, shadow_rate=0))
        hits[chunk] = r.hit_tokens_by_tier["device"]
    assert hits[0] == 0  # all four in one batch: nothing of the shared prefix is cached yet
    assert hits[3] == 3 * 3 * 8  # the first row alone, then the other three together, each finding its prefix


def test_cli_flag_reaches_the_config_and_refuses_lower_tiers(capsys):
    parser = build_parser()
    args = parser.parse_args(["replay", "--trace", "conversation", "--capacity-tokens", "1e6", "--policy", "lru",
                              "--in-flight", "16"])
    assert replay_config_from_args(args, "lru", 1_000_000).in_flight == 16
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["replay", "--trace", "conversation", "--capacity-tokens", "1e6", "--policy", "lru",
              "--host-tokens", "2e6", "--in-flight", "4"])
    assert e.value.code == 2 and "--in-flight" in capsys.readouterr().err
    with pytest.raises(ValueError, match="in_flight"):
        replay(random_chain_trace(seed=1, n_requests=3), ReplayConfig("opt", 800, in_flight=2))
