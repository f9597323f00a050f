"""Policy CPU cost beside SGLang's stock RadixCache eviction, on the same request stream in the same run.

    python -m benchmarks.micro_policy [--trace FILE] [--requests N] [--capacity-tokens T]

Replays a Mooncake trace (one radix token per 512-token block) through stock `RadixCache` (lru, lfu),
timing only its `evict` calls, and through `TieredRadixCache` with each tiers policy, timing everything
spent inside the policy (`tier_stats().policy_ns`: record, observe, admit, victims, on_*). Also times the
bare policy operations (record, admit, victims) per call. Prints a markdown table; ratios are against
stock LRU's eviction cost per request measured in this run.
"""

from __future__ import annotations

import argparse
import json
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
    return ns / len(reqs)


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
    args = ap.parse_args(argv)
    if args.requests <= 0:
        ap.error("--requests must be positive")
    reqs = _load(args.trace, args.requests)
    if not reqs:
        ap.error(f"no requests in {args.trace}")
    cap = max(1, int(round(args.capacity_tokens / 512)))

    from tiers.policy import policy_names

    base = _stock(reqs, cap, "lru")
    rows = [("stock RadixCache lru (evict)", base, None), ("stock RadixCache lfu (evict)", _stock(reqs, cap, "lfu"), None)]
    for name in policy_names():
        per_req, cache = _tiered(reqs, cap, name)
        rows.append((f"tiers {name} (all policy calls)", per_req, _per_op(cache)))
    print(f"Policy CPU cost, {len(reqs)} requests of {Path(args.trace).name}, capacity {cap} radix tokens\n")
    print("| policy | us / request | ratio vs stock lru | record ns | admit ns | victims(32) us |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, ns, ops in rows:
        extra = "| | |" if ops is None else f"| {ops[0]:.0f} | {ops[1]:.0f} | {ops[2] / 1e3:.1f} |"
        print(f"| {label} | {ns / 1e3:.1f} | {ns / base:.2f} {extra}")


if __name__ == "__main__":
    main()
