"""A `Transport` over NIXL with the UCX backend (DRAM to DRAM). The only module that imports nixl.

Design notes (observed on these machines: nixl 1.5.1, UCX over loopback, no GPU):
- No progress thread (`enable_prog_thread=False`): NIXL's spins a whole core per agent even when idle.
  The initiator drives its own transfers by polling `check_xfer_state`; a passive side calls
  `progress()` from its own loop, or the first transfer to it stalls until it does.
- No listener thread: metadata travels through the caller's own control plane (`metadata()` /
  `connect()`), so no NIXL port is ever bound. Loading metadata is retried until
  `check_remote_metadata` confirms it, because a first load after a peer restart can be lost silently.
- A frozen peer keeps a transfer in "PROC" with no timeout of its own: every wait polls against the
  caller's deadline. A WRITE is then cancelled by `release_xfer_handle`. A READ is not: over tcp its bytes
  still land once the peer resumes, even after the handle was released and the remote agent removed
  (tests/transfer/test_transport.py::test_nixl_read_from_a_frozen_peer_lands_late_and_is_reported). So a
  timed-out READ keeps its handle in a `_LateRead`, handed to the caller inside `TransferTimeout`; polling
  it (`settled()`) releases the handle once the state leaves PROC. While a peer has late reads, a
  `disconnect` only hides it from new transfers; the agent is removed when its last late read settles.
  A handle that refuses to be released is kept and retried at `close()` rather than leaked silently.
- Descriptors: a transfer's pairs that continue each other on both sides are merged first (`coalesced`):
  512 x 64 KiB as 512 descriptors took ~6.5 ms, as one ~3.7 ms (cma, idle machine).
- A READ posted to a peer that has just died can stay queued in UCX's cma endpoint (the copy is run by the
  next worker progress, which fails it at once against a dead process). Destroying the agent with it still
  queued aborts the whole process (`arbiter.c: Assertion ucs_arbiter_group_is_empty(group) failed`, in
  `ucp_worker_destroy`; reproduced under CPU load, about one cycle in three). So a failed transfer, and
  `close()`, run a few progress rounds (`_drain`) before anything can destroy the worker.
- The bindings raise exceptions with no common base (nixlRemoteDisconnectError, nixlNotFoundError, ...),
  and some helpers return None after only logging: both become `TransferError`.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from typing import Dict, List, Sequence, Set, Tuple

import numpy as np

from transfer.base import (Range, Region, Transport, TransferError, TransferTimeout, Unsettled, check_disjoint,
                           check_ranges)

try:  # the `nixl` meta package re-exports the build-specific one; nixl-cu12 alone installs `nixl_cu12`
    from nixl._api import nixl_agent, nixl_agent_config
except ImportError:  # pragma: no cover - depends on which wheel is installed
    from nixl_cu12._api import nixl_agent, nixl_agent_config

logger = logging.getLogger(__name__)

_MEM = "DRAM"
_counter = itertools.count()
_DRAIN_ROUNDS = 8  # one round runs what is queued; the rest cover ops that a failing one queues behind it


def use_loopback_only() -> None:
    """Make UCX advertise only the loopback device. Must run before the first agent is created."""
    os.environ.setdefault("UCX_NET_DEVICES", "lo")


def unique_agent_name(prefix: str) -> str:
    """Unique for the life of the process, and across restarts (pid + random suffix)."""
    return f"{prefix}-{os.getpid()}-{next(_counter)}-{uuid.uuid4().hex[:8]}"


def _descs(ranges: Sequence[Range]) -> np.ndarray:
    arr = np.zeros((len(ranges), 3), dtype=np.uint64)
    if ranges:
        arr[:, :2] = np.asarray(ranges, dtype=np.uint64)
    return arr  # column 2: device id, always 0 for DRAM


def coalesced(local: Sequence[Range], remote: Sequence[Range]) -> Tuple[List[Range], List[Range]]:
    """The pairs as fewer, longer pairs: a pair that continues the previous one on both sides joins it.

    Same bytes, same pairing, fewer descriptors: a prepared transfer's cost grows with its descriptor count
    (512 x 64 KiB: ~1.7x the time of the same bytes as one range), and pages stored in a row at the peer
    that land in a row locally become one range. Lengths must already pair up (check_ranges). A plain loop:
    numpy's conversion of a list of pairs costs more than the loop."""
    out_l: List[Range] = []
    out_r: List[Range] = []
    at_l = at_r = n = 0
    for (a, k), (b, _) in zip(local, remote):
        if n and a == at_l + n and b == at_r + n:
            n += k
            continue
        if n:
            out_l.append((at_l, n))
            out_r.append((at_r, n))
        at_l, at_r, n = a, b, k
    if n:
        out_l.append((at_l, n))
        out_r.append((at_r, n))
    return out_l, out_r


