"""Learned reuse probability per class of tree entry: the prior that tinylfu's admission contest uses.

A per-key frequency count is 1 for almost every new suffix of a prefix cache (each is seen for the first
time), so it cannot tell the suffix that will return (a conversation that goes on) from the one-shot one.
What the tree does know when an entry arrives is its *class*, and the reuse rate of a class can be learned:

- Class of a new entry: its depth (nodes above it: a deeper leaf continues a longer conversation), its size
  bucket, and its parent's gap bucket (how soon the chain it extends came back last time, against the cache
  lifetime). The back part of a split (what a request did not reach of a leaf) is TAIL. An entry used again
  becomes REUSED at its depth and the gap bucket of that reuse.
- Every entry has one open *event* (its class since insertion or its last use). The event counts as a hit
  when the entry is used again, also after it was evicted or declined: such keys wait in a bounded FIFO of
  ghosts (sized in units, a multiple of the capacity). A reuse counts only within `window_factor` x the
  cache lifetime (running mean age at eviction): a return long after any entry would still be cached says
  nothing about what is worth keeping. Counts are halved every `decay_period` events (aging).

Time is the owner's logical tick (one per tree notification), passed in; nothing reads a clock here.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable

_SIZE_EDGES = (1, 4, 16)  # size buckets: 1, 2-4, 5-16, >16 units


class ReuseClasses:
    def __init__(
        self,
        capacity: int,
        *,
        max_depth: int = 4,
        gap_buckets: int = 4,
        ghost_factor: float = 4.0,
        window_factor: float = 2.0,
        decay_period: int = 0,
        prior_hits: float = 1.0,
        prior_events: float = 2.0,
    ):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        if gap_buckets < 1:
            raise ValueError(f"gap_buckets must be >= 1, got {gap_buckets}")
        if ghost_factor < 0:
            raise ValueError(f"ghost_factor must be >= 0, got {ghost_factor}")
        if window_factor <= 0:
            raise ValueError(f"window_factor must be > 0, got {window_factor}")
        self.max_depth = max_depth
        self.n_gaps = gap_buckets + 1  # the last one: no reuse seen yet
        self.tail = max_depth * (len(_SIZE_EDGES) + 1) * self.n_gaps
        self._reused0 = self.tail + 1
        n = self._reused0 + max_depth * self.n_gaps
        self.hits = [0.0] * n
        self.events = [0.0] * n
        self.prior_hits = prior_hits
        self.prior_events = prior_events
        self.window_factor = window_factor
        self.ghost_limit = ghost_factor * capacity
        self.decay_period = decay_period or 10 * capacity
        self.lifetime = 0.0  # running mean age at eviction, in ticks (0: nothing evicted yet)
        self._ghosts: "OrderedDict[Hashable, tuple]" = OrderedDict()  # key -> (class, size, tick)
        self._ghost_size = 0
        self._returned: "OrderedDict[Hashable, None]" = OrderedDict()
        self._since_decay = 0

    # --- classes ---
    def new_class(self, depth: int, size: int, gap: int = -1) -> int:
        s = 0
        for edge in _SIZE_EDGES:
            if size <= edge:
                break
            s += 1
        g = self.n_gaps - 1 if gap < 0 else gap
        return ((min(depth, self.max_depth) - 1) * (len(_SIZE_EDGES) + 1) + s) * self.n_gaps + g

    def reused_class(self, depth: int, gap: int = -1) -> int:
        g = self.n_gaps - 1 if gap < 0 else gap
        return self._reused0 + (min(depth, self.max_depth) - 1) * self.n_gaps + g

    def gap_of(self, cls: int) -> int:
        """The gap bucket a REUSED class was entered with (-1 for any other class)."""
        return (cls - self._reused0) % self.n_gaps if cls >= self._reused0 else -1

    def gap_bucket(self, age: float) -> int:
        # how soon a chain came back, against the cache's lifetime: halves of it, then doublings
        life = self.lifetime
        if not life:
            return 0
        b, edge = 0, life / 2
        while age > edge and b < self.n_gaps - 2:
            b += 1
            edge *= 2
        return b

    def in_window(self, age: float) -> bool:
        """Whether a reuse after `age` ticks says something about what to keep."""
        return not self.lifetime or age <= self.window_factor * self.lifetime

    def probability(self, cls: int) -> float:
        return (self.hits[cls] + self.prior_hits) / (self.events[cls] + self.prior_events)

    # --- events ---
    def open(self, cls: int) -> None:
        self.events[cls] += 1
        self._since_decay += 1
        if self._since_decay >= self.decay_period:
            self._since_decay = 0
            self.hits = [h * 0.5 for h in self.hits]
            self.events = [e * 0.5 for e in self.events]

    def reused(self, cls: int, age: float) -> None:
        if self.in_window(age):
            self.hits[cls] += 1

    def evicted(self, age: float) -> None:
        life = self.lifetime
        self.lifetime = age if not life else life + 0.01 * (age - life)

    # --- ghosts: keys no longer cached whose return still teaches their class ---
    def ghost(self, key, cls: int, size: int, tick: int) -> None:
        g = self._ghosts
        old = g.pop(key, None)
        if old is not None:
            self._ghost_size -= old[1]
        g[key] = (cls, size, tick)
        self._ghost_size += size
        while self._ghost_size > self.ghost_limit and g:
            self._ghost_size -= g.popitem(last=False)[1][1]

    def recall(self, key, now: int) -> None:
        """A request asked for `key`: if it is a ghost, its class was reused."""
        g = self._ghosts.pop(key, None)
        if g is not None:
            self.reused(g[0], now - g[2])
            self._ghost_size -= g[1]
            r = self._returned
            r[key] = None
            if len(r) > 64:
                r.popitem(last=False)

    def take_returned(self, key) -> bool:
        """Whether `key` is a ghost that came back (and is now being re-inserted); forgets it."""
        if key in self._returned:
            del self._returned[key]
            return True
        return False
