"""Service settings, read from ``SWITCHBOARD_*`` environment variables.

Defaults are chosen so that ``switchboard serve`` on a fresh machine just works:
SQLite in a file in the working directory, loopback only, seeded rules.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

from mla_switchboard.core.names import validate_cluster_globs
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

HttpUrl = Annotated[str, StringConstraints(pattern=r"^https?://[^\s/?#]+[^\s?#]*$")]
"""An http(s) URL without query or fragment: what an OIDC issuer and a JWKS URI are."""


ServiceAccountGlob = Annotated[
    str, StringConstraints(pattern=r"^[a-z0-9*?.\[\]-]{1,63}/[a-z0-9*?.\[\]-]{1,253}$")
]
"""``namespace/name`` of a Kubernetes service account, either part a shell glob."""


class WorkloadIssuer(BaseModel):
    """One Kubernetes service-account token issuer, trusted for the clusters its
    ``clusters`` globs name (see service/identity/workload.py and docs/security.md).

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
    service_accounts: list[ServiceAccountGlob] | None = Field(
        default=None,
        description='the service accounts whose pods may act as agents, "namespace/name" '
        "with shell globs (Vault's bound_service_account_names and _namespaces); "
        "unset: any pod of the cluster holding a token for the audience",
    )

    @model_validator(mode="after")
    def _one_key_source(self) -> WorkloadIssuer:
        if self.jwks_file is not None and self.jwks_uri is not None:
            raise ValueError("jwks_file, jwks_uri: give one of them, or neither for OIDC discovery")
        return self

    @property
    def discovery_url(self) -> str:
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"


