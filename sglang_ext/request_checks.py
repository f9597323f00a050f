"""Request fields checked at the HTTP boundary, before SGLang's handlers see them.

SGLang 0.5.20 answers some malformed requests with a 5xx (an unknown `sampling_params` key is a TypeError, a
string where a number belongs fails a comparison) and trusts others completely: `n` copies of a request are built
in the HTTP process before anything is bounded, so `"n": 1e9` exhausts its memory and takes the server down, and
`sampling_params` accepts the fields SGLang fills in itself (`is_normalized`, `stop_strs`, ...); a token id outside
the vocabulary (`input_ids`, or a completion `prompt` of ids) reaches the model and stops the scheduler with an
IndexError, as does `input_embeds` of the wrong width, an empty prompt in a batch, more top logprobs than the
vocabulary, a `logprob_start_len` below -1 or a logit bias beyond float32; some of the OpenAI routes' request
validators read a field before checking its type (`"response_format": true` is an AttributeError, which FastAPI
answers with a 500), and a per-prompt list of the wrong length is a 500 too. A `chat_template_kwargs` key naming the
template call's own `chat_template` replaces the server's template with the client's; a huge text prompt holds the
HTTP process while it is tokenized. Each check here raises BadRequest with a message naming the field;
request_api turns that into an HTTP 400, and nothing reaches the scheduler. SGLang's other routes (embeddings,
Ollama, scoring, ...) are other_route_checks', built on the field kinds and helpers here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any, Optional

from pydantic import ValidationError

MAX_NAME_LEN = 256  # a cache salt or a session id
MAX_SAMPLES = 128  # `n` per prompt, OpenAI's own limit; a batch of prompts multiplies it
MAX_FANOUT = 4096  # prompts x n in one request
_ABSENT = object()  # a field the body does not have, which is not the same as a null

# The API-facing fields of SGLang's SamplingParams (sglang/srt/sampling/sampling_params.py, 0.5.20) and the JSON
# types each takes (None is allowed, but for `n`: check_fanout). Its internal fields are not here, so a client
# cannot set them.
INT, NUM, STR, BOOL = "an integer", "a number", "a string", "a boolean"
STRS, INTS, OBJ = "a string or a list of strings", "a list of integers", "an object"
BIAS = "an object of numbers of at most 3.4e38 in size"
WORD, COUNT = "a non-empty string", "a non-negative integer"
NAME, SECONDS = f"a non-empty string of at most {MAX_NAME_LEN} characters", "a positive finite number of seconds"
SAMPLING_FIELDS = {
    "max_new_tokens": INT, "stop": STRS, "stop_token_ids": INTS, "stop_regex": STRS, "temperature": NUM,
    "top_p": NUM, "top_k": INT, "min_p": NUM, "frequency_penalty": NUM, "presence_penalty": NUM,
    "repetition_penalty": NUM, "min_new_tokens": INT, "n": INT, "beam_width": INT, "json_schema": STR,
    "regex": STR, "ebnf": STR, "structural_tag": STR, "ignore_eos": BOOL, "skip_special_tokens": BOOL,
    "spaces_between_special_tokens": BOOL, "no_stop_trim": BOOL, "stream_interval": INT, "logit_bias": BIAS,
    "sampling_seed": INT, "custom_params": OBJ,
}
# SGLang's SessionParams fields and the types it accepts (None is always allowed).
SESSION_FIELDS = {"id": WORD, "rid": WORD, "offset": COUNT, "replace": BOOL, "drop_previous_output": BOOL}
# SGLang 0.5.20's scheduler clears a whole session (`replace` without a `rid`) by deleting from the dict it iterates:
# on a session that holds a request it raised and the server stopped
REPLACE_WITHOUT_RID = ("session_params.replace needs the rid of the request to replace after; to start a session "
                       "over, close it and open a new one")
# The bodies of SGLang's /open_session and /close_session (OpenSessionReqInput, CloseSessionReqInput) without the
# fields its processes fill in (`rid`, `http_worker_ipc`). SGLang took a negative capacity, a negative or NaN timeout,
# an empty or 100 kB session id, and those internal fields.
SESSION_ROUTES = {
    "/open_session": {"capacity_of_str_len": COUNT, "session_id": NAME, "streaming": BOOL, "timeout": SECONDS},
    "/close_session": {"session_id": NAME},
}

DETOKENIZE_ROUTES = ("/detokenize", "/v1/detokenize")
# Vertex AI's predict route: SGLang builds a /generate request of its `instances` and `parameters` (the same variable
# names the route in SGLang's http_server)
VERTEX_ROUTE = os.environ.get("AIP_PREDICT_ROUTE", "/vertex_generate")
CHECKED_ROUTES = (*DETOKENIZE_ROUTES, *SESSION_ROUTES, VERTEX_ROUTE)  # besides request_api.CARRIED_ROUTES and
# other_route_checks.ROUTES

# GenerateReqInput fields that hold one value per prompt when given as a list: SGLang indexes them by prompt, so a
# list of another length (or a list for one prompt) is a 500 in its HTTP process.
PER_PROMPT_FIELDS = ("sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num",
                     "return_hidden_states", "lora_path", "custom_logit_processor", "cache_salt", "extra_key")
# transformers' apply_chat_template parameters (other than `documents`, a template input SGLang leaves to clients)
TEMPLATE_CALL_ARGS = frozenset({
    "chat_template", "conversation", "messages", "tools", "add_generation_prompt", "continue_final_message",
    "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask",
    "tokenizer_kwargs"})
# A text prompt longer than this many characters per token of the context cannot fit it (real tokenizers average
# 3-5 per token; only runs of whitespace or repeats reach more) and is refused before it is tokenized: tokenizing
# blocks SGLang's HTTP process, and a 20 MB prompt held every other request for 18 s before its own 400.
MAX_CHARS_PER_TOKEN = 32
MAX_STOP_REGEX_BYTES = 256  # SGLang's MAX_STOP_REGEX_LEN
FLOAT32_MAX = 3.4028234663852886e38  # a logit bias SGLang writes into a float32 tensor must fit one

# GenerateReqInput fields that SGLang's own processes fill in (`lora_id`: the tokenizer manager's, from `lora_path`)
# or that only the Python engine can give (`positional_embed_overrides`: tensors); a client that sends one is refused.
# SGLang passes the last two to the scheduler as sent: a list for `lora_id`, or a number for the overrides, stopped it.
SERVER_SET_FIELDS = ("http_worker_ipc", "received_time", "num_items_assigned", "need_wait_for_mm_inputs", "lora_id",
                     "positional_embed_overrides")


class BadRequest(ValueError):
    pass


@dataclass(frozen=True)
class ModelLimits:
    """What the served model accepts: token ids in [0, vocab_size), embeddings `hidden_size` wide, prompts of at
    most `context_len` tokens (None: not known)."""

    vocab_size: int
    hidden_size: int
    context_len: Optional[int] = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_list(value: Any) -> list:
    """A field that takes one value or a list of them (one per prompt of a batch), as a list."""
    return value if isinstance(value, list) else [value]


def _is_batch(value: Any) -> bool:
    """A non-empty list of lists: token ids (or rows) for a batch of prompts rather than for one."""
    return isinstance(value, list) and bool(value) and isinstance(value[0], list)


def _is_bias(value: Any) -> bool:
    """An object of numbers that fit a float32 (a larger one raised in the scheduler, which then stopped)."""
    return isinstance(value, dict) and all(_is_num(v) and abs(v) <= FLOAT32_MAX for v in value.values())


def has_type(value: Any, kind: str) -> bool:
    if kind == INT:
        return _is_int(value)
    if kind == NUM:
        return _is_num(value)
    if kind == STR:
        return isinstance(value, str)
    if kind == WORD:
        return isinstance(value, str) and bool(value)
    if kind == NAME:
        return isinstance(value, str) and 0 < len(value) <= MAX_NAME_LEN
    if kind == SECONDS:
        return _is_num(value) and 0 < value < math.inf
    if kind == COUNT:
        return _is_int(value) and value >= 0
    if kind == BOOL:
        return isinstance(value, bool)
    if kind == STRS:
        return isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    if kind == INTS:
        return isinstance(value, list) and all(_is_int(v) for v in value)
    if kind == BIAS:
        return _is_bias(value)
    return isinstance(value, dict)


def check_fields(obj: dict, fields: dict, where: str) -> None:
    """Every key of `obj` is one of `fields`, with a value of its kind (or null)."""
    for name, value in obj.items():
        kind = fields.get(name)
        if kind is None:
            raise BadRequest(f"{where} has an unknown field {name!r}")
        if value is not None and not has_type(value, kind):
            raise BadRequest(f"{where}.{name} must be {kind} or null, got {value!r:.80}")


def check_sampling_params(params: Any) -> None:
    """`/generate`'s `sampling_params`: an object (or a list of them, for a batch) of known fields and types."""
    for one in as_list(params):
        if one is None:
            continue
        if not isinstance(one, dict):
            raise BadRequest("sampling_params must be an object (or a list of objects, for a batch)")
        check_fields(one, SAMPLING_FIELDS, "sampling_params")
        check_stop_regex(one.get("stop_regex"), "sampling_params.stop_regex")


