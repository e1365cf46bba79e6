"""Who is in the stage of a staged override: one stable bucket per pod.

Every named pod has a bucket in ``0..STAGE_BUCKETS-1``, a stable hash of (cluster,
pod name) that no rollout changes; a rollout covers ``percent`` consecutive buckets
starting at an offset drawn from its id (wrapping around). So

- the share of pods in a stage is its percent (one bucket per percent point);
- raising the percent keeps every pod that was in (the range only grows);
- a new rollout (a new id) starts elsewhere, so it does not always draw the same pods;
- the bucket can be stored with each pod once, and "how many pods of this group are
  in the stage" is a sum over at most 100 counters: fleet reads count buckets, they
  never hash pod names again.
"""

from __future__ import annotations

import functools
import hashlib

from mla_switchboard.core.schemas import Rollout

__all__ = [
    "STAGE_BUCKETS",
    "bucket_in_stage",
    "pod_key",
    "rollout_offset",
    "stage_bucket",
    "stage_bucket_of_key",
    "stage_buckets",
]

STAGE_BUCKETS = 100
"""Percent is a whole number from 1 to 100, so 100 buckets decide every stage exactly."""


def stage_bucket(cluster: str, pod: str | None) -> int | None:
    """A named pod's bucket; None for a pod without a name (never in a partial stage)."""
    if not pod:
        return None
    return stage_bucket_of_key(pod_key(cluster, pod))


def pod_key(cluster: str, pod: str | None) -> str:
    """One string that names a pod of a cluster (what its bucket is a hash of). Cluster
    names cannot hold a NUL (``CLUSTER_PATTERN``), so the first one splits it again."""
    return f"{cluster}\0{pod or ''}"


def stage_bucket_of_key(key: str) -> int | None:
    """:func:`stage_bucket` of the pod that :func:`pod_key` named ``key``."""
    if key.endswith("\0"):
        return None  # no pod name (pod names hold no NUL either)
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % STAGE_BUCKETS


@functools.lru_cache(maxsize=4096)
def rollout_offset(rollout_id: str) -> int:
    """Where a rollout's range of buckets starts."""
    digest = hashlib.blake2b(rollout_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % STAGE_BUCKETS


def bucket_in_stage(bucket: int | None, rollout: Rollout) -> bool:
    """Whether a pod in ``bucket`` is in the stage of ``rollout``.

    A halted rollout applies to no pod, a complete one (or 100 %) to every pod; pods
    without a name (``bucket`` None) are never in a partial stage."""
    if rollout.state == "complete":
        return True
    if rollout.state == "halted":
        return False
    if rollout.percent >= 100:
        return True
    if bucket is None:
        return False
    return (bucket - rollout_offset(rollout.id)) % STAGE_BUCKETS < rollout.percent


def stage_buckets(rollout: Rollout) -> frozenset[int]:
    """Every bucket in the stage of ``rollout`` (for counting pods per bucket, and for
    reading the stage pods' samples): the same set as :func:`bucket_in_stage` says,
    from one hash of the rollout's id (a guard asks on every report)."""
    if rollout.state == "halted":
        return frozenset()
    if rollout.state == "complete" or rollout.percent >= 100:
        return frozenset(range(STAGE_BUCKETS))
    offset = rollout_offset(rollout.id)
    return frozenset((offset + i) % STAGE_BUCKETS for i in range(rollout.percent))
