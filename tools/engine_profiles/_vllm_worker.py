"""Runs one vLLM release's own MLA prefill selection code on a simulated CUDA platform.

Started by ``tools.engine_profiles.vllm`` in a fresh interpreter per (release, package
set): the release's modules, its ``functools.cache``d helpers and the simulated
packages must not leak from one run into the next. It prints one JSON object on stdout.

What is real and what is simulated:

- real: the release's own Python code, imported from the extracted wheel: its
  ``AttentionConfig`` (the ``mla_prefill_backend`` field and its validator, which is
  what ``--attention-config.mla_prefill_backend=NAME`` is parsed by), its
  ``get_mla_prefill_backend`` selector (an explicit choice raises ``ValueError`` with
  the backend's ``validate_configuration`` reasons; no choice runs the release's own
  automatic order) and its platform classes.
- real, in mode ``parser``: the release's command-line parser,
  ``EngineArgs.add_cli_args(FlexibleArgumentParser())``, given ``FLAG=NAME`` for each
  backend name; what it parses the value into, or its error, is the answer. That parser
  imports most of vLLM's config modules; everything it needs besides pydantic, torch
  and ``regex`` (installed for the worker beside the cache: a stand-in ``regex`` would
  misparse the dotted flag) is a stand-in, which is enough to build the parser.
- simulated: the device (``current_platform`` is the release's own CUDA platform class
  with ``get_device_capability`` answering the grid's capability), the compiled
  extensions (``vllm._C`` and friends are not extracted, so an import of one gets a
  stub module), third-party packages the selection does not consult (stubs), and the
  kernel packages whose presence the backends test (``flashinfer``,
  ``tokenspeed_mla``): present as a stub or absent (``ImportError``) per package set.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import types
import warnings
from types import SimpleNamespace
from typing import Any

# Kernel packages a backend's availability check imports; each package set of the grid
# says which of them exist.
SIMULATED_PACKAGES = ("flashinfer", "tokenspeed_mla", "flash_attn")
# Stubbed even when a real one is installed here: a real import would try to load
# CUDA libraries or compile kernels on this CPU machine.
# Left to fail as they do here: torch tests for them and a stub would mislead it.
NEVER_STUB: tuple[str, ...] = ("triton",)
ALWAYS_STUB = ("pynvml", "cupy", "deep_gemm", "aiter", "cutlass", "nvidia")


class _StubMeta(type):
    """A stand-in for anything a stubbed module exports: attribute access, calls,
    subclassing and type unions all work, and every use gives another stand-in."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__name__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if "_stub" not in vars(cls):  # a real class that derives from a stand-in
            return super().__call__(*args, **kwargs)
        if len(args) == 1 and not kwargs and (callable(args[0]) or isinstance(args[0], type)):
            return args[0]  # used as a decorator
        return _stub_class(f"{cls.__name__}()")

    def __or__(cls, other: Any) -> Any:
        return Any

    def __ror__(cls, other: Any) -> Any:
        return Any

    def __iter__(cls) -> Any:
        return iter(())

    def __bool__(cls) -> bool:
        return False

    def __getitem__(cls, item: Any) -> Any:
        return cls


class _StubBase:
    """The base of every stand-in: a class deriving from one (a stubbed
    ``msgspec.Struct``) may pass class keywords."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema  # a stand-in in a pydantic model: any value

        return core_schema.any_schema()


def _stub_class(name: str) -> type:
    return _StubMeta(name, (_StubBase,), {"_stub": True})


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _stub_class(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []  # a package, so that submodules import too
        module.__file__ = f"<stub {spec.name}>"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _stub_spec(fullname: str) -> importlib.machinery.ModuleSpec:
    return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def _imported_by_vllm() -> bool:
    """Whether the import being resolved was written in the release's code (the first
    frame outside the import machinery belongs to a ``vllm`` module)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not (
            frame.f_code.co_filename.startswith("<frozen")
            or name.startswith("importlib")
            or name == __name__
        ):
            return name == "vllm" or name.startswith("vllm.")
        frame = frame.f_back
    return False


