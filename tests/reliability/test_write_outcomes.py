"""Writes say what happened, against a PostgreSQL server this test starts itself.

The database refuses for real: the service's own role loses the right to read the
tokens table after it started (so every configuration reload fails right after a
committed write), a deferred constraint trigger fails token creations at commit, and
the role loses the right to write the audit log (so a rollout guard cannot write the
halt an agent's stored report calls for).
"""

from __future__ import annotations

import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import ADMIN, InProcessService, ServiceProcess
from tests.reliability.conftest import PrivatePostgres, metric, wait_until
from tests.served import serving
from tests.service.test_select_decisions import ALL

pytestmark = pytest.mark.postgres

FORCE = {"force": "FLASH_ATTN", "note": "INC-7 back to FA", "rollout": {"percent": 10}}


class Database:
    """A database of the private server, owned by a role of the service's own (both
    new for each test: one server for the module, nothing shared between tests)."""

    def __init__(self, pg: PrivatePostgres) -> None:
        self.pg = pg
        suffix = uuid.uuid4().hex[:8]
        self.role, self.name = f"svc_{suffix}", f"sb_{suffix}"
        self.admin(dbname="postgres", sql=f"CREATE ROLE {self.role} LOGIN")
        self.admin(dbname="postgres", sql=f"CREATE DATABASE {self.name} OWNER {self.role}")
        self.url = f"postgresql+psycopg://{self.role}@127.0.0.1:{pg.port}/{self.name}"

    def admin(self, sql: str, dbname: str | None = None) -> list[tuple[Any, ...]]:
        """``sql`` as the server's superuser; ``{role}`` names the service's role."""
        with psycopg.connect(
            host="127.0.0.1",
            port=self.pg.port,
            user="postgres",
            dbname=dbname or self.name,
            autocommit=True,
        ) as conn:
            cur = conn.execute(sql.replace("{role}", self.role))
            return cur.fetchall() if cur.description else []


@pytest.fixture
def db(private_postgres: PrivatePostgres) -> Database:
    return Database(private_postgres)


@pytest.fixture
def service(db: Database) -> Iterator[InProcessService]:
    """The app in this process: what a write answers is tested, not the process (the
    kill -9 below needs one)."""
    with InProcessService(db.url) as s:
        yield s


def test_a_committed_write_is_answered_as_committed(
    db: Database, service: InProcessService
) -> None:
    db.admin("REVOKE SELECT ON tokens FROM {role}")  # reloads fail from now on
    key = str(uuid.uuid4())
    with service.client() as c:
        r = c.put("/v1/overrides/prod-east", json=FORCE, headers={"Idempotency-Key": key})
        assert r.status_code == 200, r.text
        first = r.json()
        assert first["reload_pending"] is True
        assert "stored and audited" in first["message"]
        assert first["override"]["force"] == "FLASH_ATTN"
        # the retry a client makes after a lost answer: the same answer, no second change
        again = c.put("/v1/overrides/prod-east", json=FORCE, headers={"Idempotency-Key": key})
        assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
        assert again.json()["override"] == first["override"]
        # the same key for a different change is refused, naming the header
        other = c.put(
            "/v1/overrides/prod-east",
            json={**FORCE, "force": "CUDNN"},
            headers={"Idempotency-Key": key},
        )
        assert other.status_code == 422 and "idempotency-key" in str(other.json()["detail"])
        created = c.post("/v1/tokens", json={"name": "ops", "role": "viewer"})
        assert created.status_code == 201, created.text
        assert created.json()["token"].startswith("sb_") and created.json()["reload_pending"]
    rows = db.admin("SELECT count(*) FROM audit WHERE action = 'override.put'")
    assert rows == [(1,)]
    stored = db.admin("SELECT spec->'rollout'->>'stage_started_at' FROM overrides")
    assert stored[0][0] == first["override"]["rollout"]["stage_started_at"]  # clock kept
    # the database lets the service read again: it applies the change at its next poll
    db.admin("GRANT SELECT ON tokens TO {role}")
    with service.client() as c:
        wait_until(lambda: c.get("/v1/overrides/prod-east").status_code == 200, 10)
        viewer = created.json()["token"]
        r = c.get("/v1/rules", headers={"Authorization": f"Bearer {viewer}"})
        assert r.status_code == 200


