"""Growth with the clusters that hold an override of their own: a fleet of 100 clusters
with an override on 10 of them, then on all 100 (every second one staged, every fifth
under policy measured), through the in-process app on SQLite.

What is compared is the number of evaluations (``assess``, which every ``decide``
calls) the operation makes, not its time: a count does not depend on the machine's
load. A kept figure of a cluster costs no evaluation, and an override's effect is
looked up per cluster (``OverrideSet``: ``tests/core/test_override_index.py``), so an
operation that concerns one cluster costs that cluster's groups at both sizes (measured:
6 evaluations for the summary, 8-14 for a preview or an admin write, at 10 and at 100
overrides). Before the per-cluster parts, the summary after one pod booted evaluated
the fleet's groups again (103, then 376) and a preview or an admin write of one
cluster's override replayed every cluster that held an override of its own (424-428,
then 980-984), each evaluation reading every override.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from mla_switchboard.core import evaluator
from mla_switchboard.core.schemas import OverrideSpec
from mla_switchboard.service.fleet import effects

from bench.scale import cluster_names, fill_decisions, fill_evidence, make_fleet, open_store
from tests.conftest import make_inprocess_client

CLUSTERS = 100
PODS = 600
DEPLOYMENTS = 4
SIZES = (10, 100)
ONE_CLUSTER = DEPLOYMENTS * 4 * 2
"""The most evaluations a replay of one cluster's groups costs: its deployments, up to
four stage classes (its staged rollout in force and the one proposed) and two
decisions each (before and after)."""


def spec(i: int, note: str = "growth") -> dict[str, Any]:
    body: dict[str, Any] = {"deny": ["TRTLLM_RAGGED"], "note": f"{note} {i}"}
    if i % 2 == 1:
        body["rollout"] = {"percent": 10}
    if i % 5 == 0:
        body["policy"] = "measured"
    return body


class Counted:
    """Evaluations made since ``reset``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.n = 0
        real = evaluator.assess

        def counting(*args: Any, **kwargs: Any) -> Any:
            self.n += 1
            return real(*args, **kwargs)

        # decide() calls the module's assess; fleet reads' shared ones import it by name
        monkeypatch.setattr(evaluator, "assess", counting)
        monkeypatch.setattr(effects, "assess", counting)

    def of(self, call: Callable[[], object]) -> int:
        self.n = 0
        call()
        return self.n


def ok(r: httpx.Response) -> httpx.Response:
    assert r.status_code < 300, r.text
    return r


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> dict[int, str]:
    """A filled SQLite store per size: the same pods, overrides on the first N clusters."""
    out = {}
    names = cluster_names(CLUSTERS)
    fleet = make_fleet(PODS, CLUSTERS, deployments=DEPLOYMENTS)
    for size in SIZES:
        url = f"sqlite:///{tmp_path_factory.mktemp(f'growth-{size}') / 'switchboard.db'}"
        store = open_store(url)
        for i, cluster in enumerate(names[:size]):
            store.config.put_override(
                cluster,
                OverrideSpec.model_validate(spec(i)),
                actor="growth-test",
                if_match=None,
                preview=None,
            )
        fill_decisions(store, fleet, 1)
        fill_evidence(store, fleet, PODS)
        store.engine.dispose()
        out[size] = url
    return out


def operations(client: httpx.Client, counted: Counted) -> Iterator[tuple[str, int]]:
    """Each operation once, warm (the first summary and preview are the cold start)."""
    names = cluster_names(CLUSTERS)
    seq = itertools.count()
    fleet = make_fleet(PODS, CLUSTERS, deployments=DEPLOYMENTS)

    def boot() -> None:
        pod = fleet[7]
        ok(client.post("/v1/select", json={**pod.request, "pod": f"new-{next(seq)}"}))

    def summary() -> None:
        ok(client.get("/v1/selections/summary"))

    def preview(cluster: str) -> None:
        body = spec(3, f"preview {next(seq)}")
        ok(client.put(f"/v1/overrides/{cluster}", params={"dry_run": "true"}, json=body))

    summary()
    preview(names[2])
    boot()
    yield "summary after a pod booted", counted.of(summary)
    yield "preview of one cluster's override", counted.of(lambda: preview(names[5]))
    write = spec(7, f"written {next(seq)}")
    yield (
        "admin PUT of one cluster's override",
        counted.of(lambda: ok(client.put(f"/v1/overrides/{names[7]}", json=write))),
    )
    yield "summary after that write", counted.of(summary)
    yield "preview after that write", counted.of(lambda: preview(names[9]))
    yield (
        "admin DELETE of one cluster's override",
        counted.of(lambda: ok(client.delete(f"/v1/overrides/{names[7]}"))),
    )


def test_ten_times_the_overrides_cost_less_than_twice(
    fleets: dict[int, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    counted = Counted(monkeypatch)
    costs: dict[int, dict[str, int]] = {}
    for size, url in fleets.items():
        with make_inprocess_client(url) as client:  # type: ignore[attr-defined]
            costs[size] = dict(operations(client, counted))
    small, large = (costs[s] for s in SIZES)
    for name in small:
        assert large[name] <= max(2 * small[name], ONE_CLUSTER), (
            f"{name}: {large[name]} evaluations with {SIZES[1]} overrides against "
            f"{small[name]} with {SIZES[0]} (all: {costs})"
        )
        assert large[name] <= ONE_CLUSTER, f"{name}: {large[name]} evaluations (all: {costs})"
