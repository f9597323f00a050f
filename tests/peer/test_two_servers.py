"""Two SGLang servers sharing one peer block server (the peer tier as HiCache L3, over NIXL on 127.0.0.1).

A prefix computed on server A is found by server B through the peer; a dead peer costs a recompute (same
answer, within the request deadline) and the tier hits again once the peer is back on its port.
"""

import random
import time

import pytest

from benchmarks.servers import peer_stats, wait_for_peer_pages
from tests.support import start_server

pytestmark = pytest.mark.server
WORDS = "cache token prefix session tenant model server request reply host device peer memory block page tree".split()
BACKUP_DEADLINE_S = 60.0
SHARED_LEAD = 8  # random prompts over 17 words share at most a couple of leading tokens


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def wait_for_pages(peer, at_least: int, deadline_s: float = BACKUP_DEADLINE_S) -> None:
    """A's write-back to the peer is asynchronous: poll the peer's own page count, bounded by a deadline."""
    wait_for_peer_pages(peer.port, at_least, deadline_s)


@pytest.fixture(scope="module")
def peer_and_servers(tmp_path_factory):
    from tests.peer.conftest import PeerProc

    logs = tmp_path_factory.mktemp("two-servers")
    peer = PeerProc(["--capacity-gb", "0.25"], logs / "peer.log").start()
    servers = []
    try:
        for name in ("a", "b"):
            # wait_complete: a prefetch from the peer is used whole, not cut at a load-dependent timeout
            servers.append(start_server(["--tier-peers", peer.address, "--max-total-tokens", "2000",
                                         "--hicache-storage-prefetch-policy", "wait_complete",
                                         "--enable-cache-report"], logs, f"server-{name}",
                                        env={"UCX_NET_DEVICES": "lo"}))
        yield peer, servers[0], servers[1]
    finally:
        for s in servers:
            s.stop()
        peer.cleanup()


def details(answer) -> dict:
    return answer["meta_info"]["cached_tokens_details"] or {}


def test_prefix_computed_on_a_is_found_by_b_through_the_peer(peer_and_servers):
    peer, a, b = peer_and_servers
    prompt = words(1, 600)
    on_a = a.generate(prompt, return_cached_tokens_details=True)
    wait_for_pages(peer, on_a["meta_info"]["prompt_tokens"] - 1)
    on_b = b.generate(prompt, return_cached_tokens_details=True)
    assert details(on_b).get("storage", 0) >= on_a["meta_info"]["prompt_tokens"] - 2, details(on_b)
    assert on_b["output_ids"] == on_a["output_ids"]


def test_dead_peer_is_a_recompute_and_a_restarted_peer_hits_again(peer_and_servers):
    peer, a, b = peer_and_servers
    prompt = words(2, 500)
    reference = a.generate(prompt, return_cached_tokens_details=True)
    peer.kill()
    start = time.monotonic()
    miss = b.generate(prompt, return_cached_tokens_details=True)
    assert time.monotonic() - start < 60
    assert details(miss).get("storage", 0) == 0
    assert miss["output_ids"] == reference["output_ids"]

    peer.start()  # same port, empty pool
    # Both servers skip a failed peer for a back-off (2 s of wall clock) and reconnect after it, so prompts sent
    # inside it are misses: send fresh prompts until one is written by A and found by B, bounded by a deadline.
    # Each wait counts from the peer's pages before that prompt, so it waits for this prompt's write-back (less a
    # few leading tokens it may share with an earlier prompt, whose pages the peer already holds).
    deadline = time.monotonic() + BACKUP_DEADLINE_S
    for attempt in range(100):
        assert time.monotonic() < deadline, "the restarted peer never served server B"
        fresh = words(3 + attempt, 500)
        before = peer_stats(peer.port)["used_pages"]
        on_a = a.generate(fresh, return_cached_tokens_details=True)
        try:
            wait_for_pages(peer, before + on_a["meta_info"]["prompt_tokens"] - 1 - SHARED_LEAD, deadline_s=15)
        except AssertionError:
            continue
        on_b = b.generate(fresh, return_cached_tokens_details=True)
        assert on_b["output_ids"] == on_a["output_ids"]
        if details(on_b).get("storage", 0) > 0:
            break
    else:
        pytest.fail("the restarted peer never served server B")
