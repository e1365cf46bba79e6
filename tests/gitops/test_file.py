"""The declarative overrides file: its models, its published JSON Schema, and each
mistake reported at the line and column where it is written."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml
from mla_switchboard.core.schemas import OverrideSpec
from mla_switchboard.service.cli import main as service_main
from mla_switchboard.service.gitops.document import (
    OverridesFile,
    content_revision,
    file_schema,
    schema_text,
)
from mla_switchboard.service.gitops.lines import FileProblem, read_file

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "overrides.schema.json"

GOOD = """\
apiVersion: switchboard/v1
kind: Overrides
rules:
  default: [FLASH_ATTN, TORCH_SDPA]
  by_capability:
    "10": [TRTLLM_RAGGED, FLASHINFER]
overrides:
  "*":
    deny: [CUDNN]
    note: cudnn 1.32 leaks on long prompts
  prod-east:
    force: flashinfer
    note: canary
    expires_at: 2099-01-01T00:00:00Z
    rollout:
      percent: 10
      steps: [10, 50, 100]
      step_every: 30m
  prod-west:
    policy: measured
    trust_clusters: [prod-*]
    note: measure
"""


def problems(text: str) -> list[FileProblem]:
    found = read_file(textwrap.dedent(text), "overrides.yaml")
    assert isinstance(found, list), f"expected mistakes, read {found!r}"
    return found


def test_a_good_file_reads_as_the_api_models() -> None:
    found = read_file(GOOD)
    assert isinstance(found, OverridesFile)
    east = found.overrides["prod-east"]
    assert isinstance(east, OverrideSpec)
    assert east.force is not None and east.force.value == "FLASHINFER"
    assert east.rollout is not None and east.rollout.steps == [10, 50, 100]
    assert found.rules is not None and [b.value for b in found.rules.default] == [
        "FLASH_ATTN",
        "TORCH_SDPA",
    ]


def test_json_is_read_the_same_way_and_the_revision_ignores_formatting() -> None:
    as_yaml = read_file(GOOD)
    as_json = read_file(json.dumps(yaml.safe_load(GOOD), default=str, indent=4))
    assert isinstance(as_yaml, OverridesFile) and isinstance(as_json, OverridesFile)
    assert as_json == as_yaml
    assert content_revision(as_json) == content_revision(as_yaml)


# (the file, line, column, field, words of the message)
MISTAKES = [
    (
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        overrides:
          prod-east:
            force: FLASHINFERX
            note: x
        """,
        5,
        12,
        "overrides.prod-east.force",
        "unknown backend 'FLASHINFERX'; valid backends: TRTLLM_RAGGED, FLASHINFER",
    ),
    (
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        overrides:
          prod-west:
            policy: measured
            trust_clusters: [prod-*, Prod_*]
            note: x
        """,
        6,
        30,
        "overrides.prod-west.trust_clusters.1",
        "'Prod_*' is not a cluster glob: use 1-63 characters",
    ),
    (
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        overrides:
          Prod East:
            force: CUDNN
            note: x
        """,
        4,
        3,
        "overrides.Prod East",
        "'Prod East' is not a cluster name or *",
    ),
    (
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        overrides:
          prod-east:
            note: nothing to do
        """,
        5,
        5,
        "overrides.prod-east",
        "an override needs at least one of force, deny or policy",
    ),
    (
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        overrides:
          prod-east:
            force: CUDNN
        """,
        5,
        5,
        "overrides.prod-east",
        "note is required",
    ),
    (
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        overrides:
          prod-east:
            force: CUDNN
            note: x
            forse: FLASHINFER
        """,
        7,
        12,
        "overrides.prod-east.forse",
        "unknown field 'forse'",
    ),
    (
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        overrides:
          prod-east:
            force: CUDNN
            note: x
            rollout: {percent: 50, steps: [10, 20], step_every: 1h}
        """,
        7,
        14,
        "overrides.prod-east.rollout",
        "the last step must be at least percent",
    ),
    (
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        rules:
          default: [FLASH_ATTN, NOPE]
        """,
        4,
        25,
        "rules.default.1",
        "unknown backend 'NOPE'",
    ),
    (
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        overrides:
          dev-a: {force: CUDNN, note: one}
          dev-a: {force: FLASH_ATTN, note: two}
        """,
        5,
        3,
        "overrides.dev-a",
        "'dev-a' is given twice",
    ),
    (
        """\
        apiVersion: switchboard/v2
        kind: Overrides
        """,
        1,
        13,
        "apiVersion",
        "switchboard/v1",
    ),
    (
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        overrides:
          prod-east: [force
        """,
        5,
        1,
        "",
        "not valid YAML",
    ),
]


@pytest.mark.parametrize(("text", "line", "column", "field", "words"), MISTAKES)
def test_each_mistake_is_reported_where_it_is_written(
    text: str, line: int, column: int, field: str, words: str
) -> None:
    found = problems(text)
    assert len(found) == 1, found
    (problem,) = found
    assert (problem.line, problem.column, problem.field) == (line, column, field), str(problem)
    assert words in problem.message
    assert str(problem).startswith(f"overrides.yaml:{line}:{column}: ")


def test_every_mistake_is_reported_at_once() -> None:
    found = problems(
        """\
        apiVersion: switchboard/v1
        kind: Overrides
        overrides:
          a: {force: NOPE, note: x}
          b: {deny: [NADA], note: y}
        """
    )
    assert [(p.line, p.field) for p in found] == [
        (4, "overrides.a.force"),
        (5, "overrides.b.deny.0"),
    ]


def test_the_published_schema_is_what_the_models_generate() -> None:
    assert SCHEMA.read_text() == schema_text(), (
        "docs/overrides.schema.json is stale: switchboard overrides schema > "
        "docs/overrides.schema.json"
    )


def test_the_schema_accepts_a_good_file_and_refuses_an_unknown_backend() -> None:
    schema = file_schema()
    good = json.loads(json.dumps(yaml.safe_load(GOOD), default=str))
    good["overrides"]["prod-east"]["force"] = "FLASHINFER"  # the schema's enum is upper case
    jsonschema.validate(good, schema)
    bad = json.loads(json.dumps(good))
    bad["overrides"]["prod-east"]["force"] = "FLASHINFERX"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_switchboard_overrides_schema_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert service_main(["overrides", "schema"]) == 0
    assert capsys.readouterr().out == schema_text()


def test_validate_names_the_line_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "overrides.yaml"
    path.write_text(MISTAKES[0][0].replace("        ", ""))
    assert service_main(["overrides", "validate", "-f", str(path)]) == 1
    assert f"{path}:5:12: overrides.prod-east.force: unknown backend" in capsys.readouterr().err
    path.write_text(GOOD)
    assert service_main(["overrides", "validate", "-f", str(path)]) == 0


def test_the_commands_run_without_the_servers_packages(tmp_path: Path) -> None:
    """A CI job installs the plain package and PyYAML: ``switchboard overrides`` must not
    import the server's packages (here made unimportable)."""
    import subprocess
    import sys

    from mla_switchboard.cli import SERVER_MODULES

    path = tmp_path / "overrides.yaml"
    path.write_text(GOOD)
    blocked = "; ".join(f"sys.modules[{m!r}] = None" for m in SERVER_MODULES)
    code = (
        f"import sys; {blocked}; from mla_switchboard.cli import main; "
        f"sys.exit(main(['overrides', 'validate', '-f', {str(path)!r}]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "valid (3 overrides)" in r.stdout
