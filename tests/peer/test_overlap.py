"""Checksums computed while pages move (tiers/peer/overlap.py), without a peer: runs and items are numbers.

Guards: each item is hashed exactly once when a hashing thread and the caller share a run (the thread
from the front, the caller from the back); a failed move stops every hasher after the slice it is on, and
the error reaches the caller only once that slice is done (it reads memory the caller may then reuse); on
a saturated machine the pool is never used. Events order the threads, never sleeps.
"""

from __future__ import annotations

import threading

import pytest

from tiers.peer import overlap
from transfer.base import deadline_in


@pytest.mark.parametrize("gil_bound", [False, True], ids=["hash-releases-the-gil", "threads-hand-the-gil-over"])
def test_a_thread_and_the_caller_meet_in_a_run_and_hash_each_item_once(monkeypatch, gil_bound):
    """The last run: the thread takes its first item and waits there until the caller (which first waits
    for the thread to be on it) has hashed the run's last item."""
    monkeypatch.setattr(overlap, "HASH_THREADS", 1)  # one pool job per run
    runs = [[0, 1, 2, 3], [4, 5, 6, 7, 8, 9]]
    by, order = {}, []
    lock = threading.Lock()
    thread_on_front, caller_on_back = threading.Event(), threading.Event()

    def checksum(i):
        mine = threading.current_thread() is threading.main_thread()
        if i == 4 and not mine:
            thread_on_front.set()
            assert caller_on_back.wait(10), "the caller never hashed the back of the last run"
        if i == 9 and mine:
            assert thread_on_front.wait(10), "no thread took the front of the last run"
        with lock:
            assert i not in by, f"item {i} hashed twice"
            by[i] = "caller" if mine else "thread"
            order.append(i)
        if i == 9 and mine:
            caller_on_back.set()
        return f"c{i}"

    sums = overlap.move_and_hash(runs, lambda run: None, checksum, deadline=deadline_in(30), hash_first=False,
                                 slice_items=1, threads=True, gil_bound=gil_bound)
    assert sums == [[f"c{i}" for i in run] for run in runs]
    assert sorted(by) == list(range(10))
    last = [by[i] for i in runs[1]]
    assert last[0] == "thread" and last[-1] == "caller"  # front by a thread, back by the caller
    assert last == sorted(last, key=lambda who: who == "caller")  # one meeting point, not interleaved
    assert [i for i in order if i >= 4 and by[i] == "caller"][0] == 9  # the caller starts at the back


def test_a_failed_move_stops_the_hashers_and_waits_for_the_slice_in_hand(monkeypatch):
    started, release = threading.Event(), threading.Event()
    hashed, finished = [], []

    def checksum(i):
        hashed.append(i)
        if i == 0:
            started.set()
            assert release.wait(10)
        finished.append(i)
        return f"c{i}"

    def move(run):
        if run[0] == 4:
            assert started.wait(10)  # a thread is inside the first slice of run 0
            raise OSError("the transfer failed")

    real_stop = overlap._Jobs.stop

    def stop_then_release(self):
        real_stop(self)
        release.set()  # only now may the thread finish its slice and look for another

    monkeypatch.setattr(overlap._Jobs, "stop", stop_then_release)
    with pytest.raises(OSError, match="transfer failed"):
        overlap.move_and_hash([[0, 1, 2, 3], [4, 5]], move, checksum, deadline=deadline_in(30), hash_first=False,
                              slice_items=1, threads=True)
    assert finished == [0]  # the slice in hand was done before the error came back
    assert hashed == [0]  # and nobody took another


def test_the_caller_hashes_alone_on_a_saturated_machine(monkeypatch):
    def no_pool():
        raise AssertionError("the hashing pool was used")

    monkeypatch.setattr(overlap, "_hash_pool", no_pool)
    moved, runs = [], [[0, 1], [2], [3, 4]]
    for hash_first in (False, True):
        sums = overlap.move_and_hash(runs, moved.append, lambda i: f"c{i}", deadline=float("inf"),
                                     hash_first=hash_first, threads=False)
        assert sums == [["c0", "c1"], ["c2"], ["c3", "c4"]]
    assert moved == runs + runs
