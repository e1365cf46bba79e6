"""The `switchboard` command: first-start token, local token management, bad config,
which database the token commands use, help texts, version, the container health check."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from mla_switchboard.core.names import validate_cluster_globs
from mla_switchboard.core.version import __version__

from tests.conftest import ROOT, free_port
from tests.inprocess import run_main
from tests.served import serving

TOKEN_RE = re.compile(r"sb_[0-9a-f]{12}_[A-Za-z0-9_-]+")


def env_for(db: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env["SWITCHBOARD_DATABASE_URL"] = f"sqlite:///{db}"
    return env


def cli(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``switchboard ARGS`` through the real entry point (the agent's dispatcher), run in
    this process (tests/inprocess.py): what it prints and returns, without a process
    start for each command."""
    from mla_switchboard.cli import main

    return run_main(main, args, env=env, cwd=cwd)


def real_cli(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``switchboard ARGS`` as its own process: each command family (``token``,
    ``health``, the dispatcher's ``--version``) keeps one test through it."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from mla_switchboard.cli import main; sys.exit(main())",
            *args,
        ],
        cwd=cwd,
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
        # the audit (the console's log) says `serve` made the first token, not `cli`
        log_items = httpx.get(f"http://127.0.0.1:{port}/v1/audit", headers=headers).json()
        first = [e for e in log_items["items"] if e["target"] == "initial-admin"]
        assert [e["actor"] for e in first] == ["serve"], first
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
    created = real_cli(
        "token", "create", "--create", "--role", "viewer", "--name", "grafana", env=env
    )
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert TOKEN_RE.fullmatch(token)
    listed = real_cli("token", "list", env=env).stdout
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


def test_a_second_serve_on_a_busy_port_creates_nothing(tmp_path: Path) -> None:
    """A service already listens on the port: a second ``serve`` (another directory,
    another database) says so and what to do before it creates a database or prints a
    token the running service would not know."""
    import socket

    db = tmp_path / "elsewhere" / "sb.db"
    db.parent.mkdir()
    with socket.socket() as running:
        running.bind(("127.0.0.1", 0))
        running.listen()
        port = running.getsockname()[1]
        r = cli("serve", "--port", str(port), env=env_for(db), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}: the address is already in use" in r.stderr
    assert "another port (--port or SWITCHBOARD_PORT)" in r.stderr
    assert f"http://127.0.0.1:{port}/" in r.stderr
    assert TOKEN_RE.findall(r.stdout + r.stderr) == []
    assert "Sign in" not in r.stderr
    assert not db.exists()
    assert list(db.parent.iterdir()) == []


def test_service_does_not_import_torch() -> None:
    code = (
        "import sys, mla_switchboard.service.api.app, mla_switchboard.service.cli, "
        "mla_switchboard.core.evaluator, mla_switchboard.kernels;"
        "bad = [m for m in ('torch', 'flashinfer', 'cudnn', 'flash_attn') if m in sys.modules];"
        "assert not bad, bad"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


# ------------------------------------------------ which database the token commands use


def test_token_commands_refuse_to_create_a_new_database(tmp_path: Path) -> None:
    """Run from another directory with no SWITCHBOARD_DATABASE_URL, `token create` used
    to create ./switchboard.db silently; its token then got 401 from the service."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = env_for(tmp_path / "unused.db")
    del env["SWITCHBOARD_DATABASE_URL"]
    for args in (["create", "--role", "admin"], ["list"], ["revoke", "0123456789ab"]):
        r = cli("token", *args, env=env, cwd=elsewhere)
        assert r.returncode == 2, (args, r.stderr)
        where = elsewhere / "switchboard.db"
        assert f"using database sqlite:///{where}" in r.stderr
        assert f"no database at {where}" in r.stderr
        # only `create` offers --create: it is the one subcommand that takes it
        assert ("--create" in r.stderr) == (args[0] == "create"), r.stderr
        assert r.stdout == ""
        assert list(elsewhere.iterdir()) == [], "nothing may be created"
    r = cli("token", "create", "--create", "--role", "admin", env=env, cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert TOKEN_RE.fullmatch(r.stdout.strip())  # stdout: the token only
    assert (elsewhere / "switchboard.db").is_file()
    assert cli("token", "list", env=env, cwd=elsewhere).returncode == 0  # exists now


def test_a_token_made_against_the_services_database_works(tmp_path: Path) -> None:
    """The database `serve` created is accepted without --create, and the token printed
    is one the running service honours."""
    db = tmp_path / "service.db"
    with serving(f"sqlite:///{db}") as service:
        r = cli("token", "create", "--role", "viewer", env=env_for(db), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert f"using database sqlite:///{db}" in r.stderr
        # the service reads new tokens within its config poll
        for _ in range(100):
            got = httpx.get(
                service.url + "/v1/selections/summary",
                headers={"Authorization": f"Bearer {r.stdout.strip()}"},
            )
            if got.status_code == 200:
                break
            time.sleep(0.1)
        assert got.status_code == 200, got.text


@pytest.mark.postgres
def test_token_commands_refuse_a_postgres_database_without_tables(
    tmp_path: Path, pg_url_factory: Callable[[], str]
) -> None:
    url = pg_url_factory()  # an empty schema: reachable, but no Switchboard tables
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env["SWITCHBOARD_DATABASE_URL"] = url
    r = cli("token", "list", env=env)
    assert r.returncode == 2
    assert "holds no Switchboard tables" in r.stderr and "--create" not in r.stderr
    r = cli("token", "create", "--role", "agent", env=env)
    assert r.returncode == 2
    assert "holds no Switchboard tables" in r.stderr and "--create" in r.stderr
    assert "using database postgresql+psycopg://postgres@127.0.0.1" in r.stderr
    created = cli("token", "create", "--create", "--role", "agent", env=env)
    assert created.returncode == 0, created.stderr
    assert "agent-token\tagent" in cli("token", "list", env=env).stdout


def test_token_commands_name_an_unreachable_database(tmp_path: Path) -> None:
    env = env_for(tmp_path / "x.db")
    env["SWITCHBOARD_DATABASE_URL"] = f"postgresql://postgres@127.0.0.1:{free_port()}/test"
    r = cli("token", "list", env=env)
    assert r.returncode == 2
    assert "cannot connect to postgresql://postgres@127.0.0.1" in r.stderr


# ------------------------------------------------------------------ cluster globs


def test_cluster_globs_follow_one_rule() -> None:
    assert validate_cluster_globs(["prod-*", "eu-west-1", "a?.b_c"]) == [
        "prod-*",
        "eu-west-1",
        "a?.b_c",
    ]
    for bad in (["Prod East"], ["prod east"], ["PROD"], [""], ["-"], ["?."], ["x" * 64], []):
        with pytest.raises(ValueError, match="clusters"):
            validate_cluster_globs(bad)


def test_token_create_refuses_cluster_globs_the_api_refuses(tmp_path: Path) -> None:
    env = env_for(tmp_path / "sb.db")
    for args, says in (
        (["--clusters", "Prod East"], "'Prod East' is not a cluster glob"),
        (["--clusters", "prod-*", "-"], "'-' is not a cluster glob"),
        (["--clusters"], "give at least one cluster glob"),
    ):
        r = cli("token", "create", "--create", "--role", "admin", *args, env=env)
        assert r.returncode == 2, r.stderr
        assert "argument --clusters:" in r.stderr and says in r.stderr
        assert not (tmp_path / "sb.db").exists()  # refused before touching the database
    ok = cli("token", "create", "--create", "--role", "admin", "--clusters", "prod-*", env=env)
    assert ok.returncode == 0, ok.stderr
    assert "\tadmin\tprod-*\tactive" in cli("token", "list", env=env).stdout


# ------------------------------------------------------------------- help, version


def test_help_texts_describe_each_command_and_its_environment(tmp_path: Path) -> None:
    env = env_for(tmp_path / "sb.db")
    serve = cli("serve", "--help", env=env)
    assert serve.returncode == 0
    for variable in (
        "SWITCHBOARD_DATABASE_URL",
        "SWITCHBOARD_ADMIN_TOKEN",
        "SWITCHBOARD_FLUSH_INTERVAL_S",
        "SWITCHBOARD_BUFFER_LIMIT",
        "SWITCHBOARD_BUFFER_LIMIT_MB",
        "SWITCHBOARD_SPILL_PATH",
        "SWITCHBOARD_SPILL_LIMIT_MB",
        "SWITCHBOARD_CONFIG_POLL_S",
        "SWITCHBOARD_MAX_BODY_BYTES",
        "SWITCHBOARD_HOST",
        "SWITCHBOARD_PORT",
    ):
        assert variable in serve.stdout, variable
    assert "Run the Switchboard service" in serve.stdout
    for sub in (["token"], ["token", "create"], ["token", "list"], ["token", "revoke"]):
        r = cli(*sub, "--help", env=env)
        assert r.returncode == 0
        assert "SWITCHBOARD_DATABASE_URL" in r.stdout, sub
    create = " ".join(cli("token", "create", "--help", env=env).stdout.split())
    assert "--create" in create
    # --clusters is every role's, the agent's included, not the admin's alone
    assert "admin token to these" not in create
    assert "any role: an agent token then selects and reports only for pods" in create
    top = cli("--help", env=env)
    for name in ("serve", "token", "health", "select", "bench"):
        assert name in top.stdout


def test_each_token_subcommand_takes_only_its_own_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--create`` (create the database) belongs to ``token create``: ``list`` and
    ``revoke`` refuse it as a usage error and never touch the database."""
    from mla_switchboard.service.cli import main

    monkeypatch.setenv("SWITCHBOARD_DATABASE_URL", f"sqlite:///{tmp_path / 'sb.db'}")
    for args in (["list", "--create"], ["revoke", "--create", "0123456789ab"]):
        with pytest.raises(SystemExit) as usage:
            main(["token", *args])
        assert usage.value.code == 2, args
        assert "unrecognized arguments: --create" in capsys.readouterr().err
        assert not (tmp_path / "sb.db").exists()
    for sub, takes_it in (("create", True), ("list", False), ("revoke", False)):
        with pytest.raises(SystemExit):
            main(["token", sub, "--help"])
        assert ("--create" in capsys.readouterr().out) == takes_it, sub


def test_every_setting_is_described() -> None:
    """``serve --help`` lists every setting with what it does, from its Field's
    description: a setting added without one fails here."""
    from mla_switchboard.service.cli import _environment_help
    from mla_switchboard.service.config import Settings

    undescribed = [
        name
        for name, field in Settings.model_fields.items()
        if not (field.description and len(field.description.split()) >= 3)
    ]
    assert undescribed == []
    help_text = " ".join(_environment_help().split())
    for name, field in Settings.model_fields.items():
        assert f"SWITCHBOARD_{name.upper()} {' '.join(field.description.split())}" in help_text
    assert "pods reported it failing" in help_text  # SWITCHBOARD_FAILURE_MIN_PODS


def test_one_version_everywhere(tmp_path: Path) -> None:
    """`switchboard --version`, the OpenAPI document and the package metadata agree."""
    assert __version__ != "0+unknown"
    r = real_cli("--version", env=env_for(tmp_path / "sb.db"))
    assert r.returncode == 0 and r.stdout.strip() == f"switchboard {__version__}"
    from mla_switchboard.service.api.app import create_app
    from mla_switchboard.service.config import Settings

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'sb.db'}"))
    assert app.openapi()["info"]["version"] == __version__


# ---------------------------------------------------- SWITCHBOARD_PORT and health


def test_health_says_in_words_what_failed(tmp_path: Path) -> None:
    """Nothing listens: "connection refused at URL: is the service running", never
    urllib's ``<urlopen error [Errno 111] ...>``."""
    port = free_port()
    r = cli("health", "--port", str(port), env=env_for(tmp_path / "sb.db"))
    assert r.returncode == 1
    assert f"connection refused at http://127.0.0.1:{port}/readyz" in r.stderr
    assert "is the service running" in r.stderr and "urlopen" not in r.stderr
    r = cli("health", "--host", "no-such-host.invalid", env=env_for(tmp_path / "sb.db"))
    assert r.returncode == 1 and "cannot find the host 'no-such-host.invalid'" in r.stderr


def test_serve_and_health_follow_switchboard_port(tmp_path: Path) -> None:
    """The container sets SWITCHBOARD_PORT once; `serve` listens there and `health`
    (its HEALTHCHECK) asks there, so changing the port cannot break the check."""
    env = env_for(tmp_path / "sb.db")
    port = free_port()
    env["SWITCHBOARD_PORT"] = str(port)
    env["SWITCHBOARD_ADMIN_TOKEN"] = "t" * 24
    assert cli("health", env=env).returncode == 1  # nothing listens yet
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mla_switchboard.service.cli", "serve"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        for _ in range(300):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        ok = real_cli("health", env=env)
        assert ok.returncode == 0, ok.stderr
        # as the image's HEALTHCHECK runs it: through the module, without the agent
        module = subprocess.run(
            [sys.executable, "-m", "mla_switchboard.service.cli", "health"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert module.returncode == 0, module.stderr
    finally:
        proc.terminate()
        proc.wait(20)
    env["SWITCHBOARD_PORT"] = "eighty"
    for command in ("serve", "health"):
        r = cli(command, env=env)
        assert r.returncode == 2 and "'eighty' is not a port" in r.stderr
        assert "SWITCHBOARD_PORT" in r.stderr
