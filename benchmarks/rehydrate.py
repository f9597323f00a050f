"""Rehydrating a prefix from a peer versus recomputing it (`python -m benchmarks.rehydrate`).

Starts one peer block server and two tiered servers sharing it (`--tier-peers`) on 127.0.0.1. For each of N seeded
prompts: server A computes it (its write-back reaches the peer: polled, with a deadline), then server B is timed on
that prompt (a storage hit: the prefix comes from the peer over NIXL) and on a fresh prompt of the same length (a
miss: computed on B). One output token each, so the time is prefill (or fetch) plus one decode step. Prints the
median of each and the rehydrate / recompute ratio, with the storage tokens B reported.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.servers import PeerProcess, peer_stats, start_server, wait_for_peer_pages

WORDS = "cache token prefix session tenant model server request reply host device peer memory block page tree".split()


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def timed(server, prompt: str):
    start = time.perf_counter()
    answer = server.generate(prompt, max_new_tokens=1, return_cached_tokens_details=True)
    return time.perf_counter() - start, answer["meta_info"]


def run(prompts: int, n_words: int, log_dir: Path) -> dict:
    peer = PeerProcess(log_dir).start()
    servers = []
    try:
        args = ["--tier-peers", peer.address, "--max-total-tokens", str(4 * n_words), "--enable-cache-report"]
        for name in ("a", "b"):
            servers.append(start_server(args, log_dir, f"rehydrate-{name}", env={"UCX_NET_DEVICES": "lo"}))
        a, b = servers
        rehydrate, recompute, storage = [], [], []
        shared = [words(1000 + i, n_words) for i in range(prompts)]
        base = peer_stats(peer.port)["used_pages"]
        computed = sum(timed(a, prompt)[1]["prompt_tokens"] for prompt in shared)
        wait_for_peer_pages(peer.port, base + computed - prompts)  # A's write-back is asynchronous
        for i, prompt in enumerate(shared):
            seconds, meta = timed(b, prompt)
            rehydrate.append(seconds)
            storage.append((meta.get("cached_tokens_details") or {}).get("storage", 0))
            seconds, _ = timed(b, words(2000 + i, n_words))
            recompute.append(seconds)
        return {"prompts": prompts, "prompt_tokens": meta["prompt_tokens"], "storage_tokens": storage,
                "rehydrate_median_s": statistics.median(rehydrate),
                "recompute_median_s": statistics.median(recompute),
                "ratio": statistics.median(rehydrate) / statistics.median(recompute)}
    finally:
        for s in servers:
            s.stop()
        peer.stop()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rehydrate", description=__doc__)
    parser.add_argument("--prompts", type=int, default=5)
    parser.add_argument("--words", type=int, default=1500, help="prompt length in words (about one token each)")
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args(argv)
    if args.prompts <= 0 or args.words <= 0:
        parser.error("--prompts and --words must be positive")
    r = run(args.prompts, args.words, Path(args.log_dir or tempfile.mkdtemp(prefix="rehydrate-")))
    print("| prompt tokens | storage tokens on B | rehydrate from peer (median) | recompute (median) | ratio |")
    print("|---|---|---|---|---|")
    print(f"| {r['prompt_tokens']} | {r['storage_tokens']} | {r['rehydrate_median_s'] * 1000:.0f} ms | "
          f"{r['recompute_median_s'] * 1000:.0f} ms | {r['ratio']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
