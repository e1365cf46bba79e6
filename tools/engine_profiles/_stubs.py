"""Run pieces of an SGLang release on a machine without a GPU, torch or SGLang's deps.

Imported only inside a worker subprocess (one per release), never by the project: it
installs an import hook that answers every import it is told to stub with a permissive
stand-in module, so that a release's argument parser and its attention dispatch
functions can be executed as written. Stand-ins are falsy, callable, subscriptable and
name themselves (``AttnForwardMethod.MHA_CHUNKED_KV`` returns an object whose
``__name__`` ends in ``MHA_CHUNKED_KV``), which is all those pieces need.
"""

from __future__ import annotations

import abc
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterable
from typing import Any

_PROBED = {
    "__spec__", "__loader__", "__file__", "__path__", "__wrapped__", "__signature__",
    "__origin__", "__args__", "__parameters__", "__annotations__", "__dict__", "__len__",
    "__fspath__", "__index__", "__float__", "__set_name__", "__get__", "__set__",
    "__delete__", "__isabstractmethod__", "__qualname__", "__module__", "__name__",
    "__self__", "__objclass__", "__text_signature__", "__code__",
    "__defaults__", "__kwdefaults__", "__all__", "__getstate__", "__reduce_ex__",
    "__reduce__", "__copy__", "__deepcopy__", "__class_getitem__", "__init_subclass__",
    "__subclasshook__", "__instancecheck__", "__subclasscheck__", "__length_hint__",
    "__await__", "__aiter__", "__enter__", "__exit__", "__aenter__", "__aexit__",
    "__buffer__", "__release_buffer__", "__supertype__", "__typing_subst__",
    "__typing_unpacked_tuple_args__", "__typing_is_unpacked_typevartuple__", "__cached__",
    "__builtins__", "__bases__", "__mro__", "__slots__", "__weakref__", "__doc__",
}  # fmt: skip

# Accelerator stacks other than CUDA: absent, so the release takes its CUDA paths.
ABSENT = {
    "torch_npu", "torch_musa", "intel_extension_for_pytorch", "habana_frameworks", "aiter",
    "vllm", "mindspore", "torch_xla", "tpu_inference", "jax", "sgl_kernel_npu", "torchada",
    "mlx",
}  # fmt: skip
ABSENT_ATTRS = {"torch.npu", "torch.xpu", "torch.musa", "torch.hpu", "torch.mlu"}


class _Meta(abc.ABCMeta):
    def __getattr__(cls, item: str) -> Any:  # e.g. a pydantic model's model_rebuild()
        if item.startswith("__"):
            raise AttributeError(item)
        return Stub(f"{cls.__name__}.{item}")


class _Base(metaclass=_Meta):
    """What a class deriving from a stand-in derives from instead."""

    def __init_subclass__(cls, **kw: Any) -> None:
        pass

    def __init__(self, *a: Any, **k: Any) -> None:
        names: list[str] = []
        for c in reversed(type(self).__mro__):
            names += [n for n in getattr(c, "__annotations__", {}) if n not in names]
        for n, v in zip(names, a, strict=False):
            object.__setattr__(self, n, v)
        for n, v in k.items():
            object.__setattr__(self, n, v)


class Stub(types.ModuleType):
    """A stand-in for a module or any attribute of one."""

    def __init__(self, name: str = "stub") -> None:
        super().__init__(name)
        self.__path__: list[str] = []

    def __getattr__(self, item: str) -> Any:
        if item == "__version__":
            return "2.13.0"
        if item == "name":  # e.g. a torch.library's name, used with hasattr()
            return "stub"
        if item == "hex":  # e.g. dill.dumps(...).hex(), stored as JSON
            return lambda: "00"
        if f"{self.__name__}.{item}" in ABSENT_ATTRS:
            raise AttributeError(item)
        if item.startswith("__") and item in _PROBED:
            raise AttributeError(item)
        value = Stub(f"{self.__name__}.{item}")
        setattr(self, item, value)
        return value

    def __call__(self, *a: Any, **k: Any) -> Any:
        if len(a) == 1 and callable(a[0]) and not k and not self.__name__.endswith("dumps"):
            return a[0]  # a stubbed decorator leaves what it decorates as it is
        return Stub(self.__name__ + "()")

    def __getitem__(self, k: Any) -> Any:
        return Stub(self.__name__ + "[]")

    def __setitem__(self, k: Any, v: Any) -> None:
        pass

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (_Base,)

    def __or__(self, o: Any) -> Any:
        return self

    __ror__ = __or__

    def _arith(self, *o: Any) -> Any:
        return self

    __neg__ = __pos__ = __abs__ = __invert__ = _arith
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _arith
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __pow__ = _arith
    __and__ = __rand__ = __xor__ = __lshift__ = __rshift__ = _arith

    def __int__(self) -> int:
        return 0

    def __eq__(self, o: object) -> bool:
        return False

    def __hash__(self) -> int:
        return id(self)

    def __lt__(self, o: Any) -> bool:
        return False

    __gt__ = __le__ = __ge__ = __lt__


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, keep: Iterable[str], absent: Iterable[str]) -> None:
        self.keep = tuple(keep)  # module names (prefixes) imported for real
        self.absent = frozenset(absent)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        root = name.split(".")[0]
        if root in self.absent:
            raise ImportError(name)
        if root in sys.stdlib_module_names and root != "sglang":
            return None
        if any(name == k or name.startswith(k + ".") for k in self.keep):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: Any) -> Any:
        return Stub(spec.name)

    def exec_module(self, module: Any) -> None:
        pass


def install(keep: Iterable[str], absent: Iterable[str] = ABSENT) -> None:
    """Stub every import except the standard library, the modules under ``keep`` (real)
    and those under ``absent`` (ImportError)."""
    sys.meta_path.insert(0, _Finder(keep, absent))
    torch = Stub("torch")  # a CUDA build on one visible device
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.get_device_capability = lambda *a: (9, 0)
    torch.cuda.get_device_name = lambda *a: "NVIDIA H100"
    torch.version.cuda = "12.9"
    torch.version.hip = None
    sys.modules["torch"] = torch
    triton = Stub("triton")
    triton.runtime.driver.active.get_current_target = lambda: types.SimpleNamespace(
        backend="cuda", arch=90, warp_size=32
    )
    sys.modules["triton"] = triton
