"""`python -m benchmarks soak`: many concurrent multi-turn sessions against a tiered server with a peer tier,
optionally with peer faults, then checks that nothing failed, nothing leaked and every answer was right.

Design
- Processes (all on 127.0.0.1, all stopped at the end whatever happened): one peer block server; the tiered
  server under test (`--tier-peers`, a small device pool so the host and peer tiers see traffic, a session TTL);
  a reference server of the same model with `--disable-radix-cache`. The reference is started beside the
  server under test and only used after the soak: each finished session's final turn is re-asked there and its
  greedy output must equal what the soak server answered under load. A cache-off server is the simplest
  oracle: it cannot be right by reusing the same (possibly wrong) cached KV. Final turns ask for their top-2
  log-probabilities: answers that part where the two best tokens are within rounding of each other (a bf16
  batch under load against a lone request) are counted as ties, apart from mismatches (greedy_compare.py).
- Load: `--sessions` threads, each running sessions one after another (a few turns each, prompt = previous
  prompt + answer + new words), under `--tenants` salts that share a per-tenant system prompt; half the
  sessions carry `cache_control` TTLs. About one request in ten is a bad input (invalid cache_control or
  salt) that must be a 4xx with a message. The run stops by itself after `--duration` seconds (sessions in
  flight finish their current request, each bounded by the request deadline).
- Faults (`--faults`, see soak_faults.py): peer killed and restarted, server restarted with the peer kept, peer
  frozen, host memory pressure, model weights rewritten in place. A fault must never be visible to a client
  as an error or a wrong answer; a probe prompt shows where a restarted server finds a prefix (the peer), and
  that after a weights change it finds it nowhere. The run is extended by the time the server swaps take, so
  the sessions get the whole `--duration` of load.
- The tiered server runs a host tier only 1.5x its device pool, so the host tier is full most of the run and
  prefixes come back from the peer tier.
- Checks after the load: `locks` in /tiers/stats reach zero (polled with a deadline: HiCache write-backs hold
  node locks until the copy is acknowledged); the host pool's used tokens equal the tokens of the tree's
  host-backed nodes; the peer's slots add up (used + writing + free = capacity); RSS of
  the server's process tree after warm-up vs at the end (with faults: the last server started).
- Memory over time (soak_memory.py): RSS per process (tokenizer, scheduler, detokenizer, peer) sampled every
  few seconds through the run, and its slope over the last half, per second and per request: warm-up growth
  flattens out, a per-request leak does not.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks import greedy_compare
from benchmarks.progress import Progress
from benchmarks.servers import PeerProcess, Server, peer_stats, start_server, tree_rss
from benchmarks.soak_faults import FaultInjector, LiveTarget
from benchmarks.soak_memory import RssSample, RssSampler, last_half_slopes, series_by_process

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
# Whole bodies for SGLang's other routes, each of which stopped the scheduler or was a 500 before the checks of
# 2026-12-06 (README, "One request cannot stop the server"); sent among the /generate ones above.
OTHER_ROUTE_BAD_INPUTS = (
    ("/v1/score", {"model": "default", "query": [], "items": [[]], "label_token_ids": [1]}),
    ("/api/generate", {"model": "default", "prompt": "soak", "options": {"top_k": 0, "num_predict": 1}}),
    ("/v1/messages/count_tokens", {"model": "default", "messages": []}),
    ("/v1/embeddings", {"model": "default", "input": "soak", "rid": []}),
    ("/api/chat", {"model": "default", "messages": [], "stream": False}),  # a 500 once the route served
)
LOCKS_DEADLINE_S = 60.0
REQUEST_TIMEOUT_S = 120.0
HOST_RATIO = "1.5"  # host tier = 1.5x the device pool: full most of the run
SERVER_ENV = {"UCX_NET_DEVICES": "lo"}


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
    rss_interval_s: float = 5.0  # RSS sampling period (doubles whenever the bounded series fills)
    peer_capacity_gb: float = 0.25  # a smaller peer fills (and evicts) within a run


@dataclass(frozen=True)
class SoakResult:
    sessions: int
    requests: int
    failures: int
    bad_inputs: int
    bad_input_failures: int
    faults_injected: int
    faults_by_kind: Dict[str, int]
    fault_log: Tuple[str, ...]
    probes: Dict[str, Dict[str, int]]  # cached tokens by tier of a known prompt after each server swap
    stale_hits_after_revision: int
    leaked_lock_refs: int
    locks: Dict[str, int]
    duration_s: float
    rss_warm_bytes: int
    rss_end_bytes: int
    rss_growth_bytes: int
    rss_growth_ratio: float
    rss_by_process: Dict[str, List[Tuple[float, int]]]  # soak_memory.series_by_process (and `requests`)
    rss_slope_bytes_per_s: Dict[str, float]  # by process, over the last half of the run
    rss_slope_bytes_per_request: Dict[str, float]
    hits_by_tier: Dict[str, int]
    prompt_tokens: int
    verified_sessions: int
    output_mismatches: int
    output_ties: int  # verified final turns that part from the reference at a numerical tie (greedy_compare)
    peer_used_pages: int
    host_used_tokens: int
    host_tree_tokens: int
    peer_slots: Dict[str, int]
    tier_counters: Dict[str, Dict[str, int]]  # /tiers/stats per tier at the end (the last server's)
    errors: Tuple[str, ...] = field(default=())
    notes: Tuple[str, ...] = field(default=())  # what is not a failure but worth reading (ties)

    @property
    def accounting_ok(self) -> bool:
        p = self.peer_slots
        # slots are conserved; some may still be `writing` (a write abandoned by a stopped server keeps its
        # lease until it runs out, then the slot is reclaimed)
        peer_ok = not p or p["used"] + p["writing"] + p["free"] == p["capacity"]
        return self.host_used_tokens == self.host_tree_tokens and peer_ok

    @property
    def ok(self) -> bool:
        return self.failures == 0 and self.bad_input_failures == 0 and self.leaked_lock_refs == 0 \
            and self.output_mismatches == 0 and self.stale_hits_after_revision == 0 and self.accounting_ok \
            and not any(self.locks.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "accounting_ok": self.accounting_ok, "ok": self.ok}


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
    notes: List[str] = field(default_factory=list)
    finals: List[Tuple[dict, dict, int]] = field(default_factory=list)  # (body, _comparable answer, weights revision)

    def error(self, msg: str) -> None:
        self._keep(self.errors, msg)

    def note(self, msg: str) -> None:
        self._keep(self.notes, msg)

    def _keep(self, messages: List[str], msg: str) -> None:
        with self.lock:
            if len(messages) < 20:  # the first few say what went wrong; the counters say how often
                messages.append(msg)


def _ask(server: Server, body: dict, route: str = "/generate") -> Tuple[int, object]:
    try:
        return server.post_status(route, body, timeout=REQUEST_TIMEOUT_S)
    except (OSError, ValueError) as e:  # timeouts, resets, unreadable bodies: all failures
        return -1, f"{type(e).__name__}: {e}"


def _bad_input(target: LiveTarget, rng: random.Random, tally: _Tally) -> None:
    route, bad = rng.choice([*(("/generate", b) for b in BAD_INPUTS), *OTHER_ROUTE_BAD_INPUTS])
    body = {"text": words(rng, 8), "sampling_params": {"max_new_tokens": 1, "temperature": 0}, **bad} \
        if route == "/generate" else bad
    status, answer, _ = target.ask(body, route)
    good = 400 <= status < 500 and isinstance(answer, dict) and bool(answer.get("message"))
    with tally.lock:
        tally.bad_inputs += 1
        tally.bad_input_failures += not good
    if not good:
        tally.error(f"bad input {route} {bad} -> {status}: {str(answer)[:200]}")


def _session(target: LiveTarget, cfg: SoakConfig, rng: random.Random, system: Dict[int, str], tally: _Tally,
             stop: threading.Event) -> None:
    tenant = rng.randrange(cfg.tenants)
    ttl = rng.choice([None, {"type": "ephemeral", "ttl": "30s"}, {"type": "ephemeral", "ttl": "5m"}])
    prompt = system[tenant] + " " + words(rng, rng.randint(40, 160))
    for turn in range(cfg.turns):
        if stop.is_set():
            return
        if rng.random() < 0.1:
            _bad_input(target, rng, tally)
        body = {"text": prompt, "cache_salt": f"soak-tenant-{tenant}", "return_cached_tokens_details": True,
                "sampling_params": {"max_new_tokens": cfg.max_new_tokens, "temperature": 0}}
        if ttl is not None:
            body["cache_control"] = ttl
        if turn == cfg.turns - 1:  # the turn re-asked on the reference: its top log-probs tell ties apart
            body.update(greedy_compare.request_fields())
        status, answer, revision = target.ask(body)
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
                tally.finals.append((body, _comparable(answer), revision))
            return
        prompt = prompt + answer["text"] + " " + words(rng, rng.randint(10, 40))


def _worker(target: LiveTarget, cfg: SoakConfig, index: int, system: Dict[int, str], tally: _Tally,
            stop: threading.Event) -> None:
    rng = random.Random(cfg.seed * 1000 + index)
    while not stop.is_set():
        _session(target, cfg, rng, system, tally, stop)


def _wait_locks_released(server: Server) -> Dict[str, int]:
    deadline = time.monotonic() + LOCKS_DEADLINE_S
    while True:
        locks = server.get("/tiers/stats").get("locks", {})
        if not any(locks.values()) or time.monotonic() > deadline:
            return locks
        time.sleep(0.5)  # write-backs finish asynchronously; bounded by the deadline above


def _comparable(answer: dict) -> dict:
    """What greedy_compare reads of an answer (the rest of it need not be kept for the whole run)."""
    return {"output_ids": answer["output_ids"],
            "meta_info": {"output_top_logprobs": answer["meta_info"].get("output_top_logprobs")}}


def _verify(reference: Server, finals: List[Tuple[dict, dict, int]], revision: int, limit: int,
            tally: _Tally) -> Tuple[int, int, int]:
    """Re-ask up to `limit` final turns answered by weights `revision` on the cache-off reference; returns
    (checked, mismatches, ties): a split at a numerical tie (greedy_compare) is counted apart, not failed."""
    checked = mismatches = ties = 0
    with tally.lock:
        mine = [(b, a) for b, a, r in tally.finals if r == revision][:limit]
    for body, answer in mine:
        ref_body = {k: v for k, v in body.items() if k not in ("cache_control", "cache_salt")}
        status, ref = _ask(reference, ref_body)
        checked += 1
        verdict = greedy_compare.compare(answer, ref) if status == 200 and isinstance(ref, dict) else None
        if verdict is not None and verdict.verdict == "tie":
            ties += 1
            tally.note(f"final turn parts from the cache-off reference at a tie ({verdict.describe()}): "
                       f"{answer['output_ids']} vs {ref['output_ids']}")
        elif verdict is None or verdict.verdict != "equal":
            mismatches += 1
            tally.error(f"final turn differs from the cache-off reference "
                        f"({verdict.describe() if verdict else status}): {answer['output_ids']} vs "
                        f"{ref.get('output_ids') if isinstance(ref, dict) else ref}")
    return checked, mismatches, ties


def _peer_slots(peer: PeerProcess) -> Dict[str, int]:
    """The peer's slot accounting at the end ({} if it does not answer)."""
    try:
        st = peer_stats(peer.port)
    except (OSError, RuntimeError):
        return {}
    return {"used": int(st["used_pages"]), "writing": int(st["writing_pages"]), "free": int(st["free_pages"]),
            "capacity": int(st["capacity_pages"]), "stored": int(st["stored"]), "evictions": int(st["evictions"]),
            "hits": int(st["hits"]), "misses": int(st["misses"])}


