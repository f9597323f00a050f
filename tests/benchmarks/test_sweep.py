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


def test_sweep_without_capacities_doubles_up_to_the_trace_footprint(tmp_path):
    from benchmarks.sweep import default_capacities
    from benchmarks.trace import load_trace

    trace = load_trace("conversation", 512, limit=100)
    footprint = len({b for r in trace.requests for b in r.blocks}) * 512
    caps = default_capacities("conversation", 512, limit=100)
    assert caps[-1] == footprint and len(caps) == 6
    assert all(b == 2 * a or a == 512 for a, b in zip(caps, caps[1:]))
    out = tmp_path / "sweep"
    assert main(["sweep", "--trace", "conversation", "--limit", "100", "--policies", "lru", "--workers", "1",
                 "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert sorted({r["capacity_tokens"] for r in results}) == caps


def test_every_replay_flag_reaches_the_sweeps_runs(tmp_path):
    """The sweep takes replay's flags; each run must use them as `replay` would, not silently drop them."""
    out = tmp_path / "sweep"
    assert main(["sweep", "--trace", "conversation", "--limit", "100", "--capacities", "5e4", "--policies",
                 "tinylfu", "--workers", "1", "--shadow-rate", "0.5", "--shadow-seed", "5", "--output-tokens", "1",
                 "--out", str(out)]) == 0
    (run,) = [r for r in json.loads((out / "results.json").read_text()) if r["policy"] == "tinylfu"]
    assert (run["config"]["shadow_rate"], run["config"]["shadow_seed"], run["config"]["output_tokens"]) == (0.5, 5, 1)
