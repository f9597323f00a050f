"""Bad-input fuzz against live servers, device-only (`tiered_server`) and with the host tier and a peer
(`server_a`): `cache_control` of random JSON shapes, salts of random types and `session_params` junk on all three
routes; then the internal TTL key planted anywhere, `sampling_params` and OpenAI field junk, token ids outside the
vocabulary, and huge or deeply nested JSON. Every answer is a 200 or a 4xx with a message, within the request
deadline (never a 5xx, never a hang); after a 4xx, `/tiers/stats` is exactly what it was before; the server still
answers afterwards, and no request without `cache_control` ever retains anything."""

import dataclasses
import json
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import served_model, settled_stats, stats_now

pytestmark = pytest.mark.server
TTL_PARAM = "sglang_ext_ttl_s"  # request_api's internal key, spelled out: a client could type it


@pytest.fixture(params=["device", "host+peer"])
def fuzzed(request):
    """Each fuzz runs against the device-only server and the one with the host tier and a peer."""
    return request.getfixturevalue("tiered_server" if request.param == "device" else "server_a")
ANSWER_DEADLINE_S = 60.0  # a hang shows as a timeout, which post_status raises

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8)
cache_controls = st.one_of(
    json_values,
    st.fixed_dictionaries({"type": st.one_of(st.just("ephemeral"), json_scalars)},
                          optional={"ttl": st.one_of(st.sampled_from(["5m", "1h", "30s", "0s", "-1m", "25h", "5x"]),
                                                     json_scalars),
                                    "scope": json_scalars}),
)
salts = st.one_of(json_values, st.text(min_size=1, max_size=300))
session_params = st.one_of(json_values, st.fixed_dictionaries(
    {"id": st.one_of(st.text(max_size=8), json_scalars)},
    optional={"rid": json_scalars, "offset": json_scalars, "replace": json_scalars, "drop_previous_output": json_scalars}))
MISSING = object()


def body_for(route: str, prompt: str, fields: dict) -> dict:
    if route == "/generate":
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    elif route in ("/v1/chat/completions", "/v1/messages"):  # the OpenAI and the Anthropic chat
        body = {"model": "default", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}
    else:
        body = {"model": "default", "prompt": prompt, "max_tokens": 1}
    body.update({k: v for k, v in fields.items() if v is not MISSING})
    return body


def message_of(answer) -> str:
    if isinstance(answer, dict):
        for key in ("message", "detail", "error"):
            if answer.get(key):
                return str(answer[key])
    return answer if isinstance(answer, str) else ""


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(["/generate", "/v1/chat/completions", "/v1/completions", "/v1/messages"]),
       cache_control=st.one_of(st.just(MISSING), cache_controls),
       salt=st.one_of(st.just(MISSING), salts),
       session=st.one_of(st.just(MISSING), session_params),
       where=st.sampled_from(["top", "message"]))
def test_bad_inputs_are_a_200_or_a_clear_4xx_and_a_4xx_changes_nothing(fuzzed, route, cache_control, salt,
                                                                        session, where):
    fields = {"cache_salt": salt, "session_params": session}
    body = body_for(route, "fuzz the request api", fields)
    if cache_control is not MISSING:
        if where == "message" and route in ("/v1/chat/completions", "/v1/messages"):
            body["messages"][0]["cache_control"] = cache_control
        else:
            body["cache_control"] = cache_control
    before = settled_stats(fuzzed)
    status, answer = fuzzed.post_status(route, body, timeout=ANSWER_DEADLINE_S)
    assert status == 200 or 400 <= status < 500, f"{status} for {body}: {answer}"
    if status != 200:
        assert message_of(answer), f"{status} without a message for {body}: {answer}"
        assert stats_now(fuzzed) == before, f"a {status} changed /tiers/stats: {body}"


def retains(stats) -> int:
    """Every `retains` counter in /tiers/stats, summed over tiers."""
    if isinstance(stats, dict):
        return sum(v if k == "retains" and isinstance(v, int) else retains(v) for k, v in stats.items())
    if isinstance(stats, list):
        return sum(retains(v) for v in stats)
    return 0


