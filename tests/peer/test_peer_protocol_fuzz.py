"""The peer server against hostile or broken clients: a real server process on 127.0.0.1, raw frames.

Guards: every well-framed request with a bad field gets an error reply and the connection goes on; every
valid one is served; a frame that is too large, not JSON, nested too deep or carrying a blob gets an
error reply and its connection is closed; a truncated frame costs nothing; the page size cannot be set
to one that would make a huge index; connections are capped with a clear refusal, idle ones are closed,
and neither stalls a client that is already served. After a fuzz run the server's memory and threads are
back near a baseline measured in the same test, and a well-formed client still gets its pages.
"""

from __future__ import annotations

import json
import socket
import string
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.peer.test_peer_server import PAGE, Pages, client, keys
from tiers.clock import ManualClock
from tiers.peer.protocol import PROTOCOL_VERSION
from tiers.peer.requests import MAX_KEY_CHARS, MAX_KEYS, MAX_NS_CHARS, MAX_REQUEST_BYTES
from tiers.peer.server import PeerServer
from tiers.peer.store import PageStore
from transfer.base import TransferError, deadline_in
from transfer.control import recv_message, send_message

HEADER = struct.Struct(">II")
REPLY_S = 30.0  # generous: the machine is shared


def connect(peer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", peer.port), timeout=REPLY_S)


def call(sock, body: dict) -> dict:
    send_message(sock, body, deadline_in(REPLY_S))
    return recv_message(sock, deadline_in(REPLY_S))[0]


def reply(sock) -> dict:
    return recv_message(sock, deadline_in(REPLY_S))[0]


def closed_by_server(sock) -> bool:
    sock.settimeout(REPLY_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def frame(body: bytes, blob: bytes = b"") -> bytes:
    return HEADER.pack(len(body), len(blob)) + body + blob


# --- requests: valid ones, and ones made invalid by exactly one bad field ------------------------------

KEY = st.text(string.hexdigits, min_size=1, max_size=64)
NS = st.sampled_from(["ns", "tenant=A|model=m", "x" * MAX_NS_CHARS])
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@st.composite
def valid_request(draw) -> dict:
    op = draw(st.sampled_from(["hello", "alloc", "commit", "lookup", "report", "stats"]))
    ks = draw(st.lists(KEY, max_size=8))
    if op == "hello":
        return {"op": op, "version": PROTOCOL_VERSION, "page_bytes": PAGE, "client": draw(st.text(max_size=16))}
    if op == "stats":
        return {"op": op}
    req = {"op": op, "ns": draw(NS), "keys": ks}
    if op == "commit":
        req["checksums"] = [draw(st.text(string.hexdigits, max_size=32)) for _ in ks]
    if op == "lookup":
        req["pin"] = draw(st.booleans())
    return req


def _bad_strings(draw, max_chars: int):
    """A value that is not a list of at most MAX_KEYS strings of at most `max_chars` characters."""
    kind = draw(st.sampled_from(["junk", "item", "long", "nul", "surrogate", "many"]))
    if kind == "junk":
        return draw(JUNK.filter(lambda v: not isinstance(v, list)))
    if kind == "item":
        return ["k", draw(JUNK.filter(lambda v: not isinstance(v, str)))]
    if kind == "long":
        return ["k", "k" * (max_chars + 1)]
    if kind == "nul":
        return ["k\x00k"]
    if kind == "surrogate":
        return ["k\ud800"]
    return ["k"] * (MAX_KEYS + 1)


@st.composite
def invalid_request(draw) -> dict:
    req = draw(valid_request().filter(lambda r: r["op"] != "stats"))
    field = draw(st.sampled_from(sorted(set(req) - {"client"}) + ["op"]))
    how = draw(st.sampled_from(["drop", "bad"]))
    if field == "op":
        req["op"] = draw(st.one_of(JUNK, st.text(max_size=8)).filter(
            lambda v: v not in ("hello", "alloc", "commit", "lookup", "report", "stats")))
    elif how == "drop" and field != "pin":
        del req[field]
    elif field == "ns":
        req["ns"] = draw(st.one_of(JUNK.filter(lambda v: not isinstance(v, str)), st.just("n" * (MAX_NS_CHARS + 1)),
                                   st.just("a\x00b")))
    elif field in ("keys", "checksums"):
        req[field] = _bad_strings(draw, MAX_KEY_CHARS if field == "keys" else 128)
        if field == "keys" and "checksums" in req and isinstance(req["keys"], list):
            req["checksums"] = ["0"] * len(req["keys"])  # keep the lengths equal: only the keys are bad
    elif field == "pin":
        req["pin"] = draw(JUNK.filter(lambda v: not isinstance(v, bool)))
    elif field == "version":
        req["version"] = draw(JUNK.filter(lambda v: v != 1 or isinstance(v, (bool, float))))
    elif field == "page_bytes":
        req["page_bytes"] = draw(JUNK.filter(lambda v: v != PAGE or isinstance(v, (bool, float))))
    else:
        raise AssertionError(field)
    return req


@st.composite
def bad_frame(draw) -> bytes:
    """Bytes that are not a frame the server takes: each gets an error reply, then the close."""
    kind = draw(st.sampled_from(["huge", "blob", "not_json", "not_object", "nested", "bad_utf8"]))
    if kind == "huge":
        return HEADER.pack(draw(st.integers(MAX_REQUEST_BYTES + 1, 2**32 - 1)), draw(st.integers(0, 2**32 - 1)))
    if kind == "blob":
        return frame(b'{"op":"stats"}', draw(st.binary(min_size=1, max_size=64)))
    if kind == "not_json":
        return frame(b"{" + draw(st.binary(max_size=64)).replace(b"}", b""))
    if kind == "not_object":
        return frame(json.dumps(draw(JUNK.filter(lambda v: not isinstance(v, dict)))).encode())
    if kind == "nested":
        depth = draw(st.integers(10_000, 200_000))
        return frame(b"[" * depth + b"]" * depth)
    return frame(b'{"op":"' + draw(st.sampled_from([b"\xff", b"\xc3\x28"])) + b'"}')


# --- the fuzz ----------------------------------------------------------------------------------------


def _usage(peer):
    import psutil

    p = psutil.Process(peer.proc.pid)
    return p.memory_info().rss, p.num_threads()


def test_fuzzed_frames_get_answers_and_leave_the_server_bounded_and_serving(peer_factory, transport):
    peer = peer_factory("--capacity-gb", "0.01", "--page-bytes", str(PAGE))
    good = client(peer, transport)
    src, dst = Pages(transport, 8, seed=11), Pages(transport, 8)
    assert all(good.put("ns", keys(8), src.pages()))
    with connect(peer) as warm:  # one raw connection before the baseline, as each example makes
        assert call(warm, {"op": "stats"})["ok"]
    rss0, threads0 = _usage(peer)

    @settings(max_examples=300, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(
        st.tuples(st.just("valid"), valid_request()),
        st.tuples(st.just("invalid"), invalid_request()),
        st.tuples(st.just("frame"), bad_frame()),
        st.tuples(st.just("truncated"), st.integers(1, 1000), st.binary(max_size=16)),
    ))
    def one(case):
        with connect(peer) as sock:
            if case[0] in ("valid", "invalid"):
                resp = call(sock, case[1])
                assert resp["ok"] is (case[0] == "valid"), (case[1], resp)
                if not resp["ok"]:
                    assert isinstance(resp["error"], str) and resp["error"]
                assert call(sock, {"op": "stats"})["ok"]  # the connection goes on
            elif case[0] == "frame":
                sock.sendall(case[1])
                resp = reply(sock)
                assert resp["ok"] is False and resp["error"], resp
                assert closed_by_server(sock)
            else:  # a header that promises more than comes, then the client leaves
                claimed, sent = case[1], case[2][: case[1] - 1]
                sock.sendall(HEADER.pack(claimed, 0) + sent)
                sock.shutdown(socket.SHUT_WR)
                assert closed_by_server(sock)
        assert peer.proc.poll() is None

    one()

    # connection threads end once their clients are gone: wait for that (bounded), then compare
    deadline = time.monotonic() + 60
    while _usage(peer)[1] > threads0 and time.monotonic() < deadline:
        time.sleep(0.1)
    rss1, threads1 = _usage(peer)
    assert threads1 <= threads0, (threads0, threads1)
    assert rss1 - rss0 < 64 << 20, (rss0, rss1)  # 2 MiB frames at most, one at a time here
    assert good.get("ns", keys(8), dst.pages()) == [True] * 8
    assert all(dst.bytes_of(i) == src.bytes_of(i) for i in range(8))
    with connect(peer) as sock:
        counters = call(sock, {"op": "stats"})["server"]
    assert counters["bad_frames"] > 0 and counters["bad_requests"] > 0 and counters["refused"] == 0


# --- page size -----------------------------------------------------------------------------------------


def test_a_hello_cannot_set_a_page_size_that_makes_a_huge_index(peer_factory, transport):
    """Today a hello with page size 1 against a 64 GB pool builds a 64-billion-entry free list; here the
    same kind of request at a size this machine can afford: 64-byte pages would cut a 0.5 GB pool into
    8 million slots, beyond the cap. (Sizes below the floor are refused in test_peer_store.py.)"""
    peer = peer_factory("--capacity-gb", "0.5")
    with connect(peer) as sock:
        resp = call(sock, {"op": "hello", "version": PROTOCOL_VERSION, "page_bytes": 64, "client": "t"})
        assert resp["ok"] is False and "slots" in resp["error"], resp
        assert call(sock, {"op": "stats"})["stats"]["page_bytes"] == 0  # nothing was formatted
    c = client(peer, transport)  # a sane page size is taken afterwards
    src = Pages(transport, 2, seed=12)
    assert all(c.put("ns", keys(2), src.pages()))
    assert c.stats().page_bytes == PAGE


# --- connections ----------------------------------------------------------------------------------------


def test_connections_are_capped_with_a_clear_refusal_and_served_clients_go_on(peer_factory, transport):
    cap = 6
    peer = peer_factory("--capacity-gb", "0.01", "--page-bytes", str(PAGE), "--max-connections", str(cap))
    good = client(peer, transport)
    src, dst = Pages(transport, 4, seed=13), Pages(transport, 4)
    assert all(good.put("ns", keys(4), src.pages()))
    hostile = [connect(peer) for _ in range(cap - 1)]  # with `good`, the server is full
    served = [call(sock, {"op": "stats"})["server"]["connections"] for sock in hostile]  # each one admitted
    assert served[-1] == cap
    hostile[0].sendall(HEADER.pack(1000, 0) + b'{"op": "st')  # a truncated frame, held open; the rest idle
    refused = []
    for _ in range(100):
        sock = connect(peer)
        refused.append(sock)
        resp = reply(sock)
        assert resp["ok"] is False and "--max-connections" in resp["error"], resp
    assert good.get("ns", keys(4), dst.pages()) == [True] * 4  # the served client is not stalled
    newcomer = client(peer, transport)
    with pytest.raises(TransferError, match="max-connections"):
        newcomer.exists("ns", keys(4))
    for sock in hostile + refused:
        sock.close()
    deadline = time.monotonic() + 60  # the server notices the closed connections (bounded wait)
    while True:
        try:
            assert newcomer.exists("ns", keys(4)) == [True] * 4
            break
        except TransferError:
            assert time.monotonic() < deadline, "the server never took a new connection again"
            time.sleep(0.1)
    assert newcomer.stats().used_pages == 4


def test_an_idle_connection_is_closed_by_the_injected_clock():
    from transfer.local_transport import LocalFabric, LocalTransport

    clock = ManualClock()
    store = PageStore(np.zeros(64 * PAGE, dtype=np.uint8), "lru", clock=clock)
    server = PeerServer(store, LocalTransport(LocalFabric(), "peer"), "127.0.0.1", 0, idle_timeout_s=30.0,
                        clock=clock).start()
    try:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=REPLY_S)
        assert call(sock, {"op": "hello", "version": PROTOCOL_VERSION, "page_bytes": PAGE, "client": "t"})["ok"]
        for _ in range(3):
            clock.advance(29.0)  # under the timeout since the last request: still served
            assert call(sock, {"op": "stats"})["ok"]
        clock.advance(31.0)
        assert closed_by_server(sock)
        sock.close()
        assert server.counters()["idle_closed"] == 1
        with socket.create_connection(("127.0.0.1", server.port), timeout=REPLY_S) as again:
            assert call(again, {"op": "stats"})["server"]["connections"] == 1  # the closed one is untracked
    finally:
        server.stop()
