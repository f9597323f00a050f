"""Sweep: every (policy, capacity) run, OPT and infinite always present, table and plots written."""

from __future__ import annotations

import json

from benchmarks.__main__ import main


def test_sweep_writes_table_results_and_plots(tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(["sweep", "--trace", "conversation", "--limit", "150", "--capacities", "5e4,2e5",
               "--policies", "lru", "--host-tokens", "1e5", "--workers", "1", "--out", str(out)])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert sorted((r["policy"], r["capacity_tokens"]) for r in results) == sorted(
        (p, c) for p in ("lru", "opt", "infinite") for c in (50000, 200000))
    by = {(r["policy"], r["capacity_tokens"]): r["token_hit_rate"] for r in results}
    for c in (50000, 200000):
        assert by[("opt", c)] <= by[("infinite", c)]
    table = (out / "results.md").read_text()
    assert "| lru |" in table and "| opt |" in table and "host load GB" in table
    for png in ("hit_rate_vs_capacity.png", "tier_traffic.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| policy |" in capsys.readouterr().out
