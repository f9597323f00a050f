"""Fleet replay: a trace's rows sent through sglang-router to N replicas of one server kind, optionally sharing M
peer servers, beside one replica that holds N times the memory (the pooled figure), in the same run.

`python -m benchmarks live-replay --trace conversation --limit 2000 --capacity-tokens 1e6 --servers tiered-host \
    --replicas 2 --router cache_aware --peers 1`

Design note
- Each replica gets the pools a single live-replay server gets (`--capacity-tokens`, `--host-tokens`), so the fleet
  holds N times that; the pooled server is one replica with N times both pools and M peers of its own (fresh, of
  the same capacity), same rows, sent the same way but straight to it: what the fleet loses by being split.
- The router is sglang-router (`benchmarks.router`), started and stopped here, with `--policy ROUTER`. Rows are
  sent to it exactly as live-replay sends them to one server (token ids, one output token, `--concurrency`).
  With `manual`, each row carries the router's own sticky-routing header (`x-smg-routing-key`): the row's session,
  else its tenant, else its first block (a trace without sessions keeps the prompts that share a first block
  together).
- Per replica: requests it served (SGLang's `sglang:num_requests_total`; the router's health checks are not
  requests), and for ours its `/tiers/stats`. `load_imbalance` is max / mean of those counts (1.0: even).
- Peers (`--peers M`, `--peer-capacity-gb G` each): `--tier-peers` on every replica (ours only), with `--hicache-storage-prefetch-policy wait_complete`, so a
  prefix another replica wrote to a peer is loaded before the request runs rather than raced, and with SGLang's
  prefetch threshold scaled as the pools are (256 trace tokens, `--tier-peer-prefetch-threshold 256 K / B`): at
  SGLang's 256 tokens, a threshold of 16 trace blocks at K = 16, a session's next turn on another replica (its
  previous turn and reply, a few blocks) would never be asked of the peer. Hit tokens by tier use SGLang's names:
  `storage` is the peer tier.
- Failover (`--kill-replica-after K`): just before row K is sent, replica 0's process group is SIGKILLed (what it
  had served is read first). The router then runs with health checks every second, one failure marking a worker
  unhealthy (`FAILOVER_ROUTER_ARGS`); rows in flight on the dead replica are the router's to retry. Reported: the
  failures, hit tokens and peer (`storage`) hit tokens of rows K on. Every row's greedy output is compared with the
  pooled server's (`outputs_differing_from_pooled`): a cache on any tier may change where the answer comes from,
  never what it is.
- Everything started is stopped in a `finally`; every start and request has a deadline.
"""

from __future__ import annotations

import os
import shlex
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from benchmarks.live_replay import (SERVER_KINDS, BlockTokens, LiveConfig, ServerRun, flush_when_idle, metric_sum,
                                    sent_tokens_by_tier, server_args, summarize)
from benchmarks.row_sending import Sent, send_row, send_rows
from benchmarks.server_log import server_pool_tokens
from benchmarks.servers import PeerProcess, Server, start_server
from benchmarks.trace import Request, Trace

ROUTERS = ("round_robin", "cache_aware", "power_of_two", "manual")
ROUTING_KEY_HEADER = "x-smg-routing-key"  # sglang-router's sticky-routing header (manual policy)
SGLANG_PREFETCH_THRESHOLD = 256  # tokens: HiCache asks storage only for a missing part at least this long
# A dead replica is marked unhealthy at the first failed check, a second after it died (defaults: 60 s, 3 checks)
FAILOVER_ROUTER_ARGS = ("--health-check-interval-secs", "1", "--health-failure-threshold", "1")


@dataclass(frozen=True)
class FleetConfig:
    replicas: int
    router: str = "cache_aware"
    peers: int = 0
    kill_replica_after: Optional[int] = None  # rows sent before replica 0 is SIGKILLed; None: no kill
    router_args: Tuple[str, ...] = ()  # more sglang-router flags (balance thresholds, cache threshold)
    peer_capacity_gb: float = 0.25  # each peer's pool


