"""The peer's field checks on lists of strings (tiers/peer/requests.py), in process.

Guards: the joined check over a whole list (the fast path) accepts exactly what the per-item check
accepts, and a list with one bad item still fails with an error naming that item, wherever it sits.
"""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tiers.peer import requests
from tiers.peer.protocol import PeerError

KEYS = st.lists(st.text(string.hexdigits, min_size=1, max_size=64), max_size=40)
BAD = {
    "not a string": 7,
    "too long": "k" * (requests.MAX_KEY_CHARS + 1),
    "holds NUL": "ab\x00cd",
    "a lone surrogate": "ab\ud800",
}


@given(KEYS)
def test_good_keys_pass_as_they_came(keys):
    assert requests.keys({"keys": keys}) == keys


@pytest.mark.parametrize("bad", sorted(BAD))
@given(keys=KEYS.filter(bool), where=st.integers(0, 39))
def test_one_bad_key_fails_and_is_named(bad, keys, where):
    where %= len(keys) + 1
    keys = keys[:where] + [BAD[bad]] + keys[where:]
    with pytest.raises(PeerError, match=rf"'keys\[{where}\]'"):
        requests.keys({"keys": keys})


def test_a_key_at_the_length_limit_passes():
    keys = ["k" * requests.MAX_KEY_CHARS, "a"]
    assert requests.keys({"keys": keys}) == keys
