"""``select_backend``: describe the pod, ask the service, fail static, build the kernel.

The one promise that shapes everything here: a serving pod always gets a valid
backend within the deadline. The service is the source of truth while it answers;
when it does not (down, slow, refusing our token), the pod boots on the last answer
the service gave for the same situation (``source: cache``), else on the very same
decision engine the service runs, with its seed rules (``source: local-fallback``).
Only two things stop the Python API: a description that is wrong (not an MLA model:
bad input) and a decision that refuses (``strict`` with an invalid request, or no
backend the pod's serving engine accepts: NoBackendError, with every candidate's
reasons). The CLI turns the second kind into "no engine flags, exit 0" so that an
init container does not stop a pod whose engine can still choose on its own.

The deadline bounds the time spent obtaining the decision (cache, service, local
fallback); probing the device and reading the config happen before it starts, since
they are local and the serving engine pays for the same torch import anyway.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mla_switchboard.agent.cache import AnswerCache, default_cache_dir
from mla_switchboard.agent.client import (
    ServiceRefused,
    ServiceUnavailable,
    ask_service,
    parse_urls,
    report_failure,
)
from mla_switchboard.agent.errors import BadInputError, NoBackendError, TokenRefused
from mla_switchboard.agent.instantiate import KernelShape, build_kernel, build_order
from mla_switchboard.agent.notes import Notes
from mla_switchboard.agent.pod import ModelSource, PodDescription, PodSpec, describe_pod
from mla_switchboard.agent.settings import (
    CLUSTER,
    DEADLINE,
    POD,
    TOKEN,
    TOKEN_FILE,
    URL,
    AgentSettings,
    BearerToken,
    bearer_of,
    token_source_problem,
)
from mla_switchboard.agent.workload_token import is_workload_token
from mla_switchboard.core.evaluator import SEED_RULES, Refusal, decide_locally
from mla_switchboard.core.schemas import Candidate, EngineInfo, SelectRequest, SelectResponse
from mla_switchboard.core.specs import Backend

__all__ = ["SelectionResult", "decide", "refusal_document", "select_backend"]

FALLBACK_RESERVE_S = 0.02
"""Kept back from the service's share of the deadline for the local fallback (~1 ms)."""


@dataclass
class SelectionResult:
    """The backend the pod should run, why, and (Python API) the built kernel.

    ``source`` is what the service said (``priority``, ``requested``, ``fallback``,
    ``override``, ``measured``) or ``cache`` / ``local-fallback`` when the agent
    answered alone, ``auth-fallback`` when it did because the service refused its token
    (the cached answer, whose own source is in ``cached_source``, else a local one).
    ``backend`` is the one that was built; it differs from ``decided_backend`` only
    when the decided one failed to build here.
    ``revalidated``: the service confirmed the cached answer (HTTP 304).
    """

    backend: Backend
    source: str
    candidates: list[Candidate]
    messages: list[str]
    decision_id: str | None
    rules_revision: int | None
    request: SelectRequest
    decided_backend: Backend
    notes: list[str] = field(default_factory=list)
    kernel: Any = None
    build_failures: list[tuple[str, str]] = field(default_factory=list)
    service_url: str | None = None
    cached_source: str | None = None
    revalidated: bool = False
    pretend: bool = False
    evidence: dict[str, Any] | None = None  # what measured selection based the answer on
    engine: EngineInfo = field(default_factory=EngineInfo)
    engine_args: list[str] = field(default_factory=list)  # argv for the engine, verbatim
    engine_env: dict[str, str] = field(default_factory=dict)

    @property
    def reasons(self) -> dict[str, list[str]]:
        """Why each backend the decision ruled out cannot run here."""
        return {c.backend.value: list(c.reasons) for c in self.candidates if not c.valid}

    def to_dict(self) -> dict[str, Any]:
        """The answer as one JSON document (``--format json``, and what every other
        format is printed from); a refusal has the same shape, see
        :func:`refusal_document`."""
        return _document(
            backend=self.backend.value,
            source=self.source,
            decided_backend=self.decided_backend.value,
            decision_id=self.decision_id,
            rules_revision=self.rules_revision,
            candidates=self.candidates,
            messages=self.messages,
            notes=self.notes,
            cached_source=self.cached_source,
            revalidated=self.revalidated,
            service_url=self.service_url,
            kernel=None if self.kernel is None else getattr(self.kernel, "impl", "built"),
            build_failures=[{"backend": b, "error": e} for b, e in self.build_failures],
            pretend=self.pretend,
            evidence=self.evidence,
            engine=self.engine,
            engine_args=self.engine_args,
            engine_env=self.engine_env,
            refusal=None,
            request=self.request,
        )


