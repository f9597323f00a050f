"""The peer tier's batched read path: pages that sit in a row on both sides move as one NIXL descriptor,
every page still verified on its own; and a peer that lies in a batched answer moves no bytes.

Guards: a read coalesced into one descriptor whose middle page is corrupt is a miss for that page only
(the others verify and are kept); a lookup, probe or alloc answer with a slot outside the pool announced,
off the page grid, of the wrong type, a checksum that is not a string, or a list of the wrong length fails
the call before any READ or WRITE (the destination is untouched) and the next call works; with hashing
threads and without (the choice the load makes), every page is verified on its own. Real peer server
processes, real NIXL.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.peer.test_peer_server import keys
from tiers.peer.client import PeerClient
from transfer.base import TransferError

PAGE = 4096


class Flat:
    """n pages of one piece each, in a row in registered memory (like a page-first host pool)."""

    def __init__(self, transport, n, seed=None):
        self.buf = np.zeros(n * PAGE, dtype=np.uint8)
        if seed is not None:
            self.buf[:] = np.random.default_rng(seed).integers(0, 256, self.buf.size, dtype=np.uint8)
        transport.register(self.buf.ctypes.data, self.buf.nbytes)
        self.pages = [[(self.buf.ctypes.data + i * PAGE, PAGE)] for i in range(n)]

    def bytes_of(self, i):
        return bytes(self.buf[i * PAGE : (i + 1) * PAGE])


def flat_client(peer, transport):
    host, port = peer.address.split(":")
    return PeerClient(host, int(port), transport, PAGE, timeout_s=10.0)


def descriptor_counts(monkeypatch):
    """Records how many descriptors each NIXL transfer was built with."""
    from transfer import nixl_transport

    seen, real = [], nixl_transport.coalesced

    def counting(local, remote):
        runs = real(local, remote)
        seen.append((len(local), len(runs[0])))
        return runs

    monkeypatch.setattr(nixl_transport, "coalesced", counting)
    return seen


def test_a_coalesced_read_with_a_corrupt_middle_page_misses_that_page_only(peer_factory, transport, monkeypatch):
    c = flat_client(peer_factory("--capacity-gb", "0.01", "--enable-test-hooks"), transport)
    src, dst = Flat(transport, 8, seed=31), Flat(transport, 8)
    assert c.put("ns", keys(8), src.pages) == [True] * 8  # a fresh pool: 8 slots in a row
    c.corrupt("ns", "k0003")
    seen = descriptor_counts(monkeypatch)
    assert c.get("ns", keys(8), dst.pages) == [True] * 3 + [False] + [True] * 4
    assert seen == [(8, 1)]  # 8 pages in a row on both sides: one descriptor
    assert all(dst.bytes_of(i) == src.bytes_of(i) for i in range(8) if i != 3)
    assert c.corrupt_pages == 1 and c.stats().corrupt_dropped == 1
    assert c.exists("ns", keys(8)) == [True] * 3 + [False] + [True] * 4


def _lie_in(op, lie):
    """A `_roundtrip` that answers `op` as the real peer did, then alters page/slot 1 with `lie`."""
    real = PeerClient._roundtrip

    def lying(self, body, deadline):
        resp, blob = real(self, body, deadline)
        if body["op"] == op:
            lie(resp, self)
        return resp, blob

    return lying


def _set(field, value):
    def lie(resp, client):
        resp["slots"][1][field] = value(client) if callable(value) else value
    return lie


def _set_found(column, value):
    def lie(resp, client):
        resp[column][1] = value(client) if callable(value) else value
    return lie


def _drop_last(column):
    return lambda resp, c: resp[column].pop()


LOOKUP_LIES = {
    "offset past the pool": _set_found("offsets", lambda c: c._pool_bytes),
    "offset before the pool": _set_found("offsets", -PAGE),
    "offset off the page grid": _set_found("offsets", PAGE // 2),
    "offset a boolean": _set_found("offsets", True),
    "offset a string": _set_found("offsets", "0"),
    "checksum not a string": _set_found("checksums", 5),
    "checksum missing for a found page": _set_found("checksums", None),
    "one offset too few": _drop_last("offsets"),
    "one checksum too few": _drop_last("checksums"),
    "one page too many": lambda resp, c: (resp["offsets"].append(resp["offsets"][0]),
                                          resp["checksums"].append(resp["checksums"][0])),
    "offsets not a list": lambda resp, c: resp.__setitem__("offsets", {"0": resp["offsets"][0]}),
}


@pytest.mark.parametrize("lie", sorted(LOOKUP_LIES))
def test_a_lying_lookup_answer_moves_no_bytes(peer_factory, transport, monkeypatch, lie):
    c = flat_client(peer_factory("--capacity-gb", "0.01"), transport)
    src, dst = Flat(transport, 4, seed=32), Flat(transport, 4)
    assert all(c.put("ns", keys(4), src.pages))
    reads = []
    monkeypatch.setattr(transport, "read", lambda *a, **k: reads.append(a))
    monkeypatch.setattr(PeerClient, "_roundtrip", _lie_in("lookup", LOOKUP_LIES[lie]))
    with pytest.raises(TransferError):
        c.get("ns", keys(4), dst.pages)
    assert reads == [] and not dst.buf.any()
    monkeypatch.undo()
    assert c.get("ns", keys(4), dst.pages) == [True] * 4  # the next call reconnects and reads
    assert all(dst.bytes_of(i) == src.bytes_of(i) for i in range(4))


def test_a_probe_answered_with_the_wrong_number_of_pages_fails(peer_factory, transport, monkeypatch):
    c = flat_client(peer_factory("--capacity-gb", "0.01"), transport)
    assert all(c.put("ns", keys(4), Flat(transport, 4, seed=35).pages))
    monkeypatch.setattr(PeerClient, "_roundtrip", _lie_in("lookup", LOOKUP_LIES["one offset too few"]))
    with pytest.raises(TransferError):
        c.exists("ns", keys(4))  # not three answers for four keys, zipped into three hits and a silent gap
    monkeypatch.undo()
    assert c.exists("ns", keys(4)) == [True] * 4


ALLOC_LIES = {
    "offset past the pool": _set("offset", lambda c: c._pool_bytes),
    "offset off the page grid": _set("offset", 1),
    "offset missing": lambda resp, c: resp["slots"][1].pop("offset"),
    "one slot too few": lambda resp, c: resp["slots"].pop(),
}


@pytest.mark.parametrize("lie", sorted(ALLOC_LIES))
def test_a_lying_alloc_answer_writes_nothing(peer_factory, transport, monkeypatch, lie):
    c = flat_client(peer_factory("--capacity-gb", "0.01"), transport)
    src = Flat(transport, 4, seed=33)
    writes = []
    monkeypatch.setattr(transport, "write", lambda *a, **k: writes.append(a))
    monkeypatch.setattr(PeerClient, "_roundtrip", _lie_in("alloc", ALLOC_LIES[lie]))
    with pytest.raises(TransferError):
        c.put("ns", keys(4), src.pages)
    assert writes == []


@pytest.mark.parametrize("threads", [True, False], ids=["hashing-threads", "caller-hashes"])
def test_both_hashing_plans_verify_every_page_and_miss_only_the_corrupt_one(peer_factory, transport, threads):
    """Whichever plan the load picks (overlap.saturated), forced here: runs of 4 pages, a corrupt page in
    the middle run, a put that hashes while it writes."""
    from tiers.peer.protocol import page_checksum, scoped_key

    host, port = peer_factory("--capacity-gb", "0.01", "--enable-test-hooks").address.split(":")
    c = PeerClient(host, int(port), transport, PAGE, timeout_s=10.0, chunk_bytes=4 * PAGE, hash_threads=threads)
    src, dst = Flat(transport, 12, seed=34), Flat(transport, 12)
    assert c.put("ns", keys(12), src.pages) == [True] * 12
    c.corrupt("ns", "k0006")
    sums = c.get_verified("ns", keys(12), dst.pages)
    assert [s is not None for s in sums] == [True] * 6 + [False] + [True] * 5
    assert all(dst.bytes_of(i) == src.bytes_of(i) for i in range(12) if i != 6)
    assert all(s == page_checksum(scoped_key("ns", k), p) for s, k, p in zip(sums, keys(12), src.pages) if s)
