"""What service/api/uvicorn_guard.py takes from uvicorn's private httptools protocol,
pinned: a uvicorn upgrade fails here, naming what to re-check, before it silently
unguards the server (a renamed callback would simply never be called).

To accept a new uvicorn: read its ``uvicorn/protocols/http/httptools_impl.py`` against
the guard (which callbacks httptools calls and when, where ``cycle`` is made and
completed, what ``connection_lost`` does), run tests/security/test_connection_limits.py
and tests/security/test_hot_path.py, then widen ``CHECKED`` here and the uvicorn bound
in pyproject.toml and .ci/constraints.txt together.
"""

from __future__ import annotations

import ast
import inspect
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.version import Version

pytest.importorskip("httptools")

from uvicorn.protocols.http import httptools_impl

# the uvicorn versions the guard was read against: [first, beyond)
CHECKED = (Version("0.54.0"), Version("0.55"))
ROOT = Path(__file__).resolve().parents[2]
RECHECK = (
    "service/api/uvicorn_guard.py subclasses uvicorn's private HttpToolsProtocol and was "
    f"checked against uvicorn >={CHECKED[0]},<{CHECKED[1]}; re-check it as this file's "
    "docstring says"
)

# overridden, called by httptools' parser (on_*) or asyncio, with these parameters
OVERRIDDEN = {
    "connection_made": ["self", "transport"],
    "connection_lost": ["self", "exc"],
    "data_received": ["self", "data"],
    "on_headers_complete": ["self"],
    "on_message_complete": ["self"],
    "on_response_complete": ["self"],
}
# read by the guard: on the protocol, on its request cycle, on its flow control
PROTOCOL_ATTRIBUTES = ("self.loop = ", "self.transport = ", "self.flow = ", "self.cycle = ")
CYCLE_ATTRIBUTES = ("self.response_started = ", "self.response_complete = ")


GUARD = ROOT / "service" / "api" / "uvicorn_guard.py"
GUARD_MAX_LINES = 120
# what the guard reads through ``self`` that uvicorn's protocol sets, and what it reads on
# uvicorn's own objects among them (``loop`` and ``transport`` are asyncio's); every name
# here is checked against uvicorn below
INHERITED = {"cycle", "flow", "loop", "transport"}
READ_ON = {"cycle": {"response_complete", "response_started"}, "flow": {"pause_reading"}}
# uvicorn modules the package may import outside the guard: the server itself and the
# logging configuration it documents for ``log_config``; never its protocols
PUBLIC_UVICORN = {"uvicorn", "uvicorn.config"}
PACKAGE_DIRS = ("core", "service", "agent", "kernels", "cli")


def test_the_guard_is_one_small_module_and_the_only_one_touching_uvicorn_insides() -> None:
    lines = len(GUARD.read_text().splitlines())
    assert lines <= GUARD_MAX_LINES, f"{GUARD.name}: {lines} lines, over {GUARD_MAX_LINES}"
    touching = set()
    for path in (p for d in PACKAGE_DIRS for p in (ROOT / d).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.startswith("uvicorn.") and n not in PUBLIC_UVICORN for n in names):
                touching.add(path.relative_to(ROOT).as_posix())
    assert touching == {"service/api/uvicorn_guard.py"}, touching


def test_the_pin_names_everything_the_guard_reads_of_uvicorn() -> None:
    """A new private attribute read by the guard fails here until this file pins it."""
    tree = ast.parse(GUARD.read_text())
    (guard,) = (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GuardedProtocol")
    own = {n.name for n in guard.body if isinstance(n, ast.FunctionDef)}
    own |= {t.target.id for t in guard.body if isinstance(t, ast.AnnAssign)}
    own |= {t.id for a in guard.body if isinstance(a, ast.Assign) for t in a.targets}
    on_self: set[str] = set()
    read_on: dict[str, set[str]] = {}
    supers: set[str] = set()
    for node in ast.walk(guard):
        if not isinstance(node, ast.Attribute):
            continue
        target = node.value
        if isinstance(target, ast.Name) and target.id == "self":
            on_self.add(node.attr)
        elif isinstance(target, ast.Attribute) and getattr(target.value, "id", None) == "self":
            read_on.setdefault(target.attr, set()).add(node.attr)
        elif isinstance(target, ast.Call) and getattr(target.func, "id", None) == "super":
            supers.add(node.attr)
    assert on_self - own == INHERITED, f"the guard reads {on_self - own}: {RECHECK}"
    assert {k: v for k, v in read_on.items() if k in READ_ON} == READ_ON, RECHECK
    assert supers <= set(OVERRIDDEN), f"the guard calls uvicorn's {supers}: {RECHECK}"


def test_uvicorn_is_a_checked_version() -> None:
    installed = Version(version("uvicorn"))
    assert CHECKED[0] <= installed < CHECKED[1], f"uvicorn {installed}: {RECHECK}"


def test_pyproject_pins_the_checked_versions() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    want = f"uvicorn[standard]>={CHECKED[0]},<{CHECKED[1]}"
    assert want in pyproject, f"pyproject.toml must require {want}: {RECHECK}"
    constraint = re.search(r"^uvicorn==(\S+)$", (ROOT / ".ci/constraints.txt").read_text(), re.M)
    assert constraint is not None and CHECKED[0] <= Version(constraint[1]) < CHECKED[1]


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_the_overridden_methods_are_still_there(name: str) -> None:
    method = getattr(httptools_impl.HttpToolsProtocol, name, None)
    assert method is not None, f"HttpToolsProtocol.{name} is gone: {RECHECK}"
    params = list(inspect.signature(method).parameters)
    assert params == OVERRIDDEN[name], f"HttpToolsProtocol.{name}{params}: {RECHECK}"


def test_the_attributes_the_guard_reads_are_still_set() -> None:
    protocol = inspect.getsource(httptools_impl.HttpToolsProtocol)
    cycle = inspect.getsource(httptools_impl.RequestResponseCycle.__init__)
    for attribute in PROTOCOL_ATTRIBUTES:
        assert attribute in protocol, f"HttpToolsProtocol no longer sets {attribute}: {RECHECK}"
    for attribute in CYCLE_ATTRIBUTES:
        assert attribute in cycle, f"RequestResponseCycle no longer sets {attribute}: {RECHECK}"
    assert callable(getattr(httptools_impl.FlowControl, "pause_reading", None)), RECHECK


def test_a_complete_response_still_wakes_the_route_and_closes_without_keep_alive() -> None:
    """What the guard and the body deadline lean on when they close a connection: uvicorn
    marks the cycle disconnected and wakes the route's read in ``connection_lost``, and
    closes after an answer that says ``connection: close``."""
    lost = inspect.getsource(httptools_impl.HttpToolsProtocol.connection_lost)
    assert "disconnected = True" in lost and "message_event.set()" in lost, RECHECK
    send = inspect.getsource(httptools_impl.RequestResponseCycle.send)
    assert 'b"close" in connection' in send and "self.keep_alive = False" in send, RECHECK
