"""The stage pods' samples, as the rollout guards and the rollout progress read them:
each pod's stage bucket is stored with it, so reading a stage's samples since it began
is a filter on what the index keeps, never a re-hash, and its cost does not follow the
rest of the situation's history."""

from __future__ import annotations

import random
import statistics
import time
from datetime import UTC, datetime, timedelta

import pytest
from mla_switchboard.core import rollouts
from mla_switchboard.core.evidence import EvidenceIndex, Observation, Situation
from mla_switchboard.core.schemas import Override, OverrideSpec, Rollout, rollout_id
from mla_switchboard.core.stages import STAGE_BUCKETS, bucket_in_stage, stage_bucket, stage_buckets

from tests.core.conftest import override

S = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", "{}", "switchboard")
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def ok(cluster: str, pod: str, tflops: float, when: datetime | None, backend: str = "CUDNN"):  # type: ignore[no-untyped-def]
    return Observation(S, backend, pod, tflops, ok=True, cluster=cluster, at=when)


def staged(percent: int, state: str = "active") -> Override:
    body = {"force": "CUDNN"}
    rid = rollout_id("*", OverrideSpec.model_validate({**body, "note": "x"}))
    return override(
        "*",
        **body,
        rollout={"percent": percent, "id": rid, "state": state, "max_slowdown_pct": 5},
    )


def brute_force(
    index: EvidenceIndex, buckets: frozenset[int | None], since: datetime | None
) -> list[tuple[str, str, float]]:
    """What ``stage_samples`` must give: every counted sample, hashed and filtered."""
    key = None if since is None else since
    return [
        (c, p, t)
        for c, p, t, when in _counted_with_times(index)
        if stage_bucket(c, p) in buckets and (key is None or (when is not None and when >= key))
    ]


def _counted_with_times(index: EvidenceIndex) -> list[tuple[str, str, float, datetime | None]]:
    return [
        (o.cluster, o.pod, o.tflops or 0.0, o.at)
        for o in index.counted()
        if o.ok and o.situation == S and o.backend == "CUDNN"
    ]


def test_stage_buckets_are_the_buckets_bucket_in_stage_admits() -> None:
    for percent in (1, 7, 20, 50, 99, 100):
        for state in ("active", "halted", "complete"):
            r = staged(percent, state).rollout
            assert r is not None
            expected = {b for b in range(STAGE_BUCKETS) if bucket_in_stage(b, r)}
            assert stage_buckets(r) == expected, (percent, state)


def test_stage_samples_are_the_filter_of_everything_counted() -> None:
    """Random reports (older and newer than what pods hold, more than ``per_pod``) and
    prunes: the kept per-bucket order always gives what a full walk and hash gives."""
    rng = random.Random(19)
    index = EvidenceIndex(per_pod=4)
    pods = [(f"c{k % 3}", f"p{k}") for k in range(60)]
    for step in range(3000):
        cluster, pod = rng.choice(pods)
        when = None if rng.random() < 0.03 else at(rng.uniform(0, 600))
        index.add([ok(cluster, pod, rng.uniform(100, 500), when)])
        if step % 500 == 499:
            index.prune(at(step / 5), timedelta(minutes=200))
        if step % 100 == 0:
            buckets = frozenset(rng.sample(range(STAGE_BUCKETS), rng.randint(1, 60)))
            since = None if rng.random() < 0.2 else at(rng.uniform(0, 600))
            got = index.stage_samples(S, "CUDNN", buckets, since)
            assert sorted(got) == sorted(brute_force(index, buckets, since)), step


