"""Tier-config fuzz: every bad `--tier-*` value is a TierConfigError / LaunchError naming its flag (no server).

A good value must be accepted; anything else must fail with a message that names the flag the user wrote, never
an argparse exit, a bare ValueError from int(), or a traceback from a scheduler process later.
"""

import importlib
import math
import os

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # read at import time by sglang modules

from sglang_ext.launch_server import LaunchError, split_tier_args  # noqa: E402
from sglang_ext.tier_config import TierConfig, TierConfigError  # noqa: E402
from tiers.policy import Policy, policy_names  # noqa: E402

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Values an argparse option takes as its argument (a leading '-' would be read as another option).
values = st.one_of(
    st.text(max_size=20).filter(lambda t: not t.startswith("-")),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-10**6, 10**6).map(str),
    st.sampled_from(["nan", "inf", "1e400", "0", "0.0", "5m", "300s", "", " ", "1,5", "٣", "²", "0x10"]),
)


def float_in_range(low_open: bool, high: float):
    """What argparse's type=float takes, then the range check: (0, high] with `low_open`, else [0, high]."""
    def good(text: str) -> bool:
        try:
            v = float(text)
        except ValueError:
            return False
        return math.isfinite(v) and (0 < v if low_open else 0 <= v) and v <= high
    return good


good_ttl, good_budget = float_in_range(True, 24 * 3600), float_in_range(True, 1)
good_share, good_timeout = float_in_range(False, 1), float_in_range(True, 60)


def good_peers(text: str) -> bool:
    items = [p.strip() for p in text.split(",") if p.strip()]
    addresses = []
    for p in items:
        host, _, port = p.rpartition(":")
        if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            return False
        addresses.append((host, int(port)))  # "h:5" and "h:05" are the same peer
    return len(set(addresses)) == len(addresses)


def whole_in_range(top: int):
    def good(text: str) -> bool:
        try:
            v = int(text)  # what argparse's type=int takes
        except ValueError:
            return False
        return 1 <= v <= top
    return good


good_threshold, good_request_mb = whole_in_range(1 << 20), whole_in_range(1 << 16)


def good_policy(text: str) -> bool:
    """A registered name, or `module:Class` naming an importable `tiers.policy.Policy` subclass (checked at launch
    since the host tier came: a ':' alone, as in ':' or '0:', is not one)."""
    if text in policy_names():
        return True
    module, colon, name = text.partition(":")
    if not colon:
        return False
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - whatever the import raises, nothing loads
        return False
    return isinstance(cls, type) and issubclass(cls, Policy)


def good_settings(text: str) -> bool:
    """Empty (the defaults), or up to six distinct candidates: a recency name, or a learned one with an optional
    gate bar in [0, 1] (its default 0.3: `gated@0.3` is `gated`)."""
    if not text:
        return True
    default_bar = {"lru-no-ttl": None, "lru": None, "gated": 0.3, "gated-no-ttl": 0.3}
    items, seen = text.split(","), set()
    for item in items:
        name, at, bar = item.strip().partition("@")
        if name not in default_bar or (at and default_bar[name] is None):
            return False
        value = default_bar[name]
        if at:
            try:
                value = float(bar)
            except ValueError:
                return False
            if not 0 <= value <= 1:
                return False
        seen.add((name.removesuffix("-no-ttl"), value, name.endswith("-no-ttl")))
    return len(items) <= 6 and len(seen) == len(items)


CASES = {
    "--tier-session-ttl": good_ttl,
    "--tier-retention-budget": good_budget,
    "--tier-policy": good_policy,
    "--tier-peers": good_peers,
    "--tier-peer-prefetch-threshold": good_threshold,
    "--tier-shadow-rate": good_share,
    "--tier-shadow-settings": good_settings,
    "--tier-peer-timeout": good_timeout,
    "--tier-max-request-mb": good_request_mb,
    "--tier-max-open-sessions": good_threshold,  # a whole number in 1..2**20, as the threshold
}


