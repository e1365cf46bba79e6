"""Write the docs' tables from the registries, or check that they are current.

The README's backend table (capability, dtypes, MLA dims, packages) is generated from
``core/specs.py``, so that a backend's facts are written in one place and the docs
cannot drift from what the service decides with. A table sits between two marker
comments in the Markdown:

    <!-- generated: backends (scripts/gen_docs_tables.py) -->
    ...
    <!-- end generated: backends -->

    python scripts/gen_docs_tables.py           # rewrite the tables in place
    python scripts/gen_docs_tables.py --check   # exit 1, naming the file, if one is stale

``tests/deploy/test_readme.py`` runs ``--check``.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from mla_switchboard.core.specs import SPECS, BackendSpec, Dtype, KernelPackage

ROOT = Path(__file__).resolve().parents[1]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _package(package: KernelPackage) -> str:
    """``flashinfer (flashinfer-python)``: the import name, and the wheel that installs it
    where its name differs by more than ``-``/``_``."""
    wheels = [d for d in package.distributions if _normal(d) != _normal(package.import_name)]
    return f"{package.import_name} ({wheels[0]})" if wheels else package.import_name


def _packages(spec: BackendSpec) -> str:
    text = ", ".join(_package(p) for p in spec.packages)
    if spec.optional_packages:
        used = ", ".join(_package(p) for p in spec.optional_packages)
        text += f"; uses {used} when installed"
    return text


def _capability(spec: BackendSpec) -> str:
    return spec.capability_text if spec.needs_gpu else f"{spec.capability_text}, also no GPU"


def backend_table() -> list[str]:
    """The backend table's Markdown lines, in the registry's order."""
    lines = [
        "| backend | capability | dtypes | MLA dims (qk_nope, qk_rope, v) | packages (wheel) |",
        "|---|---|---|---|---|",
    ]
    for backend, spec in SPECS.items():
        dtypes = ", ".join(d.value for d in Dtype if d in spec.dtypes)
        cells = [backend.value, _capability(spec), dtypes, spec.dims_text, _packages(spec)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


TABLES: dict[str, Callable[[], list[str]]] = {"backends": backend_table}
FILES = (ROOT / "README.md",)
BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)<!-- generated: (?P<name>\w+) \(scripts/gen_docs_tables\.py\) -->\n"
    r"(?P<body>.*?)"
    r"^(?P=indent)<!-- end generated: (?P=name) -->$",
    re.M | re.S,
)


def render(text: str) -> str:
    """``text`` with every generated block rewritten (indented like its markers)."""

    def block(match: re.Match[str]) -> str:
        indent, name = match["indent"], match["name"]
        body = "".join(f"{indent}{line}\n" for line in TABLES[name]())
        return (
            f"{indent}<!-- generated: {name} (scripts/gen_docs_tables.py) -->\n"
            f"{body}{indent}<!-- end generated: {name} -->"
        )

    return BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for path in FILES:
        text = path.read_text()
        if not BLOCK.search(text):
            print(f"{path.relative_to(ROOT)}: no generated table found", file=sys.stderr)
            return 1
        new = render(text)
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new)
    for path in stale:
        verb = "is stale; run python scripts/gen_docs_tables.py" if args.check else "rewritten"
        print(f"{path.relative_to(ROOT)} {verb}", file=sys.stderr if args.check else sys.stdout)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    raise SystemExit(main())
