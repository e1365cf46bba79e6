"""The Kubernetes manifests in deploy/k8s: well formed, consistent with each other,
with the app, the Dockerfile and the agent; and the serving pod's two scripts work
together against a real service.

No cluster here: the checks are static (YAML, the Kubernetes schemas through
kubernetes-validate when installed), plus the init container's and the main
container's shell scripts run on this machine as Kubernetes would run them, with
``vllm`` replaced by a stub that records its arguments.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ADMIN, ROOT, free_port
from tests.served import ThreadServer, serving

K8S = ROOT / "deploy" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))
API_VERSIONS = {
    "Namespace": "v1",
    "Secret": "v1",
    "Service": "v1",
    "Pod": "v1",
    "ConfigMap": "v1",
    "ServiceAccount": "v1",
    "Deployment": "apps/v1",
    "Job": "batch/v1",
    "PodDisruptionBudget": "policy/v1",
    "PersistentVolumeClaim": "v1",
}
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def load(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def objects(kind: str, name: str | None = None) -> list[dict[str, Any]]:
    found = [d for p in MANIFESTS for d in load(p) if d["kind"] == kind]
    return [d for d in found if name is None or d["metadata"]["name"] == name]


def one(kind: str, name: str) -> dict[str, Any]:
    (found,) = objects(kind, name)
    return found


def pod_specs() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(name, pod spec, metadata) of every pod the manifests make."""
    specs = [(p["metadata"]["name"], p["spec"], p["metadata"]) for p in objects("Pod")]
    for kind in ("Deployment", "Job"):
        for d in objects(kind):
            template = d["spec"]["template"]
            meta = {**template.get("metadata", {}), "namespace": d["metadata"]["namespace"]}
            specs.append((d["metadata"]["name"], template["spec"], meta))
    return specs


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec["containers"]]


def script(container: dict[str, Any]) -> str:
    """The shell script a ``sh -c`` container runs, line continuations joined."""
    argv = [*container.get("command", []), *container.get("args", [])]
    assert argv[:2] == ["/bin/sh", "-c"], argv
    return argv[2].replace("\\\n", " ")


def serving_pod() -> dict[str, Any]:
    (pod,) = objects("Pod")
    return pod


def init_and_main() -> tuple[dict[str, Any], dict[str, Any]]:
    spec = serving_pod()["spec"]
    (init,) = spec["initContainers"]
    (main,) = spec["containers"]
    return init, main


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


# ------------------------------------------------------------------ structure


