"""Peer block server: a DRAM pool of KV pages that other hosts read and write over NIXL.

    python -m sglang_ext.peer_server --host 127.0.0.1 --port P --capacity-gb X [--policy lru]

Design
- The pool is one registered byte array cut into fixed-size slots, one page per slot. The slot size is
  set by `--page-bytes` or by the first client's hello ("formatted on first use"); a client with another
  page size is refused, and treats the peer as unavailable.
- A page is stored under a scoped key (namespace, key). Keys are opaque strings built by the client
  (SGLang's page hashes, already seeded with the tenant's cache_salt/extra_key); the namespace names the
  model, dtype, page layout and rank. The index is keyed by the pair, so a lookup in one namespace never
  finds a page written in another.
- Integrity: a page's checksum is sha256(scoped key || page bytes), truncated to 128 bits. The writer computes it; the server
  recomputes it at commit and drops the page on mismatch; the reader recomputes it after its READ and
  reports a mismatch, upon which the server re-verifies and drops a page that really is corrupt. Because
  the key is inside the checksum, bytes served from the wrong slot (a race with eviction, a bug) fail too.
- Eviction: a `tiers` policy in flat mode (entries = slot numbers, size 1, parent None). Slots being
  written, and slots a reader looked up moments ago (a short read lease), are protected. When the policy
  offers no victim or refuses admission, the page is not stored: "full" is an answer, not an error.
- Data plane: one-sided NIXL READ/WRITE by the client into/out of the pool; the server only polls NIXL
  progress (fast for a few seconds after each request, slowly when idle; no spinning progress thread).

Control protocol (transfer.control frames: JSON object + optional blob; one response per request)
  request {"op": ..., ...}                     -> response {"ok": true, ...} or {"ok": false, "error": msg}
  hello   {"version", "page_bytes", "client"}  -> {"agent", "pool_addr", "pool_bytes", "page_bytes",
                                                   "capacity_pages"}, blob = the server's NIXL metadata
  alloc   {"ns", "keys"}                       -> {"slots": [{"state": "alloc", "offset": o} | {"state":
                                                   "exists"} | {"state": "busy"} | {"state": "full"}]}
          then the client WRITEs page i to pool_addr + offset_i, within the write lease
  commit  {"ns", "keys", "checksums"}          -> {"stored": [bool]}   (false: checksum mismatch / lost slot)
  lookup  {"ns", "keys", "pin"}                -> {"pages": [{"offset", "checksum"} | null]}
          (pin=true grants a read lease) then the client READs and checks each checksum
  report  {"ns", "keys"}                       -> {"dropped": [bool]}  (client saw a checksum mismatch)
  stats   {}                                   -> {"stats": {...}}
  corrupt {"ns", "key"}                        -> {}   test hook, only with --enable-test-hooks
Offsets are relative to pool_addr. Every socket operation has a deadline on both sides.

Threading: one thread accepts, one thread per connection serves requests, one polls NIXL progress.
`PageStore` holds all index state under one non-reentrant lock; hashing page bytes happens outside it
(the slots involved are protected by their lease meanwhile).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from tiers.clock import Clock, MonotonicClock
from tiers.policy import Candidate, Policy, create_policy
from transfer.base import Range, Transport, TransferError, deadline_in, remaining
from transfer.control import recv_message, send_message, wait_readable

logger = logging.getLogger("peer_server")

PROTOCOL_VERSION = 1
WRITE_LEASE_S = 10.0
READ_LEASE_S = 5.0
REQUEST_TIMEOUT_S = 10.0
READY_LINE = "PEER_SERVER_READY"


class PeerError(TransferError):
    """The peer answered, but refused the request."""


# --- page integrity -----------------------------------------------------------------------------------


def scoped_key(ns: str, key: str) -> bytes:
    if "\x00" in ns or "\x00" in key:
        raise ValueError("namespace and key must not contain NUL")
    return ns.encode() + b"\x00" + key.encode()


def memory_at(addr: int, length: int) -> memoryview:
    """A zero-copy view of raw memory (host pool pages, the pool itself)."""
    return memoryview((ctypes.c_char * length).from_address(addr)).cast("B")


def page_checksum(skey: bytes, pieces: Iterable[Range]) -> str:
    # sha256 rather than blake2b: with SHA extensions it runs ~1.3 GB/s here against blake2b's ~0.5, and
    # hashlib releases the GIL while hashing, so SGLang's storage threads hash in parallel.
    h = hashlib.sha256(skey)
    for addr, length in pieces:
        h.update(memory_at(addr, length))
    return h.hexdigest()[:32]


# --- the store ----------------------------------------------------------------------------------------


@dataclass
class _Slot:
    index: int
    skey: Tuple[str, str]
    writing: bool
    checksum: str = ""
    lease_until: float = 0.0


@dataclass(frozen=True)
class StoreStats:
    page_bytes: int
    capacity_pages: int
    used_pages: int
    writing_pages: int
    free_pages: int
    policy: str
    hits: int
    misses: int
    stored: int
    evictions: int
    rejected_full: int
    commit_mismatch: int
    corrupt_dropped: int
    transit_errors: int


class PageStore:
    """Index, slots and eviction for one pool. Thread-safe: every method takes `self._lock`."""

    def __init__(self, pool: np.ndarray, policy_name: str, clock: Optional[Clock] = None):
        self.pool = pool
        self.pool_addr = pool.ctypes.data
        self.policy_name = policy_name
        self.clock = clock or MonotonicClock()
        self._lock = threading.Lock()
        self.page_bytes = 0
        self.capacity_pages = 0
        self._policy: Optional[Policy] = None
        self._index: Dict[Tuple[str, str], _Slot] = {}
        self._slots: Dict[int, _Slot] = {}
        self._free: List[int] = []
        self._n = dict(hits=0, misses=0, stored=0, evictions=0, rejected_full=0, commit_mismatch=0,
                       corrupt_dropped=0, transit_errors=0)

    def format(self, page_bytes: int) -> None:
        """Cut the pool into `page_bytes` slots; a no-op if already cut that way."""
        with self._lock:
            if self.page_bytes == page_bytes:
                return
            if self.page_bytes:
                raise PeerError(f"pool holds {self.page_bytes}-byte pages; this client uses {page_bytes}")
            if page_bytes <= 0 or page_bytes > len(self.pool):
                raise PeerError(f"page size {page_bytes} does not fit a {len(self.pool)}-byte pool")
            self.capacity_pages = len(self.pool) // page_bytes
            self._policy = create_policy(self.policy_name, self.capacity_pages, clock=self.clock)
            self._free = list(range(self.capacity_pages - 1, -1, -1))
            self.page_bytes = page_bytes

    def _need_format(self) -> None:
        if not self.page_bytes:
            raise PeerError("pool not formatted yet: send hello first")

    def _protected(self, index: int) -> bool:
        return self._slots[index].lease_until > self.clock.now()  # a write in progress, or a fresh read

    def _remove(self, slot: _Slot) -> None:
        del self._index[slot.skey]
        del self._slots[slot.index]
        self._policy.on_remove(slot.index)
        self._free.append(slot.index)

    def _take_slot(self, skey: Tuple[str, str]) -> Optional[int]:
        if self._free:
            return self._free.pop()
        victims = self._policy.victims(1, self._protected)
        if not victims or not self._policy.admit(Candidate(key=skey, size=1), victims):
            return None
        for v in victims:
            self._remove(self._slots[v])
            self._n["evictions"] += 1
        return self._free.pop()

    def alloc(self, ns: str, keys: Sequence[str]) -> List[dict]:
        out = []
        with self._lock:
            self._need_format()
            now = self.clock.now()
            for key in keys:
                skey = (ns, key)
                slot = self._index.get(skey)
                if slot is not None and not slot.writing:
                    self._policy.on_access(slot.index)
                    out.append({"state": "exists"})
                    continue
                if slot is not None and slot.lease_until > now:
                    out.append({"state": "busy"})  # another writer holds it
                    continue
                if slot is not None:
                    self._remove(slot)  # an abandoned write
                index = self._take_slot(skey)
                if index is None:
                    self._n["rejected_full"] += 1
                    out.append({"state": "full"})
                    continue
                slot = _Slot(index, skey, writing=True, lease_until=now + WRITE_LEASE_S)
                self._index[skey] = self._slots[index] = slot
                self._policy.on_insert(index, key=skey, size=1, parent=None)
                out.append({"state": "alloc", "offset": index * self.page_bytes})
        return out

    def _page(self, index: int) -> List[Range]:
        return [(self.pool_addr + index * self.page_bytes, self.page_bytes)]

    def commit(self, ns: str, keys: Sequence[str], checksums: Sequence[str]) -> List[bool]:
        if len(keys) != len(checksums):
            raise PeerError("keys and checksums differ in length")
        with self._lock:
            self._need_format()
            slots = [self._index.get((ns, k)) for k in keys]
        # Hash outside the lock: the slots are still writing, hence protected from eviction.
        actual = [
            page_checksum(scoped_key(ns, k), self._page(s.index)) if s is not None and s.writing else None
            for k, s in zip(keys, slots)
        ]
        out = []
        with self._lock:
            for key, slot, want, got in zip(keys, slots, checksums, actual):
                if slot is None or got is None or self._index.get((ns, key)) is not slot:
                    out.append(False)  # the lease ran out and the slot went to someone else
                elif got != want:
                    self._n["commit_mismatch"] += 1
                    self._remove(slot)
                    out.append(False)
                else:
                    slot.writing, slot.checksum, slot.lease_until = False, want, 0.0
                    self._n["stored"] += 1
                    out.append(True)
        return out

    def lookup(self, ns: str, keys: Sequence[str], pin: bool) -> List[Optional[dict]]:
        out = []
        with self._lock:
            self._need_format()
            now = self.clock.now()
            for key in keys:
                skey = (ns, key)
                self._policy.record(skey)
                slot = self._index.get(skey)
                if slot is None or slot.writing:
                    self._n["misses"] += 1
                    out.append(None)
                    continue
                self._n["hits"] += 1
                self._policy.on_access(slot.index)
                if pin:
                    slot.lease_until = max(slot.lease_until, now + READ_LEASE_S)
                out.append({"offset": slot.index * self.page_bytes, "checksum": slot.checksum})
        return out

    def report(self, ns: str, keys: Sequence[str]) -> List[bool]:
        """A reader saw a bad checksum: re-verify and drop pages that really are corrupt."""
        with self._lock:
            slots = [self._index.get((ns, k)) for k in keys]
        verdicts = [
            None if s is None or s.writing else page_checksum(scoped_key(ns, k), self._page(s.index)) == s.checksum
            for k, s in zip(keys, slots)
        ]
        out = []
        with self._lock:
            for key, slot, good in zip(keys, slots, verdicts):
                if slot is None or good is None or self._index.get((ns, key)) is not slot:
                    out.append(False)
                elif good:
                    self._n["transit_errors"] += 1
                    out.append(False)
                else:
                    self._n["corrupt_dropped"] += 1
                    self._remove(slot)
                    out.append(True)
        return out

    def corrupt(self, ns: str, key: str) -> None:
        """Test hook: flip one byte of a stored page, behind the index's back."""
        with self._lock:
            slot = self._index.get((ns, key))
            if slot is None or slot.writing:
                raise PeerError(f"no stored page for {key!r}")
            self.pool[slot.index * self.page_bytes] ^= 0xFF

    def stats(self) -> StoreStats:
        with self._lock:
            writing = sum(1 for s in self._slots.values() if s.writing)
            return StoreStats(
                page_bytes=self.page_bytes,
                capacity_pages=self.capacity_pages,
                used_pages=len(self._slots) - writing,
                writing_pages=writing,
                free_pages=len(self._free),
                policy=self.policy_name,
                **self._n,
            )


