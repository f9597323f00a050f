"""Bad input against a live embedding server (`--is-embedding`, the embedded model served as one): SGLang 0.5.20
let a generation request through to a scheduler that cannot run one, and an embedding batch with an empty prompt
to the model; each stopped the server. Every answer here is a 200 or a 4xx with a message, a 4xx changes no
`/tiers/stats` count, and the server still embeds afterwards."""

import dataclasses

import pytest

from tests.support import served_model, settled_stats, start_server, stats_now

pytestmark = pytest.mark.server
ANSWER_DEADLINE_S = 60.0
CHAT = [{"role": "user", "content": "hi"}]
SERVED = "the served model's name"  # /v1/responses takes no other; the test asks the server
ODD_VALUES = ([], -1, {"a": None}, "x", 2**63, 0, [[]])


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory):
    server = start_server(["--is-embedding"], tmp_path_factory.mktemp("embedding"), "embedding")
    yield server
    server.stop()


def assert_still_embeds(server):
    status, answer = server.post_status("/encode", {"text": "still there"}, timeout=ANSWER_DEADLINE_S)
    assert status == 200 and answer["embedding"], answer


def message_of(answer) -> str:
    """The message of an error body, in any of SGLang's shapes ({"message"}, {"error": {"message"}}, {"error"})."""
    if not isinstance(answer, dict):
        return str(answer)
    error = answer.get("error")
    return str(error.get("message") or "") if isinstance(error, dict) else str(error or answer.get("message") or "")


@pytest.mark.parametrize("route, body", [  # each stopped the scheduler of an embedding server here (2026-12-06)
    ("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 1}}),
    ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 1}),
    ("/v1/chat/completions", {"model": "default", "messages": CHAT, "max_tokens": 1}),
    ("/v1/messages", {"model": "default", "messages": CHAT, "max_tokens": 1}),
    ("/api/generate", {"model": "default", "prompt": "hi", "stream": False, "options": {"num_predict": 1}}),
    ("/api/chat", {"model": "default", "messages": CHAT, "stream": False, "options": {"num_predict": 1}}),
    ("/v1/responses", {"model": SERVED, "input": "hi", "max_output_tokens": 4}),
    ("/v1/embeddings", {"model": "default", "input": [[]]}),
    ("/encode", {"input_ids": [[1, 2], []]}),
    ("/encode", {"input_ids": [5 * 10**6]}),
    ("/encode", {"text": "hi", "lora_id": []}),  # a field SGLang's tokenizer manager fills in
    # and these were a 500: a batch's per-prompt fields that are not one per prompt, a batch's rid that is not a list
    ("/encode", {"text": ["a", "b"], "image_data": 8192}),
    ("/encode", {"text": ["a", "b"], "image_data": []}),
    ("/v1/embeddings", {"model": "default", "input": ["a", "b"], "rid": "r"}),
])
def test_what_stopped_the_embedding_server_is_a_clear_400_that_changes_nothing(embedding_server, route, body):
    """(/api/chat and /v1/responses served nothing before 2026-12-06; now they are generation routes like the rest.)"""
    if body.get("model") == SERVED:
        body = dict(body, model=served_model(embedding_server))
    before = settled_stats(embedding_server)
    status, answer = embedding_server.post_status(route, body, timeout=ANSWER_DEADLINE_S)
    assert status == 400 and message_of(answer), f"{status}: {answer}"
    assert stats_now(embedding_server) == before
    assert_still_embeds(embedding_server)


def embedding_route_fields() -> list:
    """(route, a body it serves, the fields SGLang's model for it has), one prompt and a batch of two."""
    from sglang.srt.entrypoints.openai.protocol import EmbeddingRequest, ScoringRequest, V1RerankReqInput
    from sglang.srt.managers.io_struct import EmbeddingReqInput

    native = [f.name for f in dataclasses.fields(EmbeddingReqInput)]
    openai = list(EmbeddingRequest.model_fields)
    return [
        ("/encode", {"text": "hi"}, native), ("/encode", {"text": ["a", "b"]}, native),
        ("/classify", {"input_ids": [[5, 6], [7]]}, native),
        ("/v1/embeddings", {"model": "default", "input": "hi"}, openai),
        ("/v1/embeddings", {"model": "default", "input": [[5, 6], [7]]}, openai),
        ("/v1/score", {"model": "default", "query": "hi", "items": ["a"], "label_token_ids": [1]},
         list(ScoringRequest.model_fields)),
        ("/v1/rerank", {"query": "hi", "documents": ["a", "b"]}, list(V1RerankReqInput.model_fields)),
    ]


def test_every_embedding_field_with_an_odd_value_is_answered_and_the_server_lives(embedding_server):
    for route, base, fields in embedding_route_fields():
        status, answer = embedding_server.post_status(route, base, timeout=ANSWER_DEADLINE_S)
        assert status == 200 or 400 <= status < 500, f"{status} for {route}'s base body: {answer}"
        for field in fields:
            for value in ODD_VALUES:
                status, answer = embedding_server.post_status(route, dict(base, **{field: value}),
                                                              timeout=ANSWER_DEADLINE_S)
                assert status == 200 or 400 <= status < 500, f"{status} for {route} {field}={value!r}: {answer}"
    assert_still_embeds(embedding_server)
