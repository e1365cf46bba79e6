"""The evidence index's structures, table by table: a pod's record, the sorted
TFLOP/s built in bulk, the stage buckets kept in time order, the expiry heap, the bulk
loader (equal to adding one by one), and what building and pruning cost as the pods
of one situation grow."""

from __future__ import annotations

import gc
import math
import random
import statistics
import struct
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from mla_switchboard.core.evidence import EvidenceIndex, EvidenceLoader, Observation, Situation
from mla_switchboard.core.evidence import index as evidence_index
from mla_switchboard.core.evidence.records import RECORD as _RECORD
from mla_switchboard.core.evidence.records import expiry_entry as _expiry
from mla_switchboard.core.evidence.records import expiry_key as _expiry_key
from mla_switchboard.core.evidence.records import expiry_time as _expiry_time
from mla_switchboard.core.evidence.records import split_expired as _split_expired
from mla_switchboard.core.evidence.records import with_sample as _with_sample
from mla_switchboard.core.evidence.tallies import ALL, SPLIT_AT
from mla_switchboard.core.evidence.values import median, sorted_in_pieces
from mla_switchboard.core.specs import Backend
from mla_switchboard.core.stages import STAGE_BUCKETS, stage_bucket

from tests.conftest import MachineLoad

S = Situation("NVIDIA H200", "9.0", "128,64,128", "bfloat16", "{}", "switchboard")
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
FI = Backend.FLASHINFER
INF = math.inf


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def record(*samples: tuple[float, float]) -> bytes:
    return b"".join(_RECORD.pack(at, value, 0) for at, value in samples)


def times(rec: bytes) -> list[tuple[float, float]]:
    return [(at, value) for at, value, _ in _RECORD.iter_unpack(rec)]


# ------------------------------------------------------------- a pod's record


@pytest.mark.parametrize(
    ("held", "new", "per_pod", "kept", "made_room"),
    [
        # newer than all: appended
        ([(1, 10), (2, 20)], (3, 30), 3, [(1, 10), (2, 20), (3, 30)], None),
        # full: the oldest makes room
        ([(1, 10), (2, 20)], (3, 30), 2, [(2, 20), (3, 30)], (1, 10)),
        # a late one takes its place in time, the oldest makes room
        ([(1, 10), (3, 30)], (2, 20), 2, [(2, 20), (3, 30)], (1, 10)),
        # older than all of a full record: nothing
        ([(2, 20), (3, 30)], (1, 10), 2, None, None),
        # older than all of a record with room: first
        ([(2, 20)], (1, 10), 2, [(1, 10), (2, 20)], None),
        # the same time as the oldest of a full record: after it, and the older goes
        ([(2, 20), (3, 30)], (2, 21), 2, [(2, 21), (3, 30)], (2, 20)),
        # the same time as the newest: after it
        ([(1, 10), (2, 20)], (2, 22), 3, [(1, 10), (2, 20), (2, 22)], None),
        # undated samples are the oldest: the first to make room
        ([(-INF, 5), (2, 20)], (3, 30), 2, [(2, 20), (3, 30)], (-INF, 5)),
        ([(2, 20)], (-INF, 5), 2, [(-INF, 5), (2, 20)], None),
    ],
)
def test_a_record_keeps_a_pods_newest_samples_in_time_order(
    held: list[tuple[float, float]],
    new: tuple[float, float],
    per_pod: int,
    kept: list[tuple[float, float]] | None,
    made_room: tuple[float, float] | None,
) -> None:
    got = _with_sample(record(*held), record(new), new[0], per_pod)
    if kept is None:
        assert got is None
        return
    assert got is not None
    assert times(got[0]) == kept
    assert (None if got[1] is None else times(got[1])[0]) == made_room


@pytest.mark.parametrize(
    ("held", "cutoff", "kept", "expired"),
    [
        ([(1, 10), (2, 20), (3, 30)], 2.5, [(3, 30)], [(1, 10), (2, 20)]),
        ([(1, 10), (2, 20)], 1, [(1, 10), (2, 20)], []),  # at the cutoff: stays
        ([(1, 10), (2, 20)], 9, [], [(1, 10), (2, 20)]),
        ([(-INF, 5), (1, 10), (2, 20)], 9, [(-INF, 5)], [(1, 10), (2, 20)]),  # undated stay
    ],
)
def test_expiry_drops_the_dated_samples_before_the_cutoff(
    held: list[tuple[float, float]],
    cutoff: float,
    kept: list[tuple[float, float]],
    expired: list[tuple[float, float]],
) -> None:
    stays, gone = _split_expired(record(*held), cutoff)
    assert (times(stays), times(gone)) == (kept, expired)