def refusal_document(error: NoBackendError) -> dict[str, Any]:
    """A refusal as the answer's own document: the same keys as
    :meth:`SelectionResult.to_dict`, with ``backend`` null, ``source`` ``refused``, no
    engine flags, and ``refusal`` saying why (its kind, message and every candidate),
    so a consumer reads one shape whatever the outcome."""
    request = error.request
    engine = request.engine if request is not None and request.engine is not None else None
    return _document(
        backend=None,
        source="refused",
        decided_backend=None,
        decision_id=None,
        rules_revision=None,
        candidates=error.candidates,
        messages=[str(error)],
        notes=error.notes,
        cached_source=None,
        revalidated=False,
        service_url=None,
        kernel=None,
        build_failures=[],
        pretend=error.pretend,
        evidence=None,
        engine=engine or EngineInfo(),
        engine_args=[],
        engine_env={},
        refusal={
            "kind": error.kind,
            "message": str(error),
            "candidates": [c.model_dump(mode="json") for c in error.candidates],
        },
        request=request,
    )


def _document(
    *,
    backend: str | None,
    source: str,
    decided_backend: str | None,
    decision_id: str | None,
    rules_revision: int | None,
    candidates: Sequence[Candidate],
    messages: Sequence[str],
    notes: Sequence[str],
    cached_source: str | None,
    revalidated: bool,
    service_url: str | None,
    kernel: str | None,
    build_failures: list[dict[str, str]],
    pretend: bool,
    evidence: dict[str, Any] | None,
    engine: EngineInfo,
    engine_args: Sequence[str],
    engine_env: Mapping[str, str],
    refusal: dict[str, Any] | None,
    request: SelectRequest | None,
) -> dict[str, Any]:
    """The one JSON shape of what ``select`` decided: every key, always present."""
    return {
        "backend": backend,
        "source": source,
        "decided_backend": decided_backend,
        "decision_id": decision_id,
        "rules_revision": rules_revision,
        "candidates": [c.model_dump(mode="json") for c in candidates],
        "messages": list(messages),
        "notes": list(notes),
        "cached_source": cached_source,
        "revalidated": revalidated,
        "service_url": service_url,
        "kernel": kernel,
        "build_failures": build_failures,
        "pretend": pretend,
        "evidence": evidence,
        "engine": engine.model_dump(mode="json"),
        "engine_args": list(engine_args),
        "engine_env": dict(engine_env),
        "refusal": refusal,
        "request": None if request is None else request.model_dump(mode="json"),
    }


# -------------------------------------------------------------------- deciding


@dataclass(frozen=True)
class _Answer:
    response: SelectResponse
    url: str | None
    cached_source: str | None = None
    revalidated: bool = False


def _local_answer(request: SelectRequest, source: str = "local-fallback") -> _Answer:
    outcome = decide_locally(request)
    if isinstance(outcome, Refusal):
        raise NoBackendError(outcome.message, list(outcome.candidates), kind=outcome.kind)
    response = outcome.to_response(rules_revision=SEED_RULES.revision or 0, decision_id=None)
    return _Answer(response.model_copy(update={"source": source}), None)


