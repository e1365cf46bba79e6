"""The evidence index's bounds: what counts per pod, what a write costs, what readers
see while it is written, and expiry."""

from __future__ import annotations

import gc
import random
import statistics
import threading
import time
from array import array
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

import pytest
from mla_switchboard.core.evidence import (
    EMPTY,
    EvidenceIndex,
    FailureNote,
    FailurePolicy,
    Observation,
    Situation,
)
from mla_switchboard.core.specs import Backend

S = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", "{}", "switchboard")
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
FI = Backend.FLASHINFER


def ok(pod: str, tflops: float, at: datetime | None = T0, *, cluster: str = "c", impl: str = "fa3",
       backend: str = "FLASHINFER") -> Observation:  # fmt: skip
    return Observation(S, backend, pod, tflops, ok=True, cluster=cluster, at=at, impl=impl)


def failed(
    pod: str, at: datetime | None = T0, error: str = "boom", cluster: str = "c"
) -> Observation:
    return Observation(S, "FLASHINFER", pod, None, ok=False, cluster=cluster, at=at, error=error)


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def test_only_a_pods_most_recent_samples_count() -> None:
    index = EvidenceIndex([ok("p", float(i), minutes(i)) for i in range(10)], per_pod=8)
    stats = index.group(S)[FI]
    assert (stats.samples, stats.pods) == (8, 1)
    assert sorted(t for _, _, t in index.samples(S, FI)) == [float(i) for i in range(2, 10)]
    assert stats.median_tflops == 5.5  # of 2..9


def test_an_older_sample_arriving_late_takes_its_place_in_time() -> None:
    index = EvidenceIndex([ok("p", 10.0, minutes(10)), ok("p", 30.0, minutes(30))], per_pod=2)
    index.add([ok("p", 20.0, minutes(20))])  # newer than 10: 10 makes room
    assert index.pod_samples(S, FI, "c", "p") == [20.0, 30.0]
    assert not index.add([ok("p", 5.0, minutes(5))])  # older than all it counts: nothing
    assert index.pod_samples(S, FI, "c", "p") == [20.0, 30.0]


def test_eviction_keeps_median_samples_and_pods_right() -> None:
    """Against a brute-force reading of the same observations."""
    rng = random.Random(7)
    observations = [
        ok(f"pod-{rng.randrange(12)}", float(rng.randrange(50)), minutes(rng.randrange(500)),
           cluster=rng.choice(["a", "b"]), impl=rng.choice(["fa2", "fa3"]))
        for _ in range(600)
    ]  # fmt: skip
    index = EvidenceIndex(per_pod=3)
    for start in range(0, len(observations), 37):  # in batches, as reports arrive
        index.add(observations[start : start + 37])
    kept: dict[tuple[str, str], list[Observation]] = {}
    for o in observations:  # stable sort by time: ties keep arrival order
        kept.setdefault((o.cluster, o.pod), []).append(o)
    counted = [o for mine in kept.values() for o in sorted(mine, key=lambda o: o.at or T0)[-3:]]
    stats = index.group(S)[FI]
    assert stats.samples == len(counted)
    assert stats.pods == len(kept)
    assert stats.median_tflops == statistics.median(o.tflops or 0.0 for o in counted)
    assert stats.impls == {o.impl for o in counted}
    assert sorted(index.samples(S, FI)) == sorted((o.cluster, o.pod, o.tflops) for o in counted)


def test_the_same_pod_name_in_two_clusters_is_two_pods() -> None:
    index = EvidenceIndex([ok("p", 1.0, cluster="a"), ok("p", 2.0, cluster="b")])
    assert index.group(S)[FI].pods == 2


def test_a_failing_pod_counts_once_with_its_newest_note() -> None:
    index = EvidenceIndex(
        [failed("p", minutes(5), "newer"), failed("p", minutes(1), "older"), failed("q")]
    )
    failures = index.group(S)[FI].failures
    assert [(f.pod, f.error) for f in failures] == [("p", "newer"), ("q", "boom")]  # newest first
    assert index.summary(minutes(10))[0]["failures"] == 2


@pytest.mark.parametrize("min_pods", [1, 2, 3])
def test_the_fast_exclusion_reads_as_the_general_one(min_pods: int) -> None:
    rng = random.Random(min_pods)
    policy = FailurePolicy(min_pods=min_pods, window=timedelta(hours=1))
    notes = [
        FailureNote("c", f"p{rng.randrange(6)}", minutes(rng.randrange(-180, 0)), f"e{i}")
        for i in range(20)
    ]
    index = EvidenceIndex([failed(n.pod, n.at, n.error) for n in notes], failure_policy=policy)
    for now in (T0, minutes(30), minutes(-60)):
        assert index.exclusions(S, now).get(FI) == policy.exclusion(notes, now)


