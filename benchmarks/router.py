"""`sglang-router` (PyPI; cache-aware routing) in front of SGLang replicas on 127.0.0.1: start it, wait until it
routes to the replicas it should (with a deadline), read its view of them.

The router is returned as a `benchmarks.servers.Server`, so it is talked to like a replica (`generate`,
`post_status`, `get`); stop it with `stop_router`. Its Prometheus exporter gets its own free port: the default
(29000) would collide with any other router on the machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, Sequence

from benchmarks.servers import ROOT, Server, free_port

# Importing the router's Python launcher alone takes tens of seconds on a loaded machine.
ROUTER_START_DEADLINE_S = 180.0


def readiness(router: Server, timeout: float = 5.0) -> dict:
    """The router's `/readiness` body ({"status", "healthy_workers", ...}); {} while it does not answer."""
    try:
        with urllib.request.urlopen(router.url + "/readiness", timeout=timeout) as r:
            return json.load(r)
    except (OSError, ValueError):  # refused, 503 (HTTPError is an OSError) or a body that is not JSON yet
        return {}


def wait_healthy_workers(router: Server, count: int, deadline_s: float) -> dict:
    """Poll `/readiness` until the router counts exactly `count` healthy workers; RuntimeError at the deadline."""
    deadline = time.monotonic() + deadline_s
    while True:
        state = readiness(router)
        if state.get("healthy_workers") == count:
            return state
        if router.proc.poll() is not None:
            raise RuntimeError(f"router exited with {router.proc.returncode}:\n{router.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"router has {state} not {count} healthy workers after {deadline_s:.0f}s:\n"
                               f"{router.log_tail()}")
        time.sleep(0.2)  # polling another process's state, bounded by the deadline above


def worker_loads(router: Server) -> Dict[str, int]:
    """Requests in flight per worker URL, as the router counts them (its `/workers` list)."""
    return {w["url"]: int(w["load"]) for w in router.get("/workers", timeout=5)["workers"]}


def start_router(worker_urls: Sequence[str], log_dir: Path, args: Sequence[str] = (), name: str = "router") -> Server:
    """`python -m sglang_router.launch_router` over `worker_urls`; returns once every worker is healthy in it."""
    port, metrics_port = free_port(), free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *worker_urls,
           "--host", "127.0.0.1", "--port", str(port),
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    router = Server(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        wait_healthy_workers(router, len(worker_urls), ROUTER_START_DEADLINE_S)
    except BaseException:
        stop_router(router)
        raise
    return router


def stop_router(router: Server) -> None:
    """SIGKILL the router's process group: it keeps no state worth draining, and on SIGTERM it did not exit within
    30 s (in-flight requests done, `--shutdown-grace-period-secs 5`)."""
    try:
        os.killpg(router.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    router.proc.wait(timeout=10)
