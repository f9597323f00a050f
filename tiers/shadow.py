"""Online self-tuning: a few candidate settings run side by side on sampled shadow caches, and the live policy
follows the best of them over a recent window.

Design note
-----------
No fixed setting of a learned policy wins everywhere (benchmarks/RESULTS.md, "Where the known losses come from"):
the learned order beats recency on long multi-turn traffic and loses to it while its learner is cold or where
*when* a chain returns matters more than *whether*. So the tier measures instead of guessing:

- **Spatial sampling, whole chains** (SHARDS, Waldspurger et al., FAST 2015; miniature simulations, ATC 2017): a
  request goes to the shadows when the hash of its chain's key falls under `sample_rate`. A prefix chain is
  identified by its first key that is not a *shared head*: a key that `head_requests` recent requests passed
  through (a system prompt, a tool preamble) belongs to many chains, so sampling by it would take all of them or
  none. A conversation's later turns pass the same keys, so a chain is sampled whole or not at all. The hash is
  salted by `sample_seed` (the server's is 0): the replay's `--shadow-seed` draws other samples at the same rate,
  and the spread of a hit rate over seeds is how much of it is the tuner's path, not its rules.
- **Shadows**: one miniature cache per candidate setting, rate x the live capacity, built by the tier with the
  classes it runs itself (`make_shadow`), so a shadow is the live cache in small. A recency setting's miniature
  runs `recency` (`Setting.miniature_policy`): the same order, without the learner the live policy keeps training
  on recency for a switch back, which a miniature that never switches would not read. A miniature is only faithful
  while it holds many requests (SHARDS scales the capacity, not the items): the rate is `sample_rate` or more,
  enough for the shadow to hold `min_shadow_requests` requests of the mean size seen over the first
  `warmup_requests` (up to 1: full-size shadows). The shadows start after that warm-up.
- **Window**: a window ends after every `window_capacities` shadow capacities of sampled traffic (at the first
  decision from then on); then each shadow's hit and requested units are halved, so the comparison follows the
  recent workload. Units are capacities, so the window does not depend on how many tokens a unit holds.
- **Hysteresis**: the live setting is decided every `decide_capacities` shadow capacities of sampled traffic
  (a quarter of a window: a miniature of the learned policy parts from recency's hit rate only after a few
  capacities, and each capacity the live tree stays on recency after that is lost), and changes only once
  `min_capacities` shadow capacities of sampled traffic have been seen and another setting's windowed hit rate
  beats the live one's by `margin` (token hit rate, absolute) and by `min_z` standard errors of the per-request
  difference between the two shadows on the same sampled requests (a paired test: windows hold a few hundred
  requests, and on traffic whose hits are few and large a lead of 0.01 can be noise). The live policy starts on
  the first setting (recency: on a device-only tree SGLang's own LRU, client TTLs ignored as SGLang ignores
  them; with a host tier, stock HiCache's order with TTLs honoured: `DEFAULT_SETTINGS`, `HOST_TIER_SETTINGS`),
  so while its learner is cold (until the cache is full, below) the tier behaves as stock SGLang.
- **The first switch** (`learned_on_tie`): until the miniatures are full they evict nothing and read the same
  rate, so the paired test cannot pass before the live tree is full too, and each capacity it then waits on
  recency gives back what the learned setting wins (rag and tenants rows: the first switch came at request
  800-970 of 2,000). So before the first switch, a tie goes to the learned setting: at the first decision after
  `tie_capacities` (two) capacities of the whole cache, once recency's miniature has hits and the best learned
  miniature reads at least as many, the live tree leaves recency, its classes trained on what it served while it
  filled (until then no order drops anything); where recency's miniature leads (a short conversation slice that
  barely outgrows the pool) it stays, and a tie at no hits at all is no evidence (the synthetic slice live: both
  read 0 at the first decision, and the switch then cost 0.0007 against LRU). The whole cache: with a host tier
  below the device, nothing is dropped until both tiers are full (`cache_capacity`); a tie at two device
  capacities took the first 2,000 conversation rows (host twice the device) to the learned setting before its
  classes had seen a return, 0.0835 against stock HiCache's 0.0873. Two capacities, not one: one gained on the
  tuning set, but over five samples of the chains it left the first 1,500 conversation rows at 4e6 below LRU on
  average (-0.0082: the learned setting loses there while its classes are young), and no row may be
  (benchmarks/RESULTS.md, "Every row over five samples of the tuner"). Among learned twins that tie, the live tree
  takes the one with its own stance on client TTLs: a tie says nothing about them (the listed first, TTLs honoured,
  left tenant chat at 2e5 0.0086 lower on the tuning set). After the first switch, every switch needs the margin,
  the paired lead and `min_capacities` of traffic; one that changes the order (recency to learned or back) keeps
  the live stance on TTLs too, taking the leader's twin, unless the leader leads its twin or the twin reads no
  more than the live setting (a lead over recency says nothing about TTLs: tchat20-s79 at 5e4 went from recency
  to `gated` on a lead of 0.013 at z 0.43 over `gated-no-ttl`, and read 0.40 where that twin pinned reads 0.47).
- **A cache that holds few requests** (`few_requests`): SHARDS scales the capacity, not the items, and a
  miniature of a cache that holds ten requests holds two or three (at most a quarter of it; the whole cache with a
  host tier below): it reads nothing the cache would, and its fidelity fails or, worse, passes by chance. Where the
  whole cache holds fewer than `few_requests` requests of the windowed mean size of the sampled ones, the live tree
  runs the learned gate with TTLs ignored (where a setting that ignores them runs; else the first learned one),
  whatever the shadows read, and the shadows decide again once requests are smaller against the cache. On the
  tuning set's traces at two and four times smaller capacities than declared (4-28 mean requests in the cache),
  the shadows' choices fell below that setting pinned below ten (tenants-s2 at 1.2e4: 0.0413 against LRU's
  0.0460; pinned 0.0862), and neither led above it (benchmarks/RESULTS.md, "A cache that holds few requests").
  Retention in a cache of a few requests keeps one of them over the rest (tenant chat at 4e4: 0.4694 with TTLs
  honoured, 0.5156 without).
- **Client TTLs are a setting** (`Setting.honours_ttls`): retention is a hint, and on traffic that marks one-shot
  questions ephemeral it keeps them over the shared prompts that come back (tenants-s1 at 2.5e5: 0.4595 honouring
  them, 0.4839 with none). A candidate that ignores them is measured beside its twin that honours them, and the
  live tree follows the better one as for any setting (switching to it ends every retention at once). It gets a
  shadow only where a request of the warm-up carried a TTL: on traffic without TTLs the twins are the same
  cache. Two rules that judged TTLs by their own outcomes lost (benchmarks/RESULTS.md); the shadows judge them
  by the hit rate itself.
- **Fidelity**: the tier tells the tuner how much of each sampled request the live tree held (its own hit: a
  chunked prefill's own chunks excluded), and a switch also needs the live setting's miniature to read within
  `fidelity_factor` of the live tree's windowed rate on the same requests. A miniature that does not track the
  tree it stands for says nothing about what the tree would gain by changing: on the first 2,000 rows of the
  synthetic trace the recency miniature read 0.003 while the live tree (on recency) held 0.012 of the same
  requests, as much as the learned miniature promised, and the switch it allowed cost 0.0006 against LRU.

Cost: a sampled request costs one request on each shadow, so the tuner adds about the rate x the candidates
of the tree's per-request work; memory is the shadows (their capacity) plus `head_memory` head counts.

Threading: not thread-safe; the tier calls it under its own lock, like its policy.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Optional, Protocol, Sequence, Tuple

_HASH_BITS = 32
_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # Fibonacci hashing: spreads Python's int and tuple hashes over the bits
_SPREAD = 0xBF58476D1CE4E5B9  # splitmix64's multiplier: a seed's salt flips bits across the whole word


@dataclass(frozen=True)
class Setting:
    """One candidate configuration of a steerable policy (`steer(order, gate_threshold)`)."""

    name: str
    order: str = "learned"  # "recency": age alone, every suffix admitted (SGLang's LRU)
    gate_threshold: float = 0.0
    honours_ttls: bool = True  # False: a client's TTL is ignored (no retention, no admission bypass)

    def miniature_policy(self, policy: str, config: dict) -> Tuple[str, dict]:
        """The policy, and its configuration, of this setting's miniature beside a live tree on `policy`: a
        recency setting's runs `recency`, the order a steered policy follows on recency without the learner that a
        miniature never switching setting would never read (tiers/policies/recency.py); a learned one's runs the
        live tree's."""
        return ("recency", {}) if self.order == "recency" else (policy, config)


