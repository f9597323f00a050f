"""The replay's device + host tiers: the host-tier cache class the server runs, on simulated pools.

Design note
- `tinylfu` and every `tiers` policy: our TieredHiRadixCache (what `sglang_ext.launch_server` builds with the
  host tier on); `lru`/`lfu`/`slru`/`priority`: SGLang's own HiRadixCache with that eviction strategy. Both are
  built by `sglang_ext.simulated_host` with counting pools and a controller whose copies complete at once: the
  KV copy is the only simulated part.
- Units as in `engines.py`: a trace block is R radix tokens, capacities are in trace tokens and become
  `capacity // block_tokens * R` radix tokens per pool. SGLang's load-back threshold (10 server tokens) is taken
  in radix tokens standing for `block_tokens / R` trace tokens each.
- One request, as the scheduler serves it with HiCache at concurrency 1: `sglang_ext.simulated_host.serve_request`
  (match, load back the host part, evict the shortfall, cache_finished_req, acknowledge the copies; the
  self-tuner's host-tier shadows serve requests with it too), whose cache_finished_req here is
  engines.insert_finished (prompt + output, then the prompt alone; ours with the request's TTL stashed, as
  ServedRequests does), freeing what the insert found cached already. With `prefill_chunk` (the live server's
  chunked_prefill_size, in radix tokens) a long prompt is prefilled chunk by chunk: each chunk is allocated, then
  inserted, marked chunked, as cache_unfinished_req does (engines.insert_chunks, the TTL stashed too), before the
  next is allocated; the request's protected length moves to each chunk's end, as SGLang's `cache_protected_len`
  does, so only what an insert found cached beyond the request's own is freed. A prompt longer than the device
  pool keeps its head, as StockRadixEngine does.
- TieredHiRadixCache is built in strict mode, as create_simulated is: a policy whose view drifts from the tree
  raises instead of falling back to SGLang's order.
- Hits, in blocks: device = the match's device indices, host = what init_load_back loaded. The replay loop
  asks the device engine for its hit and then the tiers below for theirs; `HostTiers` is that "below" for
  this engine: the host part of the request just served, then (with `--peer-tokens`) the peer tier, still the
  victim-cache model of lower_tiers.py, fed with what the host pool evicts.
"""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace
from typing import Dict, Iterator, Mapping, Optional, Sequence

from benchmarks.engines import (STOCK_POLICIES, TIERED_PREFIX, Access, EngineStats, OutputTokens, RadixUnits,
                               insert_chunks, insert_finished, logical_radix_time)
from benchmarks.lower_tiers import LowerTiers, TierCounters, TierSpec
from benchmarks.trace import Request
from tiers.shadow import tuning_at


@contextlib.contextmanager
def logical_tree_time() -> Iterator[None]:
    """logical_radix_time for HiRadixCache too: its module stamps nodes from its own `time`, and both trees'
    stamps must come from one counter to keep their order."""
    from sglang.srt.mem_cache import hiradix_cache, radix_cache

    with logical_radix_time():
        saved = hiradix_cache.time
        hiradix_cache.time = radix_cache.time
        try:
            yield
        finally:
            hiradix_cache.time = saved


