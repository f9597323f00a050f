"""Session TTL retention: soft pins with a time limit and a size budget.

A retained entry is not a hard pin (locks are for running requests): the wrapped policy offers it as a
victim only when unretained victims do not free enough. Retention
- starts with `retain(entry, size, ttl_s)` (TTL from a `cache_control` block or a session default),
- is refreshed by a hit (`touch`: the TTL restarts from now),
- ends at expiry (exactly when the injected clock reaches `expires_at`), on `release`, or when the entry
  leaves the tier,
- has a budget: retained size never exceeds `budget_fraction * capacity`; going over releases retentions of the
  tenant that holds the most retained size, its oldest (least recently retained or refreshed) first. So one
  tenant's TTL flood gives up its own retentions before another's: a tenant holding no more than an equal
  share of the budget keeps every retention while another tenant holds more (max-min fairness; the tenant is
  the key's namespace, SGLang's `cache_salt`; one tenant is plain oldest-first). A client free to send many salts
  counts as many tenants: who may use which salt is the operator's to enforce (an API gateway), as for the cache;
  finding the largest holder costs O(log tenants) whatever their number (a lazy max-heap, rebuilt like the expiry
  heap below), so many salts cannot make a retain expensive.
Expiry uses a heap with lazy deletion (a refresh pushes a new deadline; stale heap items are skipped), so
nothing scans all entries. Refreshes would grow that heap with the traffic for a whole TTL (up to a day), so
it is rebuilt from the live deadlines whenever it holds more than twice as many items as there are
retentions (plus a small slack): amortized O(1) per refresh, memory in proportion to what is retained.
When the pool needs more than the unretained entries give, RetainingPolicy takes retained ones of the tenant
holding the most first (the budget's rule again), then anyone's, each in the inner order. A tree split of a retained
entry keeps the retention on both parts (`split`). The tier asks `is_retained(entry)` when it evicts: a retained
victim should be DEMOTED to the host tier rather than dropped.

Not thread-safe: called under the tier's lock, like the policy.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, List, Mapping, Optional, Tuple

from tiers.clock import Clock, MonotonicClock
from tiers.policy import Policy

MAX_TTL_S = 24 * 3600.0  # longer than a day is a configuration mistake, not a session
HEAP_SLACK = 64  # stale expiry items allowed beyond 2x the retentions before the heap is rebuilt
_TTL_RE = re.compile(r"^([0-9]+)([smh])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


def parse_ttl(ttl: Any) -> float:
    """'5m', '1h', '<N>s' (also '<N>m', '<N>h') -> seconds. Raises ValueError with the reason."""
    if isinstance(ttl, bool) or not isinstance(ttl, str):
        raise ValueError(f"cache_control ttl must be a string like '5m', '1h' or '30s', got {type(ttl).__name__} {ttl!r}")
    m = _TTL_RE.match(ttl.strip())
    if not m:
        raise ValueError(f"cache_control ttl {ttl!r} is not '<N>s', '<N>m' or '<N>h' with N a non-negative integer")
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]  # an int of any length (as float, 309 digits overflowed)
    if seconds > MAX_TTL_S:
        raise ValueError(f"cache_control ttl {ttl:.40}{'...' if len(ttl) > 40 else ''} exceeds the maximum of "
                         f"{MAX_TTL_S:.0f}s (24h)")
    return validate_ttl_s(float(seconds))


def validate_ttl_s(seconds: Any) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"ttl must be a number of seconds, got {type(seconds).__name__} {seconds!r}")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"ttl must be a positive finite number of seconds, got {seconds!r}")
    if seconds > MAX_TTL_S:
        raise ValueError(f"ttl {seconds!r}s exceeds the maximum of {MAX_TTL_S:.0f}s (24h)")
    return float(seconds)


def parse_cache_control(obj: Any, default_ttl_s: float = 300.0) -> float:
    """`{"type": "ephemeral", "ttl": "5m"}` -> TTL seconds. A missing ttl means `default_ttl_s` (5 minutes,
    the common default for ephemeral prompt caching)."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"cache_control must be an object, got {type(obj).__name__}")
    unknown = set(obj) - {"type", "ttl"}
    if unknown:
        raise ValueError(f"cache_control has unknown field(s): {', '.join(sorted(map(str, unknown)))}")
    if "type" not in obj:
        raise ValueError("cache_control needs a 'type' (only 'ephemeral' is supported)")
    if obj["type"] != "ephemeral":
        raise ValueError(f"cache_control type {obj['type']!r} is not supported; only 'ephemeral'")
    if "ttl" not in obj:
        return validate_ttl_s(default_ttl_s)
    return parse_ttl(obj["ttl"])


