"""TieredRadixCache: SGLang's RadixCache with a `tiers` policy deciding device eviction and admission.

Design note
-----------
The subclass keeps RadixCache's tree, matching and lock accounting untouched and changes three things:

- `insert` first walks the tree without changing it and records the request's path in the policy (keys,
  accesses, hit/total). Then admission, the same code in the server and in the replay: the request's new
  remainder already holds KV (the allocator gave it room, evicting in the policy's order if it had to). Under
  *pressure*, when the pool's free tokens are fewer than the remainder (the next request like this one would
  have to evict), the policy decides whether the remainder is worth the victims that would go next. KV that
  declines gave back since a request was last matched (simulated: since one last allocated) does not count as
  free: with many requests finishing together it made every later one look uncontended, though the requests
  starting next take it. A
  declined remainder adds nothing to the tree and returns `prefix_len=len(key)`, so SGLang's callers free its
  KV at once, like duplicates. Without pressure every remainder comes in, as in stock SGLang. A remainder
  with a TTL comes in if it fits the retention budget.
- `evict` (called by the allocator on shortfall) takes its victims from the policy instead of heapifying
  `evictable_leaves`, and removes them with RadixCache's own `_delete_leaf`, so `evictable_size_`,
  `protected_size_`, `evictable_leaves` and `lock_ref` keep their meaning.
- `_split_node` reports splits (`on_insert` of the new front node, then `on_resize` of the old one).
- If the policy's victims fall short while unprotected evictable leaves remain, its view of the tree has
  drifted (a split it was not told of, say): the rest is evicted least recently used first, as RadixCache
  would, and logged; strict mode (tests, replays) raises instead, so a drifting policy cannot hide there.

Policy entries are the TreeNode objects themselves (identity-hashed); a node's policy key identifies the
path up to its first page: `tiers.keys.path_key(parent_key, first child_key)`, so it is the same after an eviction and
re-insert, and the front half of a split inherits it.

The simulated tree (`create_simulated`, the replay) has no allocator: its insert first does what the
server's allocator does for a request (evicts `tree + remainder - capacity` in the policy's order, the path
protected, as a running request's locked prefix is; before the request is recorded, since in the server the
allocator evicts before the request runs), then the same admission, with free tokens counted as
capacity - tree - remainder. So a replay of one request at a time is what a server does at concurrency 1.
A replay of many at once (`reserve` when a request starts, `release` before its insert) evicts room for each
request's KV when it starts and counts the KV of started requests as used, as a server's allocator does.

In the server a request is recorded and decided once, at its first insert: `cache_unfinished_req` after its
prefill (if it goes on decoding), else `cache_finished_req`; the decision is kept on the request. A request
declined while running keeps its KV to itself (the tree is not touched; `insert` raises before any change and
`cache_unfinished_req` returns, as for SGLang's own `skip_radix_cache_insert`) and frees it when it finishes. A
chunk of a chunked prefill is inserted without a decision (`cache_unfinished_req` re-matches it), in the
server and in the simulated tree alike (a `chunked` insert), so a long prompt's chunks enter the tree and
only what its last chunk adds is decided. A node a chunk inserts is the request's own (`tree_walk.OWN_CHUNK`):
when the request is recorded, it is neither a use nor part of the hit (the request computed it), as if the prompt
had come in one piece; without that, every long prompt's chunks looked reused at once. After a decline inside
`cache_finished_req`, the topology-only prompt re-insert is skipped, since its KV is being freed.

Threading: like RadixCache, used only from the scheduler thread that owns it.
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import time
from typing import Any, Dict, Optional

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult, InsertParams, InsertResult
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode

from sglang_ext.tree_walk import is_own_chunk, mark_own_chunk, own_chunk_tokens, peek_path, used_before
from tiers.clock import Clock, MonotonicClock
from tiers.keys import path_key
from tiers.policy import Candidate, create_policy
from tiers.retention import Retention, RetainingPolicy
from tiers.shadow import Setting, ShadowTuner, TuningConfig

logger = logging.getLogger(__name__)

_ROOT_KEY = 0
_DECISION = "_tier_admission"  # set on SGLang's Req once its remainder is decided: "admitted" or "declined"
class _TreeShadow:
    """A simulated tree as a shadow cache (tiers.shadow.Shadow): serves a request's insert, reports its hit (what
    the insert's own walk matched: one walk per request, as on the live tree)."""

    def __init__(self, cache: "TieredRadixCache"):
        self.cache = cache

    def request(self, request) -> tuple:
        key, priority, ttl_s = request
        cache = self.cache
        cache.insert(InsertParams(key=key, value=_Span(len(key)), priority=priority), ttl_s=ttl_s)
        return cache.last_matched, len(key)


