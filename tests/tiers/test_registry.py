"""What lost an experiment left the code: W-TinyLFU, its hill climber and its class learner (numbers in RESULTS.md)."""

import importlib.util

import pytest

from tiers.policy import create_policy, policy_names


@pytest.mark.parametrize("module", ["tiers.policies.wtinylfu", "tiers.policies._climber", "tiers.policies._reuse"])
def test_the_removed_modules_are_gone(module):
    assert importlib.util.find_spec(module) is None


def test_wtinylfu_is_no_longer_a_policy():
    assert "wtinylfu" not in policy_names()
    with pytest.raises(ValueError, match="unknown policy 'wtinylfu'"):
        create_policy("wtinylfu", 100)
