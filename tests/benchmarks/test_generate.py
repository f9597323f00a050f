"""Workload generators: reproducible bytes, valid Mooncake rows, real prefix chaining, tenant isolation."""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import main
from benchmarks.arrivals import load_azure
from benchmarks.trace import parse_rows
from benchmarks.workloads import KINDS, BlockIds

SMALL = ["--sessions", "15", "--requests", "120"]


def generate(tmp_path, kind, seed, *extra) -> bytes:
    out = tmp_path / f"{kind}-{seed}-{len(extra)}.jsonl"
    assert main(["generate", kind, "--seed", str(seed), "--out", str(out), *SMALL, *extra]) == 0
    return out.read_bytes()


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_bytes_and_valid_rows(tmp_path, kind):
    a = generate(tmp_path, kind, 5)
    assert a == generate(tmp_path, kind, 5)
    assert a != generate(tmp_path, kind, 6)
    rows = [json.loads(line) for line in a.decode().splitlines()]
    parse_rows(rows)  # lengths match hash_ids, timestamps do not decrease
    parents = {}
    for r in rows:
        assert set(r) == {"timestamp", "input_length", "output_length", "hash_ids", "session", "ttl_s", "tenant"}
        for i, h in enumerate(r["hash_ids"]):
            parent = (r["tenant"], r["hash_ids"][i - 1] if i else None)
            assert parents.setdefault(h, parent) == parent  # one parent per block: prefix-chained


@pytest.mark.parametrize("kind", KINDS)
def test_tenants_never_share_a_block(tmp_path, kind):
    rows = [json.loads(x) for x in generate(tmp_path, kind, 1, "--tenants", "5", "--zipf", "0.5").splitlines()]
    owner = {}
    for r in rows:
        for h in r["hash_ids"]:
            assert owner.setdefault(h, r["tenant"]) == r["tenant"]
    assert len({r["tenant"] for r in rows}) > 1


def test_chat_turns_extend_their_own_history(tmp_path):
    rows = [json.loads(x) for x in generate(tmp_path, "chat", 2).splitlines()]
    by_session = {}
    for r in rows:
        by_session.setdefault(r["session"], []).append(r)
    multi = [turns for turns in by_session.values() if len(turns) > 1]
    assert multi
    for turns in multi:
        for prev, cur in zip(turns, turns[1:]):
            assert cur["input_length"] > prev["input_length"] + prev["output_length"] - 1
            full = prev["input_length"] // 512  # every full block of the previous prompt is reused
            assert cur["hash_ids"][:full] == prev["hash_ids"][:full]
            assert cur["timestamp"] >= prev["timestamp"]
    assert all(r["ttl_s"] == 300.0 for r in rows)
    no_ttl = [json.loads(x) for x in generate(tmp_path, "chat", 2, "--no-ttl").splitlines()]
    assert all(r["ttl_s"] is None for r in no_ttl)


def test_azure_lengths_are_reproducible_and_capped(tmp_path):
    a = generate(tmp_path, "chat", 4, "--lengths", "azure-conv")
    assert a == generate(tmp_path, "chat", 4, "--lengths", "azure-conv")
    rows = [json.loads(x) for x in a.splitlines()]
    assert all(1 <= r["output_length"] <= 2000 for r in rows)


def test_azure_arrivals_follow_the_trace_gaps(tmp_path):
    rows = [json.loads(x) for x in generate(tmp_path, "tenants", 3, "--arrivals", "azure-code",
                                            "--time-scale", "2").splitlines()]
    times = load_azure("azure-code").times_s
    expected = [round(2 * (t - times[0]) * 1000) for t in times[:120]]
    got = sorted(r["timestamp"] for r in rows)
    assert all(abs(g - e) <= 1 for g, e in zip(got, expected))


def test_block_ids_share_exactly_the_common_prefix():
    ids = BlockIds(block_tokens=4)
    a = ids.hash_ids("t", [("sys", 6), ("u1", 5)])  # blocks: [sys0-4], [sys4-6 u1 0-2], [u1 2-5]
    b = ids.hash_ids("t", [("sys", 6), ("u2", 5)])
    c = ids.hash_ids("other", [("sys", 6), ("u1", 5)])
    assert len(a) == 3 and a[0] == b[0] and a[1] != b[1]
    assert not set(a) & set(c)


def test_tenant_chat_tenants_differ_in_size_and_a_tenants_sessions_share_its_one_system_prompt(tmp_path):
    rows = [json.loads(x) for x in generate(tmp_path, "tenant-chat", 3, "--sessions", "200").splitlines()]
    sessions, first_blocks = {}, {}
    for r in rows:
        sessions.setdefault(r["tenant"], set()).add(r["session"])
        first_blocks.setdefault(r["tenant"], set()).add(r["hash_ids"][0])
    sizes = sorted((len(s) for s in sessions.values()), reverse=True)
    assert len(sizes) == 12  # the kind's default
    assert sizes[0] >= 4 * sizes[-1]  # Zipf: the biggest tenant dwarfs the smallest
    for tenant, blocks in first_blocks.items():
        # one system prompt: every session starts with its first block, unless it is shorter than a block
        assert len(blocks) in (1, len(sessions[tenant])), (tenant, len(blocks), len(sessions[tenant]))
    assert sum(len(b) == 1 for b in first_blocks.values()) >= 6


def test_coding_agents_delegate_to_sub_agents_with_fresh_contexts_and_resume_after_the_last_report(tmp_path):
    rows = [json.loads(x) for x in generate(tmp_path, "coding-agent", 3, "--sessions", "40").splitlines()]
    by_session = {}
    for r in rows:
        by_session.setdefault(r["session"], []).append(r)
    parents = {s: turns for s, turns in by_session.items() if "/" not in s}
    subs = {s: turns for s, turns in by_session.items() if "/" in s}
    assert subs and len(parents) == 40
    for turns in by_session.values():  # every agent, parent or sub-agent, resends its growing transcript
        for prev, cur in zip(turns, turns[1:]):
            full = prev["input_length"] // 512
            assert cur["hash_ids"][:full] == prev["hash_ids"][:full]
    parent_firsts = {turns[0]["hash_ids"][0] for turns in parents.values()}
    sub_firsts = {turns[0]["hash_ids"][0] for turns in subs.values()}
    assert not parent_firsts & sub_firsts  # a sub-agent starts from its own type's prompt, not the parent's
    assert len(sub_firsts) <= 3 < len(subs)  # three types, each one fixed prompt shared by its sub-agents
    resumed = 0
    for sid, turns in subs.items():
        parent, step = sid.split("/")[0], int(sid.split("/")[1].split(".")[0])
        delegated = parents[parent][step]
        later = parents[parent][step + 1:]
        assert all(r["timestamp"] >= delegated["timestamp"] for r in turns)
        if later:  # the parent resumes only once every sub-agent of that step has reported
            siblings = [r for s, t in subs.items() if s.startswith(f"{parent}/{step}.") for r in t]
            assert later[0]["timestamp"] >= max(r["timestamp"] for r in siblings)
            resumed += 1
    assert resumed
