"""TinyLFU for a radix tree: admission and eviction by the learned reuse frequency of an entry's class.

Design note
-----------
TinyLFU (Einziger, Friedman, Manes, ACM TOS 2017) admits a new entry only if its estimated frequency beats
that of the victims it would displace. In a prefix cache almost every new suffix is seen for the first
time, so a per-key count is 1 for all of them and cannot tell the suffix that will return (a conversation
that goes on) from the one-shot one. This policy therefore estimates the reuse frequency of a *class* of
entries and keeps TinyLFU's admission contest around it:

- Class: what the tree knows when an entry arrives. A new leaf is classed by its depth (nodes above it: a
  deeper leaf continues a longer conversation) and its size bucket; the back part of a split (what a
  request did not reuse of a leaf) is TAIL; an entry used again becomes REUSED at its depth.
- Frequency = reuse probability of the class, learned online: every entry has one open *event* (its class
  since insertion or its last use); the event counts as reused when the entry is used again, also after it
  was evicted or declined: such keys wait in a bounded FIFO of ghosts (sized in units, a multiple of the
  capacity), and a request that records a ghost key counts a reuse for the ghost's class. Counts are halved
  periodically (aging, like the sketch's reset).
- Eviction: density = reuse probability / (age + horizon), age in policy ticks (one per recorded key, i.e.
  per requested node) since the last use, lowest first. Within one class the least recently used entry has
  the lowest density, so each class keeps an LRU list and a victim query merges the lists' cold ends (no
  heap over all leaves). Leaf-only; parents become candidates once their last child is chosen
  (`_tree.select_leaves`).
- Admission (with bypass): a new suffix comes in only if its class's density at age 0 beats every
  victim's; a declined suffix adds nothing to the tier and becomes a ghost, so its class still learns.

`victims()` changes no state. A flat tier (parent=None) gets depth 1 for every entry: classes by size and
reuse.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import Callable, Hashable, Iterable, List, Optional

from tiers.clock import Clock
from tiers.policies._tree import TreeIndex, select_leaves
from tiers.policy import Candidate, Policy, register_policy

_SIZE_EDGES = (1, 4, 16)  # size buckets: 1, 2-4, 5-16, >16 units


@register_policy("tinylfu")
class TinyLFUPolicy(Policy):
    def __init__(
        self,
        capacity: int,
        clock: Optional[Clock] = None,
        *,
        max_depth: int = 4,
        horizon: float = 0.0,
        ghost_factor: float = 4.0,
        decay_period: int = 0,
        admit_margin: float = 1.0,
        prior_hits: float = 1.0,
        prior_events: float = 2.0,
    ):
        super().__init__(capacity, clock)
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        if ghost_factor < 0:
            raise ValueError(f"ghost_factor must be >= 0, got {ghost_factor}")
        if horizon < 0:
            raise ValueError(f"horizon must be >= 0, got {horizon}")
        self.index = TreeIndex()
        self.max_depth = max_depth
        nb = len(_SIZE_EDGES) + 1
        self._tail = max_depth * nb
        self._reused0 = self._tail + 1
        n_classes = self._reused0 + max_depth
        self._lists = [OrderedDict() for _ in range(n_classes)]
        self.hits = [0.0] * n_classes
        self.events = [0.0] * n_classes
        self.prior_hits = prior_hits
        self.prior_events = prior_events
        self.horizon = horizon
        self.ghost_factor = ghost_factor
        self.decay_period = decay_period or 10 * capacity
        self.admit_margin = admit_margin
        self._ghosts: "OrderedDict[Hashable, tuple]" = OrderedDict()  # key -> (class, size)
        self._ghost_size = 0
        self._returned: "OrderedDict[Hashable, None]" = OrderedDict()
        self._since_decay = 0
        self.now = 0  # the policy's clock: one tick per recorded key

    # --- classes and their learned reuse probability ---
    def _new_class(self, depth: int, size: int) -> int:
        s = 0
        for edge in _SIZE_EDGES:
            if size <= edge:
                break
            s += 1
        return (min(depth, self.max_depth) - 1) * (len(_SIZE_EDGES) + 1) + s

    def _reused_class(self, depth: int) -> int:
        return self._reused0 + min(depth, self.max_depth) - 1

    def probability(self, cls: int) -> float:
        return (self.hits[cls] + self.prior_hits) / (self.events[cls] + self.prior_events)

    def _open(self, cls: int) -> None:
        self.events[cls] += 1
        self._since_decay += 1
        if self._since_decay >= self.decay_period:
            self._since_decay = 0
            self.hits = [h * 0.5 for h in self.hits]
            self.events = [e * 0.5 for e in self.events]

    def _ghost(self, key, cls: int, size: int) -> None:
        g = self._ghosts
        old = g.pop(key, None)
        if old is not None:
            self._ghost_size -= old[1]
        g[key] = (cls, size)
        self._ghost_size += size
        limit = self.ghost_factor * self.capacity
        while self._ghost_size > limit and g:
            self._ghost_size -= g.popitem(last=False)[1][1]

    def _horizon(self) -> float:
        return self.horizon or max(1.0, float(len(self.index.nodes)))

    # --- notifications ---
    def on_insert(self, entry, key, size, parent=None) -> None:
        n = self.index.add(entry, key, size, parent)
        n.tick = self.now
        if key in self._returned:  # a ghost that came back: it was used again, not a first-seen suffix
            del self._returned[key]
            cls = self._reused_class(n.depth)
        else:
            cls = self._new_class(n.depth, size)
        n.region = cls
        self._open(cls)
        self._lists[cls][entry] = None

    def on_access(self, entry) -> None:
        n = self.index.nodes.get(entry)
        if n is None:
            return
        n.tick = self.now
        self.hits[n.region] += 1
        cls = self._reused_class(n.depth)
        self._open(cls)
        del self._lists[n.region][entry]
        n.region = cls
        self._lists[cls][entry] = None

    def on_remove(self, entry) -> None:
        n = self.index.remove(entry)
        del self._lists[n.region][entry]
        self._ghost(n.key, n.region, n.size)

    def on_resize(self, entry, new_size, new_parent, new_key=None) -> None:
        n, old_parent = self.index.resize(entry, new_size, new_parent)
        if new_key is not None:
            n.key = new_key
        if new_parent is None or new_parent == old_parent:
            return
        # a split: the new front node carries on the entry's event (it is what the request reuses); the
        # back part, which the request did not reach, starts a TAIL event
        front = self.index.nodes[new_parent]
        self.events[front.region] -= 1
        del self._lists[front.region][new_parent]
        front.region, front.tick, front.depth = n.region, n.tick, n.depth
        self._lists[n.region][new_parent] = None
        del self._lists[n.region][entry]
        n.region = self._tail
        n.depth += 1
        self._open(self._tail)
        self._lists[self._tail][entry] = None

    def record(self, key) -> None:
        self.now += 1
        g = self._ghosts.pop(key, None)
        if g is not None:
            self.hits[g[0]] += 1
            self._ghost_size -= g[1]
            r = self._returned
            r[key] = None
            if len(r) > 64:
                r.popitem(last=False)

    # --- decisions ---
    def admit(self, candidate: Candidate, victims: Iterable[Hashable]) -> bool:
        nodes = self.index.nodes
        parent = nodes.get(candidate.parent) if candidate.parent is not None else None
        cls = self._new_class(parent.depth + 1 if parent is not None else 1, candidate.size)
        now = self.now
        h = self._horizon()
        prob = self.probability
        top = max((prob(nodes[v].region) / (now - nodes[v].tick + h) for v in victims), default=0.0)
        if prob(cls) / h * self.admit_margin >= top:
            return True
        self._open(cls)
        self._ghost(candidate.key, cls, candidate.size)
        return False

    def victims(self, size: int, protected: Callable[[Hashable], bool] = lambda e: False) -> List[Hashable]:
        nodes = self.index.nodes
        now = self.now
        h = self._horizon()
        seq = itertools.count()

        def rank(n):
            return self.probability(n.region) / (now - n.tick + h)

        def stream(lst, p):
            for e in lst:
                n = nodes[e]
                yield (p / (now - n.tick + h), next(seq), n)

        streams = [stream(lst, self.probability(c)) for c, lst in enumerate(self._lists) if lst]
        order = ((r, n) for r, _, n in heapq.merge(*streams))
        return select_leaves(self.index, size, protected, order, rank, yields_inner=True)

    def __len__(self) -> int:
        return len(self.index.nodes)
