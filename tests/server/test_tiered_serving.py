"""The tiered cache in SGLang's serving path (issue: admission, TTL, tenants, live), against stock SGLang."""

import json
import random
import re
import urllib.request

import pytest

from tests.support import start_server, stats_now

WORDS = "cache token prefix session tenant model server request reply host device peer memory block page tree".split()
TTL = {"type": "ephemeral", "ttl": "5m"}
SMALL_POOL = ["--max-total-tokens", "1200", "--enable-cache-report"]


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


@pytest.fixture(scope="module")
def tiered_small(server_logs):
    # the learned policy pinned (no self-tuner): these tests are about its admission and retention while serving;
    # the tuner, which starts on recency, has its own server below
    server = start_server(SMALL_POOL + ["--enable-metrics", "--tier-stats-tenants", "--tier-shadow-rate", "0",
                                        "--tier-max-request-mb", "1"], server_logs, "tiered-small")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tuned_small(server_logs):
    # the default policy with full-size shadows: a 1,200-token pool holds four requests, too few for a miniature;
    # at most two open sessions
    server = start_server(SMALL_POOL + ["--tier-shadow-rate", "1", "--tier-max-open-sessions", "2"], server_logs,
                          "tuned-small")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stock_small(server_logs):
    server = start_server(SMALL_POOL, server_logs, "stock-small", kind="stock")
    yield server
    server.stop()


def chat(server, messages, cache_control=None, **extra):
    body = {"model": "default", "messages": messages, "max_tokens": 4, "temperature": 0, **extra}
    if cache_control is not None:
        body["cache_control"] = cache_control
    return server.post("/v1/chat/completions", body)


def metric(text: str, event: str, tier: str = "device") -> float:
    """One `sglang_ext_tier_events_total` counter from a /metrics page (0 before it first moves)."""
    for line in text.splitlines():
        if line.startswith("sglang_ext_tier_events_total{") and f'event="{event}"' in line and f'tier="{tier}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


VOCAB = 2048  # the embedded model's
FLOOD_PROMPTS = 30


def flood_scenario(server, seed: int):
    """A session warms a 250-word system prompt over 3 turns with a 5m TTL, then 30 one-shot 280-token prompts
    (7x the 1200-token device pool) flood the server; returns (warm prompt tokens, next turn's hit)."""
    messages = [{"role": "system", "content": words(seed, 250)}]
    for turn in range(3):
        messages.append({"role": "user", "content": words(seed + 10 + turn, 20)})
        reply = chat(server, messages, TTL)
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
    warm_prompt = reply["usage"]["prompt_tokens"]
    flood(server, seed)
    messages.append({"role": "user", "content": words(seed + 99, 20)})
    details = chat(server, messages, TTL)["usage"]["prompt_tokens_details"] or {}  # None: nothing cached
    return warm_prompt, details.get("cached_tokens", 0)


