"""HTTP side of the tiered cache: `cache_control` on requests, session default TTLs, and `GET /tiers/stats`.

SGLang 0.5.20 has no `cache_control` field: unknown top-level keys are dropped silently. This ASGI middleware,
installed on SGLang's FastAPI app by the plugin in the HTTP (main) process, reads the request body of
`/generate`, `/v1/chat/completions` and `/v1/completions` before SGLang does and
- validates `cache_control` (top level, or on any chat message) and `cache_salt`; anything invalid is answered
  with HTTP 400 and a message, and the request never reaches the scheduler, so no cache state changes;
- turns a valid one into a retention TTL in seconds carried to the tree cache through SGLang's own
  `custom_params` (`sampling_params.custom_params` for /generate, top-level for the OpenAI routes), a flat
  float under TTL_PARAM: msgspec IPC carries one nesting level only;
- gives requests of an SGLang session (`session_params`) the server's `--tier-session-ttl` when they carry no
  `cache_control` of their own.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional, Tuple

TTL_PARAM = "sglang_ext_ttl_s"
CARRIED_ROUTES = {"/generate": "sampling_params", "/v1/chat/completions": "top", "/v1/completions": "top"}
MAX_SALT_LEN = 256
# SGLang's SessionParams fields and the types it accepts (None is always allowed).
SESSION_FIELDS = {"id": str, "rid": str, "offset": int, "replace": bool, "drop_previous_output": bool}


class BadRequest(ValueError):
    pass


def request_ttl(body: dict, session_ttl_s: Optional[float]) -> Optional[float]:
    """The retention TTL a request asks for (validated), or None. Raises BadRequest."""
    from tiers.retention import parse_cache_control

    blocks = []
    if "cache_control" in body:
        blocks.append(body["cache_control"])
    for message in body.get("messages") or []:
        if isinstance(message, dict) and "cache_control" in message:
            blocks.append(message["cache_control"])
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and "cache_control" in part:
                blocks.append(part["cache_control"])
    salt = body.get("cache_salt")
    salts = salt if isinstance(salt, list) else [salt]
    if salt is not None and not all(isinstance(s, str) and 0 < len(s) <= MAX_SALT_LEN for s in salts):
        raise BadRequest(f"cache_salt must be a non-empty string (or a list of them, for a batch) of at most "
                         f"{MAX_SALT_LEN} characters")
    check_session_params(body.get("session_params"))
    try:
        ttls = [parse_cache_control(block) for block in blocks]
    except ValueError as e:
        raise BadRequest(str(e)) from None
    if ttls:
        return max(ttls)  # one prompt, one retention: the longest asked for covers the whole prefix
    if body.get("session_params") is not None and session_ttl_s:
        return session_ttl_s
    return None


def check_session_params(params) -> None:
    """Refuse malformed `session_params` here, before SGLang's scheduler sees (and half-applies) them."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise BadRequest("session_params must be an object")
    for name, value in params.items():
        expected = SESSION_FIELDS.get(name)
        if expected is None:
            raise BadRequest(f"session_params has an unknown field {name!r}")
        if value is not None and (type(value) is not expected or (expected is int and value < 0)
                                  or (expected is str and not value)):
            raise BadRequest(f"session_params.{name} must be {'a non-negative ' if expected is int else 'a non-empty '}"
                             f"{expected.__name__} or null, got {value!r}")


def strip_cache_control(body: dict) -> None:
    body.pop("cache_control", None)
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            message.pop("cache_control", None)
            if isinstance(message.get("content"), list):
                for part in message["content"]:
                    if isinstance(part, dict):
                        part.pop("cache_control", None)


def carry_ttl(body: dict, route: str, ttl_s: float) -> None:
    if CARRIED_ROUTES[route] == "sampling_params":
        sampling = body.get("sampling_params")
        for params in sampling if isinstance(sampling, list) else [sampling]:
            if params is None:
                params = body.setdefault("sampling_params", {})
            params.setdefault("custom_params", {})[TTL_PARAM] = ttl_s
    else:
        custom = body.get("custom_params")
        body["custom_params"] = {**(custom if isinstance(custom, dict) else {}), TTL_PARAM: ttl_s}


