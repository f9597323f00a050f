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
from typing import List, Optional, Tuple

from tiers.shadow import TuningConfig, parse_settings, tuning_at

ENV_VAR = "SGLANG_EXT_TIER_CONFIG"
MAX_PREFETCH_THRESHOLD = 1 << 20  # tokens: longer than any context, so "never ask the peer tier" is expressible
MAX_PEER_TIMEOUT_S = 60.0  # a peer slower than this is no tier: recomputing the prefix is faster
MAX_REQUEST_MB = 1 << 16  # 64 GiB: beyond any machine this runs on
MAX_OPEN_SESSIONS = 1 << 20


def parse_peers(spec) -> List[Tuple[str, int]]:
    """'h1:p1,h2:p2' (or a sequence of such strings) -> [(h1, p1), (h2, p2)]: the one parser of peer addresses
    (`--tier-peers`, the peer storage backend's extra config). ValueError naming the bad address."""
    items = spec.split(",") if isinstance(spec, str) else list(spec or [])
    peers = []
    for item in items:
        host, sep, port = item.strip().rpartition(":") if isinstance(item, str) else ("", "", "")
        # isascii: str.isdigit() accepts digits int() rejects ('²') or that no resolver expects ('٣')
        if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
            raise ValueError(f"bad peer address {item!r} (want HOST:PORT)")
        peers.append((host, int(port)))
    if not peers:
        raise ValueError("no peer address given (want HOST:PORT,HOST:PORT)")
    if len(set(peers)) != len(peers):
        raise ValueError(f"a peer is listed twice in {spec if isinstance(spec, str) else ','.join(spec)!r}")
    return peers


