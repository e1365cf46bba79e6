"""deploy/gitops: the declarative mode's ConfigMap and Deployment patch, the apply Job
and the CI pipeline are well formed and use what exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from mla_switchboard.service.config import Settings
from mla_switchboard.service.gitops.document import OverridesFile
from mla_switchboard.service.gitops.lines import read_file

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "deploy" / "gitops"
KUBERNETES = ("overrides-configmap.yaml", "deployment-patch.yaml", "apply-job.yaml")


def load(name: str) -> dict[str, Any]:
    (document,) = [d for d in yaml.safe_load_all((GITOPS / name).read_text()) if d]
    return document  # type: ignore[no-any-return]


def test_the_configmaps_file_is_a_valid_overrides_file() -> None:
    data = load("overrides-configmap.yaml")["data"]["overrides.yaml"]
    found = read_file(data, "overrides.yaml")
    assert isinstance(found, OverridesFile), [str(p) for p in found]
    assert set(found.overrides) == {"*", "prod-east", "prod-west"}


def test_the_kubernetes_examples_validate() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    for name in ("overrides-configmap.yaml", "apply-job.yaml"):  # the patch is partial
        kv.validate(load(name), kv.latest_version(), strict=True)


def test_the_declarative_settings_and_the_mount_agree() -> None:
    patch = load("deployment-patch.yaml")["spec"]["template"]["spec"]
    (container,) = patch["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    for name in env:
        assert name.removeprefix("SWITCHBOARD_").lower() in Settings.model_fields, name
    (mount,) = container["volumeMounts"]
    assert env["SWITCHBOARD_OVERRIDES_FILE"] == f"{mount['mountPath']}/overrides.yaml"
    (volume,) = patch["volumes"]
    assert volume["configMap"]["name"] == load("overrides-configmap.yaml")["metadata"]["name"]


def test_the_job_and_the_pipeline_run_the_commands_that_exist() -> None:
    from mla_switchboard.service.cli import build_parser

    parser = build_parser()
    (container,) = load("apply-job.yaml")["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["switchboard"]
    parser.parse_args(container["args"])
    steps = [
        step["run"]
        for job in load("github-actions.yaml")["jobs"].values()
        for step in job["steps"]
        if "run" in step and "switchboard overrides" in step["run"]
    ]
    assert len(steps) == 2
    for run in steps:
        line = next(x for x in run.splitlines() if x.strip().startswith("switchboard overrides"))
        args = line.split(">")[0].split()[1:]
        parser.parse_args([a.strip('"') for a in args])
