"""Fail static: a stopped, dead, hanging, refusing or flaky service never stops a pod.

Every service here is a real process or a real socket on loopback.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from mla_switchboard.agent import select_backend
from mla_switchboard.agent.cache import AnswerCache
from mla_switchboard.core.evaluator import Decision, decide_locally

from tests.conftest import MachineLoad

CONFIGS = Path(__file__).resolve().parent / "configs"
MODEL = CONFIGS / "deepseek-v3.json"
H200: dict[str, Any] = {
    "cluster": "agent-static",
    "capability": "9.0",
    "device_name": "NVIDIA H200",
    "packages": "any",
}


def _select(urls: list[str], cache_dir: Path, token: str | None = None, **extra: Any) -> Any:
    return select_backend(MODEL, urls=urls, token=token, cache_dir=cache_dir, **{**H200, **extra})


def _boot(urls: list[str], cache_dir: Path, token: str | None = None, **extra: Any) -> Any:
    """A boot on the GPU the ``gpu`` fixture shows the probe: not a dry run, so the
    answer cache is read and written (a dry run, ``_select``, touches neither)."""
    on_gpu = {"cluster": H200["cluster"], "packages": "any", "build": False}
    return select_backend(MODEL, urls=urls, token=token, cache_dir=cache_dir, **on_gpu, **extra)


def _select_count(service: Any, status: int) -> float:
    """How many POST /v1/select the service answered with ``status`` (its metrics)."""
    text = httpx.get(service.url + "/metrics", timeout=5).text
    pattern = (
        r'switchboard_request_seconds_count\{method="POST",route="/v1/select",'
        rf'status="{status}"\}} (\S+)'
    )
    match = re.search(pattern, text)
    return float(match.group(1)) if match else 0.0


@pytest.mark.serial
def test_cache_hit_with_the_service_stopped(
    service_factory: Any, sqlite_url: str, cache_dir: Path, machine_load: MachineLoad, gpu: Any
) -> None:
    gpu("NVIDIA H200", (9, 0))
    service = service_factory(sqlite_url).start()
    token = "test-admin-token"  # tests/conftest.py's bootstrap token
    first = _boot([service.url], cache_dir, token=token)
    assert (first.backend.value, first.source) == ("FLASH_ATTN", "priority")
    service.stop()

    started = time.monotonic()
    machine_load.restart()
    second = _boot([service.url], cache_dir, token=token, deadline=1.0)
    elapsed = time.monotonic() - started
    assert (second.backend, second.source, second.cached_source) == (
        first.backend,
        "cache",
        "priority",
    )
    assert second.decision_id == first.decision_id  # the decision it is based on
    assert second.candidates == first.candidates
    assert any(f"using the answer {service.url} gave, cached" in n for n in second.notes)
    assert elapsed < 1.0 + 1.0, machine_load.says(f"{elapsed:.2f} s")


def test_first_boot_with_the_service_down_decides_locally(closed_url: str, cache_dir: Path) -> None:
    result = _select([closed_url], cache_dir, deadline=0.5)
    assert result.source == "local-fallback" and result.decision_id is None
    local = decide_locally(result.request)
    assert isinstance(local, Decision) and local.backend == result.backend
    assert list(local.candidates) == result.candidates
    assert any("Connection refused" in n or "ConnectError" in n for n in result.notes)
    # The local answer is not cached: a later "cache" answer is always the service's.
    assert not list(cache_dir.glob("select-*.json"))


@pytest.mark.serial
def test_hanging_service_respects_the_deadline(
    hanging_server: Any, cache_dir: Path, machine_load: MachineLoad
) -> None:
    deadline = 0.6
    started = time.monotonic()
    result = _select([hanging_server.url], cache_dir, deadline=deadline)
    elapsed = time.monotonic() - started
    assert hanging_server.accepted.is_set()  # it did connect, then heard nothing
    assert result.source == "local-fallback"
    # generous bound for a slow CI box
    assert deadline * 0.8 <= elapsed < deadline + 1.0, machine_load.says(f"{elapsed:.2f} s")
    assert any("did not answer" in n for n in result.notes)


@pytest.mark.serial
def test_hanging_first_replica_leaves_time_for_the_second(
    hanging_server: Any, agent_service: Any, cache_dir: Path, machine_load: MachineLoad
) -> None:
    result = _select(
        [hanging_server.url, agent_service.url], cache_dir, token=agent_service.token, deadline=1.0
    )
    assert result.source == "priority", machine_load.says(result.notes)
    assert result.service_url == agent_service.url


def test_several_urls_with_the_first_dead(
    closed_url: str, agent_service: Any, cache_dir: Path
) -> None:
    # The service's own answer (not the cache or local fallback that a deadline spent on
    # the dead URL would give) shows that the agent failed over to the second URL.
    result = _select([closed_url, agent_service.url], cache_dir, token=agent_service.token)
    assert result.source == "priority" and result.service_url == agent_service.url


def test_4xx_from_the_real_service_is_not_retried(agent_service: Any, cache_dir: Path) -> None:
    before = _select_count(agent_service, 401)
    result = _select([agent_service.url], cache_dir, token="not-a-token")
    assert _select_count(agent_service, 401) == before + 1
    assert result.source == "auth-fallback"  # a bad token must not stop the pod either
    assert any("HTTP 401" in n and "unknown or revoked token" in n for n in result.notes)
    assert any(
        n.startswith("configuration error") and "SWITCHBOARD_TOKEN" in n for n in result.notes
    )


def test_a_cached_answer_after_a_refused_token_is_marked_as_such(
    agent_service: Any, cache_dir: Path, gpu: Any
) -> None:
    """The source and the log agree: a refused token is a configuration error whether
    the pod then boots on its cached answer or on a local decision, never "cache" (which
    reads as an outage)."""
    gpu("NVIDIA H200", (9, 0))
    good = _boot([agent_service.url], cache_dir, token=agent_service.token)
    assert good.source == "priority"
    refused = _boot([agent_service.url], cache_dir, token="not-a-token")
    assert (refused.source, refused.cached_source) == ("auth-fallback", "priority")
    assert refused.backend == good.backend and refused.decision_id == good.decision_id
    assert refused.to_dict()["source"] == "auth-fallback"
    problem = next(n for n in refused.notes if n.startswith("configuration error"))
    assert "(source auth-fallback)" in problem and "HTTP 401" in problem
    assert any(n.startswith("using the answer cached") for n in refused.notes)


@pytest.mark.parametrize("body", [b'{"detail": {"message": "no"}}', b'["no"]', b"no"])
def test_4xx_is_not_retried_nor_sent_to_the_next_url(
    scripted_server: Any, agent_service: Any, cache_dir: Path, body: bytes
) -> None:
    scripted_server.script = [(400, {}, body)] * 3
    result = _select([scripted_server.url, agent_service.url], cache_dir, token=agent_service.token)
    assert scripted_server.requests == 1
    assert result.source == "local-fallback"


@pytest.mark.serial
def test_503_is_retried_honouring_retry_after(
    scripted_server: Any, agent_service: Any, cache_dir: Path, machine_load: MachineLoad
) -> None:
    scripted_server.script = [(503, {"Retry-After": "1"}, b"busy")]
    started = time.monotonic()
    result = _select([scripted_server.url], cache_dir, token=agent_service.token, deadline=3.0)
    elapsed = time.monotonic() - started
    assert scripted_server.requests == 2
    assert result.source == "priority", machine_load.says(result.notes)
    assert elapsed >= 1.0


def test_429_and_500_are_retried_with_backoff(
    scripted_server: Any, agent_service: Any, cache_dir: Path
) -> None:
    scripted_server.script = [(429, {}, b"slow down"), (500, {}, b"oops")]
    result = _select([scripted_server.url], cache_dir, token=agent_service.token)
    assert scripted_server.requests == 3
    assert result.source == "priority"


def test_a_304_nobody_asked_for_is_not_trusted(
    scripted_server: Any, agent_service: Any, cache_dir: Path
) -> None:
    scripted_server.script = [(304, {"ETag": '"x"'}, b"")]
    result = _select([scripted_server.url], cache_dir, token=agent_service.token)
    assert scripted_server.requests == 2 and result.source == "priority"


@pytest.mark.serial
def test_retry_after_past_the_deadline_gives_up_at_once(
    scripted_server: Any, cache_dir: Path, machine_load: MachineLoad
) -> None:
    scripted_server.script = [(503, {"Retry-After": "120"}, b"maintenance")]
    started = time.monotonic()
    result = _select([scripted_server.url], cache_dir, deadline=5.0)
    # giving up at once, not sleeping into the deadline (generous bound for a busy box)
    elapsed = time.monotonic() - started
    assert elapsed < 2.5, machine_load.says(f"{elapsed:.2f} s")
    assert scripted_server.requests == 1 and result.source == "local-fallback"
    assert any("retry after 120.0s" in n for n in result.notes)


def test_corrupt_cache_is_ignored_with_a_warning(
    agent_service: Any, closed_url: str, cache_dir: Path, gpu: Any
) -> None:
    gpu("NVIDIA H200", (9, 0))
    good = _boot([agent_service.url], cache_dir, token=agent_service.token)
    path = AnswerCache(cache_dir).path_for(good.request)
    assert path.exists()
    path.write_text('{"format": 1, "key": "trunc')

    down = _boot([closed_url], cache_dir, deadline=0.3)
    assert down.source == "local-fallback"
    assert any("is corrupt" in n for n in down.notes)

    up = _boot([agent_service.url], cache_dir, token=agent_service.token)
    assert up.source == "priority" and not up.revalidated  # no usable ETag: a full answer
    assert any("is corrupt" in n for n in up.notes)
    entry, problem = AnswerCache(cache_dir).load(good.request)
    assert problem is None and entry is not None  # rewritten whole
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".tmp")]

    again = _boot([closed_url], cache_dir, deadline=0.3)
    assert again.source == "cache" and again.backend == good.backend


@pytest.mark.parametrize(
    "content",
    ["", "null", '{"format": 1}', '{"format": 1, "key": "other", "response": {}}', "\x00\xff"],
)
def test_cache_load_survives_any_file(tmp_path: Path, content: str) -> None:
    result = _select([], tmp_path / "c")  # local answer, for a real request object
    cache = AnswerCache(tmp_path / "c")
    cache.path_for(result.request).parent.mkdir(parents=True, exist_ok=True)
    cache.path_for(result.request).write_bytes(content.encode("latin-1"))
    entry, problem = cache.load(result.request)
    assert entry is None and problem is not None and "ignoring it" in problem
