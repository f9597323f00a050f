"""An SGLang session belongs to the tenant (`cache_salt`) of its first request.

SGLang 0.5.20's sessions are keyed by their id alone: a request naming another tenant's session id (and one of its
request ids) continued that session, its prompt built of the other tenant's turns, and the tokens then cached under
its own salt (an audit, 2026-12-07). The HTTP middleware keeps, for each session it saw open successfully, the salt
of the session's first request (None: no salt); a later request naming the session with another salt is answered
as a session that does not exist, with SGLang's own words for that, so the answer does not tell that it does.

Binding at the first request, not at the open: SGLang's /open_session has no `cache_salt`, and a gateway that adds
the tenant's salt to generation requests need not know that route. A session id the middleware never saw opened
(one opened before a restart, or one that does not exist) is not bound: SGLang answers for it as it always has. A
successful open of an id (again, after a close or a timeout) makes it unbound. Closing is left to SGLang (it
carries no salt): a tenant that knows another's session id can close it, which loses that session, never shows it.

At most `capacity` sessions are remembered (the oldest opened are forgotten first: a session SGLang timed out
is never closed here); the launcher caps open sessions well below it (`--tier-max-open-sessions`).

Threading: one instance per HTTP process, used from its event loop only.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Callable, Hashable, Optional

from sglang_ext.request_checks import BadRequest

UNBOUND = object()
DEFAULT_CAPACITY = 65536


def tenant_of(salt: Any) -> Hashable:
    """A request's tenant: its `cache_salt` (a batch's list of them as a tuple), None for none."""
    return tuple(salt) if isinstance(salt, list) else salt


def session_id_of(body: dict) -> Optional[str]:
    params = body.get("session_params")
    session_id = params.get("id") if isinstance(params, dict) else None
    return session_id if isinstance(session_id, str) else None


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

    def admit(self, body: dict) -> None:
        """Bind the session a request names to its salt, or raise BadRequest if another salt owns it."""
        session_id = session_id_of(body)
        if session_id is None or session_id not in self._owners:
            return
        owner, tenant = self._owners[session_id], tenant_of(body.get("cache_salt"))
        if owner is UNBOUND:
            self._owners[session_id] = tenant
        elif owner != tenant:
            raise BadRequest(f"Invalid request: session id {session_id} does not exist")

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
