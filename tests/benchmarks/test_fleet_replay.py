"""Fleet replay (benchmarks/fleet_replay.py): routing keys, load imbalance, the pooled configuration and the command
line without servers; then six rows through sglang-router to two of our host-tier replicas sharing a peer, one of
them killed mid-run, beside the pooled server, in one run."""

from __future__ import annotations

import json

import pytest

import subprocess
import sys

from benchmarks.fleet_replay import (ReplicaKill, after_kill, load_imbalance, outputs_differing, pooled_config,
                                     routing_key)
from benchmarks.live_replay import LiveConfig
from benchmarks.row_sending import Sent
from benchmarks.trace import Request, Trace


def test_a_row_is_routed_by_its_session_then_its_tenant_then_its_first_block():
    row = Request(0, 0.0, 1024, 1, (7, 8), 512)
    assert routing_key(row) == "block-7"
    assert routing_key(Request(0, 0.0, 1024, 1, (7, 8), 512, tenant="t1")) == "tenant-t1"
    assert routing_key(Request(0, 0.0, 1024, 1, (7, 8), 512, session="s1", tenant="t1")) == "session-s1"
    assert routing_key(Request(1, 0.0, 2048, 1, (7, 9, 10), 512)) == routing_key(row)  # same first block


@pytest.mark.parametrize("counts, expected", [([5, 5], 1.0), ([10, 0], 2.0), ([3, 1], 1.5), ([0, 0], 0.0)])
def test_load_imbalance_is_max_over_mean(counts, expected):
    assert load_imbalance(counts) == expected


def test_the_pooled_server_holds_what_the_replicas_hold_together():
    cfg = LiveConfig(capacity_tokens=1_000_000, host_tokens=2_000_000, tokens_per_block=16, block_tokens=512,
                     speedup=0.0, concurrency=1)
    pooled = pooled_config(cfg, 3)
    assert (pooled.capacity_tokens, pooled.host_tokens) == (3_000_000, 6_000_000)
    assert pooled.device_pool_tokens == 3 * cfg.device_pool_tokens
    assert pooled.host_ratio == cfg.host_ratio and pooled.tokens_per_block == cfg.tokens_per_block


def test_replicas_ask_the_peer_at_sglangs_threshold_scaled_as_the_pools_are():
    from benchmarks.fleet_replay import replica_args, scaled_prefetch_threshold

    cfg = LiveConfig(capacity_tokens=1_000_000, host_tokens=2_000_000, tokens_per_block=16, block_tokens=512,
                     speedup=0.0, concurrency=1)
    assert scaled_prefetch_threshold(cfg) == 8  # 256 trace tokens = half a block = 8 of its 16 ids
    assert scaled_prefetch_threshold(LiveConfig(1_000_000, 0, 512, 512, 0.0, 1)) == 256  # one id per token
    assert scaled_prefetch_threshold(LiveConfig(1_000_000, 0, 1, 4096, 0.0, 1)) == 1  # never below one token

    class Peer:
        address = "127.0.0.1:7"

    args = replica_args("tiered-host", cfg, [Peer()])
    assert args[args.index("--tier-peer-prefetch-threshold") + 1] == "8"
    assert "--tier-peer-prefetch-threshold" not in replica_args("tiered-host", cfg, [])


@pytest.mark.parametrize("extra, named", [
    (["--peers", "1"], "--replicas 2"),
    (["--replicas", "2", "--peers", "1", "--servers", "tiered"], "tiered-host"),
    (["--replicas", "0"], "--replicas"),
    (["--replicas", "2", "--router", "nearest"], "--router"),
    (["--replicas", "2", "--peers", "-1", "--servers", "tiered-host"], "--peers"),
    (["--kill-replica-after", "5"], "--kill-replica-after"),
    (["--replicas", "2", "--kill-replica-after", "0"], "--kill-replica-after"),
    (["--router-args", "--cache-threshold 0.5"], "--router-args"),
    (["--replicas", "2", "--router-args", "--policy random"], "--router-args"),
    (["--replicas", "2", "--peers", "1", "--servers", "tiered-host", "--peer-capacity-gb", "0"], "--peer-capacity-gb"),
])
def test_bad_fleet_command_lines_exit_2_naming_the_problem(extra, named, capsys):
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["live-replay", "--trace", "conversation", "--capacity-tokens", "1e6", *extra])
    assert e.value.code == 2 and named in capsys.readouterr().err


class _Replica:
    """The edge ReplicaKill talks to: a process in its own group, and SGLang's request counter."""

    def __init__(self, served: int):
        self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        self.served = served

    def get(self, path):
        assert path == "/metrics"
        return f'sglang:num_requests_total{{model_name="m"}} {self.served}.0\n'


