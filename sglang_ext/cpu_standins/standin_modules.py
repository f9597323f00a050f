"""Placeholder modules shared by the `triton` and `torchvision` stand-ins (CPU-only machines, see README.md).

`install(prefix)` makes every `prefix.*` submodule importable. Attributes resolve to placeholders: a class
for CamelCase names (usable as a base class or annotation; `*Error` names are exceptions), otherwise a
placeholder module that also works as a decorator (`@x`, `@x(...)`); a decorated kernel raises if launched. Nothing here
computes: the CPU path of SGLang never runs these, and a call that reaches one fails loudly.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _AnyAttributes(type):
    """Class-level attributes (enum members such as `InterpolationMode.BILINEAR`) are distinct markers."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        marker = type(attr, (), {"__module__": cls.__module__})
        setattr(cls, attr, marker)
        return marker


class Anything(metaclass=_AnyAttributes):
    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs


class StandinError(Exception, metaclass=type):
    pass


class Unavailable:
    """A decorated GPU kernel: refuses to run on CPU."""

    def __init__(self, name: str, fn):
        self.__name__, self.fn = name, fn

    def __getitem__(self, grid):
        raise RuntimeError(f"{self.__name__} launched on a CPU-only machine (stand-in)")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.__name__} called on a CPU-only machine (stand-in)")


class PlaceholderModule(types.ModuleType):
    """Stands for a submodule, a function or a decorator: `@x`, `@x(...)`, `x.y.z`, `import x.y` all work."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []
        self.__file__ = __file__

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = placeholder(self.__name__, attr)
        setattr(self, attr, value)
        return value

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return Unavailable(getattr(args[0], "__name__", self.__name__), args[0])
        return lambda fn: Unavailable(getattr(fn, "__name__", self.__name__), fn)

    def __getitem__(self, item):
        raise RuntimeError(f"{self.__name__} used on a CPU-only machine (stand-in)")


def placeholder(module_name: str, attr: str):
    if attr[:1].isupper():
        base = StandinError if attr.endswith(("Error", "Exception")) or attr.startswith("OutOf") else Anything
        return type(attr, (base,), {"__module__": module_name})
    return sys.modules.setdefault(f"{module_name}.{attr}", PlaceholderModule(f"{module_name}.{attr}"))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, prefix: str):
        self.prefix = prefix + "."

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(self.prefix):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return PlaceholderModule(spec.name)

    def exec_module(self, module):
        parent, _, child = module.__name__.rpartition(".")
        setattr(sys.modules[parent], child, module)


def install(prefix: str) -> None:
    """Serve `prefix.*` submodules that do not exist on disk (appended last: real modules win)."""
    sys.meta_path.append(_Finder(prefix))


def module_getattr(module_name: str):
    """A PEP 562 `__getattr__` for a package's own namespace."""

    def __getattr__(attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return placeholder(module_name, attr)

    return __getattr__
