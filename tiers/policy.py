"""The interface every cache policy implements, and the registry that names them.

A policy decides two things for one tier: which cached blocks leave when room is needed (`victims`) and
whether a new block may come in at the cost of those victims (`admit`). It never frees memory itself: the
tier (SGLang's radix tree on the device, the host pool, a peer's DRAM pool) owns the data and tells the
policy what happened through the `on_*` notifications.

Entries are opaque hashable handles chosen by the tier (a tree node, a page key). Each entry has a size in
tokens (or any unit the tier counts capacity in) and optionally a parent: a tree tier passes the parent so
that the policy only offers leaves as victims (evicting an inner node would strand its cached descendants).
A flat tier passes `parent=None` for every entry.

Contracts
- `victims()` is a query: it forgets nothing and frees nothing ("all or nothing": the tier either evicts
  exactly the returned entries, in order, calling `on_remove` for each, or evicts nothing). A policy may
  rebalance its own internal regions during the query;
  that keeps it consistent whichever way the tier goes.
- The order returned is always removable one by one: every entry is a leaf once the ones before it are gone.
- `protected(entry)` is true for entries that must stay (locked by a running request); they and their
  ancestors are never returned.
- Time comes from the injected `Clock`; nothing reads the wall clock.

Threading: a policy is not thread-safe. The tier that owns it calls it under the tier's own lock (in
SGLang, the scheduler thread that owns the tree).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Dict, Hashable, Iterable, List, Optional, Type

from tiers.clock import Clock, MonotonicClock


@dataclass(frozen=True)
class Candidate:
    """A block that wants to enter the tier."""

    key: Hashable  # the tier's key for the block (a tree tier: a hash of its path); what frequency counts
    size: int
    parent: Optional[Hashable] = None  # entry it would hang under in a tree tier (None: root level / flat)
    retained: bool = False  # the request asked to keep it (a session TTL): learned bars do not apply


class Policy(ABC):
    """Base class: subclasses own their state; optional hooks default to no-ops."""

    name: str = ""

    def __init__(self, capacity: int, clock: Optional[Clock] = None):
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.clock = clock or MonotonicClock()

    # --- notifications from the tier ---
    @abstractmethod
    def on_insert(self, entry: Hashable, key: Hashable, size: int, parent: Optional[Hashable] = None) -> None:
        """`entry` is now cached, `size` units, child of `parent` (None: root level / flat tier)."""

    @abstractmethod
    def on_access(self, entry: Hashable) -> None:
        """`entry` was used by a request (a hit, or the path of a new insert)."""

    @abstractmethod
    def on_remove(self, entry: Hashable) -> None:
        """`entry` left the tier (evicted, demoted, or dropped)."""

    def on_resize(
        self, entry: Hashable, new_size: int, new_parent: Optional[Hashable], new_key: Optional[Hashable] = None
    ) -> None:
        """A tree split `entry`: it now holds `new_size` units under `new_parent` (the split's new node, which
        the tier reported with `on_insert` just before, under `entry`'s old key); `new_key` is `entry`'s key
        from now on (None: unchanged). Policies give the new parent `entry`'s standing."""

    def record(self, key: Hashable) -> None:
        """A request asked for `key` (hit or miss). Frequency-based policies count it."""

    def observe(self, hit: int, total: int) -> None:
        """A request found `hit` of its `total` units cached. Adaptive policies tune themselves on it."""

    # --- decisions ---
    @abstractmethod
    def victims(self, size: int, protected: Callable[[Hashable], bool] = lambda e: False) -> List[Hashable]:
        """Entries to evict, in order, totalling at least `size` units (fewer if not enough can go)."""

    def may_admit(self, candidate: Candidate) -> bool:
        """A first verdict that does not depend on the victims (a learned bar, say). False declines
        `candidate` and the tier skips the victim query; True leaves the decision to `admit`, which must
        still give the whole verdict for a caller that never asks this."""
        return True

    def admit(self, candidate: Candidate, victims: Iterable[Hashable]) -> bool:
        """Whether `candidate` is worth evicting `victims`. Recency policies always admit."""
        return True


_REGISTRY: Dict[str, Type[Policy]] = {}


def register_policy(name: str) -> Callable[[Type[Policy]], Type[Policy]]:
    def wrap(cls: Type[Policy]) -> Type[Policy]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"policy {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return wrap


def policy_names() -> List[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def policy_class(name: str) -> Type[Policy]:
    """The class of a registered name, or of `package.module:ClassName` for an out-of-tree one."""
    _load_builtin()
    if ":" in name:
        module, _, cls_name = name.partition(":")
        return getattr(importlib.import_module(module), cls_name)
    if name in _REGISTRY:
        return _REGISTRY[name]
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(sorted(_REGISTRY))}")


def create_policy(name: str, capacity: int, clock: Optional[Clock] = None, **config) -> Policy:
    """A policy by registered name, or by `package.module:ClassName` for an out-of-tree one."""
    return policy_class(name)(capacity, clock=clock, **config)


def _load_builtin() -> None:
    importlib.import_module("tiers.policies")  # registers the built-in policies on import
