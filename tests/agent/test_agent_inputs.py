"""Input checked at the edge, help that explains itself, a quiet probe, and an agent
that stands on nothing from the service (agent side)."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.agent import client
from mla_switchboard.agent.commands.bench import bench_main
from mla_switchboard.agent.commands.select import select_main
from mla_switchboard.agent.pod import parse_packages
from mla_switchboard.core.version import __version__

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "agent"
CONFIGS = Path(__file__).resolve().parent / "configs"
DSV3 = str(CONFIGS / "deepseek-v3.json")
H200 = ["--capability", "9.0", "--device-name", "NVIDIA H200"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = select_main(argv)
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ URLs


@pytest.mark.parametrize(
    "url", ["127.0.0.1:18000", "localhost", "ftp://x:1", "http://", "http://h:x"]
)
def test_a_url_that_cannot_work_is_refused_when_parsed(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 10: ``--url 127.0.0.1:18000`` used to be retried for the whole deadline and
    then fall back (exit 0). It is bad input: exit 2, the flag named, nothing asked."""
    code, out, err = _run(["--model", DSV3, "--cluster", "c", *H200, "--url", url], capsys)
    assert (code, out) == (2, "")
    assert "argument --url" in err and repr(url.rstrip("/")) in err


def test_a_bad_switchboard_url_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWITCHBOARD_URL", "http://ok:8000,switchboard-b:8000")
    code, out, err = _run(["--model", DSV3, "--cluster", "c", *H200, "--no-cache"], capsys)
    assert (code, out) == (2, "")
    assert "SWITCHBOARD_URL" in err and "'switchboard-b:8000'" in err
    code, out, err = bench_main(["--model", DSV3, "--cluster", "c"]), *capsys.readouterr()
    assert (code, out) == (2, "") and "SWITCHBOARD_URL" in err


def test_urls_with_schemes_are_kept() -> None:
    assert client.parse_urls("http://a:1/, https://b/x") == ["http://a:1", "https://b/x"]


# -------------------------------------------------------------- packages


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("torch==2.11.0", {"torch": "2.11.0"}),
        ("torch=2.11.0, flashinfer==0.7.2.post1", {"torch": "2.11.0", "flashinfer": "0.7.2.post1"}),
        ("any", "any"),
        ("PROBE", "probe"),
    ],
)
def test_packages_keep_the_bare_version(spec: str, expected: Any) -> None:
    assert parse_packages(spec) == expected