def _token_fix(exc: ServiceRefused, token: BearerToken) -> str:
    """How to fix what the service refused, by what was sent: no readable token file,
    the pod's own service-account token (workload identity) or a static token."""
    unreadable = token_source_problem(token)
    if unreadable is not None:
        return (
            f"{unreadable}: fix the path ({TOKEN_FILE} or --token-file; in a pod, the "
            "projected token volume's mountPath and path, docs/security.md)"
        )
    workload = is_workload_token(bearer_of(token))
    if exc.status == 401 and workload:
        return (
            "the service rejected the pod's own service-account token for the reason it "
            "gives: the projected volume's audience must be the one the service expects "
            "(its issuer's audience in SWITCHBOARD_WORKLOAD_ISSUERS), and the token's "
            "issuer one the service is configured for (docs/security.md)"
        )
    if exc.status == 401:
        return (
            f"set {TOKEN} (or --token) to an agent token "
            "(`switchboard token create --role agent --name <fleet>` on the service), or, "
            f"in a cluster with a workload issuer, {TOKEN_FILE} (or --token-file) to the "
            "pod's projected service-account token (docs/security.md)"
        )
    if workload:
        return (
            "the pod presented its own service-account token, which proves which pod it "
            "is and, through its issuer, which clusters it may speak for; the service's "
            "reason names what does not match: the pod's name (leave --pod and "
            f"{POD} unset, and the agent takes it from the token) or the cluster (--cluster "
            f"or {CLUSTER} must be one of the issuer's clusters in the service's "
            "SWITCHBOARD_WORKLOAD_ISSUERS) (docs/security.md)"
        )
    return (
        "give the pod a token with the agent role whose clusters include this pod's "
        "cluster (`switchboard token create --role agent --clusters <glob>`)"
    )


def token_problem(exc: ServiceRefused, *, failing: bool = False, token: BearerToken = None) -> str:
    """What a refused token means and how to fix it, for the pod's log; ``failing``
    (``--fail-on-auth-error``): the command exits 3 instead of booting on a fallback,
    and the message says that, not what it would have done otherwise. ``token``: what
    was sent; an unreadable token file, or a pod's own service-account token, calls
    for other advice than a static token does."""
    fix = _token_fix(exc, token)
    if failing:
        then = (
            "Stopping with exit code 3 (--fail-on-auth-error): no backend is chosen and "
            "the pod does not boot on a fallback"
        )
    else:
        then = (
            "The pod boots on its cached answer or a local decision meanwhile (source "
            "auth-fallback)"
        )
    return (
        f"configuration error: the service refused this pod's token ({exc}); {fix}. {then}; "
        "the service counts these refusals per cluster (GET /v1/refusals, the dashboard)"
    )


def decide(
    request: SelectRequest,
    *,
    urls: Sequence[str],
    token: BearerToken,
    deadline_s: float,
    cache: AnswerCache | None,
    notes: Notes,
    dry_run: bool = False,
    fail_on_auth_error: bool = False,
) -> _Answer:
    """The service's answer, else the cached one, else the local engine's, in
    ``deadline_s``. Raises NoBackendError when the decision is a refusal, TokenRefused
    when the service refused the token and ``fail_on_auth_error`` says to stop.
    ``dry_run``: the service records nothing (a pretend GPU, not this pod)."""
    started = time.monotonic()
    entry = None
    if cache is not None:
        entry, problem = cache.load(request)
        if problem:
            notes.warn(problem)

    why: str
    if not urls:
        why = f"no service URL configured ({URL} or --url)"
    else:
        budget = deadline_s - (time.monotonic() - started) - FALLBACK_RESERVE_S
        try:
            asked = ask_service(
                request,
                urls=urls,
                token=token,
                deadline_s=max(0.0, budget),
                etag=entry.etag if entry is not None else None,
                dry_run=dry_run,
            )
        except ServiceRefused as exc:
            if exc.status == 409:
                raise NoBackendError(
                    exc.message, _candidates_of(exc.candidates), kind=exc.kind
                ) from None
            if exc.about_the_token:
                problem = token_problem(exc, failing=fail_on_auth_error, token=token)
                if fail_on_auth_error:
                    raise TokenRefused(problem) from None
                notes.error(problem)
                if entry is not None:
                    # marked as the refusal it follows, not as an outage: the cached
                    # answer's own source stays in cached_source
                    notes.warn(f"using the answer cached {entry.age_s:.0f}s ago meanwhile")
                    response = entry.response.model_copy(update={"source": "auth-fallback"})
                    return _Answer(response, None, cached_source=entry.response.source)
                return _local_answer(request, source="auth-fallback")
            why = f"the service refused the request ({exc})"
        except ServiceUnavailable as exc:
            tried = ""
            if exc.attempts:
                tried = f" after {len(exc.attempts)} attempts (last: {exc.attempts[-1]})"
            why = f"the service did not answer: {exc}{tried}"
        else:
            if asked.response is None:  # 304: our cached answer still holds
                assert entry is not None
                response = entry.response.model_copy(update={"decision_id": asked.decision_id})
                return _Answer(response, asked.url, revalidated=True)
            if cache is not None:
                problem = cache.store(request, asked.response, asked.etag, asked.url)
                if problem:
                    notes.warn(problem)
            return _Answer(asked.response, asked.url)

    if entry is not None:
        notes.warn(
            f"{why}; using the answer {entry.url or 'the service'} gave, cached "
            f"{entry.age_s:.0f}s ago"
        )
        response = entry.response.model_copy(update={"source": "cache"})
        return _Answer(response, None, cached_source=entry.response.source)
    notes.warn(f"{why}; deciding locally with the seed rules")
    return _local_answer(request)


