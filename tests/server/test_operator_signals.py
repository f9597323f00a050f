"""Operator signals on a live server (issue: thrash, eviction velocity, cold vs capacity misses, dashboard, alerts).

Uses the session's `hicache_server` (600-token device pool over a host tier, --enable-metrics)."""

import json
import re
import time
from pathlib import Path

from sglang_ext.serving_cache import PrometheusCounters
from sglang_ext.tier_signals import PEER_COUNTS
from tests.server.test_tiered_serving import words

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
SERIES_DEADLINE_S = 30.0


def exprs() -> list:
    """Every PromQL expression in the dashboard and the alert rules."""
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    found = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    rules = (MONITORING / "alerts.yml").read_text()
    found += re.findall(r"expr: \|\n((?:\s{10}.*\n)+)", rules) + re.findall(r"expr: (\S.*)\n", rules)
    return found


def referenced(expressions) -> tuple:
    """(metric names, event label values) the expressions use."""
    names, events = set(), set()
    for expr in expressions:
        names |= set(re.findall(r"\b(sglang[_:][A-Za-z0-9_:]*)", expr))
        for alternatives in re.findall(r'event=~?"([^"]+)"', expr):
            events |= set(alternatives.split("|"))
    return names, events


def exported(metrics_text: str) -> tuple:
    names = {line.split("{")[0].split(" ")[0] for line in metrics_text.splitlines() if line and line[0] != "#"}
    events = set(re.findall(r'sglang_ext_tier_events_total\{[^}]*event="([^"]+)"', metrics_text))
    return names, events


def gauge(metrics_text: str, name: str, tier: str = "device") -> float:
    for line in metrics_text.splitlines():
        if line.startswith(name + "{") and f'tier="{tier}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def prompt(server, seed: int, n_words: int = 400) -> dict:
    return server.generate(words(seed, n_words), max_new_tokens=1)["meta_info"]


def test_every_series_the_dashboard_and_the_alerts_use_is_exported(hicache_server):
    prompt(hicache_server, 700, 100)
    prompt(hicache_server, 700, 100)  # a hit: every per-request series has moved
    names, events = referenced(exprs())
    assert "sglang_ext_tier_thrashing" in names and "capacity_miss_tokens" in events  # the parser finds them
    deadline = time.monotonic() + SERIES_DEADLINE_S
    while True:  # gauges are exported at most once a second, after a request or while idle
        have_names, have_events = exported(hicache_server.get("/metrics"))
        missing = sorted(names - have_names) + sorted(events - have_events - set(PEER_COUNTS))
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)  # polling another process's export, bounded by the deadline above
    assert not missing, f"dashboard/alerts use series the server does not export: {missing}"
    # the peer tier's counters appear only with --tier-peers; they are exported event names all the same
    assert set(PEER_COUNTS) <= set(PrometheusCounters.EVENTS)


def test_a_flood_thrashes_and_misses_split_into_cold_and_capacity(hicache_server):
    """A 400-token prefix, then 24 new 400-token prompts through the 600-token device pool (16x), then the prefix
    again (a capacity miss on the device: it held it before) and a new one (a cold miss)."""
    device = lambda: hicache_server.get("/tiers/stats")["tiers"]["device"]  # noqa: E731
    start = device()
    first = prompt(hicache_server, 800)
    cold = device()
    assert cold["cold_miss_tokens"] - start["cold_miss_tokens"] >= first["prompt_tokens"] - first["cached_tokens"]
    assert cold["capacity_miss_tokens"] == start["capacity_miss_tokens"]

    for seed in range(801, 825):
        prompt(hicache_server, seed)
    flooded = device()
    # the window's evictions are at least its stores less one pool: thrashing, whatever came before
    assert flooded["thrashing"] is True, flooded
    assert flooded["eviction_tokens_per_s"] > 0.9 * flooded["store_tokens_per_s"] > 0
    assert flooded["evicted_entries"] - cold["evicted_entries"] >= 20
    assert flooded["evicted_never_hit_share"] > 0.5
    deadline = time.monotonic() + SERIES_DEADLINE_S
    while gauge(hicache_server.get("/metrics"), "sglang_ext_tier_thrashing") != 1.0:
        assert time.monotonic() < deadline, "the thrashing gauge did not reach 1"
        time.sleep(0.5)  # polling another process's export, bounded by the deadline above
    assert gauge(hicache_server.get("/metrics"), "sglang_ext_tier_eviction_tokens_per_s") > 0

    again = prompt(hicache_server, 800)
    repeat = device()
    capacity = repeat["capacity_miss_tokens"] - flooded["capacity_miss_tokens"]
    assert capacity >= again["prompt_tokens"] // 2, (again, capacity)
    assert repeat["cold_miss_tokens"] - flooded["cold_miss_tokens"] < capacity

    new = prompt(hicache_server, 900)
    after = device()
    assert after["cold_miss_tokens"] - repeat["cold_miss_tokens"] >= new["prompt_tokens"] - new["cached_tokens"]
    assert after["capacity_miss_tokens"] == repeat["capacity_miss_tokens"]
