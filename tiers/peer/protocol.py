"""The peer protocol's constants, scoped keys and page checksums (the design is in tiers/peer/__init__.py)."""

from __future__ import annotations

import ctypes
import hashlib
from typing import Iterable

from transfer.base import Range, TransferError

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
