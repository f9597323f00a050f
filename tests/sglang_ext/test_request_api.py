"""The HTTP boundary (request_api, request_checks) and the scheduler's second check (serving_cache.request_ttl_s):
a client cannot set the internal TTL, and nothing a body carries reaches the scheduler unchecked."""

import json
import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sglang_ext.request_api import SALT_PARAM, TTL_PARAM, rewrite
from sglang_ext.other_route_checks import check_headers
from sglang_ext.request_checks import MAX_FANOUT, MAX_SAMPLES, BadRequest, ModelLimits
from sglang_ext.serving_cache import ServedRequests, refused_on_arrival, request_ttl_s
from tiers.retention import MAX_TTL_S

ROUTES = ["/generate", "/v1/chat/completions", "/v1/completions"]


def forwarded(route: str, body, session_ttl_s=None):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, out = rewrite(route, raw, session_ttl_s)
    return status, json.loads(out)


def ttls_in(node) -> list:
    """Every TTL_PARAM value anywhere in a body."""
    found, stack = [], [node]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found += [v for k, v in node.items() if k == TTL_PARAM]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def test_the_reported_crash_request_loses_its_internal_ttl():
    body = {"input_ids": [11, 12, 13, 14, 15, 16, 17, 18],
            "sampling_params": {"max_new_tokens": 2, "custom_params": {TTL_PARAM: 1e9}}}
    status, out = forwarded("/generate", body)
    assert status == 200
    assert ttls_in(out) == []
    assert out["sampling_params"] == {"max_new_tokens": 2, "custom_params": {}}


@pytest.mark.parametrize("route", ROUTES + ["/v1/messages", "/v1/responses", "/encode"])
@pytest.mark.parametrize("where", ["top", "sampling", "extra_body", "deep", "metadata", "escaped"])
def test_a_client_supplied_internal_ttl_is_removed_on_every_route(route, where):
    body = {"model": "default", "prompt": "x", "text": "x", "messages": [{"role": "user", "content": "x"}]}
    if where == "top":
        body["custom_params"] = {TTL_PARAM: 50.0}
    elif where == "sampling":
        body["sampling_params"] = {"custom_params": {TTL_PARAM: 50.0}}
    elif where == "extra_body":
        body["extra_body"] = {"custom_params": {TTL_PARAM: 50.0}}
    elif where == "deep":
        body["x"] = [{"y": [{TTL_PARAM: 50.0}]}]
    elif where == "metadata":  # where the middleware carries a /v1/messages TTL
        body["metadata"] = {TTL_PARAM: 50.0}
    raw = json.dumps(body).encode()
    if where == "escaped":  # the same key spelled with a JSON escape
        raw = raw[:-1] + b', "custom_params": {"sglang_ext_ttl\\u005fs": 1e999}}'
    status, out = forwarded(route, raw)
    assert status == 200
    assert ttls_in(out) == []


def test_sagemakers_chat_route_carries_cache_control_as_the_chat_route_does():
    body = {"model": "m", "messages": [{"role": "user", "content": "x", "cache_control": {"type": "ephemeral"}}]}
    assert forwarded("/invocations", body)[1] == forwarded("/v1/chat/completions", body)[1]
    assert ttls_in(forwarded("/invocations", body)[1]) == [300.0]


@pytest.mark.parametrize("where", ["system", "message", "content", "tool", "top"])
def test_anthropics_cache_control_is_carried_wherever_its_api_puts_it(where):
    """Anthropic's Messages API, where `cache_control` is the client's own field (SGLang's /v1/messages ignored it):
    the TTL travels in `metadata` (SGLang builds the chat request of a fixed list of fields), nothing else stays."""
    ephemeral = {"type": "ephemeral", "ttl": "1h"}
    body = {"model": "m", "max_tokens": 4, "system": [{"type": "text", "text": "s"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}], "metadata": {"user_id": "u"}}
    holder = {"system": body["system"][0], "message": body["messages"][0], "content": body["messages"][0]["content"][0],
              "tool": body["tools"][0], "top": body}[where]
    holder["cache_control"] = ephemeral
    status, out = forwarded("/v1/messages", body)
    assert status == 200 and out["metadata"] == {"user_id": "u", TTL_PARAM: 3600.0}
    assert ttls_in(out) == [3600.0] and "cache_control" not in json.dumps(out)
    holder["cache_control"] = {"type": "ephemeral", "ttl": "25h"}
    assert forwarded("/v1/messages", body)[0] == 400


