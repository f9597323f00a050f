"""TinyLFU for a radix tree: admission and eviction by the learned reuse frequency of an entry's class.

Design note
-----------
TinyLFU (Einziger, Friedman, Manes, ACM TOS 2017) admits a new entry only if its estimated frequency beats
that of the victims it would displace. In a prefix cache almost every new suffix is seen for the first
time, so a per-key count is 1 for all of them and cannot tell the suffix that will return (a conversation
that goes on) from the one-shot one. This policy therefore estimates the reuse frequency of a *class* of
entries and keeps TinyLFU's admission contest around it:

- Class: what the tree knows when an entry arrives. A new leaf is classed by its depth (nodes above it: a
  deeper leaf continues a longer conversation), its size bucket and its parent's *gap bucket* (how soon the
  chain it extends came back last time, against the cache lifetime: a conversation that returned quickly
  tends to again); the back part of a split (what a request did not reuse of a leaf) is TAIL; an entry used
  again becomes REUSED at its depth and the gap bucket of that reuse.
- Frequency = reuse probability of the class, learned online: every entry has one open *event* (its class
  since insertion or its last use); the event counts as reused when the entry is used again, also after it
  was evicted or declined: such keys wait in a bounded FIFO of ghosts (sized in units, a multiple of the
  capacity), and a request that records a ghost key counts a reuse for the ghost's class. A reuse counts
  only within `window_factor` x the cache lifetime (running mean age at eviction): a return long after any
  entry would still be cached says nothing about what is worth keeping. Counts are halved after every
  `decay_capacities` capacities of event traffic (each event adds its entry's size: aging, as in
  TinyLFU's sketch reset).
- Eviction: density = reuse probability / (age + horizon), age in policy ticks (one per recorded key, i.e.
  per requested node) since the last use, lowest first, ties by class. Within one class the least recently
  used entry has the lowest density, so each class keeps its leaves in use order and a victim query keeps a
  small heap of the lists' cold ends, walking only the lists it takes from: no heap over all leaves, and no
  walk past inner entries (a parent joins its class's list when its last child leaves) or, in the first
  victim pass of `tiers.retention.RetainingPolicy`, past retained ones (parked in lists of their own: `park`).
  Parents become candidates once their last child is chosen (`_tree.select_leaves`). At the root level (below)
  a leaf's reuse probability is its class's x (1 + its key's count in the sketch): the classes pool popular and
  rare prompts alike, and where the same prompts come back at Zipf popularity SGLang's LFU, which keeps them by
  their counts, led the class order alone by up to 0.06 of the token hit rate (tenants-z08-s3 at 2.5e5,
  benchmarks/RESULTS.md). The count is read when the leaf is placed and each count has lists of its own, so a list
  stays in age order; a sketch reset places the counted leaves again. The counts weigh while the key contest
  below (which scores whether the prompt a count defends comes back first) has been right at least as often as
  wrong. That is a looser bar than the one for declining (twice as often): on the flat-prompt rows and the
  Mooncake synthetic trace the contest is right 1.5-2x as often as wrong and flips around its own bar, and
  weights that flipped with it lost up to 0.014 there (benchmarks/RESULTS.md, "Root-level counts weigh while they
  are right at least as often as wrong"). Where sessions start with prompts of their own, a finished session's
  count is stale and wrong far more often than right: there it orders nothing.
- Admission (with bypass), in two steps. First the reuse gate (`_gate.py`): a new suffix whose class comes
  back within `gate_horizon` capacities of miss traffic less often than `gate_threshold` is declined. Its
  horizon is what a cache can hold, not the cache's current lifetime, which on multi-turn traces is far
  shorter than the time a conversation takes to return. Then the contest: the suffix comes in only if its
  class's density at age 0 beats every victim's. Last, at the root level (a request's first entry: the prompt
  it starts with, which unrelated requests may share), TinyLFU's own contest per key (`_frequency.KeyContest`: a
  count-min sketch of the keys requests passed, aged by halving): a new root-level entry is declined if a
  root-level victim's key was asked for more often than its own. Where the same prompts come back at Zipf
  popularity (API callers, tenants) this keeps the popular ones against a stream of rarer ones, which the class
  estimates cannot: a class pools popular and rare prompts alike. Where sessions start with prompts of their own
  (the Mooncake synthetic trace), a finished session's count outranks a new session's first turn, and the new
  one comes back first: the contest scores each verdict by which of the two is asked for first, and is enforced
  only while it has been right at least twice as often as wrong. Deeper, a key belongs to one conversation or one
  document after a prompt, and stale counts held off conversations' next turns (pinned, TTLs stripped: agent-s2
  at 4e6 -0.047 and chat-s2 at 2e6 -0.045 with the contest at every depth, benchmarks/RESULTS.md), so there is
  none there. A suffix declined by a contest adds nothing to the tier and becomes a ghost, so its class still
  learns.

- Orders (`steer`, driven by the tier's self-tuner, tiers/shadow.py): "learned" is all of the above;
  "recency" ranks by placement alone (age, then the order entries were placed in: SGLang stamps a split's back
  part after the request before it) and admits everything (SGLang's LRU, to the token). The classes, ghosts and
  the gate learn in either order, so a switch back to "learned" finds them trained.

`victims()` changes no state. A flat tier (parent=None) gets depth 1 for every entry: classes by size and
reuse.

Units. Nothing here depends on how many tier units (radix tokens) an entry holds, so the same tree gives
the same decisions whether one unit stands for a token or for a 512-token block: sizes are fractions of the
capacity (size buckets, ghosts), traffic is counted in capacities (aging, the gate's horizon), and ages
are in ticks (one per recorded key, i.e. per tree node a request passes), which count nodes, not units.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict
from heapq import heapify, heappop, heapreplace, merge
from itertools import compress, count
from operator import attrgetter, itemgetter
from typing import Callable, Hashable, Iterable, List, Optional

from tiers.clock import Clock
from tiers.policies._frequency import MAX_COUNT, KeyContest
from tiers.policies._gate import ReuseGate
from tiers.policies._tree import PlacedLeaves, TreeIndex, select_leaves
from tiers.policy import Candidate, Policy, register_policy

# size buckets: upper edges in 1/10,000ths of the capacity (integers, so a bucket is exact at any scale);
# at 1e6 tokens of 512-token blocks (1953 blocks) the buckets are 1, 2-4, 5-16 and more than 16 blocks
_SIZE_EDGES = (8, 23, 85)
_SIZE_EDGE_SCALE = 10_000
ORDERS = ("learned", "recency")  # what `steer` can switch between
_first, _second = itemgetter(0), itemgetter(1)
_placed = attrgetter("placed")


def _check_parameters(*, max_depth, ghost_factor, horizon, gap_buckets, prior_hits, prior_events, window_factor,
                      decay_capacities, prior_weight) -> None:
    """ValueError naming the first of TinyLFUPolicy's parameters that is out of range."""
    for name, value, low in (("max_depth", max_depth, 1), ("ghost_factor", ghost_factor, 0),
                             ("horizon", horizon, 0), ("gap_buckets", gap_buckets, 1)):
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
    if not 0 <= prior_hits <= prior_events:
        raise ValueError(f"priors need 0 <= prior_hits <= prior_events, got {prior_hits}, {prior_events}")
    for name, value in (("window_factor", window_factor), ("decay_capacities", decay_capacities),
                        ("prior_weight", prior_weight), ("prior_events", prior_events)):
        if value <= 0:
            raise ValueError(f"{name} must be > 0, got {value}")


