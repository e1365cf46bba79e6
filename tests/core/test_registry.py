"""Backend and engine facts are written in one place each, and spelt nowhere else.

``core/specs.py`` is the backend registry (backends and the kernel packages they need)
and ``core/engines.py`` the engine one (the wire contract's ``EngineName`` is built
from it); the probe, the evidence key, the agent's ``--format`` choices, the dashboard,
the README's table, the seeded fleet and the benchmarks' version report are derived
from them. The agent once kept its own list of kernel packages, which lacked
``tokenspeed_mla``: these tests fail when a name is spelt again where it would become a
second copy, in the program (core, service, agent, kernels, cli) and in scripts/,
bench/ and tools/.

What counts as a spelling: in Python, a string that the program uses (docstrings and
other bare string statements are documentation); in the dashboard's files, any
mention, whatever its case. A backend is its registry name as a word; a kernel package
is its import or distribution name as the whole string, or as a requirement
(``flashinfer-python>=0.7``) or a module path (``flash_attn.cute``); an engine is its
name as a word in any case (``vllm serve``, ``sglang.srt``, ``vllm>=0.21``,
``vLLM 0.33``). Prose in Markdown may name backends, but no hand-written table row may
repeat the registry's facts (the README's table is generated).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest
from mla_switchboard.core.engine_names import ENGINE_NAMES, ENGINE_REGISTRY, OWN_ENGINE
from mla_switchboard.core.engines import ENGINES
from mla_switchboard.core.schemas import EngineName
from mla_switchboard.core.specs import KERNEL_PACKAGES, SPECS, TORCH, Backend

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("core", "service", "agent", "kernels", "cli", "scripts", "bench", "tools")
STATIC = ROOT / "service" / "static"

BACKEND_ALLOWED = {
    "core/specs.py": "the backend registry",
    "core/engine_rules/": "engine profiles: each rule names the backend it is about, as "
    "the engine's own code does (rewritten per release)",
    "tools/engine_profiles/": "reads each engine release's own code, which spells the names",
    "scripts/seed_fleet.py": "its pods name the backend they ask for, as a pod's engine "
    "config would (a fixture of the README's walkthrough)",
    "bench/": "benchmark workloads: the requests, overrides and measurements that pods and "
    "operators send, written as they send them (fixtures, like tests/)",
}
"""Files (or folders, ending in /) that may spell a backend's name, and why. A wrapper in
``kernels/`` may spell its own backend's (its module is the spec's ``class_path``)."""

PACKAGE_ALLOWED = {
    "core/specs.py": "the backend registry, which declares every package",
    "tools/engine_profiles/": "reads and runs each engine release's code, simulating the "
    "kernel packages it imports by their names",
    "core/engine_rules/sglang.py": "SGLang names two attention backends after their "
    "libraries (flashinfer, tokenspeed_mla): there they are SGLang's words for its flags",
    "bench/scale.py": "its simulated fleet's package mixes: what pod images ship, with "
    "versions (fixtures, like tests/)",
    "bench/boot_storm.py": "the same kind of fleet mix, for the boot storm",
    "bench/evidence_scale.py": "the package set of the situation its evidence is about",
}
"""Files that may spell a kernel package's import or distribution name, and why. A
wrapper in ``kernels/`` may spell the packages of its own backend's spec (it imports its
library by name, lazily). ``torch`` is not checked: it is the framework that every
wrapper and the agent's bench import by name, and the probe's word for how it read the
device, not a kernel a list of them could lack."""

ENGINE_ALLOWED = {
    "core/engines.py": "the engine registry",
    "core/engine_rules/": "the engine profiles",
    "tools/engine_profiles/": "downloads and runs each engine release",
    "kernels/flash_attn.py": "imports vLLM's bundled FlashAttention from the vllm package",
    "core/version.py": "the program's name (PROGRAM), a word our own engine's name shares",
    "service/migrations/": "history: a migration keeps the column default it created",
    "bench/select_load.py": "labels its two servers: 'switchboard' there is the program",
    "bench/side_by_side.py": "reads select_load's results under the same label",
}
"""Files that may spell an engine's name, display name or ``--format``, and why. Our
own engine's name is also the program's word (``core.version.PROGRAM``, in logger names
and prose), so it is caught as a whole string: a default or comparison that means the
engine."""


def _sources() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py"))


def _used_strings(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """The string constants of ``path`` (or of ``source``) that its code uses: not
    docstrings, not bare string statements (attribute docs), and f-string parts as
    written."""
    text = path.read_text() if source is None else source
    tree = ast.parse(text, filename=str(path))
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


def _backend_offenders(rel: str, strings: list[tuple[int, str]]) -> list[str]:
    if _allowed(rel, BACKEND_ALLOWED):
        return []
    return [
        f"{rel}:{line}: {backend} in {text[:60]!r}"
        for line, text in strings
        for backend, word in BACKEND_WORD.items()
        if word.search(text) and rel != _own_wrapper(backend)
    ]


def test_backend_names_are_spelt_only_in_the_registry() -> None:
    offenders = [
        o for path in _sources() for o in _backend_offenders(_rel(path), _used_strings(path))
    ]
    assert offenders == [], "spell backends through Backend (core/specs.py):\n" + "\n".join(
        offenders
    )


# ------------------------------------------------------------ kernel packages


def _package_names() -> dict[str, str]:
    """Every import and distribution name of a kernel package -> its import name."""
    return {
        name: package.import_name
        for package in KERNEL_PACKAGES.values()
        if package != TORCH
        for name in (package.import_name, *package.distributions)
    }


def _package_pattern() -> re.Pattern[str]:
    names = "|".join(re.escape(n) for n in sorted(_package_names(), key=len, reverse=True))
    return re.compile(rf"^\s*(?:{names})(?:\s*(?:[<>=!~]=?|\[).*|(?:\.[A-Za-z_]\w*)+)?\s*$")


def _own_packages(rel: str) -> set[str]:
    """The import names a kernels/ wrapper may spell: its own backend's packages."""
    return {
        p.import_name
        for backend, spec in SPECS.items()
        if rel == _own_wrapper(backend)
        for p in (*spec.packages, *spec.optional_packages)
    }