def test_the_replica_is_killed_once_before_its_row_and_keeps_what_it_had_served():
    replica = _Replica(served=7)
    try:
        kill = ReplicaKill(replica, before_row=3, served_at_start=2)
        for row in (0, 1, 2):
            kill.before_sending(row)
        assert not kill.done and replica.proc.poll() is None
        kill.before_sending(3)
        assert kill.done and kill.served == 5 and replica.proc.poll() is not None
        replica.served = 100  # a second call (a later row, another thread) changes nothing
        kill.before_sending(4)
        assert kill.served == 5
    finally:
        replica.proc.kill()
        replica.proc.wait()


def test_after_the_kill_counts_only_the_rows_from_the_kill_on_in_trace_tokens():
    k = 16  # token ids per 512-token block
    reqs = [Request(i, float(i), 1024, 1, (i, 100 + i), 512) for i in range(4)]
    trace = Trace("t", 512, tuple(reqs))
    cfg = LiveConfig(capacity_tokens=10_000, host_tokens=20_000, tokens_per_block=k, block_tokens=512, speedup=0.0,
                     concurrency=1)
    sent = [Sent(0, True, 2 * k - 1, {"device": 2 * k - 1}), Sent(1, True, k, {"device": 0, "storage": k}),
            Sent(2, False, error="502"), Sent(3, True, 2 * k - 1, {"device": k, "storage": k - 1})]
    got = after_kill(sent, trace, cfg, before_row=1)
    assert got == {"killed_replica": 0, "before_row": 1, "rows": 3, "failures": 1,
                   "hit_tokens": 512 + 1024, "peer_hit_tokens": 512 + 512}


def test_outputs_are_compared_only_where_both_runs_answered():
    a = [Sent(0, True, output_ids=(5,)), Sent(1, True, output_ids=(6,)), Sent(2, False), Sent(3, True, output_ids=(8,))]
    b = [Sent(0, True, output_ids=(5,)), Sent(1, True, output_ids=(7,)), Sent(2, True, output_ids=(1,)),
         Sent(3, False)]
    assert outputs_differing(a, b) == [1]


# ---- against real servers ----

A, C, D = list(range(0, 20)), list(range(200, 220)), list(range(300, 320))
GAP_MS = 5000  # trace time between rows: room for a replica's asynchronous write-back to the peer
# row 1 extends row 0's prompt on the other replica (round robin); rows 4 and 5 extend rows 2 and 3 after the kill:
# whichever of them the dead replica had computed comes from the peer
FAILOVER_ROWS = [A, A + [100, 101], C, D, C + [400], D + [500]]
KILL_BEFORE = 4


@pytest.mark.server
def test_two_replicas_behind_the_router_share_the_peer_and_survive_a_killed_replica(tmp_path, capsys):
    from benchmarks.__main__ import main

    rows = [{"timestamp": i * GAP_MS, "input_length": 512 * len(ids), "output_length": 1, "hash_ids": ids}
            for i, ids in enumerate(FAILOVER_ROWS)]
    trace = tmp_path / "failover.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(["live-replay", "--trace", str(trace), "--capacity-tokens", "2e5", "--servers", "tiered-host",
               "--replicas", "2", "--router", "round_robin", "--peers", "1", "--speedup", "1",
               "--kill-replica-after", str(KILL_BEFORE), "--json", "--log-dir", str(tmp_path / "logs")])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    s = report["servers"]["tiered-host"]
    n = len(rows)
    assert (s["requests"], s["failures"]) == (n, 0)  # the router retried what the dead replica could not serve
    # round robin alternates until the kill; from there the survivor serves every row, by its own count
    assert s["replica_requests"] == [KILL_BEFORE // 2, n - KILL_BEFORE // 2]
    assert s["replica_tier_stats"][0] is None and s["replica_tier_stats"][1]["tiers"]["host"] is not None
    # row 1 ran on the replica that did not compute row 0: its prefix came from the peer
    assert s["hit_tokens_by_tier"].get("storage", 0) >= 512 * len(A)
    k = s["failover"]
    assert (k["before_row"], k["rows"], k["failures"]) == (KILL_BEFORE, n - KILL_BEFORE, 0)
    assert k["peer_hit_tokens"] >= 512 * len(C)
    assert s["outputs_differing_from_pooled"] == []
    prompt_tokens = sum(r["input_length"] for r in rows)
    assert s["token_hit_rate"] == pytest.approx(sum(s["hit_tokens_by_tier"].values()) / prompt_tokens)
    pooled = s["pooled"]
    assert (pooled["requests"], pooled["failures"]) == (n, 0)
    assert pooled["device_pool_tokens"] == 400_000 // 512 * 16  # one server with both replicas' memory
    assert s["pooled_token_hit_rate"] == pooled["token_hit_rate"] > 0
    assert s["fleet_over_pooled"] == pytest.approx(s["token_hit_rate"] / pooled["token_hit_rate"])
    assert report["fleet"] == {"replicas": 2, "router": "round_robin", "peers": 1, "router_args": [],
                               "peer_capacity_gb": 0.25,
                               "kill_replica_after": KILL_BEFORE,
                               "pooled_capacity_tokens": 400_000, "pooled_host_tokens": 800_000}
