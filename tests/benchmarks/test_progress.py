"""benchmarks.progress: rows, rate and ETA on a terminal; nothing when not a terminal or under --json."""

import io

import pytest

from benchmarks import progress
from benchmarks.progress import Progress, format_duration, track
from tiers.clock import ManualClock


class Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def not_quiet(monkeypatch):
    monkeypatch.setattr(progress, "_quiet", False)


def test_a_terminal_shows_rows_rate_and_eta():
    clock, out = ManualClock(), Terminal()
    bar = Progress("replay", total=100, unit="requests", stream=out, clock=clock)
    clock.advance(10)
    bar.update(25)
    assert bar.line() == "replay: 25/100 requests, 2.5/s, 0:10 elapsed, ETA 0:30"
    assert out.getvalue().endswith(bar.line())
    bar.close()
    assert out.getvalue().endswith("\n")


def test_redraws_are_rate_limited_but_the_last_row_is_drawn():
    clock, out = ManualClock(), Terminal()
    bar = Progress("sweep", total=3, stream=out, clock=clock)
    bar.update()
    bar.update()  # same instant: not redrawn
    assert out.getvalue().count("\r") == 1
    bar.update()  # the total: drawn
    assert out.getvalue().count("\r") == 2 and "3/3" in out.getvalue()


def test_nothing_is_written_when_not_a_terminal_or_quiet(monkeypatch):
    piped = io.StringIO()
    list(track(range(5), "x", enabled=None))  # stderr under pytest is not a terminal
    bar = Progress("x", total=5, stream=piped)
    bar.update(5)
    bar.close()
    assert piped.getvalue() == ""
    monkeypatch.setattr(progress, "_quiet", True)
    quiet = Terminal()
    bar = Progress("x", total=5, stream=quiet)
    bar.update(5)
    bar.close()
    assert quiet.getvalue() == ""


def test_without_a_total_there_is_no_eta():
    clock = ManualClock()
    bar = Progress("soak", unit="requests", stream=Terminal(), clock=clock)
    clock.advance(3725)
    bar.update(10)
    assert bar.line() == "soak: 10 requests, 0.0/s, 1:02:05 elapsed"
    assert format_duration(59.6) == "1:00"


def test_json_makes_the_cli_quiet(monkeypatch):
    from benchmarks.__main__ import main

    main(["cost", "--profile", "llama3-8b-h200", "--json"])
    assert progress._quiet is True
