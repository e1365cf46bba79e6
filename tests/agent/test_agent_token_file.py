"""The agent's bearer token from a file, read afresh at each request: the kubelet
rewrites a pod's projected service-account token before it expires, so a token read
once at boot would be refused later. The static token stands in when the file cannot
be read."""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path

from mla_switchboard.agent.api import token_problem
from mla_switchboard.agent.client import ServiceRefused, _headers
from mla_switchboard.agent.commands.parsing import settings_from
from mla_switchboard.agent.notes import Notes
from mla_switchboard.agent.pod import PodSpec, describe_pod
from mla_switchboard.agent.settings import (
    POD,
    TOKEN,
    TOKEN_FILE,
    AgentSettings,
    TokenFile,
    token_source_problem,
)
from mla_switchboard.agent.workload_token import pod_name_of

CONFIG = str(Path(__file__).resolve().parent / "configs" / "deepseek-v3.json")


def test_the_file_is_read_at_each_request(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first.jwt.token\n")
    settings = AgentSettings.from_environ({TOKEN_FILE: str(path), TOKEN: "sb_static"})
    source = settings.bearer
    assert isinstance(source, TokenFile)
    assert _headers(source)["Authorization"] == "Bearer first.jwt.token"
    path.write_text("rotated.jwt.token")  # the kubelet's refresh
    assert _headers(source)["Authorization"] == "Bearer rotated.jwt.token"
    path.unlink()  # unreadable: the static token
    assert _headers(source)["Authorization"] == "Bearer sb_static"
    path.write_text("  \n")  # empty: the static token
    assert _headers(source)["Authorization"] == "Bearer sb_static"


def test_without_a_file_the_static_token_is_sent() -> None:
    assert AgentSettings.from_environ({TOKEN: "sb_static"}).bearer == "sb_static"
    assert "Authorization" not in _headers(AgentSettings.from_environ({}).bearer)
    assert "Authorization" not in _headers(TokenFile("/nonexistent/token"))


def test_the_flag_takes_the_place_of_the_variable(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import argparse

    monkeypatch.setenv(TOKEN_FILE, "/from/env")
    assert settings_from(argparse.Namespace(token_file=None)).token_file == "/from/env"
    assert settings_from(argparse.Namespace(token_file="/from/flag")).token_file == "/from/flag"


def test_an_unreadable_file_is_said_with_its_path_and_why(tmp_path: Path) -> None:
    """A mistyped path is said (which file, why, what is sent instead), not left to
    surface as the service's "missing bearer token"."""
    missing = TokenFile("/nonexistent/token")
    assert missing.problem() == (
        "cannot read the token file /nonexistent/token (--token-file or "
        "SWITCHBOARD_TOKEN_FILE): No such file or directory; sending no token"
    )
    assert token_source_problem(missing) == missing.problem()
    assert "sending SWITCHBOARD_TOKEN (or --token) instead" in str(
        TokenFile("/nonexistent/token", "sb_static").problem()
    )
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert str(TokenFile(str(empty)).problem()).endswith(": it is empty; sending no token")
    empty.write_text("a.b.c")
    assert TokenFile(str(empty)).problem() is None
    assert token_source_problem("sb_static") is None and token_source_problem(None) is None


def _projected(pod: str) -> str:
    """A token shaped like the kubelet's projection (unsigned: the agent never verifies)."""
    claims = {
        "iss": "https://kubernetes.default.svc",
        "kubernetes.io": {
            "namespace": "inference",
            "pod": {"name": pod, "uid": "0f1e"},
            "serviceaccount": {"name": "switchboard-agent", "uid": "9a8b"},
        },
    }
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{payload}.c2ln"


def test_the_agent_names_itself_from_its_projected_token(tmp_path: Path) -> None:
    """The service holds a pod to the name its token is bound to; the hostname may
    differ (a pod on the host network has its node's), so the token's name comes first,
    and a name given explicitly before that."""
    path = tmp_path / "token"
    path.write_text(_projected("deepseek-r1-0"))
    assert pod_name_of(path.read_text()) == "deepseek-r1-0"
    assert pod_name_of("sb_0123456789ab_secret") is None and pod_name_of("a.b.c") is None
    spec = PodSpec(
        CONFIG, cluster="prod-east", capability="9.0", device_name="NVIDIA H200", packages="any"
    )
    from_token = AgentSettings.from_environ({TOKEN_FILE: str(path)})
    assert describe_pod(spec, from_token, Notes()).request.pod == "deepseek-r1-0"
    given = AgentSettings.from_environ({TOKEN_FILE: str(path), POD: "named"})
    assert describe_pod(spec, given, Notes()).request.pod == "named"
    static = AgentSettings.from_environ({TOKEN: "sb_static"})
    assert describe_pod(spec, static, Notes()).request.pod == socket.gethostname()


def test_a_refused_workload_token_gets_workload_advice(tmp_path: Path) -> None:
    """A pod that presented its own service-account token is not told to create a
    static token; an unreadable token file is named as the cause of a 401."""
    path = tmp_path / "token"
    path.write_text(_projected("deepseek-r1-0"))
    mismatch = ServiceRefused(
        403,
        {"message": "pod: the service-account token was issued to pod 'x'", "field": "pod"},
        "http://switchboard",
    )
    advice = token_problem(mismatch, token=TokenFile(str(path)))
    assert "token create" not in advice
    assert "own service-account token" in advice and "SWITCHBOARD_POD" in advice
    assert "token create --role agent --clusters" in token_problem(mismatch, token="sb_static")
    rejected = ServiceRefused(
        401, {"message": "workload token rejected: wrong audience"}, "http://switchboard"
    )
    advice = token_problem(rejected, token=TokenFile(str(path)))
    assert "token create" not in advice and "audience" in advice
    missing = ServiceRefused(401, {"message": "missing bearer token"}, "http://switchboard")
    advice = token_problem(missing, token=TokenFile("/nonexistent/token"))
    assert "cannot read the token file /nonexistent/token" in advice
    assert "No such file or directory" in advice and "fix the path" in advice
