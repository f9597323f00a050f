"""Page transfer throughput through the block transport and the peer tier, beside a plain memory copy.

    python -m benchmarks.transfer_bench [--page-kib 64] [--pages N] [--repeats 9] [--ucx-tls tcp] [--json]

For each page size (64 KiB and 1 MiB unless `--page-kib` is given; `--pages` defaults to 32 MiB worth),
measured in one run on the same scattered pages:
- memcpy: ctypes.memmove of each page inside this process (the baseline every ratio is against);
- NIXL READ to a second process, all pages as ONE transfer (raw: no control plane, no checksums);
- the peer tier's get end to end: PeerClient.get against a real peer server process (lookup round trip,
  NIXL READs straight into the destination, pages in a row on both sides as one descriptor, the checksum
  of every page computed and compared: on hashing threads overlapped with the next READ unless the load
  average says the machine is saturated, else by the caller right after each READ; overlap.py). The
  pages were put in one batch into a fresh pool, so they sit in a row in the peer's pool and land in a
  row locally (one descriptor per READ); the raw NIXL READ above reads scattered slots;
- the same get into scattered destination pages (page i lands in local slot perm(i)): no two pages in a
  row locally, so one descriptor per page, as into a fragmented host pool;
- the table also gives NIXL one page per transfer, NIXL WRITE, the in-process LocalTransport and the peer
  tier's put.
The headline four are measured round-robin (memcpy, READ, get, scattered get, memcpy, ...) so a load spike
on the shared machine hits all of them alike; each figure is the median of `--repeats` rounds. Prints a
markdown table, or with `--json` one object for one page size (64 KiB unless `--page-kib` is given).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable, Dict, List

import numpy as np

DEFAULT_PAGE_KIB = (64, 1024)
DEFAULT_TOTAL_BYTES = 32 << 20


# --- the two other processes: a passive NIXL endpoint and a peer server ---------------------------------


def _passive(conn, nbytes: int) -> None:
    """The remote endpoint: registers a buffer, hands out metadata, drives progress until told to stop."""
    from transfer.nixl_transport import NixlTransport

    buf = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    t = NixlTransport("bench-passive")
    t.register(buf.ctypes.data, buf.nbytes)
    conn.send((t.metadata(), buf.ctypes.data))
    while not conn.poll(0.0005):
        t.progress()
    t.close()


def _start_peer_server(env) -> tuple:
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "sglang_ext.peer_server", "--port", "0", "--capacity-gb", "0.2"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        for line in open(log.name).read().splitlines():
            if line.startswith("PEER_SERVER_READY"):
                return proc, int(line.split("port=")[1].split()[0])
        time.sleep(0.05)  # polling a log file for readiness, bounded by the deadline above
    proc.kill()
    raise RuntimeError(f"peer server did not start:\n{open(log.name).read()[-2000:]}")


class Passive:
    """The passive NIXL endpoint, started once and stopped whatever happens."""

    def __init__(self, remote_bytes: int):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_passive, args=(child, remote_bytes), daemon=True)
        self._proc.start()
        if not self._conn.poll(60):
            self._proc.kill()
            raise RuntimeError("passive endpoint did not start")
        self.metadata, self.remote_addr = self._conn.recv()

    def stop(self) -> None:
        self._conn.send("stop")
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()


# --- timing ---------------------------------------------------------------------------------------------


def _once(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def round_robin(paths: Dict[str, Callable[[], None]], repeats: int) -> Dict[str, List[float]]:
    """Each path once per round, `repeats` rounds after one warm-up round: seconds per run, by path."""
    for fn in paths.values():
        fn()
    times: Dict[str, List[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, fn in paths.items():
            times[name].append(_once(fn))
    return times


@dataclass(frozen=True)
class Row:
    path: str
    mode: str
    seconds: List[float]
    total_bytes: int

    @property
    def gbps(self) -> float:
        return self.total_bytes / statistics.median(self.seconds) / 1e9

    @property
    def spread(self) -> str:
        lo, hi = min(self.seconds), max(self.seconds)
        return f"{self.total_bytes / hi / 1e9:.2f}-{self.total_bytes / lo / 1e9:.2f}"


# --- one page size --------------------------------------------------------------------------------------


class PageSet:
    """`n` scattered pages of `page` bytes: local destinations, remote slots, and a local copy source."""

    def __init__(self, n: int, page: int, remote_addr: int):
        rng = np.random.default_rng(1)
        self.n, self.page, self.total = n, page, n * page
        self.slots = rng.permutation(2 * n)[:n] * page  # scattered over a remote buffer twice the size
        self.local = np.zeros(self.total, dtype=np.uint8)
        self.src = rng.integers(0, 256, 2 * self.total, dtype=np.uint8)
        la = self.local.ctypes.data
        self.local_ranges = [(la + i * page, page) for i in range(n)]
        self.remote_ranges = [(remote_addr + int(o), page) for o in self.slots]
        self.src_ranges = [(self.src.ctypes.data + int(o), page) for o in self.slots]

    def memcpy(self) -> None:
        for (dst, n), (src, _) in zip(self.local_ranges, self.src_ranges):
            ctypes.memmove(dst, src, n)


def measure(passive: Passive, n: int, page: int, repeats: int, full: bool) -> List[Row]:
    """Rows for one page size; the first four are memcpy, NIXL READ batched, peer get, peer get into
    scattered pages (round-robin).

    A peer server of its own per page size (a pool holds one page size)."""
    from tiers.peer.client import PeerClient
    from transfer.base import deadline_in
    from transfer.nixl_transport import NixlTransport

    ps = PageSet(n, page, passive.remote_addr)
    server, port = _start_peer_server(dict(os.environ))
    t = NixlTransport("bench")
    t.register(ps.local.ctypes.data, ps.local.nbytes)
    client = PeerClient("127.0.0.1", port, t, page, timeout_s=30)
    try:
        peer = t.connect(passive.metadata, deadline_in(10))
        pages = [[r] for r in ps.local_ranges]
        keys = [f"bench-{page}-{i}" for i in range(n)]
        ps.local[:] = ps.src[: ps.total]
        if not all(client.put("bench", keys, pages)):
            raise RuntimeError("the peer server did not store every page (pool too small?)")
        scattered = [pages[int(j)] for j in np.random.default_rng(2).permutation(n)]
        headline = round_robin({
            "memcpy": ps.memcpy,
            "NIXL READ": lambda: t.read(peer, ps.local_ranges, ps.remote_ranges, deadline_in(30)),
            "peer tier get": lambda: _checked_get(client, keys, pages),
            "peer tier get, scattered destination": lambda: _checked_get(client, keys, scattered),
        }, repeats)
        rows = [Row(name, "batched" if name != "memcpy" else "page at a time", s, ps.total)
                for name, s in headline.items()]
        if full:
            rows += _secondary_rows(t, peer, client, ps, pages, repeats)
        return rows
    finally:
        client.close()
        t.close()
        server.kill()
        server.wait(10)


def _checked_get(client, keys, pages) -> None:
    if not all(client.get("bench", keys, pages)):
        raise RuntimeError("a peer get missed or failed its checksum")


def _secondary_rows(t, peer, client, ps: PageSet, pages, repeats: int) -> List[Row]:
    from transfer.base import deadline_in
    from transfer.local_transport import LocalFabric, LocalTransport

    few = max(1, repeats // 3)
    one_each = lambda op: lambda: [op(peer, [lr], [rr], deadline_in(30))  # noqa: E731
                                  for lr, rr in zip(ps.local_ranges, ps.remote_ranges)]
    fabric = LocalFabric()
    la_t, lb_t = LocalTransport(fabric), LocalTransport(fabric)
    la_t.register(ps.local.ctypes.data, ps.local.nbytes)
    lb_t.register(ps.src.ctypes.data, ps.src.nbytes)
    lpeer = la_t.connect(lb_t.metadata(), deadline_in(1))
    fresh = iter(range(10**9))
    paths = {
        ("NIXL READ", "one page each"): (one_each(t.read), few),
        ("NIXL WRITE", "batched"): (lambda: t.write(peer, ps.local_ranges, ps.remote_ranges, deadline_in(30)), repeats),
        ("LocalTransport READ", "batched"): (lambda: la_t.read(lpeer, ps.local_ranges, ps.src_ranges, deadline_in(30)),
                                             repeats),
        ("peer tier put (new keys)", "batched"): (
            lambda: client.put("bench", [f"n{next(fresh)}-{i}" for i in range(ps.n)], pages), few),
    }
    rows = []
    for (name, mode), (fn, reps) in paths.items():
        rows.append(Row(name, mode, round_robin({name: fn}, reps)[name], ps.total))
    la_t.close()
    lb_t.close()
    return rows


# --- output ---------------------------------------------------------------------------------------------


def summary(rows: List[Row], page_kib: int, n: int) -> dict:
    memcpy, read, get, scattered = rows[0], rows[1], rows[2], rows[3]
    return {
        "page_kib": page_kib, "pages": n, "total_bytes": memcpy.total_bytes, "repeats": len(memcpy.seconds),
        "ucx_tls": os.environ.get("UCX_TLS", "default"),
        "memcpy_gbps": memcpy.gbps, "nixl_read_gbps": read.gbps, "peer_get_gbps": get.gbps,
        "nixl_read_ratio": read.gbps / memcpy.gbps, "peer_get_ratio": get.gbps / memcpy.gbps,
        "peer_get_scattered_gbps": scattered.gbps, "peer_get_scattered_ratio": scattered.gbps / memcpy.gbps,
        "memcpy_gbps_range": memcpy.spread, "nixl_read_gbps_range": read.spread, "peer_get_gbps_range": get.spread,
    }


def print_table(results: List[tuple]) -> None:
    print(f"\nUCX_TLS={os.environ.get('UCX_TLS', 'default')}; GB/s = median of the rounds (min-max in brackets); "
          "ratios against memcpy of the same pages in the same rounds\n")
    print("| page | pages | path | mode | GB/s | vs memcpy |")
    print("|---|---:|---|---|---:|---:|")
    for page_kib, n, rows in results:
        base = rows[0].gbps
        for r in rows:
            print(f"| {page_kib} KiB | {n} | {r.path} | {r.mode} | {r.gbps:.2f} ({r.spread}) | {r.gbps / base:.2f} |")


def parse_args(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.transfer_bench", description=__doc__.split("\n")[0])
    p.add_argument("--page-kib", type=int, default=None, help="one page size (default: 64 and 1024)")
    p.add_argument("--pages", type=int, default=None, help="pages per batch (default: 32 MiB worth)")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--ucx-tls", default="", help="UCX_TLS for both sides (e.g. tcp); default: UCX's choice")
    p.add_argument("--json", action="store_true", help="print one JSON object (the headline paths only)")
    args = p.parse_args(argv)
    for name in ("page_kib", "pages", "repeats"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"argument --{name.replace('_', '-')}: must be positive, got {value}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    if args.ucx_tls:
        os.environ["UCX_TLS"] = args.ucx_tls
    sizes = [args.page_kib] if args.page_kib else ([DEFAULT_PAGE_KIB[0]] if args.json else list(DEFAULT_PAGE_KIB))
    plan = [(kib, args.pages or max(1, DEFAULT_TOTAL_BYTES // (kib * 1024))) for kib in sizes]
    passive = Passive(2 * max(kib * 1024 * n for kib, n in plan))
    try:
        results = [(kib, n, measure(passive, n, kib * 1024, args.repeats, full=not args.json)) for kib, n in plan]
    finally:
        passive.stop()
    if args.json:
        kib, n, rows = results[0]
        print(json.dumps(summary(rows, kib, n)))
    else:
        print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
