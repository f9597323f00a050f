"""Built-in policies; importing this package registers them (lru, lfu, slru, tinylfu, recency, reuse-gate)."""

from tiers.policies import gate, recency, stock, tinylfu  # noqa: F401  (registration side effect)
