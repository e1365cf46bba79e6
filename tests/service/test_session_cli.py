"""``switchboard session list|revoke`` at the service's database: what an admin sees of
the signed-in people (never a token) and ending a session or a person's sessions."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from mla_switchboard.service.config import RoleMapping
from mla_switchboard.service.identity.oidc import Person
from mla_switchboard.service.identity.people import People
from mla_switchboard.service.store.db import make_engine, migrate
from mla_switchboard.service.store.sessions import SessionStore

from tests.inprocess import run_main


def _env(url: str) -> dict[str, str]:
    env = {**os.environ, "SWITCHBOARD_DATABASE_URL": url}
    env.pop("SWITCHBOARD_ADMIN_TOKEN", None)
    mapping = '[{"group": "ops", "role": "admin", "clusters": ["*"]}]'
    env["SWITCHBOARD_OIDC_ROLE_MAPPING"] = mapping
    return env


def _real_cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``switchboard session ARGS`` as its own process (the first listing below)."""
    return subprocess.run(
        [sys.executable, "-m", "mla_switchboard.service.cli", "session", *args],
        env=_env(url),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The same command through ``main`` in this process (tests/inprocess.py)."""
    from mla_switchboard.service.cli import main

    return run_main(main, ["session", *args], env=_env(url), cwd=Path.cwd())


def test_list_and_revoke_sessions(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sb.db'}"
    engine = make_engine(url)
    migrate(engine)
    people = People(
        SessionStore(engine),
        [RoleMapping(group="ops", role="viewer", clusters=["prod-*"])],
        timedelta(hours=8),
    )
    for sub in ("ann-sub", "ben-sub"):
        made = people.sign_in(Person(sub, f"{sub}@x.io", ("ops",), refresh_token="rt-secret"))
        assert isinstance(made, tuple)
    engine.dispose()

    listed = _real_cli(url, "list")
    assert listed.returncode == 0, listed.stderr
    rows = [line.split("\t") for line in listed.stdout.splitlines()]
    assert sorted(r[1] for r in rows) == ["ann-sub", "ben-sub"]
    # the mapping in force now (admin), not the one of sign-in (viewer)
    assert all(r[3] == "admin" and r[5] == "ops" for r in rows), rows
    assert "rt-secret" not in listed.stdout + listed.stderr

    ann = next(r[0] for r in rows if r[1] == "ann-sub")
    assert _cli(url, "revoke", ann).returncode == 0
    assert _cli(url, "revoke", ann).returncode == 1  # gone already
    bad = _cli(url, "revoke", "not-an-id")
    assert bad.returncode == 2 and "not a session id" in bad.stderr
    assert _cli(url, "revoke", "--subject", "ben-sub").returncode == 0
    assert _cli(url, "list").stdout == ""
