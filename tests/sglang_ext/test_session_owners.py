"""Sessions belong to the tenant of their first request (session_owners); the server-side counterpart is
tests/reliability/test_isolation.py::test_a_tenant_cannot_continue_another_tenants_session."""

import asyncio
import json

from sglang_ext.session_owners import SessionOwners

REFUSED = "Invalid request: session id s does not exist"


def test_the_first_request_after_the_open_owns_the_session_and_another_salt_is_told_it_does_not_exist():
    owners = SessionOwners()
    owners.opened("s")
    assert owners.admit("s", "a") is None
    assert owners.admit("s", "a") is None
    for other in ("b", None):
        assert owners.admit("s", other) == REFUSED


def test_a_session_without_a_salt_belongs_to_requests_without_one():
    owners = SessionOwners()
    owners.opened("s")
    assert owners.admit("s", None) is None
    assert owners.admit("s", "a") == REFUSED


def test_an_id_never_seen_opened_is_left_to_sglang_and_a_reopened_one_is_unbound_again():
    owners = SessionOwners()
    assert owners.admit("s", "b") is None  # not opened here: SGLang answers for it; and nothing is bound
    assert owners.admit(None, "b") is None  # no session at all
    owners.opened("s")
    assert owners.admit("s", "a") is None
    owners.closed("s")
    assert owners.admit("s", "b") is None
    owners.opened("s")
    assert owners.admit("s", "b") is None
    assert owners.admit("s", "a") == REFUSED


def test_the_oldest_opened_sessions_are_forgotten_past_the_capacity():
    owners = SessionOwners(capacity=2)
    for session_id in ("s1", "s2", "s3"):
        owners.opened(session_id)
        assert owners.admit(session_id, "a") is None
    assert owners.admit("s1", "b") is None  # forgotten: left to SGLang
    assert owners.admit("s2", "b") is not None


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
    assert owners.admit("s1", "a") is None
    answered(owners, "/open_session", {"capacity_of_str_len": 100}, 200, b'"s1"')  # SGLang's id, as JSON
    assert owners.admit("s1", "a") is None
    assert owners.admit("s1", "b") is not None
    answered(owners, "/close_session", {"session_id": "s1"}, 200, b"")
    assert owners.admit("s1", "b") is None
