"""heap_trim: the interval from the environment, the loop's calls, and glibc's malloc_trim found here."""

import threading

import pytest

from sglang_ext import heap_trim


class CountedStop:
    """An Event stand-in: `wait` says "not stopped" `rounds` times, then "stopped" (no real waiting)."""

    def __init__(self, rounds):
        self.rounds, self.waits = rounds, []

    def wait(self, timeout):
        self.waits.append(timeout)
        return len(self.waits) > self.rounds


def test_the_loop_trims_once_per_interval_until_stopped():
    calls = []
    stop = CountedStop(rounds=3)
    assert heap_trim.trim_loop(lambda pad: calls.append(pad) or 1, 7.5, stop) == 3
    assert calls == [0, 0, 0] and stop.waits == [7.5] * 4


@pytest.mark.parametrize("raw, expected", [(None, heap_trim.DEFAULT_INTERVAL_S), ("12", 12.0), ("0.5", 0.5),
                                           ("0", 0.0), ("-3", 0.0), ("nan", 0.0), ("inf", 0.0), ("soon", 0.0)])
def test_the_interval_is_a_positive_number_of_seconds_or_off(raw, expected):
    environ = {} if raw is None else {heap_trim.ENV_INTERVAL: raw}
    assert heap_trim.interval_from_env(environ) == expected


def test_glibc_malloc_trim_is_found_and_callable():
    trim = heap_trim.libc_trim()
    assert trim is not None  # this project's machines run glibc
    assert trim(0) in (0, 1)  # 1: memory was given back, 0: none could be


@pytest.mark.parametrize("raw, loops", [("12", 1), ("0", 0)])
def test_a_process_starts_one_trimmer_at_most_and_none_when_off(monkeypatch, raw, loops):
    started, fake_trim = [], lambda pad: 1
    monkeypatch.setattr(heap_trim, "_started", False)
    monkeypatch.setenv(heap_trim.ENV_INTERVAL, raw)
    monkeypatch.setattr(heap_trim, "libc_trim", lambda: fake_trim)
    monkeypatch.setattr(heap_trim, "trim_loop", lambda trim, interval, stop: started.append((trim, interval)))
    for _ in range(3):  # every scheduler build in the process calls it
        heap_trim.start_from_env()
    for t in threading.enumerate():
        if t.name == "sglang_ext-heap-trim":
            t.join(10)  # the stand-in loop returns at once: every trimmer started has run by now
    assert started == [(fake_trim, 12.0)] * loops
