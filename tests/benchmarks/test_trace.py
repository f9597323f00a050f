"""benchmarks.trace: block ids must be prefix-chained, and the shared traces are."""

import pytest

from benchmarks.trace import load_trace, parse_rows


def row(t, hash_ids, **extra):
    return {"timestamp": t, "input_length": 512 * len(hash_ids), "output_length": 1, "hash_ids": hash_ids, **extra}


def test_rows_that_share_a_prefix_load():
    trace = parse_rows([row(0, [1, 2, 3]), row(1, [1, 2, 4]), row(2, [1, 2])])
    assert [r.blocks for r in trace.requests] == [(0, 1, 2), (0, 1, 3), (0, 1)]


def test_a_block_after_a_different_parent_is_an_error_naming_the_row():
    with pytest.raises(ValueError, match=r"row 3: hash id 3 follows hash id 9 here but hash id 2 in row 1"):
        parse_rows([row(0, [1, 2, 3]), row(1, [1, 2]), row(2, [1, 9, 3])])


def test_a_block_that_started_a_prompt_cannot_follow_another_block():
    with pytest.raises(ValueError, match=r"row 2: hash id 5 follows hash id 1 here but the start of a prompt in row 1"):
        parse_rows([row(0, [5, 6]), row(1, [1, 5])])


def test_tenants_may_reuse_hash_ids_with_different_parents():
    trace = parse_rows([row(0, [1, 2], tenant="a"), row(1, [3, 2], tenant="b")])
    assert trace.requests[0].blocks[1] != trace.requests[1].blocks[1]


@pytest.mark.parametrize("name", ["conversation", "synthetic"])
def test_the_shared_traces_are_prefix_chained(name):
    assert len(load_trace(name).requests) > 1000
