"""SGLang 0.5.20's chat-template calls (chat_templates): Ollama's chat template's BatchEncoding becomes the list of ids
SGLang's request expects, and no template is rendered for a conversation of no messages; nothing a client can send
changes otherwise. The server-side counterparts (a live /api/chat and /v1/responses) are in
tests/server/test_serving.py and tests/reliability/test_bad_input_fuzz.py."""

from types import SimpleNamespace

import pytest
from sglang.srt.managers.io_struct import GenerateReqInput
from transformers import BatchEncoding

from sglang_ext.chat_templates import ids_of_chat_template, refuse_an_empty_conversation


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
