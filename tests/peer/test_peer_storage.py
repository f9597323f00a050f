"""PeerStorage (the HiCache L3 backend) against real peer server processes, with a real SGLang
MHATokenToKVPoolHost built on CPU, and no SGLang server.

Guards: the dynamic-backend config path constructs it; v1 (zero-copy) and generic calls round-trip
pages bit-exact across two peers placed by rendezvous hashing; hot pages get a replica that survives
losing their peer; dead, frozen (even mid-transfer) and corrupt peers yield misses, never exceptions or
hangs, and hits come back after a restart; tenants never see each other's pages; four threads at once;
each call has one deadline for all its peer calls; pages (or a staging buffer) a late READ may still write
are kept from reuse until it settles.
"""

from __future__ import annotations

import signal
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
from tiers.peer.client import PeerClient
from sglang_ext.peer_storage import PeerStorage, parse_peers, rendezvous_order
from tiers.clock import ManualClock
from transfer.base import Transport

PAGE_TOKENS = 4
TIMEOUT_S = 2.0  # for the failure tests; healthy paths get a generous one (the machine is shared)


def host_pool(layout="layer_first"):
    device_pool = SimpleNamespace(
        layer_num=2, head_num=2, head_dim=64, store_dtype=torch.bfloat16, dtype=torch.bfloat16, size=256,
        start_layer=0, end_layer=2, device="cpu", layer_shard_enabled=False,
    )
    pool = MHATokenToKVPoolHost(device_pool, 2.0, 0, PAGE_TOKENS, layout, pin_memory=False, device="cpu")
    pool.kv_buffer.view(torch.int16).copy_(torch.randint(-32768, 32767, pool.kv_buffer.shape, dtype=torch.int16))
    return pool


def config(peers, **extra):
    return HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=False, model_name="org/model",
        extra_config={"backend_name": "peer", "module_path": "sglang_ext.peer_storage",
                      "class_name": "PeerStorage", "interface_v1": 1,
                      "peers": ",".join(p.address for p in peers), "peer_timeout_s": 10.0, **extra},
    )


def storage(peers, pool, clock=None, transport=None, **extra):
    s = PeerStorage(config(peers, **extra), {}, clock=clock, transport=transport)
    s.register_mem_pool_host(pool)
    return s


def indices(first_page, n):
    return torch.arange(first_page * PAGE_TOKENS, (first_page + n) * PAGE_TOKENS, dtype=torch.int64)


def page_bytes(pool, first_page, n):
    # compared as raw bits: random bf16 patterns include NaNs, which never compare equal
    return [pool.get_data_page(int(i)).clone().view(torch.int16) for i in indices(first_page, n)[::PAGE_TOKENS]]


def wipe(pool, first_page, n):
    for i in indices(first_page, n)[::PAGE_TOKENS]:
        pool.set_from_flat_data_page(int(i), torch.zeros_like(pool.get_data_page(int(i))))


def hexkeys(n, tag="p"):
    return [f"{tag}{i:060x}" for i in range(n)]


@pytest.fixture
def two_peers(peer_factory):
    return [peer_factory("--capacity-gb", "0.02", "--enable-test-hooks") for _ in range(2)]


def test_config_parsing_rejects_bad_peer_lists():
    assert parse_peers("127.0.0.1:5,h:6") == [("127.0.0.1", 5), ("h", 6)]
    for bad in ["", "127.0.0.1", "h:0", "h:x", "h:5,h:5"]:
        with pytest.raises(ValueError, match="peer"):
            parse_peers(bad)


def test_dynamic_backend_round_trip_across_two_peers(two_peers):
    pool = host_pool()
    s = StorageBackendFactory.create_backend("dynamic", config(two_peers), pool)
    s.register_mem_pool_host(pool)  # what the cache controller does next
    assert isinstance(s, PeerStorage)
    ks, n = hexkeys(40), 40
    want = page_bytes(pool, 0, n)
    assert s.batch_set_v1(ks, indices(0, n)) == [True] * n
    wipe(pool, 0, n)
    assert s.batch_exists(ks) == n
    assert s.batch_get_v1(ks, indices(0, n)) == [True] * n
    assert all(torch.equal(a, b) for a, b in zip(page_bytes(pool, 0, n), want))
    # placement follows rendezvous hashing: each page sits on its top-scoring peer
    ids = [p.address for p in two_peers]
    expected = [sum(rendezvous_order(k, ids)[0] == i for k in ks) for i in range(2)]
    used = [PeerClient(*p.address.split(":"), s._transport, s.page_bytes).stats().used_pages for p in two_peers]
    assert used == expected and min(used) > 0
    assert s.batch_exists(ks + hexkeys(3, "q")) == n  # leading hits only
    s.close()


