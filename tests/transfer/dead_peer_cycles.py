"""Child process for the dead-peer teardown test: N times, connect to a passive endpoint, READ, SIGKILL it,
READ again (an error), close and drop the transport, which destroys the UCX worker.

It runs apart from pytest because the bug it guards aborts the process (a UCX assertion while destroying a
worker whose cma endpoint still queues the failed READ). Prints one line per cycle; exit 0 when all ended.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys

import numpy as np

from tests.transfer.endpoint_proc import serve
from transfer.base import TransferError, deadline_in
from transfer.nixl_transport import NixlTransport

PAGE = 4096


def cycle() -> None:
    parent, child = mp.get_context("spawn").Pipe()
    proc = mp.get_context("spawn").Process(target=serve, args=(child, 1), daemon=True)
    proc.start()
    try:
        assert parent.poll(60), "passive endpoint did not start"
        metadata, addr, _ = parent.recv()
        t = NixlTransport("cycle")
        local = np.zeros(PAGE, dtype=np.uint8)
        t.register(local.ctypes.data, local.nbytes)
        peer = t.connect(metadata, deadline_in(10))
        t.read(peer, [(local.ctypes.data, PAGE)], [(addr, PAGE)], deadline_in(10))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        try:
            t.read(peer, [(local.ctypes.data, PAGE)], [(addr, PAGE)], deadline_in(3))
            print("read from a dead peer succeeded", flush=True)
        except TransferError:
            pass
        t.close()
        del t  # destroys the agent and its UCX worker: where the abort happened
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(10)


if __name__ == "__main__":
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    for n in range(int(sys.argv[1])):
        cycle()
        print(f"cycle {n} ended", flush=True)
