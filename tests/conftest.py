"""Fixtures shared by every test package: in-process apps and real service processes.

``InProcessService`` runs the app in this process through Starlette's TestClient,
on a SQLite file or a PostgreSQL schema, with the settings a test gives: it is what
most tests use, since a server process costs about two CPU seconds of imports per
start. ``ServiceProcess`` runs ``python -m mla_switchboard.service.cli serve`` on a free loopback
port, exactly as an operator would, and waits for ``/readyz``: only for tests of
the process itself (start-up, flags, signals, sockets, replicas, the CLI).
Set ``SWITCHBOARD_TEST_STARTS_LOG`` to a file name to count the processes started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.chromium import SHARED as SHARED_CHROMIUM
from tests.chromium import SharedChromium
from tests.spill_paths import default_spill_path, spill_setting

if TYPE_CHECKING:
    from tests.forked_serve import ForkedProcess

ADMIN = "test-admin-token"
ROOT = Path(__file__).resolve().parent.parent
# The PostgreSQL server the suite uses (.ci/run starts it): trust auth, database "test".
PG_DSN = os.environ.get("SWITCHBOARD_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


async def _post_all(
    port: int, path: str, bodies: Iterable[dict[str, Any]], conns: int, token: str
) -> list[tuple[int, dict[str, str], bytes]]:
    todo = iter(enumerate(bodies))
    out: dict[int, tuple[int, dict[str, str], bytes]] = {}
    prefix = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nContent-Length: "
    ).encode()

    async def conn() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i, body in todo:
                data = json.dumps(body).encode()
                writer.write(prefix + str(len(data)).encode() + b"\r\n\r\n" + data)
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    if k:
                        headers[k.strip().lower()] = v.strip()
                content = await reader.readexactly(int(headers.get("content-length", 0)))
                out[i] = (int(lines[0].split()[1]), headers, content)
        finally:
            writer.close()

    await asyncio.gather(*(conn() for _ in range(conns)))
    return [out[i] for i in range(len(out))]


def post_all(
    port: int,
    path: str,
    bodies: Iterable[dict[str, Any]],
    conns: int = 32,
    token: str = ADMIN,
) -> list[tuple[int, dict[str, str], bytes]]:
    """POST every body to a server process on ``port`` over ``conns`` keep-alive
    connections, as fast as it answers (pods booting at once): (status, headers with
    lower-case names, content) per body, in order. Raw HTTP/1.1 on asyncio, since a
    pool of httpx clients costs this process more CPU per request than the server
    spends answering it, on the same two cores."""
    # in a thread of its own: the caller may be inside an event loop (Playwright's)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _post_all(port, path, bodies, conns, token)).result()


class MachineLoad:
    """What the machine did while a timing-bound test measured, for its assertion
    messages: a wall-clock bound missed on a busy machine must say the machine was
    busy. Reports the load average and the CPU time this process (and the ``pids``
    given, e.g. the server under test) got against the wall time since ``restart``:
    on an idle machine a busy process gets close to one CPU second per second."""

    def __init__(self, *pids: int) -> None:
        self.pids = pids
        self.restart()

    def restart(self) -> MachineLoad:
        """Start the measured interval now."""
        self._wall = time.monotonic()
        self._cpu = time.process_time()
        self._pid_cpu = {pid: _cpu_seconds_of(pid) for pid in self.pids}
        return self

    def __str__(self) -> str:
        wall = time.monotonic() - self._wall
        one, five, _ = os.getloadavg()
        parts = [
            f"machine load {one:.1f} (1 min) / {five:.1f} (5 min) on {os.cpu_count()} CPUs",
            f"this process got {time.process_time() - self._cpu:.2f} s CPU in {wall:.2f} s",
        ]
        for pid, before in self._pid_cpu.items():
            after = _cpu_seconds_of(pid)
            if before is not None and after is not None:
                parts.append(f"pid {pid} got {after - before:.2f} s CPU")
        return "; ".join(parts)

    def says(self, message: object) -> str:
        """``message`` followed by the load seen: an assertion's message."""
        return f"{message} [{self}]"


def _cpu_seconds_of(pid: int) -> float | None:
    """User + system CPU seconds of a live process (Linux /proc), None when unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def machine_load() -> MachineLoad:
    """The load seen from the test's start (``restart()`` it where the measured part
    begins); its ``says(message)`` goes in a timing-bound assertion."""
    return MachineLoad()


_CALL_LOAD = pytest.StashKey[str]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    load = MachineLoad()
    try:
        return (yield)
    finally:
        item.stash[_CALL_LOAD] = str(load)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed timing-bound (``serial``) test's report says how busy the machine was
    during its call, whichever assertion failed."""
    report = yield
    load = item.stash.get(_CALL_LOAD, "")
    if report.when == "call" and report.failed and load and item.get_closest_marker("serial"):
        report.sections.append(("machine load during the test", load))
    return report