def test_generic_tensor_calls_round_trip(two_peers):
    pool = host_pool("page_first")
    s = storage(two_peers, pool)
    ks = hexkeys(5)
    values = [pool.get_data_page(int(i)).clone() for i in indices(0, 5)[::PAGE_TOKENS]]  # bf16, like SGLang's
    assert s.batch_set(ks, values)
    targets = [pool.get_dummy_flat_data_page() for _ in ks]
    got = s.batch_get(ks, targets)
    assert all(g is t for g, t in zip(got, targets))
    assert all(torch.equal(t.view(torch.int16), v.view(torch.int16)) for t, v in zip(targets, values))
    assert s.exists(ks[0]) and not s.exists("f" * 64)
    assert s.get("f" * 64, pool.get_dummy_flat_data_page()) is None
    s.close()


def test_hot_pages_are_replicated_and_survive_their_peer(two_peers):
    pool = host_pool()
    s = storage(two_peers, pool, clock=ManualClock(), replicate_after_hits=2)
    ks, n = hexkeys(16), 16
    want = page_bytes(pool, 0, n)
    assert all(s.batch_set_v1(ks, indices(0, n)))
    assert all(s.batch_get_v1(ks, indices(0, n)))
    assert s.stats().replicated == 0
    assert all(s.batch_get_v1(ks, indices(0, n)))  # second read: each page copied to its other peer
    assert s.stats().replicated == n
    two_peers[0].kill()
    wipe(pool, 0, n)
    assert s.batch_get_v1(ks, indices(0, n)) == [True] * n  # served by replicas on the survivor
    assert all(torch.equal(a, b) for a, b in zip(page_bytes(pool, 0, n), want))
    s.close()


class KillBeforeRead(Transport):
    """Delegates to a real transport, but SIGKILLs or freezes the peer just before the next READ."""

    def __init__(self, inner, action):
        self.inner, self.action = inner, action

    def read(self, peer, local, remote, deadline):
        action, self.action = self.action, None
        if action:
            action()
        return self.inner.read(peer, local, remote, deadline)

    name = property(lambda self: self.inner.name)
    register = lambda self, *a: self.inner.register(*a)  # noqa: E731
    deregister = lambda self, *a: self.inner.deregister(*a)  # noqa: E731
    metadata = lambda self: self.inner.metadata()  # noqa: E731
    connect = lambda self, *a: self.inner.connect(*a)  # noqa: E731
    disconnect = lambda self, *a: self.inner.disconnect(*a)  # noqa: E731
    write = lambda self, *a, **k: self.inner.write(*a, **k)  # noqa: E731
    send_notification = lambda self, *a: self.inner.send_notification(*a)  # noqa: E731
    progress = lambda self: self.inner.progress()  # noqa: E731
    notifications = lambda self: self.inner.notifications()  # noqa: E731
    close = lambda self: self.inner.close()  # noqa: E731


def _bounded(fn):
    start = time.monotonic()
    out = fn()
    assert time.monotonic() - start < TIMEOUT_S + 3.0, "a peer failure must cost at most the timeout"
    return out


@pytest.mark.parametrize("when", ["before", "during"])
def test_killed_peer_is_a_miss_then_hits_after_restart(peer_factory, when):
    from transfer.nixl_transport import NixlTransport

    peer = peer_factory("--capacity-gb", "0.01")
    pool, clock = host_pool(), ManualClock()
    transport = KillBeforeRead(NixlTransport("hicache-test"), None)
    s = storage([peer], pool, clock=clock, transport=transport, peer_backoff_s=5.0, peer_timeout_s=TIMEOUT_S)
    ks, n = hexkeys(8), 8
    want = page_bytes(pool, 0, n)
    assert all(s.batch_set_v1(ks, indices(0, n)))
    if when == "before":
        peer.kill()
    else:
        transport.action = peer.kill  # after the lookup answered, before the READ
    assert _bounded(lambda: s.batch_get_v1(ks, indices(0, n))) == [False] * n
    assert _bounded(lambda: s.batch_exists(ks)) == 0
    assert s.stats().peer_errors == 1  # then skipped while backing off: no second timeout
    peer.start()
    assert s.batch_exists(ks) == 0  # still backing off
    clock.advance(5.0)
    assert s.batch_exists(ks) == 0  # back, but a restarted peer starts empty
    assert all(s.batch_set_v1(ks, indices(0, n)))
    wipe(pool, 0, n)
    assert s.batch_get_v1(ks, indices(0, n)) == [True] * n
    assert all(torch.equal(a, b) for a, b in zip(page_bytes(pool, 0, n), want))
    s.close()


