"""Sending a trace's rows to servers: one row as a client's `/generate` (send_row), the rows paced by their trace
times with at most N in flight (send_rows), or each row to several servers in turn (send_interleaved).

Each request asks for one new token (temperature 0), so its latency is its time to first token. Every wait has a
deadline: a request its own (REQUEST_DEADLINE_S), a free slot that plus a margin, after which the row counts as
failed rather than hang the run. Pacing and order are pure over an injected clock (unit-tested).
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from benchmarks.servers import REQUEST_DEADLINE_S, Server


@dataclass(frozen=True)
class Sent:
    """One row's answer: cached tokens (and their tiers) and latency; ok False when the request failed."""

    index: int
    ok: bool
    cached_tokens: int = 0
    details: Optional[dict] = None
    ttft_s: float = 0.0
    error: str = ""
    output_ids: Tuple[int, ...] = ()  # the greedy reply, to compare servers row by row
    sent_s: float = 0.0  # when it went out (the sender's clock; 0: never sent), the offline twin's clock


def row_fields(req) -> dict:
    """What a row asks of a server besides its tokens, as a client sends it: its tenant as SGLang's `cache_salt`
    and its TTL as `cache_control` (whole seconds, rounded up; stock SGLang ignores the field, ours retains),
    the two things the offline twin applies to the row."""
    fields = {}
    if req.tenant is not None:
        fields["cache_salt"] = str(req.tenant)
    if req.ttl_s is not None:
        fields["cache_control"] = {"type": "ephemeral", "ttl": f"{math.ceil(req.ttl_s)}s"}
    return fields


def send_row(server: Server, ids: List[int], index: int, clock: Callable[[], float] = time.perf_counter,
             headers: Optional[dict] = None, fields: Optional[dict] = None) -> Sent:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}, **(fields or {})}
    start = clock()
    try:
        status, reply = server.post_status("/generate", body, timeout=REQUEST_DEADLINE_S, headers=headers)
    except OSError as e:  # includes timeouts: the deadline of this request
        return Sent(index, False, error=f"{type(e).__name__}: {e}", sent_s=start)
    elapsed = clock() - start
    meta = reply.get("meta_info") if isinstance(reply, dict) else None
    if status != 200 or not isinstance(meta, dict):
        return Sent(index, False, ttft_s=elapsed, error=f"{status}: {str(reply)[:200]}", sent_s=start)
    details = meta.get("cached_tokens_details")
    out = reply.get("output_ids")
    return Sent(index, True, int(meta.get("cached_tokens") or 0), details if isinstance(details, dict) else None,
                elapsed, output_ids=tuple(out) if isinstance(out, list) else (), sent_s=start)


def _wait_for_row(start: float, t: float, t0: float, speedup: float, clock, sleep) -> None:
    """Sleep until a row at trace time `t` is due: (t - t0) / speedup after `start` (speedup 0: it is due)."""
    if speedup > 0:
        delay = start + (t - t0) / speedup - clock()
        if delay > 0:
            sleep(delay)


def send_rows(send: Callable[[int], Sent], times: Sequence[float], speedup: float, concurrency: int,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
              progress: Optional[Callable] = None) -> List[Sent]:
    """Row i goes out not before (times[i] - times[0]) / speedup (speedup 0: at once), in order, with at most
    `concurrency` in flight. `send(i)` must return within its own deadline; a free slot is awaited at most that
    long plus a margin, after which the row counts as failed rather than hang the run."""
    slots = threading.BoundedSemaphore(concurrency)
    results: List[Optional[Sent]] = [None] * len(times)

    def run(i: int) -> None:
        try:
            results[i] = send(i)
        finally:
            slots.release()
            if progress:
                progress()

    start = clock()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for i, t in enumerate(times):
            _wait_for_row(start, t, times[0], speedup, clock, sleep)
            if not slots.acquire(timeout=REQUEST_DEADLINE_S + 30):
                results[i] = Sent(i, False, error="no free slot within the request deadline")
                continue
            pool.submit(run, i)
    return [r if r is not None else Sent(i, False, error="not sent") for i, r in enumerate(results)]


def send_interleaved(sends: Sequence[Callable[[int], Sent]], times: Sequence[float], speedup: float,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                     progress: Optional[Callable] = None) -> List[List[Sent]]:
    """`--interleave`: row i goes to every server in turn (one request in flight in all), not before its time
    as in send_rows; row i starts with server i mod n, so none is always the one that follows the others'
    prefill. Each server's TTFTs are then taken under the same machine load as the others', row by row, instead
    of minutes apart (this VM's speed drifts by 20% and more between sequential runs). Returns each server's
    answers, in row order."""
    n = len(sends)
    out: List[List[Sent]] = [[] for _ in range(n)]
    start = clock()
    for i, t in enumerate(times):
        _wait_for_row(start, t, times[0], speedup, clock, sleep)
        for j in range(n):
            server = (i + j) % n
            out[server].append(sends[server](i))
        if progress:
            progress()
    return out