def _candidates_of(raw: Sequence[Any]) -> list[Candidate]:
    """The candidates of a 409 body; an entry this agent cannot read is skipped (a
    newer service may list a backend this agent does not know)."""
    parsed: list[Candidate] = []
    for item in raw:
        try:
            parsed.append(Candidate.model_validate(item))
        except ValueError:
            continue
    return parsed


# ------------------------------------------------------------------- selecting


def _pod_spec(spec: PodSpec | ModelSource, fields: Mapping[str, Any]) -> PodSpec:
    """``spec`` as a PodSpec: a PodSpec with ``fields`` replaced, or a model source with
    ``fields`` as the other PodSpec fields (TypeError names an unknown one)."""
    if isinstance(spec, PodSpec):
        return dataclasses.replace(spec, **fields) if fields else spec
    return PodSpec(spec, **fields)


def select_backend(
    spec: PodSpec | ModelSource = None,
    /,
    *,
    urls: Sequence[str] | str | None = None,
    token: BearerToken = None,
    deadline: float | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    build: bool = True,
    check: bool = False,
    fail_on_auth_error: bool = False,
    settings: AgentSettings | None = None,
    **fields: Any,
) -> SelectionResult:
    """Choose this pod's MLA prefill backend and (by default) build its kernel.

    ``spec`` is a :class:`PodSpec`, or its ``model`` (a ``config.json`` path, a model
    directory or a parsed config) with the other PodSpec fields as keywords
    (``select_backend("/models/R1", cluster="prod-east")``); keywords given with a
    PodSpec replace its fields. Service settings default to ``SWITCHBOARD_URL``
    (comma-separated, tried in turn), ``SWITCHBOARD_TOKEN`` and
    ``SWITCHBOARD_DEADLINE`` (seconds, default 2); the cache to
    ``$SWITCHBOARD_CACHE_DIR`` or ``$XDG_CACHE_HOME/switchboard``: ``settings``, read
    from the environment now when not given (:class:`~.settings.AgentSettings`).

    Raises BadInputError (not an MLA model, unreadable config, bad argument),
    NoBackendError (a refusal: a strict request that is invalid, or no backend the
    engine accepts; its ``kind`` says which), KernelBuildError (nothing, not even
    TORCH_SDPA, builds) or, with ``fail_on_auth_error``, TokenRefused (the service
    refused the token; without it the pod decides locally and says why on its log).
    A pod description that pretends to be another GPU (``capability``/``device_name``)
    is a dry run: the service records nothing (no ``decision_id``), nothing is built,
    and the answer cache is neither read nor written. The cache is this pod's memory
    of what the service told it, kept to boot on when the service is away; a pretend
    GPU's answer would be kept in it for nothing, and a dry run that answered from it
    would show an old answer as the service's current one.
    """
    spec = _pod_spec(spec, fields)
    settings = settings if settings is not None else AgentSettings.from_environ()
    notes = Notes()
    url_list = _url_list(urls, settings)
    token = token if token is not None else settings.bearer
    unreadable = token_source_problem(token)
    if unreadable is not None:
        notes.warn(unreadable)
    deadline = _deadline(deadline, settings)
    pod_description = describe_pod(spec, settings, notes)
    request = pod_description.request
    building = build and not pod_description.pretend
    if building and pod_description.model.num_heads is None:
        raise BadInputError("num_attention_heads is needed to build the kernel; pass num_heads")

    cache = None
    if use_cache and not pod_description.pretend:  # a dry run neither reads nor writes it
        directory = cache_dir or settings.cache_dir or default_cache_dir(settings.xdg_cache_home)
        cache = AnswerCache(directory)

    try:
        answer = decide(
            request,
            urls=url_list,
            token=token,
            deadline_s=deadline,
            cache=cache,
            notes=notes,
            dry_run=pod_description.pretend,
            fail_on_auth_error=fail_on_auth_error,
        )
    except NoBackendError as exc:
        # the caller's report of the refusal shows what was asked and what was seen
        exc.request, exc.notes, exc.pretend = request, list(notes), pod_description.pretend
        raise
    result = _result_of(answer, request, notes, pretend=pod_description.pretend)
    if pod_description.pretend and (build or check):
        notes.info("pretending to be another GPU (--capability/--device-name): nothing is built")
    if not building:
        return result

    _build_into(result, pod_description, notes, check=check, urls=url_list, token=token)
    return result


