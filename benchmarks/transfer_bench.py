"""Page transfer throughput and latency through the block transport, beside a plain memory copy.

    python -m benchmarks.transfer_bench [--pages 512] [--page-kib 64] [--ucx-tls tcp]

Measured in one run, on the same scattered pages:
- memcpy: ctypes.memmove of each page inside this process (the floor any transport is compared with);
- NIXL READ/WRITE to a second process: batched (all pages as ONE transfer) and one page per transfer;
- the in-process LocalTransport, batched;
- the peer tier end to end (PeerClient put/get against a real peer server process: control plane,
  checksums, NIXL data plane).
Prints a markdown table; ratios are against memcpy measured in the same run. Finishes well under 60 s.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, List

import numpy as np


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


def _time(fn: Callable[[], None], repeats: int) -> List[float]:
    fn()  # warm-up: connection set-up, first-touch page faults
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _time_each(op: Callable[[int], None], count: int, repeats: int) -> tuple:
    """Run op(0..count-1) `repeats` times: (per-run totals, every single op's time)."""
    op(0)
    totals, each = [], []
    for _ in range(repeats):
        run = 0.0
        for i in range(count):
            t0 = time.perf_counter()
            op(i)
            dt = time.perf_counter() - t0
            each.append(dt)
            run += dt
        totals.append(run)
    return totals, each


def _start_peer_server(env) -> tuple:
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "sglang_ext.peer_server", "--port", "0", "--capacity-gb", "0.2"]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        for line in open(log.name).read().splitlines():
            if line.startswith("PEER_SERVER_READY"):
                return proc, int(line.split("port=")[1].split()[0])
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"peer server did not start:\n{open(log.name).read()[-2000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.transfer_bench", description=__doc__.split("\n")[0])
    p.add_argument("--pages", type=int, default=512)
    p.add_argument("--page-kib", type=int, default=64)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--ucx-tls", default="", help="UCX_TLS for both sides (e.g. tcp); default: UCX's choice")
    args = p.parse_args(argv)
    if args.pages <= 0 or args.page_kib <= 0 or args.repeats <= 0:
        p.error("argument --pages/--page-kib/--repeats: must be positive")
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    if args.ucx_tls:
        os.environ["UCX_TLS"] = args.ucx_tls

    from tiers.peer.client import PeerClient
    from transfer.base import deadline_in
    from transfer.local_transport import LocalFabric, LocalTransport
    from transfer.nixl_transport import NixlTransport

    n, page = args.pages, args.page_kib * 1024
    total = n * page
    remote_bytes = 2 * total
    rng = np.random.default_rng(1)
    remote_slots = rng.permutation(remote_bytes // page)[:n] * page  # scattered on the remote side
    local = np.zeros(total, dtype=np.uint8)
    src = rng.integers(0, 256, remote_bytes, dtype=np.uint8)  # memcpy and local-transport source
    rows = []

    def add(name, mode, times, each=None):
        med = statistics.median(times)
        rows.append((name, mode, med * 1e3, total / med / 1e9, [t * 1e6 for t in (each or times)]))

    # memcpy baseline: the same scattered pages, copied within this process
    la, sa = local.ctypes.data, src.ctypes.data
    pairs = [(la + i * page, sa + int(o)) for i, o in enumerate(remote_slots)]
    add("memcpy", "one page each", *_time_each(lambda i: ctypes.memmove(*pairs[i], page), n, args.repeats))

    # NIXL to a second process
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_passive, args=(child, remote_bytes), daemon=True)
    proc.start()
    server = None
    try:
        if not parent.poll(60):
            raise RuntimeError("passive endpoint did not start")
        metadata, raddr = parent.recv()
        t = NixlTransport("bench")
        t.register(local.ctypes.data, local.nbytes)
        peer = t.connect(metadata, deadline_in(10))
        lr = [(la + i * page, page) for i in range(n)]
        rr = [(raddr + int(o), page) for o in remote_slots]
        single_reps = max(1, args.repeats // 3)
        for op in ("read", "write"):
            fn = getattr(t, op)
            add(f"NIXL {op.upper()}", "batched", _time(lambda: fn(peer, lr, rr, deadline_in(30)), args.repeats))
            add(f"NIXL {op.upper()}", "one page each",
                *_time_each(lambda i: fn(peer, [lr[i]], [rr[i]], deadline_in(30)), n, single_reps))

        fabric = LocalFabric()
        la_t, lb_t = LocalTransport(fabric), LocalTransport(fabric)
        la_t.register(la, local.nbytes)
        lb_t.register(sa, src.nbytes)
        lpeer = la_t.connect(lb_t.metadata(), deadline_in(1))
        srr = [(sa + int(o), page) for o in remote_slots]
        add("LocalTransport READ", "batched", _time(lambda: la_t.read(lpeer, lr, srr, deadline_in(30)), args.repeats))

        # the peer tier end to end (checksums + control plane + NIXL)
        server, port = _start_peer_server(dict(os.environ))
        c = PeerClient("127.0.0.1", port, t, page, timeout_s=30)
        pages = [[r] for r in lr]
        keys = [f"bench{i}" for i in range(n)]
        c.put("bench", keys, pages)  # first put stores; later ones find the pages present
        add("peer tier get", "batched", _time(lambda: c.get("bench", keys, pages), args.repeats))
        fresh = iter(range(10**9))
        add("peer tier put (new keys)", "batched",
            _time(lambda: c.put("bench", [f"n{next(fresh)}-{i}" for i in range(n)], pages), max(1, args.repeats // 2)))
        c.close()
        t.close()
    finally:
        parent.send("stop")
        proc.join(10)
        if proc.is_alive():
            proc.kill()
        if server is not None:
            server.kill()
            server.wait(10)

    memcpy_gbs = rows[0][3]  # per-page memmove of the same scattered pages
    single = {r[0]: r[3] for r in rows if r[1] == "one page each"}
    tls = os.environ.get("UCX_TLS", "default")
    print(f"\n{n} pages x {args.page_kib} KiB = {total / 2**20:.0f} MiB, scattered; UCX_TLS={tls}; "
          f"median of {args.repeats} runs\n")
    print("| path | mode | time (ms) | GB/s | vs memcpy | batched vs one-at-a-time | per transfer p50 / p99 (us) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, mode, ms, gbs, per_op in rows:
        speed = f"{gbs / single[name]:.1f}x" if mode == "batched" and name in single else ""
        p50, p99 = np.percentile(per_op, 50), np.percentile(per_op, 99)
        print(f"| {name} | {mode} | {ms:.2f} | {gbs:.2f} | {gbs / memcpy_gbs:.2f} | {speed} | {p50:.1f} / {p99:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
