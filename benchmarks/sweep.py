"""Replay one trace over policies x capacities, in at most two worker processes; write a table and plots.

Outputs in --out: results.json (one replay result per run), results.md (hit-rate table, tier traffic table),
hit_rate_vs_capacity.png and tier_traffic.png. `opt` and `infinite` are always added: they are the lines every
policy is read against, and cost seconds.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import sys
from typing import Dict, List, Sequence, Tuple

MAX_WORKERS = 2  # the development machines have two cores, shared
REFERENCE_POLICIES = ("opt", "infinite")

_TRACE_CACHE: Dict[Tuple[str, int, object], object] = {}


def _run_job(job: Tuple[str, int, dict]) -> dict:
    """One replay (runs in a worker process; the parsed trace is cached per process)."""
    from benchmarks.replay import replay
    from benchmarks.trace import load_trace

    policy, capacity, opts = job
    key = (opts["trace"], opts["block_tokens"], opts["limit"])
    if key not in _TRACE_CACHE:
        _TRACE_CACHE[key] = load_trace(opts["trace"], opts["block_tokens"], limit=opts["limit"])
    cfg = dataclasses.replace(opts["config"], policy=policy, capacity_tokens=capacity)
    return replay(_TRACE_CACHE[key], cfg).to_dict()


def run_sweep(policies: Sequence[str], capacities: Sequence[int], opts: dict, workers: int = 2) -> List[dict]:
    from benchmarks.progress import Progress

    wanted = list(dict.fromkeys(list(policies) + list(REFERENCE_POLICIES)))
    jobs = [(p, c, opts) for c in capacities for p in wanted]
    workers = max(1, min(workers, MAX_WORKERS, len(jobs)))
    results: List[dict] = []
    bar = Progress("sweep", total=len(jobs), unit="runs")
    try:
        if workers == 1:
            for job in jobs:
                results.append(_run_job(job))
                bar.update()
        else:
            with multiprocessing.get_context("spawn").Pool(workers) as pool:
                for r in pool.imap_unordered(_run_job, jobs):
                    results.append(r)
                    bar.update()
    finally:
        bar.close()
    order = {(p, c): i for i, (p, c, _) in enumerate(jobs)}
    return sorted(results, key=lambda r: order[(r["policy"], r["capacity_tokens"])])


def markdown_table(results: Sequence[dict]) -> str:
    caps = sorted({r["capacity_tokens"] for r in results})
    policies = list(dict.fromkeys(r["policy"] for r in results))
    by = {(r["policy"], r["capacity_tokens"]): r for r in results}
    lines = [
        "| policy | " + " | ".join(f"{c:.3g} tokens" for c in caps) + " |",
        "|---|" + "---|" * len(caps),
    ]
    for p in policies:
        cells = [f"{by[(p, c)]['token_hit_rate']:.3f}" if (p, c) in by else "" for c in caps]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    tiers = sorted({t for r in results for t in r["bytes_moved_by_tier"]})
    if tiers:
        lines += ["", "Tier traffic (GB loaded / stored) and hit rate per tier", "",
                  "| policy | capacity | " + " | ".join(f"{t} hit | {t} load GB | {t} store GB" for t in tiers) + " |",
                  "|---|---|" + "---|---|---|" * len(tiers)]
        for r in results:
            cells = []
            for t in tiers:
                moved = r["bytes_moved_by_tier"].get(t, {"load": 0, "store": 0})
                cells += [f"{r['hit_rate_by_tier'].get(t, 0.0):.3f}", f"{moved['load'] / 1e9:.1f}",
                          f"{moved['store'] / 1e9:.1f}"]
            lines.append(f"| {r['policy']} | {r['capacity_tokens']:.3g} | " + " | ".join(cells) + " |")
    profiled = [r for r in results if r.get("prefill_seconds_saved") is not None]
    if profiled:
        lines += ["", f"Prefill seconds saved (profile {profiled[0]['profile']}; lower-tier hits net of transfer)", "",
                  "| policy | capacity | total | " + " | ".join(profiled[0]["prefill_seconds_saved_by_tier"]) + " |",
                  "|---|---|---|" + "---|" * len(profiled[0]["prefill_seconds_saved_by_tier"])]
        for r in profiled:
            cells = [f"{v:,.0f}" for v in r["prefill_seconds_saved_by_tier"].values()]
            lines.append(f"| {r['policy']} | {r['capacity_tokens']:.3g} | {r['prefill_seconds_saved']:,.0f} | "
                         + " | ".join(cells) + " |")
    lines += ["", "Replay time (s, excluding SGLang import)", "", "| policy | " +
              " | ".join(f"{c:.3g}" for c in caps) + " |", "|---|" + "---|" * len(caps)]
    for p in policies:
        cells = [f"{by[(p, c)]['replay_seconds']:.1f}" if (p, c) in by else "" for c in caps]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


DEFAULT_CAPACITY_STEPS = 6  # 1/32, 1/16, ..., 1 of the trace's footprint


def default_capacities(trace_name: str, block_tokens: int, limit=None) -> List[int]:
    """Capacities from 1/32 of the trace's footprint (its distinct blocks, in tokens: what an infinite cache
    holds) up to all of it, doubling; at least one block each."""
    from benchmarks.trace import load_trace

    trace = load_trace(trace_name, block_tokens, limit=limit)
    footprint = len({b for r in trace.requests for b in r.blocks}) * block_tokens
    caps = [max(block_tokens, footprint >> shift) for shift in range(DEFAULT_CAPACITY_STEPS - 1, -1, -1)]
    return list(dict.fromkeys(caps))


def run_sweep_cli(args, parser) -> int:
    from benchmarks.cli_types import capacity as _capacity
    from benchmarks.plots import plot_hit_rates, plot_tier_traffic

    try:
        capacities = ([_capacity(c) for c in args.capacities.split(",") if c.strip()] if args.capacities is not None
                      else default_capacities(args.trace, args.block_tokens, args.limit))
    except FileNotFoundError as e:
        parser.error(f"argument --trace: {e}")
    except Exception as e:  # argparse-style error for a bad list
        parser.error(f"argument --capacities: {e}")
    if not capacities:
        parser.error("argument --capacities: give at least one capacity")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        parser.error("argument --policies: give at least one policy")
    from benchmarks.__main__ import check_common_args, replay_config_from_args

    check_common_args(args, parser, policies, capacities)  # fail fast, before starting workers
    # every replay flag reaches each run as it reaches `replay`: one config, its policy and capacity set per run
    # (no bar of its own: the sweep has one)
    config = dataclasses.replace(replay_config_from_args(args, policies[0], capacities[0]), progress=False)
    opts = {"trace": args.trace, "block_tokens": args.block_tokens, "limit": args.limit, "config": config}
    results = run_sweep(policies, capacities, opts, workers=args.workers)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    table = markdown_table(results)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(f"# Sweep of {args.trace}\n\n{table}")
    written = [plot_hit_rates(results, os.path.join(args.out, "hit_rate_vs_capacity.png"), title=args.trace),
               plot_tier_traffic(results, os.path.join(args.out, "tier_traffic.png"), title=args.trace)]
    print(table)
    print("wrote " + ", ".join(["results.json", "results.md"] + [os.path.basename(w) for w in written])
          + f" to {args.out}", file=sys.stderr)
    return 0