def test_expiry_entries_sort_as_their_times_and_give_them_back() -> None:
    """A heap entry is bytes (nothing for the collector to track): its order is its
    time's, and it gives the time and the pod back exactly."""
    times = [0.0, 1.5, -1.5, 1e-300, -1e-300, 5e-324, 1796218604.495756,
             1796218604.495757, -1796218604.495756, math.inf, -math.inf]  # fmt: skip
    pods = [f"c\0p{i}-\u00e9" for i in range(len(times))]
    entries = [_expiry(t, pod) for t, pod in zip(times, pods, strict=True)]
    assert [_expiry_time(e) for e in entries] == times
    assert [_expiry_key(e) for e in entries] == pods
    assert [_expiry_time(e) for e in sorted(entries)] == sorted(times)


# ---------------------------------------------------- sorted TFLOP/s in bulk


def _uniform(rng: random.Random, low: float, high: float, n: int) -> list[float]:
    return [rng.uniform(low, high) for _ in range(n)]


@pytest.mark.parametrize(
    "values",
    [
        [],
        [1.0],
        [3.0, 1.0, 2.0],
        [1.0] * 5000,  # one value: every splitter equal
        [float(i % 3) for i in range(7000)],  # a few values, many times each
        [float(i) for i in range(20_000)],  # already sorted
        [float(-i) for i in range(20_000)],  # reversed
        _uniform(random.Random(4), 300, 700, 50_000),
        [
            x + d
            for x, d in zip(
                [400.0, 401.5, 650.0] * 3000, _uniform(random.Random(5), 0, 1e-9, 9000), strict=True
            )
        ],
    ],
    ids=["empty", "one", "three", "equal", "few", "sorted", "reversed", "random", "clustered"],
)
def test_bulk_sorted_floats_read_as_a_sorted_list(values: list[float]) -> None:
    small = {"piece": 512, "splitter_every": 16}  # many bins and pieces at small sizes
    pauses: list[int] = []
    for sizes in ({}, small):
        built = sorted_in_pieces(list(values), lambda: pauses.append(1), **sizes)
        assert list(built) == sorted(values) and len(built) == len(values)
        assert median(built) == (statistics.median(values) if values else None)
        built._check()  # the list's own invariants hold on what a bulk load built
        # and it stays a sorted multiset under the writes that follow
        flat = sorted(values)
        rng = random.Random(len(values))
        for _ in range(300):
            if flat and rng.random() < 0.5:
                v = rng.choice(flat)
                built.remove(v)
                flat.remove(v)
            else:
                v = rng.choice(flat) if flat and rng.random() < 0.3 else rng.uniform(-5, 800)
                built.add(v)
                flat.append(v)
                flat.sort()
        assert list(built) == flat
        assert median(built) == (statistics.median(flat) if flat else None)
    if len(values) > 2 * small["piece"]:
        assert pauses  # a bulk sort is done in steps


# --------------------------------------------------------- buckets in order


def ok(pod: str, tflops: float, at: datetime | None, *, cluster: str = "c",
       backend: str = "FLASHINFER", impl: str = "fa3") -> Observation:  # fmt: skip
    return Observation(S, backend, pod, tflops, ok=True, cluster=cluster, at=at, impl=impl)


def failed(
    pod: str, at: datetime | None, *, cluster: str = "c", error: str = "boom"
) -> Observation:
    return Observation(S, "FLASHINFER", pod, None, ok=False, cluster=cluster, at=at, error=error)


def brute_stage(
    observations: list[Observation], per_pod: int, buckets: set[int | None], since: datetime
) -> list[tuple[str, str, float]]:
    """The counted samples of ``buckets`` since ``since``, from a plain reading."""
    kept: dict[tuple[str, str], list[Observation]] = {}
    for o in observations:
        if o.ok:
            kept.setdefault((o.cluster, o.pod), []).append(o)
    out = []
    for (cluster, pod), mine in kept.items():
        counted = sorted(mine, key=lambda o: o.at or datetime.min.replace(tzinfo=UTC))
        for o in counted[-per_pod:]:
            if stage_bucket(cluster, pod) in buckets and o.at is not None and o.at >= since:
                out.append((cluster, pod, o.tflops or 0.0))
    return sorted(out)