def _package_offenders(rel: str, strings: list[tuple[int, str]]) -> list[str]:
    if _allowed(rel, PACKAGE_ALLOWED):
        return []
    pattern, names = _package_pattern(), _package_names()
    own = _own_packages(rel)
    offenders = []
    for line, text in strings:
        m = pattern.match(text)
        if m is None:
            continue
        spelt = re.split(r"[\s<>=!~\[.]", text.strip(), maxsplit=1)[0]
        if names[spelt] not in own:
            offenders.append(f"{rel}:{line}: package {names[spelt]} in {text[:60]!r}")
    return offenders


def test_kernel_package_names_are_spelt_only_in_the_registry() -> None:
    offenders = [
        o for path in _sources() for o in _package_offenders(_rel(path), _used_strings(path))
    ]
    assert offenders == [], "read packages from KERNEL_PACKAGES (core/specs.py):\n" + "\n".join(
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
    """Each engine other than our own: its name (and display name) as a word in any
    case, which covers its ``--format`` (``vllm-args``), ``NAME==VERSION``, a command
    (``vllm serve``), a module path (``sglang.srt``) and a requirement (``vllm>=0.21``);
    our own engine as the whole string, in any case."""
    found = {}
    for entry in ENGINE_REGISTRY:
        if entry.name == OWN_ENGINE:
            whole = "|".join(re.escape(w) for w in {entry.name, entry.display})
            found[entry.name] = re.compile(rf"^(?:{whole})$", re.I)
            continue
        words = "|".join(re.escape(w) for w in {entry.name, entry.display})
        found[entry.name] = re.compile(rf"(?<![A-Za-z0-9_])(?:{words})(?![A-Za-z0-9])", re.I)
    return found


def _engine_offenders(rel: str, strings: list[tuple[int, str]]) -> list[str]:
    if _allowed(rel, ENGINE_ALLOWED):
        return []
    spellings = _engine_spellings()
    return [
        f"{rel}:{line}: {name} in {text[:60]!r}"
        for line, text in strings
        for name, pattern in spellings.items()
        if pattern.search(text)
    ]


def test_engine_names_are_spelt_only_in_the_engine_registry() -> None:
    offenders = [
        o for path in _sources() for o in _engine_offenders(_rel(path), _used_strings(path))
    ]
    assert offenders == [], "read engines from core/engines.py:\n" + "\n".join(offenders)


def test_engine_names_agree_with_the_wire_contract_and_the_formats() -> None:
    from mla_switchboard.agent.commands.formats import SELECT_FORMATS

    assert OWN_ENGINE in ENGINE_NAMES
    assert set(get_args(EngineName)) == set(ENGINE_NAMES) == set(ENGINES)
    formats = [e.format for e in ENGINE_REGISTRY if e.format is not None]
    assert list(SELECT_FORMATS) == ["json", "env", *formats]


def test_one_version_grammar() -> None:
    """The wire contract's version text is the engine registry's, and every version the
    registry's grammar reads is one the contract carries; the profiles are chosen by
    that grammar (an unreadable version is carried too, and gets the newest rules)."""
    from mla_switchboard.core import engines, schemas

    assert schemas.ENGINE_VERSION_TEXT is engines.ENGINE_VERSION_TEXT
    pattern = re.compile(engines.ENGINE_VERSION_PATTERN)
    wire = re.compile(engines.ENGINE_VERSION_TEXT)
    for text in ("0.33.0", "0.4.9.post5", "0.33.1rc1", "0.11.0+cu128", "1", "0.10.1.1"):
        assert pattern.match(text) and engines.parse_version(text) is not None, text
        assert wire.match(text), text
    for text in ("garbage", "main", "", "1!0.34.0"):
        assert wire.match(text) and engines.parse_version(text) is None, text
    literals = [
        (rel, line)
        for path in (ROOT / "core").rglob("*.py")
        for rel in [_rel(path)]
        for line, text in _used_strings(path)
        if "[0-9]+(" in text and rel != "core/engine_rules/base.py"
    ]
    assert literals == [], literals


PLANTED = """
\"\"\"A docstring may say TOKENSPEED_MLA, flashinfer, vllm serve and sglang.srt.\"\"\"
PACKAGES = {"TOKENSPEED_MLA": 1}
KERNELS = ("flashinfer", "flash_attn", "cudnn")
WHEELS = ["flashinfer-python>=0.7", "nvidia-cudnn-frontend", "tokenspeed-mla==0.1"]
MODULE = "flash_attn.cute"
COMMAND = ["vllm serve", "model"]
ENGINE_MODULE = "sglang.srt.server_args"
REQUIREMENT = "vllm>=0.21"
FORMATS = ("json", "@FMT@")
DEFAULT_ENGINE = "@OWN@"
LOGGER = "@OWN@.agent"
LABEL = f"vLLM {1}"
FINE = ("flashinfers", "my_vllm_thing", "no_cudnn_here")
"""


def test_the_spelling_checks_see_a_second_copy() -> None:
    """The scans are only worth something if they would catch the bug they exist for:
    each form, planted in a synthetic module, is reported; documentation is not."""
    fmt = next(e.format for e in ENGINE_REGISTRY if e.format is not None)
    planted = PLANTED.replace("@FMT@", fmt).replace("@OWN@", OWN_ENGINE)
    strings = _used_strings(Path("agent/planted.py"), planted)
    texts = [t for _, t in strings]
    assert not any("docstring" in t for t in texts)
    backends = _backend_offenders("agent/planted.py", strings)
    assert len(backends) == 1 and "TOKENSPEED_MLA" in backends[0]
    packages = _package_offenders("agent/planted.py", strings)
    spelt = sorted(o.split(" in ", 1)[1] for o in packages)
    assert spelt == sorted(
        repr(t)
        for t in (
            "flashinfer",
            "flash_attn",
            "cudnn",
            "flashinfer-python>=0.7",
            "nvidia-cudnn-frontend",
            "tokenspeed-mla==0.1",
            "flash_attn.cute",
        )
    ), packages
    engines = _engine_offenders("scripts/planted.py", strings)
    found = {o.split(" in ", 1)[1] for o in engines}
    assert found == {
        repr(t)
        for t in ("vllm serve", "sglang.srt.server_args", "vllm>=0.21", fmt, "vLLM ", OWN_ENGINE)
    }, engines
    # the allow-list is by file: a wrapper may import its own library, not another's
    assert _package_offenders(_own_wrapper(Backend.FLASH_ATTN), [(1, "flash_attn")]) == []
    assert _package_offenders(_own_wrapper(Backend.FLASH_ATTN), [(1, "flashinfer")])
    assert _engine_offenders("tools/engine_profiles/x.py", [(1, "vllm serve")]) == []
    assert _any_spelling("TORCH_SDPA").search(".swatch.b-torch-sdpa {}")


def test_the_docs_tables_are_generated_from_the_registry() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_docs_tables.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
