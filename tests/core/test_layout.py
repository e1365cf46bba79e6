"""The package layout holds: core at the bottom, nothing installed under generic names.

Reads every module's imports with ``ast`` (no import side effects): the core imports
nothing of ours but itself; kernels and the service stand on the core; the agent on
the core and the kernels, never on the service; the ``switchboard`` program
(``cli/``) above the agent and the service, and nothing on it. An import counts
however it is written: an ``import`` statement, absolute or relative (``from ..service
import cli`` in ``agent/`` is resolved against the module's package, as Python does),
``importlib.import_module`` (or ``__import__``, ``find_spec``, ``run_module``) with a
name, or any string that names one of our modules (``python -m
mla_switchboard.service.cli`` in an argv), so a dependency cannot hide in a string.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = {"core": "core", "kernels": "kernels", "service": "service", "agent": "agent", "cli": "cli"}
ALLOWED = {
    "core": {"core"},
    "kernels": {"core", "kernels"},
    "service": {"core", "service"},
    "agent": {"core", "kernels", "agent"},
    "cli": {"core", "agent", "service", "cli"},
}
GENERIC_NAMES = {"service", "agent", "kernels", "bench", "core", "cli"}
# third-party packages the core may use: pydantic (the wire schemas) and
# sortedcontainers (the evidence's sorted TFLOP/s; pure Python, a GPU pod takes it)
CORE_THIRD_PARTY = {"pydantic", "sortedcontainers"}
# (part, other part) -> why a string in the part may name the other's modules
STRING_ONLY = {
    ("core", "kernels"): "BackendSpec.class_path names the wrapper; kernels.get imports it",
}
IMPORT_CALLS = {"import_module", "__import__", "find_spec", "run_module", "import_quietly"}
OUR_MODULE = re.compile(r"\bmla_switchboard\.(\w+)")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "text"``: what ``import_module(NAME)`` imports."""
    found = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return found


def module_name(path: Path) -> str:
    """The dotted name a file under ROOT is imported as (``agent/x.py`` ->
    ``mla_switchboard.agent.x``; a package's ``__init__.py`` -> the package), through
    pyproject's package-dir mapping of each part's folder."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["mla_switchboard", *parts])


def _package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def _from_import(node: ast.ImportFrom, package: str) -> set[str]:
    """The modules ``from X import a, b`` makes the importing module depend on: X
    itself and, where X is a package of ours, ``X.a`` (``a`` may be a submodule).
    A relative X is resolved against ``package``, the importing module's package."""
    if node.level:
        base = package.split(".")
        if node.level > len(base):
            raise AssertionError(f"relative import beyond the top level in {package}")
        base = base[: len(base) - node.level + 1]
        target = ".".join([*base, *([node.module] if node.module else [])])
    else:
        target = node.module or ""
    if target == "mla_switchboard":  # from mla_switchboard import kernels, from .. import x
        return {f"{target}.{a.name}" for a in node.names}
    found = {target}
    if target.startswith("mla_switchboard."):
        found |= {f"{target}.{a.name}" for a in node.names if a.name != "*"}
    return found


def _references(
    source: str, filename: str = "<source>", module: str = "mla_switchboard.x"
) -> tuple[set[str], set[str]]:
    """(modules imported, modules of ours only named in a string) by ``source``, the
    module ``module`` (the name relative imports are resolved against)."""
    tree = ast.parse(source, filename=filename)
    package = _package_of(module, filename.endswith("__init__.py"))
    docstrings = _docstrings(tree)
    constants = _constants(tree)
    imported: set[str] = set()
    named: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.update(_from_import(node, package))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            arg = node.args[0]
            if name in IMPORT_CALLS:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    imported.add(arg.value)
                elif isinstance(arg, ast.Name) and arg.id in constants:
                    imported.add(constants[arg.id])
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            named.update(f"mla_switchboard.{m}" for m in OUR_MODULE.findall(node.value))
    return imported, named - imported


def _check(part: str, rel: str, imported: set[str], named: set[str]) -> None:
    for name in imported | named:
        top = name.split(".")
        if top[0] == "mla_switchboard":
            ours = top[1] if len(top) > 1 else ""
            if name in named and (part, ours) in STRING_ONLY:
                continue
            how = "names in a string" if name in named else "imports"
            assert ours in ALLOWED[part], f"{rel} {how} {name}"
        else:
            assert top[0] not in GENERIC_NAMES, f"{rel} imports {name} by a generic top-level name"
            if part == "core":
                assert top[0] in CORE_THIRD_PARTY or top[0] in sys.stdlib_module_names, (
                    f"the core must stay neutral: {rel} imports {name}"
                )


@pytest.mark.parametrize("part", sorted(PARTS))
def test_import_graph(part: str) -> None:
    for path in sorted((ROOT / PARTS[part]).rglob("*.py")):
        imported, named = _references(path.read_text(), str(path), module_name(path))
        _check(part, str(path.relative_to(ROOT)), imported, named)


