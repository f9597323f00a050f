"""Bad-input fuzz against a live server: `cache_control` of random JSON shapes, salts of random types and
`session_params` junk on all three routes. Every answer is a 200 or a 4xx with a message, within the request
deadline (never a 5xx, never a hang); after a 4xx, `/tiers/stats` is exactly what it was before."""

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.server
ANSWER_DEADLINE_S = 60.0  # a hang shows as a timeout, which post_status raises
SETTLE_DEADLINE_S = 30.0


def settled_stats(server) -> dict:
    """/tiers/stats once two reads in a row agree: the tail of an earlier 200 (its last insert into the tree)
    may land after its HTTP answer, and must not be blamed on the next request."""
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    last = server.get("/tiers/stats")
    while True:
        now = server.get("/tiers/stats")
        if now == last or time.monotonic() > deadline:
            return now
        last = now

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8)
cache_controls = st.one_of(
    json_values,
    st.fixed_dictionaries({"type": st.one_of(st.just("ephemeral"), json_scalars)},
                          optional={"ttl": st.one_of(st.sampled_from(["5m", "1h", "30s", "0s", "-1m", "25h", "5x"]),
                                                     json_scalars),
                                    "scope": json_scalars}),
)
salts = st.one_of(json_values, st.text(min_size=1, max_size=300))
session_params = st.one_of(json_values, st.fixed_dictionaries(
    {"id": st.one_of(st.text(max_size=8), json_scalars)},
    optional={"rid": json_scalars, "offset": json_scalars, "replace": json_scalars, "drop_previous_output": json_scalars}))
MISSING = object()


def body_for(route: str, prompt: str, fields: dict) -> dict:
    if route == "/generate":
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    elif route == "/v1/chat/completions":
        body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    else:
        body = {"model": "default", "prompt": prompt, "max_tokens": 1}
    body.update({k: v for k, v in fields.items() if v is not MISSING})
    return body


def message_of(answer) -> str:
    if isinstance(answer, dict):
        for key in ("message", "detail", "error"):
            if answer.get(key):
                return str(answer[key])
    return answer if isinstance(answer, str) else ""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(["/generate", "/v1/chat/completions", "/v1/completions"]),
       cache_control=st.one_of(st.just(MISSING), cache_controls),
       salt=st.one_of(st.just(MISSING), salts),
       session=st.one_of(st.just(MISSING), session_params),
       where=st.sampled_from(["top", "message"]))
def test_bad_inputs_are_a_200_or_a_clear_4xx_and_a_4xx_changes_nothing(server_a, route, cache_control, salt,
                                                                        session, where):
    fields = {"cache_salt": salt, "session_params": session}
    body = body_for(route, "fuzz the request api", fields)
    if cache_control is not MISSING:
        if where == "message" and route == "/v1/chat/completions":
            body["messages"][0]["cache_control"] = cache_control
        else:
            body["cache_control"] = cache_control
    before = settled_stats(server_a)
    status, answer = server_a.post_status(route, body, timeout=ANSWER_DEADLINE_S)
    assert status == 200 or 400 <= status < 500, f"{status} for {body}: {answer}"
    if status != 200:
        assert message_of(answer), f"{status} without a message for {body}: {answer}"
        assert server_a.get("/tiers/stats") == before, f"a {status} changed /tiers/stats: {body}"
