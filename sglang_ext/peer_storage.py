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
  produces misses (False / 0 hits); nothing raises into SGLang. Each SGLang-facing call has ONE deadline,
  `peer_timeout_s` from its start, shared by everything it does (both candidate peers, the replication
  put); a peer not reached before it is skipped, not blamed. A failed peer is skipped for
  `peer_backoff_s`, then retried with a fresh connection.
- Late reads (transfer/base.py): a READ that missed the deadline may still land later, and NIXL cannot
  cancel it. Reads go straight into HiCache's host pool (no staging copy) on the normal path; on that slow
  path the pages it targets are reserved: reported as misses, and when HiCache frees them (it does, for a
  failed prefetch) they are held back from the pool's free list until the READ settles, then freed. This
  wraps the host pool's `free` (the one place pages go back to HiCache's allocator); `clear()` (a flush)
  is not covered. A staging buffer a late READ targets is abandoned and replaced. A peer with a late
  read is skipped until it settles, so each peer reserves at most one batch.

Threading: SGLang calls this from four threads (and `free` from the scheduler). Each `PeerClient`
serializes its own calls; the bookkeeping here (down-until times, hit counts, reserved pages) is guarded by
`self._lock`, never held while talking to a peer or calling into the host pool. The staging buffer has
its own lock, taken before `self._lock`.
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
from sglang_ext.tier_config import parse_peers
from tiers.peer.client import PeerClient
from tiers.clock import Clock, MonotonicClock
from transfer.base import Range, Region, Transport, TransferError, TransferTimeout, Unsettled, deadline_in, remaining

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
    reserved_pages: int  # pages a late READ may still write, kept from reuse until it settles


@dataclass(eq=False)  # compared by identity
class _Reserved:
    """Memory a late READ from peer `peer` may still write: `tokens` of the host pool, or a staging buffer."""

    late: Unsettled
    peer: int
    pages: int
    tokens: Optional[torch.Tensor] = None
    staging: Optional[Tuple[torch.Tensor, Region]] = None


