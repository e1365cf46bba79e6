"""A plan as people and pipelines read it: text for a terminal, JSON for a pipeline
(the plan as the service answered it, which ``apply --plan`` takes back), Markdown
for a pull-request comment."""

from __future__ import annotations

import json
from typing import Any

FORMATS = ("text", "json", "markdown")
SIGN = {"create": "+", "update": "~", "delete": "-"}
VERB = {"create": "create", "update": "change", "delete": "remove"}


def render(plan: dict[str, Any], fmt: str, path: str) -> str:
    if fmt == "json":
        return json.dumps(plan, indent=2, sort_keys=True) + "\n"
    if fmt == "markdown":
        return markdown(plan, path)
    return text(plan, path)


def headline(plan: dict[str, Any]) -> str:
    n = plan["summary"]
    return f"{n['create']} to create, {n['update']} to change, {n['delete']} to remove"


def field_changes(change: dict[str, Any], arrow: str = "->") -> list[str]:
    """``key: before -> after`` for each field a change sets, changes or clears."""
    before, after = change["before"] or {}, change["after"] or {}
    out = []
    for name in [*after, *(k for k in before if k not in after)]:
        was, now = before.get(name), after.get(name)
        if was == now:
            continue
        if change["action"] == "create":
            out.append(f"{name}: {_value(now)}")
        elif change["action"] == "delete":
            out.append(f"{name}: {_value(was)}")
        else:
            out.append(f"{name}: {_value(was)} {arrow} {_value(now)}")
    return out


def text(plan: dict[str, Any], path: str) -> str:
    lines = [f"Plan of {path} (revision {plan['revision']}): {headline(plan)}."]
    if not plan["changed"]:
        lines.append("No changes: the service runs what the file says.")
    for change in plan["changes"]:
        what = "rules" if change["resource"] == "rules" else f"override {change['target']}"
        lines.append(f"  {SIGN[change['action']]} {what} ({VERB[change['action']]})")
        lines += [f"      {line}" for line in field_changes(change)]
    preview = plan.get("preview")
    if preview is not None:
        lines.append(_fleet_line(preview) + ":")
        for row in preview["changes"]:
            lines.append(f"  {row['cluster']}: {row['from']} -> {row['to']}, {row['pods']} pods")
            for reason in row["reasons"][:3]:
                lines.append(f"      {reason['pods']} pods: {' '.join(reason['why'])}")
        for row in preview["invalid"]:
            lines.append(
                f"  {row['cluster']}: {row['from']} -> refused, {row['pods']} pods: {row['reason']}"
            )
    if plan["unmanaged"]:
        lines.append(
            "Not in the file, kept (--prune removes them): " + ", ".join(plan["unmanaged"])
        )
    return "\n".join(lines) + "\n"


def markdown(plan: dict[str, Any], path: str) -> str:
    lines = [f"### Switchboard plan of `{path}`: {headline(plan)}", ""]
    if not plan["changed"]:
        lines += ["No changes: the service runs what the file says.", ""]
    else:
        lines += ["| | resource | change |", "|---|---|---|"]
        for change in plan["changes"]:
            what = "rules" if change["resource"] == "rules" else f"override `{change['target']}`"
            detail = "<br>".join(_cell(line) for line in field_changes(change, "→"))
            lines.append(f"| {SIGN[change['action']]} | {what} | {detail} |")
        lines.append("")
    preview = plan.get("preview")
    if preview is not None:
        lines += [f"**{_fleet_line(preview)}**", ""]
        if preview["changes"] or preview["invalid"]:
            lines += ["| cluster | from | to | pods | why |", "|---|---|---|---:|---|"]
            for row in preview["changes"]:
                why = "<br>".join(_cell(" ".join(r["why"])) for r in row["reasons"][:3])
                lines.append(
                    f"| {_cell(row['cluster'])} | {row['from']} | {row['to']} | {row['pods']} "
                    f"| {why} |"
                )
            for row in preview["invalid"]:
                lines.append(
                    f"| {_cell(row['cluster'])} | {row['from']} | refused | {row['pods']} "
                    f"| {_cell(row['reason'])} |"
                )
            lines.append("")
    if plan["unmanaged"]:
        kept = ", ".join(f"`{c}`" for c in plan["unmanaged"])
        lines += [f"Not in the file, kept (`--prune` removes them): {kept}", ""]
    lines.append(f"<sub>file revision `{plan['revision']}`</sub>")
    return "\n".join(lines) + "\n"


def _fleet_line(preview: dict[str, Any]) -> str:
    return (
        f"The recorded fleet ({preview['pods_total']} pods): {preview['pods_changed']} change "
        f"backend, {preview['pods_invalid']} would be refused, {preview['pods_pending']} "
        "pending a restart already"
    )


def _value(v: Any) -> str:
    if v is None:
        return "(unset)"
    return v if isinstance(v, str) else json.dumps(v, separators=(", ", ": "))


def _cell(s: str) -> str:
    """Text safe in a Markdown table cell (pipes, newlines, HTML)."""
    return (
        s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")
    ).replace("\n", " ")
