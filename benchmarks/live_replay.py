"""Live trace replay: the rows of a trace sent to real servers, and the hit rate they report beside the offline
replay of the same rows.

`python -m benchmarks live-replay --trace conversation --limit 2000 --capacity-tokens 1e6 --servers stock,tiered`

Design note
- Token ids: each trace block (its interned id) becomes K pseudo-random token ids (K = --tokens-per-block,
  default 16) drawn from a `random.Random` seeded by the block id, inside the model's vocabulary, except the
  first, which is the block's rank among its siblings (so sibling blocks part at their first token, as in the
  trace, instead of sharing leading tokens by chance; see BlockTokens). A prompt is
  its blocks' runs end to end, so the server's radix tree sees the trace's prefix structure; the last, partial
  block of a row also becomes K ids (as in the offline replay, where a block is R radix tokens whatever its size).
- Pools in trace tokens, as in `replay`: the device pool is C // block_tokens blocks of K tokens
  (`--max-total-tokens`), the host pool H // block_tokens blocks (`--hicache-ratio` H / C: SGLang's
  `--hicache-size` is whole GB).
- Each server starts from flushed pools (`/flush_cache` after start-up), so the policy state the replay starts
  from is the offline replay's.
- Hits: SGLang never serves the last prompt token from cache (a full hit reports len - 1 cached tokens), so a
  row's hit blocks are cached // K, plus one when cached == len(blocks) * K - 1; they are counted in trace
  tokens with `Request.hit_tokens`, over the trace's prompt tokens, exactly as `replay` counts them.
- Timing: rows go out in trace order, row i not before (t_i - t_0) / speedup after the start (speedup 0: no
  waiting), with at most `concurrency` in flight. Each request asks for one new token (temperature 0), so its
  latency is its time to first token. Every wait has a deadline; every server is stopped in a `finally`.
  Servers run one after another, or with `--interleave` all at once, each row sent to each in turn: TTFTs
  compared side by side, under the same load, for this VM's speed drifts by 20% between runs minutes apart.
  With many tokens per block (`--tokens-per-block 128`), prefill decides a row's latency on this CPU too.
- The offline twin (`offline_*` fields) replays the same rows one at a time through the same classes. With more
  than one in flight, device-only servers also get a twin that runs `--concurrency` rows at once in batches of
  at most the server's chunked prefill size of new tokens (`replay --in-flight`; `offline_in_flight_*`): what
  running requests and batch-mates cost a cache, apart from the order a live run happens to take. It is a bound:
  the server's own batches are smaller (with 8 in flight, 2.6-2.9 rows on average by its log), as requests come
  back one by one.
- Servers: `stock` is `sglang.launch_server` with its own radix cache; `hicache` the same with SGLang's HiCache
  (on CPU our plugin is loaded for its host-pool seams only, see sglang_ext/cpu_hicache.py: the tree cache is
  SGLang's); `tiered` is ours, device only; `tiered-host` ours with the host tier.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from benchmarks.engines import live_hit_blocks
from benchmarks.row_sending import Sent, row_fields, send_interleaved, send_row, send_rows
from benchmarks.server_log import (PrefillBatches, log_size, logged_prefill_batches, server_chunk_tokens,
                                   server_host_pool_tokens, server_pool_tokens)
from benchmarks.servers import Server, start_server
from benchmarks.trace import Request, Trace

DEFAULT_TOKENS_PER_BLOCK = 16


@dataclass(frozen=True)
class ServerKind:
    """How a named server of the benchmark is started, and which offline replay stands for it."""

    kind: str  # "stock" (sglang.launch_server) or "tiered" (sglang_ext.launch_server)
    offline_policy: str
    host_tier: bool
    extra_args: tuple = ()
    stock_plugins: str = "none"  # SGLANG_PLUGINS of a stock server


SERVER_KINDS = {
    "stock": ServerKind("stock", "lru", False),
    "tiered": ServerKind("tiered", "tinylfu", False, ("--tier-policy", "tinylfu")),
    # stock HiCache on CPU needs the host-pool seams that our plugin installs (and nothing else of it is used)
    "hicache": ServerKind("stock", "lru", True, ("--hicache-io-backend", "direct", "--hicache-mem-layout",
                                                  "layer_first"), "tiered_kv"),
    "tiered-host": ServerKind("tiered", "tinylfu", True, ("--tier-policy", "tinylfu")),
}


# ---- trace blocks -> token ids, cached tokens -> trace hits (pure, unit-tested) ----

class BlockTokens:
    """Block id -> its fixed run of K token ids in [0, vocab_size), memoized.

    The run is pseudo-random, seeded by the block id, except its first token when `first_tokens` gives one: the
    block's rank among its parent's children (`sibling_ranks`). Two sibling blocks then part at their first
    token, as they do in the trace, instead of sharing a few leading tokens by chance: with a 2,048-token
    vocabulary, hundreds of random runs under one parent share a first token, and each such pair becomes a
    shared radix node that the trace does not have (a reuse the policies would learn from)."""

    def __init__(self, tokens_per_block: int, vocab_size: int, first_tokens: Optional[Dict[int, int]] = None):
        if tokens_per_block < 1 or vocab_size < 2:
            raise ValueError(f"need tokens_per_block >= 1 and vocab_size >= 2, got {tokens_per_block}, {vocab_size}")
        self.k, self.vocab = tokens_per_block, vocab_size
        self._first = {b: rank % vocab_size for b, rank in (first_tokens or {}).items()}  # block -> its first id
        self._runs: Dict[int, List[int]] = {}

    def run(self, block: int) -> List[int]:
        ids = self._runs.get(block)
        if ids is None:
            rng = random.Random(block)
            ids = [rng.randrange(self.vocab) for _ in range(self.k)]
            if block in self._first:
                ids[0] = self._first[block]
            self._runs[block] = ids
        return ids

    def prompt(self, blocks: Sequence[int]) -> List[int]:
        return [t for b in blocks for t in self.run(b)]

    def first_tokens(self) -> Optional[Dict[int, int]]:
        """Block -> the id its run starts with, for the offline twin (engines.RadixUnits: the twin's tree keys are
        then the server's); None with one token per block, where the twin keeps block ids."""
        return dict(self._first) if self.k > 1 else None


def sibling_ranks(requests: Sequence[Request]) -> Dict[int, int]:
    """Block id -> its rank among the children of its parent (the block before it in a row; the root for a
    first block), in order of first appearance. A trace gives each block one parent (trace.py checks it)."""
    children: Dict[Optional[int], int] = {}
    ranks: Dict[int, int] = {}
    for req in requests:
        parent = None
        for b in req.blocks:
            if b not in ranks:
                ranks[b] = children.get(parent, 0)
                children[parent] = ranks[b] + 1
            parent = b
    return ranks


def hit_tokens_by_tier(req: Request, cached: int, details: Optional[dict], k: int, block_tokens: int) -> Dict[str, int]:
    """Trace tokens this row hit, per tier: SGLang's `cached_tokens_details` lists tiers nearest first, so each
    tier's share is the blocks the cumulative count reaches beyond the tiers before it."""
    tiers = [(t, int(v)) for t, v in (details or {}).items() if isinstance(v, (int, float)) and v > 0]
    if not tiers or sum(v for _, v in tiers) != cached:
        tiers = [("device", cached)]  # no breakdown (stock without cache report) or one we cannot read
    out, cum, before = {}, 0, 0
    for tier, tokens in tiers:
        cum += tokens
        reached = req.hit_tokens(live_hit_blocks(cum, len(req.blocks), k), block_tokens) if cum else 0
        out[tier] = out.get(tier, 0) + reached - before
        before = reached
    return out


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0.0 when empty)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(round(q * (len(sorted_values) - 1))))]


