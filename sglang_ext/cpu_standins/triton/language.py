"""`triton.language` stand-in: `tl.constexpr` works as an annotation; everything else is a placeholder."""

import standin_modules

__getattr__ = standin_modules.module_getattr("triton.language")


class constexpr:
    def __init__(self, value=None):
        self.value = value


class dtype:
    """torch._dynamo registers `triton.language.dtype` as a constant type."""