def test_a_pod_whose_samples_all_expire_leaves_its_bucket() -> None:
    index = EvidenceIndex()
    index.add([ok("c", "p1", 100.0, at(0)), ok("c", "p2", 200.0, at(60))])
    every: frozenset[int | None] = frozenset(range(STAGE_BUCKETS))
    assert sorted(index.stage_samples(S, "CUDNN", every)) == [
        ("c", "p1", 100.0),
        ("c", "p2", 200.0),
    ]
    index.prune(at(90), timedelta(minutes=60))  # p1's only sample expires
    assert index.stage_samples(S, "CUDNN", every) == [("c", "p2", 200.0)]
    index.add([ok("c", "p1", 150.0, at(95))])  # and comes back with a new one
    assert sorted(index.stage_samples(S, "CUDNN", every, at(90))) == [("c", "p1", 150.0)]


def test_the_speed_guard_compares_only_what_it_is_given() -> None:
    o = staged(50)
    r = o.rollout
    assert isinstance(r, Rollout)
    slow = {"CUDNN": [("c", "a", 400.0), ("c", "a", 401.0), ("c", "b", 402.0)]}
    fast = {"FLASH_ATTN": [("c", "a", 600.0), ("c", "b", 601.0), ("c", "b", 602.0)]}
    given = {**slow, **fast}
    found = rollouts.slowdown(o, "CUDNN", "FLASH_ATTN", lambda b: given.get(b, []))
    assert found is not None and round(found.percent_slower, 1) == 33.3
    reason = found.reason(r.max_slowdown_pct)
    assert "3 samples from 2 pods: c/a, c/b; clusters c" in reason
    # one pod of the stage alone is not enough, whatever it measured
    one_pod = {b: [s for s in v if s[1] == "a"] * 3 for b, v in given.items()}
    assert rollouts.slowdown(o, "CUDNN", "FLASH_ATTN", lambda b: one_pod.get(b, [])) is None


def _history(n: int, stage: frozenset[int], started: datetime) -> EvidenceIndex:
    """``n`` samples from before the stage (any pod) and from pods outside it, plus the
    same 8 samples of 2 stage pods since the stage began, at every size."""
    index = EvidenceIndex()
    batch = []
    for i in range(n):
        pod = f"old-{i // 8}"
        inside = stage_bucket("c", pod) in stage
        when = started - timedelta(minutes=1 + i % 50) if inside else started + timedelta(seconds=i)
        batch.append(ok("c", pod, 300.0 + i % 7, when))
        if len(batch) == 256:
            index.add(batch)
            batch = []
    index.add(batch)
    fresh = [p for p in (f"stage-{k}" for k in range(500)) if stage_bucket("c", p) in stage][:2]
    index.add(
        [ok("c", p, 400.0 + k, started + timedelta(seconds=5 + k)) for p in fresh for k in range(4)]
    )
    return index


@pytest.mark.serial
def test_reading_a_stage_costs_the_same_at_10x_the_history() -> None:
    """6,400 and 64,000 samples in the situation, the stage's own 8 the same: the read
    costs the same (thread CPU time, median of 9 runs of 50 reads, sizes alternating);
    a walk over every sample costs 10x."""
    r = staged(20).rollout
    assert r is not None
    buckets = stage_buckets(r)
    started = at(1000)
    small, large = _history(6_400, buckets, started), _history(64_000, buckets, started)
    assert len(small.stage_samples(S, "CUDNN", buckets, started)) == 8
    assert len(large.stage_samples(S, "CUDNN", buckets, started)) == 8

    def cost(index: EvidenceIndex) -> float:
        began = time.thread_time()
        for _ in range(50):
            index.stage_samples(S, "CUDNN", buckets, started)
        return time.thread_time() - began

    runs: dict[str, list[float]] = {"small": [], "large": []}
    for _ in range(9):
        runs["small"].append(cost(small))
        runs["large"].append(cost(large))
    small_s, large_s = statistics.median(runs["small"]), statistics.median(runs["large"])
    print(f"50 stage reads: {small_s * 1e3:.2f} ms at 6,400, {large_s * 1e3:.2f} ms at 64,000")
    assert large_s < 2 * small_s, (small_s, large_s)
