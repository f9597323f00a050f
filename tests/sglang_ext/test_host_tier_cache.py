"""TieredHiRadixCache's own bookkeeping on SGLang's real HiRadixCache tree code (insert, split, match).

The edge faked here is what HiRadixCache.__init__ builds around the tree: the host KV pool and the controller
that copies pages to it (they need a model's KV pool and a process group). The stand-in controller accepts a
write at once while its host pool has room, which is all the tree code asks of it.
"""

from array import array

import torch

from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.hiradix_cache import HiRadixCache
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
from sglang_ext.tiered_hicache import TieredHiRadixCache
from tiers.clock import ManualClock


class HostPool:
    def __init__(self, size):
        self.size, self.used = size, 0

    def available_size(self):
        return self.size - self.used

    def clear(self):
        self.used = 0


class Controller:
    write_policy = "write_through_selective"

    def __init__(self, host_tokens):
        self.mem_pool_host = HostPool(host_tokens)

    def reset(self):
        self.mem_pool_host.clear()

    def write(self, device_indices, node_id, **_):
        n = len(device_indices)
        if self.mem_pool_host.available_size() < n:
            return None
        start = self.mem_pool_host.used
        self.mem_pool_host.used += n
        return torch.arange(start, start + n)


class DeviceAlloc:
    device = "cpu"

    def __init__(self, size):
        self.size = size


def host_cache(monkeypatch, sketch_seed=0, host_tokens=256) -> TieredHiRadixCache:
    def stand_in_init(self, params, server_args):
        self.cache_controller = Controller(host_tokens)
        self.token_to_kv_pool_host = self.cache_controller.mem_pool_host
        self.prefetch_loaded_tokens_by_reqid = {}
        self.evictable_host_leaves = set()
        self.ongoing_write_through = {}
        self.enable_storage = False
        RadixCache.__init__(self, params)

    monkeypatch.setattr(HiRadixCache, "__init__", stand_in_init)
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=DeviceAlloc(256),
                             page_size=1)
    return TieredHiRadixCache(params, None, clock=ManualClock(), sketch_seed=sketch_seed)


def ins(cache, toks, chunked=False):
    key = RadixKey(array("q", toks))
    return cache.insert(InsertParams(key=key, value=torch.arange(len(toks), dtype=torch.int64), chunked=chunked))


def test_a_split_gives_the_back_part_its_own_sketch_key_and_the_front_keeps_the_old_one(monkeypatch):
    cache = host_cache(monkeypatch)
    ins(cache, [1, 2, 3, 4])
    leaf = cache.root_node.children[1]
    before = cache._sketch_key(leaf)
    ins(cache, [1, 2, 5])  # splits [1,2,3,4] into [1,2] -> [3,4]
    front = cache.root_node.children[1]
    assert front is not leaf and leaf.parent is front
    assert cache._sketch_key(front) == before
    assert cache._sketch_key(leaf) != cache._sketch_key(front)
    assert cache._sketch_key(leaf) == hash((before, 3))


def test_the_host_sketch_is_seeded_at_random_unless_a_seed_is_injected(monkeypatch):
    a, b = host_cache(monkeypatch, sketch_seed=None), host_cache(monkeypatch, sketch_seed=None)
    assert a.sketch._seed != b.sketch._seed  # 64 random bits each: equal with probability 2**-63
    c, d = host_cache(monkeypatch, sketch_seed=7), host_cache(monkeypatch, sketch_seed=7)
    assert c.sketch._seed == d.sketch._seed


def test_a_ttl_insert_retains_each_node_of_its_path_once_and_refreshes_nothing(monkeypatch):
    cache = host_cache(monkeypatch)
    r = cache.retention
    cache._request_ttl_s = 60.0
    ins(cache, [1, 2, 3])
    assert (r.retains, r.refreshes, r.retained_size) == (1, 0, 3)
    ins(cache, [1, 2, 3, 4])  # the old node and the new one: two retentions, no hit refresh
    assert (r.retains, r.refreshes, r.retained_size) == (3, 0, 4)
    ins(cache, [1, 2, 3, 4], chunked=True)  # a topology-only re-insert: every node is retained already
    assert (r.retains, r.refreshes) == (3, 0)


def test_a_split_of_a_retained_node_keeps_the_retained_size_true(monkeypatch):
    cache = host_cache(monkeypatch)
    cache._request_ttl_s = 60.0
    ins(cache, [1, 2, 3])
    cache._request_ttl_s = None
    ins(cache, [1, 5])  # splits the retained [1,2,3]: the retained back part holds 2 tokens now
    back = cache.root_node.children[1].children[2]
    assert cache.retention.is_retained(back)
    assert cache.retention.retained_size == len(back.key) == 2


def test_the_stand_in_runs_sglangs_own_insert(monkeypatch):
    """The harness drives HiRadixCache.insert itself: its sizes add up as SGLang keeps them."""
    cache = host_cache(monkeypatch)
    ins(cache, [1, 2, 3, 4, 5, 6])
    ins(cache, [1, 2, 3, 9])
    assert cache.evictable_size_ + cache.protected_size_ == 7