class RoleMapping(BaseModel):
    """People of an identity-provider group get a role in the clusters its globs name
    (``["*"]``: every cluster and the fleet override). The first entry naming one of a
    person's groups decides: list the most privileged first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    role: Literal["viewer", "admin"]
    clusters: Annotated[list[str], AfterValidator(validate_cluster_globs)]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SWITCHBOARD_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///./switchboard.db",
        description="SQLAlchemy URL: sqlite:///path or postgresql+psycopg://user@host/db",
    )
    admin_token: SecretStr | None = Field(
        default=None, description="bootstrap admin token (compared in constant time)"
    )
    max_body_bytes: int = Field(
        default=64 * 1024, ge=1024, description="larger request bodies get 413"
    )
    max_file_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=1024,
        description="larger bodies of POST /v1/plan and /v1/apply (a whole overrides file: "
        "about 200 bytes an override) get 413",
    )
    flush_interval_s: float = Field(
        default=0.05, gt=0, description="how often recorded decisions are written"
    )
    flush_batch: int = Field(
        default=1000, ge=1, description="the most decisions written in one batch"
    )
    buffer_limit_mb: float = Field(
        default=128.0,
        ge=1,
        description="memory for decisions not yet stored (about 0.7 KB each); past it "
        "those already in the decision log leave memory (read back from the log), and "
        "new ones are refused only if the log cannot take them either",
    )
    buffer_limit: int | None = Field(
        default=None,
        ge=1000,
        description="deprecated: a count of decisions held in memory, applied on top of "
        "SWITCHBOARD_BUFFER_LIMIT_MB (use that instead)",
    )
    spill_path: str | None = Field(
        default=None,
        description="where the decision log lives: the directory <this path>.log holds "
        "every answered decision until the database has it (one replica per directory); "
        "unset: beside the SQLite file, else ./switchboard-spill-<hash of the database "
        "URL>.jsonl",
    )
    spill_limit_mb: float = Field(
        default=512.0,
        ge=0,
        description="the most the decision log may hold (about 0.2 KB a decision) before "
        "new decisions are refused; 0 turns the log off",
    )
    journal: bool = Field(
        default=True,
        description="every answered decision goes to the decision log, on disk within a "
        "few ms (one write and fdatasync per batch), so a crash loses only the last few ms "
        "whatever the database does; off: decisions are kept in memory only until stored",
    )
    shutdown_flush_s: float = Field(
        default=5.0,
        ge=0,
        description="how long a shutdown waits for the store; the log keeps the rest",
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
    event_streams_max: int = Field(
        default=200,
        ge=0,
        description="open change streams (GET /v1/events) per replica; past it 503 and "
        "the console polls instead",
    )
    event_ring: int = Field(
        default=1000,
        ge=1,
        description="changes each replica keeps for a stream that resumes (Last-Event-ID); "
        "one older than these is told to read everything again",
    )
    event_heartbeat_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="how often an idle change stream sends a heartbeat (the console "
        "calls a stream silent for two of them stalled)",
    )
    measured_min_samples: int = Field(
        default=3,
        ge=1,
        description="measurements a backend needs in a situation before policy measured "
        "ranks it by them",
    )
    measured_min_pods: int = Field(
        default=2, ge=1, description="distinct pods those measurements must come from"
    )
    measured_max_age_days: float = Field(
        default=30.0, gt=0, description="measurements older than this are ignored"
    )
    # Per situation, backend and pod only this many of the pod's most recent results
    # count (core/evidence/): memory and ranking cost follow pods, not history.
    measured_samples_per_pod: int = Field(
        default=8,
        ge=1,
        le=1000,
        description="a pod's most recent results that count per situation and backend",
    )
    # The failure policy (FailurePolicy, core/evidence/).
    failure_min_pods: int = Field(
        default=2,
        ge=1,
        description="under policy measured, a backend is left out for a situation while at "
        "least this many distinct pods reported it failing there (a build failure or a "
        "wrong result) within SWITCHBOARD_FAILURE_WINDOW_HOURS; fewer are said in the "
        "answer and leave it valid (1: one pod's wrong result excludes it for every pod)",
    )
    failure_window_hours: float = Field(
        default=24.0,
        gt=0,
        description="how long a reported failure counts; older ones expire by themselves "
        "(an admin can clear a situation's failures sooner)",
    )
    overrides_file: str | None = Field(
        default=None,
        description="declarative mode: the overrides file (docs/gitops.md) this service "
        "applies whenever its content changes, e.g. a mounted ConfigMap; console writes to "
        "what it declares are refused",
    )
    overrides_file_prune: bool = Field(
        default=False,
        description="declarative mode: the file owns every override (the ones it omits are "
        "removed, and console writes to any override refused)",
    )
    overrides_file_poll_s: float = Field(
        default=1.0, gt=0, description="declarative mode: how often the file is read"
    )
    rollout_check_s: float = Field(
        default=1.0,
        gt=0,
        description="how often each replica checks its rollouts for a step due or a "
        "guard evaluation left behind",
    )
    guard_static_sources: Literal["per_pod", "per_token"] = Field(
        default="per_pod",
        description="how a static agent token's reports count toward rollout guards: "
        "per_pod, once per pod name it recorded a decision for; per_token, once in all "
        "(forgery-proof, but a threshold above 1 then needs several tokens)",
    )
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
    forwarded_allow_ips: str = Field(
        default="127.0.0.1",
        min_length=1,
        description="comma-separated addresses or networks of the proxies whose "
        "X-Forwarded-For names the client (the failure throttle counts by it); '*' trusts "
        "any peer. Set by the service, never inherited from uvicorn's own default or its "
        "FORWARDED_ALLOW_IPS variable",
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
    store_deadline_s: float = Field(
        default=4.0,
        gt=0,
        le=60,
        description="how long a request (every route but /v1/select, which never waits "
        "on the store) waits for each store call; past it the answer is 503 with "
        "Retry-After, saying whether a write was applied, and the call is abandoned",
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
    workload_issuers_file: Path | None = Field(
        default=None,
        description="a JSON file holding the same list as SWITCHBOARD_WORKLOAD_ISSUERS "
        "(a mounted ConfigMap); its entries join the variable's",
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

    # People sign in with OIDC (service/identity/: oidc.py, people.py; docs/security.md)
    oidc_issuer: HttpUrl | None = Field(
        default=None,
        description="the identity provider's issuer URL (its discovery document lives at "
        "issuer + /.well-known/openid-configuration); unset: no sign-in, tokens only",
    )
    oidc_client_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="this service's client id at the identity provider (needed with "
        "SWITCHBOARD_OIDC_ISSUER)",
    )
    oidc_client_secret: SecretStr | None = Field(
        default=None,
        description="this service's client secret at the identity provider; unset: a public "
        "client (PKCE alone)",
    )
    oidc_redirect_url: HttpUrl | None = Field(
        default=None,
        description="this service's callback as the provider has it registered: "
        "https://switchboard.example.com/auth/callback",
    )
    oidc_provider_name: str = Field(
        default="SSO",
        min_length=1,
        max_length=60,
        description='the sign-in button\'s label: "Sign in with <name>"',
    )
    oidc_scopes: str = Field(
        default="openid email profile",
        description="the scopes sign-in asks for, space-separated (openid among them); add "
        "the one your provider needs for the groups claim (Okta: groups)",
    )
    oidc_groups_claim: str = Field(
        default="groups",
        min_length=1,
        max_length=100,
        description="the ID token claim listing a person's groups, which "
        "SWITCHBOARD_OIDC_ROLE_MAPPING maps to roles",
    )
    oidc_role_mapping: list[RoleMapping] = Field(
        default_factory=list,
        description='JSON list: [{"group": "platform-admins", "role": "admin", "clusters": '
        '["*"]}]; a person in none of these groups is refused sign-in',
    )
    session_hours: float = Field(
        default=8.0, gt=0, le=24 * 30, description="how long a person's session lasts"
    )
    oidc_groups_refresh_s: float = Field(
        default=900.0,
        ge=1.0,
        le=86400.0,
        description="how old a signed-in person's groups may get before the provider is "
        "asked again (refresh token, then userinfo); someone removed from a group loses "
        "what it gave within this, and a person the provider no longer knows is signed out",
    )

    @model_validator(mode="after")
    def _oidc_complete(self) -> Settings:
        """Sign-in is all or nothing: an issuer without a client id, callback or any
        group mapping would only ever refuse people."""
        if self.oidc_issuer is None:
            return self
        missing = [
            name
            for name, value in (
                ("oidc_client_id", self.oidc_client_id),
                ("oidc_redirect_url", self.oidc_redirect_url),
                ("oidc_role_mapping", self.oidc_role_mapping),
            )
            if not value
        ]
        if missing:
            raise ValueError(f"{', '.join(missing)}: needed with oidc_issuer")
        if "openid" not in self.oidc_scopes.split():
            raise ValueError("oidc_scopes: must include openid")
        return self

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

    @model_validator(mode="after")
    def _issuers_from_file(self) -> Settings:
        """Entries from ``workload_issuers_file`` join the variable's, validated the same
        way: a ConfigMap mounted as a file is how a cluster list that changes with the
        fleet is kept out of the Deployment's environment."""
        if self.workload_issuers_file is None:
            return self
        path = self.workload_issuers_file
        try:
            listed = json.loads(path.read_text())
        except OSError as e:
            raise ValueError(f"workload_issuers_file: cannot read {path}: {e.strerror}") from e
        except json.JSONDecodeError as e:
            raise ValueError(
                f"workload_issuers_file: {path} is not JSON (line {e.lineno}: {e.msg})"
            ) from e
        if not isinstance(listed, list):
            raise ValueError(f"workload_issuers_file: {path} must hold a JSON list of issuers")
        try:
            from_file = TypeAdapter(list[WorkloadIssuer]).validate_python(listed)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"workload_issuers_file: {path}: [{where}] {first['msg']}") from None
        self.workload_issuers = self._issuers_distinct([*self.workload_issuers, *from_file])
        return self

    def resolved_log_dir(self) -> Path | None:
        """The decision log's directory (``<spill path>.log``); None when it is off."""
        if not self.journal or self.spill_limit_mb <= 0:
            return None
        spill = self.resolved_spill_path()
        return spill.with_name(spill.name + ".log")

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
