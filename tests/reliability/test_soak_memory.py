"""The soak's memory report: slopes over the last half of the run, the bounded series, process names."""

import pytest

from benchmarks.soak_memory import (BoundedSeries, RssSample, last_half_slopes, ols_slope, process_name,
                                    series_by_process)

MB = 1 << 20


def samples(rss_at, n=20, step_s=5.0, requests_per_s=2.0, server_pid=lambda t: 100, peer_pid=lambda t: 200):
    """n samples; rss_at(t) -> {name: bytes}."""
    return [RssSample(t_s=i * step_s, requests=int(i * step_s * requests_per_s), server_pid=server_pid(i * step_s),
                      peer_pid=peer_pid(i * step_s), rss=rss_at(i * step_s)) for i in range(n)]


def test_ols_slope_of_a_line_and_of_a_constant():
    assert ols_slope([0, 1, 2, 3], [5, 7, 9, 11]) == pytest.approx(2.0)
    assert ols_slope([0, 1, 2, 3], [0, 3, 1, 4]) == pytest.approx(1.0)  # a fit over every point, not the ends
    assert ols_slope([0, 1, 2, 3], [4, 4, 4, 4]) == 0.0
    assert ols_slope([1], [3]) == 0.0
    assert ols_slope([2, 2], [1, 5]) == 0.0  # no spread in x: no slope


def test_warm_up_growth_that_stops_has_a_flat_last_half():
    # +40 MB/s for the first 30 s (pool pages touched for the first time), then flat
    s = samples(lambda t: {"scheduler": 500 * MB + int(min(t, 30.0) * 40 * MB)}, n=20)  # t = 0 .. 95 s
    per_s, per_request = last_half_slopes(s)
    assert per_s["scheduler"] == 0.0
    assert per_request["scheduler"] == 0.0


def test_a_per_request_leak_shows_in_bytes_per_second_and_per_request():
    leak = 64 * 1024  # bytes per request; 2 requests/s
    s = samples(lambda t: {"scheduler": 500 * MB + int(min(t, 30.0) * 40 * MB) + int(t * 2) * leak})
    per_s, per_request = last_half_slopes(s)
    assert per_s["scheduler"] == pytest.approx(2 * leak, rel=1e-6)
    assert per_request["scheduler"] == pytest.approx(leak, rel=1e-6)


def test_slopes_use_only_the_last_server_and_the_last_peer():
    # the server was swapped at 60 s (a fault): the new one starts lower and stays flat; the peer was
    # restarted at 70 s and is flat since
    s = samples(lambda t: {"scheduler": (900 if t < 60 else 600) * MB, "peer": (300 if t < 70 else 100) * MB},
                server_pid=lambda t: 100 if t < 60 else 101, peer_pid=lambda t: 200 if t < 70 else 201)
    per_s, _ = last_half_slopes(s)
    assert per_s == {"scheduler": 0.0, "peer": 0.0}


def test_no_samples_no_slopes():
    assert last_half_slopes([]) == ({}, {})


def test_the_series_stays_bounded_and_evenly_spaced():
    series = BoundedSeries(interval_s=5.0, max_samples=10)
    interval, t = 5.0, 0.0
    for i in range(200):  # a run 20 times longer than the series holds at the first interval
        interval = series.add(RssSample(t, i, 1, 2, {"server": i}))
        assert len(series.samples) <= 10
        gaps = {b.t_s - a.t_s for a, b in zip(series.samples, series.samples[1:])}
        assert gaps <= {interval}  # evenly spaced, at the interval in use
        t += interval
    assert interval > 5.0 and series.samples[0].t_s == 0.0  # the start of the run is kept
    assert series.samples[-1].requests == 199  # and the latest sample


def test_series_by_process_reports_each_process_and_the_request_count():
    s = samples(lambda t: {"scheduler": 1, "server": 3}, n=3)
    out = series_by_process(s)
    assert out["requests"] == [(0.0, 0), (5.0, 10), (10.0, 20)]
    assert out["scheduler"] == [(0.0, 1), (5.0, 1), (10.0, 1)] and len(out["server"]) == 3


def test_processes_are_named_by_their_title():
    assert process_name("sglang::scheduler", is_root=False) == "scheduler"
    assert process_name("sglang::detokenizer   ", is_root=False) == "detokenizer"
    assert process_name("/x/python -m sglang_ext.launch_server --port 1", is_root=True) == "tokenizer"
    assert process_name("/x/python -c pass", is_root=False) == "other"
