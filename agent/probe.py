"""Describe the pod: its GPU and which kernel packages really import.

The service can only be as right as the pod's description, so the probe asks the
same libraries the kernels will use. The device comes from torch when torch imports
(what the kernels will see, ``CUDA_VISIBLE_DEVICES`` included), else from NVML,
else the pod has no GPU (capability None, which the service answers with
TORCH_SDPA). A package counts as present only if it imports: a flash_attn wheel
built against another torch is installed yet unusable, and reporting it would get
the pod a backend it cannot build.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import os
import warnings
from dataclasses import dataclass
from types import ModuleType

from mla_switchboard.core.specs import KERNEL_PACKAGES

__all__ = ["DeviceProbe", "import_quietly", "probe_device", "probe_packages"]

NUMPY_WARNING = "Failed to initialize NumPy"
"""torch warns with this at import when numpy is missing. The agent never converts a
tensor to numpy, and GPU pods often run without numpy, so on every real probe the
warning would be noise on stderr. It is silenced only around torch's import,
where it is raised, and only that message."""


@dataclass(frozen=True)
class DeviceProbe:
    """The first visible GPU, or name and capability None when there is none."""

    name: str | None
    capability: tuple[int, int] | None
    via: str  # "torch", "nvml", "none" or "given"


def import_quietly(name: str) -> ModuleType:
    """``importlib.import_module(name)`` without torch's missing-NumPy warning.

    Every place the agent may import torch first (the probe, the kernels, the bench)
    goes through here; later imports are cached and warn no more.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=NUMPY_WARNING, category=UserWarning)
        return importlib.import_module(name)


def _probe_torch() -> DeviceProbe | None:
    try:
        torch = import_quietly("torch")
    except Exception:  # a broken torch install is "no torch" here
        return None
    try:
        if not torch.cuda.is_available():
            return DeviceProbe(None, None, "torch")
        major, minor = torch.cuda.get_device_capability(0)
        return DeviceProbe(torch.cuda.get_device_name(0), (int(major), int(minor)), "torch")
    except Exception:  # CUDA init errors mean no usable GPU
        return DeviceProbe(None, None, "torch")


def _nvml_handle(pynvml: object) -> object | None:
    """The NVML handle of the first device CUDA would show, honouring CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return pynvml.nvmlDeviceGetHandleByIndex(0)  # type: ignore[attr-defined]
    first = visible.split(",")[0].strip()
    if not first or first.startswith("-"):
        return None
    if first.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(first))  # type: ignore[attr-defined]
    return pynvml.nvmlDeviceGetHandleByUUID(first)  # type: ignore[attr-defined]


def _probe_nvml() -> DeviceProbe | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: NVMLError_LibraryNotFound and friends
        return None
    try:
        handle = _nvml_handle(pynvml)
        if handle is None:
            return DeviceProbe(None, None, "nvml")
        name = pynvml.nvmlDeviceGetName(handle)
        if isinstance(name, bytes):
            name = name.decode()
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return DeviceProbe(str(name), (int(major), int(minor)), "nvml")
    except Exception:
        return DeviceProbe(None, None, "nvml")
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def probe_device() -> DeviceProbe:
    """torch, else NVML, else no GPU."""
    return _probe_torch() or _probe_nvml() or DeviceProbe(None, None, "none")


def _version(distributions: tuple[str, ...], module: object | None) -> str:
    """The first of ``distributions`` that is installed gives the version; else the
    module's own ``__version__`` (a source build may carry no metadata)."""
    for dist in distributions:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return str(getattr(module, "__version__", "unknown"))


def probe_packages() -> tuple[dict[str, str], list[str]]:
    """Kernel packages that import (import name -> version), and notes about broken ones.

    The packages are the backend registry's (``core/specs.py``): every package some
    backend needs or uses, so a backend whose package is installed is never reported
    missing for want of a probe."""
    found: dict[str, str] = {}
    notes: list[str] = []
    for name, package in KERNEL_PACKAGES.items():
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        try:
            module = import_quietly(name)
        except Exception as exc:  # any failure means unusable
            notes.append(f"package {name} is installed but does not import: {exc}")
            continue
        found[name] = _version(package.distributions, module)
    return found, notes
