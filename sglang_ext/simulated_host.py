"""SGLang's HiRadixCache (or our TieredHiRadixCache) on simulated pools, for the offline replay.

Design note
-----------
HiRadixCache.__init__ builds a host KV pool and a HiCacheController around the tree; both need a model's device
KV pool, CUDA streams and a process group. `simulated_hicache(cls, ...)` builds the same class with that one edge
replaced: pools that count tokens (no KV memory) and a controller whose copies complete at once. The tree and
everything done to it (match_prefix, init_load_back / load_back, insert and its write-through backups, device
eviction, host eviction, the acknowledgements in check_hicache_events: writing_check, loading_check) is SGLang's
code, and for TieredHiRadixCache ours on top of it. It is what `create_simulated` is for the device-only tree.

The stand-in controller keeps the real one's contract: `write` takes host slots (None when the host pool is
short) and queues an acknowledgement; `load` takes device slots (None when the device pool is short) and queues
the copy until `start_loading` (the scheduler's ready_to_load_host_cache) turns it into an acknowledgement;
`evict_device` / `evict_host` give slots back. Pools count tokens; an index names no memory. A copy carries its
source indices over (host indices = the device indices written, device indices = the host indices loaded), so
when the replay inserts each radix token id as its own KV index, the indices a pool gets back name the tokens
that left it (`host_evicted`).

Threading: none; the caller (the replay) plays the scheduler thread.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, List, NamedTuple, Optional, Sequence


from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InitLoadBackParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode

# HiRadixCache does not load a host prefix shorter than this many server tokens (its load_back_threshold)
SGLANG_LOAD_BACK_THRESHOLD = 10


def load_back_threshold(server_tokens_per_radix_token: float) -> int:
    """SGLang's threshold in radix tokens, when one radix token stands for that many server tokens."""
    return max(1, math.ceil(SGLANG_LOAD_BACK_THRESHOLD / server_tokens_per_radix_token))


class CountingPool:
    """A KV pool of `size` tokens that only counts: what is taken, what comes back."""

    device = "cpu"

    def __init__(self, size: int):
        if size <= 0:
            raise ValueError(f"a pool must hold at least one token, got {size}")
        self.size = int(size)
        self.used = 0
        self.free_calls = 0
        self.freed_tokens = 0

    def available_size(self) -> int:
        return self.size - self.used

    def take(self, n: int) -> bool:
        if n > self.available_size():
            return False
        self.used += n
        return True

    def free(self, indices) -> None:
        self.used -= len(indices)
        self.free_calls += 1
        self.freed_tokens += len(indices)

    def clear(self) -> None:
        self.used = 0


class _Done:
    """The event of a copy that completed when it was queued."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass


@dataclass
class _Ack:
    """What writing_check / loading_check read of an acknowledgement."""

    node_ids: List[int]
    finish_event: _Done = field(default_factory=_Done)
    start_event: _Done = field(default_factory=_Done)
    num_tokens_by_pool: dict = field(default_factory=dict)
    num_bytes: int = 0
    timing_enabled: bool = False


class InstantController:
    """HiCacheController's interface to the tree, with copies that complete at once."""

    def __init__(self, device: CountingPool, host: CountingPool, write_policy: str = "write_through",
                 record_host_evictions: bool = True):
        self.mem_pool_device_allocator = device
        self.mem_pool_host = host
        self.write_policy = write_policy
        self.ack_write_queue: List[_Ack] = []
        self.ack_load_queue: List[_Ack] = []
        self.load_queue: List[int] = []
        self.written_tokens = 0
        self.host_evicted: List[int] = []  # host indices given back (the replay's token ids), for a tier below
        self._record_host_evictions = record_host_evictions  # off where nobody drains host_evicted (shadows)

    def reset(self) -> None:
        self.ack_write_queue.clear()
        self.ack_load_queue.clear()
        self.load_queue.clear()

    def write(self, device_indices, priority=None, node_id: int = -1, **_):
        if not self.mem_pool_host.take(len(device_indices)):
            return None
        self.written_tokens += len(device_indices)
        self.ack_write_queue.append(_Ack([node_id]))
        return device_indices.clone()

    def load(self, host_indices, priority=None, node_id: int = -1, **_):
        if not self.mem_pool_device_allocator.take(len(host_indices)):
            return None
        self.load_queue.append(node_id)
        return host_indices.clone()

    def start_loading(self) -> int:
        if not self.load_queue:
            return -1
        self.ack_load_queue.append(_Ack(list(self.load_queue)))  # one merged operation, as the real one
        self.load_queue.clear()
        return 0

    def evict_device(self, device_indices) -> int:
        self.mem_pool_device_allocator.free(device_indices)
        return len(device_indices)

    def evict_host(self, host_indices, backup_only: bool = True) -> int:
        self.mem_pool_host.free(host_indices)
        if self._record_host_evictions:
            self.host_evicted.extend(int(i) for i in host_indices.tolist())
        return len(host_indices)


