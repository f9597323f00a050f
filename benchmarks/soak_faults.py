"""The faults `python -m benchmarks soak --faults` injects, and the gate that lets it swap servers under load.

Schedule (fractions of `--duration`, plus the time swaps took; each step waits on the run's stop event):
- 0.15  server restart with the peer kept: new requests are held at the gate, the ones in flight finish, a
        fresh probe prompt is computed and written through to the peer, the server stops and starts again with
        the same flags, and the probe is asked again: its device and host tiers start empty, so its cached
        tokens can only come from the peer tier;
- 0.30  peer SIGKILL, 2 s dead, restarted on the same port (empty: its pages were in its memory);
- 0.45  peer frozen (SIGSTOP) for 3 s, longer than the client's 2 s peer deadline, then thawed;
- 0.60  host memory pressure: a separate process takes and touches a share of the free memory for 3 s while
        the sessions go on (the server's tiers are sized at start, so this must change nothing a client sees);
- 0.75  model revision change: the gate closes, another probe is written through to the peer, the weights
        are rewritten in place (same path, same served name, new bytes); the final turns answered so far are
        checked against the cache-off reference first (it serves the old weights), then both servers restart
        on the new weights and the probe must find nothing in any tier: no old block reaches the new model.

The gate: sessions send every request through `LiveTarget.ask`, which waits (bounded) while the target is
paused and counts requests in flight; `pause` closes the gate and waits until nothing is in flight. One lock
(a Condition) guards the target, the gate flag and the in-flight count.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

GATE_DEADLINE_S = 900.0  # a held request waits at most this long (two server starts fit well inside)
BALLOON_SHARE = 0.25  # of the memory available when the pressure starts
BALLOON_MAX_BYTES = 4 << 30
BALLOON_HOLD_S = 3.0


class LiveTarget:
    """The server the sessions talk to; swappable under load."""

    def __init__(self, server, ask: Callable):
        self._server, self._ask = server, ask
        self._cond = threading.Condition()
        self._open = True
        self._in_flight = 0
        self.revision = 0  # bumped by a weights change; final turns are verified per revision

    @property
    def server(self):
        with self._cond:
            return self._server

    def ask(self, body: dict, route: str = "/generate") -> Tuple[int, object, int]:
        """(status, answer, weights revision that answered) for one request, or (-1, why, -1) if the gate
        stayed closed past its deadline."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._open, GATE_DEADLINE_S):
                return -1, "the server was not back within the gate deadline", -1
            self._in_flight += 1
            server, revision = self._server, self.revision
        try:
            status, answer = self._ask(server, body, route)
            return status, answer, revision
        finally:
            with self._cond:
                self._in_flight -= 1
                self._cond.notify_all()

    def pause(self, deadline_s: float) -> bool:
        """Hold new requests; True once nothing is in flight (False at the deadline)."""
        with self._cond:
            self._open = False
            return self._cond.wait_for(lambda: self._in_flight == 0, deadline_s)

    def resume(self, server=None, revision: Optional[int] = None) -> None:
        with self._cond:
            if server is not None:
                self._server = server
            if revision is not None:
                self.revision = revision
            self._open = True
            self._cond.notify_all()


def rewrite_weights(model_dir: Path, seed: int) -> None:
    """A new weights revision in place: every tensor gets seeded noise, saved to the same file, with a new
    modification time (what `tiers.keys.weights_revision` sees)."""
    import torch
    from safetensors.torch import load_file, save_file

    path = model_dir / "model.safetensors"
    tensors = load_file(str(path))
    gen = torch.Generator().manual_seed(seed)
    for name, t in tensors.items():
        if t.is_floating_point():
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32) * 0.5 * float(t.float().std() or 1.0)
            tensors[name] = (t.float() + noise).to(t.dtype)
    save_file(tensors, str(path), metadata={"format": "pt"})
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def memory_balloon(hold_s: float = BALLOON_HOLD_S) -> int:
    """Take and touch a share of the available memory in a child process for `hold_s`; returns the bytes."""
    import psutil

    size = int(min(BALLOON_MAX_BYTES, psutil.virtual_memory().available * BALLOON_SHARE))
    code = ("import sys, time; b = bytearray(int(sys.argv[1])); "
            "b[::4096] = b'\\x01' * len(range(0, len(b), 4096)); time.sleep(float(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", code, str(size), str(hold_s)], check=True, timeout=hold_s + 120)
    return size