hostile_ttls = st.one_of(json_scalars, st.sampled_from([1e9, -1, 0, 1e308, 300]), json_values)
SAMPLING_NAMES = ["temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "n", "regex", "json_schema",
                  "frequency_penalty", "ignore_eos", "logit_bias", "custom_params", "sampling_seed", "beam_width",
                  "is_normalized", "stop_strs", "bogus"]
OPENAI_NAMES = ["temperature", "top_p", "n", "stop", "logit_bias", "logprobs", "top_logprobs", "seed", "user",
                "stream_options", "response_format", "tools", "custom_params", "extra_body"]
# Huge or deep values are built as text: hypothesis would take too long to draw them.
HUGE = {"deep": b"[" * 50_000 + b"]" * 50_000, "long": b'"' + b"x" * 3_000_000 + b'"',
        "wide": b"[" + b",".join([b"1"] * 300_000) + b"]"}


def plant(body: dict, route: str, where: str, value) -> None:
    """Put the internal TTL key where a client might try it."""
    if where == "top":
        body["custom_params"] = {TTL_PARAM: value}
    elif where == "extra_body":
        body["extra_body"] = {"custom_params": {TTL_PARAM: value}}
    elif route == "/generate":
        body["sampling_params"]["custom_params"] = {TTL_PARAM: value}
    else:
        body["metadata"] = {"deep": [{TTL_PARAM: value}]}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(route=st.sampled_from(["/generate", "PUT /generate", "/v1/chat/completions", "/v1/completions",
                              "/v1/messages"]),
       ttl=st.one_of(st.just(MISSING), hostile_ttls),
       where=st.sampled_from(["top", "extra_body", "sampling"]),
       junk=st.dictionaries(st.sampled_from(SAMPLING_NAMES + OPENAI_NAMES), json_values, max_size=3),
       ids=st.one_of(st.just(MISSING), st.lists(st.integers(-10, 10**7), min_size=1, max_size=6)),
       huge=st.one_of(st.just(MISSING), st.sampled_from(sorted(HUGE))))
def test_internal_keys_junk_and_huge_bodies_never_reach_the_scheduler(fuzzed, route, ttl, where, junk, ids, huge):
    method, _, route = route.rpartition(" ")
    body = body_for(route, "fuzz the scheduler", {})
    if route == "/generate":
        body["sampling_params"].update({k: v for k, v in junk.items() if k in SAMPLING_NAMES})
        if ids is not MISSING:
            body.pop("text")
            body["input_ids"] = ids
    else:
        body.update({k: v for k, v in junk.items() if k in OPENAI_NAMES})
        if ids is not MISSING and route == "/v1/completions":
            body["prompt"] = ids
    if ttl is not MISSING:
        plant(body, route, where, ttl)
    raw = json.dumps(body).encode()
    if huge is not MISSING:
        raw = raw[:-1] + b', "fuzz_' + huge.encode() + b'": ' + HUGE[huge] + b"}"
    before = settled_stats(fuzzed)
    status, answer = fuzzed.post_status(route, raw, timeout=ANSWER_DEADLINE_S, method=method or "POST")
    assert status == 200 or 400 <= status < 500, f"{status} for {raw[:300]!r}: {answer}"
    if status != 200:
        assert message_of(answer), f"{status} without a message for {raw[:300]!r}: {answer}"
        assert stats_now(fuzzed) == before, f"a {status} changed /tiers/stats: {raw[:300]!r}"
    alive, _ = fuzzed.post_status("/generate", {"text": "still there", "sampling_params": {"max_new_tokens": 1}},
                                  timeout=ANSWER_DEADLINE_S)
    assert alive == 200, f"the server stopped answering after {raw[:300]!r}"
    after = settled_stats(fuzzed)
    assert retains(after) == retains(before), f"a request without cache_control retained: {raw[:300]!r}"


