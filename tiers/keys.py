"""Scoped block keys: the identity a KV block is stored under in every tier.

A block's key is a chained SHA-256: key_i = sha256(key_{i-1} || tokens of block i as int64 LE), seeded with
the digest of a `Namespace` (tenant cache_salt, model path, weights revision, KV dtype, page size). Two
tenants therefore never share a block key, and a model, revision, dtype or page-size change never hits old
blocks, even for identical tokens. Keys are 64-char hex strings, the format SGLang's HiCache storage keys
use; `scope_storage_key` namespaces such an existing key for a shared (peer or L3) store.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import struct
from typing import List, Optional, Sequence

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclasses.dataclass(frozen=True)
class Namespace:
    model_path: str
    revision: str = ""
    kv_dtype: str = ""
    page_size: int = 1
    cache_salt: Optional[str] = None  # the tenant

    def __post_init__(self):
        if not isinstance(self.model_path, str) or not self.model_path:
            raise ValueError("Namespace.model_path must be a non-empty string")
        for name in ("revision", "kv_dtype"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"Namespace.{name} must be a string")
        if self.cache_salt is not None and not isinstance(self.cache_salt, str):
            raise ValueError("Namespace.cache_salt must be a string or None")
        if isinstance(self.page_size, bool) or not isinstance(self.page_size, int) or self.page_size <= 0:
            raise ValueError(f"Namespace.page_size must be a positive int, got {self.page_size!r}")

    @property
    def digest(self) -> str:
        h = hashlib.sha256(b"tiered-kv-namespace-v1")
        # length-prefixed fields: ("ab", "c") and ("a", "bc") must differ; None differs from ""
        for part in (self.model_path, self.revision, self.kv_dtype, str(self.page_size)):
            b = part.encode("utf-8")
            h.update(len(b).to_bytes(8, "little") + b)
        if self.cache_salt is None:
            h.update(b"\x00")
        else:
            b = self.cache_salt.encode("utf-8")
            h.update(b"\x01" + len(b).to_bytes(8, "little") + b)
        return h.hexdigest()


def block_keys(ns: Namespace, tokens: Sequence[int], block_size: Optional[int] = None) -> List[str]:
    """Chained keys of the full blocks of `tokens` (a trailing partial block has no key)."""
    bs = ns.page_size if block_size is None else block_size
    if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
        raise ValueError(f"block_size must be a positive int, got {bs!r}")
    prev = bytes.fromhex(ns.digest)
    out = []
    for start in range(0, len(tokens) - bs + 1, bs):
        block = tokens[start : start + bs]
        try:
            packed = struct.pack(f"<{bs}q", *block)
        except struct.error as exc:
            raise ValueError(f"tokens must be int64 values: {exc}") from None
        prev = hashlib.sha256(prev + packed).digest()
        out.append(prev.hex())
    return out


def scope_storage_key(ns: Namespace, storage_key: str) -> str:
    """An SGLang HiCache storage key (64 hex) prefixed with the namespace digest, for a store shared across
    models or tenants."""
    if not isinstance(storage_key, str) or not _HEX64.match(storage_key):
        raise ValueError(f"storage key must be 64 lowercase hex characters, got {storage_key!r}")
    return f"{ns.digest[:32]}-{storage_key}"


def weights_revision(model_path: str) -> str:
    """The revision of a model directory's files, for `Namespace.revision`: a digest over each top-level file's
    resolved name, size and modification time. Conservative: new weights written in place (same path, same
    served name) always change it; a touch or copy changes it too, which only costs misses. A path that is not
    a local directory (a hub id) gives "" and is identified by its name alone."""
    if not os.path.isdir(model_path):
        return ""
    h = hashlib.sha256(b"tiered-kv-weights-v1")
    for name in sorted(os.listdir(model_path)):
        path = os.path.join(model_path, name)
        real = os.path.realpath(path)  # a hub cache links to blobs named by their content hash
        if not os.path.isfile(real):
            continue
        st = os.stat(real)
        h.update(f"{name}\0{os.path.basename(real)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]
