"""A passive NIXL endpoint in a child process: owns a buffer with a known pattern, answers commands.

Runs under multiprocessing's spawn start method; talks to the test over a Pipe. Between commands it
drives NIXL progress (the passive side must poll, there is no progress thread).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

BUF_BYTES = 1 << 20


def pattern(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, BUF_BYTES, dtype=np.uint8)


def serve(conn, seed: int) -> None:
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    from transfer.nixl_transport import NixlTransport

    buf = pattern(seed)
    t = NixlTransport("passive")
    t.register(buf.ctypes.data, buf.nbytes)
    conn.send((t.metadata(), buf.ctypes.data, buf.nbytes))
    notes = []
    while True:
        if conn.poll(0.001):
            cmd = conn.recv()
            if cmd == "digest":
                conn.send(hashlib.blake2b(buf.tobytes()).hexdigest())
            elif cmd == "notifs":
                for msgs in t.notifications().values():
                    notes.extend(msgs)
                conn.send(list(notes))
            elif cmd == "stop":
                t.close()
                conn.send("bye")
                return
        t.progress()
