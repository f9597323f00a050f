"""Device-tier engines for the replay: each one answers "how many leading blocks of this request were cached"
and then caches the request, reporting which blocks it evicted.

Design note
- `stock:<policy>` drives SGLang 0.5.20's own `RadixCache` (eviction strategy chosen through
  `CacheInitParams.eviction_policy`) the way the scheduler does for one request: match_prefix, lock the matched
  node, evict the overflow, insert the whole prompt, unlock. The insert is done even on a full hit, because the
  tree's `hit_count` (what lfu/slru rank by) is only bumped by insert traversals; skipping it changes LFU results.
- `tiered:<policy>` drives `sglang_ext.tiered_cache.TieredRadixCache`, which applies admission and eviction
  inside `insert` and keeps itself within capacity.
- Each trace block becomes R radix tokens (`radix_tokens_per_block`, default 1): block b is the tokens
  b*R .. b*R+R-1, distinct across blocks, so the tree has the same shape for every R (prefixes still part
  only at block boundaries) while its entries hold R times the units, as in a server where one radix token
  is one prompt token. The tree's capacity is capacity_blocks * R tokens; hits are matched tokens // R, and
  freed token ids map back to block ids (deduplicated, in order), so the caller sees blocks whatever R is.
  The live replay's twin also gives each block the first token the server saw in it (`RadixUnits`'s
  `first_tokens`: a sibling rank), so that the tree keys the self-tuner samples by are the server's.
- Many in flight (`start` / `finish`, the replay's `in_flight`): a started request is matched, its matched node
  locked, and room for the KV it will compute evicted at once (in the policy's order of that moment) and held
  outside the tree until it finishes; then it is cached as above. A request that starts while another computes
  the same new prefix misses it, as in a server. Stock's `access` is `finish(start(req))`; ours keeps its own
  one-at-a-time `access` (a chunked prompt's room is evicted chunk by chunk there, at its start here), which
  start-then-finish equals for unchunked prompts (tests/benchmarks/test_in_flight.py).
- RadixCache stamps nodes with `time.monotonic()`. Real time makes equal stamps (and so heap order, which then
  falls back to set iteration order, i.e. memory addresses) vary between runs; `logical_radix_time()` swaps the
  module's `time` for a counter while a replay runs, so every run of a trace gives identical numbers. Order is
  what the strategies compare, and a counter preserves the order of real calls.
- Evicted blocks are observed through the allocator: the replay inserts each radix token id as its KV
  "index", so the values a cache frees are exactly the ids of the tokens (and so the blocks) it dropped.
- `output_tokens` (default 0): the engines serve each request as a live server does, for the live replay's
  offline twin: the request also generates that many tokens, which no later prompt contains (a live replay
  sends `max_new_tokens=1`; the trace's next turn carries its own blocks), and SGLang's rules apply: the prefix
  match leaves out the prompt's last token (one token must be computed for the logits), so a fully cached
  prompt reports len - 1 cached tokens and counts as a full hit; every request is cached as
  `cache_finished_req` does, prompt + output, then the prompt alone (topology only, `chunked=True`), which
  splits the new leaf at the prompt boundary. Output ids are negative, so they never match a block and never
  map back to one, and depend only on the prompt's last token: greedy decoding gives a repeated prompt the
  same output, which is then found cached (a live full hit adds nothing to the tree).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from array import array
from dataclasses import dataclass
from typing import Iterator, List, Mapping, Optional, Sequence

from benchmarks.trace import Request

STOCK_POLICIES = ("lru", "lfu", "slru", "priority")
TIERED_PREFIX = "tiered-"
# engines that need no SGLang, in benchmarks.belady: bounds and reference lines, not candidate policies
REFERENCE_ENGINES = ("opt", "infinite", "reuse-oracle", "lru-blocks")


@dataclass(frozen=True)
class Access:
    """What the device tier did for one request."""

    hit_blocks: int
    evicted: Sequence[int]  # block ids dropped from the device while serving this request
    rejected_blocks: int = 0  # blocks of this request the tier declined to cache
    # blocks computed for this request that an admission policy declined to keep on the device: with lower
    # tiers they go down as an eviction would (device bypass), not lost
    declined: Sequence[int] = ()


@dataclass(frozen=True)
class Started:
    """A request a radix engine has started and not yet finished (`start` / `finish`: many at once)."""

    req: Request
    ids: array  # its prompt's radix tokens (kept: a prompt longer than the cache keeps its head)
    matched: int  # radix tokens found cached when it started
    hit_blocks: int
    node: object  # the matched node it locks until it finishes
    held: int  # pool tokens it holds outside the tree while it runs


@dataclass(frozen=True)
class EngineStats:
    evictions: int  # eviction events (tree nodes, or blocks for block-level engines)
    evicted_blocks: int
    admissions_rejected: int
    policy_ns: int  # time spent deciding what to evict/admit
    shadow_ns: int = 0  # of policy_ns, the self-tuner's miniature caches'
    tuning: Optional[dict] = None  # the self-tuner's state at the end (tiers.shadow.TuningStats), if one ran


class _LogicalTime:
    """Stand-in for the `time` module inside radix_cache: monotonic() is a strictly increasing counter."""

    def __init__(self) -> None:
        self._t = 0.0

    def monotonic(self) -> float:
        self._t += 1.0
        return self._t

    perf_counter = staticmethod(time.perf_counter)
    perf_counter_ns = staticmethod(time.perf_counter_ns)
    time = staticmethod(time.time)


@contextlib.contextmanager
def logical_radix_time() -> Iterator[None]:
    from sglang.srt.mem_cache import radix_cache

    saved = radix_cache.time
    radix_cache.time = _LogicalTime()
    try:
        yield
    finally:
        radix_cache.time = saved


class RadixUnits:
    """Trace blocks <-> radix token ids, R tokens per block.

    `first_tokens` (block -> token id, R >= 2): the token a live server sees first in each block (the live
    replay's sibling rank). A block then starts with that id and its other tokens are `offset + b*R + j`, above
    every first token, so the twin's tree keys, and the shadow sampler's hashes of them, are the server's. Freed
    first tokens map back to no block (they are not unique); a block's other tokens do."""

    def __init__(self, tokens_per_block: int = 1, first_tokens: Optional[Mapping[int, int]] = None):
        if tokens_per_block < 1:
            raise ValueError(f"radix tokens per block must be >= 1, got {tokens_per_block}")
        if first_tokens and tokens_per_block < 2:
            raise ValueError("first tokens need at least 2 radix tokens per block")
        self.per_block = tokens_per_block
        self._first = first_tokens or {}
        self._offset = max(self._first.values(), default=-1) + 1

    def tokens(self, blocks: Sequence[int]) -> array:
        r, first, offset = self.per_block, self._first, self._offset
        if r == 1:
            return array("q", blocks)
        offsets = range(r)
        ids = array("q", [offset + b * r + j for b in blocks for j in offsets])
        if first:
            for i, b in enumerate(blocks):
                if b in first:
                    ids[i * r] = first[b]
        return ids

    def blocks(self, tokens: Sequence[int]) -> List[int]:
        """Block ids of freed tokens, each once, in the order first seen (output tokens, < 0, are no block)."""
        r, offset = self.per_block, self._offset
        if r == 1:
            return [t for t in tokens if t >= 0]
        return list(dict.fromkeys((t - offset) // r for t in tokens if t >= offset))


def live_hit_blocks(cached_tokens: int, n_blocks: int, tokens_per_block: int) -> int:
    """Leading blocks of a prompt that a server served from cache: SGLang never serves a prompt's last token from
    cache (it computes one for the logits), so a full hit reports len - 1 cached tokens."""
    if cached_tokens >= n_blocks * tokens_per_block - 1:
        return n_blocks
    return max(0, cached_tokens) // tokens_per_block


class OutputTokens:
    """What each request generates (distinct negative token ids), and, when it generates any, the live server's
    prefix-match rules (see the design note); with `per_request` 0 a request is matched and cached whole.
    `prefill_chunk` (radix tokens; 0: none) is the server's `chunked_prefill_size`: a prompt whose uncached part
    is longer is prefilled in chunks, each inserted as it completes (`chunk_ends`)."""

    def __init__(self, per_request: int = 0, prefill_chunk: int = 0):
        if per_request < 0 or prefill_chunk < 0:
            raise ValueError(f"output and chunk tokens must be >= 0, got {per_request}, {prefill_chunk}")
        self.per_request = per_request
        self.prefill_chunk = prefill_chunk

    def chunk_ends(self, n_ids: int, matched: int) -> range:
        """Prompt lengths inserted by SGLang's chunked prefill before the request finishes: the cached prefix plus
        each whole chunk that leaves part of the prompt to compute (`cache_unfinished_req(chunked=True)`)."""
        c = self.prefill_chunk
        return range(matched + c, n_ids, c) if c else range(0)

    def match_key(self, ids: array) -> array:
        """The part of the prompt the server looks up: all but its last token."""
        return ids[:-1] if self.per_request and len(ids) > 1 else ids

    def hit_blocks(self, matched: int, ids: array, per_block: int) -> int:
        """Leading blocks served by `matched` cached tokens of `ids` (a full hit counts every block)."""
        if self.per_request:
            return live_hit_blocks(matched, len(ids) // per_block, per_block)
        return matched // per_block

    def of(self, prompt: array) -> array:
        """The output ids of `prompt`: distinct for distinct last tokens, the same for a repeated prompt."""
        n = self.per_request
        first = -1 - prompt[-1] * n if n and len(prompt) else -1
        return array("q", range(first, first - n, -1))


def insert_chunks(cache, prompt: array, ends: Sequence[int], priority: int = 0, salt: Optional[str] = None,
                  **insert_kwargs):
    """The inserts of a chunked prefill, as `cache_unfinished_req(chunked=True)` makes them: each prompt prefix
    in `ends`, marked chunked (SGLang records and decides nothing for it; nor does TieredRadixCache). `salt`: the
    request's tenant, SGLang's `cache_salt` (the key's namespace); `insert_kwargs` go to every insert (ours: the
    request's `ttl_s`, which the server applies to each insert of the request). Returns the last insert's result
    (None without chunks)."""
    import torch

    _, InsertParams, _, RadixKey = _radix_api()
    result = None
    for end in ends:
        part = prompt[:end]
        result = cache.insert(InsertParams(key=RadixKey(part, cache_salt=salt),
                                           value=torch.tensor(part, dtype=torch.int64), priority=priority,
                                           chunked=True), **insert_kwargs)
    return result


def insert_finished(cache, prompt: array, output: array, priority: int = 0, salt: Optional[str] = None,
                    **insert_kwargs):
    """Cache a finished request as SGLang's cache_finished_req does: prompt + output, then (if there is
    output and the first insert kept anything) the prompt again, topology only; `insert_kwargs` go to both, as
    the server's request state (ours: its TTL) holds for every insert of cache_finished_req: the re-insert's split
    leaves the prompt's tail a new node, which the TTL retains there too. Returns the first insert's result."""
    import torch

    _, InsertParams, _, RadixKey = _radix_api()
    ids = prompt + output if output else prompt
    value = torch.tensor(ids, dtype=torch.int64)
    result = cache.insert(InsertParams(key=RadixKey(ids, cache_salt=salt), value=value, priority=priority),
                          **insert_kwargs)
    if output and result.prefix_len < len(ids):
        cache.insert(InsertParams(key=RadixKey(prompt, cache_salt=salt), value=value[: len(prompt)],
                                  priority=priority + 1, chunked=True), **insert_kwargs)
    return result


class _RecordingAllocator:
    """The smallest allocator RadixCache needs: it only frees, and we record what it frees."""

    device = "cpu"

    def __init__(self) -> None:
        self.freed: List[int] = []
        self.free_calls = 0

    def free(self, indices) -> None:
        self.free_calls += 1
        # one C call: stock's eviction is timed with this free inside it, so per-index Python work here would
        # bill the benchmark's own bookkeeping to SGLang's LRU (it grows with the radix tokens per block)
        self.freed.extend(indices.tolist())

    def free_segment(self, indices, start_pos: int = 0) -> None:
        self.free(indices[start_pos:])

    def take(self) -> List[int]:
        out, self.freed = self.freed, []
        return out


def _radix_api():
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return EvictParams, InsertParams, MatchPrefixParams, RadixKey


class StockRadixEngine:
    def __init__(
        self,
        policy: str,
        capacity_blocks: int,
        policy_config: Optional[dict] = None,
        radix_tokens_per_block: int = 1,
        output_tokens: int = 0,
        prefill_chunk: int = 0,
        first_tokens: Optional[Mapping[int, int]] = None,
    ):
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixCache

        if policy not in STOCK_POLICIES:
            raise ValueError(f"unknown stock policy {policy!r}; choose one of {', '.join(STOCK_POLICIES)}")
        self._api = _radix_api()
        self.units = RadixUnits(radix_tokens_per_block, first_tokens)
        self.outputs = OutputTokens(output_tokens, prefill_chunk)
        self.capacity_blocks = capacity_blocks
        self.capacity = capacity_blocks * radix_tokens_per_block  # in radix tokens
        self.allocator = _RecordingAllocator()
        self.cache = RadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=None,
                token_to_kv_pool_allocator=self.allocator,
                page_size=1,
                eviction_policy=policy,
                eviction_policy_config=policy_config,
            )
        )
        self._evicted_blocks = 0
        self._policy_ns = 0
        self._rejected = 0
        self._held = 0  # KV of started requests, outside the tree until they finish

    def size(self) -> int:
        return self.cache.evictable_size() + self.cache.protected_size()

    def access(self, req: Request) -> Access:
        return self.finish(self.start(req))

    def start(self, req: Request) -> Optional[Started]:
        """What the scheduler does when the request starts: match, lock the matched node, and have the allocator
        evict room for the KV it will compute, which it holds outside the tree until `finish`. None (nothing
        changed) if the pool cannot hold that beside the locked prefixes and what started requests hold."""
        EvictParams, _, MatchPrefixParams, RadixKey = self._api
        units = self.units
        kept = req.blocks[: self.capacity_blocks]  # a prompt longer than the cache keeps its head
        ids = units.tokens(kept)
        whole = ids if len(kept) == len(req.blocks) else units.tokens(req.blocks)
        outputs = self.outputs
        key = RadixKey(outputs.match_key(whole), cache_salt=req.tenant)  # tenants are namespaces, as in a server
        match = self.cache.match_prefix(MatchPrefixParams(key=key))
        hit_tokens = len(match.device_indices)
        node = match.last_device_node
        self.cache.inc_lock_ref(node)
        held = max(0, len(ids) - hit_tokens) + self.outputs.per_request
        # beside others it waits if it does not fit; alone it runs, evicting what it can, as one at a time
        if self._held and held > self.capacity - self.cache.protected_size() - self._held:
            self.cache.dec_lock_ref(node)
            return None
        overflow = self.size() + self._held + held - self.capacity
        if overflow > 0:
            t0 = time.perf_counter_ns()
            self.cache.evict(EvictParams(num_tokens=overflow))
            self._policy_ns += time.perf_counter_ns() - t0
        self._held += held
        return Started(req, ids, hit_tokens, outputs.hit_blocks(hit_tokens, whole, units.per_block), node, held)

    def finish(self, started: Started) -> Access:
        """The request finishes: cached as cache_finished_req does (its chunks first), its lock released."""
        req, ids, outputs = started.req, started.ids, self.outputs
        self._held -= started.held
        try:
            insert_chunks(self.cache, ids, outputs.chunk_ends(len(ids), started.matched), req.priority, req.tenant)
            insert_finished(self.cache, ids, outputs.of(ids), req.priority, req.tenant)
        finally:
            self.cache.dec_lock_ref(started.node)
        evicted = self.units.blocks(self.allocator.take())
        self._evicted_blocks += len(evicted)
        rejected = len(req.blocks) - len(ids) // self.units.per_block
        self._rejected += rejected
        return Access(hit_blocks=started.hit_blocks, evicted=evicted, rejected_blocks=rejected)

    def stats(self) -> EngineStats:
        return EngineStats(
            evictions=self.allocator.free_calls,
            evicted_blocks=self._evicted_blocks,
            admissions_rejected=self._rejected,
            policy_ns=self._policy_ns,
        )


class TieredEngine:
    """The project's TieredRadixCache (admission + eviction + session TTLs inside insert)."""

    def __init__(
        self,
        policy: str,
        capacity_blocks: int,
        clock,
        policy_config: Optional[dict] = None,
        radix_tokens_per_block: int = 1,
        output_tokens: int = 0,
        prefill_chunk: int = 0,
        tuning=None,
        first_tokens: Optional[Mapping[int, int]] = None,
    ):
        from sglang_ext.tiered_cache import TieredRadixCache

        self._api = _radix_api()
        self.units = RadixUnits(radix_tokens_per_block, first_tokens)
        self.outputs = OutputTokens(output_tokens, prefill_chunk)
        self.capacity = capacity_blocks * radix_tokens_per_block  # in radix tokens
        self.allocator = _RecordingAllocator()  # evictions are observed as for the stock tree
        self.cache = TieredRadixCache.create_simulated(
            policy=policy,
            capacity_tokens=self.capacity,
            clock=clock,
            policy_config=policy_config,
            mock_allocator=self.allocator,
            tuning=tuning,
            output_tokens=output_tokens,
        )

    def access(self, req: Request) -> Access:
        _, _, MatchPrefixParams, RadixKey = self._api
        units = self.units
        ids = units.tokens(req.blocks)
        outputs = self.outputs
        key = RadixKey(outputs.match_key(ids), cache_salt=req.tenant)
        matched = len(self.cache.match_prefix(MatchPrefixParams(key=key)).device_indices)
        hit = outputs.hit_blocks(matched, ids, units.per_block)
        rejected = self.cache.tier_stats().admissions_rejected
        insert_chunks(self.cache, ids, outputs.chunk_ends(len(ids), matched), req.priority, req.tenant,
                      ttl_s=req.ttl_s)
        insert_finished(self.cache, ids, outputs.of(ids), req.priority, req.tenant, ttl_s=req.ttl_s)
        declined = req.blocks[hit:] if self.cache.tier_stats().admissions_rejected > rejected else ()
        return Access(hit_blocks=hit, evicted=units.blocks(self.allocator.take()), declined=declined)

    def start(self, req: Request) -> Optional[Started]:
        """As the scheduler starts a request while others run: match, lock the matched node, and reserve room
        for the KV it will compute (`TieredRadixCache.reserve`: evicted now, held until `finish`). None (nothing
        changed) if it does not fit beside the others."""
        _, _, MatchPrefixParams, RadixKey = self._api
        ids = self.units.tokens(req.blocks)
        key = RadixKey(self.outputs.match_key(ids), cache_salt=req.tenant)
        match = self.cache.match_prefix(MatchPrefixParams(key=key))
        matched = len(match.device_indices)
        node = match.last_device_node
        self.cache.inc_lock_ref(node)
        held = self.cache.reserve(RadixKey(ids + self.outputs.of(ids), cache_salt=req.tenant))
        if held is None:
            self.cache.dec_lock_ref(node)
            return None
        return Started(req, ids, matched, self.outputs.hit_blocks(matched, ids, self.units.per_block), node, held)

    def finish(self, started: Started) -> Access:
        """The request finishes: its reserved KV goes into the tree as `access` inserts it, its lock released."""
        req, ids, outputs = started.req, started.ids, self.outputs
        self.cache.release(started.held)
        rejected = self.cache.tier_stats().admissions_rejected
        try:
            insert_chunks(self.cache, ids, outputs.chunk_ends(len(ids), started.matched), req.priority,
                          req.tenant, ttl_s=req.ttl_s)
            insert_finished(self.cache, ids, outputs.of(ids), req.priority, req.tenant, ttl_s=req.ttl_s)
        finally:
            self.cache.dec_lock_ref(started.node)
        declined = req.blocks[started.hit_blocks:] if self.cache.tier_stats().admissions_rejected > rejected else ()
        return Access(hit_blocks=started.hit_blocks, evicted=self.units.blocks(self.allocator.take()),
                      declined=declined)

    def stats(self) -> EngineStats:
        s = self.cache.tier_stats()
        tuner = self.cache.tuner
        return EngineStats(
            evictions=int(s.evictions),
            evicted_blocks=int(s.evicted_tokens) // self.units.per_block,
            admissions_rejected=int(s.admissions_rejected),
            policy_ns=int(s.policy_ns),
            shadow_ns=int(s.shadow_ns),
            tuning=dataclasses.asdict(tuner.stats()) if tuner is not None else None,
        )


def tiered_policy_names() -> List[str]:
    """Names the project's policy registry knows (empty if tiers.policies is not importable yet)."""
    try:
        from tiers.policy import policy_names

        return policy_names()
    except ImportError:
        return []


def known_policies() -> List[str]:
    tiered = tiered_policy_names()
    return list(STOCK_POLICIES) + list(REFERENCE_ENGINES) + [TIERED_PREFIX + n for n in tiered] + [
        n for n in tiered if n not in STOCK_POLICIES
    ]


def make_engine(
    name: str,
    capacity_blocks: int,
    requests: Sequence[Request],
    clock,
    policy_config=None,
    radix_tokens_per_block: int = 1,
    output_tokens: int = 0,
    prefill_chunk: int = 0,
    tuning=None,
    first_tokens: Optional[Mapping[int, int]] = None,
):
    """An engine by benchmark policy name (see `known_policies()`). The reference engines count blocks and
    ignore `radix_tokens_per_block`, `output_tokens`, `prefill_chunk` and `first_tokens` (RadixUnits); only the
    project's tree engine takes `tuning` (tiers.shadow.TuningConfig: the self-tuner, as the server runs it)."""
    from benchmarks.belady import BeladyEngine, InfiniteEngine, ReuseOracleEngine

    if capacity_blocks <= 0:
        raise ValueError(f"capacity must hold at least one block, got {capacity_blocks} blocks")
    if name in STOCK_POLICIES:
        return StockRadixEngine(name, capacity_blocks, policy_config, radix_tokens_per_block, output_tokens,
                                prefill_chunk, first_tokens)
    if name == "opt":
        return BeladyEngine(capacity_blocks, requests)
    if name == "infinite":
        return InfiniteEngine()
    if name == "reuse-oracle":
        return ReuseOracleEngine(capacity_blocks, requests)
    if name == "lru-blocks":
        return ReuseOracleEngine(capacity_blocks, requests, admit_all=True)
    tiered = name[len(TIERED_PREFIX):] if name.startswith(TIERED_PREFIX) else name
    if tiered in tiered_policy_names() or tiered == "tinylfu":
        return TieredEngine(tiered, capacity_blocks, clock, policy_config, radix_tokens_per_block, output_tokens,
                            prefill_chunk, tuning, first_tokens)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(known_policies())}")