def test_the_reported_crash_request_is_served_and_sets_no_ttl(fuzzed):
    """Issue 12's reproduction: before the fix the scheduler raised on this request and the server exited."""
    before = settled_stats(fuzzed)
    status, _ = fuzzed.post_status("/generate", {"input_ids": [11, 12, 13, 14, 15, 16, 17, 18], "sampling_params": {
        "max_new_tokens": 2, "custom_params": {TTL_PARAM: 1e9}}}, timeout=ANSWER_DEADLINE_S)
    assert status == 200
    status, _ = fuzzed.post_status("/generate", {"input_ids": [11, 12, 13, 14], "sampling_params": {
        "max_new_tokens": 1}}, timeout=ANSWER_DEADLINE_S)
    assert status == 200
    assert retains(settled_stats(fuzzed)) == retains(before)


def test_a_request_the_scheduler_refuses_caches_and_counts_nothing(fuzzed):
    """SGLang refuses an unknown session in the scheduler (a 400), after prefilling one dummy token in the
    prompt's place; stock SGLang then inserts that token into the tree. Ours frees it: twice, the same stats."""
    body = {"text": "no such session", "session_params": {"id": "no-such-session"},
            "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    before = settled_stats(fuzzed)
    for _ in range(2):
        status, answer = fuzzed.post_status("/generate", body, timeout=ANSWER_DEADLINE_S)
        assert status == 400 and "does not exist" in message_of(answer), answer
        assert settled_stats(fuzzed) == before


CHAT_BODY = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
ONE_TOKEN = {"max_new_tokens": 1, "temperature": 0}


@pytest.mark.parametrize("route, body", [  # the first six, sent once, stopped the scheduler of a server here;
    # the others were a 500, the one before last replaced the server's chat template, and the last one, tokenized,
    # held SGLang's HTTP process (a 20 MB text: 18 s) before its 400
    ("/generate", {"input_ids": [[1, 2], []], "sampling_params": ONE_TOKEN}),
    ("/generate", {"input_ids": [1, 2, 3], "sampling_params": ONE_TOKEN, "return_logprob": True,
                   "top_logprobs_num": 10**9}),
    ("/generate", {"input_ids": [1, 2, 3], "sampling_params": ONE_TOKEN, "return_logprob": True,
                   "logprob_start_len": -5}),
    ("/generate", {"input_ids": [1, 2, 3], "sampling_params": dict(ONE_TOKEN, logit_bias={"5": 1e308})}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 1, "logprobs": 10**9}),
    ("/v1/chat/completions", dict(CHAT_BODY, logprobs=True, top_logprobs=10**9)),
    ("/generate", {"input_ids": [1, 2, 3], "sampling_params": [ONE_TOKEN, ONE_TOKEN]}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 1, "echo": True, "logprobs": 0}),
    ("/generate", {"text": "hi", "sampling_params": dict(ONE_TOKEN, stop_regex="(")}),
    ("/v1/chat/completions", dict(CHAT_BODY, messages=[{"role": "assistant", "content": "hi"}],
                                  continue_final_message=True)),
    ("/v1/detokenize", {"tokens": [1, -1]}),
    ("/v1/chat/completions", dict(CHAT_BODY, rid=["a"])),
    ("/v1/chat/completions", dict(CHAT_BODY, chat_template_kwargs={"add_generation_prompt": False})),
    ("/v1/chat/completions", dict(CHAT_BODY, chat_template_kwargs={"chat_template": "{{ 'a client template' }}"})),
    ("/generate", {"text": "x" * (8192 * 32 + 1), "sampling_params": ONE_TOKEN}),  # more than the context could hold
    # the same in a chat's tools, which a template that renders them (Llama 3.1's, Qwen's) would tokenize too
    ("/v1/chat/completions", dict(CHAT_BODY, tools=[{"type": "function", "function": {
        "name": "f", "description": "x" * (8192 * 32), "parameters": {"type": "object"}}}])),
    # each of these stopped the scheduler of a server here (2026-12-05): values SGLang's own validation passes
    # (int32 sampling tensors, a vocabulary-wide stop-token tensor, float ids it coerces), and SGLang's other
    # generation routes, which the middleware did not read
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1, "top_k": 3 * 10**9}}),  # not greedy
    ("/generate", {"input_ids": [1, 2, 3], "sampling_params": dict(ONE_TOKEN, max_new_tokens=2, min_new_tokens=1,
                                                                   stop_token_ids=[10**9])}),
    ("/v1/completions", {"model": "default", "prompt": [9.0e8, 2.0], "max_tokens": 1}),
    ("/invocations", dict(CHAT_BODY, logprobs=True, top_logprobs=10**9)),
    ("/vertex_generate", {"instances": [{"input_ids": [5 * 10**6]}], "parameters": {"sampling_params": ONE_TOKEN}}),
    ("/v1/messages", dict(CHAT_BODY, top_k=3 * 10**9)),
    ("/api/generate", {"model": "default", "prompt": "hi", "stream": False,
                       "options": {"top_k": 3 * 10**9, "num_predict": 1}}),
    # a 500 the fuzz found (2026-12-06): SGLang's /generate compares `n` with 1 as given; and two fields a sweep of
    # every GenerateReqInput field found (below), each of which stopped the scheduler
    ("/generate", {"text": "hi", "sampling_params": dict(ONE_TOKEN, n=None)}),
    ("/generate", {"text": "hi", "sampling_params": ONE_TOKEN, "lora_id": []}),
    ("/generate", {"text": "hi", "sampling_params": ONE_TOKEN, "positional_embed_overrides": -1}),
    # a sweep of SGLang's other routes (2026-12-06): the first stopped the scheduler (a prompt of no tokens reached
    # the model); the others were a 500, the first Ollama one after its stream's 200 (Ollama streams by default)
    ("/v1/score", {"model": "default", "query": [], "items": [[]], "label_token_ids": [1]}),
    ("/api/generate", {"model": "default", "prompt": "hi", "options": {"top_k": 0, "num_predict": 1}}),
    ("/api/generate", {"model": "default", "prompt": "hi", "stream": False, "options": {"seed": 7, "num_predict": 1}}),
    ("/api/generate", {"model": "default", "prompt": "hi", "stream": False, "options": {"num_predict": 10**5}}),
    ("/v1/messages/count_tokens", {"model": "default", "messages": []}),
    ("/api/chat", {"model": "default", "messages": [], "stream": False}),  # once /api/chat served (route_fixes)
    ("/v1/score", {"model": "default", "query": "hi", "items": ["a"], "label_token_ids": []}),
    ("/v1/embeddings", {"model": "default", "input": "hi", "rid": []}),
    ("/encode", {"text": "hi", "sampling_params": []}),
    # answered with a count, after holding every other request while it was tokenized
    ("/v1/messages/count_tokens", {"model": "default", "messages": [{"role": "user", "content": "x" * (8192 * 32)}]}),
    ("/parse_function_call", {"text": "hi", "tool_call_parser": "no-such-parser", "tools": []}),
    # an audit (2026-12-07): a 500 for any field GenerateReqInput lacks; an 8 MB extra_key was kept with each entry
    # it keyed
    ("/vertex_generate", {"instances": [{"text": "hi"}], "parameters": {"foo": 1}}),
    ("/generate", {"text": "hi", "sampling_params": ONE_TOKEN, "extra_key": "k" * 300}),
])
def test_what_stopped_the_scheduler_is_a_clear_400_that_changes_nothing(fuzzed, route, body):
    assert_a_clear_400_that_changes_nothing(fuzzed, route, body)


