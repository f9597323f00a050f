"""Thrash scenario: a working set that fits, then 3x the device pool, then fits again; tiered beside stock SGLang.

`python -m benchmarks thrash [--pool-tokens 2000 --phase-s 45 --seed 0] [--json]` starts a stock and a tiered
server (same model, same `--max-total-tokens`, 127.0.0.1) one after the other and drives each through the same
three phases, each `--phase-s` seconds long (the thrash window is 30 s, so a phase outlasts it):

1. fit: a few recurring prefixes (about 40% of the pool) requested in turn;
2. thrash: the recurring prefixes, each after two prompts of a loop of distinct prompts; recurring + loop are
   3x the pool, so LRU evicts every entry before its next use;
3. fit: the recurring prefixes alone again.

Per phase it reports the hit rate (cached / prompt tokens) of the recurring prefixes and of all requests and,
for the tiered server (which has `/tiers/stats`), the share of requests after which the thrash indicator was on,
whether it was on at the phase's end, and the device eviction velocity then. Requests are sequential, bounded by
the phase time, and each has a deadline.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional

from benchmarks.live import WORDS
from benchmarks.servers import Server, start_server

PHASES = ("fit", "thrash", "fit again")
RECURRING = 4
RECURRING_SHARE = 0.4  # of the pool, all recurring prefixes together
LOOP_PROMPT_SHARE = 0.15  # of the pool, one loop prompt
WORKING_SET_X = 3  # phase 2's distinct prompts, in pools


@dataclass(frozen=True)
class PhaseReport:
    server: str
    phase: str
    requests: int
    recurring_hit_rate: float
    hit_rate: float
    thrashing_share: Optional[float]  # of requests after which the indicator was on (tiered only)
    thrashing_at_end: Optional[bool]
    eviction_tokens_per_s_at_end: Optional[float]


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def workload(seed: int, pool_tokens: int):
    """(recurring prompts, loop prompts): about one token per word with the embedded model's tokenizer."""
    rng = random.Random(seed)
    recurring = [text(rng, int(pool_tokens * RECURRING_SHARE / RECURRING)) for _ in range(RECURRING)]
    loop_words = int(pool_tokens * LOOP_PROMPT_SHARE)
    loop = [text(rng, loop_words) for _ in range(int((WORKING_SET_X * pool_tokens
                                                      - pool_tokens * RECURRING_SHARE) / loop_words))]
    return recurring, loop


def schedule(phase: str, recurring: List[str], loop: List[str]):
    """Endless (prompt, is_recurring) for a phase; the caller stops it by time."""
    i = 0
    while True:
        if phase == "thrash":
            yield loop[i % len(loop)], False
            if i % 2 == 1:
                yield recurring[(i // 2) % len(recurring)], True
        else:
            yield recurring[i % len(recurring)], True
        i += 1


def device_signals(server: Server) -> Optional[dict]:
    try:
        stats = server.get("/tiers/stats", timeout=10)
    except OSError:
        return None
    return stats.get("tiers", {}).get("device") if isinstance(stats, dict) else None


def run_phase(server: Server, name: str, phase: str, recurring, loop, seconds: float) -> PhaseReport:
    counts = {True: [0, 0], False: [0, 0]}  # is_recurring -> [cached, prompt]
    requests = thrashing = 0
    last = None
    deadline = time.monotonic() + seconds
    for prompt, is_recurring in schedule(phase, recurring, loop):
        if time.monotonic() >= deadline:
            break
        meta = server.generate(prompt, max_new_tokens=1)["meta_info"]
        counts[is_recurring][0] += meta.get("cached_tokens", 0)
        counts[is_recurring][1] += meta["prompt_tokens"]
        requests += 1
        last = device_signals(server) if name == "tiered" else None
        thrashing += bool(last and last.get("thrashing"))
    cached, prompt = counts[True][0] + counts[False][0], counts[True][1] + counts[False][1]
    return PhaseReport(
        server=name, phase=phase, requests=requests,
        recurring_hit_rate=counts[True][0] / counts[True][1] if counts[True][1] else 0.0,
        hit_rate=cached / prompt if prompt else 0.0,
        thrashing_share=thrashing / requests if name == "tiered" and requests else None,
        thrashing_at_end=bool(last["thrashing"]) if last else None,
        eviction_tokens_per_s_at_end=last["eviction_tokens_per_s"] if last else None,
    )


def run(args) -> List[PhaseReport]:
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="thrash-"))
    recurring, loop = workload(args.seed, args.pool_tokens)
    reports = []
    for kind in ("stock", "tiered"):
        flags = ["--max-total-tokens", str(args.pool_tokens), "--enable-cache-report"]
        if kind == "tiered":
            flags += args.tier_args.split()
        server = start_server(flags, log_dir, kind, kind=kind)
        try:
            for phase in PHASES:
                reports.append(run_phase(server, kind, phase, recurring, loop, args.phase_s))
        finally:
            server.stop()
    return reports


def markdown(reports: List[PhaseReport]) -> str:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    rows = ["| server | phase | requests | recurring hit rate | hit rate | thrashing (share of requests) "
            "| thrashing at end | eviction tok/s at end |", "|---|---|---:|---:|---:|---:|---|---:|"]
    for r in reports:
        rows.append(f"| {r.server} | {r.phase} | {r.requests} | {r.recurring_hit_rate:.3f} | {r.hit_rate:.3f} "
                    f"| {fmt(r.thrashing_share, '.2f')} | {fmt(r.thrashing_at_end, '')} "
                    f"| {fmt(r.eviction_tokens_per_s_at_end, '.0f')} |")
    return "\n".join(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pool-tokens", type=int, default=2000, help="device KV pool of both servers (tokens)")
    p.add_argument("--phase-s", type=float, default=45.0, help="seconds per phase (the thrash window is 30 s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tier-args", default="", help="extra flags for the tiered server, e.g. '--tier-policy lru'")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--json", action="store_true")


def main(args) -> int:
    if args.pool_tokens < 200 or args.phase_s <= 0:
        raise SystemExit("error: --pool-tokens must be at least 200 and --phase-s positive")
    reports = run(args)
    print(json.dumps([asdict(r) for r in reports], indent=2) if args.json else markdown(reports))
    return 0
