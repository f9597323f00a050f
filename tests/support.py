"""Real servers for tests: see benchmarks/servers.py (shared with the live benchmark and the soak)."""

from benchmarks.servers import REQUEST_DEADLINE_S, ROOT, Server, free_port, start_server  # noqa: F401
