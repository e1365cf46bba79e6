"""What the pod's own projected service-account token says about it, read unverified.

The service verifies the token; the agent reads only the pod's name from it
(``kubernetes.io.pod.name``) to name itself, because the hostname need not be the
pod's name (a pod on the host network carries its node's, a pod spec may set another
``hostname``). Nothing is trusted on this reading: the service refuses a pod that
names itself wrongly all the same. Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

__all__ = ["claims_of", "is_workload_token", "pod_name_of"]


def claims_of(token: str | None) -> dict[str, Any] | None:
    """A JWT's claims, unverified; None when ``token`` is not a JWT (a static token)."""
    parts = (token or "").split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(payload))
    except (binascii.Error, ValueError):
        return None
    return claims if isinstance(claims, dict) else None


def is_workload_token(token: str | None) -> bool:
    """Whether ``token`` is a Kubernetes service-account token (it has the
    ``kubernetes.io`` claims), as opposed to a static Switchboard token."""
    claims = claims_of(token)
    return claims is not None and isinstance(claims.get("kubernetes.io"), dict)


def pod_name_of(token: str | None) -> str | None:
    """The pod a projected token is bound to (``kubernetes.io.pod.name``), or None."""
    claims = claims_of(token) or {}
    k8s = claims.get("kubernetes.io")
    pod = k8s.get("pod") if isinstance(k8s, dict) else None
    name = pod.get("name") if isinstance(pod, dict) else None
    return name if isinstance(name, str) and name.strip() else None
