"""The package probe reads the backend registry: every package a backend needs is probed.

The probe once kept its own list of four packages beside the registry's five, so a pod
with ``tokenspeed_mla`` installed was told "required package tokenspeed_mla not
installed" for TOKENSPEED_MLA. These tests install fake packages (a module and its
dist-info) on ``sys.path`` and probe for real.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mla_switchboard.agent.commands.select import select_main
from mla_switchboard.agent.probe import probe_packages
from mla_switchboard.core.specs import KERNEL_PACKAGES, SPECS, Backend

CONFIGS = Path(__file__).resolve().parent / "configs"
DSV3 = str(CONFIGS / "deepseek-v3.json")
B200 = ["--capability", "10.0", "--device-name", "NVIDIA B200", "--packages", "probe"]


def _install(site: Path, import_name: str, distribution: str, version: str) -> None:
    """A package as an installed wheel leaves it: the module and its dist-info. The
    module's own ``__version__`` differs, to show the version comes from metadata."""
    package = site / import_name
    package.mkdir()
    (package / "__init__.py").write_text('__version__ = "0.0.0+module"\n')
    info = site / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
    )


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path where a test installs packages; what the probe imported
    from it is forgotten afterwards, so no later test sees a fake package."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    before = set(sys.modules)
    yield root
    for name in set(sys.modules) - before:
        module_file = getattr(sys.modules[name], "__file__", None) or ""
        if module_file.startswith(str(root)):
            del sys.modules[name]


FAKES = [p for name, p in KERNEL_PACKAGES.items() if name != "torch"]


@pytest.mark.parametrize("package", FAKES, ids=lambda p: p.import_name)
def test_every_registry_package_is_probed_with_its_distributions_version(
    site: Path, package: Any
) -> None:
    if package.import_name in sys.modules or any(
        (Path(p) / package.import_name).exists() for p in sys.path[1:] if p
    ):
        pytest.skip(f"{package.import_name} is really installed here")
    _install(site, package.import_name, package.distributions[0], "2.0.4")
    found, notes = probe_packages()
    assert notes == []
    assert found[package.import_name] == "2.0.4"


def test_every_package_a_backend_needs_is_in_the_registry() -> None:
    for spec in SPECS.values():
        for package in (*spec.packages, *spec.optional_packages):
            assert KERNEL_PACKAGES[package.import_name] == package


def test_a_probing_blackwell_pod_with_tokenspeed_mla_gets_it_as_valid(
    site: Path,
    agent_service: Any,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """End to end: the probe finds tokenspeed_mla, the request carries it, the service
    finds TOKENSPEED_MLA valid on 10.x and grants the pod's request for it, under our
    own kernels and under vLLM (which runs it on 10.x for DeepSeek-R1 dims)."""
    package = KERNEL_PACKAGES["tokenspeed_mla"]
    _install(site, package.import_name, package.distributions[0], "2.0.4")
    monkeypatch.setenv("SWITCHBOARD_TOKEN", agent_service.token)
    argv = ["--model", DSV3, "--cluster", "agent-probe", "--url", agent_service.url]
    argv += ["--cache-dir", str(cache_dir), *B200, "--requested", "tokenspeed_mla", "--strict"]
    for engine in ([], ["--engine", "vllm==0.33.0"]):
        code = select_main([*argv, *engine])
        out, err = capsys.readouterr()
        assert code == 0, err
        doc = json.loads(out)
        assert doc["request"]["packages"]["tokenspeed_mla"] == "2.0.4"
        by_backend = {c["backend"]: c for c in doc["candidates"]}
        assert by_backend[Backend.TOKENSPEED_MLA]["valid"], by_backend[Backend.TOKENSPEED_MLA]
        assert (doc["backend"], doc["source"]) == (Backend.TOKENSPEED_MLA, "requested")