def test_packages_double_equals_reaches_the_service_as_the_version(
    closed_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 10: ``torch==2.11.0`` used to be sent as ``{"torch": "=2.11.0"}``."""
    argv = ["--model", DSV3, "--cluster", "c", *H200, "--url", closed_url, "--deadline", "0.2"]
    code, out, err = _run([*argv, "--no-cache", "--packages", "torch==2.11.0"], capsys)
    assert code == 0, err
    assert json.loads(out)["request"]["packages"] == {"torch": "2.11.0"}


@pytest.mark.parametrize("spec", ["torch 2.1", "torch", "torch=", "=2.1", "torch=2 .1", ","])
def test_bad_packages_exit_2_naming_the_flag(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["--model", DSV3, "--cluster", "c", *H200, "--packages", spec], capsys)
    assert (code, out) == (2, "")
    assert "argument --packages" in err


def test_a_model_without_a_rope_part_is_accepted(
    closed_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """GLM-5-Next's (256, 0, 256): a rope dim of 0 is a real MLA layout."""
    argv = ["--cluster", "c", *H200, "--url", closed_url, "--deadline", "0.2", "--no-cache"]
    dims = ["--qk-nope-head-dim", "256", "--qk-rope-head-dim", "0", "--v-head-dim", "256"]
    code, out, err = _run([*argv, *dims], capsys)
    assert code == 0, err
    model = json.loads(out)["request"]["model"]
    assert (model["qk_nope_head_dim"], model["qk_rope_head_dim"], model["v_head_dim"]) == (
        256, 0, 256,
    )  # fmt: skip


# ------------------------------------------------------------------ help


@pytest.mark.parametrize(
    ("command", "words"),
    [
        ("select", ["Choose this pod's MLA prefill backend", "vllm-args", "sglang-args",
                    "--fail-if-unavailable", "SWITCHBOARD_DEADLINE"]),
        ("bench", ["Measure every MLA prefill backend", "--layers", "table:"]),
    ],
)  # fmt: skip
def test_help_describes_the_command_its_format_and_environment(
    command: str, words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    main = select_main if command == "select" else bench_main
    assert main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for word in [*words, "--format", "--engine", "SWITCHBOARD_URL", "SWITCHBOARD_TOKEN",
                 "SWITCHBOARD_CLUSTER", "environment variables read"]:  # fmt: skip
        assert word in out, word
    if command == "select":
        assert "SWITCHBOARD_CACHE_DIR" in out
    # --format has its own help text, not only its choices
    assert ("json: the whole" if command == "select" else "table: one row") in out


def test_the_user_agent_is_the_package_version() -> None:
    """One version string: the package metadata's, not a hard-coded 0.1."""
    assert client.USER_AGENT.split("/") == ["switchboard-agent", __version__]


# ------------------------------------------------------------- a quiet probe


def test_a_real_probe_prints_no_numpy_warning(closed_url: str, tmp_path: Path) -> None:
    """Issue 10: ``UserWarning: Failed to initialize NumPy`` on every real probe (torch
    imported without numpy). Silenced where torch is imported, only that warning."""
    if importlib.util.find_spec("numpy") is not None:
        pytest.skip("numpy is installed here, so torch has nothing to warn about")
    proc = subprocess.run(
        [sys.executable, "-W", "default", "-m", "mla_switchboard.cli", "select",
         "--model", DSV3, "--cluster", "c", "--url", closed_url, "--deadline", "0.2",
         "--no-cache", "--check"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["request"]["packages"]["torch"]  # torch was imported
    assert "NumPy" not in proc.stderr


# --------------------------------------------------- standing on the core only


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", "") == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(str(node.args[0].value))
    return found


def test_no_agent_module_imports_the_service() -> None:
    """Issue 11: the GPU agent stands on core and kernels only. Every import in every
    agent module (lazy ones and ``import_module`` by name included), without exception:
    the ``switchboard`` program's dispatch of ``serve`` and ``token`` lives above the
    agent, in ``mla_switchboard.cli``."""
    offenders = {}
    for path in sorted(AGENT.rglob("*.py")):
        bad = {
            m
            for m in _imports(path)
            if m.split(".")[0] in ("service", "fastapi", "sqlalchemy", "uvicorn", "alembic")
            or m.startswith("mla_switchboard.service")
        }
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert offenders == {}


BLOCKER = """
import importlib.abc, sys
# what the server extra installs: absent from a GPU pod's plain install, which still
# has the service's own modules (they are part of the distribution)
BLOCKED = ("fastapi", "fastapi_offline", "pydantic_settings", "uvicorn", "sqlalchemy",
           "alembic", "prometheus_client", "starlette", "psycopg")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (plain install)")
sys.meta_path.insert(0, Block())
import importlib.util
_find_spec = importlib.util.find_spec
def find_spec(name, package=None):
    return None if name.split(".")[0] in BLOCKED else _find_spec(name, package)
importlib.util.find_spec = find_spec
from mla_switchboard.cli import main
code = main(sys.argv[1:])
loaded = sorted(m for m in sys.modules
                if m.split(".")[0] in BLOCKED or m.startswith("mla_switchboard.service"))
print("LOADED", loaded, file=sys.stderr)
sys.exit(code)
"""


@pytest.mark.parametrize(
    ("argv", "code", "expected"),
    [
        (["select", "--help"], 0, "Choose this pod's MLA prefill backend"),
        (["bench", "--help"], 0, "Measure every MLA prefill backend"),
        (["select", "--model", DSV3, "--cluster", "c", *H200, "--no-cache", "--url",
          "URL", "--deadline", "0.2"], 0, '"backend": "FLASH_ATTN"'),
        (["bench", "--model", DSV3, "--cluster", "c", "--no-report", "--shapes", "1x8",
          "--iters", "1", "--num-heads", "2"], 0, "torch-fp32-reference"),
        (["serve"], 2, "pip install 'mla-switchboard[server]'"),
        (["token", "create", "--help"], 2, "missing fastapi, fastapi_offline, pydantic_settings"),
    ],
)  # fmt: skip
def test_select_and_bench_run_without_the_service_packages(
    argv: list[str], code: int, expected: str, closed_url: str, tmp_path: Path
) -> None:
    """A GPU pod's plain install has the service's modules but not the server extra's
    packages: with those unimportable, select and bench still work (the select asks a
    closed URL and decides locally) without loading any service module, and ``serve``
    and ``token`` name the extra to install instead of a traceback from inside the
    service (``serve`` used to fail on ``pydantic_settings``)."""
    argv = [closed_url if a == "URL" else a for a in argv]
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKER, *argv],
        capture_output=True, text=True, timeout=180, cwd=tmp_path,
        env={**os.environ, "HOME": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == code, proc.stderr
    assert expected in proc.stdout + proc.stderr
    if code == 0:
        assert "LOADED []" in proc.stderr
