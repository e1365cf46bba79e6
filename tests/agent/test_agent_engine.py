"""The serving engine, agent side: detected from package metadata or given
with ``--engine``, sent in the request, and its flags printed exactly as the answer
gives them; a refusal prints no flags, explains every candidate and lets the pod boot.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.agent.api import SelectionResult
from mla_switchboard.agent.commands.formats import format_document
from mla_switchboard.agent.commands.select import select_main
from mla_switchboard.agent.engine import detect_engine, parse_engine
from mla_switchboard.core.schemas import Candidate, EngineInfo, SelectRequest
from mla_switchboard.core.specs import Backend

CONFIGS = Path(__file__).resolve().parent / "configs"
DSV3 = str(CONFIGS / "deepseek-v3.json")
H200 = ["--capability", "9.0", "--device-name", "NVIDIA H200", "--packages", "any"]
H200_PACKAGES = ["--packages", "any"]  # with the probe seeing an H200 (the gpu fixture)


def _fake_distribution(root: Path, name: str, version: str) -> None:
    """An installed distribution as importlib.metadata sees it: a dist-info folder."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on sys.path where a test 'installs' engines."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


@pytest.fixture
def svc_args(agent_service: Any, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("SWITCHBOARD_TOKEN", agent_service.token)
    return ["--cluster", "agent-engine", "--url", agent_service.url, "--cache-dir", str(cache_dir)]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = select_main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ detection


def test_detection_prefers_vllm_then_sglang(site: Path) -> None:
    assert detect_engine() is None  # neither installed here: switchboard's own kernels
    _fake_distribution(site, "sglang", "0.5.2")
    assert detect_engine() == EngineInfo(name="sglang", version="0.5.2")
    _fake_distribution(site, "vllm", "0.33.0+cu130")
    # vLLM first; the local part is dropped when needed, the release always kept
    detected = detect_engine()
    assert detected is not None and detected.name == "vllm"
    assert detected.version in ("0.33.0+cu130", "0.33.0")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("vllm==0.33.0", EngineInfo(name="vllm", version="0.33.0")),
        ("vLLM=0.20.1", EngineInfo(name="vllm", version="0.20.1")),
        ("sglang==0.5.2", EngineInfo(name="sglang", version="0.5.2")),
        ("switchboard", EngineInfo(name="switchboard")),
        ("vllm", EngineInfo(name="vllm")),  # not installed here: version unknown
    ],
)
def test_parse_engine(text: str, expected: EngineInfo) -> None:
    assert parse_engine(text) == expected


