"""MLA prefill kernels: torch-free specs plus lazily imported wrappers.

``mla_switchboard.core.specs`` (re-exported here) is safe to import anywhere: it is what the
service and the agent use to decide. The wrapper classes import torch and their
backend's package, so they load only when ``kernels.get(...)`` asks for one.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mla_switchboard.core.specs import (
    R1_DIMS,
    SPECS,
    Backend,
    BackendSpec,
    Capability,
    Dtype,
    MLADims,
    SelectionContext,
    parse_backend,
    parse_dtype,
)

if TYPE_CHECKING:  # pragma: no cover
    from mla_switchboard.kernels.base import MLAPrefillKernel

__all__ = [
    "R1_DIMS",
    "SPECS",
    "Backend",
    "BackendSpec",
    "Capability",
    "Dtype",
    "MLADims",
    "SelectionContext",
    "get",
    "parse_backend",
    "parse_dtype",
]


def get(backend: Backend | str) -> type[MLAPrefillKernel]:
    """The wrapper class for ``backend``, imported on first use.

    Raises ValueError for an unknown name and ImportError (with the backend named)
    when the wrapper's module cannot be imported, e.g. torch missing.
    """
    name = backend if isinstance(backend, Backend) else parse_backend(backend)
    module_name, _, class_name = SPECS[name].class_path.partition(":")
    try:
        module: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"backend {name} unavailable: {exc}") from exc
    return getattr(module, class_name)
