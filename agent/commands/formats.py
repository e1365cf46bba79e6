"""``switchboard select --format``: the answer's own document, printed for a consumer.

Every format is printed from one JSON document, the answer's own
(:meth:`~mla_switchboard.agent.api.SelectionResult.to_dict`, or
:func:`~mla_switchboard.agent.api.refusal_document` for a refusal, which has the same
keys): ``json`` is that document, ``env`` its fields as shell variables, and one
``NAME-args`` format per serving engine that takes flags prints exactly its
``engine_args``. The engine flags are the answer's, verbatim: the service is the one
place that knows how each engine spells a backend.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from mla_switchboard.agent.notes import log
from mla_switchboard.agent.settings import ENGINE
from mla_switchboard.core.engine_names import by_format, detection_order
from mla_switchboard.core.engine_rules.switchboard import SWITCHBOARD_ENV

__all__ = ["SELECT_FORMATS", "args_format_engine", "format_document"]

SELECT_FORMATS: tuple[str, ...] = (
    "json",
    "env",
    *(e.format for e in detection_order() if e.format is not None),
)
"""``--format`` choices: the document, shell variables, and each engine's flags."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def args_format_engine(fmt: str) -> str | None:
    """The engine whose command line ``--format fmt`` prints; None for json and env."""
    entry = by_format(fmt)
    return None if entry is None else entry.name


def _args_line(args: Sequence[str]) -> str:
    """``args`` as one line for ``$(...)``: words separated by spaces. The engine flags
    the service gives have no whitespace; quoting would not survive ``$(...)`` anyway."""
    return " ".join(args)


def _env_values(document: Mapping[str, Any]) -> dict[str, str]:
    """The document as shell variables: the decision, the engine's args (also under
    ``SWITCHBOARD_<ENGINE>_ARGS`` for each engine, empty unless it is this one), why
    nothing was chosen when so, and the engine's own environment."""
    engine = document["engine"]["name"]
    args = _args_line(document["engine_args"])
    values = {
        SWITCHBOARD_ENV: document["backend"] or "",
        "SWITCHBOARD_SOURCE": document["source"],
        "SWITCHBOARD_DECISION_ID": document["decision_id"] or "",
        "SWITCHBOARD_RULES_REVISION": str(document["rules_revision"] or ""),
        ENGINE: engine,  # the variable select reads the engine from, so exporting it holds
        f"{ENGINE}_ARGS": args,
    }
    for entry in detection_order():
        values[f"SWITCHBOARD_{entry.name.upper()}_ARGS"] = args if entry.name == engine else ""
    if document["refusal"] is not None:
        values["SWITCHBOARD_REFUSAL"] = document["refusal"]["message"]
    for name, value in document["engine_env"].items():
        if _ENV_NAME.match(name):
            values[name] = value
        else:
            log.warning("engine_env names %r, which is not a shell variable; left out", name)
    return values


def format_document(document: Mapping[str, Any], fmt: str) -> str:
    """The stdout text of the answer's document for ``fmt``.

    An engine's args format prints nothing when the answer has no args (a refusal, an
    engine version without the flag), so that ``$(...)`` expands to no argument and
    the engine keeps its own choice.
    """
    if fmt == "json":
        return json.dumps(document, indent=2) + "\n"
    if fmt == "env":
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in _env_values(document).items())
    if args_format_engine(fmt) is None:
        raise ValueError(f"unknown format {fmt!r}; want one of {', '.join(SELECT_FORMATS)}")
    args = document["engine_args"]
    return _args_line(args) + "\n" if args else ""