def routing_key(req: Request) -> str:
    """What a client would route a row by: its session, else its tenant, else its first block."""
    if req.session:
        return f"session-{req.session}"
    if req.tenant:
        return f"tenant-{req.tenant}"
    return f"block-{req.blocks[0]}" if req.blocks else "empty"


def load_imbalance(counts: Sequence[int]) -> float:
    """max / mean of the requests each replica served (1.0: even; 0.0 when none served any)."""
    total = sum(counts)
    return max(counts) * len(counts) / total if total else 0.0


def served_requests(server: Server) -> int:
    """Requests the server finished, by SGLang's own counter (0 when it does not export it)."""
    return int(metric_sum(server.get("/metrics"), "sglang:num_requests_total") or 0)


class ReplicaKill:
    """SIGKILLs one replica's process group once, just before row `before_row` is sent; keeps the requests it had
    served by then (it cannot be asked afterwards). Safe to call from every sending thread."""

    def __init__(self, replica: Server, before_row: int, served_at_start: int):
        self.replica, self.before_row, self._start = replica, before_row, served_at_start
        self.served: Optional[int] = None
        self._lock = threading.Lock()

    def before_sending(self, row: int) -> None:
        with self._lock:
            if row < self.before_row or self.served is not None:
                return
            self.served = served_requests(self.replica) - self._start
            try:
                os.killpg(self.replica.proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # already gone: it is killed all the same
                pass
            self.replica.proc.wait(timeout=30)

    @property
    def done(self) -> bool:
        return self.served is not None


def after_kill(sent: Sequence[Sent], trace: Trace, cfg: LiveConfig, before_row: int) -> dict:
    """What the rows from `before_row` on got, in trace tokens: failures, hit tokens, and those from the peer tier."""
    rows = [s for s in sent if s.index >= before_row]
    tiers = sent_tokens_by_tier(rows, trace, cfg.tokens_per_block)
    return {"killed_replica": 0, "before_row": before_row, "rows": len(rows),
            "failures": sum(not s.ok for s in rows), "hit_tokens": sum(tiers.values()),
            "peer_hit_tokens": tiers.get("storage", 0)}


def outputs_differing(a: Sequence[Sent], b: Sequence[Sent]) -> List[int]:
    """Rows both runs answered with different greedy outputs."""
    return [x.index for x, y in zip(a, b) if x.ok and y.ok and x.output_ids != y.output_ids]


def scaled_prefetch_threshold(cfg: LiveConfig) -> int:
    """SGLang's storage prefetch threshold (256 tokens) in the tokens the replay sends: a trace block of
    `block_tokens` becomes `tokens_per_block` ids, so 256 trace tokens are 256 x K / B ids (at least one)."""
    return max(1, round(SGLANG_PREFETCH_THRESHOLD * cfg.tokens_per_block / cfg.block_tokens))


def replica_args(name: str, cfg: LiveConfig, peers: Sequence[PeerProcess]) -> List[str]:
    args = server_args(SERVER_KINDS[name], cfg.device_pool_tokens, cfg.host_ratio)
    if peers:
        args += ["--tier-peers", ",".join(p.address for p in peers),
                 "--tier-peer-prefetch-threshold", str(scaled_prefetch_threshold(cfg)),
                 "--hicache-storage-prefetch-policy", "wait_complete"]
    return args


def start_replicas(name: str, cfg: LiveConfig, peers: Sequence[PeerProcess], n: int, log_dir: Path) -> List[Server]:
    """n replicas started in parallel (each takes most of a minute on a loaded machine); all or none."""
    spec = SERVER_KINDS[name]
    args = replica_args(name, cfg, peers)
    started: List[Server] = []
    errors: List[BaseException] = []
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(start_server, args, log_dir, f"{name}-replica-{i}", kind=spec.kind,
                               env={"UCX_NET_DEVICES": "lo"}, stock_plugins=spec.stock_plugins) for i in range(n)]
        for f in futures:
            try:
                started.append(f.result())
            except Exception as e:  # keep the ones that started, to stop them
                errors.append(e)
    if errors:
        for s in started:
            s.stop()
        raise RuntimeError(f"{len(errors)} of {n} replicas did not start: {errors[0]}")
    return started


