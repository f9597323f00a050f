"""Servers shared by the reliability tests: one peer block server and server A (HiCache + peer tier, a 600-token
device pool so the host and peer tiers see traffic). Server B (a copy of the model under another path, same
peer) is started only by the test that needs it."""

import socket
import time

import pytest

from tests.peer.conftest import peer_factory  # noqa: F401  (a fixture, for the peer protocol test)
from tests.support import start_server
from transfer.control import recv_message, send_message

PEER_PAGES_DEADLINE_S = 60.0


def peer_stats(port: int) -> dict:
    deadline = time.monotonic() + 5
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        send_message(sock, {"op": "stats"}, deadline)
        return recv_message(sock, deadline)[0]["stats"]


def wait_for_peer_pages(port: int, at_least: int, deadline_s: float = PEER_PAGES_DEADLINE_S) -> None:
    """Write-back to the peer is asynchronous: poll the peer's own page count, bounded by a deadline."""
    deadline = time.monotonic() + deadline_s
    while peer_stats(port)["used_pages"] < at_least:
        assert time.monotonic() < deadline, f"peer holds {peer_stats(port)['used_pages']} < {at_least} pages"
        time.sleep(0.2)


def server_args(peer_address: str) -> list:
    return ["--tier-peers", peer_address, "--max-total-tokens", "600", "--enable-cache-report"]


@pytest.fixture(scope="session")
def reliability_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("reliability")


@pytest.fixture(scope="session")
def shared_peer(reliability_logs):
    from tests.peer.conftest import PeerProc

    peer = PeerProc(["--capacity-gb", "0.25"], reliability_logs / "peer.log").start()
    yield peer
    peer.cleanup()


@pytest.fixture(scope="session")
def server_a(shared_peer, reliability_logs):
    server = start_server(server_args(shared_peer.address), reliability_logs, "server-a",
                          env={"UCX_NET_DEVICES": "lo"})
    yield server
    server.stop()
