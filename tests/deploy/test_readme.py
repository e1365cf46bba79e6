"""The README's promises, checked as a new user would meet them.

- The platform engineer's walkthrough is run as written (its shell blocks, against a
  real fresh service started as a new user starts it), and every figure it shows is
  checked against the answers: its figures used to drift from what a fresh install
  answered.
- The two commands: command 1 installs into a venv (a stock Debian Python refuses
  global installs) and command 2's toolchain is pinned, with torch left to .ci/run.
- The README stays one page that links into docs/, and every relative link of the
  README, deploy/README.md and docs/ reaches an existing file and heading: pages were
  split and moved, and a dead link is how a reader learns that too late.
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
from mla_switchboard.service.config import Settings
from packaging.requirements import Requirement

from tests.conftest import ROOT, ServiceProcess

README = (ROOT / "README.md").read_text()
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"
TOUR = "Five-minute tour: a staged change"
PAGES = sorted([ROOT / "README.md", ROOT / "deploy" / "README.md", *(ROOT / "docs").glob("*.md")])


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
def test_the_walkthrough_runs_as_written_with_the_figures_it_shows(tmp_path: Path) -> None:
    """A new user's path: a first start without a configured token (it prints one and
    says where it goes), then the workflow's blocks as written; every figure the README
    shows is the one this fresh install answers."""
    service = ServiceProcess(f"sqlite:///{tmp_path / 'switchboard.db'}", bootstrap_token=None)
    service.start(tmp_path)
    port = service.port
    printed = (service.log_path or tmp_path).read_text()
    token = re.search(r"\n    (sb_\S+)\n", printed)
    assert token, printed
    assert f"Sign in to the dashboard at http://127.0.0.1:{port}/" in printed
    assert "SWITCHBOARD_TOKEN" in printed and "--role agent" in printed
    workflow = section(TOUR)
    blocks = shell_blocks(workflow)
    assert len(blocks) == 2 and "export TOKEN=sb_..." in blocks[0]
    assert "date -u -d '+2 hours'" in blocks[0] and "/failure" in blocks[1]
    script = (
        "\n".join(blocks)
        .replace("export TOKEN=sb_...", f"export TOKEN={token.group(1)}")
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
            timeout=300,
        )
    finally:
        service.stop()
    out = done.stdout
    assert done.returncode == 0, done.stderr + out
    documents = _json_documents(out)
    errors = [d for d in documents if "detail" in d]
    assert not errors, errors  # every request of the walkthrough was accepted
    shown = "\n".join(line for line in workflow.splitlines() if line.startswith("#"))

    # the seed's lines, both runs, as printed
    for line in re.findall(r"^#   (\S+ +\S+ +\d+ pods)$", shown, re.M):
        assert line in out, line
    summary = documents[0]
    prod_east = re.search(r'"prod-east": \{"FLASHINFER": (\d+), "FLASH_ATTN": (\d+)\}', shown)
    assert prod_east is not None
    assert summary["clusters"]["prod-east"] == {
        "FLASHINFER": int(prod_east[1]),
        "FLASH_ATTN": int(prod_east[2]),
    }
    # the dry runs: the 10 % stage, then what promoting to 50 % adds
    dry_runs = [d["preview"] for d in documents if d.get("dry_run")]
    assert [p["pods_changed"] for p in dry_runs] == [
        int(n) for n in re.findall(r'"pods_changed": (\d+)', shown)
    ]
    assert all(p["pods_total"] == 772 for p in dry_runs)
    assert {c["to"] for p in dry_runs for c in p["changes"]} == {"FLASH_ATTN"}
    # why they move, as the first dry run says it (the last reason shown shortened)
    (reason,) = dry_runs[0]["changes"][0]["reasons"]
    *said, choice = reason["why"]
    assert reason["pods"] == dry_runs[0]["pods_changed"]
    assert all(f'"{why}"' in shown for why in said), said
    assert choice.startswith("Using FLASH_ATTN: first valid backend in the priority list ")
    # the override's revision in the stage's message, and the rollout's progress
    written = [d["override"] for d in documents if "override" in d and "preview" in d]
    assert written and all(o["note"] == "INC-4711 FlashInfer segfault" for o in written)
    assert f"override prod-east rev {written[0]['revision']}." in shown
    (progress,) = [d["rollouts"][0] for d in documents if d.get("rollouts")]
    figures = re.search(
        r'"pods_in_scope": (\d+), "pods_in_stage": (\d+), "pods_booted_with_it": (\d+)', shown
    )
    assert figures is not None
    assert (
        progress["pods_in_scope"],
        progress["pods_in_stage"],
        progress["pods_booted_with_it"],
    ) == tuple(int(n) for n in figures.groups())
    overrides = next(d["items"] for d in documents if "items" in d and "expired" in str(d))
    assert [o["cluster"] for o in overrides] == ["prod-east"]
    assert overrides[0]["expired"] is False  # expires_at is computed from now
    # the guard: the pod the README names halted it, and the audit entry says so
    (halted,) = [d["rollout"] for d in documents if (d.get("rollout") or {}).get("state")]
    failed = re.search(r'"failed_pods": \["([^"]+)"\]', shown)
    assert failed is not None and halted["failed_pods"] == [failed[1]]
    assert halted["halted_reason"].startswith("1 evidence source(s) (0 verified pod(s), 1 static")
    assert halted["evidence"] == {"verified_pods": 0, "static_sources": 1}
    audit = documents[-1]["items"][0]
    assert (audit["actor"], audit["action"]) == ("switchboard", "rollout.failure")
    assert audit["note"].startswith(failed[1])


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


# ------------------------------------------------------------------ one page, live links

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub makes for a Markdown page: lower case, punctuation
    dropped, spaces as hyphens, a repeated heading numbered -1, -2 ..."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


def relative_links(page: Path) -> list[str]:
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_every_relative_link_reaches_a_file_and_its_heading() -> None:
    dead = []
    for page in PAGES:
        for target in relative_links(page):
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(ROOT)}: {target}"
            if not resolved.exists():
                dead.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                dead.append(f"{where} (no such heading)")
    assert dead == []


def test_the_link_check_finds_what_it_should(tmp_path: Path) -> None:
    """The checker itself: GitHub's anchors, and links in code are not links."""
    page = tmp_path / "page.md"
    page.write_text(
        "# The change stream (`GET /v1/events`)\n## Notes\n## Notes\n"
        "[a](other.md#x) `[b](in-code.md)`\n```\n[c](in-fence.md)\n```\n"
        "[d](https://example.com/x) ![e](images/p.png)\n"
    )
    assert anchors(page) == {"the-change-stream-get-v1events", "notes", "notes-1"}
    assert relative_links(page) == ["other.md#x", "images/p.png"]