LRU = Setting("lru-no-ttl", order="recency", honours_ttls=False)  # SGLang's LRU, which has no client TTLs
RETAINING_LRU = Setting("lru", order="recency")  # the same, client TTLs honoured (retention within its budget)
GATED = Setting("gated", "learned", 0.3)  # the learned order with the reuse gate at its bar: `tinylfu` pinned
GATED_NO_TTL = Setting("gated-no-ttl", "learned", 0.3, honours_ttls=False)
# The device-only tree starts as SGLang does: recency honouring TTLs there left traffic that marks one-shot
# questions ephemeral (API callers) below SGLang's LRU until the first switch (the first 300 rows of api-s8 at
# 2.5e5: 0.3372 against 0.3447). With a host tier below, a retained victim is demoted, not dropped, and the
# start honours TTLs: it never lost to stock HiCache on those slices, and kept tenant chat ahead from its start
# (benchmarks/RESULTS.md, "The device-only start is SGLang's LRU, client TTLs included"). The setting that
# ignores TTLs joins only where the warm-up traffic carried them. A frequency order (close to SGLang's LFU) as a
# candidate lost: one wrong switch to it cost 0.03 against LRU.
DEFAULT_SETTINGS = (LRU, GATED, GATED_NO_TTL)
HOST_TIER_SETTINGS = (RETAINING_LRU, GATED, GATED_NO_TTL)
NAMED_SETTINGS = {s.name: s for s in (LRU, RETAINING_LRU, GATED, GATED_NO_TTL)}
MAX_SETTINGS = 6  # each candidate is a shadow cache: the tuner's memory and CPU grow with their number


