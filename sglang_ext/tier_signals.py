"""Operator signals (tiers.signals) for a served tree cache: where they are fed from and how they are exported.

Design note
-----------
- Stores and removals: SGLang reports every block stored in or removed from a tier to its KV-event recorder
  (`cache.kv_events.record_store / record_remove`, with the medium: GPU = device, CPU = host), on every path:
  inserts, host write-through acks, load-backs, demotions, drops, host evictions. `SignalingRecorder` wraps that
  recorder, feeds the tier's `TierSignals`, then forwards the call unchanged (SGLang still decides whether events
  are published). The entry's birth stamp and hit flag live on the TreeNode, one attribute per tier (the front
  part SGLang splits off a node has none: its eviction counts, without a lifetime). A failing hook is logged
  and swallowed (`observe`): the signals never stop the scheduler. Known gap:
  HiRadixCache re-filling an evicted node's device value in place during insert (KV recomputed after a failed
  load-back) reports no store, so it is not counted.
- Hits: the cache calls `matched` with each scheduling lookup's MatchResult (not with its own internal
  lookups): nodes on the matched path are marked hit in the tier that holds them. Hit tokens for the thrash rule
  come from each finished request's own per-tier split (`hit`), so a lookup the scheduler retries counts once.
- Fragmentation of the device pool: the allocator's free page ids, sorted, as runs of consecutive pages; sampled
  at most once per FRAGMENTATION_INTERVAL_S (a sort of the free list), on a stats read or an export.
- Export: `tier_stats` adds each tier's snapshot to `/tiers/stats`; `counts` gives the monotonic ones (and the
  peer tier's health counters) to the Prometheus event counters; `export_gauges` sets the rates, thrash flag,
  lifetimes, fragmentation and retained tokens as gauges, and the self-tuner's state (tiers.shadow.TuningStats:
  which setting is live, its switches, the shadows' windowed hit rates) where a tuner runs.
  The scheduler refreshes the gauges while idle too (plugin hook on `Scheduler.on_idle`, at most once per
  second), so a quiet server's velocities decay to 0 and its thrash flag clears.

Threading: the scheduler thread only, like the tree cache that owns it.
"""

from __future__ import annotations

import logging
import math
from typing import Dict, Iterable, Optional

from sglang.srt.disaggregation.kv_events import StorageMedium

from tiers.clock import Clock, MonotonicClock
from tiers.signals import Every, Fragmentation, TierSignals

logger = logging.getLogger(__name__)

FRAGMENTATION_INTERVAL_S = 5.0
IDLE_REFRESH_S = 1.0
GAUGES = ("eviction_tokens_per_s", "store_tokens_per_s", "evictions_per_s", "stores_per_s", "hit_tokens_per_s",
          "thrashing", "evicted_lifetime_s", "evicted_lifetime_tokens", "evicted_never_hit_share")
COUNTS = ("cold_miss_tokens", "capacity_miss_tokens", "stored_entries", "stored_tokens", "evicted_entries",
          "evicted_never_hit")
FRAGMENTATION_GAUGES = ("free_pages", "free_runs", "largest_free_run_pages")
GHOST_BLOCK = 16  # tokens
GHOST_BLOCKS = 5  # keys an eviction leaves: its start and its first 4 aligned blocks (64 tokens)
PEER_COUNTS = ("peer_hits", "peer_misses", "peer_errors", "peer_corrupt", "peer_store_failures")
_STAMP = {"device": "_signals_device", "host": "_signals_host"}  # node attribute: [Birth, hit]


def tier_of(medium) -> Optional[str]:
    if medium is None or medium == StorageMedium.GPU:
        return "device"
    return "host" if medium == StorageMedium.CPU else None


