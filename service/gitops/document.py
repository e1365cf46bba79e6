"""The declarative file's shape, built from the API's own models: an override in the
file is exactly the body of ``PUT /v1/overrides/{cluster}`` (``OverrideSpec``) and the
rules are ``PUT /v1/rules``'s document without its revision, so the file, the API and
the published JSON Schema (``docs/overrides.schema.json``) cannot disagree."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Literal

from mla_switchboard.core.schemas import (
    ClusterName,
    ClusterRuleSet,
    Override,
    OverrideScope,
    OverrideSpec,
    RolloutSpec,
    RulesDocument,
    RuleSet,
)
from pydantic import BaseModel, ConfigDict, Field

API_VERSION = "switchboard/v1"
KIND = "Overrides"


class FileRules(RuleSet):
    """The fleet's rule set as the file declares it: ``PUT /v1/rules``'s document
    without ``revision`` and ``updated_at`` (the service keeps those)."""

    clusters: dict[ClusterName, ClusterRuleSet] = Field(
        default_factory=dict, json_schema_extra={"additionalProperties": False}
    )

    def document(self) -> RulesDocument:
        return RulesDocument.model_validate(self.model_dump(mode="json"))

    @classmethod
    def of(cls, rules: RulesDocument) -> FileRules:
        return cls.model_validate(rules.rules_only())


class OverridesFile(BaseModel):
    """What the fleet should run: the rules (optional: absent, the file leaves them
    alone) and every scope's override, keyed by cluster name or ``*``."""

    model_config = ConfigDict(extra="forbid", title="Switchboard overrides file")

    apiVersion: Literal["switchboard/v1"] = Field(description="the file format's version")
    kind: Literal["Overrides"]
    rules: FileRules | None = Field(
        default=None,
        description="the priority rules; absent (or null): the file does not manage them",
    )
    overrides: dict[OverrideScope, OverrideSpec] = Field(
        default_factory=dict,
        # pydantic writes the key pattern as patternProperties: without this a key
        # that does not match it (and its value) would be left unconstrained
        json_schema_extra={"additionalProperties": False},
        description="each scope's override (a cluster name, or * for the whole fleet), "
        "exactly as PUT /v1/overrides/{cluster} takes it",
    )

    def sent(self) -> dict[str, Any]:
        """The file as JSON, for the plan and apply requests."""
        return self.model_dump(mode="json", exclude_none=False)


def spec_fields(override: Mapping[str, Any]) -> dict[str, Any]:
    """An override as the API shows it (stored, with its rollout's state), cut down to
    what the file declares: ``OverrideSpec``'s fields, the rollout's spec fields."""
    out = {k: override.get(k) for k in OverrideSpec.model_fields if k in override}
    rollout = override.get("rollout")
    if rollout is not None:
        out["rollout"] = {k: rollout[k] for k in RolloutSpec.model_fields if k in rollout}
    return out


def spec_of(override: Override) -> OverrideSpec:
    return OverrideSpec.model_validate(spec_fields(override.model_dump(mode="json")))


def file_form(spec: OverrideSpec) -> dict[str, Any]:
    """An override as the file writes it: only what is set, in the models' order."""
    return spec.model_dump(mode="json", exclude_none=True, exclude_defaults=True)


def content_revision(document: OverridesFile) -> str:
    """The file's revision when none is given: the sha256 of its content, 12 hex digits
    (the same declarations, however formatted or commented, have the same one)."""
    text = json.dumps(document.sent(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def file_schema() -> dict[str, Any]:
    """The JSON Schema of the file, generated from the models above."""
    schema = OverridesFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://mla-switchboard.dev/schemas/overrides.schema.json"
    return schema


def schema_text() -> str:
    """``docs/overrides.schema.json`` as committed (and printed by
    ``switchboard overrides schema``)."""
    return json.dumps(file_schema(), indent=2, sort_keys=True) + "\n"
