"""`python -m benchmarks soak`: many concurrent multi-turn sessions against a tiered server with a peer tier,
optionally with peer faults, then checks that nothing failed, nothing leaked and every answer was right.

Design
- Processes (all on 127.0.0.1, all stopped at the end whatever happened): one peer block server; the tiered
  server under test (`--tier-peers`, a small device pool so the host and peer tiers see traffic, a session TTL);
  a reference server of the same model with `--disable-radix-cache`. The reference is started beside the
  server under test and only used after the soak: each finished session's final turn is re-asked there and its
  greedy output must equal what the soak server answered under load. A cache-off server is the simplest
  oracle: it cannot be right by reusing the same (possibly wrong) cached KV.
- Load: `--sessions` threads, each running sessions one after another (a few turns each, prompt = previous
  prompt + answer + new words), under `--tenants` salts that share a per-tenant system prompt; half the
  sessions carry `cache_control` TTLs. About one request in ten is a bad input (invalid cache_control or
  salt) that must be a 4xx with a message. The run stops by itself after `--duration` seconds (sessions in
  flight finish their current request, each bounded by the request deadline).
- Faults (`--faults`): the peer is SIGKILLed and restarted on the same port, then frozen (SIGSTOP) for longer
  than the client's peer timeout and thawed. A tier fault must never be visible to a client.
- Checks after the load: `locks` in /tiers/stats reach zero (polled with a deadline: HiCache write-backs hold
  node locks until the copy is acknowledged), RSS of the server's process tree after warm-up vs at the end.
"""

from __future__ import annotations

import json
import random
import signal
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks.servers import PeerProcess, Server, peer_stats, start_server

WORDS = ("cache token prefix session tenant model server request reply host device peer memory block page tree "
         "agent tool plan step answer question context window retry budget").split()
BAD_INPUTS = (
    {"cache_control": {"type": "ephemeral", "ttl": "-5m"}},
    {"cache_control": {"type": "persistent"}},
    {"cache_control": "ephemeral"},
    {"cache_control": {"type": "ephemeral", "ttl": "5m", "scope": "global"}},
    {"cache_salt": 42},
    {"cache_salt": ""},
    {"cache_salt": ["a", None]},
)
LOCKS_DEADLINE_S = 60.0
REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class SoakConfig:
    duration_s: float
    sessions: int = 8
    tenants: int = 3
    seed: int = 0
    faults: bool = False
    turns: int = 4
    max_new_tokens: int = 6
    max_total_tokens: int = 1500
    session_ttl_s: float = 120.0
    verify_limit: int = 60  # final turns re-asked on the reference (the first N finished sessions)
    log_dir: Optional[str] = None


@dataclass(frozen=True)
class SoakResult:
    sessions: int
    requests: int
    failures: int
    bad_inputs: int
    bad_input_failures: int
    faults_injected: int
    fault_log: Tuple[str, ...]
    leaked_lock_refs: int
    locks: Dict[str, int]
    duration_s: float
    rss_warm_bytes: int
    rss_end_bytes: int
    rss_growth_bytes: int
    rss_growth_ratio: float
    hits_by_tier: Dict[str, int]
    prompt_tokens: int
    verified_sessions: int
    output_mismatches: int
    peer_used_pages: int
    errors: Tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.failures == 0 and self.bad_input_failures == 0 and self.leaked_lock_refs == 0 \
            and self.output_mismatches == 0

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


