"""The foundation, end to end: the embedded default serves chat, the frontend, prefix hits, and the host tier."""

import json
import random
import urllib.request

from tests.support import served_model


WORDS = "cache token prefix session tenant model server request reply host device peer memory block page tree".split()


def words(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chat(server, messages, max_tokens=8):
    return server.post("/v1/chat/completions", {"model": "default", "messages": messages,
                                                "max_tokens": max_tokens, "temperature": 0})


def test_two_turn_chat_second_turn_hits_first_turn_prompt(tiered_server):
    """Guards the tree cache backend: a conversation's second turn reuses the first turn's KV."""
    turn1 = [{"role": "system", "content": words(1, 40)}, {"role": "user", "content": words(2, 30)}]
    r1 = chat(tiered_server, turn1)
    reply = r1["choices"][0]["message"]["content"]
    turn2 = turn1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": words(3, 20)}]
    r2 = chat(tiered_server, turn2)
    first_prompt = r1["usage"]["prompt_tokens"]
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert r2["usage"]["prompt_tokens"] > first_prompt
    assert cached >= first_prompt, (cached, first_prompt)


def test_frontend_program_runs_against_the_server(tiered_server):
    """An unchanged SGLang frontend program (sgl.function, sgl.gen, RuntimeEndpoint)."""
    import sglang as sgl

    @sgl.function
    def two_answers(s, question):
        s += "Question: " + question + "\n"
        s += "Answer:" + sgl.gen("first", max_tokens=6, temperature=0)
        s += "\nAgain:" + sgl.gen("second", max_tokens=6, temperature=0)

    backend = sgl.RuntimeEndpoint(tiered_server.url)
    state = two_answers.run(question=words(4, 12), backend=backend)
    assert state["first"] and state["second"]
    assert "Answer:" + state["first"] in state.text()


def test_cached_output_equals_uncached_output_bit_exact(tiered_server, nocache_server):
    """A prefix hit must not change a greedy answer: same token ids as with the cache disabled."""
    prompt = words(5, 120)
    cold = tiered_server.generate(prompt, max_new_tokens=12)
    warm = tiered_server.generate(prompt, max_new_tokens=12)
    reference = nocache_server.generate(prompt, max_new_tokens=12)
    assert warm["meta_info"]["cached_tokens"] > 0
    assert nocache_server.generate(prompt, max_new_tokens=12)["meta_info"]["cached_tokens"] == 0
    assert warm["output_ids"] == cold["output_ids"] == reference["output_ids"]


def test_prompt_evicted_from_device_comes_back_from_host(hicache_server, nocache_server):
    """HiCache on CPU (patch 0001 + cpu_hicache): an evicted prompt is loaded back from host memory."""
    # Start from empty pools: earlier tests on this shared server leave the host tier full, and then host
    # admission may rightly turn this one-shot prompt away.
    assert "Cache flushed" in hicache_server.get("/flush_cache")
    prompt = words(6, 300)
    first = hicache_server.generate(prompt, max_new_tokens=8, return_cached_tokens_details=True)
    for seed in (7, 8):  # 2 x 300 tokens overflow the 600-token device pool; the host pool holds 1200
        hicache_server.generate(words(seed, 300), max_new_tokens=8)
    again = hicache_server.generate(prompt, max_new_tokens=8, return_cached_tokens_details=True)
    details = again["meta_info"]["cached_tokens_details"]
    assert details["host"] >= first["meta_info"]["prompt_tokens"] - 2, details
    assert details["device"] < details["host"]
    reference = nocache_server.generate(prompt, max_new_tokens=8)
    assert again["output_ids"] == first["output_ids"] == reference["output_ids"]


def test_ollama_chat_answers_as_the_openai_chat_does(tiered_server):
    """SGLang's Ollama `/api/chat` serves (sglang_ext/route_fixes.py: under the transformers SGLang 0.5.20 pins, its
    chat template gave a BatchEncoding where ids belong, and every chat was a 500): the same messages give the same
    prompt tokens and, greedy, the same reply as /v1/chat/completions, whole and streamed (SGLang's stream left the
    last piece out: route_fixes sends it before the empty `done` chunk, as Ollama does)."""
    messages = [{"role": "system", "content": words(4, 12)}, {"role": "user", "content": words(5, 10)}]
    openai = chat(tiered_server, messages, max_tokens=6)
    body = {"model": "default", "messages": messages, "options": {"num_predict": 6, "temperature": 0}}
    whole = tiered_server.post("/api/chat", dict(body, stream=False))
    assert whole["done"] and whole["prompt_eval_count"] == openai["usage"]["prompt_tokens"]
    assert whole["message"]["content"] == openai["choices"][0]["message"]["content"]
    req = urllib.request.Request(tiered_server.url + "/api/chat", data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        chunks = [json.loads(line) for line in r.read().splitlines() if line.strip()]
    assert chunks[-1]["done"] and not any(c["done"] for c in chunks[:-1])
    assert "".join(c["message"]["content"] for c in chunks) == whole["message"]["content"]


def test_openai_responses_answer_as_the_openai_chat_does(tiered_server):
    """SGLang's `/v1/responses` serves (setup installs openai-harmony, SGLang's own pin: without it the route was a
    500 on every request): instructions and input give the chat's prompt tokens and, greedy, the start of its reply
    (SGLang gives the Responses route two tokens fewer than `max_output_tokens`)."""
    model = served_model(tiered_server)
    system, user = words(6, 12), words(7, 10)
    openai = chat(tiered_server, [{"role": "system", "content": system}, {"role": "user", "content": user}])
    answer = tiered_server.post("/v1/responses", {"model": model, "instructions": system, "input": user,
                                                  "max_output_tokens": 8, "temperature": 0})
    assert answer["usage"]["input_tokens"] == openai["usage"]["prompt_tokens"]
    text = "".join(part["text"] for item in answer["output"] if item["type"] == "message" for part in item["content"])
    assert text and openai["choices"][0]["message"]["content"].startswith(text)
