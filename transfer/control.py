"""Length-prefixed request/response messages over a TCP socket, every operation bounded by a deadline.

Frame: 8-byte header (`>II`: JSON length, blob length), a UTF-8 JSON object, then an optional opaque blob
(NIXL metadata, which JSON would bloat). Both lengths are capped so a garbled or hostile stream fails fast
instead of allocating gigabytes. Errors are `TransferError`; a missed deadline is `TransferTimeout`.
"""

from __future__ import annotations

import json
import select
import socket
import struct
from typing import Any, Dict, Tuple

from transfer.base import TransferError, TransferTimeout, remaining

_HEADER = struct.Struct(">II")
MAX_JSON = 16 << 20
MAX_BLOB = 64 << 20


class FrameError(TransferError):
    """Bytes arrived but are not a frame this receiver takes (too large, not a JSON object)."""


def _settimeout(sock: socket.socket, deadline: float) -> None:
    left = remaining(deadline)
    if left <= 0:
        raise TransferTimeout("deadline passed before the socket operation")
    sock.settimeout(left)


def send_message(sock: socket.socket, body: Dict[str, Any], deadline: float, blob: bytes = b"") -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    if len(data) > MAX_JSON or len(blob) > MAX_BLOB:
        raise TransferError(f"message too large ({len(data)} + {len(blob)} bytes)")
    frame = _HEADER.pack(len(data), len(blob)) + data + blob
    try:
        _settimeout(sock, deadline)
        sock.sendall(frame)
    except socket.timeout as e:
        raise TransferTimeout("send timed out") from e
    except OSError as e:
        raise TransferError(f"send failed: {e}") from e


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            _settimeout(sock, deadline)
            k = sock.recv_into(view[got:], n - got)
        except socket.timeout as e:
            raise TransferTimeout(f"receive timed out after {got}/{n} bytes") from e
        except OSError as e:
            raise TransferError(f"receive failed: {e}") from e
        if k == 0:
            raise TransferError("connection closed by peer")
        got += k
    return bytes(buf)


def recv_message(
    sock: socket.socket, deadline: float, max_json: int = MAX_JSON, max_blob: int = MAX_BLOB
) -> Tuple[Dict[str, Any], bytes]:
    """One frame; `FrameError` if it exceeds `max_json` + `max_blob` bytes or its JSON is not an object."""
    jlen, blen = _HEADER.unpack(_recv_exact(sock, _HEADER.size, deadline))
    if jlen > max_json or blen > max_blob:
        raise FrameError(f"frame too large ({jlen} + {blen} bytes; this end takes at most {max_json} + "
                         f"{max_blob}): not a peer-protocol stream?")
    try:
        body = json.loads(_recv_exact(sock, jlen, deadline))
    except (ValueError, RecursionError) as e:  # RecursionError: JSON nested too deep
        raise FrameError(f"bad message: {e}") from e
    if not isinstance(body, dict):
        raise FrameError("message is not a JSON object")
    blob = _recv_exact(sock, blen, deadline) if blen else b""
    return body, blob


def wait_readable(sock: socket.socket, timeout: float) -> bool:
    """Whether a message starts arriving within `timeout` seconds (lets servers check a stop flag)."""
    r, _, _ = select.select([sock], [], [], timeout)
    return bool(r)
