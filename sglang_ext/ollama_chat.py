"""Ollama's `/api/chat` under the transformers SGLang 0.5.20 pins: the chat template's token ids as a list.

SGLang 0.5.20's Ollama chat handler tokenizes with `tokenizer.apply_chat_template(messages, tokenize=True)` and
passes the result to `GenerateReqInput(input_ids=...)`. Under transformers 5 (SGLang pins 5.12.1) that call
returns a `BatchEncoding` (a dict of `input_ids` and `attention_mask`), not a list of ids, and the request's
normalization raised on it ("input_ids should be a list of lists"): every `/api/chat` request, however well formed,
was a 500. SGLang's OpenAI chat handler passes `return_dict=False` to the same call; the Ollama one does not.

A BEFORE hook on `TokenizerManager.generate_request`, where every route's request enters the tokenizer manager,
takes the ids out of a `BatchEncoding` before anything reads them. Only a `BatchEncoding` is unwrapped: a client's
JSON can hold a dict but never that type, so what a client sends is judged as before (a dict of ids on `/generate`
is still SGLang's 400).

Threading: runs in the HTTP process's event loop, like the method it precedes; it keeps no state.
"""

from __future__ import annotations

from typing import Any

TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"


def ids_of_chat_template(manager: Any, obj: Any, *args: Any, **kwargs: Any) -> None:
    """The BEFORE hook: a request whose `input_ids` is a chat template's BatchEncoding gets its list of ids."""
    from transformers import BatchEncoding

    ids = getattr(obj, "input_ids", None)
    if isinstance(ids, BatchEncoding):
        obj.input_ids = list(ids["input_ids"])