# ---- one server ----

@dataclass(frozen=True)
class ServerRun:
    name: str
    sent: List[Sent]
    wall_s: float
    tier_stats: Optional[dict] = None
    pool_tokens: Optional[int] = None
    offline: Optional[dict] = None
    offline_in_flight: Optional[dict] = None  # the twin at the run's concurrency (device-only servers, > 1 in flight)
    eviction_s: Optional[float] = None  # sglang:eviction_duration_seconds_sum at the end (None: not exported)
    prefill_chunk: Optional[int] = None  # the server's chunked_prefill_size (tokens), from its start-up log
    host_pool: Optional[int] = None  # a HiCache server's host pool (tokens), from its start-up log
    prefill_batches: Optional[PrefillBatches] = None  # what the server's log says its prefill passes carried


def server_args(spec: ServerKind, device_tokens: int, host_ratio: float) -> List[str]:
    # metrics on every server: SGLang's eviction-duration histogram is stock's whole policy cost, which ours is
    # compared with (ours also counts every policy call in /tiers/stats)
    args = ["--max-total-tokens", str(device_tokens), "--enable-cache-report", "--enable-metrics", *spec.extra_args]
    if spec.host_tier:
        args += ["--enable-hierarchical-cache", "--hicache-ratio", f"{host_ratio:.6g}"]
    return args