def test_anthropics_request_without_cache_control_carries_no_ttl_and_odd_metadata_stays_sglangs():
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}],
            "metadata": {"user_id": "u", TTL_PARAM: 99.0}}
    status, out = forwarded("/v1/messages", body)
    assert status == 200 and out["metadata"] == {"user_id": "u"}
    system = [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]
    odd = dict(body, metadata="not an object", system=system)
    status, out = forwarded("/v1/messages", odd)
    assert status == 200 and out["metadata"] == "not an object" and ttls_in(out) == []  # SGLang's 400, as sent


def test_the_anthropic_conversion_hands_the_ttl_and_the_salt_to_the_chat_request():
    """request_api.carry_metadata_to_chat, the AFTER hook on SGLang's /v1/messages -> chat conversion."""
    from sglang_ext.request_api import carry_metadata_to_chat

    chat = SimpleNamespace(custom_params=None, cache_salt=None)
    carry_metadata_to_chat(chat, None, SimpleNamespace(metadata={"user_id": "u", TTL_PARAM: 300.0,
                                                                 SALT_PARAM: "tenant-a"}))
    assert chat.custom_params == {TTL_PARAM: 300.0} and chat.cache_salt == "tenant-a"
    for metadata in (None, {"user_id": "u"}, "x"):
        chat = SimpleNamespace(custom_params={"a": 1}, cache_salt=None)
        carry_metadata_to_chat(chat, None, SimpleNamespace(metadata=metadata))
        assert chat.custom_params == {"a": 1} and chat.cache_salt is None


def test_an_anthropic_requests_salt_travels_in_its_metadata_and_only_the_middleware_puts_it_there():
    """SGLang builds /v1/messages' chat request without `cache_salt`: tenants hit each other's prompts there (an
    audit, 2026-12-07). The salt is checked as on every route, and a client's own copy of the key is removed."""
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "cache_salt": "tenant-a"}
    status, out = forwarded("/v1/messages", body)
    assert status == 200 and out["metadata"] == {SALT_PARAM: "tenant-a"} and "cache_salt" not in out
    status, out = forwarded("/v1/messages", dict(body, metadata={"user_id": "u"}, cache_control={"type": "ephemeral"}))
    assert status == 200 and out["metadata"] == {"user_id": "u", SALT_PARAM: "tenant-a", TTL_PARAM: 300.0}
    for salt in (["tenant-a"], "", "x" * 257, 7):
        assert forwarded("/v1/messages", dict(body, cache_salt=salt))[0] == 400, salt
    assert forwarded("/v1/messages", dict(body, metadata="odd"))[0] == 400
    status, out = forwarded("/v1/messages", dict(body, cache_salt=None, metadata={SALT_PARAM: "tenant-b"}))
    assert status == 200 and out["metadata"] == {}


@pytest.mark.parametrize("route", ["/api/generate", "/api/chat", "/v1/score", "/v1/rerank", "/v1/embeddings",
                                   "/encode"])
def test_a_salt_on_a_route_that_drops_it_is_refused(route):
    """Ollama's routes, scoring, reranking and embeddings build SGLang requests without the client's salt: a
    tenant's prompt was cached where every tenant reaches it (an audit, 2026-12-07)."""
    body = {"model": "m", "prompt": "x", "messages": [{"role": "user", "content": "x"}], "query": "q",
            "items": ["i"], "documents": ["d"], "input": "x", "text": "x"}
    status, out = forwarded(route, dict(body, cache_salt="tenant-a"))
    assert status == 400 and "cache_salt" in json.dumps(out)
    assert forwarded(route, body)[0] == 200


def test_a_valid_cache_control_is_the_only_ttl_that_is_carried():
    body = {"model": "default", "prompt": "x", "cache_control": {"type": "ephemeral", "ttl": "1h"},
            "custom_params": {TTL_PARAM: 5.0}, "extra_body": {"custom_params": {TTL_PARAM: 9.0}}}
    status, out = forwarded("/v1/completions", body)
    assert status == 200
    assert ttls_in(out) == [3600.0]
    status, out = forwarded("/generate", {"text": ["x", "y"], "sampling_params": [{"custom_params": {TTL_PARAM: 1.0}}, None],
                                          "cache_control": {"type": "ephemeral"}})
    assert status == 200 and ttls_in(out) == [300.0, 300.0]


