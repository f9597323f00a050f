"""Servers shared by the reliability tests: one peer block server and server A (HiCache + peer tier, a 600-token
device pool so the host and peer tiers see traffic). The model-revision test starts its own servers, on a copy
of the model whose weights it rewrites, against the same peer."""

import pytest

from tests.peer.conftest import peer_factory  # noqa: F401  (a fixture, for the peer protocol test)
from tests.support import start_server


ADMIN_KEY = "reliability-operator-key"


def server_args(peer_address: str) -> list:
    return ["--tier-peers", peer_address, "--max-total-tokens", "600", "--enable-cache-report",
            "--tier-stats-tenants", "--enable-metrics"]


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
    # the operator's key guards /tiers/stats (per-tenant occupancy is on); server_a.get sends it
    server = start_server(server_args(shared_peer.address), reliability_logs, "server-a",
                          env={"UCX_NET_DEVICES": "lo"}, admin_key=ADMIN_KEY)
    yield server
    server.stop()