class _StubFinder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: whatever nothing else could import becomes a stub,
    except the kernel packages the current package set says are absent."""

    def __init__(self, absent: set[str], extensions: list[str] | None = None) -> None:
        self.absent = absent
        self.extensions = extensions

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        top = fullname.split(".")[0]
        if top in self.absent or top in sys.stdlib_module_names or top in NEVER_STUB:
            return None
        if top == "vllm" and self.extensions is not None:
            # vLLM's own modules: only the compiled ones its wheel ships are stubbed;
            # any other missing one fails to import, as it would in that release
            shipped = any(e == fullname or e.startswith(fullname + ".") for e in self.extensions)
            return _stub_spec(fullname) if shipped else None
        if not _imported_by_vllm():
            return None  # another library's optional import: let it fail as it would
        return _stub_spec(fullname)


class _ForcedStubFinder(_StubFinder):
    """First on ``sys.meta_path``: packages that must never be the real ones here."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        top = fullname.split(".")[0]
        if top in ALWAYS_STUB or (top in SIMULATED_PACKAGES and top not in self.absent):
            return super().find_spec(fullname, path, target)
        return None  # absent: no finder has it (main checks that none is installed)


def _patch_metadata(release: str, absent: set[str]) -> None:
    """Distribution versions for what is stubbed: vLLM's own (the release being read;
    the extracted tree has no metadata) and, for a stubbed package, a version newer
    than any the release checks for."""
    import importlib.metadata as metadata

    real = metadata.version

    def version(name: str) -> str:
        if name == "vllm":
            return release
        try:
            return real(name)
        except metadata.PackageNotFoundError:
            if name.replace("-", "_") in absent or not _imported_by_vllm():
                raise
            return "999.0.0"

    metadata.version = version


FAILURES: list[dict[str, str]] = []
"""Every module of the release that failed to import here, with the cause: the
simulation failed, whatever the release made of it (0.34.0's selector turns the
``ImportError`` of a backend module into the reason ``"ImportError"``; a module may
wrap it in a ``ValueError`` of its own). The tool refuses to write a table then."""


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _describe(exc: BaseException) -> str:
    """The exception and, innermost last, what caused it."""
    return " <- ".join(f"{type(e).__name__}: {str(e).strip()[:300]}" for e in _chain(exc))


class _RecordingLoader(importlib.abc.Loader):
    """Runs a release module as its own loader would, and records a failure before it
    propagates into code that might catch it."""

    def __init__(self, loader: Any, absent: set[str]) -> None:
        self.loader = loader
        self.absent = absent

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)  # get_code, get_resource_reader, ...

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        try:
            self.loader.exec_module(module)
        except BaseException as exc:
            self._record(module.__name__, exc)
            raise

    def _record(self, name: str, exc: BaseException) -> None:
        chain = _chain(exc)
        if any(getattr(e, "_switchboard_recorded", False) for e in chain):
            return  # an inner module of the release already said why
        root = chain[-1]
        missing = getattr(root, "name", None) or ""
        if isinstance(root, ImportError) and missing.split(".")[0] in self.absent:
            return  # a kernel package this package set leaves out: the release's case
        for e in chain:
            e._switchboard_recorded = True  # type: ignore[attr-defined]
        failure = {"module": name, "cause": _describe(exc)}
        if failure not in FAILURES:  # a second import of the module fails alike
            FAILURES.append(failure)