@pytest.mark.parametrize("route", ROUTES)
def test_json_nested_too_deeply_is_a_400(route):
    raw = b'{"model": "default", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    status, out = forwarded(route, raw)
    assert status == 400 and "nested too deeply" in out["message"]


def test_a_header_sglang_reads_as_an_integer_must_be_one():
    check_headers([(b"x-data-parallel-rank", b"0"), (b"x-other", b"x"), (b"content-type", b"application/json")])
    for value in (b"x", b"1.5", b""):
        with pytest.raises(BadRequest, match="x-data-parallel-rank"):
            check_headers([(b"x-data-parallel-rank", value)])


@pytest.mark.parametrize("sampling, field", [
    ({"bogus": 1}, "bogus"), ({"max_new_tokens": "x"}, "max_new_tokens"), ({"is_normalized": True}, "is_normalized"),
    ({"stop_strs": ["a"]}, "stop_strs"), ({"temperature": "hot"}, "temperature"), ({"ignore_eos": 1}, "ignore_eos"),
    ({"stop": [1]}, "stop"), ({"logit_bias": {"1": "x"}}, "logit_bias"), ({"custom_params": [1]}, "custom_params"),
    ([{"n": 2}, 7], "sampling_params"), ("greedy", "sampling_params"),
])
def test_generate_sampling_params_of_unknown_fields_or_types_are_a_400(sampling, field):
    status, out = forwarded("/generate", {"text": "x", "sampling_params": sampling})
    assert status == 400 and field in out["message"]


@pytest.mark.parametrize("field, value", [("lora_id", []), ("lora_id", "adapter"), ("positional_embed_overrides", -1),
                                          ("received_time", 1.0)])
def test_generate_fields_the_server_sets_are_a_400(field, value):
    """SGLang took `lora_id` and `positional_embed_overrides` from the body to the scheduler, which a list or a number
    there stopped; the tokenizer manager sets the first, only the Python engine the second."""
    status, out = forwarded("/generate", {"text": "x", field: value})
    assert status == 400 and field in out["message"]


def test_known_sampling_params_pass_unchanged():
    sampling = {"max_new_tokens": 4, "temperature": 0, "top_p": 0.9, "stop": ["a"], "n": 2, "ignore_eos": True,
                "logit_bias": {"5": -1.5}, "custom_params": {"k": 1}, "json_schema": None}
    raw = json.dumps({"text": "x", "sampling_params": sampling}).encode()
    assert rewrite("/generate", raw, None) == (200, raw)