class Retention:
    """Which entries are retained, until when, and within what budget."""

    def __init__(self, capacity: int, clock: Optional[Clock] = None, budget_fraction: float = 0.5):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        if not 0.0 < budget_fraction <= 1.0:
            raise ValueError(f"budget_fraction must be in (0, 1], got {budget_fraction}")
        self.clock = clock or MonotonicClock()
        self.budget = budget_fraction * capacity
        self._expiry: Dict[Hashable, float] = {}
        self._ttl: Dict[Hashable, float] = {}
        self._size: Dict[Hashable, int] = {}
        self._tenant: Dict[Hashable, Hashable] = {}  # entry -> its tenant
        self._age: Dict[Hashable, "OrderedDict[Hashable, None]"] = {}  # tenant -> its entries, oldest first
        self._tenant_size: Dict[Hashable, int] = {}  # tenant -> retained size
        self._by_size: List[Tuple[int, int, Hashable]] = []  # (-size, seq, tenant), stale items skipped
        self._size_seq = itertools.count()  # its own: the expiry heap's ties stay in retention order
        self._heap: List[Tuple[float, int, Hashable]] = []
        self._seq = itertools.count()
        self.retained_size = 0
        self.released_over_budget = 0
        self.retains = 0  # counters for metrics: retentions started or extended, refreshes on hit, expiries
        self.refreshes = 0
        self.expiries = 0
        self._watchers: List[Tuple[Callable[[Hashable], None], Callable[[Hashable], None]]] = []

    def watch(self, started: Callable[[Hashable], None], ended: Callable[[Hashable], None]) -> None:
        """Call `started(entry)` when an entry's retention begins and `ended(entry)` when it ends (expiry,
        release, the budget, or the entry leaving its tier); a refresh or an extension calls neither."""
        self._watchers.append((started, ended))

    def __len__(self) -> int:
        self.expire()
        return len(self._expiry)

    def retain(self, entry: Hashable, size: int, ttl_s: float, tenant: Hashable = None) -> bool:
        """Retain `entry` of `tenant` for `ttl_s` from now. False if it alone exceeds the budget. (An entry keeps
        the tenant it was first retained for: a tree's node never changes namespace.)"""
        ttl_s = validate_ttl_s(ttl_s)
        if size < 0:
            raise ValueError(f"size must be >= 0, got {size}")
        self.expire()
        if size > self.budget:
            return False
        new = entry not in self._expiry
        if new:
            self._tenant[entry] = tenant
            self._age.setdefault(tenant, OrderedDict())
        self._add_size(entry, size - self._size.get(entry, 0))
        self._size[entry] = size
        self._ttl[entry] = ttl_s if new else max(ttl_s, self._ttl[entry])
        self._set_deadline(entry)
        self.retains += 1
        if new:
            for started, _ in self._watchers:
                started(entry)
        while self.retained_size > self.budget:
            self.release(next(iter(self._age[self._largest_tenant()])))
            self.released_over_budget += 1
        return True

    def _add_size(self, entry: Hashable, delta: int) -> None:
        tenant = self._tenant[entry]
        self.retained_size += delta
        size = self._tenant_size[tenant] = self._tenant_size.get(tenant, 0) + delta
        if not delta:  # a refresh at the same size (every request's path): the heap's item still holds
            return
        heapq.heappush(self._by_size, (-size, next(self._size_seq), tenant))
        if len(self._by_size) > 2 * len(self._tenant_size) + HEAP_SLACK:
            self._by_size = [(-n, next(self._size_seq), t) for t, n in self._tenant_size.items()]
            heapq.heapify(self._by_size)

    def size_of(self, entry: Hashable) -> int:
        return self._size.get(entry, 0)

    def tenant_of(self, entry: Hashable) -> Hashable:
        return self._tenant.get(entry)

    def largest_tenant(self) -> Hashable:
        """The tenant holding the most retained size (None if nothing is retained)."""
        return self._largest_tenant() if self._expiry else None

    def split(self, entry: Hashable, front: Hashable, front_size: int) -> None:
        """A tree split retained `entry`: its first `front_size` units are now `front` (a new entry, the tree's
        parent of `entry`), retained as `entry` is, for the same tenant, TTL and deadline; the caller resizes
        `entry` next, so the retained size is unchanged. A hit that ends inside a retained entry splits it: the
        front kept no retention, and the budget counted only the tail (a split could move a prefix out of it)."""
        if entry not in self._expiry or front in self._expiry:
            return
        tenant = self._tenant[entry]
        self._tenant[front], self._ttl[front], self._size[front] = tenant, self._ttl[entry], front_size
        self._add_size(front, front_size)
        self._expiry[front] = self._expiry[entry]
        self._age[tenant][front] = None
        heapq.heappush(self._heap, (self._expiry[front], next(self._seq), front))
        for started, _ in self._watchers:
            started(front)

    def _largest_tenant(self) -> Hashable:
        """The tenant holding the most retained size (ties: the one whose size was set first)."""
        heap, sizes = self._by_size, self._tenant_size
        while -heap[0][0] != sizes.get(heap[0][2]):  # stale: the tenant's size changed or it retains nothing
            heapq.heappop(heap)
        return heap[0][2]

    def touch(self, entry: Hashable) -> None:
        """A hit: the entry's TTL restarts from now (if it is still retained)."""
        if entry in self._expiry and not self._expired(entry):
            self._set_deadline(entry)
            self.refreshes += 1

    def resize(self, entry: Hashable, size: int) -> None:
        if entry in self._size:
            self._add_size(entry, size - self._size[entry])
            self._size[entry] = size

    def release(self, entry: Hashable) -> None:
        if entry in self._expiry:
            tenant = self._tenant[entry]
            del self._expiry[entry], self._ttl[entry], self._age[tenant][entry]
            self._add_size(entry, -self._size.pop(entry))
            del self._tenant[entry]
            if not self._age[tenant]:  # the tenant retains nothing now: it leaves the budget's count
                del self._age[tenant], self._tenant_size[tenant]
            for _, ended in self._watchers:
                ended(entry)

    def release_all(self) -> None:
        """End every retention (its watchers told of each), as when client TTLs stop being honoured."""
        for entry in list(self._expiry):
            self.release(entry)

    def is_retained(self, entry: Hashable) -> bool:
        return entry in self._expiry and not self._expired(entry)

    def expires_at(self, entry: Hashable) -> Optional[float]:
        return self._expiry.get(entry) if self.is_retained(entry) else None

    @property
    def pending_deadlines(self) -> int:
        """Items in the expiry heap, stale ones included (bounded by 2x the retentions plus a slack)."""
        return len(self._heap)

    def expire(self) -> int:
        """Release every retention whose deadline has passed; returns how many."""
        now = self.clock.now()
        heap = self._heap
        n = 0
        while heap and heap[0][0] <= now:
            deadline, _, entry = heapq.heappop(heap)
            if self._expiry.get(entry) == deadline:  # else a stale item from before a refresh
                self.release(entry)
                n += 1
        self.expiries += n
        return n

    def _expired(self, entry) -> bool:
        return self.clock.now() >= self._expiry[entry]

    def _set_deadline(self, entry) -> None:
        deadline = self.clock.now() + self._ttl[entry]
        self._expiry[entry] = deadline
        age = self._age[self._tenant[entry]]
        age[entry] = None
        age.move_to_end(entry)
        heapq.heappush(self._heap, (deadline, next(self._seq), entry))
        if len(self._heap) > 2 * len(self._expiry) + HEAP_SLACK:
            self._heap = [(d, next(self._seq), e) for e, d in self._expiry.items()]
            heapq.heapify(self._heap)


