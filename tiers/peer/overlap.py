"""Page checksums computed while the pages move: on worker threads unless the machine is saturated.

A large batch of pages moves as a few prepared transfers ("runs") of about `CHUNK_BYTES` each. While run
k+1 is in flight (a NIXL READ into the host pool, or a WRITE to the peer) the checksums of run k are
computed by a small pool of hashing threads: xxhash releases the GIL while it hashes, and so does NIXL
while it copies. A run is cut into slices of about `HASH_SLICE_BYTES`; the threads take them from the
front, the caller from the back, each slice once. The caller takes what is left of run k after run k+1
has moved (the bytes are still in cache), and after the last move it hashes the last run from the back
while a thread hashes it from the front: measured on the 2-core machine, a 32 MiB get of 1 MiB pages
spent 1.0 ms hashing after its last READ with the caller alone and 0.8 ms with the two meeting. One pool
job per run and thread (not one per slice): an offer costs one submit (16 submits were 0.13 ms between
two READs), and a thread that is slow to be scheduled leaves the run to the caller.

xxhash releases the GIL only while it hashes more than 64 KiB in one update (`GIL_RELEASED_ABOVE`): a
page of 64 KiB or less holds it. Hashing threads still overlap such pages with the next move (NIXL releases
the GIL while it copies), but a thread holding the GIL keeps it until the interpreter's switch interval
(5 ms) makes it let go, so the mover, back from its copy, waited: a 16 MiB READ's call took 4.8 ms instead
of 2.5 (64 KiB pages, 2-core machine). So with `gil_bound` a thread hands the GIL over after each slice
(`time.sleep(0)`): 32 MiB gets of 64 KiB pages took 13.0-14.3 ms against 14.0-16.0 without (four runs, 31
gets each, alternating in one process). Larger pages need no hand-over: their hash lets go of the GIL.

On a saturated machine (`saturated`, from the load average) the threads wait for a core while the caller
waits for them: measured on the shared 2-core machine, a 32 MiB get of 1 MiB pages took 14.6-22 ms with
hashing threads (1 or 2) and 12.6 ms without at load 5.6, but 7.3-7.8 ms with one thread and 8.7-9.2 ms
without at load 1.6 (64 KiB pages: 10.3-10.9 against 11.9-12.6 ms).
There the caller hashes each run itself, right after it moves.

If a transfer fails or the deadline passes, no slice is taken any more, and the ones being hashed are
waited for before the error propagates: a hash reads the caller's memory, which the caller may reuse
once we return (bounded work: one slice at most per hashing thread).

Thread-safe: the hashing pool is process-wide and created on first use; its threads only ever run bounded
hashing work (Python joins them at exit).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

from transfer.base import TransferTimeout, remaining

CHUNK_BYTES = 16 << 20  # per prepared transfer: each has a fixed cost (2-16 MiB runs lost to 16 MiB ones)
HASH_SLICE_BYTES = 1 << 20  # per hashing job: one run is hashed by several threads at once
HASH_THREADS = max(1, min(4, (os.cpu_count() or 2) - 1))  # one core is the mover's
GIL_RELEASED_ABOVE = 64 << 10  # xxhash's XXHASH_GIL_MINSIZE: a shorter update holds the GIL while it hashes
SATURATED_LOAD_PER_CORE = 1.5  # threads won at a load of 0.8-1.2 per core here, and lost at 2.8


def saturated() -> bool:
    """Whether the machine is too busy for hashing threads to get a core (1-minute load average per core;
    True if the load is unknown)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return True
    return load >= SATURATED_LOAD_PER_CORE * (os.cpu_count() or 1)


_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def _hash_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=HASH_THREADS, thread_name_prefix="peer-hash")
        return _pool


