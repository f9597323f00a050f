"""`python -m benchmarks.transfer_bench --json` prints one object with the documented keys (a tiny run)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import ROOT


def test_json_has_the_headline_figures_for_the_page_size_given():
    cmd = [sys.executable, "-m", "benchmarks.transfer_bench", "--json", "--page-kib", "64", "--pages", "8",
           "--repeats", "1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["page_kib"], result["pages"]) == (64, 8)
    for key in ("memcpy_gbps", "nixl_read_gbps", "peer_get_gbps"):
        assert result[key] > 0
    assert result["peer_get_ratio"] == result["peer_get_gbps"] / result["memcpy_gbps"]


def test_non_positive_sizes_are_refused():
    out = subprocess.run([sys.executable, "-m", "benchmarks.transfer_bench", "--pages", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--pages" in out.stderr
