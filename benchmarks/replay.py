"""Replay one trace through one device policy (plus optional host/peer tiers) and measure it.

Per request, in trace order: the injected ManualClock is set to the row's timestamp (so session TTLs follow
trace time), the device engine serves the request (match, evict, insert), the lower tiers continue the prefix
the device missed, and the blocks the device evicted, or computed and declined to keep, are demoted. Hit rates are token-weighted: a hit block
counts its real token count (the last block of a prompt may be partial).

With a host tier (`host_tokens` > 0), a radix policy's device and host tiers are the class the server runs with
HiCache, on simulated pools (benchmarks.host_engine: SGLang's HiRadixCache for stock policies, our
TieredHiRadixCache for ours); the reference engines and the peer tier keep the victim-cache model of lower_tiers.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass, field
from typing import Dict, Mapping, Optional

from benchmarks.cost import DEFAULT_KV_BYTES_PER_TOKEN, Profile
from benchmarks.engines import REFERENCE_ENGINES, STOCK_POLICIES, make_engine
from benchmarks.host_engine import host_tier_engine, logical_tree_time
from benchmarks.lower_tiers import LowerTiers, TierSpec
from benchmarks.trace import Trace
from tiers.shadow import TuningConfig, tuning_at


@dataclass(frozen=True)
class ReplayConfig:
    policy: str
    capacity_tokens: int
    host_tokens: int = 0
    peer_tokens: int = 0
    lower_policy: str = "lru"
    session_ttl_s: Optional[float] = None  # TTL for rows that have a session but no ttl_s of their own
    profile: Optional[Profile] = None
    policy_config: Optional[dict] = None
    progress: Optional[bool] = False  # True: always; None: on a terminal (benchmarks.progress); False: never
    # radix tokens standing for one trace block in the device tree (1: one per block; a server has one per
    # prompt token); capacities stay in trace tokens, so the result should not depend on it
    radix_tokens_per_block: int = 1
    # tokens each request generates, cached after its prompt as SGLang's cache_finished_req does and never
    # asked for again (benchmarks.engines); live-replay's offline twin uses 1, as its requests do
    output_tokens: int = 0
    # the live server's chunked_prefill_size in radix tokens (0: no chunks), for the live replay's twin
    prefill_chunk_tokens: int = 0
    # block -> the token id a live server sees first in it (the live replay's twin: engines.RadixUnits), so that
    # the twin's tree keys, and the blocks the self-tuner samples by their hashes, are the server's
    block_first_tokens: Optional[Mapping[int, int]] = None
    # the host pool a live server built, in radix tokens (None: host_tokens' blocks): SGLang adds a page to
    # int(device x ratio), so the live replay's twin takes the size from the server's start-up log
    host_pool_radix_tokens: Optional[int] = None
    # the server's --tier-shadow-rate (tiers.shadow: self-tuning from shadow caches; 0: off); the device-only
    # tree of the project's policies runs it, as the server does
    shadow_rate: float = TuningConfig.sample_rate
    # which chains its sample takes (tiers.shadow.TuningConfig.sample_seed; the server's is 0)
    shadow_seed: int = 0
    # its candidates, the server's --tier-shadow-settings (tiers.shadow.parse_settings; empty: the defaults)
    shadow_settings: str = ""
    # rows the device runs at once, as a server's batch (device only, radix engines): all are matched and given
    # their KV (evicting room for it) before any is cached; then each is cached in trace order. 1: one at a time.
    # With prefill_chunk_tokens, a batch also stops at that many new tokens, as SGLang's PrefillAdder fills one
    in_flight: int = 1


@dataclass(frozen=True)
class ReplayResult:
    trace: str
    policy: str
    capacity_tokens: int
    block_tokens: int
    requests: int
    input_tokens: int
    token_hit_rate: float
    block_hits: int
    hit_rate_by_tier: Dict[str, float]
    hit_tokens_by_tier: Dict[str, int]
    prefill_tokens_saved: int
    bytes_moved_by_tier: Dict[str, Dict[str, int]]
    evictions: int
    evicted_blocks: int
    admissions_rejected: int
    policy_ns_per_request: float
    shadow_ns_per_request: float  # of policy_ns_per_request, the self-tuner's miniature caches'
    replay_seconds: float
    kv_bytes_per_token: int
    profile: Optional[str] = None
    prefill_seconds_saved: Optional[float] = None
    prefill_seconds_saved_by_tier: Optional[Dict[str, float]] = None
    config: Dict[str, object] = field(default_factory=dict)
    tuning: Optional[Dict[str, object]] = None  # the self-tuner at the end (tiers.shadow.TuningStats), if one ran

    def to_dict(self) -> dict:
        return asdict(self)


def replay(trace: Trace, cfg: ReplayConfig) -> ReplayResult:
    from tiers.clock import ManualClock

    bt = trace.block_tokens
    _check(cfg, bt)
    reqs = trace.requests
    clock = ManualClock(reqs[0].time_s if reqs else 0.0)
    specs = [TierSpec(n, t // bt) for n, t in (("host", cfg.host_tokens), ("peer", cfg.peer_tokens)) if t > 0]
    lower = LowerTiers(specs, policy=cfg.lower_policy, clock=clock, block_tokens=bt)
    uses_radix = cfg.policy not in REFERENCE_ENGINES
    # with a host tier, a radix policy runs the host-tier cache class the server runs (benchmarks.host_engine)
    host_engine = uses_radix and cfg.host_tokens > 0
    with (logical_tree_time() if uses_radix else contextlib.nullcontext()):
        if host_engine:
            engine, lower = host_tier_engine(cfg, bt, clock)
        else:
            engine = device_engine(trace, cfg, clock, tuning_at(cfg.shadow_rate, cfg.shadow_seed,
                                                                settings=cfg.shadow_settings))
        served = _serve(engine, lower if specs else None, reqs, cfg, clock, bt)
    return _result(trace, cfg, engine, lower, served, host_engine)


def device_engine(trace: Trace, cfg: ReplayConfig, clock, tuning: Optional[TuningConfig]):
    """The device-only engine the replay serves `cfg.policy` with (`tuning`: the self-tuner, for ours)."""
    return make_engine(cfg.policy, cfg.capacity_tokens // trace.block_tokens, trace.requests, clock,
                       cfg.policy_config, cfg.radix_tokens_per_block, cfg.output_tokens, cfg.prefill_chunk_tokens,
                       tuning, cfg.block_first_tokens)


def arrive(req, cfg: ReplayConfig, clock):
    """The row as the engine serves it: the clock moved to its time, the session TTL given where it has none."""
    clock.set(max(clock.now(), req.time_s))
    if req.ttl_s is None and req.session is not None and cfg.session_ttl_s is not None:
        return _with_ttl(req, cfg.session_ttl_s)
    return req


def _check(cfg: ReplayConfig, block_tokens: int) -> None:
    if cfg.capacity_tokens < block_tokens:
        raise ValueError(f"capacity_tokens {cfg.capacity_tokens} is below one block ({block_tokens} tokens)")
    if cfg.radix_tokens_per_block < 1:
        raise ValueError(f"radix_tokens_per_block must be >= 1, got {cfg.radix_tokens_per_block}")
    if cfg.in_flight < 1:
        raise ValueError(f"in_flight must be >= 1, got {cfg.in_flight}")
    if cfg.in_flight > 1 and (cfg.host_tokens or cfg.peer_tokens or cfg.policy in REFERENCE_ENGINES):
        raise ValueError("in_flight > 1 is for a radix policy on the device alone (no host or peer tier)")


@dataclass(frozen=True)
class _Served:
    device_hit_tokens: int
    block_hits: int
    seconds: float


def _serve(engine, lower: Optional[LowerTiers], reqs, cfg: ReplayConfig, clock, bt: int) -> _Served:
    """Every request in trace order: the device engine, then the lower tiers (if any) for what it missed."""
    device_hit_tokens = block_hits = 0
    t_start = time.perf_counter()  # after the engine is built: SGLang's import is not replay time
    for req, access in _accesses(engine, _progress(reqs, cfg), cfg, clock):
        block_hits += access.hit_blocks
        device_hit_tokens += req.hit_tokens(access.hit_blocks, bt)
        if lower is not None:
            sizes = [req.block_size(i, bt) for i in range(len(req.blocks))]
            found = lower.lookup(req.blocks, access.hit_blocks, sizes)
            block_hits += sum(found.values())
            lower.demote(access.evicted)
            lower.demote(access.declined)
    return _Served(device_hit_tokens, block_hits, time.perf_counter() - t_start)


def _accesses(engine, reqs, cfg: ReplayConfig, clock):
    """(row, what the device did for it), in trace order: one row at a time, or `cfg.in_flight` rows started
    together (each matched, locked and given its KV) before the first of them is cached."""
    if cfg.in_flight == 1:
        for req in reqs:
            req = arrive(req, cfg, clock)
            yield req, engine.access(req)
        return
    batch, budget = [], cfg.prefill_chunk_tokens
    for req in reqs:
        batch.append(arrive(req, cfg, clock))
        if len(batch) == cfg.in_flight:
            batch = yield from _run_batch(engine, batch, budget)
    while batch:
        batch = yield from _run_batch(engine, batch, budget)


def _run_batch(engine, batch, budget: int = 0):
    """Start the rows in order while the pool has room for them, as SGLang's scheduler fills a batch, then
    finish them. Returns the rows left waiting, to start first in the next batch. A row that does not fit with
    nothing else running is served alone (a prompt longer than the cache is cut as one at a time).

    `budget` (radix tokens; 0: none) is the server's chunked prefill size: SGLang's PrefillAdder puts at most that
    many new (unmatched) tokens into one prefill batch, chunking the row that crosses it, which is then the batch's
    last. The twin ends the batch at that row too, and runs it whole."""
    started, waiting, new_tokens = [], [], 0
    for i, req in enumerate(batch):
        if budget and new_tokens >= budget:
            waiting = batch[i:]
            break
        s = engine.start(req)
        if s is not None:
            started.append(s)
            new_tokens += s.held  # the KV it computes: its prompt past the cached prefix, and its output
        elif started:
            waiting = batch[i:]
            break
        else:
            yield req, engine.access(req)
    for s in started:
        yield s.req, engine.finish(s)
    return waiting


def _result(trace: Trace, cfg: ReplayConfig, engine, lower: LowerTiers, served: _Served,
            host_engine: bool) -> ReplayResult:
    stats = engine.stats()
    reqs, bt = trace.requests, trace.block_tokens
    kv_bytes = cfg.profile.kv_bytes_per_token if cfg.profile else DEFAULT_KV_BYTES_PER_TOKEN
    total = trace.total_input_tokens
    hit_tokens = {"device": served.device_hit_tokens}
    hit_tokens.update({n: c.hit_tokens for n, c in lower.counters.items()})
    saved = sum(hit_tokens.values())
    bytes_moved = {
        n: {"load": c.loaded_tokens * kv_bytes, "store": c.stored_tokens * kv_bytes}
        for n, c in lower.counters.items()
    }
    by_tier_s = cfg.profile.seconds_saved(hit_tokens) if cfg.profile else None
    return ReplayResult(
        trace=trace.path,
        policy=cfg.policy,
        capacity_tokens=cfg.capacity_tokens,
        block_tokens=bt,
        requests=len(reqs),
        input_tokens=total,
        token_hit_rate=saved / total if total else 0.0,
        block_hits=served.block_hits,
        hit_rate_by_tier={n: (v / total if total else 0.0) for n, v in hit_tokens.items()},
        hit_tokens_by_tier=hit_tokens,
        prefill_tokens_saved=saved,
        bytes_moved_by_tier=bytes_moved,
        evictions=stats.evictions,
        evicted_blocks=stats.evicted_blocks,
        admissions_rejected=stats.admissions_rejected + sum(c.rejected_blocks for c in lower.counters.values()),
        policy_ns_per_request=stats.policy_ns / len(reqs) if reqs else 0.0,
        shadow_ns_per_request=stats.shadow_ns / len(reqs) if reqs else 0.0,
        replay_seconds=served.seconds,
        kv_bytes_per_token=kv_bytes,
        profile=cfg.profile.name if cfg.profile else None,
        prefill_seconds_saved=sum(by_tier_s.values()) if by_tier_s else None,
        prefill_seconds_saved_by_tier=by_tier_s,
        config=_config(cfg, engine.name if host_engine else ("victim-cache model" if cfg.host_tokens > 0 else None)),
        tuning=getattr(stats, "tuning", None),
    )


def _config(cfg: ReplayConfig, host_tier: Optional[str]) -> Dict[str, object]:
    return {
        "host_tokens": cfg.host_tokens,
        "peer_tokens": cfg.peer_tokens,
        "lower_policy": cfg.lower_policy,
        "session_ttl_s": cfg.session_ttl_s,
        "stock": cfg.policy in STOCK_POLICIES,
        "radix_tokens_per_block": cfg.radix_tokens_per_block,
        "output_tokens": cfg.output_tokens,
        "prefill_chunk_tokens": cfg.prefill_chunk_tokens,
        "shadow_rate": cfg.shadow_rate,
        "shadow_seed": cfg.shadow_seed,
        "shadow_settings": cfg.shadow_settings,
        "in_flight": cfg.in_flight,
        "host_tier": host_tier,
    }


def _with_ttl(req, ttl_s):
    from dataclasses import replace

    return replace(req, ttl_s=ttl_s)


def _progress(reqs, cfg: ReplayConfig):
    if cfg.progress is False:
        return reqs
    from benchmarks.progress import track

    return track(reqs, f"replay {cfg.policy}@{cfg.capacity_tokens:g}", enabled=cfg.progress, unit="requests")