@pytest.mark.parametrize("route, body", [
    ("/generate", {"text": "x", "sampling_params": {"n": 10**9}}),
    ("/generate", {"text": "x", "sampling_params": {"n": 0}}),
    ("/generate", {"text": "x", "sampling_params": {"n": None}}),  # SGLang compared None with 1: a 500
    ("/generate", {"text": ["x", "y"], "sampling_params": [{"n": 2}, {"n": None}]}),
    ("/v1/completions", {"prompt": "x", "n": None}),
    ("/v1/chat/completions", {"messages": [], "n": 1e9}),
    ("/v1/completions", {"prompt": "x", "n": MAX_SAMPLES + 1}),
    ("/generate", {"text": ["x"] * (MAX_FANOUT // 2 + 1), "sampling_params": {"n": 2}}),
    ("/v1/completions", {"prompt": [[1, 2]] * (MAX_FANOUT + 1)}),
])
def test_fanout_beyond_the_bound_is_a_400(route, body):
    status, out = forwarded(route, body)
    assert status == 400 and "n" in out["message"]


def test_fanout_within_the_bound_passes():
    for route, body in [("/generate", {"input_ids": list(range(5000)), "sampling_params": {"n": MAX_SAMPLES}}),
                        ("/v1/completions", {"prompt": ["x"] * 32, "n": MAX_SAMPLES}),
                        ("/v1/chat/completions", {"messages": [], "n": 2.0})]:
        assert forwarded(route, body)[0] == 200


@pytest.mark.parametrize("messages", [7, "text", {"role": "user"}, [None, 3, {"content": 5}]])
def test_odd_messages_never_raise_in_the_middleware(messages):
    status, _ = forwarded("/v1/chat/completions", {"messages": messages, "cache_control": {"type": "ephemeral"}})
    assert status == 200


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20)


@given(route=st.sampled_from(ROUTES), body=st.dictionaries(st.sampled_from(
    ["text", "prompt", "messages", "sampling_params", "custom_params", "n", "cache_control", "cache_salt",
     "session_params", "input_ids", "extra_body", TTL_PARAM]), json_values, max_size=6))
def test_rewrite_never_raises_and_never_forwards_a_client_ttl(route, body):
    body.pop("cache_control", None)
    status, out = rewrite(route, json.dumps(body).encode(), None)
    assert status in (200, 400)
    if status == 200:
        assert ttls_in(json.loads(out)) == []


# ---- the scheduler's second check ----

def req_with(value) -> SimpleNamespace:
    return SimpleNamespace(rid="r", sampling_params=SimpleNamespace(custom_params={TTL_PARAM: value}))


@pytest.mark.parametrize("value", [1e9, math.inf, -math.inf, math.nan, -1, 0, "5", True, None, [1], {"a": 1},
                                   MAX_TTL_S * 2])
def test_the_scheduler_refuses_an_invalid_internal_ttl_and_counts_it(value):
    assert request_ttl_s(req_with(value)) == (None, True)
    served = SimpleNamespace(_served={"refused_ttl_params": 0})  # the only state _take_request_ttl touches
    assert ServedRequests._take_request_ttl(served, req_with(value)) is None
    assert served._served["refused_ttl_params"] == 1


def test_the_scheduler_takes_a_valid_internal_ttl():
    assert request_ttl_s(req_with(300)) == (300.0, False)
    assert request_ttl_s(SimpleNamespace(sampling_params=SimpleNamespace(custom_params=None))) == (None, False)
    assert request_ttl_s(SimpleNamespace()) == (None, False)


# ---- what would reach the model ----

LIMITS = ModelLimits(vocab_size=100, hidden_size=4)


@pytest.mark.parametrize("route, body", [
    ("/generate", {"input_ids": [1, 2, 100]}), ("/generate", {"input_ids": [1, -1]}),
    ("/generate", {"input_ids": [[1], [2, 999]]}), ("/v1/completions", {"prompt": [5, 100]}),
    ("/v1/completions", {"prompt": [[5], [-3]]}),
    ("/v1/completions", {"prompt": [9.0e8, 2.0]}),  # SGLang coerces floats to ids: this one stopped a scheduler
    # lists a min/max pass cannot judge (mixed types, a NaN) are looked at id by id
    ("/generate", {"input_ids": [1, "x", 100]}), ("/generate", {"input_ids": [float("nan"), 100]}),
    ("/generate", {"input_ids": [1, float("nan"), -1]}),
    ("/generate", {"input_embeds": [[0.1, 0.2]]}), ("/generate", {"input_embeds": []}),
    ("/generate", {"input_embeds": [[[0.0, 0.0, 0.0, "x"]]]}),
    ("/generate", {"text": "x", "http_worker_ipc": "ipc:///tmp/elsewhere"}),
    ("/generate", {"text": "x", "received_time": 0.0}),
    # each of these stopped a live scheduler (tests/reliability/test_bad_input_fuzz.py sends them to one)
    ("/generate", {"input_ids": [[]]}), ("/generate", {"input_ids": [[1], []]}), ("/v1/completions", {"prompt": [[]]}),
    ("/generate", {"text": "x", "return_logprob": True, "top_logprobs_num": 101}),
    ("/generate", {"text": ["x", "y"], "return_logprob": True, "top_logprobs_num": [1, 101]}),
    ("/generate", {"text": "x", "return_logprob": True, "logprob_start_len": -2}),
    ("/generate", {"text": "x", "sampling_params": {"logit_bias": {"5": 1e39}}}),
    ("/v1/completions", {"model": "m", "prompt": "x", "logprobs": 101}),
    ("/v1/completions", {"model": "m", "prompt": "x", "logit_bias": {"5": -1e39}}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "logprobs": True, "top_logprobs": 101}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "logit_bias": {"5": 1e308}}),
    # and these were a 500 in SGLang's HTTP process: per-prompt lists that do not match the prompts
    ("/generate", {"text": "x", "sampling_params": [{}, {}]}), ("/generate", {"text": "x", "rid": ["a", "b"]}),
    ("/generate", {"text": ["x", "y"], "sampling_params": [{}]}),
    ("/generate", {"input_ids": [[1], [2]], "return_logprob": True, "logprob_start_len": [0]}),
    ("/generate", {"input_ids": [[1], [2]], "return_logprob": True, "token_ids_logprob": [[1]]}),
    ("/v1/completions", {"model": "m", "prompt": "x", "echo": True, "logprobs": 0}),
    ("/generate", {"text": "x", "sampling_params": {"stop_regex": ["a", "("]}}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "stop_regex": "[z-a]"}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "assistant", "content": "x"}],
                              "continue_final_message": True}),
    ("/v1/detokenize", {"tokens": [1, -1]}), ("/detokenize", {"tokens": [[1], [-5]]}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "rid": ["a"]}),
    ("/v1/completions", {"model": "m", "prompt": "x", "rid": ["a", "b"]}),
    ("/v1/completions", {"model": "m", "prompt": ["x", "y"], "rid": ["a"]}),
    # a client's own chat template (Jinja run in the HTTP process), or the template call's own arguments
    ("/v1/chat/completions", {"model": "m", "messages": [], "chat_template_kwargs": {"chat_template": "{{ 1 }}"}}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "chat_template_kwargs": {"tokenize": False}}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "chat_template_kwargs": {"x": 1, "tools": 5}}),
    # sessions: what SGLang took, and the fields its own processes fill in
    ("/open_session", {"capacity_of_str_len": -5, "session_id": "s"}),
    ("/open_session", {"capacity_of_str_len": 100, "session_id": "s", "timeout": -1}),
    ("/open_session", {"capacity_of_str_len": 100, "session_id": "s", "timeout": "NaN"}),
    ("/open_session", {"capacity_of_str_len": 100, "session_id": "s", "timeout": 0}),
    ("/open_session", {"capacity_of_str_len": 100, "session_id": ""}),
    ("/open_session", {"capacity_of_str_len": 100, "session_id": "x" * 257}),
    ("/open_session", {"capacity_of_str_len": 100, "session_id": "s", "rid": "r"}),
    ("/open_session", {"capacity_of_str_len": 100, "http_worker_ipc": "ipc:///tmp/elsewhere"}),
    ("/close_session", {"session_id": "s", "rid": "r"}), ("/close_session", {"session_id": 5}),
    # SageMaker's name for the chat route, and Vertex AI's predict route (a /generate of its instances), which
    # went past every check of the middleware
    ("/invocations", {"model": "m", "messages": [], "logprobs": True, "top_logprobs": 101}),
    ("/invocations", {"model": "m", "messages": [], "chat_template_kwargs": {"chat_template": "{{ 1 }}"}}),
    ("/invocations", {"model": "m", "messages": [], "n": MAX_SAMPLES + 1}),
    ("/vertex_generate", {"instances": [{"input_ids": [5, 100]}]}),
    ("/vertex_generate", {"instances": [{"input_ids": [1, 2]}, {"input_ids": []}]}),
    ("/vertex_generate", {"instances": [{"text": "x"}], "parameters": {"http_worker_ipc": "ipc:///tmp/elsewhere"}}),
    ("/vertex_generate", {"instances": [{"text": "x"}], "parameters": {"sampling_params": {"is_normalized": True}}}),
    ("/vertex_generate", {"instances": [{"text": "x"}], "parameters": {"text": "y"}}),
    # an audit (2026-12-07): a 500 for any field GenerateReqInput lacks; a session cleared by `replace` without a
    # rid stopped the scheduler; an 8 MB `extra_key` was held with each entry it keyed; an empty prompt in a batch
    ("/vertex_generate", {"instances": [{"text": "x"}], "parameters": {"foo": 1}}),
    ("/vertex_generate", {"instances": [{"text": "x"}], "parameters": {"cache_control": {"type": "ephemeral"}}}),
    ("/generate", {"text": "x", "session_params": {"id": "s", "replace": True}}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "session_params": {"id": "s", "replace": True}}),
    ("/generate", {"text": "x", "extra_key": "k" * 257}), ("/generate", {"text": "x", "extra_key": ""}),
    ("/generate", {"text": ["x", "y"], "extra_key": ["k", "k" * 257]}),
    ("/v1/completions", {"model": "m", "prompt": "x", "extra_key": "k" * 257}),
    ("/generate", {"text": ["x", ""]}), ("/v1/completions", {"model": "m", "prompt": ["x", ""]}),
    # SGLang's other routes, swept field by field (2026-12-06): each was a 500
    ("/api/generate", {"model": "m", "prompt": "x", "options": {"seed": 7}}),  # a field SamplingParams lacks
    ("/api/generate", {"model": "m", "prompt": "x", "options": {"stop": [[]]}}),
    ("/api/generate", {"model": "m", "prompt": "x", "options": {"num_predict": "x"}}),
    ("/api/generate", {"model": "m", "prompt": "x", "options": {"num_predict": 1e30}}),
    ("/api/generate", {"model": "m", "prompt": "x", "options": {"top_k": 0}}),  # SGLang's verify, after the 200
    ("/api/chat", {"model": "m", "messages": [], "options": {"temperature": -1}}),
    ("/api/chat", {"model": "m", "messages": []}),  # the chat template indexed the first message: an IndexError
    ("/v1/messages/count_tokens", {"model": "m", "messages": []}),
    ("/v1/score", {"query": "x", "items": ["y"], "label_token_ids": []}),
    ("/v1/embeddings", {"model": "m", "input": "x", "rid": []}),
    ("/v1/classify", {"model": "m", "input": ["x", "y"], "rid": ["a"]}),
    ("/encode", {"text": "x", "rid": ["a", "b"]}), ("/classify", {"text": "x", "sampling_params": []}),
    ("/parse_function_call", {"text": "x", "tool_call_parser": "no-such-parser", "tools": []}),
    ("/parse_function_call", {"text": "x", "tool_call_parser": None, "tools": []}),
    ("/separate_reasoning", {"text": "x", "reasoning_parser": "no-such-parser"}),
    # an embedding server's (tests/reliability/test_embedding_server_input.py): the first three stopped it
    ("/encode", {"input_ids": [[1, 2], []]}), ("/v1/embeddings", {"input": [[5], [100]]}),
    ("/encode", {"text": "x", "lora_id": []}),
    ("/encode", {"text": ["a", "b"], "image_data": 7}), ("/encode", {"text": ["a", "b"], "embed_overrides": [[]]}),
    ("/v1/embeddings", {"model": "m", "input": ["a", "b"], "rid": "r"}),
])
def test_what_would_stop_the_scheduler_is_a_400(route, body):
    status, out = rewrite(route, json.dumps(body).encode(), None, LIMITS)
    assert status == 400, out
    assert json.loads(out)["message"]


