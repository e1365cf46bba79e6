"""``switchboard select``: formats, exit codes, stdout for machines, stderr for people."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from mla_switchboard.agent.commands.select import select_main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = Path(__file__).resolve().parent / "configs"
DSV3 = str(CONFIGS / "deepseek-v3.json")
FA_FLAG = "--attention-config.mla_prefill_backend=FLASH_ATTN\n"
B200 = ["--capability", "10.0", "--device-name", "NVIDIA B200", "--packages", "any"]
VLLM = ["--engine", "vllm==0.33.0"]


@pytest.fixture
def svc_args(agent_service: Any, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("SWITCHBOARD_TOKEN", agent_service.token)
    return ["--cluster", "agent-cli", "--url", agent_service.url, "--cache-dir", str(cache_dir)]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = select_main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _selections(service: Any, cluster: str) -> int:
    response = httpx.get(
        service.url + "/v1/selections",
        params={"cluster": cluster, "limit": 100},
        headers={"Authorization": f"Bearer {service.token}"},
    )
    return len(response.json()["items"])


def test_json_output(svc_args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(
        ["--model", str(CONFIGS / "deepseek-v3.json"), *svc_args, *B200, "--format", "json"],
        capsys,
    )
    assert code == 0
    doc = json.loads(out)
    assert (doc["backend"], doc["source"]) == ("TRTLLM_RAGGED", "priority")
    assert doc["decision_id"] is None and doc["rules_revision"] == 1  # a dry run (B200 pretend)
    assert [c["backend"] for c in doc["candidates"]][:4] == [
        "TRTLLM_RAGGED", "FLASHINFER", "CUDNN", "FLASH_ATTN",
    ]  # fmt: skip
    assert doc["request"]["model"]["num_heads"] == 128 and doc["kernel"] is None
    assert "switchboard: TRTLLM_RAGGED (priority)" in err


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (B200, "--attention-config.mla_prefill_backend=TRTLLM_RAGGED\n"),
        (["--capability", "9.0", "--packages", "any"], FA_FLAG),
    ],
)  # fmt: skip
def test_vllm_args(
    svc_args: list[str], capsys: pytest.CaptureFixture[str], extra: list[str], expected: str
) -> None:
    argv = ["--model", str(CONFIGS / "kimi-k2.json"), *svc_args, *extra]
    code, out, _ = _run([*argv, "--engine", "vllm==0.33.0", "--format", "vllm-args"], capsys)
    assert (code, out) == (0, expected)


def test_vllm_args_without_a_version_print_nothing_and_say_why(
    svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """No vLLM installed here and none named: the pod may run any release, and no
    flag every release takes exists (0.20.2 refuses the one 0.21+ read), so nothing
    is printed and stderr says why; vLLM keeps its own choice."""
    argv = ["--model", str(CONFIGS / "kimi-k2.json"), *svc_args, *B200]
    code, out, err = _run([*argv, "--format", "vllm-args"], capsys)
    assert (code, out) == (0, "")
    assert "version" in err


def test_vllm_args_without_a_gpu_print_nothing_and_say_why(
    svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """No GPU: no backend vLLM accepts (or, before the engine rules, TORCH_SDPA, which
    vLLM lacks). Either way stdout is empty (the engine keeps its own choice), the
    reason is on stderr and the init container does not fail."""
    argv = ["--model", str(CONFIGS / "kimi-k2.json"), *svc_args, "--capability", "none"]
    code, out, err = _run([*argv, "--format", "vllm-args"], capsys)
    assert (code, out) == (0, "")
    assert "printing no engine flags" in err or "printing none" in err


def _env(out: str) -> dict[str, str]:
    return dict(shlex.split(line)[1].split("=", 1) for line in out.splitlines())


def test_env_output_is_shell(svc_args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """GLM-5's dims (192, 64, 256) on Blackwell: TRTLLM_RAGGED now takes them (spec
    table), so the seed rules' first choice wins. Switchboard's own kernels: no vLLM
    flags."""
    argv = ["--model", str(CONFIGS / "glm-5"), *svc_args, *B200, "--engine", "switchboard"]
    code, out, _ = _run([*argv, "--format", "env"], capsys)
    assert code == 0
    values = _env(out)
    assert values["SWITCHBOARD_BACKEND"] == "TRTLLM_RAGGED"
    assert values["SWITCHBOARD_SOURCE"] == "priority"
    assert values["SWITCHBOARD_DECISION_ID"] == ""  # a dry run (B200 pretend): none recorded
    assert values["SWITCHBOARD_ENGINE"] == "switchboard"
    assert values["SWITCHBOARD_VLLM_ARGS"] == ""


def test_env_output_exports_the_engine_args(
    svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(CONFIGS / "glm-5"), *svc_args, *B200, *VLLM]
    code, out, _ = _run([*argv, "--format", "env"], capsys)
    assert code == 0
    values = _env(out)
    flag = "--attention-config.mla_prefill_backend=TRTLLM_RAGGED"
    assert values["SWITCHBOARD_ENGINE"] == "vllm"
    assert values["SWITCHBOARD_ENGINE_ARGS"] == values["SWITCHBOARD_VLLM_ARGS"] == flag


def test_not_mla_is_bad_input_and_asks_nobody(
    agent_service: Any, svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    before = _selections(agent_service, "agent-cli")
    code, out, err = _run(
        ["--model", str(CONFIGS / "llama-3.1-8b-instruct.json"), *svc_args], capsys
    )
    assert (code, out) == (2, "")
    assert "does not use MLA" in err
    assert _selections(agent_service, "agent-cli") == before


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "/nonexistent/config.json", "--cluster", "c"], "cannot read model config"),
        (["--model", str(CONFIGS / "deepseek-v3.json")], "no cluster given"),
        (["--model", DSV3, "--cluster", "Bad Name", "--capability", "9.0"],
         "cluster"),
        (["--model", str(CONFIGS / "deepseek-v3.json"), "--cluster", "c", "--requested", "fa9"],
         "valid backends: TRTLLM_RAGGED"),
        (["--model", str(CONFIGS / "deepseek-v3.json"), "--cluster", "c", "--capability", "nine"],
         "not major.minor"),
        (["--model", str(CONFIGS / "deepseek-v3.json"), "--cluster", "c", "--format", "yaml"],
         "invalid choice"),
        (["--cluster", "c", "--deadline", "-1"], "must be positive"),
    ],
)  # fmt: skip
def test_bad_input_exits_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run([*argv, "--no-cache"], capsys)
    assert (code, out) == (2, "")
    assert message in err


def test_strict_refusal_exits_1(svc_args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", str(CONFIGS / "deepseek-v3.json"), *svc_args, "--capability", "9.0"]
    code, out, err = _run([*argv, "--requested", "trtllm_ragged", "--strict"], capsys)
    assert (code, out) == (1, "")
    assert "compute capability 9.0 not supported (needs 10.x)" in err


def test_service_down_still_exits_0(
    closed_url: str, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        ["--model", str(CONFIGS / "deepseek-v3.json"), "--cluster", "c", "--url", closed_url,
         "--cache-dir", str(cache_dir), "--deadline", "0.3", *B200,
         "--engine", "vllm==0.33.0", "--format", "vllm-args"],
        capsys,
    )  # fmt: skip
    assert (code, out) == (0, "--attention-config.mla_prefill_backend=TRTLLM_RAGGED\n")
    assert "deciding locally with the seed rules" in err


def test_check_builds_and_verifies_the_kernel(
    svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(
        ["--model", str(CONFIGS / "deepseek-v2-lite.json"), *svc_args, "--check"], capsys
    )
    assert code == 0
    doc = json.loads(out)
    assert (doc["backend"], doc["kernel"], doc["build_failures"]) == (
        "TORCH_SDPA", "torch-fp32-reference", [],
    )  # fmt: skip


def test_the_switchboard_command_runs_select(agent_service: Any, cache_dir: Path) -> None:
    """Through the console script's entry point, in a fresh process, as a pod would."""
    proc = subprocess.run(
        [sys.executable, "-m", "mla_switchboard.cli",
         "select", "--model", str(CONFIGS / "glm-5"), "--cluster", "agent-cli",
         "--url", agent_service.url, "--cache-dir", str(cache_dir), *B200, *VLLM,
         "--format", "vllm-args"],
        cwd=ROOT,
        env={"SWITCHBOARD_TOKEN": agent_service.token, "PATH": "/usr/bin:/bin",
             "HOME": str(cache_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "--attention-config.mla_prefill_backend=TRTLLM_RAGGED\n"
    assert "switchboard: TRTLLM_RAGGED (priority)" in proc.stderr


def test_stderr_says_why_a_request_was_not_taken(
    svc_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(CONFIGS / "glm-5"), *svc_args, "--capability", "9.0"]
    code, out, err = _run(
        [*argv, "--requested", "cudnn", "--engine", "vllm==0.33.0", "--format", "vllm-args"], capsys
    )
    assert (code, out) == (0, FA_FLAG)
    assert "Requested MLA prefill backend CUDNN is not valid" in err
    assert "model MLA dims (192, 64, 256) not supported" in err


def test_a_dry_run_is_never_recorded(
    svc_args: list[str], agent_service: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--capability``/``--device-name`` pretend to be another GPU: the service decides
    and records nothing, so the fleet's counts and latest pods do not move."""
    args = [*svc_args[:1], "agent-dry-run", *svc_args[2:]]
    before = _selections(agent_service, "agent-dry-run")
    code, out, _ = _run(["--model", DSV3, *args, "--capability", "9.0"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["source"] == "priority" and doc["decision_id"] is None
    assert _selections(agent_service, "agent-dry-run") == before == 0


def test_a_refused_token_is_a_configuration_error(
    svc_args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWITCHBOARD_TOKEN", "sb_000000000000_mistyped")
    code, out, err = _run(["--model", DSV3, *svc_args, *B200, "--format", "json"], capsys)
    assert code == 0  # the pod still boots...
    assert json.loads(out)["source"] == "auth-fallback"  # ...on a local decision, marked
    assert "configuration error: the service refused this pod's token" in err
    assert "SWITCHBOARD_TOKEN" in err and "HTTP 401" in err
    code, out, err = _run(
        ["--model", DSV3, *svc_args, *B200, "--no-cache", "--fail-on-auth-error"], capsys
    )
    assert (code, out) == (3, "")
    assert "configuration error" in err