def assert_a_clear_400_that_changes_nothing(server, route, body) -> None:
    """`body` is a 400 with a message, `/tiers/stats` is as it was, and the server still serves."""
    before = settled_stats(server)
    status, answer = server.post_status(route, body, timeout=ANSWER_DEADLINE_S)
    assert status == 400 and message_of(answer), f"{status}: {answer}"
    assert stats_now(server) == before
    alive, _ = server.post_status("/generate", {"text": "still there", "sampling_params": ONE_TOKEN},
                                  timeout=ANSWER_DEADLINE_S)
    assert alive == 200


@pytest.mark.parametrize("case, route, second", [  # what refuses the batch's second prompt
    (0, "/generate", {"text": "a " * 9000}),  # longer than the context
    (1, "/generate", {"text": ""}),
    (2, "/generate", {"text": "b", "sampling_params": {"max_new_tokens": 1, "top_k": 0}}),  # not greedy
    (3, "/v1/completions", {"text": "a " * 9000}),
    (4, "/generate", {"text": "b", "fields": {"return_logprob": [True, True], "logprob_start_len": [0, 1000]}}),
])
def test_a_batch_refused_at_its_second_prompt_computes_none_of_it(fuzzed, case, route, second):
    """SGLang sends a text batch's prompts one at a time, each checked just before it is sent: a batch refused at
    its second prompt had its first computed and cached behind the 400 (an audit, 2026-12-07)."""
    first = f"zq{case} a first prompt that only this batch sends, long enough to tell a hit"
    if route == "/generate":
        body = {"text": [first, second["text"]],
                "sampling_params": [ONE_TOKEN, second.get("sampling_params", ONE_TOKEN)], **second.get("fields", {})}
    else:
        body = {"model": "default", "prompt": [first, second["text"]], "max_tokens": 1}
    # its last request is served in order after the batch: a first prompt that had been sent is computed by then
    assert_a_clear_400_that_changes_nothing(fuzzed, route, body)
    settled_stats(fuzzed)
    status, again = fuzzed.post_status("/generate", {"text": first, "sampling_params": ONE_TOKEN},
                                       timeout=ANSWER_DEADLINE_S)
    assert status == 200
    assert again["meta_info"]["cached_tokens"] < again["meta_info"]["prompt_tokens"] // 2, again["meta_info"]


