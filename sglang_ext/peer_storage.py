"""HiCache L3 backend that keeps KV pages in the DRAM of peer block servers (sglang_ext.peer_server).

Enable with
    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config '{"backend_name": "peer",
      "module_path": "sglang_ext.peer_storage", "class_name": "PeerStorage", "interface_v1": 1,
      "peers": "127.0.0.1:P1,127.0.0.1:P2"}'
Optional extra-config keys: "peer_timeout_s" (2.0), "peer_backoff_s" (2.0: how long a failed peer is
skipped), "replicate_after_hits" (2: reads of a page before it is copied to a second peer), "tenant" ("").

Design
- Placement: rendezvous hashing over the configured peer list. A page's candidates are its two
  highest-scoring peers; it is written to the first one that is up, read from the first one that holds
  it. Adding or losing a peer moves only the pages that scored highest on it.
- Replication: a page read `replicate_after_hits` times is written to its other candidate too, right
  after the read, while its bytes are in the host pool we were given.
- Zero copy: pages move between the peer's pool and SGLang's host pool directly (the host pool buffer is
  registered with NIXL once; `get_page_buffer_meta` gives each page's pieces). The generic
  (non-v1) calls go through a small registered staging buffer.
- Keys: SGLang's page hashes (already seeded with cache_salt / extra_key) inside a namespace naming
  tenant, model, dtype, layout, page size and the TP/PP/CP rank, as HiCacheFile suffixes its files.
- Failure model: a peer that fails, times out, or serves a page whose checksum does not match only
  produces misses (False / 0 hits); nothing raises into SGLang and every call is bounded by the timeout.
  A failed peer is skipped for `peer_backoff_s`, then retried with a fresh connection.

Threading: SGLang calls this from four threads. Each `PeerClient` serializes its own calls; the small
bookkeeping state here (down-until times, hit counts) is guarded by `self._lock`, never held while
talking to a peer. The staging buffer has its own lock.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo
from tiers.peer.client import PeerClient
from tiers.clock import Clock, MonotonicClock
from transfer.base import Range, Transport, TransferError

logger = logging.getLogger(__name__)

_HIT_TABLE_SIZE = 1 << 16  # keys whose read counts we remember (oldest forgotten first)


@dataclass(frozen=True)
class PeerStorageStats:
    hits: int
    misses: int
    corrupt: int
    peer_errors: int
    stored: int
    store_failures: int
    replicated: int


def parse_peers(spec: Any) -> List[Tuple[str, int]]:
    """'h1:p1,h2:p2' (or a list of such strings) -> [(h1, p1), (h2, p2)]; a clear error otherwise."""
    items = spec.split(",") if isinstance(spec, str) else list(spec or [])
    peers = []
    for item in (i.strip() for i in items):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"peer storage: bad peer address {item!r} in 'peers' (want host:port)")
        peers.append((host, int(port)))
    if not peers:
        raise ValueError("peer storage: extra config 'peers' lists no peer (want 'host:port,host:port')")
    if len(set(peers)) != len(peers):
        raise ValueError(f"peer storage: duplicate peer in 'peers': {spec!r}")
    return peers


def rendezvous_order(key: str, peer_ids: Sequence[str]) -> List[int]:
    """Peer indices by decreasing highest-random-weight score for `key`."""
    def score(i: int) -> int:
        digest = hashlib.blake2b(f"{peer_ids[i]}|{key}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")

    return sorted(range(len(peer_ids)), key=score, reverse=True)


def _namespace(config: HiCacheStorageConfig, tenant: str, revision: str) -> str:
    model = (config.model_name or "").replace("/", "-")
    parts = [f"tenant={tenant}", f"model={model}", f"rev={revision}"]
    if not config.is_mla_model:
        parts.append(f"tp={config.tp_rank}/{config.tp_size}")
    if config.pp_size > 1:
        parts.append(f"pp={config.pp_rank}/{config.pp_size}")
    if config.attn_cp_size > 1:
        parts.append(f"cp={config.attn_cp_rank}/{config.attn_cp_size}")
    return "|".join(parts)


class PeerStorage(HiCacheStorage):
    def __init__(
        self,
        storage_config: HiCacheStorageConfig,
        kwargs: Optional[dict] = None,
        *,
        transport: Optional[Transport] = None,
        clock: Optional[Clock] = None,
    ):
        extra = dict(storage_config.extra_config or {})
        self.peers = parse_peers(extra.get("peers"))
        self.timeout_s = float(extra.get("peer_timeout_s", 2.0))
        self.backoff_s = float(extra.get("peer_backoff_s", 2.0))
        self.replicate_after = int(extra.get("replicate_after_hits", 2))
        if self.timeout_s <= 0 or self.backoff_s < 0 or self.replicate_after < 1:
            raise ValueError("peer storage: need peer_timeout_s > 0, peer_backoff_s >= 0, replicate_after_hits >= 1")
        self._base_ns = _namespace(storage_config, str(extra.get("tenant", "")), str(extra.get("model_revision", "")))
        self.namespace = ""  # completed by register_mem_pool_host (dtype, layout, page size)
        self._peer_ids = [f"{h}:{p}" for h, p in self.peers]
        self._transport = transport  # created at registration when not injected (no side effects here)
        self._owns_transport = transport is None
        self._clock = clock or MonotonicClock()
        self._lock = threading.Lock()
        self._down_until: Dict[int, float] = {}
        self._reads: "OrderedDict[str, int]" = OrderedDict()
        self._n = dict(hits=0, misses=0, peer_errors=0, stored=0, store_failures=0, replicated=0)
        self._clients: List[PeerClient] = []
        self._staging: Optional[torch.Tensor] = None
        self._staging_region = None
        self._staging_lock = threading.Lock()
        self.page_bytes = 0

    # --- setup ---
    def register_mem_pool_host(self, mem_pool_host) -> None:
        buf = getattr(mem_pool_host, "kv_buffer", None)
        if not isinstance(buf, torch.Tensor) or not hasattr(mem_pool_host, "get_page_buffer_meta"):
            raise ValueError(
                f"peer storage needs a host pool with one kv_buffer tensor (MHA/MLA); got {type(mem_pool_host).__name__}"
            )
        super().register_mem_pool_host(mem_pool_host)
        pool = mem_pool_host
        _, sizes = pool.get_page_buffer_meta(torch.arange(pool.page_size, dtype=torch.int64))
        self.page_bytes = int(sum(sizes))
        self._pieces = len(sizes)
        self.namespace = (
            f"{self._base_ns}|dtype={pool.dtype}|layout={pool.layout}|page={pool.page_size}|bytes={self.page_bytes}"
        )
        if self._transport is None:
            from transfer.nixl_transport import NixlTransport, use_loopback_only

            if all(h in ("127.0.0.1", "localhost") for h, _ in self.peers):
                use_loopback_only()
            self._transport = NixlTransport("hicache")
        self._transport.register(buf.data_ptr(), buf.numel() * buf.element_size())
        self._clients = [
            PeerClient(h, p, self._transport, self.page_bytes, timeout_s=self.timeout_s) for h, p in self.peers
        ]

    def close(self) -> None:
        for c in self._clients:
            c.close()
        if self._owns_transport and self._transport is not None:
            self._transport.close()

    def stats(self) -> PeerStorageStats:
        corrupt = sum(c.corrupt_pages for c in self._clients)
        with self._lock:
            return PeerStorageStats(**self._n, corrupt=corrupt)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._n[name] += n

    # --- peer health ---
    def _up(self, i: int) -> bool:
        with self._lock:
            return self._down_until.get(i, float("-inf")) <= self._clock.now()

    def _failed(self, i: int, err: Exception) -> None:
        logger.warning("peer %s unavailable for %.1fs: %s", self._peer_ids[i], self.backoff_s, err)
        with self._lock:
            self._down_until[i] = self._clock.now() + self.backoff_s
            self._n["peer_errors"] += 1

    def _on_peer(self, i: int, fn, *args) -> Optional[List[bool]]:
        """Run a client call on peer i; None if the peer is down or fails (it is then marked down)."""
        if not self._up(i):
            return None
        try:
            return fn(self._clients[i], *args)
        except TransferError as e:
            self._failed(i, e)
            return None

    def _candidates(self, key: str) -> List[int]:
        return rendezvous_order(key, self._peer_ids)[:2]

    # --- page geometry ---
    def _pages_of(self, host_indices: torch.Tensor, n: int) -> List[List[Range]]:
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices[: n * self.mem_pool_host.page_size])
        k = self._pieces
        return [list(zip(ptrs[j * k : (j + 1) * k], sizes[j * k : (j + 1) * k])) for j in range(n)]

    # --- the core: exists / get / put over the candidate peers ---
    def _exists(self, keys: List[str]) -> List[bool]:
        found = [False] * len(keys)
        for rank in range(2):
            groups: Dict[int, List[int]] = {}
            for j, key in enumerate(keys):
                cands = self._candidates(key)
                if not found[j] and rank < len(cands):
                    groups.setdefault(cands[rank], []).append(j)
            for i, idx in groups.items():
                res = self._on_peer(i, PeerClient.exists, self.namespace, [keys[j] for j in idx])
                for j, ok in zip(idx, res or []):
                    found[j] = found[j] or ok
        return found

    def _get(self, keys: List[str], pages: List[List[Range]]) -> List[bool]:
        got = [False] * len(keys)
        source: Dict[int, int] = {}
        for rank in range(2):
            groups: Dict[int, List[int]] = {}
            for j, key in enumerate(keys):
                cands = self._candidates(key)
                if not got[j] and rank < len(cands):
                    groups.setdefault(cands[rank], []).append(j)
            for i, idx in groups.items():
                res = self._on_peer(i, PeerClient.get, self.namespace, [keys[j] for j in idx], [pages[j] for j in idx])
                for j, ok in zip(idx, res or []):
                    if ok:
                        got[j], source[j] = True, i
        hits = sum(got)
        self._count("hits", hits)
        self._count("misses", len(keys) - hits)
        self._replicate_hot(keys, pages, source)
        return got

    def _replicate_hot(self, keys: List[str], pages: List[List[Range]], source: Dict[int, int]) -> None:
        due: Dict[int, List[int]] = {}
        with self._lock:
            for j, i in source.items():
                n = self._reads.pop(keys[j], 0) + 1
                self._reads[keys[j]] = n
                if n == self.replicate_after:
                    others = [c for c in self._candidates(keys[j]) if c != i]
                    if others:
                        due.setdefault(others[0], []).append(j)
            while len(self._reads) > _HIT_TABLE_SIZE:
                self._reads.popitem(last=False)
        for i, idx in due.items():
            res = self._on_peer(i, PeerClient.put, self.namespace, [keys[j] for j in idx], [pages[j] for j in idx])
            self._count("replicated", sum(res or []))

    def _put(self, keys: List[str], pages: List[List[Range]]) -> List[bool]:
        stored = [False] * len(keys)
        groups: Dict[int, List[int]] = {}
        for j, key in enumerate(keys):
            up = [i for i in self._candidates(key) if self._up(i)]
            if up:
                groups.setdefault(up[0], []).append(j)
        for i, idx in groups.items():
            res = self._on_peer(i, PeerClient.put, self.namespace, [keys[j] for j in idx], [pages[j] for j in idx])
            for j, ok in zip(idx, res or []):
                stored[j] = ok
        self._count("stored", sum(stored))
        self._count("store_failures", len(keys) - sum(stored))
        return stored

    def _guard(self, what: str, fn, n: int, default):
        """The SGLang-facing wrapper: never raise, never report more than the peers confirmed."""
        if not self._clients:
            logger.error("peer storage: %s before register_mem_pool_host", what)
            return default
        try:
            return fn()
        except Exception:  # a bug here must cost a miss, not the scheduler
            logger.exception("peer storage: %s of %d page(s) failed", what, n)
            return default

    # --- HiCacheStorage, v1 (zero copy) ---
    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        def run() -> int:
            found = self._exists(list(keys))
            return found.index(False) if False in found else len(found)

        return self._guard("batch_exists", run, len(keys), 0)

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        return self._guard("batch_get_v1", lambda: self._get(list(keys), self._pages_of(host_indices, len(keys))),
                           len(keys), [False] * len(keys))

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        return self._guard("batch_set_v1", lambda: self._put(list(keys), self._pages_of(host_indices, len(keys))),
                           len(keys), [False] * len(keys))

    # --- HiCacheStorage, generic (tensors; through the staging buffer) ---
    def _staging_pages(self, n: int) -> List[List[Range]]:
        """n page-sized ranges of the registered staging buffer (grown on demand). Hold _staging_lock."""
        if self._staging is None or self._staging.numel() < n * self.page_bytes:
            if self._staging is not None:
                self._transport.deregister(self._staging_region)
            self._staging = torch.empty(max(n, 16) * self.page_bytes, dtype=torch.uint8)
            self._staging_region = self._transport.register(self._staging.data_ptr(), self._staging.numel())
        base = self._staging.data_ptr()
        return [[(base + j * self.page_bytes, self.page_bytes)] for j in range(n)]

    def _staging_view(self, j: int) -> torch.Tensor:
        return self._staging[j * self.page_bytes : (j + 1) * self.page_bytes]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Optional[torch.Tensor]]:
        def run():
            with self._staging_lock:
                got = self._get(list(keys), self._staging_pages(len(keys)))
                out: List[Optional[torch.Tensor]] = []
                for j, ok in enumerate(got):
                    target = target_locations[j] if target_locations is not None else None
                    if not ok:
                        out.append(None)
                    elif target is None:
                        out.append(self._staging_view(j).clone())
                    else:
                        target.view(-1).view(torch.uint8).copy_(self._staging_view(j))
                        out.append(target)
                return out

        return self._guard("batch_get", run, len(keys), [None] * len(keys))

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        def run() -> bool:
            with self._staging_lock:
                pages = self._staging_pages(len(keys))
                for j, value in enumerate(values):
                    flat = value.contiguous().view(-1).view(torch.uint8)
                    if flat.numel() != self.page_bytes:
                        raise ValueError(f"value {j} holds {flat.numel()} bytes, a page is {self.page_bytes}")
                    self._staging_view(j).copy_(flat)
                return all(self._put(list(keys), pages))

        return self._guard("batch_set", run, len(keys), False)

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1
