"""tiers.keys: the model revision that scopes peer keys, a tree entry's policy key; and it holds nothing the
serving path does not use."""

import ast
import os
import subprocess
import sys
from pathlib import Path

from tiers.keys import path_key, weights_revision

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


_CHILD_KEYS = "[((None, 't3'), 17), (('lora-a', 't3'), 17), ('lora-a', 17), 17, (17, 18), ((None, 't4'), 17)]"


def _path_keys_in_a_process(hash_seed: str) -> str:
    code = f"from tiers.keys import path_key; print([path_key(5, k) for k in {_CHILD_KEYS}])"
    env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_a_salted_entrys_policy_key_is_the_same_in_every_process():
    """Guards replays that depend on the process: the shadow sampler picks chains by these keys, and Python hashes
    a salt (a str) differently in each process unless the key hashes it stably."""
    assert _path_keys_in_a_process("1") == _path_keys_in_a_process("2")
    assert path_key(5, ((None, "t3"), 17)) != path_key(5, ((None, "t4"), 17)) != path_key(5, 17)
    assert path_key(5, ("lora-a", 17)) != path_key(5, (("lora-a", "t3"), 17))
