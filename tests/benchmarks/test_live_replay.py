"""Live trace replay (benchmarks/live_replay.py): block -> token mapping, hit counting and pacing without
servers; then a short slice of the conversation trace against real stock and tiered servers, live beside
offline."""

from __future__ import annotations

import json
import threading
from collections import Counter

import pytest

from benchmarks.live_replay import BlockTokens, hit_tokens_by_tier, live_hit_blocks, percentile
from benchmarks.row_sending import Sent, row_fields, send_interleaved, send_rows
from benchmarks.trace import TRACES_DIR, parse_rows

K = 16


def test_a_block_is_the_same_run_of_ids_wherever_it_appears():
    a, b = BlockTokens(K, 2048), BlockTokens(K, 2048)
    a.prompt([3, 5])
    assert a.run(7) == b.run(7)  # seeded by the block id, not by the order blocks are met
    assert a.run(7) != a.run(8)
    assert len(a.run(7)) == K and all(0 <= t < 2048 for b_ in range(200) for t in a.run(b_))
    small = BlockTokens(K, 3)
    assert {t for b_ in range(50) for t in small.run(b_)} == {0, 1, 2}  # within the vocabulary, all of it


def test_a_row_sends_its_tenant_and_ttl_as_a_client_would():
    """The offline twin namespaces a row by its tenant and retains it for its TTL: live, the server must be asked
    the same (cache_salt; cache_control, which our request API validates), or the two replay different traffic."""
    rows = [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "tenant": "t3", "ttl_s": 299.5},
            {"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [2]}]
    with_both, plain = parse_rows(rows).requests
    assert row_fields(with_both) == {"cache_salt": "t3", "cache_control": {"type": "ephemeral", "ttl": "300s"}}
    assert row_fields(plain) == {}
    from sglang_ext.request_api import request_ttl

    assert request_ttl(row_fields(with_both), None) == 300.0


def test_sibling_blocks_part_at_their_first_token():
    """Guards: random runs that share leading tokens by chance under one parent, a shared radix node the trace
    does not have (with 2,048 ids, 300 random first blocks share a first token in about 20 pairs)."""
    from benchmarks.live_replay import sibling_ranks
    from benchmarks.trace import Request

    rows = [Request(b, 0.0, 1024, 1, (b, 1000 + b), 512) for b in range(300)]
    rows.append(Request(300, 0.0, 1024, 1, (7, 2000), 512))  # a second child of block 7
    m = BlockTokens(K, 2048, sibling_ranks(rows))
    firsts = [m.run(b)[0] for b in range(300)]
    assert len(set(firsts)) == 300  # root's children: all distinct first tokens
    assert m.run(1007)[0] != m.run(2000)[0]  # block 7's two children part at once
    assert m.run(5)[1:] == BlockTokens(K, 2048).run(5)[1:]  # the rest of the run is still seeded by the block


def tier_keys(cache) -> Counter:
    """Every node's policy key (a split's back parts can share one: keys are given when a node is made)."""
    keys, stack = Counter(), list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        keys[node.tier_key] += 1
        stack.extend(node.children.values())
    return keys


def test_the_twin_keys_its_tree_as_the_server_does():
    """Guards: a twin whose blocks are other token ids than the server's. Its tree has the same shape, but its
    keys differ, so the self-tuner samples other chains and the twin can follow another trajectory (live
    synthetic, 2,000 rows: the server went lru -> gated -> lru, the twin stayed on lru)."""
    import torch

    from benchmarks.engines import TieredEngine
    from benchmarks.live_replay import sibling_ranks
    from benchmarks.trace import Request
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang_ext.tiered_cache import TieredRadixCache
    from tiers.clock import ManualClock

    rows = [Request(i, 0.0, 512 * len(b), 1, b, 512) for i, b in enumerate([(1, 2, 3), (1, 2, 4), (1, 5), (6, 7)])]
    m = BlockTokens(K, 2048, sibling_ranks(rows))
    server = TieredRadixCache.create_simulated(policy="tinylfu", capacity_tokens=100 * K, clock=ManualClock())
    for r in rows:
        ids = m.prompt(r.blocks)
        server.insert(InsertParams(key=RadixKey(ids), value=torch.arange(len(ids), dtype=torch.int64)))
    twins = [TieredEngine("tinylfu", 100, ManualClock(), radix_tokens_per_block=K, first_tokens=first)
             for first in (m.first_tokens(), None)]
    for twin in twins:
        for r in rows:
            twin.access(r)
    assert sum(tier_keys(server).values()) == 6  # blocks (1), (2), (3), (4), (5) and (6, 7)
    assert tier_keys(twins[0].cache) == tier_keys(server)
    assert not tier_keys(twins[1].cache) & tier_keys(server)  # plain block ids: the same shape, other keys


def retained_nodes(cache) -> dict:
    """{tier key: tokens} of every node a TTL retains in `cache`'s tree."""
    out, stack = {}, list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        if cache.retention.is_retained(node):
            out[node.tier_key] = len(node.key)
        stack.extend(node.children.values())
    return out


def test_the_twin_retains_what_the_server_retains_for_a_ttl():
    """Guards: a twin that passed a row's TTL to the first insert of cache_finished_req only. The server's request
    state holds the TTL for both, and the topology-only re-insert splits the new leaf at the prompt boundary: the
    server retains the prompt's tail node, the twin left it unretained, so the twin evicted the retained output
    leaves above it and their prompts with them (tenant-chat-s1, 600 rows at 5e4: 351 retained evictions in the
    twin, 3 live; 0.5875 offline against 0.6005 live)."""
    import torch

    from benchmarks.engines import OutputTokens, RadixUnits, TieredEngine
    from benchmarks.live_replay import sibling_ranks
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang_ext.serving_cache import ServingTieredCache
    from tiers.clock import ManualClock

    rows = parse_rows([{"timestamp": t, "input_length": 512 * len(ids), "output_length": 1, "hash_ids": ids,
                        "session": "s", "ttl_s": 60.0}
                       for t, ids in ((0, [1, 2]), (1, [1, 2, 3]), (2, [4]), (3, [5, 6, 7, 8, 9]))])
    m, outputs = BlockTokens(K, 2048, sibling_ranks(rows.requests)), OutputTokens(1, prefill_chunk=2 * K)
    units = RadixUnits(K, m.first_tokens())  # the twin's token ids: its output tokens are its own
    server = ServingTieredCache.create_simulated(policy="tinylfu", capacity_tokens=100 * K, clock=ManualClock())
    twin = TieredEngine("tinylfu", 100, ManualClock(), radix_tokens_per_block=K, output_tokens=1,
                        prefill_chunk=2 * K, first_tokens=m.first_tokens())
    for r in rows.requests:
        ids = units.tokens(r.blocks)
        out = outputs.of(ids)
        matched = len(server.match_prefix(MatchPrefixParams(key=RadixKey(ids[:-1]))).device_indices)
        server._request_ttl_s = r.ttl_s  # what cache_unfinished_req and cache_finished_req hold while they insert
        for end in outputs.chunk_ends(len(ids), matched):  # the last row's chunked prefill: 2 chunks
            server.insert(InsertParams(key=RadixKey(ids[:end]), value=torch.arange(end), chunked=True))
        server.insert(InsertParams(key=RadixKey(ids + out), value=torch.arange(len(ids) + 1)))
        server.insert(InsertParams(key=RadixKey(ids), value=torch.arange(len(ids)), chunked=True))
        server._request_ttl_s = None
        twin.access(r)
    retained = retained_nodes(server)
    assert sum(retained.values()) == 9 * K + 4  # blocks 1-9 and each prompt's output token
    assert retained_nodes(twin.cache) == retained
    assert twin.cache.retention.retains == server.retention.retains  # the chunks' inserts retained as they came


def counts(cache) -> tuple:
    s = cache.tier_stats()
    return s.evictions, s.evicted_tokens, s.admissions_rejected, s.size_tokens


@pytest.mark.parametrize("seed", [0, 2])
def test_the_twin_evicts_for_the_prompt_then_for_the_output_as_the_server_allocates(seed):
    """Guards: a twin that made room for a request's prompt and output in one round. The server allocates the
    prompt's KV (evicting its shortfall, the matched prefix locked), then the output's (evicting what is still
    missing), and two rounds do not always take the victims one round takes for the sum (the policy's density
    horizon is the number of tracked entries, which the first round lowers): live, tenants-s1 (600
    rows at 2.5e5) freed 115 tokens and then a 96-token leaf where the twin's one round of 116 took a 48-token
    one, and the twin declined 46 suffixes where the server declined 50. Reference: a simulated tree without
    output rules, driven round by round as the scheduler drives the server's."""
    import random
    from array import array

    import torch

    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang_ext.tiered_cache import TieredRadixCache
    from sglang_ext.tree_walk import peek_path
    from tiers.clock import ManualClock

    rng = random.Random(seed)
    heads = [[rng.randrange(100, 30000) for _ in range(rng.randrange(16, 160))] for _ in range(30)]
    twin = TieredRadixCache.create_simulated("tinylfu", 800, clock=ManualClock(), output_tokens=1)
    server = TieredRadixCache.create_simulated("tinylfu", 800, clock=ManualClock())
    for i in range(400):  # with one round, these seeds part at requests 101 and 363
        head = rng.choice(heads)
        prompt = head[: rng.randrange(1, len(head) + 1)] + [rng.randrange(100, 30000) for _ in range(rng.randrange(1, 40))]
        key = RadixKey(array("q", prompt + [-1 - i]))  # the prompt and its one generated token
        twin.match_prefix(MatchPrefixParams(key=RadixKey(array("q", prompt))))
        twin.insert(InsertParams(key=key, value=torch.arange(len(prompt) + 1)))
        node = server.match_prefix(MatchPrefixParams(key=RadixKey(array("q", prompt)))).last_device_node
        server.inc_lock_ref(node)  # the request holds its prefix while the prompt's KV is allocated
        computed = len(prompt) - peek_path(server.root_node, key, 1)[1]
        if computed > 0:
            shortfall = server.evictable_size() + server.protected_size() + computed - server.capacity_tokens
            server.evict(EvictParams(num_tokens=shortfall))
        server.dec_lock_ref(node)
        server.insert(InsertParams(key=key, value=torch.arange(len(prompt) + 1)))  # evicts for the output
        assert counts(twin) == counts(server), i
    assert server.tier_stats().evictions > 100 and server.tier_stats().admissions_rejected > 0


def test_prompts_share_exactly_the_tokens_of_their_shared_blocks():
    m = BlockTokens(K, 2048)
    x, y = m.prompt([1, 2, 3, 4]), m.prompt([1, 2, 9])
    assert len(x) == 4 * K and len(y) == 3 * K
    assert x[: 2 * K] == y[: 2 * K]
    assert x[2 * K] != y[2 * K]  # block 3 vs block 9 part at the block boundary (these seeds differ there)


@pytest.mark.parametrize("cached, expected", [
    (0, 0), (K - 1, 0), (K, 1), (2 * K + 5, 2),
    (4 * K - 1, 4),  # a full hit: SGLang serves all but the last prompt token from cache
    (4 * K, 4),
])
def test_live_hit_blocks(cached, expected):
    assert live_hit_blocks(cached, 4, K) == expected


def test_hit_tokens_count_trace_tokens_per_tier_like_the_replay():
    req = parse_rows([{"timestamp": 0, "input_length": 3 * 512 + 100, "hash_ids": [1, 2, 3, 4]}]).requests[0]
    assert hit_tokens_by_tier(req, 2 * K, {"device": 2 * K, "host": 0}, K, 512) == {"device": 1024}
    # a full hit, partly from host: the last block is partial (100 tokens), as `replay` counts it
    assert hit_tokens_by_tier(req, 4 * K - 1, {"device": K, "host": 3 * K - 1}, K, 512) == {
        "device": 512, "host": 2 * 512 + 100}
    # no breakdown (or one that does not add up): all device
    assert hit_tokens_by_tier(req, 3 * K, None, K, 512) == {"device": 3 * 512}
    assert hit_tokens_by_tier(req, 3 * K, {"device": 1}, K, 512) == {"device": 3 * 512}
    assert hit_tokens_by_tier(req, 0, None, K, 512) == {"device": 0}


def test_summary_counts_hits_over_all_the_trace_prompt_tokens_and_failures_apart():
    from benchmarks.live_replay import LiveConfig, ServerRun, summarize

    trace = parse_rows([{"timestamp": 0, "input_length": 1000, "hash_ids": [1, 2]},
                        {"timestamp": 1, "input_length": 1000, "hash_ids": [1, 2]},
                        {"timestamp": 2, "input_length": 600, "hash_ids": [1, 3]}])
    sent = [Sent(0, True, 0, None, 0.1), Sent(1, True, 2 * K - 1, None, 0.3), Sent(2, False, error="boom")]
    run = ServerRun("stock", sent, wall_s=2.0, offline={"token_hit_rate": 0.4, "hit_tokens_by_tier": {},
                                                        "admissions_rejected": 0, "radix_tokens_per_block": K})
    s = summarize(run, trace, LiveConfig(10_000, 20_000, K, 512, 0.0, 1))
    assert s["token_hit_rate"] == 1000 / 2600  # the failed row's tokens stay in the denominator
    assert (s["requests"], s["failures"], s["full_hit_rows"], s["first_error"]) == (2, 1, 1, "boom")
    assert (s["ttft_ms_p99"], s["ttft_ms_mean"], s["requests_per_s"]) == (300.0, 200.0, 1.0)


def test_the_twin_runs_on_the_clock_the_rows_were_sent_by():
    """Guards the twin's TTL clock: rows go out at the sender's times (a slice of minutes in seconds at speedup 0),
    and the server's TTLs expire on that clock, so the twin's rows carry those times (from the trace's first);
    a row never sent keeps the time before it. A 300 s TTL on a 1,200 s slice sent in 20 s: the twin with the
    trace's own times let TTLs expire that never expired live (+0.0145 live - offline on 600 tenants-s1 rows)."""
    from benchmarks.live_replay import at_send_times
    from benchmarks.trace import parse_rows

    trace = parse_rows([{"timestamp": 1000 * i, "input_length": 512, "output_length": 1, "hash_ids": [i]}
                        for i in range(4)])
    sent = [Sent(0, True, sent_s=50.0), Sent(1, True, sent_s=50.5), Sent(2, False), Sent(3, False, sent_s=52.0)]
    twin = at_send_times(trace, sent)
    t0 = trace.requests[0].time_s
    assert [r.time_s - t0 for r in twin.requests] == [0.0, 0.5, 0.5, 2.0]
    assert [r.blocks for r in twin.requests] == [r.blocks for r in trace.requests]
    assert at_send_times(trace, [Sent(i, False) for i in range(4)]) is trace  # nothing went out: trace time


@pytest.mark.parametrize("concurrency", [1, 4])
def test_with_many_in_flight_device_servers_also_get_a_twin_that_runs_them_at_once(monkeypatch, tmp_path,
                                                                                  concurrency):
    """At more than one in flight, each device-only server's report carries the twin run at that concurrency
    (`replay --in-flight`), beside the one-at-a-time twin: here four rows that share a new prefix, which one at a
    time find it and all at once do not. The host-tier server has no such twin (the batch twin is device only).
    The servers are the edge faked here: their answers are given, the twins are the real replays."""
    import benchmarks.live_replay as lr

    trace = parse_rows([{"timestamp": i, "input_length": 512 * len(h), "output_length": 1, "hash_ids": h}
                        for i, h in enumerate([[1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 3, 6]])])

    def served(name, trace, cfg, blocks, log_dir):
        return lr.ServerRun(name, [Sent(i, True, 0, None, 0.01, sent_s=float(i)) for i in range(4)], wall_s=1.0)

    monkeypatch.setattr(lr, "run_server", served)
    cfg = lr.LiveConfig(64 * 512, 128 * 512, K, 512, 0.0, concurrency)
    report = lr.live_replay(trace, ["stock", "tiered", "tiered-host"], cfg, tmp_path, vocab_size=2048)["servers"]
    for name in ("stock", "tiered"):
        assert report[name]["offline_token_hit_rate"] == 9 * 512 / (15 * 512)  # rows 2-4 find three blocks each
        if concurrency == 1:
            assert report[name]["offline_in_flight_token_hit_rate"] is None
        else:
            assert report[name]["offline_in_flight_token_hit_rate"] == 0.0  # all four in one batch
            assert report[name]["offline_in_flight_admissions_rejected"] == 0
    assert report["tiered-host"]["offline_in_flight_token_hit_rate"] is None


def test_percentile_nearest_rank():
    assert percentile([], 0.5) == 0.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert percentile([float(i) for i in range(101)], 0.99) == 99.0


class FakeClock:
    """Time that moves only when the sender sleeps."""

    def __init__(self):
        self.t, self.sleeps = 100.0, []

    def now(self):
        return self.t

    def sleep(self, s):
        self.sleeps.append(round(s, 9))
        self.t += s


def test_rows_go_out_at_their_trace_time_divided_by_the_speedup():
    clock = FakeClock()
    sent = send_rows(lambda i: Sent(i, True), [5.0, 15.0, 15.0, 35.0], speedup=10, concurrency=1,
                     clock=clock.now, sleep=clock.sleep)
    assert clock.sleeps == [1.0, 2.0]  # rows at +1 s (two of them) and +3 s
    assert [s.index for s in sent] == [0, 1, 2, 3] and all(s.ok for s in sent)
    clock = FakeClock()
    send_rows(lambda i: Sent(i, True), [5.0, 15.0, 35.0], speedup=0, concurrency=1, clock=clock.now,
              sleep=clock.sleep)
    assert clock.sleeps == []  # speedup 0: no waiting


@pytest.mark.parametrize("concurrency", [1, 3])
def test_at_most_concurrency_requests_in_flight_and_all_of_them_used(concurrency):
    lock, state = threading.Lock(), {"now": 0, "max": 0}
    all_in = threading.Barrier(concurrency)

    def send(i):
        with lock:
            state["now"] += 1
            state["max"] = max(state["max"], state["now"])
        if i < concurrency:
            all_in.wait(timeout=30)  # the first `concurrency` rows are in flight together
        with lock:
            state["now"] -= 1
        return Sent(i, i != 4, error="" if i != 4 else "boom")

    sent = send_rows(send, [0.0] * 12, speedup=0, concurrency=concurrency)
    assert state["max"] == concurrency
    assert [s.ok for s in sent] == [i != 4 for i in range(12)]


def test_interleaved_rows_go_to_every_server_in_turn_each_row_starting_with_the_next_server():
    """Guards the side-by-side TTFTs: each row reaches every server before the next row goes out (one request in
    flight in all), the first of row i is server i mod n (a fixed order would always give one server the machine
    right after the others' prefill), rows wait for their time as in send_rows, and a failed answer is kept as
    that server's and does not stop the others."""
    clock, calls = FakeClock(), []

    def sender(server):
        def send(i):
            calls.append((i, server, clock.now()))
            return Sent(i, not (server == 1 and i == 2), error="boom" if server == 1 and i == 2 else "")
        return send

    sent = send_interleaved([sender(0), sender(1), sender(2)], [5.0, 15.0, 15.0, 35.0], speedup=10,
                            clock=clock.now, sleep=clock.sleep)
    assert [(i, server) for i, server, _ in calls] == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (1, 0),
                                                       (2, 2), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]
    assert clock.sleeps == [1.0, 2.0]
    assert {t for i, _, t in calls if i == 3} == {103.0}  # the last row at +3 s on every server
    assert [[s.index for s in answers] for answers in sent] == [[0, 1, 2, 3]] * 3
    assert [s.ok for s in sent[1]] == [True, True, False, True] and all(s.ok for s in sent[0] + sent[2])


