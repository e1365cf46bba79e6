"""Extract each vLLM release's MLA prefill rules by running that release's own code.

    python -m tools.engine_profiles.vllm [--versions 0.27.0 0.33.0 ...]
                                         [--out tools/engine_profiles/data/vllm]

Why: the core's rules (``core/engine_rules/vllm.py``) must say, for the release a pod
runs, exactly which prefill backends that release starts with; an answer the release
rejects stops the engine. Reading one release's source and applying it to every other
gave answers older releases reject. So every release gets its own table, produced by
its own code, and a test (``tests/core/test_engine_profiles_vllm.py``) checks the
core's rules against every committed table.

For each release (default: every release on the package index from 0.21.0, when
``--attention-config.mla_prefill_backend`` appeared, to the newest; pre-releases
excluded; every patch release, not only the last of each minor):

0. The first release is proven first: the release before ``FIRST`` (0.20.2) must refuse
   ``--attention-config.mla_prefill_backend=NAME`` in its own parser, and ``FIRST``
   must take it (``check_first``; the answer goes into ``FIRST``'s table).
1. ``pip download --no-deps vllm==X`` into ``~/.cache/switchboard-engines/wheels``
   (``$SWITCHBOARD_ENGINE_CACHE`` moves it), extract the wheel's Python files only into
   ``.../vllm/X/`` and delete the wheel unless ``--keep-wheels``.
2. For each package set, start ``_vllm_worker`` in a fresh interpreter (this one's:
   it needs torch and pydantic, not vLLM's other dependencies) on that tree. It parses
   each backend name with the release's own ``AttentionConfig`` (what the flag's value
   becomes), then over the grid calls the release's own
   ``get_mla_prefill_backend``: once per explicit name (the release answers with the
   backend or raises ``ValueError`` with its ``validate_configuration`` reasons) and
   once without a choice (the release's automatic order).
   Once more, in mode ``parser``: the release's own command-line parser
   (``EngineArgs.add_cli_args(FlexibleArgumentParser())``) is given
   ``--attention-config.mla_prefill_backend=NAME`` for every name, and what it parses
   each into is the table's ``flag`` (the spelling is recorded only if the release's
   parser takes it). Building that parser imports most of vLLM's config modules: the
   worker needs the real ``regex`` (installed with ``pip install --target`` into
   ``.../pydeps``, beside the cache), pydantic and torch; every other third-party
   module vLLM imports there is a stand-in, which is the minimum the parser needs.
3. Write ``<out>/X.json``: the release, the wheel and source files consulted with
   sha256, the method, the grid, the flag, the names the release's config accepts and, per
   situation, each backend's reasons (empty: accepted; each reason text is written once
   in ``reasons`` and referred to by its index) and the automatic choice.

A reason that is not the release's own ``ValueError`` (a failure of the simulation,
such as a stub that does not fit) stops the run for that release: a table must never
record the harness's error as the release's rule. The same holds for any module of the
release that fails to import in the worker, even when the release catches the failure
and makes a verdict of it (0.34.0's selector answers ``['ImportError']``): the worker
records it and the run exits 1 naming the release, the module and the cause
(``SimulationFailed``). A new table is compared with the previous release's
(``compare_with_previous``), and the run ends with the cache's size.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mla_switchboard.core.engine_rules.vllm import VLLM_LEGACY, VLLM_PREFILL_FLAG
from mla_switchboard.core.specs import Backend

from tools.engine_profiles import TABLES
from tools.engine_profiles.cache import cache_root, cache_summary

__all__ = [
    "GRID",
    "PACKAGE_SETS",
    "check_first",
    "extract",
    "main",
    "parse_flag",
    "releases",
    "table_for",
]

FIRST = VLLM_LEGACY.until  # the first release with the flag (0.21.0): the core's claim
FLAG = VLLM_PREFILL_FLAG.option  # the option the core's answers give (--opt=NAME)
FLAG_FIELD = "AttentionConfig.mla_prefill_backend"
CACHE = cache_root()
DEPS = CACHE / "pydeps"  # real third-party modules the parser needs (regex)
ROOT = Path(__file__).resolve().parents[2]

# The names asked about: every backend Switchboard knows, in the registry's order.
NAMES = tuple(b.value for b in Backend)

GRID: dict[str, Any] = {
    "capabilities": [
        [7, 5],
        [8, 0],
        [8, 6],
        [8, 9],
        [9, 0],
        [10, 0],
        [10, 3],
        [11, 0],
        [12, 0],
        [12, 1],
    ],
    # R1/V3, Kimi-linear and DeepSeek-V3.2 (192, 64, 256), the small (64, 64, 128),
    # GLM-5's NoPE layout (256, 0, 256), and two that no release names: a qk head over
    # 256 and a v head larger than the R1 one.
    "dims": [
        [128, 64, 128],
        [192, 64, 256],
        [64, 64, 128],
        [256, 0, 256],
        [256, 64, 128],
        [128, 64, 256],
    ],
    "dtypes": ["bfloat16", "float16", "float32"],
}

# Which kernel packages import (the backends' availability checks test flashinfer and
# tokenspeed_mla; flash_attn is simulated too though vLLM's CUDA build ships its own).
PACKAGE_SETS: dict[str, list[str]] = {
    "all": ["flashinfer", "tokenspeed_mla", "flash_attn"],
    "no-tokenspeed": ["flashinfer", "flash_attn"],
    "tokenspeed-only": ["tokenspeed_mla"],
    "none": [],
}

# The files whose code decides the answer, recorded with their sha256 (the worker
# imports more, but these hold the flag, the names, the checks and the order).
SOURCES = (
    "vllm/config/attention.py",
    "vllm/engine/arg_utils.py",
    "vllm/platforms/interface.py",
    "vllm/platforms/cuda.py",
    "vllm/v1/attention/backends/fa_utils.py",
)
SOURCE_DIRS = ("vllm/v1/attention/backends/mla/prefill",)

_PREFIX = re.compile(
    r"^ValueError: Selected MLA prefill backend (\w+) is not valid for this configuration\. "
    r"Reason: "
)

METHOD = (
    "The release's own code run on a simulated CUDA platform (tools/engine_profiles/"
    "_vllm_worker.py): AttentionConfig(mla_prefill_backend=NAME) decides which names the "
    f"flag {FLAG}=NAME accepts (its EngineArgs parser, run, gives 'flag'); "
    "get_mla_prefill_backend(vllm_config) with that choice gives accepted (reasons []) or "
    "the release's ValueError, whose reason list is recorded (the fixed prefix 'Selected "
    "MLA prefill backend NAME is not valid for this configuration. Reason:' dropped); "
    "without a choice it gives the release's automatic choice. current_platform is the "
    "release's CUDA platform class answering the grid's capability; compiled extensions "
    "and unrelated third-party modules are stubs; the kernel packages of each package set "
    "import as stubs, the others raise ImportError."
)


def _version_key(text: str) -> tuple[int, ...] | None:
    if not re.fullmatch(r"\d+(\.\d+)*", text):
        return None  # pre-releases, dev and post releases are not served versions
    return tuple(int(p) for p in text.split("."))


def all_releases() -> list[str]:
    """Every final vLLM release, oldest first, as pip's index lists them."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "vllm"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("Available versions:"))
    found = []
    for text in line.split(":", 1)[1].split(","):
        key = _version_key(text.strip())
        if key is not None:
            found.append((key, text.strip()))
    return [text for _, text in sorted(found)]


