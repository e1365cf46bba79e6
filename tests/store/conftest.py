"""Fixtures of the store tests: every test runs on a fresh SQLite file and on a fresh
PostgreSQL schema; several engines on one database stand for several replicas."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.service.store import Store
from mla_switchboard.service.store.db import make_engine, migrate
from sqlalchemy import Engine

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    factory: Callable[[], str] = request.getfixturevalue("pg_url_factory")
    return factory()


@pytest.fixture
def engines(db_url: str) -> Iterator[Callable[[], Engine]]:
    """Engines on the test's database (one per simulated replica), disposed after."""
    made: list[Engine] = []

    def make() -> Engine:
        made.append(make_engine(db_url))
        return made[-1]

    yield make
    for engine in made:
        engine.dispose()


@pytest.fixture
def store(engines: Callable[[], Engine]) -> Store:
    engine = engines()
    migrate(engine)
    s = Store(engine)
    s.config.ensure_seeded()
    return s


def run_together(n: int, work: Callable[[int], Any]) -> list[Any]:
    """Run ``work(i)`` in n threads released at once; re-raise the first error."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(10)
            results[i] = work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results
