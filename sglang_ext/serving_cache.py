"""The tiered tree cache as the server runs it: request TTLs, `/tiers/stats`, Prometheus counters.

`TieredRadixCache` (tiered_cache.py) is the policy-driven tree; this subclass adds what only a serving process
has: the retention TTL a request carries (request_api.TTL_PARAM in `sampling_params.custom_params`, put there by
the HTTP middleware from `cache_control` or the session default) is applied to the request's whole prefix when
SGLang inserts it; counters are exported for `/tiers/stats` and, with `--enable-metrics`, as Prometheus counters
created in the scheduler process (SGLang's multiprocess registry exports them on `/metrics`).

Threading: like RadixCache, called only from the scheduler thread; `tier_stats_dict` is read on that thread
too (through `get_internal_state`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Optional

from sglang_ext.request_api import TTL_PARAM
from sglang_ext.tiered_cache import TieredRadixCache


HIT_TIERS = ("device", "host", "storage")


def request_ttl_s(req) -> Optional[float]:
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    value = params.get(TTL_PARAM) if isinstance(params, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def tenant_label(salt: Optional[str]) -> str:
    """Tenants appear in stats as a digest of their salt: an operator who knows a salt can find it, a tenant
    reading the stats cannot learn another tenant's salt."""
    return "default" if not salt else "t-" + hashlib.sha256(salt.encode()).hexdigest()[:12]


class PrometheusCounters:
    """Monotonic counters mirrored by delta from the cache's own per-tier counters, so the hot path never touches
    them. Only the events named here are exported (gauges such as retained tokens are not counters)."""

    EVENTS = ("inserts", "admissions_rejected", "rejected_tokens", "evictions", "evicted_tokens",
              "retained_evictions", "hit_requests", "hit_tokens", "retains", "ttl_refreshes", "ttl_expiries",
              "admitted", "rejected", "demotions", "dropped", "sketch_resets")

    def __init__(self):
        from prometheus_client import Counter

        self._counter = Counter("sglang_ext_tier_events", "Tiered KV cache events by kind and tier",
                                ["event", "tier"])
        self._last = {}

    def sync(self, per_tier: dict) -> None:
        """`per_tier`: {tier: {event: running total}}."""
        for tier, values in per_tier.items():
            for name in self.EVENTS:
                value = values.get(name, 0)
                delta = value - self._last.get((tier, name), 0)
                if delta > 0:
                    self._counter.labels(event=name, tier=tier).inc(delta)
                self._last[(tier, name)] = value


class ServedRequests:
    """What every served tree cache does per request (mixed in before the SGLang cache class): stash the request's
    retention TTL while SGLang inserts its prompt, count hits, and mirror counters to Prometheus."""

    _request_ttl_s: Optional[float] = None

    def _init_served(self, enable_metrics: bool, stats_tenants: bool = False) -> None:
        self._stats_tenants = stats_tenants  # per-tenant occupancy in /tiers/stats (--tier-stats-tenants)
        self._served = {"hit_requests": 0, "hit_tokens": 0}
        # SGLang splits each request's cached prefix by where it came from (device / host / storage=peer tier)
        self._tier_hits = {tier: {"hit_requests": 0, "hit_tokens": 0} for tier in HIT_TIERS}
        self._metrics = PrometheusCounters() if enable_metrics else None

    def _count_hits(self, req) -> None:
        cached = getattr(req, "cached_tokens", 0) or 0
        self._served["hit_requests"] += cached > 0
        self._served["hit_tokens"] += cached
        for tier, hits in self._tier_hits.items():
            n = getattr(req, f"cached_tokens_{tier}", 0) or 0
            hits["hit_requests"] += n > 0
            hits["hit_tokens"] += n

    def cache_unfinished_req(self, req, *args, **kwargs):
        self._request_ttl_s = request_ttl_s(req)
        try:
            return super().cache_unfinished_req(req, *args, **kwargs)
        finally:
            self._request_ttl_s = None

    def cache_finished_req(self, req, *args, **kwargs):
        self._request_ttl_s = request_ttl_s(req)
        self._count_hits(req)
        try:
            return super().cache_finished_req(req, *args, **kwargs)
        finally:
            self._request_ttl_s = None
            if self._metrics is not None:
                self._metrics.sync(self.tier_counters())


class ServingTieredCache(ServedRequests, TieredRadixCache):
    def __init__(self, params, *, enable_metrics: bool = False, stats_tenants: bool = False, **kwargs):
        super().__init__(params, **kwargs)
        self._init_served(enable_metrics, stats_tenants)

    def insert(self, params, ttl_s: Optional[float] = None):
        return super().insert(params, ttl_s if ttl_s is not None else self._request_ttl_s)

    # ---- observability ----
    def counters(self) -> dict:
        stats = dataclasses.asdict(self.tier_stats())
        retention = self.retention
        stats.update(**self._served, retains=retention.retains,
                     ttl_refreshes=retention.refreshes, ttl_expiries=retention.expiries,
                     retained_tokens=retention.retained_size)
        return stats

    def tier_counters(self) -> dict:
        return {"device": self.counters()}

    def occupancy_by_tenant(self) -> dict:
        out = {}
        for child in self.root_node.children.values():
            label = tenant_label(getattr(child.key, "cache_salt", None))
            size, stack = 0, [child]
            while stack:
                node = stack.pop()
                size += len(node.key)
                stack.extend(node.children.values())
            out[label] = out.get(label, 0) + size
        return out

    def tier_stats_dict(self) -> dict:
        counters = self.counters()
        out = {
            "policy": counters.pop("policy"),
            "tiers": {"device": {"capacity_tokens": counters.pop("capacity_tokens"),
                                 "used_tokens": counters.pop("size_tokens"), **counters}},
        }
        if self._stats_tenants:
            out["tenants"] = {label: {"device_tokens": n} for label, n in sorted(self.occupancy_by_tenant().items())}
        return out