def run_fleet(name: str, trace: Trace, cfg: LiveConfig, fleet: FleetConfig, blocks: BlockTokens,
              log_dir: Path) -> Tuple[dict, List[Sent]]:
    """The rows through the router to `fleet.replicas` replicas of `name` (one replica: sent to it directly); the
    summary of live-replay plus the fleet's own fields, and what each row got."""
    from benchmarks.progress import track
    from benchmarks.router import start_router, stop_router

    peers: List[PeerProcess] = []
    replicas: List[Server] = []
    router = None
    kill = None
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        peers = [PeerProcess(log_dir, fleet.peer_capacity_gb).start() for _ in range(fleet.peers)]
        replicas = start_replicas(name, cfg, peers, fleet.replicas, log_dir)
        for r in replicas:
            flush_when_idle(r)  # as live-replay: start from empty pools
        before = [served_requests(r) for r in replicas]
        if fleet.replicas > 1:
            extra = FAILOVER_ROUTER_ARGS if fleet.kill_replica_after is not None else ()
            router = start_router([r.url for r in replicas], log_dir,
                                  ["--policy", fleet.router, *extra, *fleet.router_args])
            if fleet.kill_replica_after is not None:
                kill = ReplicaKill(replicas[0], fleet.kill_replica_after, before[0])
        target = router or replicas[0]  # one replica (the pooled server) is sent to directly
        reqs = trace.requests
        bar = iter(track(range(len(reqs)), f"fleet {name}", unit="requests"))
        manual = fleet.router == "manual"

        def send(i: int):
            if kill:
                kill.before_sending(i)
            headers = {ROUTING_KEY_HEADER: routing_key(reqs[i])} if manual else None
            return send_row(target, blocks.prompt(reqs[i].blocks), i, headers=headers)

        start = time.perf_counter()
        sent = send_rows(send, [r.time_s for r in reqs], cfg.speedup, cfg.concurrency, progress=lambda: next(bar, None))
        wall = time.perf_counter() - start
        dead = kill.replica if kill and kill.done else None  # it cannot be asked: its count was kept
        counts = [kill.served if r is dead else served_requests(r) - b for r, b in zip(replicas, before)]
        pool = server_pool_tokens(next(r for r in replicas if r is not dead))
        stats = [r.get("/tiers/stats") if SERVER_KINDS[name].kind == "tiered" and r is not dead else None
                 for r in replicas]
    finally:
        if router is not None:
            stop_router(router)
        for r in replicas:
            r.stop()
        for p in peers:
            p.stop()
    out = summarize(ServerRun(name, sent, wall, pool_tokens=pool), trace, cfg)
    out.update({"replicas": fleet.replicas, "router": fleet.router, "peers": fleet.peers,
                "replica_requests": counts, "load_imbalance": load_imbalance(counts),
                "replica_tier_stats": stats,
                "failover": after_kill(sent, trace, cfg, kill.before_row) if kill and kill.done else None})
    return out, sent


def pooled_config(cfg: LiveConfig, n: int) -> LiveConfig:
    """One server holding what n replicas hold together."""
    return replace(cfg, capacity_tokens=cfg.capacity_tokens * n, host_tokens=cfg.host_tokens * n)


