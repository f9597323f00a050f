"""HiCache on a machine without CUDA: the host pool's allocator and its host<->device copy.

SGLang's host pool (`pool_host/`) allocates through `ALLOC_MEMORY_FUNCS[device]`, which defaults to
`cudaHostRegister`-pinned memory, and copies pages with `sgl_kernel.kvcacheio.transfer_kv_direct`. Neither
exists on CPU. Both are filled through seams: `ALLOC_MEMORY_FUNCS` is a plain dict in SGLang, and
`HOST_KV_TRANSFER_FUNCS` is added by patches/0001. "Device" memory is ordinary RAM here, so pinning means
nothing and a copy is an index_copy between two CPU tensors.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def alloc_host_buffer(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
    """Host KV buffer on CPU: never pinned (there is no device to pin it for)."""
    if allocator is not None:
        return allocator.allocate(dims, dtype=dtype, device=device)
    return torch.empty(dims, dtype=dtype, device=device)


def transfer_kv_direct(*, src_layers, dst_layers, src_indices, dst_indices, page_size):
    """Copy token rows `src_indices` of each source layer buffer to rows `dst_indices` of its destination."""
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"{len(src_layers)} source layers but {len(dst_layers)} destination layers")
    if src_indices.numel() != dst_indices.numel():
        raise ValueError(f"{src_indices.numel()} source rows but {dst_indices.numel()} destination rows")
    src_idx = src_indices.to(device="cpu", dtype=torch.long)
    dst_idx = dst_indices.to(device="cpu", dtype=torch.long)
    for src, dst in zip(src_layers, dst_layers):
        dst.index_copy_(0, dst_idx, src.index_select(0, src_idx).to(dst.dtype))


def install() -> bool:
    """Fill both seams; False (and a log line) if the patch set is not applied, so HiCache cannot work."""
    from sglang.srt.mem_cache.pool_host import common

    common.ALLOC_MEMORY_FUNCS["cpu"] = alloc_host_buffer
    if not hasattr(common, "HOST_KV_TRANSFER_FUNCS"):
        logger.error("sglang lacks the HiCache transfer seam; run `python -m sglang_ext.patches apply`")
        return False
    common.HOST_KV_TRANSFER_FUNCS["transfer_kv_direct"] = transfer_kv_direct
    return True