@pytest.mark.parametrize("items", [[], [{"type": "reasoning", "id": "r", "summary": []}]])
def test_a_responses_input_of_no_messages_is_a_clear_400_that_changes_nothing(tiered_server, items):
    """Once /v1/responses served (setup installs SGLang's openai-harmony): an input that becomes no chat message had
    the chat template index the first one, a 500 (a probe of 1,500 random input items found no other)."""
    before = settled_stats(tiered_server)
    body = {"model": served_model(tiered_server), "input": items, "max_output_tokens": 4}
    status, answer = tiered_server.post_status("/v1/responses", body, timeout=ANSWER_DEADLINE_S)
    assert status == 400 and "no message" in str(answer), f"{status}: {answer}"
    assert stats_now(tiered_server) == before


ODD_VALUES = ([], -1, {"a": None}, "x", 2**63)  # a type or a size no field of /generate expects all of


def generate_fields() -> list:
    """Every top-level field of SGLang's /generate body but the prompt and its sampling params."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    prompt = ("text", "input_ids", "sampling_params")
    return [f.name for f in dataclasses.fields(GenerateReqInput) if f.name not in prompt]


def test_every_generate_field_with_an_odd_value_is_answered_and_the_scheduler_lives(fuzzed):
    """A sweep of every field SGLang's GenerateReqInput has, each with values of the wrong type or size: never a 5xx,
    and the server answers afterwards (2026-12-06: a list for `lora_id`, or a number for `positional_embed_overrides`,
    stopped the scheduler; the fuzz above draws only sampling and OpenAI fields)."""
    fields = generate_fields()
    assert "lora_id" in fields and len(fields) > 30  # the sweep reads SGLang's own list
    for field in fields:
        for value in ODD_VALUES:
            body = {"text": "sweep", "sampling_params": ONE_TOKEN, field: value}
            status, answer = fuzzed.post_status("/generate", body, timeout=ANSWER_DEADLINE_S)
            assert status == 200 or 400 <= status < 500, f"{status} for {field}={value!r}: {answer}"
    alive, _ = fuzzed.post_status("/generate", {"text": "still there", "sampling_params": ONE_TOKEN},
                                  timeout=ANSWER_DEADLINE_S)
    assert alive == 200


def other_route_fields(model: str) -> list:
    """(route, a body it serves or answers with a 4xx, the fields SGLang's model for it has) for SGLang's routes
    besides /generate and the two OpenAI ones the fuzz draws; Ollama's options as fields of their own. `model`: the
    served model's name, for /v1/responses."""
    from sglang.srt.entrypoints.anthropic.protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
    from sglang.srt.entrypoints.ollama.protocol import OllamaChatRequest, OllamaGenerateRequest
    from sglang.srt.entrypoints.openai.protocol import (EmbeddingRequest, ResponsesRequest, ScoringRequest,
                                                        TokenizeRequest)
    from sglang.srt.managers.io_struct import EmbeddingReqInput

    messages = [{"role": "user", "content": "hi"}]
    ollama = {"model": "default", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
    ollama_chat = {"model": "default", "messages": messages, "stream": False, "options": {"num_predict": 1}}
    return [
        ("/v1/messages", dict(CHAT_BODY, messages=messages), list(AnthropicMessagesRequest.model_fields)),
        ("/v1/messages/count_tokens", {"model": "default", "messages": messages},
         list(AnthropicCountTokensRequest.model_fields)),
        ("/api/generate", ollama, list(OllamaGenerateRequest.model_fields)),
        ("/api/generate", ollama, [f"options.{name}" for name in OLLAMA_OPTIONS]),
        ("/api/chat", ollama_chat, list(OllamaChatRequest.model_fields)),
        ("/api/chat", ollama_chat, [f"options.{name}" for name in OLLAMA_OPTIONS]),
        ("/v1/score", {"model": "default", "query": "hi", "items": ["a"], "label_token_ids": [1]},
         list(ScoringRequest.model_fields)),
        ("/v1/embeddings", {"model": "default", "input": "hi"}, list(EmbeddingRequest.model_fields)),
        ("/encode", {"text": "hi"}, [f.name for f in dataclasses.fields(EmbeddingReqInput)]),
        ("/v1/tokenize", {"model": "default", "prompt": "hi"}, list(TokenizeRequest.model_fields)),
        ("/v1/responses", {"model": model, "input": "hi", "max_output_tokens": 4}, list(ResponsesRequest.model_fields)),
        ("/parse_function_call", {"text": "hi", "tool_call_parser": "llama3", "tools": []}, ["tool_call_parser"]),
        ("/separate_reasoning", {"text": "hi", "reasoning_parser": "deepseek-r1"}, ["reasoning_parser"]),
    ]


OLLAMA_OPTIONS = ("temperature", "top_p", "top_k", "num_predict", "stop", "presence_penalty", "frequency_penalty",
                  "seed")  # the ones SGLang 0.5.20 maps to sampling fields


def test_every_field_of_the_other_routes_with_an_odd_value_is_answered_and_the_scheduler_lives(tiered_server):
    """The sweep above, on SGLang's other routes. One server: these checks do not depend on the tiers. (2026-12-06:
    an empty `/v1/score` query and item stopped the scheduler, a dozen fields were a 500, and once Ollama's /api/chat
    and /v1/responses served, an empty `messages` on the first and an empty `input` on the second.)"""
    for route, base, fields in other_route_fields(served_model(tiered_server)):
        status, answer = tiered_server.post_status(route, base, timeout=ANSWER_DEADLINE_S)
        assert status == 200 or 400 <= status < 500, f"{status} for {route}'s base body: {answer}"
        for field in fields:
            for value in ODD_VALUES + (0, [[]]):
                body = dict(base, options=dict(base["options"], **{field[8:]: value})) \
                    if field.startswith("options.") else dict(base, **{field: value})
                status, answer = tiered_server.post_status(route, body, timeout=ANSWER_DEADLINE_S)
                assert status == 200 or 400 <= status < 500, f"{status} for {route} {field}={value!r}: {answer}"
    alive, _ = tiered_server.post_status("/generate", {"text": "still there", "sampling_params": ONE_TOKEN},
                                         timeout=ANSWER_DEADLINE_S)
    assert alive == 200


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_several_odd_fields_at_once_on_the_other_routes_are_answered_and_a_4xx_changes_nothing(tiered_server, data):
    """The sweep's fields two to four at a time, with any JSON values (a random probe of 40,000 such requests found
    the batch cases of the embedding routes that one field at a time did not)."""
    route, base, fields = data.draw(st.sampled_from(other_route_fields(served_model(tiered_server))))
    body = json.loads(json.dumps(base))
    for field in data.draw(st.lists(st.sampled_from(fields), min_size=1, max_size=4, unique=True)):
        value = data.draw(st.one_of(json_values, st.sampled_from(ODD_VALUES + (0, [[]], 3e9, 2**31))))
        if field.startswith("options."):
            body["options"][field[8:]] = value
        else:
            body[field] = value
    before = settled_stats(tiered_server)
    status, answer = tiered_server.post_status(route, body, timeout=ANSWER_DEADLINE_S)
    assert status == 200 or 400 <= status < 500, f"{status} for {route} {json.dumps(body)[:300]}: {answer}"
    if status != 200:
        assert stats_now(tiered_server) == before, f"a {status} changed /tiers/stats: {json.dumps(body)[:300]}"
    alive, _ = tiered_server.post_status("/generate", {"text": "still there", "sampling_params": ONE_TOKEN},
                                         timeout=ANSWER_DEADLINE_S)
    assert alive == 200, f"the server stopped answering after {route} {json.dumps(body)[:300]}"


def test_a_header_sglang_reads_as_an_integer_is_a_400_when_it_is_not_one(tiered_server):
    """X-Data-Parallel-Rank: SGLang's OpenAI routes answer a value that is not an integer with a 400, and
    /v1/messages answered it with a 500."""
    for route, body in (("/v1/messages", CHAT_BODY), ("/v1/chat/completions", CHAT_BODY)):
        status, answer = tiered_server.post_status(route, body, timeout=ANSWER_DEADLINE_S,
                                                   headers={"X-Data-Parallel-Rank": "x"})
        assert status == 400 and message_of(answer), f"{route}: {status}: {answer}"


@pytest.mark.parametrize("body", [  # what SGLang opened a session with
    {"capacity_of_str_len": -5, "session_id": "fuzz-negative"},
    {"capacity_of_str_len": 100, "session_id": "fuzz-timeout", "timeout": -1},
    {"capacity_of_str_len": 100, "session_id": "fuzz-internal", "http_worker_ipc": "ipc:///tmp/elsewhere"},
    {"capacity_of_str_len": 100, "session_id": "x" * 10_000},
])
def test_a_malformed_session_is_a_400_on_get_and_post_and_opens_nothing(fuzzed, body):
    """SGLang's /open_session answers GET as well as POST, with the body read on both: a GET went past every check
    of the middleware. Each body is refused either way, and no session of its id exists afterwards."""
    for method in ("GET", "POST"):
        status, answer = fuzzed.post_status("/open_session", body, timeout=ANSWER_DEADLINE_S, method=method)
        assert status == 400 and message_of(answer), f"{method} {status}: {answer}"
    status, answer = fuzzed.post_status("/generate", {"text": "hi", "sampling_params": ONE_TOKEN,
                                                      "session_params": {"id": body["session_id"]}})
    assert status == 400 and "does not exist" in message_of(answer), f"{status}: {answer}"


def close_session(server, sid, method: str = "POST") -> None:
    """SGLang's /close_session answers 200 with an empty body (not JSON)."""
    close = urllib.request.Request(server.url + "/close_session", data=json.dumps({"session_id": sid}).encode(),
                                   method=method, headers={"content-type": "application/json"})
    with urllib.request.urlopen(close, timeout=ANSWER_DEADLINE_S) as r:
        assert r.status == 200


def test_a_session_opened_by_get_is_served_and_closes(fuzzed):
    status, sid = fuzzed.post_status("/open_session", {"capacity_of_str_len": 1000, "session_id": "fuzz-get"},
                                     method="GET")
    assert (status, sid) == (200, "fuzz-get")
    status, answer = fuzzed.post_status("/generate", {"text": "hi", "sampling_params": ONE_TOKEN,
                                                      "session_params": {"id": sid}})
    assert status == 200, answer
    close_session(fuzzed, sid, method="GET")


def test_a_repetition_penalty_is_served_on_cpu(fuzzed):
    """SGLang applies repetition_penalty in a helper it torch.compile's; compiling it on this CPU stopped the
    scheduler (the launcher now runs such helpers eagerly)."""
    for penalty in (1.3, 0.7):
        status, answer = fuzzed.post_status("/generate", {"input_ids": [5, 6, 5, 6], "sampling_params": dict(
            ONE_TOKEN, max_new_tokens=4, repetition_penalty=penalty)}, timeout=ANSWER_DEADLINE_S)
        assert status == 200 and len(answer["output_ids"]) == 4, answer


def test_a_session_replaced_without_a_rid_is_a_400_and_the_session_goes_on(fuzzed):
    """SGLang 0.5.20 clears a whole session (`replace` without a `rid`) by deleting from the dict it iterates: on a
    session holding a request the scheduler raised and the server stopped (an audit, 2026-12-07)."""
    status, sid = fuzzed.post_status("/open_session", {"capacity_of_str_len": 1000, "session_id": "fuzz-replace"})
    assert (status, sid) == (200, "fuzz-replace")
    turn = {"text": "turn one", "sampling_params": ONE_TOKEN, "session_params": {"id": sid}}
    status, first = fuzzed.post_status("/generate", turn, timeout=ANSWER_DEADLINE_S)
    assert status == 200, first
    before = settled_stats(fuzzed)
    status, answer = fuzzed.post_status("/generate", dict(turn, text="x", session_params={"id": sid, "replace": True}),
                                        timeout=ANSWER_DEADLINE_S)
    assert status == 400 and "rid" in message_of(answer), answer
    assert stats_now(fuzzed) == before
    status, answer = fuzzed.post_status("/generate", dict(turn, text=" turn two", session_params={
        "id": sid, "rid": first["meta_info"]["id"], "replace": True}), timeout=ANSWER_DEADLINE_S)
    assert status == 200, answer
    close_session(fuzzed, sid)


def test_a_session_turn_the_scheduler_refuses_leaves_the_session_as_it_was(fuzzed):
    """SGLang adds a turn to its session before its scheduler checks the request: a turn refused there (its
    prompt and the session's history longer than the context) stayed in the session, and continuing from it was
    served with a history of one dummy token (an audit, 2026-12-07). Now continuing from it is a 400, and the
    session goes on from its last good turn."""
    limit = fuzzed.get("/get_server_info")["max_req_input_len"]
    half = [5 + i % 50 for i in range(limit * 6 // 10)]  # each fits the context, two do not
    status, sid = fuzzed.post_status("/open_session", {"capacity_of_str_len": 10**6, "session_id": "fuzz-refused"})
    assert (status, sid) == (200, "fuzz-refused")
    turn = {"input_ids": half, "sampling_params": ONE_TOKEN, "session_params": {"id": sid}}
    status, first = fuzzed.post_status("/generate", turn, timeout=ANSWER_DEADLINE_S)
    assert status == 200, first
    after_first = {"id": sid, "rid": first["meta_info"]["id"]}
    status, answer = fuzzed.post_status("/generate", dict(turn, rid="fuzz-refused-turn", session_params=after_first),
                                        timeout=ANSWER_DEADLINE_S)
    assert status == 400 and "exceeds" in message_of(answer), answer
    short = dict(turn, input_ids=[9, 10, 11])
    status, answer = fuzzed.post_status("/generate", dict(short, session_params={"id": sid, "rid": "fuzz-refused-turn"}),
                                        timeout=ANSWER_DEADLINE_S)
    assert status == 400, answer
    status, answer = fuzzed.post_status("/generate", dict(short, session_params=after_first), timeout=ANSWER_DEADLINE_S)
    assert status == 200 and answer["meta_info"]["prompt_tokens"] > len(half), answer
    close_session(fuzzed, sid)
