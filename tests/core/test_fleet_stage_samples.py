"""A rollout's stage samples kept across fleet reads (``progress.StageSamples``) are
what reading the cluster's evidence gives, and are read again once it changes."""

from __future__ import annotations

from mla_switchboard.core.evidence import EvidenceIndex, Observation, situation_of
from mla_switchboard.service.fleet.progress import RolloutTally, StageSamples

from tests.core.test_fleet_replay import SHAPES, staged

SITUATION = situation_of(SHAPES[0])


def report(index: EvidenceIndex, cluster: str, tflops: float, pods: range) -> None:
    assert SITUATION is not None
    index.add(
        Observation(SITUATION, "FLASHINFER", f"{cluster}-{i}", tflops, ok=True, cluster=cluster)
        for i in pods
    )


def test_kept_samples_are_the_evidences_until_it_changes() -> None:
    assert SITUATION is not None
    index = EvidenceIndex(min_samples=1, min_pods=1)
    report(index, "east", 600.0, range(40))
    report(index, "west", 100.0, range(40))  # another cluster's: never east's figures
    tally = RolloutTally.of(staged("east", 30, force="FLASHINFER"))
    kept = StageSamples()

    first = kept.of(tally, index, "east", SITUATION, "FLASHINFER")
    assert first == tally.speeds(index, "east", SITUATION, "FLASHINFER")
    inside, outside = first
    assert inside and outside  # 40 pods: some in a 30 % stage, some out
    assert set(inside) | set(outside) == {600.0}
    assert kept.of(tally, index, "east", SITUATION, "FLASHINFER") is first  # read once

    report(index, "east", 900.0, range(40, 80))  # the index moves its version
    again = kept.of(tally, index, "east", SITUATION, "FLASHINFER")
    assert again == tally.speeds(index, "east", SITUATION, "FLASHINFER")
    assert 900.0 in set(again[0]) | set(again[1])

    other = EvidenceIndex(min_samples=1, min_pods=1)  # a reload: another index object
    assert kept.of(tally, other, "east", SITUATION, "FLASHINFER") == ((), ())
