"""The last check before a request goes to the scheduler, whatever HTTP route built it.

request_checks bounds the bodies of the routes whose schemas it knows. SGLang 0.5.20 serves the same generation
through routes it does not (`/invocations`, `/vertex_generate`, `/v1/messages`, `/v1/responses`, `/v1/score`,
Ollama's `/api/chat` and `/api/generate`), and some values pass SGLang's own validation there and then stop the
scheduler: a `top_k` or `min_new_tokens` past int32 (its sampling tensors are int32), a stop token id outside the
vocabulary (an index into a vocabulary-wide tensor), a token id outside it (a completion prompt of floats is coerced
to ints that nothing checks), more top logprobs than the vocabulary, a `logprob_start_len` below -1, a prompt of no
tokens (`/v1/score` with an empty query and item, an embedding batch with an empty prompt: the model's forward
raised on it), and on an embedding server any generation request (SGLang checks only the reverse). All of those
routes meet in `TokenizerManager._create_tokenized_object`, where SGLang runs its own `SamplingParams.verify`; an
AROUND hook there checks the object it built and raises RefusedRequest, a ValueError, which those routes answer
with a 400 as they answer SGLang's own checks there (request_api maps it to a 400 on Ollama's routes too, which
answer any ValueError with a 500). Nothing has reached the scheduler or the cache yet.

The same hook refuses a request that names a session another tenant owns (session_owners): every route's request
that carries `session_params` passes here.

Threading: runs in the HTTP process's event loop, like the method it wraps; its only state is session_owners'.
"""

from __future__ import annotations

from typing import Any

from sglang_ext.request_checks import MAX_NAME_LEN, REPLACE_WITHOUT_RID, outside_vocabulary
from sglang_ext.session_owners import OWNERS

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object"
VALIDATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
BATCH_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._should_use_batch_tokenization"


class RefusedRequest(ValueError):
    """A request refused here: the client's to fix (a 400)."""


def check_tokenized(obj: Any, vocab_size: int) -> None:
    """Raise RefusedRequest (a 400 on every route) if the tokenized request `obj` holds a value that would stop the
    scheduler: its prompt for any request (an embedding's too), its sampling and logprob fields for a generation."""
    ids, session = getattr(obj, "input_ids", None), getattr(obj, "session_params", None)
    if ids is not None and len(ids) == 0 and session is None:
        raise RefusedRequest("a prompt needs at least one token")  # the model's forward raises on none
    bad = outside_vocabulary(ids, vocab_size)
    if bad is not None:
        raise RefusedRequest(f"token id {bad} is outside the vocabulary [0, {vocab_size})")
    if getattr(session, "replace", None) and getattr(session, "rid", None) is None:
        raise RefusedRequest(REPLACE_WITHOUT_RID)
    for name in ("cache_salt", "extra_key"):  # held with every entry they key
        value = getattr(obj, name, None)
        if value is not None and len(value) > MAX_NAME_LEN:
            raise RefusedRequest(f"{name} must be at most {MAX_NAME_LEN} characters, got {len(value)}")
    sp = getattr(obj, "sampling_params", None)
    if sp is None or not hasattr(obj, "top_logprobs_num"):
        return  # not a generation: an embedding has no sampling or logprobs to judge
    for name in ("top_k", "min_new_tokens", "max_new_tokens"):
        value = getattr(sp, name, None)
        if value is not None and value > INT32_MAX:
            raise RefusedRequest(f"{name} must be at most {INT32_MAX}, got {value}")
    bad = outside_vocabulary(sp.stop_token_ids, vocab_size)
    if bad is not None:
        raise RefusedRequest(f"stop_token_ids: {bad} is outside the vocabulary [0, {vocab_size})")
    seed = getattr(sp, "sampling_seed", None)
    if seed is not None and not -INT64_MAX - 1 <= seed <= INT64_MAX:
        raise RefusedRequest(f"sampling_seed must fit a signed 64-bit integer, got {seed}")
    if obj.return_logprob:
        if not 0 <= obj.top_logprobs_num <= vocab_size:
            raise RefusedRequest(f"top logprobs must be from 0 to the vocabulary size ({vocab_size}), "
                                 f"got {obj.top_logprobs_num}")
        if obj.logprob_start_len < -1:
            raise RefusedRequest(f"logprob_start_len must be -1 or more, got {obj.logprob_start_len}")
        if ids is not None and session is None and obj.logprob_start_len > len(ids):
            # SGLang's scheduler refuses it too, but a batch's earlier prompts were cached by then (a session's
            # prompt is only known there, with its history)
            raise RefusedRequest(f"logprob_start_len {obj.logprob_start_len} is more than the prompt's "
                                 f"{len(ids)} tokens")


def refuse_what_sglang_refuses(original, manager, *args, **kwargs):
    """AROUND hook on SGLang's own checks of a request in the tokenizer manager (`_validate_one_request`, and the
    SamplingParams built of the client's fields in `_create_tokenized_object`, with their normalize and verify):
    what they raise is the client's to fix, and is raised as RefusedRequest. Ollama's routes answered SGLang's own
    ValueErrors (a `num_predict` past the context, a `top_k` of 0) with a 500, and a field of the wrong type or
    name (Ollama's `seed` option, which SamplingParams lacks) was a TypeError, a 500 on every route."""
    try:
        return original(manager, *args, **kwargs)
    except RefusedRequest:
        raise
    except ValueError as e:
        raise RefusedRequest(str(e)) from None
    except TypeError as e:
        raise RefusedRequest(f"a sampling field has the wrong type or name ({e})") from None


def guard(original, manager, *args, **kwargs):
    """The AROUND hook on TARGET: SGLang builds the tokenized request, then it is checked before anything sends it."""
    obj = refuse_what_sglang_refuses(original, manager, *args, **kwargs)
    if hasattr(obj, "top_logprobs_num") and not getattr(manager, "is_generation", True):
        # SGLang refuses an embedding request to a generative model, not this: its scheduler stopped on the batch
        raise RefusedRequest("this server runs an embedding model (--is-embedding): it does not generate text; "
                             "use /encode or /v1/embeddings")
    try:
        check_tokenized(obj, int(manager.model_config.vocab_size))
    except TypeError as e:  # a value SGLang let through untyped (an Ollama option, say): not comparable
        raise RefusedRequest(f"a sampling field has the wrong type ({e})") from None
    session = getattr(obj, "session_params", None)
    refusal = OWNERS.admit(getattr(session, "id", None), getattr(obj, "cache_salt", None))
    if refusal is not None:
        raise RefusedRequest(refusal)
    return obj


def batches_checked_whole(original, manager, batch_size, requests):
    """AROUND hook on BATCH_TARGET: a batch of text prompts takes SGLang's batch-tokenizing path, which checks
    every prompt before it sends any. SGLang's default for text tokenizes, checks and sends one prompt at a time, so
    a batch refused at its second prompt (too long, empty, a `top_k` of 0) had its first computed and cached all the
    same, behind the client's 400. Pre-tokenized batches take that path already; prompts with images, audio or
    video, or embeddings, keep SGLang's default (its batch path refuses them), as do a multimodal model's (its
    processor may rewrite any prompt) and DP attention."""
    if original(manager, batch_size, requests):
        return True
    if batch_size <= 0 or manager.server_args.enable_dp_attention or getattr(manager, "mm_processor", None):
        return False
    return all(_plain_text(requests[i]) for i in range(batch_size))


def _plain_text(request) -> bool:
    return (isinstance(request.text, str) and request.input_ids is None
            and getattr(request, "input_embeds", None) is None and not request.contains_mm_input())
