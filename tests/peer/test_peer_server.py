"""The peer block server as a process, driven through PeerClient over real NIXL (no SGLang import).

Guards: pages come back bit-exact (multi-piece pages included); one namespace never reads another's
pages; altered pool bytes are detected, counted and dropped; a full pool evicts by policy instead of
failing; dead, frozen and restarted peers cost a bounded error, then work again; bad flags exit cleanly.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tiers.peer.client import PeerClient
from transfer.base import TransferError

PAGE = 4096
PIECE = PAGE // 2


class Pages:
    """n pages of registered memory, each as two non-adjacent pieces (like a layer-first host pool)."""

    def __init__(self, transport, n, seed=None):
        self.n = n
        self.buf = np.zeros(2 * n * PIECE, dtype=np.uint8)
        if seed is not None:
            self.buf[:] = np.random.default_rng(seed).integers(0, 256, self.buf.size, dtype=np.uint8)
        transport.register(self.buf.ctypes.data, self.buf.nbytes)
        self.base = self.buf.ctypes.data

    def page(self, i):  # first half of the page at piece i, second half n pieces later
        return [(self.base + i * PIECE, PIECE), (self.base + (self.n + i) * PIECE, PIECE)]

    def pages(self, idx=None):
        return [self.page(i) for i in (range(self.n) if idx is None else idx)]

    def bytes_of(self, i):
        return bytes(self.buf[i * PIECE : (i + 1) * PIECE]) + bytes(self.buf[(self.n + i) * PIECE : (self.n + i + 1) * PIECE])


def keys(n, prefix="k"):
    return [f"{prefix}{i:04d}" for i in range(n)]


def client(peer, transport, timeout_s=10.0):  # generous: the machine is shared; failure tests pass 2.0
    host, port = peer.address.split(":")
    return PeerClient(host, int(port), transport, PAGE, timeout_s=timeout_s)


def test_pages_round_trip_bit_exact(peer_factory, transport):
    peer = peer_factory("--capacity-gb", "0.01")
    c = client(peer, transport)
    src, dst = Pages(transport, 64, seed=1), Pages(transport, 64)
    assert c.put("ns", keys(64), src.pages()) == [True] * 64
    assert c.put("ns", keys(64), src.pages()) == [True] * 64  # already there: "exists", not rewritten
    assert c.get("ns", keys(64), dst.pages()) == [True] * 64
    assert all(dst.bytes_of(i) == src.bytes_of(i) for i in range(64))
    stats = c.stats()
    assert (stats.used_pages, stats.stored, stats.page_bytes) == (64, 64, PAGE)


def test_namespaces_are_isolated(peer_factory, transport):
    peer = peer_factory("--capacity-gb", "0.01")
    c = client(peer, transport)
    src, dst = Pages(transport, 8, seed=2), Pages(transport, 8)
    assert all(c.put("tenant=A|model=m", keys(8), src.pages()))
    assert c.exists("tenant=B|model=m", keys(8)) == [False] * 8
    assert c.get("tenant=B|model=m", keys(8), dst.pages()) == [False] * 8
    assert not dst.buf.any()  # nothing was even transferred
    assert c.exists("tenant=A|model=m", keys(8)) == [True] * 8


def test_corrupted_page_is_detected_counted_and_dropped(peer_factory, transport):
    peer = peer_factory("--capacity-gb", "0.01", "--enable-test-hooks")
    c = client(peer, transport)
    src, dst = Pages(transport, 6, seed=3), Pages(transport, 6)
    assert all(c.put("ns", keys(6), src.pages()))
    c.corrupt("ns", "k0002")
    assert c.get("ns", keys(6), dst.pages()) == [True, True, False, True, True, True]
    assert c.corrupt_pages == 1
    assert c.stats().corrupt_dropped == 1
    assert c.exists("ns", keys(6)) == [True, True, False, True, True, True]  # dropped, never served again


def test_corrupt_hook_is_off_by_default_and_page_size_is_fixed(peer_factory, transport):
    peer = peer_factory("--capacity-gb", "0.01")
    c = client(peer, transport)
    src = Pages(transport, 1, seed=4)
    assert all(c.put("ns", keys(1), src.pages()))
    with pytest.raises(TransferError, match="test hooks are disabled"):
        c.corrupt("ns", "k0000")
    host, port = peer.address.split(":")
    other = PeerClient(host, int(port), transport, 2 * PAGE)  # the pool was formatted for PAGE by `c`
    with pytest.raises(TransferError, match="4096-byte pages"):
        other.exists("ns", keys(1))
    assert c.exists("ns", keys(1)) == [True]


def test_full_pool_evicts_least_recent_by_policy(peer_factory, transport):
    # 9 slots of 4 KiB
    peer = peer_factory("--capacity-gb", str(9 * PAGE / 1e9), "--page-bytes", str(PAGE), "--policy", "lru")
    c = client(peer, transport)
    src = Pages(transport, 13, seed=5)
    ks = keys(13)
    assert all(c.put("ns", ks[:9], src.pages(range(9))))
    dst = Pages(transport, 13)
    assert all(c.get("ns", ks[:3], dst.pages(range(3))))  # a read: 0..2 become the most recent
    assert all(c.exists("ns", ks[3:7]))  # a probe counts nothing: 3..6 stay the least recent
    assert c.put("ns", ks[9:], src.pages(range(9, 13))) == [True] * 4  # no error: evicts 3..6
    assert c.exists("ns", ks) == [True] * 3 + [False] * 4 + [True] * 6
    stats = c.stats()
    assert (stats.evictions, stats.used_pages, stats.free_pages) == (4, 9, 0)
    assert (stats.hits, stats.misses) == (3, 4)  # each asked key counted once: 3 reads, 4 probes that missed
    got = c.get("ns", ks, dst.pages())
    assert all(dst.bytes_of(i) == src.bytes_of(i) for i in range(13) if got[i])


def test_killed_frozen_and_restarted_peer(peer_factory, transport):
    peer = peer_factory("--capacity-gb", "0.01")
    c = client(peer, transport, timeout_s=2.0)
    src, dst = Pages(transport, 4, seed=6), Pages(transport, 4)
    assert all(c.put("ns", keys(4), src.pages()))

    peer.signal(signal.SIGSTOP)  # frozen: the control request times out, bounded by the client deadline
    start = time.monotonic()
    with pytest.raises(TransferError):
        c.get("ns", keys(4), dst.pages())
    assert time.monotonic() - start < 2.0 + 3.0
    peer.signal(signal.SIGCONT)
    assert c.get("ns", keys(4), dst.pages()) == [True] * 4  # reconnects by itself

    peer.kill()
    start = time.monotonic()
    with pytest.raises(TransferError):
        c.get("ns", keys(4), dst.pages())
    assert time.monotonic() - start < 2.0 + 3.0

    peer.start()  # same port, new process, new NIXL agent, empty pool
    assert c.exists("ns", keys(4)) == [False] * 4
    assert all(c.put("ns", keys(4), src.pages()))
    dst.buf[:] = 0
    assert c.get("ns", keys(4), dst.pages()) == [True] * 4
    assert all(dst.bytes_of(i) == src.bytes_of(i) for i in range(4))


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--port", "0", "--capacity-gb", "-1"], "--capacity-gb"),
        (["--port", "0", "--capacity-gb", "100000"], "--capacity-gb"),
        (["--port", "70000", "--capacity-gb", "0.01"], "--port"),
        (["--port", "0", "--capacity-gb", "0.01", "--policy", "nosuch"], "--policy"),
        (["--port", "0"], "--capacity-gb"),
        (["--port", "0", "--capacity-gb", "lots"], "--capacity-gb"),
        (["--port", "0", "--capacity-gb", "0.01", "--host", "256.0.0.1"], "--host"),
        (["--port", "0", "--capacity-gb", "0.01", "--page-bytes", "1"], "--page-bytes"),
        (["--port", "0", "--capacity-gb", "0.5", "--page-bytes", "64"], "--page-bytes"),  # 8M slots
        (["--port", "0", "--capacity-gb", "0.01", "--max-connections", "0"], "--max-connections"),
        (["--port", "0", "--capacity-gb", "0.01", "--idle-timeout-s", "0"], "--idle-timeout-s"),
    ],
)
def test_bad_flags_exit_with_a_message_naming_the_flag(flags, named):
    r = subprocess.run([sys.executable, "-m", "sglang_ext.peer_server", *flags], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert named in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_full_pool_under_tinylfu_admits_or_refuses_without_error(peer_factory, transport):
    """TinyLFU may refuse a cold page rather than evict a hot one (its admission is randomized, so which
    ones varies): a refused page is simply not stored, and every outcome is accounted for."""
    peer = peer_factory("--capacity-gb", str(9 * PAGE / 1e9), "--page-bytes", str(PAGE), "--policy", "tinylfu")
    c = client(peer, transport)
    src = Pages(transport, 30, seed=7)
    ks = keys(30)
    assert all(c.put("ns", ks[:9], src.pages(range(9))))
    hot = Pages(transport, 9)
    for _ in range(3):
        assert all(c.get("ns", ks[:9], hot.pages()))  # make the residents hot
    stored = c.put("ns", ks[9:], src.pages(range(9, 30)))
    stats = c.stats()
    assert stats.used_pages == 9 and stats.free_pages == 0
    assert stats.rejected_full == stored.count(False)  # refused newcomers are counted, not errors
    assert stats.evictions == stored.count(True)
    assert c.exists("ns", ks[:9]).count(True) == 9 - stats.evictions


def server_counters(peer) -> dict:
    """The peer's connection counters, over a fresh control connection (so that connection is never idle)."""
    import socket as _socket

    from transfer.base import deadline_in
    from transfer.control import recv_message, send_message

    host, port = peer.address.split(":")
    with _socket.create_connection((host, int(port)), timeout=10) as sock:
        send_message(sock, {"op": "stats"}, deadline_in(10))
        return recv_message(sock, deadline_in(10))[0]["server"]


