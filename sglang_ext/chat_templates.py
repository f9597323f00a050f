"""SGLang 0.5.20's chat-template calls in the HTTP process, where two of its routes fail on every request or on
inputs a client chooses: the Ollama chat's token ids, and a conversation of no messages.

- **Ollama's `/api/chat`.** Its handler tokenizes with `tokenizer.apply_chat_template(messages, tokenize=True)` and
  passes the result to `GenerateReqInput(input_ids=...)`. Under transformers 5 (SGLang pins 5.12.1) that call returns
  a `BatchEncoding` (a dict of `input_ids` and `attention_mask`), not a list of ids, and the request's normalization
  raised on it ("input_ids should be a list of lists"): every `/api/chat` request, however well formed, was a 500.
  SGLang's OpenAI chat handler passes `return_dict=False` to the same call; the Ollama one does not. A BEFORE hook on
  `TokenizerManager.generate_request`, where every route's request enters the tokenizer manager, takes the ids out
  of a `BatchEncoding` before anything reads them. Only that type is unwrapped: a client's JSON can hold a dict but
  never a `BatchEncoding`, so what a client sends is judged as before (a dict of ids on `/generate` is still a 400).
- **A conversation of no messages.** `/v1/responses` turns its input items into chat messages, and some inputs
  become none at all (`"input": []`, or only a `reasoning` item); the chat template then indexed the first message,
  an IndexError and a 500. An AROUND hook on `OpenAIServingChat._render_and_encode_chat_template`, which every route
  that renders SGLang's chat template goes through (the chat completions, responses and tokenize handlers), refuses
  an empty list with a ValueError, which each of those handlers answers with a 400 (the chat routes refused an empty
  `messages` before; this is the one place all of them meet).

Threading: both run in the HTTP process's event loop, like the methods they wrap; they keep no state.
"""

from __future__ import annotations

from typing import Any

OLLAMA_IDS_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"
RENDER_TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._render_and_encode_chat_template"


def ids_of_chat_template(manager: Any, obj: Any, *args: Any, **kwargs: Any) -> None:
    """The BEFORE hook: a request whose `input_ids` is a chat template's BatchEncoding gets its list of ids."""
    from transformers import BatchEncoding

    ids = getattr(obj, "input_ids", None)
    if isinstance(ids, BatchEncoding):
        obj.input_ids = list(ids["input_ids"])


def refuse_an_empty_conversation(original, serving: Any, messages, *args: Any, **kwargs: Any):
    """The AROUND hook: a chat template is rendered only for at least one message."""
    if not messages:
        raise ValueError("the request holds no message the chat template can render (an empty input, or only "
                         "items that are not messages)")
    return original(serving, messages, *args, **kwargs)
