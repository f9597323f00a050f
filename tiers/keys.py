"""The model revision that peer keys are scoped by.

Where each tier's key gets its scope (README, "Tenants are isolated on every tier"): the device and host tiers
key blocks by SGLang's radix tree path, whose root-level child key carries the request's `extra_key` and
`cache_salt`; the peer tier keys a page by (namespace, SGLang's page hash), the hash chain seeded with
`storage_namespace_seed(extra_key, cache_salt)` and the namespace naming model, revision (below), rank and page
layout (sglang_ext.peer_storage).
"""

from __future__ import annotations

import hashlib
import os


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