def test_racing_retries_with_one_key_apply_once(db: Database) -> None:
    """Six clients at once: a real HTTP server in this process (the test client's
    transport is not made for requests from several threads at once: one of six
    failed with ClosedResourceError)."""
    key = str(uuid.uuid4())
    answers: list[dict[str, Any]] = []

    def put() -> None:
        with service.client() as c:
            r = c.put("/v1/overrides/*", json=FORCE, headers={"Idempotency-Key": key})
            assert r.status_code == 200, r.text
            answers.append(r.json())

    with serving(db.url) as service:
        threads = [threading.Thread(target=put) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(answers) == 6
    assert len({a["override"]["revision"] for a in answers}) == 1
    assert db.admin("SELECT count(*) FROM audit WHERE action = 'override.put'") == [(1,)]


def test_a_token_whose_commit_fails_is_never_left_usable(
    db: Database, service: InProcessService
) -> None:
    db.admin(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'commit refused by the test'; END $$"
    )
    db.admin(
        "CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON tokens "
        "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse()"
    )
    with service.client() as c:
        r = c.post("/v1/tokens", json={"name": "lost", "role": "admin"})
        assert r.status_code == 503, r.text
        message = r.json()["detail"]["message"]
        assert "may or may not" not in message  # the service found out which
        assert "was not stored" in message
    assert db.admin("SELECT count(*) FROM tokens WHERE revoked_at IS NULL") == [(0,)]


def test_admin_writes_without_a_key_still_work(service: InProcessService) -> None:
    with service.client(ADMIN) as c:
        r = c.put("/v1/overrides/prod-west", json={"deny": ["CUDNN"], "note": "x"})
        assert r.status_code == 200 and "reload_pending" not in r.json()
        assert r.headers["ETag"].startswith('"override-prod-west-')
        bad = c.put(
            "/v1/overrides/prod-west",
            json={"deny": ["CUDNN"], "note": "x"},
            headers={"Idempotency-Key": "has space"},
        )
        assert bad.status_code == 422 and "idempotency-key" in str(bad.json()["detail"])


# ------------------------------------------------------------- agent reports


DEVICE = {"name": "NVIDIA H200", "capability": [9, 0]}
MODEL = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}


