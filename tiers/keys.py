"""The model revision that peer keys are scoped by, and the policy key of a tree entry.

Where each tier's key gets its scope (README, "Tenants are isolated on every tier"): the device and host tiers
key blocks by SGLang's radix tree path, whose root-level child key carries the request's `extra_key` and
`cache_salt`; the peer tier keys a page by (namespace, SGLang's page hash), the hash chain seeded with
`storage_namespace_seed(extra_key, cache_salt)` and the namespace naming model, revision (below), rank and page
layout (sglang_ext.peer_storage).
"""

from __future__ import annotations

import hashlib
import os
import zlib


def weights_revision(model_path: str) -> str:
    """The revision of a model directory's files, for the peer namespace: a digest over each top-level file's
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


def path_key(parent_key: int, child_key) -> int:
    """A radix tree entry's policy key: its parent's key and its first page's child key, hashed alike in every
    process. SGLang namespaces a child key as `((extra_key, cache_salt), tokens)` or `(extra_key, tokens)`, and
    Python salts `str` hashes per process, so the namespace enters as its crc32: the shadow sampler picks chains
    by these keys, and a replay must not pick other chains in another process."""
    if type(child_key) is tuple and len(child_key) == 2:
        ns = child_key[0]
        if type(ns) is str or (type(ns) is tuple and all(type(x) is str or x is None for x in ns)):
            return hash((parent_key, zlib.crc32(repr(ns).encode()), child_key[1]))
    return hash((parent_key, child_key))
