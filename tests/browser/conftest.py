"""The browser tests' servers: uvicorn in a thread of the test process (tests/served.py),
a fresh service on a fresh store for each test that asks, so the app's import is paid
once per session instead of once per test. A test that needs the process itself (a
signal, a replica's environment) starts a ``ServiceProcess`` as before."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.served import ThreadServer, thread_servers


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Callable[..., ThreadServer]]:
    """Starts servers for this test (``served(**settings)``; each on a SQLite file of its
    own unless given ``database_url``); all stopped after it, also when a start fails."""
    with thread_servers(tmp_path) as make:
        yield make


@pytest.fixture
def service(served: Callable[..., ThreadServer]) -> ThreadServer:
    """One fresh server for this test, with the default settings."""
    return served()
