"""``switchboard bench`` and ``select --measure`` on CPU, against a real service process.

Only TORCH_SDPA runs on a CPU, so the failure paths use real kernels made wrong on
purpose (a subclass that scales q before the real TORCH_SDPA math, one whose build
raises) pushed through the real reference checks by ``bench_main``'s
``kernel_classes`` hook. What the service stored is read back from its own SQLite
file: a no-GPU pod's numbers are stored but are evidence for no GPU situation, so
the summary (GPU situations only) must not show them.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from mla_switchboard.agent.bench import (
    BenchShape,
    build_report,
    iterations,
    parse_shapes,
    plan_bench,
    run_bench,
    time_forward_passes,
)
from mla_switchboard.agent.bench.plan import runnable_backends
from mla_switchboard.agent.bench.run import forward_inputs
from mla_switchboard.agent.commands.bench import bench_main
from mla_switchboard.agent.commands.select import select_main
from mla_switchboard.agent.errors import BadInputError
from mla_switchboard.agent.pod import PodSpec
from mla_switchboard.core.schemas import SelectRequest
from mla_switchboard.core.specs import Backend
from mla_switchboard.kernels.base import RaggedBatch
from mla_switchboard.kernels.torch_sdpa import TorchSdpaPrefill

from tests.conftest import MachineLoad

CONFIGS = Path(__file__).resolve().parent / "configs"
DSV3 = str(CONFIGS / "deepseek-v3.json")
GLM5 = str(CONFIGS / "glm-5")
QUICK = ["--shapes", "1x16,2x8", "--iters", "3", "--num-heads", "4"]


class WrongScaleSdpa(TorchSdpaPrefill):
    """The real TORCH_SDPA math with q scaled by 1.25: a wrong softmax scale, as a
    kernel that ignored ``softmax_scale`` would compute."""

    def _forward(
        self,
        q: Any,
        k: Any,
        v: Any,
        batch: RaggedBatch,
        *,
        causal: bool,
        return_lse: bool,
    ) -> Any:
        return super()._forward(q * 1.25, k, v, batch, causal=causal, return_lse=return_lse)


class BrokenBuildSdpa(TorchSdpaPrefill):
    """A kernel whose one-time setup fails, like a CUDA init error on a bad node."""

    def _build(self, **options: Any) -> None:
        raise RuntimeError("cudaErrorDevicesUnavailable: all CUDA-capable devices are busy")


@pytest.fixture(scope="module")
def agent_token(agent_service: Any) -> str:
    """A token with the agent role: what a pod really holds."""
    response = httpx.post(
        agent_service.url + "/v1/tokens",
        json={"name": "bench-pods", "role": "agent"},
        headers={"Authorization": f"Bearer {agent_service.token}"},
    )
    assert response.status_code == 201, response.text
    return response.json()["token"]


@pytest.fixture
def env(agent_service: Any, agent_token: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("SWITCHBOARD_TOKEN", agent_token)
    return agent_service


def _pod() -> str:
    return f"pod-{uuid.uuid4().hex[:8]}"


def _rows(service: Any, pod: str) -> list[dict[str, Any]]:
    """What the service stored for ``pod``, read from its own database file."""
    path = service.database_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT * FROM measurements WHERE pod = ? ORDER BY id", (pod,))
        return [dict(r) for r in rows.fetchall()]


def _summary(service: Any) -> list[dict[str, Any]]:
    response = httpx.get(
        service.url + "/v1/measurements/summary",
        headers={"Authorization": f"Bearer {service.token}"},
    )
    assert response.status_code == 200, response.text
    return response.json()["groups"]


def _bench(argv: list[str], capsys: pytest.CaptureFixture[str], **kw: Any) -> tuple[int, str, str]:
    code = bench_main(argv, **kw)
    out, err = capsys.readouterr()
    return code, out, err


def test_cpu_bench_reports_torch_sdpa(env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pod = _pod()
    argv = ["--model", DSV3, "--cluster", "bench-cpu", "--url", env.url, "--pod", pod]
    code, out, err = _bench([*argv, "--iters", "3", "--format", "json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    # default shapes scaled down for a CPU, with the model's real head count
    assert doc["shapes"] == ["2x64", "1x256"] and "scaled down" in err
    assert doc["device"] == {"name": None, "capability": None, "torch_device": "cpu"}
    assert doc["model"]["num_heads"] == 128 and doc["packages"]["torch"]
    assert [(r["backend"], r["shape"]["seqlens"], r["correct"]) for r in doc["results"]] == [
        ("TORCH_SDPA", [64, 64], True),
        ("TORCH_SDPA", [256], True),
    ]
    assert all(r["median_ms"] > 0 and r["tflops"] > 0 for r in doc["results"])
    assert doc["checks"]["TORCH_SDPA"]["ok"] and len(doc["checks"]["TORCH_SDPA"]["cases"]) == 3
    # every GPU backend was left out, with the spec's reason
    assert "no CUDA device" in doc["unavailable"]["FLASHINFER"][0]
    assert set(doc["unavailable"]) == {
        "TRTLLM_RAGGED", "FLASHINFER", "CUDNN", "FLASH_ATTN", "TOKENSPEED_MLA",
    }  # fmt: skip
    # one progress line per backend and shape, and the report's receipt
    assert "bench TORCH_SDPA 2x64 H128:" in err and "bench TORCH_SDPA 1x256 H128:" in err
    assert doc["report"]["posted"] and doc["report"]["results"] == 2

    rows = _rows(env, pod)
    assert [(r["backend"], r["correct"], r["cluster"]) for r in rows] == [
        ("TORCH_SDPA", 1, "bench-cpu"),
        ("TORCH_SDPA", 1, "bench-cpu"),
    ]
    assert {r["report_id"] for r in rows} == {doc["report"]["measurement_id"]}
    assert rows[0]["dims"].replace(" ", "") in ("128,64,128", "[128,64,128]")
    assert rows[1]["tflops"] == pytest.approx(doc["results"][1]["tflops"])
    # numbers from a pod without a GPU are stored, but are evidence for no GPU
    assert all(g["capability"] for g in _summary(env))


def test_table_and_no_report(env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pod = _pod()
    code, out, err = _bench(
        ["--model", DSV3, "--cluster", "bench-cpu", "--pod", pod, "--no-report", *QUICK], capsys
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["backend", "impl", "shape", "correct"]
    assert lines[1].split()[:4] == ["TORCH_SDPA", "torch-fp32-reference", "1x16", "H4"]
    assert any(line.startswith("FLASHINFER") and "invalid" in line for line in lines)
    assert _rows(env, pod) == []
    # no URL at all and no --no-report: bad input, said before measuring anything
    code, out, err = _bench(["--model", DSV3, "--cluster", "bench-cpu", *QUICK], capsys)
    assert code == 2 and out == "" and "--no-report" in err


@pytest.mark.serial
def test_tiny_budget_skips_and_reports_nothing(
    env: Any, capsys: pytest.CaptureFixture[str], machine_load: MachineLoad
) -> None:
    pod = _pod()
    argv = ["--model", DSV3, "--cluster", "bench-cpu", "--url", env.url, "--pod", pod]
    started = time.monotonic()
    code, out, err = _bench([*argv, *QUICK, "--budget", "0.001", "--format", "json"], capsys)
    elapsed = time.monotonic() - started
    assert elapsed < 20, machine_load.says(f"{elapsed:.1f} s")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["results"] == [] and not doc["report"]["posted"]
    assert [(s["backend"], s["shape"]) for s in doc["skipped"]] == [
        ("TORCH_SDPA", None),
        ("TORCH_SDPA", "1x16"),
        ("TORCH_SDPA", "2x8"),
    ]
    assert "budget of 0.001s was spent" in doc["skipped"][0]["reason"]
    assert "nothing was measured" in err
    assert _rows(env, pod) == []


def test_budget_stops_between_steps() -> None:
    """A budget spent after the check: the check's result stands, no shape is timed."""
    plan = plan_bench(
        PodSpec(DSV3, cluster="bench-cpu", num_heads=4), shapes="1x16,2x8", budget_s=0.01, iters=3
    )
    ticks = iter([0.0, 0.0])  # start, first budget test; then the clock reads late

    def clock() -> float:
        return next(ticks, 1.0)

    outcome = run_bench(plan, clock=clock)
    assert outcome.checks["TORCH_SDPA"].ok and outcome.results == []
    assert [(s.backend, s.shape) for s in outcome.skipped] == [
        ("TORCH_SDPA", "1x16"),
        ("TORCH_SDPA", "2x8"),
    ]