def test_frozen_peer_is_a_miss_within_the_deadline(peer_factory):
    peer = peer_factory("--capacity-gb", "0.01")
    pool, clock = host_pool(), ManualClock()
    s = storage([peer], pool, clock=clock, peer_backoff_s=1.0, peer_timeout_s=TIMEOUT_S)
    ks, n = hexkeys(8), 8
    assert all(s.batch_set_v1(ks, indices(0, n)))
    peer.signal(signal.SIGSTOP)
    assert _bounded(lambda: s.batch_get_v1(ks, indices(0, n))) == [False] * n
    assert _bounded(lambda: s.batch_set_v1(hexkeys(2, "z"), indices(8, 2))) == [False] * 2
    peer.signal(signal.SIGCONT)
    clock.advance(1.0)
    assert s.batch_get_v1(ks, indices(0, n)) == [True] * n  # the pool survived the freeze
    s.close()


def test_corrupt_page_is_a_miss(two_peers):
    pool = host_pool()
    s = storage(two_peers, pool)
    ks, n = hexkeys(6), 6
    assert all(s.batch_set_v1(ks, indices(0, n)))
    owner = two_peers[rendezvous_order(ks[1], [p.address for p in two_peers])[0]]
    PeerClient(*owner.address.split(":"), s._transport, s.page_bytes).corrupt(s.namespace, ks[1])
    assert s.batch_get_v1(ks, indices(0, n)) == [True, False, True, True, True, True]
    assert s.stats().corrupt == 1
    assert s.batch_exists(ks) == 1  # dropped by the peer
    s.close()


def test_tenants_never_read_each_others_pages(two_peers):
    pool_a, pool_b = host_pool(), host_pool()
    a = storage(two_peers, pool_a, tenant="A")
    b = storage(two_peers, pool_b, tenant="B")
    ks, n = hexkeys(10), 10  # identical tokens -> identical page hashes in both tenants
    assert all(a.batch_set_v1(ks, indices(0, n)))
    before = page_bytes(pool_b, 0, n)
    assert b.batch_exists(ks) == 0
    assert b.batch_get_v1(ks, indices(0, n)) == [False] * n
    assert all(torch.equal(x, y) for x, y in zip(page_bytes(pool_b, 0, n), before))
    assert a.batch_exists(ks) == n
    a.close()
    b.close()


def test_four_threads_at_once(two_peers):
    pool = host_pool()
    s = storage(two_peers, pool)
    want = page_bytes(pool, 0, 48)
    errors = []

    def worker(t):
        try:
            ks, first = hexkeys(12, f"t{t}"), 12 * t
            for _ in range(3):
                assert all(s.batch_set_v1(ks, indices(first, 12)))
                assert s.batch_exists(ks) == 12
                assert all(s.batch_get_v1(ks, indices(first, 12)))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert all(torch.equal(a, b) for a, b in zip(page_bytes(pool, 0, 48), want))
    s.close()


def test_a_new_model_revision_never_reads_old_pages(two_peers):
    """Same model name, new weights (another `model_revision`): the old revision's pages are never served."""
    pool_old, pool_new = host_pool(), host_pool()
    old = storage(two_peers, pool_old, model_revision="rev-1")
    new = storage(two_peers, pool_new, model_revision="rev-2")
    ks, n = hexkeys(6, "r"), 6
    assert all(old.batch_set_v1(ks, indices(0, n)))
    before = page_bytes(pool_new, 0, n)
    assert new.batch_exists(ks) == 0
    assert new.batch_get_v1(ks, indices(0, n)) == [False] * n
    assert all(torch.equal(x, y) for x, y in zip(page_bytes(pool_new, 0, n), before))
    assert old.batch_exists(ks) == n
    old.close()
    new.close()


