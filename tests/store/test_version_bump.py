"""``evidence_version`` moves once for a group of concurrent reports, and every report's
answer comes after a bump that began after its own commit."""

from __future__ import annotations

import threading

from mla_switchboard.service.store import Store
from mla_switchboard.service.store.version_bump import GroupBump
from sqlalchemy import event
from sqlalchemy.exc import OperationalError


def test_each_write_returns_after_a_bump_begun_after_it(store: Store) -> None:
    bump = GroupBump(store.engine, "evidence_version")
    for _ in range(3):
        before = store.config.versions()["evidence_version"]
        bump.after_commit()
        assert store.config.versions()["evidence_version"] > before


def test_concurrent_writes_share_bumps(store: Store) -> None:
    bump = GroupBump(store.engine, "evidence_version")
    before = store.config.versions()["evidence_version"]
    start = threading.Barrier(16)
    seen: list[int] = []

    def write() -> None:
        start.wait()
        bump.after_commit()
        seen.append(store.config.versions()["evidence_version"])

    threads = [threading.Thread(target=write) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(seen) == 16 and min(seen) > before  # every one found the version moved
    after = store.config.versions()["evidence_version"]
    assert after - before == bump.bumps <= 16


def test_a_refused_bump_is_tried_again(store: Store) -> None:
    """A bump the database refuses once (a dropped connection) is tried again, so the
    write still returns after a stored bump; one refused every time is given up."""
    bump = GroupBump(store.engine, "evidence_version")
    refusals = [1]

    def refuse(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        if statement.lstrip().upper().startswith("UPDATE META") and refusals[0] > 0:
            refusals[0] -= 1
            raise OperationalError(statement, {}, Exception("connection dropped"))

    event.listen(store.engine, "before_cursor_execute", refuse)
    try:
        before = store.config.versions()["evidence_version"]
        bump.after_commit()
        assert store.config.versions()["evidence_version"] == before + 1
        refusals[0] = 10
        bump.after_commit()  # refused three times: given up, logged
        assert refusals[0] == 7
        assert store.config.versions()["evidence_version"] == before + 1
    finally:
        event.remove(store.engine, "before_cursor_execute", refuse)
