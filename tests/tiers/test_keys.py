import os

import pytest
from hypothesis import given, strategies as st

from tiers.keys import Namespace, block_keys, scope_storage_key

tokens = st.lists(st.integers(0, 2**31), min_size=4, max_size=40)


@given(tokens, st.text(min_size=0, max_size=8), st.text(min_size=0, max_size=8))
def test_two_tenants_never_share_a_block(toks, s1, s2):
    if s1 == s2:
        return
    a = block_keys(Namespace("m", cache_salt=s1), toks, 4)
    b = block_keys(Namespace("m", cache_salt=s2), toks, 4)
    assert not set(a) & set(b)


@given(tokens)
def test_model_revision_change_never_hits_old_blocks(toks):
    a = block_keys(Namespace("m", revision="r1"), toks, 4)
    b = block_keys(Namespace("m", revision="r2"), toks, 4)
    c = block_keys(Namespace("m", revision="r1", kv_dtype="fp8"), toks, 4)
    assert not set(a) & set(b) and not set(a) & set(c)


def test_keys_are_chained_and_stable():
    ns = Namespace("m")
    a = block_keys(ns, [1, 2, 3, 4, 5], 2)
    assert len(a) == 2 and all(len(k) == 64 for k in a)
    assert block_keys(ns, [1, 2, 3, 4], 2) == a
    assert block_keys(ns, [9, 2, 3, 4], 2)[1] != a[1]  # a block's key depends on everything before it


def test_salt_none_differs_from_empty():
    assert Namespace("m").digest != Namespace("m", cache_salt="").digest


def test_scope_storage_key():
    k = "ab" * 32
    assert scope_storage_key(Namespace("m"), k).endswith(k)
    assert scope_storage_key(Namespace("m"), k) != scope_storage_key(Namespace("m", cache_salt="t"), k)
    with pytest.raises(ValueError, match="64 lowercase hex"):
        scope_storage_key(Namespace("m"), "xyz")


def test_bad_namespace():
    with pytest.raises(ValueError):
        Namespace("")
    with pytest.raises(ValueError):
        Namespace("m", page_size=0)


def test_weights_revision_changes_when_weights_are_rewritten_in_place(tmp_path):
    from tiers.keys import weights_revision

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x01" * 64)
    (tmp_path / "config.json").write_text("{}")
    os.utime(weights, ns=(1_000_000_000, 1_000_000_000))
    first = weights_revision(str(tmp_path))
    assert first and weights_revision(str(tmp_path)) == first  # stable while nothing changes
    weights.write_bytes(b"\x02" * 64)  # same path, same size, new bytes and a new modification time
    os.utime(weights, ns=(2_000_000_000, 2_000_000_000))
    assert weights_revision(str(tmp_path)) != first
    assert weights_revision(str(tmp_path / "no-such-dir")) == ""
    ns = [Namespace("m", revision=r) for r in (first, weights_revision(str(tmp_path)))]
    assert block_keys(ns[0], list(range(8)), 4) != block_keys(ns[1], list(range(8)), 4)
