"""Service settings, read from ``SWITCHBOARD_*`` environment variables.

Defaults are chosen so that ``switchboard serve`` on a fresh machine just works:
SQLite in a file in the working directory, loopback only, seeded rules.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated

from mla_switchboard.core.names import validate_cluster_globs
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

HttpUrl = Annotated[str, StringConstraints(pattern=r"^https?://[^\s/?#]+[^\s?#]*$")]
"""An http(s) URL without query or fragment: what an OIDC issuer and a JWKS URI are."""


class WorkloadIssuer(BaseModel):
    """One Kubernetes service-account token issuer, trusted for the clusters its
    ``clusters`` globs name (see service/auth_workload.py and docs/security.md).

    Its keys come from ``jwks_file`` (an air-gapped cluster: the API server's
    ``/openid/v1/jwks`` saved to a file, re-read when it changes), else ``jwks_uri``,
    else OIDC discovery at ``issuer + "/.well-known/openid-configuration"``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    clusters: Annotated[list[str], AfterValidator(validate_cluster_globs)]
    issuer: HttpUrl = Field(
        description="the tokens' iss claim, exactly as the API server writes it"
    )
    audience: Annotated[str, StringConstraints(min_length=1, max_length=200)] = Field(
        description="the aud the projected token is requested for (serviceAccountToken.audience)"
    )
    jwks_file: Path | None = None
    jwks_uri: HttpUrl | None = None

    @model_validator(mode="after")
    def _one_key_source(self) -> WorkloadIssuer:
        if self.jwks_file is not None and self.jwks_uri is not None:
            raise ValueError("jwks_file, jwks_uri: give one of them, or neither for OIDC discovery")
        return self

    @property
    def discovery_url(self) -> str:
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWITCHBOARD_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///./switchboard.db",
        description="SQLAlchemy URL: sqlite:///path or postgresql+psycopg://user@host/db",
    )
    admin_token: SecretStr | None = Field(
        default=None, description="bootstrap admin token (compared in constant time)"
    )
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    flush_interval_s: float = Field(
        default=0.05, gt=0, description="how often recorded decisions are written"
    )
    flush_batch: int = Field(default=1000, ge=1)
    buffer_limit_mb: float = Field(
        default=128.0,
        ge=1,
        description="memory for decisions not yet stored (estimated from what each holds, "
        "about 0.5 KB); past it they go to the spill file, dropped only if that is full too",
    )
    buffer_limit: int | None = Field(
        default=None,
        ge=1000,
        description="deprecated: a count of decisions held in memory, applied on top of "
        "SWITCHBOARD_BUFFER_LIMIT_MB (use that instead)",
    )
    spill_path: str | None = Field(
        default=None,
        description="the local log of decisions the store cannot take (an outage, a "
        "shutdown), stored by whichever replica drains it next (default: beside the SQLite "
        "file, else ./switchboard-spill-<hash of the database URL>.jsonl)",
    )
    spill_limit_mb: float = Field(
        default=512.0,
        ge=0,
        description="the most the spill file may grow to (1.2-1.5 KB a decision); 0 turns "
        "spilling off",
    )
    journal: bool = Field(
        default=True,
        description="every answered decision also goes to a journal beside the spill file, "
        "on disk within a few ms (one write and fdatasync per batch), so a crash loses "
        "only the last few ms whatever the database does; off: only what the writer "
        "stored or spilled survives a crash",
    )
    shutdown_flush_s: float = Field(
        default=5.0,
        ge=0,
        description="how long a shutdown waits for the store before spilling to the file",
    )
    max_config_staleness_s: float | None = Field(
        default=None,
        gt=0,
        description="/readyz answers 503 once the replica could not check the configuration "
        "for this long (off by default: a database outage would empty the load balancer)",
    )
    config_poll_s: float = Field(
        default=0.5, gt=0, description="how often a replica looks for others' admin writes"
    )
    measured_min_samples: int = Field(default=3, ge=1)
    measured_min_pods: int = Field(default=2, ge=1)
    measured_max_age_days: float = Field(default=30.0, gt=0)
    # Per situation, backend and pod only this many of the pod's most recent results
    # count (core/evidence.py): memory and ranking cost follow pods, not history.
    measured_samples_per_pod: int = Field(default=8, ge=1, le=1000)
    # The failure policy (core/evidence.py FailurePolicy): under policy measured, a
    # backend is excluded for a situation while at least this many pods reported it
    # failing within the window; older failures expire by themselves.
    failure_min_pods: int = Field(default=1, ge=1)
    failure_window_hours: float = Field(default=24.0, gt=0)
    # How often each replica checks whether a staged override's step is due.
    rollout_check_s: float = Field(default=1.0, gt=0)
    # What a client can hold or grow (see service/api/server.py, metrics.py)
    max_header_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        description="request line and headers of one request; more answers 431 and closes",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="time from a request's first byte to the end of its headers; then 408",
    )
    body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="time from the end of a request's headers to the end of its body; then 408",
    )
    max_connections: int = Field(
        default=900,
        ge=1,
        description="open connections; past it a new one takes the place of the one waiting "
        "longest on its client, else 503 (lowered to fit the descriptor limit)",
    )
    auth_failures_per_minute: int = Field(
        default=300,
        ge=0,
        description="wrong bearer tokens one client address may send in a minute; past it "
        "its wrong tokens get 429 with Retry-After (valid tokens never do); 0 turns it off",
    )
    metrics_require_token: bool = Field(
        default=False,
        description="/metrics needs a viewer token; without a token it never names clusters",
    )
    metrics_max_clusters: int = Field(
        default=200,
        ge=1,
        description="distinct cluster labels in metrics; decisions of further clusters "
        "are counted under cluster='(other)'",
    )
    pod_ttl_days: float = Field(
        default=7.0,
        gt=0,
        description="a pod that has not asked for a decision for this long leaves the live "
        "fleet (summary, previews, fleet table); its decisions stay in the log",
    )
    fleet_read_budget_s: float = Field(
        default=10.0,
        gt=0,
        description="the most CPU time one fleet read (summary, preview) may take; past it "
        "the answer is 503 and the caller may retry",
    )

    workload_issuers: list[WorkloadIssuer] = Field(
        default_factory=list,
        description="JSON list of Kubernetes service-account token issuers: "
        '[{"clusters": [globs], "issuer": url, "audience": str, "jwks_file": path | '
        '"jwks_uri": url}]; a cluster matched here takes only its pods\' own tokens',
    )
    workload_leeway_s: float = Field(
        default=30.0,
        ge=0,
        le=300,
        description="clock skew allowed on a workload token's exp and nbf",
    )
    workload_refetch_s: float = Field(
        default=30.0,
        gt=0,
        description="an issuer's keys are fetched again for a token naming an unknown kid "
        "(key rotation) at most this often",
    )

    @field_validator("workload_issuers")
    @classmethod
    def _issuers_distinct(cls, issuers: list[WorkloadIssuer]) -> list[WorkloadIssuer]:
        """One entry per issuer: a token's ``iss`` must find exactly one set of keys,
        audience and clusters."""
        seen: set[str] = set()
        for i, entry in enumerate(issuers):
            if entry.issuer in seen:
                raise ValueError(f"[{i}].issuer: {entry.issuer!r} is configured twice")
            seen.add(entry.issuer)
        return issuers

    def resolved_spill_path(self) -> Path:
        """The spill file: configured, or found again by a restart with the same
        settings and working directory (beside an SQLite file; else in the working
        directory, named after the database URL so two databases never share one)."""
        if self.spill_path:
            return Path(self.spill_path).expanduser()
        url = self.database_url
        if url.startswith("sqlite:///"):
            db = url.removeprefix("sqlite:///").split("?", 1)[0]
            if db and db != ":memory:":
                return Path(db).expanduser().with_name(Path(db).name + "-spill.jsonl")
        digest = hashlib.sha256(url.encode()).hexdigest()[:12]
        return Path(f"switchboard-spill-{digest}.jsonl")
