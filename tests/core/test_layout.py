"""The package layout holds: core at the bottom, nothing installed under generic names.

Reads every module's imports with ``ast`` (no import side effects): the core imports
nothing of ours but itself; kernels and the service stand on the core; the agent on
the core and the kernels, never on the service.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PARTS = {"core": "core", "kernels": "kernels", "service": "service", "agent": "agent"}
ALLOWED = {
    "core": {"core"},
    "kernels": {"core", "kernels"},
    "service": {"core", "service"},
    "agent": {"core", "kernels", "agent"},
}
# third-party packages the core may use: pydantic only (the wire schemas)
CORE_THIRD_PARTY = {"pydantic"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "mla_switchboard":  # from mla_switchboard import kernels
                names.update(f"mla_switchboard.{a.name}" for a in node.names)
            else:
                names.add(node.module)
    return names


@pytest.mark.parametrize("part", sorted(PARTS))
def test_import_graph(part: str) -> None:
    for path in sorted((ROOT / PARTS[part]).rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")
            if top[0] == "mla_switchboard":
                ours = top[1] if len(top) > 1 else ""
                assert ours in ALLOWED[part], f"{path.relative_to(ROOT)} imports {name}"
            else:
                assert top[0] not in {"service", "agent", "kernels", "bench"}, (
                    f"{path.relative_to(ROOT)} imports {name} by a generic top-level name"
                )
                if part == "core":
                    assert top[0] in CORE_THIRD_PARTY or top[0] in sys.stdlib_module_names, (
                        f"the core must stay neutral: {path.relative_to(ROOT)} imports {name}"
                    )


def test_no_generic_top_level_names_are_installed(tmp_path: Path) -> None:
    """From outside the checkout, only mla_switchboard.* is importable."""
    code = (
        "import importlib.util as u\n"
        "bad = [n for n in ('service', 'agent', 'kernels', 'core') if u.find_spec(n)]\n"
        "assert not bad, bad\n"
        "import mla_switchboard.core.evaluator, mla_switchboard.agent.cli\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
