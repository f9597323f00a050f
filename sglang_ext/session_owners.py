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
gateway that adds the tenant's salt to generation requests need not know that route. A session id never seen opened
(one opened before a restart, or one that does not exist) is not bound: SGLang answers for it as it always has. A
successful open of an id (again, after a close or a timeout) makes it unbound. Left as they are: closing needs only
the id, as in SGLang (a tenant that knows another's session id can end it, not read it); a first request that
SGLang's scheduler then refuses (a grammar that does not compile) still binds the session to its salt.

At most `capacity` sessions are remembered (the oldest opened are forgotten first, and left to SGLang: a session
SGLang timed out is never closed here); the launcher's default cap on open sessions (`--tier-max-open-sessions`,
4,096) is well below it.

Threading: one instance per HTTP process (`OWNERS`), used from its event loop only.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Callable, Optional

UNBOUND = object()
DEFAULT_CAPACITY = 65536


class SessionOwners:
    def __init__(self, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self._owners: "OrderedDict[str, Any]" = OrderedDict()

    def opened(self, session_id: str) -> None:
        """SGLang opened `session_id`: its next request's salt owns it."""
        self._owners.pop(session_id, None)
        self._owners[session_id] = UNBOUND
        while len(self._owners) > self.capacity:
            self._owners.popitem(last=False)

    def closed(self, session_id: str) -> None:
        self._owners.pop(session_id, None)

    def admit(self, session_id: Optional[str], salt: Optional[str]) -> Optional[str]:
        """Bind the session a request names to its salt; the refusal to answer with if another salt owns it."""
        if session_id is None or session_id not in self._owners:
            return None
        owner = self._owners[session_id]
        if owner is UNBOUND:
            self._owners[session_id] = salt
        elif owner != salt:
            return f"Invalid request: session id {session_id} does not exist"
        return None

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
            session_id = json.loads(answer if route == "/open_session" else request_body)
        except ValueError:
            return
        if route == "/close_session":
            session_id = session_id.get("session_id") if isinstance(session_id, dict) else None
        if isinstance(session_id, str):
            (self.opened if route == "/open_session" else self.closed)(session_id)


OWNERS = SessionOwners()