@dataclass(frozen=True)
class SimulatedHost:
    """What the stand-in takes in place of ServerArgs."""

    host_tokens: int
    write_policy: str = "write_through"
    load_back_threshold: int = SGLANG_LOAD_BACK_THRESHOLD
    record_host_evictions: bool = True


class SimulatedHiRadixCache(HiRadixCache):
    """SGLang's HiRadixCache whose constructor builds the counting pools and the instant controller; every
    other method is SGLang's (or, through `simulated_hicache`, a subclass's)."""

    def __init__(self, params: CacheInitParams, server_args: SimulatedHost):
        sim = server_args
        self._enable_metrics_flag = False
        self.page_size = params.page_size
        self.kv_cache = None
        self.token_to_kv_pool_host = CountingPool(sim.host_tokens)
        self.cache_controller = InstantController(params.token_to_kv_pool_allocator, self.token_to_kv_pool_host,
                                                  sim.write_policy, sim.record_host_evictions)
        # one rank, no pipeline: SGLang's all-reduces of ready counts are then no-ops
        self.tp_group = self.attn_cp_group = self.attn_tp_group = self.pp_group = None
        self.tp_world_size, self.pp_rank, self.pp_size = 1, 0, 1
        self.work_list = []
        self.enable_storage = self.enable_storage_metrics = False
        self.extra_metric_labels = None
        self.ongoing_write_through, self.ongoing_load_back = {}, {}
        self.ongoing_prefetch, self.ongoing_backup = {}, {}
        self.prefetch_loaded_tokens_by_reqid = {}
        self.write_through_threshold = 1 if sim.write_policy == "write_through" else 2
        self.load_back_threshold = sim.load_back_threshold
        self.evictable_host_leaves = set()
        RadixCache.__init__(self, params)


_CLASSES = {HiRadixCache: SimulatedHiRadixCache}


def simulated_class(cls: type) -> type:
    """`cls` (HiRadixCache or a subclass) with the simulated constructor underneath its own."""
    if cls not in _CLASSES:
        if not issubclass(cls, HiRadixCache):
            raise TypeError(f"{cls.__name__} is not a HiRadixCache")
        _CLASSES[cls] = type(f"Simulated{cls.__name__}", (cls, SimulatedHiRadixCache),
                            {"__module__": __name__})
    return _CLASSES[cls]


def simulated_hicache(cls: type, device_tokens: int, host_tokens: int, *,
                      load_back_threshold: int = SGLANG_LOAD_BACK_THRESHOLD, eviction_policy: str = "lru",
                      eviction_policy_config=None, write_policy: str = "write_through",
                      record_host_evictions: bool = True, **kwargs):
    """A `cls` (page size 1) over a device pool of `device_tokens` and a host pool of `host_tokens`; `kwargs` go to
    `cls`'s constructor (TieredHiRadixCache's policy, clock, ...). `record_host_evictions`: keep the host indices
    given back in `cache_controller.host_evicted`, for a caller that drains them after each request."""
    params = CacheInitParams(disable=False, req_to_token_pool=None,
                             token_to_kv_pool_allocator=CountingPool(device_tokens), page_size=1,
                             eviction_policy=eviction_policy, eviction_policy_config=eviction_policy_config)
    sim = SimulatedHost(host_tokens, write_policy, load_back_threshold, record_host_evictions)
    # HiRadixCache's constructor (its reset) restarts SGLang's node counter, which every tree in the process
    # shares; a shadow built while the live tree serves would hand the live tree's ids out again, and the live
    # tree keys its copies in flight by node id (`ongoing_load_back`: two nodes, one id, a KeyError at the ack).
    counter = TreeNode.counter
    try:
        return simulated_class(cls)(params, sim, **kwargs)
    finally:
        TreeNode.counter = max(counter, TreeNode.counter)


