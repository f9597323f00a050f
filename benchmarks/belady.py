"""Reference engines that need no SGLang: Belady's OPT with bypass, a reuse oracle, and an infinite cache.

OPT keeps, among the cached blocks plus the block being served, those whose next use is nearest; the one whose
next use is farthest is evicted, or refused admission if it is the incoming block. Time is the position in the
flattened stream of block accesses (request by request, block by block), so next uses are distinct.

Why this respects the radix tree's leaf-only eviction: in a prefix-chained trace a block is used only together
with its parent, one position earlier, so a parent's next use is always earlier than any child's. The farthest
block is therefore never a parent of a cached block (blocks never used again tie at infinity; deeper goes
first), the cache stays prefix-closed, and its hits are exactly "the longest cached prefix". Among all policies
that may evict any cached block at any time and may refuse admission, Belady with bypass maximizes block hits,
so it bounds every tree policy (which can only do less) from above.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from typing import Dict, List, Sequence, Set

from benchmarks.engines import Access, EngineStats
from benchmarks.trace import Request

NEVER = float("inf")


def next_uses(requests: Sequence[Request]) -> List[float]:
    """For every block access in stream order, the stream position of the same block's next access."""
    stream = [b for r in requests for b in r.blocks]
    out: List[float] = [NEVER] * len(stream)
    seen: Dict[int, int] = {}
    for pos in range(len(stream) - 1, -1, -1):
        out[pos] = seen.get(stream[pos], NEVER)
        seen[stream[pos]] = pos
    return out


class _BlockEngine:
    """Counters and read-outs shared by the block-level reference engines (`_cached`: block -> anything)."""

    def __init__(self, capacity_blocks: int, requests: Sequence[Request]):
        self.capacity = capacity_blocks
        self._next = next_uses(requests)
        self._pos = 0
        self._evicted = 0
        self._rejected = 0
        self._ns = 0

    def cached_blocks(self) -> Set[int]:
        return set(self._cached)

    def stats(self) -> EngineStats:
        return EngineStats(
            evictions=self._evicted, evicted_blocks=self._evicted, admissions_rejected=self._rejected, policy_ns=self._ns
        )


class BeladyEngine(_BlockEngine):
    def __init__(self, capacity_blocks: int, requests: Sequence[Request]):
        super().__init__(capacity_blocks, requests)
        self._cached: Dict[int, float] = {}  # block -> its next use
        self._heap: list = []  # (-next_use, -depth, block); stale entries skipped lazily

    def _farthest(self):
        while True:
            neg_next, neg_depth, block = self._heap[0]
            if self._cached.get(block) == -neg_next:
                return (-neg_next, -neg_depth), block
            heapq.heappop(self._heap)

    def access(self, req: Request) -> Access:
        t0 = time.perf_counter_ns()
        hit = 0
        while hit < len(req.blocks) and req.blocks[hit] in self._cached:
            hit += 1
        evicted: List[int] = []
        declined: List[int] = []
        bypassing = False
        for depth, block in enumerate(req.blocks):
            nxt = self._next[self._pos]
            self._pos += 1
            if block in self._cached:
                self._cached[block] = nxt
                heapq.heappush(self._heap, (-nxt, -depth, block))
                continue
            if bypassing:  # every later block of this prompt is used even later: refused too
                self._rejected += 1
                declined.append(block)
                continue
            if len(self._cached) >= self.capacity:
                key, victim = self._farthest()
                if key <= (nxt, depth):
                    bypassing = True
                    self._rejected += 1
                    declined.append(block)
                    continue
                heapq.heappop(self._heap)
                del self._cached[victim]
                evicted.append(victim)
            self._cached[block] = nxt
            heapq.heappush(self._heap, (-nxt, -depth, block))
        self._evicted += len(evicted)
        self._ns += time.perf_counter_ns() - t0
        return Access(hit_blocks=hit, evicted=evicted, declined=declined)


class ReuseOracleEngine(_BlockEngine):
    """LRU over blocks, leaf-first, that admits a block only if the trace uses it again: a perfect yes/no
    prediction of reuse, with no knowledge of when.

    It answers how much of Belady's margin an admission filter could win if it predicted reuse perfectly,
    and so how good a predictor the issue #3 goal needs. A request touches its blocks deepest first, so a
    parent is always more recent than its children and the LRU victim is always a leaf; an admitted block's
    parent is admitted too (it is used again whenever the child is), so the cache stays prefix-closed.
    With `admit_all` it is plain block-level leaf-first LRU (the trace README's "LRU, leaf-first" column).
    """

    def __init__(self, capacity_blocks: int, requests: Sequence[Request], admit_all: bool = False):
        super().__init__(capacity_blocks, requests)
        self._admit_all = admit_all
        self._cached: "OrderedDict[int, None]" = OrderedDict()

    def access(self, req: Request) -> Access:
        t0 = time.perf_counter_ns()
        cached = self._cached
        hit = 0
        while hit < len(req.blocks) and req.blocks[hit] in cached:
            hit += 1
        start = self._pos
        self._pos += len(req.blocks)
        declined: List[int] = []
        for depth in range(len(req.blocks) - 1, -1, -1):
            block = req.blocks[depth]
            if block in cached:
                cached.move_to_end(block)
            elif self._admit_all or self._next[start + depth] != NEVER:
                cached[block] = None
            else:
                self._rejected += 1
                declined.append(block)
        evicted: List[int] = []
        while len(cached) > self.capacity:
            evicted.append(cached.popitem(last=False)[0])
        self._evicted += len(evicted)
        self._ns += time.perf_counter_ns() - t0
        return Access(hit_blocks=hit, evicted=evicted, declined=declined[::-1])


class InfiniteEngine:
    """Everything ever seen stays cached: the ceiling any capacity can reach."""

    def __init__(self) -> None:
        self._seen: Set[int] = set()

    def access(self, req: Request) -> Access:
        hit = 0
        while hit < len(req.blocks) and req.blocks[hit] in self._seen:
            hit += 1
        self._seen.update(req.blocks)
        return Access(hit_blocks=hit, evicted=())

    def stats(self) -> EngineStats:
        return EngineStats(evictions=0, evicted_blocks=0, admissions_rejected=0, policy_ns=0)