def check_stop_regex(patterns: Any, field: str) -> None:
    """Each stop regex parses: SGLang parses them in its HTTP process and answered a bad one with a 500. Patterns
    over SGLang's own length limit are left to its 400 (parsing is linear in the pattern's length)."""
    for pattern in as_list(patterns):
        if isinstance(pattern, str) and len(pattern.encode()) <= MAX_STOP_REGEX_BYTES:
            try:
                re.compile(pattern)
            except (re.error, RecursionError, OverflowError) as e:
                raise BadRequest(f"{field} {pattern!r:.80} is not a regular expression: {e}"[:300]) from None


def _samples(value: Any, field: str) -> int:
    """The completions `n` asks for: 1 if absent. A null is refused, not read as absent: SGLang's /generate reads
    `sampling_params["n"]` as given and compared None with 1, a 500 (the OpenAI routes' schema refuses it too)."""
    if value is _ABSENT:
        return 1
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # pydantic takes 2.0 for 2; so do we, and bound it
    if not _is_int(value) or not 1 <= value <= MAX_SAMPLES:
        raise BadRequest(f"{field} must be an integer from 1 to {MAX_SAMPLES}, got {value!r}")
    return value


def check_fanout(body: dict, route: str) -> None:
    """Bound the copies SGLang builds in the HTTP process: `n` per prompt, and prompts x `n` per request."""
    if route == "/generate":
        params = body.get("sampling_params")
        per = [_samples(p.get("n", _ABSENT) if isinstance(p, dict) else _ABSENT, "sampling_params.n")
               for p in as_list(params)]
        batch = prompt_count(body) or 1
    else:
        per = [_samples(body.get("n", _ABSENT), "n")]
        batch = completion_prompt_count(body) or 1
    n = max(per, default=1)
    if batch * n > MAX_FANOUT:
        raise BadRequest(f"a request may ask for at most {MAX_FANOUT} completions (prompts x n), got {batch} x {n}")


