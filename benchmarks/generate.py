"""`python -m benchmarks generate KIND --seed S --out FILE`: write a workload as JSONL (same seed, same bytes)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from benchmarks.arrivals import ARRIVAL_KINDS, AZURE_FILES
from benchmarks.cli_types import non_negative_float as _non_negative_float
from benchmarks.cli_types import float_in as _float_in
from benchmarks.cli_types import positive_int as _positive_int
from benchmarks.workloads import KIND_DEFAULTS, KINDS, GenConfig, generate_rows
from tiers.retention import MAX_TTL_S

_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids", "session", "ttl_s", "tenant")


def add_generate_parser(sub) -> None:
    g = sub.add_parser("generate", help="write a synthetic workload (Mooncake JSONL + session/ttl_s/tenant)")
    g.add_argument("kind", choices=KINDS)
    g.add_argument("--seed", type=int, required=True)
    g.add_argument("--out", required=True, help="output JSONL path ('-' for stdout)")
    g.add_argument("--sessions", type=_positive_int, default=200, help="chat, agent and coding-agent sessions")
    g.add_argument("--requests", type=_positive_int, default=2000, help="rag/tenants requests")
    g.add_argument("--tenants", type=_positive_int, default=None,
                   help="tenants (default: 100 for 'tenants', 12 for 'tenant-chat', else 1)")
    g.add_argument("--zipf", type=_non_negative_float, default=1.0, help="Zipf exponent of tenant/document popularity")
    g.add_argument("--system-prompts", type=_positive_int, default=None,
                   help="system prompts per tenant (default: 1 for 'tenant-chat', else 4)")
    g.add_argument("--arrivals", choices=ARRIVAL_KINDS, default="poisson")
    g.add_argument("--rate", type=_float_in(0, 1e4, "per second"), default=0.5,
                   help="poisson: new sessions/requests per second")
    g.add_argument("--time-scale", type=_non_negative_float, default=1.0, help="Azure arrivals: gap multiplier")
    g.add_argument("--lengths", choices=("lognormal",) + tuple(AZURE_FILES), default="lognormal",
                   help="where user-message and output lengths come from")
    g.add_argument("--think-s", type=_float_in(0, MAX_TTL_S, "seconds"), default=60.0,
                   help="mean think time between turns (s); agents pause a tenth of it between steps")
    g.add_argument("--ttl", type=_float_in(0, MAX_TTL_S, "seconds"), default=300.0,
                   help="cache_control TTL put on rows (s)")
    g.add_argument("--no-ttl", action="store_true", help="write ttl_s: null")
    g.add_argument("--docs", type=_positive_int, default=500)
    g.add_argument("--docs-per-request", type=_positive_int, default=3)
    g.add_argument("--block-tokens", type=_positive_int, default=512)


def run_generate_cli(args: argparse.Namespace) -> int:
    preset = {"system_prompts": GenConfig.system_prompts, **KIND_DEFAULTS[args.kind]}
    cfg = GenConfig(
        seed=args.seed,
        sessions=args.sessions,
        requests=args.requests,
        tenants=args.tenants if args.tenants is not None else preset["tenants"],
        zipf=args.zipf,
        system_prompts=args.system_prompts if args.system_prompts is not None else preset["system_prompts"],
        arrivals=args.arrivals,
        rate=args.rate,
        time_scale=args.time_scale,
        lengths="" if args.lengths == "lognormal" else args.lengths,
        think_s=args.think_s,
        ttl_s=None if args.no_ttl else args.ttl,
        docs=args.docs,
        docs_per_request=args.docs_per_request,
        block_tokens=args.block_tokens,
    )
    rows = generate_rows(args.kind, cfg)
    text = "".join(json.dumps({k: r[k] for k in _FIELDS}) + "\n" for r in rows)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
        print(f"wrote {len(rows)} rows to {args.out}", file=sys.stderr)
    return 0