FLUSH_IDLE_DEADLINE_S = 60


def flush_when_idle(server: Server) -> None:
    """Empty the server's pools once it is idle: a flush while anything runs (a start-up warm-up request still in
    flight on a loaded machine) is refused with a 400; SGLang's `timeout` defers it until idle, within a deadline."""
    server.get(f"/flush_cache?timeout={FLUSH_IDLE_DEADLINE_S}", timeout=FLUSH_IDLE_DEADLINE_S + 30)


@contextlib.contextmanager
def started(name: str, cfg: "LiveConfig", log_dir: Path) -> Iterator[Tuple[Server, dict]]:
    """A server of kind `name`, up and flushed, with what its start-up log says it built; stopped at exit."""
    spec = SERVER_KINDS[name]
    server = start_server(server_args(spec, cfg.device_pool_tokens, cfg.host_ratio), log_dir, name,
                          kind=spec.kind, stock_plugins=spec.stock_plugins)
    try:
        built = dict(pool_tokens=server_pool_tokens(server), prefill_chunk=server_chunk_tokens(server),
                     host_pool=server_host_pool_tokens(server))
        # start from empty pools and fresh policy state: whatever the server ran while starting (its health
        # probes) is not in the offline replay, and a learning policy's decisions can turn on one extra node
        flush_when_idle(server)
        built["log_start"] = log_size(server)  # the run's prefill passes are logged after this
        yield server, built
    finally:
        server.stop()


def finished_run(name: str, server: Server, built: dict, sent: List[Sent], wall_s: float) -> ServerRun:
    """The run of a server that is still up: its answers and the counters it reports at the end."""
    stats = server.get("/tiers/stats") if SERVER_KINDS[name].kind == "tiered" else None
    eviction_s = metric_sum(server.get("/metrics"), "sglang:eviction_duration_seconds_sum")
    built = dict(built)
    batches = logged_prefill_batches(server, built.pop("log_start", 0))
    return ServerRun(name, sent, wall_s, stats, eviction_s=eviction_s, prefill_batches=batches, **built)


def row_sender(server: Server, trace: Trace, blocks: BlockTokens) -> Callable[[int], Sent]:
    reqs = trace.requests
    return lambda i: send_row(server, blocks.prompt(reqs[i].blocks), i, fields=row_fields(reqs[i]))


def run_server(name: str, trace: Trace, cfg: "LiveConfig", blocks: BlockTokens, log_dir: Path) -> ServerRun:
    from benchmarks.progress import track

    with started(name, cfg, log_dir) as (server, built):
        reqs = trace.requests
        bar = iter(track(range(len(reqs)), f"live {name}", unit="requests"))
        start = time.perf_counter()
        sent = send_rows(row_sender(server, trace, blocks), [r.time_s for r in reqs], cfg.speedup, cfg.concurrency,
                         progress=lambda: next(bar, None))
        return finished_run(name, server, built, sent, time.perf_counter() - start)


