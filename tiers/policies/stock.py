"""Equivalents of SGLang's stock eviction strategies (sglang/srt/mem_cache/evict_policy.py), as policies.

- lru:  evict the least recently used leaf (`last_access_time`).
- lfu:  evict the leaf with the fewest uses, then the least recent (`(hit_count, last_access_time)`).
- slru: two segments by use count: leaves used fewer than `protected_threshold` times go first, LRU within
        each segment (`(hit_count >= threshold, last_access_time)`).

A "use" is one `on_insert`/`on_access` notification, which the radix adapter sends where SGLang bumps
`hit_count` (insert traversals); recency is a logical tick, never the wall clock. A tree split copies the
use count to the new parent, as `_split_node` copies `hit_count`. Always admit.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, List, Optional

from tiers.clock import Clock
from tiers.policies._tree import TreeIndex, heap_order, select_leaves
from tiers.policy import Policy, register_policy


class _TreePolicy(Policy):
    """Tracks the tree; subclasses define the eviction rank of a node."""

    def __init__(self, capacity: int, clock: Optional[Clock] = None):
        super().__init__(capacity, clock)
        self.index = TreeIndex()

    def on_insert(self, entry, key, size, parent=None) -> None:
        n = self.index.add(entry, key, size, parent)
        n.count = 1

    def on_access(self, entry) -> None:
        n = self.index.nodes.get(entry)
        if n is None:
            return  # the tier may touch entries it never reported (e.g. the root); nothing to rank
        n.tick = self.index.tick()
        n.count += 1

    def on_remove(self, entry) -> None:
        self.index.remove(entry)

    def on_resize(self, entry, new_size, new_parent, new_key=None) -> None:
        n, old_parent = self.index.resize(entry, new_size, new_parent)
        if new_key is not None:
            n.key = new_key
        if new_parent is not None and new_parent != old_parent:
            # like _split_node: the new parent inherits hit_count and is itself freshly accessed
            self.index.nodes[new_parent].count = n.count

    def __len__(self) -> int:
        return len(self.index.nodes)

    def _rank(self, n):
        raise NotImplementedError

    def victims(self, size: int, protected: Callable[[Hashable], bool] = lambda e: False) -> List[Hashable]:
        return select_leaves(
            self.index, size, protected, heap_order(self.index, self._rank), self._rank, yields_inner=False
        )


@register_policy("lru")
class LRUPolicy(_TreePolicy):
    """Recency only. Keeps entries in an ordered dict so a victim query walks from the cold end instead of
    heapifying every leaf."""

    def __init__(self, capacity: int, clock: Optional[Clock] = None):
        super().__init__(capacity, clock)
        self._order: "OrderedDict[Hashable, None]" = OrderedDict()

    def on_insert(self, entry, key, size, parent=None) -> None:
        super().on_insert(entry, key, size, parent)
        self._order[entry] = None

    def on_access(self, entry) -> None:
        if entry in self._order:
            super().on_access(entry)
            self._order.move_to_end(entry)

    def on_remove(self, entry) -> None:
        super().on_remove(entry)
        del self._order[entry]

    def _rank(self, n):
        return n.tick

    def victims(self, size, protected=lambda e: False):
        nodes = self.index.nodes
        order = ((nodes[e].tick, nodes[e]) for e in self._order)
        return select_leaves(self.index, size, protected, order, self._rank, yields_inner=True)


@register_policy("lfu")
class LFUPolicy(_TreePolicy):
    def _rank(self, n):
        return (n.count, n.tick)


@register_policy("slru")
class SLRUPolicy(_TreePolicy):
    def __init__(self, capacity: int, clock: Optional[Clock] = None, protected_threshold: int = 2):
        super().__init__(capacity, clock)
        if protected_threshold < 1:
            raise ValueError(f"protected_threshold must be >= 1, got {protected_threshold}")
        self.protected_threshold = protected_threshold

    def _rank(self, n):
        return (n.count >= self.protected_threshold, n.tick)