class _Span:
    """A shadow's KV value: only its length. A shadow has no pool, and SGLang's insert only slices, measures and
    clones values; its fallback, a tensor of the key's token ids cloned in slices at every split, grows with the
    prompt (one radix token per prompt token in the server)."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, s: slice) -> "_Span":
        return _Span(len(range(self.n)[s]))

    def clone(self) -> "_Span":
        return self


class _DeclinedWhileRunning(Exception):
    """Raised by `insert` inside `cache_unfinished_req` when the policy declines, before anything changed."""


@dataclasses.dataclass(frozen=True)
class TierStats:
    policy: str
    capacity_tokens: int
    size_tokens: int
    inserts: int
    admissions_rejected: int
    rejected_tokens: int
    evictions: int
    evicted_tokens: int
    retained_evictions: int
    policy_ns: int  # perf_counter_ns spent inside policy calls (record, observe, admit, victims, on_*)
    shadow_ns: int  # of policy_ns, the self-tuner's: its miniature caches serving the sampled requests
    policy_calls: int


class _Counters:
    __slots__ = [f.name for f in dataclasses.fields(TierStats) if f.name not in ("policy", "capacity_tokens", "size_tokens")]

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)


class TieredRadixCache(RadixCache):
    def __init__(
        self,
        params: CacheInitParams,
        policy: str = "tinylfu",
        policy_config: Optional[Dict[str, Any]] = None,
        clock: Optional[Clock] = None,
        capacity_tokens: Optional[int] = None,
        retention_budget: float = 0.5,
        strict: bool = False,
        tuning: Optional[TuningConfig] = None,
    ):
        if capacity_tokens is None:
            alloc = params.token_to_kv_pool_allocator
            if alloc is None:
                raise ValueError("capacity_tokens is required when there is no KV allocator")
            capacity_tokens = int(alloc.size)
        if capacity_tokens <= 0:
            raise ValueError(f"capacity_tokens must be positive, got {capacity_tokens}")
        self.capacity_tokens = int(capacity_tokens)
        self._policy_name = policy
        self._policy_config = dict(policy_config or {})
        self._tier_clock = clock or MonotonicClock()
        self._retention_budget = retention_budget
        self._strict = strict  # raise on a policy that returns a non-evictable victim (tests); else fall back
        self._simulated = False  # create_simulated: no allocator; insert evicts for the request itself
        self._simulated_output = 0  # create_simulated: generated tokens at the end of a finished request's key
        self._held_tokens = 0  # create_simulated: KV that started requests hold outside the tree (`reserve`)
        self._freed_by_declines = 0  # KV declined remainders gave back since KV was last given to a request
        self._finishing_reserved = False  # simulated: the inserts under way are of a request that `reserve`d
        self._deciding: Optional[str] = None  # "unfinished" / "finished": inside that cache_*_req, deciding
        self._decided_req = False  # inside a cache_*_req whose request was recorded and decided before
        self._declined_in_finished = False
        self._n = _Counters()
        self.last_matched = 0  # the cached prefix of the latest insert (a shadow's hit)
        self._tuning = tuning
        self.tuner: Optional[ShadowTuner] = None
        self._honours_ttls = True  # the live setting's: False while the self-tuner has client TTLs ignored
        super().__init__(params)  # calls reset(), which builds the policy

    @classmethod
    def create_simulated(
        cls,
        policy: str = "tinylfu",
        capacity_tokens: int = 0,
        clock: Optional[Clock] = None,
        policy_config: Optional[Dict[str, Any]] = None,
        page_size: int = 1,
        mock_allocator: Any = None,
        retention_budget: float = 0.5,
        tuning: Optional[TuningConfig] = None,
        strict: bool = True,
        output_tokens: int = 0,
    ) -> "TieredRadixCache":
        """A tree without KV pools (page size 1 by default) whose inserts apply admission and keep the tree
        within `capacity_tokens`. `output_tokens`: a finished request's key ends with that many generated tokens,
        whose KV the server allocates after its prompt's (the live replay's twin)."""
        params = CacheInitParams(
            disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=mock_allocator, page_size=page_size
        )
        cache = cls(
            params,
            policy=policy,
            policy_config=policy_config,
            clock=clock,
            capacity_tokens=capacity_tokens,
            retention_budget=retention_budget,
            strict=strict,
            tuning=tuning,
        )
        cache._simulated = True
        cache._simulated_output = output_tokens
        return cache

    # ---- lifecycle ----
    def reset(self):
        super().reset()
        inner = create_policy(self._policy_name, self.capacity_tokens, clock=self._tier_clock, **self._policy_config)
        self.retention = Retention(self.capacity_tokens, self._tier_clock, self._retention_budget)
        self.policy = RetainingPolicy(inner, self.retention)
        self.root_node.tier_key = _ROOT_KEY
        self._n = _Counters()
        self.tuner = None
        if self._tuning is not None and hasattr(inner, "steer"):
            self.tuner = ShadowTuner(self._tuning, self.capacity_tokens, self._make_shadow)
            self._steer(self.tuner.live)

    def _steer(self, setting: Setting) -> None:
        inner = self.policy.inner
        if hasattr(inner, "steer"):  # a recency miniature's policy has that order only (Setting.miniature_policy)
            inner.steer(setting.order, setting.gate_threshold)
        self._honours_ttls = setting.honours_ttls
        if not setting.honours_ttls:
            self.retention.release_all()

    def _make_shadow(self, setting: Setting, capacity: int) -> "_TreeShadow":
        """A miniature of this cache running `setting`: the same tree class, policy and page size, no pools, no
        tuner, no serving counters; its policy classes sizes as this tier does and weighs its priors by the
        sample rate."""
        policy, config = setting.miniature_policy(self._policy_name, self._policy_config)
        config = {**config, "class_capacity": self.capacity_tokens, "prior_weight": capacity / self.capacity_tokens}
        shadow = TieredRadixCache.create_simulated(
            policy=policy, capacity_tokens=capacity, clock=self._tier_clock, policy_config=config,
            page_size=self.page_size, retention_budget=self._retention_budget, strict=self._strict,
        )
        shadow._steer(setting)
        return _TreeShadow(shadow)

    def tier_stats(self) -> TierStats:
        n = self._n
        return TierStats(
            policy=self._policy_name,
            capacity_tokens=self.capacity_tokens,
            size_tokens=self.evictable_size_ + self.protected_size_,
            **{name: getattr(n, name) for name in _Counters.__slots__},
        )

    # ---- keys ----
    def _entry(self, node: TreeNode):
        return None if node is self.root_node else node

    def _child_tier_key(self, parent: TreeNode, child_key) -> int:
        return path_key(parent.tier_key, child_key)

    # ---- SGLang API ----
    def insert(self, params: InsertParams, ttl_s: Optional[float] = None) -> InsertResult:
        if self.disable:
            return super().insert(params)
        if self._declined_in_finished:
            # cache_finished_req's topology-only re-insert after a decline: its KV is being freed
            return InsertResult(prefix_len=len(params.key))
        key, _ = params.key.maybe_to_bigram_view(self.is_eagle)
        key = key.page_aligned(self.page_size)
        counted = not params.chunked and not self._decided_req  # each request is recorded once
        self._n.inserts += 1

        path, matched, anchor = self._peek(key)
        self.last_matched = matched
        remainder = len(key) - matched
        cand_key = self._child_tier_key(anchor, key.child_key_at(matched, self.page_size)) if remainder else None
        if self._simulated and not self._finishing_reserved:
            self._freed_by_declines = 0  # one at a time, a request's allocation (below) comes before its decision
        if remainder and self._simulated:
            # the allocator's evictions for this request, before it runs (so before it is recorded, as in the
            # server, where the policy's order at that moment decides the victims); none left to do if the
            # request `reserve`d its KV when it started
            self._allocate(path, remainder, 0 if params.chunked else min(self._simulated_output, remainder))
        if counted:
            hit = matched - own_chunk_tokens(path)  # the request's own hit: not its own chunks
            self._record_request(path, cand_key, hit, len(key))
            if self.tuner is not None:
                self._offer_to_shadows(path, cand_key, key, params.priority, ttl_s, hit)
        if not self._honours_ttls:  # the shadows were offered the TTL: each honours it as its setting says
            ttl_s = None
        deciding = (self._simulated and not params.chunked) or (self._deciding and counted)
        if remainder and deciding:
            if not self._admits(path, anchor, cand_key, remainder, counted, ttl_s):
                if self._deciding == "unfinished":
                    raise _DeclinedWhileRunning
                return InsertResult(prefix_len=len(key))

        result = super().insert(params)
        chain = self._note_inserted(result.last_device_node, counted, ttl_s, own=params.chunked and not counted)
        over = self._used_tokens() - self.capacity_tokens
        if over > 0:
            on_chain = set(chain)
            self._evict_tokens(over, lambda n: n.lock_ref > 0 or n in on_chain)
        return result

    def reserve(self, key) -> Optional[int]:
        """Simulated only, for a replay of many requests at once: what the server's allocator does when a request
        starts, long before its insert: room for the KV it will compute (the tokens of `key`, a RadixKey, past
        the cached prefix), evicted in the policy's order of that moment, held outside the tree until
        `release`. The caller locks the matched prefix, as the scheduler does. Returns the tokens held, or None
        (nothing changed) if the pool cannot hold them beside the locked prefixes and the KV others hold: the
        scheduler leaves such a request waiting until others finish."""
        if not self._simulated:
            raise RuntimeError("reserve is for a simulated tree; a server's allocator holds a running request's KV")
        key = key.page_aligned(self.page_size)
        path, matched, _ = self._peek(key)
        remainder = len(key) - matched
        if remainder > self.capacity_tokens - self.protected_size_ - self._held_tokens:
            return None
        self._allocate(path, remainder, min(self._simulated_output, remainder))
        self._held_tokens += remainder
        return remainder

    def release(self, tokens: int) -> None:
        """A reserved request finishes: its KV goes into the tree at its inserts (or is freed), not held aside."""
        self._held_tokens -= tokens
        self._finishing_reserved = True

    def _allocate(self, path, remainder: int, output: int) -> None:
        """The simulated allocator's evictions for a request's new KV, its matched path protected as a running
        request's locked prefix is. The server allocates the prompt's KV, then its output's, each evicting its
        own shortfall: victims taken in two rounds are not always those one round takes for the sum (the learned
        order's horizon is the number of entries the policy tracks, which the first round lowers)."""
        on_path = set(path)
        for allocated in (remainder - output, remainder) if output else (remainder,):
            self._evict_tokens(self._used_tokens() + allocated - self.capacity_tokens,
                               lambda n: n.lock_ref > 0 or n in on_path)

    def _used_tokens(self) -> int:
        """Pool tokens in use: the tree's, and (simulated) what started requests hold outside it."""
        return self.evictable_size_ + self.protected_size_ + self._held_tokens

    def match_prefix(self, params):
        """A request is matched before the scheduler gives it KV: from here, what declines freed is taken."""
        self._freed_by_declines = 0
        self._finishing_reserved = False
        return super().match_prefix(params)

    def _free_tokens(self, remainder: int) -> int:
        """Free pool tokens while the request still holds its remainder's KV."""
        if self._simulated:
            return self.capacity_tokens - self._used_tokens() - remainder
        return int(self.token_to_kv_pool_allocator.available_size())

    def _charge(self, t0: int, calls: int) -> int:
        """Count `calls` policy calls and the time since `t0` (perf_counter_ns) as policy cost; returns that time."""
        ns = time.perf_counter_ns() - t0
        self._n.policy_ns += ns
        self._n.policy_calls += calls
        return ns

    def _record_request(self, path, cand_key, matched: int, total: int) -> None:
        """Tell the policy what a request asked for: every key on its path and its new remainder's, and its hit."""
        t0 = time.perf_counter_ns()
        policy = self.policy
        for node in path:
            policy.record(node.tier_key)
        if cand_key is not None:
            policy.record(cand_key)
        policy.observe(matched, total)
        self._charge(t0, len(path) + (cand_key is not None) + 1)

    def _offer_to_shadows(self, path, cand_key, key, priority: int, ttl_s, hit: int) -> None:
        """Let the tuner sample the request (the tree held `hit` tokens of it); switch the live policy if it says
        so. Counted as policy cost."""
        t0 = time.perf_counter_ns()
        keys = [node.tier_key for node in path]
        if cand_key is not None:
            keys.append(cand_key)
        setting = self.tuner.offer(keys, (key, priority, ttl_s), len(key), hit, carries_ttl=ttl_s is not None)
        if setting is not None:
            self._steer(setting)
            logger.info("shadow tuner: the live policy now runs %r (%s)", setting.name, self.tuner.stats())
        self._n.shadow_ns += self._charge(t0, 1)

    def _admits(self, path, anchor, cand_key, remainder: int, counted: bool, ttl_s) -> bool:
        """Whether the remainder stays in the tree. Under pressure the policy weighs it against the victims
        that would make room for it next (a query: nothing is evicted here). A decline still counts the path
        as used, and is counted."""
        free = self._free_tokens(remainder)
        if free < 0:  # simulated only: more than the pool can hold even after evicting all it could
            return self._declined(path, remainder, counted)
        # what declines just freed is no slack: the requests that start next take it first (requests that
        # finish together, with others running, would otherwise see it and come in unweighed)
        need = remainder - max(0, free - self._freed_by_declines)
        if need <= 0 or (ttl_s is not None and remainder <= self.retention.budget):
            return True
        t0 = time.perf_counter_ns()
        policy = self.policy
        candidate = Candidate(cand_key, remainder, self._entry(anchor), retained=ttl_s is not None)
        ok = policy.may_admit(candidate)  # a verdict that needs no victims spares the victim query
        calls = 1
        if ok:
            on_path = set(path)
            victims = policy.victims(need, lambda n: n.lock_ref > 0 or n in on_path)
            ok = policy.admit(candidate, victims)
            calls += 2
        self._charge(t0, calls)
        return ok or self._declined(path, remainder, counted)

    def _declined(self, path, remainder: int, counted: bool) -> bool:
        """Count a declined remainder; its path still counts as used."""
        if counted:
            t1 = time.perf_counter_ns()
            for node in path:
                if used_before(node):
                    self.policy.on_access(node)
            self._charge(t1, len(path))
        self._n.admissions_rejected += 1
        self._n.rejected_tokens += remainder
        if self._deciding != "unfinished":  # freed now (a request declined while running keeps its KV)
            self._freed_by_declines += remainder
        if self._deciding == "finished":
            self._declined_in_finished = True
        return False

    def _note_inserted(self, leaf, counted: bool, ttl_s, own: bool = False) -> list:
        """After SGLang's insert: report the new nodes to the policy (marked `OWN_CHUNK` if `own`: a chunk's), the
        old ones as used if `counted`, retain the path for a TTL. Returns the path from the root's child down to
        `leaf`."""
        t0 = time.perf_counter_ns()
        policy = self.policy
        chain = []
        node = leaf
        while node is not self.root_node and node is not None:
            chain.append(node)
            node = node.parent
        chain.reverse()
        calls = 0
        for node in chain:
            if getattr(node, "tier_key", None) is None:  # the new remainder
                node.tier_key = self._child_tier_key(node.parent, node.key.child_key(self.page_size))
                policy.on_insert(node, node.tier_key, len(node.key), self._entry(node.parent))
                calls += 1
                if own:
                    mark_own_chunk(node)
            elif counted and used_before(node):
                policy.on_access(node)
                calls += 1
        if ttl_s is not None:
            for node in chain:
                self.retention.retain(node, len(node.key), ttl_s, node.key.cache_salt)  # tenant: its namespace
        self._charge(t0, calls)
        return chain

    def cache_unfinished_req(self, req, chunked: bool = False, **kwargs):
        """After a prefill: the request is recorded and its remainder decided here, once (a chunk of a chunked
        prefill is inserted without a decision). A declined request keeps its KV to itself while it runs."""
        decision = getattr(req, _DECISION, None)
        if decision == "declined":
            return None
        if chunked or decision is not None:
            self._decided_req = decision is not None
            try:
                return super().cache_unfinished_req(req, chunked=chunked, **kwargs)
            finally:
                self._decided_req = False
        self._deciding = "unfinished"
        try:
            super().cache_unfinished_req(req, **kwargs)
            setattr(req, _DECISION, "admitted")
        except _DeclinedWhileRunning:  # raised before the tree or the request's KV changed
            setattr(req, _DECISION, "declined")
        finally:
            self._deciding = None
        return None

    def cache_finished_req(self, req, is_insert: bool = True, **kwargs):
        decision = getattr(req, _DECISION, None)
        self._deciding = "finished" if decision is None else None
        self._decided_req = decision is not None
        self._declined_in_finished = decision == "declined"  # freed now, like a decline made here
        try:
            return super().cache_finished_req(req, is_insert, **kwargs)
        finally:
            self._deciding = None
            self._decided_req = False
            self._declined_in_finished = False

    def evict(self, params: EvictParams) -> EvictResult:
        if self.disable:
            return EvictResult()
        start = time.perf_counter()
        n = self._evict_tokens(params.num_tokens, lambda x: x.lock_ref > 0)
        self.update_eviction_metrics(n, start)
        return EvictResult(num_tokens_evicted=n)

    # ---- internals ----
    def _peek(self, key):
        return peek_path(self.root_node, key, self.page_size)

    def _evict_tokens(self, num_tokens: int, protected) -> int:
        if num_tokens <= 0:
            return 0
        t0 = time.perf_counter_ns()
        victims = self.policy.victims(num_tokens, protected)
        self._charge(t0, 1)
        evicted = self._evict_nodes(victims)
        if evicted < num_tokens:
            evicted += self._evict_in_tree_order(num_tokens - evicted, protected)
        return evicted

    def _evict_nodes(self, victims) -> int:
        """Evict the policy's victims in order; stops at the first that is not an evictable leaf (the policy's
        view of the tree is then wrong: `_evict_in_tree_order` frees the rest). Counts what it evicted."""
        evicted = 0
        for x in victims:
            if x not in self.evictable_leaves:
                msg = f"policy {self._policy_name!r} returned a victim that is not an evictable leaf (node {x.id})"
                if self._strict:
                    raise RuntimeError(msg)
                logger.warning("%s; the rest of this round goes in the tree's own order", msg)
                break
            evicted += self._remove_leaf(x)
        return evicted

    def _evict_in_tree_order(self, num_tokens: int, protected) -> int:
        """The fallback when the policy returned too little while the tree still has unprotected evictable
        leaves (its view drifted, e.g. a split it was not told of): least recently used leaf first, as
        RadixCache.evict. With the policy in step with the tree this finds nothing (every leaf it skipped is
        protected), so decisions are unchanged."""
        heap = [(n.last_access_time, n.id, n) for n in self.evictable_leaves if not protected(n)]
        if not heap:
            return 0
        if self._strict:
            raise RuntimeError(f"policy {self._policy_name!r} left {num_tokens} tokens unfreed while "
                               f"{len(heap)} unprotected leaves were evictable")
        logger.warning("policy %r left %d tokens unfreed with evictable leaves left; evicting least recently "
                       "used leaves", self._policy_name, num_tokens)
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            x = heapq.heappop(heap)[2]
            if x not in self.evictable_leaves:
                continue
            parent = x.parent
            evicted += self._remove_leaf(x)
            if parent in self.evictable_leaves and not protected(parent):
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        return evicted

    def _remove_leaf(self, x: TreeNode) -> int:
        """Free one evictable leaf, drop it from the tree and tell the policy; returns its tokens."""
        if self.retention.is_retained(x):
            self._n.retained_evictions += 1
        alloc = self.token_to_kv_pool_allocator
        if alloc is not None:
            alloc.free_segment(x.value, start_pos=0)
        self._delete_leaf(x)
        t0 = time.perf_counter_ns()
        try:
            self.policy.on_remove(x)
        except (KeyError, ValueError) as e:  # a node the policy never heard of (its view drifted): the tree rules
            if self._strict:
                raise
            logger.warning("policy %r could not remove node %s: %s", self._policy_name, x.id, e)
        self._charge(t0, 1)
        self.kv_events.record_remove(x)
        self._n.evictions += 1
        self._n.evicted_tokens += len(x.value)
        return len(x.value)

    def _split_node(self, key, child: TreeNode, split_len: int):
        new_node = super()._split_node(key, child, split_len)
        old_key = child.tier_key
        new_node.tier_key = old_key
        mark_own_chunk(new_node, is_own_chunk(child))
        child.tier_key = self._child_tier_key(new_node, child.key.child_key(self.page_size))
        t0 = time.perf_counter_ns()
        self.policy.on_insert(new_node, old_key, len(new_node.key), self._entry(new_node.parent))
        self.policy.on_resize(child, len(child.key), new_node, child.tier_key)
        self._charge(t0, 2)
        return new_node
