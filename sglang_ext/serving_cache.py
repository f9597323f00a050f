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
import logging
from typing import Optional, Tuple

from sglang.srt.managers.schedule_batch import FINISH_ABORT

from sglang_ext.request_api import TTL_PARAM
from sglang_ext.tier_signals import COUNTS as SIGNAL_COUNTS, PEER_COUNTS, ServingSignals, SignalingRecorder, observe
from sglang_ext.tiered_cache import TieredRadixCache
from tiers.retention import validate_ttl_s

logger = logging.getLogger(__name__)


HIT_TIERS = ("device", "host", "storage")


def request_ttl_s(req) -> Tuple[Optional[float], bool]:
    """(ttl, refused): the retention TTL the middleware carried, checked again here because this runs inside the
    scheduler, where a raise stops the server. A value that is not a valid TTL (the middleware strips clients'
    copies, so only a route around it could send one) is refused: the request is served without retention."""
    params = getattr(getattr(req, "sampling_params", None), "custom_params", None)
    if not isinstance(params, dict) or TTL_PARAM not in params:
        return None, False
    try:
        return validate_ttl_s(params[TTL_PARAM]), False
    except (ValueError, TypeError):
        return None, True


def refused_on_arrival(req) -> bool:
    """Whether SGLang's scheduler refused the request as invalid (`Req.set_finish_with_abort`: an unknown
    session, a prompt too long, ...): its client gets a 4xx, and the prompt was replaced by one dummy token
    that is prefilled only to finish the request. Aborts without a 4xx (a client that went away) are not."""
    reason = getattr(req, "finished_reason", None)
    code = getattr(reason, "status_code", None)
    return isinstance(reason, FINISH_ABORT) and isinstance(code, int) and 400 <= code < 500


def tenant_label(salt: Optional[str]) -> str:
    """Tenants appear in stats as a digest of their salt: an operator who knows a salt can find it, a tenant
    reading the stats cannot learn another tenant's salt."""
    return "default" if not salt else "t-" + hashlib.sha256(str(salt).encode()).hexdigest()[:12]


class PrometheusCounters:
    """Monotonic counters mirrored by delta from the cache's own per-tier counters, so the hot path never touches
    them. Only the events named here are exported (gauges such as retained tokens are not counters)."""

    EVENTS = ("inserts", "admissions_rejected", "rejected_tokens", "evictions", "evicted_tokens",
              "retained_evictions", "hit_requests", "hit_tokens", "retains", "ttl_refreshes", "ttl_expiries",
              "admitted", "rejected", "demotions", "dropped", "refused_ttl_params"
              ) + SIGNAL_COUNTS + PEER_COUNTS

    def __init__(self):
        from prometheus_client import Counter

        self._counter = Counter("sglang_ext_tier_events", "Tiered KV cache events by kind and tier",
                                ["event", "tier"])
        self._last = {}

    def sync(self, per_tier: dict) -> None:
        """`per_tier`: {tier: {event: running total}}."""
        for tier, values in per_tier.items():
            for name in self.EVENTS:
                if name not in values:
                    continue
                value = values[name]
                if (tier, name) not in self._last:  # the series exists, at 0, from the first sync on
                    self._counter.labels(event=name, tier=tier)
                delta = value - self._last.get((tier, name), 0)
                if delta > 0:
                    self._counter.labels(event=name, tier=tier).inc(delta)
                self._last[(tier, name)] = value


class ServedRequests:
    """What every served tree cache does per request (mixed in before the SGLang cache class): stash the request's
    retention TTL while SGLang inserts its prompt, count hits, and mirror counters to Prometheus."""

    _request_ttl_s: Optional[float] = None
    _signals: Optional[ServingSignals] = None
    _cache_calls = 0  # > 0 inside cache_*_req, whose own lookups are not scheduling hits

    def _init_served(self, enable_metrics: bool, stats_tenants: bool = False, signal_tiers=("device",)) -> None:
        self._stats_tenants = stats_tenants  # per-tenant occupancy in /tiers/stats (--tier-stats-tenants)
        self._served = {"hit_requests": 0, "hit_tokens": 0, "refused_ttl_params": 0}
        # SGLang splits each request's cached prefix by where it came from (device / host / storage=peer tier)
        self._tier_hits = {tier: {"hit_requests": 0, "hit_tokens": 0} for tier in HIT_TIERS}
        self._metrics = PrometheusCounters() if enable_metrics else None
        if not signal_tiers:  # a shadow cache: no operator reads its signals
            return
        self._signals = ServingSignals(signal_tiers, self.token_to_kv_pool_allocator,
                                       getattr(self, "_tier_clock", None))
        self.kv_events = SignalingRecorder(self.kv_events, self._signals)  # every store/removal, every tier

    def _count_hits(self, req) -> None:
        cached = getattr(req, "cached_tokens", 0) or 0
        self._served["hit_requests"] += cached > 0
        self._served["hit_tokens"] += cached
        for tier, hits in self._tier_hits.items():
            n = getattr(req, f"cached_tokens_{tier}", 0) or 0
            hits["hit_requests"] += n > 0
            hits["hit_tokens"] += n
            if self._signals is not None:
                self._signals.hit(tier, n)

    def _take_request_ttl(self, req) -> Optional[float]:
        ttl, refused = request_ttl_s(req)
        if refused:
            self._served["refused_ttl_params"] += 1
            if self._served["refused_ttl_params"] % 1000 == 1:  # the first, then one in a thousand
                logger.warning("request %s carried an invalid internal TTL; served without retention (%d so far)",
                               getattr(req, "rid", "?"), self._served["refused_ttl_params"])
        return ttl

    def match_prefix(self, params):
        result = super().match_prefix(params)
        if self._signals is not None and not self._cache_calls:
            observe(self._signals.matched, result, self.root_node)
        return result

    def refresh_signals(self) -> None:
        """Export the signal counters and gauges now (the scheduler calls this while idle)."""
        if self._metrics is not None and self._signals is not None:
            storage = getattr(getattr(self, "cache_controller", None), "storage_backend", None)
            self._metrics.sync(self._signals.counts(self.tier_counters(), storage))
            self._signals.export_gauges(self.retention.retained_size, self.tuner)

    def cache_unfinished_req(self, req, *args, **kwargs):
        self._request_ttl_s = self._take_request_ttl(req)
        self._cache_calls += 1
        try:
            return super().cache_unfinished_req(req, *args, **kwargs)
        finally:
            self._request_ttl_s = None
            self._cache_calls -= 1

    def cache_finished_req(self, req, *args, **kwargs):
        if refused_on_arrival(req):  # a 4xx changes no state: its dummy token's KV is freed, nothing counted
            if args:
                args = (False,) + args[1:]
            else:
                kwargs["is_insert"] = False
            return super().cache_finished_req(req, *args, **kwargs)
        self._request_ttl_s = self._take_request_ttl(req)
        self._count_hits(req)
        self._cache_calls += 1
        try:
            return super().cache_finished_req(req, *args, **kwargs)
        finally:
            self._request_ttl_s = None
            self._cache_calls -= 1
            observe(self.refresh_signals)


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
        if self.tuner is not None:
            out["tuning"] = dataclasses.asdict(self.tuner.stats())
        if self._stats_tenants:
            out["tenants"] = {label: {"device_tokens": n} for label, n in sorted(self.occupancy_by_tenant().items())}
        self._signals.tier_stats(out["tiers"])
        return out
