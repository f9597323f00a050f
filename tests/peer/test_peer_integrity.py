"""Page integrity on the peer tier's new paths: chunked transfers with checksums computed alongside
(tiers/peer/overlap.py), and puts that reuse a reader's verified checksums (replication).

Guards: a corrupt page in any chunk is a miss, counted and dropped; bytes served for another key (a
misplaced slot) are a miss; a put whose given checksums do not match its bytes, or were made for another
key, stores nothing; chunked multi-piece pages round-trip bit-exact. Real peer server processes, real NIXL.
"""

from __future__ import annotations

import pytest

from tests.peer.test_peer_server import PAGE, Pages, keys
from tiers.peer.client import PeerClient
from tiers.peer.protocol import page_checksum, scoped_key


def chunked_client(peer, transport, chunk_pages):
    host, port = peer.address.split(":")
    return PeerClient(host, int(port), transport, PAGE, timeout_s=10.0, chunk_bytes=chunk_pages * PAGE)


def test_chunked_round_trip_of_multi_piece_pages_is_bit_exact(peer_factory, transport):
    c = chunked_client(peer_factory("--capacity-gb", "0.01"), transport, chunk_pages=3)  # 10 pages: 4 chunks
    src, dst = Pages(transport, 10, seed=21), Pages(transport, 10)
    assert c.put("ns", keys(10), src.pages()) == [True] * 10
    sums = c.get_verified("ns", keys(10), dst.pages())
    assert all(dst.bytes_of(i) == src.bytes_of(i) for i in range(10))
    assert sums == [page_checksum(scoped_key("ns", k), p) for k, p in zip(keys(10), src.pages())]


def test_a_corrupt_page_in_a_middle_chunk_is_a_miss(peer_factory, transport):
    c = chunked_client(peer_factory("--capacity-gb", "0.01", "--enable-test-hooks"), transport, chunk_pages=2)
    src, dst = Pages(transport, 8, seed=22), Pages(transport, 8)
    assert all(c.put("ns", keys(8), src.pages()))
    c.corrupt("ns", "k0005")  # third of four chunks
    assert c.get("ns", keys(8), dst.pages()) == [True] * 5 + [False] + [True] * 2
    assert c.corrupt_pages == 1 and c.stats().corrupt_dropped == 1
    assert c.exists("ns", keys(8)) == [True] * 5 + [False] + [True] * 2


def test_bytes_served_for_another_key_are_a_miss(peer_factory, transport, monkeypatch):
    """A peer that answers a lookup with another page's slot (a misplaced page): the bytes are intact, but
    they were written for another key, so they never verify."""
    c = chunked_client(peer_factory("--capacity-gb", "0.01"), transport, chunk_pages=2)
    src, dst = Pages(transport, 4, seed=23), Pages(transport, 4)
    assert all(c.put("ns", keys(4), src.pages()))
    real = PeerClient._roundtrip

    def swapping(self, body, deadline):
        resp, blob = real(self, body, deadline)
        if body["op"] == "lookup" and body.get("pin"):
            p = resp["offsets"]
            p[1], p[2] = p[2], p[1]
        return resp, blob

    monkeypatch.setattr(PeerClient, "_roundtrip", swapping)
    assert c.get("ns", keys(4), dst.pages()) == [True, False, False, True]
    monkeypatch.undo()
    stats = c.stats()
    assert (stats.transit_errors, stats.corrupt_dropped) == (2, 0)  # re-verified on the peer: intact, kept


def test_a_put_with_given_checksums_cannot_plant_bytes(peer_factory, transport):
    """The replication path puts with checksums it already verified; the peer still checks them at commit,
    so checksums of other bytes (right key, wrong bytes) or of another key store nothing."""
    c = chunked_client(peer_factory("--capacity-gb", "0.01"), transport, chunk_pages=2)
    src, other = Pages(transport, 3, seed=24), Pages(transport, 3, seed=25)
    ks = keys(3)
    wrong_bytes = [page_checksum(scoped_key("ns", k), p) for k, p in zip(ks, other.pages())]
    assert c.put("ns", ks, src.pages(), checksums=wrong_bytes) == [False] * 3
    other_key = [page_checksum(scoped_key("other-ns", k), p) for k, p in zip(ks, src.pages())]
    assert c.put("ns", ks, src.pages(), checksums=other_key) == [False] * 3
    assert c.exists("ns", ks) == [False] * 3
    right = [page_checksum(scoped_key("ns", k), p) for k, p in zip(ks, src.pages())]
    assert c.put("ns", ks, src.pages(), checksums=right) == [True] * 3
    dst = Pages(transport, 3)
    assert c.get("ns", ks, dst.pages()) == [True] * 3 and all(dst.bytes_of(i) == src.bytes_of(i) for i in range(3))
