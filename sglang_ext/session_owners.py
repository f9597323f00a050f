"""An SGLang session belongs to the tenant (`cache_salt`) of its first request.

SGLang 0.5.20's sessions are keyed by their id alone: a request naming another tenant's session id (and one of its
request ids) continued that session, its prompt built of the other tenant's turns, and the tokens then cached under
its own salt (two audits, 2026-12-07: on /generate, then on /vertex_generate once /generate was closed). So the
HTTP process keeps, for each session it saw opened successfully, the salt of the session's first request (None: no
salt), and a later request naming the session with another salt is refused as a session that does not exist, with
SGLang's own words for that, so the answer does not tell that it does.

Where: the check runs in scheduler_guard's hook on the tokenized request, where every route's request meets once
SGLang has built and checked it (a route that carries `session_params` any other way is covered as well; SGLang's
OpenAI routes drop the field, so they neither bind nor are refused); the middleware reports successful opens and
closes (`watch`). Binding at the first request, not at the open: SGLang's /open_session has no `cache_salt`, and a
gateway that adds the tenant's salt to generation requests need not know that route. A session id not in the table
(never opened, closed, or timed out) is refused here too, in the same words: SGLang's scheduler answers such a
request only after a prefill of a dummy token, so a refusal from here (4 ms) against one from there (133 ms; a
streamed answer of another shape) told a tenant that another tenant's session existed (an audit, 2026-12-07). The
table knows every live session: this HTTP process is the only one (the launcher refuses tokenizer workers), and it
forgets a session only once the scheduler has. A successful open of an id (again, after a close or a timeout) makes
it unbound. Left as they are: closing needs only
the id, as in SGLang (a tenant that knows another's session id can end it, not read it); a first request that
SGLang's scheduler then refuses (a grammar that does not compile) still binds the session to its salt.

A session leaves the table when it is closed here, or once SGLang's scheduler has timed it out: a session opened
with a `timeout` is forgotten `SLACK_S` after its last request here plus that timeout (the scheduler counts the
timeout from the request's arrival there, later than here, and reaps about once a second, so the table forgets a
session only after the scheduler has closed it). At most `capacity` sessions are remembered; an open past that is
refused here (`may_open`), never made room for: until 2026-12-07 the oldest opened were forgotten first, and a
flood of opens with tiny timeouts (66,000 in 100 s; the scheduler reaps them, so its cap of open sessions never
binds) pushed a live session out of the table, after which another tenant naming it and one of its request ids
read its turns (an audit). A full table refuses opens, an availability limit, not a leak; the launcher's cap on
open sessions (`--tier-max-open-sessions`, 4,096) is well below the capacity.

Threading: one instance per HTTP process (`OWNERS`), used from its event loop only; time is `clock` (monotonic).
"""

from __future__ import annotations

import heapq
import json
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

UNBOUND = object()
MISSING = object()
DEFAULT_CAPACITY = 65536
SLACK_S = 60.0  # beyond a session's timeout before the table forgets it: the scheduler has reaped it by then
FULL = ("Failed to open the session: {} sessions are open or timed out within the last minute; close sessions "
        "or wait")


class SessionOwners:
    def __init__(self, capacity: int = DEFAULT_CAPACITY, clock: Callable[[], float] = time.monotonic):
        self.capacity = capacity
        self.clock = clock
        self._owners: Dict[str, Any] = {}
        self._timeouts: Dict[str, float] = {}  # the sessions opened with a timeout, which the scheduler reaps
        self._forget_at: Dict[str, float] = {}
        self._expiry: List[Tuple[float, str]] = []  # (forget_at, id), stale entries skipped

    def __contains__(self, session_id: str) -> bool:
        """Whether `session_id` is remembered (opened here, not closed, not yet forgotten)."""
        self._forget_timed_out()
        return session_id in self._owners

    def may_open(self) -> Optional[str]:
        """None if a session may be opened now; otherwise the refusal to answer with (the table is full)."""
        self._forget_timed_out()
        return FULL.format(len(self._owners)) if len(self._owners) >= self.capacity else None

    def opened(self, session_id: str, timeout: Optional[float] = None) -> None:
        """SGLang opened `session_id` (idle `timeout` seconds, or none): its next request's salt owns it."""
        self.closed(session_id)
        self._owners[session_id] = UNBOUND
        if timeout is not None:
            self._timeouts[session_id] = timeout
            self._touch(session_id)

    def closed(self, session_id: str) -> None:
        self._owners.pop(session_id, None)
        self._timeouts.pop(session_id, None)
        self._forget_at.pop(session_id, None)

    def admit(self, session_id: Optional[str], salt: Optional[str]) -> Optional[str]:
        """Bind the session a request names to its salt; the refusal to answer with if another salt owns it."""
        self._forget_timed_out()
        if session_id is None:
            return None
        owner = self._owners.get(session_id, MISSING)
        if owner is UNBOUND:
            self._owners[session_id] = salt
        elif owner is MISSING or owner != salt:
            return f"Invalid request: session id {session_id} does not exist"
        if session_id in self._timeouts:
            self._touch(session_id)
        return None

    def _touch(self, session_id: str) -> None:
        forget_at = self.clock() + self._timeouts[session_id] + SLACK_S
        self._forget_at[session_id] = forget_at
        heapq.heappush(self._expiry, (forget_at, session_id))
        if len(self._expiry) > 2 * len(self._forget_at) + 64:  # refreshes leave stale entries: rebuild
            self._expiry = [(t, s) for s, t in self._forget_at.items()]
            heapq.heapify(self._expiry)

    def _forget_timed_out(self) -> None:
        now = self.clock()
        while self._expiry and self._expiry[0][0] <= now:
            forget_at, session_id = heapq.heappop(self._expiry)
            if self._forget_at.get(session_id) == forget_at:
                self.closed(session_id)

    def watch(self, route: str, request_body: bytes, send: Callable) -> Callable:
        """`send` of an ASGI app answering `route`; a successful /open_session or /close_session is noted."""
        if route not in ("/open_session", "/close_session"):
            return send
        status, chunks = None, []

        async def watched(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if status == 200 and not message.get("more_body", False):
                    self._answered(route, request_body, b"".join(chunks))
            await send(message)

        return watched

    def _answered(self, route: str, request_body: bytes, answer: bytes) -> None:
        try:  # /open_session answers with the id (a JSON string); /close_session with nothing
            body = json.loads(request_body) if request_body else {}
            session_id = json.loads(answer) if route == "/open_session" else body.get("session_id")
        except (ValueError, AttributeError):
            return
        if not isinstance(session_id, str):
            return
        if route == "/close_session":
            return self.closed(session_id)
        timeout = body.get("timeout")  # request_checks let through only a number >= 0 or none
        self.opened(session_id, float(timeout) if isinstance(timeout, (int, float)) else None)


OWNERS = SessionOwners()