def _is_whole_in(value, low: int, high: int) -> bool:
    """An int (not a bool) in low..high."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


class TierConfigError(ValueError):
    """A `--tier-*` value is invalid; the message names the flag."""


def check_policy_name(name: str) -> type:
    """A registered policy, or `package.module:Class` naming an importable `tiers.policy.Policy` subclass: checked
    here, at launch, so that a typo fails naming the flag instead of in the scheduler's constructor. Returns the
    class."""
    from tiers.policy import Policy, policy_class, policy_names

    if ":" not in name and name not in policy_names():
        raise TierConfigError(f"--tier-policy: unknown policy {name!r}; choose one of {policy_names()}")
    try:
        cls = policy_class(name)
    except (ImportError, AttributeError, ValueError) as e:
        raise TierConfigError(f"--tier-policy: cannot load {name!r}: {e}") from None
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise TierConfigError(f"--tier-policy: {name!r} is not a tiers.policy.Policy subclass")
    return cls


@dataclass(frozen=True)
class TierConfig:
    policy: str = "tinylfu"
    session_ttl_s: Optional[float] = None
    retention_budget: float = 0.5
    peers: Tuple[str, ...] = ()  # HOST:PORT of peer block servers (sglang_ext.peer_server)
    stats_tenants: bool = False  # per-tenant occupancy in /tiers/stats: only when the operator asks
    # HiCache asks the peer tier only for a prefix whose part beyond device and host memory is at least this long
    peer_prefetch_threshold: int = 256  # tokens (SGLang's storage `prefetch_threshold`, same default)
    # the one deadline of each peer-tier call HiCache makes (lookups, reads, writes); past it the call is a miss
    peer_timeout_s: float = 2.0
    # least share of prefix chains the self-tuner's shadow caches see (tiers.shadow); 0: no self-tuning
    shadow_rate: float = TuningConfig.sample_rate
    # the self-tuner's candidates, `NAME[@BAR],...` (tiers.shadow.parse_settings; the first is where the live tree
    # starts); empty: the defaults of the tree (device only, or with a host tier)
    shadow_settings: str = ""
    # the largest request body the HTTP process reads (every POST body is read whole, then parsed, before it is
    # checked): a body of 400 MiB cost the server 1.5 GB of memory, and parsing 256 MiB of token ids holds the HTTP
    # process 3.7 s; 64 MiB is far beyond a text prompt (a 128k-token prompt of ids is about 1 MiB)
    max_request_mb: int = 64
    # sessions (`/open_session`) open at once in the scheduler: SGLang keeps each until it is closed or its idle
    # timeout (if the client gave one) passes, so without a bound a client could open them until memory runs out
    max_open_sessions: int = 4096

    def tuning(self, host_tier: bool = False) -> Optional[TuningConfig]:
        """The self-tuner's settings for a device-only tree or one with a host tier (None: off, the policy runs as
        configured)."""
        return tuning_at(self.shadow_rate, host_tier=host_tier, settings=self.shadow_settings)

    def validate(self) -> "TierConfig":
        policy = check_policy_name(self.policy)
        if self.session_ttl_s is not None:
            from tiers.retention import validate_ttl_s

            try:
                validate_ttl_s(self.session_ttl_s)
            except ValueError as e:
                raise TierConfigError(f"--tier-session-ttl: {e}") from None
        if self.peers:
            try:
                parse_peers(self.peers)
            except ValueError as e:
                raise TierConfigError(f"--tier-peers: {e}") from None
        if not _is_whole_in(self.peer_prefetch_threshold, 1, MAX_PREFETCH_THRESHOLD):
            raise TierConfigError(f"--tier-peer-prefetch-threshold: want a whole number of tokens in 1.."
                                  f"{MAX_PREFETCH_THRESHOLD}, got {self.peer_prefetch_threshold!r}")
        if not (isinstance(self.peer_timeout_s, (int, float)) and not isinstance(self.peer_timeout_s, bool)
                and 0 < self.peer_timeout_s <= MAX_PEER_TIMEOUT_S):
            raise TierConfigError(f"--tier-peer-timeout: want seconds in (0, {MAX_PEER_TIMEOUT_S:g}], got "
                                  f"{self.peer_timeout_s!r}")
        if not _is_whole_in(self.max_request_mb, 1, MAX_REQUEST_MB):
            raise TierConfigError(f"--tier-max-request-mb: want a whole number of MiB in 1..{MAX_REQUEST_MB}, got "
                                  f"{self.max_request_mb!r}")
        if not _is_whole_in(self.max_open_sessions, 1, MAX_OPEN_SESSIONS):
            raise TierConfigError(f"--tier-max-open-sessions: want a whole number in 1..{MAX_OPEN_SESSIONS}, got "
                                  f"{self.max_open_sessions!r}")
        if not 0 < self.retention_budget <= 1:
            raise TierConfigError(f"--tier-retention-budget: must be a fraction in (0, 1], got {self.retention_budget}")
        if not (isinstance(self.shadow_rate, (int, float)) and not isinstance(self.shadow_rate, bool)
                and 0 <= self.shadow_rate <= 1):
            raise TierConfigError(f"--tier-shadow-rate: must be a fraction in [0, 1] (0: no self-tuning), got "
                                  f"{self.shadow_rate!r}")
        self._check_shadow_settings(policy)
        return self

    def _check_shadow_settings(self, policy: type) -> None:
        if not self.shadow_settings:
            return
        if not isinstance(self.shadow_settings, str):
            raise TierConfigError(f"--tier-shadow-settings: want NAME[@BAR],..., got {self.shadow_settings!r}")
        try:
            parse_settings(self.shadow_settings)
        except ValueError as e:
            raise TierConfigError(f"--tier-shadow-settings: {e}") from None
        if not self.shadow_rate:
            raise TierConfigError("--tier-shadow-settings: the candidates need the self-tuner on "
                                  "(--tier-shadow-rate above 0)")
        if not callable(getattr(policy, "steer", None)):
            raise TierConfigError(f"--tier-shadow-settings: policy {self.policy!r} cannot be steered between "
                                  f"settings (the self-tuner runs on tinylfu)")

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def launched() -> bool:
        """Whether this process belongs to a server that `sglang_ext.launch_server` started (it exports the config)."""
        return bool(os.environ.get(ENV_VAR))

    @classmethod
    def from_env(cls) -> "TierConfig":
        raw = os.environ.get(ENV_VAR)
        if not raw:
            return cls()
        fields = json.loads(raw)
        return cls(**{**fields, "peers": tuple(fields.get("peers", ()))})

    def storage_args(self, model_revision: str = "") -> list:
        """SGLang flags that put the peer tier under HiCache as its L3 (a `dynamic` storage backend).
        `model_revision` (tiers.keys.weights_revision) goes into every peer key's namespace."""
        extra = {"backend_name": "peer", "module_path": "sglang_ext.peer_storage", "class_name": "PeerStorage",
                 "interface_v1": 1, "peers": ",".join(self.peers), "model_revision": model_revision,
                 "peer_timeout_s": self.peer_timeout_s,
                 "prefetch_threshold": self.peer_prefetch_threshold}  # SGLang takes this key out for itself
        return ["--hicache-storage-backend", "dynamic", "--hicache-storage-backend-extra-config", json.dumps(extra)]