def test_the_readme_is_one_page_of_what_a_newcomer_needs() -> None:
    """At most 200 lines: what it is, the two commands, the tour, sign-in, and links;
    dated figures and commit hashes live in docs/history.md."""
    assert len(README.splitlines()) <= 200
    for title in ("Two commands", TOUR, "Sign-in: tokens and OIDC", "Read on"):
        assert f"\n## {title}\n" in README, title
    settings = {
        f"SWITCHBOARD_{name.upper()}" for name in Settings.model_fields if name.startswith("oidc_")
    }
    documented = set(re.findall(r"`(SWITCHBOARD_OIDC_\w+)`", section("Sign-in: tokens and OIDC")))
    assert documented == settings
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "a dated figure: docs/history.md"
    assert not re.search(r"\b(at|from a fresh clone at) [0-9a-f]{7,40}\b", README)
    linked = {t.partition("#")[0] for t in relative_links(ROOT / "README.md")}
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{page.name}" in linked, f"README links no docs/{page.name}"


def test_the_settings_the_docs_list_are_the_services() -> None:
    """Every SWITCHBOARD_* row of docs/operations.md's configuration table names a
    setting of service/config.py (or serve's --host/--port), with its default as
    written: the table was copied between pages and must not drift from the code."""
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text[text.index("## Configuration") : text.index("**Container image.**")]
    fields = Settings.model_fields
    checked = 0
    for first, default in re.findall(r"^\| (`SWITCHBOARD_[^|]*)\| ([^|]*) \|", table, re.M):
        names = re.findall(r"`(SWITCHBOARD_\w+|_\w+)`", first)
        names = [n if n.startswith("SWITCHBOARD_") else _expand(names[0], n) for n in names]
        defaults = [d.strip("` ") for d in default.split(",")]
        for i, name in enumerate(names):
            if name in ("SWITCHBOARD_HOST", "SWITCHBOARD_PORT"):
                continue  # serve's own options (service/cli.py)
            field = fields.get(name.removeprefix("SWITCHBOARD_").lower())
            assert field is not None, f"{name}: no such setting"
            checked += 1
            if len(defaults) != len(names) or not re.fullmatch(r"[\w./:\[\]-]+", defaults[i]):
                continue  # a default described in words
            value = field.get_default(call_default_factory=True)
            if isinstance(value, bool):
                value = int(value)
            if value is None or value == []:
                value = {"unset": None, "[]": []}.get(defaults[i], "a default")
                assert value == field.get_default(call_default_factory=True), (name, defaults[i])
                continue
            assert defaults[i] in (str(value), f"{value:g}" if isinstance(value, float) else ""), (
                name,
                defaults[i],
                value,
            )
    assert checked >= 25


def _expand(full: str, suffix: str) -> str:
    """``_MIN_PODS`` after ``SWITCHBOARD_MEASURED_MIN_SAMPLES``: the longest prefix of
    the full name that makes the shorthand a setting (else the shorthand as written)."""
    parts = full.split("_")
    for cut in range(len(parts) - 1, 0, -1):
        name = "_".join(parts[:cut]) + suffix
        if name.removeprefix("SWITCHBOARD_").lower() in Settings.model_fields:
            return name
    return suffix