def test_late_reports_keep_a_buckets_order_right() -> None:
    """Reports arrive out of time order (another replica's, read late): the stage's
    samples since a time are still exactly the ones reported since then."""
    rng = random.Random(11)
    observations = [
        ok(f"p{rng.randrange(300)}", float(rng.randrange(100)), minutes(rng.randrange(1000)))
        for _ in range(3000)
    ]
    index = EvidenceIndex(per_pod=3)
    for start in range(0, len(observations), 50):
        index.add(observations[start : start + 50])
    assert any(t.disordered for t in index._tallies[S].values())  # late ones came
    buckets = set(range(0, STAGE_BUCKETS, 3)) | {None}
    for since in (minutes(0), minutes(500), minutes(990)):
        got = sorted(index.stage_samples(S, FI, buckets, since))
        assert got == brute_stage(observations, 3, buckets, since)
    for tally in index._tallies[S].values():  # each read bucket is in order again
        for home in {tally.home(bucket) for bucket in buckets}:
            pods = tally.buckets.get(home, {})
            newest = [times(r)[-1][0] for r in pods.values()]
            assert newest == sorted(newest)


# ------------------------------------------------------------- the loader


S2 = replace(S, device="NVIDIA B200")
"""A situation only prod-a reports: every index that takes prod-a holds the same."""


