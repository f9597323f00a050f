"""The patch tool refuses trees it does not know and is idempotent (on copies of the real SGLang files)."""

import shutil
from pathlib import Path

import pytest

from sglang_ext import patches as pt


@pytest.fixture
def pristine_tree(tmp_path):
    """A site-packages-like tree holding the pinned SGLang's original copies of every patched file."""
    root = pt.sglang_root()
    series = pt.load_series()
    for patch in series:
        for f in patch.files:
            dst = tmp_path / f.path
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(root / f.path, dst)
    # The installed tree is patched by setup.sh: reverse that on the copy to get the originals back.
    for patch in reversed(series):
        if pt.sha256(tmp_path / patch.files[0].path) == patch.files[0].patched:
            import subprocess

            subprocess.run(["patch", "-p1", "-R", "--batch", "--no-backup-if-mismatch"], input=patch.text,
                           text=True, cwd=tmp_path, check=True, capture_output=True)
    return tmp_path, series


def file_hashes(root: Path, series):
    return {f.path: pt.sha256(root / f.path) for p in series for f in p.files}


def test_every_patch_documents_why_how_upstream_and_when_to_drop():
    for patch in pt.load_series():
        header = patch.text.split("\n--- a/", 1)[0]
        for field in ("Why:", "How:", "Upstream:", "Drop-when:"):
            assert field in header, (patch.name, field)


def test_apply_patches_a_pristine_tree_then_applying_again_changes_nothing(pristine_tree):
    root, series = pristine_tree
    assert {s.state for s in pt.inspect(series, root, version="0.5.20")} == {"pending"}
    pt.apply(series, root, version="0.5.20")
    after_first = file_hashes(root, series)
    assert all(after_first[f.path] == f.patched for p in series for f in p.files)
    states = pt.apply(series, root, version="0.5.20")
    assert {s.state for s in states} == {"applied"}
    assert file_hashes(root, series) == after_first


def test_refuses_another_sglang_version_and_writes_nothing(pristine_tree):
    root, series = pristine_tree
    before = file_hashes(root, series)
    with pytest.raises(pt.PatchError, match="0.5.19"):
        pt.apply(series, root, version="0.5.19")
    assert file_hashes(root, series) == before


def test_refuses_a_file_whose_hash_differs_and_writes_nothing(pristine_tree):
    root, series = pristine_tree
    target = root / series[0].files[0].path
    target.write_text(target.read_text() + "\n# locally edited\n")
    before = file_hashes(root, series)
    with pytest.raises(pt.PatchError, match="neither the original"):
        pt.apply(series, root, version="0.5.20")
    assert file_hashes(root, series) == before


def test_cli_check_reports_the_installed_tree_as_applied(capsys):
    assert pt.main(["check"]) == 0
    assert "applied" in capsys.readouterr().out
