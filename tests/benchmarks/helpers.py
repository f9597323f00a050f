"""Small trace builders shared by the benchmark tests."""

from __future__ import annotations

import random
from typing import List

from benchmarks.trace import Trace, parse_rows


def random_chain_rows(seed: int, n_requests: int, max_new: int = 4, block_tokens: int = 8) -> List[dict]:
    """Prefix-chained rows: each request follows a random existing path for a while, then adds new blocks."""
    rng = random.Random(seed)
    paths: List[List[int]] = []
    next_id = 0
    rows = []
    for i in range(n_requests):
        prefix: List[int] = []
        if paths and rng.random() < 0.8:
            base = rng.choice(paths)
            prefix = base[: rng.randint(1, len(base))]
        new = rng.randint(0 if prefix else 1, max_new)
        blocks = prefix + list(range(next_id, next_id + new))
        next_id += new
        paths.append(blocks)
        last = rng.randint(1, block_tokens)
        rows.append({
            "timestamp": i * 100,
            "input_length": block_tokens * (len(blocks) - 1) + last,
            "output_length": 1,
            "hash_ids": blocks,
        })
    return rows


def random_chain_trace(seed: int, n_requests: int, max_new: int = 4, block_tokens: int = 8) -> Trace:
    return parse_rows(random_chain_rows(seed, n_requests, max_new, block_tokens), block_tokens)
