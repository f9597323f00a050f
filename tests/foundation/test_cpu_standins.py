"""The CPU stand-ins: imports succeed, GPU kernels refuse to run, the two sgl_kernel ops compute correctly."""

import ctypes

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="stand-ins exist only where CUDA is absent")


def test_triton_kernel_is_defined_but_never_launches():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, BLOCK: tl.constexpr):
        pass

    assert getattr(triton, "IS_STANDIN", False)
    with pytest.raises(RuntimeError, match="CPU-only"):
        kernel[(1,)](None, BLOCK=4)


def test_assign_req_to_token_pool_matches_a_reference():
    from sgl_kernel import assign_req_to_token_pool_cpu

    req_to_token = torch.zeros(3, 10, dtype=torch.int32)
    rows, start, end = torch.tensor([2, 0]), torch.tensor([1, 4]), torch.tensor([4, 6])
    out = torch.arange(100, 105)
    assign_req_to_token_pool_cpu(rows, req_to_token, start, end, out, 10)
    expected = torch.zeros(3, 10, dtype=torch.int32)
    expected[2, 1:4] = torch.tensor([100, 101, 102], dtype=torch.int32)
    expected[0, 4:6] = torch.tensor([103, 104], dtype=torch.int32)
    assert torch.equal(req_to_token, expected)


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer():
    from sgl_kernel import copy_all_layer_kv_cache_cpu

    buffers = [torch.arange(40, dtype=torch.float32).reshape(10, 4) + 100 * i for i in range(2)]
    expected = [b.clone() for b in buffers]
    for e in expected:
        e[[7, 8]] = e[[1, 2]]
    ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.element_size() for b in buffers], dtype=torch.int64)
    copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([7, 8]), torch.tensor([1, 2]))
    assert all(torch.equal(b, e) for b, e in zip(buffers, expected))
    assert ctypes.sizeof(ctypes.c_void_p) == 8


def test_host_transfer_copies_token_rows_between_layers():
    from sglang_ext.cpu_hicache import transfer_kv_direct

    src = [torch.randn(8, 2, 4) for _ in range(2)]
    dst = [torch.zeros(8, 2, 4) for _ in range(2)]
    transfer_kv_direct(src_layers=src, dst_layers=dst, src_indices=torch.tensor([0, 3]),
                       dst_indices=torch.tensor([5, 6]), page_size=1)
    for s, d in zip(src, dst):
        assert torch.equal(d[[5, 6]], s[[0, 3]]) and not d[[0, 1, 2, 3, 4, 7]].any()