@pytest.mark.parametrize("extra, named", [
    (["--servers", "stock,nope"], "--servers"),
    (["--servers", "stock,stock"], "--servers"),
    (["--trace", "no-such-trace.jsonl"], "--trace"),
    (["--capacity-tokens", "100"], "--capacity-tokens"),
    (["--host-tokens", "10"], "--host-tokens"),
    (["--limit", "300", "--tokens-per-block", "64"], "does not fit"),  # a 236-block row: 15,104 ids > context
    (["--interleave", "--concurrency", "2"], "--interleave"),
])
def test_bad_command_lines_exit_2_naming_the_problem(extra, named, capsys):
    from benchmarks.__main__ import main

    argv = ["live-replay", "--trace", "conversation", "--capacity-tokens", "1e6"]
    with pytest.raises(SystemExit) as e:
        main(argv + extra)
    assert e.value.code == 2 and named in capsys.readouterr().err


def test_table_reports_a_server_that_did_not_start_and_the_ratios_of_ours_to_stock():
    from benchmarks.live_replay import table

    row = {"token_hit_rate": 0.05, "offline_token_hit_rate": 0.04, "ttft_ms_p50": 10.0, "ttft_ms_p90": 20.0,
           "ttft_ms_p99": 40.0, "ttft_ms_mean": 20.0, "requests_per_s": 1.0, "failures": 0}
    out = table({"servers": {"stock": row, "tiered": {**row, "ttft_ms_mean": 10.0, "ttft_ms_p99": 60.0},
                             "hicache": {"error": "hicache exited with 1:\nlog", "failures": 3}}})
    assert "| stock | 0.0500 | 0.0400 | +0.0100 |" in out
    assert "| hicache | did not start: hicache exited with 1: |" in out
    assert "tiered / stock: TTFT mean 0.50x, p99 1.50x" in out and "tiered-host" not in out
    out = table({"servers": {"stock": {**row, "eviction_ms_per_request": 0.2},
                             "tiered": {**row, "policy_ms_per_request": 0.3}}})
    assert "policy CPU 0.300 ms/request (every policy call) vs stock's eviction 0.200 ms/request: 1.50x" in out
    out = table({"servers": {"stock": {**row, "eviction_ms_per_request": 0.2},
                             "tiered": {**row, "policy_ms_per_request": 0.3, "shadow_ms_per_request": 0.1}}})
    assert "(every policy call; the self-tuner's shadows 0.100 of it) vs stock's eviction" in out