# 30 s was once too short while a whole test run shared the 2 cores (load average ~7)
PROBE_PEER_DEADLINE_S = 90.0
PROBE_RESEND_S = 2.0  # how often the probe is asked again while the peer lacks it


def _seed_probe(server: Server, peer: PeerProcess, text: str) -> str:
    """Compute `text` on `server` (the sessions are held), then wait (bounded) until the peer stored as many
    new pages as the prompt has full pages (page size 1 on CPU). Returns what it saw, for the fault log.

    The probe carries a TTL, which puts it in host memory (and so in the peer) at once while the live setting
    honours TTLs; once the self-tuner has chosen a setting that ignores them, the host tier admits the probe
    only when its policy says so, like any prefix. So the probe is asked again every `PROBE_RESEND_S` while
    the peer lacks it: each ask is another use of the prefix, as a returning client's would be."""
    try:
        before = int(peer_stats(peer.port)["stored"])
    except (OSError, RuntimeError) as e:
        return f"probe not seeded: peer stats failed ({e})"
    meta = _probe_meta(server, text)
    if meta is None:
        return "probe not seeded: the server did not answer it"
    tokens = int(meta["prompt_tokens"]) - 1
    start = last_ask = time.monotonic()
    stored, asks = before, 1
    while time.monotonic() < start + PROBE_PEER_DEADLINE_S:
        try:
            stored = int(peer_stats(peer.port)["stored"])
            if stored >= before + tokens:
                return (f"probe seeded: the peer took {stored - before} pages in {time.monotonic() - start:.1f}s "
                        f"({asks} ask{'s' if asks > 1 else ''})")
            if time.monotonic() - last_ask >= PROBE_RESEND_S:
                asks, last_ask = asks + 1, time.monotonic()
                _probe_meta(server, text)
            else:
                # An idle scheduler only turns host-copy acks into peer writes when its loop runs: a stats
                # request (handled by the scheduler) makes it run.
                server.get("/tiers/stats")
        except (OSError, RuntimeError) as e:
            return f"probe seeding stopped: {e}"
        time.sleep(0.5)  # write-through to the peer is asynchronous; bounded by the deadline above
    return (f"probe seeding timed out: the peer took {stored - before} of {tokens} pages in "
            f"{PROBE_PEER_DEADLINE_S:g}s ({asks} asks)")