def parse_settings(spec: str) -> Tuple[Setting, ...]:
    """An operator's candidates, `NAME[@BAR],...` (the server's `--tier-shadow-settings`), the first the live
    tree's start: NAME one of NAMED_SETTINGS; a learned one (`gated`, `gated-no-ttl`) may name its own gate bar,
    a fraction in [0, 1] (`gated@0.5`). ValueError saying what is wrong."""
    settings = []
    for item in (item.strip() for item in spec.split(",")):
        name, at, bar = item.partition("@")
        base = NAMED_SETTINGS.get(name)
        if base is None:
            raise ValueError(f"unknown setting {item!r}; choose from {', '.join(NAMED_SETTINGS)} "
                             f"(a learned one may carry its gate bar: gated@0.5)")
        if at:
            if base.order != "learned":
                raise ValueError(f"{item!r}: only a learned setting has a gate bar")
            try:
                threshold = float(bar)
            except ValueError:
                threshold = math.nan
            if not 0.0 <= threshold <= 1.0:  # also refuses nan
                raise ValueError(f"{item!r}: the gate bar must be a fraction in [0, 1]")
            threshold += 0.0  # -0 is 0
            base = Setting(f"{name}@{threshold:g}", base.order, threshold, base.honours_ttls)
        settings.append(base)
    if len(settings) > MAX_SETTINGS:
        raise ValueError(f"at most {MAX_SETTINGS} settings (each is a shadow cache), got {len(settings)}")
    if len({(s.order, s.gate_threshold, s.honours_ttls) for s in settings}) != len(settings):
        raise ValueError(f"a setting is listed twice in {spec!r}")
    return tuple(settings)


