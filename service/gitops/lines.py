"""Reading the declarative file with the line and column of every value, so that a
mistake is reported where it is written: ``overrides.yaml:12:5: overrides.prod-east.
force: unknown backend 'FLASHINFERX'; ...``.

The text is composed with PyYAML's node API (``yaml.compose``: JSON is read the same
way), which keeps each node's position; pydantic's error ``loc`` is then walked down
the node tree to the value it names (a dictionary key's own error, ``[key]``, points at
the key)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from mla_switchboard.core.names import cluster_rule
from mla_switchboard.core.schemas import CLUSTER_GLOB_PATTERN, OVERRIDE_SCOPE_PATTERN
from mla_switchboard.service.gitops.document import OverridesFile
from pydantic import ValidationError


@dataclass(frozen=True)
class FileProblem:
    """One mistake in the file: where it is (1-based line and column) and what."""

    path: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.field}: " if self.field else ""
        return f"{self.path}:{self.line}:{self.column}: {where}{self.message}"


def read_file(text: str, path: str = "overrides.yaml") -> OverridesFile | list[FileProblem]:
    """The file's content as the model, or every mistake in it with its position."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        data = None if root is None else loader.construct_document(root)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        problem = getattr(exc, "problem", None) or str(exc)
        return [FileProblem(path, line, column, "", f"not valid YAML: {problem}")]
    finally:
        loader.dispose()
    if root is None or not isinstance(data, dict):
        return [FileProblem(path, 1, 1, "", "expected a mapping with apiVersion, kind, overrides")]
    duplicates = list(_duplicate_keys(root, path, ()))
    if duplicates:
        return duplicates
    try:
        return OverridesFile.model_validate(data)
    except ValidationError as exc:
        return [_problem(path, root, error) for error in exc.errors(include_url=False)]


def _problem(path: str, root: yaml.Node, error: Any) -> FileProblem:
    loc: tuple[Any, ...] = tuple(error["loc"])
    node, field = _locate(root, loc)
    mark = node.start_mark
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if error["type"] == "string_pattern_mismatch":
        message = _pattern_message(error)
    elif error["type"] == "missing":
        message = f"{loc[-1]} is required"
    elif error["type"] == "extra_forbidden":
        message = f"unknown field {loc[-1]!r}"
    return FileProblem(path, mark.line + 1, mark.column + 1, _dotted(field), message)


def _pattern_message(error: Any) -> str:
    """A cluster name or glob refused by its pattern, said in the words of its rule
    (``core/names.py``) rather than as the regular expression."""
    pattern = (error.get("ctx") or {}).get("pattern")
    value = error.get("input")
    if pattern == CLUSTER_GLOB_PATTERN:
        return f"{value!r} is not a cluster glob: use {cluster_rule(wildcards=True)}"
    if pattern == OVERRIDE_SCOPE_PATTERN:
        return f"{value!r} is not a cluster name or *: use {cluster_rule()}"
    return str(error["msg"])


def _locate(root: yaml.Node, loc: Sequence[Any]) -> tuple[yaml.Node, list[str]]:
    """The deepest node ``loc`` names, and the field path written as in the file
    (model-level errors and union branches are dropped: they name no key)."""
    node, key, field = root, root, []
    for part in loc:
        if part == "[key]":
            return key, field  # the error is the key's own: point at the key
        child = _child(node, part)
        if child is None:
            continue  # a union branch or model name pydantic adds, or a missing field
        key, node = child
        field.append(str(part))
    return node, field


def _child(node: yaml.Node, part: Any) -> tuple[yaml.Node, yaml.Node] | None:
    """The (key, value) nodes of ``part`` in ``node`` (an item: itself twice)."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return key, value
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return node.value[part], node.value[part]
    return None


def _duplicate_keys(node: yaml.Node, path: str, field: tuple[str, ...]) -> Any:
    """A key given twice in one mapping (YAML keeps the last silently: in a reviewed
    file that is a mistake, one of the two overrides would never apply)."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            name = str(key.value)
            if name in seen:
                yield FileProblem(
                    path,
                    key.start_mark.line + 1,
                    key.start_mark.column + 1,
                    _dotted([*field, name]),
                    f"{name!r} is given twice",
                )
            seen.add(name)
            yield from _duplicate_keys(value, path, (*field, name))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _duplicate_keys(item, path, (*field, str(i)))


def _dotted(field: Sequence[str]) -> str:
    return ".".join(field)
