"""The README's promises, checked as a new user would meet them.

- The platform engineer's walkthrough is run as written (its shell block, against a
  real fresh service): the old one showed ``pods_changed: 0`` on a fresh install and a
  fixed ``expires_at`` that was soon in the past (422).
- The two commands: command 1 installs into a venv (a stock Debian Python refuses
  global installs) and command 2's toolchain is pinned, with torch left to .ci/run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import ROOT, ServiceProcess, free_port

README = (ROOT / "README.md").read_text()
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"


def section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def pins() -> dict[str, str]:
    found = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, pinned = line.partition("==")
            assert pinned, f"not an exact pin: {line}"
            found[re.sub(r"[-_.]+", "-", name).lower()] = pinned
    return found


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_the_walkthrough_runs_as_written(tmp_path: Path) -> None:
    port = free_port()
    token = "sb_walkthrough_admin_token_0123456789"
    service = ServiceProcess(
        f"sqlite:///{tmp_path / 'switchboard.db'}", env={"SWITCHBOARD_ADMIN_TOKEN": token}
    )
    service.port, service.url = port, f"http://127.0.0.1:{port}"
    service.start(tmp_path)
    script = shell_blocks(section("A platform engineer's workflow"))[0]
    assert "export TOKEN=sb_..." in script and "date -u -d '+2 hours'" in script
    script = (
        script.replace("export TOKEN=sb_...", f"export TOKEN={token}")
        .replace("localhost:8000", f"localhost:{port}")
        .replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    )
    try:
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=ROOT,
            env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
            capture_output=True,
            text=True,
            timeout=180,
        )
    finally:
        service.stop()
    out = done.stdout
    assert done.returncode == 0, done.stderr + out
    documents = _json_documents(out)
    errors = [d for d in documents if "detail" in d]
    assert not errors, errors  # every request of the walkthrough was accepted
    # the fleet the README describes, then the change it makes to prod-east
    assert "prod-east  FLASHINFER      412 pods" in out
    summary = documents[0]
    assert summary["clusters"]["prod-east"] == {"FLASHINFER": 412, "FLASH_ATTN": 20}
    (dry_run,) = [d for d in documents if d.get("dry_run")]
    preview = dry_run["preview"]
    assert preview["pods_total"] == 772
    assert 0 < preview["pods_changed"] < 412  # a stage of prod-east's FLASHINFER pods
    assert {c["to"] for c in preview["changes"]} == {"FLASH_ATTN"}
    written = [d["override"] for d in documents if "override" in d and "preview" in d]
    assert written and all(o["note"] == "INC-4711 FlashInfer segfault" for o in written)
    overrides = documents[-1]["items"]
    assert [o["cluster"] for o in overrides] == ["prod-east"]
    assert overrides[0]["expired"] is False  # expires_at is computed from now


def _json_documents(out: str) -> list[dict]:
    """The JSON answers in curl's output (each printed without a newline after it)."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while (at := out.find("{", at)) != -1:
        document, end = decoder.raw_decode(out, at)
        found.append(document)
        at = end
    return found


def test_command_one_installs_into_a_venv_and_command_two_runs_ci() -> None:
    (block,) = shell_blocks(section("Two commands"))
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert commands[0].startswith("python3 -m venv .venv && .venv/bin/pip install")
    assert "-c .ci/constraints.txt '.[server]'" in commands[0]
    assert " -e " not in commands[0]  # a copy: later edits to the checkout cannot break it
    assert commands[0].endswith(".venv/bin/switchboard serve")
    assert commands[1] == "bash .ci/run"
    run = (ROOT / ".ci" / "run").read_text()
    assert '"$ROOT/.ci/.venv"' in run and "python3 -m venv" in run
    assert "-c .ci/constraints.txt" in run
    if (ROOT / ".git").exists() and shutil.which("git"):
        for venv in (".venv", ".ci/.venv"):
            ignored = subprocess.run(["git", "check-ignore", "-q", f"{venv}/bin/python"], cwd=ROOT)
            assert ignored.returncode == 0, f"{venv} must be git-ignored"


def test_toolchain_is_pinned_and_torch_is_not() -> None:
    test_extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["test"]
    names = {Requirement(r).name.lower() for r in test_extra} - {"mla-switchboard"}
    pinned = pins()
    for name in names:
        assert re.sub(r"[-_.]+", "-", name) in pinned, f"{name} is not in .ci/constraints.txt"
    # the break this pin avoids: schemathesis 4.32 on pytest 9.2 (AttributeError _nodeid)
    assert not pinned["pytest"].startswith("9.2")
    assert "pytest-asyncio" not in pinned  # no async test: no plugin
    assert "torch" not in pinned and not any("torch" in r for r in test_extra)


def test_this_run_uses_the_pinned_versions() -> None:
    """Under .ci/run (CI set), the environment running the suite holds exactly the
    pinned versions: the machine's own packages can hide nothing."""
    if not os.environ.get("CI"):
        pytest.skip("only under .ci/run (CI set): a developer's venv may differ")
    wrong = {}
    for name, pinned in pins().items():
        try:
            got = version(name)
        except PackageNotFoundError:
            continue  # pinned for the image or another platform, not needed here
        if got != pinned:
            wrong[name] = (got, pinned)
    assert not wrong, wrong
    assert sys.prefix != sys.base_prefix, "not in a virtual environment"