class _RecordingFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: finds the release's own modules with the finders
    after it and wraps their loaders in a :class:`_RecordingLoader`."""

    def __init__(self, absent: set[str]) -> None:
        self.absent = absent

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] != "vllm":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if isinstance(spec.loader, importlib.machinery.SourceFileLoader):
                spec.loader = _RecordingLoader(spec.loader, self.absent)
            return spec
        return None


_CAPABILITY: tuple[int, int] | None = (9, 0)


def _install_platform() -> Any:
    """``current_platform`` as the release's own CUDA platform class, answering the
    grid's capability. A placeholder is installed before anything imports the platform
    (modules bind ``current_platform`` at import); its class becomes the release's
    CUDA class once that imports."""
    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    class _Placeholder(Platform):
        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"

    placeholder = _Placeholder()
    platforms._current_platform = placeholder
    from vllm.platforms import cuda  # a failure here is the simulation's: it propagates

    base = getattr(cuda, "CudaPlatformBase", None) or cuda.CudaPlatform

    def get_device_capability(cls: Any, device_id: int = 0) -> Any:
        return None if _CAPABILITY is None else DeviceCapability(*_CAPABILITY)

    def has_device_capability(cls: Any, capability: Any, device_id: int = 0) -> bool:
        current = get_device_capability(cls)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return tuple(current) >= capability
        return current.to_int() >= capability

    def is_device_capability(cls: Any, capability: Any, device_id: int = 0) -> bool:
        current = get_device_capability(cls)
        if current is None:
            return False
        if isinstance(capability, tuple):
            return tuple(current) == capability
        return current.to_int() == capability

    def is_device_capability_family(cls: Any, capability: int, device_id: int = 0) -> bool:
        current = get_device_capability(cls)
        return current is not None and current.to_int() // 10 == capability // 10

    simulated = type(
        "SimulatedCudaPlatform",
        (base,),
        {
            "get_device_capability": classmethod(get_device_capability),
            "has_device_capability": classmethod(has_device_capability),
            "is_device_capability": classmethod(is_device_capability),
            "is_device_capability_family": classmethod(is_device_capability_family),
            "get_device_name": classmethod(lambda cls, device_id=0: "simulated"),
        },
    )
    placeholder.__class__ = simulated
    return placeholder


def _names(module_name: str) -> list[str]:
    registry = importlib.import_module(module_name)
    return list(registry.MLAPrefillBackendEnum.__members__)


def _parse(attention_config_cls: Any, name: str) -> tuple[Any, str | None]:
    """The release's own config parsing of ``mla_prefill_backend=NAME``: the value the
    flag becomes, or the release's error text."""
    try:
        config = attention_config_cls(mla_prefill_backend=name)
    except Exception as exc:
        return None, _text(exc)
    return config, None


def _text(exc: BaseException) -> str:
    text = str(exc).strip()
    # pydantic's errors end with a documentation URL line; it is not the release's text
    lines = [ln for ln in text.splitlines() if "errors.pydantic.dev" not in ln]
    return f"{type(exc).__name__}: " + " ".join(ln.strip() for ln in lines if ln.strip())


def _parse_flag(flag: str, names: list[str]) -> dict[str, Any]:
    """The release's own argument parser given ``flag=NAME`` per name: the value it
    parses into (``AttentionConfig.mla_prefill_backend``), or the parser's error."""
    import contextlib
    import io

    arg_utils = importlib.import_module("vllm.engine.arg_utils")
    argparse_utils = importlib.import_module("vllm.utils.argparse_utils")
    parser = arg_utils.EngineArgs.add_cli_args(argparse_utils.FlexibleArgumentParser())
    parsed: dict[str, Any] = {}
    for name in names:
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                namespace = parser.parse_args([f"{flag}={name}"])
        except SystemExit:
            # argparse prints usage, then "PROG: error: MESSAGE" (pydantic's over lines)
            text = errors.getvalue().split(": error: ", 1)[-1]
            lines = [ln.strip() for ln in text.splitlines() if "errors.pydantic.dev" not in ln]
            parsed[name] = {"accepted": False, "error": " ".join(ln for ln in lines if ln)}
            continue
        value = namespace.attention_config.mla_prefill_backend
        parsed[name] = {"accepted": True, "value": str(getattr(value, "name", value))}
    return {"parser": "EngineArgs.add_cli_args(FlexibleArgumentParser())", "parsed": parsed}