def check_cache_key(value: Any, field: str) -> None:
    """`cache_salt` and `extra_key` are part of every cached entry's key, held as long as the entry is: bounded
    like a name (an 8 MB `extra_key` was kept with each 2-token entry, and eviction counts tokens, not bytes)."""
    if value is not None and not all(has_type(s, NAME) for s in as_list(value)):
        raise BadRequest(f"{field} must be a non-empty string (or a list of them, for a batch) of at most "
                         f"{MAX_NAME_LEN} characters")


def check_session_params(params: Any) -> None:
    """Refuse malformed `session_params` here, before SGLang's scheduler sees (and half-applies) them."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise BadRequest("session_params must be an object")
    check_fields(params, SESSION_FIELDS, "session_params")
    if params.get("replace") and params.get("rid") is None:
        raise BadRequest(REPLACE_WITHOUT_RID)


def check_token_ids(ids: Any, field: str, vocab_size: Optional[int]) -> None:
    """A list of token ids (or a batch of them) is not empty and names only tokens of the vocabulary (when it is
    known); other shapes are SGLang's. SGLang refuses an empty prompt on its own, but an empty one in a batch
    reaches the model, whose forward raises on zero tokens and stops the scheduler."""
    batch = _is_batch(ids)
    for i, seq in enumerate(ids if batch else [ids]):
        if isinstance(seq, list) and not seq:
            raise BadRequest(f"{field}[{i}] is empty: a prompt needs at least one token" if batch else
                             f"{field} is empty: a prompt needs at least one token")
        if vocab_size is not None and isinstance(seq, list):
            bad = outside_vocabulary(seq, vocab_size)
            if bad is not None:
                raise BadRequest(f"{field} has token id {bad}, outside the vocabulary [0, {vocab_size})")


def outside_vocabulary(seq, vocab_size: int):
    """A number of `seq` (a list, array or set of token ids) outside [0, vocab_size), or None; other items are
    SGLang's to refuse. A float counts too: SGLang coerces a completion prompt's 9.0e8 to the id 900000000."""
    if not seq or _within(seq, vocab_size):
        return None
    return next((t for t in seq if _is_num(t) and not 0 <= t < vocab_size), None)


def _within(seq, vocab_size: int) -> bool:
    """True if every number in `seq` lies in [0, vocab_size): two C-speed passes over a prompt's ids. False when
    unsure (a non-number, or a NaN, in the list); the caller then looks at each id."""
    try:
        return 0 <= min(seq) and max(seq) < vocab_size
    except (TypeError, RecursionError):  # lists compare item by item, as deep as a client nested them
        return False


def check_input_embeds(embeds: Any, hidden_size: int) -> None:
    if embeds is None:
        return
    for rows in embeds if _is_batch(embeds) and _is_batch(embeds[0]) else [embeds]:
        if not (isinstance(rows, list) and rows and all(
                isinstance(row, list) and len(row) == hidden_size and all(_is_num(x) for x in row) for row in rows)):
            raise BadRequest(f"input_embeds must be a non-empty list of rows of {hidden_size} numbers "
                             "(or a batch of them)")


def check_server_set_fields(body: dict) -> None:
    """None of SERVER_SET_FIELDS is in a /generate (or SGLang's embedding) body."""
    for name in SERVER_SET_FIELDS:
        if body.get(name) is not None:
            raise BadRequest(f"{name} is set by the server, not by a request")


def check_texts(texts: Any, field: str) -> None:
    """No text prompt of a batch is empty (SGLang refuses one on its own, but in a batch only once the prompts
    before it were sent)."""
    if isinstance(texts, list):
        for i, text in enumerate(texts):
            if text == "":
                raise BadRequest(f"{field}[{i}] is empty: a prompt needs at least one token")


def check_generate(body: dict, limits: Optional[ModelLimits]) -> None:
    check_server_set_fields(body)
    check_texts(body.get("text"), "text")
    check_sampling_params(body.get("sampling_params"))
    check_per_prompt_lists(body)
    check_logprob_fields(body, limits)
    check_token_ids(body.get("input_ids"), "input_ids", limits and limits.vocab_size)
    if limits is not None:
        check_input_embeds(body.get("input_embeds"), limits.hidden_size)


def prompt_count(body: dict) -> Optional[int]:
    """How many prompts a /generate body holds as a batch; None for a single prompt."""
    text, ids, embeds = body.get("text"), body.get("input_ids"), body.get("input_embeds")
    if text is not None:
        return len(text) if isinstance(text, list) else None
    if ids is not None:
        return len(ids) if _is_batch(ids) else None
    return len(embeds) if _is_batch(embeds) and _is_batch(embeds[0]) else None


def completion_prompt_count(body: dict, field: str = "prompt") -> Optional[int]:
    """How many prompts a /v1/completions body (or an OpenAI embedding's `input`) holds as a batch (texts, or lists
    of ids); None for one."""
    prompt = body.get(field)
    return len(prompt) if isinstance(prompt, list) and prompt and not _is_int(prompt[0]) else None


def check_rid(rid: Any, prompts: Optional[int]) -> None:
    """A list `rid` holds one id per prompt of a batch (`prompts`; None: the request has one prompt)."""
    if isinstance(rid, list) and len(rid) != prompts:
        raise BadRequest(f"rid is a list of {len(rid)}: it needs one id per prompt of a batch, and the request has "
                         f"{prompts or 'one'}")


def check_per_prompt_lists(body: dict, fields: tuple = PER_PROMPT_FIELDS) -> None:
    """A per-prompt field given as a list has one value per prompt of a batch (token_ids_logprob: a list of
    lists; a flat list of ids is shared by all)."""
    prompts = prompt_count(body)
    nested_ids = _is_batch(body.get("token_ids_logprob"))
    for name in fields + (("token_ids_logprob",) if nested_ids else ()):
        value = body.get(name)
        if not isinstance(value, list):
            continue
        if prompts is None:
            raise BadRequest(f"{name} is a list (one value per prompt of a batch), but the request has one prompt")
        if len(value) != prompts:
            raise BadRequest(f"{name} has {len(value)} values, one per prompt, but the request has {prompts} prompts")


def check_logprob_fields(body: dict, limits: Optional[ModelLimits]) -> None:
    """/generate's logprob fields, each a value or a list of one per prompt."""
    for k in as_list(body.get("top_logprobs_num")):
        check_top_logprobs(k, "top_logprobs_num", limits)
    for start in as_list(body.get("logprob_start_len")):
        if _is_int(start) and start < -1:
            raise BadRequest(f"logprob_start_len must be -1 (output only) or a prompt position, got {start}")


def check_top_logprobs(k: Any, field: str, limits: Optional[ModelLimits]) -> None:
    """How many top logprobs to return per position: at most the vocabulary (more stopped the scheduler in its
    top-k). Other types are left to SGLang's validation."""
    if not _is_int(k):
        return
    if k < 0:
        raise BadRequest(f"{field} must not be negative, got {k}")
    if limits is not None and k > limits.vocab_size:
        raise BadRequest(f"{field} must be at most the vocabulary size ({limits.vocab_size}), got {k}")


def check_openai_fields(body: dict, route: str, limits: Optional[ModelLimits]) -> None:
    """The OpenAI routes' fields that reach the scheduler unbounded (what SGLang's request models accept)."""
    if body.get("logit_bias") is not None and not _is_bias(body["logit_bias"]):
        raise BadRequest(f"logit_bias must be {BIAS}")
    check_stop_regex(body.get("stop_regex"), "stop_regex")
    check_rid(body.get("rid"), completion_prompt_count(body) if route == "/v1/completions" else None)
    if route == "/v1/chat/completions":
        check_top_logprobs(body.get("top_logprobs"), "top_logprobs", limits)
        check_final_message(body)
        check_template_kwargs(body.get("chat_template_kwargs"))
        return
    check_top_logprobs(body.get("logprobs"), "logprobs", limits)
    if body.get("echo") is True and body.get("logprobs") == 0:  # SGLang 0.5.20 then fails building the answer
        raise BadRequest("echo with logprobs 0 is not supported; ask for logprobs of 1 or more")


def check_final_message(body: dict) -> None:
    """`continue_final_message` takes the last assistant message out as the answer's prefix; with nothing before
    it SGLang indexed an empty conversation (a 500)."""
    messages = body.get("messages")
    if body.get("continue_final_message") is True and isinstance(messages, list) and len(messages) == 1 \
            and isinstance(messages[0], dict) and messages[0].get("role") == "assistant" \
            and isinstance(messages[0].get("content"), str):
        raise BadRequest("continue_final_message needs a message before the assistant's final one")


def check_template_kwargs(kwargs: Any) -> None:
    """`chat_template_kwargs` are variables for the served chat template, merged into the tokenizer's
    apply_chat_template call: a key naming one of its own parameters replaced the server's template
    (`chat_template`: a client's Jinja ran in the HTTP process) or its tokenization, or collided (a 500)."""
    taken = sorted(TEMPLATE_CALL_ARGS & kwargs.keys()) if isinstance(kwargs, dict) else []
    if taken:
        raise BadRequest(f"chat_template_kwargs.{taken[0]} is the server's to set, not a template variable")


def check_detokenize(body: dict) -> None:
    """Token ids to detokenize are not negative (SGLang's tokenizer raised on one: a 500); ids past the
    vocabulary detokenize to nothing, as in SGLang."""
    tokens = body.get("tokens")
    for seq in tokens if _is_batch(tokens) else [tokens]:
        if isinstance(seq, list) and any(_is_int(t) and t < 0 for t in seq):
            raise BadRequest("tokens must not be negative")


def _openai_models() -> dict:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest

    return {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}


def check_openai_body(body: dict, route: str) -> None:
    """Run SGLang's own request model for an OpenAI route on a copy (its validators change what they read): a
    validator that raises anything but a validation error would be a 500 in SGLang's handler. A validation error is
    left for SGLang to answer, with its own 400."""
    model = _openai_models().get(route)
    if model is None:
        return
    try:
        model.model_validate(json.loads(json.dumps(body)))
    except ValidationError:
        return
    except Exception as e:  # noqa: BLE001 - any other exception is a field of the wrong shape
        raise BadRequest(f"a field has the wrong type for {route} ({type(e).__name__}: {e})"[:300]) from None


MEDIA_PARTS = ("image_url", "video_url", "audio_url", "input_audio")  # content parts whose payload is not rendered


def template_text_length(value: Any, most: float = math.inf) -> int:
    """Characters a chat template could render from `value`: every string in it, keys included (a template may
    write tools or tool calls out as JSON), except the payload of media parts (a processor's input, not text).
    A walk with a stack of its own, so any depth the JSON parser let through is counted; it stops once the count
    passes `most` (the walk costs no more than the text it may refuse)."""
    n, stack = 0, [value]
    while stack and n <= most:
        v = stack.pop()
        if isinstance(v, str):
            n += len(v)
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, dict):
            media = v.get("type") if v.get("type") in MEDIA_PARTS else None  # a media part: skip its payload only
            n += sum(len(k) for k in v)  # JSON keys are strings
            stack.extend(x for k, x in v.items() if k != media)
    return n


