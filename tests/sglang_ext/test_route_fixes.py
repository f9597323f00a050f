"""Fixes of SGLang 0.5.20's own compatibility routes (route_fixes): Ollama's chat template's BatchEncoding becomes the
list of ids SGLang's request expects, Ollama's streams end with their last text, and no chat template is rendered for
a conversation of no messages; nothing a client can send changes otherwise. The server-side counterparts (a live
/api/chat and /v1/responses) are in tests/server/test_serving.py and tests/reliability/test_bad_input_fuzz.py."""

import asyncio
import json
from types import SimpleNamespace

import pytest
from sglang.srt.managers.io_struct import GenerateReqInput
from transformers import BatchEncoding

from sglang_ext.route_fixes import ids_of_chat_template, ollama_stream_with_final_text, refuse_an_empty_conversation


def test_a_chat_templates_batch_encoding_becomes_the_list_sglang_normalizes():
    """What SGLang's Ollama handler builds: before the hook, normalizing it raised ("a list of lists"), a 500."""
    obj = GenerateReqInput(input_ids=BatchEncoding({"input_ids": [1, 5, 9], "attention_mask": [1, 1, 1]}),
                           sampling_params={"max_new_tokens": 1})
    ids_of_chat_template(None, obj, None)
    assert obj.input_ids == [1, 5, 9] and type(obj.input_ids) is list
    obj.normalize_batch_and_arguments()  # SGLang's own step that raised on the BatchEncoding
    assert obj.input_ids == [1, 5, 9]


def test_what_a_client_can_send_is_left_as_sent():
    """A client's JSON holds lists and dicts, never a BatchEncoding: a dict of ids stays SGLang's to refuse."""
    for ids in ([1, 2], [[1, 2], [3]], {"input_ids": [1, 2]}, None):
        obj = SimpleNamespace(input_ids=ids)
        ids_of_chat_template(None, obj)
        assert obj.input_ids is ids
    ids_of_chat_template(None, SimpleNamespace(text="an embedding or a text prompt: no ids at all"))


def test_no_chat_template_is_rendered_for_no_messages():
    """The template indexed the first message (an IndexError, a 500 on /v1/responses); a ValueError is SGLang's 400."""
    rendered = []

    def render(serving, messages, **kwargs):
        rendered.append(messages)
        return "prompt", [1, 2], None

    with pytest.raises(ValueError, match="no message"):
        refuse_an_empty_conversation(render, None, [], tools=None, template_kwargs={}, encode_kwargs={},
                                     use_cache=False)
    assert rendered == []
    one = [{"role": "user", "content": "hi"}]
    assert refuse_an_empty_conversation(render, None, one, tools=None, template_kwargs={}, encode_kwargs={},
                                        use_cache=False) == ("prompt", [1, 2], None)
    assert rendered == [one]


def streamed(handler, pieces, key: str, around=None) -> list:
    """What SGLang's Ollama stream `handler` sends for a reply streamed as `pieces` (cumulative text, the last chunk
    final, as the tokenizer manager streams), run as is or through the AROUND hook `around`."""
    from sglang.srt.entrypoints.ollama.serving import OllamaServing

    async def stream(*args, **kwargs):
        for i, text in enumerate(pieces):
            yield {"text": text, "meta_info": {"finish_reason": {"type": "length"} if i == len(pieces) - 1 else None}}

    serving = SimpleNamespace(tokenizer_manager=SimpleNamespace(generate_request=stream),
                              _get_timestamp=OllamaServing._get_timestamp.__get__(object()))
    handler = getattr(handler, "__wrapped__", handler)  # SGLang's own, whether or not a plugin hooked it

    async def run():
        call = (lambda *a: around(handler, *a)) if around else handler
        response = await call(serving, None, None, "m")
        return [json.loads(line) async for line in response.body_iterator]

    return [(chunk[key]["content"] if key == "message" else chunk[key], chunk["done"]) for chunk in asyncio.run(run())]


@pytest.mark.parametrize("handler, key", [("_stream_chat_response", "message"),
                                          ("_stream_generate_response", "response")])
def test_an_ollama_stream_ends_with_its_last_text(handler, key):
    """SGLang's handlers sent the final chunk's text as an empty `done` chunk: a streamed reply lost its last piece."""
    from sglang.srt.entrypoints.ollama.serving import OllamaServing

    handler = getattr(OllamaServing, handler)
    pieces = ["He", "Hello", "Hello wor", "Hello world"]
    as_sglang_sends = streamed(handler, pieces, key)
    assert "".join(t for t, _ in as_sglang_sends) == "Hello wor"  # the bug the hook mends
    fixed = streamed(handler, pieces, key, around=ollama_stream_with_final_text)
    assert "".join(t for t, _ in fixed) == "Hello world"
    assert [done for _, done in fixed] == [False] * 4 + [True] and fixed[-1][0] == ""  # Ollama's own shape
    assert streamed(handler, ["Hi", "Hi"], key, around=ollama_stream_with_final_text) == [("Hi", False), ("", True)]
