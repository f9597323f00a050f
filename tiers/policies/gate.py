"""`reuse-gate`: the reuse gate (`_gate.py`) in front of plain LRU.

It shows what the gate does on its own: everything it admits competes by recency only (SGLang's order).
`tinylfu` puts the same gate in front of its class-density eviction.
"""

from __future__ import annotations

from typing import Hashable, Iterable, Optional

from tiers.clock import Clock
from tiers.policies._gate import ReuseGate
from tiers.policies.stock import LRUPolicy
from tiers.policy import Candidate, register_policy


@register_policy("reuse-gate")
class ReuseGatePolicy(LRUPolicy):
    def __init__(self, capacity: int, clock: Optional[Clock] = None, **gate):
        super().__init__(capacity, clock)
        self.gate = ReuseGate(capacity, **gate)

    def on_insert(self, entry, key, size, parent=None) -> None:
        super().on_insert(entry, key, size, parent)
        self.gate.opened(key, self.index.nodes[entry].depth, size)

    def on_resize(self, entry, new_size, new_parent, new_key=None) -> None:
        old_parent = self.index.nodes[entry].parent
        super().on_resize(entry, new_size, new_parent, new_key)
        if new_parent is not None and new_parent != old_parent:
            self.gate.withdraw(self.index.nodes[new_parent].key)

    def record(self, key) -> None:
        self.gate.record(key)

    def observe(self, hit: int, total: int) -> None:
        self.gate.observe(hit, total)

    def may_admit(self, candidate: Candidate) -> bool:
        return self.gate.admits(candidate, self.index.nodes)

    def admit(self, candidate: Candidate, victims: Iterable[Hashable]) -> bool:
        return self.may_admit(candidate)