def _backoff(start: float) -> None:
    """Spin briefly (most transfers finish in microseconds), then sleep longer and longer, up to 1 ms."""
    waited = time.monotonic() - start
    if waited < 0.0005:
        time.sleep(0)
    else:
        time.sleep(min(0.001, waited / 10))


class _LateRead(Unsettled):
    """A READ past its deadline, still in flight: its handle is kept until the state leaves PROC."""

    def __init__(self, transport: "NixlTransport", handle, peer: str, local: Sequence[Range]):
        self._transport, self._handle, self.peer = transport, handle, peer
        self.local = tuple(local)
        self._done = False

    def settled(self) -> bool:
        if not self._done:
            self._done = self._transport._poll_late(self)
        return self._done


class NixlTransport(Transport):
    def __init__(self, name_prefix: str = "kvpeer", backends: Sequence[str] = ("UCX",)):
        self._name = unique_agent_name(name_prefix)
        self._lock = threading.Lock()  # guards every call into the agent; never held across a wait
        self._regions: Dict[Region, object] = {}
        self._peers: set = set()
        self._notifs: Dict[str, List[bytes]] = {}
        self._stuck_handles: list = []
        self._late: Dict[str, Set[_LateRead]] = {}  # peer -> its reads past their deadline, not settled
        self._forget_later: Set[str] = set()  # peers disconnected while they had late reads
        self._closed = False
        config = nixl_agent_config(
            enable_prog_thread=False, enable_listen_thread=False, listen_port=0, backends=list(backends)
        )
        try:
            self._agent = nixl_agent(self._name, config)
        except Exception as e:
            raise TransferError(f"cannot create NIXL agent: {type(e).__name__}: {e}") from e
        missing = [b for b in backends if b not in self._agent.backends]
        if missing:
            raise TransferError(f"NIXL backend(s) {missing} unavailable; plugins: {self._agent.plugin_list}")

    @property
    def name(self) -> str:
        return self._name

    def _call(self, what: str, fn, *args):
        if self._closed:
            raise TransferError(f"transport {self._name} is closed")
        with self._lock:
            try:
                return fn(*args)
            except TransferError:
                raise
            except Exception as e:  # no common base class in the bindings
                raise TransferError(f"{what}: {type(e).__name__}: {e}") from e

    # --- memory and peers ---
    def register(self, addr: int, length: int) -> Region:
        if length <= 0:
            raise TransferError(f"cannot register {length} bytes")
        region = Region(addr, length)
        check_disjoint(list(self._regions), region)  # a snapshot: deregister may run on another thread
        descs = self._call("register_memory", self._agent.register_memory, [(addr, length, 0, "")], _MEM)
        if descs is None:
            raise TransferError("register_memory returned None")
        self._regions[region] = descs
        return region

    def deregister(self, region: Region) -> None:
        descs = self._regions.pop(region, None)
        if descs is not None:
            self._call("deregister_memory", self._agent.deregister_memory, descs)

    def metadata(self) -> bytes:
        return self._call("get_agent_metadata", self._agent.get_agent_metadata)

    def connect(self, metadata: bytes, deadline: float) -> str:
        # Load, then confirm; retry either step until the deadline (a load can fail transiently, and a
        # loaded agent is not always visible at once).
        last: Exception | None = None
        name: str | None = None
        start = time.monotonic()
        while True:
            try:
                if name is None:
                    loaded = self._call("add_remote_agent", self._agent.add_remote_agent, metadata)
                    name = loaded.decode() if isinstance(loaded, bytes) else loaded
                if self._call("check_remote_metadata", self._agent.check_remote_metadata, name):
                    self._peers.add(name)
                    self._forget_later.discard(name)  # the same agent again (a thawed peer): keep it
                    return name
                last = TransferError(f"metadata of {name} not visible yet")
            except TransferError as e:
                last = e
            if time.monotonic() >= deadline:
                raise TransferTimeout(f"could not load peer metadata before the deadline: {last}")
            _backoff(start)

    def disconnect(self, peer: str) -> None:
        if peer in self._peers and not self._closed:
            self._peers.discard(peer)
            with self._lock:
                if self._late.get(peer):
                    self._forget_later.add(peer)  # removing the agent would not stop its late reads landing
                    return
            self._remove_agent(peer)

    def _remove_agent(self, peer: str) -> None:
        if not self._closed:
            try:
                self._call("remove_remote_agent", self._agent.remove_remote_agent, peer)
            except TransferError as e:
                logger.debug("forgetting %s: %s", peer, e)

    # --- data ---
    def read(self, peer: str, local: Sequence[Range], remote: Sequence[Range], deadline: float) -> None:
        self._xfer("READ", peer, local, remote, deadline, b"")

    def write(
        self, peer: str, local: Sequence[Range], remote: Sequence[Range], deadline: float, notify: bytes = b""
    ) -> None:
        self._xfer("WRITE", peer, local, remote, deadline, notify)

    def _xfer(self, op: str, peer: str, local, remote, deadline: float, notify: bytes) -> None:
        check_ranges(local, remote)
        if not local:
            return
        if peer not in self._peers:
            raise TransferError(f"unknown peer {peer!r}: connect first")
        agent = self._agent
        runs = coalesced(local, remote)
        try:
            descs = _descs(runs[0]), _descs(runs[1])
        except (OverflowError, ValueError) as e:  # an address outside [0, 2**64): a caller bug
            raise TransferError(f"bad range: {e}") from e
        local_dl = self._call("get_xfer_descs", agent.get_xfer_descs, descs[0], _MEM)
        remote_dl = self._call("get_xfer_descs", agent.get_xfer_descs, descs[1], _MEM)
        if local_dl is None or remote_dl is None:
            raise TransferError("could not build descriptor lists")
        handle = self._call(f"{op} initialize_xfer", agent.initialize_xfer, op, local_dl, remote_dl, peer, notify)
        late = None
        try:
            state = self._call(f"{op} transfer", agent.transfer, handle)
            start = time.monotonic()
            while state == "PROC":
                if time.monotonic() >= deadline:
                    if op == "READ":
                        late = self._keep_late(handle, peer, local)
                    raise TransferTimeout(f"{op} of {len(local)} ranges from {peer} still in progress at the deadline",
                                          unsettled=late)
                _backoff(start)
                state = self._call(f"{op} check_xfer_state", agent.check_xfer_state, handle)
            if state != "DONE":
                raise TransferError(f"{op} with {peer} ended in state {state}")
        except TransferTimeout:
            raise
        except TransferError:
            self._drain()  # what UCX queued towards a dead peer must fail out now (module notes)
            raise
        finally:
            if late is None:
                self._release(handle)

    # --- late reads (see the module notes) ---
    def _keep_late(self, handle, peer: str, local: Sequence[Range]) -> _LateRead:
        late = _LateRead(self, handle, peer, local)
        with self._lock:
            self._late.setdefault(peer, set()).add(late)
        logger.warning("READ from %s past its deadline: its %d destination range(s) stay reserved until it ends",
                       peer, len(local))
        return late

    def _poll_late(self, late: _LateRead) -> bool:
        """Whether `late` has left PROC; if so, release its handle and forget it (and maybe its peer)."""
        if self._closed:
            return False  # close() could not settle it: its memory stays reserved for good
        try:
            state = self._call("check_xfer_state", self._agent.check_xfer_state, late._handle)
        except TransferError as e:  # the peer died: nothing more can arrive from it
            logger.debug("late READ from %s ended: %s", late.peer, e)
            state = "ERR"
        if state == "PROC":
            return False
        self._release(late._handle)
        with self._lock:
            pending = self._late.get(late.peer, set())
            pending.discard(late)
            forget = not pending and late.peer in self._forget_later
            if not pending:
                self._late.pop(late.peer, None)
            if forget:
                self._forget_later.discard(late.peer)
        if forget:
            self._remove_agent(late.peer)
        return True

    def _release(self, handle) -> None:
        try:
            self._call("release_xfer_handle", self._agent.release_xfer_handle, handle)
        except TransferError as e:
            # NIXL refuses to free a transfer it cannot cancel; keep it so close() can try again.
            logger.warning("keeping an uncancellable transfer handle: %s", e)
            self._stuck_handles.append(handle)

    # --- notifications ---
    def send_notification(self, peer: str, message: bytes) -> None:
        self._call("send_notif", self._agent.send_notif, peer, message)

    def progress(self) -> None:
        new = self._call("get_new_notifs", self._agent.get_new_notifs)
        for sender, msgs in (new or {}).items():
            self._notifs.setdefault(sender, []).extend(msgs)

    def notifications(self) -> Dict[str, List[bytes]]:
        self.progress()
        with self._lock:
            out, self._notifs = self._notifs, {}
        return out

    def _drain(self) -> None:
        """Progress the worker a few rounds, so that nothing queued is left for the worker's destruction."""
        for _ in range(_DRAIN_ROUNDS):
            try:
                self.progress()  # keeps what notifications arrive
            except TransferError as e:  # a dead peer's error surfaces here too: what the drain is for
                logger.debug("progress while draining: %s", e)

    def close(self) -> None:
        if self._closed:
            return
        self._drain()
        for late in [x for reads in list(self._late.values()) for x in list(reads)]:
            if not late.settled():
                logger.warning("closing with a READ from %s still in flight: its destination may still change",
                               late.peer)
                self._stuck_handles.append(late._handle)
        for handle in self._stuck_handles:
            try:
                with self._lock:
                    self._agent.release_xfer_handle(handle)
            except Exception as e:
                logger.warning("transfer handle still stuck at close: %s", e)
        self._stuck_handles.clear()
        self._late.clear()
        for peer in list(self._peers | self._forget_later):
            self._remove_agent(peer)
        self._peers.clear()
        for region in list(self._regions):
            try:
                self.deregister(region)
            except TransferError as e:
                logger.warning("deregister at close: %s", e)
        self._closed = True
