"""TierView: one `tiers` policy over the nodes of SGLang's radix tree that are resident on one tier.

Design note
-----------
HiRadixCache keeps one tree for two tiers: a node is on the device while `value` is set and on the host while
`host_value` is set. TieredHiRadixCache gives each tier its own policy instance and tells it, through a
TierView, when a node becomes resident there (`add`), is used (`access`), is split (`split`) or leaves
(`remove`). The view keeps the set of its members, so the cache (and the tests) can check the policy's
view against the tree.

Residency is closed upward on both tiers: a device node's parent is on the device (`load_back` loads the
whole evicted chain below the deepest device node; eviction takes device leaves only), and a host node's
parent is on the host (`write_backup` refuses a node whose parent is not backed up; host eviction takes host
leaves only). So a member's parent is a member or the root, and a leaf of the policy's tree (no member
children) is what HiRadixCache calls an evictable leaf of that tier, locks aside; locks are the
`protected` predicate of `victims`.

Retention (tiers.retention) is shared by both views: each policy is wrapped so that retained nodes are its
victims last. A node that leaves the device for the host (a demotion) keeps its retention (`remove(...,
keep_retention=True)`); leaving its last tier releases it.

A notification the policy refuses (a parent it never heard of, a node it already tracks) means its view
drifted from the tree: strict mode (tests) raises, otherwise it is logged and membership follows the tree.

Threading: the scheduler thread only, like the tree.
"""

from __future__ import annotations

import logging
import time

from tiers.policy import Policy
from tiers.retention import Retention, RetainingPolicy

logger = logging.getLogger(__name__)


class TierView:
    def __init__(self, tier: str, policy: Policy, retention: Retention, root, strict: bool = False):
        self.tier = tier
        self.inner = policy
        self.policy = RetainingPolicy(policy, retention)
        self.members: set = set()
        self.calls = 0  # policy calls made through this view, and their time (perf_counter_ns)
        self.ns = 0
        self._root = root
        self._strict = strict

    def __contains__(self, node) -> bool:
        return node in self.members

    def charge(self, t0: int, calls: int = 1) -> int:
        """Count `calls` policy calls and the time since `t0` (perf_counter_ns) as this tier's policy cost; returns
        that time."""
        ns = time.perf_counter_ns() - t0
        self.ns += ns
        self.calls += calls
        return ns

    def drift(self, msg: str) -> None:
        """The policy's view and the tree disagree: raise in strict mode, else log."""
        msg = f"{self.tier} policy {self.inner.name!r}: {msg}"
        if self._strict:
            raise RuntimeError(msg)
        logger.warning(msg)

    def _parent_entry(self, node):
        parent = node.parent
        if parent is self._root or parent is None:
            return None
        if parent not in self.members:
            self.drift(f"node {node.id}'s parent {parent.id} is not on this tier; tracked at the root level")
            return None
        return parent

    # ---- notifications ----
    def add(self, node, key) -> None:
        """`node` is now resident on this tier (its parent already is, or is the root)."""
        if node in self.members:
            return
        t0 = time.perf_counter_ns()
        try:
            self.policy.on_insert(node, key, len(node.key), self._parent_entry(node))
        except (KeyError, ValueError) as e:
            self.drift(f"could not add node {node.id}: {e}")
            return
        finally:
            self.charge(t0)
        self.members.add(node)

    def access(self, node) -> None:
        """A request used `node` (not a hit refresh of its retention: match_prefix does that)."""
        if node in self.members:
            t0 = time.perf_counter_ns()
            self.inner.on_access(node)
            self.charge(t0)

    def remove(self, node, keep_retention: bool = False) -> None:
        """`node` left this tier; `keep_retention`: it is still cached on another tier."""
        if node not in self.members:
            return
        self.members.discard(node)
        t0 = time.perf_counter_ns()
        try:
            (self.inner.on_remove if keep_retention else self.policy.on_remove)(node)
        except (KeyError, ValueError) as e:
            self.drift(f"could not remove node {node.id}: {e}")
        finally:
            self.charge(t0)

    def split(self, front, back) -> None:
        """SGLang split `back` into `front` -> `back`; `front` carries `back`'s old key (`front.tier_key`)."""
        if back not in self.members:
            return
        self.add(front, front.tier_key)
        t0 = time.perf_counter_ns()
        try:
            self.policy.on_resize(back, len(back.key), front if front in self.members else None, back.tier_key)
        except (KeyError, ValueError) as e:
            self.drift(f"could not resize node {back.id}: {e}")
        finally:
            self.charge(t0)

    def record(self, keys, hit: int, total: int) -> None:
        """A request asked for `keys` (its path and its new remainder's) and found `hit` of `total` here."""
        t0 = time.perf_counter_ns()
        policy = self.policy
        for key in keys:
            policy.record(key)
        policy.observe(hit, total)
        self.charge(t0, len(keys) + 1)

    # ---- decisions ----
    def victims(self, size: int, protected) -> list:
        t0 = time.perf_counter_ns()
        try:
            return self.policy.victims(size, protected)
        finally:
            self.charge(t0)

    def admits(self, candidate, victims_of) -> bool:
        """`may_admit`, then `admit` against the victims `victims_of()` names (queried only if needed); False
        when it names none (nothing could make room)."""
        t0 = time.perf_counter_ns()
        policy, calls = self.policy, 1
        try:
            if not policy.may_admit(candidate):
                return False
            victims = victims_of()
            calls += 2
            return bool(victims) and policy.admit(candidate, victims)
        finally:
            self.charge(t0, calls)
