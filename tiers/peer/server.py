"""PeerServer: serves one PageStore over the control protocol, and the peer's command line."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import List, Optional, Sequence, Tuple

import numpy as np

from tiers.peer.protocol import PROTOCOL_VERSION, READY_LINE, REQUEST_TIMEOUT_S, PeerError
from tiers.peer.store import PageStore
from transfer.base import Transport, TransferError, deadline_in
from transfer.control import recv_message, send_message, wait_readable

logger = logging.getLogger("peer_server")



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

# --- command line -------------------------------------------------------------------------------------


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    import psutil

    from tiers.policy import policy_names

    p = argparse.ArgumentParser(prog="python -m sglang_ext.peer_server", description="Peer block server: a DRAM pool of KV pages that other hosts read and write over NIXL.")
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
