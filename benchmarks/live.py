"""Live mode: the same seeded multi-turn chat workload against a stock and a tiered server, side by side.

`python -m benchmarks live [--sessions 8 --turns 4 --concurrency 4 --seed 0] [--json]` starts both servers on
127.0.0.1 (embedded model on CPU; `--model-path` on a GPU machine), drives each with identical conversations
(streamed `/v1/chat/completions`), and reports TTFT p50/p99, throughput and the cached-token ratio, with the
tiered/stock ratio of each. The workload is bounded (sessions x turns requests) and stops by itself.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional

from benchmarks.progress import track
from benchmarks.servers import Server, start_server

WORDS = ("cache token prefix session tenant model server request reply host device peer memory block page tree "
         "node hit miss evict admit window sketch time first turn chat user assistant system prompt").split()


@dataclass(frozen=True)
class Turn:
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class LiveReport:
    server: str
    requests: int
    failures: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    requests_per_s: float
    output_tokens_per_s: float
    cached_token_ratio: float


def conversations(seed: int, sessions: int, turns: int, system_words: int = 60, user_words: int = 40):
    """Seeded user messages per session: a shared system prompt, then `turns` user messages each."""
    rng = random.Random(seed)
    system = " ".join(rng.choice(WORDS) for _ in range(system_words))
    return system, [[" ".join(rng.choice(WORDS) for _ in range(user_words)) for _ in range(turns)]
                    for _ in range(sessions)]


def stream_chat(server: Server, messages, max_tokens: int, deadline_s: float = 120.0) -> tuple[Turn, str]:
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(server.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    start = time.perf_counter()
    ttft, text, usage = None, [], {}
    with urllib.request.urlopen(req, timeout=deadline_s) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            for choice in chunk.get("choices") or []:
                delta = (choice.get("delta") or {}).get("content")
                if delta:
                    ttft = ttft if ttft is not None else time.perf_counter() - start
                    text.append(delta)
            usage = chunk.get("usage") or usage
    latency = time.perf_counter() - start
    details = usage.get("prompt_tokens_details") or {}
    turn = Turn(ttft if ttft is not None else latency, latency, usage.get("prompt_tokens", 0),
                details.get("cached_tokens", 0), usage.get("completion_tokens", 0))
    return turn, "".join(text)


def run_session(server: Server, system: str, users: List[str], max_tokens: int) -> tuple[List[Turn], int]:
    messages, turns, failures = [{"role": "system", "content": system}], [], 0
    for user in users:
        messages.append({"role": "user", "content": user})
        try:
            turn, reply = stream_chat(server, messages, max_tokens)
        except OSError:
            failures += 1
            reply = ""
        else:
            turns.append(turn)
        messages.append({"role": "assistant", "content": reply})
    return turns, failures


def drive(server: Server, name: str, seed: int, sessions: int, turns: int, concurrency: int,
          max_tokens: int, ttfts_out: Optional[dict] = None) -> LiveReport:
    """One server's run; `ttfts_out[name]` receives every request's TTFT (ms), for the CDF plot."""
    system, users = conversations(seed, sessions, turns)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(track(pool.map(lambda u: run_session(server, system, u, max_tokens), users),
                             f"live {name}", total=len(users), unit="sessions"))
    wall = time.perf_counter() - start
    done = [t for ts, _ in results for t in ts]
    failures = sum(f for _, f in results)
    ttfts = sorted(t.ttft_s * 1000 for t in done) or [0.0]
    if ttfts_out is not None:
        ttfts_out[name] = [t.ttft_s * 1000 for t in done]
    p99 = ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))]
    prompt = sum(t.prompt_tokens for t in done)
    return LiveReport(name, len(done), failures, statistics.median(ttfts), p99, len(done) / wall,
                      sum(t.completion_tokens for t in done) / wall,
                      sum(t.cached_tokens for t in done) / prompt if prompt else 0.0)


def compare(args, ttfts_out: Optional[dict] = None) -> List[LiveReport]:
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="live-"))
    common = ["--enable-cache-report", *(["--max-total-tokens", str(args.max_total_tokens)]
                                         if args.max_total_tokens else [])]
    reports = []
    for kind in ("stock", "tiered"):
        extra = common + (args.tier_args.split() if kind == "tiered" and args.tier_args else [])
        if args.model_path:
            extra += ["--model-path", args.model_path] if kind == "tiered" else []
        server = start_server(extra, log_dir, kind, kind=kind,
                              model_path=args.model_path if kind == "stock" else None)
        try:
            reports.append(drive(server, kind, args.seed, args.sessions, args.turns, args.concurrency,
                                 args.max_tokens, ttfts_out))
        finally:
            server.stop()
    return reports


def markdown(reports: List[LiveReport]) -> str:
    stock, tiered = reports
    rows = ["| metric | stock | tiered | tiered / stock |", "|---|---|---|---|"]
    for field in ("requests", "failures", "ttft_p50_ms", "ttft_p99_ms", "requests_per_s", "output_tokens_per_s",
                  "cached_token_ratio"):
        a, b = getattr(stock, field), getattr(tiered, field)
        ratio = f"{b / a:.2f}" if a else "-"
        rows.append(f"| {field} | {a:.3g} | {b:.3g} | {ratio} |")
    return "\n".join(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=16, help="completion tokens per turn")
    p.add_argument("--max-total-tokens", type=int, default=None, help="device KV pool size of both servers")
    p.add_argument("--model-path", default=None, help="a real model (GPU); default: the embedded model")
    p.add_argument("--tier-args", default="", help="extra flags for the tiered server, e.g. '--tier-policy lru'")
    p.add_argument("--log-dir", default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--plot", default=None, help="write the TTFT CDF of both servers to this PNG")


def main(args) -> int:
    for name in ("sessions", "turns", "concurrency", "max_tokens"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"error: --{name.replace('_', '-')} must be positive")
    ttfts = {}
    reports = compare(args, ttfts)
    if args.plot:
        from benchmarks.plots import plot_ttft_cdf

        plot_ttft_cdf(ttfts, args.plot, title=f"({args.sessions} sessions x {args.turns} turns)")
    if args.json:
        print(json.dumps({r.server: asdict(r) for r in reports}, indent=2))
    else:
        print(markdown(reports))
    return 0 if all(r.failures == 0 for r in reports) else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.live", description=__doc__)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
