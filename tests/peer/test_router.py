"""sglang-router (PyPI, cache-aware policy) in front of two tiered SGLang replicas that share one peer server.

What the router does, observed on the pinned sglang-router 0.3.2 (HTTP workers, text prompts):
- while in-flight loads are balanced (its default thresholds) it keeps a prefix tree of the texts it routed per
  worker: a prompt that matches one worker's texts (over `--cache-threshold` of its characters) goes back to that
  worker; one that matches none goes to the least-loaded healthy worker (in-flight requests it counts), the first
  listed on a tie;
- a failed upstream request is retried on the worker the policy picks again (up to `--retry-max-retries`), so a
  dead worker costs errors until its circuit breaker opens or a health check marks it unhealthy; an unhealthy
  worker stays listed but is skipped, and a prompt whose prefix it held goes to the first healthy worker.
The tests run in file order on one module-scoped cluster; the last one kills a replica.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List

import pytest

from benchmarks.fleet_replay import FAILOVER_ROUTER_ARGS, ROUTING_KEY_HEADER, served_requests
from benchmarks.router import start_router, stop_router, wait_healthy_workers, worker_loads
from benchmarks.servers import PeerProcess, peer_stats, wait_for_peer_pages
from tests.peer.test_two_servers import words
from tests.support import REQUEST_DEADLINE_S, Server, start_server

pytestmark = pytest.mark.server
# Fast health checks, so that a killed replica is marked unhealthy within seconds (default: every 60 s).
ROUTER_ARGS = ["--policy", "cache_aware", *FAILOVER_ROUTER_ARGS]
REPLICA_ARGS = ["--max-total-tokens", "2000", "--hicache-storage-prefetch-policy", "wait_complete",
                "--enable-cache-report", "--enable-metrics"]
FAILOVER_DEADLINE_S = 60.0
BUSY_DEADLINE_S = 30.0


@dataclass
class Cluster:
    peer: PeerProcess
    replicas: List[Server]
    router: Server


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    logs = tmp_path_factory.mktemp("router")
    peer = PeerProcess(logs).start()
    replicas: List[Server] = []
    router = None
    try:
        args = ["--tier-peers", peer.address, *REPLICA_ARGS]
        # in parallel: each replica takes most of a minute to start on a loaded machine
        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(start_server, args, logs, f"replica-{n}", env={"UCX_NET_DEVICES": "lo"})
                       for n in "ab"]
            errors = []
            for f in futures:
                try:
                    replicas.append(f.result())
                except Exception as e:  # keep the one that started, so the finalizer stops it
                    errors.append(e)
            if errors:
                raise errors[0]
        router = start_router([r.url for r in replicas], logs, ROUTER_ARGS)
        yield Cluster(peer, replicas, router)
    finally:
        if router is not None:
            stop_router(router)
        for r in replicas:
            r.stop()
        peer.stop()


def served(replica: Server) -> int:
    """Requests the replica finished (SGLang's own `sglang:num_requests_total`; health checks are not counted)."""
    return served_requests(replica)


def served_by(cluster: Cluster) -> Dict[str, int]:
    return {r.url: served(r) for r in cluster.replicas}


def delta(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, int]:
    return {url: after[url] - before[url] for url in before}


def test_routed_request_gets_the_replicas_greedy_output(cluster):
    prompt = words(11, 200)
    direct = cluster.replicas[1].generate(prompt, max_new_tokens=16)
    before = served_by(cluster)
    routed = cluster.router.generate(prompt, max_new_tokens=16)
    assert sum(delta(before, served_by(cluster)).values()) == 1  # one upstream request, no retry
    assert routed["output_ids"] == direct["output_ids"]
    assert routed["text"] == direct["text"]


def test_a_fresh_prompt_goes_to_the_idle_replica_while_the_other_is_busy(cluster):
    """No prefix match: cache-aware routing falls back to the least-loaded replica, so both serve traffic."""
    router = cluster.router
    before = served_by(cluster)
    # a long decode (EOS ignored) keeps one replica busy while the second prompt is routed
    slow_body = {"text": words(21, 200), "sampling_params": {"max_new_tokens": 96, "temperature": 0,
                                                             "ignore_eos": True}}
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(router.post, "/generate", slow_body)
        deadline = time.monotonic() + BUSY_DEADLINE_S
        while not any(worker_loads(router).values()):
            assert not slow.done(), "the slow request finished before the router counted it in flight"
            assert time.monotonic() < deadline, "the router never counted the slow request in flight"
            time.sleep(0.05)  # polling the router's in-flight counter, bounded by the deadline above
        busy = [url for url, load in worker_loads(router).items() if load > 0]
        quick = router.generate(words(22, 200))
        slow.result(timeout=REQUEST_DEADLINE_S)
    counts = delta(before, served_by(cluster))
    assert len(busy) == 1
    assert counts == {url: 1 for url in counts}, counts  # one request each: both replicas served traffic
    assert quick["meta_info"]["completion_tokens"] > 0


def test_a_repeated_prompt_goes_back_to_its_replica_and_hits_its_cache(cluster):
    prompt = words(31, 400)
    before = served_by(cluster)
    first = cluster.router.generate(prompt, return_cached_tokens_details=True)
    second = cluster.router.generate(prompt, return_cached_tokens_details=True)
    counts = delta(before, served_by(cluster))
    assert sorted(counts.values()) == [0, 2], counts  # both on the replica that computed the prefix
    # (the first may match a token or two of another prompt's start: the prompts share one small vocabulary)
    assert second["meta_info"]["cached_tokens"] >= second["meta_info"]["prompt_tokens"] - 2, second["meta_info"]
    assert second["meta_info"]["cached_tokens"] > first["meta_info"]["cached_tokens"]
    assert second["output_ids"] == first["output_ids"]


def test_a_routing_key_keeps_generate_and_openai_requests_on_one_replica(cluster, tmp_path):
    """sglang-router's manual policy reads the sticky key from a header, which a client sends alike on /generate and
    on the OpenAI routes (a second router over the same replicas)."""
    router = start_router([r.url for r in cluster.replicas], tmp_path, ["--policy", "manual"], name="manual")
    try:
        for key in ("session-a", "session-b", "session-c"):
            before = served_by(cluster)
            for n in range(2):
                status, _ = router.post_status("/generate", {"text": words(51 + n, 50), "sampling_params": {
                    "max_new_tokens": 2, "temperature": 0}}, headers={ROUTING_KEY_HEADER: key})
                assert status == 200
                status, _ = router.post_status("/v1/chat/completions", {
                    "model": "default", "messages": [{"role": "user", "content": words(61 + n, 50)}],
                    "max_tokens": 2, "temperature": 0}, headers={ROUTING_KEY_HEADER: key})
                assert status == 200
            counts = delta(before, served_by(cluster))
            assert sorted(counts.values()) == [0, 4], (key, counts)  # all four on the key's replica
    finally:
        stop_router(router)


def test_killed_replica_router_fails_over_and_the_peer_serves_its_prefix(cluster):
    router, peer = cluster.router, cluster.peer
    prompt = words(41, 400)
    pages_before = peer_stats(peer.port)["used_pages"]
    before = served_by(cluster)
    reference = router.generate(prompt, return_cached_tokens_details=True)
    counts = delta(before, served_by(cluster))
    owner = next(r for r in cluster.replicas if counts[r.url] == 1)
    survivor = next(r for r in cluster.replicas if r is not owner)
    assert counts[survivor.url] == 0
    # the owner's write-back to the peer is asynchronous: wait until the prompt's pages are there
    wait_for_peer_pages(peer.port, pages_before + reference["meta_info"]["prompt_tokens"] - 1)
    survivor_before = served(survivor)

    os.killpg(owner.proc.pid, signal.SIGKILL)
    owner.proc.wait(timeout=30)

    # The router's prefix tree still sends this prompt to the dead owner: it answers 5xx (after its own retries,
    # all on the owner) until the owner's circuit breaker opens or a health check marks it unhealthy, then routes
    # the prompt to the survivor. With checks every second the health check usually wins and no request fails;
    # either way, retry, bounded by attempts and a deadline.
    deadline = time.monotonic() + FAILOVER_DEADLINE_S
    failures: List[object] = []
    for _ in range(200):
        status, answer = router.post_status("/generate", {
            "text": prompt, "sampling_params": {"max_new_tokens": 8, "temperature": 0},
            "return_cached_tokens_details": True})
        if status == 200:
            break
        failures.append((status, answer))
        assert time.monotonic() < deadline, f"router never answered after the kill: {failures[-3:]}"
        time.sleep(0.2)  # retrying against another process's state, bounded by the deadline above
    else:
        pytest.fail(f"router never answered after the kill: {failures[-3:]}")
    assert all(status >= 500 for status, _ in failures), failures
    assert answer["output_ids"] == reference["output_ids"]
    # the survivor never computed this prompt: its prefix came from the peer tier
    assert (answer["meta_info"]["cached_tokens_details"] or {}).get("storage", 0) > 0, answer["meta_info"]
    assert served(survivor) == survivor_before + 1

    # health-based removal: the router reports one healthy worker, and a fresh prompt is answered first time
    state = wait_healthy_workers(router, 1, FAILOVER_DEADLINE_S)
    assert state["total_workers"] == 2, state
    fresh = router.generate(words(42, 100))
    assert fresh["meta_info"]["completion_tokens"] > 0
    assert served(survivor) == survivor_before + 2
