"""Real servers for tests: see benchmarks/servers.py (shared with the live benchmark and the soak)."""

import time

from benchmarks.servers import REQUEST_DEADLINE_S, ROOT, Server, free_port, start_server  # noqa: F401


# /tiers/stats values that move with the clock alone (rates and shares over a sliding window, sampled gauges): not
# state a request changes, so tests that check "this request changed nothing" compare the rest.
WINDOWED = ("_per_s", "window_s", "thrashing", "evicted_lifetime", "evicted_never_hit_share", "fragmentation")


def counts_only(stats):
    if isinstance(stats, dict):
        return {k: counts_only(v) for k, v in stats.items() if not any(w in k for w in WINDOWED)}
    if isinstance(stats, list):
        return [counts_only(v) for v in stats]
    return stats


def stats_now(server) -> dict:
    """/tiers/stats without its windowed values."""
    return counts_only(server.get("/tiers/stats"))


SETTLE_DEADLINE_S = 30.0


def settled_stats(server) -> dict:
    """/tiers/stats (counts) once two reads in a row agree: the tail of an earlier 200 (its last insert into the
    tree) may land after its HTTP answer, and must not be blamed on the next request."""
    deadline = time.monotonic() + SETTLE_DEADLINE_S
    last = stats_now(server)
    while True:
        now = stats_now(server)
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def served_model(server) -> str:
    """The served model's name, which /v1/responses requires (it refuses "default", which the other routes take)."""
    return server.get("/v1/models")["data"][0]["id"]
