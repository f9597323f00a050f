"""monitoring/: the alert rules pass Prometheus' own rule tests; the dashboard is well formed.

(That every series they use is exported is checked on a live server: tests/server/test_operator_signals.py.)"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

MONITORING = Path(__file__).resolve().parents[2] / "monitoring"
PROMTOOL_DEADLINE_S = 120


def promtool(*args) -> subprocess.CompletedProcess:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool is not installed (Debian: apt-get install --no-install-recommends prometheus)")
    return subprocess.run([exe, *args], cwd=MONITORING, capture_output=True, text=True, timeout=PROMTOOL_DEADLINE_S)


def test_alert_rules_are_valid_and_pass_their_unit_tests():
    check = promtool("check", "rules", "alerts.yml")
    assert check.returncode == 0, check.stdout + check.stderr
    test = promtool("test", "rules", "alerts.test.yml")
    assert test.returncode == 0, test.stdout + test.stderr


def test_dashboard_panels_each_query_something_and_do_not_overlap():
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    cells = set()
    for panel in dashboard["panels"]:
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
        g = panel["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {panel['title']!r} overlaps another"
        assert all(x < 24 for x, _ in mine)
        cells |= mine
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("hit rate", "eviction", "thrash", "churn", "cold vs capacity", "retained", "peer", "fragmentation",
                  "self-tuner"):
        assert topic in titles, topic
