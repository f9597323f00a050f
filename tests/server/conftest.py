"""Session-wide real servers (embedded model, CPU, 127.0.0.1), started lazily and shared by test modules.
`server_logs` and the default `tiered_server` are in tests/conftest.py: the reliability tests share them."""

import pytest

from tests.support import start_server

pytestmark = pytest.mark.server


@pytest.fixture(scope="session")
def nocache_server(server_logs):
    """The reference for bit-exact comparisons: the same model with the prefix cache disabled."""
    server = start_server(["--disable-radix-cache"], server_logs, "nocache")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def hicache_server(server_logs):
    """A small device pool (600 tokens) over a host tier twice its size, so eviction is easy to force."""
    server = start_server(["--enable-hierarchical-cache", "--max-total-tokens", "600", "--enable-cache-report",
                           "--enable-metrics"],
                          server_logs, "hicache")
    yield server
    server.stop()