def prompt_lengths(body: dict, route: str, most: float = math.inf) -> list:
    """The length in characters of each prompt text a body asks SGLang to tokenize (a chat: what its template
    renders, together: messages with their names and tool calls, `tools`, and the template's own variables;
    counted until it passes `most`)."""
    if route == "/v1/chat/completions":
        return [template_text_length([body.get(k) for k in ("messages", "tools", "chat_template_kwargs")], most)]
    text = body.get("text" if route == "/generate" else "prompt")
    return [len(t) for t in as_list(text) if isinstance(t, str)]


def check_text_length(body: dict, route: str, limits: Optional[ModelLimits], lengths=prompt_lengths) -> None:
    """No prompt text of the body (`lengths`: its texts' lengths, counted up to a bound) is longer than the
    context could hold."""
    if limits is None or limits.context_len is None:
        return
    most = limits.context_len * MAX_CHARS_PER_TOKEN
    for n in lengths(body, route, most):
        if n > most:
            raise BadRequest(f"a prompt of at least {n} characters cannot fit the model's context of "
                             f"{limits.context_len} tokens (more than {MAX_CHARS_PER_TOKEN} characters per token)")


def vertex_as_generate(body: dict) -> Optional[dict]:
    """The /generate body SGLang's Vertex AI route builds: the prompts of its `instances` (the first of text,
    input_ids, input_embeds that the first instance has) as a batch, `parameters` as the other fields. None where
    SGLang answers itself (no instances, or a body its model refuses)."""
    instances, parameters = body.get("instances"), body.get("parameters") or {}
    if not instances or not isinstance(instances, list) or not all(isinstance(i, dict) for i in instances) \
            or not isinstance(parameters, dict):
        return None
    inputs = {}
    for name in ("text", "input_ids", "input_embeds"):
        if instances[0].get(name):
            inputs[name] = [instance.get(name) for instance in instances]
            break
    clash = sorted(({*inputs, "image_data"}) & parameters.keys())
    if clash:  # SGLang passed both as keyword arguments: a TypeError, a 500
        raise BadRequest(f"parameters.{clash[0]} is given by the instances")
    unknown = sorted(parameters.keys() - _generate_fields())
    if unknown:  # the same TypeError
        raise BadRequest(f"parameters has an unknown field {unknown[0]!r:.80} (not a field of a /generate request)")
    return {**inputs, **parameters}