def check(flag: str, value: str) -> None:
    try:
        config, rest = split_tier_args(["--model-path", "m", flag, value])
    except LaunchError as e:
        assert not CASES[flag](value), f"{flag} {value!r} is valid but was refused: {e}"
        assert flag in str(e), f"error for {flag} {value!r} does not name the flag: {e}"
        return
    assert CASES[flag](value), f"{flag} {value!r} was accepted: {config}"
    assert rest == ["--model-path", "m"]


@FUZZ
@given(flag=st.sampled_from(sorted(CASES)), value=values)
@example(flag="--tier-policy", value=":")  # found by this test: a ':' names no class
@example(flag="--tier-policy", value="0:")
@example(flag="--tier-policy", value="tiers.policies.stock:LRUPolicy")
@example(flag="--tier-shadow-settings", value="lru-no-ttl,gated,gated@0.5,gated-no-ttl@0")
@example(flag="--tier-shadow-settings", value="gated, gated@0.30")  # the same setting twice
@example(flag="--tier-shadow-settings", value="lru@0.5")
@example(flag="--tier-shadow-settings", value="gated@nan")
@example(flag="--tier-shadow-settings", value="gated@-0")
@example(flag="--tier-shadow-settings", value="gated@1,gated@0.9,gated@0.8,gated@0.7,gated@0.6,gated@0.5,gated@0.4")
def test_every_bad_tier_value_is_an_error_naming_the_flag(flag, value):
    check(flag, value)


@FUZZ
@given(value=st.lists(st.one_of(
    st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["127.0.0.1", "h", "", "a:b"]),
              st.one_of(st.integers(-5, 70000).map(str), st.text(max_size=4))),
    st.text(max_size=8)), max_size=4).map(",".join).filter(lambda t: not t.startswith("-")))
def test_peer_lists(value):
    check("--tier-peers", value)


@pytest.mark.parametrize("argv, flag", [
    (["--tier-session-ttl"], "--tier-session-ttl"),  # no value at all
    (["--tier-session-ttl", "abc"], "--tier-session-ttl"),
    (["--tier-retention-budget", "half"], "--tier-retention-budget"),
    (["--tier-peers", "h:1,h:1"], "--tier-peers"),
    (["--tier-peers", "h:²"], "--tier-peers"),
    (["--tier-shadow-rate", "nan"], "--tier-shadow-rate"),
    (["--tier-shadow-rate", "1.5"], "--tier-shadow-rate"),
    (["--tier-shadow-settings", "gated,,lru"], "--tier-shadow-settings"),
    (["--tier-shadow-settings", "gated", "--tier-shadow-rate", "0"], "--tier-shadow-settings"),  # no tuner to use them
    (["--tier-shadow-settings", "gated", "--tier-policy", "lru"], "--tier-shadow-settings"),  # nothing to steer
    (["--tier-max-request-mb", "0"], "--tier-max-request-mb"),
    (["--tier-max-request-mb", "0.5"], "--tier-max-request-mb"),
    (["--tier-max-open-sessions", "0"], "--tier-max-open-sessions"),
])
def test_known_bad_values(argv, flag):
    with pytest.raises(LaunchError, match=flag):
        split_tier_args(argv)


@FUZZ
@given(ttl=st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
       budget=st.floats(allow_nan=True, allow_infinity=True))
def test_tier_config_validate_direct(ttl, budget):
    config = TierConfig(session_ttl_s=ttl, retention_budget=budget)
    ttl_ok = ttl is None or (math.isfinite(ttl) and 0 < ttl <= 24 * 3600)
    budget_ok = 0 < budget <= 1
    if ttl_ok and budget_ok:
        assert config.validate() is config
        return
    with pytest.raises(TierConfigError) as info:
        config.validate()
    assert ("--tier-session-ttl" if not ttl_ok else "--tier-retention-budget") in str(info.value)
