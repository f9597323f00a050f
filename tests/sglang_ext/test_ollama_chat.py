"""Ollama's /api/chat under transformers 5 (ollama_chat): the chat template's BatchEncoding becomes the list of ids
SGLang's request expects; nothing a client can send changes. The server-side counterpart (a live /api/chat answered,
streamed and not) is in tests/reliability/test_bad_input_fuzz.py."""

from types import SimpleNamespace

from sglang.srt.managers.io_struct import GenerateReqInput
from transformers import BatchEncoding

from sglang_ext.ollama_chat import ids_of_chat_template


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
