"""Seed a running Switchboard service with a small fleet, for the README's walkthrough.

Sends ``POST /v1/select`` as the pods of three clusters would at boot, so that the
summary, the override preview and the dashboard have something real to show:

- ``prod-east``: 412 H200 pods whose vLLM config asks for FLASHINFER, and 20 that ask
  for nothing (the seed rules give those FLASH_ATTN);
- ``prod-west``: 300 B200 pods (TRTLLM_RAGGED by the seed rules);
- ``staging``: 40 H200 pods asking for FLASHINFER.

Every pod reports every kernel package of the backend registry (``core/specs.py``, read
from this checkout: it is standard library only), so the seeded fleet is a fully
equipped one whatever backends the registry has. Standard library only, so that it runs
with any Python 3.11+ (no install needed):

    python3 scripts/seed_fleet.py --url http://127.0.0.1:8000 --token "$TOKEN"

Running it again re-sends the same pods (each pod counts once, with its latest decision).
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

SPECS_FILE = Path(__file__).resolve().parents[1] / "core" / "specs.py"
SEEDED_VERSION = "0+seed"  # what each seeded pod reports as every package's version


def backend_registry() -> ModuleType:
    """``core/specs.py`` of this checkout, loaded by path: the registry is standard
    library only, so reading it needs no install of the package."""
    spec = importlib.util.spec_from_file_location("switchboard_backend_registry", SPECS_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def packages() -> dict[str, str]:
    """Every kernel package the registry names, as a fully equipped pod reports them."""
    return dict.fromkeys(backend_registry().KERNEL_PACKAGES, SEEDED_VERSION)


R1 = {
    "name": "deepseek-ai/DeepSeek-R1",
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_heads": 128,
}
H200 = {"name": "NVIDIA H200", "capability": [9, 0]}
B200 = {"name": "NVIDIA B200", "capability": [10, 0]}

# (cluster, pod prefix, pods, device, requested backend)
FLEET = [
    ("prod-east", "r1-fi", 412, H200, "FLASHINFER"),
    ("prod-east", "r1", 20, H200, None),
    ("prod-west", "r1", 300, B200, None),
    ("staging", "r1-fi", 40, H200, "FLASHINFER"),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Seed a running Switchboard service with a small fleet (README walkthrough).",
        epilog="environment variables read: SWITCHBOARD_URL, SWITCHBOARD_TOKEN",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("SWITCHBOARD_URL", "http://127.0.0.1:8000"),
        help="the service (default $SWITCHBOARD_URL, else http://127.0.0.1:8000)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("SWITCHBOARD_TOKEN"),
        help="an agent or admin token (default $SWITCHBOARD_TOKEN)",
    )
    args = parser.parse_args(argv)
    url = urlsplit(args.url)
    if url.scheme not in ("http", "https") or not url.hostname:
        parser.error(f"argument --url: {args.url!r} is not an http:// or https:// URL")
    if not args.token:
        parser.error("argument --token: required (or set SWITCHBOARD_TOKEN)")

    conn_class = (
        http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    )
    conn = conn_class(url.hostname, url.port, timeout=10)  # one kept-alive connection
    headers = {"Authorization": f"Bearer {args.token}", "Content-Type": "application/json"}
    got: Counter[tuple[str, str]] = Counter()
    equipped = packages()
    for cluster, prefix, count, device, requested in FLEET:
        for i in range(count):
            body = {
                "cluster": cluster,
                "node": f"{cluster}-node-{i // 8:03d}",
                "pod": f"{prefix}-{i:04d}",
                "device": device,
                "model": R1,
                "dtype": "bfloat16",
                "packages": equipped,
                "requested_backend": requested,
            }
            try:
                conn.request("POST", "/v1/select", body=json.dumps(body), headers=headers)
                answer = conn.getresponse()
                text = answer.read()
            except OSError as exc:
                print(f"seed_fleet: cannot reach {args.url}: {exc}", file=sys.stderr)
                return 1
            if answer.status != 200:
                print(
                    f"seed_fleet: POST /v1/select answered {answer.status}: {text[:300]!r}",
                    file=sys.stderr,
                )
                return 1
            got[(cluster, json.loads(text)["backend"])] += 1
    for (cluster, backend), pods in sorted(got.items()):
        print(f"{cluster:10} {backend:14} {pods:4} pods")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