def flood(server, seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(FLOOD_PROMPTS):  # distinct from their first token on: nothing in them is ever reused
        server.generate(input_ids=[rng.randrange(100, VOCAB) for _ in range(280)], max_new_tokens=2)


def anthropic_flood_scenario(server, seed: int):
    """The flood scenario from an Anthropic client: `cache_control` on its `system` block (Anthropic's own field),
    three turns on /v1/messages, the flood, then the next turn's prompt asked as the same chat without
    `cache_control` (/v1/messages reports no cached tokens); returns (warm prompt tokens, that request's hit)."""
    system = words(seed, 250)
    messages = []
    for turn in range(3):
        messages.append({"role": "user", "content": words(seed + 10 + turn, 20)})
        body = {"model": "default", "max_tokens": 4, "temperature": 0, "messages": messages,
                "system": [{"type": "text", "text": system, "cache_control": TTL}]}
        reply = server.post("/v1/messages", body)
        messages.append({"role": "assistant", "content": "".join(block["text"] for block in reply["content"])})
    flood(server, seed)
    messages.append({"role": "user", "content": words(seed + 99, 20)})
    details = chat(server, [{"role": "system", "content": system}] + messages)["usage"]["prompt_tokens_details"] or {}
    return reply["usage"]["input_tokens"], details.get("cached_tokens", 0)


def test_flood_retained_session_hits_on_tiered_and_misses_on_stock(tiered_small, stock_small):
    """Guards session TTL retention end to end: stock SGLang (LRU) loses the session's prefix to the flood."""
    rejected = lambda: tiered_small.get("/tiers/stats")["tiers"]["device"]["admissions_rejected"]  # noqa: E731
    rejected_before = rejected()
    warm, tiered_hit = flood_scenario(tiered_small, seed=1)
    stock_warm, stock_hit = flood_scenario(stock_small, seed=1)
    print(f"flood scenario: tiered cached {tiered_hit}/{warm}, stock cached {stock_hit}/{stock_warm}, "
          f"tiered declined {rejected() - rejected_before} one-shot suffixes")
    assert warm == stock_warm
    assert tiered_hit >= warm
    assert stock_hit < warm // 4
    # the device admission acts while serving: under pool pressure, one-shot suffixes are declined
    assert rejected() > rejected_before


def test_an_anthropic_clients_cache_control_keeps_its_session_through_the_flood(tiered_small, stock_small):
    """Anthropic's `cache_control` on /v1/messages, which SGLang ignores (it builds the chat request of a fixed list
    of fields): ours retains the session as the chat route's does, and stock SGLang loses it to the flood."""
    retains = lambda: tiered_small.get("/tiers/stats")["tiers"]["device"]["retains"]  # noqa: E731
    retains_before = retains()
    warm, tiered_hit = anthropic_flood_scenario(tiered_small, seed=3)
    assert retains() > retains_before  # only the /v1/messages turns carry a cache_control
    stock_warm, stock_hit = anthropic_flood_scenario(stock_small, seed=3)
    assert warm == stock_warm
    assert tiered_hit >= warm
    assert stock_hit < warm // 4


def scan_between_hot_prompts(server, n: int, seed: int) -> float:
    """Three hot 150-token prompts, each asked again every ninth request, between one-shot 280-token prompts
    (four of them fill the pool); the share of the hot prompts' tokens served from cache in the second half."""
    rng = random.Random(seed)
    hot = [[rng.randrange(100, VOCAB) for _ in range(150)] for _ in range(3)]
    cached = total = 0
    for i in range(n):
        if i % 3:
            server.generate(input_ids=[rng.randrange(100, VOCAB) for _ in range(280)], max_new_tokens=1)
            continue
        reply = server.generate(input_ids=hot[(i // 3) % 3] + [rng.randrange(100, VOCAB)], max_new_tokens=1)
        if i >= n // 2:
            cached += reply["meta_info"]["cached_tokens"]
            total += 150
    return cached / total


def test_the_self_tuner_leaves_recency_when_a_scan_flushes_the_hot_set_and_stock_does_not(tuned_small, stock_small):
    """The tuner acts while serving: it starts on recency (SGLang's LRU), its shadows see the learned settings
    keep the hot prompts through the scan, and the live policy follows; stock keeps losing them."""
    tuned = scan_between_hot_prompts(tuned_small, 240, seed=5)
    stock = scan_between_hot_prompts(stock_small, 240, seed=5)
    tuning = tuned_small.get("/tiers/stats")["tuning"]
    print(f"scan: hot prompts cached {tuned:.2f} (tuned) vs {stock:.2f} (stock); tuner {tuning}")
    assert tuning["live"] != "lru-no-ttl" and tuning["switches"] >= 1 and tuning["sample_rate"] == 1.0
    assert tuning["shadow_hit_rates"][tuning["live"]] > tuning["shadow_hit_rates"]["lru-no-ttl"]
    assert stock < 0.2 and tuned > stock + 0.4


def test_two_tenants_never_share_cached_tokens(tiered_small):
    # The flood before this leaves the pool under pressure with a learner that declines one-shot prompts: start
    # from empty pools, where every prompt is admitted (admission under pressure is tested by the flood test).
    assert "Cache flushed" in tiered_small.get("/flush_cache")
    prompt = words(20, 200)
    a1 = tiered_small.generate(prompt, cache_salt="tenant-a")
    b1 = tiered_small.generate(prompt, cache_salt="tenant-b")
    a2 = tiered_small.generate(prompt, cache_salt="tenant-a")
    assert b1["meta_info"]["cached_tokens"] == 0
    assert a2["meta_info"]["cached_tokens"] >= a1["meta_info"]["prompt_tokens"] - 1
    assert a1["output_ids"] == b1["output_ids"] == a2["output_ids"]


def test_tenants_never_share_in_the_host_tier(hicache_server):
    # Other modules flood this shared server. Start from empty pools: a full host tier admits a prompt only if the
    # host policy says so (tested on its own in tests/sglang_ext/test_host_tier_cache.py).
    assert "Cache flushed" in hicache_server.get("/flush_cache")
    prompt = words(21, 250)
    hicache_server.generate(prompt, cache_salt="host-a", return_cached_tokens_details=True)
    for seed in (22, 23):  # push the prompt out of the 600-token device pool into the host tier
        hicache_server.generate(words(seed, 300), cache_salt="host-a")
    before, metrics_before = hicache_server.get("/tiers/stats"), hicache_server.get("/metrics")
    b = hicache_server.generate(prompt, cache_salt="host-b", return_cached_tokens_details=True)
    a = hicache_server.generate(prompt, cache_salt="host-a", return_cached_tokens_details=True)
    after, metrics_after = hicache_server.get("/tiers/stats"), hicache_server.get("/metrics")
    assert b["meta_info"]["cached_tokens"] == 0
    host_hit = a["meta_info"]["cached_tokens_details"]["host"]
    assert host_hit > 0
    # the host hit is counted on the host tier, in /tiers/stats and in Prometheus
    assert after["tiers"]["host"]["hit_tokens"] - before["tiers"]["host"]["hit_tokens"] == host_hit
    assert after["tiers"]["host"]["hit_requests"] == before["tiers"]["host"]["hit_requests"] + 1
    assert (metric(metrics_after, "hit_tokens", "host") - metric(metrics_before, "hit_tokens", "host")
            == host_hit)


def test_a_flush_releases_the_host_tier_retention(hicache_server):
    """Guards TieredHiRadixCache.reset: retained tokens of a flushed tree would otherwise hold the TTL budget."""
    hicache_server.generate(words(24, 120), cache_salt="flush",
                            cache_control={"type": "ephemeral", "ttl": "5m"})
    assert hicache_server.get("/tiers/stats")["counters"]["retained_tokens"] > 0
    assert "Cache flushed" in hicache_server.get("/flush_cache")
    after = hicache_server.get("/tiers/stats")
    assert after["counters"]["retained_tokens"] == 0
    assert after["tiers"]["host"]["used_tokens"] == 0


INVALID_CACHE_CONTROL = [
    {"type": "ephemeral", "ttl": "-5m"},
    {"type": "ephemeral", "ttl": "100h"},
    {"type": "ephemeral", "ttl": 300},
    {"type": "persistent", "ttl": "5m"},
    {"ttl": "5m"},
    {"type": "ephemeral", "ttl": "5m", "scope": "global"},
    "ephemeral",
]


@pytest.mark.parametrize("cache_control", INVALID_CACHE_CONTROL, ids=lambda c: re.sub(r"\W+", "_", str(c)))
@pytest.mark.parametrize("route", ["/generate", "/v1/chat/completions", "/v1/completions"])
def test_invalid_cache_control_is_a_400_and_changes_nothing(tiered_small, route, cache_control):
    before = stats_now(tiered_small)
    prompt = words(30, 50)
    body = {"cache_control": cache_control, "model": "default", "max_tokens": 2}
    if route == "/generate":
        body = {"text": prompt, "cache_control": cache_control, "sampling_params": {"max_new_tokens": 2}}
    elif route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    status, answer = tiered_small.post_status(route, body)
    assert status == 400, answer
    assert "cache_control" in answer["message"] or "ttl" in answer["message"]
    assert stats_now(tiered_small) == before


def test_invalid_cache_salt_is_a_400(tiered_small):
    before = stats_now(tiered_small)
    status, answer = tiered_small.post_status("/generate", {"text": "hello", "cache_salt": 42})
    assert status == 400 and "cache_salt" in answer["message"]
    assert stats_now(tiered_small) == before


def raw_request(server, head: bytes, body_parts, request: bytes = b"POST /generate") -> bytes:
    """`request` (POST /generate) over a plain socket (the body as the parts given), and the whole answer: read
    until its declared length has arrived or the server closes (each read has the socket's deadline)."""
    import socket

    host, port = server.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(request + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + head + b"\r\n")
        try:
            for part in body_parts:
                sock.sendall(part)
        except OSError:  # the server may answer and close before the whole body is sent
            pass
        answer = b""
        while True:
            headers, _, body = answer.partition(b"\r\n\r\n")
            length = re.search(rb"content-length: (\d+)", headers, re.IGNORECASE)
            if length and len(body) >= int(length.group(1)):
                return answer
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                return answer
            if not data:
                return answer
            answer += data


def test_a_body_over_the_request_cap_is_a_413_before_it_is_read(tiered_small):
    """--tier-max-request-mb 1: a declared length over the cap is refused before the body is read, a chunked body
    once it outgrows the cap; a body under it is served, and nothing refused changes /tiers/stats."""
    before = stats_now(tiered_small)
    declared = raw_request(tiered_small, b"Content-Length: %d\r\n" % ((1 << 20) + 1), [])
    declared_get = raw_request(tiered_small, b"Content-Length: %d\r\n" % ((1 << 20) + 1), [], b"GET /open_session")
    # just over the cap, in 64 KiB chunks: the server has read nearly all of it when it answers and closes (bytes
    # left unread at a close would reset the connection, and could take the answer with them)
    parts = [b'{"text": "a", "pad": "'] + [b"x" * (1 << 16)] * 16
    framed = [b"%x\r\n%s\r\n" % (len(part), part) for part in parts] + [b"0\r\n\r\n"]
    chunked = raw_request(tiered_small, b"Transfer-Encoding: chunked\r\n", framed)
    assert declared.startswith(b"HTTP/1.1 413") and b"--tier-max-request-mb" in declared, declared[:200]
    assert chunked.startswith(b"HTTP/1.1 413"), chunked[:200]
    assert declared_get.startswith(b"HTTP/1.1 413"), declared_get[:200]  # SGLang reads a GET's body too
    assert stats_now(tiered_small) == before
    status, answer = tiered_small.post_status("/generate", {"text": "a", "pad": "x" * (1 << 19),
                                                            "sampling_params": {"max_new_tokens": 1}})
    assert status == 200, answer


def test_stats_and_metrics_move_as_the_scenario_says(tiered_small):
    before, metrics_before = tiered_small.get("/tiers/stats"), tiered_small.get("/metrics")
    messages = [{"role": "user", "content": words(40, 120)}]
    chat(tiered_small, messages, TTL)
    chat(tiered_small, messages, TTL)  # the repeat hits and refreshes the TTL
    after, metrics_after = tiered_small.get("/tiers/stats"), tiered_small.get("/metrics")
    b, a = before["tiers"]["device"], after["tiers"]["device"]
    assert a["inserts"] > b["inserts"]
    assert a["hit_requests"] > b["hit_requests"] and a["hit_tokens"] >= b["hit_tokens"] + 100
    assert a["retains"] > b["retains"] and a["ttl_refreshes"] > b["ttl_refreshes"]
    assert sum(t["device_tokens"] for t in after["tenants"].values()) == a["used_tokens"]
    assert "tuning" not in after  # --tier-shadow-rate 0: no self-tuner, the learned setting throughout
    for event in ("inserts", "hit_tokens", "retains", "ttl_refreshes"):
        assert metric(metrics_after, event) > metric(metrics_before, event), event


def test_flood_retained_session_survives_with_the_host_tier(hicache_server):
    """With the host tier on (TieredHiRadixCache): the retained session outlives a flood 6x the device pool and
    3x the host pool, from device or host, and the flood's one-shots are what the host tier refuses or drops."""
    before = hicache_server.get("/tiers/stats")
    warm, hit = flood_scenario(hicache_server, seed=50)
    after = hicache_server.get("/tiers/stats")
    assert hit >= warm, (hit, warm)
    assert after["counters"]["retains"] > before["counters"]["retains"]
    assert "tenants" not in after  # per-tenant occupancy only with --tier-stats-tenants
    b, a = before["tiers"], after["tiers"]
    assert a["host"]["used_tokens"] <= a["host"]["capacity_tokens"]
    # per-tier counters: the flood pushed nodes off the device (demoted or dropped) and past the host pool
    # (refused at admission or evicted), and the session's last turn was a hit from device or host
    assert a["device"]["evictions"] > b["device"]["evictions"]
    assert a["device"]["evicted_tokens"] > b["device"]["evicted_tokens"]
    assert a["device"]["demotions"] > b["device"]["demotions"]
    assert a["host"]["admitted"] > b["host"]["admitted"]
    assert a["host"]["rejected"] + a["host"]["evicted_tokens"] > b["host"]["rejected"] + b["host"]["evicted_tokens"]
    assert sum(a[t]["hit_tokens"] - b[t]["hit_tokens"] for t in ("device", "host")) >= hit
    # one policy, named for what runs on each tier, decided on both
    assert after["policy"] == "tinylfu (device: tinylfu, host admission and eviction: tinylfu)"
    assert all(a[t]["policy_calls"] > b[t]["policy_calls"] for t in ("device", "host"))
    # and the self-tuner runs on this class by default: the flood's requests were offered to it
    assert after["tuning"]["sample_rate"] >= 1 / 16
    assert after["tuning"]["live"] in ("lru", "gated")


def close_session(server, session_id: str) -> int:
    """SGLang's /close_session answers 200 with an empty body."""
    req = urllib.request.Request(server.url + "/close_session", data=json.dumps({"session_id": session_id}).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.status


def test_an_open_past_the_session_cap_is_a_400_and_opens_nothing(tuned_small, stock_small):
    """Guards --tier-max-open-sessions (2 here): SGLang keeps a session until it is closed, so a client could open
    them until the scheduler's memory runs out. Past the cap an open is refused and its session does not exist;
    closing one makes room. Stock SGLang (no cap) opens the third."""
    def open_session(server, session_id):
        return server.post_status("/open_session", {"capacity_of_str_len": 1000, "session_id": session_id})

    def exists(server, session_id):
        status, answer = server.post_status("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1},
                                                          "session_params": {"id": session_id}})
        assert status in (200, 400), answer
        return status == 200

    assert [open_session(tuned_small, f"cap-{i}") for i in range(2)] == [(200, "cap-0"), (200, "cap-1")]
    status, answer = open_session(tuned_small, "cap-2")
    assert status == 400 and "Failed to open the session" in json.dumps(answer), answer
    assert not exists(tuned_small, "cap-2") and exists(tuned_small, "cap-1")
    assert close_session(tuned_small, "cap-0") == 200
    assert open_session(tuned_small, "cap-2") == (200, "cap-2")
    for session_id in ("cap-1", "cap-2"):
        assert close_session(tuned_small, session_id) == 200
    assert [open_session(stock_small, f"cap-{i}") for i in range(3)] == [(200, f"cap-{i}") for i in range(3)]
    for i in range(3):
        assert close_session(stock_small, f"cap-{i}") == 200