def rewrite(route: str, raw: bytes, session_ttl_s: Optional[float]) -> Tuple[int, bytes]:
    """(status, body): 200 and the body to forward, or 400 and an error body."""
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        return 200, raw  # not JSON: SGLang answers it as it always has
    if not isinstance(body, dict):
        return 200, raw
    try:
        ttl = request_ttl(body, session_ttl_s)
    except BadRequest as e:
        error = {"object": "error", "message": str(e), "type": "BadRequestError", "code": 400}
        return 400, json.dumps(error).encode()
    if ttl is None and "cache_control" not in raw.decode(errors="ignore"):
        return 200, raw
    strip_cache_control(body)
    if ttl is not None:
        carry_ttl(body, route, ttl)
    return 200, json.dumps(body).encode()


class CacheControlMiddleware:
    """Pure ASGI middleware (a body must be read before SGLang's handler and replayed to it)."""

    def __init__(self, app: Callable):
        self.app = app
        self._session_ttl_s = None

    @property
    def session_ttl_s(self) -> Optional[float]:
        # Read at the first request, not at install time: the launcher sets the config after the plugin loads.
        if self._session_ttl_s is None:
            from sglang_ext.tier_config import TierConfig

            self._session_ttl_s = (TierConfig.from_env().session_ttl_s,)
        return self._session_ttl_s[0]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in CARRIED_ROUTES:
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        status, body = rewrite(scope["path"], b"".join(chunks), self.session_ttl_s)
        if status != 200:
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        scope = {**scope, "headers": headers + [(b"content-length", str(len(body)).encode())]}
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def install_http_routes() -> None:
    """Add the middleware and `/tiers/stats` to SGLang's app (HTTP process only, before it starts)."""
    from fastapi.responses import ORJSONResponse
    from sglang.srt.entrypoints import http_server

    app = http_server.app
    if getattr(app.state, "sglang_ext_installed", False):
        return
    app.state.sglang_ext_installed = True
    app.add_middleware(CacheControlMiddleware)

    from sglang.srt.utils.auth import AuthLevel, auth_level

    @app.get("/tiers/stats")
    @auth_level(AuthLevel.ADMIN_OPTIONAL)  # with --admin-api-key set, only the operator reads it
    async def tiers_stats():
        states = await http_server._global_state.tokenizer_manager.get_internal_state()
        ranks = [s.get("tiers") for s in states if isinstance(s, dict)]
        return ORJSONResponse({"ranks": ranks} if len(ranks) != 1 else ranks[0] or {})


def attach_stats_to_internal_state(result: Any, scheduler, *args, **kwargs) -> Any:
    """AFTER hook on Scheduler.get_internal_state: add the tree cache's tier counters under "tiers"."""
    state = getattr(result, "internal_state", None)  # a GetInternalStateReqOutput
    if isinstance(state, dict):
        cache = scheduler.tree_cache
        stats = getattr(cache, "tier_stats_dict", None)
        state["tiers"] = {"cache": type(cache).__name__, **(stats() if callable(stats) else {}),
                          "locks": tree_lock_summary(cache)}
    return result


def tree_lock_summary(cache) -> dict:
    """Nodes still locked by requests (lock_ref > 0, root excluded) and the tokens they pin: both must be 0
    whenever no request is running, or a lock leaked. A scan: only for this on-demand endpoint."""
    root = getattr(cache, "root_node", None)
    if root is None:
        return {}
    nodes = tokens = 0
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        if node.lock_ref > 0:
            nodes += 1
            tokens += len(node.key)
        stack.extend(node.children.values())
    return {"locked_nodes": nodes, "locked_tokens": tokens,
            "protected_size": int(getattr(cache, "protected_size_", 0) or 0)}
