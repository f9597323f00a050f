"""Sessions belong to the tenant of their first request (session_owners); the server-side counterpart is
tests/reliability/test_isolation.py::test_a_tenant_cannot_continue_another_tenants_session."""

import asyncio
import json

import pytest

from sglang_ext.request_checks import BadRequest
from sglang_ext.session_owners import SessionOwners


def turn(session_id="s", salt=None):
    body = {"text": "x", "session_params": {"id": session_id}}
    if salt is not None:
        body["cache_salt"] = salt
    return body


def test_the_first_request_after_the_open_owns_the_session_and_another_salt_is_told_it_does_not_exist():
    owners = SessionOwners()
    owners.opened("s")
    owners.admit(turn(salt="a"))
    owners.admit(turn(salt="a"))
    for other in ("b", None, ["a"]):
        with pytest.raises(BadRequest, match="session id s does not exist"):
            owners.admit(turn(salt=other))


def test_a_session_without_a_salt_belongs_to_requests_without_one():
    owners = SessionOwners()
    owners.opened("s")
    owners.admit(turn())
    with pytest.raises(BadRequest):
        owners.admit(turn(salt="a"))


def test_an_id_never_seen_opened_is_left_to_sglang_and_a_reopened_one_is_unbound_again():
    owners = SessionOwners()
    owners.admit(turn(salt="b"))  # not opened here: SGLang answers for it; and nothing is bound
    owners.opened("s")
    owners.admit(turn(salt="a"))
    owners.closed("s")
    owners.admit(turn(salt="b"))
    owners.opened("s")
    owners.admit(turn(salt="b"))
    with pytest.raises(BadRequest):
        owners.admit(turn(salt="a"))


def test_the_oldest_opened_sessions_are_forgotten_past_the_capacity():
    owners = SessionOwners(capacity=2)
    for session_id in ("s1", "s2", "s3"):
        owners.opened(session_id)
        owners.admit(turn(session_id, salt="a"))
    owners.admit(turn("s1", salt="b"))  # forgotten: left to SGLang
    with pytest.raises(BadRequest):
        owners.admit(turn("s2", salt="b"))


def answered(owners, route, request, status, answer):
    sent = []

    async def send(message):
        sent.append(message)

    async def run():
        watched = owners.watch(route, json.dumps(request).encode(), send)
        await watched({"type": "http.response.start", "status": status, "headers": []})
        await watched({"type": "http.response.body", "body": answer, "more_body": False})

    asyncio.run(run())
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]


def test_successful_opens_and_closes_are_noted_and_failed_ones_are_not():
    owners = SessionOwners()
    answered(owners, "/open_session", {"capacity_of_str_len": 100}, 400, b'{"message": "already open"}')
    owners.admit(turn("s1", salt="a"))
    answered(owners, "/open_session", {"capacity_of_str_len": 100}, 200, b'"s1"')  # SGLang's id, as JSON
    owners.admit(turn("s1", salt="a"))
    with pytest.raises(BadRequest):
        owners.admit(turn("s1", salt="b"))
    answered(owners, "/close_session", {"session_id": "s1"}, 200, b"")
    owners.admit(turn("s1", salt="b"))
