"""TieredHiRadixCache: SGLang's HiRadixCache (device + host tiers) driven by the `tiers` policy on both tiers.

Design note
-----------
With the host tier on, SGLang's HiRadixCache owns the two-level tree, the host pool and the asynchronous
device<->host copies; this subclass makes the decisions with the policy `--tier-policy` names (any `tiers`
policy; `lru`/`lfu`/`slru` are the registry's equivalents of SGLang's strategies), one instance per tier, each
seeing only the nodes resident on its tier through a TierView (tier_views.py):

- Device eviction (`_evict_write_through`): the device policy's victims, in its order, leaves only, locked
  nodes protected; a backed-up victim is demoted (its host copy stays), any other is dropped. The device
  view hears of every node that gains device KV: insert's new node, an insert that revives an evicted node
  (both found by walking the inserted key afterwards), `load_back`, and the front part of a split.
- Host admission (`_inc_hit_count`, where stock write-through backs up on the first or second insert): a
  node goes to host memory if it is retained or its request carries a TTL (so that a device eviction can
  demote it instead of dropping it), or if the host pool has room, or, when it is full, if the host
  policy's `may_admit` and then `admit` against the host victims that would make room say so. Refusals
  are counted. The host view hears of every backup (`write_backup`), of host-only nodes a storage prefetch
  adds, and of splits.
- Host eviction (`evict_host`): the host policy's victims (host leaves whose device copy is gone, unlocked
  and not pinned by a copy in flight), in its order.
- Requests: each request is recorded once on both policies (its path's keys, its remainder's, its hit), at
  its first non-chunked insert; an insert's path nodes already on the device count as used, except those the
  request's own chunks inserted (marked as on the device-only tree, `tree_walk.OWN_CHUNK`).
- Drift: if a policy's victims are not evictable leaves of its tier, or fall short while unprotected
  evictable leaves remain, its view has drifted from the tree; the rest of that round goes in SGLang's own
  order (least recently used, retained last) and is logged; strict mode (tests) raises instead.
- Retention (tiers.retention): a request's TTL (from `cache_control` or the session default, carried as in
  serving_cache) retains the nodes of its prompt, each once per insert; a hit refreshes them. Both policies
  give retained nodes last; a retained node leaving the device is always demoted (it was backed up at
  admission), never dropped while it is retained.
- Self-tuning (tiers.shadow, `--tier-shadow-rate`): as on the device-only tree, the tuner samples whole prefix
  chains at their first insert and serves them on one shadow per candidate setting; a shadow is this class on
  simulated pools (simulated_host), both tiers scaled by the sample rate, serving each request as the scheduler
  does (match, load back, evict, insert, acknowledge). A switch steers both tiers' policies at once: `lru`
  (recency, every backup admitted) is stock HiCache's write-through LRU, here with client TTLs honoured, since a
  retained victim is demoted, not dropped (`tiers.shadow.HOST_TIER_SETTINGS`); `gated` the learned setting.
- Counters per tier for `/tiers/stats` and Prometheus: hits (device / host / storage, from SGLang's own split
  of each request's cached prefix), host admissions and rejections, device evictions (demoted or dropped),
  host evictions, retention events, policy calls and their time.

A node's policy key (`tier_key`) hashes its path (`tiers.keys.path_key` of its parent's key and first child key),
the same after an eviction and re-insert; after a split the front part keeps it and the back part gets its own.
`--hicache-write-policy write_back` is refused: its eviction backs up leaves whose parents are not on the
host, so host residency would not be closed upward. (`write_through_selective` behaves as `write_through`
here: admission is the policy's, not a hit count.)

Threading: the scheduler thread only, like HiRadixCache's tree (the copies run on the controller's threads).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from typing import Any, Dict, Optional

import torch
from sglang.srt.disaggregation.kv_events import StorageMedium
from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.utils import get_eviction_strategy

from sglang_ext.serving_cache import ServedRequests, tenant_label
from sglang_ext.simulated_host import serve_request, simulated_hicache
from sglang_ext.tier_views import TierView
from sglang_ext.tree_walk import is_own_chunk, mark_own_chunk, own_chunk_tokens, peek_path, used_before
from tiers.clock import MonotonicClock
from tiers.keys import path_key
from tiers.policy import Candidate, create_policy
from tiers.retention import Retention
from tiers.shadow import Setting, ShadowTuner, TuningConfig

logger = logging.getLogger(__name__)

_ROOT_KEY = 0
_RECORDED = "_tier_recorded"  # set on SGLang's Req once both policies have recorded it


class RetainedLast:
    """An SGLang eviction strategy: retained nodes sort after every unretained one, then SGLang's own order."""

    def __init__(self, base, retention: Retention):
        self.base, self.retention = base, retention

    def get_priority(self, node):
        return (self.retention.is_retained(node), self.base.get_priority(node))


