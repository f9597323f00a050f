"""Peer block servers as real processes on 127.0.0.1, killed in teardown whatever the test did, and a NIXL
endpoint per test to reach them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 60.0


@dataclass
class PeerProc:
    args: List[str]
    log: Path
    port: int = 0
    proc: Optional[subprocess.Popen] = None
    history: List[subprocess.Popen] = field(default_factory=list)

    def start(self) -> "PeerProc":
        """Start (or restart on the same port) and wait for the ready line, with a deadline."""
        port = str(self.port)
        cmd = [sys.executable, "-m", "sglang_ext.peer_server", "--host", "127.0.0.1", "--port", port, *self.args]
        env = dict(os.environ, UCX_NET_DEVICES="lo", NIXL_LOG_LEVEL="WARN", PYTHONUNBUFFERED="1")
        out = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.history.append(self.proc)
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            text = self.log.read_text()
            for line in text.splitlines():
                if line.startswith("PEER_SERVER_READY"):
                    self.port = int(line.split("port=")[1].split()[0])
                    return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"peer server did not start (rc={self.proc.poll()}):\n{text[-3000:]}")
            time.sleep(0.05)  # polling a log file for readiness, bounded by the deadline above

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def signal(self, sig: int) -> None:
        """Send `sig`; for SIGSTOP/SIGCONT, return only once the process really is stopped/running."""
        import psutil

        os.kill(self.proc.pid, sig)
        if sig not in (signal.SIGSTOP, signal.SIGCONT):
            return
        want_stopped = sig == signal.SIGSTOP
        deadline = time.monotonic() + 10
        while (psutil.Process(self.proc.pid).status() == psutil.STATUS_STOPPED) != want_stopped:
            assert time.monotonic() < deadline, f"process did not react to signal {sig}"
            time.sleep(0.001)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def cleanup(self) -> None:
        for p in self.history:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass
                p.wait(10)


@pytest.fixture
def transport():
    """A NIXL endpoint per test: its registrations end with the test. (A module-long one gathered the
    registrations of buffers earlier tests had freed; a new buffer around such a stale region made NIXL
    refuse transfers from it, and `register` now refuses overlaps instead.)"""
    from transfer.nixl_transport import NixlTransport

    t = NixlTransport("test-client")
    yield t
    t.close()


@pytest.fixture
def peer_factory(tmp_path):
    procs: List[PeerProc] = []

    def make(*args: str) -> PeerProc:
        p = PeerProc(list(args), tmp_path / f"peer{len(procs)}.log")
        procs.append(p)
        return p.start()

    yield make
    for p in procs:
        p.cleanup()