def chunks(items: Sequence[int], item_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> List[List[int]]:
    """`items` cut, in order, into runs of about `chunk_bytes` (at least one item each)."""
    per = max(1, chunk_bytes // max(1, item_bytes))
    return [list(items[i : i + per]) for i in range(0, len(items), per)]


def move_and_hash(
    runs: Sequence[Sequence[int]],
    move: Callable[[Sequence[int]], None],
    checksum: Callable[[int], str],
    deadline: float,
    hash_first: bool,
    slice_items: int = 1,
    threads: bool = True,
    gil_bound: bool = False,
) -> List[List[str]]:
    """For each run in order: `move(run)`, and `checksum(i)` of each item of the run, overlapped.

    `hash_first=False` (a read): a run is offered for hashing once it has moved. `hash_first=True` (a
    write): a run is offered before it moves. `threads=False`: the caller hashes everything itself, each
    run right after its move. `gil_bound` (the hash holds the GIL): hashing threads hand it over after
    each slice. Returns the checksums, run by run; raises what
    `move` raised, or `TransferTimeout` if hashing is not done by `deadline`."""
    jobs = _Jobs(checksum, hand_over=gil_bound)
    try:
        for k, run in enumerate(runs):
            if hash_first:
                jobs.offer(k, run, slice_items, to_pool=threads)
            move(run)
            if not hash_first:
                jobs.offer(k, run, slice_items, to_pool=threads)
            jobs.help(upto=k if hash_first or not threads else k - 1)
        jobs.help(upto=len(runs))
        _, late = wait(jobs.futures, timeout=max(0.0, remaining(deadline)))
        if late:
            raise TransferTimeout(f"checksums of {len(late)} run(s) not done by the deadline")
        for f in jobs.futures:
            f.result()  # re-raises what a hashing thread raised
        return [[c for part in jobs.sums[k] for c in part] for k in range(len(runs))]
    except BaseException:
        jobs.stop()  # a thread finishes the slice it hashes, then takes no more
        wait(jobs.futures)  # the running ones read caller memory: finish before the caller reuses it
        raise


class _Jobs:
    """Runs offered for hashing in slices, each slice taken once: a pool job drains its run from the front,
    the caller's `help` from the back (module notes). Guarded by `_lock`: which slices are left, `_stopped`."""

    def __init__(self, checksum: Callable[[int], str], hand_over: bool = False):
        self._checksum = checksum
        self._hand_over = hand_over  # a thread lets go of the GIL after each slice (module notes)
        self._lock = threading.Lock()
        self._left: Dict[int, Deque[Tuple[int, Sequence[int]]]] = {}  # run -> (slice, items) not taken yet
        self._stopped = False
        self.sums: Dict[int, List[List[str]]] = {}  # run -> checksums, slice by slice
        self.futures: List[Future] = []

    def offer(self, k: int, run: Sequence[int], slice_items: int, to_pool: bool = True) -> None:
        """Offer run k in slices of `slice_items` (several threads can then hash one large run); with
        `to_pool` false, only to the caller's `help`."""
        parts = [run[i : i + slice_items] for i in range(0, len(run), max(1, slice_items))]
        self.sums[k] = [[] for _ in parts]
        with self._lock:
            self._left[k] = deque(enumerate(parts))
        if to_pool:
            pool = _hash_pool()
            self.futures.extend(pool.submit(self._drain, k) for _ in range(min(HASH_THREADS, len(parts))))

    def _take(self, k: int, from_front: bool) -> bool:
        with self._lock:
            left = self._left.get(k)
            if self._stopped or not left:
                return False
            j, items = left.popleft() if from_front else left.pop()
        self.sums[k][j] = [self._checksum(i) for i in items]
        return True

    def _drain(self, k: int) -> None:
        while self._take(k, from_front=True):
            if self._hand_over:
                time.sleep(0)  # a waiting mover gets the GIL now, not at the next switch interval

    def help(self, upto: int) -> None:
        with self._lock:
            ready = sorted(k for k, left in self._left.items() if left and k <= upto)
        for k in ready:
            while self._take(k, from_front=False):
                pass

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