def test_deeply_nested_ids_are_answered_not_raised():
    """The ids check compares a list's items with min/max; lists among them compare as deep as they are nested,
    up to whatever the JSON parser let through: every such body gets an answer, at any call depth."""
    def answer(frames: int, raw: bytes):
        return answer(frames - 1, raw) if frames else rewrite("/generate", raw, None, LIMITS)

    for frames in (0, 40):
        for depth in range(900, 1000, 7):
            nested = "[" * depth + "1" + "]" * depth
            for ids in (f"[[{nested},{nested}]]", f"[[{nested},7]]"):  # lists with lists, lists with a number
                status, _ = answer(frames, ('{"input_ids": ' + ids + "}").encode())
                assert status in (200, 400)


@pytest.mark.parametrize("route, body", [
    ("/generate", {"input_ids": [0, 99]}), ("/generate", {"input_ids": [[0], [99, 1]]}),
    ("/v1/completions", {"prompt": ["text", "more"]}), ("/v1/completions", {"prompt": [[0, 99]]}),
    ("/generate", {"input_embeds": [[0.1, 0.2, 0.3, 0.4]]}),
    ("/generate", {"input_embeds": [[[0, 0, 0, 0]], [[1, 1, 1, 1], [2, 2, 2, 2]]]}),
    ("/generate", {"text": ["x", "y"], "return_logprob": [True, True], "top_logprobs_num": [0, 100],
                   "logprob_start_len": [-1, 0], "rid": ["a", "b"], "sampling_params": [{}, {"logit_bias": {"1": -100}}]}),
    ("/generate", {"input_ids": [[1], [2]], "return_logprob": True, "token_ids_logprob": [3, 4]}),
    ("/generate", {"input_ids": [[1], [2]], "return_logprob": True, "token_ids_logprob": [[3], [4]]}),
    ("/generate", {"text": "x", "rid": "r", "return_logprob": True, "top_logprobs_num": 5, "logprob_start_len": 0}),
    ("/v1/completions", {"model": "m", "prompt": "x", "echo": True, "logprobs": 5, "logit_bias": {"5": 3.4e38}}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "logprobs": True, "top_logprobs": 20}),
    ("/generate", {"text": "x", "sampling_params": {"stop_regex": ["a+", "\\d{3}"]}}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"},
                                                         {"role": "assistant", "content": "y"}],
                              "continue_final_message": True, "stop_regex": "(a|b)"}),
    ("/v1/detokenize", {"tokens": [1, 10**6]}), ("/detokenize", {"tokens": [[1], [2]]}),
    ("/v1/completions", {"model": "m", "prompt": ["x", "y"], "rid": ["a", "b"], "n": 2}),
    ("/v1/chat/completions", {"model": "m", "messages": [], "rid": "a",
                              "chat_template_kwargs": {"enable_thinking": True, "documents": [{"text": "d"}]}}),
    ("/open_session", {"capacity_of_str_len": 1000, "session_id": "s" * 256, "streaming": False, "timeout": 30.5}),
    ("/open_session", {"capacity_of_str_len": 0}), ("/close_session", {"session_id": "s"}),
    ("/invocations", {"model": "m", "messages": [], "logprobs": True, "top_logprobs": 20}),
    ("/vertex_generate", {"instances": [{"input_ids": [5, 99]}, {"input_ids": [1]}],
                          "parameters": {"sampling_params": {"max_new_tokens": 1}}}),
    ("/vertex_generate", {"instances": []}), ("/vertex_generate", {"instances": "x"}),
    ("/vertex_generate", {"instances": [{"text": "x"}], "parameters": {"cache_salt": "t", "priority": 1}}),
    ("/generate", {"text": "x", "session_params": {"id": "s", "rid": "r", "replace": True}}),
    ("/generate", {"text": ["x", "y"], "extra_key": ["k" * 256, "k"]}),
    ("/api/generate", {"model": "m", "prompt": "x", "options": {"num_predict": 5, "top_k": 3, "stop": ["a"],
                                                                "temperature": 0.5, "num_ctx": 99, "mirostat": 1}}),
    ("/api/generate", {"model": "m", "prompt": "x", "options": {"seed": None}}), ("/api/chat", {"options": "x"}),
    ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/score", {"query": "x", "items": ["y"], "label_token_ids": [1]}), ("/v1/score", {"query": "x"}),
    ("/v1/embeddings", {"model": "m", "input": ["x", "y"], "rid": ["a", "b"]}),
    ("/v1/embeddings", {"model": "m", "input": [1, 2], "rid": "a"}),
    ("/encode", {"text": ["x", "y"], "rid": ["a", "b"], "sampling_params": [{}, {}]}),
    ("/encode", {"text": "x", "image_data": ["i1", "i2"]}),
    ("/encode", {"text": ["x", "y"], "image_data": ["i", None]}),
    ("/v1/embeddings", {"model": "m", "input": [[5], [99]], "rid": ["a", "b"]}),
    ("/parse_function_call", {"text": "x", "tool_call_parser": "llama3", "tools": []}),
    ("/separate_reasoning", {"text": "x", "reasoning_parser": "DeepSeek-R1"}),  # SGLang looks it up in lower case
])
def test_what_the_model_takes_passes(route, body):
    assert rewrite(route, json.dumps(body).encode(), None, LIMITS)[0] == 200


