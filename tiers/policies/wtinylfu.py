"""W-TinyLFU for a radix tree: an adaptive LRU window in front of a segmented main region, admission from
the window into main by estimated frequency, leaf-only eviction.

Design note
-----------
TinyLFU (Einziger, Friedman, Manes, ACM TOS 2017) admits a new entry only if its estimated frequency beats
that of the entry it would displace; W-TinyLFU puts a small LRU *window* in front so that a burst of new
entries is not rejected before it had a chance to be reused, and Caffeine adapts the window size by hill
climbing on the hit rate (the "adaptive W-TinyLFU" of Einziger et al., Middleware 2018). Here:

- Regions in units (tokens, or blocks), not entries: WINDOW (LRU), then main = PROBATION + PROTECTED
  (segmented LRU; PROTECTED is capped at `protected_frac` of main and demotes its LRU end to PROBATION).
  A new entry enters the window; a use moves a PROBATION entry to PROTECTED.
- Admission into main: when room is needed and the window is over its target, the window's coldest leaf
  (the candidate) competes with main's coldest leaf (the victim: PROBATION's LRU end, else PROTECTED's):
  the less frequent one is evicted, a winning candidate moves into PROBATION. Under its target the window
  is left alone and victims come from main in LRU order.
- Frequency estimate of the contest (`freq`): the count-min sketch (`tiers.sketch`, 4-bit, aging) counts
  every requested key, so a shared prefix or a block several turns passed through ranks high; but in a
  prefix cache almost every new suffix has count 1, and so have most main victims. The default, "density",
  therefore ranks by the learned reuse probability of the entry's class (`_reuse.ReuseClasses`: depth,
  size, how soon its chain came back) per tick of age, p / (age + horizon), and uses the sketch count only
  to break ties. "sketch" is Caffeine's rule (counts; a warm loser is still admitted about once in 128
  tries, the sketch's jitter against hash flooding), "mix" is counts with the class probability as the
  tie-breaker, "class" the probability alone. Measured on the Mooncake traces (see the issue #3 report):
  counts-first lost to LRU at conversation 3e6 and synthetic 3e6; density came closest to staying at or above LRU
  everywhere. With "density" the victim taken from main is the less dense of the two segments' LRU leaves.
- Bypass: `admit(candidate, victims)` declines a new suffix whose class's reuse density at age 0 is below
  that of every main victim it would displace (density = probability / (age + horizon)); a declined key
  becomes a ghost, so its class still learns. Victims taken from the window alone are always accepted
  (that is LRU's choice).
- Window size: hill climbing on the token hit rate per sample period (`_climber.HillClimber`). At 100% the
  main region is empty, every victim is the window's LRU leaf and admission always says yes: the policy is
  LRU exactly, so the climber can always fall back to it.
- Leaf-only: a victim is a leaf of the cached tree, a parent becomes a candidate when its last child is
  chosen (as in `_tree.select_leaves`), locked entries and their ancestors are never returned.

`victims()` frees nothing; it may move window winners (and inner window nodes over the target) into
PROBATION, which is consistent whichever way the tier goes. Time is a logical tick (one per insert/access),
never the wall clock.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import Callable, Hashable, Iterable, List, Optional

from tiers.clock import Clock
from tiers.policies._climber import HillClimber
from tiers.policies._reuse import ReuseClasses
from tiers.policies._tree import TreeIndex
from tiers.policy import Candidate, Policy, register_policy
from tiers.sketch import FrequencySketch

WINDOW, PROBATION, PROTECTED = 0, 1, 2
_FREQS = ("density", "mix", "sketch", "class")


class _Cursor:
    """The coldest available leaf of one region during one victim selection: walks the region's LRU list
    and keeps a heap (by tick) of its entries that became leaves after being passed over."""

    __slots__ = ("it", "pending", "heap", "skipped", "inner", "inner_units")

    def __init__(self, lst):
        self.it = iter(lst)
        self.pending = None
        self.heap: list = []
        self.skipped: set = set()
        self.inner: list = []  # inner nodes passed over, in LRU order
        self.inner_units = 0


@register_policy("wtinylfu")
class WTinyLFUPolicy(Policy):
    def __init__(
        self,
        capacity: int,
        clock: Optional[Clock] = None,
        *,
        window: float = 0.2,
        adapt: bool = True,
        period_factor: float = 2.0,
        step: float = 0.0625,
        protected_frac: float = 0.8,
        freq: str = "density",
        bypass: bool = True,
        horizon: float = 0.0,
        admit_margin: float = 1.0,
        sketch_keys: int = 0,
        doorkeeper: bool = False,
        seed: Optional[int] = None,
        **reuse_config,
    ):
        super().__init__(capacity, clock)
        if not 0.0 <= window <= 1.0:
            raise ValueError(f"window must be within [0, 1], got {window}")
        if not 0.0 <= protected_frac <= 1.0:
            raise ValueError(f"protected_frac must be within [0, 1], got {protected_frac}")
        if freq not in _FREQS:
            raise ValueError(f"freq must be one of {', '.join(_FREQS)}, got {freq!r}")
        if horizon < 0:
            raise ValueError(f"horizon must be >= 0, got {horizon}")
        self.index = TreeIndex()
        self.reuse = ReuseClasses(capacity, **reuse_config)
        self.sketch = FrequencySketch(sketch_keys or min(max(capacity, 64), 1 << 20), doorkeeper=doorkeeper, seed=seed)
        self.climber = HillClimber(window, period=period_factor * capacity, step=step) if adapt else None
        self.freq = freq
        self.bypass = bypass
        self.horizon = horizon
        self.admit_margin = admit_margin
        self.protected_frac = protected_frac
        self._lists = (OrderedDict(), OrderedDict(), OrderedDict())
        self.units = [0, 0, 0]
        self._carried: dict = {}  # split front -> last use of the entry it was split from
        self._set_window(window)

    # --- regions ---
    @property
    def window_frac(self) -> float:
        return self._window_frac

    def _set_window(self, frac: float) -> None:
        self._window_frac = frac
        self.window_target = frac * self.capacity
        self.protected_max = self.protected_frac * (self.capacity - self.window_target)

    def _move(self, n, region: int) -> None:
        del self._lists[n.region][n.entry]
        self.units[n.region] -= n.size
        n.region = region
        self._lists[region][n.entry] = None
        self.units[region] += n.size

    def _demote_protected(self) -> None:
        prot = self._lists[PROTECTED]
        nodes = self.index.nodes
        while self.units[PROTECTED] > self.protected_max and prot:
            self._move(nodes[next(iter(prot))], PROBATION)

    # --- notifications ---
    def on_insert(self, entry, key, size, parent=None) -> None:
        n = self.index.add(entry, key, size, parent)
        reuse = self.reuse
        if reuse.take_returned(key):  # a ghost that came back: used again, not a first-seen suffix
            cls = reuse.reused_class(n.depth)
        else:
            p = self.index.nodes.get(parent) if parent is not None else None
            cls = reuse.new_class(n.depth, size, reuse.gap_of(p.count) if p is not None else -1)
        n.count = cls  # the entry's reuse class (its open event)
        reuse.open(cls)
        n.region = WINDOW
        self._lists[WINDOW][entry] = None
        self.units[WINDOW] += size

    def on_access(self, entry) -> None:
        n = self.index.nodes.get(entry)
        if n is None:
            return  # the tier may touch entries it never reported (e.g. the root)
        now = self.index.tick()
        age = now - (self._carried.pop(entry, n.tick) if self._carried else n.tick)
        n.tick = now
        reuse = self.reuse
        reuse.reused(n.count, age)
        n.count = reuse.reused_class(n.depth, reuse.gap_bucket(age))
        reuse.open(n.count)
        r = n.region
        if r == PROBATION:
            self._move(n, PROTECTED)
            self._demote_protected()
        else:
            self._lists[r].move_to_end(entry)

    def on_remove(self, entry) -> None:
        n = self.index.remove(entry)
        if self._carried:
            self._carried.pop(entry, None)
        del self._lists[n.region][entry]
        self.units[n.region] -= n.size
        self.reuse.evicted(self.index.now - n.tick)
        self.reuse.ghost(n.key, n.count, n.size, n.tick)

    def on_resize(self, entry, new_size, new_parent, new_key=None) -> None:
        n = self.index.nodes[entry]
        self.units[n.region] += new_size - n.size
        n, old_parent = self.index.resize(entry, new_size, new_parent)
        if new_key is not None:
            n.key = new_key
        if new_parent is None or new_parent == old_parent:
            return
        # a split: the new front node carries on the entry's event and region (it is what the request
        # reuses); the back part, which the request did not reach, starts a TAIL event
        front = self.index.nodes[new_parent]
        reuse = self.reuse
        reuse.events[front.count] -= 1
        front.count, front.depth = n.count, n.depth
        # the front keeps its fresh tick (its recency rank, as in LRU); the age of the event it carries on
        # is measured from the entry's last use, so remember that until the front's next use
        self._carried[new_parent] = self._carried.pop(entry, n.tick)
        if front.region != n.region:
            self._move(front, n.region)
        n.count = reuse.tail
        n.depth += 1
        reuse.open(reuse.tail)

    def record(self, key) -> None:
        self.sketch.increment(key)
        self.reuse.recall(key, self.index.now)

    def observe(self, hit: int, total: int) -> None:
        c = self.climber
        if c is not None and c.observe(hit, total):
            self._set_window(c.frac)
            self._demote_protected()

    # --- decisions ---
    def _beats(self, cand, victim) -> bool:
        """Whether the window candidate is more frequent than main's victim (ties: the victim stays)."""
        prob = self.reuse.probability
        if self.freq == "density":
            now = self.index.now
            h = self.horizon or max(1.0, float(len(self.index.nodes)))
            dc, dv = self._density(cand, now, h), self._density(victim, now, h)
            if dc != dv:
                return dc > dv
            return self.sketch.estimate(cand.key) > self.sketch.estimate(victim.key)
        if self.freq == "class":
            return prob(cand.count) > prob(victim.count)
        est = self.sketch.estimate
        fc, fv = est(cand.key), est(victim.key)
        if fc != fv:
            return fc > fv or self.sketch.admit_with_jitter(fc, fv)
        return self.freq == "mix" and prob(cand.count) > prob(victim.count)

    def _density(self, n, now: int, h: float) -> float:
        return self.reuse.probability(n.count) / (now - n.tick + h)

    def admit(self, candidate: Candidate, victims: Iterable[Hashable]) -> bool:
        if not self.bypass or self._window_frac >= 1.0:
            return True
        nodes = self.index.nodes
        main = [nodes[v] for v in victims if nodes[v].region != WINDOW]
        if not main:
            return True  # room comes from the window alone: LRU's choice
        reuse = self.reuse
        now = self.index.now
        h = self.horizon or max(1.0, float(len(nodes)))
        parent = nodes.get(candidate.parent) if candidate.parent is not None else None
        if parent is not None:
            cls = reuse.new_class(parent.depth + 1, candidate.size, reuse.gap_bucket(now - parent.tick))
        else:
            cls = reuse.new_class(1, candidate.size)
        top = max(self._density(n, now, h) for n in main)
        if reuse.probability(cls) / h * self.admit_margin >= top:
            return True
        reuse.open(cls)
        reuse.ghost(candidate.key, cls, candidate.size, now)
        return False

    def victims(self, size: int, protected: Callable[[Hashable], bool] = lambda e: False) -> List[Hashable]:
        out: List[Hashable] = []
        if size <= 0:
            return out
        self._fill_main()
        nodes = self.index.nodes
        lists = self._lists
        taken: set = set()
        gone: dict = {}  # entry -> children chosen in this selection
        cursors = (_Cursor(lists[WINDOW]), _Cursor(lists[PROBATION]), _Cursor(lists[PROTECTED]))
        seq = itertools.count()

        def peek(cur):
            if cur.pending is None:
                for e in cur.it:
                    if e in taken or protected(e):
                        continue
                    n = nodes[e]
                    if n.children - gone.get(e, 0):
                        cur.skipped.add(e)
                        cur.inner.append(n)
                        cur.inner_units += n.size
                        continue
                    cur.pending = n
                    break
            heap = cur.heap
            if heap and (cur.pending is None or heap[0][0] < cur.pending.tick):
                return heap[0][2]
            return cur.pending

        def pop(cur, n):  # n is what peek(cur) just returned
            if cur.pending is n:
                cur.pending = None
            else:
                heapq.heappop(cur.heap)

        def mark(n):
            e = n.entry
            taken.add(e)
            out.append(e)
            p = n.parent
            if p is not None:
                k = gone.get(p, 0) + 1
                gone[p] = k
                pn = nodes[p]
                if pn.children == k and not protected(p):
                    pc = cursors[pn.region]
                    if p in pc.skipped:
                        heapq.heappush(pc.heap, (pn.tick, next(seq), pn))
            return n.size

        win, prob, prot = cursors
        promote = []
        dens = self.freq == "density"
        # the room is for `size` new units, and new entries enter the window: count them as already there,
        # so the window's overflow competes now (the tier asks before it inserts)
        excess = self.units[WINDOW] + size - self.window_target
        freed = spare = 0
        while freed < size:
            c = peek(win) if excess - win.inner_units > 0 else None
            vc = prob
            v = peek(prob)
            if v is None:
                vc = prot
                v = peek(prot)
            elif dens:  # main's victim: the less dense of the two segments' LRU leaves
                w = peek(prot)
                if w is not None and self._beats(v, w):
                    vc, v = prot, w
            if c is not None and v is not None:
                pop(win, c)  # the candidate leaves the window either way
                excess -= c.size
                if self._beats(c, v):
                    pop(vc, v)
                    freed += mark(v)
                    promote.append(c)
                else:
                    freed += mark(c)
            elif v is not None:
                pop(vc, v)
                freed += mark(v)
            else:
                c = peek(win)  # main has nothing to give: the window's own LRU leaf
                if c is None:
                    if spare < len(promote):  # last resort: this query's own winners (now main's newest)
                        freed += mark(promote[spare])
                        spare += 1
                        continue
                    break
                pop(win, c)
                excess -= c.size
                freed += mark(c)
        self._promote(promote, win.inner, excess, taken)
        return out

    def _fill_main(self) -> None:
        """Window overflow moves into main without a contest while main is below its share (a cold start,
        or the window just shrank): there is nothing there yet to compete against."""
        room = self.capacity - self.window_target - self.units[PROBATION] - self.units[PROTECTED]
        over = self.units[WINDOW] - self.window_target
        if room <= 0 or over <= 0:
            return
        nodes = self.index.nodes
        moving = []
        for e in self._lists[WINDOW]:
            if room <= 0 or over <= 0:
                break
            n = nodes[e]
            moving.append(n)
            room -= n.size
            over -= n.size
        for n in moving:
            self._move(n, PROBATION)

    def _promote(self, winners, inner, excess, taken) -> None:
        """Window winners move into PROBATION; so do inner window nodes passed over while the window was
        over its target (they cannot compete, not being leaves, but count against the target)."""
        for n in winners:
            self._move(n, PROBATION)
        for n in inner:
            if excess <= 0:
                break
            if n.region == WINDOW and n.entry not in taken:
                self._move(n, PROBATION)
                excess -= n.size

    def __len__(self) -> int:
        return len(self.index.nodes)