def test_a_connection_the_peer_closed_while_idle_is_reopened_without_a_miss(peer_factory, transport):
    """The peer closes idle connections (--idle-timeout-s); the client's next call must reconnect, not fail once
    and put the peer in back-off (a miss for HiCache)."""
    peer = peer_factory("--capacity-gb", "0.01", "--idle-timeout-s", "1")
    c = client(peer, transport)
    src, dst = Pages(transport, 4, seed=9), Pages(transport, 4)
    assert c.put("ns", keys(4), src.pages()) == [True] * 4
    deadline = time.monotonic() + 60
    while server_counters(peer)["idle_closed"] < 1:
        assert time.monotonic() < deadline, "the peer never closed the idle connection"
        time.sleep(0.2)  # polling a condition, not ordering events
    assert c.get("ns", keys(4), dst.pages()) == [True] * 4
    assert all(dst.bytes_of(i) == src.bytes_of(i) for i in range(4))


def test_the_pool_is_committed_before_ready_unless_no_prefault(peer_factory):
    """A prefaulted pool is resident when the peer says ready, so its RSS does not climb as pages arrive (the
    soak's flat-memory claim) and no WRITE lands on first-touch page faults; --no-prefault keeps calloc's lazy
    pages."""
    import psutil

    pool = 200_000_000
    eager = psutil.Process(peer_factory("--capacity-gb", "0.2").proc.pid).memory_info().rss
    lazy = psutil.Process(peer_factory("--capacity-gb", "0.2", "--no-prefault").proc.pid).memory_info().rss
    assert eager >= pool and lazy < pool / 2, (eager, lazy)
