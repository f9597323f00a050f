"""A debug hook, off by default: where does a server process's memory grow?

`SGLANG_EXT_MEMORY_DEBUG=DIR` makes every process that loads the plugin (the HTTP/tokenizer process and each
scheduler) write to `DIR/<title>-<pid>.txt`, every `SGLANG_EXT_MEMORY_DEBUG_INTERVAL_S` seconds (default 30),
the growth since the hook started of its live objects by type (gc) and of torch tensor storage bytes by dtype
and trailing shape. With `SGLANG_EXT_TRACEMALLOC=1` it also traces Python allocations and adds the source lines
whose allocations grew most (slow: a traced server takes minutes to start on a busy machine). The file is
rewritten each time, so it holds the latest comparison (a server stopped with SIGKILL leaves its last one).
Native allocations (oneDNN caches, malloc arenas) show in neither: a process whose RSS grows while both stay
flat grows outside Python objects and tensors. `SGLANG_EXT_MALLOC_TRIM_PROBE=1` replaces the census by a line
per interval in `DIR/<title>-<pid>-trim.txt`: RSS before and after `malloc_trim(0)` (freed heap that glibc kept
resident comes back; live native memory stays).

For investigations only, never in a measured run.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc
from pathlib import Path

ENV_DIR = "SGLANG_EXT_MEMORY_DEBUG"
ENV_TRACEMALLOC = "SGLANG_EXT_TRACEMALLOC"  # "1": also trace Python allocations (slow: start-up takes minutes)
ENV_INTERVAL = "SGLANG_EXT_MEMORY_DEBUG_INTERVAL_S"
ENV_TRIM_PROBE = "SGLANG_EXT_MALLOC_TRIM_PROBE"  # "1": no census; each interval, RSS before and after malloc_trim(0)
FRAMES = 1  # the allocating line only: deeper tracebacks made each report take minutes in a busy scheduler
TOP = 25

_started = False


def install_from_env() -> None:
    """Start the hook if SGLANG_EXT_TRACEMALLOC names a folder; never raises (it runs inside the server)."""
    global _started
    out = os.environ.get(ENV_DIR)
    if not out or _started:
        return
    try:
        interval = float(os.environ.get(ENV_INTERVAL, "30"))
        Path(out).mkdir(parents=True, exist_ok=True)
        _started = True
        if os.environ.get(ENV_TRACEMALLOC) == "1":
            tracemalloc.start(FRAMES)
        loop = _trim_loop if os.environ.get(ENV_TRIM_PROBE) == "1" else _dump_loop
        thread = threading.Thread(target=loop, args=(Path(out), interval), name="sglang_ext-memory-debug",
                                  daemon=True)
        thread.start()
    except Exception:  # a debug aid must not stop a server
        return


def _title() -> str:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            first = f.read().split(b"\0")[0].decode(errors="replace").strip()
    except OSError:
        first = "python"
    return first.split("::")[-1].split()[0] if "::" in first else "main"


def _dump_loop(out: Path, interval_s: float) -> None:
    tracing = tracemalloc.is_tracing()
    base = tracemalloc.take_snapshot() if tracing else None
    base_census = object_census()
    t0 = time.monotonic()
    path = out / f"{_title()}-{os.getpid()}.txt"
    while True:
        time.sleep(interval_s)  # a debug thread's period, not an ordering of events
        try:
            census = census_report(base_census, object_census(), time.monotonic() - t0)
            if tracing:
                write_report(path, base, tracemalloc.take_snapshot(), time.monotonic() - t0)
                with open(path, "a") as f:
                    f.write(census)
            else:
                path.write_text(census)
        except Exception:
            continue


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _trim_loop(out: Path, interval_s: float) -> None:
    """Free-but-unreturned heap memory: RSS before and after glibc's malloc_trim(0), appended each interval.
    What trim gives back is fragmentation (freed, still resident); what stays is live native memory."""
    from sglang_ext.heap_trim import libc_trim

    trim = libc_trim()
    if trim is None:
        return
    path = out / f"{_title()}-{os.getpid()}-trim.txt"
    t0 = time.monotonic()
    while True:
        time.sleep(interval_s)  # a debug thread's period, not an ordering of events
        try:
            before = _rss()
            t1 = time.perf_counter()
            trim(0)
            took = time.perf_counter() - t1
            with open(path, "a") as f:
                f.write(f"{time.monotonic() - t0:.0f}s rss {before >> 20} MiB -> {_rss() >> 20} MiB "
                        f"after trim ({took * 1e3:.1f} ms)\n")
        except Exception:
            continue


def object_census() -> dict:
    """Live objects gc tracks, by type: {name: count}; torch tensors also by (dtype, trailing shape) with
    their storage bytes (tensors' memory is native, invisible to tracemalloc)."""
    import gc
    import sys

    torch = sys.modules.get("torch")
    counts: dict = {}
    seen = set()
    for obj in gc.get_objects():
        name = type(obj).__name__
        counts[name] = counts.get(name, 0) + 1
        if torch is not None and isinstance(obj, torch.Tensor):
            try:
                storage = obj.untyped_storage()
                ptr, nbytes = storage.data_ptr(), storage.nbytes()
            except Exception:
                continue
            if ptr in seen:
                continue
            seen.add(ptr)
            key = f"tensor {obj.dtype} [*, {', '.join(map(str, tuple(obj.shape)[1:]))}] bytes"
            counts[key] = counts.get(key, 0) + nbytes
    return counts


def census_report(base: dict, now: dict, elapsed_s: float) -> str:
    grown = sorted(((now[k] - base.get(k, 0), k) for k in now), reverse=True)[:TOP]
    return f"\nafter {elapsed_s:.0f}s, live objects (count, or bytes for tensors), growth since start:\n" + "".join(
        f"  {diff:+d}  {key} (now {now[key]})\n" for diff, key in grown)


def write_report(path: Path, base: tracemalloc.Snapshot, now: tracemalloc.Snapshot, elapsed_s: float) -> None:
    current, peak = tracemalloc.get_traced_memory()
    lines = [f"after {elapsed_s:.0f}s: traced {current / 2**20:.1f} MiB (peak {peak / 2**20:.1f} MiB)", ""]
    for stat in now.compare_to(base, "lineno")[:TOP]:
        lines.append(f"{stat.size_diff / 2**20:+.2f} MiB, {stat.count_diff:+d} blocks "
                     f"(now {stat.size / 2**20:.2f} MiB in {stat.count} blocks)")
        lines.extend("    " + line for line in stat.traceback.format())
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)
