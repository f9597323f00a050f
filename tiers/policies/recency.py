"""The order `tinylfu` follows when the self-tuner steers it to recency, without the learner: the recency
candidate's miniature cache.

Design note
-----------
The self-tuner (tiers/shadow.py) measures each candidate setting on a miniature cache that never changes setting.
Steered to "recency", `tinylfu` ranks leaves by placement alone (the tick of their last use, then the order they
were placed in) and admits everything, which is SGLang's LRU to the token; its classes, ghosts, gate and sketch
keep learning so that the live tree finds them trained when it switches back. A miniature that stays on recency
never reads what they learn, nor needs its leaves in a list per class (merged by age at every victim query). This
policy keeps only what the order is made of, with the same rules, so its victims are `tinylfu`'s on recency, one
for one (tests/tiers/test_retention.py drives both through the same tree changes; tests/benchmarks/
test_self_tuning.py serves traces on both and on SGLang's LRU):

- a tick per recorded key (a request's nodes), which stamps a use;
- a placement (tick, sequence) for each leaf: an insert, a use or a split's back part at the end; a split's front
  part keeps the entry's tick; a parent that loses its last child keeps its own placement;
- one list of leaves in placement order (and one of parked leaves, for tiers.retention.RetainingPolicy), so a
  victim query walks from the cold end past no inner entry; what tree changes and parking do to the lists is
  `_tree.PlacedLeaves`, which `tinylfu` uses too.

Threading: not thread-safe; the tier calls it under its own lock.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from heapq import merge
from itertools import count
from operator import attrgetter, itemgetter
from typing import Callable, Hashable, List, Optional

from tiers.clock import Clock
from tiers.policies._tree import PlacedLeaves, TreeIndex, select_leaves
from tiers.policy import Policy, register_policy

_first = itemgetter(0)
_placed = attrgetter("placed")


@register_policy("recency")
class PlacementRecencyPolicy(PlacedLeaves, Policy):
    def __init__(self, capacity: int, clock: Optional[Clock] = None, *, class_capacity: int = 0,
                 prior_weight: float = 1.0):
        """`class_capacity` and `prior_weight` are a miniature's scaling of a learner (tiers/shadow.py), which
        this policy does not have: accepted so that a shadow is built alike for every setting, and unused."""
        super().__init__(capacity, clock)
        self.index = TreeIndex()
        self.now = 0  # one tick per recorded key, as tinylfu's
        self._placements = count()
        self._leaves: list = []  # (placement, entry) of unparked leaves, in placement order
        self._parked: list = []  # and of parked (retained) leaves

    def record(self, key) -> None:
        self.now += 1

    def on_insert(self, entry, key, size, parent=None) -> None:
        n = self._add_leaf(entry, key, size, parent)
        n.placed = (n.tick, next(self._placements))
        self._place(n)

    def on_access(self, entry) -> None:
        n = self.index.nodes.get(entry)
        if n is not None:
            self._stamp(n)

    def on_remove(self, entry) -> None:
        self._remove_leaf(entry)

    def on_resize(self, entry, new_size, new_parent, new_key=None) -> None:
        front = self._move(entry, new_size, new_parent, new_key)
        if front is None:
            return
        # a split: the front part is what the request reuses and keeps the entry's age (it is an inner entry now,
        # placed where a leaf of that age goes should it be one again); the back part starts now
        n = self.index.nodes[entry]
        front.tick = n.tick
        front.placed = (n.tick, next(self._placements))
        self._stamp(n)

    def _stamp(self, n) -> None:
        """Entry `n` used (or split off) now: at the end of its list if it is a leaf."""
        leaf = not n.children
        if leaf:
            self._leave(n)
        n.tick = self.now
        n.placed = (n.tick, next(self._placements))
        if leaf:
            self._place(n)

    def _place(self, n) -> None:
        insort(self._parked if n.parked else self._leaves, (n.placed, n.entry), key=_first)

    def _leave(self, n) -> None:
        """Take leaf `n` out of its list. Never raises: an entry missing from its list can only be offered less."""
        leaves = self._parked if n.parked else self._leaves
        i = bisect_left(leaves, n.placed, key=_first)
        if i < len(leaves) and leaves[i][1] == n.entry:
            del leaves[i]

    def victims(self, size: int, protected: Callable[[Hashable], bool] = lambda e: False,
                parked: bool = True) -> List[Hashable]:
        """Oldest placement first. `parked=False`: parked entries are neither offered nor walked past."""
        nodes = self.index.nodes
        if parked and self._parked:
            walk = merge(self._leaves, self._parked, key=_first)
        else:
            walk = self._leaves
        if not parked:  # nor taken when the selection frees their last child
            unparked = protected
            protected = lambda e: unparked(e) or nodes[e].parked  # noqa: E731
        order = ((placed, nodes[e]) for placed, e in walk)
        return select_leaves(self.index, size, protected, order, _placed, yields_inner=False)

    def __len__(self) -> int:
        return len(self.index.nodes)