def ghost_keys(node, blocks: int) -> list:
    """Keys for the miss breakdown, independent of where the tree happens to split a prefix: (tokens from the
    node's start, its depth), then (each GHOST_BLOCK-token block at a depth that is a multiple of GHOST_BLOCK,
    its depth) for the first `blocks - 1` such blocks. A store looks up its first key: its first aligned block
    if it has one, else its start. So a prefix evicted as one node and stored again from a later split point
    (HiRadixCache splits nodes that wait in the host tier) is still recognised within its first blocks."""
    depth = _depth(node)
    # the key's namespace too: a tenant's store must not count as a capacity miss of another tenant's eviction
    tokens, extra = node.key.token_ids, (node.key.extra_key, node.key.cache_salt)
    aligned = []
    for offset in range(-depth % GHOST_BLOCK, len(tokens) - GHOST_BLOCK + 1, GHOST_BLOCK):
        if len(aligned) == max(1, blocks - 1):
            break
        aligned.append(hash((extra, depth + offset, _block(tokens, offset))))
    start = hash((extra, -1 - depth, _block(tokens, 0)))  # a negative depth: never equal to a block's key
    if blocks == 1:
        return aligned or [start]
    return [start] + aligned


def _depth(node) -> int:
    """Tokens above `node` (its start in the prompt). Memoized on each node with the key object it was computed
    for: SGLang gives a split node's back part a new key object, so a stale value is never used."""
    chain = []
    while node is not None:
        memo = getattr(node, "_signals_depth", None)
        if memo is not None and memo[0] is node.key:
            depth = memo[1]
            break
        chain.append(node)
        node = node.parent
    else:
        depth = None
    for n in reversed(chain):  # from the top-most node not memoized down to the one asked for
        depth = 0 if n.parent is None else depth + len(n.parent.key)
        n._signals_depth = (n.key, depth)
    return depth


def _block(tokens, offset: int):
    piece = tokens[offset:offset + GHOST_BLOCK]
    return piece.tobytes() if hasattr(piece, "tobytes") else tuple(piece)


def pool_fragmentation(allocator) -> Optional[Fragmentation]:
    import torch

    get = getattr(allocator, "get_all_free_pages", None)
    if get is None:
        return None
    pages = get()
    n = int(pages.numel())
    if n == 0:
        return Fragmentation(0, 0, 0, int(allocator.page_size))
    pages = torch.sort(pages.flatten()).values
    breaks = torch.nonzero(pages[1:] - pages[:-1] != 1).flatten()
    edges = torch.cat([breaks.new_tensor([-1]), breaks, breaks.new_tensor([n - 1])])
    largest = int((edges[1:] - edges[:-1]).max().item())
    return Fragmentation(n, int(breaks.numel()) + 1, largest, int(allocator.page_size))


