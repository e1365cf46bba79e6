"""Why a rollout halted, as data: which clusters, which pods, which error, which numbers.

A halt cause names pods and quotes error text of whichever clusters took part, and
callers limited to some clusters may read only theirs. So the cause is stored as these
values (in the rollout's JSON, and so in every audit entry that holds the override) and
turned into words for each caller where it leaves the service (``core/cause_words.py``,
applied per caller by ``service/reads/scope.py``): nothing is parsed back from text, and
nothing an agent sends (a pod name, an error) can change what another caller reads.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer

ERROR_CHARS = 200
"""How much of an error's first line a cause keeps."""


class _Cause(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class PodAt(_Cause):
    """A pod, by its cluster and name."""

    cluster: str
    pod: str


class PodError(PodAt):
    """A pod's reported error: its first line, at most :data:`ERROR_CHARS` characters."""

    at: datetime | None = None
    error: str

    @field_serializer("at", when_used="always")
    def _at(self, at: datetime | None) -> str | None:
        """As text in every dump: a cause travels in answers and audit rows dumped for
        JSON without pydantic's JSON mode."""
        return None if at is None else at.isoformat()


def first_line(error: str) -> str:
    """The part of an error a cause keeps."""
    return (error.strip().splitlines() or ["(no error text)"])[0][:ERROR_CHARS]


class FailureHalt(_Cause):
    """The failure guard halted the rollout: distinct evidence sources reported a
    failure of what the rollout gave their stage pods, reaching ``max_failures``."""

    kind: Literal["failures"] = "failures"
    sources: int
    verified_pods: int
    static_sources: int
    max_failures: int
    pods: list[PodAt]
    latest: PodError
    backend: str


class SlowdownHalt(_Cause):
    """The speed guard halted the rollout: the stage pods measured what the override
    gives them slower than what they would run without it, beyond the limit."""

    kind: Literal["slowdown"] = "slowdown"
    staged: str
    staged_tflops: float
    staged_samples: int
    pods: list[PodAt]
    without: str
    without_tflops: float
    without_samples: int
    percent_slower: float
    max_slowdown_pct: float
    verified_pods: int
    static_sources: int


class PersonHalt(_Cause):
    """Someone halted the rollout, with a note for everyone the override covers."""

    kind: Literal["person"] = "person"
    by: str
    note: str


HaltCause = Annotated[FailureHalt | SlowdownHalt | PersonHalt, Field(discriminator="kind")]
"""Why a rollout halted (``Rollout.halted_cause``)."""


class MeasuredExclusion(_Cause):
    """Failures reported within the failure policy's window exclude a backend from
    measured selection: how many pods, and the newest few quoted."""

    kind: Literal["measured_failures"] = "measured_failures"
    pods: int
    window_h: float
    quoted: list[PodError]


class FailuresBelowPolicy(_Cause):
    """Failures were reported for a backend in a situation, from fewer distinct pods
    than the failure policy needs to exclude it: it stays valid. One pod's wrong result
    (a bad GPU, a flaky run) must not take a backend away from a whole deployment."""

    kind: Literal["measured_failures_below_policy"] = "measured_failures_below_policy"
    backend: str
    pods: int
    needed: int
    window_h: float


class ExclusionWaived(_Cause):
    """Failures exclude every backend that would otherwise be valid for the pod: the
    one with the fewest failing pods is kept valid, since a pod with no backend at all
    is an outage, and one that failed on a few pods may still run on this one."""

    kind: Literal["measured_exclusion_waived"] = "measured_exclusion_waived"
    backend: str
    pods: int
    window_h: float


FailureNotice = Annotated[FailuresBelowPolicy | ExclusionWaived, Field(discriminator="kind")]
"""What reported failures did to a backend that stays valid (``Candidate.failures``)."""