class RetainingPolicy(Policy):
    """Wraps any policy: retained entries become victims only after every unretained one.

    A policy that can park entries (`park(entry)`, `unpark(entry)`, and `victims(..., parked=False)`, which
    leaves parked entries out of the order it walks) is told of every retention as it starts and ends, so
    the first victim pass does not walk past the retained entries; with a host tier the retention budget
    can cover the whole device, and that walk was most of the policy's time. Any other policy is asked
    `is_retained` for each entry its first pass reaches."""

    def __init__(self, inner: Policy, retention: Retention):
        # deliberately not calling Policy.__init__ twice over the same state: share the inner's settings
        self.inner = inner
        self.retention = retention
        self.capacity = inner.capacity
        self.clock = inner.clock
        self.name = inner.name
        # the calls retention has no part in go straight to the inner policy's bound methods: they run
        # several times per request, and a forwarding frame each was a measurable share of the policy cost
        self.record = inner.record
        self.observe = inner.observe
        self.may_admit = inner.may_admit
        self.admit = inner.admit
        self._parks = callable(getattr(inner, "park", None))
        if self._parks:  # inserts go through on_insert below, which parks an entry that arrives retained
            retention.watch(inner.park, inner.unpark)
        else:
            self.on_insert = inner.on_insert

    def on_insert(self, entry, key, size, parent=None) -> None:
        self.inner.on_insert(entry, key, size, parent)
        if self._parks and self.retention.is_retained(entry):  # retained before it came to this tier
            self.inner.park(entry)

    def on_access(self, entry) -> None:
        self.retention.touch(entry)
        self.inner.on_access(entry)

    def on_remove(self, entry) -> None:
        self.retention.release(entry)
        self.inner.on_remove(entry)

    def on_resize(self, entry, new_size, new_parent, new_key=None) -> None:
        if new_parent is not None:  # the split's front part keeps the retention too (the caller inserted it)
            self.retention.split(entry, new_parent, self.retention.size_of(entry) - new_size)
        self.retention.resize(entry, new_size)
        self.inner.on_resize(entry, new_size, new_parent, new_key)

    def victims(self, size: int, protected: Callable[[Hashable], bool] = lambda e: False) -> List[Hashable]:
        self.retention.expire()
        if not self.retention.retained_size:
            return self.inner.victims(size, protected)
        if self._parks:
            first = self.inner.victims(size, protected, parked=False)
        else:
            is_ret = self.retention.is_retained
            first = self.inner.victims(size, lambda e: protected(e) or is_ret(e))
        freed = sum(self._size_of(e) for e in first)
        if freed >= size:
            return first
        # not enough without retained entries: continue in the inner order, the retentions of the tenant holding
        # the most first (as over the budget: one tenant's flood gives up its own before another's), then anyone's
        # (the concatenation stays removable: every later entry's children are earlier in one list or other, and
        # no entry has a parent in another tenant's namespace)
        seen = set(first)
        out = list(first)
        retention = self.retention
        largest = retention.largest_tenant()
        for allowed in (lambda e: not retention.is_retained(e) or retention.tenant_of(e) == largest, lambda e: True):
            for e in self.inner.victims(size, lambda e: protected(e) or not allowed(e)):
                if freed >= size:
                    return out
                if e not in seen:
                    seen.add(e)
                    out.append(e)
                    freed += self._size_of(e)
        return out

    def _size_of(self, e) -> int:
        return self.inner.index.nodes[e].size