@register_policy("tinylfu")
class TinyLFUPolicy(PlacedLeaves, Policy):
    def __init__(
        self,
        capacity: int,
        clock: Optional[Clock] = None,
        *,
        max_depth: int = 4,
        horizon: float = 0.0,
        ghost_factor: float = 4.0,
        decay_capacities: float = 60.0,
        admit_margin: float = 1.0,
        prior_hits: float = 1.0,
        prior_events: float = 2.0,
        window_factor: float = 2.0,
        gap_buckets: int = 4,
        gate_threshold: float = 0.3,
        gate_horizon: float = 5.0,
        class_capacity: int = 0,
        prior_weight: float = 1.0,
        frequency_margin: float = 1.0,
        frequency_period: float = 10.0,
    ):
        super().__init__(capacity, clock)
        _check_parameters(max_depth=max_depth, ghost_factor=ghost_factor, horizon=horizon, gap_buckets=gap_buckets,
                          prior_hits=prior_hits, prior_events=prior_events, window_factor=window_factor,
                          decay_capacities=decay_capacities, prior_weight=prior_weight)
        self.index = TreeIndex()
        self.window_factor = window_factor
        # sizes are classed against `class_capacity` (0: this tier's); a shadow cache (tiers/shadow.py) passes
        # the live tier's, so that its classes are the live tier's classes
        n_classes = self._lay_out_classes(max_depth, gap_buckets, class_capacity or capacity)
        self.lifetime = 0.0  # running mean age at eviction, in ticks (0: nothing evicted yet)
        # the leaves of each list (a class, or a root-level class at one sketch count: _lay_out_slots) as (placement,
        # entry) in placement order: unretained ones, and retained ones (see park()). A placement is (tick,
        # sequence), so a list is in age order, which within one list is density order: an insert, a use or a
        # split's back part goes at the end, a split's front part (which keeps the entry's age) where the entry
        # was, and a parent that loses its last child where it was
        n_slots = self._lay_out_slots(n_classes)
        self._leaves: List[list] = [[] for _ in range(n_slots)]
        self._parked: List[list] = [[] for _ in range(n_slots)]
        self._n_parked = 0  # parked leaves: a victim query that may take them skips their lists when 0
        self._placements = count()
        self.hits = [0.0] * n_classes
        self.events = [0.0] * n_classes
        # a shadow cache that sees a sample of rate r of the traffic learns from r of the events: priors
        # weighted by r give it the live tier's estimates in expectation
        self.prior_hits = prior_hits * prior_weight
        self.prior_events = prior_events * prior_weight
        self.horizon = horizon
        self.ghost_factor = ghost_factor
        self.decay_units = decay_capacities * capacity
        self.admit_margin = admit_margin
        self._ghosts: "OrderedDict[Hashable, tuple]" = OrderedDict()  # key -> (class, size)
        self._ghost_size = 0
        self._returned: "OrderedDict[Hashable, None]" = OrderedDict()
        self._since_decay, self._decays = 0.0, 0  # event units since the last halving; halvings so far
        self._last_open = None  # (entry, halvings before it): the latest on_insert's event
        self.now = 0  # the policy's clock: one tick per recorded key
        # in front of the density contest: a new suffix whose class rarely comes back within a few
        # capacities of traffic is declined outright (threshold 0: the gate always passes, v3 as it was)
        self.gate = ReuseGate(capacity, threshold=gate_threshold, horizon=gate_horizon, class_capacity=class_capacity,
                              prior_hits=1.0 * prior_weight, prior_events=3.0 * prior_weight)
        # steered by the tier's shadow tuner (tiers/shadow.py): "recency" ranks by placement alone and admits all
        # (SGLang's LRU); the classes, ghosts and the gate keep learning in either order
        self.order, self.learned = "learned", True
        # TinyLFU's contest per key, at the root level (margin 0: none; 1: TinyLFU's rule)
        self.contest = KeyContest(frequency_period, frequency_margin)

    def _lay_out_classes(self, max_depth: int, gap_buckets: int, class_capacity: int) -> int:
        """Number the classes: (depth, size bucket, gap bucket) for new suffixes, then the tail, then (depth, gap
        bucket) for reused entries. Returns how many there are."""
        self.max_depth = max_depth
        self.n_gaps = gap_buckets + 1  # the last one: no reuse seen yet
        self._size_edges = tuple(e * class_capacity for e in _SIZE_EDGES)  # in units x _SIZE_EDGE_SCALE
        self._nb = len(_SIZE_EDGES) + 1
        self._tail = max_depth * self._nb * self.n_gaps
        self._reused0 = self._tail + 1
        return self._reused0 + max_depth * self.n_gaps

    def _lay_out_slots(self, n_classes: int) -> int:
        """Number the leaf lists: one per class (weight 1), then one per root-level class and sketch count 1 to
        MAX_COUNT (weight 1 + the count). A leaf's list is fixed when it is placed, so each list stays in age order,
        which is density order at its one weight. Returns how many lists there are."""
        roots = [*range(self._nb * self.n_gaps), *range(self._reused0, self._reused0 + self.n_gaps)]
        self._slot_class = list(range(n_classes))
        self._slot_weight = [1] * n_classes
        self._root_slot = [None]  # per count from 1: root-level class -> its list
        for f in range(1, MAX_COUNT + 1):
            self._root_slot.append({c: len(self._slot_class) + i for i, c in enumerate(roots)})
            self._slot_class += roots
            self._slot_weight += [1 + f] * len(roots)
        self._first_root_slot = n_classes
        self._unit_weights = [1] * len(self._slot_weight)
        return len(self._slot_class)

    def _slot(self, n) -> int:
        """The list leaf `n` goes in: its class's, or at the root level its class's at its key's sketch count."""
        if n.depth != 1:
            return n.region
        f = self.contest.sketch.estimate(n.key)
        return self._root_slot[f][n.region] if f else n.region

    def steer(self, order: str, gate_threshold: float) -> None:
        """Switch the order ("learned", with the gate at `gate_threshold`, or "recency"). Takes effect at the
        next decision; no entry moves."""
        if order not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        self.order = order
        self.learned = order == "learned"
        self.gate.threshold = gate_threshold

    # --- classes and their learned reuse probability ---
    # The hot paths (notifications, record, admit, victims) inline these helpers with locals: they run
    # several times per request, and Python call and attribute overhead is most of their cost. The helpers
    # stay the single definition of each rule; an inlined copy computes exactly the same values.
    def _new_class(self, depth: int, size: int, gap: int = -1) -> int:
        s = 0
        scaled = size * _SIZE_EDGE_SCALE
        for edge in self._size_edges:
            if scaled <= edge:
                break
            s += 1
        g = self.n_gaps - 1 if gap < 0 else gap
        return ((min(depth, self.max_depth) - 1) * self._nb + s) * self.n_gaps + g

    def _reused_class(self, depth: int, gap: int = -1) -> int:
        g = self.n_gaps - 1 if gap < 0 else gap
        return self._reused0 + (min(depth, self.max_depth) - 1) * self.n_gaps + g

    def _gap_bucket(self, age: float) -> int:
        # how soon this chain came back, against the cache's lifetime: halves of it, then doublings
        life = self.lifetime
        if not life:
            return 0
        b, edge = 0, life / 2
        last = self.n_gaps - 2
        while age > edge and b < last:
            b += 1
            edge *= 2
        return b

    def _in_window(self, age: float) -> bool:
        # a reuse counts as a hit only if keeping the entry that long is plausible
        return not self.lifetime or age <= self.window_factor * self.lifetime

    def probability(self, cls: int) -> float:
        return (self.hits[cls] + self.prior_hits) / (self.events[cls] + self.prior_events)

    def _open(self, cls: int, size: int) -> None:
        self.events[cls] += 1
        self._since_decay += size
        if self._since_decay >= self.decay_units:
            self._decay()

    def _decay(self) -> None:
        self._decays += 1
        self._since_decay = 0.0
        self.hits = [h * 0.5 for h in self.hits]
        self.events = [e * 0.5 for e in self.events]

    def _ghost(self, key, cls: int, size: int, tick: int) -> None:
        g = self._ghosts
        old = g.pop(key, None)
        gs = self._ghost_size
        if old is not None:
            gs -= old[1]
        g[key] = (cls, size, tick)
        gs += size
        limit = self.ghost_factor * self.capacity
        if gs > limit:
            popitem = g.popitem
            while gs > limit and g:
                gs -= popitem(last=False)[1][1]
        self._ghost_size = gs

    def _horizon(self) -> float:
        return self.horizon or max(1.0, float(len(self.index.nodes)))

    # --- notifications ---
    def on_insert(self, entry, key, size, parent=None) -> None:
        index = self.index
        n = self._add_leaf(entry, key, size, parent)
        self.gate.opened(key, n.depth, size)
        returned = self._returned
        if key in returned:  # a ghost that came back: it was used again, not a first-seen suffix
            del returned[key]
            cls = self._reused_class(n.depth)
        elif parent is not None:
            cls = self._new_class(n.depth, size, index.nodes[parent].count - 1)
        else:
            cls = self._new_class(n.depth, size)
        n.count = 0
        n.region = cls
        self._last_open = (entry, self._decays)  # a split's front part takes this event back (on_resize)
        self.events[cls] += 1  # _open, inlined
        self._since_decay += size
        if self._since_decay >= self.decay_units:
            self._decay()
        n.placed = (n.tick, next(self._placements))
        self._place(n)

    def on_access(self, entry) -> None:
        n = self.index.nodes.get(entry)
        if n is None:
            return
        leaf = not n.children
        if leaf:
            self._leave(n)
        now = self.now
        age = now - n.tick
        n.tick = now
        old = n.region
        life = self.lifetime
        if not life:  # _in_window and _gap_bucket, inlined
            self.hits[old] += 1
            gb = 0
        else:
            if age <= self.window_factor * life:
                self.hits[old] += 1
            gb, edge = 0, life / 2
            last = self.n_gaps - 2
            while age > edge and gb < last:
                gb += 1
                edge *= 2
        n.count = gb + 1
        depth = n.depth
        max_depth = self.max_depth
        cls = self._reused0 + ((depth if depth < max_depth else max_depth) - 1) * self.n_gaps + gb
        self.events[cls] += 1  # _open, inlined
        self._since_decay += n.size
        if self._since_decay >= self.decay_units:
            self._decay()
        n.region = cls
        n.placed = (now, next(self._placements))
        if leaf:
            self._place(n)

    def on_remove(self, entry) -> None:
        n = self._remove_leaf(entry)
        tick = n.tick
        age = self.now - tick
        life = self.lifetime
        self.lifetime = age if not life else life + 0.01 * (age - life)
        self._ghost(n.key, n.region, n.size, tick)

    def on_resize(self, entry, new_size, new_parent, new_key=None) -> None:
        front = self._move(entry, new_size, new_parent, new_key)
        if front is None:
            return
        n = self.index.nodes[entry]
        # a split: the new front node carries on the entry's event and age (it is what the request reuses: its
        # use, which follows, measures the gap); the back part, which the request did not reach, starts a TAIL
        # event now, as an insert would (SGLang's match stamps the node before it splits it)
        self.gate.withdraw(front.key)
        self._withdraw_open(front)
        front.region, front.tick, front.depth, front.count = n.region, n.tick, n.depth, n.count
        front.placed = (n.tick, next(self._placements))
        leaf = not n.children
        if leaf:
            self._leave(n)
        n.region = self._tail
        n.depth += 1
        n.tick = self.now
        n.placed = (n.tick, next(self._placements))
        self._open(self._tail, n.size)
        if leaf:
            self._place(n)

    def _withdraw_open(self, front) -> None:
        """Take back the event a split's front part opened when it was reported as an insert (it is not new: it
        carries on the entry's event). If that insert ended an aging period, what is left of the event is what the
        halving left of it, half (taking 1 took half an event of another entry, and once drove a count below 0: a
        density with a denominator of 0, a raise in the scheduler). Its units stay in the aging period, as tuned."""
        last, self._last_open = self._last_open, None
        if last is None or last[0] is not front.entry:  # not reported just before: nothing of it to take back
            return
        cls = front.region
        self.events[cls] = max(0.0, self.events[cls] - 0.5 ** (self._decays - last[1]))  # exact; never below 0

    def record(self, key) -> None:
        self.gate.record(key)
        self.now += 1
        if self.contest.record(key, len(self.index.nodes)):
            self._replace_roots()
        g = self._ghosts.pop(key, None)
        if g is not None:
            if self._in_window(self.now - g[2]):
                self.hits[g[0]] += 1
            self._ghost_size -= g[1]
            r = self._returned
            r[key] = None
            if len(r) > 64:
                r.popitem(last=False)

    def observe(self, hit: int, total: int) -> None:
        self.gate.observe(hit, total)

    # --- decisions ---
    def may_admit(self, candidate: Candidate) -> bool:
        return not self.learned or self.gate.admits(candidate, self.index.nodes)

    def admit(self, candidate: Candidate, victims: Iterable[Hashable]) -> bool:
        if not self.learned:
            return True
        if not self.may_admit(candidate):  # a pass changes nothing, so asking again after the tier did is safe
            return False
        nodes = self.index.nodes
        parent = nodes.get(candidate.parent) if candidate.parent is not None else None
        now = self.now
        if parent is not None:
            cls = self._new_class(parent.depth + 1, candidate.size, self._gap_bucket(now - parent.tick))
        else:
            cls = self._new_class(1, candidate.size)
        h = self._horizon()
        hits, events = self.hits, self.events
        ph, pe = self.prior_hits, self.prior_events
        top = 0.0  # max(..., default=0.0), inlined: the first density replaces the default, as max does
        first = True
        roots = []  # the root-level victims' keys
        for v in victims:
            n = nodes[v]
            c = n.region
            d = (hits[c] + ph) / (events[c] + pe) / (now - n.tick + h)
            if first or d > top:
                top = d
                first = False
            if n.depth == 1:
                roots.append(n.key)
        if (hits[cls] + ph) / (events[cls] + pe) / h * self.admit_margin >= top:
            if parent is not None or not self.contest.declines(candidate.key, roots):
                return True
        self._open(cls, candidate.size)
        self._ghost(candidate.key, cls, candidate.size, now)
        return False

    # --- leaf lists (parking for tiers.retention.RetainingPolicy: _tree.PlacedLeaves) ---
    # A leaf is in one list of its class, in placement order: its leaves, or its parked leaves while retained;
    # an inner entry is in none (it cannot go before its children). Victim queries merge the lists' cold ends
    # by density (ties by class): the order of one LRU list per class, leaves only, walking past no other.
    def _replace_roots(self) -> None:
        """Place every counted root-level leaf again, at its key's count now that the sketch halved them all (a leaf
        keeps its list until it is placed again; resets come every `frequency_period` x the entries of uses, so
        this is a fraction of a placement per use)."""
        nodes, first = self.index.nodes, self._first_root_slot
        for lists in (self._leaves, self._parked):
            moving = [nodes[e] for src in lists[first:] for _, e in src]
            for s in range(first, len(lists)):
                lists[s] = []
            for n in moving:
                if n.parked:
                    self._n_parked -= 1
                self._place(n)

    def _place(self, n) -> None:
        """Add leaf `n` to its list, at its placement."""
        s = n.slot = self._slot(n)
        if n.parked:
            insort(self._parked[s], (n.placed, n.entry), key=_first)
            self._n_parked += 1
        else:
            insort(self._leaves[s], (n.placed, n.entry), key=_first)

    def _leave(self, n) -> None:
        """Take leaf `n` out of its list (before its placement, class or parking changes). Never raises: it
        runs inside Retention's calls too, and an entry missing from its list can only be offered less."""
        leaves = (self._parked if n.parked else self._leaves)[n.slot]
        i = bisect_left(leaves, n.placed, key=_first)
        if i < len(leaves) and leaves[i][1] == n.entry:
            del leaves[i]
            if n.parked:
                self._n_parked -= 1

    def victims(self, size: int, protected: Callable[[Hashable], bool] = lambda e: False,
                parked: bool = True) -> List[Hashable]:
        """`parked=False`: parked entries are neither offered nor walked past."""
        lists = self._leaves
        if parked and self._n_parked:  # a list's leaves and parked leaves walked as one, in placement order
            lists = self._leaves.copy()
            for s in compress(range(len(lists)), self._parked):
                lists[s] = (lists[s], self._parked[s]) if lists[s] else self._parked[s]
        if not parked:  # nor taken when the selection frees their last child
            nodes, unparked = self.index.nodes, protected
            protected = lambda e: unparked(e) or nodes[e].parked  # noqa: E731
        if not self.learned:
            return select_leaves(self.index, size, protected, self._age_order(lists), _placed, yields_inner=False)
        now = self.now
        h = self._horizon()
        hits, events, ph, pe = self.hits, self.events, self.prior_hits, self.prior_events
        weights = self._weights()

        def rank(n):  # (density, class, list): ties go by class, in the order and in the selection's heap alike
            c, s = n.region, self._slot(n)
            return (hits[c] + ph) / (events[c] + pe) * weights[s] / (now - n.tick + h), c, s

        return select_leaves(self.index, size, protected, self._order(now, h, lists), rank, yields_inner=False)

    def _age_order(self, lists):
        """(placement, leaf), oldest first: recency's order, every class's lists merged by placement. Ties of age
        go by placement, not by class: a split's back part starts at the tick of the request before the one that
        split it (SGLang's match_prefix splits before the request is recorded), as old as that request's new
        leaf, and SGLang's LRU stamps it later."""
        nodes = self.index.nodes
        sources = [x for src in compress(lists, lists) for x in (src if type(src) is tuple else (src,))]
        return ((placed, nodes[e]) for placed, e in merge(*sources, key=_first))

    def _weights(self) -> list:
        """Each list's weight on density: by the sketch's counts while the key contest is on and its verdicts were
        right at least as often as wrong (where a root's count does not tell which prompt comes back first, the
        counts order nothing), else 1 for all."""
        contest = self.contest
        return self._slot_weight if contest.margin and contest.orders else self._unit_weights

    def _order(self, now: int, h: float, lists):
        """((density, class, list), leaf), lowest first: a heap over the cold end of each list in `lists` (or of
        its two, leaves and parked leaves, merged in placement order: a list is in age order whether or not some of
        it is parked). Only the lists the selection reaches are walked, so a query costs O(lists) plus the victims
        taken."""
        nodes = self.index.nodes
        hits, events, ph, pe = self.hits, self.events, self.prior_hits, self.prior_events
        slot_class, weights = self._slot_class, self._weights()
        heap = []
        append = heap.append
        for s in compress(range(len(lists)), lists):  # the non-empty lists
            src = lists[s]
            n = nodes[(min(src[0][0], src[1][0], key=_first) if type(src) is tuple else src[0])[1]]
            c = slot_class[s]
            p = (hits[c] + ph) / (events[c] + pe) * weights[s]
            # ties go by class, then list (one source per list, so ties never reach the node); a source's iterator
            # is made only once the selection takes its head
            append((p / (now - n.tick + h), c, s, p, n, None))
        heapify(heap)
        while heap:
            r, c, s, p, n, it = heap[0]
            yield (r, c, s), n
            if it is None:
                src = lists[s]
                it = map(_second, merge(*src, key=_first) if type(src) is tuple else src)
                next(it)
            e = next(it, None)
            if e is None:
                heappop(heap)
            else:
                m = nodes[e]
                heapreplace(heap, (p / (now - m.tick + h), c, s, p, m, it))

    def __len__(self) -> int:
        return len(self.index.nodes)
