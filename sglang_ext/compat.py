"""The SGLang interface this project relies on, named in one place, and the start-up check against it.

The tiered cache subclasses SGLang's RadixCache / HiRadixCache and overrides or calls some of their private
methods; the HTTP side reads a private module global of SGLang's server. None of that is a stable API: a
new SGLang can rename a method or change its parameters, and an override that SGLang no longer calls fails
silently (a split the policy never hears of, a host admission that never runs). So the launcher and the
plugin compare the installed SGLang with PINNED_SGLANG and every hook below with the parameters it had
there, and refuse to start with a message naming what changed.

Each hook: (module, dotted attribute, parameter names or None for "must exist", how we use it).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

PINNED_SGLANG = "0.5.20"

_RC = "sglang.srt.mem_cache.radix_cache"
_HR = "sglang.srt.mem_cache.hiradix_cache"


@dataclass(frozen=True)
class Hook:
    module: str
    attr: str
    params: Optional[Tuple[str, ...]]  # None: only its presence is checked
    use: str


def _hook(module: str, attr: str, params: Optional[str], use: str) -> Hook:
    return Hook(module, attr, None if params is None else tuple(p.strip() for p in params.split(",")), use)


CACHE_HOOKS = (
    _hook(_RC, "RadixCache._split_node", "self, key, child, split_len", "overridden: splits reach the policy"),
    _hook(_RC, "RadixCache._delete_leaf", "self, node", "called: removes a policy's victim"),
    _hook(_RC, "RadixCache.insert", "self, params", "overridden: admission"),
    _hook(_RC, "RadixCache.evict", "self, params", "overridden: the policy's victims"),
    _hook(_RC, "RadixCache.update_eviction_metrics", "self, num_evicted, start_time", "called by evict"),
    _hook(_RC, "RadixCache.cache_finished_req", "self, req, is_insert, kv_len_to_handle", "overridden"),
    _hook(_RC, "RadixCache.cache_unfinished_req", "self, req, chunked", "overridden"),
    _hook(_RC, "RadixKey.child_key_at", "self, offset, page_size", "called: the walk without changes"),
    _hook(_RC, "RadixKey.match_at", "self, other, offset, page_size", "called: the walk without changes"),
    _hook(_HR, "HiRadixCache._split_node", "self, key, child, split_len", "overridden: split notifications"),
    _hook(_HR, "HiRadixCache._inc_hit_count", "self, node, chunked", "overridden: host admission"),
    _hook(_HR, "HiRadixCache._evict_backuped", "self, node", "overridden: demotions counted"),
    _hook(_HR, "HiRadixCache._evict_regular", "self, node", "overridden: drops counted"),
    _hook(_HR, "HiRadixCache.evict_host", "self, num_tokens", "overridden: host evictions counted"),
    _hook(_HR, "HiRadixCache.write_backup", "self, node, write_back", "called: host admission"),
    _hook(_HR, "HiRadixCache.insert", "self, params", "overridden: retention"),
    _hook("sglang.srt.mem_cache.utils", "get_eviction_strategy", "eviction_policy, config", "called"),
    _hook("sglang.srt.mem_cache.registry", "register_radix_cache_backend", "name, factory", "called"),
    _hook("sglang.srt.mem_cache.registry", "default_radix_cache_factory", "ctx", "called"),
    _hook("sglang.srt.mem_cache.pool_host.common", "ALLOC_MEMORY_FUNCS", None, "filled: CPU host pool"),
    _hook(_RC, "RadixCache.match_prefix", "self, params", "overridden: hits for the operator signals"),
    _hook("sglang.srt.mem_cache.events", "KVCacheEventRecorder.record_store", "self, node, medium, session_id",
          "wrapped: stores feed the operator signals"),
    _hook("sglang.srt.mem_cache.events", "KVCacheEventRecorder.record_remove", "self, node, medium",
          "wrapped: removals feed the operator signals"),
    _hook("sglang.srt.mem_cache.allocator.base", "BaseTokenToKVPoolAllocator.get_all_free_pages", "self",
          "called: device pool fragmentation"),
    _hook("sglang.srt.managers.scheduler", "Scheduler.on_idle", "self", "hooked: signals exported while idle"),
    _hook("sglang.srt.managers.scheduler", "Scheduler.open_session", "self, recv_req",
          "hooked: --tier-max-open-sessions"),
    _hook("sglang.srt.managers.scheduler", "Scheduler.handle_generate_request", "self, recv_req, mm_input_error",
          "hooked: a refused session turn leaves the session as it was (session_turns)"),
    _hook("sglang.srt.managers.tokenizer_manager", "TokenizerManager._create_tokenized_object",
          "self, obj, input_text, input_ids, input_embeds, mm_inputs, token_type_ids",
          "hooked: the last check before the scheduler (scheduler_guard)"),
    _hook("sglang.srt.managers.tokenizer_manager", "TokenizerManager._validate_one_request", "self, obj, input_ids",
          "hooked: SGLang's own refusals are a 400 on every route (scheduler_guard)"),
    _hook("sglang.srt.managers.tokenizer_manager", "TokenizerManager._should_use_batch_tokenization",
          "self, batch_size, requests", "hooked: a text batch is checked whole before any of it is sent"),
)
HTTP_HOOKS = (
    _hook("sglang.srt.entrypoints.http_server", "_global_state", None, "read: /tiers/stats"),
    _hook("sglang.srt.entrypoints.http_server", "app", None, "extended: middleware and /tiers/stats"),
    _hook("sglang.srt.managers.scheduler", "Scheduler.get_internal_state", "self, recv_req",
          "hooked: tier counters"),
    _hook("sglang.srt.entrypoints.anthropic.serving", "AnthropicServing._convert_to_chat_completion_request",
          "self, anthropic_request", "hooked: a /v1/messages TTL reaches the chat request (request_api)"),
    _hook("sglang.srt.managers.tokenizer_manager", "TokenizerManager.generate_request", "self, obj, request",
          "hooked: Ollama's chat template ids as a list (route_fixes)"),
    _hook("sglang.srt.entrypoints.ollama.serving", "OllamaServing._stream_chat_response",
          "self, gen_request, raw_request, model_name", "hooked: the stream ends with its last text (route_fixes)"),
    _hook("sglang.srt.entrypoints.ollama.serving", "OllamaServing._stream_generate_response",
          "self, gen_request, raw_request, model_name", "hooked: the stream ends with its last text (route_fixes)"),
    _hook("sglang.srt.entrypoints.openai.serving_chat", "OpenAIServingChat._render_and_encode_chat_template",
          "self, messages, tools, template_kwargs, encode_kwargs, use_cache",
          "hooked: no chat template rendered for no messages (route_fixes)"),
)


class IncompatibleSGLang(RuntimeError):
    pass


def _resolve(hook: Hook):
    obj = importlib.import_module(hook.module)
    for part in hook.attr.split("."):
        obj = getattr(obj, part)
    return obj


def hook_problem(hook: Hook, resolve: Callable[[Hook], object] = _resolve) -> Optional[str]:
    """What changed about one hook, or None."""
    where = f"{hook.module}.{hook.attr}"
    try:
        obj = resolve(hook)
    except (ImportError, AttributeError):
        return f"{where} is gone ({hook.use})"
    if hook.params is None:
        return None
    try:
        params = tuple(inspect.signature(obj).parameters)
    except (TypeError, ValueError):
        return f"{where} is no longer a function ({hook.use})"
    if params != hook.params:
        return f"{where} takes ({', '.join(params)}), expected ({', '.join(hook.params)}) ({hook.use})"
    return None


def problems(hooks=CACHE_HOOKS, version: Optional[str] = None, resolve=_resolve) -> List[str]:
    """Every difference between the installed SGLang and the one this project is pinned to."""
    if version is None:
        try:
            version = importlib.metadata.version("sglang")
        except importlib.metadata.PackageNotFoundError:
            return ["sglang is not installed"]
    found = [] if version == PINNED_SGLANG else [f"installed sglang is {version}, this project needs {PINNED_SGLANG}"]
    return found + [p for p in (hook_problem(h, resolve) for h in hooks) if p]


def check(hooks=CACHE_HOOKS + HTTP_HOOKS, version: Optional[str] = None) -> None:
    """Raise IncompatibleSGLang naming every difference (None found: returns)."""
    found = problems(hooks, version)
    if found:
        raise IncompatibleSGLang("the installed SGLang does not match the interface sglang_ext is pinned to:\n  - "
                                 + "\n  - ".join(found))