class Served(NamedTuple):
    device_tokens: int  # the request's prefix found on the device
    host_tokens: int  # and below it, loaded back from the host
    evict_ns: int  # perf_counter_ns spent in the allocator's eviction for it


def serve_request(cache, key, total_tokens: int, finish: Callable[[int], None], output_tokens: int = 0,
                  chunk_ends: Callable[[int], Sequence[int]] = lambda prefix: (),
                  insert_chunk: Optional[Callable[[int, int], None]] = None) -> Served:
    """One request on a simulated HiRadixCache, as the scheduler serves it with HiCache at concurrency 1.

    1. match_prefix of `key`: the device prefix, and the host-only part below it (`host_hit_length`);
    2. with the device prefix locked (PrefillAdder's temporary lock), init_load_back of the host part (all or
       nothing); the request then holds a lock on its prefix until it finishes;
    3. the allocator: if fewer device tokens are free than the request's `total_tokens` less its prefix, evict
       the shortfall (the prefix is locked), then take them; in two rounds when the last `output_tokens` of them
       are generated (the prompt's KV, then the output's: two rounds do not always take the victims one round
       takes for the sum). A chunked prefill (`chunk_ends(prefix)`: the prompt lengths its chunks end at) takes
       each chunk first, and caches it as cache_unfinished_req(chunked=True) does: `insert_chunk(end, protected)`,
       then a match of the chunk, whose last node the request locks instead;
    4. ready_to_load_host_cache, then `finish(protected)` (the request's cache_finished_req; `protected`: its
       prefix and its own chunks, which the tree holds), unlock;
    5. check_hicache_events, which the next scheduling round runs first: writing_check and loading_check
       acknowledge the copies (all complete) and release the locks SGLang took for them.
    """
    match = cache.match_prefix(MatchPrefixParams(key=key))
    device_hit, node = len(match.device_indices), match.last_device_node
    loaded = evict_ns = 0
    if match.host_hit_length > 0:
        cache.inc_lock_ref(node)
        values, loaded_node = cache.init_load_back(
            InitLoadBackParams(best_match_node=match.best_match_node, host_hit_length=match.host_hit_length))
        cache.dec_lock_ref(node)
        loaded, node = len(values), loaded_node
    cache.inc_lock_ref(node)
    protected = device_hit + loaded
    for end in chunk_ends(protected):
        evict_ns += _allocate(cache, end - protected)
        insert_chunk(end, protected)
        chunk_node = cache.match_prefix(MatchPrefixParams(key=key[:end])).last_device_node
        cache.dec_lock_ref(node)
        cache.inc_lock_ref(chunk_node)
        node, protected = chunk_node, end
    computed = total_tokens - protected
    output = min(output_tokens, computed)
    for need in (computed - output, output):
        evict_ns += _allocate(cache, need)
    cache.ready_to_load_host_cache()
    finish(protected)
    cache.dec_lock_ref(node)
    cache.check_hicache_events()
    return Served(device_hit, loaded, evict_ns)


def _allocate(cache, need: int) -> int:
    """Take `need` device tokens, evicting the shortfall first (what is locked stays); the eviction's ns."""
    pool, evict_ns = cache.token_to_kv_pool_allocator, 0
    short = need - pool.available_size()
    if short > 0:
        t0 = time.perf_counter_ns()
        cache.evict(EvictParams(num_tokens=short))
        evict_ns = time.perf_counter_ns() - t0
    if not pool.take(need):
        raise RuntimeError(f"{need} device tokens not free after eviction")
    return evict_ns
