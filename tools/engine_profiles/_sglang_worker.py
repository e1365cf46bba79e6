"""One SGLang release's own code, run in a subprocess: ``python -m
tools.engine_profiles._sglang_worker ROOT MODE`` prints a JSON answer.

ROOT holds the release's extracted ``sglang/`` package. MODE ``parser`` builds the
release's own argument parser (``ServerArgs.add_cli_args``) and prints the choices of
its attention-backend flags; MODE ``handler`` loads the DeepSeek model's attention
dispatch (``handle_attention_<name>`` or, in older releases, the attention class's
``dispatch_attn_forward_method``) and prints, per backend name, compute capability and
MLA dims, the forward method the release picks for a fresh prefill batch. Everything
outside the release (torch, CUDA, kernels) is stubbed; the device capability is set
per call. A subprocess per release keeps one release's modules from meeting another's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mla_switchboard.core.engine_rules.sglang import SGLANG_NAMES

from tools.engine_profiles import _stubs
from tools.engine_profiles.cache import cache_root
from tools.engine_profiles.sglang import FLAGS

# Small pure libraries a release's parser introspects for real (newer releases build
# their fields from msgspec structs): installed by the tool into DEPS, outside the repo.
REAL = ("msgspec",)
DEPS = cache_root() / "pydeps"  # where the tool installs them ($SWITCHBOARD_ENGINE_CACHE)

NAMES = tuple(SGLANG_NAMES)  # the SGLang names the tool asks about, the core's map


def parser_choices(root: str) -> dict[str, Any]:
    _stubs.install(keep=["sglang", *REAL])
    sys.path.insert(0, root)
    sys.path.insert(1, str(DEPS))
    import sglang.srt.server_args as server_args  # type: ignore[import-not-found]

    parser = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(parser)
    out: dict[str, Any] = {}
    for action in parser._actions:
        for flag in action.option_strings:
            if flag in FLAGS:
                out[flag] = list(action.choices) if action.choices is not None else None
    return out


class _Attn:
    """The attention layer as the dispatch reads it: the dims, and server defaults."""

    def __init__(self, dims: list[int]) -> None:
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = dims
        self.flashinfer_mla_disable_ragged = False
        self.disable_chunked_prefix_cache = False
        self.chunked_prefix_cache_threshold = 8192
        self.kv_cache_dtype = "auto"
        self.current_attention_backend = None
        self.rocm_fused_decode_mla = False

    def __getattr__(self, item: str) -> Any:
        return False


class _Mode:
    """A fresh prefill (extend) batch, no speculation."""

    def __getattr__(self, item: str) -> Any:
        return lambda: item in ("is_extend", "is_extend_without_speculative")


def _batch() -> Any:
    return SimpleNamespace(
        forward_mode=_Mode(),
        extend_prefix_lens_cpu=[0],
        extend_seq_lens_cpu=[128],
        seq_lens_cpu=[128],
        get_max_chunk_capacity=lambda: 1 << 20,
    )


def _platform(major: int) -> Any:
    return SimpleNamespace(
        is_cuda=True,
        is_hip=False,
        is_npu=False,
        is_xpu=False,
        is_sm90=major == 9,
        is_hopper_with_cuda_12_3=major == 9,
        is_sm100=major == 10,
        is_sm100_or_sm110=major in (10, 11),
        is_sm110=major == 11,
        is_sm120=major == 12,
        is_blackwell=major in (10, 11, 12),
    )


def _load(path: str, name: str) -> Any:
    """One file of the release as a module, every import it makes stubbed; its stubbed
    platform checks answer CUDA (not ROCm, NPU, CPU or MPS) and no graph capture."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    for attr, value in list(vars(mod).items()):
        if isinstance(value, _stubs.Stub):
            if attr.startswith("_is_"):
                setattr(mod, attr, attr == "_is_cuda")
            elif attr.startswith("is_"):
                setattr(mod, attr, lambda *a, **k: False)
    return mod


def _set_device(mod: Any, major: int) -> None:
    platform = _platform(major)
    mod.get_platform = lambda: platform
    for fname, value in (
        ("is_sm100_supported", major == 10),
        ("is_sm100_or_sm110_supported", major in (10, 11)),
        ("is_blackwell_supported", major in (10, 11, 12)),
        ("is_blackwell", major in (10, 11, 12)),
        ("is_sm90_supported", major == 9),
        ("is_hopper_with_cuda_12_3", major == 9),
        ("is_sm120_supported", major == 12),
    ):
        setattr(mod, fname, lambda *a, value=value, **k: value)