# --- processes ---------------------------------------------------------------------------------------


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (SGLang's scheduler and detokenizer are children)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


# --- load --------------------------------------------------------------------------------------------


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


@dataclass
class _Tally:
    """Shared by the session threads; every update holds `lock`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: int = 0
    failures: int = 0
    bad_inputs: int = 0
    bad_input_failures: int = 0
    sessions: int = 0
    prompt_tokens: int = 0
    hits: Dict[str, int] = field(default_factory=dict)
    errors: List[str] = field(default_factory=list)
    finals: List[Tuple[dict, List[int]]] = field(default_factory=list)  # (request body, output_ids)

    def error(self, msg: str) -> None:
        with self.lock:
            if len(self.errors) < 20:
                self.errors.append(msg)


def _ask(server: Server, body: dict) -> Tuple[int, object]:
    try:
        return server.post_status("/generate", body, timeout=REQUEST_TIMEOUT_S)
    except (OSError, ValueError) as e:  # timeouts, resets, unreadable bodies: all failures
        return -1, f"{type(e).__name__}: {e}"


def _bad_input(server: Server, rng: random.Random, tally: _Tally) -> None:
    bad = rng.choice(BAD_INPUTS)
    body = {"text": words(rng, 8), "sampling_params": {"max_new_tokens": 1, "temperature": 0}, **bad}
    status, answer = _ask(server, body)
    good = 400 <= status < 500 and isinstance(answer, dict) and bool(answer.get("message"))
    with tally.lock:
        tally.bad_inputs += 1
        tally.bad_input_failures += not good
    if not good:
        tally.error(f"bad input {bad} -> {status}: {str(answer)[:200]}")


def _session(server: Server, cfg: SoakConfig, rng: random.Random, system: Dict[int, str], tally: _Tally,
             stop: threading.Event) -> None:
    tenant = rng.randrange(cfg.tenants)
    ttl = rng.choice([None, {"type": "ephemeral", "ttl": "30s"}, {"type": "ephemeral", "ttl": "5m"}])
    prompt = system[tenant] + " " + words(rng, rng.randint(40, 160))
    for turn in range(cfg.turns):
        if stop.is_set():
            return
        if rng.random() < 0.1:
            _bad_input(server, rng, tally)
        body = {"text": prompt, "cache_salt": f"soak-tenant-{tenant}", "return_cached_tokens_details": True,
                "sampling_params": {"max_new_tokens": cfg.max_new_tokens, "temperature": 0}}
        if ttl is not None:
            body["cache_control"] = ttl
        status, answer = _ask(server, body)
        ok = status == 200 and isinstance(answer, dict) and "output_ids" in answer
        with tally.lock:
            tally.requests += 1
            tally.failures += not ok
            if ok:
                meta = answer["meta_info"]
                tally.prompt_tokens += meta.get("prompt_tokens", 0)
                for tier, n in (meta.get("cached_tokens_details") or {}).items():
                    if isinstance(n, int):
                        tally.hits[tier] = tally.hits.get(tier, 0) + n
        if not ok:
            tally.error(f"turn {turn} -> {status}: {str(answer)[:300]}")
            return
        if turn == cfg.turns - 1:
            with tally.lock:
                tally.sessions += 1
                tally.finals.append((body, answer["output_ids"]))
            return
        prompt = prompt + answer["text"] + " " + words(rng, rng.randint(10, 40))


def _worker(server: Server, cfg: SoakConfig, index: int, system: Dict[int, str], tally: _Tally,
            stop: threading.Event) -> None:
    rng = random.Random(cfg.seed * 1000 + index)
    while not stop.is_set():
        _session(server, cfg, rng, system, tally, stop)


def _inject_faults(peer: PeerProcess, cfg: SoakConfig, stop: threading.Event, log: List[str]) -> None:
    """Kill + restart at ~25% of the run, freeze for 3 s (> the 2 s peer timeout) at ~60%."""
    t0 = time.monotonic()

    def at(fraction: float) -> bool:  # waits on `stop` so the run never outlives its duration
        return not stop.wait(max(0.0, t0 + fraction * cfg.duration_s - time.monotonic()))

    if at(0.25):
        peer.kill()
        log.append(f"{time.monotonic() - t0:.1f}s SIGKILL peer")
        stop.wait(2.0)  # the peer stays dead a while: requests meanwhile must not notice
        peer.start()
        log.append(f"{time.monotonic() - t0:.1f}s peer restarted on port {peer.port}")
    if at(0.6):
        peer.signal(signal.SIGSTOP)
        log.append(f"{time.monotonic() - t0:.1f}s SIGSTOP peer")
        stop.wait(3.0)
        peer.signal(signal.SIGCONT)
        log.append(f"{time.monotonic() - t0:.1f}s SIGCONT peer")


def _wait_locks_released(server: Server) -> Dict[str, int]:
    deadline = time.monotonic() + LOCKS_DEADLINE_S
    while True:
        locks = server.get("/tiers/stats").get("locks", {})
        if not any(locks.values()) or time.monotonic() > deadline:
            return locks
        time.sleep(0.5)  # write-backs finish asynchronously; bounded by the deadline above


def _verify(reference: Server, finals: List[Tuple[dict, List[int]]], limit: int, tally: _Tally) -> Tuple[int, int]:
    checked = mismatches = 0
    for body, output_ids in finals[:limit]:
        ref_body = {k: v for k, v in body.items() if k not in ("cache_control", "cache_salt")}
        status, answer = _ask(reference, ref_body)
        checked += 1
        if status != 200 or answer.get("output_ids") != output_ids:
            mismatches += 1
            tally.error(f"final turn differs from the cache-off reference: {output_ids} vs "
                        f"{answer.get('output_ids') if isinstance(answer, dict) else answer}")
    return checked, mismatches


def _peer_used_pages(peer: PeerProcess) -> int:
    """Pages the peer holds at the end (-1 if it does not answer): shows the write-back reached the peer tier."""
    try:
        return int(peer_stats(peer.port)["used_pages"])
    except (OSError, RuntimeError, KeyError):
        return -1


def _start_both(args: List[str], log_dir: Path) -> Tuple[Server, Server]:
    """Start the server under test and the reference concurrently (start-up is most of a short run)."""
    out: Dict[str, object] = {}

    def start(name: str, a: List[str]) -> None:
        try:
            out[name] = start_server(a, log_dir, name, env={"UCX_NET_DEVICES": "lo"})
        except Exception as e:  # reported below, after both attempts finished
            out[name] = e

    threads = [threading.Thread(target=start, args=("soak-tiered", args)),
               threading.Thread(target=start, args=("soak-reference", ["--disable-radix-cache"]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [v for v in out.values() if isinstance(v, Exception)]
    if errors:
        for v in out.values():
            if isinstance(v, Server):
                v.stop()
        raise RuntimeError(f"could not start servers: {errors[0]}")
    return out["soak-tiered"], out["soak-reference"]


def run_soak(cfg: SoakConfig) -> SoakResult:
    log_dir = Path(cfg.log_dir or tempfile.mkdtemp(prefix="soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    peer = PeerProcess(log_dir).start()
    server = reference = None
    try:
        server, reference = _start_both(
            ["--tier-peers", peer.address, "--max-total-tokens", str(cfg.max_total_tokens),
             "--tier-session-ttl", str(cfg.session_ttl_s), "--enable-cache-report"], log_dir)
        rng = random.Random(cfg.seed)
        system = {t: words(rng, rng.randint(120, 220)) for t in range(cfg.tenants)}
        tally, stop, fault_log = _Tally(), threading.Event(), []
        threads = [threading.Thread(target=_worker, args=(server, cfg, i, system, tally, stop), daemon=True)
                   for i in range(cfg.sessions)]
        if cfg.faults:
            threads.append(threading.Thread(target=_inject_faults, args=(peer, cfg, stop, fault_log), daemon=True))
        t0 = time.monotonic()
        for t in threads:
            t.start()
        stop.wait(min(cfg.duration_s * 0.15, 20.0))
        rss_warm = tree_rss(server.proc.pid)  # after warm-up: pools allocated, first batches run
        stop.wait(max(0.0, t0 + cfg.duration_s - time.monotonic()))
        stop.set()
        for t in threads:
            t.join(REQUEST_TIMEOUT_S + 30)
        duration = time.monotonic() - t0
        locks = _wait_locks_released(server)
        rss_end = tree_rss(server.proc.pid)
        verified, mismatches = _verify(reference, tally.finals, cfg.verify_limit, tally)
        peer_pages = _peer_used_pages(peer)
        return SoakResult(
            sessions=tally.sessions, requests=tally.requests, failures=tally.failures,
            bad_inputs=tally.bad_inputs, bad_input_failures=tally.bad_input_failures,
            faults_injected=sum(1 for line in fault_log if "SIGKILL" in line or "SIGSTOP" in line),
            fault_log=tuple(fault_log), leaked_lock_refs=int(locks.get("locked_nodes", 0)),
            locks={k: int(v) for k, v in locks.items()}, duration_s=round(duration, 2),
            rss_warm_bytes=rss_warm, rss_end_bytes=rss_end, rss_growth_bytes=rss_end - rss_warm,
            rss_growth_ratio=round(rss_end / rss_warm - 1, 4) if rss_warm else 0.0,
            hits_by_tier=dict(sorted(tally.hits.items())), prompt_tokens=tally.prompt_tokens,
            verified_sessions=verified, output_mismatches=mismatches, peer_used_pages=peer_pages, errors=tuple(tally.errors))
    finally:
        for s in (server, reference):
            if s is not None:
                s.stop()
        peer.stop()


# --- CLI ---------------------------------------------------------------------------------------------


def add_arguments(p) -> None:
    from benchmarks.cli_types import positive_int

    def positive_float(text: str) -> float:
        import argparse

        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not 0 < value <= 3600:
            raise argparse.ArgumentTypeError(f"must be in (0, 3600] seconds, got {text}")
        return value

    p.add_argument("--duration", type=positive_float, required=True, help="seconds of load (at most 3600)")
    p.add_argument("--sessions", type=positive_int, default=8, help="concurrent session threads")
    p.add_argument("--tenants", type=positive_int, default=3, help="distinct cache_salt values")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-total-tokens", type=positive_int, default=1500, help="device pool of the tiered server")
    p.add_argument("--faults", action="store_true", help="kill/restart and freeze/thaw the peer during the run")
    p.add_argument("--log-dir", default=None, help="server logs (default: a new temp folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def main(args) -> int:
    cfg = SoakConfig(duration_s=args.duration, sessions=args.sessions, tenants=args.tenants, seed=args.seed,
                     faults=args.faults, max_total_tokens=args.max_total_tokens, log_dir=args.log_dir)
    result = run_soak(cfg)
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
        return 0 if result.ok else 1
    print(f"soak {result.duration_s:.0f}s: {result.sessions} sessions, {result.requests} requests, "
          f"{result.failures} failed; {result.bad_inputs} bad inputs, {result.bad_input_failures} not a clean 4xx")
    print(f"  faults injected  {result.faults_injected}  ({'; '.join(result.fault_log) or 'none'})")
    print(f"  locks when idle  {result.locks}  (leaked lock refs {result.leaked_lock_refs})")
    print(f"  rss              {result.rss_warm_bytes / 2**20:.0f} MiB after warm-up -> "
          f"{result.rss_end_bytes / 2**20:.0f} MiB at the end ({result.rss_growth_ratio:+.1%})")
    total = result.prompt_tokens or 1
    print("  hits by tier     " + ", ".join(f"{k} {v:,} ({v / total:.1%})" for k, v in result.hits_by_tier.items())
          + f" of {result.prompt_tokens:,} prompt tokens")
    print(f"  peer tier        {result.peer_used_pages} pages held at the end")
    print(f"  outputs          {result.verified_sessions} final turns re-asked cache-off, "
          f"{result.output_mismatches} differ")
    for e in result.errors[:5]:
        print(f"  error: {e}")
    print("OK" if result.ok else "FAILED")
    return 0 if result.ok else 1