def test_prune_drops_what_left_the_window_and_says_so() -> None:
    policy = FailurePolicy(min_pods=1, window=timedelta(hours=1))
    index = EvidenceIndex(
        [ok("p", 1.0, minutes(0)), ok("p", 2.0, minutes(60)), ok("q", 3.0, None),
         failed("r", minutes(0))],
        failure_policy=policy,
    )  # fmt: skip
    version = index.version
    assert not index.prune(minutes(30), timedelta(days=1))  # nothing due: no change
    assert index.version == version
    assert index.exclusions(S, minutes(30))
    # the failure leaves the policy's window: cached decisions must go
    assert index.prune(minutes(61), timedelta(days=1))
    assert index.version > version and not index.exclusions(S, minutes(61))
    assert not index.prune(minutes(62), timedelta(days=1))
    # 30 minutes of evidence window: the sample at 0 and the failure go, the undated stays
    assert index.prune(minutes(70), timedelta(minutes=30))
    stats = index.group(S)[FI]
    assert (stats.samples, stats.pods, stats.failures) == (2, 2, ())
    assert index.prune(minutes(200), timedelta(minutes=30))
    assert index.group(S)[FI].samples == 1  # only the undated sample is left
    index.prune(minutes(200), timedelta(minutes=30))
    assert [t for _, _, t in index.samples(S, FI)] == [3.0]


def test_a_situation_with_nothing_left_disappears() -> None:
    index = EvidenceIndex([ok("p", 1.0, minutes(0))])
    assert index.prune(minutes(100), timedelta(minutes=10))
    assert index.group(S) == {} and index.summary() == []


def test_version_changes_only_when_something_counts() -> None:
    index = EvidenceIndex()
    assert index.version == 0
    assert index.add([ok("p", 1.0)])
    assert index.version == 1
    assert not index.add([Observation(S, "NOT_A_BACKEND", "p", 1.0, ok=True)])
    assert not index.add([])
    assert index.version == 1


def test_with_observations_copies() -> None:
    old = EvidenceIndex([ok("p", 1.0, minutes(0))], per_pod=2)
    new = old.with_observations([ok("p", 2.0, minutes(1)), ok("p", 3.0, minutes(2))])
    assert old.pod_samples(S, FI, "c", "p") == [1.0]
    assert new.pod_samples(S, FI, "c", "p") == [2.0, 3.0]  # the bound carries over
    assert new.per_pod == 2


def test_the_shared_empty_index_cannot_be_written() -> None:
    with pytest.raises(TypeError):
        EMPTY.add([ok("p", 1.0)])


def test_readers_never_see_half_a_write() -> None:
    """Each write adds one sample to two backends of one situation; a reader on
    another thread always finds them equal."""
    index = EvidenceIndex(per_pod=4)
    stop = threading.Event()
    seen: list[tuple[int, int]] = []

    def read() -> None:
        while not stop.is_set():
            group = index.group(S)
            if group:
                seen.append((group[FI].samples, group[Backend.CUDNN].samples))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(3000):
            at = minutes(i)
            index.add([ok(f"p{i % 50}", 1.0, at), ok(f"p{i % 50}", 2.0, at, backend="CUDNN")])
    finally:
        stop.set()
        reader.join()
    assert seen and all(a == b for a, b in seen)


# ------------------------------------------------------------------- growth


def _one_situation(n: int, pods: int = 2000, situation: Situation = S) -> list[Observation]:
    """``n`` results in one situation: ``pods`` pods boot again and again."""
    backends = ["FLASHINFER", "CUDNN", "FLASH_ATTN", "TORCH_SDPA"]
    return [
        Observation(
            situation, backends[i % 4], f"pod-{i % pods}", 100.0 + (i * 7919) % 500, ok=True,
            cluster="c", at=minutes(i / 60), impl="fa3",
        )
        for i in range(n)
    ]  # fmt: skip


def _build_s(*sets: list[Observation], rounds: int = 3) -> list[float]:
    """For each set, the best of ``rounds`` builds in reports of 256 results, in this
    thread's CPU time (other processes on a shared machine delay the wall clock, not
    this count). The sets take turns within each round, so a change in the machine's
    load during the test weighs on each alike. The garbage collector is off meanwhile:
    its passes grow with everything the test process holds, not with this index (what
    the index costs the collector is measured on its own, in objects)."""
    best = [float("inf")] * len(sets)
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for k, observations in enumerate(sets):
                started = time.thread_time()
                index = EvidenceIndex()
                for start in range(0, len(observations), 256):
                    index.add(observations[start : start + 256])
                best[k] = min(best[k], time.thread_time() - started)
                del index
    finally:
        gc.enable()
    return best