# --- the server ---------------------------------------------------------------------------------------


class PeerServer:
    """Serves one `PageStore` over the control protocol; the pool is registered with `transport`."""

    def __init__(self, store: PageStore, transport: Transport, host: str, port: int, test_hooks: bool = False):
        self.store = store
        self.transport = transport
        self.test_hooks = test_hooks
        transport.register(store.pool_addr, len(store.pool))  # before anyone fetches metadata
        self._metadata = transport.metadata()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._busy_until = 0.0  # fast progress polling until then (monotonic)
        self._threads: List[threading.Thread] = []
        self._handlers = {
            "hello": self._hello, "alloc": self._alloc, "commit": self._commit, "lookup": self._lookup,
            "report": self._report, "stats": self._stats, "corrupt": self._corrupt,
        }

    def start(self) -> "PeerServer":
        for target in (self._accept_loop, self._progress_loop):
            t = threading.Thread(target=target, daemon=True, name=f"peer-{target.__name__}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)
        self._sock.close()
        self.transport.close()

    def wait(self) -> None:
        while not self._stop.wait(0.5):
            pass

    def _progress_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.transport.progress()
                self.transport.notifications()  # nothing in the protocol uses them; drain the queue
            except TransferError as e:
                logger.warning("progress: %s", e)
            fast = time.monotonic() < self._busy_until
            self._stop.wait(0.0002 if fast else 0.02)

    def _accept_loop(self) -> None:
        self._sock.settimeout(0.5)
        while not self._stop.is_set():
            try:
                conn, addr = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True, name=f"peer-conn-{addr[1]}")
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            while not self._stop.is_set():
                try:
                    if not wait_readable(conn, 0.5):
                        continue
                    req, blob = recv_message(conn, deadline_in(REQUEST_TIMEOUT_S))
                except (TransferError, OSError, ValueError):
                    return  # client went away or sent garbage: drop the connection
                self._busy_until = time.monotonic() + 3.0
                resp, out_blob = self._dispatch(req, blob)
                try:
                    send_message(conn, resp, deadline_in(REQUEST_TIMEOUT_S), out_blob)
                except TransferError:
                    return

    def _dispatch(self, req: dict, blob: bytes) -> Tuple[dict, bytes]:
        handler = self._handlers.get(req.get("op"))
        if handler is None:
            return {"ok": False, "error": f"unknown op {req.get('op')!r}"}, b""
        try:
            resp, out_blob = handler(req)
            return {"ok": True, **resp}, out_blob
        except (PeerError, KeyError, TypeError, ValueError) as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}, b""

    def _hello(self, req: dict):
        if req["version"] != PROTOCOL_VERSION:
            raise PeerError(f"protocol version {req['version']} != {PROTOCOL_VERSION}")
        self.store.format(int(req["page_bytes"]))
        info = {
            "agent": self.transport.name, "pool_addr": self.store.pool_addr, "pool_bytes": len(self.store.pool),
            "page_bytes": self.store.page_bytes, "capacity_pages": self.store.capacity_pages,
        }
        return info, self._metadata

    def _alloc(self, req):
        return {"slots": self.store.alloc(req["ns"], req["keys"])}, b""

    def _commit(self, req):
        return {"stored": self.store.commit(req["ns"], req["keys"], req["checksums"])}, b""

    def _lookup(self, req):
        return {"pages": self.store.lookup(req["ns"], req["keys"], bool(req.get("pin", False)))}, b""

    def _report(self, req):
        return {"dropped": self.store.report(req["ns"], req["keys"])}, b""

    def _stats(self, req):
        return {"stats": self.store.stats().__dict__}, b""

    def _corrupt(self, req):
        if not self.test_hooks:
            raise PeerError("test hooks are disabled (start with --enable-test-hooks)")
        self.store.corrupt(req["ns"], req["key"])
        return {}, b""


