"""Shared pytest set-up: GPU tests are skipped on CPU machines; servers come from tests/support.py."""

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis' per-example deadline (200 ms) is a timing threshold: on 2 shared cores a trivial example once took
# 380 ms. Correctness is what the property tests assert, so no deadline anywhere.
settings.register_profile("project", deadline=None)
settings.load_profile("project")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("UCX_NET_DEVICES", "lo")  # NIXL/UCX on loopback only, before any agent exists


@pytest.fixture(scope="session")
def server_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="session")
def tiered_server(server_logs):
    """The default: `python -m sglang_ext.launch_server` with nothing but cache reporting on (device tier only).
    Shared by tests/server and tests/reliability; started at its first use."""
    from tests.support import start_server

    server = start_server(["--enable-cache-report"], server_logs, "tiered")
    yield server
    server.stop()


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
