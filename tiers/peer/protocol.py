"""The peer protocol's constants, scoped keys and page checksums (the design is in tiers/peer/__init__.py).

Page checksum: XXH3-128 over the scoped key followed by the page bytes, seeded with a 64-bit hash of the
scoped key: a per-key hash function, and the key inside the input, so a checksum verifies only the bytes it
was made for, under the (namespace, key) it was made for. XXH3 runs at memory speed (~6 GB/s from DRAM
here, ~15 GB/s from cache, against sha256's ~1.3 and BLAKE3's ~5): the check costs less than the copy it
guards. It is not a cryptographic MAC; what it defends against, and what not, is in README (promise 4).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Iterable

import xxhash

from transfer.base import Range, TransferError

PROTOCOL_VERSION = 2  # 2: a lookup answers with two lists (offsets, checksums), not one object per key
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


@functools.lru_cache(maxsize=256)
def _bytes_type(length: int):
    return ctypes.c_char * length


def _raw(addr: int, length: int):
    """Raw memory as a ctypes array: a buffer the hash reads in place (cheaper per page than a memoryview)."""
    return _bytes_type(length).from_address(addr)


def page_checksum(skey: bytes, pieces: Iterable[Range]) -> str:
    """XXH3-128 of `skey` and then the page's pieces (in order), seeded by `skey`; 32 hex digits."""
    h = xxhash.xxh3_128(skey, seed=xxhash.xxh3_64_intdigest(skey))
    for addr, length in pieces:
        h.update(_raw(addr, length))
    return h.hexdigest()
