"""What the device-only and the host-tier trees share: the one read-only walk of a radix tree, and the marks on
nodes that a request's own chunks inserted (a chunk of a chunked prefill enters the tree before its request is
recorded; when it is, its own chunks are neither a use nor part of its hit). Pure functions over SGLang's
TreeNode; the scheduler thread only, like the trees.
"""

from __future__ import annotations

# set on a TreeNode a chunk of a chunked prefill inserted, until its request is recorded (the request's own KV)
OWN_CHUNK = "tier_own_chunk"


def is_own_chunk(node) -> bool:
    return getattr(node, OWN_CHUNK, False)


def mark_own_chunk(node, own: bool = True) -> None:
    """Mark `node` as a chunk's, or (own False) as not; a split's front part takes its node's mark."""
    setattr(node, OWN_CHUNK, own)


def own_chunk_tokens(path) -> int:
    """Tokens of `path` that the recording request's own chunks inserted."""
    return sum(len(n.key) for n in path if is_own_chunk(n))


def used_before(node) -> bool:
    """Whether a node on a recorded request's path was there before the request; clears the request's own mark."""
    if is_own_chunk(node):
        mark_own_chunk(node, False)
        return False
    return True


def peek_path(root, key, page_size: int):
    """(nodes `key` passes through, matched length, node the remainder would hang from), changing nothing: the one
    read-only walk of a radix tree, shared by the device-only and the host-tier cache."""
    node, matched, path = root, 0, []
    while matched < len(key):
        child = node.children.get(key.child_key_at(matched, page_size))
        if child is None:
            break
        m = child.key.match_at(key, matched, page_size=page_size)
        path.append(child)
        matched += m
        node = child
        if m < len(child.key):
            break
    return path, matched, node
