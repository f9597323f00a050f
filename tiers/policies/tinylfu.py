"""W-TinyLFU for a radix tree (and for flat tiers).

Design note
-----------
W-TinyLFU (Einziger, Friedman, Manes, ACM TOS 2017; Caffeine's BoundedLocalCache) splits capacity into a
small LRU *window* that takes every new entry and a *main* region (segmented LRU: probation + protected)
guarded by a TinyLFU admission filter: an entry leaving the window enters main only if its sketch
frequency beats the probation victim it would displace. Here capacity and every region are measured in
tokens (entry sizes), and three things change for a prefix tree:

1. Leaf-only victims. Evicting an inner node would strand its cached descendants (they become
   unreachable for a prefix match). Victims are taken only from leaves; a parent becomes a candidate once
   its last child is gone (see `_tree.select_leaves`).
2. Admission with bypass. A new suffix that would not survive the window (it is bigger than the window)
   contests at once against the main-region victims it would displace; if it loses, the tier does not
   cache it at all (`admit` returns False) instead of letting a one-shot suffix flush useful prefixes.
3. Adaptive window. Recency-heavy phases want a big window, frequency-heavy ones a small one; a hill
   climber (Caffeine's) moves the window size by a decaying step after each sample period, keeping the
   direction while the observed hit rate improves.

What a frequency is: the tier records one key per node on a request's path (and the key of the new
remainder). In a prefix tree a node's key identifies the path up to its first token, so a deeper node's
count never exceeds its ancestors' (exactly, before sketch noise); a leaf's frequency therefore already
weighs in the popularity of its whole path.

State changes in `victims()`: it may move window overflow into probation (region bookkeeping only); it
never forgets an entry, so a tier that evicts nothing after the query leaves the policy consistent.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Hashable, Iterable, List, Optional

from tiers.clock import Clock
from tiers.policies._tree import TreeIndex, heap_order, select_leaves
from tiers.policy import Candidate, Policy, register_policy
from tiers.sketch import FrequencySketch

WINDOW, PROBATION, PROTECTED = 0, 1, 2


class _HillClimber:
    """Caffeine-style window sizing: step in the direction that last improved the hit rate."""

    def __init__(self, capacity: int, sample_tokens: int, step_fraction: float, decay: float, restart: float):
        self.capacity = capacity
        self.sample_tokens = sample_tokens
        self.initial_step = step_fraction * capacity
        self.step = self.initial_step
        self.decay = decay
        self.restart = restart
        self.hits = 0
        self.total = 0
        self.prev_rate: Optional[float] = None

    def observe(self, hit: int, total: int) -> float:
        """Returns the window size change to apply (tokens, may be negative or 0)."""
        self.hits += hit
        self.total += total
        if self.total < self.sample_tokens:
            return 0.0
        rate = self.hits / self.total
        self.hits = self.total = 0
        if self.prev_rate is None:
            self.prev_rate = rate
            return self.step
        change = rate - self.prev_rate
        if change < 0:
            self.step = -self.step
        self.step *= self.decay
        if abs(change) >= self.restart:
            self.step = self.initial_step if self.step >= 0 else -self.initial_step
        self.prev_rate = rate
        return self.step


@register_policy("tinylfu")
class TinyLFUPolicy(Policy):
    def __init__(
        self,
        capacity: int,
        clock: Optional[Clock] = None,
        *,
        window_fraction: float = 0.01,
        protected_fraction: float = 0.8,
        adaptive: bool = True,
        sample_factor: float = 10.0,
        step_fraction: float = 0.0625,
        step_decay: float = 0.98,
        restart_threshold: float = 0.05,
        sketch_keys: Optional[int] = None,
        doorkeeper: bool = False,
        seed: Optional[int] = None,
        main: str = "lfu",
    ):
        super().__init__(capacity, clock)
        if not 0.0 <= window_fraction <= 1.0:
            raise ValueError(f"window_fraction must be in [0, 1], got {window_fraction}")
        if not 0.0 <= protected_fraction <= 1.0:
            raise ValueError(f"protected_fraction must be in [0, 1], got {protected_fraction}")
        if sample_factor <= 0:
            raise ValueError(f"sample_factor must be positive, got {sample_factor}")
        if main not in ("slru", "lfu"):
            raise ValueError(f"main must be 'slru' or 'lfu', got {main!r}")
        self.main = main
        self.index = TreeIndex()
        self.sketch = FrequencySketch(
            sketch_keys or max(64, min(capacity, 1 << 17)), doorkeeper=doorkeeper, seed=seed
        )
        self.window_max = window_fraction * capacity
        self.protected_fraction = protected_fraction
        self._regions = (OrderedDict(), OrderedDict(), OrderedDict())
        self._sizes = [0, 0, 0]
        self._candidates: "OrderedDict[Hashable, None]" = OrderedDict()  # probation entries that came from the window
        self._climber = (
            _HillClimber(capacity, int(sample_factor * capacity), step_fraction, step_decay, restart_threshold)
            if adaptive
            else None
        )

    # --- notifications ---
    def on_insert(self, entry, key, size, parent=None) -> None:
        n = self.index.add(entry, key, size, parent)
        n.region = WINDOW
        n.count = self.sketch.estimate(key)  # cached estimate: ranks victims without re-hashing every leaf
        self._regions[WINDOW][entry] = None
        self._sizes[WINDOW] += size

    def on_access(self, entry) -> None:
        n = self.index.nodes.get(entry)
        if n is None:
            return
        n.tick = self.index.tick()
        n.count = self.sketch.estimate(n.key)
        if n.region == PROBATION:
            self._move(n, PROTECTED)
            self._candidates.pop(entry, None)
            self._demote_protected_overflow()
        else:
            self._regions[n.region].move_to_end(entry)

    def on_remove(self, entry) -> None:
        n = self.index.remove(entry)
        del self._regions[n.region][entry]
        self._sizes[n.region] -= n.size
        self._candidates.pop(entry, None)

    def on_resize(self, entry, new_size, new_parent, new_key=None) -> None:
        n = self.index.nodes[entry]
        old_size = n.size
        _, old_parent = self.index.resize(entry, new_size, new_parent)
        self._sizes[n.region] += new_size - old_size
        if new_key is not None:
            n.key = new_key
            n.count = self.sketch.estimate(new_key)
        if new_parent is not None and new_parent != old_parent:
            # the split's new node is the front part of `entry`: it belongs where `entry` was
            p = self.index.nodes[new_parent]
            if p.region != n.region:
                self._move(p, n.region)

    def record(self, key) -> None:
        self.sketch.increment(key)

    def observe(self, hit: int, total: int) -> None:
        if self._climber is None or total <= 0:
            return
        delta = self._climber.observe(hit, total)
        if delta:
            self.window_max = min(float(self.capacity), max(0.0, self.window_max + delta))

    # --- decisions ---
    def frequency(self, entry) -> int:
        return self.sketch.estimate(self.index.nodes[entry].key)

    def admit(self, candidate: Candidate, victims: Iterable[Hashable]) -> bool:
        """A candidate that fits in the window is always taken (recency gets its chance); a bigger one
        must beat every main-region entry it would displace."""
        if candidate.size <= self.window_max:
            return True
        nodes = self.index.nodes
        if self.main == "lfu":
            f = self.sketch.estimate(candidate.key)
            top = max((self.sketch.estimate(nodes[v].key) for v in victims), default=0)
            return f >= top or self.sketch.admit_with_jitter(f, top)
        f = self.sketch.estimate(candidate.key)
        for v in victims:
            n = nodes[v]
            if n.region != WINDOW and not self.sketch.admit_with_jitter(f, self.sketch.estimate(n.key)):
                return False
        return True

    def victims(self, size: int, protected: Callable[[Hashable], bool] = lambda e: False) -> List[Hashable]:
        if self.main == "lfu":
            return self._victims_lfu(size, protected)
        self._spill_window()
        nodes = self.index.nodes
        sketch = self.sketch
        out: List[Hashable] = []
        taken: set = set()
        freed = 0
        # 1. contest: window arrivals (candidates) against probation's cold end, loser goes
        while freed < size and self._candidates:
            cand = self._first_leaf(self._candidates, protected, taken, skip=None)
            vict = self._first_leaf(self._regions[PROBATION], protected, taken, skip=self._candidates)
            if cand is None or vict is None:
                break
            if sketch.admit_with_jitter(sketch.estimate(nodes[cand].key), sketch.estimate(nodes[vict].key)):
                loser = vict
                self._candidates.pop(cand)  # it won its place in main
            else:
                loser = cand
            out.append(loser)
            taken.add(loser)
            freed += nodes[loser].size
        if freed >= size:
            return out
        # 2. then plain cold-end order: probation, protected, window (each leaf-only, parents as they free up)
        return out + self._select_rest(size - freed, protected, taken)

    def _victims_lfu(self, size, protected):
        win = self._regions[WINDOW]
        wmax = self.window_max
        # window entries within the window budget (most recent first) are spared until last
        spared = set()
        acc = 0
        for e in reversed(win):
            n = self.index.nodes[e]
            if acc + n.size > wmax:
                break
            acc += n.size
            spared.add(e)

        def rank(n):
            return (n.entry in spared, n.count, n.tick)

        return select_leaves(self.index, size, protected, heap_order(self.index, rank), rank, yields_inner=False)

    # --- internals ---
    def _select_rest(self, size, protected, taken) -> List[Hashable]:
        nodes = self.index.nodes
        pos = {}

        def order():
            i = 0
            for region in (PROBATION, PROTECTED, WINDOW):
                for e in self._regions[region]:
                    pos[e] = i
                    yield (i, nodes[e])
                    i += 1

        def rank(n):
            # a parent freed up during selection competes at its own position (it was passed already)
            return pos.get(n.entry, -1)

        return select_leaves(self.index, size, protected, order(), rank, exclude=taken, yields_inner=True)

    def _first_leaf(self, region, protected, taken, skip):
        nodes = self.index.nodes
        for e in region:
            if e in taken or (skip is not None and e in skip):
                continue
            # a parent whose children were taken earlier in this query waits for the plain pass
            if nodes[e].children == 0 and not protected(e):
                return e
        return None

    def _spill_window(self) -> None:
        win = self._regions[WINDOW]
        nodes = self.index.nodes
        while self._sizes[WINDOW] > self.window_max and win:
            e = next(iter(win))
            self._move(nodes[e], PROBATION)
            self._candidates[e] = None

    def _demote_protected_overflow(self) -> None:
        limit = self.protected_fraction * (self.capacity - self.window_max)
        prot = self._regions[PROTECTED]
        nodes = self.index.nodes
        while self._sizes[PROTECTED] > limit and prot:
            e = next(iter(prot))
            self._move(nodes[e], PROBATION)

    def _move(self, n, region) -> None:
        del self._regions[n.region][n.entry]
        self._sizes[n.region] -= n.size
        n.region = region
        self._regions[region][n.entry] = None
        self._sizes[region] += n.size

    def __len__(self) -> int:
        return len(self.index.nodes)

    def region_sizes(self):
        return tuple(self._sizes)