class FaultInjector:
    """Runs the schedule above against a soak run. `restart` starts a replacement server (same flags, the
    current weights); `verify` checks the finals of one revision against the reference; `restart_reference`
    brings the reference up on the new weights; `seed_probe(server, i)` computes probe prompt i on a server
    and waits (bounded) until the peer took its pages; `probe(server, i)` returns its cached tokens by tier."""

    def __init__(self, *, peer, target: LiveTarget, duration_s: float, stop: threading.Event, model_dir: Path,
                 restart: Callable, restart_reference: Callable, verify: Callable, seed_probe: Callable,
                 probe: Callable, seed: int = 0):
        self.peer, self.target, self.duration_s, self.stop = peer, target, duration_s, stop
        self.model_dir, self.seed = model_dir, seed
        self.restart, self.restart_reference, self.verify = restart, restart_reference, verify
        self.seed_probe, self.probe = seed_probe, probe
        self.log: List[str] = []
        self.counts: Dict[str, int] = {}
        self.probes: Dict[str, Dict[str, int]] = {}
        self.errors: List[str] = []
        self.warm_rss = 0  # RSS of the last server started, once warm
        self.swapping = False
        self._paused_s = 0.0
        self._swap_started = 0.0
        self._t0 = time.monotonic()

    def paused_s(self) -> float:
        """Seconds spent swapping servers so far (the load was held meanwhile)."""
        return self._paused_s + (time.monotonic() - self._swap_started if self.swapping else 0.0)

    def _at(self, fraction: float) -> bool:
        return not self.stop.wait(max(0.0, self._t0 + fraction * self.duration_s + self.paused_s() - time.monotonic()))

    def _note(self, kind: str, text: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        self.log.append(f"{time.monotonic() - self._t0:.1f}s {text}")

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # reported as a soak error; the run's finally stops every process
            self.errors.append(f"fault injection failed: {type(e).__name__}: {e}")
            self.target.resume()

    def _swap_server(self, why: str, new_weights: bool, probe: int) -> Dict[str, int]:
        """Hold the sessions, seed probe `probe` on the old server, swap it, and return what the new server
        finds of the probe, by tier."""
        self.swapping, self._swap_started = True, time.monotonic()
        try:
            if not self.target.pause(GATE_DEADLINE_S):
                raise RuntimeError(f"{why}: requests still in flight at the gate deadline")
            old = self.target.server
            # seeded while the sessions are held: the peer's page count then grows by the probe's pages alone
            self.log.append(f"{time.monotonic() - self._t0:.1f}s {why}: {self.seed_probe(old, probe)}")
            revision = self.target.revision
            if new_weights:
                self.verify(revision)  # the reference still serves these weights
            old.stop()
            if new_weights:
                rewrite_weights(self.model_dir, self.seed + revision + 1)
                revision += 1
                with ThreadPoolExecutor(2) as pool:  # two start-ups at once: most of a swap's time
                    ref = pool.submit(self.restart_reference)
                    new = self.restart()
                    ref.result()
            else:
                new = self.restart()
            found = self.probe(new, probe)  # before the sessions resume: the new server's first request
        finally:
            self._paused_s += time.monotonic() - self._swap_started
            self.swapping = False
        self.target.resume(new, revision)
        return found

    def _measure_warm(self) -> None:
        from benchmarks.servers import tree_rss

        self.stop.wait(min(self.duration_s * 0.15, 20.0))
        self.warm_rss = tree_rss(self.target.server.proc.pid)

    def _run(self) -> None:
        if self._at(0.15):
            self.probes["after_server_restart"] = self._swap_server("server restart", new_weights=False, probe=0)
            self._note("server_restart", "server restarted, peer kept")
            self._measure_warm()
        if self._at(0.30):
            self.peer.kill()
            self._note("peer_kill", "SIGKILL peer")
            self.stop.wait(2.0)  # the peer stays dead a while: requests meanwhile must not notice
            self.peer.start()
            self.log.append(f"peer restarted on port {self.peer.port}")
        if self._at(0.45):
            self.peer.signal(signal.SIGSTOP)
            self._note("peer_freeze", "SIGSTOP peer")
            self.stop.wait(3.0)
            self.peer.signal(signal.SIGCONT)
            self.log.append("SIGCONT peer")
        if self._at(0.60):
            size = memory_balloon()
            self._note("host_memory_pressure", f"host memory pressure: {size / 2**30:.1f} GiB held {BALLOON_HOLD_S:g}s")
        if self._at(0.75):
            self.probes["after_revision_change"] = self._swap_server("model revision change", new_weights=True,
                                                                     probe=1)
            self._note("model_revision_change", "weights rewritten in place; server and reference restarted")
            self._measure_warm()