def _generate_fields() -> frozenset:
    from sglang.srt.managers.io_struct import GenerateReqInput  # loaded in the HTTP process already

    return frozenset(f.name for f in dataclasses.fields(GenerateReqInput))


def check_request(body: dict, route: str, limits: Optional[ModelLimits] = None) -> None:
    """Every check that applies to a body for `route` (request_api.CARRIED_ROUTES, CHECKED_ROUTES); `limits`
    None: the model's are not known yet, and the checks that need them are skipped."""
    if route in DETOKENIZE_ROUTES:
        check_detokenize(body)
        return
    if route in SESSION_ROUTES:
        check_fields(body, SESSION_ROUTES[route], route[1:])
        return
    if route == VERTEX_ROUTE:
        generate = vertex_as_generate(body)
        if generate is not None:
            check_request(generate, "/generate", limits)
        return
    check_cache_key(body.get("cache_salt"), "cache_salt")
    check_cache_key(body.get("extra_key"), "extra_key")
    check_session_params(body.get("session_params"))
    if route == "/generate":
        check_generate(body, limits)
    else:
        check_openai_fields(body, route, limits)
    if route == "/v1/completions":
        check_token_ids(body.get("prompt"), "prompt", limits and limits.vocab_size)
        check_texts(body.get("prompt"), "prompt")
    check_text_length(body, route, limits)
    check_fanout(body, route)
    check_openai_body(body, route)
