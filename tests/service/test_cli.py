"""The `switchboard` command: first-start token, local token management, bad config."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import ROOT, free_port

TOKEN_RE = re.compile(r"sb_[0-9a-f]{12}_[A-Za-z0-9_-]+")


def env_for(db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env["SWITCHBOARD_DATABASE_URL"] = f"sqlite:///{db}"
    return env


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mla_switchboard.service.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_first_start_prints_an_admin_token_once(tmp_path: Path) -> None:
    env = env_for(tmp_path / "sb.db")
    port = free_port()
    log = tmp_path / "serve.log"

    def serve() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "mla_switchboard.service.cli", "serve", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )

    def wait_ready() -> None:
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError(log.read_text())

    proc = serve()
    try:
        wait_ready()
        tokens = TOKEN_RE.findall(log.read_text())
        assert len(tokens) == 1, log.read_text()
        headers = {"Authorization": f"Bearer {tokens[0]}"}
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/tokens",
            headers=headers,
            json={"name": "dash", "role": "viewer"},
        )
        assert r.status_code == 201
    finally:
        proc.terminate()
        proc.wait(20)
    proc = serve()  # second start: tokens exist, nothing printed
    try:
        wait_ready()
        assert TOKEN_RE.findall(log.read_text()) == []
    finally:
        proc.terminate()
        proc.wait(20)


def test_token_create_list_revoke_locally(tmp_path: Path) -> None:
    env = env_for(tmp_path / "sb.db")
    created = cli("token", "create", "--role", "viewer", "--name", "grafana", env=env)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert TOKEN_RE.fullmatch(token)
    listed = cli("token", "list", env=env).stdout
    assert "grafana\tviewer\t*\tactive" in listed
    assert token not in listed
    token_id = token.split("_")[1]
    assert cli("token", "revoke", token_id, env=env).returncode == 0
    assert "revoked" in cli("token", "list", env=env).stdout
    again = cli("token", "revoke", token_id, env=env)
    assert again.returncode == 1 and "no active token" in again.stderr
    bad = cli("token", "create", "--role", "root", env=env)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


def test_bad_database_url_is_a_clear_error(tmp_path: Path) -> None:
    env = env_for(tmp_path / "x.db")
    env["SWITCHBOARD_DATABASE_URL"] = "mysql://nope"
    r = cli("serve", "--port", str(free_port()), env=env)
    assert r.returncode == 2 and "unsupported database" in r.stderr
    env["SWITCHBOARD_DATABASE_URL"] = f"sqlite:///{tmp_path}/missing/dir/sb.db"
    r = cli("serve", "--port", str(free_port()), env=env)
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_service_does_not_import_torch() -> None:
    code = (
        "import sys, mla_switchboard.service.api.app, mla_switchboard.service.cli, "
        "mla_switchboard.core.evaluator, mla_switchboard.kernels;"
        "bad = [m for m in ('torch', 'flashinfer', 'cudnn', 'flash_attn') if m in sys.modules];"
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