def test_nothing_imports_the_switchboard_program() -> None:
    """``cli/`` dispatches to the parts; a part that imported it would depend upward."""
    assert all("cli" not in allowed for part, allowed in ALLOWED.items() if part != "cli")


@pytest.mark.parametrize(
    "source",
    [
        "import mla_switchboard.service.cli",
        "from mla_switchboard.service import cli",
        "import importlib\nimportlib.import_module('mla_switchboard.service.cli')",
        "from importlib import import_module\nimport_module('mla_switchboard.service.cli')",
        "import importlib\nNAME = 'mla_switchboard.service.cli'\nimportlib.import_module(NAME)",
        "__import__('mla_switchboard.service')",
        "ARGV = ['python', '-m', 'mla_switchboard.service.cli', 'serve']",
        "import importlib.util\nimportlib.util.find_spec('mla_switchboard.service.api')",
    ],
)
def test_the_check_sees_the_service_however_the_agent_names_it(source: str) -> None:
    imported, named = _references(textwrap.dedent(source))
    with pytest.raises(AssertionError, match=r"mla_switchboard\.service"):
        _check("agent", "agent/x.py", imported, named)


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("from ..service import cli", "mla_switchboard.agent.x"),
        ("from .. import service", "mla_switchboard.agent.x"),
        ("from ...service.api import routes", "mla_switchboard.agent.commands.select"),
        ("from ...service.cli import main", "mla_switchboard.agent.commands"),
    ],
)
def test_the_check_sees_relative_imports_of_the_service(source: str, module: str) -> None:
    """A relative import is resolved against the importing module's package, so
    ``from ..service import cli`` in ``agent/`` is the service, as Python sees it.
    (The last module is a package's ``__init__``, whose package is itself: ``...`` is
    the top there.)"""
    filename = "agent/commands/__init__.py" if module.endswith("commands") else "agent/x.py"
    imported, named = _references(source, filename, module)
    with pytest.raises(AssertionError, match=r"mla_switchboard\.service"):
        _check("agent", filename, imported, named)


def test_relative_imports_inside_a_part_pass() -> None:
    imported, named = _references(
        "from . import notes\nfrom .commands import parsing\nfrom ..core import specs\n",
        "agent/x.py",
        "mla_switchboard.agent.x",
    )
    assert imported >= {
        "mla_switchboard.agent.notes",
        "mla_switchboard.agent.commands",
        "mla_switchboard.core",
        "mla_switchboard.core.specs",
    }
    _check("agent", "agent/x.py", imported, named)


def test_module_names_follow_the_package_dir_mapping() -> None:
    assert module_name(ROOT / "agent" / "engine.py") == "mla_switchboard.agent.engine"
    assert module_name(ROOT / "agent" / "commands" / "__init__.py") == (
        "mla_switchboard.agent.commands"
    )


def test_a_docstring_may_mention_a_module() -> None:
    imported, named = _references('"""Run by ``mla_switchboard.cli``."""\n')
    assert (imported, named) == (set(), set())


