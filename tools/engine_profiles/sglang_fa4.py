"""The head dims SGLang's fa4 prefill takes, run from each release's vendored FA4 check.

SGLang's attention dispatch sends an MLA prefill to fa4 without looking at head dims;
FlashAttention 4 itself refuses, at the first prefill, head dims its kernels are not
built for (an ``AssertionError`` in ``_validate_head_dims``, in the release's vendored
``flash_attn/cute/interface.py``). So, the way trtllm_mla's head dims are run on the
FlashInfer the release pins, the release's own check is run here: the function is
taken from the source with ``ast`` (it uses nothing but its arguments), and called with
every (qk, v) pair of multiples of 8 up to 512, per compute capability major it
distinguishes, with the alignment of a 16-bit dtype (``16 // element_size``: 8), the
only dtypes SGLang's MLA prefill runs. What it takes is summarised as "both at most
``up_to``" plus the other pairs it takes, and the grid's pairs are listed as run.

A release that vendors no FA4 (its fa4 comes from a package outside the wheel) gets
``value`` None and a note: its check was not read, and the table's verdicts stay those
of SGLang's own code.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["FA4_CHECK", "FA4_MAJORS", "fa4_head_dims", "fa4_reason", "fa4_takes"]

FA4_CHECK = "_validate_head_dims"
FA4_GLOB = "sglang/**/flash_attn/cute/interface.py"
FA4_MAJORS = (9, 10, 11)  # the majors the check distinguishes (8.x is not checked)
ALIGNMENT = 8  # 16 // element size of float16 / bfloat16
_PARAMS = ["head_dim", "head_dim_v", "compute_capability", "alignment"]
_DIMS = range(8, 513, 8)


def _function(path: Path) -> tuple[Callable[..., None], str]:
    text = path.read_text()
    tree = ast.parse(text)
    func = next(
        (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == FA4_CHECK),
        None,
    )
    if func is None:
        raise RuntimeError(f"{path}: no {FA4_CHECK}: the FA4 head-dim check moved")
    params = [a.arg for a in func.args.args]
    if params != _PARAMS:  # a changed signature must be read again, not guessed
        raise RuntimeError(f"{path}:{func.lineno}: {FA4_CHECK}{tuple(params)} is not {_PARAMS}")
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=[func], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[FA4_CHECK], f"{func.lineno}-{func.end_lineno}"


def _summary(taken: set[tuple[int, int]]) -> dict[str, Any]:
    up_to = 0
    for n in _DIMS:
        if all((a, b) in taken for a in range(8, n + 1, 8) for b in range(8, n + 1, 8)):
            up_to = n
    also = sorted(p for p in taken if max(p) > up_to)
    if len(taken) != len({(a, b) for a in _DIMS for b in _DIMS if max(a, b) <= up_to}) + len(also):
        raise RuntimeError("the FA4 check takes pairs below its square that it refuses")
    return {"up_to": up_to, "also": [list(p) for p in also]}


def fa4_head_dims(root: Path, grid: list[tuple[int, int]]) -> dict[str, Any]:
    """The fact for a release extracted at ``root`` (holding ``sglang/``): per major,
    the (qk, v) head dims its vendored FA4 takes, and the grid's pairs as run."""
    hits = sorted(root.glob(FA4_GLOB))
    if not hits:
        return {
            "value": None,
            "method": "read",
            "where": None,
            "note": "the wheel vendors no flash_attn/cute/interface.py: fa4 comes from a "
            "package outside it, whose head-dim check was not read",
        }
    path = hits[0]
    if len({h.read_bytes() for h in hits}) > 1:  # which one fa4 imports must be read then
        raise RuntimeError(f"{root}: FA4 is vendored more than once, differently: {hits}")
    check, lines = _function(path)
    value: dict[str, Any] = {}
    for major in FA4_MAJORS:
        taken: set[tuple[int, int]] = set()
        for qk in _DIMS:
            for v in _DIMS:
                try:
                    check(qk, v, major, ALIGNMENT)
                except AssertionError:
                    continue
                taken.add((qk, v))
        summary = _summary(taken)
        summary["grid"] = [list(p) for p in sorted(set(grid)) if fa4_takes(summary, p)]
        value[str(major)] = summary
    return {
        "value": value,
        "method": "run",
        "where": f"python/{path.relative_to(root)}:{lines} ({FA4_CHECK})",
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "alignment": ALIGNMENT,
    }


def fa4_takes(summary: dict[str, Any], qk_v: tuple[int, int]) -> bool:
    qk, v = qk_v
    if qk % ALIGNMENT or v % ALIGNMENT:
        return False
    return max(qk, v) <= summary["up_to"] or [qk, v] in summary["also"]


def fa4_reason(major: int, qk_v: tuple[int, int], fact: dict[str, Any]) -> str | None:
    """Why the release's FA4 refuses ``qk_v`` on ``major`` (None: it takes them, or the
    check was not read, or does not apply on that major)."""
    summary = (fact.get("value") or {}).get(str(major))
    if summary is None or fa4_takes(summary, qk_v):
        return None
    return (  # what it does take is the fact's (it varies where the core does not look)
        f"its fa4 prefill runs the vendored FlashAttention 4, whose {FA4_CHECK} refuses "
        f"(qk, v) head dims {qk_v} on SM{major}x"
    )