def test_metric_sum_adds_a_series_over_its_label_sets_and_nothing_else():
    from benchmarks.live_replay import metric_sum

    page = ("# HELP sglang:eviction_duration_seconds x\n"
            'sglang:eviction_duration_seconds_sum{model_name="m",tp_rank="0"} 0.25\n'
            'sglang:eviction_duration_seconds_sum{model_name="m",tp_rank="1"} 0.5\n'
            "sglang:eviction_duration_seconds_sum_other 9\n"
            'sglang:eviction_duration_seconds_count{model_name="m"} 3\n')
    assert metric_sum(page, "sglang:eviction_duration_seconds_sum") == 0.75
    assert metric_sum(page, "sglang:absent") is None and metric_sum({"not": "text"}, "x") is None


def test_the_twin_takes_the_pools_the_server_built_from_its_log(tmp_path):
    """Guards: a host-tier twin on the configured host pool where SGLang built one page more (int(device x ratio)
    plus a page: 62,497 tokens for 62,496 asked); a backup that fit live made the twin evict from its host pool
    (synthetic, 2,000 rows at 1e6 / 2e6: 0.0769 offline against 0.0766 live; the server's size gives 0.0766)."""
    from types import SimpleNamespace

    from benchmarks.host_engine import HostTierEngine
    from benchmarks.server_log import server_chunk_tokens, server_host_pool_tokens, server_pool_tokens
    from tiers.clock import ManualClock

    log = tmp_path / "server.log"
    log.write_text("server_args={'chunked_prefill_size': 4096, 'x': 1}\n"
                   "max_total_num_tokens=31248, chunked_prefill_size=4096\n"
                   "Allocating kv hierarchical KV host pool: 62497 tokens, 0.03 GB host memory.\n")
    server = SimpleNamespace(log_path=log)
    assert (server_pool_tokens(server), server_chunk_tokens(server), server_host_pool_tokens(server)) == (
        31248, 4096, 62497)
    assert server_host_pool_tokens(SimpleNamespace(log_path=tmp_path / "missing.log")) is None
    for policy in ("lru", "tinylfu"):
        asked = HostTierEngine(policy, 10, 20, ManualClock(), 512, radix_tokens_per_block=K)
        built = HostTierEngine(policy, 10, 20, ManualClock(), 512, radix_tokens_per_block=K, host_pool=20 * K + 1)
        assert asked.controller.mem_pool_host.size == 20 * K
        assert built.controller.mem_pool_host.size == 20 * K + 1


