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
from mla_switchboard.agent.commands.select import build_parser, select_main

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


def test_a_refused_token_message_says_what_happens(
    svc_args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fix it names exists (``--token``), and with ``--fail-on-auth-error`` it says
    the command stops with exit 3, not that the pod boots on a fallback."""
    monkeypatch.setenv("SWITCHBOARD_TOKEN", "sb_000000000000_mistyped")
    code, _, err = _run(["--model", DSV3, *svc_args, *B200, "--no-cache"], capsys)
    assert code == 0
    assert "set SWITCHBOARD_TOKEN (or --token)" in err
    assert "boots on its cached answer or a local decision" in err
    code, _, err = _run(
        ["--model", DSV3, *svc_args, *B200, "--no-cache", "--fail-on-auth-error"], capsys
    )
    assert code == 3
    assert "exit code 3 (--fail-on-auth-error)" in err
    assert "boots on" not in err


def test_an_unreadable_token_file_is_named_not_sent_silently(
    svc_args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--token-file`` with a mistyped path: stderr names the file and why it cannot
    be read, before and in the service's refusal, not only "missing bearer token"."""
    monkeypatch.delenv("SWITCHBOARD_TOKEN")
    argv = ["--model", DSV3, *svc_args, *B200, "--no-cache", "--fail-on-auth-error"]
    code, out, err = _run([*argv, "--token-file", "/nonexistent/token"], capsys)
    assert (code, out) == (3, "")
    said = (
        "cannot read the token file /nonexistent/token (--token-file or "
        "SWITCHBOARD_TOKEN_FILE): No such file or directory; sending no token"
    )
    assert err.count(said) == 2, err  # as a warning first, then as the refusal's cause
    assert "fix the path" in err and "HTTP 401" in err


def test_the_token_can_be_given_as_a_flag(
    svc_args: list[str],
    agent_service: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--token`` stands in for ``$SWITCHBOARD_TOKEN`` (the help says a flag shows in
    ``ps`` and points to the safer two)."""
    monkeypatch.delenv("SWITCHBOARD_TOKEN")
    monkeypatch.delenv("SWITCHBOARD_TOKEN_FILE", raising=False)
    argv = ["--model", DSV3, *svc_args, *B200, "--no-cache", "--fail-on-auth-error"]
    code, out, _ = _run([*argv, "--token", agent_service.token], capsys)
    assert code == 0 and json.loads(out)["source"] == "priority"
    code, _, _ = _run([*argv, "--token", "sb_000000000000_mistyped"], capsys)
    assert code == 3
    (flag,) = [a for a in build_parser()._actions if "--token" in a.option_strings]
    assert "(ps, /proc)" in str(flag.help)
    assert "prefer $SWITCHBOARD_TOKEN or --token-file" in str(flag.help)


def test_a_cluster_name_is_refused_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    """The same words as ``token create --clusters`` (core/names.py), never a regex."""
    from mla_switchboard.core.names import cluster_rule, validate_cluster_globs

    code, out, err = _run(["--model", DSV3, "--cluster", "Prod_East", *B200, "--no-cache"], capsys)
    assert (code, out) == (2, "")
    assert f"--cluster: 'Prod_East' is not a cluster name: use {cluster_rule()}" in err
    assert "did you mean 'prod_east'?" in err
    assert "pattern" not in err and "^[" not in err
    with pytest.raises(ValueError) as refused:
        validate_cluster_globs(["Prod_East"])
    assert cluster_rule(wildcards=True) in str(refused.value)
    assert cluster_rule().split(" (")[0] in cluster_rule(wildcards=True)  # one wording


def test_a_dry_run_neither_reads_nor_writes_the_cache(
    svc_args: list[str],
    cache_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``select --help``: a dry run caches nothing. It answered from, and wrote, the
    pod's answer cache: a later dry run with the service away showed an old answer."""
    code, out, _ = _run(["--model", DSV3, *svc_args, *B200], capsys)
    assert code == 0 and json.loads(out)["source"] == "priority"
    assert not cache_dir.exists() or list(cache_dir.iterdir()) == []
    # A real run here (no GPU, every package assumed) caches the answer for the very
    # request a `--capability none` dry run sends: the dry run must not answer from it.
    monkeypatch.delenv("SWITCHBOARD_URL", raising=False)
    real = ["--model", DSV3, *svc_args, "--packages", "any"]
    code, out, _ = _run(real, capsys)
    assert code == 0 and json.loads(out)["decision_id"]  # the service's answer
    assert len(list(cache_dir.iterdir())) == 1
    offline = ["--model", DSV3, "--cluster", "agent-cli", "--cache-dir", str(cache_dir)]
    code, out, _ = _run([*offline, "--packages", "any"], capsys)
    assert code == 0 and json.loads(out)["source"] == "cache"  # the real pod boots on it
    code, out, err = _run([*offline, "--capability", "none"], capsys)
    assert code == 0 and json.loads(out)["source"] == "local-fallback", err
    help_text = " ".join(build_parser().format_help().split())
    assert "the answer cache is neither read nor written" in help_text


def test_bench_without_torch_says_so_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain install has no torch: one clear line with the extra to install, exit
    1, no traceback and no list of backends 'skipped' for want of it."""
    from mla_switchboard.agent.commands.bench import bench_main

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails, as uninstalled
    code = bench_main(["--model", DSV3, "--cluster", "c", "--no-report"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert "PyTorch is not installed here" in err
    assert "pip install 'mla-switchboard[gpu]'" in err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err and "skipped" not in err