@dataclass(frozen=True)
class TuningConfig:
    """Defaults chosen on the declared tuning set (benchmarks/RESULTS.md, "Self-tuning from shadow caches")."""

    sample_rate: float = 1 / 16  # the least share of chains the shadows see
    max_rate: float = 0.25  # the most, however large the requests are against the capacity (bounds the CPU)
    min_shadow_requests: float = 32.0  # a shadow holds at least this many mean-sized requests (up to max_rate)
    warmup_requests: int = 32  # requests seen before the shadows are sized and started
    # the first is what the live policy starts with (`tuning_at`: HOST_TIER_SETTINGS for a tree with a host tier)
    settings: Tuple[Setting, ...] = DEFAULT_SETTINGS
    window_capacities: float = 4.0  # shadow capacities of sampled traffic per window (then the counts halve)
    decide_capacities: float = 1.0  # shadow capacities of sampled traffic between two decisions
    min_capacities: float = 2.0  # sampled traffic before a lead can move the live setting
    tie_capacities: float = 2.0  # and before a tie can move it off recency, in capacities of the whole cache
    margin: float = 0.002  # token hit rate by which another setting must beat the live one
    min_z: float = 1.0  # and its per-request lead over the live one, in standard errors (paired)
    fidelity_factor: float = 2.0  # and the live setting's shadow within this factor of the live tree's rate
    learned_on_tie: bool = True  # before the first switch, recency's tie with a learned setting goes to the learned
    few_requests: float = 10.0  # a whole cache holding fewer mean-sized requests runs the learned gate, TTLs ignored
    head_requests: int = 32  # requests through a key that make it a shared head
    head_memory: int = 4096  # keys whose request counts are kept
    sample_seed: int = 0  # which chains the sample takes (each seed another sample at the same rate)

    def __post_init__(self):
        if not 0 < self.sample_rate <= self.max_rate <= 1:
            raise ValueError(f"shadow sample rates need 0 < rate <= max rate <= 1, got {self.sample_rate}, "
                             f"{self.max_rate}")
        if len(self.settings) < 1 or len({s.name for s in self.settings}) != len(self.settings):
            raise ValueError("shadow settings need at least one setting and distinct names")
        if min(self.window_capacities, self.decide_capacities) <= 0 or min(
                self.min_capacities, self.tie_capacities, self.margin, self.min_z, self.few_requests) < 0:
            raise ValueError("window and decision interval must be > 0, least traffic, margin, min_z and "
                             "few_requests >= 0")
        if not self.fidelity_factor >= 1:
            raise ValueError(f"fidelity_factor must be >= 1, got {self.fidelity_factor}")
        if self.head_requests < 2 or self.head_memory < 1:
            raise ValueError("head_requests must be >= 2 and head_memory >= 1")
        if not 0 <= self.sample_seed <= _MASK64:
            raise ValueError(f"sample_seed must be in [0, 2**64), got {self.sample_seed}")
        if self.min_shadow_requests < 0 or self.warmup_requests < 1:
            raise ValueError("min_shadow_requests must be >= 0 and warmup_requests >= 1")


def tuning_at(sample_rate: float, sample_seed: int = 0, host_tier: bool = False,
              settings: str = "") -> Optional[TuningConfig]:
    """The default tuning with `sample_rate` as its least rate (None for 0: no self-tuning), for a device-only
    tree or one with a host tier below, with the candidates `settings` names (`parse_settings`; empty: the
    tree's defaults): the one rule the server's `--tier-shadow-*` and the replay's `--shadow-*` share."""
    if not sample_rate:
        return None
    candidates = parse_settings(settings) if settings else HOST_TIER_SETTINGS if host_tier else DEFAULT_SETTINGS
    return TuningConfig(sample_rate=sample_rate, max_rate=max(sample_rate, TuningConfig.max_rate),
                        sample_seed=sample_seed, settings=candidates)


