"""Cost model: what a cached token is worth in prefill time, per tier.

Recomputing a token costs `prefill_flops_per_token / achievable_prefill_flops` seconds; fetching it from a tier
costs `kv_bytes_per_token / bandwidth(tier link)`. Fetching beats recomputing only above the break-even bandwidth
    B* = kv_bytes_per_token * achievable_prefill_flops / prefill_flops_per_token.
The FLOP count is the linear (weights) part only; attention over a long context makes recompute dearer, so B*
as computed here is an upper bound (fetch already wins at somewhat lower bandwidth for long prompts).
Device hits are free; a lower-tier hit saves recompute time minus its transfer time (negative below B*).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Tuple

import yaml

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
DEFAULT_KV_BYTES_PER_TOKEN = 131072  # Llama-3-8B, bf16


@dataclass(frozen=True)
class Profile:
    name: str
    kv_bytes_per_token: int
    prefill_flops_per_token: float
    achievable_prefill_flops: float
    bandwidth: Tuple[Tuple[str, float], ...]  # link -> bytes/s
    tiers: Tuple[Tuple[str, str], ...]  # tier -> link

    def link_bandwidth(self, link: str) -> float:
        return dict(self.bandwidth)[link]

    def tier_bandwidth(self, tier: str) -> float:
        return self.link_bandwidth(dict(self.tiers)[tier])

    @property
    def recompute_s_per_token(self) -> float:
        return self.prefill_flops_per_token / self.achievable_prefill_flops

    @property
    def break_even_bandwidth(self) -> float:
        return self.kv_bytes_per_token * self.achievable_prefill_flops / self.prefill_flops_per_token

    def fetch_s_per_token(self, tier: str) -> float:
        return self.kv_bytes_per_token / self.tier_bandwidth(tier)

    def seconds_saved(self, hit_tokens_by_tier: Mapping[str, int]) -> Dict[str, float]:
        out = {}
        for tier, tokens in hit_tokens_by_tier.items():
            fetch = 0.0 if tier == "device" else self.fetch_s_per_token(tier)
            out[tier] = tokens * (self.recompute_s_per_token - fetch)
        return out

    def summary(self) -> dict:
        return {
            "profile": self.name,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "recompute_s_per_token": self.recompute_s_per_token,
            "break_even_bandwidth_bytes_per_s": self.break_even_bandwidth,
            "links": {
                link: {"bandwidth_bytes_per_s": bw, "fetch_beats_recompute": bw > self.break_even_bandwidth}
                for link, bw in self.bandwidth
            },
            "tiers": {
                tier: {
                    "link": link,
                    "fetch_s_per_token": self.fetch_s_per_token(tier),
                    "break_even_bandwidth_bytes_per_s": self.break_even_bandwidth,
                    "fetch_beats_recompute": self.tier_bandwidth(tier) > self.break_even_bandwidth,
                }
                for tier, link in self.tiers
            },
        }


def resolve_profile_path(name: str) -> Path:
    p = Path(name)
    if p.exists():
        return p
    for candidate in (PROFILES_DIR / name, PROFILES_DIR / f"{name}.yaml"):
        if candidate.exists():
            return candidate
    known = ", ".join(sorted(x.stem for x in PROFILES_DIR.glob("*.yaml")))
    raise FileNotFoundError(f"profile {name!r} not found; known profiles: {known}")


def load_profile(name: str) -> Profile:
    path = resolve_profile_path(name)
    with open(path) as f:
        raw = yaml.safe_load(f)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping")
    try:
        bandwidth = {str(k): float(v) for k, v in raw["bandwidth"].items()}
        tiers = {str(k): str(v) for k, v in raw.get("tiers", {}).items()}
        profile = Profile(
            name=str(raw.get("name", path.stem)),
            kv_bytes_per_token=int(raw["kv_bytes_per_token"]),
            prefill_flops_per_token=float(raw["prefill_flops_per_token"]),
            achievable_prefill_flops=float(raw["achievable_prefill_flops"]),
            bandwidth=tuple(sorted(bandwidth.items())),
            tiers=tuple(sorted(tiers.items())),
        )
    except KeyError as e:
        raise ValueError(f"{path}: missing field {e.args[0]!r}") from None
    for tier, link in profile.tiers:
        if link not in bandwidth:
            raise ValueError(f"{path}: tier {tier!r} uses unknown link {link!r}")
    for field in ("kv_bytes_per_token", "prefill_flops_per_token", "achievable_prefill_flops"):
        if getattr(profile, field) <= 0:
            raise ValueError(f"{path}: {field} must be positive")
    if any(bw <= 0 for bw in bandwidth.values()):
        raise ValueError(f"{path}: bandwidths must be positive")
    return profile