def test_wrong_backend_is_reported_failed_without_speed(
    env: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pod = _pod()
    argv = ["--model", GLM5, "--cluster", "bench-cpu", "--url", env.url, "--pod", pod, *QUICK]
    code, out, err = _bench(
        [*argv, "--format", "json"],
        capsys,
        kernel_classes={Backend.TORCH_SDPA: WrongScaleSdpa},
    )
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc["results"]) == 2
    for r in doc["results"]:
        assert r["correct"] is False and r["median_ms"] is None and r["tflops"] is None
        assert r["error"].startswith("reference check failed on causal [1, 37, 200]")
        assert "out of tolerance" in r["error"]
    assert "TFLOP/s" not in err.split("reference check failed")[1]
    assert doc["report"]["posted"]
    rows = _rows(env, pod)
    assert [(r["correct"], r["tflops"], r["median_ms"]) for r in rows] == [(0, None, None)] * 2
    assert "reference check failed" in rows[0]["error"]


def test_build_failure_is_reported(env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pod = _pod()
    argv = ["--model", GLM5, "--cluster", "bench-cpu", "--url", env.url, "--pod", pod, *QUICK]
    code, out, err = _bench(
        [*argv, "--format", "json"], capsys, kernel_classes={Backend.TORCH_SDPA: BrokenBuildSdpa}
    )
    assert code == 0, err
    doc = json.loads(out)
    assert {r["error"] for r in doc["results"]} == {
        "failed to build: RuntimeError: cudaErrorDevicesUnavailable: all CUDA-capable "
        "devices are busy"
    }
    assert all(not r["correct"] and r["tflops"] is None for r in doc["results"])
    assert [r["correct"] for r in _rows(env, pod)] == [0, 0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", str(CONFIGS / "llama-3.1-8b-instruct.json")], "does not use MLA"),
        (["--model", DSV3, "--shapes", "8x"], "not BATCHxTOKENS"),
        (["--model", DSV3, "--shapes", "4096x4096"], "too large"),
        (["--model", DSV3, "--backends", "FLASHY"], "unknown backend"),
        (["--model", DSV3, "--device", "cuda:0"], "no CUDA device"),
        (["--model", DSV3, "--device", "tpu"], "not cpu, cuda or cuda:N"),
        (["--model", DSV3, "--iters", "0"], "at least 1"),
        (["--model", DSV3, "--budget", "-1"], "must be positive"),
        (["--model", str(CONFIGS / "missing.json")], "cannot read model config"),
    ],
)
def test_bad_input_exits_2(
    closed_url: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = _bench([*argv, "--cluster", "bench-cpu", "--url", closed_url], capsys)
    assert (code, out) == (2, "")
    assert message in err


def test_report_failure_exits_1(closed_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--model", DSV3, "--cluster", "bench-cpu", "--url", closed_url, "--deadline", "0.3"]
    code, out, err = _bench([*argv, *QUICK], capsys)
    assert code == 1
    assert "TORCH_SDPA" in out  # the measurements are still printed
    assert "could not report the results" in err and "ConnectError" in err


def test_select_measure_reports_then_selects(
    env: Any,
    agent_token: str,
    cache_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The token given as ``--token`` reaches the bench child too (by its environment,
    not its argv), so the report is accepted."""
    monkeypatch.delenv("SWITCHBOARD_TOKEN")
    pod = _pod()
    argv = ["--model", DSV3, "--cluster", "bench-boot", "--url", env.url, "--pod", pod]
    argv += ["--cache-dir", str(cache_dir), "--num-heads", "4", "--measure"]
    argv += ["--token", agent_token]
    code = select_main([*argv, "--measure-budget", "120", "--format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["backend"] == "TORCH_SDPA"
    assert "reported as measurement" in err, err
    rows = _rows(env, pod)
    assert [(r["backend"], r["correct"], r["num_heads"]) for r in rows] == [
        ("TORCH_SDPA", 1, 4),
        ("TORCH_SDPA", 1, 4),
    ]


@pytest.mark.serial
def test_select_measure_never_holds_the_boot(
    env: Any, cache_dir: Path, capsys: pytest.CaptureFixture[str], machine_load: MachineLoad
) -> None:
    """A budget too short to even import torch: the child is stopped at the budget,
    the boot goes on with a warning and still gets its backend."""
    pod = _pod()
    argv = ["--model", DSV3, "--cluster", "bench-boot", "--url", env.url, "--pod", pod]
    argv += ["--cache-dir", str(cache_dir), "--measure", "--measure-budget", "0.5"]
    started = time.monotonic()
    code = select_main([*argv, "--format", "json"])
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["backend"] == "TORCH_SDPA"
    # budget + select deadline + generous slack
    assert elapsed < 0.5 + 2 + 3, machine_load.says(f"{elapsed:.1f} s")
    assert "measuring gave no result" in err
    assert _rows(env, pod) == []


def test_parse_shapes_and_iterations() -> None:
    assert parse_shapes("4x4096, 1x16384,4x4096") == [BenchShape(4, 4096), BenchShape(1, 16384)]
    with pytest.raises(BadInputError):
        parse_shapes(" , ")
    # (warmup, timed) forward passes
    assert iterations(20, 1.0, 100.0) == (5, 20)  # fast kernel: all passes
    assert iterations(20, 500.0, 100.0) == (1, 6)  # slow one: ~3 s of passes
    assert iterations(20, 500.0, 0.0) == (1, 3)  # budget gone mid-step: a minimum


def test_sigterm_stops_measuring_and_keeps_what_was_measured() -> None:
    """What ``select --measure`` does at its soft limit: SIGTERM makes the child stop
    measuring at once and still print (and report) what it has."""
    import os
    import signal
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    argv = [
        sys.executable,
        "-m",
        "mla_switchboard.cli",
        "bench",
        "--model",
        DSV3,
        "--cluster",
        "x",
    ]
    argv += ["--no-report", "--format", "json", "--shapes", "1x64,1x512,2x512", "--iters", "20"]
    proc = subprocess.Popen(
        argv,
        cwd=root,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # wait until the first shape has been timed
        if "bench TORCH_SDPA 1x64 H128:" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    doc = json.loads(out)
    assert doc["interrupted"] is True
    assert doc["results"][0]["shape"]["seqlens"] == [64] and doc["results"][0]["correct"]
    assert doc["skipped"] and doc["skipped"][-1]["shape"] == "2x512"
    assert all("stopped" in s["reason"] for s in doc["skipped"])


class PlanningSdpa(TorchSdpaPrefill):
    """The real TORCH_SDPA math, plus a one-time planning cost per batch whenever the
    offsets tensor is not the one of the previous call, as FlashInfer's plan step or
    a cuDNN graph lookup costs once per new batch. Counts its plans and calls."""

    PLAN_S = 0.2

    def _forward(self, q: Any, k: Any, v: Any, batch: RaggedBatch, **kw: Any) -> Any:
        self.calls = getattr(self, "calls", 0) + 1
        if batch.cu_seqlens_q is not getattr(self, "planned_for", None):
            self.plans = getattr(self, "plans", 0) + 1
            time.sleep(self.PLAN_S)
            self.planned_for = batch.cu_seqlens_q
        return super()._forward(q, k, v, batch, **kw)


@pytest.mark.serial
def test_timing_charges_planning_once_per_forward_pass(machine_load: MachineLoad) -> None:
    """Issue 14: measured as serving calls the kernel, several layers with the same
    offsets per forward pass and new offsets each pass. Planning is paid once a pass
    and charged 1/layers per call: not on every call (a bench with new offsets per call
    would), and not never (a bench that reuses one batch forever hides it)."""
    kernel = PlanningSdpa.create(4, 128, 64, 128, 0.07, "bfloat16", "cpu")
    inputs = forward_inputs(kernel, [16, 8], "bfloat16", "cpu")
    layers = 5
    timing = time_forward_passes(kernel, inputs, layers=layers, warmup=1, passes=3)
    assert (timing.layers, timing.passes) == (layers, 3)
    assert (kernel.calls, kernel.plans) == (4 * layers, 4)  # one plan per pass, warm-up too
    plan_ms = PlanningSdpa.PLAN_S * 1e3
    # Bounds with room for a loaded machine: the sleep guarantees the lower one, and
    # the upper one is far below a plan per call (200 ms).
    assert timing.median_ms >= 0.95 * plan_ms / layers
    assert timing.median_ms < 0.6 * plan_ms, machine_load.says(f"{timing.median_ms:.1f} ms")
    assert timing.host_us > 0


def test_layers_come_from_the_config_and_the_engine_is_reported(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On a GPU a forward pass has as many calls as the model has layers (DeepSeek-V3:
    61; on a CPU only 2, see CPU_LAYERS); ``--layers`` overrides it; the engine the pod
    serves with is in the report."""
    plan = plan_bench(PodSpec(DSV3, cluster="bench-cpu", num_heads=4), shapes="1x8", iters=1)
    assert (plan.model.num_layers, plan.device, plan.layers) == (61, "cpu", 2)
    argv = ["--model", DSV3, "--cluster", "bench-cpu", "--no-report", "--format", "json"]
    argv += ["--shapes", "1x16", "--iters", "3", "--num-heads", "4", "--layers", "2"]
    code, out, err = _bench([*argv, "--engine", "switchboard"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["layers"] == 2 and "2 calls a forward pass" in err
    assert doc["engine"] == {"name": "switchboard", "version": None}
    assert doc["results"][0]["impl"] == "torch-fp32-reference"

    plan = plan_bench(
        PodSpec(DSV3, cluster="bench-cpu", num_heads=4, engine="switchboard"),
        shapes="1x8",
        iters=1,
        layers=1,
    )
    report = build_report(plan, run_bench(plan))
    assert report is not None and report.engine is not None
    assert (report.engine.name, report.engine.version) == ("switchboard", None)
    assert {r.impl for r in report.results} == {"torch-fp32-reference"}


DIM_NAMES = ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _request(engine: dict[str, Any] | None, dims: tuple[int, int, int] = (128, 64, 128)) -> Any:
    return SelectRequest.model_validate(
        {
            "cluster": "c",
            "model": dict(
                zip(("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"), dims, strict=True)
            ),
            "dtype": "bf16",
            "packages": {"torch": "2.11.0", "flashinfer": "0.7.2", "cudnn": "1.32.0"},
            "engine": engine,
        }
    )


def test_a_bench_measures_only_what_the_engine_runs() -> None:
    """A vLLM pod on an H200 measures FLASH_ATTN only: vLLM has no CUDNN and no
    TORCH_SDPA, and runs FLASHINFER only on 10.x; each is left out with the engine's
    reason. Switchboard's own kernels are all measured."""
    runnable, unavailable = runnable_backends(
        _request({"name": "vllm", "version": "0.33.0"}), (9, 0)
    )
    assert runnable == [Backend.FLASH_ATTN]
    assert any("vLLM 0.33.0 has no CUDNN" in r for r in unavailable["CUDNN"])
    assert any("10.x" in r for r in unavailable["FLASHINFER"])
    assert any("TORCH_SDPA" in r for r in unavailable["TORCH_SDPA"])
    runnable, _ = runnable_backends(_request(None), (9, 0))
    assert runnable == [Backend.FLASHINFER, Backend.CUDNN, Backend.FLASH_ATTN, Backend.TORCH_SDPA]


def test_a_cpu_bench_for_vllm_measures_nothing_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--model", DSV3, "--cluster", "c", "--no-report", "--format", "json", *QUICK]
    code, out, err = _bench([*argv, "--engine", "vllm==0.33.0"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["results"] == [] and doc["engine"] == {"name": "vllm", "version": "0.33.0"}
    assert "vLLM 0.33.0 has no TORCH_SDPA" in " ".join(doc["unavailable"]["TORCH_SDPA"])
    assert "nothing was measured" in err


def test_bench_refuses_a_pretended_gpu_and_a_bad_url(capsys: pytest.CaptureFixture[str]) -> None:
    plan_error = pytest.raises(BadInputError, match="cannot pretend")
    with plan_error:
        plan_bench(PodSpec(DSV3, cluster="c", capability="9.0"))
    code, out, err = _bench(["--model", DSV3, "--cluster", "c", "--url", "localhost:8000"], capsys)
    assert (code, out) == (2, "")
    assert "argument --url" in err and "no http:// or https:// scheme" in err
