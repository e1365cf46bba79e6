"""The Kubernetes manifests in deploy/k8s: well formed, consistent with each other,
with the app, the Dockerfile and the agent; and the serving pod's two scripts work
together against a real service.

No cluster here: the checks are static (YAML, the Kubernetes schemas through
kubernetes-validate when installed), plus the init container's and the main
container's shell scripts run on this machine as Kubernetes would run them, with
``vllm`` replaced by a stub that records its arguments. The pod-identity example is
checked the same way: its issuers file through the service's own settings loader, and
its init container signing in with a projected token against a real service.
"""

from __future__ import annotations

import fnmatch
import json
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
from mla_switchboard.core.names import cluster_matches
from mla_switchboard.service.config import Settings
from mla_switchboard.service.identity.issuer_keys import parse_jwks

from tests.conftest import ADMIN, ROOT, free_port
from tests.served import ThreadServer, serving
from tests.service.workload_issuer import TestIssuer

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
        "workload-identity-example.yaml",
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


def test_no_controller_adopts_a_pod_of_another_example() -> None:
    """A ReplicaSet adopts every ownerless pod of its namespace that its selector
    matches: the standalone serving pod must not be taken over by a Deployment."""
    for d in objects("Deployment"):
        selector = d["spec"]["selector"]["matchLabels"].items()
        assert selector <= d["spec"]["template"]["metadata"]["labels"].items()
        for pod in objects("Pod"):
            if pod["metadata"]["namespace"] == d["metadata"]["namespace"]:
                assert not selector <= pod["metadata"]["labels"].items(), d["metadata"]["name"]


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
    service_images = {  # the service's own namespace; serving Deployments run vLLM's image
        c["image"]
        for d in objects("Deployment") + objects("Job")
        if d["metadata"]["namespace"] == "switchboard"
        for c in containers(d["spec"]["template"]["spec"])
    }
    assert len(service_images) == 1, service_images
    assert service_images.pop().rsplit(":", 1)[0].endswith("/mla-switchboard")
    for _, spec, _ in pod_specs():
        (init,), (main,) = spec.get("initContainers", [None]), spec["containers"]
        if init is not None:  # the agent probes the image that serves
            assert init["image"] == main["image"]


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
    service: ThreadServer,
    tmp_path: Path,
    extra_agent_args: str = "",
    pod: tuple[dict[str, Any], dict[str, Any]] | None = None,
    token_file: Path | None = None,
) -> tuple[dict[str, str], list[str]]:
    """Run the init container's script, then the main container's, here: the pod's
    paths moved under tmp_path, `vllm` a stub. ``pod``: its (init, main) containers,
    the serving pod's by default; ``token_file``: where the projected token lies here.
    Returns the env file's variables and the arguments vllm got."""
    init, main = pod or init_and_main()
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
    if "SWITCHBOARD_TOKEN_FILE" in env:
        assert token_file is not None, "the pod reads a projected token: give its file"
        env["SWITCHBOARD_TOKEN_FILE"] = str(token_file)
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


# ------------------------------------------------ pod identity (workload tokens)

IDENTITY = "deepseek-r1"  # the serving Deployment of workload-identity-example.yaml


