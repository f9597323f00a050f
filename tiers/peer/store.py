"""PageStore: the peer's index, slots and eviction for one pool (the design is in tiers/peer/__init__.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from tiers.clock import Clock, MonotonicClock
from tiers.peer.protocol import READ_LEASE_S, WRITE_LEASE_S, PeerError, page_checksum, scoped_key
from tiers.policy import Candidate, Policy, create_policy
from transfer.base import Range

# Page sizes a pool accepts: at least MIN_PAGE_BYTES, and few enough slots that the index stays small next
# to the pool (a 64 GB pool takes pages of 15,259 bytes or more). Whoever sets the size, flag or first hello,
# cannot make the server build an index in proportion to a number it chose.
MIN_PAGE_BYTES = 64
MAX_SLOTS = 1 << 22


def page_size_problem(pool_bytes: int, page_bytes: int) -> Optional[str]:
    """Why `page_bytes` cannot cut a `pool_bytes` pool, or None if it can."""
    if isinstance(page_bytes, bool) or not isinstance(page_bytes, int):
        return f"page size must be an integer, got {type(page_bytes).__name__}"
    if page_bytes < MIN_PAGE_BYTES or page_bytes > pool_bytes:
        return f"page size {page_bytes} is outside [{MIN_PAGE_BYTES}, {pool_bytes}] (the pool's bytes)"
    if pool_bytes // page_bytes > MAX_SLOTS:
        return (f"page size {page_bytes} cuts the {pool_bytes}-byte pool into more than {MAX_SLOTS} slots; "
                f"the smallest page this pool takes is {-(-pool_bytes // MAX_SLOTS)} bytes")
    return None


@dataclass
class _Slot:
    index: int
    skey: Tuple[str, str]
    writing: bool
    checksum: str = ""
    lease_until: float = 0.0


class Located(NamedTuple):
    """A lookup's answer, key by key: the page's offset in the pool and its checksum, or None twice."""

    offsets: List[Optional[int]]
    checksums: List[Optional[str]]


@dataclass(frozen=True)
class StoreStats:
    page_bytes: int
    capacity_pages: int
    used_pages: int
    writing_pages: int
    free_pages: int
    policy: str
    hits: int
    misses: int
    stored: int
    evictions: int
    rejected_full: int
    commit_mismatch: int
    corrupt_dropped: int
    transit_errors: int


class PageStore:
    """Index, slots and eviction for one pool. Thread-safe: every method takes `self._lock`."""

    def __init__(self, pool: np.ndarray, policy_name: str, clock: Optional[Clock] = None):
        self.pool = pool
        self.pool_addr = pool.ctypes.data
        self.policy_name = policy_name
        self.clock = clock or MonotonicClock()
        self._lock = threading.Lock()
        self.page_bytes = 0
        self.capacity_pages = 0
        self._policy: Optional[Policy] = None
        self._index: Dict[Tuple[str, str], _Slot] = {}
        self._slots: Dict[int, _Slot] = {}
        self._free: List[int] = []  # slots given back; slots never used are `_fresh` and above
        self._fresh = 0
        self._n = dict(hits=0, misses=0, stored=0, evictions=0, rejected_full=0, commit_mismatch=0,
                       corrupt_dropped=0, transit_errors=0)

    def format(self, page_bytes: int) -> None:
        """Cut the pool into `page_bytes` slots; a no-op if already cut that way."""
        with self._lock:
            if self.page_bytes:
                if page_bytes != self.page_bytes:
                    raise PeerError(f"pool holds {self.page_bytes}-byte pages; this client uses {page_bytes}")
                return
            problem = page_size_problem(len(self.pool), page_bytes)
            if problem:
                raise PeerError(problem)
            self.capacity_pages = len(self.pool) // page_bytes
            self._policy = create_policy(self.policy_name, self.capacity_pages, clock=self.clock)
            self.page_bytes = page_bytes

    def _need_format(self) -> None:
        if not self.page_bytes:
            raise PeerError("pool not formatted yet: send hello first")

    def _protected(self, index: int) -> bool:
        return self._slots[index].lease_until > self.clock.now()  # a write in progress, or a fresh read

    def _remove(self, slot: _Slot) -> None:
        del self._index[slot.skey]
        del self._slots[slot.index]
        self._policy.on_remove(slot.index)
        self._free.append(slot.index)

    def _take_slot(self, skey: Tuple[str, str]) -> Optional[int]:
        if self._free:
            return self._free.pop()
        if self._fresh < self.capacity_pages:
            self._fresh += 1
            return self._fresh - 1
        victims = self._policy.victims(1, self._protected)
        if not victims or not self._policy.admit(Candidate(key=skey, size=1), victims):
            return None
        for v in victims:
            self._remove(self._slots[v])
            self._n["evictions"] += 1
        return self._free.pop()

    def alloc(self, ns: str, keys: Sequence[str]) -> List[dict]:
        out = []
        with self._lock:
            self._need_format()
            now = self.clock.now()
            for key in keys:
                skey = (ns, key)
                slot = self._index.get(skey)
                if slot is not None and not slot.writing:
                    self._policy.on_access(slot.index)
                    out.append({"state": "exists"})
                    continue
                if slot is not None and slot.lease_until > now:
                    out.append({"state": "busy"})  # another writer holds it
                    continue
                if slot is not None:
                    self._remove(slot)  # an abandoned write
                index = self._take_slot(skey)
                if index is None:
                    self._n["rejected_full"] += 1
                    out.append({"state": "full"})
                    continue
                slot = _Slot(index, skey, writing=True, lease_until=now + WRITE_LEASE_S)
                self._index[skey] = self._slots[index] = slot
                self._policy.on_insert(index, key=skey, size=1, parent=None)
                out.append({"state": "alloc", "offset": index * self.page_bytes})
        return out

    def _page(self, index: int) -> List[Range]:
        return [(self.pool_addr + index * self.page_bytes, self.page_bytes)]

    def commit(self, ns: str, keys: Sequence[str], checksums: Sequence[str]) -> List[bool]:
        if len(keys) != len(checksums):
            raise PeerError("keys and checksums differ in length")
        with self._lock:
            self._need_format()
            slots = [self._index.get((ns, k)) for k in keys]
        # Hash outside the lock: the slots are still writing, hence protected from eviction.
        actual = [
            page_checksum(scoped_key(ns, k), self._page(s.index)) if s is not None and s.writing else None
            for k, s in zip(keys, slots)
        ]
        out = []
        with self._lock:
            for key, slot, want, got in zip(keys, slots, checksums, actual):
                if slot is None or got is None or self._index.get((ns, key)) is not slot:
                    out.append(False)  # the lease ran out and the slot went to someone else
                elif got != want:
                    self._n["commit_mismatch"] += 1
                    self._remove(slot)
                    out.append(False)
                else:
                    slot.writing, slot.checksum, slot.lease_until = False, want, 0.0
                    self._n["stored"] += 1
                    out.append(True)
        return out

    def lookup(self, ns: str, keys: Sequence[str], pin: bool) -> "Located":
        """Where each page is. Each asked key is counted once: a probe (`pin` false: the client's `exists`)
        counts only its misses, because a found page is read next and that read (`pin` true) counts the hit,
        bumps recency and takes the read lease. The policy hears the same once-per-key `record`s and, per
        call, the miss traffic (`observe`) that ages its learned estimates. One loop with its lookups
        hoisted: a 512-key lookup right after a 32 MiB read runs from a cold cache (1.9 ms measured)."""
        offsets: List[Optional[int]] = []
        checksums: List[Optional[str]] = []
        hits = 0
        with self._lock:
            self._need_format()
            policy, index, grid = self._policy, self._index, self.page_bytes
            record, access, lease = policy.record, policy.on_access, self.clock.now() + READ_LEASE_S
            for key in keys:
                skey = (ns, key)
                slot = index.get(skey)
                if slot is None or slot.writing:
                    record(skey)
                    offsets.append(None)
                    checksums.append(None)
                    continue
                if pin:
                    hits += 1
                    record(skey)
                    access(slot.index)
                    if slot.lease_until < lease:
                        slot.lease_until = lease
                offsets.append(slot.index * grid)
                checksums.append(slot.checksum)
            misses = offsets.count(None)
            self._n["hits"] += hits
            self._n["misses"] += misses
            if hits + misses:
                policy.observe(hits, hits + misses)
        return Located(offsets, checksums)

    def report(self, ns: str, keys: Sequence[str]) -> List[bool]:
        """A reader saw a bad checksum: re-verify and drop pages that really are corrupt."""
        with self._lock:
            slots = [self._index.get((ns, k)) for k in keys]
        verdicts = [
            None if s is None or s.writing else page_checksum(scoped_key(ns, k), self._page(s.index)) == s.checksum
            for k, s in zip(keys, slots)
        ]
        out = []
        with self._lock:
            for key, slot, good in zip(keys, slots, verdicts):
                if slot is None or good is None or self._index.get((ns, key)) is not slot:
                    out.append(False)
                elif good:
                    self._n["transit_errors"] += 1
                    out.append(False)
                else:
                    self._n["corrupt_dropped"] += 1
                    self._remove(slot)
                    out.append(True)
        return out

    def corrupt(self, ns: str, key: str) -> None:
        """Test hook: flip one byte of a stored page, behind the index's back."""
        with self._lock:
            slot = self._index.get((ns, key))
            if slot is None or slot.writing:
                raise PeerError(f"no stored page for {key!r}")
            self.pool[slot.index * self.page_bytes] ^= 0xFF

    def stats(self) -> StoreStats:
        with self._lock:
            writing = sum(1 for s in self._slots.values() if s.writing)
            return StoreStats(
                page_bytes=self.page_bytes,
                capacity_pages=self.capacity_pages,
                used_pages=len(self._slots) - writing,
                writing_pages=writing,
                free_pages=len(self._free) + self.capacity_pages - self._fresh,
                policy=self.policy_name,
                **self._n,
            )
