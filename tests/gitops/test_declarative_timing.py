"""The declarative mode's bound: a changed file is in force within 5 s (the default
poll reads it every second). A wall-clock bound: serial, apart from the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ServiceProcess
from tests.gitops.test_declarative import force_of, until, write


@pytest.mark.serial
def test_a_changed_file_is_in_force_within_5_s(tmp_path: Path) -> None:
    path = tmp_path / "overrides.yaml"
    write(path, {"prod-a": {"force": "CUDNN", "note": "v1"}})
    env = {"SWITCHBOARD_OVERRIDES_FILE": str(path)}
    service = ServiceProcess(f"sqlite:///{tmp_path / 'sb.db'}", env=env).start(tmp_path)
    try:
        with service.client() as c:
            assert force_of(c, "prod-a") == "CUDNN"
            write(path, {"prod-a": {"force": "FLASH_ATTN", "note": "v2"}})
            took = until(lambda: force_of(c, "prod-a") == "FLASH_ATTN", timeout=30)
            assert took < 5.0, f"applied after {took:.1f} s"
    finally:
        service.stop()
