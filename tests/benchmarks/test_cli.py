"""Bad command lines fail like argparse does: exit status 2 and the offending flag named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["replay", "--trace", "conversation", "--capacity-tokens", "lots", "--policy", "lru"], "--capacity-tokens"),
        (["replay", "--trace", "conversation", "--capacity-tokens", "1e6"], "--policy"),
        (["replay", "--trace", "conversation", "--capacity-tokens", "1e6", "--policy", "nope"], "--policy"),
        (["replay", "--trace", "no-such-trace.jsonl", "--capacity-tokens", "1e6", "--policy", "lru"], "--trace"),
        (["replay", "--trace", "conversation", "--capacity-tokens", "1e6", "--policy", "lru", "--block-tokens", "0"],
         "--block-tokens"),
        (["replay", "--trace", "conversation", "--capacity-tokens", "1e6", "--policy", "lru", "--bogus"], "--bogus"),
        (["sweep", "--trace", "conversation", "--capacities", "1e6,x", "--out", "/tmp/x"], "--capacities"),
        (["sweep", "--trace", "conversation", "--capacities", "1e6", "--policies", "lru,zz", "--out", "/tmp/x"],
         "--policies"),
        (["replay", "--trace", "conversation", "--capacity-tokens", "100", "--policy", "lru"], "--capacity-tokens"),
        (["sweep", "--trace", "conversation", "--capacities", "1e6,inf", "--out", "/tmp/x"], "--capacities"),
        (["replay", "--trace", "conversation", "--capacity-tokens", "1e6", "--policy", "lru", "--lower-policy", "opt"],
         "--lower-policy"),
        (["cost", "--profile", "no-such-profile"], "--profile"),
        (["generate", "chat", "--seed", "x", "--out", "/tmp/x"], "--seed"),
        (["generate", "chat", "--seed", "1", "--out", "/tmp/x", "--arrivals", "gamma"], "--arrivals"),
        (["generate", "coding-agent", "--seed", "1", "--out", "/tmp/x", "--think-s", "0"], "--think-s"),
        (["generate", "chat", "--seed", "1", "--out", "/tmp/x", "--rate", "nan"], "--rate"),
        (["generate", "tenants", "--seed", "1", "--out", "/tmp/x", "--ttl", "0"], "--ttl"),
        (["generate", "tenants", "--seed", "1", "--out", "/tmp/x", "--ttl", "1e9"], "--ttl"),
        (["generate", "rag", "--seed", "1", "--out", "/tmp/x", "--zipf", "inf"], "--zipf"),
        (["replay", "--trace", "conversation", "--capacity-tokens", "1e6", "--policy", "lru", "--shadow-rate", "1.5"],
         "--shadow-rate"),
        (["replay", "--trace", "conversation", "--capacity-tokens", "1e6", "--policy", "lru", "--shadow-rate", "nan"],
         "--shadow-rate"),
        (["replay", "--trace", "conversation", "--capacity-tokens", "1e6", "--policy", "lru", "--shadow-seed", "-1"],
         "--shadow-seed"),
        (["replay", "--trace", "conversation", "--capacity-tokens", "1e6", "--policy", "lru", "--shadow-seed",
          str(2**32)], "--shadow-seed"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


def test_module_entry_point_reports_bad_flags():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "replay", "--trace", "conversation",
                           "--capacity-tokens", "-5", "--policy", "lru"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "--capacity-tokens" in proc.stderr
