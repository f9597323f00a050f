"""benchmarks.thrash: the workload's sizes and phases (the live run itself is the benchmark: RESULTS.md)."""

import itertools

from benchmarks.thrash import PhaseReport, RECURRING, markdown, schedule, workload


def words(texts):
    return sum(len(t.split()) for t in texts)


def test_the_thrash_phase_is_three_pools_and_the_fit_phases_fit():
    recurring, loop = workload(0, 2000)
    assert len(recurring) == RECURRING and words(recurring) <= 0.5 * 2000
    assert 2.8 * 2000 <= words(recurring) + words(loop) <= 3 * 2000
    assert len(set(loop)) == len(loop) and not set(loop) & set(recurring)


def test_phases_schedule_what_they_say():
    recurring, loop = workload(1, 1000)
    fit = list(itertools.islice(schedule("fit", recurring, loop), 8))
    assert all(is_recurring for _, is_recurring in fit) and [p for p, _ in fit[:4]] == recurring
    thrash = list(itertools.islice(schedule("thrash", recurring, loop), 30))
    flags = [is_recurring for _, is_recurring in thrash]
    assert flags[:6] == [False, False, True, False, False, True]
    # between two uses of one recurring prefix: more than a pool of other prompts (LRU loses it)
    first = [i for i, (p, _) in enumerate(thrash) if p == recurring[0]][:2]
    between = thrash[first[0] + 1:first[1]]
    assert words(p for p, _ in between) > 1000


def test_the_report_leaves_stock_signals_blank():
    rows = markdown([PhaseReport("stock", "fit", 3, 0.5, 0.4, None, None, None),
                     PhaseReport("tiered", "thrash", 3, 0.9, 0.3, 0.75, True, 120.0)])
    assert "| stock | fit | 3 | 0.500 | 0.400 | - | - | - |" in rows
    assert "| tiered | thrash | 3 | 0.900 | 0.300 | 0.75 | True | 120 |" in rows


def test_ttft_cdf_plot_is_a_png(tmp_path):
    from benchmarks.plots import plot_ttft_cdf

    path = plot_ttft_cdf({"stock": [120.0, 80.0, 300.0], "tiered": [40.0, 60.0]}, str(tmp_path / "cdf.png"))
    assert open(path, "rb").read()[:8] == b"\x89PNG\r\n\x1a\n"
