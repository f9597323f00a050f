"""The SGLang plugin (entry point group `sglang.srt.plugins`): registers the `tiered` tree-cache backend.

SGLang calls `register()` in the launcher and in every scheduler process; the launcher also calls it before
parsing arguments, because `--radix-cache-backend` accepts only registered names. It is idempotent, and it
never raises on the serving path. It first compares the installed SGLang with the pinned interface (compat):
on any difference it logs what changed, installs no hook, and the `tiered` backend refuses to build, so a
server asked for it does not start. What it installs otherwise:
- every process: the `tiered` backend; on CPU, the HiCache seams (cpu_hicache); the last check of a tokenized
  request before it goes to the scheduler (scheduler_guard);
- scheduler processes: a hook that adds the tree cache's tier counters to `get_internal_state`; where the
  `tiered` backend is built, a thread that returns freed heap memory to the system (heap_trim);
- the HTTP (main) process: the `cache_control` middleware, its TTL carried through SGLang's Anthropic route, and
  `GET /tiers/stats` (request_api); fixes of SGLang's Ollama and Responses routes (route_fixes).
"""

from __future__ import annotations

import logging
import multiprocessing

logger = logging.getLogger(__name__)

BACKEND_NAME = "tiered"
_registered = False
_incompatible = None  # compat's message when the installed SGLang differs from the pinned interface


def register() -> None:
    global _registered, _incompatible
    if _registered:
        return
    _registered = True
    from sglang_ext import memory_debug

    memory_debug.install_from_env()  # off unless SGLANG_EXT_MEMORY_DEBUG is set (a debug aid)
    from sglang_ext import compat

    main_process = multiprocessing.parent_process() is None
    try:
        compat.check(compat.CACHE_HOOKS + (compat.HTTP_HOOKS if main_process else ()))
    except compat.IncompatibleSGLang as e:
        _incompatible = str(e)
        logger.error("sglang_ext: %s", e)
    from sglang.srt.mem_cache.registry import register_radix_cache_backend, registered_radix_cache_backends
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.utils import is_cpu

    from sglang_ext import request_api, route_fixes, scheduler_guard, session_cap, session_turns, tier_signals
    from sglang_ext.tier_config import TierConfig

    if BACKEND_NAME not in registered_radix_cache_backends():
        register_radix_cache_backend(BACKEND_NAME, build_tree_cache)
    if _incompatible:
        return
    if is_cpu():
        from sglang_ext import cpu_hicache

        cpu_hicache.install()
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.get_internal_state",
                          request_api.attach_stats_to_internal_state, HookType.AFTER)
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.on_idle", tier_signals.refresh_on_idle,
                          HookType.AFTER)
    # the tokenizer manager runs in the HTTP (main) process; a stock launch may also serve from SGLang's tokenizer
    # workers, which load no plugin (our launcher refuses --tokenizer-worker-num > 1 for that reason)
    HookRegistry.register(scheduler_guard.TARGET, scheduler_guard.guard, HookType.AROUND)
    HookRegistry.register(scheduler_guard.VALIDATE_TARGET, scheduler_guard.refuse_what_sglang_refuses, HookType.AROUND)
    HookRegistry.register(scheduler_guard.BATCH_TARGET, scheduler_guard.batches_checked_whole, HookType.AROUND)
    HookRegistry.register(session_turns.TARGET, session_turns.forget_refused_turn, HookType.AROUND)
    if TierConfig.launched():  # a stock `sglang.launch_server` (the plugin is installed) keeps SGLang's behaviour
        HookRegistry.register("sglang.srt.managers.scheduler.Scheduler.open_session",
                              session_cap.refuse_over_cap(TierConfig.from_env().max_open_sessions), HookType.AROUND)
    if main_process:
        HookRegistry.register(request_api.ANTHROPIC_CONVERSION, request_api.carry_metadata_to_chat, HookType.AFTER)
        HookRegistry.register(route_fixes.OLLAMA_IDS_TARGET, route_fixes.ids_of_chat_template, HookType.BEFORE)
        for target in route_fixes.OLLAMA_STREAM_TARGETS:
            HookRegistry.register(target, route_fixes.ollama_stream_with_final_text, HookType.AROUND)
        HookRegistry.register(route_fixes.RENDER_TARGET, route_fixes.refuse_an_empty_conversation, HookType.AROUND)
        request_api.install_http_routes()


def build_tree_cache(ctx):
    """`--radix-cache-backend tiered`: the project's tree cache, or SGLang's own where ours does not apply."""
    from sglang.srt.mem_cache.registry import default_radix_cache_factory

    from sglang_ext.compat import IncompatibleSGLang
    from sglang_ext.tier_config import TierConfig

    if _incompatible:
        raise IncompatibleSGLang(_incompatible)
    if ctx.disable_radix_cache or ctx.is_hybrid_swa or ctx.is_hybrid_ssm or ctx.is_dsa:
        logger.info("tiered cache: model or flags need SGLang's own cache; using the default chain")
        return default_radix_cache_factory(ctx)
    config = TierConfig.from_env()
    if ctx.enable_hierarchical_cache:
        from sglang_ext.tiered_hicache import TieredHiRadixCache

        cache = TieredHiRadixCache(ctx.params, ctx.server_args, policy=config.policy,
                                   retention_budget=config.retention_budget, stats_tenants=config.stats_tenants,
                                   tuning=config.tuning(host_tier=True),
                                   enable_metrics=bool(ctx.server_args.enable_metrics))
        # The forward pass waits on this counter for host->device loads (see sglang registry.py).
        ctx.tp_worker.register_hicache_layer_transfer_counter(cache.cache_controller.layer_done_counter)
    else:
        from sglang_ext.serving_cache import ServingTieredCache

        cache = ServingTieredCache(ctx.params, policy=config.policy, retention_budget=config.retention_budget,
                                   stats_tenants=config.stats_tenants, tuning=config.tuning(),
                                   enable_metrics=bool(ctx.server_args.enable_metrics))
    logger.info("tiered cache: %s with policy %s", type(cache).__name__, config.policy)
    from sglang_ext import heap_trim

    heap_trim.start_from_env()  # this scheduler gives freed heap back every 30 s (heap_trim.py)
    return cache
