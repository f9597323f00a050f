"""tiers.keys: the model revision that scopes peer keys; and it holds nothing the serving path does not use."""

import ast
import os
from pathlib import Path

from tiers.keys import weights_revision

ROOT = Path(__file__).resolve().parents[2]


def test_weights_revision_changes_when_weights_are_rewritten_in_place(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x01" * 64)
    (tmp_path / "config.json").write_text("{}")
    os.utime(weights, ns=(1_000_000_000, 1_000_000_000))
    first = weights_revision(str(tmp_path))
    assert first and weights_revision(str(tmp_path)) == first  # stable while nothing changes
    weights.write_bytes(b"\x02" * 64)  # same path, same size, new bytes and a new modification time
    os.utime(weights, ns=(2_000_000_000, 2_000_000_000))
    assert weights_revision(str(tmp_path)) != first
    assert weights_revision(str(tmp_path / "no-such-dir")) == ""


def test_every_public_helper_in_keys_is_used_outside_the_tests():
    tree = ast.parse((ROOT / "tiers" / "keys.py").read_text())
    public = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]
    sources = [p.read_text() for d in ("sglang_ext", "tiers", "benchmarks", "transfer") for p in (ROOT / d).rglob("*.py")
               if p.name != "keys.py"]
    unused = [name for name in public if not any(name in text for text in sources)]
    assert not unused, f"tiers/keys.py helpers no serving or benchmark code uses: {unused}"