def run_interleaved(names: Sequence[str], trace: Trace, cfg: "LiveConfig", blocks: BlockTokens,
                    log_dir: Path) -> Dict[str, Any]:
    """Every server up at once, each row sent to each in turn (send_interleaved). Name -> ServerRun, or the
    RuntimeError of a server that did not start (the others still run). A server's `wall_s` is its own busy time,
    the sum of its requests' latencies, so its requests_per_s is what it served while it had the machine."""
    from benchmarks.progress import track

    runs: Dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        up = {}
        for name in names:
            try:
                up[name] = stack.enter_context(started(name, cfg, log_dir))
            except RuntimeError as e:
                runs[name] = e
        reqs = trace.requests
        bar = iter(track(range(len(reqs)), f"live {'+'.join(up)}", unit="rows"))
        sent = send_interleaved([row_sender(server, trace, blocks) for server, _ in up.values()],
                                [r.time_s for r in reqs], cfg.speedup, progress=lambda: next(bar, None))
        for (name, (server, built)), answers in zip(up.items(), sent):
            runs[name] = finished_run(name, server, built, answers, sum(a.ttft_s for a in answers))
    return {name: runs[name] for name in names}


def metric_sum(text, name: str) -> Optional[float]:
    """The sum over label sets of a Prometheus series in a /metrics page (None if absent)."""
    if not isinstance(text, str):
        return None
    values = [float(line.rsplit(None, 1)[1]) for line in text.splitlines()
              if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " ")]
    return sum(values) if values else None


def policy_ns(tier_stats: Optional[dict], name: str = "policy_ns") -> Optional[int]:
    """All policy calls' time in one of our servers (device-only: the device tier's; with the host tier: both
    tiers' policies, in `counters`); `name="shadow_ns"`: the part of it the self-tuner's shadows took."""
    if not tier_stats:
        return None
    counters = tier_stats.get("counters") or {}
    if name in counters:
        return int(counters[name])
    device = (tier_stats.get("tiers") or {}).get("device") or {}
    return int(device[name]) if name in device else None


def per_request_ms(ns: Optional[float], sent: Sequence[Sent]) -> Optional[float]:
    """`ns` nanoseconds over the rows sent, in milliseconds a row (None if either is missing)."""
    return ns / 1e6 / len(sent) if ns is not None and sent else None


def at_send_times(trace: Trace, sent: Sequence[Sent]) -> Trace:
    """The trace with each row at the time the live run sent it, from the trace's first time: the server's TTLs
    run on its clock, so the twin's must too (at `--speedup 0` a slice of many minutes goes out in seconds, and
    no TTL expires live that the trace's own times would expire). A row never sent keeps the time before it."""
    sent_at = {s.index: s.sent_s for s in sent if s.sent_s}
    if not sent_at or not trace.requests:
        return trace
    t0, first = trace.requests[0].time_s, min(sent_at.values())
    times, last = [], 0.0
    for i in range(len(trace.requests)):
        last = max(last, sent_at.get(i, last + first) - first)
        times.append(t0 + last)
    return replace(trace, requests=[replace(r, time_s=t) for r, t in zip(trace.requests, times)])


