"""Tiers below the device (host DRAM, then a peer's DRAM), modelled as victim caches of whole blocks.

Model (the HiCache write-through shape): a block the device evicts is stored into the host tier unless the host
already holds a copy; a block the host evicts moves on to the peer tier; what the peer evicts is dropped. A
request whose device prefix ends at block k continues its prefix in the lower tiers: block k, k+1, ... each
found in the host (first) or the peer counts as a hit of that tier and is loaded back to the device. A tier
keeps its copy after a hit, so a later device eviction of that block costs no transfer.

Each tier is a flat cache (no tree: any block can be evicted) ranked by LRU ("lru", built in here), or by a
policy from the project's registry ("tinylfu", "tiered-lru", ...: `tiers.policy.create_policy`, every entry
with parent=None), which then also decides admission.

This model is not what a server runs: with the host tier on, the replay drives the server's host-tier class for
radix policies (benchmarks.host_engine), and HiCache's host memory is inclusive (a prompt is backed up when it is
inserted), not a victim cache (tests/benchmarks/test_host_replay.py shows where they part). It stays for the
reference engines' host rows (`opt`, `infinite`, ...) and for the peer tier, fed by host evictions.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple


class _LRU:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._order: "OrderedDict[int, None]" = OrderedDict()

    def __contains__(self, block: int) -> bool:
        return block in self._order

    def __len__(self) -> int:
        return len(self._order)

    def touch(self, block: int) -> None:
        self._order.move_to_end(block)

    def add(self, block: int) -> Tuple[bool, List[int]]:
        """(admitted, evicted blocks)."""
        evicted = []
        while len(self._order) >= self.capacity:
            evicted.append(self._order.popitem(last=False)[0])
        self._order[block] = None
        return True, evicted


class _RegistryPolicyTier:
    """A flat tier ranked by a policy from tiers.policy (parent=None for every entry)."""

    def __init__(self, name: str, capacity: int, clock):
        from tiers.policy import Candidate, create_policy

        self._candidate = Candidate
        self.capacity = capacity
        self.policy = create_policy(name[len("tiered-"):] if name.startswith("tiered-") else name, capacity, clock=clock)
        self._blocks: set = set()

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def touch(self, block: int) -> None:
        self.policy.record(block)
        self.policy.on_access(block)

    def add(self, block: int) -> Tuple[bool, List[int]]:
        self.policy.record(block)
        victims: List[int] = []
        if len(self._blocks) >= self.capacity:
            victims = list(self.policy.victims(len(self._blocks) + 1 - self.capacity))
            if not self.policy.admit(self._candidate(key=block, size=1), victims):
                return False, []
        for v in victims:
            self._blocks.discard(v)
            self.policy.on_remove(v)
        self._blocks.add(block)
        self.policy.on_insert(block, key=block, size=1, parent=None)
        return True, victims


@dataclass(frozen=True)
class TierSpec:
    name: str
    capacity_blocks: int


@dataclass
class TierCounters:
    hit_blocks: int = 0
    hit_tokens: int = 0
    loaded_tokens: int = 0  # tier -> device
    stored_tokens: int = 0  # into this tier from the tier above
    evicted_blocks: int = 0
    rejected_blocks: int = 0


def lower_policy_names():
    from benchmarks.engines import tiered_policy_names

    names = tiered_policy_names()
    return ["lru"] + [f"tiered-{n}" for n in names] + [n for n in names if n != "lru"]


class LowerTiers:
    """An ordered chain of victim tiers (e.g. host, then peer)."""

    def __init__(self, specs: Sequence[TierSpec], policy: str = "lru", clock=None, block_tokens: int = 512):
        self.names = [s.name for s in specs]
        self.block_tokens = block_tokens
        self._tiers = []
        for s in specs:
            if s.capacity_blocks <= 0:
                raise ValueError(f"tier {s.name!r} must hold at least one block")
            tier = _LRU(s.capacity_blocks) if policy == "lru" else _RegistryPolicyTier(policy, s.capacity_blocks, clock)
            self._tiers.append(tier)
        self.counters: Dict[str, TierCounters] = {s.name: TierCounters() for s in specs}

    def lookup(self, blocks: Sequence[int], start: int, sizes: Sequence[int]) -> Dict[str, int]:
        """Continue a prefix from `start`: blocks found per tier (counted and loaded) until the first miss."""
        found = {n: 0 for n in self.names}
        for i in range(start, len(blocks)):
            tier_name = None
            for name, tier in zip(self.names, self._tiers):
                if blocks[i] in tier:
                    tier.touch(blocks[i])
                    tier_name = name
                    break
            if tier_name is None:
                break
            c = self.counters[tier_name]
            c.hit_blocks += 1
            c.hit_tokens += sizes[i]
            c.loaded_tokens += sizes[i]
            found[tier_name] += 1
        return found

    def demote(self, blocks: Sequence[int]) -> None:
        """Blocks the device dropped flow down the chain."""
        for block in blocks:
            self._push(0, block)

    def _push(self, level: int, block: int) -> None:
        if level >= len(self._tiers):
            return
        tier, c = self._tiers[level], self.counters[self.names[level]]
        if block in tier:
            tier.touch(block)
            return
        admitted, evicted = tier.add(block)
        if not admitted:
            c.rejected_blocks += 1
            return
        c.stored_tokens += self.block_tokens
        c.evicted_blocks += len(evicted)
        for e in evicted:
            self._push(level + 1, e)