def test_every_document_parses_with_known_kinds() -> None:
    assert {p.name for p in MANIFESTS} >= {
        "switchboard.yaml",
        "serving-pod-example.yaml",
        "secret-example.yaml",
    }
    seen = set()
    for path in MANIFESTS:
        docs = load(path)
        assert docs, path
        for d in docs:
            assert d["kind"] in API_VERSIONS, (path.name, d["kind"])
            assert d["apiVersion"] == API_VERSIONS[d["kind"]], (path.name, d["kind"])
            assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", d["metadata"]["name"])
            key = (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
            assert key not in seen, key
            seen.add(key)
            if d["kind"] != "Namespace":
                assert d["metadata"].get("namespace"), (path.name, key)


def test_valid_against_the_kubernetes_schemas() -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    version = kv.latest_version()
    for path in MANIFESTS:
        for d in load(path):
            kv.validate(d, version, strict=True)  # strict: unknown fields are errors


def test_service_objects() -> None:
    deployment = one("Deployment", "switchboard")
    service = one("Service", "switchboard")
    pdb = one("PodDisruptionBudget", "switchboard")
    assert deployment["spec"]["replicas"] == 3
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    for selector in (
        deployment["spec"]["selector"]["matchLabels"],
        pdb["spec"]["selector"]["matchLabels"],
        service["spec"]["selector"],
    ):
        assert selector and selector.items() <= pod_labels.items()
    assert 0 < pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    text = (K8S / "switchboard.yaml").read_text()
    assert "PostgreSQL" in text and "SQLite" in text  # replicas need PostgreSQL, said


def test_service_command_port_and_probes() -> None:
    deployment = one("Deployment", "switchboard")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    argv = [*c.get("command", []), *c["args"]]
    assert argv[:4] == ["switchboard", "serve", "--host", "0.0.0.0"], argv
    port = int(argv[argv.index("--port") + 1])
    (declared,) = c["ports"]
    assert declared["containerPort"] == port == 8000
    for probe, path in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")]:
        get = c[probe]["httpGet"]
        assert get["path"] == path
        assert get["port"] in (port, declared["name"])
    if "startupProbe" in c:
        assert c["startupProbe"]["httpGet"]["port"] in (port, declared["name"])
    service = one("Service", "switchboard")
    (sp,) = service["spec"]["ports"]
    assert sp["targetPort"] in (port, declared["name"])


def test_probe_paths_answer_without_a_token(tmp_path: Path) -> None:
    """The probes carry no token: their paths must exist in the app and be open."""
    import warnings

    with warnings.catch_warnings():  # starlette's note about httpx, as in conftest
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    from mla_switchboard.service.api.app import create_app
    from mla_switchboard.service.config import Settings

    (c,) = one("Deployment", "switchboard")["spec"]["template"]["spec"]["containers"]
    paths = {c[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe", "startupProbe")}
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'sb.db'}", admin_token=ADMIN))
    documented = app.openapi()["paths"]
    assert all("get" in documented.get(p, {}) for p in paths), paths
    with TestClient(app) as client:  # no Authorization header, like the kubelet
        for path in sorted(paths):
            r = client.get(path)
            assert r.status_code == 200, (path, r.text)


def test_secrets_referenced_exist_in_the_example() -> None:
    secrets = {
        (s["metadata"]["namespace"], s["metadata"]["name"]): {
            *s.get("stringData", {}),
            *s.get("data", {}),
        }
        for s in objects("Secret")
    }
    refs = []
    for _, spec, meta in pod_specs():
        for c in containers(spec):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    refs.append((meta["namespace"], ref["name"], ref["key"], e["name"]))
    assert {r[3] for r in refs} >= {
        "SWITCHBOARD_DATABASE_URL",
        "SWITCHBOARD_ADMIN_TOKEN",
        "SWITCHBOARD_TOKEN",
    }
    for namespace, name, key, var in refs:
        assert key in secrets.get((namespace, name), set()), (var, namespace, name, key)


def test_non_root_everywhere() -> None:
    uid = _dockerfile_uid()
    for name, spec, _ in pod_specs():
        pod_sc = spec["securityContext"]
        assert pod_sc["runAsNonRoot"] is True, name
        assert pod_sc.get("runAsUser", 1) != 0, name
        assert pod_sc["seccompProfile"]["type"] == "RuntimeDefault", name
        assert spec.get("automountServiceAccountToken") is False, name
        for c in containers(spec):
            sc = c["securityContext"]
            assert sc.get("runAsNonRoot", True) is True and sc.get("runAsUser", 1) != 0
            assert sc["allowPrivilegeEscalation"] is False, c["name"]
            assert "ALL" in sc["capabilities"]["drop"], c["name"]
            assert not sc.get("privileged", False)
    spec = one("Deployment", "switchboard")["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsUser"] == uid  # the image's own user
    (c,) = spec["containers"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    init, _ = init_and_main()
    assert init["securityContext"]["readOnlyRootFilesystem"] is True


def _dockerfile_uid() -> int:
    users = re.findall(r"^USER\s+(\S+)", (ROOT / "Dockerfile").read_text(), re.M)
    return int(users[-1].split(":")[0])


def test_image_tags_agree() -> None:
    images = [c["image"] for _, spec, _ in pod_specs() for c in containers(spec)]
    ours = [i for i in images if "switchboard" in i.rsplit("/", 1)[-1]]
    assert ours and all(i.rsplit(":", 1)[1] == VERSION for i in ours), (VERSION, ours)
    service_images = {
        c["image"]
        for d in objects("Deployment") + objects("Job")
        for c in containers(d["spec"]["template"]["spec"])
    }
    assert len(service_images) == 1, service_images
    assert service_images.pop().rsplit(":", 1)[0].endswith("/mla-switchboard")
    init, main = init_and_main()
    assert init["image"] == main["image"]  # the agent probes the image that serves


# ------------------------------------------------------------ the serving pod

ENV_FILE_WRITE = re.compile(r">\s*(/\S+)")
ENV_FILE_READ = re.compile(r"(?:^|[\s;&|])(?:\.|source)\s+(/\S+)")


def test_init_container_runs_the_agent() -> None:
    init, main = init_and_main()
    text = script(init)
    argv = shlex.split(text.split(">")[0])
    assert argv[:2] == ["switchboard", "select"], argv
    assert argv[argv.index("--format") + 1] == "env"
    assert argv[argv.index("--model") + 1].startswith("/models/")
    cluster = argv[argv.index("--cluster") + 1]
    assert cluster == "$(CLUSTER)" and "CLUSTER" in env_of(init)  # expanded by Kubernetes
    env = env_of(init)
    urls = env["SWITCHBOARD_URL"]["value"].split(",")
    assert len(urls) == 2 and all(re.fullmatch(r"https?://[^\s,/]+(:\d+)?", u) for u in urls)
    service = one("Service", "switchboard")
    in_cluster = (
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}"
        f".svc.cluster.local:{service['spec']['ports'][0]['port']}"
    )
    assert urls[0] == in_cluster
    assert env["SWITCHBOARD_TOKEN"]["valueFrom"]["secretKeyRef"]
    cache = argv[argv.index("--cache-dir") + 1]
    assert cache in {m["mountPath"] for m in init["volumeMounts"]}
    assert main["name"] != init["name"]


def test_env_file_handed_over_on_a_shared_volume() -> None:
    pod = serving_pod()
    init, main = init_and_main()
    (written,) = ENV_FILE_WRITE.findall(script(init))
    (read,) = ENV_FILE_READ.findall(script(main))
    assert written == read
    directory = str(Path(written).parent)
    mounts = [{m["mountPath"]: m["name"] for m in c["volumeMounts"]} for c in (init, main)]
    assert directory in mounts[0] and directory in mounts[1]
    assert mounts[0][directory] == mounts[1][directory]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "emptyDir" in volumes[mounts[0][directory]]
    # the model directory is mounted in both, read-only
    argv = shlex.split(script(init))
    model = argv[argv.index("--model") + 1]
    for c in (init, main):
        mounts_ro = [m["mountPath"] for m in c["volumeMounts"] if m.get("readOnly")]
        assert any(model.startswith(m + "/") for m in mounts_ro), c["name"]


def test_main_container_passes_the_vllm_args() -> None:
    _, main = init_and_main()
    text = script(main)
    (serve,) = [line for line in text.splitlines() if "vllm serve" in line]
    assert serve.strip().startswith("exec vllm serve /models/")
    # unquoted: one flag, or no argument at all for TORCH_SDPA
    assert serve.rstrip().endswith("$SWITCHBOARD_VLLM_ARGS")
    assert '"$SWITCHBOARD_VLLM_ARGS"' not in text
    ports = {p["containerPort"] for p in main["ports"]}
    assert int(re.search(r"--port\s+(\d+)", serve).group(1)) in ports  # type: ignore[union-attr]


# ------------------------------------------- the two scripts, run for real


def _k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of command and args (unknown names stay)."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m[1], m[0]), text)


def _run_pod(
    service: ThreadServer, tmp_path: Path, extra_agent_args: str = ""
) -> tuple[dict[str, str], list[str]]:
    """Run the init container's script, then the main container's, here: the pod's
    paths moved under tmp_path, `vllm` a stub. Returns the env file's variables and
    the arguments vllm got."""
    init, main = init_and_main()
    model = tmp_path / "models" / "DeepSeek-R1"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(
        (ROOT / "tests" / "agent" / "configs" / "deepseek-v3.json").read_text()
    )
    for d in ("switchboard", "cache", "bin", "tmp"):
        (tmp_path / d).mkdir(exist_ok=True)
    moved = {
        "/models/": f"{tmp_path}/models/",
        "/switchboard/": f"{tmp_path}/switchboard/",
        "/var/cache/switchboard": f"{tmp_path}/cache",
    }

    def here(text: str) -> str:
        for pod_path, local in moved.items():
            text = text.replace(pod_path, local)
        return text

    stub = tmp_path / "bin" / "vllm"
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "{tmp_path}/vllm-args"\n')
    stub.chmod(0o755)
    path = f"{tmp_path}/bin:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    base = {"PATH": path, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path / "tmp")}

    env = dict(base)
    for name, e in env_of(init).items():
        if "value" in e:
            env[name] = e["value"]
        elif "secretKeyRef" in e.get("valueFrom", {}):
            env[name] = ADMIN  # the admin token may do what an agent token may
        else:
            env[name] = {"SWITCHBOARD_POD": "deepseek-r1-0", "SWITCHBOARD_NODE": "gpu-1"}[name]
    # two URLs as in the manifest: the first one dead, the second the real service
    env["SWITCHBOARD_URL"] = f"http://127.0.0.1:{free_port()},{service.url}"
    init_script = here(_k8s_expand(script(init), env))
    if extra_agent_args:  # the dry-run flags go before the redirection
        init_script = init_script.replace(" >", f" {extra_agent_args} >", 1)
    done = subprocess.run(
        ["/bin/sh", "-c", init_script], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr

    main_env = {**base, **{n: e["value"] for n, e in env_of(main).items() if "value" in e}}
    main_env["HOME"] = str(tmp_path / "tmp")
    done = subprocess.run(
        ["/bin/sh", "-c", here(_k8s_expand(script(main), main_env))],
        env=main_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    env_file = (tmp_path / "switchboard" / "decision.env").read_text()
    exported = dict(re.findall(r"^export (\w+)=(.*)$", env_file, re.M))
    return exported, (tmp_path / "vllm-args").read_text().splitlines()


@pytest.fixture(scope="module")
def deploy_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadServer]:
    """The service the pod's scripts ask, over HTTP (served from a thread of this process)."""
    d = tmp_path_factory.mktemp("deploy")
    with serving(f"sqlite:///{d / 'switchboard.db'}") as service:
        yield service


def test_pod_scripts_without_gpu(deploy_service: ThreadServer, tmp_path: Path) -> None:
    """This machine has no GPU: vLLM has no MLA prefill backend for it (TORCH_SDPA is
    not one of vLLM's), so the agent refuses with the reason, exits 0, and vllm gets no
    prefill flag at all: it starts and chooses for itself."""
    exported, argv = _run_pod(deploy_service, tmp_path)
    assert set(exported) >= {
        "SWITCHBOARD_BACKEND",
        "SWITCHBOARD_SOURCE",
        "SWITCHBOARD_VLLM_ARGS",
        "SWITCHBOARD_REFUSAL",
    }
    assert shlex.split(exported["SWITCHBOARD_SOURCE"]) == ["refused"]
    assert shlex.split(exported["SWITCHBOARD_VLLM_ARGS"]) == [""]  # set, and empty
    assert shlex.split(exported["SWITCHBOARD_REFUSAL"])  # says why
    assert argv[:2] == ["serve", f"{tmp_path}/models/DeepSeek-R1"]
    assert not any(a.startswith("--attention-config") for a in argv)
    assert argv[-2:] == ["--port", "8000"]


def test_pod_scripts_on_an_h200(deploy_service: ThreadServer, tmp_path: Path) -> None:
    """Pretending to be an H200 (the agent's dry-run flag, added here only): the
    backend reaches vllm as the flag it understands."""
    exported, argv = _run_pod(
        deploy_service, tmp_path, "--capability 9.0 --device-name 'NVIDIA H200'"
    )
    backend = shlex.split(exported["SWITCHBOARD_BACKEND"])[0]
    assert backend == "FLASH_ATTN"
    assert argv[-1] == f"--attention-config.mla_prefill_backend={backend}"