def random_history(seed: int, n: int = 4000) -> list[Observation]:
    """Results and failures of a few clusters and backends, with late reports, times
    shared by several results, undated results and wrong ones; and a situation of
    one cluster's."""
    rng = random.Random(seed)
    out = []
    for _ in range(n // 10):
        pod, tflops = f"pod-{rng.randrange(40)}", float(rng.randrange(300, 400))
        mine = ok(pod, tflops, minutes(rng.randrange(600)), cluster="prod-a")
        out.append(replace(mine, situation=S2))
    for _ in range(n):
        cluster = rng.choice(["prod-a", "prod-b", "bench-1", "bench-2"])
        pod = f"pod-{rng.randrange(150)}"
        at = None if rng.random() < 0.02 else minutes(rng.randrange(600))
        if rng.random() < 0.03:
            out.append(failed(pod, at, cluster=cluster, error=f"e{rng.randrange(9)}"))
            continue
        backend = rng.choice(["FLASHINFER", "CUDNN", "NOT_A_BACKEND"])
        out.append(ok(pod, float(rng.randrange(200, 700)), at, cluster=cluster, backend=backend,
                      impl=rng.choice(["fa2", "fa3", ""])))  # fmt: skip
    return out


def snapshot(index: EvidenceIndex) -> object:
    """Everything a reader can see of an index."""
    out = []
    for row in index.summary(minutes(300)):
        out.append(sorted(row.items(), key=str))
    for backend in (FI, Backend.CUDNN):
        out.append(sorted(index.samples(S, backend)))
        out.append(sorted(index.stage_samples(S, backend, set(range(50)) | {None}, minutes(200))))
        out.append([index.pod_samples(S, backend, c, f"pod-{p}")
                    for c in ("prod-a", "bench-2") for p in range(0, 150, 7)])  # fmt: skip
        failures = index.group(S).get(backend)
        out.append(None if failures is None else failures.failures)
    out.append(sorted(index.samples(S2, FI)))
    out.append(sorted(index.stage_samples(S2, FI, set(range(100)), minutes(300))))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_bulk_load_equals_adding_one_by_one(seed: int) -> None:
    """The same history, through the loader into several indexes at once (every
    cluster, each cluster, a scope of two), reads exactly as indexes that took it
    report by report; and they stay equal through the writes and prunes after."""
    history = random_history(seed)
    groups = {"all": None, "prod-a": {"prod-a"}, "bench": {"bench-1", "bench-2"}}

    def made() -> dict[str, EvidenceIndex]:
        return {name: EvidenceIndex(per_pod=3, min_pods=1) for name in groups}

    one_by_one, loaded = made(), made()
    for name, index in one_by_one.items():
        mine = [o for o in history if groups[name] is None or o.cluster in groups[name]]  # type: ignore[operator]
        for start in range(0, len(mine), 40):
            index.add(mine[start : start + 40])
    loader = EvidenceLoader(per_pod=3)
    for start in range(0, len(history), 40):
        loader.add(history[start : start + 40])
    pauses: list[int] = []
    loader.build(
        lambda cluster: [i for n, i in loaded.items() if groups[n] is None or cluster in groups[n]],  # type: ignore[operator]
        lambda: pauses.append(1),
    )
    for name in groups:
        assert snapshot(loaded[name]) == snapshot(one_by_one[name]), name
        assert loaded[name].version > 0
    more = random_history(seed + 100, 300)
    for name in groups:
        for index in (one_by_one[name], loaded[name]):
            index.add(o for o in more if groups[name] is None or o.cluster in groups[name])  # type: ignore[operator]
            index.prune(minutes(700), timedelta(minutes=400))
        assert snapshot(loaded[name]) == snapshot(one_by_one[name]), name


def test_a_loader_keeps_only_what_counts_whatever_the_history() -> None:
    """Every pod reporting a hundred times: the loader holds each pod's newest few,
    not the history (what a long one costs at start-up is the time to read it)."""
    loader = EvidenceLoader(per_pod=4)
    for report in range(100):
        loader.add([ok(f"p{i}", float(report), minutes(report)) for i in range(50)])
    held = sum(len(r) for records in loader._records.values() for r in records.values())
    assert held == 50 * 4 * _RECORD.size
    index = EvidenceIndex(per_pod=4)
    loader.build(lambda cluster: [index])
    assert sorted({t for _, _, t in index.samples(S, FI)}) == [96.0, 97.0, 98.0, 99.0]


def test_a_loader_fills_only_empty_indexes_of_its_bound() -> None:
    loader = EvidenceLoader(per_pod=3)
    loader.add([ok("p", 1.0, minutes(0))])
    with pytest.raises(ValueError, match="per_pod"):
        loader.build(lambda cluster: [EvidenceIndex(per_pod=8)])
    with pytest.raises(ValueError, match="empty"):
        loader.build(lambda cluster: [EvidenceIndex([ok("q", 1.0, minutes(0))], per_pod=3)])


def test_a_scope_built_from_other_indexes_shares_their_records() -> None:
    a = EvidenceIndex([ok(f"a{i}", 500.0 + i, minutes(i), cluster="a") for i in range(20)])
    b = EvidenceIndex([ok(f"b{i}", 400.0 + i, minutes(i), cluster="b") for i in range(20)]
                      + [failed("bad", minutes(3), cluster="b")])  # fmt: skip
    loader = EvidenceLoader()
    loader.add_index(a)
    loader.add_index(b)
    scope = EvidenceIndex()
    loader.build(lambda cluster: [scope])
    assert snapshot(scope) == snapshot(EvidenceIndex([*a.counted(), *b.counted()]))
    record_a = a._tallies[S][FI].record("a\0a3", stage_bucket("a", "a3"))
    assert scope._tallies[S][FI].record("a\0a3", stage_bucket("a", "a3")) is record_a


# ------------------------------------------------------------------ expiry


def test_a_prune_looks_only_at_what_expired() -> None:
    """However many pods, a prune looks at the entries that expired (and at pods
    that moved on since their entry was made), never at every pod."""
    looked = []
    for pods in (1_000, 10_000):
        index = EvidenceIndex(
            [ok(f"p{i}", 500.0, minutes(i / pods * 1000)) for i in range(pods)], per_pod=2
        )
        # the 50 oldest pods expire: their minute is before the cutoff
        assert index.prune(minutes(1000 * 50 / pods + 60), timedelta(minutes=60))
        looked.append(index.pruned)
        assert index.group(S)[FI].pods == pods - 50
        assert not index.prune(minutes(1000 * 50 / pods + 60), timedelta(minutes=60))
        assert index.pruned == 0  # nothing due: not even a look
    assert looked == [50, 50]


def test_pods_that_reported_again_are_looked_at_once_per_report() -> None:
    """A pod's expiry entry is made when it first reports; reports after that move
    its oldest sample on without a new entry, and the prune that meets the old entry
    files it again under the pod's oldest sample, once."""
    index = EvidenceIndex(per_pod=2)
    for report in range(10):  # 100 pods, 10 reports each, 10 minutes apart
        index.add([ok(f"p{i}", float(report), minutes(10 * report)) for i in range(100)])
    tally = index._tallies[S][FI]
    assert len(tally.expiry) == 100  # one entry a pod, not one a report
    # cutoff 75: every pod's entry (minute 0) is due, but its samples (80, 90) stay
    assert not index.prune(minutes(85), timedelta(minutes=10))
    assert index.pruned == 100  # each pod's entry, once: filed again under minute 80
    assert sorted(map(_expiry_time, tally.expiry)) == [minutes(80).timestamp()] * 100
    assert not index.prune(minutes(85), timedelta(minutes=10))
    assert index.pruned == 0
    assert index.prune(minutes(95), timedelta(minutes=10))  # cutoff 85: minute 80 goes
    assert index.pruned == 100
    assert index.group(S)[FI].samples == 100


def test_a_late_older_sample_expires_on_time() -> None:
    index = EvidenceIndex([ok("p", 1.0, minutes(50))], per_pod=3)
    index.add([ok("p", 2.0, minutes(10))])  # older than the pod's entry: one of its own
    assert index.prune(minutes(40), timedelta(minutes=20))
    assert index.pod_samples(S, FI, "c", "p") == [1.0]
    assert index.prune(minutes(80), timedelta(minutes=20))
    assert index.group(S) == {}
    assert index._tallies == {}


def test_a_prune_in_steps_ends_where_one_prune_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(8)
    history = [
        ok(f"p{rng.randrange(3000)}", float(rng.randrange(100)), minutes(rng.randrange(600)))
        for _ in range(12_000)
    ] + [failed(f"f{i}", minutes(i)) for i in range(300)]
    whole, stepped = EvidenceIndex(history, per_pod=3), EvidenceIndex(history, per_pod=3)
    seen: list[int] = []
    monkeypatch.setattr(evidence_index, "PRUNE_STEP", 500)

    def pause() -> None:  # a reader between two steps sees whole situations
        stats = stepped.group(S)[FI]
        seen.append(stats.samples)

    assert whole.prune(minutes(600), timedelta(minutes=300))
    assert stepped.prune(minutes(600), timedelta(minutes=300), pause)
    assert len(seen) >= 2 and seen == sorted(seen, reverse=True)
    assert snapshot(stepped) == snapshot(whole)
    assert stepped.pruned == whole.pruned


def test_a_retired_index_lets_go_in_steps_and_keeps_what_it_published() -> None:
    """A full reload replaces every index; the old ones are emptied a step at a time
    (freeing them at once held the interpreter for 50 ms). A reader still holding one
    sees the summaries it published, and no samples."""
    index = EvidenceIndex([ok(f"p{i}", 500.0 + i % 7, minutes(i)) for i in range(5000)])
    published = index.group(S)
    steps: list[int] = []
    index.retire(lambda: steps.append(1))
    assert len(steps) >= 3
    assert index.group(S) is published and published[FI].pods == 5000
    assert index.samples(S, FI) == [] and index.stage_samples(S, FI, {0, 1, None}) == []
    index.prune(minutes(10_000), timedelta(minutes=1))  # nothing left to drop: no error
    assert index._tallies == {}


# ------------------------------------------------------------------ growth


def _one_situation(pods: int, situation: Situation = S) -> list[Observation]:
    """Each pod's report of 8 results (4 backends x 2 shapes), pods a second apart."""
    backends = ["FLASHINFER", "CUDNN", "FLASH_ATTN", "TORCH_SDPA"]
    return [
        Observation(situation, backends[k % 4], f"r1-{p:06d}", 300.0 + (p * 7919 + k) % 300,
                    ok=True, cluster="hot", at=T0 + timedelta(seconds=p), impl="fa3")
        for p in range(pods)
        for k in range(8)
    ]  # fmt: skip


def _cpu(*builds: object, rounds: int = 3) -> list[float]:
    """Best of ``rounds`` thread CPU seconds of each build (taking turns, the
    collector off: see test_evidence_bounds._build_s)."""
    best = [math.inf] * len(builds)
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for k, build in enumerate(builds):
                started = time.thread_time()
                build()  # type: ignore[operator]
                best[k] = min(best[k], time.thread_time() - started)
    finally:
        gc.enable()
    return best


def _added(observations: list[Observation]) -> object:
    def build() -> None:
        index = EvidenceIndex()
        for start in range(0, len(observations), 8):
            index.add(observations[start : start + 8])  # report by report

    return build


def _loaded(observations: list[Observation]) -> object:
    samples = [
        (o.situation, o.backend, o.cluster, o.pod, o.at.timestamp(), o.tflops, o.impl, "")  # type: ignore[union-attr]
        for o in observations
    ]

    def build() -> None:
        loader = EvidenceLoader()
        loader.add_samples(samples)
        index, by_cluster = EvidenceIndex(), EvidenceIndex()
        loader.build(lambda cluster: [index, by_cluster])  # all clusters and its own

    return build


@pytest.mark.serial
@pytest.mark.parametrize("how", [_added, _loaded], ids=["report by report", "bulk load"])
def test_building_costs_grow_linearly_with_the_pods_of_one_situation(
    how: object, machine_load: MachineLoad
) -> None:
    """Five times the pods in one situation cost no more than five times the pods
    spread over ten situations (the same memory at each size, so the processor's caches
    weigh alike), and 10,000 pods in one situation about what the same pods over ten
    situations cost. A copy of a stage bucket per pod made 1,000 -> 10,000 pods cost
    13-15x and 10,000 -> 100,000 45x, and the second ratio 1.3-1.6x.

    The growth is measured against the spread's, not against 5x: on this project's
    2-core VM a 2,000-pod index fits in the caches where 10,000 do not, so ten
    situations of the same pods also grow 5.5-6.6x (thread CPU, best of 5), which put
    a bound of 6x on the one situation's growth inside the machine's noise."""
    small = _one_situation(2_000)
    large = _one_situation(10_000)
    small_spread, spread = (
        [o for k in range(10) for o in _one_situation(n, replace(S, device=f"GPU {k}"))]
        for n in (200, 1_000)
    )
    machine_load.restart()
    small_s, large_s, small_spread_s, spread_s = _cpu(
        how(small),  # type: ignore[operator]
        how(large),  # type: ignore[operator]
        how(small_spread),  # type: ignore[operator]
        how(spread),  # type: ignore[operator]
        rounds=5,
    )
    growth, spread_growth = large_s / small_s, spread_s / small_spread_s
    figures = (
        f"one situation 2,000 -> 10,000 pods {small_s:.3f} -> {large_s:.3f} s "
        f"({growth:.2f}x), ten situations {small_spread_s:.3f} -> {spread_s:.3f} s "
        f"({spread_growth:.2f}x)"
    )
    assert growth < 1.2 * spread_growth, machine_load.says(figures)
    assert large_s < 1.5 * spread_s, machine_load.says(figures)


def test_a_record_is_18_bytes_a_sample() -> None:
    """What a counted sample costs in a pod's record (its TFLOP/s also sits, 8 bytes,
    in the sorted chunks): the bound on memory per sample the docs state."""
    assert struct.calcsize("<ddH") == _RECORD.size == 18


def test_a_small_tally_keeps_one_dict_and_a_big_one_one_per_bucket() -> None:
    """Memory follows what a cluster has: a tally of a few pods is one dict, not one
    per stage bucket, and reads the same samples as a big one, split past SPLIT_AT."""
    rng = random.Random(5)
    small = [ok(f"p{i}", float(i), minutes(rng.randrange(100))) for i in range(40)]
    index = EvidenceIndex(per_pod=3)
    index.add(small)
    (tally,) = index._tallies[S].values()
    assert not tally.split and list(tally.buckets) == [ALL]
    buckets = set(range(0, STAGE_BUCKETS, 2)) | {None}
    for since in (minutes(0), minutes(50)):
        got = sorted(index.stage_samples(S, FI, buckets, since))
        assert got == brute_stage(small, 3, buckets, since)
    big = small + [ok(f"q{i}", 1.0, minutes(100 + i)) for i in range(SPLIT_AT)]
    index.add(big[len(small) :])
    assert tally.split and ALL not in tally.buckets and len(tally.buckets) > 50
    assert sum(len(p) for p in tally.buckets.values()) == tally.pods == len(big)
    for since in (minutes(0), minutes(50), minutes(200)):
        got = sorted(index.stage_samples(S, FI, buckets, since))
        assert got == brute_stage(big, 3, buckets, since)
