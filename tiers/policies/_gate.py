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
- its size, in powers of two: very short first prompts are almost never continued.

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

Cost: events sit in a FIFO in open order and expire from its head, so each call is O(1) amortized and the
FIFO holds at most horizon x capacity entries (every event is at least one unit of traffic). `opened` enforces
that bound itself, so a tier that drives `observe` short, or not at all, cannot grow the FIFO past capacity.
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
        self.horizon_units = horizon * capacity
        self.max_depth = max_depth
        self.prior_hits = prior_hits
        self.prior_events = prior_events
        self.hits: Dict[int, float] = {}
        self.events: Dict[int, float] = {}
        self.traffic = 0  # miss units seen so far: the clock events expire by
        # key -> (class, traffic at open, times this key had come back before)
        self._open: "OrderedDict[Hashable, Tuple[int, int, int]]" = OrderedDict()
        self._returning: "OrderedDict[Hashable, int]" = OrderedDict()  # key just recorded -> times back

    def class_of(self, depth: int, size: int) -> int:
        return min(depth, self.max_depth) * 64 + max(size, 0).bit_length()

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
        """A new suffix entered the tier (or was declined): its event starts now."""
        returns = self._returning.pop(key, 0)
        pending = self._open
        pending.pop(key, None)
        pending[key] = (self.class_of(depth + returns, size), self.traffic, returns)
        if len(pending) > self.horizon_units:  # more events than the horizon has units: the oldest is past it
            _, (cls, _, _) = pending.popitem(last=False)
            self.events[cls] = self.events.get(cls, 0.0) + 1.0

    def withdraw(self, key: Hashable) -> None:
        """`key` was reported as new but is not a new suffix (the front part of a split)."""
        self._open.pop(key, None)

    def record(self, key: Hashable) -> None:
        opened = self._open.pop(key, None)
        if opened is None:
            return
        cls, _, returns = opened
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
        events, pending = self.events, self._open
        while pending:
            key, (cls, opened, _) = next(iter(pending.items()))
            if opened >= oldest:
                break
            del pending[key]
            events[cls] = events.get(cls, 0.0) + 1.0

    def __len__(self) -> int:
        return len(self._open)