def offline_replay(name: str, trace: Trace, cfg: "LiveConfig", prefill_chunk: Optional[int] = None,
                   first_tokens: Optional[Dict[int, int]] = None, host_pool: Optional[int] = None,
                   in_flight: int = 1) -> dict:
    """The same rows replayed offline through the same classes, in the live server's units: one radix token per
    sent token id, each block starting with the id the server saw first in it (`first_tokens`: the tree's keys,
    and so the chains the self-tuner samples, are the server's), the one token each request generates cached
    after its prompt, and the server's chunked prefill: a long prompt's chunks are inserted, undecided, before it
    finishes; with the host tier, the host pool the server built (`host_pool`, tokens; None: the configured one);
    `in_flight` rows at once in batches of at most one chunk of new tokens (device only)."""
    from benchmarks.replay import ReplayConfig, replay

    spec = SERVER_KINDS[name]
    chunk = prefill_chunk if prefill_chunk and prefill_chunk > 0 else 0
    result = replay(trace, ReplayConfig(
        policy=spec.offline_policy, capacity_tokens=cfg.capacity_tokens,
        host_tokens=cfg.host_tokens if spec.host_tier else 0,
        radix_tokens_per_block=cfg.tokens_per_block, output_tokens=1, prefill_chunk_tokens=chunk,
        block_first_tokens=first_tokens, host_pool_radix_tokens=host_pool if spec.host_tier else None,
        in_flight=in_flight))
    return {"token_hit_rate": result.token_hit_rate, "hit_tokens_by_tier": result.hit_tokens_by_tier,
            "admissions_rejected": result.admissions_rejected, "radix_tokens_per_block": cfg.tokens_per_block,
            # with the host tier: the class the server runs (host_engine)
            "host_tier": result.config["host_tier"], "prefill_chunk_tokens": chunk}


def sent_tokens_by_tier(sent: Sequence[Sent], trace: Trace, k: int) -> Dict[str, int]:
    """Trace tokens the answered rows of `sent` hit, summed per tier."""
    by_tier: Dict[str, int] = {}
    for s in sent:
        if s.ok:
            for tier, tokens in hit_tokens_by_tier(trace.requests[s.index], s.cached_tokens, s.details, k,
                                                   trace.block_tokens).items():
                by_tier[tier] = by_tier.get(tier, 0) + tokens
    return by_tier


def summarize(run: ServerRun, trace: Trace, cfg: "LiveConfig") -> dict:
    reqs, k = trace.requests, cfg.tokens_per_block
    by_tier = sent_tokens_by_tier(run.sent, trace, k)
    full_hits = sum(live_hit_blocks(s.cached_tokens, len(reqs[s.index].blocks), k) == len(reqs[s.index].blocks)
                    for s in run.sent if s.ok)
    total = trace.total_input_tokens
    ok = [s for s in run.sent if s.ok]
    ttfts = sorted(s.ttft_s * 1000 for s in ok)
    return {
        "token_hit_rate": sum(by_tier.values()) / total if total else 0.0,
        "offline_token_hit_rate": run.offline["token_hit_rate"] if run.offline else None,
        "hit_tokens_by_tier": by_tier,
        "full_hit_rows": full_hits,
        "offline_hit_tokens_by_tier": run.offline["hit_tokens_by_tier"] if run.offline else None,
        "offline_admissions_rejected": run.offline["admissions_rejected"] if run.offline else None,
        "offline_radix_tokens_per_block": run.offline["radix_tokens_per_block"] if run.offline else None,
        "offline_host_tier": run.offline.get("host_tier") if run.offline else None,
        "offline_prefill_chunk_tokens": run.offline.get("prefill_chunk_tokens") if run.offline else None,
        "offline_in_flight_token_hit_rate": run.offline_in_flight["token_hit_rate"] if run.offline_in_flight
        else None,
        "offline_in_flight_admissions_rejected": run.offline_in_flight["admissions_rejected"]
        if run.offline_in_flight else None,
        "ttft_ms_p50": percentile(ttfts, 0.5),
        "ttft_ms_p90": percentile(ttfts, 0.9),
        "ttft_ms_p99": percentile(ttfts, 0.99),
        "ttft_ms_mean": statistics.fmean(ttfts) if ttfts else 0.0,
        "requests": len(ok),
        "failures": len(run.sent) - len(ok),
        "first_error": next((s.error for s in run.sent if not s.ok), None),
        "requests_per_s": len(ok) / run.wall_s if run.wall_s > 0 else 0.0,
        "wall_s": run.wall_s,
        "device_pool_tokens": run.pool_tokens,
        "prefill_batches": run.prefill_batches.passes if run.prefill_batches else None,
        "requests_per_prefill_batch": run.prefill_batches.requests / run.prefill_batches.passes
        if run.prefill_batches else None,
        # CPU spent deciding, per request: stock's is its eviction time, ours every policy call (eviction,
        # admission, recording) from /tiers/stats; both are the server's own clocks
        "eviction_ms_per_request": per_request_ms(None if run.eviction_s is None else run.eviction_s * 1e9,
                                                  run.sent),
        "policy_ms_per_request": per_request_ms(policy_ns(run.tier_stats), run.sent),
        "shadow_ms_per_request": per_request_ms(policy_ns(run.tier_stats, "shadow_ns"), run.sent),
        "tier_stats": run.tier_stats,
    }


