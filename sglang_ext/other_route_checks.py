"""Checks of SGLang's routes besides /generate and the OpenAI chat and completion routes (request_checks): the
embedding and reward routes, Ollama's, Anthropic's token count, scoring, the parser routes, and the request headers
SGLang parses. A field sweep of each (2026-12-06) found values that stopped the scheduler (an empty embedding
prompt; on an embedding server, `lora_id` on /encode) and a dozen that were a 500; each check raises
request_checks.BadRequest with a message naming the field, which request_api answers with a 400 before SGLang's
handler runs. What only the tokenized request shows (a generation sent to an embedding model, an empty prompt built
from a score's query and item) is scheduler_guard's.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from sglang_ext.request_checks import (SAMPLING_FIELDS, BadRequest, ModelLimits, as_list, check_per_prompt_lists,
                                       check_rid, check_server_set_fields, check_text_length, check_token_ids,
                                       completion_prompt_count, has_type, prompt_count, template_text_length)

# The embedding and reward routes (SGLang's EmbeddingReqInput, and the OpenAI routes that build one) and the field
# that holds their prompts: a list `rid` for one prompt (or of another length) was a TypeError in SGLang, a 500.
EMBEDDING_ROUTES = {"/encode": "text", "/classify": "text", "/v1/embeddings": "input", "/v1/classify": "input"}
# An embedding batch's fields that SGLang indexes by prompt besides `rid` and `sampling_params`, each a list of one
# value per prompt in a batch (a list for one prompt is that prompt's: several images for one text, say).
BATCH_EMBEDDING_FIELDS = ("image_data", "video_data", "audio_data", "embed_overrides", "multi_item_delimiter_indices")
# Ollama's routes (the same variables SGLang's http_server reads) pass the `options` below to SamplingParams as
# sent, under SGLang's names (OllamaServing._convert_options_to_sampling_params; others are ignored there). A value of
# the wrong type was a 500 (a list of lists in `stop`: an IndexError in the tokenizer), and `seed` always was: it
# maps to a field SamplingParams lacks.
OLLAMA_ROUTES = (os.environ.get("SGLANG_OLLAMA_CHAT_ROUTE", "/api/chat"),
                 os.environ.get("SGLANG_OLLAMA_GENERATE_ROUTE", "/api/generate"))
OLLAMA_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "num_predict": "max_new_tokens",
                  "stop": "stop", "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                  "seed": None}
# Lists that must not be empty, by route: Anthropic's token count and Ollama's chat render the chat template on the
# messages as sent (none at all was an IndexError; /v1/messages refuses that itself), and a score of no label tokens
# failed after the model had run (a RuntimeError). Each was a 500.
NON_EMPTY_FIELDS = {"/v1/messages/count_tokens": "messages", OLLAMA_ROUTES[0]: "messages",
                    "/v1/score": "label_token_ids"}
# SGLang's parser routes build the parser a body names; one it does not know was a ValueError there, a 500.
PARSER_FIELDS = {"/parse_function_call": "tool_call_parser", "/separate_reasoning": "reasoning_parser"}
# Every route here that tokenizes, and the fields each renders into one prompt (the routes of batches: the field
# whose items are prompts). Tokenizing runs in SGLang's HTTP process: an 18 MB text held every other request for
# 17-30 s on each of them (then a 400 for a prompt longer than the context, or a count of 10 million tokens), so a
# text that could not fit the context is refused first, as on /generate.
CHAT_FIELDS = ("messages", "system", "tools")
PROMPT_FIELDS = {
    "/v1/messages": CHAT_FIELDS, "/v1/messages/count_tokens": CHAT_FIELDS,
    "/v1/responses": ("input", "instructions", "tools"),
    "/v1/tokenize": ("messages", "tools"), "/tokenize": ("messages", "tools"),
    **dict.fromkeys(OLLAMA_ROUTES, ("messages", "prompt", "system", "suffix", "template")),
}
BATCH_PROMPT_FIELDS = {**EMBEDDING_ROUTES, "/v1/tokenize": "prompt", "/tokenize": "prompt"}
PAIRED_ROUTES = {"/v1/score": "items", "/v1/rerank": "documents"}  # each item is tokenized after the query
# Routes whose request SGLang builds without the client's `cache_salt` (its models there have no such field): a
# tenant's salt was dropped in silence, and its prompt cached where every tenant reaches it (Ollama's routes: 659 of
# a prompt's tokens hit under another salt; an audit, 2026-12-07). A salt there is refused, not ignored.
SALTLESS_ROUTES = (*OLLAMA_ROUTES, *EMBEDDING_ROUTES, "/v1/score", "/v1/rerank")
SALTED_ROUTES = "/generate, /v1/completions, /v1/chat/completions, /v1/messages or /v1/responses"
ROUTES = (*EMBEDDING_ROUTES, *NON_EMPTY_FIELDS, *OLLAMA_ROUTES, *PARSER_FIELDS, *PROMPT_FIELDS, *PAIRED_ROUTES)
# Request headers SGLang reads as an integer on the OpenAI and Anthropic routes: /v1/messages answered one that is
# not an integer with a 500 (the OpenAI routes with a 400).
INT_HEADERS = (b"x-data-parallel-rank",)


def check_route(body: dict, route: str, limits: Optional[ModelLimits] = None) -> None:
    """Every check that applies to a body for `route`, one of ROUTES; `limits` None: the model's are not known yet,
    and the checks that need them are skipped."""
    if route in SALTLESS_ROUTES and body.get("cache_salt") is not None:
        raise BadRequest(f"cache_salt is not supported on {route}: SGLang builds its request without one, so the "
                         f"prompt would be cached where other tenants reach it; send it to {SALTED_ROUTES}")
    if route in EMBEDDING_ROUTES:
        check_embedding(body, EMBEDDING_ROUTES[route], limits)
    elif route in PARSER_FIELDS:
        check_parser(body.get(PARSER_FIELDS[route]), PARSER_FIELDS[route])
    elif route in OLLAMA_ROUTES:
        check_ollama_options(body.get("options"), limits)
    if route in NON_EMPTY_FIELDS and body.get(NON_EMPTY_FIELDS[route]) == []:
        raise BadRequest(f"{NON_EMPTY_FIELDS[route]} must not be empty")
    check_text_length(body, route, limits, prompt_lengths)


def prompt_lengths(body: dict, route: str, most: float) -> list:
    """The length in characters of each prompt text `route` would tokenize from `body`, counted until it passes
    `most` (what a chat template could render of a conversation; a query with each item it is scored against)."""
    lengths = []
    if route in PROMPT_FIELDS:
        lengths.append(template_text_length([body.get(k) for k in PROMPT_FIELDS[route]], most))
    if route in BATCH_PROMPT_FIELDS:
        texts = body.get(BATCH_PROMPT_FIELDS[route])
        lengths += [template_text_length(text, most) for text in as_list(texts)]
    if route in PAIRED_ROUTES:
        query, items = template_text_length(body.get("query"), most), body.get(PAIRED_ROUTES[route])
        lengths += [query + template_text_length(item, most) for item in as_list(items)]
    return lengths


def check_headers(headers) -> None:
    """The headers SGLang parses (ASGI's (name, value) byte pairs; names in lower case) have values it can parse."""
    for name, value in headers:
        if name in INT_HEADERS:
            try:
                int(value)
            except ValueError:
                raise BadRequest(f"the {name.decode()} header must be an integer, got {value!r:.40}") from None


def check_embedding(body: dict, prompt_field: str, limits: Optional[ModelLimits]) -> None:
    """An embedding or reward request (`prompt_field`: where its prompts are): fields SGLang's processes fill in are
    refused as on /generate; a batch's `rid` is a list of one id per prompt, and its per-prompt fields one value
    per prompt (SGLang indexes them); token ids lie in the vocabulary, and no prompt of a batch is empty."""
    if prompt_field == "text":  # SGLang's own EmbeddingReqInput body
        check_server_set_fields(body)
        prompts, ids = prompt_count(body), body.get("input_ids")
        check_per_prompt_lists(body, ("rid", "sampling_params"))
        for name in BATCH_EMBEDDING_FIELDS if prompts is not None else ():
            value = body.get(name)
            if value is not None and not (isinstance(value, list) and len(value) == prompts):
                raise BadRequest(f"{name} must be a list of one value per prompt of the batch's {prompts}")
    else:
        prompts, ids = completion_prompt_count(body, prompt_field), body.get(prompt_field)
        check_rid(body.get("rid"), prompts)
    if prompts is not None and body.get("rid") is not None and not isinstance(body["rid"], list):
        raise BadRequest("rid must be a list of one id per prompt for a batch")  # SGLang asserted it: a 500
    check_token_ids(ids, prompt_field if prompt_field != "text" else "input_ids", limits and limits.vocab_size)


def check_parser(name: Any, field: str) -> None:
    """The parser a body names is one SGLang has (its reasoning parsers are looked up in lower case)."""
    if field == "tool_call_parser":
        from sglang.srt.function_call.function_call_parser import FunctionCallParser

        known, key = FunctionCallParser.ToolCallParserEnum, name
    else:
        from sglang.srt.parser.reasoning_parser import ReasoningParser

        known, key = ReasoningParser.DetectorMap, name.lower() if isinstance(name, str) else name
    if not isinstance(key, str) or key not in known:
        raise BadRequest(f"{field} must name one of SGLang's parsers ({', '.join(sorted(known))}), got {name!r:.80}")


def check_ollama_options(options: Any, limits: Optional[ModelLimits]) -> None:
    """Ollama's `options` that SGLang turns into sampling fields have the types those fields take (or are null) and
    pass SGLang's own SamplingParams.verify; the ones it ignores are not looked at. Checked here because Ollama
    streams by default, and SGLang's refusal came after the stream's 200 (its body: "Internal Server Error")."""
    if not isinstance(options, dict):
        return  # SGLang's model refuses it
    params = {}
    for name, field in OLLAMA_OPTIONS.items():
        value = options.get(name)
        if value is None:
            continue
        if field is None:
            raise BadRequest(f"options.{name} is not supported by this server")
        if not has_type(value, SAMPLING_FIELDS[field]):
            raise BadRequest(f"options.{name} must be {SAMPLING_FIELDS[field]} or null, got {value!r:.80}")
        params[field] = value
    if limits is not None:
        from sglang.srt.sampling.sampling_params import SamplingParams

        try:
            SamplingParams(**params).verify(limits.vocab_size)
        except ValueError as e:
            raise BadRequest(f"options: {e}"[:300]) from None