def _deadline(deadline: float | None, settings: AgentSettings) -> float:
    """The seconds the service may take: given, or the settings' when None."""
    if deadline is None:
        try:
            deadline = settings.deadline_s()
        except ValueError as exc:
            raise BadInputError(f"{DEADLINE}: {exc}") from None
    if not deadline > 0:
        raise BadInputError(f"deadline must be positive, got {deadline!r}")
    return deadline


def _url_list(urls: Sequence[str] | str | None, settings: AgentSettings) -> list[str]:
    """The service URLs to try in turn: given, or the settings' when None."""
    try:
        if urls is None:
            return parse_urls(settings.url, URL)
        return parse_urls(urls if isinstance(urls, str) else ",".join(urls))
    except ValueError as exc:
        raise BadInputError(str(exc)) from None


def _result_of(
    answer: _Answer, request: SelectRequest, notes: Notes, *, pretend: bool
) -> SelectionResult:
    """The service's (or the local) answer as the caller sees it, before any build."""
    response = answer.response
    return SelectionResult(
        backend=response.backend,
        source=response.source,
        candidates=list(response.candidates),
        messages=list(response.messages),
        decision_id=response.decision_id,
        rules_revision=response.rules_revision,
        request=request,
        decided_backend=response.backend,
        notes=notes,
        service_url=answer.url,
        cached_source=answer.cached_source,
        revalidated=answer.revalidated,
        pretend=pretend,
        evidence=None if response.evidence is None else response.evidence.model_dump(mode="json"),
        # the engine asked for; the answer's echo where none was named (switchboard)
        engine=request.engine or response.engine,
        engine_args=list(response.engine_args),
        engine_env=dict(response.engine_env),
    )


def _build_into(
    result: SelectionResult,
    pod_description: PodDescription,
    notes: Notes,
    *,
    check: bool,
    urls: list[str],
    token: BearerToken,
) -> None:
    """Build the decided kernel (or the next that builds) and record it on ``result``.

    A backend that fails is reported to the service against the decision, so the
    fleet's evidence learns of it; the answer's engine arguments are dropped when the
    kernel built is not the one they select."""
    request = pod_description.request
    decided, candidates = result.decided_backend, result.candidates
    dims = pod_description.model
    shape = KernelShape(
        num_heads=dims.num_heads or 0,
        qk_nope_head_dim=dims.qk_nope_head_dim,
        qk_rope_head_dim=dims.qk_rope_head_dim,
        v_head_dim=dims.v_head_dim,
        softmax_scale=dims.softmax_scale,
        dtype=request.dtype,
        device="cpu" if request.device.capability is None else "cuda",
    )

    def on_failure(backend: Backend, error: str) -> None:
        if result.decision_id is None or not urls:
            return
        problem = report_failure(result.decision_id, backend.value, error, urls=urls, token=token)
        if problem is not None:
            notes.warn(f"could not report the {backend} failure to the service: {problem}")

    outcome = build_kernel(
        build_order(decided, candidates),
        shape,
        notes=notes,
        check=check,
        on_failure=on_failure,
    )
    result.backend = outcome.backend
    result.kernel = outcome.kernel
    result.build_failures = [(b.value, why) for b, why in outcome.failures]
    if outcome.failures:
        notes.warn(f"using {outcome.backend} instead of {decided}")
        if result.engine_args or result.engine_env:
            # The answer's engine arguments select the decided backend; the agent has
            # no mapping of its own (the answer is the one source), so it gives none.
            notes.warn(
                f"the engine arguments select {decided}, which did not build "
                "here; giving none, so the engine chooses on its own"
            )
            result.engine_args, result.engine_env = [], {}
