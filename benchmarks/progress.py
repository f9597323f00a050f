"""One progress line for long benchmark commands: rows done (of a total, when known), rate, ETA.

Shown only on a terminal: `Progress(..., enabled=None)` writes when its stream is a TTY and the command was
not given --json (`set_quiet`), so piped output, CI logs and JSON runs stay clean. Redrawn in place at most every REDRAW_S seconds;
`close()` ends the line. Time is injected (tiers.clock) so tests drive it with a ManualClock.
"""

from __future__ import annotations

import sys
from typing import Iterable, Iterator, Optional, TextIO, TypeVar

from tiers.clock import Clock, MonotonicClock

REDRAW_S = 0.2
T = TypeVar("T")
_quiet = False


def set_quiet() -> None:
    """Silence every Progress of this process (the CLI calls it for --json)."""
    global _quiet
    _quiet = True


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class Progress:
    def __init__(self, label: str, total: Optional[int] = None, unit: str = "rows", stream: TextIO = None,
                 enabled: Optional[bool] = None, clock: Clock = None):
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = (callable(isatty) and isatty() and not _quiet) if enabled is None else enabled
        self.clock = clock or MonotonicClock()
        self.done = 0
        self._start = self.clock.now()
        self._drawn: Optional[float] = None

    def line(self) -> str:
        elapsed = self.clock.now() - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
        text = f"{self.label}: {count} {self.unit}, {rate:.1f}/s, {format_duration(elapsed)} elapsed"
        if self.total and rate > 0:
            text += f", ETA {format_duration(max(0, self.total - self.done) / rate)}"
        return text

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        now = self.clock.now()
        if self._drawn is None or now - self._drawn >= REDRAW_S or (self.total and self.done >= self.total):
            self._drawn = now
            self.stream.write("\r\x1b[K" + self.line())
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._drawn is not None:
            self.stream.write("\r\x1b[K" + self.line() + "\n")
            self.stream.flush()
            self._drawn = None


def track(items: Iterable[T], label: str, total: Optional[int] = None, enabled: Optional[bool] = None,
          unit: str = "rows") -> Iterator[T]:
    """Iterate `items`, counting each on a Progress line (closed when the iteration ends or is abandoned)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    bar = Progress(label, total, unit, enabled=enabled)
    try:
        for item in items:
            yield item
            bar.update()
    finally:
        bar.close()