@pytest.mark.serial
def test_cost_grows_linearly_with_the_history_of_one_situation() -> None:
    """64,000 results in one situation cost about what 64,000 spread over ten
    situations cost (the same memory, so the machine's caches weigh the same), and
    about ten times 6,400 (a copy per observation made that 54x for 4x)."""
    large = _one_situation(64_000)
    spread = [
        o
        for k in range(10)
        for o in _one_situation(6_400, pods=200, situation=replace(S, device=f"GPU {k}"))
    ]
    small = _one_situation(6_400, pods=200)
    large_s, spread_s, small_s = _build_s(large, spread, small)
    # linear: about 1x and 10x; a copy per observation made the second 54x for 4x (a
    # quadratic cost would be 100x here). Ten times the memory also misses the caches
    # more: 15-17x in a long test process, hence the wide bound on the second ratio
    # and the narrow one on the first, which compares equal memory.
    assert large_s < 2 * spread_s, (large_s, spread_s)
    assert large_s < 30 * small_s, (large_s, small_s)
    # one more report on top of 64,000 results costs what it costs on an empty index
    index = EvidenceIndex(large)
    started = time.thread_time()
    index.add(_one_situation(256))
    assert time.thread_time() - started < 0.05


def test_the_sorted_values_give_the_median_under_adds_and_removes() -> None:
    """The median every write publishes, read from the tally's sorted values, is the
    median of what they hold, whatever was added and removed before."""
    from mla_switchboard.core.evidence.values import median
    from sortedcontainers import SortedList

    rng = random.Random(3)
    values, flat = SortedList(), []
    values._reset(4)  # splits and merges its sublists within a few dozen items
    for step in range(3000):
        if flat and rng.random() < 0.45:
            value = rng.choice(flat)
            values.remove(value)
            flat.remove(value)
        else:
            value = float(rng.randrange(40))
            values.add(value)
            flat.append(value)
        if step % 50 == 0:
            flat.sort()
            assert list(values) == flat and len(values) == len(flat)
            assert median(values) == (statistics.median(flat) if flat else None)
            assert not values._index  # read off the sublists: no positional index built


# ------------------------------------------------------------ the garbage collector


CONTAINERS = (tuple, list, dict, set, frozenset, array, MappingProxyType)
OURS = (EvidenceIndex.__module__.rpartition(".")[0], "sortedcontainers")


def _tracked_below(root: object) -> int:
    """How many objects the cyclic garbage collector tracks in what ``root`` holds: its
    containers, the evidence package's own objects and the sorted lists it keeps (not
    their classes, modules or locks)."""
    seen: set[int] = set()
    stack = [root]
    tracked = 0
    while stack:
        obj = stack.pop()
        ours = type(obj).__module__.startswith(OURS)
        if id(obj) in seen or not (ours or isinstance(obj, CONTAINERS)):
            continue
        seen.add(id(obj))
        tracked += gc.is_tracked(obj)
        stack.extend(r for r in gc.get_referents(obj) if not isinstance(r, type))
    return tracked


@pytest.mark.parametrize("pods", [2_000, 20_000])
def test_evidence_gives_the_collector_a_few_objects_whatever_the_pods(pods: int) -> None:
    """A collection holds every thread, the event loop's too, for as long as it walks
    the objects it tracks: a replica's evidence (every pod's samples, each stage
    bucket's order) must be a few objects per situation and backend, not one per pod
    (one or two per pod made a full collection 100 ms at 100,000 results)."""
    rng = random.Random(pods)
    index = EvidenceIndex(
        [
            ok(f"p{i}", rng.uniform(400, 700), minutes(i % 600), backend=b, cluster=f"c{i % 7}")
            for i in range(pods)
            for b in ("FLASHINFER", "CUDNN")
        ]
    )
    gc.collect()
    gc.collect()  # a tuple of tuples is left untracked over two passes
    tallies = 2
    chunks = 2 * pods // 256 * 2  # the sorted TFLOP/s: one list per few hundred values
    assert _tracked_below(index) < 100 * tallies + chunks, pods


# ------------------------------------------------------------------ clears


def test_a_clear_forgets_the_failures_noted_until_then_and_nothing_else() -> None:
    cudnn = Observation(S, "CUDNN", "q", None, ok=False, cluster="c", at=minutes(5), error="x")
    index = EvidenceIndex(
        [failed("p1", minutes(1)), failed("p2", minutes(9)), cudnn, ok("p3", 600.0)]
    )
    version = index.version
    assert index.clear_failures(S, FI, before=minutes(5))
    stats = index.group(S)
    assert [f.pod for f in stats[FI].failures] == ["p2"]  # noted after the clear: stays
    assert stats[FI].samples == 1  # samples are not failures
    assert len(stats[Backend.CUDNN].failures) == 1  # another backend's
    assert index.version > version
    assert not index.clear_failures(S, FI, before=minutes(5))  # nothing left to clear
    assert index.clear_failures(S, None, before=minutes(10))  # every backend
    assert Backend.CUDNN not in index.group(S)  # nothing left of it
    assert not index.group(S)[FI].failures
    other = replace(S, device="NVIDIA H100")
    assert not index.clear_failures(other, None, before=minutes(10))