def stage_answers(c: httpx.Client, cluster: str, n: int) -> list[dict[str, Any]]:
    """The answers of ``n`` pods in the stage of the rollout in force."""
    found = []
    for i in range(300):
        r = c.post(
            "/v1/select",
            json={"cluster": cluster, "pod": f"p-{i}", "device": DEVICE, "model": MODEL,
                  "dtype": "bfloat16", "packages": ALL},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        answer = r.json()
        if any((o.get("rollout") or {}).get("in_stage") for o in answer["overrides"]):
            found.append({**answer, "pod": f"p-{i}"})
            if len(found) == n:
                return found
    raise AssertionError(f"fewer than {n} of 300 pods in the stage")


def rollout_state(c: httpx.Client, cluster: str) -> str:
    return str(c.get(f"/v1/overrides/{cluster}").json()["rollout"]["state"])


def test_a_stored_failure_report_is_answered_and_its_guard_retried(
    db: Database, service: InProcessService
) -> None:
    spec = {"force": "FLASHINFER", "note": "INC-9", "rollout": {"percent": 20, "max_failures": 1}}
    with service.client() as c:
        assert c.put("/v1/overrides/prod-east", json=spec).status_code == 200
        (answer,) = stage_answers(c, "prod-east", 1)
        db.admin("REVOKE INSERT ON audit FROM {role}")  # the halt cannot be written now
        r = c.post(
            f"/v1/selections/{answer['decision_id']}/failure",
            json={"backend": "FLASHINFER", "error": "RuntimeError: illegal memory access"},
        )
        assert r.status_code == 202, r.text  # before: 503 "nothing was changed"
        assert r.json()["recorded"] is True and r.json()["guard"] == "pending"
        assert db.admin("SELECT count(*) FROM failures") == [(1,)]
        assert rollout_state(c, "prod-east") == "active"
        assert metric(service, "switchboard_rollout_guards_pending") == 1
        db.admin("GRANT INSERT ON audit TO {role}")
        took = wait_until(lambda: rollout_state(c, "prod-east") == "halted", 10, what="halt")
        print(f"halted {took:.2f} s after the audit log took writes again")
        (entry,) = c.get("/v1/audit", params={"action": "rollout.failure"}).json()["items"]
        assert entry["actor"] == "switchboard" and f"prod-east/{answer['pod']}" in entry["note"]
        # the retry halts, then leaves the pending list: the halt can be read first
        wait_until(
            lambda: metric(service, "switchboard_rollout_guards_pending") == 0,
            10,
            what="the pending evaluation gone",
        )


def test_a_retried_report_gets_the_guard_its_first_attempt_never_ran(
    db: Database, tmp_path: Path
) -> None:
    """The replica that stored the report dies before its pending guard could run; the
    agent retries the report (same ``report_id``) on another replica: the halt the two
    pods' figures call for happens then."""
    spec = {"force": "CUDNN", "note": "INC-10", "rollout": {"percent": 20, "max_slowdown_pct": 5}}
    first = ServiceProcess(db.url).start(tmp_path)

    def report(c: httpx.Client, pod: str, report_id: str) -> httpx.Response:
        return c.post(
            "/v1/measurements",
            json={
                "report_id": report_id, "cluster": "prod-east", "pod": pod, "device": DEVICE,
                "model": MODEL, "dtype": "bfloat16", "packages": ALL,
                "results": [
                    {"backend": b, "shape": {"seqlens": [4096], "num_heads": 128},
                     "median_ms": 1.0, "tflops": t + k, "correct": True}
                    for b, t in (("CUDNN", 400.0), ("FLASH_ATTN", 600.0)) for k in range(2)
                ],
            },
        )  # fmt: skip

    try:
        with first.client() as c:
            assert c.put("/v1/overrides/prod-east", json=spec).status_code == 200
            one, two = stage_answers(c, "prod-east", 2)
            # the second pod asks and reports under a token of its own: two evidence
            # sources (one token is one, however many pods it names)
            made = c.post("/v1/tokens", json={"name": "pod-two", "role": "agent"})
            assert made.status_code == 201, made.text
            token = made.json()["token"]
            with first.client(token) as own:
                asked = own.post(
                    "/v1/select",
                    json={"cluster": "prod-east", "pod": two["pod"], "device": DEVICE,
                          "model": MODEL, "dtype": "bfloat16", "packages": ALL},
                )  # fmt: skip
                assert asked.status_code == 200, asked.text
            r = report(c, one["pod"], "report-one-0001")
            assert r.status_code == 201 and r.json()["guard"] == "checked", r.text
            db.admin("REVOKE INSERT ON audit FROM {role}")
            with first.client(token) as own:
                r = report(own, two["pod"], "report-two-0001")
            assert r.status_code == 201, r.text  # before: 503 "nothing was changed"
            assert r.json()["counted"] is True and r.json()["guard"] == "pending"
    finally:
        first.stop(signal.SIGKILL)  # the pending evaluation dies with it
    db.admin("GRANT INSERT ON audit TO {role}")
    second = ServiceProcess(db.url).start(tmp_path)
    try:
        with second.client() as c:
            assert rollout_state(c, "prod-east") == "active"  # the halt was never written
            with second.client(token) as own:
                again = report(own, two["pod"], "report-two-0001")
            assert again.status_code == 200, again.text
            assert again.json()["duplicate"] is True and again.json()["guard"] == "checked"
            assert rollout_state(c, "prod-east") == "halted", second.log_path.read_text()[-4000:]
            reason = c.get("/v1/overrides/prod-east").json()["rollout"]["halted_reason"]
            assert f"prod-east/{one['pod']}" in reason and f"prod-east/{two['pod']}" in reason
        assert db.admin("SELECT count(DISTINCT report_id) FROM measurements") == [(2,)]
    finally:
        second.stop()
