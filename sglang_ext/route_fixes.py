"""Where SGLang 0.5.20's own compatibility routes fail on requests that are well formed, or on inputs a client
chooses: the Ollama routes and the OpenAI Responses route, fixed through hooks in the HTTP process.

- **Ollama's `/api/chat` ids.** Its handler tokenizes with `tokenizer.apply_chat_template(messages, tokenize=True)`
  and passes the result to `GenerateReqInput(input_ids=...)`. Under transformers 5 (SGLang pins 5.12.1) that call
  returns a `BatchEncoding` (a dict of `input_ids` and `attention_mask`), not a list of ids, and the request's
  normalization raised on it ("input_ids should be a list of lists"): every `/api/chat` request, however well
  formed, was a 500. (SGLang's OpenAI chat handler passes `return_dict=False` to the same call.) A BEFORE hook on
  `TokenizerManager.generate_request`, where every route's request enters the tokenizer manager, takes the ids out
  of a `BatchEncoding`. Only that type is unwrapped: a client's JSON can hold a dict but never a `BatchEncoding`, so
  what a client sends is judged as before (a dict of ids on `/generate` is still a 400).
- **Ollama's streams end with their last text.** Both Ollama stream handlers send each chunk's new text, except the
  final chunk's, which they send as an empty `done` chunk: every streamed reply lost its last piece. An AROUND hook
  on each hands SGLang's handler a stream in which the final text arrives in a chunk of its own just before the
  final chunk (SGLang's handler, unchanged, then sends it, and the `done` chunk empty, as Ollama does).
- **A conversation of no messages.** `/v1/responses` turns its input items into chat messages, and some inputs become
  none at all (`"input": []`, or only a `reasoning` item); the chat template then indexed the first message, an
  IndexError and a 500. An AROUND hook on `OpenAIServingChat._render_and_encode_chat_template`, which every route
  that renders SGLang's chat template goes through (the chat completions, responses and tokenize handlers), refuses
  an empty list with a ValueError, which each of those handlers answers with a 400.

Threading: all run in the HTTP process's event loop, like the methods they wrap; they keep no state.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

OLLAMA_IDS_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request"
OLLAMA_STREAM_TARGETS = ("sglang.srt.entrypoints.ollama.serving.OllamaServing._stream_chat_response",
                         "sglang.srt.entrypoints.ollama.serving.OllamaServing._stream_generate_response")
RENDER_TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._render_and_encode_chat_template"


def ids_of_chat_template(manager: Any, obj: Any, *args: Any, **kwargs: Any) -> None:
    """The BEFORE hook: a request whose `input_ids` is a chat template's BatchEncoding gets its list of ids."""
    from transformers import BatchEncoding

    ids = getattr(obj, "input_ids", None)
    if isinstance(ids, BatchEncoding):
        obj.input_ids = list(ids["input_ids"])


async def final_text_first(chunks: AsyncIterator[dict]) -> AsyncIterator[dict]:
    """The tokenizer manager's stream of cumulative-text chunks, with the final chunk's text (when it adds any)
    also sent in a copy of it that is not final, just before it."""
    sent = ""
    async for chunk in chunks:
        meta = chunk.get("meta_info") or {}
        text = chunk.get("text") or ""
        if meta.get("finish_reason") is not None and len(text) > len(sent):
            yield {**chunk, "meta_info": {**meta, "finish_reason": None}}
        sent = text
        yield chunk


class _Delegate:
    """Another object's attributes, but those set here."""

    def __init__(self, inner: Any):
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _FinalTextManager(_Delegate):
    """A tokenizer manager whose streams send their final text before their final chunk."""

    def generate_request(self, *args: Any, **kwargs: Any) -> AsyncIterator[dict]:
        return final_text_first(self._inner.generate_request(*args, **kwargs))


def ollama_stream_with_final_text(original, serving: Any, *args: Any, **kwargs: Any):
    """The AROUND hook on each Ollama stream handler: it runs as written, on a view of its serving object whose
    tokenizer manager is `_FinalTextManager`."""
    view = _Delegate(serving)
    view.tokenizer_manager = _FinalTextManager(serving.tokenizer_manager)
    return original(view, *args, **kwargs)


def refuse_an_empty_conversation(original, serving: Any, messages, *args: Any, **kwargs: Any):
    """The AROUND hook: a chat template is rendered only for at least one message."""
    if not messages:
        raise ValueError("the request holds no message the chat template can render (an empty input, or only "
                         "items that are not messages)")
    return original(serving, messages, *args, **kwargs)
