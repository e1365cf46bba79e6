"""Backend and engine facts are written in one place each, and spelt nowhere else.

``core/specs.py`` is the backend registry and ``core/engines.py`` (with the wire
contract's ``EngineName``) the engine one; the probe, the evidence key, the agent's
``--format`` choices, the dashboard and the README's table are derived from them. The
agent once kept its own list of kernel packages, which lacked ``tokenspeed_mla``:
these tests fail when a name is spelt again where it would become a second copy.

What counts as a spelling: in Python, a string that the program uses (docstrings and
other bare string statements are documentation); in the dashboard's files, any
mention, whatever its case. Prose in Markdown may name backends, but no hand-written
table row may repeat the registry's facts (the README's table is generated).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mla_switchboard.core.engine_names import ENGINE_NAMES, OWN_ENGINE, engine_entries
from mla_switchboard.core.specs import KERNEL_PACKAGES, SPECS, Backend

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("core", "service", "agent", "kernels", "cli", "scripts", "tools")
STATIC = ROOT / "service" / "static"

BACKEND_ALLOWED = {
    "core/specs.py": "the backend registry",
    "core/engine_rules/": "engine profiles: each rule names the backend it is about, as "
    "the engine's own code does (rewritten per release)",
    "tools/engine_profiles/": "reads each engine release's own code, which spells the names",
    "scripts/seed_fleet.py": "standard library only (runs without the package installed); "
    "its requests name backends as a pod's vLLM config would",
}
"""Files (or folders, ending in /) that may spell a backend's name, and why. A wrapper
in ``kernels/`` may spell its own backend's (its module is the spec's ``class_path``)."""

ENGINE_ALLOWED = {
    "core/engines.py": "the engine registry",
    "core/engine_rules/": "the engine profiles",
    "tools/engine_profiles/": "downloads and runs each engine release",
    "core/schemas.py": "the wire contract's EngineName, which the profiles must match",
    "kernels/flash_attn.py": "imports vLLM's bundled FlashAttention from the vllm package",
}
"""Files that may spell an engine's name or ``--format``, and why. Our own engine is
not checked: its name is the product's (the logger, the cache folder, the program)."""


def _sources() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py"))


