"""The peer block server runs on a host that only lends DRAM: numpy, xxhash, psutil and nixl, no sglang, no torch."""

import subprocess
import sys

from tests.support import ROOT


def test_the_peer_package_imports_neither_sglang_nor_torch():
    code = ("import sys, tiers.peer.server, tiers.peer.client, sglang_ext.peer_server; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sglang', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
