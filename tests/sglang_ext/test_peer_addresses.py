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


def test_the_peer_prefetch_threshold_reaches_hicache_through_the_storage_config():
    """SGLang reads `prefetch_threshold` out of the storage backend's extra config (and hands the rest to the
    backend): what `--tier-peer-prefetch-threshold` sets is what HiCache uses."""
    import json

    from sglang.srt.mem_cache.hiradix_cache import HiRadixCache

    for threshold in (8, 256):
        args = TierConfig(peers=("h:5",), peer_prefetch_threshold=threshold).validate().storage_args()
        extra = args[args.index("--hicache-storage-backend-extra-config") + 1]
        config, used, _, _ = HiRadixCache._parse_storage_backend_extra_config(None, extra)
        assert used == threshold
        assert "prefetch_threshold" not in config and json.loads(extra)["peers"] == "h:5"


@pytest.mark.parametrize("bad", [0, -1, (1 << 20) + 1, 2.5, True, "8"])
def test_a_bad_peer_prefetch_threshold_is_refused_naming_the_flag(bad):
    with pytest.raises(TierConfigError, match="--tier-peer-prefetch-threshold"):
        TierConfig(peer_prefetch_threshold=bad).validate()


def test_the_peer_timeout_reaches_the_peer_storage_backend():
    """`--tier-peer-timeout` is the deadline PeerStorage gives each call: it travels in the extra config that
    SGLang hands the backend."""
    from sglang.srt.mem_cache.hiradix_cache import HiRadixCache

    for timeout_s in (0.5, 7.5):
        args = TierConfig(peers=("h:5",), peer_timeout_s=timeout_s).validate().storage_args()
        extra = args[args.index("--hicache-storage-backend-extra-config") + 1]
        config, _, _, _ = HiRadixCache._parse_storage_backend_extra_config(None, extra)
        assert config["peer_timeout_s"] == timeout_s


@pytest.mark.parametrize("bad", [0, -1, 60.5, float("nan"), float("inf"), True, "2"])
def test_a_bad_peer_timeout_is_refused_naming_the_flag(bad):
    with pytest.raises(TierConfigError, match="--tier-peer-timeout"):
        TierConfig(peer_timeout_s=bad).validate()
