"""Policy CPU cost beside SGLang's stock RadixCache eviction, on the same request stream in the same run.

    python -m benchmarks.micro_policy [--trace FILE] [--requests N] [--capacity-tokens T] [--rounds R]

Replays a Mooncake trace (one radix token per 512-token block) through stock `RadixCache` (lru, lfu),
timing only its `evict` calls, and through `TieredRadixCache` with each tiers policy, timing everything
spent inside the policy (`tier_stats().policy_ns`: record, observe, admit, victims, on_*). Also times the
bare policy operations (record, admit, victims) per call. Prints a markdown table.

Why rounds: on a shared 2-core machine one pass per policy gave stock-LRU ratios from 1.27 to 2.06 for the
same code, because a burst of other work lands on whichever policy runs at that moment. Each round runs
every policy once, in an order rotated by one per round, and the ratio is taken within the round; the table
reports the median over rounds of the per-request cost and of that paired ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from array import array
from pathlib import Path

DEFAULT_TRACE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "mooncake_conversation.jsonl"


class _NullAlloc:
    device = "cpu"

    def __init__(self, size):
        self.size = size

    def free_segment(self, *a, **k):
        pass


def _load(path, limit):
    out = []
    with open(path) as f:
        for line in f:
            out.append(array("q", json.loads(line)["hash_ids"]))
            if len(out) >= limit:
                break
    return out


def _stock(reqs, cap, strategy):
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
    from sglang.srt.mem_cache.utils import get_eviction_strategy

    c = RadixCache.create_simulated(mock_allocator=_NullAlloc(cap))
    c.eviction_strategy = get_eviction_strategy(strategy, None)
    ns = 0
    for toks in reqs:
        c.match_prefix(MatchPrefixParams(key=RadixKey(toks)))
        r = c.insert(InsertParams(key=RadixKey(toks), value=torch.arange(len(toks))))
        over = c.evictable_size_ + c.protected_size_ - cap
        if over > 0:
            c.inc_lock_ref(r.last_device_node)
            t0 = time.perf_counter_ns()
            c.evict(EvictParams(num_tokens=over))
            ns += time.perf_counter_ns() - t0
            c.dec_lock_ref(r.last_device_node)
    return ns / len(reqs), None


def _tiered(reqs, cap, policy):
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from sglang_ext.tiered_cache import TieredRadixCache
    from tiers.clock import ManualClock

    c = TieredRadixCache.create_simulated(policy=policy, capacity_tokens=cap, clock=ManualClock())
    for toks in reqs:
        c.match_prefix(MatchPrefixParams(key=RadixKey(toks)))
        c.insert(InsertParams(key=RadixKey(toks), value=torch.arange(len(toks))))
    return c.tier_stats().policy_ns / len(reqs), c


def _signals(reqs, cap, shares=None):
    """The operator signals (tiers.signals through sglang_ext.tier_signals) as the server feeds them: the
    served cache's stores, removals and scheduling lookups, each call timed; one snapshot per 100 requests (the
    server takes one per export, at most once a second). `shares` collects the signals' share of the whole loop
    (lookup, insert, eviction and signals together)."""
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from sglang_ext.serving_cache import ServingTieredCache
    from tiers.clock import ManualClock

    clock = ManualClock()
    c = ServingTieredCache.create_simulated(policy="lru", capacity_tokens=cap, clock=clock)
    spent = [0]

    def timed(fn):
        def call(*args):
            t0 = time.perf_counter_ns()
            fn(*args)
            spent[0] += time.perf_counter_ns() - t0
        return call

    signals = c._signals
    signals.stored, signals.removed, signals.matched = map(timed, (signals.stored, signals.removed, signals.matched))
    snapshot = timed(lambda: signals.signals["device"].snapshot())
    start = time.perf_counter_ns()
    for i, toks in enumerate(reqs):
        clock.advance(0.01)
        c.match_prefix(MatchPrefixParams(key=RadixKey(toks)))
        c.insert(InsertParams(key=RadixKey(toks), value=torch.arange(len(toks))))
        if i % 100 == 0:
            snapshot()
    if shares is not None:
        shares.append(spent[0] / (time.perf_counter_ns() - start))
    return spent[0] / len(reqs), None


def _per_op(cache, n=2000):
    """Bare policy operations on the warmed-up policy: ns per call."""
    from tiers.policy import Candidate

    p = cache.policy
    t0 = time.perf_counter_ns()
    for i in range(n):
        p.record(("bench", i))
    rec = (time.perf_counter_ns() - t0) / n
    protected = lambda e: e.lock_ref > 0  # noqa: E731
    t0 = time.perf_counter_ns()
    for _ in range(n // 10):
        vs = p.victims(32, protected)
    vic = (time.perf_counter_ns() - t0) / (n // 10)
    t0 = time.perf_counter_ns()
    for i in range(n):
        p.admit(Candidate(("bench", i), 32), vs)
    adm = (time.perf_counter_ns() - t0) / n
    return rec, adm, vic


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--capacity-tokens", type=float, default=1e6, help="trace tokens; 512 per radix token")
    ap.add_argument("--rounds", type=int, default=5, help="each round runs every policy once, order rotated")
    args = ap.parse_args(argv)
    if args.requests <= 0:
        ap.error("--requests must be positive")
    if args.rounds <= 0:
        ap.error("--rounds must be positive")
    reqs = _load(args.trace, args.requests)
    if not reqs:
        ap.error(f"no requests in {args.trace}")
    cap = max(1, int(round(args.capacity_tokens / 512)))

    from tiers.policy import policy_names

    runs = [("stock RadixCache lru (evict)", lambda: _stock(reqs, cap, "lru"))]
    runs.append(("stock RadixCache lfu (evict)", lambda: _stock(reqs, cap, "lfu")))
    shares = []
    runs.append(("operator signals (all signal calls)", lambda: _signals(reqs, cap, shares)))
    for name in policy_names():
        runs.append((f"tiers {name} (all policy calls)", lambda name=name: _tiered(reqs, cap, name)))
    costs = {label: [] for label, _ in runs}
    ratios = {label: [] for label, _ in runs}
    ops = {}
    for r in range(args.rounds):
        this_round = {}
        for i in range(len(runs)):
            label, run = runs[(i + r) % len(runs)]
            ns, cache = run()
            this_round[label] = ns
            if cache is not None and label not in ops:
                ops[label] = _per_op(cache)
        base = this_round[runs[0][0]]
        if base <= 0:
            ap.error("stock LRU evicted nothing, so there is no baseline: raise --requests or lower --capacity-tokens")
        for label, ns in this_round.items():
            costs[label].append(ns)
            ratios[label].append(ns / base)
    print(f"Policy CPU cost, {len(reqs)} requests of {Path(args.trace).name}, capacity {cap} radix tokens, "
          f"median of {args.rounds} rounds\n")
    print("| policy | us / request | ratio vs stock lru (paired, median) | record ns | admit ns | victims(32) us |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, _ in runs:
        op = ops.get(label)
        extra = "| | |" if op is None else f"| {op[0]:.0f} | {op[1]:.0f} | {op[2] / 1e3:.1f} |"
        ratio = statistics.median(ratios[label])
        print(f"| {label} | {statistics.median(costs[label]) / 1e3:.1f} | {ratio:.2f} {extra}")
    print(f"\nOperator signals: {statistics.median(shares):.1%} of the served cache's own time per request "
          "(lookup + insert + eviction + signals, lru, same requests; median of rounds)")

if __name__ == "__main__":
    main()
