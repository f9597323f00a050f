"""The project's own server settings (`--tier-*` flags), validated once, carried to every process.

The launcher parses these flags (from the command line or SGLang's `--config FILE.yaml`), validates them and
exports them as JSON in `SGLANG_EXT_TIER_CONFIG`; SGLang's scheduler processes are spawned with the
launcher's environment, and the cache factory reads the same frozen `TierConfig` back.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from typing import Optional

ENV_VAR = "SGLANG_EXT_TIER_CONFIG"


class TierConfigError(ValueError):
    """A `--tier-*` value is invalid; the message names the flag."""


@dataclass(frozen=True)
class TierConfig:
    policy: str = "tinylfu"
    session_ttl_s: Optional[float] = None
    retention_budget: float = 0.5

    def validate(self) -> "TierConfig":
        from tiers.policy import policy_names

        if self.policy not in policy_names() and ":" not in self.policy:
            raise TierConfigError(f"--tier-policy: unknown policy {self.policy!r}; choose one of {policy_names()}")
        if self.session_ttl_s is not None:
            from tiers.retention import validate_ttl_s

            try:
                validate_ttl_s(self.session_ttl_s)
            except ValueError as e:
                raise TierConfigError(f"--tier-session-ttl: {e}") from None
        if not 0 < self.retention_budget <= 1:
            raise TierConfigError(f"--tier-retention-budget: must be a fraction in (0, 1], got {self.retention_budget}")
        return self

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_env(cls) -> "TierConfig":
        raw = os.environ.get(ENV_VAR)
        return cls(**json.loads(raw)) if raw else cls()


def add_tier_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tiered KV cache (sglang_ext)")
    group.add_argument("--tier-policy", default=TierConfig.policy,
                       help="device-tier admission/eviction policy (tiers registry name, or module:Class)")
    group.add_argument("--tier-session-ttl", type=float, default=None, metavar="SECONDS",
                       help="default retention TTL for SGLang sessions (session_params) without cache_control")
    group.add_argument("--tier-retention-budget", type=float, default=TierConfig.retention_budget,
                       metavar="FRACTION", help="fraction of each tier's capacity that retained prefixes may hold")


def tier_config_from_args(args: argparse.Namespace) -> TierConfig:
    return TierConfig(
        policy=args.tier_policy,
        session_ttl_s=args.tier_session_ttl,
        retention_budget=args.tier_retention_budget,
    ).validate()
