"""Built-in policies; importing this package registers them (lru, lfu, slru, tinylfu, wtinylfu, reuse-gate)."""

from tiers.policies import gate, stock, tinylfu, wtinylfu  # noqa: F401  (registration side effect)