CHAT = {"model": "default", "messages": [{"role": "user", "content": "x"}]}


@pytest.mark.parametrize("response_format", [True, [1], "text", {"type": "json_schema", "schema": 5},
                                             {"type": "json_schema", "schema": {"properties": 5}}])
def test_a_field_sglangs_own_validator_trips_on_is_a_400(response_format):
    """Guards: SGLang's chat request validator reads `response_format` as an object before checking its type, and
    FastAPI answered the AttributeError with a 500 (found by the bad-input fuzz test)."""
    status, out = rewrite("/v1/chat/completions", json.dumps({**CHAT, "response_format": response_format}).encode(),
                          None, LIMITS)
    assert status == 400 and "wrong type" in json.loads(out)["message"]


@pytest.mark.parametrize("body", [{**CHAT, "response_format": {"type": "json_object"}}, {**CHAT, "messages": 5},
                                  {**CHAT, "tools": 5}])
def test_sglang_answers_its_own_validation_errors_and_valid_bodies(body):
    """A body SGLang's model takes, or refuses with a validation error (its own 400), is forwarded unchanged."""
    raw = json.dumps(body).encode()
    assert rewrite("/v1/chat/completions", raw, None, LIMITS) == (200, raw)


def test_the_lock_summary_reads_any_tree_without_raising():
    """Guards: /get_server_info walked SGLang's own tree nodes (no `lock_ref`) inside the scheduler and raised,
    stopping the server, when our plugin ran beside a stock tree cache."""
    from types import SimpleNamespace as NS

    from sglang_ext.request_api import tree_lock_summary

    def tree(**lock):
        leaf = NS(children={}, key=[1, 2, 3], **lock)
        return NS(root_node=NS(children={1: leaf}), protected_size_=3)

    assert tree_lock_summary(tree(lock_ref=1)) == {"locked_nodes": 1, "locked_tokens": 3, "protected_size": 3}
    assert tree_lock_summary(tree()) == {}