class ServingSignals:
    def __init__(self, tiers: Iterable[str], allocator=None, clock: Optional[Clock] = None):
        clock = clock or MonotonicClock()
        self.signals: Dict[str, TierSignals] = {tier: TierSignals(clock) for tier in tiers}
        self.allocator = allocator
        self._fragmentation_due = Every(clock, FRAGMENTATION_INTERVAL_S)
        self._export_due = Every(clock, IDLE_REFRESH_S)
        self._idle_due = Every(clock, IDLE_REFRESH_S)
        self.fragmentation: Optional[Fragmentation] = None
        self._gauges = None
        self._tuning_labels: set = set()  # the settings the tuner gauges have a series for

    # ---- feeding ----
    def stored(self, node, medium) -> None:
        tier = tier_of(medium)
        signals = self.signals.get(tier)
        if signals is not None and node.key is not None:
            setattr(node, _STAMP[tier], [signals.stored(ghost_keys(node, 1)[0], len(node.key)), False])

    def removed(self, node, medium) -> None:
        tier = tier_of(medium)
        signals = self.signals.get(tier)
        if signals is None or node.key is None:
            return
        stamp = getattr(node, _STAMP[tier], None)
        setattr(node, _STAMP[tier], None)
        birth, was_hit = stamp if stamp else (None, False)
        signals.evicted(ghost_keys(node, GHOST_BLOCKS), len(node.key), birth, was_hit)

    def matched(self, result, root) -> None:
        node = getattr(result, "last_host_node", None) or result.last_device_node
        while node is not None and node is not root:
            stamp = getattr(node, _STAMP["host" if node.evicted else "device"], None)
            if stamp:
                if stamp[1]:
                    break  # marked by an earlier lookup, and so were the nodes above it then
                stamp[1] = True
            node = node.parent

    def hit(self, tier: str, tokens: int) -> None:
        signals = self.signals.get(tier)
        if signals is not None:
            signals.hit(tokens)

    # ---- reading ----
    def sample_fragmentation(self) -> Optional[Fragmentation]:
        if self.allocator is not None and self._fragmentation_due.due():
            self.fragmentation = pool_fragmentation(self.allocator)
        return self.fragmentation

    def tier_stats(self, tiers: dict) -> None:
        """Add each tier's signals to its `/tiers/stats` entry (and the device pool's fragmentation)."""
        for tier, signals in self.signals.items():
            tiers.setdefault(tier, {}).update(signals.snapshot().as_dict())
        fragmentation = self.sample_fragmentation()
        if fragmentation is not None:
            tiers.setdefault("device", {})["fragmentation"] = fragmentation.as_dict()

    def counts(self, per_tier: dict, storage_backend=None) -> dict:
        """`per_tier` (tier -> counters) with each tier's monotonic signal counts added, for the event counters,
        and the peer tier's health counters when `storage_backend` is the project's PeerStorage."""
        out = {tier: dict(values) for tier, values in per_tier.items()}
        for tier, signals in self.signals.items():
            out.setdefault(tier, {}).update({name: getattr(signals, name) for name in COUNTS})
        stats = getattr(storage_backend, "stats", None)
        stats = stats() if callable(stats) else None
        if stats is not None:
            out.setdefault("storage", {}).update(
                {name: getattr(stats, name[len("peer_"):], 0) for name in PEER_COUNTS})
        return out

    def export_gauges(self, retained_tokens: int = 0, tuner=None, force: bool = False) -> None:
        """Set the gauges, at most once per IDLE_REFRESH_S unless forced (called per request and while idle).
        `tuner`: the self-tuner (tiers.shadow.ShadowTuner), or None where none runs; its stats are read only
        when the gauges are due."""
        if not (self._export_due.due() or force):
            return
        gauges = self._gauges or prometheus_gauges()
        self._gauges = gauges
        gauges["retained_tokens"].set(retained_tokens)
        if tuner is not None:
            self._export_tuning(gauges, tuner.stats())
        for tier, signals in self.signals.items():
            snap = signals.snapshot()
            for name in GAUGES:
                value = getattr(snap, name)
                gauges[name].labels(tier=tier).set(float(value) if value is not None else 0.0)
        fragmentation = self.sample_fragmentation()
        if fragmentation is not None:
            for name in FRAGMENTATION_GAUGES:
                gauges[name].set(getattr(fragmentation, name))

    def _export_tuning(self, gauges: dict, tuning) -> None:
        """One series per candidate setting. A setting the tuner dropped (a TTL twin, once the first requests
        carried no client TTLs) keeps its series, not its last value: live 0, shadow hit rate NaN (no shadow).
        (Removing the series would not do: SGLang's metrics are multi-process, and that mode keeps the last
        value of a removed label set.)"""
        settings = set(tuning.shadow_hit_rates) | {tuning.live}
        for gone in self._tuning_labels - settings:
            gauges["tuner_live"].labels(setting=gone).set(0.0)
            gauges["tuner_shadow_hit_rate"].labels(setting=gone).set(math.nan)
        self._tuning_labels |= settings
        for name in settings:
            gauges["tuner_live"].labels(setting=name).set(1.0 if name == tuning.live else 0.0)
            gauges["tuner_shadow_hit_rate"].labels(setting=name).set(tuning.shadow_hit_rates.get(name, 0.0))
        gauges["tuner_switches"].set(tuning.switches)
        gauges["tuner_live_tree_hit_rate"].set(tuning.live_tree_hit_rate)
        gauges["tuner_sample_rate"].set(tuning.sample_rate)


