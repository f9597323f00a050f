"""CPU stand-in for `torchvision` (installed only where CUDA is absent; see ../README.md).

PyPI's torchvision cannot load beside the CPU torch wheel. SGLang and transformers only need its names at
import time; image processing through it raises.
"""

import standin_modules

__version__ = "0.28.0"
IS_STANDIN = True
standin_modules.install("torchvision")
__getattr__ = standin_modules.module_getattr("torchvision")
