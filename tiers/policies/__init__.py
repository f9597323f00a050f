"""Built-in policies; importing this package registers them (lru, lfu, slru, tinylfu)."""

from tiers.policies import stock, tinylfu  # noqa: F401  (registration side effect)
