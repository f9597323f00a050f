"""The cost model: break-even bandwidth and what a hit per tier saves."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from benchmarks.__main__ import main
from benchmarks.cost import PROFILES_DIR, load_profile


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILES_DIR.glob("*.yaml")))
def test_fetch_wins_exactly_above_break_even(name):
    p = load_profile(name)
    assert p.break_even_bandwidth == pytest.approx(
        p.kv_bytes_per_token * p.achievable_prefill_flops / p.prefill_flops_per_token)
    for tier, link in p.tiers:
        s = p.summary()["tiers"][tier]
        assert s["fetch_beats_recompute"] == (p.fetch_s_per_token(tier) < p.recompute_s_per_token)
        assert s["fetch_beats_recompute"] == (p.link_bandwidth(link) > p.break_even_bandwidth)


def test_a_hit_at_break_even_saves_nothing_and_below_it_costs():
    p = load_profile("llama3-8b-h200")
    at = replace(p, bandwidth=(("pcie", p.break_even_bandwidth),), tiers=(("host", "pcie"),))
    below = replace(at, bandwidth=(("pcie", p.break_even_bandwidth / 2),))
    assert at.seconds_saved({"host": 1000})["host"] == pytest.approx(0.0, abs=1e-12)
    assert below.seconds_saved({"host": 1000})["host"] < 0
    assert p.seconds_saved({"device": 1000})["device"] == pytest.approx(1000 * p.recompute_s_per_token)


def test_bad_profile_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nkv_bytes_per_token: 1\nbandwidth: {pcie: 1}\n")
    with pytest.raises(ValueError, match="prefill_flops_per_token"):
        load_profile(str(bad))
    bad.write_text("name: x\nkv_bytes_per_token: 1\nprefill_flops_per_token: 1\nachievable_prefill_flops: 1\n"
                   "bandwidth: {pcie: 1}\ntiers: {host: nvlink}\n")
    with pytest.raises(ValueError, match="unknown link"):
        load_profile(str(bad))


def test_cost_cli_json(capsys):
    assert main(["cost", "--profile", "llama3-70b-h200", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["profile"] == "llama3-70b-h200"
    assert isinstance(out["break_even_bandwidth_bytes_per_s"], float)
    assert set(out["tiers"]) == {"host", "peer"}