def identity_pod() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The pod-identity serving Deployment's (pod spec, init container, main container)."""
    spec = one("Deployment", IDENTITY)["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    (main,) = spec["containers"]
    return spec, init, main


def issuers_configmap() -> dict[str, Any]:
    return one("ConfigMap", "switchboard-workload-issuers")


def issuers_file(tmp_path: Path, **replace: str) -> Path:
    """The ConfigMap's issuers.json written out as the service would read it, its
    mount path moved to ``tmp_path`` (and any other text replaced as given)."""
    data = issuers_configmap()["data"]
    mount = str(Path(data["issuers-file"]).parent)
    text = data["issuers.json"].replace(mount, str(tmp_path))
    for old, new in replace.items():
        text = text.replace(old, new)
    for name, content in data.items():
        if name.endswith(".json"):
            (tmp_path / name).write_text(content)
    path = tmp_path / "issuers.json"
    path.write_text(text)
    return path


def cluster_of(init: dict[str, Any]) -> str:
    return env_of(init)["CLUSTER"]["value"]


def test_the_serving_pods_run_as_their_service_account_with_a_projected_token() -> None:
    deployment = one("Deployment", IDENTITY)
    spec, init, main = identity_pod()
    namespace = deployment["metadata"]["namespace"]
    account = one("ServiceAccount", spec["serviceAccountName"])
    assert account["metadata"]["namespace"] == namespace
    assert spec["automountServiceAccountToken"] is False  # no API-server credential
    volumes = {v["name"]: v for v in spec["volumes"]}
    env = env_of(init)
    token_path = Path(env["SWITCHBOARD_TOKEN_FILE"]["value"])
    assert "SWITCHBOARD_TOKEN" not in env  # no static token beside it
    (mount,) = [m for m in init["volumeMounts"] if m["mountPath"] == str(token_path.parent)]
    assert mount.get("readOnly") is True
    assert all(m["name"] != mount["name"] for m in main["volumeMounts"])  # vllm never sees it
    (source,) = volumes[mount["name"]]["projected"]["sources"]
    projected = source["serviceAccountToken"]
    assert projected["path"] == token_path.name
    assert projected["expirationSeconds"] >= 600  # the kubelet's minimum
    # the service trusts exactly one issuer for this pod's cluster, for this audience
    # and service account
    entries = Settings(workload_issuers=json.loads(issuers_configmap()["data"]["issuers.json"]))
    matched = [e for e in entries.workload_issuers if cluster_matches(cluster_of(init), e.clusters)]
    (entry,) = matched
    assert entry.audience == projected["audience"]
    bound = f"{namespace}/{spec['serviceAccountName']}"
    assert entry.service_accounts and any(
        fnmatch.fnmatchcase(bound, glob) for glob in entry.service_accounts
    )
    # the static-token example's cluster has no issuer: its token keeps working there
    init_static, _ = init_and_main()
    assert not any(
        cluster_matches(cluster_of(init_static), e.clusters) for e in entries.workload_issuers
    )


def test_the_issuers_file_loads_with_the_services_own_settings(tmp_path: Path) -> None:
    """What the service reads at start: SWITCHBOARD_WORKLOAD_ISSUERS_FILE, from the
    ConfigMap switchboard.yaml mounts (optionally: the service starts without it)."""
    settings = Settings(workload_issuers_file=issuers_file(tmp_path))
    assert settings.workload_issuers, "no issuer in the example"
    for entry in settings.workload_issuers:
        assert entry.service_accounts, entry.issuer  # bound, as docs/security.md advises
        if entry.jwks_file is not None:
            assert entry.jwks_file.exists(), entry.jwks_file  # a key of the ConfigMap
            parse_jwks(json.loads(entry.jwks_file.read_text()))
    # the service's Deployment mounts the ConfigMap where its issuers-file key says
    data = issuers_configmap()["data"]
    spec = one("Deployment", "switchboard")["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    ref = env_of(c)["SWITCHBOARD_WORKLOAD_ISSUERS_FILE"]["valueFrom"]["configMapKeyRef"]
    assert ref["name"] == issuers_configmap()["metadata"]["name"]
    assert ref["key"] in data and ref.get("optional") is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [
        m for m in c["volumeMounts"] if m["mountPath"] == str(Path(data[ref["key"]]).parent)
    ]
    assert volumes[mount["name"]]["configMap"] == {"name": ref["name"], "optional": True}
    assert mount.get("readOnly") is True
    assert issuers_configmap()["metadata"]["namespace"] == "switchboard"


def test_a_bad_issuers_file_is_refused_with_the_field_named(tmp_path: Path) -> None:
    path = issuers_file(tmp_path, **{'"audience": "switchboard"': '"audience": ""'})
    with pytest.raises(ValueError, match=r"workload_issuers_file: .*\[0\.audience\]"):
        Settings(workload_issuers_file=path)


@pytest.fixture(scope="module")
def issuer() -> Any:
    yield from TestIssuer.serving()


def test_pod_identity_signs_in_with_the_projected_token(issuer: TestIssuer, tmp_path: Path) -> None:
    """The example's issuers file with the prod-west issuer pointed at a local one: the
    init container, reading the projected token from its file, is answered (a refused
    token would exit 3 under --fail-on-auth-error); the shared static token is refused
    for that cluster, as the example says."""
    _, init, main = identity_pod()
    entry = next(
        e
        for e in Settings(workload_issuers_file=issuers_file(tmp_path)).workload_issuers
        if cluster_matches(cluster_of(init), e.clusters)
    )
    path = issuers_file(tmp_path, **{entry.issuer: issuer.url})
    service = ThreadServer(
        f"sqlite:///{tmp_path / 'switchboard.db'}", workload_issuers_file=path
    ).start()
    try:
        namespace = one("Deployment", IDENTITY)["metadata"]["namespace"]
        token = tmp_path / "switchboard-token"
        token.write_text(issuer.token("deepseek-r1-0", namespace=namespace))
        exported, argv = _run_pod(
            service, tmp_path / "pod", "--fail-on-auth-error", (init, main), token
        )
        assert shlex.split(exported["SWITCHBOARD_SOURCE"]) == ["refused"]  # no GPU here
        assert argv[-2:] == ["--port", "8000"]
        static = subprocess.run(
            [
                *(sys.executable, "-m", "mla_switchboard.cli", "select", "--fail-on-auth-error"),
                *("--model", str(tmp_path / "pod" / "models" / "DeepSeek-R1")),
                *("--cluster", cluster_of(init), "--engine", "vllm==0.33.0"),
            ],
            env={**os.environ, "SWITCHBOARD_URL": service.url, "SWITCHBOARD_TOKEN": ADMIN},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert static.returncode == 3, static.stderr
        assert "requires workload identity" in static.stderr
    finally:
        service.stop()