@dataclass(frozen=True)
class TuningStats:
    live: str
    sample_rate: float  # 0.0 while warming up
    sampled_requests: int
    switches: int
    shadow_hit_rates: Dict[str, float]  # windowed token hit rate of each shadow (0.0 before any traffic)
    live_tree_hit_rate: float  # the live tree's own windowed hit rate on the same sampled requests


class Shadow(Protocol):
    def request(self, request) -> Tuple[int, int]:
        """Serve one request; (hit units, requested units)."""


class ChainSampler:
    """Whether a request's prefix chain is in the sample, by the hash of the chain's own first key."""

    def __init__(self, sample_rate: float, head_requests: int = 32, head_memory: int = 4096, seed: int = 0):
        self.rate = sample_rate
        self._salt = (seed * _SPREAD) & _MASK64  # 0 for seed 0: the sample the tier has always taken
        self._bar = int(sample_rate * (1 << _HASH_BITS))
        self._head_requests = head_requests
        self._head_memory = head_memory
        self._counts: "OrderedDict[Hashable, int]" = OrderedDict()  # recently passed keys -> requests

    def chain_key(self, keys: Sequence[Hashable]) -> Optional[Hashable]:
        """The first of a request's path keys (root first) that is not a shared head; counts the keys it
        passes. None for an empty path."""
        counts = self._counts
        key = None
        for key in keys:
            n = counts.pop(key, 0) + 1
            counts[key] = n
            if n < self._head_requests:
                break
        while len(counts) > self._head_memory:
            counts.popitem(last=False)
        return key

    def sampled(self, keys: Sequence[Hashable]) -> bool:
        key = self.chain_key(keys)
        if key is None:
            return False
        mixed = (((hash(key) & _MASK64) ^ self._salt) * _GOLDEN) & _MASK64
        return (mixed >> (64 - _HASH_BITS)) < self._bar


class PairedLeads:
    """Windowed sums of the per-request hit difference between every two shadows on the same sampled requests,
    so that a lead can be weighed against its own noise (a paired z statistic; halved with the window)."""

    def __init__(self, n: int):
        self._d = [[0.0] * n for _ in range(n)]
        self._q = [[0.0] * n for _ in range(n)]
        self._count = 0.0

    def add(self, hits: Sequence[float]) -> None:
        self._count += 1
        for a, ha in enumerate(hits):
            da, qa = self._d[a], self._q[a]
            for b, hb in enumerate(hits):
                diff = ha - hb
                da[b] += diff
                qa[b] += diff * diff

    def halve(self) -> None:
        self._count *= 0.5
        self._d = [[x * 0.5 for x in row] for row in self._d]
        self._q = [[x * 0.5 for x in row] for row in self._q]

    def z(self, a: int, b: int) -> float:
        """Mean per-request lead of shadow `a` over `b`, in standard errors (inf for a lead with no spread)."""
        n = self._count
        if n < 2:
            return 0.0
        mean = self._d[a][b] / n
        var = max(0.0, self._q[a][b] / n - mean * mean)
        if var == 0.0:
            return math.inf if mean > 0 else 0.0
        return mean / math.sqrt(var / n)


