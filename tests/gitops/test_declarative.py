"""The declarative mode through a real ``switchboard serve``: the service applies a
mounted overrides file at start and whenever it changes, and refuses console writes
(and other applies) to what the file owns."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import ServiceProcess

HEADER = {"apiVersion": "switchboard/v1", "kind": "Overrides"}


def write(path: Path, overrides: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")  # as a ConfigMap update lands: a whole new file
    tmp.write_text(yaml.safe_dump({**HEADER, "overrides": overrides}))
    tmp.replace(path)


def until(check: Callable[[], bool], timeout: float = 30.0) -> float:
    """Seconds until ``check`` holds (fails past ``timeout``: a behaviour, not a bound)."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < timeout, "the file was not applied"
        time.sleep(0.1)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def synced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, Path]]:
    d = tmp_path_factory.mktemp("declarative")
    path = d / "overrides.yaml"
    write(path, {"prod-a": {"force": "CUDNN", "note": "from git"}})
    env = {"SWITCHBOARD_OVERRIDES_FILE": str(path), "SWITCHBOARD_OVERRIDES_FILE_POLL_S": "0.5"}
    service = ServiceProcess(f"sqlite:///{d / 'sb.db'}", env=env).start(d)
    yield service, path
    service.stop()


@pytest.fixture
def admin(synced: tuple[ServiceProcess, Path]) -> Iterator[httpx.Client]:
    with synced[0].client() as c:
        yield c


def force_of(c: httpx.Client, scope: str) -> str | None:
    r = c.get(f"/v1/overrides/{scope}")
    return r.json()["force"] if r.status_code == 200 else None


def test_the_file_is_applied_at_start_by_the_file_sync(admin: httpx.Client) -> None:
    found = admin.get("/v1/overrides/prod-a").json()
    assert (found["force"], found["created_by"]) == ("CUDNN", "overrides.yaml (file sync)")
    (entry,) = admin.get("/v1/audit", params={"target": "prod-a"}).json()["items"]
    assert entry["actor"] == "overrides.yaml (file sync)"
    assert entry["note"].startswith("overrides file rev ")


def test_console_writes_to_a_managed_cluster_are_refused_with_the_reason(
    admin: httpx.Client,
) -> None:
    r = admin.put("/v1/overrides/prod-a", json={"force": "FLASHINFER", "note": "by hand"})
    assert r.status_code == 409
    message = r.json()["detail"]["message"]
    assert "override 'prod-a' is managed by overrides.yaml rev " in message
    assert admin.delete("/v1/overrides/prod-a").status_code == 409
    assert force_of(admin, "prod-a") == "CUDNN"
    # a cluster the file does not declare stays the console's
    r = admin.put("/v1/overrides/prod-free", json={"force": "FLASHINFER", "note": "mine"})
    assert r.status_code == 200, r.text
    # and an apply of another file to a managed cluster is refused as well
    other = {**HEADER, "overrides": {"prod-a": {"force": "FLASH_ATTN", "note": "ci"}}}
    plan = admin.post("/v1/plan", json={"file": other}).json()
    r = admin.post("/v1/apply", json={"file": other, "etags": plan["etags"]})
    assert r.status_code == 409 and "managed by overrides.yaml" in r.json()["detail"]["message"]


def test_a_changed_file_is_applied_and_a_bad_one_leaves_the_last(
    synced: tuple[ServiceProcess, Path], admin: httpx.Client
) -> None:
    service, path = synced
    write(path, {"prod-a": {"force": "FLASH_ATTN", "note": "v2"},
                 "prod-c": {"deny": ["CUDNN"], "note": "v2"}})  # fmt: skip
    until(lambda: force_of(admin, "prod-a") == "FLASH_ATTN")
    assert admin.get("/v1/overrides/prod-c").status_code == 200
    r = admin.put("/v1/overrides/prod-c", json={"force": "CUDNN", "note": "by hand"})
    assert r.status_code == 409  # the new file's clusters are managed now
    path.write_text(path.read_text().replace("FLASH_ATTN", "FLASHATTN"))
    assert service.log_path is not None
    until(lambda: "overrides file not applied" in service.log_path.read_text())  # type: ignore[union-attr]
    line = next(
        x for x in service.log_path.read_text().splitlines() if "overrides file not applied" in x
    )
    assert f"{path}:" in line and "overrides.prod-a.force: unknown backend 'FLASHATTN'" in line
    assert force_of(admin, "prod-a") == "FLASH_ATTN"