STARTS_LOG = "SWITCHBOARD_TEST_STARTS_LOG"


def count_start(what: str) -> None:
    """One line per service process started, in the file ``SWITCHBOARD_TEST_STARTS_LOG``
    names (when set), with the test that started it: how many the suite starts is what
    its run time mostly is."""
    path = os.environ.get(STARTS_LOG)
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "-").split(" ")[0]
        with open(path, "a") as log:
            log.write(f"{os.getpid()} {what} {test}\n")


def _starts_logged() -> int:
    try:
        return len(Path(os.environ[STARTS_LOG]).read_text().splitlines())
    except FileNotFoundError:
        return 0


_STARTS_BEFORE = pytest.StashKey[int]()


_LEFT_BEFORE = pytest.StashKey[set[str]]()


def _left_in_checkout() -> set[str]:
    """What a service writes beside its working directory when no test said where:
    spill files and decision logs (tests/spill_paths.py)."""
    return {p.name for p in ROOT.glob("switchboard-spill-*")}


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(STARTS_LOG):
        config.stash[_STARTS_BEFORE] = _starts_logged()
    config.stash[_LEFT_BEFORE] = _left_in_checkout()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The processes this run started (xdist workers append to the same file)."""
    if os.environ.get(STARTS_LOG):
        started = _starts_logged() - config.stash.get(_STARTS_BEFORE, 0)
        terminalreporter.write_line(f"service processes started: {started}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A run that left a service's spill file or decision log in the checkout fails: a
    later run on the same database URL would take that log over (tests/spill_paths.py)."""
    if hasattr(session.config, "workerinput"):
        return  # the controller looks once every worker is done
    left = _left_in_checkout() - session.config.stash.get(_LEFT_BEFORE, set())
    if left:
        print(
            f"\nerror: the run left {len(left)} service spill files or decision logs in "
            f"{ROOT} (a test's service named no spill path; tests/spill_paths.py): "
            f"{', '.join(sorted(left)[:5])}",
            file=sys.stderr,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# Files whose tests take long (a browser, process starts, a fuzzer, faults and their
# recovery): the parallel pass schedules whole files (``--dist loadfile``), and a long
# file taken last keeps one worker busy after the others ran out of work. Taken first,
# the many short files fill in behind them and every worker ends at about the same time.
# Files with a ``browser`` test count as long too.
LONG_FILES = frozenset(
    {
        "fuzz/test_schemathesis.py",
        "service/test_cli.py",
        "security/test_secrets.py",
        "reliability/test_faults.py",
        "reliability/test_outage.py",
        "reliability/test_write_outcomes.py",
        "reliability/test_log_inprocess.py",
        "reliability/test_durability.py",
        "agent/test_agent_bench.py",
        "deploy/test_manifests.py",
        "service/test_rollout_guards.py",
    }
)


# the test files with a test that uses the shared Chromium (``chromium``)
_CHROMIUM_FILES = pytest.StashKey[set[Path]]()

# How a test file marks a timing test: the timing pass reads only files that say it.
SERIAL_MARK = "mark.serial"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The timing pass (``-m serial``) imports only the files that mark a timing test:
    importing the other 150 files (torch, schemathesis, playwright among them) to
    deselect every test in them costs the pass about 6 s of CPU. The behaviour pass
    checks that every timing test's file says ``mark.serial`` (see below), so no timing
    test is skipped by this."""
    if config.getoption("markexpr", "") != "serial" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return SERIAL_MARK not in collection_path.read_text(errors="replace")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long files first, the rest in their order (a stable sort: each file's tests keep
    theirs). With xdist's ``--no-loadscope-reorder`` (.ci/run) files go to the workers
    in this order, longest first."""
    tests_dir = Path(__file__).parent
    long: dict[Path, bool] = {}
    for item in items:
        path = item.path
        if path not in long:
            long[path] = False
            with contextlib.suppress(ValueError):
                long[path] = path.relative_to(tests_dir).as_posix() in LONG_FILES
        if item.get_closest_marker("browser"):
            long[path] = True
    items.sort(key=lambda item: not long[item.path])
    timed = {i.path for i in items if i.get_closest_marker("serial")}
    unmarked = sorted(str(p) for p in timed if SERIAL_MARK not in p.read_text())
    if unmarked:
        raise pytest.UsageError(
            f"timing tests in files that never say {SERIAL_MARK!r}, which the timing pass "
            f"would not read: {', '.join(unmarked)}"
        )
    config.stash[_CHROMIUM_FILES] = {
        i.path for i in items if "chromium" in getattr(i, "fixturenames", ())
    }


@pytest.fixture(scope="session")
def chromium() -> SharedChromium:
    """The worker's Chromium (tests/chromium.py): ``with chromium.contexts() as browser``
    gives a test contexts of its own in it."""
    return SHARED_CHROMIUM


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """The shared Chromium runs from the first test that asks for it to the end of the
    last file in a row that has such tests (a module-scoped page outlives the tests in
    between): Playwright's loop would refuse another file's ``asyncio.run`` (and
    another Playwright), and an idle browser only takes memory."""
    try:
        return (yield)
    finally:
        files = item.config.stash.get(_CHROMIUM_FILES, set())
        if SHARED_CHROMIUM.running and (nextitem is None or nextitem.path not in files):
            SHARED_CHROMIUM.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """A real ``switchboard serve`` process on loopback."""

    def __init__(
        self,
        database_url: str,
        *,
        env: dict[str, str] | None = None,
        prefix: list[str] | None = None,
        preexec_fn: Callable[[], None] | None = None,
        bootstrap_token: str | None = ADMIN,
        root: Path | None = None,
    ) -> None:
        self.database_url = database_url
        # another checkout's code (its own .venv), for a benchmark beside an older version
        self.root = root
        # None: no token configured, as a new user's first start (it prints one)
        self.bootstrap_token = bootstrap_token
        self.extra_env = env or {}
        self.prefix = prefix or []  # e.g. prlimit: the process under a resource limit
        self.preexec_fn = preexec_fn  # run in the child before exec (e.g. a descriptor limit)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | ForkedProcess | None = None
        self.log_path: Path | None = None

    def start(self, log_dir: Path, timeout: float = 30.0) -> ServiceProcess:
        """Spawn and wait until ready; a start that fails leaves no process behind."""
        return self.spawn(log_dir).wait_ready(timeout)

    def spawn(self, log_dir: Path) -> ServiceProcess:
        """Start the process without waiting for it (``wait_ready`` waits)."""
        env = {
            **os.environ,
            "SWITCHBOARD_DATABASE_URL": self.database_url,
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("SWITCHBOARD_ADMIN_TOKEN", None)
        if self.bootstrap_token is not None:
            env["SWITCHBOARD_ADMIN_TOKEN"] = self.bootstrap_token
        env.update(self.extra_env)
        spill = default_spill_path(self.database_url)
        if spill is not None and "SWITCHBOARD_SPILL_PATH" not in env:
            env["SWITCHBOARD_SPILL_PATH"] = spill
        self.log_path = log_dir / f"service-{self.port}.log"
        argv = ["serve", "--port", str(self.port), "--log-level", "warning"]
        if self.root is None and not self.prefix and self.preexec_fn is None:
            from tests.forked_serve import fork_serve

            self.proc = fork_serve(argv, env=env, cwd=ROOT, log_path=self.log_path)
        else:  # another checkout, a prefix or a preexec_fn: a fresh interpreter
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    [
                        *self.prefix,
                        str(self.root / ".venv/bin/python") if self.root else sys.executable,
                        "-m",
                        "mla_switchboard.service.cli",
                        *argv,
                    ],
                    cwd=self.root or ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    preexec_fn=self.preexec_fn,
                )
        count_start(self.url)
        return self

    def wait_ready(self, timeout: float = 30.0) -> ServiceProcess:
        """Until ``/readyz`` answers 200; the log when the process exits or never does.

        A process that is not ready in time is killed before the error is raised:
        whoever called this holds no handle to stop it once it raises."""
        assert self.proc is not None and self.log_path is not None, "spawn() first"
        load = MachineLoad(self.proc.pid)
        try:
            ready = self._poll_ready(timeout)
        except BaseException:
            self.stop(signal.SIGKILL)
            raise
        if ready:
            return self
        exited = self.proc.poll() is not None
        self.stop(signal.SIGKILL)
        if exited:
            raise RuntimeError(f"service exited early:\n{self.log_path.read_text()}")
        raise RuntimeError(
            load.says(f"service not ready in {timeout}s:\n{self.log_path.read_text()}")
        )

    def _poll_ready(self, timeout: float) -> bool:
        """True once ``/readyz`` answers 200; False when the process exits or time runs out."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(self.url + "/readyz", timeout=0.5).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def client(self, token: str | None = ADMIN) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)


def start_together(log_dir: Path, *services: ServiceProcess) -> tuple[ServiceProcess, ...]:
    """Start replicas at once, as a deployment does, and wait until each is ready: their
    start-ups (imports, migrations) overlap instead of adding up."""
    for service in services:
        service.spawn(log_dir)
    try:
        return tuple(service.wait_ready() for service in services)
    except BaseException:
        for service in services:
            service.stop()
        raise


@pytest.fixture
def service_factory(tmp_path: Path) -> Iterator[type[ServiceProcess]]:
    started: list[ServiceProcess] = []

    class Factory(ServiceProcess):
        def start(self, log_dir: Path = tmp_path, timeout: float = 30.0) -> ServiceProcess:  # type: ignore[override]
            started.append(self)
            return super().start(log_dir, timeout)

    yield Factory
    stuck: list[subprocess.SubprocessError] = []
    for proc in started:  # every one, even after one that would not die
        try:
            proc.stop()
        except subprocess.SubprocessError as exc:
            stuck.append(exc)
    if stuck:
        raise stuck[0]


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'switchboard.db'}"


@pytest.fixture
def live_service(service_factory: type[ServiceProcess], sqlite_url: str) -> ServiceProcess:
    return service_factory(sqlite_url).start()


def make_inprocess_client(database_url: str, **settings: object) -> object:
    """A TestClient context manager around a fresh app (enter it to start the app)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from mla_switchboard.service.api.app import create_app
    from mla_switchboard.service.config import Settings

    settings = {**spill_setting(database_url), **settings}
    app = create_app(Settings(database_url=database_url, admin_token=ADMIN, **settings))
    return TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"})


class InProcessService:
    """The app of ``switchboard serve`` in this process, behind Starlette's TestClient.

    Configured as a ``ServiceProcess`` is: a database URL, ``SWITCHBOARD_*`` variables
    in ``env`` (read as the process would read them), the bootstrap token; keyword
    ``settings`` are ``Settings`` fields. ``start()`` runs the app's start-up (the
    runtime's threads, migrations), ``stop()`` its shut-down. Every ``client(token)``
    talks to the same running app, so a test body reads as it does against a server;
    ``url`` is the TestClient's base URL (for building links, not for sockets).
    """

    url = "http://testserver"

    def __init__(
        self,
        database_url: str,
        *,
        env: dict[str, str] | None = None,
        bootstrap_token: str | None = ADMIN,
        **settings: object,
    ) -> None:
        self.database_url = database_url
        self.bootstrap_token = bootstrap_token
        self.extra_env = env or {}
        self.settings = settings
        self._test_client: Any = None

    def make_settings(self) -> Any:
        """The Settings the process would read: this environment, minus the admin token
        (the process is given its own), plus ``env``, under explicit fields."""
        from mla_switchboard.service.config import Settings

        saved = dict(os.environ)
        try:
            os.environ.pop("SWITCHBOARD_ADMIN_TOKEN", None)
            os.environ.update(self.extra_env)
            fields: dict[str, object] = {"database_url": self.database_url, **self.settings}
            fields = {**spill_setting(self.database_url), **fields}
            if self.bootstrap_token is not None:
                fields["admin_token"] = self.bootstrap_token
            return Settings(**fields)  # type: ignore[arg-type]
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def start(self) -> InProcessService:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from starlette.testclient import TestClient

        from mla_switchboard.service.api.app import create_app

        client = TestClient(create_app(self.make_settings()))
        client.__enter__()
        self._test_client = client
        return self

    def stop(self) -> None:
        if self._test_client is not None:
            client, self._test_client = self._test_client, None
            client.__exit__(None, None, None)

    def __enter__(self) -> InProcessService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def app(self) -> Any:
        assert self._test_client is not None, "start() first"
        return self._test_client.app

    @property
    def runtime(self) -> Any:
        """The app's Runtime (store, recorder, metrics), for looking inside."""
        return self.app.state.runtime

    def client(self, token: str | None = ADMIN) -> httpx.Client:
        """A client of the running app with ``token`` (None: no Authorization header);
        closing it leaves the app running."""
        assert self._test_client is not None, "start() first"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=self.url,
            headers=headers,
            transport=self._test_client._transport,
            follow_redirects=True,
            timeout=10,
        )