# ---- configuration, CLI ----

@dataclass(frozen=True)
class LiveConfig:
    capacity_tokens: int
    host_tokens: int
    tokens_per_block: int
    block_tokens: int
    speedup: float
    concurrency: int
    interleave: bool = False  # every server up at once, each row sent to each in turn (send_interleaved)

    # pools in whole blocks, as the offline replay counts them (capacity // block_tokens blocks of K tokens): a
    # pool a few tokens larger puts an entry near a size-class edge on the other side of it
    @property
    def device_pool_tokens(self) -> int:
        return self.capacity_tokens // self.block_tokens * self.tokens_per_block

    @property
    def host_pool_tokens(self) -> int:
        return self.host_tokens // self.block_tokens * self.tokens_per_block

    @property
    def host_ratio(self) -> float:
        return self.host_tokens / self.capacity_tokens


def model_config() -> dict:
    """The embedded model's config.json (vocab_size, max_position_embeddings)."""
    from sglang_ext.embedded_model import ensure_embedded_model

    return json.loads((ensure_embedded_model() / "config.json").read_text())


def _run_or_error(name: str, trace: Trace, cfg: LiveConfig, blocks: BlockTokens, log_dir: Path):
    try:
        return run_server(name, trace, cfg, blocks, log_dir)
    except RuntimeError as e:
        return e


def live_replay(trace: Trace, names: Sequence[str], cfg: LiveConfig, log_dir: Path,
                vocab_size: Optional[int] = None) -> dict:
    blocks = BlockTokens(cfg.tokens_per_block, vocab_size or int(model_config()["vocab_size"]),
                         sibling_ranks(trace.requests))
    if cfg.interleave:
        runs = run_interleaved(names, trace, cfg, blocks, log_dir)
    else:
        runs = {name: _run_or_error(name, trace, cfg, blocks, log_dir) for name in names}
    out = {}
    for name, run in runs.items():
        if isinstance(run, RuntimeError):  # did not start: the other servers still ran; reported, and the exit is 1
            out[name] = {"error": str(run)[-2000:], "failures": len(trace.requests)}
            continue
        twin = at_send_times(trace, run.sent)  # the server's clock, for its TTLs
        run = replace(run, offline=offline_replay(name, twin, cfg, run.prefill_chunk, blocks.first_tokens(),
                                                  run.host_pool))
        if cfg.concurrency > 1 and not SERVER_KINDS[name].host_tier:
            run = replace(run, offline_in_flight=offline_replay(name, twin, cfg, run.prefill_chunk,
                                                                blocks.first_tokens(), in_flight=cfg.concurrency))
        out[name] = summarize(run, trace, cfg)
    config = {"trace": trace.path, "rows": len(trace.requests), "block_tokens": trace.block_tokens,
              "interleave": cfg.interleave,
              "capacity_tokens": cfg.capacity_tokens, "host_tokens": cfg.host_tokens,
              "tokens_per_block": cfg.tokens_per_block, "device_pool_tokens": cfg.device_pool_tokens,
              "host_pool_tokens": cfg.host_pool_tokens, "speedup": cfg.speedup, "concurrency": cfg.concurrency,
              "vocab_size": blocks.vocab, "prompt_tokens": trace.total_input_tokens,
              "offline_policies": {n: SERVER_KINDS[n].offline_policy for n in names}}
    return {"servers": out, "config": config}


