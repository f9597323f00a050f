"""Fleet replay (benchmarks/fleet_replay.py): routing keys, load imbalance, the pooled configuration and the command
line without servers; then a short slice through sglang-router to two of our host-tier replicas sharing a peer,
beside the pooled server, in one run."""

from __future__ import annotations

import json

import pytest

from benchmarks.fleet_replay import load_imbalance, pooled_config, routing_key
from benchmarks.live_replay import LiveConfig
from benchmarks.trace import TRACES_DIR, Request


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


@pytest.mark.parametrize("extra, named", [
    (["--peers", "1"], "--replicas 2"),
    (["--replicas", "2", "--peers", "1", "--servers", "tiered"], "tiered-host"),
    (["--replicas", "0"], "--replicas"),
    (["--replicas", "2", "--router", "nearest"], "--router"),
    (["--replicas", "2", "--peers", "-1", "--servers", "tiered-host"], "--peers"),
])
def test_bad_fleet_command_lines_exit_2_naming_the_problem(extra, named, capsys):
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["live-replay", "--trace", "conversation", "--capacity-tokens", "1e6", *extra])
    assert e.value.code == 2 and named in capsys.readouterr().err


# ---- against real servers ----

ROWS = 30


@pytest.mark.server
def test_two_replicas_behind_the_router_beside_the_pooled_server(tmp_path, capsys):
    from benchmarks.__main__ import main

    with open(TRACES_DIR / "mooncake_conversation.jsonl") as f:
        rows = [json.loads(next(f)) for _ in range(ROWS)]
    trace = tmp_path / "slice.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rc = main(["live-replay", "--trace", str(trace), "--capacity-tokens", "2e5", "--servers", "tiered-host",
               "--replicas", "2", "--router", "round_robin", "--peers", "1", "--json",
               "--log-dir", str(tmp_path / "logs")])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0, report
    s = report["servers"]["tiered-host"]
    assert (s["requests"], s["failures"]) == (ROWS, 0)
    # round robin at one request in flight alternates: each replica served half the rows, by its own count
    assert s["replica_requests"] == [ROWS // 2, ROWS // 2] and s["load_imbalance"] == 1.0
    assert all(t["tiers"]["host"] is not None for t in s["replica_tier_stats"])  # ours, with the host tier
    prompt_tokens = sum(r["input_length"] for r in rows)
    assert s["token_hit_rate"] == pytest.approx(sum(s["hit_tokens_by_tier"].values()) / prompt_tokens)
    pooled = s["pooled"]
    assert (pooled["requests"], pooled["failures"]) == (ROWS, 0)
    assert pooled["device_pool_tokens"] == 400_000 // 512 * 16  # one server with both replicas' memory
    assert s["pooled_token_hit_rate"] == pooled["token_hit_rate"] > 0
    assert s["fleet_over_pooled"] == pytest.approx(s["token_hit_rate"] / pooled["token_hit_rate"])
    assert report["fleet"] == {"replicas": 2, "router": "round_robin", "peers": 1, "pooled_capacity_tokens": 400_000,
                               "pooled_host_tokens": 800_000}
