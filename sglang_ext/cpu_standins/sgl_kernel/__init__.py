"""CPU stand-in for `sgl_kernel` (installed only where CUDA is absent; see ../README.md).

With `SGLANG_USE_CPU_ENGINE=1` SGLang imports two ops from here unconditionally. Both are written in plain
torch with the same argument order as the real CPU kernels.
"""

import ctypes

import torch

IS_STANDIN = True


def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """Write each request's new KV slots into its row of `req_to_token`, packed in `out_cache_loc`."""
    lengths = (end_offset - start_offset).tolist()
    src = 0
    for row, start, n in zip(req_pool_indices.tolist(), start_offset.tolist(), lengths):
        req_to_token[row, start:start + n] = out_cache_loc[src:src + n].to(req_to_token.dtype)
        src += n


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """For every buffer (one data pointer and one row stride in bytes each), copy row src[i] to row tgt[i]."""
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for tgt, src in pairs:
            ctypes.memmove(ptr + tgt * stride, ptr + src * stride, stride)


def __getattr__(attr: str):
    # Any other op is a GPU op: fail at the point of use with a clear message.
    if attr.startswith("__"):
        raise AttributeError(attr)

    def _missing(*args, **kwargs):
        raise RuntimeError(f"sgl_kernel.{attr} is not available on a CPU-only machine (stand-in)")

    return _missing


del torch