def add_tier_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("tiered KV cache (sglang_ext)")
    group.add_argument("--tier-policy", default=TierConfig.policy,
                       help="device-tier admission/eviction policy (tiers registry name, or module:Class)")
    group.add_argument("--tier-session-ttl", type=float, default=None, metavar="SECONDS",
                       help="default retention TTL for SGLang sessions (session_params) without cache_control")
    group.add_argument("--tier-peers", default="", metavar="HOST:PORT,...",
                       help="peer block servers for the peer tier (implies --enable-hierarchical-cache)")
    group.add_argument("--tier-peer-prefetch-threshold", type=int, default=TierConfig.peer_prefetch_threshold,
                       metavar="TOKENS", help="look a prefix up in the peer tier only when its part beyond device "
                                              "and host memory is at least this many tokens (SGLang's storage "
                                              "prefetch_threshold)")
    group.add_argument("--tier-peer-timeout", type=float, default=TierConfig.peer_timeout_s, metavar="SECONDS",
                       help="deadline of each peer-tier call (a lookup, a read, a write); a call past it is a miss "
                            "and the prefix is recomputed")
    group.add_argument("--tier-retention-budget", type=float, default=TierConfig.retention_budget,
                       metavar="FRACTION", help="fraction of each tier's capacity that retained prefixes may hold")
    group.add_argument("--tier-shadow-rate", type=float, default=TierConfig.shadow_rate, metavar="FRACTION",
                       help="self-tuning: the least share of prefix chains replayed on shadow caches, one per "
                            "candidate setting, whose best the policy follows (on the device tier, and with "
                            "--enable-hierarchical-cache on both tiers; 0: off, the learned setting throughout)")
    group.add_argument("--tier-shadow-settings", default="", metavar="NAME[@BAR],...",
                       help="self-tuning: the candidate settings, each a shadow cache, the first where the live "
                            "policy starts: lru-no-ttl (SGLang's LRU), lru (the same, client TTLs honoured), gated "
                            "(the learned order with the reuse gate), gated-no-ttl; a gated one may name its gate "
                            "bar, e.g. gated@0.5 (default: lru-no-ttl,gated,gated-no-ttl; with the host tier, "
                            "lru,gated,gated-no-ttl)")
    group.add_argument("--tier-max-request-mb", type=int, default=TierConfig.max_request_mb, metavar="MIB",
                       help="answer a request whose body is larger with a 413, before reading the rest of it")
    group.add_argument("--tier-max-open-sessions", type=int, default=TierConfig.max_open_sessions, metavar="N",
                       help="refuse /open_session (a 400) while this many sessions are open")
    group.add_argument("--tier-stats-tenants", action="store_true",
                       help="add per-tenant occupancy (salt digests) to /tiers/stats; off by default, so that no "
                            "client learns another tenant's footprint (with --admin-api-key, /tiers/stats needs it)")


def tier_config_from_args(args: argparse.Namespace) -> TierConfig:
    return TierConfig(
        policy=args.tier_policy,
        session_ttl_s=args.tier_session_ttl,
        retention_budget=args.tier_retention_budget,
        peers=tuple(p.strip() for p in args.tier_peers.split(",") if p.strip()),
        stats_tenants=bool(args.tier_stats_tenants),
        peer_prefetch_threshold=args.tier_peer_prefetch_threshold,
        peer_timeout_s=args.tier_peer_timeout,
        shadow_rate=args.tier_shadow_rate,
        shadow_settings=args.tier_shadow_settings,
        max_request_mb=args.tier_max_request_mb,
        max_open_sessions=args.tier_max_open_sessions,
    ).validate()