def test_policy_time_is_read_from_either_cache_shape():
    from benchmarks.live_replay import policy_ns

    assert policy_ns({"tiers": {"device": {"policy_ns": 7}}}) == 7  # device-only
    assert policy_ns({"counters": {"policy_ns": 9}, "tiers": {"device": {}}}) == 9  # with the host tier
    assert policy_ns(None) is None
    assert policy_ns({"tiers": {"device": {"policy_ns": 7, "shadow_ns": 3}}}, "shadow_ns") == 3
    assert policy_ns({"counters": {"policy_ns": 9, "shadow_ns": 4}, "tiers": {"device": {}}}, "shadow_ns") == 4


# ---- against real servers ----

ROWS = 120
CAPACITY = 200_000  # trace tokens: 390 of the slice's ~3,000 distinct blocks fit, so both servers evict
TTL_CAPACITY = 50_000  # the tenant-chat slice (TTLs on every row): 97 blocks, a few sessions' worth
FIELDS = {"token_hit_rate", "offline_token_hit_rate", "hit_tokens_by_tier", "ttft_ms_p50", "ttft_ms_p90",
          "ttft_ms_p99", "ttft_ms_mean", "requests", "failures", "requests_per_s", "tier_stats"}


def slice_rows(trace_name: str) -> list:
    """The first ROWS rows of a Mooncake trace, or of the generated tenant-chat workload (seed 1, as
    benchmarks/out/tenant-chat-s1.jsonl): sessions and tenants, a 300 s TTL on every row."""
    if trace_name == "tenant-chat":
        from benchmarks.workloads import KIND_DEFAULTS, GenConfig, generate_rows

        return generate_rows("tenant-chat", GenConfig(seed=1, **KIND_DEFAULTS["tenant-chat"]))[:ROWS]
    with open(TRACES_DIR / f"mooncake_{trace_name}.jsonl") as f:
        return [json.loads(next(f)) for _ in range(ROWS)]


