"""Hill climbing of W-TinyLFU's window size on the observed hit rate (Caffeine's simple climber).

Every `period` requested units the hit rate of that sample is compared with the previous sample's: if it did
not drop, the window keeps moving in the same direction by `step`; if it dropped, the direction reverses.
The step decays by `decay` each period so the window settles, and restarts at full size when the hit rate
moves by more than `restart` (the workload changed). The fraction stays within [min_frac, max_frac].
"""

from __future__ import annotations


class HillClimber:
    def __init__(
        self,
        initial: float,
        *,
        period: float,
        step: float = 0.0625,
        decay: float = 0.98,
        restart: float = 0.05,
        min_frac: float = 0.0,
        max_frac: float = 1.0,
    ):
        if not 0.0 <= min_frac <= max_frac <= 1.0:
            raise ValueError(f"need 0 <= min_frac <= max_frac <= 1, got {min_frac}, {max_frac}")
        if period <= 0:
            raise ValueError(f"period must be positive, got {period}")
        if step < 0 or not 0 < decay <= 1:
            raise ValueError(f"step must be >= 0 and 0 < decay <= 1, got {step}, {decay}")
        self.frac = min(max_frac, max(min_frac, initial))
        self.period = period
        self.full_step = step
        self.step = step  # signed: the direction of the next move
        self.decay = decay
        self.restart = restart
        self.min_frac = min_frac
        self.max_frac = max_frac
        self.prev_rate = None
        self._hits = 0
        self._total = 0
        self.moves = 0

    def observe(self, hit: int, total: int) -> bool:
        """Counts one request; returns True when the window fraction changed."""
        self._hits += hit
        self._total += total
        if self._total < self.period:
            return False
        rate = self._hits / self._total
        self._hits = self._total = 0
        prev, self.prev_rate = self.prev_rate, rate
        if prev is None:
            amount = self.step
        else:
            change = rate - prev
            amount = self.step if change >= 0 else -self.step
            if abs(change) >= self.restart:
                self.step = self.full_step if amount >= 0 else -self.full_step
            else:
                self.step = self.decay * amount
        old = self.frac
        self.frac = min(self.max_frac, max(self.min_frac, old + amount))
        if self.frac == old and amount:
            self.step = -self.step  # pinned at a bound: probe the other way next period
            return False
        self.moves += 1
        return True
