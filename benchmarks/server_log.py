"""What a server's log says: the pools and chunk size it built (its start-up log), and the prefill passes it ran.

The log, not /get_server_info: that would run our plugin's internal-state hook, which a stock tree cache does not
support (it stops the scheduler of the `hicache` server). Every reader returns None where the log has no answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from benchmarks.servers import Server


def logged_int(server: Server, pattern: str) -> Optional[int]:
    """The number `pattern`'s group matches first in the server's log; None if not found."""
    try:
        found = re.search(pattern, server.log_path.read_text(errors="replace"))
    except OSError:
        return None
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class PrefillBatches:
    """The prefill passes a server logged during a run (SGLang logs each: `Prefill batch, #new-seq: n, ...`) and
    the requests they carried (a chunked request is counted in each pass it takes)."""
    passes: int
    requests: int


def log_size(server: Server) -> int:
    try:
        return server.log_path.stat().st_size
    except OSError:
        return 0


def logged_prefill_batches(server: Server, start: int) -> Optional[PrefillBatches]:
    """The prefill passes in the server's log after byte `start` (None: no log, or none logged). With many
    requests in flight this is the batch the server really ran, which the in-flight twin bounds from above."""
    try:
        with open(server.log_path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    counts = [int(n) for n in re.findall(r"Prefill batch[^\n]*?#new-seq: (\d+)", text)]
    return PrefillBatches(len(counts), sum(counts)) if counts else None


def server_chunk_tokens(server: Server) -> Optional[int]:
    """The server's `chunked_prefill_size` (the server_args line)."""
    return logged_int(server, r"'chunked_prefill_size': (-?\d+)")


def server_pool_tokens(server: Server) -> Optional[int]:
    """The device pool the server really built (SGLang may cap --max-total-tokens at what it profiled)."""
    return logged_int(server, r"max_total_num_tokens=(\d+)")


def server_host_pool_tokens(server: Server) -> Optional[int]:
    """The host pool a HiCache server built: SGLang adds a page to int(device x ratio)."""
    return logged_int(server, r"hierarchical KV host pool: (\d+) tokens")
