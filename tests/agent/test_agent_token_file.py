"""The agent's bearer token from a file, read afresh at each request: the kubelet
rewrites a pod's projected service-account token before it expires, so a token read
once at boot would be refused later. The static token stands in when the file cannot
be read."""

from __future__ import annotations

from pathlib import Path

from mla_switchboard.agent.client import _headers
from mla_switchboard.agent.commands.parsing import settings_from
from mla_switchboard.agent.settings import TOKEN, TOKEN_FILE, AgentSettings, TokenFile


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
