"""Resident memory of the soak's processes over time, and its slope over the last half of the run.

Design note
-----------
A process that grows only while it warms up (the torch allocator's first arenas, pool pages touched for the
first time: the peer's slab, the host tier) flattens out; a structure that grows per request keeps climbing
with the traffic. So the soak samples RSS per process every few seconds and reports the least-squares slope
over the second half of the run, in bytes per second and bytes per request, next to the series itself.

- Processes are named by their title: SGLang's scheduler and detokenizer set `sglang::scheduler` /
  `sglang::detokenizer`; the server's main process (HTTP server and tokenizer manager) is `tokenizer`; the peer
  block server (not in the server's tree) is `peer`. `server` is the sum over the server's tree.
- Bounded: at most `max_samples` samples are kept; when full, every other one is dropped and the interval
  doubles, so a run of any length keeps an even series of at most that many points.
- With faults the server is swapped: every sample records the server's pid, and slopes use only samples of
  the last server (and of the peer process that ran at the end).

Threading: `RssSampler` runs one daemon thread; `samples()` copies under its lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

SERVER = "server"
PEER = "peer"
DEFAULT_INTERVAL_S = 5.0
DEFAULT_MAX_SAMPLES = 240


@dataclass(frozen=True)
class RssSample:
    t_s: float  # seconds since the sampler started
    requests: int  # requests answered so far (the run's counter)
    server_pid: int
    peer_pid: int
    rss: Dict[str, int]  # bytes by process name (see the module note), plus SERVER, the server tree's sum


def process_name(title: str, is_root: bool) -> str:
    """`sglang::scheduler` -> `scheduler`; the tree's root (SGLang's main process) -> `tokenizer`."""
    if is_root:
        return "tokenizer"
    return title.split("::", 1)[1].split()[0] if title.startswith("sglang::") else "other"


def tree_rss_by_process(pid: int) -> Dict[str, int]:
    """RSS in bytes of a process tree by process name, and their SERVER sum; {} if the root is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    out: Dict[str, int] = {}
    for p in procs:
        try:
            title = " ".join(p.cmdline()) or p.name()
            rss = p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        name = process_name(title, p.pid == pid)
        out[name] = out.get(name, 0) + rss
    if out:
        out[SERVER] = sum(out.values())
    return out


def process_rss(pid: int) -> int:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.NoSuchProcess:
        return 0


def ols_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ys on xs; 0.0 with fewer than two distinct xs."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def last_half_slopes(samples: Sequence[RssSample]) -> Tuple[Dict[str, float], Dict[str, float]]:
    """({name: bytes/s}, {name: bytes/request}) over the samples in the second half of the run, of the last
    server (server processes) and the last peer process (`peer`)."""
    if not samples:
        return {}, {}
    half = samples[-1].t_s / 2
    last = samples[-1]
    tail = [s for s in samples if s.t_s >= half]
    per_s: Dict[str, float] = {}
    per_request: Dict[str, float] = {}
    for name in last.rss:
        pid_of = (lambda s: s.peer_pid) if name == PEER else (lambda s: s.server_pid)
        pid = pid_of(last)
        points = [(s.t_s, s.requests, s.rss[name]) for s in tail if pid_of(s) == pid and name in s.rss]
        per_s[name] = round(ols_slope([p[0] for p in points], [p[2] for p in points]), 1)
        per_request[name] = round(ols_slope([p[1] for p in points], [p[2] for p in points]), 1)
    return per_s, per_request


def series_by_process(samples: Sequence[RssSample]) -> Dict[str, List[Tuple[float, int]]]:
    """{name: [(t_s, bytes), ...]} for the JSON report (`requests` is the request count at each sample)."""
    out: Dict[str, List[Tuple[float, int]]] = {"requests": [(round(s.t_s, 1), s.requests) for s in samples]}
    for s in samples:
        for name, rss in s.rss.items():
            out.setdefault(name, []).append((round(s.t_s, 1), rss))
    return out


class BoundedSeries:
    """At most `max_samples` samples, evenly spaced: when full, every other sample goes and the caller's
    interval doubles (`add` returns the interval to use next). Thinning happens at an odd length, so the
    first and the latest sample stay and the next one comes one new interval after the latest."""

    def __init__(self, interval_s: float, max_samples: int):
        if max_samples < 5:
            raise ValueError(f"max_samples must be at least 5, got {max_samples}")
        self.interval_s = interval_s
        self._full = max_samples if max_samples % 2 else max_samples - 1
        self.samples: List[RssSample] = []

    def add(self, sample: RssSample) -> float:
        self.samples.append(sample)
        if len(self.samples) >= self._full:
            self.samples = self.samples[::2]
            self.interval_s *= 2
        return self.interval_s


class RssSampler:
    """Samples the server tree (whichever server `server_pid()` names now) and the peer every interval."""

    def __init__(self, server_pid: Callable[[], int], peer_pid: Callable[[], int], requests: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic, interval_s: float = DEFAULT_INTERVAL_S,
                 max_samples: int = DEFAULT_MAX_SAMPLES):
        self._server_pid, self._peer_pid, self._requests, self._clock = server_pid, peer_pid, requests, clock
        self._series = BoundedSeries(interval_s, max_samples)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._t0 = clock()

    def sample(self) -> float:
        """Take one sample now; returns the interval until the next."""
        server, peer = self._server_pid(), self._peer_pid()
        rss = tree_rss_by_process(server)
        if peer:
            rss[PEER] = process_rss(peer)
        sample = RssSample(self._clock() - self._t0, self._requests(), server, peer, rss)
        with self._lock:
            return self._series.add(sample)

    def start(self) -> "RssSampler":
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop and take a last sample (the end of the run)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.sample()

    def samples(self) -> List[RssSample]:
        with self._lock:
            return list(self._series.samples)

    def _run(self) -> None:
        interval = self._series.interval_s
        while not self._stop.wait(interval):
            try:
                interval = self.sample()
            except Exception:  # a process exiting mid-sample (a fault swap): skip this tick
                continue
