"""HTTP side of the tiered cache: `cache_control` on requests, session default TTLs, and `GET /tiers/stats`.

SGLang 0.5.20 has no `cache_control` field: unknown top-level keys are dropped silently. This ASGI middleware,
installed on SGLang's FastAPI app by the plugin in the HTTP (main) process, reads the request body of
`/generate` (POST or PUT), `/v1/chat/completions` (and SageMaker's `/invocations`, the same route under another
name), `/v1/completions` and Anthropic's `/v1/messages` before SGLang does and
- validates `cache_control` (top level, or wherever Anthropic's API puts it: a chat message, a content block, a
  `system` block, a tool), and the fields request_checks bounds
  (`cache_salt`, `session_params`, `sampling_params`, `n`, token ids, logprob fields, per-prompt lists, prompt
  length, ...; also the ids sent to /detokenize, the bodies of /open_session and /close_session, and the
  /generate request that Vertex AI's /vertex_generate builds); anything invalid is answered with HTTP 400 and a
  message, and the request never reaches the scheduler, so no cache state changes (SGLang's other generation
  routes are checked where they all meet, before the scheduler: scheduler_guard);
- turns a valid one into a retention TTL in seconds carried to the tree cache through SGLang's own
  `custom_params` (`sampling_params.custom_params` for /generate, top-level for the OpenAI routes), a flat
  float under TTL_PARAM: msgspec IPC carries one nesting level only. SGLang builds the chat request of
  `/v1/messages` from a fixed list of its fields, so there the TTL travels in the request's `metadata` and an AFTER
  hook on that conversion (`carry_metadata_to_chat`) puts it into the chat request's `custom_params`. The same list
  has no `cache_salt`: SGLang dropped a tenant's salt there, and tenants hit each other's prompts (648 of 650
  tokens; an audit, 2026-12-07), so the salt travels in `metadata` too, and the hook sets the chat request's;
- gives requests of an SGLang session (`session_params`) the server's `--tier-session-ttl` when they carry no
  `cache_control` of their own; tells session_owners which sessions opened and closed, and refuses an open
  while its table is full.
The internal keys (INTERNAL_PARAMS) are ours alone: on every route, any copy a client put anywhere in its JSON body
(top level, `sampling_params.custom_params`, an OpenAI `extra_body`, any depth) is removed before the middleware
sets its own, so a client can reach the scheduler's retention only through a validated `cache_control`. A body
nested too deeply to parse is a 400. The scheduler checks the value once more (serving_cache.request_ttl_s).
Every request's body is read whole before SGLang sees it, whatever the method (SGLang's session and admin routes
read a JSON body on GET too: a GET went past every check until 2026-12-05), so its size is capped
(`--tier-max-request-mb`): a larger one is a 413 before the rest of it is read.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional, Tuple

from sglang_ext import other_route_checks
from sglang_ext.other_route_checks import check_headers
from sglang_ext.request_checks import CHECKED_ROUTES, BadRequest, ModelLimits, check_cache_key, check_request
from sglang_ext.session_owners import OWNERS

TTL_PARAM = "sglang_ext_ttl_s"
SALT_PARAM = "sglang_ext_cache_salt"  # a /v1/messages request's cache_salt, in its metadata
INTERNAL_PARAMS = (TTL_PARAM, SALT_PARAM)
INTERNAL_PREFIX = b"sglang_ext_"
CARRIED_ROUTES = {"/generate": "sampling_params", "/v1/chat/completions": "top", "/v1/completions": "top",
                  "/v1/messages": "metadata"}
ANTHROPIC_CONVERSION = "sglang.srt.entrypoints.anthropic.serving.AnthropicServing._convert_to_chat_completion_request"
ROUTE_ALIASES = {"/invocations": "/v1/chat/completions"}  # SageMaker's: the chat route's body and handler
MISSING = object()
NOT_JSON = object()


def request_ttl(body: dict, session_ttl_s: Optional[float]) -> Optional[float]:
    """The retention TTL a request asks for (validated), or None. Raises BadRequest."""
    from tiers.retention import parse_cache_control

    try:
        ttls = [parse_cache_control(holder["cache_control"]) for holder in cache_control_holders(body)
                if "cache_control" in holder]
    except ValueError as e:
        raise BadRequest(str(e)) from None
    if ttls:
        return max(ttls)  # one prompt, one retention: the longest asked for covers the whole prefix
    if body.get("session_params") is not None and session_ttl_s:
        return session_ttl_s
    return None


def cache_control_holders(body: dict) -> list:
    """The objects that may carry a `cache_control`: the body, its messages and their content parts, and Anthropic's
    `system` blocks and tools (anything of another shape is SGLang's to refuse)."""
    def dicts(value) -> list:
        return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []

    messages = dicts(body.get("messages"))
    parts = [part for message in messages for part in dicts(message.get("content"))]
    return [body, *messages, *parts, *dicts(body.get("system")), *dicts(body.get("tools"))]


def strip_cache_control(body: dict) -> None:
    for holder in cache_control_holders(body):
        holder.pop("cache_control", None)


def carry_ttl(body: dict, route: str, ttl_s: float) -> None:
    if CARRIED_ROUTES[route] == "metadata":
        metadata = body.get("metadata")
        if metadata is None or isinstance(metadata, dict):  # else SGLang's to refuse, as sent
            body["metadata"] = {**(metadata or {}), TTL_PARAM: ttl_s}
        return
    if CARRIED_ROUTES[route] == "sampling_params":
        sampling = body.get("sampling_params")
        if isinstance(sampling, list):
            body["sampling_params"] = [{**(p or {}), "custom_params": {**((p or {}).get("custom_params") or {}),
                                                                       TTL_PARAM: ttl_s}} for p in sampling]
            return
        params = sampling if isinstance(sampling, dict) else {}
        body["sampling_params"] = {**params, "custom_params": {**(params.get("custom_params") or {}), TTL_PARAM: ttl_s}}
    else:
        custom = body.get("custom_params")
        body["custom_params"] = {**(custom if isinstance(custom, dict) else {}), TTL_PARAM: ttl_s}


def carry_salt_in_metadata(body: dict) -> bool:
    """/v1/messages: move the request's `cache_salt` into its `metadata` (SGLang drops the field there); True if
    there was one. Raises BadRequest for a salt that is not one string (one conversation, one tenant)."""
    salt = body.pop("cache_salt", None)
    if salt is None:
        return False
    if not isinstance(salt, str):
        raise BadRequest("cache_salt must be a string on /v1/messages")
    check_cache_key(salt, "cache_salt")
    metadata = body.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise BadRequest("metadata must be an object")
    body["metadata"] = {**(metadata or {}), SALT_PARAM: salt}
    return True


def strip_internal_params(body: Any) -> bool:
    """Remove every INTERNAL_PARAMS key a client put anywhere in a parsed JSON body; True if any was there.
    Iterative: a hostile body's depth cannot exhaust the stack here."""
    found, stack = False, [body]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in INTERNAL_PARAMS:
                found |= node.pop(key, MISSING) is not MISSING
            stack.extend(node.values())
        elif isinstance(node, list):  # only containers can hold a key: a token id list adds nothing to walk
            stack.extend([x for x in node if isinstance(x, (dict, list))])
    return found


def may_carry_internal_params(raw: bytes) -> bool:
    """Cheap pre-check for routes we do not rewrite: could this body name an internal key (also through JSON
    escapes)?"""
    return INTERNAL_PREFIX in raw or b"\\u" in raw


def parse_body(raw: bytes) -> Any:
    """The JSON body, or NOT_JSON for anything SGLang should answer itself. Raises BadRequest when the body is
    JSON nested too deeply to parse (SGLang's own parser would fail on it too, with a 5xx)."""
    try:
        return json.loads(raw) if raw else {}
    except RecursionError:
        raise BadRequest("the JSON body is nested too deeply") from None
    except ValueError:
        return NOT_JSON


def bad_request(message: str, status: int = 400) -> Tuple[int, bytes]:
    error = {"object": "error", "message": message, "type": "BadRequestError", "code": status}
    return status, json.dumps(error).encode()


def too_large(cap: int) -> Tuple[int, bytes]:
    return bad_request(f"the request body is over {cap >> 20} MiB (--tier-max-request-mb)", 413)


def declared_length(scope: dict) -> int:
    """The body's Content-Length, or 0 when none (or an unreadable one) was sent; h11 refuses those itself."""
    for k, v in scope.get("headers", []):
        if k.lower() == b"content-length":
            try:
                return int(v)
            except ValueError:
                return 0
    return 0


async def answer(send: Callable, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def rewrite(route: str, raw: bytes, session_ttl_s: Optional[float],
            limits: Optional[ModelLimits] = None) -> Tuple[int, bytes]:
    """(status, body): 200 and the body to forward, or 400 and an error body. `route` outside CARRIED_ROUTES:
    only client-supplied internal keys are removed (and a body of CHECKED_ROUTES or other_route_checks.ROUTES is
    checked)."""
    route = ROUTE_ALIASES.get(route, route)
    carried = route in CARRIED_ROUTES
    other = route in other_route_checks.ROUTES
    checked = carried or other or route in CHECKED_ROUTES
    if not checked and not may_carry_internal_params(raw):
        return 200, raw
    try:
        body = parse_body(raw)
        if body is NOT_JSON:
            return 200, raw  # SGLang answers it as it always has
        stripped = may_carry_internal_params(raw) and strip_internal_params(body)  # no walk when none can be there
        if checked and isinstance(body, dict):
            (other_route_checks.check_route if other else check_request)(body, route, limits)
        if not (carried and isinstance(body, dict)):
            return 200, json.dumps(body).encode() if stripped else raw
        ttl = request_ttl(body, session_ttl_s)
        salted = route == "/v1/messages" and carry_salt_in_metadata(body)
    except BadRequest as e:
        return bad_request(str(e))
    if ttl is None and not (stripped or salted) and "cache_control" not in raw.decode(errors="ignore"):
        return 200, raw
    strip_cache_control(body)
    if ttl is not None:
        carry_ttl(body, route, ttl)
    return 200, json.dumps(body).encode()


class CacheControlMiddleware:
    """Pure ASGI middleware (a body must be read before SGLang's handler and replayed to it)."""

    def __init__(self, app: Callable):
        self.app = app
        self._config = None
        self._limits: Optional[ModelLimits] = None

    @property
    def config(self):
        # Read at the first request, not at install time: the launcher sets the config after the plugin loads.
        if self._config is None:
            from sglang_ext.tier_config import TierConfig

            self._config = TierConfig.from_env()
        return self._config

    @property
    def limits(self) -> Optional[ModelLimits]:
        """The served model's vocabulary, width and context, from SGLang's tokenizer manager once it exists."""
        if self._limits is None:
            from sglang.srt.entrypoints import http_server

            config = getattr(getattr(http_server._global_state, "tokenizer_manager", None), "model_config", None)
            if config is not None:
                self._limits = ModelLimits(int(config.vocab_size), int(config.hidden_size), int(config.context_len))
        return self._limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        cap = self.config.max_request_mb << 20
        if declared_length(scope) > cap:  # refused before a byte of the body is read
            return await answer(send, *too_large(cap))
        chunks, more, size = [], True, 0
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > cap:  # a chunked body (no length declared) that outgrows the cap: the rest is never read
                return await answer(send, *too_large(cap))
            more = message.get("more_body", False)
        try:
            check_headers(scope.get("headers", []))
        except BadRequest as e:
            return await answer(send, *bad_request(str(e)))
        status, body = rewrite(scope["path"], b"".join(chunks), self.config.session_ttl_s, self.limits)
        if status != 200:
            return await answer(send, status, body)
        full = OWNERS.may_open() if scope["path"] == "/open_session" else None
        if full is not None:
            return await answer(send, *bad_request(full))
        send = OWNERS.watch(scope["path"], body, send)
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


def carry_metadata_to_chat(chat_request: Any, serving: Any, anthropic_request: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER hook on SGLang's conversion of a `/v1/messages` request into a chat request: the TTL and the salt this
    middleware put into its `metadata` (a client's own copies were removed before) go to the chat request's
    `custom_params` and `cache_salt`."""
    metadata = getattr(anthropic_request, "metadata", None)
    metadata = metadata if isinstance(metadata, dict) else {}
    if metadata.get(TTL_PARAM) is not None:
        chat_request.custom_params = {**(chat_request.custom_params or {}), TTL_PARAM: metadata[TTL_PARAM]}
    if metadata.get(SALT_PARAM) is not None:
        chat_request.cache_salt = metadata[SALT_PARAM]


def install_http_routes() -> None:
    """Add the middleware and `/tiers/stats` to SGLang's app (HTTP process only, before it starts)."""
    from fastapi.responses import ORJSONResponse, Response
    from sglang.srt.entrypoints import http_server

    app = http_server.app
    if getattr(app.state, "sglang_ext_installed", False):
        return
    app.state.sglang_ext_installed = True
    app.add_middleware(CacheControlMiddleware)

    from sglang_ext.scheduler_guard import RefusedRequest

    @app.exception_handler(RefusedRequest)
    async def refused(_request, exc: RefusedRequest):  # the routes that let a ValueError through as a 500
        status, body = bad_request(str(exc))
        return Response(body, status_code=status, media_type="application/json")

    from sglang.srt.utils.auth import AuthLevel, auth_level

    @app.get("/tiers/stats")
    @auth_level(AuthLevel.ADMIN_OPTIONAL)  # with --admin-api-key set, only the operator reads it
    async def tiers_stats():
        status, body = tiers_stats_reply(await http_server._global_state.tokenizer_manager.get_internal_state())
        return ORJSONResponse(body, status_code=status)


def tiers_stats_reply(states: Any) -> Tuple[int, dict]:
    """(status, body) of `/tiers/stats` from the schedulers' internal states: one rank's tier stats, or all
    ranks'. Never an empty body: a rank without tier stats is a 503 that says why."""
    states = states if isinstance(states, list) else []
    ranks = [s.get("tiers") if isinstance(s, dict) else None for s in states]
    if not ranks:
        return 503, {"error": "no scheduler answered get_internal_state"}
    missing = [i for i, r in enumerate(ranks) if not isinstance(r, dict)]
    if missing:
        return 503, {"error": f"scheduler rank(s) {missing} sent no tier stats: the sglang_ext hook on "
                              "Scheduler.get_internal_state did not run (plugin not loaded there, or refused "
                              "an SGLang whose interface changed: see the server log)"}
    return 200, ranks[0] if len(ranks) == 1 else {"ranks": ranks}


def attach_stats_to_internal_state(result: Any, scheduler, *args, **kwargs) -> Any:
    """AFTER hook on Scheduler.get_internal_state: add the tree cache's tier counters under "tiers"."""
    state = getattr(result, "internal_state", None)  # a GetInternalStateReqOutput
    if isinstance(state, dict):
        cache = scheduler.tree_cache
        stats = getattr(cache, "tier_stats_dict", None)
        own = stats() if callable(stats) else {"error": f"{type(cache).__name__} is not the tiered cache: no tier "
                                                         "stats (--radix-cache-backend tiered not set?)"}
        state["tiers"] = {"cache": type(cache).__name__, **own, "locks": tree_lock_summary(cache)}
    return result


def tree_lock_summary(cache) -> dict:
    """Nodes still locked by requests (lock_ref > 0, root excluded) and the tokens they pin: both must be 0
    whenever no request is running, or a lock leaked. A scan: only for this on-demand endpoint."""
    root = getattr(cache, "root_node", None)
    if root is None:
        return {}
    nodes = tokens = 0
    stack = list(getattr(root, "children", {}).values())
    while stack:
        node = stack.pop()
        lock = getattr(node, "lock_ref", None)
        if not isinstance(lock, int):  # a tree cache of another kind (SGLang's unified tree): no summary
            return {}
        if lock > 0:
            nodes += 1
            tokens += len(node.key)
        stack.extend(node.children.values())
    return {"locked_nodes": nodes, "locked_tokens": tokens,
            "protected_size": int(getattr(cache, "protected_size_", 0) or 0)}
