"""The reuse gate: a learned admission bar for new suffixes, shared by `tinylfu` and `reuse-gate`.

Design note
-----------
TinyLFU puts a frequency filter in front of an eviction policy: a newcomer enters only if it is likely to be
used again. In a prefix cache almost every new suffix is seen once, so a per-key count says nothing; what
does predict reuse is what the tree shows when the suffix arrives:

- its depth, plus the number of times this same suffix key already came back while declined (a declined
  suffix is not in the tree, so the next turn of its conversation arrives under the same key again): a
  conversation that has gone on is likelier to go on (Mooncake conversation trace: 25% of first turns get a
  next turn, 75% of sixth turns; synthetic trace: 12% and 73%);
- its size as a fraction of the capacity, in powers of two: very short first prompts are almost never
  continued. A fraction, not a count of units, so the classes are the same whether a unit is a token or a
  block (at 1e6 tokens of 512-token blocks, the buckets are 1, 2-3, 4-7, ... blocks).

(depth, size) is the suffix's class. Each new suffix opens one *event* for its class, keyed by its first
block's scoped key, whether it was admitted or declined. The event counts as reused when a later request
passes through that key (`record`) within `horizon` x capacity units of miss traffic (the units requests had
to compute), and as not reused once that much traffic has gone by. The horizon is as long as a cache could
hold the suffix: a return later than that cannot be served whatever the policy does, so it must not make a
class look useful. (A horizon tied to the cache's own lifetime, as `tinylfu`'s class learner uses, made every
class look useless here: returns come 5 capacities of traffic later, far beyond an LRU lifetime.)

The gate passes a suffix whose class's reuse probability (hits + prior) / (events + prior) is at least
`threshold`. The bar is fixed: a contest against the classes of the victims, tried on the same replay, let the
tier fill with middling classes and lost most of the gain.

Cost: events sit in a FIFO in open order and expire from its head, so each call is O(1) amortized. The open
events hold at most horizon x capacity units (each counts its suffix's size, at least one unit, so that also
bounds their number). `opened` enforces that bound itself, so a tier that drives `observe` short, or not at
all, cannot grow the FIFO past it; like every rule here it is in units relative to the capacity, not in
events, so it does not loosen when a unit is a token rather than a block. A new suffix's size is miss
traffic, so with `observe` driven the bound trips at most one suffix's traffic before the horizon would.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, Hashable, Mapping, Tuple

from tiers.policy import Candidate


class ReuseGate:
    """Not thread-safe: called by the policy that owns it, under the tier's lock."""

    def __init__(
        self,
        capacity: int,
        threshold: float = 0.3,
        horizon: float = 5.0,
        max_depth: int = 8,
        prior_hits: float = 1.0,
        prior_events: float = 3.0,
        class_capacity: int = 0,
    ):
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"gate threshold must be in [0, 1], got {threshold}")
        if horizon <= 0:
            raise ValueError(f"gate horizon must be > 0, got {horizon}")
        if max_depth < 1:
            raise ValueError(f"gate max_depth must be >= 1, got {max_depth}")
        if not (prior_events > 0 and 0 <= prior_hits <= prior_events):
            raise ValueError(f"gate priors need 0 <= hits <= events, events > 0; got {prior_hits}, {prior_events}")
        self.threshold = threshold
        self.capacity = capacity
        # sizes are classed against this capacity (0: the tier's own); a shadow cache classes against the
        # live tier's, so that a miniature puts a suffix in the class the live tier would
        self.class_capacity = class_capacity or capacity
        self.horizon_units = horizon * capacity
        self.max_depth = max_depth
        self.prior_hits = prior_hits
        self.prior_events = prior_events
        self.hits: Dict[int, float] = {}
        self.events: Dict[int, float] = {}
        self.traffic = 0  # miss units seen so far: the clock events expire by
        # key -> (class, traffic at open, times this key had come back before, units)
        self._open: "OrderedDict[Hashable, Tuple[int, int, int, int]]" = OrderedDict()
        self._open_units = 0  # units of the open events
        self._returning: "OrderedDict[Hashable, int]" = OrderedDict()  # key just recorded -> times back
        self._just_opened: Hashable = None  # the key the last `opened` call started an event for

    def class_of(self, depth: int, size: int) -> int:
        # size bucket: log2 of size / capacity, from 2^-20 of the capacity up (the bucket of 2^-20 .. 2^-19
        # is 1; smaller is 0)
        return min(depth, self.max_depth) * 64 + min(((max(size, 0) << 20) // self.class_capacity).bit_length(), 63)

    def reuse_probability(self, cls: int) -> float:
        return (self.hits.get(cls, 0.0) + self.prior_hits) / (self.events.get(cls, 0.0) + self.prior_events)

    def admits(self, candidate: Candidate, nodes: Mapping[Hashable, Any]) -> bool:
        """`passes` for a tier's candidate; `nodes` is the policy's tree index (entry -> node with a depth). A
        retained one (its request asked for a session TTL) always passes: the client said it will come back,
        which no class estimate knows better."""
        if candidate.retained:
            return True
        parent = nodes.get(candidate.parent) if candidate.parent is not None else None
        return self.passes(candidate.key, parent.depth + 1 if parent is not None else 1, candidate.size)

    def passes(self, key: Hashable, depth: int, size: int) -> bool:
        """Whether a new suffix may enter; a declined one opens its event here (it gets no `opened`)."""
        if self.reuse_probability(self.class_of(depth + self._returning.get(key, 0), size)) >= self.threshold:
            return True
        self.opened(key, depth, size)
        return False

    def opened(self, key: Hashable, depth: int, size: int) -> None:
        """A new suffix entered the tier (or was declined): its event starts now. A key whose event is still
        open is the same suffix reported again (the front part of a split, which keeps the key): its event
        goes on as it was. SGLang splits a finished request's new leaf at once (prompt | output), so resetting
        or dropping the event there would hide every live suffix from the gate."""
        pending = self._open
        if key in pending:
            self._just_opened = None
            return
        returns = self._returning.pop(key, 0)
        self._just_opened = key
        units = max(size, 1)
        pending[key] = (self.class_of(depth + returns, size), self.traffic, returns, units)
        self._open_units += units
        # more open units than the horizon has: the oldest events are past it
        while self._open_units > self.horizon_units and len(pending) > 1:
            self._expire_oldest()

    def withdraw(self, key: Hashable) -> None:
        """`key` was reported as new (`opened`, just before) but is the front part of a split: the event that
        report opened goes (one it found open and kept stays)."""
        if self._just_opened == key:
            self._close(key)
        self._just_opened = None

    def _close(self, key: Hashable):
        """Remove `key`'s open event (if any) without counting it; returns it."""
        opened = self._open.pop(key, None)
        if opened is not None:
            self._open_units -= opened[3]
        return opened

    def _expire_oldest(self) -> None:
        """The oldest open event counts as not reused."""
        _, (cls, _, _, units) = self._open.popitem(last=False)
        self._open_units -= units
        self.events[cls] = self.events.get(cls, 0.0) + 1.0

    def record(self, key: Hashable) -> None:
        opened = self._open.pop(key, None)  # _close, inlined: this runs for every key a request passes
        if opened is None:
            return
        cls, _, returns, units = opened
        self._open_units -= units
        self.hits[cls] = self.hits.get(cls, 0.0) + 1.0
        self.events[cls] = self.events.get(cls, 0.0) + 1.0
        # the request that brought the key back asks for its admission next; a declined suffix comes back
        # under the same key, so it carries the count into its class
        r = self._returning
        r[key] = returns + 1
        if len(r) > 64:
            r.popitem(last=False)

    def observe(self, hit: int, total: int) -> None:
        self.traffic += max(total - hit, 0)
        oldest = self.traffic - self.horizon_units
        pending = self._open
        while pending and next(iter(pending.values()))[1] < oldest:
            self._expire_oldest()

    def __len__(self) -> int:
        return len(self._open)