_observer_failed = False


def observe(fn, *args) -> None:
    """Call a signal hook from the scheduler's path; an exception is logged the first time and swallowed."""
    global _observer_failed
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - the signals must never stop the scheduler
        if not _observer_failed:
            _observer_failed = True
            logger.exception("operator signals: a hook failed; serving goes on (further failures not logged)")


def refresh_on_idle(result, scheduler, *args, **kwargs):
    """AFTER hook on Scheduler.on_idle (which spins while idle): export at most once per IDLE_REFRESH_S."""
    cache = getattr(scheduler, "tree_cache", None)
    signals = getattr(cache, "_signals", None)
    if isinstance(signals, ServingSignals) and signals._idle_due.due():
        observe(cache.refresh_signals)
    return result


class SignalingRecorder:
    """Wraps SGLang's KVCacheEventRecorder: feeds the signals, then forwards every call unchanged. Signals are
    an observer: a failure in them is logged (once) and never reaches SGLang's tree code."""

    def __init__(self, inner, signals: ServingSignals):
        self._inner, self._signals = inner, signals

    def record_store(self, node, medium=None, **kwargs):
        observe(self._signals.stored, node, medium)
        return self._inner.record_store(node, medium, **kwargs)

    def record_remove(self, node, medium=None):
        observe(self._signals.removed, node, medium)
        return self._inner.record_remove(node, medium)

    def __getattr__(self, name):
        return getattr(self._inner, name)


_GAUGES: Optional[dict] = None


def prometheus_gauges() -> dict:
    """The gauge families, created once per process (a second registration of a name would raise)."""
    global _GAUGES
    if _GAUGES is None:
        from prometheus_client import Gauge

        helps = {
            "eviction_tokens_per_s": "Tokens evicted per second over the signal window",
            "store_tokens_per_s": "Tokens stored per second over the signal window",
            "evictions_per_s": "Entries freed per second over the signal window (churn)",
            "stores_per_s": "Entries allocated per second over the signal window (churn)",
            "hit_tokens_per_s": "Cached tokens served per second over the signal window",
            "thrashing": "1 while evictions exceed 0.9 x stores over the window and stores dominate lookups",
            "evicted_lifetime_s": "Mean lifetime in seconds of entries evicted in the window",
            "evicted_lifetime_tokens": "Mean lifetime in tokens stored meanwhile of entries evicted in the window",
            "evicted_never_hit_share": "Share of entries evicted in the window that were never hit",
        }
        gauges = {name: Gauge(f"sglang_ext_tier_{name}", text, ["tier"], multiprocess_mode="mostrecent")
                  for name, text in helps.items()}
        for name, text in (("free_pages", "Free pages of the device KV pool"),
                           ("free_runs", "Runs of consecutive free pages in the device KV pool"),
                           ("largest_free_run_pages", "Largest run of consecutive free pages in the device pool")):
            gauges[name] = Gauge(f"sglang_ext_device_{name}", text, multiprocess_mode="mostrecent")
        gauges["retained_tokens"] = Gauge("sglang_ext_retained_tokens", "Tokens held under a retention TTL",
                                          multiprocess_mode="mostrecent")
        for name, text in (
                ("live", "1 for the setting the self-tuner runs the live cache on, 0 for the other candidates"),
                ("shadow_hit_rate", "Windowed token hit rate of each candidate's shadow cache (sampled traffic)")):
            gauges[f"tuner_{name}"] = Gauge(f"sglang_ext_tuner_{name}", text, ["setting"],
                                            multiprocess_mode="mostrecent")
        for name, text in (("switches", "Times the self-tuner changed the live setting since the server started"),
                           ("live_tree_hit_rate", "The live cache's windowed token hit rate on the sampled traffic"),
                           ("sample_rate", "Share of prefix chains the shadow caches see (0 while warming up)")):
            gauges[f"tuner_{name}"] = Gauge(f"sglang_ext_tuner_{name}", text, multiprocess_mode="mostrecent")
        _GAUGES = gauges
    return _GAUGES
