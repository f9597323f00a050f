"""PeerClient: one connection to one peer server (the protocol is in tiers/peer/__init__.py)."""

from __future__ import annotations

import logging
import select
import socket
import threading
from typing import Dict, List, Optional, Sequence, Tuple

from tiers.peer.overlap import CHUNK_BYTES, GIL_RELEASED_ABOVE, HASH_SLICE_BYTES, chunks, move_and_hash, saturated
from tiers.peer.protocol import PROTOCOL_VERSION, PeerError, page_checksum, scoped_key
from tiers.peer.requests import MAX_CHECKSUM_CHARS
from tiers.peer.store import StoreStats
from transfer.base import Range, Transport, TransferError, TransferTimeout, deadline_in, remaining
from transfer.control import recv_message, send_message

logger = logging.getLogger("peer_client")


def _integer(fields: dict, name: str, lo: int, hi: int) -> int:
    """A field of a peer's answer that must be an integer in [lo, hi] (a lying peer fails the call)."""
    value = fields[name]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise TransferError(f"peer answered {name}={value!r}, not an integer in [{lo}, {hi}]")
    return value


class PeerClient:
    """One connection to one peer server, for pages of `page_bytes` bytes.

    A page is given as a list of local ranges (pieces, in order) that together hold `page_bytes` bytes;
    the local memory must be registered with `transport`. Pages move straight between that memory and
    the peer's pool (no staging copy), in runs of at most `chunk_bytes`, pages in a row on both sides as
    one descriptor; the checksums are computed while the pages move, on hashing threads unless the
    machine is saturated (`hash_threads=None`; True or False forces the choice), else by this thread
    right after each run (tiers/peer/overlap.py). Each side hashes a page once: the writer before commit, the reader after
    its READ. Every field of the peer's answers is checked before any byte moves (`_found`): a lying
    peer fails the call, and can make no READ or WRITE leave the pool it announced.

    Every call finishes by its `deadline` (absolute, `time.monotonic()`; default: `timeout_s` from now),
    waiting for the client's lock included, or raises `TransferError` (`TransferTimeout` for a missed
    deadline) and drops the connection, so the next call reconnects: a restarted peer is picked up
    without further ado. A READ that missed the deadline may still land: the `TransferTimeout` then carries
    it as `unsettled` (transfer/base.py, "Late reads"), and the caller must not reuse those pages before
    it settles.

    Thread-safe: one lock per client serializes whole calls (request, transfer, commit).
    """

    def __init__(self, host: str, port: int, transport: Transport, page_bytes: int, timeout_s: float = 2.0,
                 chunk_bytes: int = CHUNK_BYTES, hash_threads: Optional[bool] = None):
        self.host, self.port = host, int(port)
        self.transport = transport
        self.page_bytes = page_bytes
        self.timeout_s = timeout_s
        self.chunk_bytes = chunk_bytes
        self.hash_threads = hash_threads  # None: hashing threads unless the machine is saturated (overlap.py)
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._peer: Optional[str] = None
        self._pool_addr = 0
        self._pool_bytes = 0
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
        self._pool_addr = _integer(info, "pool_addr", 1, (1 << 64) - 1)
        self._pool_bytes = _integer(info, "pool_bytes", self.page_bytes, (1 << 64) - 1 - self._pool_addr)
        self._peer = self.transport.connect(blob, deadline)

    def _closed_by_peer(self) -> bool:
        """A connection the peer closed while it sat idle (its --idle-timeout-s, a restart) reads as EOF: reconnect
        then, rather than fail a call and put the peer in back-off (a miss for HiCache)."""
        readable = select.poll()  # first: a recv on a socket with a timeout waits for data, whatever its flags
        readable.register(self._sock, select.POLLIN)
        if not readable.poll(0):
            return False
        try:
            return self._sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _roundtrip(self, body: dict, deadline: float) -> Tuple[dict, bytes]:
        send_message(self._sock, body, deadline)
        resp, blob = recv_message(self._sock, deadline)
        if not resp.get("ok"):
            raise PeerError(f"peer {self.address} refused {body['op']}: {resp.get('error')}")
        return resp, blob

    def _call(self, fn, *args, deadline: Optional[float] = None):
        """Run `fn(deadline, *args)` connected, under the lock; any failure drops the connection."""
        deadline = deadline_in(self.timeout_s) if deadline is None else deadline
        if not self._lock.acquire(timeout=max(0.0, remaining(deadline))):
            raise TransferTimeout(f"peer {self.address}: another call held the connection until the deadline")
        try:
            if self._sock is not None and self._closed_by_peer():
                self._reset()
            if self._sock is None:
                self._connect(deadline)
            return fn(deadline, *args)
        except TransferError:
            self._reset()
            raise
        except (KeyError, TypeError, ValueError) as e:  # a malformed answer
            self._reset()
            raise TransferError(f"bad answer from {self.address}: {e}") from e
        finally:
            self._lock.release()

    def _check_pages(self, pages: Sequence[Sequence[Range]]) -> None:
        for p in pages:
            if (p[0][1] if len(p) == 1 else sum(n for _, n in p)) != self.page_bytes:
                raise ValueError(f"a page must hold {self.page_bytes} bytes, got {sum(n for _, n in p)}")

    def _found(self, resp: dict, n: int) -> List[Optional[Tuple[int, str]]]:
        """A lookup answer checked field by field: (offset, checksum) or None per key. The peer may lie:
        an offset must name a whole slot inside the pool it announced (so every READ stays inside memory
        the peer registered), a checksum must be a string; anything else fails the call (TransferError)."""
        offsets, checksums = self._columns(resp, n)
        out: List[Optional[Tuple[int, str]]] = []
        last, grid = self._pool_bytes - self.page_bytes, self.page_bytes
        for offset, checksum in zip(offsets, checksums):
            if offset is None:
                out.append(None)
            elif (type(offset) is not int or not 0 <= offset <= last or offset % grid  # `type`: no bool
                    or type(checksum) is not str or len(checksum) > MAX_CHECKSUM_CHARS):
                raise TransferError(f"peer {self.address} answered a lookup with slot {offset!r} (pool of "
                                    f"{self._pool_bytes} bytes) or a bad checksum")
            else:
                out.append((offset, checksum))
        return out

    def _columns(self, resp: dict, n: int) -> Tuple[list, list]:
        """A lookup answer's two lists, one item per asked key (a list of another length fails the call)."""
        offsets, checksums = resp["offsets"], resp["checksums"]
        if type(offsets) is not list or type(checksums) is not list or not len(offsets) == len(checksums) == n:
            raise TransferError(f"peer {self.address} answered a lookup of {n} keys with malformed lists")
        return offsets, checksums

    # --- operations ---
    def put(self, ns: str, keys: Sequence[str], pages: Sequence[Sequence[Range]],
            checksums: Optional[Sequence[str]] = None, deadline: Optional[float] = None) -> List[bool]:
        """Store pages; True where the peer now holds the page (or another writer is storing it).

        `checksums`, when given, are the pages' checksums already known (from a verified read of these
        very bytes); otherwise they are computed while the pages are written."""
        self._check_pages(pages)
        return self._call(self._put, ns, list(keys), pages, checksums, deadline=deadline)

    def _put(self, deadline, ns, keys, pages, known) -> List[bool]:
        resp, _ = self._roundtrip({"op": "alloc", "ns": ns, "keys": keys}, deadline)
        slots = resp["slots"]
        if not isinstance(slots, list) or len(slots) != len(keys):
            raise TransferError(f"peer {self.address} answered an alloc of {len(keys)} keys with a malformed list")
        out = [s["state"] in ("exists", "busy") for s in slots]
        todo = [i for i, s in enumerate(slots) if s["state"] == "alloc"]
        if not todo:
            return out
        last = self._pool_bytes - self.page_bytes
        offsets = [_integer(s, "offset", 0, last) if s["state"] == "alloc" else None for s in slots]
        if any(o is not None and o % self.page_bytes for o in offsets):
            raise TransferError(f"peer {self.address} answered an alloc with a slot off the page grid")
        if known is None:
            sums = self._move_and_hash(self.transport.write, ns, keys, pages, offsets, todo, deadline, True)
        else:
            runs = chunks(todo, self.page_bytes, self.chunk_bytes)
            for run in runs:
                self.transport.write(self._peer, *self._ranges(run, offsets, pages), deadline)
            sums = {i: known[i] for i in todo}
        body = {"op": "commit", "ns": ns, "keys": [keys[i] for i in todo], "checksums": [sums[i] for i in todo]}
        resp, _ = self._roundtrip(body, deadline)
        for i, ok in zip(todo, resp["stored"]):
            out[i] = bool(ok)
        return out

    def _move_and_hash(self, move, ns, keys, pages, offsets, todo, deadline, hash_first) -> Dict[int, str]:
        """Move pages `todo` with `move` (transport.read or .write) in runs, checksumming them meanwhile:
        on hashing threads unless the machine is saturated, else by this thread (overlap.py)."""
        threads = self.hash_threads if self.hash_threads is not None else not saturated()
        runs = chunks(todo, self.page_bytes, self.chunk_bytes)
        sums = move_and_hash(
            runs,
            lambda run: move(self._peer, *self._ranges(run, offsets, pages), deadline),
            lambda i: page_checksum(scoped_key(ns, keys[i]), pages[i]),
            deadline,
            hash_first,
            slice_items=max(1, HASH_SLICE_BYTES // self.page_bytes),
            threads=threads,
            gil_bound=max(n for _, n in pages[todo[0]]) <= GIL_RELEASED_ABOVE,
        )
        return {i: c for run, cs in zip(runs, sums) for i, c in zip(run, cs)}

    def _ranges(self, todo, offsets, pages):
        """Local and remote ranges of pages `todo` (one prepared transfer for all of them; the transport
        merges ranges that continue each other on both sides)."""
        local, remote, base = [], [], self._pool_addr
        for i in todo:
            at = base + offsets[i]
            for piece in pages[i]:
                local.append(piece)
                remote.append((at, piece[1]))
                at += piece[1]
        return local, remote

    def get(self, ns: str, keys: Sequence[str], pages: Sequence[Sequence[Range]],
            deadline: Optional[float] = None) -> List[bool]:
        """Read pages into `pages`; True where the bytes arrived and their checksum matched.

        Where False, the destination memory holds undefined bytes."""
        return [c is not None for c in self.get_verified(ns, keys, pages, deadline)]

    def get_verified(self, ns: str, keys: Sequence[str], pages: Sequence[Sequence[Range]],
                     deadline: Optional[float] = None) -> List[Optional[str]]:
        """Like `get`, but gives each page's verified checksum (None for a miss), for a later `put`."""
        self._check_pages(pages)
        return self._call(self._get, ns, list(keys), pages, deadline=deadline)

    def _get(self, deadline, ns, keys, pages) -> List[Optional[str]]:
        resp, _ = self._roundtrip({"op": "lookup", "ns": ns, "keys": keys, "pin": True}, deadline)
        found = self._found(resp, len(keys))
        todo = [i for i, f in enumerate(found) if f is not None]
        out: List[Optional[str]] = [None] * len(keys)
        if not todo:
            return out
        offsets = [f and f[0] for f in found]
        sums = self._move_and_hash(self.transport.read, ns, keys, pages, offsets, todo, deadline, False)
        bad = []
        for i in todo:
            if sums[i] == found[i][1]:
                out[i] = sums[i]
            else:
                bad.append(keys[i])
        if bad:
            self.corrupt_pages += len(bad)
            logger.warning("peer %s served %d page(s) failing their checksum", self.address, len(bad))
            self._roundtrip({"op": "report", "ns": ns, "keys": bad}, deadline)
        return out

    def exists(self, ns: str, keys: Sequence[str], deadline: Optional[float] = None) -> List[bool]:
        return self._call(self._exists, ns, list(keys), deadline=deadline)

    def _exists(self, deadline, ns, keys) -> List[bool]:
        resp, _ = self._roundtrip({"op": "lookup", "ns": ns, "keys": keys, "pin": False}, deadline)
        return [o is not None for o in self._columns(resp, len(keys))[0]]

    def stats(self) -> StoreStats:
        return self._call(lambda d: StoreStats(**self._roundtrip({"op": "stats"}, d)[0]["stats"]))

    def corrupt(self, ns: str, key: str) -> None:
        """Test hook (server started with --enable-test-hooks)."""
        self._call(lambda d: self._roundtrip({"op": "corrupt", "ns": ns, "key": key}, d))
