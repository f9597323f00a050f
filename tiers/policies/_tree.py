"""Shared bookkeeping for tree-shaped tiers: sizes, parents, child counts, and leaf-only victim selection.

Every built-in policy keeps one `_Node` per entry. A tier that is a tree (SGLang's radix tree) passes
parents; a flat tier passes `parent=None` and every entry is a leaf. Victim selection follows the radix
tree's own rule: only a leaf may go, and a parent becomes a candidate once its last child is gone; this is
what keeps every returned order removable one by one and never strands a cached descendant.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable, Dict, Hashable, Iterable, Iterator, List, Optional, Tuple


class _Node:
    __slots__ = ("entry", "key", "size", "parent", "children", "tick", "count", "region", "depth", "parked", "placed",
                 "slot")

    def __init__(self, entry, key, size, parent):
        self.entry = entry
        self.key = key
        self.size = size
        self.parent = parent  # entry handle or None
        self.children = 0
        self.tick = 0  # logical time of last access: ranks recency without a wall clock
        self.count = 0  # per-entry use count (LFU/SLRU)
        self.region = 0
        self.depth = 1  # nodes from the root down to this one, as of its insertion
        self.parked = False  # retained, for a policy that parks retained entries (tiers.retention)
        self.placed = (0, 0)  # where a policy that keeps ordered lists put it last: (age, sequence)
        self.slot = 0  # and in which of its lists


class TreeIndex:
    """Entry -> _Node with parent/child bookkeeping. Raises on inconsistent notifications."""

    def __init__(self):
        self.nodes: Dict[Hashable, _Node] = {}
        self.leaves: set = set()  # entries with no tracked children
        self.now = 0  # logical time: one tick per insert/access
        self.total = 0

    def tick(self) -> int:
        self.now += 1
        return self.now

    def tick_now(self) -> int:
        return self.now

    def add(self, entry, key, size, parent) -> _Node:
        if entry in self.nodes:
            raise ValueError(f"entry {entry!r} is already tracked")
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        if parent is not None:
            p = self.nodes.get(parent)
            if p is None:
                raise ValueError(f"parent {parent!r} of {entry!r} is not tracked")
            p.children += 1
            self.leaves.discard(parent)
        n = _Node(entry, key, size, parent)
        if parent is not None:
            n.depth = p.depth + 1
        n.tick = self.tick()
        self.nodes[entry] = n
        self.leaves.add(entry)
        self.total += size
        return n

    def remove(self, entry) -> _Node:
        n = self.nodes.pop(entry, None)
        if n is None:
            raise KeyError(f"entry {entry!r} is not tracked")
        if n.children:
            # a tier drops subtrees bottom-up; removing an inner node first would orphan its children
            raise ValueError(f"entry {entry!r} still has {n.children} tracked children")
        self.leaves.discard(entry)
        if n.parent is not None:
            p = self.nodes[n.parent]
            p.children -= 1
            if p.children == 0:
                self.leaves.add(n.parent)
        self.total -= n.size
        return n

    def resize(self, entry, new_size, new_parent) -> Tuple[_Node, Optional[Hashable]]:
        """Returns the node and its old parent."""
        n = self.nodes[entry]
        old_parent = n.parent
        if new_parent != old_parent:
            if new_parent is not None:
                self.nodes[new_parent].children += 1
                self.leaves.discard(new_parent)
            if old_parent is not None:
                op = self.nodes[old_parent]
                op.children -= 1
                if op.children == 0:
                    self.leaves.add(old_parent)
            n.parent = new_parent
        self.total += new_size - n.size
        n.size = new_size
        return n, old_parent


class PlacedLeaves:
    """For a policy that keeps each leaf in a list in placement order (`_place(n)` adds leaf `n` to its list,
    `_leave(n)` takes it out; its `index` is a TreeIndex): what tree changes do to the lists, and parking for
    tiers.retention.RetainingPolicy (a parked leaf sits in a list of parked ones until unparked; an inner entry
    only carries the mark)."""

    def park(self, entry) -> None:
        self._set_parked(entry, True)

    def unpark(self, entry) -> None:
        self._set_parked(entry, False)

    def _set_parked(self, entry, parked: bool) -> None:
        n = self.index.nodes.get(entry)
        if n is None or n.parked == parked:
            return
        if n.children:
            n.parked = parked
            return
        self._leave(n)
        n.parked = parked
        self._place(n)

    def _add_leaf(self, entry, key, size, parent) -> _Node:
        """Track `entry`, used at the policy's tick `self.now`; its parent leaves its list if it just stopped being a
        leaf. The caller places the new leaf."""
        index = self.index
        n = index.add(entry, key, size, parent)
        n.tick = self.now
        if parent is not None and index.nodes[parent].children == 1:  # its parent is no leaf any more
            self._leave(index.nodes[parent])
        return n

    def _remove_leaf(self, entry) -> _Node:
        """Stop tracking leaf `entry`; a parent left without children is placed again, where it was."""
        n = self.index.remove(entry)
        self._leave(n)
        if n.parent is not None:
            p = self.index.nodes[n.parent]
            if not p.children:  # a leaf again
                self._place(p)
        return n

    def _move(self, entry, new_size, new_parent, new_key) -> Optional[_Node]:
        """`on_resize`'s tree change: `entry` resized under `new_parent`, the lists kept to the leaves. Returns the
        split's front part (`new_parent`, reported by `on_insert` just before) if this is a split, else None."""
        nodes = self.index.nodes
        front = nodes.get(new_parent) if new_parent is not None else None
        if front is not None and not front.children and nodes[entry].parent != new_parent:
            self._leave(front)  # about to be the entry's parent
        n, old_parent = self.index.resize(entry, new_size, new_parent)
        if new_key is not None:
            n.key = new_key
        if new_parent == old_parent:
            return None
        if old_parent is not None and not nodes[old_parent].children:
            self._place(nodes[old_parent])
        return front  # None: moved to the root level, no split