def test_no_generic_top_level_names_are_installed(tmp_path: Path) -> None:
    """From outside the checkout, only mla_switchboard.* is importable."""
    code = (
        "import importlib.util as u\n"
        f"bad = [n for n in {sorted(GENERIC_NAMES - {'bench'})!r} if u.find_spec(n)]\n"
        "assert not bad, bad\n"
        "import mla_switchboard.core.evaluator, mla_switchboard.cli\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_package_folder_is_in_the_wheel() -> None:
    """pyproject lists the packages the wheel (and so the image) carries, one by one: a
    new folder of modules that is not listed imports in an editable
    checkout and is missing from every installed copy."""
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {  # every folder holding Python modules, with an __init__.py or without
        module_name(py.parent / "__init__.py")
        for part in PARTS.values()
        for py in (ROOT / part).rglob("*.py")
    }
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
    assert listed - found == set(), f"listed but not found: {sorted(listed - found)}"


def _service_graph() -> dict[str, set[str]]:
    """Each service module and the service modules it imports, however it imports
    them (``TYPE_CHECKING`` blocks too: a cycle kept alive by type hints is still
    one module that cannot be understood, or tested, without the other)."""
    paths = sorted((ROOT / PARTS["service"]).rglob("*.py"))
    modules = {module_name(p): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported, _named = _references(path.read_text(), str(path), name)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's), each
    sorted: every import cycle is inside one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_in_the_service() -> None:
    assert _cycles(_service_graph()) == []


def test_the_cycle_check_sees_a_type_checking_cycle() -> None:
    a, _ = _references(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from mla_switchboard.service.b import B\n",
        "service/a.py",
        "mla_switchboard.service.a",
    )
    b, _ = _references(
        "from mla_switchboard.service import a\n", "service/b.py", "mla_switchboard.service.b"
    )
    known = {"mla_switchboard.service.a", "mla_switchboard.service.b"}
    graph = {
        "mla_switchboard.service.a": a & known,
        "mla_switchboard.service.b": b & known,
    }
    assert _cycles(graph) == [sorted(known)]


def _part_of(module: str) -> str:
    """What a service module counts as in the graph of the service's parts: its
    sub-package (``service.store.decisions`` -> ``service.store``), or the module
    itself when it sits at the top (``service.selector``)."""
    return ".".join(module.split(".")[:3])


def _part_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with each sub-package folded into one node: two sub-packages
    that import each other, through modules that do not, are still two parts that
    cannot be understood (or moved) one without the other."""
    parts: dict[str, set[str]] = {}
    for module, imported in graph.items():
        node = _part_of(module)
        parts.setdefault(node, set()).update(_part_of(m) for m in imported if _part_of(m) != node)
    return parts


def _described(cycle: list[str], graph: dict[str, set[str]]) -> str:
    """A cycle of parts, with the module imports that make each of its arrows."""
    members = set(cycle)
    arrows = sorted(
        f"{module} -> {m}"
        for module, imported in graph.items()
        for m in imported
        if _part_of(module) in members
        and _part_of(m) in members
        and _part_of(m) != _part_of(module)
    )
    return " <-> ".join(cycle) + ":\n  " + "\n  ".join(arrows)


def test_no_import_cycle_between_the_service_parts() -> None:
    """Sub-packages and top-level modules of the service form layers: arrows between
    them point one way (what two parts share goes into the lower one)."""
    graph = _service_graph()
    cycles = _cycles(_part_graph(graph))
    assert cycles == [], "\n".join(_described(c, graph) for c in cycles)


def test_the_part_check_sees_a_cycle_the_module_check_does_not() -> None:
    """``store.decisions`` imports ``fleet.shapes`` and ``fleet.groups`` imports
    ``store.decisions``: no module imports itself back, but the two sub-packages do."""
    graph = {
        "mla_switchboard.service.store.decisions": {"mla_switchboard.service.fleet.shapes"},
        "mla_switchboard.service.fleet.shapes": set(),
        "mla_switchboard.service.fleet.groups": {"mla_switchboard.service.store.decisions"},
        "mla_switchboard.service.selector": {"mla_switchboard.service.fleet.shapes"},
    }
    assert _cycles(graph) == []
    cycles = _cycles(_part_graph(graph))
    assert cycles == [["mla_switchboard.service.fleet", "mla_switchboard.service.store"]]
    described = _described(cycles[0], graph)
    assert "service.store.decisions -> mla_switchboard.service.fleet.shapes" in described
    assert "service.fleet.groups -> mla_switchboard.service.store.decisions" in described
    assert "selector" not in described  # an arrow into the cycle is not part of it


MIGRATIONS = ROOT / PARTS["service"] / "migrations"
MIGRATION_THIRD_PARTY = {"alembic", "sqlalchemy"}


def _migration_problems(rel: str, imported: set[str], named: set[str]) -> list[str]:
    """What a migration (or the migrations' environment) takes from outside its own
    package: a migration runs years after it was written, so what it does must not
    move when the live code does; it copies what it needs, frozen."""
    own = module_name(MIGRATIONS / "__init__.py")
    problems = []
    for name in sorted(imported | named):
        top = name.split(".")[0]
        if name == own or name.startswith(own + "."):
            continue
        if top == "mla_switchboard" or not (
            top in MIGRATION_THIRD_PARTY or top in sys.stdlib_module_names
        ):
            problems.append(f"{rel} imports {name}")
    return problems


def test_migrations_import_nothing_of_the_live_code() -> None:
    problems = []
    for path in sorted(MIGRATIONS.rglob("*.py")):
        imported, named = _references(path.read_text(), str(path), module_name(path))
        problems += _migration_problems(str(path.relative_to(ROOT)), imported, named)
    assert problems == []


@pytest.mark.parametrize(
    ("source", "allowed"),
    [
        ("import sqlalchemy as sa\nfrom alembic import op\nimport json", True),
        ("from mla_switchboard.service.migrations import columns", True),
        ("from mla_switchboard.service.store.shapes import shape_of_json", False),
        ("from mla_switchboard.core.stages import stage_bucket", False),
        ("from ...store.models import Base", False),
        ("import pydantic", False),
    ],
)
def test_the_migration_check_sees_live_imports(source: str, allowed: bool) -> None:
    module = "mla_switchboard.service.migrations.versions.0099_x"
    imported, named = _references(source, "service/migrations/versions/0099_x.py", module)
    assert (_migration_problems("0099_x.py", imported, named) == []) is allowed


MOST_CLASS_LINES = 400
"""A class longer than this holds more than one responsibility: split it by what it
holds, not by trimming lines."""


def _long_classes(source: str, path: str) -> list[str]:
    return [
        f"{path}: {node.name} is {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MOST_CLASS_LINES
    ]


def test_no_class_is_over_400_lines() -> None:
    long = [
        found
        for part in PARTS.values()
        for path in sorted((ROOT / part).rglob("*.py"))
        for found in _long_classes(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not long, long


def test_the_size_check_sees_a_long_class() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MOST_CLASS_LINES))
    assert _long_classes(f"class Big:\n{body}\n", "big.py") == ["big.py: Big is 401 lines"]