@pytest.fixture
def inprocess_factory() -> Iterator[type[InProcessService]]:
    """``inprocess_factory(url, env=..., **settings).start()``: apps for one test,
    each stopped afterwards (also when the test fails)."""
    started: list[InProcessService] = []

    class Factory(InProcessService):
        def start(self) -> InProcessService:
            started.append(self)
            return super().start()

    yield Factory
    for service in reversed(started):
        service.stop()


@pytest.fixture
def inprocess_service(sqlite_url: str) -> Iterator[InProcessService]:
    """A fresh app of this test's own on a SQLite file (cheap: no imports to pay)."""
    with InProcessService(sqlite_url) as service:
        yield service


@pytest.fixture
def inprocess_app(sqlite_url: str) -> Iterator[httpx.Client]:
    with make_inprocess_client(sqlite_url) as c:  # type: ignore[attr-defined]
        yield c


@pytest.fixture(scope="session")
def shared_inprocess(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    url = f"sqlite:///{tmp_path_factory.mktemp('inproc') / 'switchboard.db'}"
    with make_inprocess_client(url) as c:  # type: ignore[attr-defined]
        yield c


@pytest.fixture(scope="session")
def shared_inprocess_pg(pg_schemas: Callable[[], str]) -> Iterator[InProcessService]:
    """The session's in-process app on a PostgreSQL schema of its own."""
    with InProcessService(pg_schemas()) as service:
        yield service


@pytest.fixture(scope="session")
def shared_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A real server process for the whole session (tests of other packages use it)."""
    d = tmp_path_factory.mktemp("served")
    service = ServiceProcess(f"sqlite:///{d / 'switchboard.db'}").start(d)
    yield service
    service.stop()


@pytest.fixture(
    params=["inprocess", pytest.param("inprocess-postgres", marks=pytest.mark.postgres)]
)
def api(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    """The same tests through the in-process app on SQLite and on PostgreSQL.

    Both are shared by the whole session, so tests that count things use cluster
    names of their own.
    """
    if request.param == "inprocess":
        yield request.getfixturevalue("shared_inprocess")
        return
    service: InProcessService = request.getfixturevalue("shared_inprocess_pg")
    with service.client() as client:
        yield client


# ---------------------------------------------------------------- PostgreSQL
#
# Every test module (or test) that needs PostgreSQL gets a schema of its own on the
# shared server, named sb_<random>, reached through the URL's search_path, and
# dropped afterwards: sessions running side by side never see each other's rows.


def pg_unavailable() -> str | None:
    """Why the PostgreSQL server cannot be used, or None when it can."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - psycopg is a dependency
        return f"psycopg is not installed: {exc}"
    try:
        with psycopg.connect(PG_DSN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"PostgreSQL at {PG_DSN} is not reachable: {str(exc).strip().splitlines()[0]}"
    return None


def pg_schema_url(schema: str, dsn: str = PG_DSN) -> str:
    """A SQLAlchemy URL whose connections all use ``schema`` (and only it)."""
    base = dsn.split("://", 1)[1]
    return f"postgresql+psycopg://{base}?options=-csearch_path%3D{schema}"


def create_pg_schema(dsn: str = PG_DSN) -> str:
    import psycopg

    schema = f"sb_{secrets.token_hex(6)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return schema


def drop_pg_schema(schema: str, dsn: str = PG_DSN) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The PostgreSQL server's DSN; skips (fails under CI) when it is not reachable."""
    reason = pg_unavailable()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI must run the PostgreSQL tests (.ci/run starts it)")
        pytest.skip(f"{reason} (set CI=1 to make this a failure)")
    return PG_DSN


@pytest.fixture(scope="session")
def pg_schemas(postgres_server: str) -> Iterator[Callable[[], str]]:
    """Makes fresh schemas (returns their URL); drops them all at the end of the session."""
    made: list[str] = []

    def make() -> str:
        made.append(create_pg_schema(postgres_server))
        return pg_schema_url(made[-1], postgres_server)

    yield make
    for schema in made:
        drop_pg_schema(schema, postgres_server)


@pytest.fixture(scope="module")
def pg_url(postgres_server: str) -> Iterator[str]:
    """A PostgreSQL schema of this test module's own, dropped afterwards."""
    schema = create_pg_schema(postgres_server)
    yield pg_schema_url(schema, postgres_server)
    drop_pg_schema(schema, postgres_server)


@pytest.fixture
def pg_url_factory(postgres_server: str) -> Iterator[Callable[[], str]]:
    """Fresh schemas for one test (returns their URLs); dropped after the test."""
    made: list[str] = []

    def make() -> str:
        made.append(create_pg_schema(postgres_server))
        return pg_schema_url(made[-1], postgres_server)

    yield make
    for schema in made:
        drop_pg_schema(schema, postgres_server)
