"""`python -m benchmarks {replay,generate,sweep,cost,live,soak,thrash} ...` (see --help of each)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional

from benchmarks.cli_types import capacity as _capacity
from benchmarks.cli_types import json_object as _json_object
from benchmarks.cli_types import non_negative_float as _non_negative_float
from benchmarks.cli_types import non_negative_int as _non_negative_int
from benchmarks.cli_types import positive_int as _positive_int
from benchmarks.cli_types import seed as _seed
from benchmarks.cli_types import shadow_settings as _shadow_settings
from benchmarks.cli_types import share as _share


def _add_replay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="JSONL trace: a path, a file name under ../shared/traces/, "
                   "or 'conversation' / 'synthetic'")
    p.add_argument("--host-tokens", type=_capacity, default=0, help="host tier capacity in tokens (0: none)")
    p.add_argument("--peer-tokens", type=_capacity, default=0, help="peer tier capacity in tokens (0: none)")
    p.add_argument("--lower-policy", default="lru", help="policy of the victim-cache model (the peer tier, and the host tier of the reference engines opt/infinite/...): lru or a tiers policy name; a radix policy's host tier is the server's own class and uses --policy")
    p.add_argument("--block-tokens", type=_positive_int, default=512, help="tokens per hash_ids block")
    p.add_argument("--session-ttl", type=_non_negative_float, default=None,
                   help="TTL (s) for rows that have a session but no ttl_s of their own")
    p.add_argument("--policy-config", type=_json_object, default=None, help="JSON kwargs for the policy")
    p.add_argument("--profile", default=None, help="cost profile (benchmarks/profiles/NAME.yaml or a path)")
    p.add_argument("--limit", type=_positive_int, default=None, help="replay only the first N rows")
    p.add_argument("--radix-tokens-per-block", type=_positive_int, default=1,
                   help="radix tokens standing for one trace block in the device tree (default 1)")
    p.add_argument("--output-tokens", type=_non_negative_int, default=0,
                   help="tokens each request generates, cached after its prompt as the server does (default 0)")
    p.add_argument("--prefill-chunk-tokens", type=_non_negative_int, default=0,
                   help="a server's chunked_prefill_size in radix tokens: longer prompts enter the device tree "
                        "chunk by chunk, as they do while serving (default 0: whole)")
    p.add_argument("--in-flight", type=_positive_int, default=1, metavar="N",
                   help="rows the device runs at once, as a server's batch: all matched and given their KV before "
                        "any is cached; with --prefill-chunk-tokens a batch also stops at that many new tokens, as "
                        "SGLang's scheduler fills one (device-only radix policies; default 1: one at a time)")
    p.add_argument("--shadow-rate", type=_share, default=None, metavar="FRACTION",
                   help="the project's policies: the server's --tier-shadow-rate (self-tuning from shadow caches; "
                        "default: the server's default; 0: off, the learned setting throughout)")
    p.add_argument("--shadow-settings", type=_shadow_settings, default="", metavar="NAME[@BAR],...",
                   help="the self-tuner's candidates, as the server's --tier-shadow-settings (default: the "
                        "server's default for the tree replayed)")
    p.add_argument("--shadow-seed", type=_seed, default=0, metavar="N",
                   help="which prefix chains the self-tuner's sample takes (default 0, the server's sample); "
                        "another seed is another sample at the same rate: the spread over seeds is how much of "
                        "a hit rate is the tuner's path")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("replay", help="replay a trace through one policy")
    _add_replay_args(p)
    p.add_argument("--capacity-tokens", type=_capacity, required=True, help="device capacity in tokens")
    p.add_argument("--policy", required=True, help="lru, lfu, slru, priority, opt, infinite, reuse-oracle, lru-blocks, tinylfu, tiered-NAME")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--progress", action="store_true", help="progress bar on stderr")
    p.set_defaults(_parser=p)

    s = sub.add_parser("sweep", help="replay a trace over policies x capacities; table and plots")
    _add_replay_args(s)
    s.add_argument("--capacities", default=None,
                   help="comma-separated token counts, e.g. 1e6,3e6 (default: 1/32 to all of the trace's distinct "
                        "prompt tokens, in doublings)")
    s.add_argument("--policies", default="lru,lfu,slru,priority,opt,infinite", help="comma-separated")
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--workers", type=_positive_int, default=2, help="processes (at most 2)")
    s.set_defaults(_parser=s)

    c = sub.add_parser("cost", help="print a cost profile and its break-even bandwidths")
    c.add_argument("--profile", required=True)
    c.add_argument("--json", action="store_true")
    c.set_defaults(_parser=c)

    from benchmarks.generate import add_generate_parser
    from benchmarks.live import add_arguments as add_live_arguments

    add_generate_parser(sub)
    live = sub.add_parser("live", help="stock vs tiered server on the same seeded multi-turn workload")
    add_live_arguments(live)
    live.set_defaults(_parser=live)
    from benchmarks.soak import add_arguments as add_soak_arguments

    soak = sub.add_parser("soak", help="concurrent sessions, tenants and peer faults against a tiered server; "
                                       "checks failures, leaked locks, memory and outputs")
    add_soak_arguments(soak)
    soak.set_defaults(_parser=soak)
    from benchmarks.thrash import add_arguments as add_thrash_arguments

    thrash = sub.add_parser("thrash", help="working set fits, then 3x the pool, then fits: thrash indicator and "
                                           "recurring-prefix hit rate, stock beside tiered")
    add_thrash_arguments(thrash)
    thrash.set_defaults(_parser=thrash)
    from benchmarks.live_replay import add_arguments as add_live_replay_arguments

    live_replay = sub.add_parser("live-replay", help="a trace's rows against real servers; live vs offline hit rate")
    add_live_replay_arguments(live_replay)
    live_replay.set_defaults(_parser=live_replay)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "json", False):
        from benchmarks.progress import set_quiet

        set_quiet()
    try:
        if args.command == "replay":
            return _replay(args, args._parser)
        if args.command == "sweep":
            from benchmarks.sweep import run_sweep_cli

            return run_sweep_cli(args, args._parser)
        if args.command == "cost":
            return _cost(args, args._parser)
        if args.command == "generate":
            from benchmarks.generate import run_generate_cli

            return run_generate_cli(args)
        if args.command == "live":
            from benchmarks.live import main as live_main

            return live_main(args)
        if args.command == "soak":
            from benchmarks.soak import main as soak_main

            return soak_main(args)
        if args.command == "thrash":
            from benchmarks.thrash import main as thrash_main

            return thrash_main(args)
        if args.command == "live-replay":
            from benchmarks.live_replay import main as live_replay_main

            return live_replay_main(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    parser.error(f"unknown command {args.command!r}")
    return 2


def replay_config_from_args(args, policy: str, capacity: int):
    from benchmarks.cost import load_profile
    from benchmarks.replay import ReplayConfig

    return ReplayConfig(
        policy=policy,
        capacity_tokens=capacity,
        host_tokens=args.host_tokens,
        peer_tokens=args.peer_tokens,
        lower_policy=args.lower_policy,
        session_ttl_s=args.session_ttl,
        profile=load_profile(args.profile) if args.profile else None,
        policy_config=args.policy_config,
        progress=True if getattr(args, "progress", False) else None,  # None: on a terminal, unless --json
        radix_tokens_per_block=getattr(args, "radix_tokens_per_block", 1),
        output_tokens=getattr(args, "output_tokens", 0),
        prefill_chunk_tokens=getattr(args, "prefill_chunk_tokens", 0),
        **({"shadow_rate": args.shadow_rate} if getattr(args, "shadow_rate", None) is not None else {}),
        shadow_seed=getattr(args, "shadow_seed", 0),
        shadow_settings=getattr(args, "shadow_settings", ""),
        in_flight=getattr(args, "in_flight", 1),
    )


def check_common_args(args, parser, policies: List[str], capacities: List[int]) -> None:
    """Flag values argparse cannot check by type: reported like argparse does (exit 2, flag named)."""
    from benchmarks.cost import resolve_profile_path
    from benchmarks.engines import known_policies
    from benchmarks.trace import resolve_trace_path

    for name, check in (("--trace", lambda: resolve_trace_path(args.trace)),
                        ("--profile", lambda: args.profile and resolve_profile_path(args.profile))):
        try:
            check()
        except FileNotFoundError as e:
            parser.error(f"argument {name}: {e}")
    flag = "--capacity-tokens" if args.command == "replay" else "--capacities"
    for c in capacities:
        if c < args.block_tokens:
            parser.error(f"argument {flag}: {c} tokens is less than one block ({args.block_tokens} tokens)")
    for name, tokens in (("--host-tokens", args.host_tokens), ("--peer-tokens", args.peer_tokens)):
        if 0 < tokens < args.block_tokens:
            parser.error(f"argument {name}: {tokens} tokens is less than one block ({args.block_tokens} tokens)")
    known = known_policies()
    for p in policies:
        if p not in known:
            parser.error(f"argument {'--policy' if args.command == 'replay' else '--policies'}: "
                         f"unknown policy {p!r}; choose from {', '.join(known)}")
    from benchmarks.engines import REFERENCE_ENGINES

    if args.in_flight > 1 and (args.host_tokens or args.peer_tokens or set(policies) & set(REFERENCE_ENGINES)):
        parser.error("argument --in-flight: more than one in flight is for radix policies on the device alone "
                     "(no --host-tokens, --peer-tokens, or reference engines)")
    from benchmarks.lower_tiers import lower_policy_names

    if args.lower_policy not in lower_policy_names():
        parser.error(f"argument --lower-policy: unknown policy {args.lower_policy!r}; "
                     f"choose from {', '.join(lower_policy_names())}")


def _replay(args, parser) -> int:
    from benchmarks.replay import replay
    from benchmarks.trace import load_trace

    check_common_args(args, parser, [args.policy], [args.capacity_tokens])
    trace = load_trace(args.trace, args.block_tokens, limit=args.limit)
    result = replay(trace, replay_config_from_args(args, args.policy, args.capacity_tokens))
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
        return 0
    print(f"{result.policy} @ {result.capacity_tokens:,} tokens on {result.trace} ({result.requests} requests)")
    print(f"  token hit rate   {result.token_hit_rate:.4f}  by tier: "
          + ", ".join(f"{k} {v:.4f}" for k, v in result.hit_rate_by_tier.items()))
    print(f"  tokens saved     {result.prefill_tokens_saved:,}")
    for tier, moved in result.bytes_moved_by_tier.items():
        print(f"  {tier:<6} bytes    load {moved['load']:,}  store {moved['store']:,}")
    print(f"  evictions        {result.evictions:,}   admissions rejected {result.admissions_rejected:,}")
    print(f"  policy ns/req    {result.policy_ns_per_request:,.0f} (shadows {result.shadow_ns_per_request:,.0f})"
          f"   replay {result.replay_seconds:.1f} s")
    if result.prefill_seconds_saved is not None:
        print(f"  prefill s saved  {result.prefill_seconds_saved:,.1f} ({result.profile})")
    return 0


def _cost(args, parser) -> int:
    from benchmarks.cost import load_profile

    try:
        summary = load_profile(args.profile).summary()
    except (FileNotFoundError, ValueError) as e:
        parser.error(f"argument --profile: {e}")
    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    print(f"{summary['profile']}: recompute {summary['recompute_s_per_token'] * 1e6:.2f} us/token, "
          f"break-even bandwidth {summary['break_even_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s")
    for tier, t in summary["tiers"].items():
        verdict = "fetch beats recompute" if t["fetch_beats_recompute"] else "recompute is cheaper"
        print(f"  {tier:<6} over {t['link']:<7} fetch {t['fetch_s_per_token'] * 1e6:.2f} us/token: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
