"""Read a model's MLA dims from its Hugging Face ``config.json``.

The decision depends on three head dims, the head count and the dtype, and all of
them are in the model's ``config.json``. Reading the file (rather than importing
``transformers``) keeps the agent light and lets it describe models whose config
class transformers does not know yet. Multimodal checkpoints keep the language
model's fields under ``text_config`` or ``language_config``; those win over the
top level, as in vLLM's ``hf_text_config``.

A model counts as MLA the way vLLM decides it: its text config sets
``kv_lora_rank``, and does not say ``use_mla: false`` (DeepSeek-VL2-Tiny and
DeepSeek-OCR ship ``kv_lora_rank: null`` with ``use_mla: false``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mla_switchboard.agent.errors import BadInputError
from mla_switchboard.core.specs import Dtype, parse_dtype

__all__ = ["ModelDims", "is_mla", "load_config", "read_model", "text_config"]

NESTED_TEXT_KEYS = ("text_config", "language_config")
DIM_KEYS = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


@dataclass(frozen=True)
class ModelDims:
    """What the decision and the kernel need to know about the model."""

    name: str | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    num_heads: int | None
    dtype: Dtype | None
    softmax_scale: float
    model_type: str | None = None
    num_layers: int | None = None  # num_hidden_layers: the calls one forward pass makes


def load_config(path: str | Path) -> tuple[dict[str, Any], Path]:
    """The parsed ``config.json`` at ``path`` (a file, or a model directory holding one)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInputError(f"cannot read model config {p}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadInputError(f"model config {p} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadInputError(f"model config {p} is not a JSON object")
    return data, p


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of ``config`` (the nested one of a multimodal model)."""
    for key in NESTED_TEXT_KEYS:
        nested = config.get(key)
        if isinstance(nested, Mapping):
            return nested
    return config


def is_mla(config: Mapping[str, Any]) -> bool:
    """vLLM's test: the text config sets ``kv_lora_rank`` and does not disable MLA."""
    text = text_config(config)
    return text.get("kv_lora_rank") is not None and text.get("use_mla", True) is not False


def _lookup(config: Mapping[str, Any], *keys: str) -> Any:
    """First of ``keys`` set in the text config, else at the top level."""
    for scope in (text_config(config), config):
        for key in keys:
            value = scope.get(key)
            if value is not None:
                return value
    return None


def _yarn_mscale(rope: Any) -> float:
    """DeepSeek's YaRN attention scale correction (vLLM's ``yarn_get_mscale`` squared).

    The MLA softmax scale is ``qk_head_dim ** -0.5`` times ``mscale ** 2`` when YaRN
    rope scaling is on; a kernel built with the plain scale would run, but wrongly.
    """
    if not isinstance(rope, Mapping):
        return 1.0
    kind = rope.get("rope_type") or rope.get("type")
    factor = rope.get("factor")
    if kind not in ("yarn", "deepseek_yarn") or not isinstance(factor, int | float) or factor <= 1:
        return 1.0
    mscale_all_dim = float(rope.get("mscale_all_dim") or 0.0)
    mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
    return mscale * mscale


def _positive_int(value: Any, field: str, source: str, *, zero_ok: bool = False) -> int:
    low = 0 if zero_ok else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a non-negative" if zero_ok else "a positive"
        raise BadInputError(f"{field} in {source} must be {kind} integer, got {value!r}")
    return value


def _default_name(path: Path | None, config: Mapping[str, Any]) -> str | None:
    name = config.get("_name_or_path")
    if isinstance(name, str) and name.strip():
        return name.strip()[:253]
    if path is not None and path.name == "config.json" and path.parent.name:
        return path.parent.name[:253]  # /models/DeepSeek-R1/config.json -> DeepSeek-R1
    return None


def _not_mla(cfg: Mapping[str, Any], source: str) -> str:
    """Why a config that is no MLA model is refused, naming what gave it away."""
    text = text_config(cfg)
    model_type = text.get("model_type") or cfg.get("model_type") or "unknown"
    why = (
        "it sets use_mla: false"
        if text.get("use_mla") is False
        else "its config has no kv_lora_rank"
    )
    return (
        f"{source} describes a {model_type} model that does not use MLA ({why}); "
        "Switchboard selects MLA prefill backends only"
    )


def _dims(
    cfg: Mapping[str, Any], explicit: Mapping[str, int | None], source: str
) -> dict[str, int]:
    """The three head dims: each from the arguments, else from the config, else refused."""
    dims: dict[str, int] = {}
    for key in DIM_KEYS:
        # A rope part of 0 is a real MLA layout (GLM-5-Next: (256, 0, 256)).
        zero_ok = key == "qk_rope_head_dim"
        if explicit[key] is not None:
            dims[key] = _positive_int(explicit[key], key, "the arguments", zero_ok=zero_ok)
            continue
        value = _lookup(cfg, key)
        if value is None:
            flag = "--" + key.replace("_", "-")
            raise BadInputError(f"{key} is not in {source}; give it with {flag}")
        dims[key] = _positive_int(value, key, source, zero_ok=zero_ok)
    return dims


def _dtype(cfg: Mapping[str, Any], dtype: str | Dtype | None, source: str) -> Dtype | None:
    """The argument's dtype, else the config's (``dtype`` or ``torch_dtype``), else None."""
    raw_dtype = dtype if dtype is not None else _lookup(cfg, "dtype", "torch_dtype")
    if isinstance(raw_dtype, Dtype):
        return raw_dtype
    if raw_dtype is None:
        return None
    try:
        return parse_dtype(str(raw_dtype))
    except ValueError as exc:
        where = "the arguments" if dtype is not None else source
        raise BadInputError(f"dtype in {where}: {exc}; give one with --dtype") from None


def read_model(
    path: str | Path | None = None,
    *,
    config: Mapping[str, Any] | None = None,
    qk_nope_head_dim: int | None = None,
    qk_rope_head_dim: int | None = None,
    v_head_dim: int | None = None,
    num_heads: int | None = None,
    dtype: str | Dtype | None = None,
    name: str | None = None,
) -> ModelDims:
    """The model's dims from ``path`` (or an already parsed ``config``), explicit
    arguments overriding the file.

    Raises BadInputError when the file is unreadable, the model is not MLA, or a dim
    is missing from both the file and the arguments.
    """
    file: Path | None = None
    if config is None and path is not None:
        config, file = load_config(path)
    source = str(file) if file is not None else ("the model config" if config else "the flags")
    cfg: Mapping[str, Any] = config or {}
    if config is not None and not is_mla(cfg):
        raise BadInputError(_not_mla(cfg, source))
    explicit = {
        "qk_nope_head_dim": qk_nope_head_dim,
        "qk_rope_head_dim": qk_rope_head_dim,
        "v_head_dim": v_head_dim,
    }
    dims = _dims(cfg, explicit, source)
    heads: int | None
    if num_heads is not None:
        heads = _positive_int(num_heads, "num_heads", "the arguments")
    else:
        found = _lookup(cfg, "num_attention_heads")
        heads = None if found is None else _positive_int(found, "num_attention_heads", source)
    resolved_dtype = _dtype(cfg, dtype, source)

    qk_head_dim = dims["qk_nope_head_dim"] + dims["qk_rope_head_dim"]
    rope = _lookup(cfg, "rope_scaling", "rope_parameters")
    text = text_config(cfg)
    layers = _lookup(cfg, "num_hidden_layers")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers <= 0:
        layers = None  # only the bench reads it, to call as many times as a forward pass
    return ModelDims(
        name=name if name is not None else _default_name(file, cfg),
        num_layers=layers,
        num_heads=heads,
        dtype=resolved_dtype,
        softmax_scale=qk_head_dim**-0.5 * _yarn_mscale(rope),
        model_type=text.get("model_type") or cfg.get("model_type"),
        **dims,
    )
