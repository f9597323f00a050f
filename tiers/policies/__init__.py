"""Built-in policies; importing this package registers them (lru, lfu, slru, tinylfu, wtinylfu)."""

from tiers.policies import stock, tinylfu, wtinylfu  # noqa: F401  (registration side effect)