# --- the client ---------------------------------------------------------------------------------------


class PeerClient:
    """One connection to one peer server, for pages of `page_bytes` bytes.

    A page is given as a list of local ranges (pieces, in order) that together hold `page_bytes` bytes;
    the local memory must be registered with `transport`. Every call finishes by `timeout_s` or raises
    `TransferError` (`TransferTimeout` for a missed deadline) and drops the connection, so the next call
    reconnects: a restarted peer is picked up without further ado.

    Thread-safe: one lock per client serializes whole calls (request, transfer, commit).
    """

    def __init__(self, host: str, port: int, transport: Transport, page_bytes: int, timeout_s: float = 2.0):
        self.host, self.port = host, int(port)
        self.transport = transport
        self.page_bytes = page_bytes
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._peer: Optional[str] = None
        self._pool_addr = 0
        self.corrupt_pages = 0  # pages whose checksum failed after a read (guarded by _lock)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        with self._lock:
            self._reset()

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._peer is not None:
            self.transport.disconnect(self._peer)
            self._peer = None

    def _connect(self, deadline: float) -> None:
        try:
            self._sock = socket.create_connection((self.host, self.port), timeout=max(0.001, remaining(deadline)))
        except OSError as e:
            raise TransferError(f"cannot reach peer {self.address}: {e}") from e
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = {"op": "hello", "version": PROTOCOL_VERSION, "page_bytes": self.page_bytes,
                "client": self.transport.name}
        info, blob = self._roundtrip(body, deadline)
        self._pool_addr = int(info["pool_addr"])
        self._peer = self.transport.connect(blob, deadline)

    def _roundtrip(self, body: dict, deadline: float) -> Tuple[dict, bytes]:
        send_message(self._sock, body, deadline)
        resp, blob = recv_message(self._sock, deadline)
        if not resp.get("ok"):
            raise PeerError(f"peer {self.address} refused {body['op']}: {resp.get('error')}")
        return resp, blob

    def _call(self, fn, *args):
        """Run `fn(deadline, *args)` connected, under the lock; any failure drops the connection."""
        deadline = deadline_in(self.timeout_s)
        with self._lock:
            try:
                if self._sock is None:
                    self._connect(deadline)
                return fn(deadline, *args)
            except TransferError:
                self._reset()
                raise
            except (KeyError, TypeError, ValueError) as e:  # a malformed answer
                self._reset()
                raise TransferError(f"bad answer from {self.address}: {e}") from e

    def _check_pages(self, pages: Sequence[Sequence[Range]]) -> None:
        for p in pages:
            if sum(n for _, n in p) != self.page_bytes:
                raise ValueError(f"a page must hold {self.page_bytes} bytes, got {sum(n for _, n in p)}")

    def _remote(self, offset: int, page: Sequence[Range]) -> List[Range]:
        out, at = [], self._pool_addr + offset
        for _, n in page:
            out.append((at, n))
            at += n
        return out

    # --- operations ---
    def put(self, ns: str, keys: Sequence[str], pages: Sequence[Sequence[Range]]) -> List[bool]:
        """Store pages; True where the peer now holds the page (or another writer is storing it)."""
        self._check_pages(pages)
        sums = [page_checksum(scoped_key(ns, k), p) for k, p in zip(keys, pages)]
        return self._call(self._put, ns, list(keys), pages, sums)

    def _put(self, deadline, ns, keys, pages, sums) -> List[bool]:
        resp, _ = self._roundtrip({"op": "alloc", "ns": ns, "keys": keys}, deadline)
        slots = resp["slots"]
        out = [s["state"] in ("exists", "busy") for s in slots]
        todo = [i for i, s in enumerate(slots) if s["state"] == "alloc"]
        if not todo:
            return out
        local, remote = self._ranges(todo, [s and s.get("offset") for s in slots], pages)
        self.transport.write(self._peer, local, remote, deadline)
        body = {"op": "commit", "ns": ns, "keys": [keys[i] for i in todo], "checksums": [sums[i] for i in todo]}
        resp, _ = self._roundtrip(body, deadline)
        for i, ok in zip(todo, resp["stored"]):
            out[i] = bool(ok)
        return out

    def _ranges(self, todo, offsets, pages):
        """Local and remote ranges of pages `todo` (one prepared transfer for all of them)."""
        local, remote = [], []
        for i in todo:
            local.extend(pages[i])
            remote.extend(self._remote(offsets[i], pages[i]))
        return local, remote

    def get(self, ns: str, keys: Sequence[str], pages: Sequence[Sequence[Range]]) -> List[bool]:
        """Read pages into `pages`; True where the bytes arrived and their checksum matched.

        Where False, the destination memory holds undefined bytes."""
        self._check_pages(pages)
        return self._call(self._get, ns, list(keys), pages)

    def _get(self, deadline, ns, keys, pages) -> List[bool]:
        resp, _ = self._roundtrip({"op": "lookup", "ns": ns, "keys": keys, "pin": True}, deadline)
        found = resp["pages"]
        todo = [i for i, f in enumerate(found) if f is not None]
        out = [False] * len(keys)
        if not todo:
            return out
        local, remote = self._ranges(todo, [f and f["offset"] for f in found], pages)
        self.transport.read(self._peer, local, remote, deadline)
        bad = []
        for i in todo:
            if page_checksum(scoped_key(ns, keys[i]), pages[i]) == found[i]["checksum"]:
                out[i] = True
            else:
                bad.append(keys[i])
        if bad:
            self.corrupt_pages += len(bad)
            logger.warning("peer %s served %d page(s) failing their checksum", self.address, len(bad))
            self._roundtrip({"op": "report", "ns": ns, "keys": bad}, deadline)
        return out

    def exists(self, ns: str, keys: Sequence[str]) -> List[bool]:
        return self._call(self._exists, ns, list(keys))

    def _exists(self, deadline, ns, keys) -> List[bool]:
        resp, _ = self._roundtrip({"op": "lookup", "ns": ns, "keys": keys, "pin": False}, deadline)
        return [p is not None for p in resp["pages"]]

    def stats(self) -> StoreStats:
        return self._call(lambda d: StoreStats(**self._roundtrip({"op": "stats"}, d)[0]["stats"]))

    def corrupt(self, ns: str, key: str) -> None:
        """Test hook (server started with --enable-test-hooks)."""
        self._call(lambda d: self._roundtrip({"op": "corrupt", "ns": ns, "key": key}, d))