def releases() -> list[str]:
    """Every final vLLM release from 0.21.0 on, oldest first."""
    return [r for r in all_releases() if (_version_key(r) or ())[:3] >= FIRST]


def release_before_first() -> str:
    """The newest release older than ``FIRST``: the one whose parser must refuse the flag."""
    return [r for r in all_releases() if (_version_key(r) or ())[:3] < FIRST][-1]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract(version: str, *, keep_wheel: bool = False) -> tuple[Path, dict[str, str]]:
    """The release's Python files, extracted once into the cache; and its wheel's name
    and sha256 (kept beside the tree, since the wheel itself may be deleted)."""
    tree = CACHE / "vllm" / version
    meta = tree / "wheel.json"
    if meta.exists() and "extensions" in json.loads(meta.read_text()):
        return tree, json.loads(meta.read_text())
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "-d",
            str(wheels),
            f"vllm=={version}",
        ],
        check=True,
        capture_output=True,
    )
    wheel = next(p for p in wheels.glob("vllm-*.whl") if p.name.split("-")[1] == version)
    partial = tree.parent / f"{tree.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    extensions = []
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("vllm/") and name.endswith(".py"):
                z.extract(name, partial)
            elif name.startswith("vllm/") and name.endswith(".so"):
                # the compiled modules the release ships: the worker stubs these, and
                # only these, among vLLM's own modules
                extensions.append(name.split(".")[0].replace("/", "."))
    info = {"wheel": wheel.name, "sha256": _sha256(wheel), "extensions": sorted(extensions)}
    (partial / "wheel.json").write_text(json.dumps(info))
    shutil.rmtree(tree, ignore_errors=True)
    partial.rename(tree)
    if not keep_wheel:
        wheel.unlink()
    return tree, info


