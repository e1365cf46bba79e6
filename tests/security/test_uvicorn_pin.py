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
