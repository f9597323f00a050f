"""What an operator watches on one cache tier: eviction and store velocity, thrash, churn, cold vs capacity misses.

Design note
-----------
A `TierSignals` is fed by its cache at three moments: an entry is stored in the tier (`stored`), an entry leaves
it (`evicted`), a lookup hits it (`hit`). Everything is O(1) per event and bounded in memory:

- Velocities come from a ring of `window_s` one-second buckets (`Window`): adding to a bucket is O(1), reading a
  window sum is O(window_s). A rate is the window's sum over `window_s` seconds.
- Thrash: the tier is thrashing while, over the last `window_s` seconds (30 s by default, two Prometheus scrapes
  at the usual 15 s), evicted tokens exceed `thrash_ratio` (0.9) x stored tokens, stores are at least
  `thrash_min_miss_share` (half) of the tokens looked up (stored + hit), and at least `thrash_min_entries` entries
  were stored. The first condition is the issue's: when the working set exceeds capacity, LRU evicts everything
  before its second use, so every store costs an eviction. The second keeps a full, healthy cache with a few
  misses (each store also costs an eviction there) from reading as thrash; the third keeps an idle tier quiet.
  Judging the whole window's sums is what "sustained" means here: one burst in a quiet window does not flip it.
- Miss breakdown: every store in a tier follows a miss in that tier. The ghost is a bounded, insertion-ordered
  record of the keys of recently evicted entries: a store whose key is in it is a capacity miss (the tier once had
  it), any other is a cold miss (never seen, or evicted so long ago that the ghost forgot it). The cache picks
  the keys (an eviction may leave several, so that a later store of part of the entry is still recognised).
- Churn and lifetime: `stored` returns a birth stamp the cache keeps on the entry (so no per-entry table lives
  here); `evicted` takes it back and accumulates the entry's lifetime in seconds and in traffic (tokens stored in
  the tier since its birth: for an entry never hit under LRU this is about the tier's capacity) and whether it was
  ever hit.

Time is injected (tiers.clock). Not thread-safe: one owner thread (the scheduler's, in the server).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Hashable, Iterable, NamedTuple, Optional

from tiers.clock import Clock

DEFAULT_WINDOW_S = 30
DEFAULT_GHOST_ENTRIES = 16384  # keys; the server adds up to 5 per evicted entry

# Window fields (per-second bucket columns).
STORED_TOKENS, STORED_ENTRIES, EVICTED_TOKENS, EVICTED_ENTRIES, HIT_TOKENS, LIFETIME_S, LIFETIME_TRAFFIC, \
    AGED_EVICTIONS, NEVER_HIT = range(9)
_FIELDS = 9


class Window:
    """Per-second sums over the last `window_s` whole seconds, in a fixed ring of buckets."""

    def __init__(self, window_s: int, fields: int = _FIELDS):
        if window_s < 1:
            raise ValueError(f"window_s must be at least 1, got {window_s}")
        self.window_s = int(window_s)
        self._second = [None] * self.window_s
        self._sums = [[0.0] * fields for _ in range(self.window_s)]

    def add(self, now: float, field: int, amount: float) -> None:
        self._bucket(int(now))[field] += amount

    def bucket(self, now: float) -> list:
        """The current second's bucket, for adding several fields at once."""
        return self._bucket(int(now))

    def _bucket(self, second: int) -> list:
        i = second % self.window_s
        row = self._sums[i]
        if self._second[i] != second:
            self._second[i] = second
            for f in range(len(row)):
                row[f] = 0.0
        return row

    def sums(self, now: float) -> list:
        """Each field's sum over the buckets of the last `window_s` seconds, this one included."""
        second = int(now)
        out = [0.0] * len(self._sums[0])
        for stamp, row in zip(self._second, self._sums):
            if stamp is not None and second - self.window_s < stamp <= second:
                for f, v in enumerate(row):
                    out[f] += v
        return out


class Ghost:
    """The keys of the last `capacity` evicted entries, oldest forgotten first."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"ghost capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._keys: Dict[Hashable, None] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, key: Hashable) -> None:
        self._keys.pop(key, None)
        self._keys[key] = None
        if len(self._keys) > self.capacity:
            del self._keys[next(iter(self._keys))]

    def take(self, key: Hashable) -> bool:
        """True (and forget it) if `key` was evicted recently."""
        return self._keys.pop(key, False) is None


@dataclasses.dataclass(frozen=True)
class SignalsConfig:
    window_s: int = DEFAULT_WINDOW_S
    thrash_ratio: float = 0.9
    thrash_min_miss_share: float = 0.5
    thrash_min_entries: int = 4
    ghost_entries: int = DEFAULT_GHOST_ENTRIES


class Birth(NamedTuple):
    """What a tier remembers about an entry from its store until its eviction (kept on the entry by the cache).
    A tuple, not a frozen dataclass: one is made per store, on the scheduler's path."""
    time_s: float
    traffic_tokens: int


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One tier's signals at one moment. Rates are over the last `window_s` seconds; counts since start."""
    window_s: int
    eviction_tokens_per_s: float
    store_tokens_per_s: float
    evictions_per_s: float  # entries freed per second (block churn)
    stores_per_s: float  # entries allocated per second
    hit_tokens_per_s: float
    thrashing: bool
    evicted_lifetime_s: Optional[float]  # mean over the window's evictions of entries whose birth is known
    evicted_lifetime_tokens: Optional[float]  # the same lifetime in tokens stored into the tier meanwhile
    evicted_never_hit_share: Optional[float]
    cold_miss_tokens: int
    capacity_miss_tokens: int
    stored_entries: int
    stored_tokens: int
    evicted_entries: int
    evicted_never_hit: int
    ghost_entries: int

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


