"""`--radix-tokens-per-block R`: the replay's hit rates do not depend on how many radix tokens stand for one
trace block (issue 13, item 3). R = 1 is what the policies were tuned on; R = 32 is closer to a server,
where one radix token is one prompt token."""

from __future__ import annotations

import pytest

from benchmarks.__main__ import build_parser, replay_config_from_args
from benchmarks.engines import STOCK_POLICIES, RadixUnits, tiered_policy_names
from benchmarks.replay import ReplayConfig, replay
from benchmarks.trace import load_trace

ROWS = 1500  # the conversation trace's first rows: 15.7e6 distinct prompt tokens
# both contended: 1e6 is the headline capacity (admission declines hundreds of suffixes); 4e6 is where old
# unit-counted size buckets moved tinylfu by 0.013 between R = 1 and R = 32
CAPACITIES = (1_000_000, 4_000_000)
POLICIES = list(STOCK_POLICIES) + [f"tiered-{n}" for n in tiered_policy_names()]


@pytest.fixture(scope="module")
def trace():
    return load_trace("conversation", limit=ROWS)


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_token_hit_rate_is_the_same_for_one_and_32_radix_tokens_per_block(trace, capacity):
    """Guards: policy parameters counted in radix tokens or keys (size buckets, aging) that make the policy
    tuned on blocks another policy in a server. The self-tuner is off here: which chains its shadows sample
    hangs on the token ids, which R changes (its own sizes are in capacities: tests/tiers/test_shadow.py)."""
    off = {}
    for policy in POLICIES:
        one, many = (replay(trace, ReplayConfig(policy, capacity, radix_tokens_per_block=r, shadow_rate=0))
                     for r in (1, 32))
        assert one.evicted_blocks > 0, f"{policy} @ {capacity}: not contended"
        assert many.config["radix_tokens_per_block"] == 32
        off[policy] = (round(one.token_hit_rate, 4), round(many.token_hit_rate, 4))
    far = {p: rates for p, rates in off.items() if abs(rates[0] - rates[1]) > 0.01}
    assert not far, f"token hit rate (R=1, R=32) differs by more than 0.01: {far}"


def test_evicted_radix_tokens_map_back_to_blocks_once_each_in_order():
    units = RadixUnits(4)
    assert list(units.tokens([3, 0])) == [12, 13, 14, 15, 0, 1, 2, 3]
    assert units.blocks([13, 12, 15, 14, 0, 3, 9]) == [3, 0, 2]
    with pytest.raises(ValueError):
        RadixUnits(0)


def test_a_block_can_start_with_the_token_a_server_saw_first_and_still_maps_back():
    """The live replay's twin: block b starts with its given first token, its other tokens lie above every first
    token (so no block's run is taken for another's), and freed tokens other than first ones map back."""
    units = RadixUnits(4, {3: 1, 0: 0})
    assert list(units.tokens([3, 0])) == [1, 15, 16, 17, 0, 3, 4, 5]
    assert units.blocks([15, 1, 0, 4, 17]) == [3, 0]
    with pytest.raises(ValueError):
        RadixUnits(1, {0: 0})


def test_cli_flag_reaches_the_replay_config():
    parser = build_parser()
    for command in (["replay", "--policy", "lru", "--capacity-tokens", "1e6"], ["sweep", "--out", "x"]):
        args = parser.parse_args(command + ["--trace", "conversation", "--radix-tokens-per-block", "32"])
        assert replay_config_from_args(args, "lru", 10**6).radix_tokens_per_block == 32
    args = parser.parse_args(["replay", "--trace", "conversation", "--policy", "lru", "--capacity-tokens", "1e6"])
    assert replay_config_from_args(args, "lru", 10**6).radix_tokens_per_block == 1
    assert replay_config_from_args(args, "lru", 10**6).prefill_chunk_tokens == 0
    args = parser.parse_args(["replay", "--trace", "conversation", "--policy", "lru", "--capacity-tokens", "1e6",
                              "--prefill-chunk-tokens", "256", "--output-tokens", "1"])
    config = replay_config_from_args(args, "lru", 10**6)
    assert (config.prefill_chunk_tokens, config.output_tokens) == (256, 1)
    with pytest.raises(SystemExit):
        parser.parse_args(["replay", "--trace", "conversation", "--policy", "lru", "--capacity-tokens", "1e6",
                           "--radix-tokens-per-block", "0"])