def _used_strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of ``path`` that its code uses: not docstrings, not bare
    string statements (attribute docs), and f-string parts as written."""
    tree = ast.parse(path.read_text(), filename=str(path))
    documentation = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in documentation
    ]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _allowed(rel: str, allowed: dict[str, str]) -> bool:
    return any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in allowed)


def _own_wrapper(backend: Backend) -> str:
    module = SPECS[backend].class_path.partition(":")[0]
    return module.replace("mla_switchboard.", "").replace(".", "/") + ".py"


# ------------------------------------------------------------------- backends

BACKEND_WORD = {b: re.compile(rf"\b{b.value}\b") for b in Backend}


def test_backend_names_are_spelt_only_in_the_registry() -> None:
    offenders = []
    for path in _sources():
        rel = _rel(path)
        if _allowed(rel, BACKEND_ALLOWED):
            continue
        for line, text in _used_strings(path):
            for backend, word in BACKEND_WORD.items():
                if word.search(text) and rel != _own_wrapper(backend):
                    offenders.append(f"{rel}:{line}: {backend} in {text[:60]!r}")
    assert offenders == [], "spell backends through Backend (core/specs.py):\n" + "\n".join(
        offenders
    )


def _any_spelling(name: str) -> re.Pattern[str]:
    """``FLASH_ATTN``, ``flash-attn``, ``Flash_Attn``: every way CSS or JS might write it."""
    parts = re.split(r"[_-]", name)
    return re.compile(r"(?<![A-Za-z0-9])" + "[-_]".join(parts) + r"(?![A-Za-z0-9])", re.I)


@pytest.mark.parametrize("path", sorted(STATIC.iterdir()), ids=lambda p: p.name)
def test_the_dashboard_names_no_backend(path: Path) -> None:
    """Its list, order and colours come from GET /v1/backends."""
    text = path.read_text()
    found = [b.value for b in Backend if _any_spelling(b.value).search(text)]
    assert found == [], f"{_rel(path)} spells {found}"


def test_no_markdown_table_repeats_the_registrys_facts() -> None:
    """The facts live in one table, generated by scripts/gen_docs_tables.py (checked in
    tests/deploy/test_readme.py); a hand-written row with a backend's capability or
    dims would drift from it."""
    generated = re.compile(r"<!-- generated: .*?<!-- end generated: \w+ -->", re.S)
    offenders = []
    for path in sorted(ROOT.rglob("*.md")):
        parts = path.relative_to(ROOT).parts
        if any(part.startswith(".") or part.endswith(".egg-info") for part in parts):
            continue  # virtual environments, caches, build metadata
        text = generated.sub("", path.read_text())
        for row in re.findall(r"^\s*\|.*\|\s*$", text, re.M):
            cells = [c.strip() for c in row.strip().strip("|").split("|")]
            for backend, spec in SPECS.items():
                if backend.value in cells[:1] and spec.dims_text in cells[1:]:
                    offenders.append(f"{_rel(path)}: {row.strip()}")
    assert offenders == []


def test_colours_are_fixed_slots_the_stylesheet_has() -> None:
    colours = [spec.colour for spec in SPECS.values()]
    assert len(set(colours)) == len(colours), "two backends share a colour"
    css = (STATIC / "dashboard.css").read_text()
    slots = {int(n) for n in re.findall(r"^\.bc-(\d+) \{ --backend: var\(--b-\1\); \}", css, re.M)}
    palette = {int(n) for n in re.findall(r"^\s*--b-(\d+):", css, re.M)}
    assert set(colours) <= slots <= palette


def test_the_probe_and_the_evidence_key_read_the_registry() -> None:
    from mla_switchboard.agent import probe
    from mla_switchboard.core import evidence

    needed = {p.import_name for s in SPECS.values() for p in (*s.packages, *s.optional_packages)}
    assert set(KERNEL_PACKAGES) == needed
    assert set(evidence.KERNEL_PACKAGES) == needed
    assert probe.KERNEL_PACKAGES is KERNEL_PACKAGES


# -------------------------------------------------------------------- engines


def _engine_spellings() -> dict[str, re.Pattern[str]]:
    """Each engine other than our own: its exact name, its ``--format``, and the
    ``NAME==VERSION`` form, as a used string would hold them."""
    found = {}
    for entry in engine_entries():
        if entry.name == OWN_ENGINE:
            continue
        forms = [re.escape(entry.name)]
        if entry.format is not None:
            forms.append(re.escape(entry.format))
        found[entry.name] = re.compile(
            rf"^(?:{'|'.join(forms)})$|\b{re.escape(entry.name)}(?:==|-args\b)", re.I
        )
    return found


def test_engine_names_are_spelt_only_in_the_engine_registry() -> None:
    spellings = _engine_spellings()
    offenders = []
    for path in _sources():
        rel = _rel(path)
        if _allowed(rel, ENGINE_ALLOWED):
            continue
        for line, text in _used_strings(path):
            for name, pattern in spellings.items():
                if pattern.search(text):
                    offenders.append(f"{rel}:{line}: {name} in {text[:60]!r}")
    assert offenders == [], "read engines from core/engine_names.py:\n" + "\n".join(offenders)


def test_engine_names_agree_with_the_wire_contract_and_the_formats() -> None:
    from mla_switchboard.agent.commands.formats import SELECT_FORMATS

    assert OWN_ENGINE in ENGINE_NAMES
    formats = [e.format for e in engine_entries() if e.format is not None]
    assert list(SELECT_FORMATS) == ["json", "env", *formats]


def test_the_spelling_checks_see_a_second_copy(tmp_path: Path) -> None:
    """The scans are only worth something if they would catch the bug they exist for."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        '"""A docstring may say TOKENSPEED_MLA."""\n'
        'PACKAGES = {"TOKENSPEED_MLA": 1}\n'
        'FORMATS = ("json", "' + (engine_entries()[1].format or "") + '")\n'
    )
    strings = [text for _, text in _used_strings(planted)]
    assert any(BACKEND_WORD[Backend.TOKENSPEED_MLA].search(t) for t in strings)
    assert not any("docstring" in t for t in strings)
    assert any(p.search(t) for p in _engine_spellings().values() for t in strings)
    assert _any_spelling("TORCH_SDPA").search(".swatch.b-torch-sdpa {}")


def test_the_docs_tables_are_generated_from_the_registry() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_docs_tables.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
