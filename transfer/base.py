"""The block-transport interface: move many byte ranges between two processes' registered memory.

A `Transport` is one endpoint (a NIXL agent, or an in-process stand-in). It owns the memory it registers
and the peers it connects to. Data moves by one-sided READ and WRITE of byte ranges: the initiator names
local ranges and remote ranges (addresses inside memory the peer registered), and many ranges travel as
ONE prepared transfer (`read`/`write` take lists; never loop one page at a time over the wire).

Lifecycle
  1. `Transport(...)`: creates the endpoint; its `name` is unique for the life of the process (peers key
     their state on it, and a restarted peer must never be mistaken for the old one).
  2. `register(addr, length)` the memory peers may touch, BEFORE handing out `metadata()`: metadata is a
     snapshot and does not follow later registrations.
  3. `metadata()` -> bytes, carried to peers out of band (the peer server's control plane does this).
     `connect(metadata, deadline)` on the initiator loads it and returns the peer's name.
  4. `read(peer, local, remote, deadline)` / `write(...)`: blocks until every range is done, or raises.
  5. `disconnect(peer)` forgets a peer (do this before reconnecting to a restarted one); `close()` ends
     the endpoint. Both are idempotent.

Failure model
  - Every blocking call takes an absolute `deadline` (time.monotonic() seconds). A frozen peer leaves a
    transfer "in progress" forever, so waits poll until the deadline, then cancel the transfer and raise
    `TransferTimeout`.
  - Any other failure (dead peer, unknown peer, bad range, backend error) raises `TransferError`. The
    implementations wrap their library's exceptions: callers catch exactly these two types.
  - After a failure the data in the destination ranges is undefined. The peer stays connected; callers
    that suspect a restart call `disconnect` and `connect` with fresh metadata.
  - Late reads: a READ that misses its deadline is NOT cancelled, because NIXL over UCX cannot fence it:
    after `release_xfer_handle` and even `remove_remote_agent` return, the bytes of a READ from a frozen
    peer still land in the destination once the peer resumes (observed over tcp). So `read` raises
    `TransferTimeout` with `unsettled` set: the destination ranges stay off limits to the caller until
    `unsettled.settled()` is True (the transfer finished or failed; each call polls, never blocks). The
    transport keeps such a peer loaded (a `disconnect` is deferred) so the transfer can still be polled.
    A WRITE that misses its deadline is cancelled as before: a late WRITE only reads its source.

Threading
  - A Transport is thread-safe: any method may be called from any thread. Implementations serialize
    calls into the underlying library with one internal, non-reentrant lock held only for a single
    library call, never across a wait, so concurrent transfers interleave their polling.
  - There is no background progress thread. A side that only receives one-sided traffic calls
    `progress()` now and then (the peer server does it from its own loop); it also collects
    notifications, returned by `notifications()`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

Range = Tuple[int, int]  # (address, length in bytes)


class TransferError(Exception):
    """A transfer or connection failed; the destination ranges are undefined."""


class Unsettled(ABC):
    """A READ that missed its deadline and may still land in its `local` ranges (see "Late reads")."""

    local: Tuple[Range, ...]

    @abstractmethod
    def settled(self) -> bool:
        """True once nothing more can land in `local` (the READ finished or failed). Polls; never blocks."""


class TransferTimeout(TransferError):
    """The deadline passed before the operation finished.

    `unsettled` is None when the operation was cancelled and touches no memory any more; for a READ that
    may still land, it is the `Unsettled` transfer whose destination must stay unused until it settles."""

    def __init__(self, message: str, unsettled: Optional[Unsettled] = None):
        super().__init__(message)
        self.unsettled = unsettled


@dataclass(frozen=True)
class Region:
    """Memory registered with a transport."""

    addr: int
    length: int

    def contains(self, addr: int, length: int) -> bool:
        return self.addr <= addr and addr + length <= self.addr + self.length

    def overlaps(self, other: "Region") -> bool:
        return self.addr < other.addr + other.length and other.addr < self.addr + self.length


def check_disjoint(registered, region: Region) -> None:
    """`register` refuses memory that overlaps registered memory: NIXL then fails transfers from the outer
    region whenever a smaller one lies inside it before the bytes moved (NIXL_ERR_NOT_FOUND, nixl 1.5.1),
    which a caller sees only later, at random (a freed buffer's registration under a new buffer)."""
    for r in registered:
        if r.overlaps(region):
            raise TransferError(f"[{region.addr:#x}, +{region.length}) overlaps registered [{r.addr:#x}, +{r.length}):"
                                " deregister it first")


def deadline_in(seconds: float) -> float:
    """An absolute deadline `seconds` from now, in the clock every transport uses."""
    return time.monotonic() + seconds


def remaining(deadline: float) -> float:
    return deadline - time.monotonic()


def check_ranges(local: Sequence[Range], remote: Sequence[Range]) -> None:
    """Both sides must pair up one to one with equal lengths: a mismatch is a caller bug."""
    if len(local) != len(remote):
        raise TransferError(f"{len(local)} local ranges but {len(remote)} remote ranges")
    for i, ((_, ll), (_, rl)) in enumerate(zip(local, remote)):
        if ll != rl or ll <= 0:
            raise TransferError(f"range {i}: local length {ll} != remote length {rl} (or not positive)")


class Transport(ABC):
    """One endpoint of the block transport. See the module docstring for lifecycle and contracts."""

    @property
    @abstractmethod
    def name(self) -> str:
        """Unique for the life of the process."""

    @abstractmethod
    def register(self, addr: int, length: int) -> Region:
        """Make [addr, addr+length) reachable by peers (and usable as a local side). Raises TransferError
        if it overlaps memory registered here already (see check_disjoint)."""

    @abstractmethod
    def deregister(self, region: Region) -> None:
        """Undo `register`; the memory must no longer be in flight."""

    @abstractmethod
    def metadata(self) -> bytes:
        """What a peer needs to reach this endpoint and its registered memory."""

    @abstractmethod
    def connect(self, metadata: bytes, deadline: float) -> str:
        """Load a peer's metadata (retrying until it sticks or the deadline passes); returns its name."""

    @abstractmethod
    def disconnect(self, peer: str) -> None:
        """Forget `peer`; a no-op for an unknown peer."""

    @abstractmethod
    def read(self, peer: str, local: Sequence[Range], remote: Sequence[Range], deadline: float) -> None:
        """Copy each remote range of `peer` into the paired local range, as one transfer.

        On a missed deadline raises `TransferTimeout`; its `unsettled` says whether `local` may still be
        written later (see "Late reads")."""

    @abstractmethod
    def write(
        self, peer: str, local: Sequence[Range], remote: Sequence[Range], deadline: float, notify: bytes = b""
    ) -> None:
        """Copy each local range into the paired remote range of `peer`, as one transfer.

        `notify`, if not empty, is delivered to the peer's `notifications()` after the data lands."""

    @abstractmethod
    def send_notification(self, peer: str, message: bytes) -> None:
        """A small message to `peer`, outside any transfer."""

    @abstractmethod
    def progress(self) -> None:
        """Drive the passive side: lets incoming one-sided traffic complete and collects notifications."""

    @abstractmethod
    def notifications(self) -> Dict[str, List[bytes]]:
        """Notifications received since the last call, by sender name (calls `progress` first)."""

    @abstractmethod
    def close(self) -> None:
        """End the endpoint. Idempotent."""

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
