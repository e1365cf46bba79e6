"""The profile tool fails loudly: a table is written only from a release's own checks.

A release module that cannot import here (a stand-in that does not fit, a package the
simulation lacks) must stop the run with the release, the module and the cause, even
when the release's own code catches the failure and turns it into a verdict (vLLM
0.34.0's selector answers ``['ImportError']`` for a backend whose module did not
import). These tests run the real worker on a miniature release tree, so the import
recording is exercised as it is on a downloaded wheel.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.engine_profiles import vllm as tool
from tools.engine_profiles.cache import cache_root, cache_summary

# A miniature release: the modules the worker imports, and a FLASHINFER backend module
# that imports a helper. Its selector, like 0.34.0's, catches the ImportError of the
# backend module and calls it a reason, which must not become a table's verdict.
_PREFILL = "vllm/v1/attention/backends/mla/prefill"
_SELECTOR = """
class _Backend:
    @staticmethod
    def get_name():
        return "FLASHINFER"

def get_mla_prefill_backend(vllm_config):
    try:
        from vllm.backends import flashinfer  # noqa: F401
    except ImportError:
        raise ValueError(
            "Selected MLA prefill backend FLASHINFER is not valid for this "
            "configuration. Reason: ['ImportError']"
        )
    return _Backend
"""
_CONFIG = """
class AttentionConfig:
    def __init__(self, mla_prefill_backend=None):
        if mla_prefill_backend not in (None, "FLASHINFER"):
            raise ValueError(f"Unknown MLA prefill backend: {mla_prefill_backend!r}")
        self.mla_prefill_backend = mla_prefill_backend
"""
_INTERFACE = """
import enum
from typing import NamedTuple

class DeviceCapability(NamedTuple):
    major: int
    minor: int

    def to_int(self):
        return self.major * 10 + self.minor

class PlatformEnum(enum.Enum):
    CUDA = 1

class Platform:
    pass
"""


def _release(root: Path, helper: str) -> Path:
    tree = root / "9.9.9"
    files = {
        "vllm/platforms/__init__.py": "_current_platform = None\n",
        "vllm/platforms/interface.py": _INTERFACE,
        "vllm/platforms/cuda.py": "from vllm.platforms.interface import Platform\n"
        "class CudaPlatform(Platform):\n    pass\n",
        "vllm/config/attention.py": _CONFIG,
        f"{_PREFILL}/registry.py": "import enum\n"
        "class MLAPrefillBackendEnum(enum.Enum):\n    FLASHINFER = 1\n",
        f"{_PREFILL}/selector.py": _SELECTOR,
        "vllm/backends/flashinfer.py": "from vllm.utils import helper  # noqa: F401\n",
        "vllm/utils/helper.py": helper,
    }
    for rel, text in files.items():
        path = tree / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        for folder in path.relative_to(tree).parents:
            if str(folder) != ".":
                (tree / folder / "__init__.py").touch()
    return tree


def _run(tree: Path, present: list[str], monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    grid = {"capabilities": [[10, 0]], "dims": [[128, 64, 128]], "dtypes": ["bfloat16"]}
    monkeypatch.setattr(tool, "GRID", grid)
    return tool._run_worker(tree, present, [])


def test_a_module_that_fails_inside_the_release_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # triton is left out on purpose (torch.compile would trip over a stand-in); a
    # release module that needs its submodules must stop the run, not become a reason
    tree = _release(tmp_path, "import triton.language  # noqa: F401\n")
    with pytest.raises(tool.SimulationFailed) as failed:
        _run(tree, ["flashinfer"], monkeypatch)
    text = str(failed.value)
    assert text.startswith("vLLM 9.9.9: the simulation failed (selection")
    assert "module vllm.utils.helper failed to import: ModuleNotFoundError" in text
    assert "'triton'" in text


def test_a_wrapped_failure_is_still_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    helper = (
        "try:\n    import triton  # noqa: F401\n"
        "except ImportError as exc:\n"
        "    raise ValueError('helper needs triton') from exc\n"
    )
    tree = _release(tmp_path, helper)
    with pytest.raises(tool.SimulationFailed) as failed:
        _run(tree, ["flashinfer"], monkeypatch)
    text = str(failed.value)
    assert "module vllm.utils.helper failed to import: ValueError: helper needs triton" in text
    assert "<- ModuleNotFoundError: No module named 'triton'" in text


def test_a_kernel_package_the_package_set_leaves_out_is_the_releases_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = _release(tmp_path, "import flashinfer  # noqa: F401\n")
    result = _run(tree, [], monkeypatch)
    assert result["failures"] == []
    assert result["rows"][0]["explicit"]["FLASHINFER"].endswith("Reason: ['ImportError']")


def test_the_tool_exits_non_zero_naming_release_module_and_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    failure = tool.SimulationFailed(
        "0.34.0",
        "selection, packages ['flashinfer']",
        [{"module": "vllm.utils.deep_gemm", "cause": "ModuleNotFoundError: triton.language"}],
    )

    def table_for(version: str, **_: Any) -> dict[str, Any]:
        raise failure

    monkeypatch.setattr(tool, "table_for", table_for)
    monkeypatch.setenv("SWITCHBOARD_ENGINE_CACHE", str(tmp_path / "cache"))
    assert tool.main(["--versions", "0.34.0", "--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "vLLM 0.34.0: FAILED: vLLM 0.34.0: the simulation failed" in out
    assert "module vllm.utils.deep_gemm failed to import: ModuleNotFoundError" in out
    assert not list(tmp_path.glob("*.json"))
    assert f"engine cache {tmp_path / 'cache'}: empty" in out


def test_the_cache_follows_the_environment_and_states_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_ENGINE_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "x.whl").write_bytes(b"0" * 2**20)
    assert cache_summary().startswith(f"engine cache {tmp_path}: 0.00 GiB")


def _table(release: str, trtllm: list[str], auto: str) -> dict[str, Any]:
    return {
        "release": release,
        "names": {"accepted": ["TRTLLM_RAGGED"], "rejected": {}},
        "flag": {"spelling": "--x=NAME", "parsed": {"TRTLLM_RAGGED": {"accepted": True}}},
        "situations": [
            {
                "capability": "10.0",
                "dims": [128, 64, 128],
                "dtype": "bfloat16",
                "packages": "all",
                "backends": {"TRTLLM_RAGGED": trtllm},
                "auto": auto,
            }
        ],
    }


def test_a_new_table_is_compared_with_the_previous_release(tmp_path: Path) -> None:
    old = _table("0.33.0", [], "FLASH_ATTN")
    (tmp_path / "0.33.0.json").write_text(tool.dump(old))
    (tmp_path / "0.21.0.json").write_text(tool.dump(_table("0.21.0", ["x"], "X")))
    assert tool.previous("0.34.0", tmp_path) == tmp_path / "0.33.0.json"
    same = tool.compare_with_previous(_table("0.34.0", [], "FLASH_ATTN"), tmp_path)
    assert (
        same == "vLLM 0.34.0 against 0.33.0: the same verdicts, automatic choices, names and flag"
    )
    wrong = tool.compare_with_previous(_table("0.34.0", ["ImportError"], "FLASH_ATTN"), tmp_path)
    assert "1 differences" in wrong
    assert (
        "10.0 (128, 64, 128) bfloat16 all: TRTLLM_RAGGED accepted -> refused ['ImportError']"
        in (wrong)
    )
    json.loads((tmp_path / "0.33.0.json").read_text())  # the comparison wrote nothing


# SGLang 0.5.23's vendored FlashAttention 4 check, as its wheel ships it (abridged
# messages): the FA4 reading runs this function itself.
_FA4_CHECK = """
def _validate_head_dims(
    head_dim: int, head_dim_v: int, compute_capability: int, alignment: int
) -> None:
    is_deepseek_shape = head_dim == 192 and head_dim_v == 128
    is_deepseek_mla_absorbed_shape = (
        head_dim == 64 or head_dim == head_dim_v
    ) and head_dim_v == 512
    is_dedicate_kernel_shape = head_dim == 256 and head_dim_v == 256
    is_standard_range = 8 <= head_dim <= 128 and 8 <= head_dim_v <= 128
    is_sm90_range = (8 <= head_dim <= 256 and 8 <= head_dim_v <= 256) or (
        head_dim == head_dim_v == 512
    )
    if compute_capability == 9:
        assert is_sm90_range and head_dim % alignment == 0 and head_dim_v % alignment == 0
    elif compute_capability in [10, 11]:
        assert (
            (
                is_standard_range
                or is_deepseek_shape
                or is_deepseek_mla_absorbed_shape
                or is_dedicate_kernel_shape
            )
            and head_dim % alignment == 0
            and head_dim_v % alignment == 0
        ), "not supported on SM100/SM110"