def test_a_bare_engine_name_takes_the_installed_version(site: Path) -> None:
    _fake_distribution(site, "vllm", "0.25.0")
    assert parse_engine("vllm") == EngineInfo(name="vllm", version="0.25.0")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("trtllm==1.0", "unknown engine"),
        ("vllm==", "no version"),
        ("vllm==0.34 0", "not a version"),
        ("switchboard==1.0", "takes no version"),
    ],
)
def test_bad_engine_exits_2_naming_the_flag(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(["--model", DSV3, "--cluster", "c", *H200, "--engine", value], capsys)
    assert (code, out) == (2, "")
    assert "argument --engine" in err and message in err


def test_the_request_names_the_detected_or_given_engine(
    site: Path,
    svc_args: list[str],
    agent_service: Any,
    capsys: pytest.CaptureFixture[str],
    gpu: Any,
) -> None:
    """What the service received, read back from it: the engine the pod will run (the
    probe sees an H200: a real pod, recorded)."""
    gpu("NVIDIA H200", (9, 0))
    code, out, err = _run(["--model", DSV3, *svc_args, *H200_PACKAGES], capsys)
    assert code == 0, err
    assert json.loads(out)["request"]["engine"] is None  # nothing installed: switchboard

    _fake_distribution(site, "vllm", "0.33.0")
    code, out, err = _run(["--model", DSV3, *svc_args, *H200_PACKAGES], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["request"]["engine"] == {"name": "vllm", "version": "0.33.0"}
    assert "serving engine: vllm 0.33.0 (installed here)" in err
    with agent_service.client() as client:
        seen = client.get(f"/v1/selections/{doc['decision_id']}").json()
    assert seen["request"]["engine"] == {"name": "vllm", "version": "0.33.0"}

    # --engine overrides what is installed
    argv = ["--model", DSV3, *svc_args, *H200_PACKAGES, "--engine", "switchboard"]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    assert json.loads(out)["request"]["engine"] == {"name": "switchboard", "version": None}


def test_args_format_and_engine_must_agree(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", DSV3, "--cluster", "c", *H200, "--no-cache"]
    code, out, err = _run([*argv, "--engine", "sglang==0.5.2", "--format", "vllm-args"], capsys)
    assert (code, out) == (2, "")
    assert "--format vllm-args" in err and "--engine is sglang" in err
    monkeypatch.setenv("SWITCHBOARD_ENGINE", "sglang")
    code, out, err = _run([*argv, "--format", "vllm-args"], capsys)
    assert (code, out) == (2, "") and "SWITCHBOARD_ENGINE is sglang" in err


def test_switchboard_engine_variable_is_read_and_checked(
    closed_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", DSV3, "--cluster", "c", *H200, "--no-cache", "--url", closed_url]
    argv += ["--deadline", "0.2"]
    monkeypatch.setenv("SWITCHBOARD_ENGINE", "vllm==0.33.0")
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    assert json.loads(out)["request"]["engine"] == {"name": "vllm", "version": "0.33.0"}
    monkeypatch.setenv("SWITCHBOARD_ENGINE", "tensorrt")
    code, out, err = _run(argv, capsys)
    assert (code, out) == (2, "") and "SWITCHBOARD_ENGINE: unknown engine" in err


# ------------------------------------------------------------------ the flags


def _result(engine: EngineInfo, args: list[str], env: dict[str, str]) -> SelectionResult:
    request = SelectRequest.model_validate(
        {
            "cluster": "c",
            "model": {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
            "dtype": "bf16",
        }
    )
    return SelectionResult(
        backend=Backend.FLASH_ATTN,
        source="priority",
        candidates=[Candidate(backend=Backend.FLASH_ATTN, valid=True, reasons=[], role="priority")],
        messages=[],
        decision_id="d1",
        rules_revision=3,
        request=request,
        decided_backend=Backend.FLASH_ATTN,
        engine=engine,
        engine_args=args,
        engine_env=env,
    )


def test_formats_print_the_answers_engine_args_verbatim() -> None:
    """The agent has no table of engine flags of its own: whatever the answer says
    (here, flags no table would produce) is what it prints."""
    sglang = _result(
        EngineInfo(name="sglang", version="0.5.2"),
        ["--prefill-attention-backend", "fa3", "--decode-attention-backend", "flashmla"],
        {"SGLANG_X": "1 2", "bad name": "x"},
    )
    expected = "--prefill-attention-backend fa3 --decode-attention-backend flashmla\n"
    assert format_document(sglang.to_dict(), "sglang-args") == expected
    env = dict(
        shlex.split(line)[1].split("=", 1)
        for line in format_document(sglang.to_dict(), "env").splitlines()
    )
    assert env["SWITCHBOARD_ENGINE"] == "sglang"
    assert env["SWITCHBOARD_ENGINE_ARGS"] == expected.strip()
    assert env["SWITCHBOARD_VLLM_ARGS"] == ""
    assert env["SGLANG_X"] == "1 2" and "bad name" not in env  # not a shell name: left out
    doc = json.loads(format_document(sglang.to_dict(), "json"))
    assert doc["engine_args"] == sglang.engine_args and doc["engine"]["name"] == "sglang"

    legacy = _result(EngineInfo(name="vllm", version="0.20.0"), [], {})
    assert format_document(legacy.to_dict(), "vllm-args") == ""


def test_vllm_before_0_21_gets_no_flag_and_the_reason(
    svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", DSV3, *svc_args, *H200, "--engine", "vllm==0.20.0"]
    code, out, err = _run([*argv, "--format", "vllm-args"], capsys)
    assert (code, out) == (0, "")
    assert "0.21" in err and "printing none" in err


def test_sglang_args_select_prefill_and_pin_decode(
    svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", DSV3, *svc_args, *H200, "--engine", "sglang==0.5.2"]
    code, out, err = _run([*argv, "--format", "sglang-args"], capsys)
    assert code == 0, err
    words = out.split()
    assert words[0] == "--prefill-attention-backend" and "--decode-attention-backend" in words


# ------------------------------------------------------------------ refusals


def test_no_valid_backend_prints_no_flags_explains_and_exits_0(
    svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 11 (4, 6) and 12 (3): nothing is valid (no GPU, and torch missing from the
    packages). The service answers 409; the agent prints every candidate's real reason
    on stderr, no engine flags on stdout, the refusal in its JSON, and exits 0 so an
    init container does not stop the pod, unless --fail-if-unavailable."""
    argv = ["--model", DSV3, *svc_args, "--capability", "none", "--packages", "cudnn=1.32.0"]
    code, out, err = _run([*argv, "--format", "vllm-args"], capsys)
    assert (code, out) == (0, "")
    assert "TORCH_SDPA: required package torch" in err
    assert "printing no engine flags" in err

    code, out, err = _run([*argv, "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["backend"] is None and doc["engine_args"] == []
    assert doc["request"]["packages"] == {"cudnn": "1.32.0"}  # what was asked
    assert doc["refusal"]["kind"] == "no_valid_backend"
    by_backend = {c["backend"]: c for c in doc["refusal"]["candidates"]}
    assert set(by_backend) == {b.value for b in Backend}
    assert not by_backend["TORCH_SDPA"]["valid"]
    assert any("torch" in r for r in by_backend["TORCH_SDPA"]["reasons"])

    code, out, _ = _run([*argv, "--format", "env"], capsys)
    assert code == 0 and "export SWITCHBOARD_BACKEND=''" in out

    code, out, err = _run([*argv, "--fail-if-unavailable"], capsys)
    assert code == 1 and "TORCH_SDPA: required package torch" in err


def test_refusal_for_vllm_names_the_engine_in_json_and_env(
    svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM on a pod without a GPU: nothing vLLM runs. The documents say which engine
    refused, in the same shape as an answer's ``engine``."""
    argv = ["--model", DSV3, *svc_args, "--capability", "none", "--engine", "vllm==0.33.0"]
    code, out, err = _run([*argv, "--format", "json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["engine"] == {"name": "vllm", "version": "0.33.0"} and doc["backend"] is None
    assert all(not c["valid"] for c in doc["refusal"]["candidates"])
    assert "vLLM 0.33.0" in err
    code, out, _ = _run([*argv, "--format", "env"], capsys)
    assert code == 0 and "export SWITCHBOARD_ENGINE=vllm" in out


def test_local_refusal_explains_itself_too(
    closed_url: str, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same refusal decided locally (service down) reads the same."""
    argv = ["--model", DSV3, "--cluster", "c", "--url", closed_url, "--deadline", "0.3"]
    argv += ["--cache-dir", str(cache_dir), "--capability", "none", "--packages", "cudnn=1.32.0"]
    code, out, err = _run([*argv, "--format", "vllm-args"], capsys)
    assert (code, out) == (0, "")
    assert "deciding locally" in err and "TORCH_SDPA: required package torch" in err


def test_strict_refusal_lists_every_candidate_and_exits_1(
    svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", DSV3, *svc_args, *H200, "--requested", "trtllm_ragged", "--strict"]
    code, out, err = _run(argv, capsys)
    assert (code, out) == (1, "")
    assert "TRTLLM_RAGGED: compute capability 9.0 not supported" in err
    assert "FLASH_ATTN: valid" in err


# vLLM 0.33.0's own rules, written out from the issue's reading of its source
# (prefill/base.py and each backend's file), independently of core/engines.py.
VLLM_FA_DIMS = {(128, 64, 128), (192, 64, 256), (64, 64, 128), (256, 0, 256)}
VLLM_BLACKWELL_DIMS = {
    "FLASHINFER": {(128, 64, 128)},
    "TRTLLM_RAGGED": {(128, 64, 128), (192, 64, 256)},
    "TOKENSPEED_MLA": {(128, 64, 128)},
}


def _vllm_runs(backend: str, capability: str, dims: tuple[int, int, int], dtype: str) -> bool:
    if capability == "none" or dtype == "fp32":
        return False
    if backend == "FLASH_ATTN":
        return dims in VLLM_FA_DIMS
    major = int(capability.split(".")[0])
    return major == 10 and dims in VLLM_BLACKWELL_DIMS.get(backend, set())


@pytest.mark.parametrize("capability", ["7.5", "8.0", "8.9", "9.0", "10.0", "10.3", "12.0", "none"])
@pytest.mark.parametrize(
    "dims", [(128, 64, 128), (192, 64, 256), (64, 64, 128), (256, 0, 256), (96, 32, 64)]
)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_vllm_args_name_only_what_vllm_runs(
    capability: str,
    dims: tuple[int, int, int],
    dtype: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 12: whatever the pod, ``--format vllm-args`` prints one flag vLLM 0.33.0
    accepts and would run for it, or nothing (exit 0 either way). Decided locally (no
    service URL), the path a pod takes when the service is down."""
    nope, rope, v = (str(d) for d in dims)
    argv = ["--cluster", "c", "--capability", capability, "--packages", "any", "--no-cache"]
    argv += ["--qk-nope-head-dim", nope, "--qk-rope-head-dim", rope, "--v-head-dim", v]
    argv += ["--dtype", dtype, "--engine", "vllm==0.33.0", "--format", "vllm-args"]
    code, out, err = _run(argv, capsys)
    assert code == 0, err
    if not out:
        assert "printing no engine flags" in err or "printing none" in err
        return
    flag, _, backend = out.strip().partition("=")
    assert flag == "--attention-config.mla_prefill_backend" and "\n" not in out.strip()
    assert _vllm_runs(backend, capability, dims, dtype), out


@pytest.mark.parametrize("version", ["garbage", "main", "latest", "v0.34.0", "1!0.34.0"])
def test_an_unreadable_or_tagged_version_is_passed_on_as_given(version: str) -> None:
    """The agent cleans what the contract cannot carry, and nothing else: the service
    reads the version (``v0.34.0`` is 0.34.0) or says it could not, as for any caller."""
    assert parse_engine(f"vllm=={version}") == EngineInfo(name="vllm", version=version)
