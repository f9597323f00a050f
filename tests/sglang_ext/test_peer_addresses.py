"""One parser of peer addresses, for the launcher's `--tier-peers` and the peer storage backend alike."""

import pytest

from sglang_ext import peer_storage, tier_config
from sglang_ext.tier_config import TierConfig, TierConfigError, parse_peers


def test_the_launcher_and_the_storage_backend_share_one_parser():
    assert peer_storage.parse_peers is tier_config.parse_peers


def test_addresses_parse_to_host_and_port():
    assert parse_peers("127.0.0.1:5, h:6") == [("127.0.0.1", 5), ("h", 6)]
    assert parse_peers(["[::1]:7"]) == [("[::1]", 7)]


@pytest.mark.parametrize("bad", ["", "h", ":5", "h:0", "h:65536", "h:x", "h:²", "h:5,h:05", ["h:5", 5]])
def test_a_bad_address_list_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="peer"):
        parse_peers(bad)


def test_the_same_peer_written_twice_is_refused_by_the_launcher_too():
    with pytest.raises(TierConfigError, match="--tier-peers: a peer is listed twice"):
        TierConfig(peers=("h:5", "h:05")).validate()
