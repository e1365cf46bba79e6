"""SGLang's MLA prefill behaviour per release, taken from each release's own code.

``python -m tools.engine_profiles.sglang [--versions V ...] [--out DIR]`` (default
``tools/engine_profiles/data/sglang``)

For each SGLang release that has ``--prefill-attention-backend`` (0.4.9.post5 is the
first: ``pip download`` of 0.4.9.post4 and older shows no such flag), the wheel is
downloaded once into ``~/.cache/switchboard-engines/sglang`` (``$SWITCHBOARD_ENGINE_CACHE``
moves it) and its Python sources are
extracted. Then, per release, in a subprocess (``_sglang_worker``) with torch, CUDA and
the kernels stubbed:

- run: the release's own argument parser (``ServerArgs.add_cli_args``) gives the
  choices of ``--attention-backend``/``--prefill-attention-backend``/
  ``--decode-attention-backend`` (newer releases build their fields from msgspec
  structs, so msgspec is installed for the worker beside the cache). Where the parser
  cannot be built under stubs, the choices list is read from the source instead and the
  fact says so (no release needs that today);
- run: the DeepSeek model's attention dispatch (``handle_attention_<name>``, or the
  attention class's ``dispatch_attn_forward_method`` before 0.5.3) for a fresh prefill
  batch, per backend name, compute capability and MLA dims: ``MHA*`` means the
  backend's ragged prefill kernel runs; ``MLA`` means prefill goes through the absorbed
  (decode-style) path instead;
- run: the fa3 backend's own capability assert, its condition evaluated per capability;
- run (0.5.10 on, where it is a function of its own): SGLang's automatic attention
  backend for an MLA model per capability;
- read, with file:line: the rest (FlashInfer's CUTLASS kernel on 10.x, the trtllm_mla
  and tokenspeed_mla startup checks, the kernel trtllm_mla's prefill calls, the
  automatic MLA default before 0.5.10 and the DeepSeek-V3 override), because they sit
  inside ``ServerArgs.__post_init__`` or a backend's ``__init__`` that cannot run
  without a GPU, or are a call's presence;
- read, from FlashInfer rather than SGLang: what the kernels SGLang calls take
  (``KERNEL_FACTS``), and from each wheel's METADATA how it depends on flashinfer;
- run, from the release's vendored FlashAttention 4 (``flash_attn/cute/interface.py``,
  ``sglang_fa4``): its ``_validate_head_dims``, per capability major, for every (qk, v)
  pair of multiples of 8 up to 512; fa4's verdict on a capability it checks is that;
- run, on the FlashInfer release the SGLang release pins (``flashinfer_python==X`` in
  its METADATA; its wheel or sdist downloaded once into
  ``~/.cache/switchboard-engines/flashinfer``, ``flashinfer/prefill.py`` extracted):
  the head-dim check of
  ``trtllm_ragged_attention_deepseek``, the kernel trtllm_mla prefill calls, evaluated
  for every (qk, v) pair it could name. That gives the (qk, v) head dims the release's
  trtllm_mla prefill takes (a release whose trtllm_mla backend has no prefill of its
  own runs its parent's, FlashInfer's MLA backend, and says so).

The dispatch runs with the platform predicates it reads (``get_platform()``,
``is_sm100_supported()``...) replaced by answers for the simulated capability; the
verdict per situation combines what ran with what was read, and each table lists both.

One JSON table per release goes to ``<out>/<version>.json``; ``core/engine_rules/
sglang.py`` holds the rules as data per release range and ``tests/core/
test_engine_profiles_sglang.py`` checks them against every table.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Any

from mla_switchboard.core.engine_rules.base import version_text
from mla_switchboard.core.engine_rules.sglang import (
    SGLANG_DECODE_FLAG,
    SGLANG_FIRST,
    SGLANG_NAMES,
    SGLANG_PREFILL_FLAG,
)
from mla_switchboard.core.specs import FLASHINFER_CUTLASS_HEAD_DIMS

from tools.engine_profiles import TABLES
from tools.engine_profiles.cache import cache_root, cache_summary
from tools.engine_profiles.sglang_fa4 import fa4_head_dims, fa4_reason

CACHE = cache_root() / "sglang"
FLASHINFER_CACHE = CACHE.parent / "flashinfer"
BUILD_DEPS = CACHE.parent / "builddeps"
"""What ``pip download`` needs to read an old FlashInfer sdist's metadata (0.3 to 0.4
ship no wheel on the index, and their build requirements no longer resolve), used
with ``--no-build-isolation``."""
BUILD_REQUIRES = ["setuptools>=77", "packaging>=24"]
FIRST = version_text(SGLANG_FIRST)  # the first release whose parser has the prefill flag
PREFILL = SGLANG_PREFILL_FLAG.option  # the options the core's answers give
DECODE = SGLANG_DECODE_FLAG.option
FLAGS = ("--attention-backend", PREFILL, DECODE)
"""The flags whose choices a release's parser is asked for: both the core gives, and
the one that sets prefill and decode together (which the core never gives)."""
CAPS = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (10, 3), (11, 0), (12, 0), (12, 1)]
DIMS = [
    (128, 64, 128),  # DeepSeek-V2/V3/R1, Kimi-K2
    (192, 64, 256),  # Kimi-linear
    (64, 64, 128),
    (256, 0, 256),  # GLM-5 style, no rope part
    (256, 64, 128),
    (128, 64, 256),
    (64, 0, 64),
]
DTYPES = ["bfloat16", "float16", "float32"]
# SGLang names that map to a Switchboard backend: the core's one map of them.
NAMES: dict[str, str] = {name: backend.value for name, backend in SGLANG_NAMES.items()}
# FlashInfer's CUTLASS FMHA (what SGLang's FlashInfer MLA backend runs on 10.x) is
# instantiated only for these (qk head dim, v head dim) pairs (read from FlashInfer,
# written once in core/specs.py).
CUTLASS_QK_V = set(FLASHINFER_CUTLASS_HEAD_DIMS)
RAGGED_KERNEL = "trtllm_ragged_attention_deepseek"
"""FlashInfer's trtllm-gen ragged DeepSeek prefill (``flashinfer/prefill.py``), what
SGLang's trtllm_mla backend calls for a fresh prefill (0.5.2 on)."""
# Facts about the kernels SGLang calls, read from FlashInfer (not from SGLang): the same
# for every release here, recorded in each table so that it says what it rests on.
KERNEL_FACTS: dict[str, dict[str, Any]] = {
    "flashinfer_cutlass_dims": {
        "value": sorted(CUTLASS_QK_V),
        "method": "read",
        "where": "flashinfer-python 0.7.2 flashinfer/prefill.py:1737-1738 (the dispatch "
        "in csrc/fmha_cutlass_sm100.cu takes exactly these (qk, v) head dims)",
    },
    "flashinfer_auto_backend": {
        "value": "fa3 on SM90 for the head dims its kernels have, else fa2",
        "method": "read",
        "where": "flashinfer-python 0.7.2 flashinfer/utils.py:574 "
        "determine_attention_backend; fa2 is JIT-built for the device, SM120 included "
        "(flashinfer/jit/core.py:169, compute_120a/120f; compilation_context.py: CUDA "
        ">= 12.8), heads over 256 on 8.x-12.x (jit/attention/modules.py:1606)",
    },
    "flashinfer_mla_min_capability": {
        "value": "8.0",
        "method": "read",
        "where": "SGLang's FlashInfer MLA backend builds BatchMLAPagedAttentionWrapper at "
        "init; FlashInfer's MLA kernels are not built for 7.5 (our reading, not run)",
    },
    "trtllm_ragged_capability": {
        "value": "10.x",
        "method": "read",
        "where": "FlashInfer trtllm_ragged_attention_deepseek: trtllm-gen cubins for "
        "SM100/SM103 only (its head dims: each release's trtllm_ragged_head_dims)",
    },
    "fp16_bf16_only": {
        "value": True,
        "method": "read",
        "where": "FA3, FA4, FlashInfer and trtllm-gen prefill kernels take fp16/bf16 only",
    },
}


