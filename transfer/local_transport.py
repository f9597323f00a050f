"""A `Transport` for endpoints in one process: memmove between registered ranges. Also the test fake.

Endpoints meet through an explicit `LocalFabric` (no hidden global registry). The fabric can make an
endpoint die (`kill`: later transfers fail at once) or freeze (`freeze`: transfers stall until their
deadline, like a SIGSTOPped peer over UCX), so failure handling can be tested without processes. As over
UCX, a READ from a frozen endpoint that missed its deadline still lands when the endpoint is thawed (its
`TransferTimeout.unsettled` settles then), and never if the endpoint is killed first.
Ranges are checked against what each side registered, as NIXL does: a bad range is a `TransferError`,
never a stray write into the process.
"""

from __future__ import annotations

import ctypes
import json
import threading
import uuid
from typing import Callable, Dict, List, Sequence

from transfer.base import (Range, Region, Transport, TransferError, TransferTimeout, Unsettled, check_disjoint,
                           check_ranges, remaining)


class LocalFabric:
    """Where in-process endpoints find each other. Thread-safe (one lock, held only for dict updates)."""

    def __init__(self):
        self.id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._endpoints: Dict[str, "LocalTransport"] = {}
        self._frozen: Dict[str, threading.Event] = {}  # name -> event set when thawed
        self._late: Dict[str, List["_LateRead"]] = {}  # name -> reads from it past their deadline

    def _add(self, ep: "LocalTransport") -> None:
        with self._lock:
            self._endpoints[ep.name] = ep

    def _remove(self, name: str) -> None:
        with self._lock:
            self._endpoints.pop(name, None)

    def lookup(self, name: str) -> "LocalTransport":
        with self._lock:
            ep = self._endpoints.get(name)
            thaw = self._frozen.get(name)
        if ep is None:
            raise TransferError(f"peer {name!r} is gone")
        if thaw is not None and not thaw.is_set():
            return _Frozen(thaw)  # type: ignore[return-value]
        return ep

    def kill(self, name: str) -> None:
        self._remove(name)
        with self._lock:
            late = self._late.pop(name, [])
        for read in late:
            read.done = True  # the source is gone: nothing will land

    def _keep_late(self, name: str, local: Sequence[Range], land: Callable[[], None]) -> "_LateRead":
        read = _LateRead(tuple(local), land)
        with self._lock:
            self._late.setdefault(name, []).append(read)
        return read

    def freeze(self, name: str) -> None:
        with self._lock:
            self._frozen[name] = threading.Event()

    def thaw(self, name: str) -> None:
        """Resume `name`: reads from it that missed their deadline land now, in this thread."""
        with self._lock:
            ev = self._frozen.pop(name, None)
            late = self._late.pop(name, [])
        for read in late:
            try:
                read.land()
            except TransferError:
                pass  # a side went away meanwhile: nothing lands
            read.done = True
        if ev is not None:
            ev.set()


class _LateRead(Unsettled):
    def __init__(self, local, land: Callable[[], None]):
        self.local, self.land, self.done = local, land, False

    def settled(self) -> bool:
        return self.done


class _Frozen:
    def __init__(self, thaw: threading.Event):
        self.thaw = thaw


class LocalTransport(Transport):
    def __init__(self, fabric: LocalFabric, name_prefix: str = "local"):
        self._fabric = fabric
        self._name = f"{name_prefix}-{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self._regions: List[Region] = []
        self._peers: set = set()
        self._notifs: Dict[str, List[bytes]] = {}
        self._closed = False
        fabric._add(self)

    @property
    def name(self) -> str:
        return self._name

    def _check_open(self) -> None:
        if self._closed:
            raise TransferError(f"transport {self._name} is closed")

    def register(self, addr: int, length: int) -> Region:
        self._check_open()
        if length <= 0:
            raise TransferError(f"cannot register {length} bytes")
        region = Region(addr, length)
        with self._lock:
            check_disjoint(self._regions, region)
            self._regions.append(region)
        return region

    def deregister(self, region: Region) -> None:
        with self._lock:
            if region in self._regions:
                self._regions.remove(region)

    def _owns(self, addr: int, length: int) -> bool:
        with self._lock:
            return any(r.contains(addr, length) for r in self._regions)

    def metadata(self) -> bytes:
        self._check_open()
        return json.dumps({"fabric": self._fabric.id, "name": self._name}).encode()

    def connect(self, metadata: bytes, deadline: float) -> str:
        self._check_open()
        try:
            md = json.loads(metadata)
            fabric_id, name = md["fabric"], md["name"]
        except (ValueError, KeyError, TypeError) as e:
            raise TransferError(f"bad metadata: {e}") from e
        if fabric_id != self._fabric.id:
            raise TransferError("peer belongs to another fabric")
        self._fabric.lookup(name)
        with self._lock:
            self._peers.add(name)
        return name

    def disconnect(self, peer: str) -> None:
        with self._lock:
            self._peers.discard(peer)

    def _peer(self, peer: str, deadline: float) -> "LocalTransport":
        self._check_open()
        with self._lock:
            known = peer in self._peers
        if not known:
            raise TransferError(f"unknown peer {peer!r}: connect first")
        ep = self._fabric.lookup(peer)
        while isinstance(ep, _Frozen):
            if not ep.thaw.wait(max(0.0, remaining(deadline))):
                raise TransferTimeout(f"peer {peer} did not respond before the deadline")
            ep = self._fabric.lookup(peer)
        return ep

    def _copy(self, dst_owner: "LocalTransport", src_owner: "LocalTransport", pairs) -> None:
        for (dst, n), (src, _) in pairs:
            if not dst_owner._owns(dst, n) or not src_owner._owns(src, n):
                raise TransferError(f"range ({dst:#x}, {n}) or ({src:#x}, {n}) is not registered")
        for (dst, n), (src, _) in pairs:
            ctypes.memmove(dst, src, n)

    def read(self, peer: str, local: Sequence[Range], remote: Sequence[Range], deadline: float) -> None:
        check_ranges(local, remote)
        pairs = list(zip(local, remote))
        try:
            ep = self._peer(peer, deadline)
        except TransferTimeout as e:
            land = lambda: self._copy(self, self._fabric.lookup(peer), pairs)  # noqa: E731
            raise TransferTimeout(str(e), unsettled=self._fabric._keep_late(peer, local, land)) from None
        self._copy(self, ep, pairs)

    def write(
        self, peer: str, local: Sequence[Range], remote: Sequence[Range], deadline: float, notify: bytes = b""
    ) -> None:
        check_ranges(local, remote)
        ep = self._peer(peer, deadline)
        self._copy(ep, self, list(zip(remote, local)))
        if notify:
            ep._deliver(self._name, notify)

    def _deliver(self, sender: str, message: bytes) -> None:
        with self._lock:
            self._notifs.setdefault(sender, []).append(bytes(message))

    def send_notification(self, peer: str, message: bytes) -> None:
        ep = self._fabric.lookup(peer)
        if isinstance(ep, _Frozen):
            return  # delivered nowhere, like a message to a stopped process that is never read
        ep._deliver(self._name, message)

    def progress(self) -> None:
        self._check_open()

    def notifications(self) -> Dict[str, List[bytes]]:
        self.progress()
        with self._lock:
            out, self._notifs = self._notifs, {}
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._fabric._remove(self._name)
