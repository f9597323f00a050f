"""Loading request traces: the Mooncake JSONL format, plus the optional fields our generators add.

Each row: `timestamp` (ms), `input_length`, `output_length`, `hash_ids` (one id per `block_tokens`-token block,
prefix-chained: two rows share block i only if they share every block before it). Generated rows may add
`session` (str), `ttl_s` (float, the row's cache_control TTL), `tenant` (str) and `priority` (int).

The chaining is checked: a block id that follows two different parents (or starts one row and follows a block in
another) is an error naming the row, since a trace that breaks it would make OPT and the infinite-cache bound
count hits no radix cache could have.

Every (tenant, hash id) pair is interned to one small integer, in first-seen order: that integer is the single
radix token standing for the block, so the real radix tree sees the real prefix structure (one node edge per
block), and tenants can never share a block even if a file reuses hash ids across tenants.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

PROJECT_ROOT = Path(__file__).resolve().parent.parent
TRACES_DIR = PROJECT_ROOT.parent / "shared" / "traces"
SHORT_NAMES = {"conversation": "mooncake_conversation.jsonl", "synthetic": "mooncake_synthetic.jsonl"}


@dataclass(frozen=True)
class Request:
    index: int
    time_s: float
    input_length: int
    output_length: int
    blocks: Tuple[int, ...]  # interned radix token ids, one per block
    last_block_tokens: int  # the last block may be partial
    session: Optional[str] = None
    ttl_s: Optional[float] = None
    tenant: Optional[str] = None
    priority: int = 0

    def hit_tokens(self, hit_blocks: int, block_tokens: int) -> int:
        """Prompt tokens covered by the first `hit_blocks` blocks."""
        if hit_blocks >= len(self.blocks):
            return self.input_length
        return hit_blocks * block_tokens

    def block_size(self, i: int, block_tokens: int) -> int:
        return self.last_block_tokens if i == len(self.blocks) - 1 else block_tokens


@dataclass(frozen=True)
class Trace:
    path: str
    block_tokens: int
    requests: Tuple[Request, ...]

    @property
    def total_input_tokens(self) -> int:
        return sum(r.input_length for r in self.requests)


def resolve_trace_path(name: str) -> Path:
    """A path as given if it exists; else a short name or file name under the shared traces folder."""
    p = Path(name)
    if p.exists():
        return p
    candidate = TRACES_DIR / SHORT_NAMES.get(name, name)
    if candidate.exists():
        return candidate
    raise FileNotFoundError(f"trace {name!r} not found (looked at {p} and {candidate})")


def load_trace(name: str, block_tokens: int = 512, limit: Optional[int] = None) -> Trace:
    path = resolve_trace_path(name)
    rows = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if limit is not None and len(rows) >= limit:
                break
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e})") from None
    return parse_rows(rows, block_tokens, source=str(path))


def parse_rows(rows: Sequence[dict], block_tokens: int = 512, source: str = "<rows>") -> Trace:
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    intern: Dict[Hashable, int] = {}
    parents: Dict[int, tuple] = {}  # for check_chained
    out: List[Request] = []
    last_t = float("-inf")
    for i, row in enumerate(rows):
        where = f"{source}: row {i + 1}"
        for field in ("timestamp", "input_length", "hash_ids"):
            if field not in row:
                raise ValueError(f"{where}: missing field {field!r}")
        hash_ids, n_in = row["hash_ids"], int(row["input_length"])
        expected = -(-n_in // block_tokens)
        if n_in <= 0 or len(hash_ids) != expected:
            raise ValueError(
                f"{where}: {len(hash_ids)} hash_ids for input_length {n_in} "
                f"(expected ceil({n_in}/{block_tokens}) = {expected})"
            )
        t = float(row["timestamp"]) / 1000.0
        if t < last_t:
            raise ValueError(f"{where}: timestamps must not decrease ({t * 1000} after {last_t * 1000})")
        last_t = t
        tenant = row.get("tenant")
        blocks = tuple(intern.setdefault((tenant, h), len(intern)) for h in hash_ids)
        check_chained(blocks, hash_ids, parents, i, where)
        ttl = row.get("ttl_s")
        out.append(
            Request(
                index=i,
                time_s=t,
                input_length=n_in,
                output_length=int(row.get("output_length", 0)),
                blocks=blocks,
                last_block_tokens=n_in - block_tokens * (len(hash_ids) - 1),
                session=row.get("session"),
                ttl_s=None if ttl is None else float(ttl),
                tenant=tenant,
                priority=int(row.get("priority", 0)),
            )
        )
    return Trace(path=source, block_tokens=block_tokens, requests=tuple(out))


def check_chained(blocks: Sequence[int], hash_ids: Sequence, parents: Dict[int, tuple], row: int, where: str) -> None:
    """Every block keeps the parent it was first seen with (prefix chaining); raises ValueError naming the row.
    `parents`: block -> (block before it or None, that block's hash id, row first seen), filled as rows come."""
    prev = prev_id = None
    for b, h in zip(blocks, hash_ids):
        seen = parents.setdefault(b, (prev, prev_id, row))
        if seen[0] != prev:
            raise ValueError(f"{where}: hash id {h!r} follows {_after(prev_id)} here but {_after(seen[1])} in row "
                             f"{seen[2] + 1}: hash_ids must be prefix-chained")
        prev, prev_id = b, h


def _after(hash_id) -> str:
    return "the start of a prompt" if hash_id is None else f"hash id {hash_id!r}"
