"""`python -m sglang_ext.patches check|apply`: the project's patch set against the pinned SGLang.

`patches/series` lists unified diffs (paths relative to site-packages, `a/sglang/...`). Each patch opens with
a header: Subject, Why, How, Upstream, Drop-when, and a `Files:` block giving every touched file's sha256
before (`original=`) and after (`patched=`). Before changing anything the tool checks the installed SGLang
version and every file's hash: a file must be exactly original (to patch) or exactly patched (already done).
Anything else is refused with a message and nothing is written, so `apply` is idempotent and never patches
a tree it does not know.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from sglang_ext.compat import PINNED_SGLANG

PATCH_DIR = Path(__file__).resolve().parent.parent / "patches"
_FILE_LINE = re.compile(r"^\s+(\S+)\s+original=([0-9a-f]{64})\s+patched=([0-9a-f]{64})\s*$")


class PatchError(Exception):
    pass


@dataclass(frozen=True)
class PatchedFile:
    path: str
    original: str
    patched: str


@dataclass(frozen=True)
class Patch:
    name: str
    subject: str
    files: Tuple[PatchedFile, ...]
    text: str


@dataclass(frozen=True)
class PatchState:
    patch: Patch
    state: str  # "applied" | "pending"


def sglang_root() -> Path:
    """The site-packages directory holding `sglang/` (found without importing sglang)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("sglang is not installed in this environment")
    return Path(list(spec.submodule_search_locations)[0]).parent


def load_series(patch_dir: Path = PATCH_DIR) -> List[Patch]:
    series = patch_dir / "series"
    names = [ln.strip() for ln in series.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return [parse_patch(patch_dir / name) for name in names]


def parse_patch(path: Path) -> Patch:
    text = path.read_text()
    header = text.split("\n--- a/", 1)[0]
    subject = next((ln[len("Subject:"):].strip() for ln in header.splitlines() if ln.startswith("Subject:")), "")
    files = tuple(PatchedFile(*m.groups()) for m in map(_FILE_LINE.match, header.splitlines()) if m)
    missing = [f for f in ("Why:", "How:", "Upstream:", "Drop-when:") if f not in header]
    if not subject or not files or missing:
        raise PatchError(f"{path.name}: header needs Subject, Why, How, Upstream, Drop-when and Files ({missing})")
    touched = set(re.findall(r"^\+\+\+ b/(\S+)", text, flags=re.M))
    if touched != {f.path for f in files}:
        raise PatchError(f"{path.name}: Files block {sorted(f.path for f in files)} != diff {sorted(touched)}")
    return Patch(path.name, subject, files, text)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def inspect(patches: List[Patch], root: Path, version: Optional[str] = None) -> List[PatchState]:
    """The state of every patch, or PatchError if the tree is not one this patch set knows."""
    version = version or importlib.metadata.version("sglang")
    if version != PINNED_SGLANG:
        raise PatchError(f"installed sglang is {version}; this patch set is for sglang=={PINNED_SGLANG}")
    states = []
    for patch in patches:
        seen = set()
        for f in patch.files:
            target = root / f.path
            if not target.exists():
                raise PatchError(f"{patch.name}: {f.path} does not exist under {root}")
            digest = sha256(target)
            if digest == f.original:
                seen.add("pending")
            elif digest == f.patched:
                seen.add("applied")
            else:
                raise PatchError(f"{patch.name}: {f.path} has sha256 {digest[:12]}..., neither the original "
                                 f"({f.original[:12]}...) nor the patched ({f.patched[:12]}...) file; refusing")
        if len(seen) != 1:
            raise PatchError(f"{patch.name}: partly applied (some files patched, some not); reinstall sglang")
        states.append(PatchState(patch, seen.pop()))
    return states


def apply(patches: List[Patch], root: Path, version: Optional[str] = None) -> List[PatchState]:
    """Apply every pending patch (all checks first); returns the states before applying."""
    states = inspect(patches, root, version)
    for st in states:
        if st.state == "pending":
            for args in (["--dry-run"], []):
                run = subprocess.run(["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", *args],
                                     input=st.patch.text, text=True, capture_output=True, cwd=root)
                if run.returncode != 0:
                    raise PatchError(f"{st.patch.name}: patch failed:\n{run.stdout}{run.stderr}")
            for f in st.patch.files:
                if sha256(root / f.path) != f.patched:
                    raise PatchError(f"{st.patch.name}: {f.path} does not hash as expected after patching")
    return states


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_ext.patches", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["check", "apply"])
    parser.add_argument("--root", type=Path, default=None, help="site-packages dir holding sglang/ (default: found)")
    parser.add_argument("--patch-dir", type=Path, default=PATCH_DIR)
    args = parser.parse_args(argv)
    try:
        root = args.root or sglang_root()
        patches = load_series(args.patch_dir)
        states = inspect(patches, root) if args.command == "check" else apply(patches, root)
    except PatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for st in states:
        now = "applied" if args.command == "apply" else st.state
        note = " (already)" if args.command == "apply" and st.state == "applied" else ""
        print(f"{st.patch.name}: {now}{note} - {st.patch.subject}")
    if args.command == "check" and any(st.state == "pending" for st in states):
        return 3  # known tree, not yet patched
    return 0


if __name__ == "__main__":
    sys.exit(main())