def released_versions() -> list[str]:
    """Every final SGLang release on the index (pre-releases excluded), oldest first."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "sglang"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("Available versions:"))
    found = [v.strip() for v in line.split(":", 1)[1].split(",")]
    finals = [v for v in found if not re.search(r"(rc|a|b|dev)\d*$", v)]
    return sorted(finals, key=vkey)


def vkey(v: str) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?", v)
    assert m is not None, v
    return tuple(int(g or 0) for g in m.groups())


def fetch(version: str) -> Path:
    """The release's extracted sources (downloaded once)."""
    root = CACHE / "src" / version
    if (root / "sglang" / "srt").is_dir():
        return root
    dl = CACHE / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    wheels = list(dl.glob(f"sglang-{version}-*.whl"))
    if not wheels:
        print(f"  pip download sglang=={version}", flush=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
        subprocess.run([*pip, f"sglang=={version}", "-d", str(dl)], check=True)
        wheels = list(dl.glob(f"sglang-{version}-*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        z.extractall(root, [n for n in z.namelist() if n.startswith("sglang/")])
    return root


def ensure_deps() -> None:
    """msgspec, which newer releases' parsers introspect for real, beside the cache; and
    what reading an old FlashInfer sdist's metadata needs (``BUILD_DEPS``)."""
    deps = CACHE.parent / "pydeps"
    wanted = ((deps, "msgspec", ["msgspec"]), (BUILD_DEPS, "setuptools", BUILD_REQUIRES))
    for target, marker, packages in wanted:
        if not (target / marker).is_dir():
            print(f"  pip install --target ... {' '.join(packages)}", flush=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "-q", "--target", str(target), *packages],
                check=True,
            )


def _worker(root: Path, mode: str, *extra: str) -> dict[str, Any] | None:
    proc = subprocess.run(
        [sys.executable, "-m", "tools.engine_profiles._sglang_worker", str(root), mode, *extra],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    if "@@JSON@@" not in proc.stdout:
        return None
    return json.loads(proc.stdout.split("@@JSON@@", 1)[1])


class Source:
    """A release's files, with sha256 and line lookups for the facts read from them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.used: dict[str, str] = {}

    def text(self, rel: str) -> str | None:
        path = self.root / "sglang" / "srt" / rel
        if not path.is_file():
            return None
        data = path.read_bytes()
        self.used[f"python/sglang/srt/{rel}"] = hashlib.sha256(data).hexdigest()
        return data.decode()

    def find(self, rels: list[str], pattern: str) -> tuple[str, int, str] | None:
        """The first line matching ``pattern`` in the first of ``rels`` that has one."""
        rx = re.compile(pattern)
        for rel in rels:
            text = self.text(rel)
            if text is None:
                continue
            for i, line in enumerate(text.splitlines(), 1):
                if rx.search(line):
                    return rel, i, line.strip()
        return None

    def files(self, *globs: str) -> list[str]:
        base = self.root / "sglang" / "srt"
        return sorted(str(p.relative_to(base)) for g in globs for p in base.glob(g))


def _where(hit: tuple[str, int, str] | None) -> str | None:
    return None if hit is None else f"python/sglang/srt/{hit[0]}:{hit[1]}"


def read_choices(src: Source) -> tuple[dict[str, list[str]] | None, str | None]:
    """The flags' choices read from the source: ``choices=X`` where X is a list literal
    or a module-level list (``ATTENTION_BACKEND_CHOICES``)."""
    rels = src.files("arg_groups/choices.py", "server_args.py", "arg_groups/fields/*.py")
    for rel in rels:
        text = src.text(rel)
        assert text is not None
        m = re.search(r"^ATTENTION_BACKEND_CHOICES = \[(.*?)^\]", text, re.S | re.M)
        if m:
            names = [n for n in re.findall(r'"([^"]+)"', m.group(1))]
            line = text[: m.start()].count("\n") + 1
            return {f: names for f in FLAGS}, f"python/sglang/srt/{rel}:{line}"
    return None, None


def fa3_assert(src: Source) -> dict[str, Any]:
    """The fa3 backend's own capability assert, its condition evaluated per capability
    with the model an MLA model."""
    for rel in ("layers/attention/attention_registry.py", "model_executor/model_runner.py"):
        text = src.text(rel)
        if text is None:
            continue
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Assert) or node.msg is None:
                continue
            if "FlashAttention v3 Backend requires" not in ast.unparse(node.msg):
                continue
            cond = compile(ast.Expression(node.test), rel, "eval")
            ok = []
            for major, minor in CAPS:
                torch = _NS(cuda=_NS(get_device_capability=lambda *a, c=(major, minor): c))
                env = {
                    "torch": torch,
                    "major": major,
                    "minor": minor,
                    "self": _NS(use_mla_backend=True),
                    "runner": _NS(use_mla_backend=True),
                }
                if eval(cond, env):
                    ok.append(f"{major}.{minor}")
            try:
                message = str(ast.literal_eval(node.msg))
            except ValueError:
                message = ast.unparse(node.msg)
            return {
                "value": ok,
                "method": "run",
                "where": f"python/sglang/srt/{rel}:{node.lineno}",
                "text": ast.unparse(node.test),
                "message": message,
            }
    return {"value": ["9.0"], "method": "read", "where": None, "text": "not found"}


class _NS:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def read_facts(src: Source) -> dict[str, dict[str, Any]]:
    """The facts read (not run), each with its file:line in this release."""
    model_files = ["models/deepseek_common/attention_backend_handler.py", "models/deepseek_v2.py"]
    args_files = src.files("server_args.py", "arg_groups/*.py", "arg_groups/model_overrides/*.py")
    facts: dict[str, dict[str, Any]] = {}

    def fact(key: str, files: list[str], pattern: str, value: Any, absent: Any) -> None:
        hit = src.find(files, pattern)
        facts[key] = {
            "value": value if hit else absent,
            "method": "read",
            "where": _where(hit),
            "line": hit[2] if hit else None,
        }

    fact(
        "flashinfer_cutlass_on_10x",
        ["layers/attention/flashinfer_mla_backend.py"],
        r'fmha_backend = "cutlass"',
        True,
        False,
    )
    fact(
        "flashinfer_ragged_off_without_rope",
        model_files,
        r"qk_rope_head_dim == 0",
        True,
        False,
    )
    fact(
        "trtllm_mla_startup_check",
        args_files,
        r"TRTLLM MLA backend is only supported on Blackwell",
        "attention or decode flag trtllm_mla: Blackwell only",
        None,
    )
    fact(
        "tokenspeed_mla_needs_fp8_kv",
        [*args_files, "layers/attention/tokenspeed_mla_backend.py"],
        r"tokenspeed_mla backend requires (--)?kv-cache-dtype",
        True,
        False,
    )
    fact(
        "tokenspeed_mla_alias_of_cutedsl",
        src.files("arg_groups/choices.py", "server_args.py"),
        r'"tokenspeed_mla",\s*# Deprecated alias for "cutedsl_mla"',
        True,
        False,
    )
    fact(
        "cutedsl_decode_only",
        args_files,
        r"CuteDSL MLA only supports decoding",
        True,
        False,
    )
    fact(
        "automatic_mla",
        [
            "arg_groups/model_override_base.py",
            "server_args.py",
            "model_executor/model_runner.py",
        ],
        r'(attention_backend = |return )"flashinfer"',
        "MLA: 9.x fa3, 10.x flashinfer, otherwise triton",
        None,
    )
    fact(
        "deepseek_v3_sm100_trtllm_mla",
        args_files,
        r"Use trtllm_mla as attention backend on sm100",
        "DeepSeek-V3 family on 10.x: trtllm_mla while no attention flag is set",
        None,
    )
    return facts


def situations(
    choices: dict[str, list[str]],
    fa3: dict[str, Any],
    methods: dict[str, str | None],
    facts: dict[str, dict[str, Any]],
    defaults: dict[str, str | None],
) -> list[dict[str, Any]]:
    """Per capability, dims and dtype: each SGLang name's verdict and kernel."""
    prefill = set(choices.get(PREFILL) or [])
    rows = []
    for (major, minor), dims, dtype in ((c, d, t) for c in CAPS for d in DIMS for t in DTYPES):
        cap = f"{major}.{minor}"
        qk, v = dims[0] + dims[1], dims[2]
        row: dict[str, Any] = {"capability": cap, "dims": list(dims), "dtype": dtype}
        names: dict[str, Any] = {}
        for name in NAMES:
            verdict: dict[str, Any] = {"runs": False, "kernel": None, "reason": None}
            method = methods.get(f"{name}|{cap}|{dims[0]},{dims[1]},{dims[2]}")
            if name not in prefill:
                verdict["reason"] = f"not a --prefill-attention-backend choice ({name})"
            elif dtype not in ("bfloat16", "float16"):
                verdict["reason"] = "its MLA prefill kernels are built for fp16/bf16 only"
            elif method is None:
                verdict["reason"] = "the DeepSeek attention dispatch has no handler for it"
            elif not method.startswith("MHA"):
                verdict["reason"] = (
                    f"its dispatch sends prefill to the absorbed path ({method}), "
                    "not the backend's ragged prefill kernel"
                )
            elif name == "fa3":
                if cap in fa3["value"]:
                    verdict.update(runs=True, kernel="FlashAttention 3 varlen (sgl_kernel)")
                else:
                    verdict["reason"] = (
                        "fa3 asserts compute capability 9.x for MLA models: "
                        + fa3.get("message", "")
                    )
            elif name == "fa4":
                verdict.update(fa4_verdict(major, (qk, v), facts, method))
            elif name == "flashinfer":
                if major < 8:
                    verdict["reason"] = "FlashInfer's MLA kernels need compute capability 8.0+"
                elif major == 10 and facts["flashinfer_cutlass_on_10x"]["value"]:
                    if (qk, v) in CUTLASS_QK_V:
                        verdict.update(runs=True, kernel="FlashInfer CUTLASS FMHA (ragged)")
                    else:
                        verdict["reason"] = (
                            "on 10.x it forces FlashInfer's CUTLASS kernel, which takes "
                            f"(qk, v) head dims {sorted(CUTLASS_QK_V)} only, not ({qk}, {v})"
                        )
                else:
                    kind = "FA3" if major == 9 else "FA2"
                    verdict.update(runs=True, kernel=f"FlashInfer ragged prefill, auto ({kind})")
            elif name == "trtllm_mla":
                verdict.update(trtllm_verdict(major, (qk, v), facts))
            elif name == "tokenspeed_mla":
                if facts["tokenspeed_mla_alias_of_cutedsl"]["value"]:
                    verdict["reason"] = (
                        "tokenspeed_mla is a deprecated alias of cutedsl_mla, which only decodes"
                    )
                elif facts["tokenspeed_mla_needs_fp8_kv"]["value"]:
                    verdict["reason"] = (
                        "its tokenspeed_mla backend requires --kv-cache-dtype fp8_e4m3"
                    )
                else:
                    verdict.update(runs=True, kernel="tokenspeed_mla")
            verdict["dispatch"] = method
            names[name] = verdict
        row["names"] = names
        row["automatic"] = automatic(major, facts, defaults.get(cap))
        rows.append(row)
    return rows


def fa4_verdict(
    major: int, qk_v: tuple[int, int], facts: dict[str, Any], method: str
) -> dict[str, Any]:
    """fa4's prefill, its dispatch having sent it to FlashAttention 4's MHA path: what
    the release's vendored FA4 check takes (``sglang_fa4``; unread: SGLang's answer)."""
    reason = fa4_reason(major, qk_v, facts["fa4_head_dims"])
    if reason is not None:
        return {"reason": reason}
    return {"runs": True, "kernel": f"FlashAttention 4 (flash_attn.cute), {method}"}


def trtllm_verdict(major: int, qk_v: tuple[int, int], facts: dict[str, Any]) -> dict[str, Any]:
    """trtllm_mla's prefill on a capability major for head dims (qk, v), its dispatch
    having sent the prefill to the backend: what the kernel it calls takes."""
    prefill = facts["trtllm_mla_prefill"]["value"]
    if major != 10:
        kernel = (
            "CUTLASS kernel" if prefill == PARENT_PREFILL else "trtllm-gen ragged DeepSeek kernel"
        )
        return {
            "reason": f"trtllm_mla prefill runs FlashInfer's {kernel}, built for SM100/SM103 only"
        }
    if prefill == RAGGED_KERNEL:
        fact = facts["trtllm_ragged_head_dims"]
        taken = {tuple(p) for p in fact["value"] or []}
        if qk_v in taken:
            return {"runs": True, "kernel": "FlashInfer trtllm-gen ragged DeepSeek"}
        return {  # where it was read is the fact's: the reason is the same across releases
            "reason": f"its prefill calls FlashInfer's {RAGGED_KERNEL}, which takes (qk, v) "
            f"head dims {sorted(taken)} only, not {qk_v}"
        }
    if prefill == PARENT_PREFILL and facts["flashinfer_cutlass_on_10x"]["value"]:
        if qk_v in CUTLASS_QK_V:
            return {"runs": True, "kernel": f"FlashInfer CUTLASS FMHA (ragged), via {prefill}"}
        return {
            "reason": f"its prefill is {prefill}, which on 10.x forces FlashInfer's CUTLASS "
            f"kernel: (qk, v) head dims {sorted(CUTLASS_QK_V)} only, not {qk_v}"
        }
    return {"reason": "no prefill kernel found for trtllm_mla in this release"}


def automatic(major: int, facts: dict[str, dict[str, Any]], ran: str | None) -> dict[str, str]:
    """SGLang's own choice with no attention flag: a generic MLA model and the
    DeepSeek-V3 family. ``ran``: what the release's defaulting function answered (0.5.10
    on); else read from the inline defaulting in its post-init."""
    generic = ran or ("fa3" if major == 9 else "flashinfer" if major == 10 else "triton")
    dsv3 = generic
    if major == 10 and facts["deepseek_v3_sm100_trtllm_mla"]["value"]:
        dsv3 = "trtllm_mla"
    return {"mla": generic, "deepseek_v3": dsv3}


def flashinfer_dependency(version: str) -> dict[str, Any]:
    """How the release's wheel depends on flashinfer (METADATA Requires-Dist)."""
    wheel = next((CACHE / "dl").glob(f"sglang-{version}-*.whl"), None)
    if wheel is None:
        return {"value": None, "method": "read", "where": None}
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    found = [
        x.split(":", 1)[1].strip()
        for x in lines
        if x.lower().startswith("requires-dist: flashinfer")
    ]
    return {"value": found, "method": "read", "where": f"{wheel.name}:{meta}"}


_PIN = re.compile(r"^flashinfer[-_]python(\[[^\]]*\])?\s*==\s*([^;\s]+)")


def flashinfer_pin(dependency: dict[str, Any]) -> str | None:
    """The flashinfer-python release the SGLang wheel pins (``==X``), or None."""
    for requirement in dependency.get("value") or []:
        m = _PIN.match(requirement)
        if m:
            return m.group(2)
    return None


def _flashinfer_archives(dl: Path, version: str) -> list[Path]:
    return sorted(
        p
        for p in dl.iterdir()
        if p.name.startswith(f"flashinfer_python-{version}-")
        or p.name == f"flashinfer_python-{version}.tar.gz"
    )


def fetch_flashinfer(version: str) -> Path:
    """FlashInfer ``version``'s ``flashinfer/prefill.py`` (downloaded once, wheel or sdist;
    only that file is kept extracted)."""
    target = FLASHINFER_CACHE / "src" / version / "flashinfer" / "prefill.py"
    if target.is_file():
        return target
    dl = FLASHINFER_CACHE / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    found = _flashinfer_archives(dl, version)
    if not found:
        print(f"  pip download flashinfer-python=={version}", flush=True)
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-build-isolation"]
        env = {**os.environ, "PYTHONPATH": str(BUILD_DEPS)}
        subprocess.run([*pip, f"flashinfer-python=={version}", "-d", str(dl)], check=True, env=env)
        found = _flashinfer_archives(dl, version)
    archive = found[0]
    if archive.name.endswith(".whl"):
        with zipfile.ZipFile(archive) as z:
            data = z.read("flashinfer/prefill.py")
    else:
        with tarfile.open(archive) as t:
            (member,) = [
                m
                for m in t.getmembers()
                if m.name.count("/") == 2 and m.name.endswith("/flashinfer/prefill.py")
            ]
            handle = t.extractfile(member)
            assert handle is not None
            data = handle.read()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def trtllm_prefill(src: Source) -> dict[str, Any]:
    """What SGLang's trtllm_mla backend runs for a fresh prefill, read: FlashInfer's
    ragged DeepSeek kernel where the backend calls it (0.5.2 on), else, where the
    backend has no ``forward_extend`` of its own (0.5.1 to 0.5.1.post3), its parent's:
    FlashInfer's MLA backend, whose ragged prefill is FlashInfer's CUTLASS kernel on
    10.x."""
    rels = ["layers/attention/trtllm_mla_backend.py"]
    hit = src.find(rels, rf"\b{RAGGED_KERNEL}\(")
    if hit is not None:
        return {"value": RAGGED_KERNEL, "method": "read", "where": _where(hit), "line": hit[2]}
    parent = src.find(rels, r"^class TRTLLMMLABackend\(FlashInferMLAAttnBackend\)")
    if parent is not None and src.find(rels, r"def forward_extend\(") is None:
        return {
            "value": PARENT_PREFILL,
            "method": "read",
            "where": _where(parent),
            "line": parent[2],
        }
    return {"value": None, "method": "read", "where": None, "line": None}


PARENT_PREFILL = "FlashInferMLAAttnBackend.forward_extend"
"""trtllm_mla's prefill where its backend does not override it: its parent's."""
_TENSORS = ("query", "key", "value")


def _shape_only(node: ast.AST, names: set[str]) -> bool:
    """An expression of the tensors' shapes and names set from them, nothing called."""
    return not any(isinstance(n, ast.Call) for n in ast.walk(node)) and all(
        n.id in names for n in ast.walk(node) if isinstance(n, ast.Name)
    )


def ragged_head_dims(version: str) -> dict[str, Any]:
    """The (qk, v) head dims FlashInfer ``version``'s ``trtllm_ragged_attention_deepseek``
    takes, run: its own check (the names it sets from the tensors' shapes, then the
    assert on them) evaluated with query and key of head dim qk and value of head dim
    v (SGLang passes k with q's head dim), for every pair of the head dims the check
    names or the grid has."""
    path = fetch_flashinfer(version)
    text = path.read_text()
    where = f"flashinfer-python {version} flashinfer/prefill.py"
    func = next(
        (
            n
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef) and n.name == RAGGED_KERNEL
        ),
        None,
    )
    found: dict[str, Any] = {
        "value": None,
        "method": "run",
        "where": where,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }
    if func is None:
        return {**found, "text": f"no {RAGGED_KERNEL}"}
    names = set(_TENSORS)
    setup: list[ast.stmt] = []
    check: ast.Assert | None = None
    for stmt in func.body:
        if isinstance(stmt, ast.Assign) and _shape_only(stmt.value, names):
            targets = [t for t in stmt.targets if isinstance(t, ast.Name)]
            if len(targets) == len(stmt.targets):
                setup.append(stmt)
                names.update(t.id for t in targets)
        elif isinstance(stmt, ast.Assert) and _shape_only(stmt.test, names):
            check = stmt
            break
    if check is None:
        return {**found, "text": "no head-dim assert"}
    used = [*setup, check]
    code = compile(ast.Module(body=setup, type_ignores=[]), where, "exec")
    test = compile(ast.Expression(check.test), where, "eval")
    named = {
        c.value
        for stmt in used
        for c in ast.walk(stmt)
        if isinstance(c, ast.Constant) and type(c.value) is int and c.value > 0
    }
    dims = named | {d for n, r, v in DIMS for d in (n + r, v)}
    taken = []
    for qk, v in itertools.product(sorted(dims), repeat=2):
        env: dict[str, Any] = {
            "query": _NS(shape=(1, 1, qk)),
            "key": _NS(shape=(1, 1, qk)),
            "value": _NS(shape=(1, 1, v)),
        }
        exec(code, env)
        if eval(test, env):
            taken.append([qk, v])
    first = min(stmt.lineno for stmt in used)
    last = check.end_lineno or check.lineno
    return {
        **found,
        "value": taken,
        "where": f"{where}:{first}-{last} ({RAGGED_KERNEL})",
        "text": ast.unparse(check.test),
    }


def extract(version: str) -> dict[str, Any]:
    root = fetch(version)
    src = Source(root)
    print(f"{version}: parser", flush=True)
    run_choices = _worker(root, "parser")
    if run_choices:
        choices = run_choices
        choices_fact = {"method": "run", "where": "ServerArgs.add_cli_args"}
    else:
        read, where = read_choices(src)
        choices = read or {}
        choices_fact = {"method": "read", "where": where}
    print(f"{version}: attention dispatch", flush=True)
    grid = json.dumps({"caps": [list(c) for c in CAPS], "dims": [list(d) for d in DIMS]})
    handler = _worker(root, "handler", grid) or {"file": None, "methods": {}}
    if handler["file"]:
        src.text(handler["file"].removeprefix("sglang/srt/"))
    print(f"{version}: automatic backend", flush=True)
    caps = json.dumps({"caps": [list(c) for c in CAPS]})
    ran = _worker(root, "default", caps) or {"file": None, "mla": {}}
    fa3 = fa3_assert(src)
    facts = read_facts(src)
    if ran["file"]:
        src.text(ran["file"].removeprefix("sglang/srt/"))
        facts["automatic_mla"] = {
            "value": ran["mla"],
            "method": "run",
            "where": f"python/{ran['file']} (the defaulting function, a DeepSeek-V3 config)",
        }
    facts["flashinfer_dependency"] = flashinfer_dependency(version)
    facts["trtllm_mla_prefill"] = trtllm_prefill(src)
    pinned = flashinfer_pin(facts["flashinfer_dependency"])
    if facts["trtllm_mla_prefill"]["value"] == RAGGED_KERNEL and pinned is not None:
        print(f"{version}: flashinfer {pinned}'s {RAGGED_KERNEL}", flush=True)
        facts["trtllm_ragged_head_dims"] = ragged_head_dims(pinned)
    else:
        facts["trtllm_ragged_head_dims"] = {
            "value": None,
            "method": "read",
            "where": None,
            "note": f"this release's trtllm_mla prefill does not call {RAGGED_KERNEL}",
        }
    facts["fa4_head_dims"] = fa4_head_dims(root, sorted({(n + r, v) for n, r, v in DIMS}))
    rows = situations(choices, fa3, handler["methods"], facts, ran["mla"])
    return {
        "engine": "sglang",
        "release": version,
        "tool": "tools/engine_profiles/sglang.py",
        "sources": dict(sorted(src.used.items())),
        "facts": {
            "choices": {"value": choices, **choices_fact},
            "dispatch": {
                "method": "run" if handler["methods"] else "read",
                "where": handler["file"],
                "note": "fresh prefill batch; MHA* = the backend's ragged prefill kernel",
            },
            "fa3_mla_capabilities": fa3,
            **facts,
            **KERNEL_FACTS,
        },
        "flags": {
            "prefill": PREFILL,
            "decode": DECODE,
            "decode_pin": "SGLang's own automatic choice for the pod (each situation's "
            "'automatic'), pinned so that setting only the prefill flag moves nothing else",
        },
        "grid": {
            "capabilities": [f"{a}.{b}" for a, b in CAPS],
            "dims": [list(d) for d in DIMS],
            "dtypes": DTYPES,
            "names": NAMES,
        },
        "situations": rows,
    }


def check_first(released: list[str]) -> None:
    """FIRST is the first release whose own parser has the prefill flag: the one before
    it must not have it (run, like the rest)."""
    before = [v for v in released if vkey(v) < vkey(FIRST)]
    for version, expect in ((before[-1], False), (FIRST, True)):
        choices = _worker(fetch(version), "parser") or {}
        has = PREFILL in choices
        print(f"{version}: {PREFILL} {'present' if has else 'absent'}")
        if has is not expect:
            raise SystemExit(f"FIRST ({FIRST}) is stale: check {version}")


def dump(table: dict[str, Any]) -> str:
    """Indented JSON with one line per situation: readable diffs, a small file."""
    rows = table.pop("situations")
    for row in rows:
        for verdict in row["names"].values():
            for key in [k for k, v in verdict.items() if v is None]:
                del verdict[key]
    head = json.dumps(table, indent=1)[:-2]
    body = ",\n".join("  " + json.dumps(r, separators=(",", ":")) for r in rows)
    table["situations"] = rows
    return f'{head},\n "situations": [\n{body}\n ]\n}}\n'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", nargs="*", help="default: every release since " + FIRST)
    parser.add_argument("--out", default=str(TABLES / "sglang"))
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing: exit 1 unless each release's table equals the one in --out",
    )
    args = parser.parse_args(argv)
    ensure_deps()
    if args.versions:
        versions = args.versions
    else:
        released = released_versions()
        versions = [v for v in released if vkey(v) >= vkey(FIRST)]
        check_first(released)
    out = Path(args.out)
    if not args.check:
        out.mkdir(parents=True, exist_ok=True)
    differ = []
    for i, version in enumerate(versions, 1):
        print(f"[{i}/{len(versions)}] sglang {version}", flush=True)
        table = extract(version)
        path = out / f"{version}.json"
        if args.check:
            same = path.exists() and path.read_text() == dump(table)
            print(f"{version}: {'reproduces' if same else 'DIFFERS from'} {path}", flush=True)
            if not same:
                differ.append(version)
            continue
        path.write_text(dump(table))
    print(cache_summary(), flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
