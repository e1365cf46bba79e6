"""Measured selection: the fleet's own benchmarks and failures, per exact situation.

A *situation* is what decides which kernel is fastest and whether it works: device
name, compute capability, MLA dims, dtype, the versions of the kernel packages and the
serving engine (vLLM's FLASH_ATTN is vLLM's bundled FlashAttention 3, not the FA2 that
PyTorch bundles, so the two are never compared as one). Evidence counts only for its
own situation.

Failures (a kernel that failed to build, or gave a wrong result) exclude a backend
under a stated :class:`FailurePolicy`: by default one failing pod within 24 hours. They
expire with the window and an admin can clear them; every exclusion is a reason the
answer shows ("failed on 2 pods in the last 24 h: staging/pod-a 2026-11-30 15:37 UTC:
..."), never a silent gap.

**What counts is bounded.** Per situation, backend and pod (cluster and pod name) only
the ``per_pod`` most recent correct results count (:data:`SAMPLES_PER_POD`, 8 by
default; the service reads ``SWITCHBOARD_MEASURED_SAMPLES_PER_POD``), and a failing pod
counts once, with its newest failure. A pod that benchmarks at every boot for a month
therefore weighs as much as one that booted twice this week, and memory and ranking
cost follow the number of pods, not the history. A pod's older results make room for
newer ones; results older than the evidence window are dropped by
:meth:`EvidenceIndex.prune`.

**Every cost follows what counts, once.** An :class:`EvidenceIndex` changes in place
under its own lock and publishes immutable per-situation summaries
(:class:`BackendStats`) with one assignment, which readers (every decision) use
without a lock. Behind them, per situation and backend (``tallies.Tally``):

- each pod's counted samples are one immutable ``bytes`` *record* (18 bytes a sample:
  time, TFLOP/s, code path), kept in a dict per stage bucket that is ordered by the
  pod's newest sample. A report replaces its pod's record and, when its newest sample
  moved, deletes and re-inserts the pod (O(1)); nothing is ever copied per pod (the
  ordered tuples of each bucket were copied per pod: building 100,000 pods' evidence
  grew as n^1.9). A late report marks its bucket for sorting on the next read of it;
- every counted TFLOP/s is also in a ``sortedcontainers.SortedList``, so an insertion
  is a binary search and a short move within one of its sublists, and the median a
  walk over its sublists' lengths (``values.py``);
- a heap of (time, pod) entries, bytes that sort as the time, one per pod at or
  before its oldest dated sample, is what :meth:`EvidenceIndex.prune` pops up to the
  evidence window's cutoff: a prune looks at what expired (and at pods that moved on
  since their entry was filed, once each), never at every pod, and runs in steps
  that let the event loop in;
- none of it is a container per pod: a collection has a few objects per tally to
  visit, whatever the pods.

**A full read is a bulk load** (:class:`EvidenceLoader`): rows come as plain tuples,
each pod's record is bounded as it is read (the loader holds what counts, never the
history), then every pod is filed once into each index that trusts its cluster, the
record and the heap entry shared between them, and each index's TFLOP/s are sorted in
pieces instead of inserted one by one; an index that takes exactly the same pods as
another (a situation seen in one cluster) copies it. History beyond the window is
never read into memory at all: a reader starts at the window's first row, and nothing
reads older rows (the store keeps them).

:meth:`EvidenceIndex.with_observations` still gives a new index, by copying (for tests
and one-off comparisons).

Where each part lives: ``situations.py`` (the key), ``observations.py`` (what a pod
reports, the failure policy), ``stats.py`` (the published summaries), ``records.py``
(a pod's samples as bytes, the expiry heap's entries), ``values.py`` (the sorted
TFLOP/s), ``tallies.py`` (one backend in one situation), ``published.py`` (the
lock-free reads every decision makes), ``index.py`` (the writer, and the reads of the
tallies), ``loader.py`` (a full read in bulk), ``snapshot.py`` (what a bulk read
counted, as bytes a later start restores before reading only the rows after it).
"""

from mla_switchboard.core.evidence.index import EMPTY, PRUNE_STEP, EvidenceIndex
from mla_switchboard.core.evidence.loader import EvidenceLoader, LoadedSample
from mla_switchboard.core.evidence.observations import (
    FailureNote,
    FailurePolicy,
    Observation,
    failure_observation,
    failure_source,
    measurement_source,
    observations_of_report,
    report_key,
)
from mla_switchboard.core.evidence.published import PublishedEvidence
from mla_switchboard.core.evidence.records import MAX_IMPL_NAMES, SAMPLES_PER_POD
from mla_switchboard.core.evidence.situations import (
    KERNEL_PACKAGES,
    Situation,
    dims_key,
    engine_key,
    packages_key,
    situation_of,
)
from mla_switchboard.core.evidence.stats import BackendStats, Group, PodSample
from mla_switchboard.core.evidence.tallies import LOAD_STEP

__all__ = [
    "EMPTY",
    "KERNEL_PACKAGES",
    "LOAD_STEP",
    "MAX_IMPL_NAMES",
    "PRUNE_STEP",
    "SAMPLES_PER_POD",
    "BackendStats",
    "EvidenceIndex",
    "EvidenceLoader",
    "FailureNote",
    "FailurePolicy",
    "Group",
    "LoadedSample",
    "Observation",
    "PodSample",
    "PublishedEvidence",
    "Situation",
    "dims_key",
    "engine_key",
    "failure_observation",
    "failure_source",
    "measurement_source",
    "observations_of_report",
    "packages_key",
    "report_key",
    "situation_of",
]