def test_a_read_frozen_mid_transfer_keeps_its_pages_from_reuse(peer_factory, monkeypatch):
    """Issue 12 item 3. The peer is SIGSTOPped after answering the lookup, before the READ. Over tcp the READ
    then stalls past the deadline and cannot be cancelled: once the peer resumes, its bytes land anyway. The
    get must be a bounded miss, and the destination pages must not go back to HiCache's allocator when the
    cache controller frees them, until that READ has settled."""
    from transfer.nixl_transport import NixlTransport

    monkeypatch.setenv("UCX_TLS", "tcp")  # over cma a READ copies even from a stopped process
    peer = peer_factory("--capacity-gb", "0.01")
    pool, clock = host_pool(), ManualClock()
    transport = KillBeforeRead(NixlTransport("hicache-test"), None)
    s = storage([peer], pool, clock=clock, transport=transport, peer_timeout_s=TIMEOUT_S, peer_backoff_s=1.0)
    ks, n = hexkeys(8), 8
    dest = pool.alloc(n * PAGE_TOKENS)  # what the cache controller does before a prefetch
    want = [pool.get_data_page(int(i)).clone().view(torch.int16) for i in dest[::PAGE_TOKENS]]
    assert all(s.batch_set_v1(ks, dest))
    for i in dest[::PAGE_TOKENS]:
        pool.set_from_flat_data_page(int(i), torch.zeros_like(pool.get_data_page(int(i))))
    transport.action = lambda: peer.signal(signal.SIGSTOP)
    assert _bounded(lambda: s.batch_get_v1(ks, dest)) == [False] * n
    assert s.stats().reserved_pages == n
    available = pool.available_size()
    pool.free(dest)  # the failed prefetch hands its pages back
    assert pool.available_size() == available and bool(pool.slot_used[dest].all())  # held back, not reusable
    peer.signal(signal.SIGCONT)
    deadline = time.monotonic() + 30
    while s.stats().reserved_pages:  # each storage call polls the late READ
        assert time.monotonic() < deadline, "the late READ never settled after the peer resumed"
        s.batch_exists(ks)
    landed = [pool.get_data_page(int(i)).clone().view(torch.int16) for i in dest[::PAGE_TOKENS]]
    assert all(torch.equal(a, b) for a, b in zip(landed, want))  # it did land, after the deadline
    assert pool.available_size() == available + n * PAGE_TOKENS and not bool(pool.slot_used[dest].any())
    clock.advance(1.0)
    dest = pool.alloc(n * PAGE_TOKENS)
    assert s.batch_get_v1(ks, dest) == [True] * n  # the peer serves again
    s.close()


def test_each_call_has_one_deadline_for_all_its_peer_calls(two_peers, monkeypatch):
    """One HiCache call may ask both candidates of a page and then write a replica: all of it shares one
    deadline (peer_timeout_s from the call's start), instead of a fresh timeout per peer call."""
    pool, clock = host_pool(), ManualClock()
    s = storage(two_peers, pool, clock=clock, replicate_after_hits=1, peer_backoff_s=1.0)
    ks, n = hexkeys(16), 16
    two_peers[0].kill()
    s.batch_set_v1(ks, indices(0, n))  # peer 0 fails and is skipped: every page goes to peer 1 ...
    assert all(s.batch_set_v1(ks, indices(0, n)))
    two_peers[0].start()  # ... and peer 0 comes back empty: its pages are found at their second candidate
    clock.advance(1.0)
    seen = []

    def recording(method):
        def call(self, *args, deadline=None, **kw):
            seen.append((method.__name__, deadline))
            return method(self, *args, deadline=deadline, **kw)
        return call

    for name in ("get_verified", "put", "exists"):
        monkeypatch.setattr(PeerClient, name, recording(getattr(PeerClient, name)))
    assert s.batch_get_v1(ks, indices(0, n)) == [True] * n
    names = [name for name, _ in seen]
    assert names.count("get_verified") == 3 and names.count("put") == 1  # peer 0, peer 1, peer 1; replicas
    assert len({d for _, d in seen}) == 1 and seen[0][1] is not None
    s.close()


def test_a_late_read_into_the_staging_buffer_retires_it(peer_factory, monkeypatch):
    """The generic (tensor) calls read through a staging buffer; a READ that may still land there leaves the
    buffer to that READ: the next call gets a fresh one, and the old one goes once the READ settles."""
    from transfer.nixl_transport import NixlTransport

    monkeypatch.setenv("UCX_TLS", "tcp")
    peer = peer_factory("--capacity-gb", "0.01")
    pool = host_pool("page_first")
    transport = KillBeforeRead(NixlTransport("hicache-test"), None)
    s = storage([peer], pool, clock=ManualClock(), transport=transport, peer_timeout_s=TIMEOUT_S)
    ks = hexkeys(4)
    values = [pool.get_data_page(int(i)).clone() for i in indices(0, 4)[::PAGE_TOKENS]]
    assert s.batch_set(ks, values)
    retired = s._staging
    transport.action = lambda: peer.signal(signal.SIGSTOP)
    assert _bounded(lambda: s.batch_get(ks, [pool.get_dummy_flat_data_page() for _ in ks])) == [None] * 4
    assert s.stats().reserved_pages == 4 and s._staging is None
    s.batch_exists(ks)  # a call while the READ is pending: the retired buffer stays with it
    assert s.stats().reserved_pages == 4
    peer.signal(signal.SIGCONT)
    deadline = time.monotonic() + 30
    while s.stats().reserved_pages:
        assert time.monotonic() < deadline, "the late READ never settled after the peer resumed"
        s.batch_exists(ks)
    assert retired[: s.page_bytes].view(torch.int16).equal(values[0].reshape(-1).view(torch.int16))  # landed late
    s.close()