def fleet_replay(trace: Trace, names: Sequence[str], cfg: LiveConfig, fleet: FleetConfig, log_dir: Path,
                 blocks: BlockTokens) -> dict:
    out: Dict[str, dict] = {}
    pooled_cfg = pooled_config(cfg, fleet.replicas)
    for name in names:
        try:
            s, fleet_sent = run_fleet(name, trace, cfg, fleet, blocks, log_dir)
            pooled, pooled_sent = run_fleet(name, trace, pooled_cfg, replace(fleet, replicas=1,
                                                                             kill_replica_after=None), blocks, log_dir)
        except RuntimeError as e:  # did not start: the other kinds still run; reported, and the exit is 1
            out[name] = {"error": str(e)[-2000:], "failures": len(trace.requests)}
            continue
        s["pooled_token_hit_rate"] = pooled["token_hit_rate"]
        s["pooled"] = {k: pooled[k] for k in ("token_hit_rate", "hit_tokens_by_tier", "ttft_ms_p50", "ttft_ms_p99",
                                                "ttft_ms_mean", "requests", "failures", "device_pool_tokens")}
        s["fleet_over_pooled"] = s["token_hit_rate"] / pooled["token_hit_rate"] if pooled["token_hit_rate"] else None
        s["outputs_differing_from_pooled"] = outputs_differing(fleet_sent, pooled_sent)
        out[name] = s
    return {"servers": out, "fleet": {"replicas": fleet.replicas, "router": fleet.router, "peers": fleet.peers,
                                      "router_args": list(fleet.router_args),
                                      "peer_capacity_gb": fleet.peer_capacity_gb,
                                      "kill_replica_after": fleet.kill_replica_after,
                                      "pooled_capacity_tokens": pooled_cfg.capacity_tokens,
                                      "pooled_host_tokens": pooled_cfg.host_tokens}}


def table(report: dict) -> str:
    f = report["fleet"]
    flags = " ".join(f.get("router_args") or ())
    rows = [f"{f['replicas']} replicas behind sglang-router ({f['router']}{' ' + flags if flags else ''}), "
            f"{f['peers']} peer(s); pooled: one "
            f"server with {f['pooled_capacity_tokens']} device (+{f['pooled_host_tokens']} host) trace tokens",
            "| server | fleet hit | pooled hit | fleet / pooled | hit tokens by tier | requests per replica | "
            "load imbalance | TTFT mean ms | pooled TTFT mean ms | failures |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in report["servers"].items():
        if "error" in s:
            rows.append(f"| {name} | did not start: {s['error'].splitlines()[0]} |")
            continue
        ratio = f"{s['fleet_over_pooled']:.3f}" if s["fleet_over_pooled"] is not None else "-"
        rows.append(f"| {name} | {s['token_hit_rate']:.4f} | {s['pooled_token_hit_rate']:.4f} | {ratio} | "
                    f"{s['hit_tokens_by_tier']} | {s['replica_requests']} | {s['load_imbalance']:.2f} | "
                    f"{s['ttft_ms_mean']:.1f} | {s['pooled']['ttft_ms_mean']:.1f} | {s['failures']} |")
    for name, s in report["servers"].items():
        if "error" in s:
            continue
        if s["failover"]:
            k = s["failover"]
            rows.append(f"{name}: replica 0 killed before row {k['before_row']}; the {k['rows']} rows from there: "
                        f"{k['failures']} failed, {k['hit_tokens']} hit tokens, {k['peer_hit_tokens']} from the peer")
        rows.append(f"{name}: {len(s['outputs_differing_from_pooled'])} rows answered differently from the pooled "
                    f"server")
    return "\n".join(rows)


def check_fleet_args(args, names: Sequence[str], parser) -> Optional[FleetConfig]:
    """The fleet settings of live-replay's command line; None for a single server per kind."""
    if args.peers and args.replicas < 2:
        parser.error("argument --peers: a peer tier shared by replicas needs --replicas 2 or more")
    if args.peers and any(n != "tiered-host" for n in names):
        parser.error("argument --peers: only our host-tier server (--servers tiered-host) uses peers")
    if args.kill_replica_after is not None and args.replicas < 2:
        parser.error("argument --kill-replica-after: failover needs --replicas 2 or more")
    router_args = tuple(shlex.split(args.router_args or ""))
    if router_args and args.replicas < 2:
        parser.error("argument --router-args: a router runs only in front of --replicas 2 or more")
    if any(a in ("--policy", "--worker-urls", "--host", "--port") for a in router_args):
        parser.error("argument --router-args: the policy, workers and address are set by the fleet replay")
    if args.replicas < 2:
        return None
    return FleetConfig(args.replicas, args.router, args.peers, args.kill_replica_after, router_args,
                       args.peer_capacity_gb)
