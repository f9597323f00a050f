"""TinyLFU's frequency sketch (how often each key was asked for lately, in fixed memory per entry) and the
admission contest per key that uses it.

Design note
-----------
A count-min sketch (Cormode and Muthukrishnan 2005) as TinyLFU uses it (Einziger, Friedman, Manes, ACM TOS
2017): `ROWS` rows of small counters, one counter per row for each key; a use adds one to those of the key's
counters that hold the lowest value (the "conservative update": a key is less inflated by the keys it collides
with), and its estimate is that lowest value, so it can be too high, never too low. Counters stop at `MAX_COUNT`
(TinyLFU's 4-bit counters: past 15 uses a key is as hot as a contest needs). Aging is TinyLFU's reset: after
`period` x the entries tracked of uses, every counter is halved, so a key that stops coming back fades.

Size. `WIDTH_PER_ENTRY` counters per entry tracked and row (a power of two in all; at 4 per entry, starting over
when widened, three tenants rows read up to 0.009 below exact counts; at 16 within 0.0006: benchmarks/RESULTS.md).
The width doubles as the entries do, by repeating each row, which keeps every estimate: a key's slot in the
wider row is its old slot plus a multiple of the old width. It never shrinks, and stops at `MAX_WIDTH`: a client
that splits the tree into many small entries cannot make it allocate more. Everything is counted in entries and
uses, so nothing depends on how many tokens an entry holds, and memory is `ROWS` x the width in bytes whatever
keys clients send.

The contest (`KeyContest`) keeps its own score; its docstring says how.

Neither class is thread-safe: the policy that owns them calls them under the tier's lock.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Hashable, Iterable

ROWS = 4
MAX_COUNT = 15
WIDTH_PER_ENTRY = 16
MIN_ENTRIES = 64
MAX_WIDTH = 1 << 22  # counters a row at most (16 MiB in all): 262,144 entries at full width
_MIX = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: spreads nearby keys over all 64 bits, 16 bits a row
_MIX2 = 0xC2B2AE3D27D4EB4F  # another odd 64-bit constant (xxHash's second prime): a second hash from the first
_MASK64 = (1 << 64) - 1
_HALVE = bytes(b >> 1 for b in range(256))  # a translate table: every counter halved in one C pass


class FrequencySketch:
    def __init__(self, period: float = 10.0):
        if period <= 0:
            raise ValueError(f"period must be > 0, got {period}")
        self.period = period
        self.width = MIN_ENTRIES * WIDTH_PER_ENTRY
        self._rows = [bytearray(self.width) for _ in range(ROWS)]
        self._fits = MIN_ENTRIES  # the entries the width is for
        self._uses = 0  # since the last reset

    def _slots(self, key: Hashable):
        h = (hash(key) * _MIX) & _MASK64
        m = self.width - 1  # a power of two
        if m <= 0xFFFF:  # 16 bits of one hash a row
            return h & m, (h >> 16) & m, (h >> 32) & m, (h >> 48) & m
        g = (h * _MIX2) & _MASK64  # wider rows (over 4,096 entries): 32 bits of two hashes a row
        return h & m, (h >> 32) & m, g & m, (g >> 32) & m

    def add(self, key: Hashable, entries: int) -> bool:
        """Count one use of `key`; `entries` is how many the cache tracks now, which sizes the sketch and its
        aging. True if this use halved every count."""
        if entries > self._fits:
            self._grow(entries)
        a, b, c, d = self._slots(key)
        r0, r1, r2, r3 = self._rows
        low = min(r0[a], r1[b], r2[c], r3[d])
        if low < MAX_COUNT:
            if r0[a] == low:
                r0[a] = low + 1
            if r1[b] == low:
                r1[b] = low + 1
            if r2[c] == low:
                r2[c] = low + 1
            if r3[d] == low:
                r3[d] = low + 1
        self._uses += 1
        if self._uses >= self.period * (entries if entries > MIN_ENTRIES else MIN_ENTRIES):
            self._uses = 0
            self._rows = [row.translate(_HALVE) for row in self._rows]
            return True
        return False

    def estimate(self, key: Hashable) -> int:
        a, b, c, d = self._slots(key)
        r0, r1, r2, r3 = self._rows
        return min(r0[a], r1[b], r2[c], r3[d])

    def _grow(self, entries: int) -> None:
        k = 1
        while self.width * k < min(WIDTH_PER_ENTRY * entries, MAX_WIDTH):
            k *= 2
        self._rows = [row * k for row in self._rows]
        self.width *= k
        # at the cap the rows stop widening: estimates stay upper bounds, looser as collisions grow
        self._fits = self.width // WIDTH_PER_ENTRY if self.width < MAX_WIDTH else float("inf")


class KeyContest:
    """TinyLFU's admission contest per key, which keeps its own score.

    A newcomer loses if a victim's key was asked for more than `margin` x as often (the sketch's estimates). Each
    such verdict is an open bet: it was right if the defended victim is asked for again before the newcomer comes
    back, wrong if the newcomer comes back first (a session's next turn, after its first was held off by stale
    counts of another session). The contest is enforced while it has been right at least `right_per_wrong` times
    as often as wrong (scores halved at the sketch's resets): a wrong verdict can cost every later turn of a
    session, a right one keeps one prompt. Verdicts it does not enforce are scored the same way, so it can come
    back on. Its counts order eviction on a looser bar (`orders`: right at least as often as wrong). Where
    identical prompts recur at Zipf popularity the defended ones come back first; where traffic is sessions whose
    roots are their own (the Mooncake synthetic trace), new sessions come back first.
    """

    def __init__(self, period: float = 10.0, margin: float = 1.0, right_per_wrong: float = 2.0, open_bets: int = 64):
        if margin < 0:
            raise ValueError(f"frequency margin must be >= 0, got {margin}")
        if right_per_wrong < 0:
            raise ValueError(f"right_per_wrong must be >= 0, got {right_per_wrong}")
        self.right_per_wrong = right_per_wrong
        self.sketch = FrequencySketch(period)
        self.margin = margin  # 0: no contest
        self.right = 0.0
        self.wrong = 0.0
        self._limit = open_bets
        self._held_off: "OrderedDict[Hashable, Hashable]" = OrderedDict()  # newcomer key -> defended key
        self._defended: Dict[Hashable, Hashable] = {}  # defended key -> newcomer key

    @property
    def enforced(self) -> bool:
        return self.right >= self.right_per_wrong * self.wrong

    @property
    def orders(self) -> bool:
        """Whether the counts were right at least as often as wrong: the bar for them to order eviction (a wrong
        order costs one entry's stay, a wrong decline a whole session's next turns)."""
        return self.right >= self.wrong

    def record(self, key: Hashable, entries: int) -> bool:
        """A request passed `key`; `entries`: how many the cache tracks now. True if this use halved every count."""
        reset = self.sketch.add(key, entries)
        if reset:
            self.right *= 0.5
            self.wrong *= 0.5
        if key in self._held_off:
            self.wrong += 1
            self._defended.pop(self._held_off.pop(key), None)
        elif key in self._defended:
            self.right += 1
            self._held_off.pop(self._defended.pop(key), None)
        return reset

    def declines(self, key: Hashable, victim_keys: Iterable[Hashable]) -> bool:
        """Whether the newcomer `key` loses to the victims (which the caller would evict for it)."""
        if not self.margin:
            return False
        estimate = self.sketch.estimate
        hottest, defended = 0, None
        for v in victim_keys:
            f = estimate(v)
            if f > hottest:
                hottest, defended = f, v
        if hottest <= self.margin * estimate(key):
            return False
        self._bet(key, defended)
        return self.enforced

    def _bet(self, key: Hashable, defended: Hashable) -> None:
        held_off, defenders = self._held_off, self._defended
        old = held_off.pop(key, None)  # a newcomer held off again: its last bet is replaced
        if old is not None:
            defenders.pop(old, None)
        old = defenders.pop(defended, None)  # and so is another bet on the same victim
        if old is not None:
            held_off.pop(old, None)
        held_off[key] = defended
        defenders[defended] = key
        if len(held_off) > self._limit:  # the oldest open bet lapses unscored
            defenders.pop(held_off.popitem(last=False)[1], None)