def table(report: dict) -> str:
    rows = ["| server | live hit | offline hit | live - offline | TTFT p50 ms | p90 | p99 | mean | req/s | failures |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in report["servers"].items():
        if "error" in s:
            rows.append(f"| {name} | did not start: {s['error'].splitlines()[0]} |")
            continue
        off = s["offline_token_hit_rate"]
        diff = f"{s['token_hit_rate'] - off:+.4f}" if off is not None else "-"
        rows.append(f"| {name} | {s['token_hit_rate']:.4f} | {off:.4f} | {diff} | {s['ttft_ms_p50']:.1f} | "
                    f"{s['ttft_ms_p90']:.1f} | {s['ttft_ms_p99']:.1f} | {s['ttft_ms_mean']:.1f} | "
                    f"{s['requests_per_s']:.2f} | {s['failures']} |")
    return "\n".join(rows + ratio_lines(report["servers"]))


PAIRS = (("tiered", "stock"), ("tiered-host", "hicache"))


def ratio_lines(servers: dict) -> List[str]:
    """Ours over the stock server it replaces: TTFT mean and p99, hit rate."""
    lines = []
    for ours, stock in PAIRS:
        a, b = servers.get(ours), servers.get(stock)
        if not a or not b or "error" in a or "error" in b or not b["ttft_ms_mean"] or not b["ttft_ms_p99"]:
            continue
        line = (f"\n{ours} / {stock}: TTFT mean {a['ttft_ms_mean'] / b['ttft_ms_mean']:.2f}x, p99 "
                f"{a['ttft_ms_p99'] / b['ttft_ms_p99']:.2f}x; token hit rate {a['token_hit_rate']:.4f} vs "
                f"{b['token_hit_rate']:.4f}")
        ours_ms, stock_ms = a.get("policy_ms_per_request"), b.get("eviction_ms_per_request")
        if ours_ms is not None and stock_ms:
            shadows = a.get("shadow_ms_per_request")
            of_it = f"; the self-tuner's shadows {shadows:.3f} of it" if shadows else ""
            line += (f"; policy CPU {ours_ms:.3f} ms/request (every policy call{of_it}) vs stock's eviction "
                     f"{stock_ms:.3f} ms/request: {ours_ms / stock_ms:.2f}x")
        lines.append(line)
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    from benchmarks.cli_types import capacity, gigabytes, non_negative_float, non_negative_int, positive_int
    from benchmarks.fleet_replay import ROUTERS

    p.add_argument("--trace", required=True, help="JSONL trace: a path, a file under ../shared/traces/, "
                   "or 'conversation' / 'synthetic'")
    p.add_argument("--limit", type=positive_int, default=None, help="only the first N rows")
    p.add_argument("--capacity-tokens", type=capacity, required=True, help="device capacity in trace tokens")
    p.add_argument("--host-tokens", type=capacity, default=None,
                   help="host tier capacity in trace tokens for hicache/tiered-host (default: 2x the device)")
    p.add_argument("--tokens-per-block", type=positive_int, default=DEFAULT_TOKENS_PER_BLOCK,
                   help="token ids sent per trace block")
    p.add_argument("--block-tokens", type=positive_int, default=512, help="trace tokens per hash_ids block")
    p.add_argument("--servers", default="stock,tiered", help=f"comma-separated, of {', '.join(SERVER_KINDS)}")
    p.add_argument("--speedup", type=non_negative_float, default=0.0,
                   help="divide the trace's inter-arrival times by this (0, the default: send without waiting)")
    p.add_argument("--concurrency", type=positive_int, default=1, help="requests in flight at most")
    p.add_argument("--interleave", action="store_true",
                   help="start every server at once and send each row to each in turn (one request in flight in "
                        "all), so that their TTFTs are measured side by side under the same machine load")
    p.add_argument("--replicas", type=positive_int, default=1,
                   help="N > 1: each server kind as N replicas behind sglang-router, beside one with N x the pools "
                        "(benchmarks/fleet_replay.py)")
    p.add_argument("--router", default="cache_aware", choices=ROUTERS,
                   help="sglang-router policy in front of the replicas (manual: sticky by the row's session)")
    p.add_argument("--peer-capacity-gb", type=gigabytes, default=0.25, help="each peer's pool (fleet only)")
    p.add_argument("--router-args", default=None, metavar="FLAGS",
                   help="more sglang-router flags, one string (e.g. '--balance-abs-threshold 0')")
    p.add_argument("--peers", type=non_negative_int, default=0,
                   help="peer servers shared by the replicas (tiered-host only)")
    p.add_argument("--kill-replica-after", type=positive_int, default=None, metavar="K",
                   help="failover: SIGKILL replica 0 just before row K is sent (needs --replicas 2 or more)")
    p.add_argument("--log-dir", default=None, help="server logs (default: a new temporary folder)")
    p.add_argument("--json", action="store_true")


def check_args(args, parser) -> List[str]:
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    unknown = [n for n in names if n not in SERVER_KINDS]
    if not names or unknown or len(set(names)) != len(names):
        parser.error(f"argument --servers: want distinct names of {', '.join(SERVER_KINDS)}, got {args.servers!r}")
    from benchmarks.trace import resolve_trace_path

    try:
        resolve_trace_path(args.trace)
    except FileNotFoundError as e:
        parser.error(f"argument --trace: {e}")
    if args.capacity_tokens < args.block_tokens:
        parser.error(f"argument --capacity-tokens: {args.capacity_tokens} is less than one block")
    if args.host_tokens is not None and args.host_tokens < args.block_tokens:
        parser.error(f"argument --host-tokens: {args.host_tokens} is less than one block")
    if args.interleave and (args.concurrency != 1 or args.replicas != 1):
        parser.error("argument --interleave: one request in flight in all, one replica each (--concurrency 1, "
                     "--replicas 1)")
    return names


def main(args) -> int:
    from benchmarks import fleet_replay
    from benchmarks.trace import load_trace

    parser = args._parser
    names = check_args(args, parser)
    fleet = fleet_replay.check_fleet_args(args, names, parser)
    trace = load_trace(args.trace, args.block_tokens, limit=args.limit)
    host = args.host_tokens if args.host_tokens is not None else 2 * args.capacity_tokens
    cfg = LiveConfig(args.capacity_tokens, host, args.tokens_per_block, args.block_tokens, args.speedup,
                     args.concurrency, args.interleave)
    model = model_config()
    longest = max((len(r.blocks) for r in trace.requests), default=0) * cfg.tokens_per_block
    room = min(cfg.device_pool_tokens, int(model["max_position_embeddings"]) - 1)  # one position for the reply
    if longest > room:
        parser.error(f"the longest prompt ({longest} tokens) does not fit the device pool "
                     f"({cfg.device_pool_tokens} tokens) or the model's context: raise --capacity-tokens or "
                     f"lower --tokens-per-block")
    log_dir = Path(args.log_dir or tempfile.mkdtemp(prefix="live-replay-"))
    # SIGTERM unwinds like an exception, so the `finally` that stops the running server runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if fleet:
        blocks = BlockTokens(cfg.tokens_per_block, int(model["vocab_size"]), sibling_ranks(trace.requests))
        report = fleet_replay.fleet_replay(trace, names, cfg, fleet, log_dir, blocks)
    else:
        report = live_replay(trace, names, cfg, log_dir, int(model["vocab_size"]))
    if args.json:
        print(json.dumps(report, indent=2))  # servers in the order run
    else:
        print(fleet_replay.table(report) if fleet else table(report))
    return 0 if all(s["failures"] == 0 for s in report["servers"].values()) else 1