class ShadowTuner:
    """Feeds sampled requests to one shadow per setting and says which setting the live policy should run."""

    def __init__(self, config: TuningConfig, capacity: int, make_shadow: Callable[[Setting, int], Shadow],
                 cache_capacity: Optional[int] = None):
        """`capacity`: the live tier's units, which the shadows scale; `cache_capacity`: all the units the cache
        holds before it drops anything (with a host tier below the device, both tiers'; default `capacity`)."""
        self.config = config
        self.capacity = capacity
        self._fill = (cache_capacity or capacity) / capacity  # the whole cache's units per live-tier unit
        self._make_shadow = make_shadow
        self.sampler: Optional[ChainSampler] = None
        self.shadow_capacity = 0
        self._shadows: list = []
        self._ttls_seen = False
        self._candidates(config.settings)
        self._tree_hits = 0.0  # the live tree's own hits on the sampled requests, windowed as the shadows'
        self._since_halving = 0.0
        self._since_decision = 0.0
        self._window_units = 0.0  # sampled requests' units and number, windowed: their mean size
        self._window_requests = 0.0
        self._seen = 0.0  # units of sampled traffic so far
        self._warmup_units = 0
        self._requests = 0
        self._live = 0
        self._sampled = 0
        self._switches = 0

    @property
    def live(self) -> Setting:
        return self._settings[self._live]

    @property
    def shadows(self) -> Tuple[Tuple[Setting, Shadow], ...]:
        """(setting, its shadow cache) for each candidate; empty until the warm-up ends."""
        return tuple(self._shadows)

    def offer(self, keys: Sequence[Hashable], request, units: int, live_hit: float,
              carries_ttl: bool = False) -> Optional[Setting]:
        """A request of `units` passed `keys` (root first) in the live tree, which held `live_hit` units of it
        (`carries_ttl`: the client asked for retention). If its chain is sampled, every shadow serves `request`;
        returns the setting to switch the live policy to, or None to keep it."""
        self._requests += 1
        if self.sampler is None:
            self._ttls_seen |= carries_ttl
            self._warm_up(units)
            return None
        if not self.sampler.sampled(keys):
            return None
        self._sampled += 1
        hits = []
        for i, (_, shadow) in enumerate(self._shadows):
            hit, total = shadow.request(request)
            self._hits[i] += hit
            self._totals[i] += total
            hits.append(hit)
        self._pairs.add(hits)
        self._tree_hits += live_hit
        self._window_units += units
        self._window_requests += 1
        self._seen += units
        self._since_halving += units
        self._since_decision += units
        cap = self.shadow_capacity
        if self._since_decision < self.config.decide_capacities * cap:
            return None
        setting = self._choose()  # on the windowed rates
        self._since_decision = 0.0
        if self._since_halving >= self.config.window_capacities * cap:  # a window ended: age the rates
            self._since_halving = 0.0
            self._hits = [h * 0.5 for h in self._hits]
            self._totals = [t * 0.5 for t in self._totals]
            self._tree_hits *= 0.5
            self._window_units *= 0.5
            self._window_requests *= 0.5
            self._pairs.halve()
        return setting

    def _warm_up(self, units: int) -> None:
        """Learn the mean request size; then size the shadows to hold `min_shadow_requests` of them."""
        cfg = self.config
        self._warmup_units += units
        if self._requests < cfg.warmup_requests:
            return
        mean = self._warmup_units / self._requests
        rate = min(cfg.max_rate, max(cfg.sample_rate, cfg.min_shadow_requests * mean / self.capacity))
        self.shadow_capacity = max(1, int(self.capacity * rate))
        self.sampler = ChainSampler(rate, cfg.head_requests, cfg.head_memory, cfg.sample_seed)
        # a setting that ignores TTLs is its TTL twin on traffic without them: a shadow only where it can differ,
        # and always for the first (the live tree's start)
        self._candidates(tuple(s for i, s in enumerate(cfg.settings) if not i or s.honours_ttls or self._ttls_seen))
        self._shadows = [(s, self._make_shadow(s, self.shadow_capacity)) for s in self._settings]

    def _candidates(self, settings: Tuple[Setting, ...]) -> None:
        """The settings compared (the first stays first: the live one at the start), with empty counts for each."""
        self._settings = settings
        n = len(settings)
        self._hits, self._totals, self._pairs = [0.0] * n, [0.0] * n, PairedLeads(n)
        self._learned = [i for i, s in enumerate(settings) if s.order != "recency"]

    def _rate(self, i: int) -> float:
        return self._hits[i] / self._totals[i] if self._totals[i] else 0.0

    def _live_tree_rate(self) -> float:
        total = self._totals[self._live]  # every shadow was asked for the same sampled units as the tree
        return self._tree_hits / total if total else 0.0

    def _tracks_live_tree(self) -> bool:
        """Whether the live setting's miniature reads within `fidelity_factor` of the live tree's own rate."""
        shadow, tree = self._rate(self._live), self._live_tree_rate()
        return max(shadow, tree) <= self.config.fidelity_factor * min(shadow, tree)

    def _tie_goes_to_learned(self) -> Optional[int]:
        """Before the first switch, on recency: the best learned setting, if its miniature reads at least
        recency's and recency's has hits (a tie at no hits is no evidence: then only a lead moves the tree)."""
        if not (self.config.learned_on_tie and not self._switches and self.live.order == "recency" and self._learned):
            return None
        if self._seen < self.config.tie_capacities * self.shadow_capacity * self._fill:
            return None  # until the whole cache is full, the live tree drops nothing whatever it runs
        top = max(map(self._rate, self._learned))
        tied = [i for i in self._learned if self._rate(i) == top]
        # twins that read the same say nothing about TTLs: the live tree keeps its stance on them
        learned = next((i for i in tied if self._settings[i].honours_ttls == self.live.honours_ttls), tied[0])
        return learned if 0 < self._rate(self._live) <= top else None

    def _leads(self, i: int, j: int) -> bool:
        """Whether setting `i` reads more than `j` by the margin, and not within the sampling noise."""
        return self._rate(i) > self._rate(j) + self.config.margin and self._pairs.z(i, j) >= self.config.min_z

    def _twin_keeping_stance(self, best: int) -> int:
        """`best`'s twin with the live tree's stance on client TTLs, where that twin also reads more than the
        live setting by the margin and `best` does not lead it: a lead over the live setting says nothing about
        TTLs."""
        setting = self._settings[best]
        if setting.honours_ttls == self.live.honours_ttls:
            return best
        twin = next((i for i, s in enumerate(self._settings) if s.order == setting.order
                     and s.gate_threshold == setting.gate_threshold and s.honours_ttls == self.live.honours_ttls), None)
        if (twin is None or twin == self._live or self._rate(twin) <= self._rate(self._live) + self.config.margin
                or self._leads(best, twin)):
            return best
        return twin

    def _for_few_requests(self) -> Optional[int]:
        """Where the whole cache holds fewer than `few_requests` requests of the recent mean size: the learned
        setting that ignores TTLs (else the first learned one); otherwise None."""
        if not (self._learned and self._window_requests):
            return None
        mean = self._window_units / self._window_requests
        if self.capacity * self._fill >= self.config.few_requests * mean:
            return None
        return next((i for i in self._learned if not self._settings[i].honours_ttls), self._learned[0])

    def _by_shadows(self) -> Optional[int]:
        """The setting the shadows' readings move the live tree to, or None to keep it."""
        if not self._tracks_live_tree():
            return None
        best = self._tie_goes_to_learned()
        if best is None:
            if self._seen < self.config.min_capacities * self.shadow_capacity:
                return None
            best = max(range(len(self._shadows)), key=self._rate)
            if best == self._live or not self._leads(best, self._live):
                return None
            best = self._twin_keeping_stance(best)
        return best

    def _choose(self) -> Optional[Setting]:
        best = self._for_few_requests()
        best = self._by_shadows() if best is None else best
        if best is None or best == self._live:
            return None
        self._live = best
        self._switches += 1
        return self.live

    def stats(self) -> TuningStats:
        return TuningStats(
            live=self.live.name,
            sample_rate=self.sampler.rate if self.sampler is not None else 0.0,
            sampled_requests=self._sampled,
            switches=self._switches,
            shadow_hit_rates={s.name: round(self._rate(i), 6) for i, s in enumerate(self._settings)},
            live_tree_hit_rate=round(self._live_tree_rate(), 6),
        )
