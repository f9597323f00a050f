"""Cache policies and tier logic: pure Python, no sglang import (see tiers/policy.py for the interface)."""
