"""TieredHiRadixCache: SGLang's HiRadixCache (device + host tiers) with the project's admission and retention.

Design note
-----------
With the host tier on, SGLang's HiRadixCache owns the two-level tree, the host pool and the asynchronous
device<->host copies; this subclass changes only the decisions, at SGLang's own override points:

- Host admission (`_inc_hit_count`): stock write-through backs up every node on its first insert, and
  `write_through_selective` on its second. Here a node goes to host memory if it is retained or its request
  carries a TTL (so that a device eviction can demote it instead of dropping it), or if the host pool has room,
  or, when the pool is full, if its TinyLFU frequency (tiers.sketch, counted on every insert walk) beats that
  of the coldest of a small sample of evictable host leaves (Caffeine's admission, with its anti-flooding
  jitter; the sketch is seeded at random). Rejections are counted. A node's sketch key hashes its path; after
  a split the front part keeps it and the back part gets its own.
- Eviction order (device and host): `--tier-policy` picks it. `tinylfu` evicts the leaf with the lowest
  frequency in the same aged sketch first (TinyLFU's eviction side), the least recently used among equals;
  `lru` / `lfu` / `slru` are SGLang's own orders of those names. HiRadixCache still walks the tree (leaves
  only, a parent once its children are gone, locked nodes skipped); only the order is ours. The class-based
  tree policies of `tiers/policies` need insert/remove notifications that HiRadixCache's many device<->host
  paths do not give in one place, so they drive the device-only cache (tiered_cache), not this one.
- Retention (tiers.retention): a request's TTL (from `cache_control` or the session default, carried as in
  serving_cache) retains the nodes of its prompt, each once per insert; a hit refreshes them. Every order is
  wrapped so that retained nodes go last, and a retained node leaving the device is always demoted (it was backed up at
  admission), never dropped while it is retained.
- Counters per tier for `/tiers/stats` and Prometheus: hits (device / host / storage, from SGLang's own split
  of each request's cached prefix), host admissions and rejections, device evictions (demoted or dropped),
  host evictions, retention and sketch events.

Threading: the scheduler thread only, like HiRadixCache's tree (the copies run on the controller's threads).
"""

from __future__ import annotations

import itertools
from typing import Optional

from sglang.srt.mem_cache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.utils import get_eviction_strategy

from sglang_ext.serving_cache import ServedRequests, tenant_label
from sglang_ext.tier_config import TierConfig
from tiers.clock import MonotonicClock
from tiers.retention import Retention
from tiers.sketch import FrequencySketch

HOST_VICTIM_SAMPLE = 16


class TinyLFUOrder:
    """An SGLang eviction strategy: least frequent first by the aged sketch, least recently used among equals."""

    def __init__(self, sketch: FrequencySketch, key_of):
        self.sketch, self.key_of = sketch, key_of

    def get_priority(self, node):
        return (self.sketch.estimate(self.key_of(node)), node.last_access_time)


class RetainedLast:
    """An SGLang eviction strategy: retained nodes sort after every unretained one, then SGLang's own order."""

    def __init__(self, base, retention: Retention):
        self.base, self.retention = base, retention

    def get_priority(self, node):
        return (self.retention.is_retained(node), self.base.get_priority(node))


