"""The SGLang plugin (entry point group `sglang.srt.plugins`): registers the `tiered` tree-cache backend.

SGLang calls `register()` in the launcher and in every scheduler process. It must be idempotent (the launcher
also calls it before parsing arguments, because `--radix-cache-backend` accepts only registered names) and it
must never raise on the serving path.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

BACKEND_NAME = "tiered"


def register() -> None:
    from sglang.srt.mem_cache.registry import register_radix_cache_backend, registered_radix_cache_backends

    if BACKEND_NAME not in registered_radix_cache_backends():
        register_radix_cache_backend(BACKEND_NAME, build_tree_cache)
    from sglang.srt.utils import is_cpu

    if is_cpu():
        from sglang_ext import cpu_hicache

        cpu_hicache.install()


def build_tree_cache(ctx):
    """`--radix-cache-backend tiered`: the project's tree cache, or SGLang's own where ours does not apply."""
    from sglang.srt.mem_cache.registry import default_radix_cache_factory

    from sglang_ext.tier_config import TierConfig

    if ctx.disable_radix_cache or ctx.is_hybrid_swa or ctx.is_hybrid_ssm or ctx.is_dsa:
        logger.info("tiered cache: model or flags need SGLang's own cache; using the default chain")
        return default_radix_cache_factory(ctx)
    config = TierConfig.from_env()
    if ctx.enable_hierarchical_cache:
        from sglang.srt.mem_cache.hiradix_cache import HiRadixCache

        cache = HiRadixCache(ctx.params, ctx.server_args)
        # The forward pass waits on this counter for host->device loads (see sglang registry.py).
        ctx.tp_worker.register_hicache_layer_transfer_counter(cache.cache_controller.layer_done_counter)
    else:
        from sglang_ext.tiered_cache import TieredRadixCache

        cache = TieredRadixCache(ctx.params, policy=config.policy)
    logger.info("tiered cache: %s with policy %s", type(cache).__name__, config.policy)
    return cache