def select_leaves(
    index: TreeIndex,
    size: int,
    protected: Callable[[Hashable], bool],
    order: Iterable[Tuple[object, _Node]],
    rank: Callable[[_Node], object],
    exclude: Optional[set] = None,
    yields_inner: bool = True,
) -> List[Hashable]:
    """Leaf-only victims totalling >= `size` (fewer if not enough can go), changing no state.

    `order` yields (rank, node) best-victim-first; `rank` gives the same ordering key for a parent that
    becomes a leaf during the selection, which then competes through a small heap exactly as in
    RadixCache.evict. `yields_inner`: whether `order` also yields inner nodes (a recency list does; a heap
    of the current leaves does not, so every parent that becomes a leaf goes through the heap).
    """
    out: List[Hashable] = []
    if size <= 0:
        return out
    nodes = index.nodes
    taken = set() if exclude is None else set(exclude)
    gone_children: Dict[Hashable, int] = {}
    for e in taken:  # entries chosen before this call count as gone
        p = nodes[e].parent
        if p is not None:
            gone_children[p] = gone_children.get(p, 0) + 1
    gone = gone_children.get  # a node is a leaf here when all its tracked children are gone
    skipped_inner = set()
    offered = _leaves_now(order, taken, protected, gone, skipped_inner)
    heap: List[tuple] = []
    seq = itertools.count()
    freed = 0
    pending = None  # (rank, node) `order` offered next

    while freed < size:
        if pending is None:
            pending = next(offered, None)
        if heap and (pending is None or heap[0][0] < pending[0]):
            n = heapq.heappop(heap)[2]
        elif pending is not None:
            n, pending = pending[1], None
        else:
            break
        e = n.entry
        if e in taken:
            continue
        taken.add(e)
        out.append(e)
        freed += n.size
        p = n.parent
        if p is not None:
            gone_children[p] = g = gone(p, 0) + 1
            pn = nodes[p]
            if (not yields_inner or p in skipped_inner) and pn.children == g and not protected(p):
                heapq.heappush(heap, (rank(pn), next(seq), pn))
    return out


def _leaves_now(order: Iterable[Tuple[object, _Node]], taken: set, protected: Callable[[Hashable], bool],
                gone: Callable, skipped_inner: set) -> Iterator[Tuple[object, _Node]]:
    """What `order` offers that is a leaf when asked for (all its tracked children gone), not taken and not
    protected; the inner nodes it passes over go into `skipped_inner`. Lazy: the state is read at each step."""
    for r, n in order:
        e = n.entry
        if e in taken or protected(e):
            continue
        if n.children != gone(e, 0):
            skipped_inner.add(e)
            continue
        yield r, n


def heap_order(index: TreeIndex, rank: Callable[[_Node], object]) -> Iterator[Tuple[object, _Node]]:
    """Current leaves, lowest rank first (what RadixCache.evict does: heapify the evictable leaves)."""
    nodes = index.nodes
    heap = [(rank(nodes[e]), i, nodes[e]) for i, e in enumerate(index.leaves)]
    heapq.heapify(heap)
    while heap:
        r, _, n = heapq.heappop(heap)
        yield r, n