class TierSignals:
    def __init__(self, clock: Clock, config: SignalsConfig = SignalsConfig()):
        self.clock, self.config = clock, config
        self.window = Window(config.window_s)
        self.ghost = Ghost(config.ghost_entries)
        self.cold_miss_tokens = self.capacity_miss_tokens = 0
        self.stored_entries = self.stored_tokens = 0
        self.evicted_entries = self.evicted_never_hit = 0

    def stored(self, key: Hashable, tokens: int) -> Birth:
        now = self.clock.now()
        if self.ghost.take(key):
            self.capacity_miss_tokens += tokens
        else:
            self.cold_miss_tokens += tokens
        birth = Birth(now, self.stored_tokens)
        self.stored_entries += 1
        self.stored_tokens += tokens
        row = self.window.bucket(now)
        row[STORED_TOKENS] += tokens
        row[STORED_ENTRIES] += 1
        return birth

    def evicted(self, keys: Iterable[Hashable], tokens: int, birth: Optional[Birth], was_hit: bool) -> None:
        """`keys`: what a later store of any part of the entry may be looked up by (see the cache's key scheme)."""
        now = self.clock.now()
        for key in keys:
            self.ghost.add(key)
        self.evicted_entries += 1
        row = self.window.bucket(now)
        row[EVICTED_TOKENS] += tokens
        row[EVICTED_ENTRIES] += 1
        if birth is not None:
            row[AGED_EVICTIONS] += 1
            row[LIFETIME_S] += now - birth.time_s
            row[LIFETIME_TRAFFIC] += self.stored_tokens - birth.traffic_tokens
            if not was_hit:
                row[NEVER_HIT] += 1
                self.evicted_never_hit += 1

    def hit(self, tokens: int) -> None:
        if tokens > 0:
            self.window.add(self.clock.now(), HIT_TOKENS, tokens)

    def snapshot(self) -> Snapshot:
        c = self.config
        s = self.window.sums(self.clock.now())
        per_s = 1.0 / c.window_s
        stored, evicted, hits, aged = s[STORED_TOKENS], s[EVICTED_TOKENS], s[HIT_TOKENS], s[AGED_EVICTIONS]
        thrashing = (evicted > c.thrash_ratio * stored and stored >= c.thrash_min_miss_share * (stored + hits)
                     and s[STORED_ENTRIES] >= c.thrash_min_entries)
        return Snapshot(
            window_s=c.window_s,
            eviction_tokens_per_s=evicted * per_s, store_tokens_per_s=stored * per_s,
            evictions_per_s=s[EVICTED_ENTRIES] * per_s, stores_per_s=s[STORED_ENTRIES] * per_s,
            hit_tokens_per_s=hits * per_s, thrashing=bool(thrashing),
            evicted_lifetime_s=s[LIFETIME_S] / aged if aged else None,
            evicted_lifetime_tokens=s[LIFETIME_TRAFFIC] / aged if aged else None,
            evicted_never_hit_share=s[NEVER_HIT] / aged if aged else None,
            cold_miss_tokens=self.cold_miss_tokens, capacity_miss_tokens=self.capacity_miss_tokens,
            stored_entries=self.stored_entries, stored_tokens=self.stored_tokens,
            evicted_entries=self.evicted_entries, evicted_never_hit=self.evicted_never_hit,
            ghost_entries=len(self.ghost),
        )


@dataclasses.dataclass(frozen=True)
class Fragmentation:
    """The free pool as runs of consecutive free pages (a run is what one contiguous allocation could take)."""
    free_pages: int
    free_runs: int
    largest_free_run_pages: int
    page_size: int

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def free_runs(sorted_pages) -> tuple:
    """(runs, largest run) of a sorted sequence of distinct page ids. Pure Python, for tests and small pools."""
    runs = largest = current = 0
    previous = None
    for page in sorted_pages:
        if previous is not None and page == previous + 1:
            current += 1
        else:
            runs += 1
            current = 1
        largest = max(largest, current)
        previous = page
    return runs, largest


class Every:
    """Rate limit for a costly sample: `due()` is True at most once per `interval_s`."""

    def __init__(self, clock: Clock, interval_s: float):
        self.clock, self.interval_s = clock, interval_s
        self._last: Optional[float] = None

    def due(self) -> bool:
        now = self.clock.now()
        if self._last is not None and now - self._last < self.interval_s:
            return False
        self._last = now
        return True
