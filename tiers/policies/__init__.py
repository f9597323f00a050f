"""Built-in policies; importing this package registers them (lru, lfu, slru, tinylfu, reuse-gate)."""

from tiers.policies import gate, stock, tinylfu  # noqa: F401  (registration side effect)
