"""PeerServer: serves one PageStore over the control protocol, and the peer's command line.

Design note (hostile or broken clients)
- Connections: at most `max_connections` at once. One more gets an error frame naming the limit and is
  closed; the clients already connected are not affected. Each connection has one thread, tracked in
  `_conns` from accept until it ends; `stop()` shuts every connection down and joins its thread.
- Deadlines: a connection idle for `idle_timeout_s` (by the injected clock) is closed; a frame must
  arrive whole within REQUEST_TIMEOUT_S of its first byte, so a truncated frame costs its own thread that
  long and nobody else anything.
- Frames: at most `requests.MAX_REQUEST_BYTES` of JSON and no blob. A frame that is too large or is not a
  JSON object gets an error reply and its connection is closed (the stream cannot be trusted after it).
  A well-framed request with a bad field (`tiers.peer.requests`) gets an error reply, changes no state,
  and the connection goes on. Nothing a client sends raises out of a connection thread.

Locking: `_lock` guards `_conns` and the counters and is never held during I/O; the store has its own.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tiers.clock import Clock, MonotonicClock
from tiers.peer import requests
from tiers.peer.protocol import PROTOCOL_VERSION, READY_LINE, REQUEST_TIMEOUT_S, PeerError
from tiers.peer.store import PageStore, page_size_problem
from transfer.base import Transport, TransferError, deadline_in
from transfer.control import FrameError, recv_message, send_message, wait_readable

logger = logging.getLogger("peer_server")

DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_IDLE_TIMEOUT_S = 600.0
_POLL_S = 0.5  # how often a waiting thread looks at the stop flag (and a connection at its idle time)
_REFUSAL_S = 1.0  # deadline for the error frame sent to a client that is being dropped
# The passive side's progress polling: fast for 3 s after a request, because over UCX's tcp transport a
# client's READ or WRITE moves only when this side progresses (over cma the reader copies alone). Each
# wake-up costs ~28 us of CPU here: 1 ms polls moved tcp gets as fast as 0.2 ms ones (1.49-1.67 against
# 1.53-1.68 GB/s; 20 ms: 0.2) with a fifth of the wake-ups: ~3% of a core instead of ~10%, left to the
# reader and its hashing when both sit on one machine.
_FAST_PROGRESS_S, _IDLE_PROGRESS_S, _FAST_FOR_S = 0.001, 0.02, 3.0


class PeerServer:
    """Serves one `PageStore` over the control protocol; the pool is registered with `transport`."""

    def __init__(
        self,
        store: PageStore,
        transport: Transport,
        host: str,
        port: int,
        test_hooks: bool = False,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        clock: Optional[Clock] = None,
    ):
        if max_connections < 1 or not idle_timeout_s > 0:
            raise ValueError(f"need max_connections >= 1 and idle_timeout_s > 0, got {max_connections}, "
                             f"{idle_timeout_s}")
        self.store = store
        self.transport = transport
        self.test_hooks = test_hooks
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self.clock = clock or MonotonicClock()
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
        self._lock = threading.Lock()
        self._conns: Dict[int, Tuple[threading.Thread, socket.socket]] = {}
        self._next_conn = 0
        self._n = dict(refused=0, bad_frames=0, bad_requests=0, idle_closed=0)
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
        with self._lock:
            conns = list(self._conns.values())
        for _, conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it
            except OSError:
                pass
        for t, _ in conns:
            t.join(timeout=2.0)
        self.transport.close()

    def wait(self) -> None:
        while not self._stop.wait(0.5):
            pass

    def counters(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._n, connections=len(self._conns), max_connections=self.max_connections)

    def _count(self, name: str) -> None:
        with self._lock:
            self._n[name] += 1

    def _progress_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.transport.progress()
                self.transport.notifications()  # nothing in the protocol uses them; drain the queue
            except TransferError as e:
                logger.warning("progress: %s", e)
            fast = time.monotonic() < self._busy_until
            self._stop.wait(_FAST_PROGRESS_S if fast else _IDLE_PROGRESS_S)

    # --- connections ---
    def _accept_loop(self) -> None:
        self._sock.settimeout(_POLL_S)
        while not self._stop.is_set():
            try:
                conn, addr = self._sock.accept()
            except socket.timeout:
                continue
            except OSError as e:
                if self._stop.is_set():
                    return
                logger.warning("accept: %s", e)  # out of file descriptors, say: wait, do not stop serving
                self._stop.wait(_POLL_S)
                continue
            self._admit(conn, addr)

    def _admit(self, conn: socket.socket, addr) -> None:
        """Serve `conn` on its own tracked thread, or refuse it if the server is at its connection cap."""
        with self._lock:
            full = len(self._conns) >= self.max_connections
            if full:
                self._n["refused"] += 1
            else:
                cid, self._next_conn = self._next_conn, self._next_conn + 1
                t = threading.Thread(target=self._serve, args=(conn, cid), daemon=True, name=f"peer-conn-{cid}")
                self._conns[cid] = (t, conn)
        if full:
            logger.info("refused a connection from %s: at the limit of %d", addr, self.max_connections)
            self._drop(conn, f"peer server busy: {self.max_connections} connections open, the limit set by "
                             "--max-connections; try again later")
            return
        try:
            t.start()
        except RuntimeError as e:  # the OS would not give us a thread
            with self._lock:
                self._conns.pop(cid, None)
            self._drop(conn, f"peer server cannot serve another connection: {e}")

    def _drop(self, conn: socket.socket, error: str) -> None:
        """Send one error frame, then close. What the client already sent (up to 1 MiB) is read first, so
        that the close is a FIN after our frame rather than a reset that could discard it."""
        try:
            send_message(conn, {"ok": False, "error": error}, deadline_in(_REFUSAL_S))
            conn.shutdown(socket.SHUT_WR)
            conn.setblocking(False)
            for _ in range(16):  # bounded: a client that keeps sending cannot hold the thread here
                if not conn.recv(1 << 16):
                    break
        except (TransferError, OSError):
            pass  # nothing left to read, or the client is gone: either way we are done with it
        conn.close()

    def _serve(self, conn: socket.socket, cid: int) -> None:
        try:
            # Answers go out at once: with Nagle, the tail of an answer can wait for the client's delayed
            # ACK (~40 ms; seen when a client had two requests in flight).
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._serve_requests(conn)
        except Exception:  # a bug, not the client's doing: log it, and drop only this connection
            logger.exception("connection %d failed", cid)
        finally:
            conn.close()
            with self._lock:
                self._conns.pop(cid, None)

    def _serve_requests(self, conn: socket.socket) -> None:
        last = self.clock.now()
        while not self._stop.is_set():
            try:
                if not wait_readable(conn, _POLL_S):
                    if self.clock.now() - last >= self.idle_timeout_s:
                        self._count("idle_closed")
                        return
                    continue
                req, _ = recv_message(conn, deadline_in(REQUEST_TIMEOUT_S), requests.MAX_REQUEST_BYTES, 0)
            except FrameError as e:
                self._count("bad_frames")
                self._drop(conn, f"bad frame: {e}")
                return
            except (TransferError, OSError, ValueError):
                return  # the client went away, or stalled mid-frame past the deadline
            last = self.clock.now()  # idle time counts from the last request (read before we answer it)
            self._busy_until = time.monotonic() + _FAST_FOR_S
            resp, out_blob = self._dispatch(req)
            try:
                send_message(conn, resp, deadline_in(REQUEST_TIMEOUT_S), out_blob)
            except TransferError:
                return

    # --- requests ---
    def _dispatch(self, req: dict) -> Tuple[dict, bytes]:
        try:
            op = requests.op_name(req)
            handler = self._handlers.get(op)
            if handler is None:
                raise PeerError(f"unknown op {op[:64]!r}")
            resp, out_blob = handler(req)
            return {"ok": True, **resp}, out_blob
        except PeerError as e:
            self._count("bad_requests")
            return {"ok": False, "error": str(e)}, b""
        except Exception as e:  # a bug, not the client's doing: answer, log, keep serving
            logger.exception("request failed")
            return {"ok": False, "error": f"internal error: {type(e).__name__}"}, b""

    def _hello(self, req):
        version = requests.integer(req, "version", 0, 1 << 31)
        if version != PROTOCOL_VERSION:
            raise PeerError(f"protocol version {version} != {PROTOCOL_VERSION}")
        requests.text(req, "client", requests.MAX_NAME_CHARS, default="")
        self.store.format(requests.integer(req, "page_bytes", 1, 1 << 62))
        info = {
            "agent": self.transport.name, "pool_addr": self.store.pool_addr, "pool_bytes": len(self.store.pool),
            "page_bytes": self.store.page_bytes, "capacity_pages": self.store.capacity_pages,
        }
        return info, self._metadata

    def _alloc(self, req):
        return {"slots": self.store.alloc(requests.namespace(req), requests.keys(req))}, b""

    def _commit(self, req):
        ns, keys = requests.namespace(req), requests.keys(req)
        checksums = requests.strings(req, "checksums", requests.MAX_CHECKSUM_CHARS)
        return {"stored": self.store.commit(ns, keys, checksums)}, b""

    def _lookup(self, req):
        ns, keys, pin = requests.namespace(req), requests.keys(req), requests.flag(req, "pin", False)
        found = self.store.lookup(ns, keys, pin)
        return {"offsets": found.offsets, "checksums": found.checksums}, b""

    def _report(self, req):
        return {"dropped": self.store.report(requests.namespace(req), requests.keys(req))}, b""

    def _stats(self, req):
        return {"stats": self.store.stats().__dict__, "server": self.counters()}, b""

    def _corrupt(self, req):
        if not self.test_hooks:
            raise PeerError("test hooks are disabled (start with --enable-test-hooks)")
        self.store.corrupt(requests.namespace(req), requests.text(req, "key", requests.MAX_KEY_CHARS))
        return {}, b""

# --- command line -------------------------------------------------------------------------------------


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    import psutil

    from tiers.policy import policy_names

    p = argparse.ArgumentParser(prog="python -m sglang_ext.peer_server", description="Peer block server: a DRAM pool of KV pages that other hosts read and write over NIXL.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, required=True, help="control port; 0 picks a free one (printed)")
    p.add_argument("--capacity-gb", type=float, required=True, help="DRAM pool size in GB (1e9 bytes)")
    p.add_argument("--policy", default="lru", help="eviction policy from tiers.policy (default lru)")
    p.add_argument("--page-bytes", type=int, default=0, help="slot size; default: set by the first client's hello")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                   help=f"clients served at once; one more is refused (default {DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--idle-timeout-s", type=float, default=DEFAULT_IDLE_TIMEOUT_S,
                   help=f"close a connection idle this long (default {DEFAULT_IDLE_TIMEOUT_S:g})")
    p.add_argument("--prefault", action=argparse.BooleanOptionalAction, default=True,
                   help="write the whole pool once at start (default), so its memory is committed before the server "
                        "is ready: the RSS stays flat while the pool fills, and no WRITE waits on first-touch page "
                        "faults; --no-prefault lets pages appear on first write")
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
    if args.page_bytes and page_size_problem(capacity, args.page_bytes):
        p.error(f"argument --page-bytes: {page_size_problem(capacity, args.page_bytes)}")
    if args.max_connections < 1:
        p.error(f"argument --max-connections: must be at least 1, got {args.max_connections}")
    if not args.idle_timeout_s > 0:
        p.error(f"argument --idle-timeout-s: must be positive, got {args.idle_timeout_s}")
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
    pool = np.zeros(int(args.capacity_gb * 1e9), dtype=np.uint8)  # calloc: pages appear on first write...
    if args.prefault:
        pool.fill(0)  # ...unless written now: every page is faulted in before READY
    store = PageStore(pool, args.policy)
    if args.page_bytes:
        store.format(args.page_bytes)
    try:
        transport = NixlTransport("peer")
        server = PeerServer(store, transport, args.host, args.port, test_hooks=args.enable_test_hooks,
                            max_connections=args.max_connections, idle_timeout_s=args.idle_timeout_s)
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