@pytest.mark.server
@pytest.mark.parametrize("stock, ours, trace_name, capacity, mode", [
    ("stock", "tiered", "conversation", CAPACITY, []),
    ("stock", "tiered", "tenant-chat", TTL_CAPACITY, ["--interleave"]),
    ("hicache", "tiered-host", "synthetic", CAPACITY, [])])
def test_live_replay_agrees_with_the_offline_replay(tmp_path, capsys, stock, ours, trace_name, capacity, mode):
    """Device only on conversation rows, some longer than this CPU server's chunked prefill (a twin that did not
    chunk as the server does parts from it there), and on tenant-chat rows whose TTLs the server retains (a twin
    that retained at the first insert of cache_finished_req only read 0.6268 against the server's 0.6493 here),
    both servers up at once and each row sent to each in turn (`--interleave`: each server's twin on its own
    clock); with the host tier on synthetic rows, where the host pool serves part of the slice (on these
    conversation rows every reuse comes back before the device evicts it)."""
    from benchmarks.__main__ import main

    rows = slice_rows(trace_name)
    rows.append(rows[-1])  # the last row again: a full hit, which SGLang reports as len - 1 cached tokens
    trace = tmp_path / "slice.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(["live-replay", "--trace", str(trace), "--capacity-tokens", str(capacity), "--servers",
               f"{stock},{ours}", "--concurrency", "1", "--json", "--log-dir", str(tmp_path / "logs"), *mode])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    assert report["config"]["interleave"] == bool(mode)
    assert report["config"]["device_pool_tokens"] == capacity // 512 * K
    for name in (stock, ours):
        s = report["servers"][name]
        assert FIELDS <= set(s), FIELDS - set(s)
        assert (s["requests"], s["failures"]) == (ROWS + 1, 0)
        assert s["device_pool_tokens"] == capacity // 512 * K  # the server built the pool asked for
        assert s["offline_token_hit_rate"] > 0
        assert abs(s["token_hit_rate"] - s["offline_token_hit_rate"]) <= 0.01, (name, s)
        assert 0 < s["ttft_ms_p50"] <= s["ttft_ms_p90"] <= s["ttft_ms_p99"]
        # read from the server's real log (a line SGLang no longer wrote would give None): one request at a time,
        # every prefill pass of the run carried one request (a long row's chunks take one pass each)
        assert s["requests_per_prefill_batch"] == 1.0 and s["prefill_batches"] >= ROWS + 1, s
        if ours == "tiered-host":  # the host tier served part of the slice, live and offline
            assert s["hit_tokens_by_tier"].get("host", 0) > 0 and s["offline_hit_tokens_by_tier"].get("host", 0) > 0
    assert report["servers"][stock]["full_hit_rows"] >= 1  # the repeated row (ours may have declined it)
    assert report["servers"][stock]["tier_stats"] is None
    device = report["servers"][ours]["tier_stats"]["tiers"]["device"]
    assert device["evictions"] > 0  # contended
    assert report["servers"][stock]["eviction_ms_per_request"] > 0  # stock's policy cost, from /metrics
    assert report["servers"][ours]["policy_ms_per_request"] > report["servers"][ours]["shadow_ms_per_request"] > 0