class HostTierEngine:
    """Device + host tiers through HiRadixCache (stock policies) or TieredHiRadixCache (ours)."""

    def __init__(self, policy: str, capacity_blocks: int, host_blocks: int, clock, block_tokens: int,
                 policy_config: Optional[dict] = None, radix_tokens_per_block: int = 1, output_tokens: int = 0,
                 tuning=None, first_tokens: Optional[Mapping[int, int]] = None, prefill_chunk: int = 0,
                 host_pool: Optional[int] = None):
        from sglang.srt.mem_cache.hiradix_cache import HiRadixCache

        from sglang_ext.simulated_host import load_back_threshold, simulated_hicache

        if capacity_blocks <= 0 or host_blocks <= 0:
            raise ValueError(f"device and host must hold a block each, got {capacity_blocks} and {host_blocks}")
        self.units = RadixUnits(radix_tokens_per_block, first_tokens)
        self.outputs = OutputTokens(output_tokens, prefill_chunk)
        r = radix_tokens_per_block
        self.capacity = capacity_blocks * r
        threshold = load_back_threshold(block_tokens / r)
        host = host_pool or host_blocks * r  # radix tokens: a live server's own size where the twin has it
        self.stock = policy in STOCK_POLICIES
        if self.stock:
            self.cache = simulated_hicache(HiRadixCache, self.capacity, host, load_back_threshold=threshold,
                                           eviction_policy=policy, eviction_policy_config=policy_config)
        else:
            from sglang_ext.tiered_hicache import TieredHiRadixCache

            ours = policy[len(TIERED_PREFIX):] if policy.startswith(TIERED_PREFIX) else policy
            self.cache = simulated_hicache(TieredHiRadixCache, self.capacity, host,
                                           load_back_threshold=threshold, policy=ours, policy_config=policy_config,
                                           clock=clock, strict=True, tuning=tuning)
        self.device_pool = self.cache.token_to_kv_pool_allocator
        self.controller = self.cache.cache_controller
        self.last_host_blocks = 0
        self._evict_ns = 0

    @property
    def name(self) -> str:
        return type(self.cache).__mro__[1].__name__  # the class under the simulated constructor

    def access(self, req: Request) -> Access:
        from sglang.srt.mem_cache.radix_cache import RadixKey

        from sglang_ext.simulated_host import serve_request

        units, outputs = self.units, self.outputs
        # a prompt longer than the device pool keeps its head (its output still has to fit)
        ids = units.tokens(req.blocks[: (self.capacity - outputs.per_request) // units.per_block])
        output = outputs.of(ids)
        key = RadixKey(outputs.match_key(ids), cache_salt=req.tenant)  # tenants are namespaces, as in a server
        served = serve_request(self.cache, key, len(ids) + len(output),
                               lambda protected: self._finish(ids, output, req, protected), output_tokens=len(output),
                               chunk_ends=lambda prefix: outputs.chunk_ends(len(ids), prefix),
                               insert_chunk=lambda end, protected: self._insert_chunk(ids, req, end, protected))
        self._evict_ns += served.evict_ns
        device_hit, loaded = served.device_tokens, served.host_tokens
        self._count_hits(device_hit, loaded)
        device_blocks = outputs.hit_blocks(device_hit, ids, units.per_block)
        self.last_host_blocks = outputs.hit_blocks(device_hit + loaded, ids, units.per_block) - device_blocks
        evicted_host = units.blocks(self.controller.host_evicted)
        self.controller.host_evicted = []
        return Access(hit_blocks=device_blocks, evicted=evicted_host)

    def _insert_chunk(self, ids, req: Request, end: int, protected: int) -> None:
        """A chunked prefill's cache_unfinished_req(chunked=True): the prompt up to `end` joins the tree."""
        with self._request_state(req):
            result = insert_chunks(self.cache, ids, [end], req.priority, req.tenant)
        self._free_computed_twice(result.prefix_len, protected)

    def _finish(self, ids, output, req: Request, protected: int) -> None:
        """cache_finished_req: insert prompt + output, then free the tokens the insert found cached already beyond
        the request's own (`protected`: its prefix and chunks; the rest was computed twice)."""
        with self._request_state(req):
            result = insert_finished(self.cache, ids, output, req.priority, req.tenant)
        self._free_computed_twice(result.prefix_len, protected)

    @contextlib.contextmanager
    def _request_state(self, req: Request):
        """Ours: the request's TTL stashed while its inserts run, as ServedRequests does in cache_*_req."""
        if not self.stock:
            self.cache._request_ttl_s = req.ttl_s
        try:
            yield
        finally:
            if not self.stock:
                self.cache._request_ttl_s = None

    def _free_computed_twice(self, prefix_len: int, protected: int) -> None:
        if prefix_len > protected:
            self.device_pool.free(range(protected, prefix_len))

    def _count_hits(self, device: int, host: int) -> None:
        if not self.stock:  # ours counts hits per tier from SGLang's split of the cached prefix
            self.cache._count_hits(SimpleNamespace(cached_tokens=device + host, cached_tokens_device=device,
                                                   cached_tokens_host=host, cached_tokens_storage=0))

    def stats(self) -> EngineStats:
        per_block = self.units.per_block
        if self.stock:
            return EngineStats(evictions=self.device_pool.free_calls,
                               evicted_blocks=self.device_pool.freed_tokens // per_block, admissions_rejected=0,
                               policy_ns=self._evict_ns)
        device = self.cache.tier_counters()["device"]
        counters = self.cache.counters()
        tuner = self.cache.tuner
        return EngineStats(evictions=device["evictions"], evicted_blocks=device["evicted_tokens"] // per_block,
                           admissions_rejected=0, policy_ns=counters["policy_ns"], shadow_ns=counters["shadow_ns"],
                           tuning=dataclasses.asdict(tuner.stats()) if tuner is not None else None)

    def host_counters(self, block_tokens: int) -> TierCounters:
        """The host tier's counters in the replay's terms (trace tokens; rejections are the policy's refusals)."""
        per_block = self.units.per_block
        rejected = 0 if self.stock else self.cache.tier_counters()["host"]["rejected"]
        return TierCounters(stored_tokens=self.controller.written_tokens // per_block * block_tokens,
                            evicted_blocks=self.controller.mem_pool_host.freed_tokens // per_block,
                            rejected_blocks=rejected)


class HostTiers:
    """The tiers below the device for HostTierEngine, in LowerTiers' interface: the host part comes from the
    request the engine just served; the peer tier, if any, is LowerTiers' victim cache fed by host evictions."""

    def __init__(self, engine: HostTierEngine, block_tokens: int, peer_blocks: int = 0, lower_policy: str = "lru",
                 clock=None):
        self.engine, self.block_tokens = engine, block_tokens
        self.peer = (LowerTiers([TierSpec("peer", peer_blocks)], policy=lower_policy, clock=clock,
                                block_tokens=block_tokens) if peer_blocks > 0 else None)
        self.names = ["host"] + (self.peer.names if self.peer else [])
        self._host = TierCounters()

    @property
    def counters(self) -> Dict[str, TierCounters]:
        from dataclasses import replace

        host = replace(self.engine.host_counters(self.block_tokens), hit_blocks=self._host.hit_blocks,
                       hit_tokens=self._host.hit_tokens, loaded_tokens=self._host.loaded_tokens)
        return {"host": host, **(self.peer.counters if self.peer else {})}

    def lookup(self, blocks: Sequence[int], start: int, sizes: Sequence[int]) -> Dict[str, int]:
        host = self.engine.last_host_blocks
        tokens = sum(sizes[start:start + host])
        self._host.hit_blocks += host
        self._host.hit_tokens += tokens
        self._host.loaded_tokens += tokens
        found = {"host": host}
        if self.peer:
            found.update(self.peer.lookup(blocks, start + host, sizes))
        return found

    def demote(self, blocks: Sequence[int]) -> None:
        """Blocks the host evicted go to the peer tier (nothing else leaves the host tier for it)."""
        if self.peer and blocks:
            self.peer.demote(blocks)


def host_tier_engine(cfg, block_tokens: int, clock):
    """(engine, the tiers below it) for the replay loop, from a ReplayConfig whose host tier is on."""
    bt = block_tokens
    tuning = tuning_at(cfg.shadow_rate, cfg.shadow_seed, host_tier=True, settings=cfg.shadow_settings)
    engine = HostTierEngine(cfg.policy, cfg.capacity_tokens // bt, cfg.host_tokens // bt, clock, bt,
                            cfg.policy_config, cfg.radix_tokens_per_block, cfg.output_tokens, tuning,
                            cfg.block_first_tokens, cfg.prefill_chunk_tokens, cfg.host_pool_radix_tokens)
    return engine, HostTiers(engine, bt, cfg.peer_tokens // bt, cfg.lower_policy, clock)
