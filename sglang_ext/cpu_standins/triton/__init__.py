"""CPU stand-in for `triton` (installed only where CUDA is absent; see ../README.md).

SGLang imports triton at module level and decorates GPU kernels with `@triton.jit`; on the CPU path those
kernels never launch. Launching one raises instead of computing something wrong.
"""

import standin_modules

__version__ = "3.4.0"
IS_STANDIN = True
standin_modules.install("triton")
__getattr__ = standin_modules.module_getattr("triton")


def cdiv(a: int, b: int) -> int:
    return -(a // -b)


def next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 0 else 1


class Config:
    def __init__(self, kwargs=None, num_warps=4, num_stages=2, **extra):
        self.kwargs, self.num_warps, self.num_stages = kwargs or {}, num_warps, num_stages


import importlib  # noqa: E402

language = importlib.import_module("triton.language")  # not `from . import`: __getattr__ would answer it