@dataclass(frozen=True)
class _LateGroup:
    late: Unsettled
    peer: int
    idx: List[int]  # positions in the call's keys


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
        self._reserved: List[_Reserved] = []
        self._held: List[torch.Tensor] = []  # reserved host tokens HiCache already freed
        self._pool_free = None  # the host pool's own `free`
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
        if self._pool_free is None:
            self._pool_free, pool.free = pool.free, self._free_host_tokens
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
            return PeerStorageStats(**self._n, corrupt=corrupt, reserved_pages=sum(r.pages for r in self._reserved))

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._n[name] += n

    # --- peer health ---
    def _up(self, i: int) -> bool:
        with self._lock:
            if any(r.peer == i for r in self._reserved):
                return False  # its late read has not settled
            return self._down_until.get(i, float("-inf")) <= self._clock.now()

    def _failed(self, i: int, err: Exception) -> None:
        logger.warning("peer %s unavailable for %.1fs: %s", self._peer_ids[i], self.backoff_s, err)
        with self._lock:
            self._down_until[i] = self._clock.now() + self.backoff_s
            self._n["peer_errors"] += 1

    def _on_peer(self, i: int, fn, *args, deadline: float, lates: Optional[List[_LateGroup]] = None,
                 idx: Sequence[int] = ()):
        """Run a client call on peer i by `deadline`; None if the peer is down, out of time, or fails (it
        is then marked down). A READ that missed the deadline and may still land goes to `lates`."""
        if not self._up(i) or remaining(deadline) <= 0:
            return None
        try:
            return fn(self._clients[i], *args, deadline=deadline)
        except TransferError as e:
            late = getattr(e, "unsettled", None) if isinstance(e, TransferTimeout) else None
            if late is not None and lates is not None:
                lates.append(_LateGroup(late, i, list(idx)))
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
    def _by_candidate(self, keys: List[str], rank: int, skip: Sequence[bool]) -> Dict[int, List[int]]:
        """Positions of the keys not in `skip`, grouped by their rank-th candidate peer."""
        groups: Dict[int, List[int]] = {}
        for j, key in enumerate(keys):
            cands = self._candidates(key)
            if not skip[j] and rank < len(cands):
                groups.setdefault(cands[rank], []).append(j)
        return groups

    def _exists(self, keys: List[str], deadline: float) -> List[bool]:
        found = [False] * len(keys)
        for rank in range(2):
            for i, idx in self._by_candidate(keys, rank, found).items():
                res = self._on_peer(i, PeerClient.exists, self.namespace, [keys[j] for j in idx], deadline=deadline)
                for j, ok in zip(idx, res or []):
                    found[j] = found[j] or ok
        return found

    def _get(self, keys: List[str], pages: List[List[Range]], deadline: float) -> Tuple[List[bool], List[_LateGroup]]:
        """Read pages from their candidates; (hits, late reads whose pages must be reserved by the caller)."""
        sums: List[Optional[str]] = [None] * len(keys)
        done = [False] * len(keys)  # a hit, or memory a late read may still write: not read again
        source: Dict[int, int] = {}
        lates: List[_LateGroup] = []
        for rank in range(2):
            for i, idx in self._by_candidate(keys, rank, done).items():
                res = self._on_peer(i, PeerClient.get_verified, self.namespace, [keys[j] for j in idx],
                                    [pages[j] for j in idx], deadline=deadline, lates=lates, idx=idx)
                for j, c in zip(idx, res or []):
                    if c is not None:
                        sums[j], done[j], source[j] = c, True, i
            for group in lates:
                for j in group.idx:
                    done[j] = True
        got = [c is not None for c in sums]
        hits = sum(got)
        self._count("hits", hits)
        self._count("misses", len(keys) - hits)
        self._replicate_hot(keys, pages, source, sums, deadline)
        return got, lates

    def _replicate_hot(self, keys: List[str], pages: List[List[Range]], source: Dict[int, int],
                       sums: List[Optional[str]], deadline: float) -> None:
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
        for i, idx in due.items():  # the checksums just verified are these bytes': no second hashing
            res = self._on_peer(i, PeerClient.put, self.namespace, [keys[j] for j in idx], [pages[j] for j in idx],
                                [sums[j] for j in idx], deadline=deadline)
            self._count("replicated", sum(res or []))

    def _put(self, keys: List[str], pages: List[List[Range]], deadline: float) -> List[bool]:
        stored = [False] * len(keys)
        groups: Dict[int, List[int]] = {}
        for j, key in enumerate(keys):
            up = [i for i in self._candidates(key) if self._up(i)]
            if up:
                groups.setdefault(up[0], []).append(j)
        for i, idx in groups.items():
            res = self._on_peer(i, PeerClient.put, self.namespace, [keys[j] for j in idx], [pages[j] for j in idx],
                                deadline=deadline)
            for j, ok in zip(idx, res or []):
                stored[j] = ok
        self._count("stored", sum(stored))
        self._count("store_failures", len(keys) - sum(stored))
        return stored

    # --- late reads: pages kept from reuse until the READ settles ---
    def _reserve(self, entry: _Reserved) -> None:
        logger.warning("peer %s: a late READ may still write %d page(s); they stay reserved until it ends",
                       self._peer_ids[entry.peer], entry.pages)
        with self._lock:
            self._reserved.append(entry)

    def _reserve_host_pages(self, lates: List[_LateGroup], host_indices: torch.Tensor) -> None:
        ps = self.mem_pool_host.page_size
        for g in lates:
            tokens = torch.cat([host_indices[j * ps : (j + 1) * ps] for j in g.idx]).cpu()
            self._reserve(_Reserved(g.late, g.peer, len(g.idx), tokens=tokens))

    def _reserved_tokens(self) -> Optional[torch.Tensor]:
        """Host tokens of unsettled late reads (None: none). Hold self._lock."""
        parts = [r.tokens for r in self._reserved if r.tokens is not None]
        return torch.cat(parts) if parts else None

    def _free_host_tokens(self, indices: torch.Tensor) -> int:
        """Installed as the host pool's `free`: reserved tokens are held back until their READ settles."""
        self._settle()
        n = len(indices)
        with self._lock:
            reserved = self._reserved_tokens()
            if reserved is not None:
                indices = indices.cpu()
                held = torch.isin(indices, reserved)
                self._held.append(indices[held])
                indices = indices[~held]
        self._pool_free(indices)
        return n

    def _settle(self) -> None:
        """Poll late reads; free what HiCache gave back meanwhile, and drop abandoned staging buffers."""
        with self._lock:
            entries = list(self._reserved)
        done = [r for r in entries if r.late.settled()]  # polls NIXL: outside our lock
        if not done:
            return
        with self._lock:
            self._reserved = [r for r in self._reserved if r not in done]
            held = torch.cat(self._held) if self._held else torch.empty(0, dtype=torch.int64)
            still = self._reserved_tokens()
            keep = torch.isin(held, still) if still is not None else torch.zeros_like(held, dtype=torch.bool)
            self._held = [held[keep]] if bool(keep.any()) else []
            release = held[~keep]
        if release.numel():
            self._pool_free(release)
        for r in done:  # a staging buffer two late reads target goes when the last one settles
            if r.staging is not None and not any(x.staging is r.staging for x in self._reserved):
                self._transport.deregister(r.staging[1])

    def _guard(self, what: str, fn, n: int, default):
        """The SGLang-facing wrapper: never raise, never report more than the peers confirmed."""
        if not self._clients:
            logger.error("peer storage: %s before register_mem_pool_host", what)
            return default
        try:
            self._settle()
            return fn(deadline_in(self.timeout_s))
        except Exception:  # a bug here must cost a miss, not the scheduler
            logger.exception("peer storage: %s of %d page(s) failed", what, n)
            return default

    # --- HiCacheStorage, v1 (zero copy) ---
    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        def run(deadline: float) -> int:
            found = self._exists(list(keys), deadline)
            return found.index(False) if False in found else len(found)

        return self._guard("batch_exists", run, len(keys), 0)

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        def run(deadline: float) -> List[bool]:
            got, lates = self._get(list(keys), self._pages_of(host_indices, len(keys)), deadline)
            self._reserve_host_pages(lates, host_indices)
            return got

        return self._guard("batch_get_v1", run, len(keys), [False] * len(keys))

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        return self._guard("batch_set_v1", lambda d: self._put(list(keys), self._pages_of(host_indices, len(keys)), d),
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
        def run(deadline: float):
            with self._staging_lock:
                got, lates = self._get(list(keys), self._staging_pages(len(keys)), deadline)
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
                if lates:  # a late READ may still write the staging buffer: leave it to that READ
                    staging = (self._staging, self._staging_region)
                    for g in lates:
                        self._reserve(_Reserved(g.late, g.peer, len(g.idx), staging=staging))
                    self._staging, self._staging_region = None, None
                return out

        return self._guard("batch_get", run, len(keys), [None] * len(keys))

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        def run(deadline: float) -> bool:
            with self._staging_lock:
                pages = self._staging_pages(len(keys))
                for j, value in enumerate(values):
                    flat = value.contiguous().view(-1).view(torch.uint8)
                    if flat.numel() != self.page_bytes:
                        raise ValueError(f"value {j} holds {flat.numel()} bytes, a page is {self.page_bytes}")
                    self._staging_view(j).copy_(flat)
                return all(self._put(list(keys), pages, deadline))

        return self._guard("batch_set", run, len(keys), False)

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        return self.batch_get([key], [target_location] if target_location is not None else None)[0]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1