# --- command line -------------------------------------------------------------------------------------


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    import psutil

    from tiers.policy import policy_names

    p = argparse.ArgumentParser(prog="python -m sglang_ext.peer_server", description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="control port; 0 picks a free one (printed)")
    p.add_argument("--capacity-gb", type=float, required=True, help="DRAM pool size in GB (1e9 bytes)")
    p.add_argument("--policy", default="lru", help="eviction policy from tiers.policy (default lru)")
    p.add_argument("--page-bytes", type=int, default=0, help="slot size; default: set by the first client")
    p.add_argument("--enable-test-hooks", action="store_true", help="allow the 'corrupt' request (tests only)")
    p.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        p.error(f"argument --port: {args.port} is not a port number (0-65535)")
    if not args.capacity_gb > 0:
        p.error(f"argument --capacity-gb: must be positive, got {args.capacity_gb}")
    capacity = int(args.capacity_gb * 1e9)
    available = psutil.virtual_memory().available
    if capacity > available:
        p.error(f"argument --capacity-gb: {args.capacity_gb} GB asked but only {available / 1e9:.2f} GB "
                "of memory is available")
    if args.page_bytes < 0 or args.page_bytes > capacity:
        p.error(f"argument --page-bytes: {args.page_bytes} does not fit the pool ({capacity} bytes)")
    names = policy_names()
    if args.policy not in names and ":" not in args.policy:
        p.error(f"argument --policy: unknown policy {args.policy!r}; choose one of {', '.join(names)}")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from transfer.nixl_transport import NixlTransport, use_loopback_only

    if args.host in ("127.0.0.1", "localhost"):
        use_loopback_only()
    pool = np.zeros(int(args.capacity_gb * 1e9), dtype=np.uint8)  # calloc: pages appear on first write
    store = PageStore(pool, args.policy)
    if args.page_bytes:
        store.format(args.page_bytes)
    try:
        transport = NixlTransport("peer")
        server = PeerServer(store, transport, args.host, args.port, test_hooks=args.enable_test_hooks)
    except OSError as e:
        print(f"peer_server: cannot listen on --host {args.host} --port {args.port}: {e}", file=sys.stderr)
        return 2
    except TransferError as e:
        print(f"peer_server: NIXL setup failed: {e}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    print(f"{READY_LINE} port={server.port} agent={transport.name} pid={os.getpid()}", flush=True)
    while not stop.wait(0.5):
        pass
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