@pytest.mark.parametrize("n, matched, chunk, expected", [
    (10, 0, 0, []),  # no chunked prefill
    (10, 0, 4, [4, 8]),  # two whole chunks leave a part to compute; the last chunk ends with the request
    (8, 0, 4, [4]),  # the second chunk is the last: inserted when the request finishes, not as a chunk
    (10, 3, 4, [7]),  # chunks start after the cached prefix
    (5, 3, 4, []),
])
def test_chunked_prefill_inserts_each_chunk_that_leaves_part_of_the_prompt(n, matched, chunk, expected):
    from benchmarks.engines import OutputTokens

    assert list(OutputTokens(1, chunk).chunk_ends(n, matched)) == expected


def test_the_server_chunk_size_is_read_from_its_start_up_log(tmp_path):
    from benchmarks.server_log import server_chunk_tokens
    from benchmarks.servers import Server

    log = tmp_path / "s.log"
    log.write_text("x\nserver_args={'max_total_tokens': 6240, 'chunked_prefill_size': 2048, 'page_size': 1}\n")
    assert server_chunk_tokens(Server("http://127.0.0.1:1", None, log)) == 2048
    log.write_text("nothing here\n")
    assert server_chunk_tokens(Server("http://127.0.0.1:1", None, log)) is None


def test_the_prefill_batches_are_read_from_the_log_after_the_runs_start(tmp_path):
    """The server's own batches (one log line a prefill pass), counted only after the run began: the start-up
    warm-up's pass comes before it."""
    from benchmarks.server_log import PrefillBatches, log_size, logged_prefill_batches
    from benchmarks.servers import Server

    log = tmp_path / "s.log"
    line = "[2026-12-07 04:13:28] Prefill batch, #new-seq: {}, #new-token: 160, #cached-token: 0, token usage: 0.17\n"
    log.write_text(line.format(1))  # the warm-up
    server = Server("http://127.0.0.1:1", None, log)
    start = log_size(server)
    with open(log, "a") as f:
        f.write(line.format(7) + "Decode batch, #running-req: 7\n" + line.format(2))
    assert logged_prefill_batches(server, start) == PrefillBatches(passes=2, requests=9)
    assert logged_prefill_batches(server, 0) == PrefillBatches(passes=3, requests=10)
    assert logged_prefill_batches(server, log_size(server)) is None  # nothing logged since
    assert logged_prefill_batches(Server("http://127.0.0.1:1", None, tmp_path / "missing.log"), 0) is None
