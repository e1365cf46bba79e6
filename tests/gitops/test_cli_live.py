"""``switchboard overrides`` against a real ``switchboard serve`` process: export,
plan (exit 0 / 2 / 1, text, JSON, Markdown) and apply, as a pipeline runs them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from mla_switchboard.service.cli import main as switchboard

from tests.conftest import ADMIN, ServiceProcess
from tests.service.test_select_decisions import body


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    d = tmp_path_factory.mktemp("gitops-live")
    service = ServiceProcess(f"sqlite:///{d / 'sb.db'}").start(d)
    yield service
    service.stop()


@pytest.fixture(scope="module")
def admin(server: ServiceProcess) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def fresh(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def token(c: httpx.Client, role: str, clusters: list[str] | None = None) -> str:
    r = c.post("/v1/tokens", json={"name": fresh(role), "role": role, "clusters": clusters})
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


class Cli:
    """``switchboard overrides ...`` as a pipeline runs it: exit code, stdout, stderr."""

    def __init__(self, server: ServiceProcess, capsys: pytest.CaptureFixture[str]) -> None:
        self.server, self.capsys = server, capsys

    def __call__(self, *args: str, tok: str = ADMIN) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = switchboard(["overrides", *args, "--url", self.server.url, "--token", tok])
        out = self.capsys.readouterr()
        return code, out.out, out.err


@pytest.fixture
def cli(server: ServiceProcess, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(server, capsys)


def export(cli: Cli, path: Path) -> dict[str, Any]:
    code, _, err = cli("export", "-o", str(path))
    assert code == 0, err
    return yaml.safe_load(path.read_text())  # type: ignore[no-any-return]


def save(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def audit_size(c: httpx.Client) -> int:
    return len(c.get("/v1/audit", params={"limit": 500}).json()["items"])


def test_export_then_apply_of_the_same_file_changes_nothing(
    cli: Cli, admin: httpx.Client, tmp_path: Path
) -> None:
    soon = (datetime.now(UTC) + timedelta(days=3)).isoformat()
    puts = {
        "*": {"deny": ["CUDNN"], "note": "fleet-wide: cudnn leaks"},
        fresh("prod"): {"force": "FLASHINFER", "note": "canary", "expires_at": soon,
                        "rollout": {"percent": 10, "steps": [10, 50, 100], "step_every": "2h",
                                    "guard_clusters": ["prod-*"]}},
        fresh("prod"): {"policy": "measured", "trust_clusters": ["prod-*"], "note": "measure"},
    }  # fmt: skip
    for scope, spec in puts.items():
        assert admin.put(f"/v1/overrides/{scope}", json=spec).status_code == 200
    path = tmp_path / "overrides.yaml"
    exported = export(cli, path)
    assert list(exported) == ["apiVersion", "kind", "rules", "overrides"]
    assert list(exported["overrides"]) == sorted(exported["overrides"])
    before = audit_size(admin)
    code, out, err = cli("plan", "-f", str(path))
    assert (code, err) == (0, ""), out
    assert "No changes" in out
    code, out, err = cli("apply", "-f", str(path), "--prune")
    assert code == 0, err
    assert "Nothing to apply" in out
    assert audit_size(admin) == before
    again = tmp_path / "again.yaml"
    export(cli, again)
    assert again.read_text() == path.read_text()  # stable: a diff shows only changes


def test_forcing_flashinfer_plans_exactly_the_consoles_preview(
    cli: Cli, admin: httpx.Client, tmp_path: Path
) -> None:
    cluster = fresh("prod")
    for i in range(4):
        r = admin.post("/v1/select", json=body(cluster=cluster, pod=f"r1-{i}"))
        assert r.status_code == 200, r.text
    document = export(cli, tmp_path / "live.yaml")
    spec = {"force": "FLASHINFER", "note": "faster on H200"}
    document["overrides"][cluster] = spec
    path = save(tmp_path / "overrides.yaml", document)
    code, out, err = cli("plan", "-f", str(path), "--format", "json")
    assert code == 2, err
    plan = json.loads(out)
    console = admin.put(f"/v1/overrides/{cluster}?dry_run=true", json=spec).json()["preview"]
    assert plan["preview"] == console
    assert [(c["cluster"], c["to"], c["pods"]) for c in plan["preview"]["changes"]] == [
        (cluster, "FLASHINFER", 4)
    ]
    code, text, _ = cli("plan", "-f", str(path))
    assert code == 2
    assert f"+ override {cluster} (create)" in text
    assert f"{cluster}: FLASH_ATTN -> FLASHINFER, 4 pods" in text
    code, md, _ = cli("plan", "-f", str(path), "--format", "markdown")
    assert code == 2
    assert md.startswith("### Switchboard plan of ")
    assert f"| {cluster} | FLASH_ATTN | FLASHINFER | 4 |" in md
    code, out, err = cli("apply", "-f", str(path), "--revision", "0123abc")
    assert code == 0, err
    assert admin.get(f"/v1/overrides/{cluster}").json()["force"] == "FLASHINFER"
    entry = admin.get("/v1/audit", params={"target": cluster}).json()["items"][0]
    assert entry["note"] == "overrides file rev 0123abc: faster on H200"


def test_a_console_edit_between_plan_and_apply_makes_apply_refuse(
    cli: Cli, admin: httpx.Client, tmp_path: Path
) -> None:
    cluster = fresh("prod")
    assert (
        admin.put(f"/v1/overrides/{cluster}", json={"force": "CUDNN", "note": "a"}).status_code
        == 200
    )
    document = export(cli, tmp_path / "live.yaml")
    document["overrides"][cluster] = {"force": "FLASH_ATTN", "note": "from git"}
    path = save(tmp_path / "overrides.yaml", document)
    code, out, _ = cli("plan", "-f", str(path), "--format", "json")
    assert code == 2
    saved = tmp_path / "plan.json"
    saved.write_text(out)
    edit = {"force": "FLASHINFER", "note": "by hand"}
    assert admin.put(f"/v1/overrides/{cluster}", json=edit).status_code == 200
    code, _, err = cli("apply", "-f", str(path), "--plan", str(saved))
    assert code == 1
    assert f"412 override:{cluster} changed since the plan" in err
    assert admin.get(f"/v1/overrides/{cluster}").json()["force"] == "FLASHINFER"


def test_prune_removes_only_the_overrides_the_file_omits(
    cli: Cli, admin: httpx.Client, tmp_path: Path
) -> None:
    keep, drop = fresh("prod"), fresh("prod")
    for c in (keep, drop):
        assert (
            admin.put(f"/v1/overrides/{c}", json={"deny": ["CUDNN"], "note": c}).status_code == 200
        )
    document = export(cli, tmp_path / "live.yaml")
    del document["overrides"][drop]
    path = save(tmp_path / "overrides.yaml", document)
    code, out, _ = cli("plan", "-f", str(path))
    assert code == 0 and drop in out  # kept without --prune, and said so
    code, out, _ = cli("plan", "-f", str(path), "--prune")
    assert code == 2 and f"- override {drop} (remove)" in out
    live_before = {o["cluster"] for o in admin.get("/v1/overrides").json()["items"]}
    code, _, err = cli("apply", "-f", str(path), "--prune")
    assert code == 0, err
    live_after = {o["cluster"] for o in admin.get("/v1/overrides").json()["items"]}
    assert live_before - live_after == {drop}


def test_a_viewer_can_plan_but_not_apply(cli: Cli, admin: httpx.Client, tmp_path: Path) -> None:
    viewer = token(admin, "viewer")
    document = export(cli, tmp_path / "live.yaml")
    cluster = fresh("prod")
    document["overrides"][cluster] = {"force": "CUDNN", "note": "v"}
    path = save(tmp_path / "overrides.yaml", document)
    code, _, err = cli("plan", "-f", str(path), tok=viewer)
    assert code == 2, err
    code, _, err = cli("apply", "-f", str(path), tok=viewer)
    assert code == 1 and "/v1/apply: 403" in err
    assert admin.get(f"/v1/overrides/{cluster}").status_code == 404


def test_a_prod_admin_cannot_apply_a_change_to_dev_a(
    cli: Cli, admin: httpx.Client, tmp_path: Path
) -> None:
    prod = token(admin, "admin", ["prod-*"])
    document = export(cli, tmp_path / "prod.yaml")
    document["overrides"] = {
        c: s for c, s in document["overrides"].items() if c.startswith("prod-") or c == "*"
    }
    document["overrides"]["dev-a"] = {"force": "CUDNN", "note": "not mine"}
    path = save(tmp_path / "overrides.yaml", document)
    code, _, err = cli("apply", "-f", str(path), tok=prod)
    assert code == 1
    assert "403" in err and "'dev-a'" in err
    assert admin.get("/v1/overrides/dev-a").status_code == 404


def test_a_file_with_a_bad_glob_fails_with_its_line_before_asking(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "overrides.yaml"
    path.write_text(
        "apiVersion: switchboard/v1\nkind: Overrides\noverrides:\n"
        "  prod-east:\n    policy: measured\n    trust_clusters: [PROD]\n    note: x\n"
    )
    code, _, err = cli("plan", "-f", str(path))
    assert code == 1
    assert f"{path}:6:22: overrides.prod-east.trust_clusters.0: 'PROD' is not a cluster glob" in err
