"""The database password is never printed, logged or answered (service/messages.py).

``switchboard serve`` with an unreachable PostgreSQL printed the whole URL, password
included, on stderr at every restart of a crash loop (``switchboard token`` masked it).
Every way out is tried here with a URL holding a recognisable password: ``serve`` at
start and on each restart, ``switchboard token list``, ``create`` and ``revoke``,
``/readyz``, ``/metrics`` and the 503 of an admin write from a service whose database
went away, the service's log, and what Python prints by itself in a serving process
(an uncaught exception in a thread, in the main thread, in a ``__del__``, a task's
exception nobody retrieved); the password must appear nowhere.
"""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from mla_switchboard.service.messages import (
    MASK,
    first_line,
    install_log_redaction,
    protect,
    redact,
    shown_url,
)

from tests.conftest import ADMIN, ROOT, ServiceProcess, free_port
from tests.inprocess import run_main
from tests.spill_paths import default_spill_path

PASSWORD = "Sb-pw-7Qx4Zr9Lm2"
R1 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}


def _env(url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    spill = default_spill_path(url)
    if spill is not None:
        env["SWITCHBOARD_SPILL_PATH"] = spill
    return {**env, "SWITCHBOARD_DATABASE_URL": url, "PYTHONUNBUFFERED": "1", **extra}


def _switchboard(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``switchboard ARGS`` as its own process: what a crash loop's supervisor collects."""
    return subprocess.run(
        [sys.executable, "-m", "mla_switchboard.service.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _in_process(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``switchboard ARGS`` through the same ``main``, run in this process with none of
    its registered secrets or log set-up (tests/inprocess.py): what it prints and
    returns, without a process start."""
    from mla_switchboard.service.cli import main

    return run_main(main, args, env=env, cwd=ROOT)


def _assert_hidden(text: str, where: str, password: str = PASSWORD) -> None:
    for form in {password, quote(password, safe="")}:
        assert form not in text, f"{where} shows the password:\n{text[-2000:]}"


# ------------------------------------------------------------ the command line


PLAIN = f"postgresql+psycopg://switchboard:{PASSWORD}@127.0.0.1:{{port}}/switchboard"


@pytest.mark.parametrize(
    "url",
    [
        PLAIN,
        f"postgresql://switchboard:{quote('@' + PASSWORD, safe='')}@127.0.0.1:{{port}}/sb",
        f"postgresql+psycopg://switchboard@127.0.0.1:{{port}}/sb?password={PASSWORD}",
        f"postgresql+psycopg://switchboard:{PASSWORD}@127.0.0.1:notaport/sb",
        f"postgresql+nosuchdriver://switchboard:{PASSWORD}@127.0.0.1:{{port}}/sb",
    ],
    ids=["plain", "percent-encoded", "query", "unparseable", "unknown-driver"],
)
def test_serve_and_token_never_print_the_password(url: str) -> None:
    """The plain URL's commands run as processes (what the interpreter itself prints
    counts too); the other forms of the password go through the same ``main`` in this
    process."""
    real = url == PLAIN
    url = url.format(port=free_port())  # nothing listens there: a database that is down
    env = _env(url)
    starts = 3 if "nosuchdriver" not in url and "notaport" not in url else 1
    tokens = (
        ["token", "list"],
        ["token", "create", "--role", "agent"],
        ["token", "revoke", "0123456789ab"],
    )
    # a crash loop's starts (each says why, none the password) and the token commands;
    # processes two at a time: each is a process start that mostly waits for its imports
    commands = [["serve", "--port", str(free_port())] for _ in range(starts)] + list(tokens)
    if real:
        with ThreadPoolExecutor(2) as pool:
            outs = list(pool.map(lambda args: _switchboard(*args, env=env), commands))
    else:
        outs = [_in_process(*args, env=env) for args in commands]
    for restart, serve in enumerate(outs[:starts]):
        assert serve.returncode in (1, 2), serve.stderr
        assert "switchboard:" in serve.stderr and MASK in serve.stderr, serve.stderr
        _assert_hidden(serve.stdout + serve.stderr, f"serve (start {restart + 1})")
    for args, out in zip(tokens, outs[starts:], strict=True):
        assert out.returncode != 0
        _assert_hidden(out.stdout + out.stderr, " ".join(args))
        assert "Traceback" not in out.stderr, out.stderr


def test_serve_says_what_failed_without_the_password() -> None:
    port = free_port()
    url = f"postgresql+psycopg://switchboard:{PASSWORD}@127.0.0.1:{port}/switchboard"
    serve = _in_process("serve", "--port", str(free_port()), env=_env(url))
    assert serve.returncode == 1
    expected = f"cannot open the store at postgresql+psycopg://switchboard:***@127.0.0.1:{port}/"
    assert expected in serve.stderr, serve.stderr
    assert "Connection refused" in serve.stderr  # the driver's own first line


def test_token_revoke_never_prints_a_secret(tmp_path: Path) -> None:
    """A whole token pasted instead of its id is revoked by its id, and neither it nor
    the bootstrap admin token is printed back."""
    admin_token = "Sb-admin-" + PASSWORD
    env = _env(f"sqlite:///{tmp_path / 'sb.db'}", SWITCHBOARD_ADMIN_TOKEN=admin_token)
    created = _in_process("token", "create", "--role", "agent", "--create", env=env)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    token_id, secret = token.split("_", 2)[1:]
    revoked = _in_process("token", "revoke", token, env=env)
    assert revoked.returncode == 0, revoked.stderr
    assert f"revoked token {token_id}" in revoked.stderr
    again = _in_process("token", "revoke", token, env=env)
    assert again.returncode == 1 and f"no active token with id {token_id}" in again.stderr
    bootstrap = _in_process("token", "revoke", admin_token, env=env)
    assert bootstrap.returncode == 2 and "is not a token id" in bootstrap.stderr
    pasted = _in_process("token", "revoke", f"Bearer {token}", env=env)  # a typo'd paste
    assert pasted.returncode == 2 and "is not a token id" in pasted.stderr
    for out in (revoked, again, bootstrap, pasted):
        _assert_hidden(out.stdout + out.stderr, "token revoke", secret)
        _assert_hidden(out.stdout + out.stderr, "token revoke", admin_token)


CRASHES = """
import asyncio, gc, sys, threading
import uvicorn
from mla_switchboard.service import cli

URL = sys.argv[1]
TOKEN = sys.argv[2]


def run(app, **options):
    # what can go wrong while a server runs, each printed by Python itself
    def crash():
        raise ConnectionError(f"lost {URL} ({TOKEN})")

    thread = threading.Thread(target=crash, name="crasher")
    thread.start()
    thread.join()

    async def serving():
        inner = getattr(app, "app", app)  # the FastAPI app inside the server's middleware
        async with inner.router.lifespan_context(inner):
            async def fail():
                raise ConnectionError(f"task lost {URL} ({TOKEN})")

            task = asyncio.get_running_loop().create_task(fail())
            await asyncio.sleep(0.05)
            del task
            gc.collect()

    asyncio.run(serving())

    class Connection:
        def __del__(self):
            raise OSError(f"closing {URL} ({TOKEN})")

    Connection()
    gc.collect()
    raise RuntimeError(f"cannot reach {URL} ({TOKEN})")


uvicorn.run = run
sys.exit(cli.main(["serve", "--port", "8999"]))  # never bound: run is replaced
"""


def test_what_python_prints_itself_in_serve_is_redacted(tmp_path: Path) -> None:
    """``serve`` installs redacting printers for uncaught exceptions (main thread, other
    threads, ``__del__``) and the event loop's exception handler before it serves; the
    server itself is replaced by crashes carrying the URL and the admin token."""
    admin_token = "Sb-admin-" + PASSWORD
    env = _env(f"sqlite:///{tmp_path / 'sb.db'}", SWITCHBOARD_ADMIN_TOKEN=admin_token)
    url = f"postgresql+psycopg://switchboard:{PASSWORD}@db.internal:5432/switchboard"
    out = subprocess.run(
        [sys.executable, "-c", CRASHES, url, admin_token],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    for printed in (
        "Exception in thread crasher",
        "Task exception was never retrieved",
        "Exception ignored in",
        "RuntimeError: cannot reach postgresql+psycopg://switchboard:***@db.internal",
    ):
        assert printed in text, text
    assert text.count("switchboard:***@db.internal") >= 4, text
    _assert_hidden(text, "serve's own exception printers")
    _assert_hidden(text, "serve's own exception printers", admin_token)


# ------------------------------------------------------------ a service whose database went away


def test_a_service_whose_database_went_away_keeps_the_password(tmp_path: Path) -> None:
    from tests.reliability.conftest import PrivatePostgres

    pg = PrivatePostgres()
    try:
        pg.init().start()
        # trust authentication: the server never asks for the password, so the URL may
        # carry any; the service still has it in its settings and its engine
        url = pg.url.replace("postgres@", f"postgres:{PASSWORD}@")
        service = ServiceProcess(
            url, env={"SWITCHBOARD_SPILL_PATH": str(tmp_path / "spill.jsonl")}
        ).start(tmp_path)
        try:
            with service.client() as c:
                for i in range(20):
                    body = {
                        "cluster": "secrets",
                        "pod": f"p{i}",
                        "device": {"name": "NVIDIA H200", "capability": [9, 0]},
                        "model": {
                            "qk_nope_head_dim": 128,
                            "qk_rope_head_dim": 64,
                            "v_head_dim": 128,
                        },
                        "dtype": "bfloat16",
                    }
                    assert c.post("/v1/select", json=body).status_code == 200
                pg.stop()
                seen = _answers_while_down(service, c)
        finally:
            service.stop()
    finally:
        pg.cleanup()
    assert service.log_path is not None
    seen["log"] = service.log_path.read_text(errors="replace")
    assert "store unavailable" in seen["503"], seen["503"]
    assert '"store":"degraded"' in seen["readyz"].replace(" ", ""), seen["readyz"]
    for where, text in seen.items():
        _assert_hidden(text, where)
    assert "unreachable" in seen["log"] or "unavailable" in seen["log"], seen["log"][-2000:]


def _answers_while_down(service: ServiceProcess, c: httpx.Client) -> dict[str, str]:
    """What a caller and a scraper see once the database is gone."""
    deadline = time.monotonic() + 20
    while True:
        readyz = httpx.get(service.url + "/readyz", timeout=5)
        if readyz.json().get("store") == "degraded":
            break
        assert time.monotonic() < deadline, readyz.text
        time.sleep(0.1)
    write = c.put("/v1/overrides/secrets", json={"force": "CUDNN", "note": "while down"})
    assert write.status_code == 503, write.text
    listing = c.get("/v1/selections", params={"cluster": "secrets"})
    return {
        "readyz": readyz.text,
        "503": write.text,
        "listing": f"{listing.status_code} {listing.text}",
        "metrics": httpx.get(
            service.url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}
        ).text,
    }


# ------------------------------------------------------------ the helper itself


def test_redact_masks_urls_conninfo_and_registered_secrets() -> None:
    protect(f"postgresql+psycopg://u:{PASSWORD}@db.internal:5432/sb")
    assert redact("postgresql://u:p@ss@host/db down") == f"postgresql://u:{MASK}@host/db down"
    assert redact("host=db user=u password='a b\\'c' dbname=x") == (
        f"host=db user=u password={MASK} dbname=x"
    )
    assert redact("dsn: password=hunter2 host=x") == f"dsn: password={MASK} host=x"
    assert redact(f"driver said: auth {PASSWORD} refused") == f"driver said: auth {MASK} refused"
    assert redact("sqlite:///var/lib/sb.db") == "sqlite:///var/lib/sb.db"
    assert shown_url(f"postgresql://u:{PASSWORD}@h/db") == f"postgresql://u:{MASK}@h/db"
    assert shown_url(f"postgresql://u:{PASSWORD}@h:bad/db") == f"postgresql://u:{MASK}@h:bad/db"
    error = RuntimeError(f"connection to postgresql://u:{PASSWORD}@h/db failed\nmore")
    assert first_line(error) == f"connection to postgresql://u:{MASK}@h/db failed"


def test_log_records_are_redacted_tracebacks_included() -> None:
    protect(f"postgresql://u:{PASSWORD}@h/db")
    install_log_redaction()
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("switchboard.test-secrets")
    log.addHandler(handler)
    log.propagate = False
    try:
        error = ConnectionError(f"could not reach postgresql://u:{PASSWORD}@h/db")
        log.warning("store unavailable: %s", error)
        log.warning("using %s", f"postgresql://u:{PASSWORD}@h/db")
        try:
            raise error
        except ConnectionError:
            log.exception("failed")
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    _assert_hidden(text, "the log")
    assert text.count(MASK) == 3 and "Traceback" in text, text


def test_a_503_from_the_store_does_not_carry_the_url(tmp_path: Path) -> None:
    """SQLAlchemy and psycopg errors may quote the connection string; the 503's
    message is the driver's first line, redacted."""
    import asyncio

    from mla_switchboard.service.api.app import _store_unavailable
    from mla_switchboard.service.config import Settings
    from mla_switchboard.service.runtime import Runtime
    from sqlalchemy.exc import OperationalError

    runtime = Runtime(Settings(database_url=f"sqlite:///{tmp_path / 'sb.db'}"))
    protect(f"postgresql://u:{PASSWORD}@h/db")

    class Request:
        class app:
            class state:
                pass

    Request.app.state.runtime = runtime  # type: ignore[attr-defined]
    cause = Exception(f'invalid dsn: host=h user=u password={PASSWORD} dbname="db"')
    error = OperationalError("SELECT 1", {}, cause)
    answer = asyncio.run(_store_unavailable(Request(), error))  # type: ignore[arg-type]
    body = bytes(answer.body).decode()
    assert answer.status_code == 503 and "invalid dsn" in body, body
    _assert_hidden(body, "the 503")