def main() -> None:
    global _CAPABILITY
    request = json.loads(sys.stdin.read())
    sys.path.insert(0, request["source"])
    if request.get("mode") == "parser":
        sys.path.insert(1, request["deps"])
    absent = set(SIMULATED_PACKAGES) - set(request["present"])
    warnings.simplefilter("ignore")
    import logging

    logging.disable(logging.CRITICAL)
    import torch

    installed = [n for n in SIMULATED_PACKAGES if importlib.util.find_spec(n) is not None]
    if installed:
        raise SystemExit(f"run this without {installed} installed: their presence is simulated")
    sys.meta_path.insert(0, _ForcedStubFinder(absent))
    sys.meta_path.append(_StubFinder(absent, request.get("extensions")))
    sys.meta_path.insert(0, _RecordingFinder(absent))
    _patch_metadata(request.get("release", "0.0.0"), absent)

    platform = _install_platform()
    if request.get("mode") == "parser":
        json.dump(
            {**_parse_flag(request["flag"], request["names"]), "failures": FAILURES}, sys.stdout
        )
        return
    selector = importlib.import_module("vllm.v1.attention.backends.mla.prefill.selector")
    from vllm.config.attention import AttentionConfig

    registry = "vllm.v1.attention.backends.mla.prefill.registry"
    members = _names(registry)
    parsed: dict[str, Any] = {}
    rejected: dict[str, str] = {}
    for name in request["names"]:
        config, error = _parse(AttentionConfig, name)
        if error is None:
            parsed[name] = config
        else:
            rejected[name] = error

    dtypes = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    rows = []
    for cap in request["capabilities"]:
        _CAPABILITY = None if cap is None else (int(cap[0]), int(cap[1]))
        for dims in request["dims"]:
            for dtype in request["dtypes"]:
                hf = SimpleNamespace(
                    qk_nope_head_dim=dims[0], qk_rope_head_dim=dims[1], v_head_dim=dims[2]
                )
                model = SimpleNamespace(dtype=dtypes[dtype], hf_text_config=hf, hf_config=hf)
                explicit: dict[str, str | None] = {}
                for name in request["names"]:
                    if name in rejected:
                        explicit[name] = rejected[name]
                        continue
                    vllm_config = SimpleNamespace(model_config=model, attention_config=parsed[name])
                    explicit[name] = _select(selector, vllm_config, expect=name)
                vllm_config = SimpleNamespace(
                    model_config=model, attention_config=AttentionConfig()
                )
                auto = _auto(selector, vllm_config)
                rows.append(
                    {"capability": cap, "dims": dims, "dtype": dtype, "explicit": explicit, **auto}
                )
    json.dump(
        {
            "members": members,
            "rejected_names": rejected,
            "platform": type(platform).__mro__[1].__qualname__,
            "rows": rows,
            "failures": FAILURES,
        },
        sys.stdout,
    )


def _clear_caches(selector: Any) -> None:
    for value in vars(selector).values():
        clear = getattr(value, "cache_clear", None)
        if callable(clear):
            clear()


def _select(selector: Any, vllm_config: Any, expect: str) -> str | None:
    """None when the release runs ``expect`` for this situation, else its reason."""
    _clear_caches(selector)
    try:
        cls = selector.get_mla_prefill_backend(vllm_config)
    except Exception as exc:
        return _text(exc)
    name = cls.get_name()
    if name != expect:
        return f"the release ran {name} instead"
    return None


def _auto(selector: Any, vllm_config: Any) -> dict[str, Any]:
    _clear_caches(selector)
    try:
        cls = selector.get_mla_prefill_backend(vllm_config)
    except Exception as exc:
        return {"auto": None, "auto_error": _text(exc)}
    return {"auto": cls.get_name()}


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # the release's code failed here: say where, for the tool
        json.dump({"failures": FAILURES, "crashed": _describe(exc)}, sys.stdout)
        raise SystemExit(3) from None
