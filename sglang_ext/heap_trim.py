"""Give freed heap memory back to the system: glibc's `malloc_trim(0)` every `SGLANG_EXT_MALLOC_TRIM_S` seconds.

Why: a scheduler on CPU allocates and frees tensors of every batch shape through glibc malloc. Freed chunks in
the middle of a heap stay resident (only the top of a heap is returned on free), so the process's RSS climbs
with traffic although its live memory barely grows. Measured in a 420-s soak (benchmarks/RESULTS.md, "Memory
over time"): each `malloc_trim(0)` every 30 s gave back 60-90 MiB of the scheduler's RSS in 12-18 ms, and what
stayed flattened within minutes. `malloc_trim(0)` walks every arena and returns whole free pages inside them
(madvise); allocator settings did not help (soaks side by side with `MALLOC_MMAP_THRESHOLD_` and
`MALLOC_TRIM_THRESHOLD_` fixed, or with `MALLOC_ARENA_MAX=2`, grew as fast as the default).

The trimmer is one daemon thread in each scheduler process that builds the `tiered` backend (plugin.py; a
stock server is left as it is); off with `SGLANG_EXT_MALLOC_TRIM_S=0`, and a no-op where the C library has no
`malloc_trim` (not glibc). Each call holds one arena's lock at a time, so an allocating thread can wait for
it: milliseconds every interval. Never raises.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import Callable, Optional

logger = logging.getLogger(__name__)

ENV_INTERVAL = "SGLANG_EXT_MALLOC_TRIM_S"
DEFAULT_INTERVAL_S = 30.0

_started = False
_lock = threading.Lock()


def interval_from_env(environ=os.environ) -> float:
    """Seconds between trims; 0 (off) for `0` or a value that is not a positive number (logged)."""
    raw = environ.get(ENV_INTERVAL)
    if raw is None:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        if raw.strip() != "0":
            logger.warning("%s=%r is not a positive number of seconds: heap trimming is off", ENV_INTERVAL, raw)
        return 0.0
    return value


def libc_trim() -> Optional[Callable[[int], int]]:
    """glibc's malloc_trim, or None where the C library has none."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim_loop(trim: Callable[[int], int], interval_s: float, stop: threading.Event) -> int:
    """Call `trim(0)` every `interval_s` until `stop` is set; returns how many calls were made."""
    calls = 0
    while not stop.wait(interval_s):
        trim(0)
        calls += 1
    return calls


def start_from_env() -> None:
    """Start this process's trimmer once, unless it is off or unavailable; never raises."""
    global _started
    try:
        with _lock:
            if _started:
                return
            _started = True
        interval = interval_from_env()
        trim = libc_trim() if interval > 0 else None
        if trim is None:
            return
        threading.Thread(target=trim_loop, args=(trim, interval, threading.Event()), name="sglang_ext-heap-trim",
                         daemon=True).start()
    except Exception as e:  # a memory aid must not stop a server
        logger.warning("heap trimming not started: %s", e)