"""


def test_sglang_fa4_head_dims_are_run_from_the_vendored_check(tmp_path: Path) -> None:
    from mla_switchboard.core.engine_rules.sglang import FA4_SM100

    from tools.engine_profiles.sglang_fa4 import fa4_head_dims, fa4_reason

    folder = tmp_path / "sglang" / "kernels" / "flash_attn" / "cute"
    folder.mkdir(parents=True)
    (folder / "interface.py").write_text("import torch\n" + _FA4_CHECK)
    fact = fa4_head_dims(tmp_path, [(192, 128), (192, 256), (256, 128), (256, 256)])
    assert fact["method"] == "run" and fact["where"].endswith("(_validate_head_dims)")
    sm100 = fact["value"]["10"]
    assert sm100["up_to"] == FA4_SM100.up_to
    assert {tuple(p) for p in sm100["also"]} == FA4_SM100.also
    assert sm100["grid"] == [[192, 128], [256, 256]]
    assert fact["value"]["9"]["up_to"] == 256
    # the issue's two: Kimi-like (128, 64, 256) and dots.llm3's (192, 64, 128)
    for qk_v in ((192, 256), (256, 128)):
        reason = fa4_reason(10, qk_v, fact)
        assert reason is not None and f"refuses (qk, v) head dims {qk_v} on SM10x" in reason
        assert not FA4_SM100.takes(qk_v)
    assert fa4_reason(10, (192, 128), fact) is None
    assert fa4_reason(8, (192, 256), fact) is None  # the check does not look at 8.x


def test_a_release_without_vendored_fa4_is_said_unread(tmp_path: Path) -> None:
    from tools.engine_profiles.sglang_fa4 import fa4_head_dims, fa4_reason

    fact = fa4_head_dims(tmp_path, [(192, 128)])
    assert fact["value"] is None and "not read" in fact["note"]
    assert fa4_reason(10, (192, 256), fact) is None