def _sources(tree: Path) -> list[dict[str, str]]:
    paths = [tree / s for s in SOURCES if (tree / s).exists()]
    for folder in SOURCE_DIRS:
        paths.extend(sorted((tree / folder).glob("*.py")))
    return [
        {"path": str(p.relative_to(tree)), "sha256": _sha256(p)}
        for p in paths
        if p.name != "__init__.py"
    ]


def ensure_deps() -> None:
    """The real ``regex`` for the parser worker, installed beside the cache once."""
    if not (DEPS / "regex").is_dir():
        print("  pip install --target ... regex", flush=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--target", str(DEPS), "regex"],
            check=True,
        )


def _run_worker(
    tree: Path, present: list[str], extensions: list[str], **mode: Any
) -> dict[str, Any]:
    request = {
        "source": str(tree),
        "release": tree.name,
        "extensions": extensions,
        "present": present,
        "names": list(NAMES),
        **GRID,
        **mode,
    }
    proc = subprocess.run(
        [sys.executable, "-m", "tools.engine_profiles._vllm_worker"],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    where = mode.get("mode", "selection") + (f", packages {present}" if present else "")
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise SimulationFailed(tree.name, where, [], proc.stderr[-3000:]) from None
    if proc.returncode != 0 or result.get("failures"):
        raise SimulationFailed(
            tree.name, where, result.get("failures", []), result.get("crashed", "")
        )
    return result


class SimulationFailed(RuntimeError):
    """The release's code did not run as it would on a pod (a module of it failed to
    import here, or a stand-in did not fit): no verdict of that run is the release's."""

    def __init__(self, release: str, mode: str, failures: list[dict[str, str]], crash: str = ""):
        self.release = release
        self.failures = failures
        parts = [f"module {f['module']} failed to import: {f['cause']}" for f in failures]
        if crash:
            parts.append(f"the worker stopped: {crash}")
        super().__init__(
            f"vLLM {release}: the simulation failed ({mode}), no table is written: "
            + "; ".join(parts or ["the worker gave no output"])
        )


def _reasons(text: str | None, name: str) -> list[str] | str:
    """The release's reason list for ``name`` (empty: accepted), or the harness error."""
    if text is None:
        return []
    m = _PREFIX.match(text)
    if m is None or m.group(1) != name:
        return f"harness error: {text}"
    rest = text[m.end() :]
    try:
        parsed = ast.literal_eval(rest)
    except (ValueError, SyntaxError):
        return [rest]
    return [str(r) for r in parsed] if isinstance(parsed, list) else [rest]


def parse_flag(version: str, *, keep_wheel: bool = False) -> dict[str, Any]:
    """What the release's own argument parser makes of ``FLAG=NAME`` for every name."""
    ensure_deps()
    tree, wheel = extract(version, keep_wheel=keep_wheel)
    return _run_worker(tree, [], wheel["extensions"], mode="parser", flag=FLAG, deps=str(DEPS))


def _takes_flag(result: dict[str, Any]) -> bool:
    return any(p["accepted"] for p in result["parsed"].values())


def check_first(*, keep_wheel: bool = False) -> dict[str, Any]:
    """``FIRST`` is the first release whose parser takes the flag: the release before it
    must refuse it for every name. Returns that release's answer for ``FIRST``'s table;
    raises SystemExit when ``FIRST`` is stale."""
    before = release_before_first()
    result = parse_flag(before, keep_wheel=keep_wheel)
    print(f"vLLM {before}: {FLAG} {'taken' if _takes_flag(result) else 'refused'}", flush=True)
    if _takes_flag(result):
        raise SystemExit(f"FIRST ({'.'.join(map(str, FIRST))}) is stale: vLLM {before} takes it")
    return {"release": before, **result}


def _flag(version: str, keep_wheel: bool) -> dict[str, Any]:
    """The table's ``flag``: the spelling, and what the release's parser made of it."""
    result = parse_flag(version, keep_wheel=keep_wheel)
    flag: dict[str, Any] = {
        "option": FLAG if _takes_flag(result) else None,
        "joined": True,
        "env": None,
        "spelling": f"{FLAG}=NAME" if _takes_flag(result) else None,
        "field": FLAG_FIELD,
        "method": "run: the release's own " + result["parser"] + ", given "
        f"{FLAG}=NAME per name; no environment variable names the prefill backend",
        "parsed": result["parsed"],
    }
    if _version_key(version) == FIRST:
        flag["before"] = check_first(keep_wheel=keep_wheel)
    return flag


def table_for(version: str, *, keep_wheel: bool = False) -> dict[str, Any]:
    """The release's table, built by its own code (see the module docstring)."""
    tree, wheel = extract(version, keep_wheel=keep_wheel)
    flag = _flag(version, keep_wheel)
    situations: list[dict[str, Any]] = []
    accepted_names: list[str] | None = None
    rejected_names: dict[str, str] = {}
    members: list[str] = []
    errors: list[str] = []
    for package_set, present in PACKAGE_SETS.items():
        result = _run_worker(tree, present, wheel["extensions"])
        members = result["members"]
        rejected_names = result["rejected_names"]
        accepted_names = [n for n in NAMES if n not in rejected_names]
        for row in result["rows"]:
            backends: dict[str, Any] = {}
            for name in accepted_names:
                reasons = _reasons(row["explicit"][name], name)
                if isinstance(reasons, str):
                    errors.append(f"{row['capability']} {row['dims']} {row['dtype']}: {reasons}")
                backends[name] = reasons
            auto = row["auto"]
            auto_error = row.get("auto_error")
            if auto is None and not (auto_error or "").startswith("ValueError: No valid MLA"):
                errors.append(f"auto {row['capability']} {row['dims']}: {auto_error}")
            situations.append(
                {
                    "capability": "{}.{}".format(*row["capability"]),
                    "dims": row["dims"],
                    "dtype": row["dtype"],
                    "packages": package_set,
                    "backends": backends,
                    "auto": auto,
                }
            )
    if errors:
        raise RuntimeError(f"vLLM {version}: the simulation failed: " + "; ".join(errors[:5]))
    return {
        "engine": "vllm",
        "release": version,
        "wheel": {"file": wheel["wheel"], "sha256": wheel["sha256"]},
        "sources": _sources(tree),
        "method": METHOD,
        "flag": flag,
        "names": {
            "members": members,
            "accepted": accepted_names,
            "rejected": rejected_names,
        },
        "grid": {**GRID, "packages": PACKAGE_SETS},
        "situations": situations,
    }


def dump(table: dict[str, Any]) -> str:
    """Readable but compact: the header indented, one situation per line. Each reason
    text is written once, in ``reasons``; a situation's backend lists its indexes there
    (``[]``: the release accepts the backend)."""
    texts: dict[str, int] = {}
    rows = []
    for s in table["situations"]:
        backends = {
            name: [texts.setdefault(r, len(texts)) for r in reasons]
            for name, reasons in s["backends"].items()
        }
        rows.append({**s, "backends": backends})
    head = {k: v for k, v in table.items() if k != "situations"}
    head["reasons"] = list(texts)
    text = json.dumps(head, indent=1)
    lines = ",\n  ".join(json.dumps(s, separators=(",", ":")) for s in rows)
    return text[:-2] + ',\n "situations": [\n  ' + lines + "\n ]\n}\n"


def load(text: str) -> dict[str, Any]:
    """A table as :func:`dump` wrote it, each reason index replaced by its text."""
    table = json.loads(text)
    texts = table.pop("reasons", [])
    for s in table["situations"]:
        s["backends"] = {n: [texts[i] for i in idx] for n, idx in s["backends"].items()}
    return table


def previous(version: str, out: Path) -> Path | None:
    """The committed table of the newest release older than ``version``, if any."""
    key = _version_key(version) or ()
    older = [
        (k, p) for p in out.glob("*.json") if (k := _version_key(p.stem)) is not None and k < key
    ]
    return max(older)[1] if older else None


def _situation_key(s: dict[str, Any]) -> tuple[str, str, str, str]:
    return (s["capability"], str(tuple(s["dims"])), s["dtype"], s["packages"])


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What ``new`` answers differently from ``old`` (both in :func:`load`'s form): the
    names the config accepts, the flag's parse, and per situation each backend's
    verdict and the automatic choice. Empty: the releases agree."""
    out: list[str] = []
    for field in ("accepted", "rejected"):
        if old["names"][field] != new["names"][field]:
            out.append(f"names {field}: {old['names'][field]} -> {new['names'][field]}")
    if old["flag"]["spelling"] != new["flag"]["spelling"]:
        out.append(f"flag: {old['flag']['spelling']} -> {new['flag']['spelling']}")
    for name, parsed in new["flag"]["parsed"].items():
        if old["flag"]["parsed"].get(name) != parsed:
            out.append(f"flag {name}: {old['flag']['parsed'].get(name)} -> {parsed}")
    before = {_situation_key(s): s for s in old["situations"]}
    after = {_situation_key(s): s for s in new["situations"]}
    for key in sorted(before.keys() ^ after.keys()):
        out.append(f"{' '.join(key)}: only in {'the old' if key in before else 'the new'} grid")
    for key in sorted(before.keys() & after.keys()):
        a, b = before[key], after[key]
        where = " ".join(key)
        for name in sorted(a["backends"].keys() | b["backends"].keys()):
            was, now = a["backends"].get(name), b["backends"].get(name)
            if was != now:
                out.append(f"{where}: {name} {_verdict(was)} -> {_verdict(now)}")
        if a["auto"] != b["auto"]:
            out.append(f"{where}: automatic {a['auto']} -> {b['auto']}")
    return out


def _verdict(reasons: list[str] | None) -> str:
    if reasons is None:
        return "not asked"
    return "accepted" if not reasons else f"refused {reasons}"


def compare_with_previous(table: dict[str, Any], out: Path, limit: int = 40) -> str:
    """For review: how a release's new table differs from the previous release's."""
    path = previous(table["release"], out)
    if path is None:
        return f"vLLM {table['release']}: no older table in {out} to compare with"
    old = load(path.read_text())
    diff = differences(old, load(dump(table)))
    head = f"vLLM {table['release']} against {old['release']}: "
    if not diff:
        return head + "the same verdicts, automatic choices, names and flag"
    more = f"\n  ... and {len(diff) - limit} more" if len(diff) > limit else ""
    return head + f"{len(diff)} differences\n  " + "\n  ".join(diff[:limit]) + more


def summary(table: dict[str, Any]) -> str:
    rows = table["situations"]
    accepted = sum(1 for s in rows for r in s["backends"].values() if not r)
    refused = sum(1 for s in rows for r in s["backends"].values() if r)
    autos: dict[str, int] = {}
    for s in rows:
        key = s["auto"] or "none"
        autos[key] = autos.get(key, 0) + 1
    auto_text = ", ".join(f"{k} {v}" for k, v in sorted(autos.items()))
    return (
        f"vLLM {table['release']}: {len(rows)} situations, names {table['names']['accepted']}, "
        f"{accepted} accepted / {refused} refused explicit choices; automatic: {auto_text}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", nargs="*", help="releases (default: 0.21.0 to newest)")
    parser.add_argument("--out", default=TABLES / "vllm", type=Path)
    parser.add_argument("--keep-wheels", action="store_true")
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing: exit 1 unless each release's table equals the one in --out",
    )
    args = parser.parse_args(argv)
    versions = args.versions or releases()
    if not args.check:
        args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for version in versions:
        try:
            table = table_for(version, keep_wheel=args.keep_wheels)
        except Exception as exc:
            print(f"vLLM {version}: FAILED: {exc}", flush=True)
            failed.append(version)
            continue
        path = args.out / f"{version}.json"
        if args.check:
            same = path.exists() and path.read_text() == dump(table)
            print(f"vLLM {version}: {'reproduces' if same else 'DIFFERS from'} {path}", flush=True)
            if not same:
                failed.append(version)
            continue
        path.write_text(dump(table))
        print(summary(table), flush=True)
        print(compare_with_previous(table, args.out), flush=True)
    print(cache_summary(), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
