"""Frequency sketch for TinyLFU admission: a 4-bit count-min sketch with periodic aging.

Design note
-----------
TinyLFU (Einziger, Friedman, Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM Transactions
on Storage 13(4), 2017) admits a new entry only if its recent access frequency beats that of the entry it
would displace. Frequencies are kept for far more keys than the cache holds, so they live in an approximate
structure:

- Count-min sketch, depth 4. A key's estimate is the minimum of its 4 counters, so it never undercounts;
  it overcounts only through collisions (error ~ e * N / width with probability 1 - e^-depth).
- 4-bit counters (saturating at 15). TinyLFU only needs to compare small frequencies, and aging keeps
  them small; 16 counters fit in one 64-bit word.
- Caffeine-style block layout: a key first selects one 64-byte block (8 words), then its 4 counters sit in
  4 distinct words of that block. In C this makes an increment touch one cache line; here in Python it
  keeps the arithmetic to a handful of shifts on small ints, which is what per-op cost is made of.
- Aging ("reset"): after `sample_size` increments (10x the expected number of distinct live keys, as in the
  paper) every counter is halved, so the sketch tracks recent popularity and old heavy hitters fade.
  Truncation error of the halving is corrected as in the paper by subtracting (odd counters)/4 from
  the sample count.
- Doorkeeper (optional): a Bloom filter in front of the counters. A key's first occurrence only sets
  doorkeeper bits; counters start counting from the second. One-hit wonders then never touch the counters,
  which is the paper's way to get the same accuracy from a smaller sketch. The doorkeeper is cleared at
  each reset. Estimates add 1 for a key present in the doorkeeper.
- Hash flooding: keys are hashed with a per-instance random seed, so an adversary cannot precompute
  colliding keys; `admit_with_jitter` also admits a warm candidate that ties or narrowly loses with a small
  probability (Caffeine's defence), so a flood that drives victims' counters up cannot shut admission
  out completely.

Not thread-safe: the owning policy calls it under the tier's lock.
"""

from __future__ import annotations

import random
from typing import Hashable, Optional

_MASK64 = (1 << 64) - 1
_RESET_MASK = 0x7777_7777_7777_7777  # after a right shift by 1, clears the bit shifted in from the next nibble
_ONE_MASK = 0x1111_1111_1111_1111
_MAX_COUNT = 15


def _ceil_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class FrequencySketch:
    """Approximate, aging frequency counts of hashable keys."""

    def __init__(
        self,
        expected_keys: int,
        *,
        sample_factor: int = 10,
        doorkeeper: bool = False,
        seed: Optional[int] = None,
    ):
        if not isinstance(expected_keys, int) or expected_keys <= 0:
            raise ValueError(f"expected_keys must be a positive int, got {expected_keys!r}")
        if sample_factor <= 0:
            raise ValueError(f"sample_factor must be positive, got {sample_factor}")
        words = max(8, _ceil_pow2(expected_keys))  # one 4-bit counter row of `expected_keys` per depth, packed
        self._table = [0] * words
        self._block_mask = (words >> 3) - 1  # number of 8-word blocks, minus 1
        rng = random.Random(seed)
        self._seed = rng.getrandbits(64) | 1
        self._rng = rng
        self.sample_size = sample_factor * expected_keys
        self._additions = 0
        self.resets = 0
        self._door: Optional[bytearray] = None
        if doorkeeper:
            self._door_bits = max(64, _ceil_pow2(expected_keys * 4))
            self._door = bytearray(self._door_bits >> 3)

    # --- hashing ---
    def _spread(self, key: Hashable) -> int:
        h = (hash(key) * self._seed) & _MASK64
        h ^= h >> 29
        h = (h * 0xBF58476D1CE4E5B9) & _MASK64
        return h ^ (h >> 32)

    def _slots(self, h: int):
        """(word index, bit shift) of the key's 4 counters: one block, 4 distinct words in it."""
        base = (h & self._block_mask) << 3
        h >>= 24
        # word i of the key lives in the i-th pair of the block's 8 words; one bit chooses which of the pair
        return (
            (base + ((h >> 0) & 1), ((h >> 4) & 15) << 2),
            (base + 2 + ((h >> 1) & 1), ((h >> 8) & 15) << 2),
            (base + 4 + ((h >> 2) & 1), ((h >> 12) & 15) << 2),
            (base + 6 + ((h >> 3) & 1), ((h >> 16) & 15) << 2),
        )

    # --- doorkeeper ---
    def _door_positions(self, h: int):
        n = self._door_bits - 1
        return (h >> 7) & n, (h >> 27) & n, ((h >> 47) ^ h) & n

    def _door_contains(self, h: int) -> bool:
        d = self._door
        return all(d[p >> 3] >> (p & 7) & 1 for p in self._door_positions(h))

    def _door_put(self, h: int) -> bool:
        """Set the key's bits; True if it was already present."""
        d = self._door
        present = True
        for p in self._door_positions(h):
            byte, bit = p >> 3, 1 << (p & 7)
            if not d[byte] & bit:
                present = False
                d[byte] |= bit
        return present

    # --- public API ---
    def increment(self, key: Hashable) -> None:
        h = self._spread(key)
        if self._door is not None and not self._door_put(h):
            self._tick()
            return
        t = self._table
        base = (h & self._block_mask) << 3
        g = h >> 24
        added = False
        # inlined _slots(): this is the hot path (one call per node on every request's path)
        for w, sh in (
            (base + (g & 1), ((g >> 4) & 15) << 2),
            (base + 2 + ((g >> 1) & 1), ((g >> 8) & 15) << 2),
            (base + 4 + ((g >> 2) & 1), ((g >> 12) & 15) << 2),
            (base + 6 + ((g >> 3) & 1), ((g >> 16) & 15) << 2),
        ):
            if (t[w] >> sh) & 15 < _MAX_COUNT:
                t[w] += 1 << sh
                added = True
        if added:
            self._tick()

    def estimate(self, key: Hashable) -> int:
        h = self._spread(key)
        t = self._table
        base = (h & self._block_mask) << 3
        g = h >> 24
        est = min(
            (t[base + (g & 1)] >> (((g >> 4) & 15) << 2)) & 15,
            (t[base + 2 + ((g >> 1) & 1)] >> (((g >> 8) & 15) << 2)) & 15,
            (t[base + 4 + ((g >> 2) & 1)] >> (((g >> 12) & 15) << 2)) & 15,
            (t[base + 6 + ((g >> 3) & 1)] >> (((g >> 16) & 15) << 2)) & 15,
        )
        if self._door is not None and self._door_contains(h):
            est += 1
        return est

    def _tick(self) -> None:
        self._additions += 1
        if self._additions >= self.sample_size:
            self.reset()

    def reset(self) -> None:
        """Halve every counter (aging) and clear the doorkeeper."""
        t = self._table
        odd = 0
        for i, w in enumerate(t):
            if w:
                odd += bin(w & _ONE_MASK).count("1")
                t[i] = (w >> 1) & _RESET_MASK
        self._additions = max(0, (self._additions - (odd >> 2)) >> 1)
        if self._door is not None:
            self._door = bytearray(len(self._door))
        self.resets += 1

    def admit_with_jitter(self, candidate_freq: int, victim_freq: int) -> bool:
        """TinyLFU's comparison, hardened against flooding (Caffeine): a warm candidate that does not win
        outright is still admitted about once in 128 tries, so inflated victim counts cannot lock it out."""
        if candidate_freq > victim_freq:
            return True
        if candidate_freq >= 6 and (self._rng.getrandbits(7) == 0):
            return True
        return False
