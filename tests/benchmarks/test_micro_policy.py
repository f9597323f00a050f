"""micro_policy: one row per policy, paired ratios against stock LRU, a clear error for a bad flag."""

import pytest

from benchmarks.micro_policy import main
from tiers.policy import policy_names


def test_every_policy_gets_a_row_with_its_ratio_to_stock_lru(capsys):
    main(["--requests", "150", "--capacity-tokens", "2e4", "--rounds", "2"])
    out = capsys.readouterr().out
    assert "median of 2 rounds" in out
    rows = {line.split("|")[1].strip(): line.split("|")[3].strip() for line in out.splitlines()
            if line.startswith("| stock") or line.startswith("| tiers")}
    assert rows["stock RadixCache lru (evict)"] == "1.00"  # the baseline, paired with itself in every round
    for name in policy_names():
        assert float(rows[f"tiers {name} (all policy calls)"]) > 0
    signals = [line for line in out.splitlines() if line.startswith("| operator signals")]
    assert len(signals) == 1 and float(signals[0].split("|")[3]) > 0
    assert "Operator signals: " in out and "% of the served cache's own time" in out


def test_rounds_must_be_positive(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--rounds", "0"])
    assert e.value.code == 2
    assert "--rounds must be positive" in capsys.readouterr().err


def test_a_run_without_evictions_is_refused_not_divided_by_zero(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--requests", "5", "--capacity-tokens", "1e9", "--rounds", "1"])
    assert e.value.code == 2
    assert "no baseline" in capsys.readouterr().err