class TieredHiRadixCache(ServedRequests, HiRadixCache):
    def __init__(self, params, server_args, *, policy: str = "tinylfu", retention_budget: float = 0.5,
                 enable_metrics: bool = False, stats_tenants: bool = False, clock=None,
                 sketch_seed: Optional[int] = None):
        TierConfig(policy=policy).check_host_tier()
        self._policy_name = policy
        self._n = dict(host_admitted=0, host_rejected=0, demotions=0, dropped=0, device_evicted_tokens=0,
                       host_evicted_tokens=0)
        super().__init__(params, server_args)
        self._init_served(enable_metrics, stats_tenants, signal_tiers=("device", "host"))
        self._clock, self._retention_budget, self._sketch_seed = clock or MonotonicClock(), retention_budget, sketch_seed
        self._fresh_policy_state()

    def _fresh_policy_state(self) -> None:
        """Retention, sketch and eviction order for an empty tree (at start and after a flush)."""
        device_tokens = max(1, int(self.token_to_kv_pool_allocator.size))
        host_tokens = max(1, int(self.cache_controller.mem_pool_host.size))
        # Retained prefixes end up in host memory (demoted, not dropped): the budget is a fraction of the host tier.
        self.retention = Retention(max(device_tokens, host_tokens), self._clock, self._retention_budget)
        # A random seed (tests inject one): a client that cannot know it cannot pick keys whose counters collide.
        self.sketch = FrequencySketch(max(64, host_tokens // 16), seed=self._sketch_seed)
        order = (TinyLFUOrder(self.sketch, self._sketch_key) if self._policy_name == "tinylfu"
                 else get_eviction_strategy(self._policy_name))
        self.eviction_strategy = RetainedLast(order, self.retention)

    def reset(self):
        """SGLang's flush (`/flush_cache`) empties both pools; the retention and sketch of the old tree go too, or
        retained tokens that no longer exist would hold the budget. Counters stay monotonic."""
        super().reset()
        if hasattr(self, "retention"):  # HiRadixCache's constructor resets before ours has run
            self._fresh_policy_state()

    # ---- admission to the host tier ----
    def _sketch_key(self, node) -> int:
        key = getattr(node, "sketch_key", None)
        if key is None:
            parent = node.parent
            parent_key = 0 if parent is None or parent is self.root_node else self._sketch_key(parent)
            key = node.sketch_key = hash((parent_key, node.key.child_key(self.page_size)))
        return key

    def _split_node(self, key, child, split_len):
        front_key = getattr(child, "sketch_key", None)
        new_node = super()._split_node(key, child, split_len)
        # The front keeps the path's identity and counts; the back is keyed afresh under its new parent (it
        # would otherwise share the front's counters).
        if front_key is not None:
            new_node.sketch_key = front_key
            child.sketch_key = None
        self.retention.resize(child, len(child.key))
        return new_node

    def _inc_hit_count(self, node, chunked=False):
        if self.cache_controller.write_policy == "write_back" or chunked:
            return
        node.hit_count += 1
        key = self._sketch_key(node)
        self.sketch.increment(key)
        if node.backuped or not self._admit_to_host(node, key):
            return
        if self.write_backup(node):
            self._n["host_admitted"] += 1

    def _admit_to_host(self, node, key) -> bool:
        # A request with a TTL is about to retain its path (after this insert): back it up now, so that a
        # device eviction demotes it rather than drops it.
        if self._request_ttl_s is not None or self.retention.is_retained(node):
            return True
        if self.cache_controller.mem_pool_host.available_size() >= len(node.value):
            return True
        sample = [leaf for leaf in itertools.islice(self.evictable_host_leaves, HOST_VICTIM_SAMPLE)
                  if leaf.evicted and leaf.host_ref_counter == 0]
        if not sample:
            self._n["host_rejected"] += 1
            return False
        victim = min(sample, key=self.eviction_strategy.get_priority)
        if self.sketch.admit_with_jitter(self.sketch.estimate(key), self.sketch.estimate(self._sketch_key(victim))):
            return True
        self._n["host_rejected"] += 1
        return False

    # ---- retention ----
    def insert(self, params):
        result = super().insert(params)
        if self._request_ttl_s is not None:
            self._retain_path(params.key, self._request_ttl_s, skip_retained=params.chunked)
        return result

    def _retain_path(self, key, ttl_s: float, skip_retained: bool = False) -> None:
        """Retain, once each, the device nodes `key` passes through: a walk that changes nothing else (no hit
        refresh, no split, no access time). `skip_retained`: a topology-only or chunk re-insert, whose earlier
        nodes this request retained moments ago; only nodes new since then are retained."""
        key, _ = key.maybe_to_bigram_view(self.is_eagle)
        key = key.page_aligned(self.page_size)
        node, matched, page = self.root_node, 0, self.page_size
        while matched < len(key):
            child = node.children.get(key.child_key_at(matched, page))
            if child is None or child.evicted or child.key.match_at(key, matched, page_size=page) < len(child.key):
                break
            if not (skip_retained and self.retention.is_retained(child)):
                self.retention.retain(child, len(child.key), ttl_s)
            matched += len(child.key)
            node = child

    def match_prefix(self, params):
        result = super().match_prefix(params)
        node = result.last_device_node
        while node is not None and node is not self.root_node:  # a hit refreshes the path's retention
            self.retention.touch(node)
            node = node.parent
        return result

    # ---- eviction counts (the order is the strategy's) ----
    def evict(self, params):
        result = super().evict(params)
        self._n["device_evicted_tokens"] += result.num_tokens_evicted
        return result

    def _evict_backuped(self, node):
        self._n["demotions"] += 1
        return super()._evict_backuped(node)

    def _evict_regular(self, node):
        self._n["dropped"] += 1
        return super()._evict_regular(node)

    def evict_host(self, num_tokens: int):
        host = self.cache_controller.mem_pool_host
        before = host.available_size()
        result = super().evict_host(num_tokens)
        self._n["host_evicted_tokens"] += max(0, host.available_size() - before)
        return result

    # ---- observability ----
    def counters(self) -> dict:
        r = self.retention
        return {**self._n, **self._served, "retains": r.retains, "ttl_refreshes": r.refreshes,
                "ttl_expiries": r.expiries, "retained_tokens": r.retained_size, "sketch_resets": self.sketch.resets}

    def tier_counters(self) -> dict:
        n, r, hits = self._n, self.retention, self._tier_hits
        return {
            "device": {**hits["device"], "evictions": n["demotions"] + n["dropped"], "demotions": n["demotions"],
                       "dropped": n["dropped"], "evicted_tokens": n["device_evicted_tokens"],
                       "retains": r.retains, "ttl_refreshes": r.refreshes, "ttl_expiries": r.expiries},
            "host": {**hits["host"], "admitted": n["host_admitted"], "rejected": n["host_rejected"],
                     "evicted_tokens": n["host_evicted_tokens"], "sketch_resets": self.sketch.resets},
            "storage": dict(hits["storage"]),
        }

    def occupancy_by_tenant(self) -> dict:
        tenants = {}
        for child in self.root_node.children.values():
            label = tenant_label(getattr(child.key, "cache_salt", None))
            entry = tenants.setdefault(label, {"device_tokens": 0, "host_tokens": 0})
            stack = [child]
            while stack:
                n = stack.pop()
                entry["device_tokens"] += 0 if n.evicted else len(n.key)
                entry["host_tokens"] += len(n.key) if n.backuped else 0
                stack.extend(n.children.values())
        return dict(sorted(tenants.items()))

    def tier_stats_dict(self) -> dict:
        host = self.cache_controller.mem_pool_host
        occupancy = {
            "device": {"capacity_tokens": int(self.token_to_kv_pool_allocator.size),
                       "used_tokens": int(self.evictable_size_ + self.protected_size_)},
            "host": {"capacity_tokens": int(host.size), "used_tokens": int(host.size - host.available_size())},
            "storage": {},
        }
        per_tier = self.tier_counters()
        out = {
            "policy": f"{self._policy_name} (host admission: tinylfu)",
            "tiers": {tier: {**occupancy[tier], **per_tier[tier]} for tier in per_tier},
            "counters": self.counters(),
        }
        if self._stats_tenants:
            out["tenants"] = self.occupancy_by_tenant()
        self._signals.tier_stats(out["tiers"])
        return out