def _probe_meta(server: Server, text: str) -> Optional[dict]:
    # A TTL: retained, so the host tier admits it even when full while the live setting honours TTLs.
    body = {"text": text, "cache_salt": "soak-probe", "return_cached_tokens_details": True,
            "cache_control": {"type": "ephemeral", "ttl": "5m"},
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    status, answer = _ask(server, body)
    return answer["meta_info"] if status == 200 and isinstance(answer, dict) else None


def _probe(server: Server, text: str) -> Dict[str, int]:
    """Cached tokens by tier for `text` (under the probe's own salt), or {"error": 1}."""
    meta = _probe_meta(server, text)
    if meta is None:
        return {"error": 1}
    details = meta.get("cached_tokens_details") or {"device": 0, "host": 0, "storage": 0}  # absent: no hit
    return {tier: int(n) for tier, n in details.items() if isinstance(n, int)}


def _start_both(args: List[str], ref_args: List[str], log_dir: Path) -> Tuple[Server, Server]:
    """Start the server under test and the reference concurrently (start-up is most of a short run)."""
    out: Dict[str, object] = {}

    def start(name: str, a: List[str]) -> None:
        try:
            out[name] = start_server(a, log_dir, name, env=SERVER_ENV)
        except Exception as e:  # reported below, after both attempts finished
            out[name] = e

    threads = [threading.Thread(target=start, args=("soak-tiered", args)),
               threading.Thread(target=start, args=("soak-reference", ref_args))]
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


def _host_accounting(stats: dict) -> Tuple[int, int]:
    """(host pool used tokens, tokens of host-backed tree nodes) from /tiers/stats."""
    host = stats.get("tiers", {}).get("host", {})
    tree = sum(t.get("host_tokens", 0) for t in stats.get("tenants", {}).values())
    return int(host.get("used_tokens", 0)), int(tree)


class _Fleet:
    """Every process of a run: the peer, the server under test, the cache-off reference, and the servers that
    replace them after a fault. `stop_all` stops every one ever started."""

    def __init__(self, cfg: SoakConfig, log_dir: Path):
        from sglang_ext.embedded_model import ensure_embedded_model

        self.log_dir = log_dir
        # A private copy of the model: the revision fault rewrites its weights in place.
        self.model_dir = log_dir / "model"
        shutil.rmtree(self.model_dir, ignore_errors=True)
        shutil.copytree(ensure_embedded_model(), self.model_dir)
        self.servers: List[Server] = []
        self.peer = PeerProcess(log_dir, capacity_gb=cfg.peer_capacity_gb).start()
        self.args = ["--model-path", str(self.model_dir), "--tier-peers", self.peer.address,
                     "--max-total-tokens", str(cfg.max_total_tokens), "--hicache-ratio", HOST_RATIO,
                     "--hicache-storage-prefetch-policy", "wait_complete",
                     "--tier-session-ttl", str(cfg.session_ttl_s), "--enable-cache-report", "--tier-stats-tenants"]
        self.ref_args = ["--model-path", str(self.model_dir), "--disable-radix-cache"]
        self.reference: Optional[Server] = None

    def start(self) -> Server:
        """Start the server under test and the reference; returns the server under test."""
        server, self.reference = _start_both(self.args, self.ref_args, self.log_dir)
        self.servers += [server, self.reference]
        return server

    def restart(self) -> Server:
        new = start_server(self.args, self.log_dir, f"soak-tiered-{len(self.servers)}", env=SERVER_ENV)
        self.servers.append(new)
        return new

    def restart_reference(self) -> None:
        self.reference.stop()
        self.reference = start_server(self.ref_args, self.log_dir, f"soak-reference-{len(self.servers)}",
                                      env=SERVER_ENV)
        self.servers.append(self.reference)

    def stop_all(self) -> None:
        for s in self.servers:
            s.stop()
        self.peer.stop()


class _Verifier:
    """Re-asks the final turns of each weights revision once, on the reference of that revision."""

    def __init__(self, fleet: _Fleet, tally: _Tally, per_revision: int):
        self.fleet, self.tally, self.per_revision = fleet, tally, per_revision
        self.done: set = set()
        self.verified = self.mismatches = self.ties = 0

    def __call__(self, revision: int) -> None:
        if revision in self.done:
            return
        self.done.add(revision)
        c, m, t = _verify(self.fleet.reference, self.tally.finals, revision, self.per_revision, self.tally)
        self.verified, self.mismatches, self.ties = self.verified + c, self.mismatches + m, self.ties + t


def _run_load(cfg: SoakConfig, target: LiveTarget, injector: FaultInjector, system: Dict[int, str],
              tally: _Tally, stop: threading.Event) -> Tuple[float, Server, int]:
    """Run the sessions (and the faults) for the run's duration; (seconds, server measured, its warm RSS)."""
    threads = [threading.Thread(target=_worker, args=(target, cfg, i, system, tally, stop), daemon=True)
               for i in range(cfg.sessions)]
    if cfg.faults:
        threads.append(threading.Thread(target=injector.run, daemon=True))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    stop.wait(min(cfg.duration_s * 0.15, 20.0))
    warm_server, warm_rss = target.server, tree_rss(target.server.proc.pid)  # after warm-up
    # The run gets `duration` of load: time spent swapping servers is added, and it ends after the last fault
    # (the injector's steps are bounded: gate, start and probe deadlines).
    faults_running = (lambda: threads[-1].is_alive()) if cfg.faults else (lambda: False)
    bar = Progress("soak", unit="requests")  # progress: rows and rate on a terminal (benchmarks.progress)
    while not stop.is_set():
        bar.update(tally.requests - bar.done)
        left = t0 + cfg.duration_s + injector.paused_s() - time.monotonic()
        if left <= 0 and not faults_running():  # the schedule always completes
            break
        stop.wait(min(max(left, 0.5), 5.0))
    bar.close()
    stop.set()
    for t in threads:
        t.join(REQUEST_TIMEOUT_S + 30)
    server = target.server
    if warm_server is not server:  # a fault swapped it: measure the last one from its warm state on
        warm_rss = injector.warm_rss
    return time.monotonic() - t0, server, warm_rss


def _final_state(server: Server, tally: _Tally) -> Tuple[Dict[str, int], dict]:
    """(locks once idle, /tiers/stats) of the server at the end."""
    try:
        return _wait_locks_released(server), server.get("/tiers/stats")
    except OSError as e:  # e.g. a swap left no server up: reported, not raised
        tally.error(f"the server did not answer after the run: {e}")
        return {"unanswered": 1}, {}


def run_soak(cfg: SoakConfig) -> SoakResult:
    log_dir = Path(cfg.log_dir or tempfile.mkdtemp(prefix="soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    fleet = _Fleet(cfg, log_dir)
    try:
        target = LiveTarget(fleet.start(), _ask)
        tally, stop = _Tally(), threading.Event()
        verifier = _Verifier(fleet, tally, max(1, cfg.verify_limit // 2) if cfg.faults else cfg.verify_limit)
        # Probes have a salt of their own: no session shares their prefix, so a hit is the probe's own pages.
        # Long enough (> SGLang's 256-token storage prefetch threshold) to be fetched from the peer.
        rng = random.Random(cfg.seed)
        system = {t: words(rng, rng.randint(120, 220)) for t in range(cfg.tenants)}
        probe_texts = [words(rng, 400) for _ in range(2)]
        injector = FaultInjector(
            peer=fleet.peer, target=target, duration_s=cfg.duration_s, stop=stop, model_dir=fleet.model_dir,
            restart=fleet.restart, restart_reference=fleet.restart_reference, verify=verifier,
            seed_probe=lambda srv, i: _seed_probe(srv, fleet.peer, probe_texts[i]),
            probe=lambda srv, i: _probe(srv, probe_texts[i]), seed=cfg.seed)
        sampler = RssSampler(lambda: target.server.proc.pid, lambda: fleet.peer.proc.pid,
                             lambda: tally.requests, interval_s=cfg.rss_interval_s).start()
        try:
            duration, server, warm_rss = _run_load(cfg, target, injector, system, tally, stop)
        finally:
            sampler.stop()
        locks, stats = _final_state(server, tally)
        verifier(target.revision)
        tally.errors[:0] = [c for c in (s.crash() for s in fleet.servers) if c]  # first: they explain the rest
        return _result(tally, injector, verifier, locks, stats, _peer_slots(fleet.peer), sampler.samples(),
                       duration, warm_rss, tree_rss(server.proc.pid))
    finally:
        fleet.stop_all()


def _result(tally: _Tally, injector: FaultInjector, verifier: _Verifier, locks: Dict[str, int], stats: dict,
            slots: Dict[str, int], samples: List[RssSample], duration: float, warm_rss: int,
            end_rss: int) -> SoakResult:
    host_used, host_tree = _host_accounting(stats)
    after_rev = injector.probes.get("after_revision_change", {})
    per_s, per_request = last_half_slopes(samples)
    return SoakResult(
        sessions=tally.sessions, requests=tally.requests, failures=tally.failures + len(injector.errors),
        bad_inputs=tally.bad_inputs, bad_input_failures=tally.bad_input_failures,
        faults_injected=sum(injector.counts.values()), faults_by_kind=dict(injector.counts),
        fault_log=tuple(injector.log), probes=dict(injector.probes),
        stale_hits_after_revision=sum(after_rev.values()),  # an unanswered probe counts too
        leaked_lock_refs=int(locks.get("locked_nodes", 0)),
        locks={k: int(v) for k, v in locks.items()}, duration_s=round(duration, 2),
        rss_warm_bytes=warm_rss, rss_end_bytes=end_rss, rss_growth_bytes=end_rss - warm_rss,
        rss_growth_ratio=round(end_rss / warm_rss - 1, 4) if warm_rss else 0.0,
        rss_by_process=series_by_process(samples), rss_slope_bytes_per_s=per_s,
        rss_slope_bytes_per_request=per_request,
        hits_by_tier=dict(sorted(tally.hits.items())), prompt_tokens=tally.prompt_tokens,
        verified_sessions=verifier.verified, output_mismatches=verifier.mismatches, output_ties=verifier.ties,
        peer_used_pages=slots.get("used", -1), host_used_tokens=host_used, host_tree_tokens=host_tree,
        peer_slots=slots,
        tier_counters={t: {k: v for k, v in c.items() if isinstance(v, int)}
                       for t, c in stats.get("tiers", {}).items()},
        errors=tuple(injector.errors + tally.errors), notes=tuple(tally.notes))


# --- CLI ---------------------------------------------------------------------------------------------


def add_arguments(p) -> None:
    from benchmarks.cli_types import float_in, gigabytes, positive_int

    p.add_argument("--duration", type=float_in(0, 3600, "seconds"), required=True, help="seconds of load (at most 3600)")
    p.add_argument("--sessions", type=positive_int, default=8, help="concurrent session threads")
    p.add_argument("--tenants", type=positive_int, default=3, help="distinct cache_salt values")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-total-tokens", type=positive_int, default=1500, help="device pool of the tiered server")
    p.add_argument("--faults", action="store_true",
                   help="peer kill/restart and freeze, server restart, host memory pressure, weights change")
    p.add_argument("--peer-capacity-gb", type=gigabytes, default=0.25,
                   help="the peer's pool (written once at its start: its RSS is flat from there)")
    p.add_argument("--log-dir", default=None, help="server logs (default: a new temp folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def main(args) -> int:
    cfg = SoakConfig(duration_s=args.duration, sessions=args.sessions, tenants=args.tenants, seed=args.seed,
                     faults=args.faults, max_total_tokens=args.max_total_tokens, log_dir=args.log_dir,
                     peer_capacity_gb=args.peer_capacity_gb)
    result = run_soak(cfg)
    if args.json:
        print(json.dumps(result.to_dict(), sort_keys=True))
        return 0 if result.ok else 1
    print(f"soak {result.duration_s:.0f}s: {result.sessions} sessions, {result.requests} requests, "
          f"{result.failures} failed; {result.bad_inputs} bad inputs, {result.bad_input_failures} not a clean 4xx")
    print(f"  faults injected  {result.faults_injected}  ({'; '.join(result.fault_log) or 'none'})")
    for name, tiers in result.probes.items():
        print(f"  probe {name:22s} cached tokens by tier {tiers}")
    print(f"  stale hits after the weights change  {result.stale_hits_after_revision}")
    print(f"  accounting       host pool {result.host_used_tokens} tokens vs tree {result.host_tree_tokens}; "
          f"peer slots {result.peer_slots}")
    for tier, c in result.tier_counters.items():
        print(f"  tier {tier:8s}    {c}")
    print(f"  locks when idle  {result.locks}  (leaked lock refs {result.leaked_lock_refs})")
    print(f"  rss              {result.rss_warm_bytes / 2**20:.0f} MiB after warm-up -> "
          f"{result.rss_end_bytes / 2**20:.0f} MiB at the end ({result.rss_growth_ratio:+.1%})")
    per_request = result.rss_slope_bytes_per_request
    print("  rss slope        over the last half: " + "; ".join(
        f"{name} {per_s / 2**10:+.1f} KiB/s ({per_request.get(name, 0) / 2**10:+.1f} KiB/request)"
        for name, per_s in sorted(result.rss_slope_bytes_per_s.items())))
    total = result.prompt_tokens or 1
    print("  hits by tier     " + ", ".join(f"{k} {v:,} ({v / total:.1%})" for k, v in result.hits_by_tier.items())
          + f" of {result.prompt_tokens:,} prompt tokens")
    print(f"  outputs          {result.verified_sessions} final turns re-asked cache-off, "
          f"{result.output_mismatches} differ, {result.output_ties} part at a numerical tie")
    for e in result.errors[:5]:
        print(f"  error: {e}")
    print("OK" if result.ok else "FAILED")
    return 0 if result.ok else 1