def test_only_a_request_the_scheduler_refused_as_invalid_counts_as_refused_on_arrival():
    from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH

    def req(reason):
        return SimpleNamespace(finished_reason=reason)

    assert refused_on_arrival(req(FINISH_ABORT("Invalid request: session id 0 does not exist", 400)))
    assert not refused_on_arrival(req(FINISH_ABORT()))  # a client that went away: its KV is real, keep it
    assert not refused_on_arrival(req(FINISH_ABORT("internal", 500)))
    assert not refused_on_arrival(req(FINISH_LENGTH(4)))
    assert not refused_on_arrival(req(None))


@pytest.mark.parametrize("route, body", [
    ("/generate", {"text": "x" * 321}), ("/generate", {"text": ["ok", "x" * 321]}),
    ("/v1/completions", {"model": "m", "prompt": "x" * 321}),
    # a chat counts every string its template could render, keys and roles included (a template may write tools
    # or tool calls out as JSON): 42 characters of structure here ("role", "user", "content" twice; "type", "text")
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x" * 200},
                                                         {"role": "user", "content": [{"type": "text", "text": "y" * 79}]}]}),
    # 17 characters in {"role": "user", "content": "hi"}, 4 more with "name"; 56 in the tool's structure ("type",
    # "function", "name", "f", "description", "parameters", "object"); 13 in the documents' ("documents", "text")
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi", "name": "z" * 300}]}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": "f", "description": "w" * 248, "parameters": {"type": "object"}}}]}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                              "chat_template_kwargs": {"documents": [{"text": "v" * 291}]}}),
    # SGLang's other routes that tokenize: 15 characters of structure in {"role": "user", "content": ...}; a score's
    # query is tokenized with each item
    ("/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "a" * 306}]}),
    ("/api/generate", {"model": "m", "prompt": "b" * 321}),
    ("/v1/embeddings", {"model": "m", "input": ["ok", "c" * 321]}),
    ("/v1/score", {"query": "q", "items": ["ok", "d" * 320]}), ("/v1/tokenize", {"model": "m", "prompt": "e" * 321}),
])
def test_a_text_too_long_for_the_context_is_a_400_before_it_is_tokenized(route, body):
    """A context of 10 tokens takes at most 320 characters of text (MAX_CHARS_PER_TOKEN); tokenizing a longer one
    would hold SGLang's HTTP process for nothing. One character less fits."""
    limits = ModelLimits(vocab_size=100, hidden_size=4, context_len=10)
    status, out = rewrite(route, json.dumps(body).encode(), None, limits)
    assert status == 400 and "context of 10 tokens" in json.loads(out)["message"]
    raw = json.dumps(body)
    for c, n in (("x", 321), ("y", 79), ("z", 300), ("w", 248), ("v", 291), ("a", 306), ("b", 321), ("c", 321),
                 ("d", 320), ("e", 321)):
        raw = raw.replace(c * n, c * (n - 1))
    assert rewrite(route, raw.encode(), None, limits)[0] == 200


def test_a_chats_images_are_not_counted_as_text():
    limits = ModelLimits(vocab_size=100, hidden_size=4, context_len=10)
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 10_000}}
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]}
    assert rewrite("/v1/chat/completions", json.dumps(body).encode(), None, limits)[0] == 200
    # only a media part's payload is skipped: a message calling itself an image still has its text counted
    body = {"model": "m", "messages": [{"role": "user", "type": "image_url", "content": "x" * 400}]}
    assert rewrite("/v1/chat/completions", json.dumps(body).encode(), None, limits)[0] == 400