class _Anything:
    """A config object whose unset fields are None (the server's defaults)."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def __getattr__(self, item: str) -> Any:
        return None


def default_backends(root: str, caps: list[list[int]]) -> dict[str, Any]:
    """SGLang's automatic attention backend for an MLA model (a DeepSeek-V3 config), per
    capability, from the release's own defaulting function where it has one (0.5.10
    on); None where it has none (the choice is inline in a GPU-only post-init)."""
    _stubs.install(keep=[], absent=())
    for rel in ("sglang/srt/arg_groups/model_override_base.py", "sglang/srt/server_args.py"):
        path = f"{root}/{rel}"
        if _exists(path) and "_default_attn_backend(" in Path(path).read_text():
            break
    else:
        return {"file": None, "mla": {}}
    mod = _load(path, "sglang_release_defaults")
    hf = _Anything(architectures=["DeepseekV3ForCausalLM"])
    model_config = _Anything(hf_config=hf, has_attention_sinks=False, has_asymmetric_kv=False)
    model_config.get_num_kv_heads = lambda *a: 128
    out: dict[str, Any] = {"file": rel, "mla": {}}
    for major, minor in caps:
        _set_device(mod, major)
        cfg = _Anything(tp_size=1, enable_hierarchical_cache=False)
        try:
            fn = getattr(mod, "get_default_attn_backend", None)
            if fn is not None:
                answer = fn(cfg, True, model_config)
            else:
                answer = mod.ServerArgs._get_default_attn_backend(cfg, True, model_config)
        except Exception as exc:
            answer = f"error: {type(exc).__name__}: {exc}"
        out["mla"][f"{major}.{minor}"] = answer if isinstance(answer, str) else None
    return out


def handler_methods(root: str, caps: list[list[int]], dims: list[list[int]]) -> dict[str, Any]:
    _stubs.install(keep=[], absent=())
    src = root + "/sglang/srt/models/deepseek_common/attention_backend_handler.py"
    if not _exists(src):
        src = root + "/sglang/srt/models/deepseek_v2.py"
    mod = _load(src, "sglang_release_dispatch")
    mod.use_intel_amx_backend = lambda *a, **k: False
    mod.is_cp_active = lambda *a, **k: False
    mod.get_exec = lambda: SimpleNamespace(
        deterministic=SimpleNamespace(enable_deterministic_inference=False)
    )
    mod.get_parallel = lambda: SimpleNamespace(dcp_enabled=False)
    mod.get_global_server_args = lambda: SimpleNamespace(enable_deterministic_inference=False)
    cls = getattr(mod, "DeepseekV2AttentionMLA", None)
    out: dict[str, Any] = {"file": src[len(root) + 1 :], "methods": {}}
    for major, minor in caps:
        _set_device(mod, major)
        for name in NAMES:
            for d in dims:
                key = f"{name}|{major}.{minor}|{d[0]},{d[1]},{d[2]}"
                out["methods"][key] = _dispatch(mod, cls, name, d)
    return out


def _dispatch(mod: Any, cls: Any, name: str, dims: list[int]) -> str | None:
    attn = _Attn(dims)
    batch = _batch()
    try:
        fn = getattr(mod, f"handle_attention_{name}", None)
        if fn is not None:
            result = fn(attn, batch)
        elif hasattr(mod, "AttentionBackendRegistry"):
            return None  # no handler of its own: the name is not an MLA prefill backend
        elif cls is not None and hasattr(cls, "dispatch_attn_forward_method"):
            mod.global_server_args_dict = {
                "prefill_attention_backend": name,
                "decode_attention_backend": name,
                "attention_backend": name,
                "enable_deterministic_inference": False,
            }
            result = cls.dispatch_attn_forward_method(attn, batch)
        else:
            return None
    except Exception as exc:  # the release's own refusal, kept as its text
        return f"error: {type(exc).__name__}: {exc}"
    if isinstance(result, _stubs.Stub):  # a member of a stubbed enum names itself
        return result.__name__.rsplit(".", 1)[-1]
    name_of = getattr(result, "name", None)  # a member of the release's own enum
    return name_of if isinstance(name_of, str) else str(result)


def _exists(path: str) -> bool:
    try:
        with open(path, "rb"):
            return True
    except OSError:
        return False


def main() -> None:
    root, mode = sys.argv[1], sys.argv[2]
    if mode == "parser":
        answer = parser_choices(root)
    elif mode == "default":
        answer = default_backends(root, json.loads(sys.argv[3])["caps"])
    else:
        grid = json.loads(sys.argv[3])
        answer = handler_methods(root, grid["caps"], grid["dims"])
    sys.stdout.write("\n@@JSON@@" + json.dumps(answer))


if __name__ == "__main__":
    main()