class _HostTierShadow:
    """A simulated TieredHiRadixCache as a shadow cache (tiers.shadow.Shadow): serves a request on both of its
    tiers as the scheduler would (simulated_host.serve_request), reports its hit on either tier."""

    def __init__(self, cache: "TieredHiRadixCache"):
        self.cache = cache

    def request(self, request) -> tuple:
        full_key, priority, ttl_s = request
        cache = self.cache
        # a request longer than the miniature's device pool keeps its head, as in the replay; the rest is a miss
        key = full_key[: int(cache.token_to_kv_pool_allocator.size)]

        def finish(prefix: int) -> None:  # cache_finished_req: the request's KV joins the tree
            cache._request_ttl_s = ttl_s
            try:
                value = torch.arange(len(key), dtype=torch.int64)  # the pools only count: any indices do
                result = cache.insert(InsertParams(key=key, value=value, priority=priority))
            finally:
                cache._request_ttl_s = None
            if result.prefix_len > prefix:  # computed twice: the copy the tree had already goes back
                cache.token_to_kv_pool_allocator.free(range(prefix, result.prefix_len))

        served = serve_request(cache, key, len(key), finish)
        return served.device_tokens + served.host_tokens, len(full_key)


class TieredHiRadixCache(ServedRequests, HiRadixCache):
    def __init__(self, params, server_args, *, policy: str = "tinylfu", policy_config: Optional[Dict[str, Any]] = None,
                 retention_budget: float = 0.5, enable_metrics: bool = False, stats_tenants: bool = False,
                 clock=None, strict: bool = False, tuning: Optional[TuningConfig] = None, scale: float = 1.0,
                 signals: bool = True):
        """`tuning`: the self-tuner (tiers.shadow), whose shadows are miniatures of this class on simulated pools;
        `scale`: this tree is such a miniature, at that fraction of the cache it stands for (its policies size
        their classes against the full tiers and weigh their priors by the scale); `signals`: feed the operator
        signals of /tiers/stats and /metrics (off in a shadow, whose work is charged to the policy)."""
        self._policy_name, self._policy_config = policy, dict(policy_config or {})
        self._tuning, self._scale = tuning, scale
        self._strict = strict  # raise when a policy's view drifts from the tree (tests); else log and fall back
        self._n = dict(host_admitted=0, host_rejected=0, demotions=0, dropped=0, device_evicted_tokens=0,
                       host_evicted_tokens=0, fallback_rounds=0, shadow_ns=0)
        self._req_recorded = False  # inside cache_*_req of a request both policies have recorded already
        self._backed_up_now: Optional[set] = None  # inside insert: the nodes it backed up (new on the host)
        self._honours_ttls = True  # the live setting's: False while the self-tuner has client TTLs ignored
        super().__init__(params, server_args)
        if self.cache_controller.write_policy == "write_back":
            raise ValueError("--hicache-write-policy write_back does not work with the tiered cache (its eviction "
                             "backs up leaves whose parents are not on the host); use write_through or "
                             "write_through_selective")
        self._init_served(enable_metrics, stats_tenants, signal_tiers=("device", "host") if signals else ())
        self._clock, self._retention_budget = clock or MonotonicClock(), retention_budget
        self._fresh_policy_state()

    def _fresh_policy_state(self) -> None:
        """Retention and both tiers' policies for an empty tree (at start and after a flush)."""
        device_tokens = max(1, int(self.token_to_kv_pool_allocator.size))
        host_tokens = max(1, int(self.cache_controller.mem_pool_host.size))
        # Retained prefixes end up in host memory (demoted, not dropped): the budget is a fraction of the host tier.
        self.retention = Retention(max(device_tokens, host_tokens), self._clock, self._retention_budget)
        self.root_node.tier_key = _ROOT_KEY
        self.device_view = self._view("device", device_tokens)
        self.host_view = self._view("host", host_tokens)
        # SGLang's own order, for a round whose policy drifted
        self.eviction_strategy = RetainedLast(get_eviction_strategy("lru"), self.retention)
        self.tuner = None
        if self._tuning is not None and hasattr(self.device_view.inner, "steer"):
            self.tuner = ShadowTuner(self._tuning, device_tokens, self._make_shadow, device_tokens + host_tokens)
            self._steer(self.tuner.live)

    def _view(self, tier: str, capacity: int) -> TierView:
        config = dict(self._policy_config)
        if self._scale != 1.0:
            config.update(class_capacity=round(capacity / self._scale), prior_weight=self._scale)
        policy = create_policy(self._policy_name, capacity, clock=self._clock, **config)
        return TierView(tier, policy, self.retention, self.root_node, self._strict)

    # ---- self-tuning ----
    def _steer(self, setting: Setting) -> None:
        """Both tiers run the setting: with `recency`, device and host evict least recently used first and the
        host takes every backup, as stock HiCache's write-through does."""
        for view in (self.device_view, self.host_view):
            if hasattr(view.inner, "steer"):  # a recency miniature's policy has that order only
                view.inner.steer(setting.order, setting.gate_threshold)
        self._honours_ttls = setting.honours_ttls
        if not setting.honours_ttls:
            self.retention.release_all()

    def _make_shadow(self, setting: Setting, device_tokens: int) -> _HostTierShadow:
        """A miniature of this cache running `setting`: this class on simulated pools, both tiers scaled alike,
        the same policy, retention budget and clock; no tuner, no signals, no KV."""
        scale = device_tokens / max(1, int(self.token_to_kv_pool_allocator.size))
        host_tokens = max(1, round(int(self.cache_controller.mem_pool_host.size) * scale))
        policy, config = setting.miniature_policy(self._policy_name, self._policy_config)
        shadow = simulated_hicache(
            TieredHiRadixCache, device_tokens, host_tokens, record_host_evictions=False,
            load_back_threshold=self.load_back_threshold,  # in tokens, as the shadow's page of 1 token
            policy=policy, policy_config=config, retention_budget=self._retention_budget,
            clock=self._clock, strict=self._strict, scale=scale, signals=False)
        shadow._steer(setting)
        return _HostTierShadow(shadow)

    def _offer_to_shadows(self, keys, key, priority: int, hit: int) -> None:
        """Let the tuner sample the request (the tree held `hit` tokens of it, on either tier); switch both
        tiers' setting if it says so. Counted as device policy cost (the shadows' work is the tuner's)."""
        t0 = time.perf_counter_ns()
        ttl_s = self._request_ttl_s
        setting = self.tuner.offer(keys, (key, priority, ttl_s), len(key), hit, carries_ttl=ttl_s is not None)
        if setting is not None:
            self._steer(setting)
            logger.info("shadow tuner: both tiers now run %r (%s)", setting.name, self.tuner.stats())
        self._n["shadow_ns"] += self.device_view.charge(t0, 1)  # of policy_ns, the self-tuner's

    def reset(self):
        """SGLang's flush (`/flush_cache`) empties both pools; the retention and policies of the old tree go too,
        or retained tokens that no longer exist would hold the budget. Counters stay monotonic."""
        super().reset()
        if hasattr(self, "retention"):  # HiRadixCache's constructor resets before ours has run
            self._fresh_policy_state()

    # ---- keys and splits ----
    def _tier_key(self, node) -> int:
        key = getattr(node, "tier_key", None)
        if key is None:
            key = node.tier_key = path_key(self._tier_key(node.parent), node.key.child_key(self.page_size))
        return key

    def _split_node(self, key, child, split_len):
        front_key = self._tier_key(child)
        new_node = super()._split_node(key, child, split_len)
        # The front keeps the path's identity; the back is keyed afresh under its new parent.
        new_node.tier_key = front_key
        mark_own_chunk(new_node, is_own_chunk(child))
        child.tier_key = path_key(front_key, child.key.child_key(self.page_size))
        if hasattr(self, "device_view"):
            self.device_view.split(new_node, child)
            self.host_view.split(new_node, child)
        self.retention.resize(child, len(child.key))
        return new_node

    # ---- requests: recording and insert ----
    def _peek(self, key):
        """(nodes the key passes through, on any tier; matched length, last node): changes nothing."""
        return peek_path(self.root_node, key, self.page_size)

    def _walk(self, key):
        """The nodes along `key` after an insert made its whole path (stops early on a partial match)."""
        node, matched, page = self.root_node, 0, self.page_size
        while matched < len(key):
            child = node.children.get(key.child_key_at(matched, page))
            if child is None or child.key.match_at(key, matched, page_size=page) < len(child.key):
                return
            yield child
            matched += len(child.key)
            node = child

    def _record_request(self, key, priority: int) -> None:
        """Both policies learn what a request asked for: its path's keys, its remainder's, and its hit there;
        then the self-tuner may sample it."""
        path, matched, anchor = self._peek(key)
        keys = [self._tier_key(n) for n in path]
        if matched < len(key):
            keys.append(path_key(self._tier_key(anchor), key.child_key_at(matched, self.page_size)))
        before = [n for n in path if not is_own_chunk(n)]  # not the request's own chunks
        on_device = sum(len(n.key) for n in before if not n.evicted)
        on_host = sum(len(n.key) for n in before if n.backuped)
        hit = matched - own_chunk_tokens(path)
        self.device_view.record(keys, min(on_device, hit), len(key))
        self.host_view.record(keys, min(on_host, hit), len(key))
        if self.tuner is not None:
            self._offer_to_shadows(keys, key, priority, hit)

    def insert(self, params):
        key, _ = params.key.maybe_to_bigram_view(self.is_eagle)
        key = key.page_aligned(self.page_size)
        counted = not params.chunked and not self._req_recorded
        if counted and len(key):
            self._record_request(key, params.priority)
        if not self._honours_ttls:  # the shadows were offered the TTL: each honours it as its setting says
            self._request_ttl_s = None
        self._backed_up_now = set()
        try:
            result = super().insert(params)
        finally:
            backed_up_now, self._backed_up_now = self._backed_up_now, None
        on_device = []  # the path's nodes that hold device KV, root first
        for node in self._walk(key):  # new and revived nodes hold device KV now; the others were used
            if node.evicted:
                break
            on_device.append(node)
            used = counted and used_before(node)  # the request's own chunks were not used, but computed
            if node not in self.device_view:
                self.device_view.add(node, self._tier_key(node))
                if params.chunked and not counted:
                    mark_own_chunk(node)
            elif used:
                self.device_view.access(node)
            if used and node not in backed_up_now:
                self.host_view.access(node)  # a no-op unless it was on the host before this insert
        if self._request_ttl_s is not None:
            self._retain_path(on_device, self._request_ttl_s, skip_retained=params.chunked)
        return result

    def cache_unfinished_req(self, req, chunked=False, **kwargs):
        return self._once_per_request(super().cache_unfinished_req, req, chunked, chunked=chunked, **kwargs)

    def cache_finished_req(self, req, *args, **kwargs):
        return self._once_per_request(super().cache_finished_req, req, False, *args, **kwargs)

    def _once_per_request(self, method, req, is_chunk: bool, *args, **kwargs):
        """A request inserts its prompt after prefill and again when it finishes: only its first non-chunk
        insert is recorded, or the policies would count the request as its own reuse."""
        self._req_recorded = getattr(req, _RECORDED, False)
        try:
            return method(req, *args, **kwargs)
        finally:
            if not is_chunk:
                setattr(req, _RECORDED, True)
            self._req_recorded = False

    def load_back(self, node, mem_quota=None):
        result = super().load_back(node, mem_quota)
        if result is not None:  # the loaded chain holds device KV again: tell the device policy, parents first
            chain = []
            while node is not self.root_node and node not in self.device_view:
                chain.append(node)
                node = node.parent
            for n in reversed(chain):
                self.device_view.add(n, self._tier_key(n))
        return result

    def _insert_helper_host(self, node, key, host_value, hash_value):
        matched = super()._insert_helper_host(node, key, host_value, hash_value)
        start, page = node, self.page_size
        while len(key) and start is not None:  # a storage prefetch's host-only nodes, parents first
            child = start.children.get(key.child_key(page))
            if child is None:
                break
            if child.backuped:
                self.host_view.add(child, self._tier_key(child))
            key, start = key[len(child.key):], child
        return matched

    # ---- admission to the host tier ----
    def _inc_hit_count(self, node, chunked=False):
        if chunked:  # a chunk's own re-insert is no new use (as in SGLang)
            return
        node.hit_count += 1
        if node.backuped or (node.parent is not self.root_node and not node.parent.backuped):
            return  # backed up already, or write_backup would refuse it (its parent is not on the host)
        if not self._admit_to_host(node):
            self._n["host_rejected"] += 1
            return
        if self.write_backup(node):
            self._n["host_admitted"] += 1

    def _admit_to_host(self, node) -> bool:
        # A request with a TTL is about to retain its path (after this insert): back it up now, so that a
        # device eviction demotes it rather than drops it.
        if self._request_ttl_s is not None or self.retention.is_retained(node):
            return True
        size = len(node.value)
        need = size - self.cache_controller.mem_pool_host.available_size()
        if need <= 0:
            return True
        parent = node.parent if node.parent in self.host_view else None
        candidate = Candidate(self._tier_key(node), size, parent)
        return self.host_view.admits(candidate, lambda: self._host_room(need))

    def _host_room(self, need: int) -> list:
        """The host victims that would free `need` tokens, in the host policy's order; [] if they cannot."""
        victims = self.host_view.victims(need, self._host_protected)
        return victims if sum(len(v.key) for v in victims) >= need else []

    def write_backup(self, node, write_back=False):
        n = super().write_backup(node, write_back)
        if n:
            self.host_view.add(node, self._tier_key(node))
            if self._backed_up_now is not None:
                self._backed_up_now.add(node)
        return n

    # ---- device eviction ----
    def evict(self, params):
        result = super().evict(params)
        self._n["device_evicted_tokens"] += result.num_tokens_evicted
        return result

    def _evict_write_through(self, num_tokens: int) -> int:
        evicted = 0
        for x in self.device_view.victims(num_tokens, lambda n: n.lock_ref > 0):
            if x not in self.evictable_leaves:
                self.device_view.drift(f"victim node {x.id} is not an evictable device leaf")
                break
            evicted += self._evict_backuped(x) if x.backuped else self._evict_regular(x)
        if evicted < num_tokens and self.evictable_leaves:
            self.device_view.drift(f"{num_tokens - evicted} tokens unfreed with {len(self.evictable_leaves)} "
                              "evictable device leaves left; SGLang's order frees the rest")
            self._n["fallback_rounds"] += 1
            evicted += super()._evict_write_through(num_tokens - evicted)
        return evicted

    def _detach_backuped(self, node):
        self._n["demotions"] += 1
        self.device_view.remove(node, keep_retention=True)  # its host copy stays, and so does its retention
        return super()._detach_backuped(node)

    def _evict_regular(self, node):
        self._n["dropped"] += 1
        self.device_view.remove(node)
        return super()._evict_regular(node)

    # ---- host eviction ----
    def _host_protected(self, node) -> bool:
        """Not evictable from host memory: still on the device, locked, or pinned by a copy in flight."""
        return not node.evicted or node.lock_ref > 0 or node.host_ref_counter > 0

    def evict_host(self, num_tokens: int):
        host = self.cache_controller.mem_pool_host
        before = host.available_size()
        evicted = 0
        for x in self.host_view.victims(num_tokens, self._host_protected):
            if x not in self.evictable_host_leaves or x.host_ref_counter > 0:
                self.host_view.drift(f"victim node {x.id} is not an evictable host leaf")
                break
            evicted += self._evict_host_leaf(x)
        if evicted < num_tokens and any(n.host_ref_counter == 0 for n in self.evictable_host_leaves):
            self.host_view.drift(f"{num_tokens - evicted} tokens unfreed with evictable host leaves left; "
                            "SGLang's order frees the rest")
            self._n["fallback_rounds"] += 1
            self._evict_host_in_tree_order(num_tokens - evicted)
        self._n["host_evicted_tokens"] += max(0, host.available_size() - before)

    def _evict_host_leaf(self, x) -> int:
        """Free one evictable host leaf (its device copy is gone) and drop it from the tree: what SGLang's
        evict_host does per node."""
        self.kv_events.record_remove(x, medium=StorageMedium.CPU)
        freed = self.cache_controller.evict_host(x.host_value)
        v = x.parent.children.pop(x.key.child_key(self.page_size), None)
        assert v is x, f"parent does not have node {x.id}"
        self.evictable_host_leaves.discard(x)
        self._update_host_leaf_status(x.parent)
        self.host_view.remove(x)
        return freed

    def _evict_host_in_tree_order(self, num_tokens: int) -> int:
        """The fallback: SGLang's own host order (least recently used, retained last), parents once bare."""
        prio = self.eviction_strategy.get_priority
        heap = [(prio(n), n.id, n) for n in self.evictable_host_leaves if n.host_ref_counter == 0]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            x = heapq.heappop(heap)[2]
            if x not in self.evictable_host_leaves or x.host_ref_counter > 0:
                continue
            parent = x.parent
            evicted += self._evict_host_leaf(x)
            if parent in self.evictable_host_leaves and parent.host_ref_counter == 0:
                heapq.heappush(heap, (prio(parent), parent.id, parent))
        return evicted

    # ---- retention ----
    def _retain_path(self, path, ttl_s: float, skip_retained: bool = False) -> None:
        """Retain, once each, the insert's `path` (its nodes that hold device KV, root first; found by the walk
        that reported them to the policies, so retention changes nothing else: no hit refresh, no split, no
        access time). `skip_retained`: a topology-only or chunk re-insert, whose earlier nodes this request
        retained moments ago; only nodes new since then are retained. Retention is policy work: counted as the
        device policy's, as the device-only tree counts it."""
        t0, calls = time.perf_counter_ns(), 0
        for child in path:
            if not (skip_retained and self.retention.is_retained(child)):
                self.retention.retain(child, len(child.key), ttl_s, child.key.cache_salt)
                calls += 1
        self.device_view.charge(t0, calls)

    def match_prefix(self, params):
        result = super().match_prefix(params)
        node = result.last_device_node
        retention = self.retention
        t0, refreshes = time.perf_counter_ns(), retention.refreshes
        while node is not None and node is not self.root_node:  # a hit refreshes the path's retention
            retention.touch(node)
            node = node.parent
        if retention.refreshes > refreshes:  # policy work only where it refreshed (a request with no TTL: none)
            self.device_view.charge(t0, retention.refreshes - refreshes)
        return result

    # ---- observability ----
    def policy_label(self) -> str:
        """What decides on each tier, as /tiers/stats reports it."""
        name = self._policy_name
        return f"{name} (device: {name}, host admission and eviction: {name})"

    def counters(self) -> dict:
        r = self.retention
        return {**self._n, **self._served, "retains": r.retains, "ttl_refreshes": r.refreshes,
                "ttl_expiries": r.expiries, "retained_tokens": r.retained_size,
                "policy_calls": self.device_view.calls + self.host_view.calls, "policy_ns": self.device_view.ns + self.host_view.ns}

    def tier_counters(self) -> dict:
        n, r, hits = self._n, self.retention, self._tier_hits
        return {
            "device": {**hits["device"], "evictions": n["demotions"] + n["dropped"], "demotions": n["demotions"],
                       "dropped": n["dropped"], "evicted_tokens": n["device_evicted_tokens"],
                       "retains": r.retains, "ttl_refreshes": r.refreshes, "ttl_expiries": r.expiries,
                       "policy_calls": self.device_view.calls, "policy_ns": self.device_view.ns},
            "host": {**hits["host"], "admitted": n["host_admitted"], "rejected": n["host_rejected"],
                     "evicted_tokens": n["host_evicted_tokens"], "policy_calls": self.host_view.calls,
                     "policy_ns": self.host_view.ns},
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
            "policy": self.policy_label(),
            "tiers": {tier: {**occupancy[tier], **per_tier[tier]} for tier in per_tier},
            "counters": self.counters(),
        }
        if self._stats_tenants:
            out["tenants"] = self.occupancy_by_tenant()
        if self.tuner is not None:
            out["tuning"] = dataclasses.asdict(self.tuner.stats())
        if self._signals is not None:
            self._signals.tier_stats(out["tiers"])
        return out
